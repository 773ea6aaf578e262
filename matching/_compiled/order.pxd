# Declarations that make the compiled `Order` (matching/order.py) an extension type: fixed fields
# read and written as C struct members by the compiled engine. Values stay Python objects (ints of
# any size: amounts are exact, never C integers that could overflow).
cdef class Order:
    cdef public object order_id, account, client_order_id, side, order_type, tif, qty, price
    cdef public object post_only, display_qty, stop_price, budget, stp_group, stp_policy, fee_tier
    cdef public object state, seq, remaining, visible, filled, quote_traded, fee_num, fees_paid
    cdef public object decremented
