"""A backend's projection of the event stream: what README "Events" tells a consumer to keep,
built from events alone (no API call), as a reference for another team and the one the tests and
the soak compare with the API's own state.

    projection = EventProjection()
    for envelope in messages:            # JSON envelopes from JetStream, in any order, redeliveries included
        projection.apply(envelope)
    posted, held = projection.balance(account_id)

Rules it follows (README "Events"): every `event_key` is applied once (a redelivery is counted in
`duplicates` and skipped); a `ledger.transaction_posted` adds its legs per account whatever the
order; a state event (holds, orders, withdrawals) is applied only when its `aggregate_seq` is above
the last one applied for its aggregate (an older state that arrives late changes nothing). It keeps
everything in memory, so it is a reference, not a store: a real consumer records the applied key
with its effect in one database transaction. Thread-safe (one lock); imports nothing of the service.
"""
from __future__ import annotations

import threading


class EventProjection:
    """Balances (posted, held), holds, orders and withdrawals from events only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.applied: set[str] = set()
        self.last_seq: dict[str, int] = {}
        self.posted: dict[int, int] = {}
        self.holds: dict[int, tuple[int, int]] = {}  # hold id -> (account id, held)
        self.orders: dict[str, dict] = {}  # order id -> the data of its latest order.* event
        self.withdrawals: dict[int, str] = {}  # withdrawal id -> state
        self.types: set[str] = set()
        self.events = 0  # envelopes given to apply(), redeliveries included
        self.duplicates = 0  # event keys seen again and skipped
        self.duplicate_types: set[str] = set()

    def apply(self, event: dict) -> None:
        with self.lock:
            self.events += 1
            if event["event_key"] in self.applied:
                self.duplicates += 1
                self.duplicate_types.add(event["type"])
                return
            self.applied.add(event["event_key"])
            self.types.add(event["type"])
            kind, data, agg, seq = event["type"], event["data"], event["aggregate"], event["aggregate_seq"]
            if kind == "ledger.transaction_posted":  # a posting adds up, whatever the order
                for leg in data["legs"]:
                    self.posted[leg["account_id"]] = self.posted.get(leg["account_id"], 0) + leg["amount"]
                return
            if seq <= self.last_seq.get(agg, 0):
                return  # an older state of something a newer event already set
            self.last_seq[agg] = seq
            if kind == "ledger.hold_changed":
                self.holds[data["hold_id"]] = (data["account_id"], data["held"])
            elif kind.startswith("order."):
                self.orders[data["order_id"]] = data
            elif kind == "withdrawal.state_changed":
                self.withdrawals[data["withdrawal_id"]] = data["state"]

    def accounts(self) -> set[int]:
        """Every account an event named (in a posting's legs or a hold)."""
        with self.lock:
            return set(self.posted) | {a for a, _ in self.holds.values()}

    def balance(self, account_id: int) -> tuple[int, int]:
        """(posted, held) of the account as the events say."""
        with self.lock:
            return self.posted.get(account_id, 0), sum(h for a, h in self.holds.values() if a == account_id)
