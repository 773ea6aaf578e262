# Declarations for the compiled book (matching/book.py): the sides and the book as extension types,
# and `reprice` (every move of a resting order) as a C-callable method with typed locals.
cimport cython
from matching._compiled.order cimport Order

cdef class BookSide:
    cdef public object side, sign, limit
    cdef public list keys
    cdef public dict queues

cdef class Book:
    cdef public BookSide bids, asks
    @cython.locals(side=BookSide, keys=list, queues=dict, queue=dict, new_queue=dict)
    cpdef bint reprice(self, Order order, old_price)
