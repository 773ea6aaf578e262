"""The ten order states, the transitions between them (declared once, as data), and `transition()`.

Every state change of an order, in the engine and later in the gateway's `order` row, goes through
`transition()`, so an undeclared change raises instead of silently happening.

| state | set by | hold effect | FIX 4.4 OrdStatus (39) |
| --- | --- | --- | --- |
| received | gateway after the client order id is deduped; the trigger evaluator when a stop fires | none yet | A Pending New |
| rejected | risk, compliance, or the matcher (invalid, post-only cross, STP before any fill, hold failed) | none placed, or released in full | 8 Rejected |
| pending_new | risk, once the hold is placed and the command handed to the sequencer | hold placed for the full order value | A Pending New |
| working | matcher, on acknowledging an order that rests with no fill | unchanged | 0 New |
| partially_filled | matcher, on each execution that leaves quantity open | reduced by each capture | 1 Partially Filled |
| filled | matcher, on the execution that completes the quantity | closed; price-improvement remainder released | 2 Filled |
| pending_cancel | gateway, on accepting a cancel request | unchanged; fills may still post | 6 Pending Cancel |
| cancelled | matcher, on applying a cancel (or STP removing a live order, or an `Evict`: a fill could not pay the owner) | residual released | 4 Canceled |
| expired | matcher, for an IOC / FOK / market remainder (or a future time-in-force clock) | residual released | C Expired |
| untriggered | trigger evaluator, on accepting a stop or stop-limit | none: a stop reserves nothing | none: FIX carries the trigger in OrdType (40); 7 Stopped means something else |

Engine specifics: a normal order enters the engine in `pending_new` (its hold already placed); it
goes to `working` only if it rests without trading. A stop enters in `received` and moves to
`untriggered`; when it fires it returns to `received` (nothing held) until the money layer places
its hold (`ActivateTriggered` -> `pending_new`) or cannot (`RejectTriggered` -> `rejected`).
`pending_cancel` is a gateway state: the engine applies cancels synchronously, but accepts orders in
it so a row the gateway moved there can still fill or cancel.
"""
from __future__ import annotations

import enum

from matching.errors import IllegalTransition


class OrderState(str, enum.Enum):
    """One of the ten order states of the architecture sheet; nothing else is a status."""

    received = "received"
    rejected = "rejected"
    pending_new = "pending_new"
    working = "working"
    partially_filled = "partially_filled"
    filled = "filled"
    pending_cancel = "pending_cancel"
    cancelled = "cancelled"
    expired = "expired"
    untriggered = "untriggered"


S = OrderState

# The only allowed changes. A self-loop (partially_filled -> partially_filled) is a further fill.
TRANSITIONS: dict[OrderState, frozenset[OrderState]] = {
    S.received: frozenset({S.pending_new, S.untriggered, S.rejected, S.cancelled}),
    S.pending_new: frozenset({S.working, S.partially_filled, S.filled, S.rejected, S.expired}),
    S.working: frozenset({S.partially_filled, S.filled, S.pending_cancel, S.cancelled,
                          S.expired}),
    S.partially_filled: frozenset({S.partially_filled, S.filled, S.pending_cancel, S.cancelled,
                                   S.expired}),
    S.pending_cancel: frozenset({S.partially_filled, S.filled, S.cancelled, S.expired}),
    S.untriggered: frozenset({S.received, S.cancelled}),
    S.rejected: frozenset(),
    S.filled: frozenset(),
    S.cancelled: frozenset(),
    S.expired: frozenset(),
}

TERMINAL: frozenset[OrderState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)

# States in which an order has value held for it (the sheet's "amber" states).
HOLDING: frozenset[OrderState] = frozenset({S.pending_new, S.working, S.partially_filled,
                                            S.pending_cancel})

# States in which an order is on this engine's book (or its stop list) and may be cancelled.
OPEN: frozenset[OrderState] = frozenset({S.working, S.partially_filled, S.pending_cancel,
                                         S.untriggered, S.received})

FIX_ORD_STATUS: dict[OrderState, str | None] = {
    S.received: "A", S.rejected: "8", S.pending_new: "A", S.working: "0",
    S.partially_filled: "1", S.filled: "2", S.pending_cancel: "6", S.cancelled: "4",
    S.expired: "C", S.untriggered: None,
}


def can_transition(old: OrderState, new: OrderState) -> bool:
    """True when `old -> new` is declared in `TRANSITIONS`."""
    return new in TRANSITIONS[old]


def transition(order_id: str, old: OrderState, new: OrderState) -> OrderState:
    """Return `new` if `old -> new` is declared, else raise `IllegalTransition`."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(order_id, old.value, new.value)
    return new
