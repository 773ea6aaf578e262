# Declarations for the compiled engine (matching/engine.py): the engine as an extension type whose
# state is C struct members, and the hot commands (amend, cancel, place) and the steps they take
# (entering, matching, fills, state changes) as C-callable methods with the orders typed. Nothing
# here changes what the code does.
cimport cython
from matching._compiled.book cimport Book
from matching._compiled.order cimport Order

cdef class Engine:
    cdef public object market, fees, default_stp, stops, _stop_keys, _tiers
    cdef public Book book
    cdef public dict orders, live, by_client, awaiting, handlers
    cdef public object last_seq, last_price, _match_no
    cdef public list _events
    @cython.locals(order=Order, events=list, book=Book)
    cpdef list _amend(self, seq, cmd)
    @cython.locals(order=Order, events=list)
    cpdef list _cancel(self, seq, cmd)
    @cython.locals(order=Order, events=list)
    cpdef list _place(self, seq, cmd)
    cpdef _take_out(self, Order order)
    @cython.locals(book=Book)
    cpdef _enter(self, Order order)
    cpdef _match(self, Order order)
    @cython.locals(maker=Order)
    cpdef _execute(self, Order taker, plan)
    cpdef _decrement(self, Order maker, Order taker, qty)
    cpdef _fill(self, Order maker, Order taker, qty)
    cpdef _finish(self, Order order, plan)
    cpdef _end_unfilled(self, Order order, state, reason)
    cpdef _move(self, Order order, new)
    cpdef _close(self, Order order, state, reason)
    cpdef _reject(self, Order order, code)
