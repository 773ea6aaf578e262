# Declarations for the compiled matcher (matching/matcher.py): the plan as an extension type and
# the planning walk with the taker, the makers and the book typed. No change of behaviour.
cimport cython
from matching._compiled.book cimport Book, BookSide
from matching._compiled.order cimport Order

cdef class Plan:
    cdef public list steps
    cdef public object filled, stp_kill, budget_exhausted

@cython.locals(plan=Plan, steps=list, side=BookSide, keys=list, queues=dict, maker=Order,
               tail=list, refills=dict)
cpdef Plan plan_match(Order taker, Book book, market, fees)
