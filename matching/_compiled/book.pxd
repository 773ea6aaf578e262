# Declarations for the compiled book (matching/book.py): the sides and the book as extension types,
# and the book's changes as C-callable methods with the order typed.
cimport cython
from matching._compiled.order cimport Order

cdef class BookSide:
    cdef public object side, sign, limit
    cdef public list keys
    cdef public dict queues
    @cython.locals(keys=list)
    cpdef _new_level(self, price, order_id, Order order)
    @cython.locals(keys=list, queues=dict)
    cpdef _pop_emptied_best(self)

cdef class Book:
    cdef public BookSide bids, asks
    @cython.locals(side=BookSide, queue=dict)
    cpdef add(self, Order order)
    @cython.locals(side=BookSide, queue=dict)
    cpdef remove(self, Order order, resting_price=*)
    @cython.locals(side=BookSide, keys=list, queues=dict, queue=dict, new_queue=dict)
    cpdef bint reprice(self, Order order, old_price)
    @cython.locals(side=BookSide, queue=dict)
    cpdef requeue(self, Order order)
    @cython.locals(keys=list)
    cpdef bint would_cross(self, side, price)
