"""custody.client.projection: the README "Events" consumer rules, on hand-made envelopes."""
from __future__ import annotations

import pytest

from custody.client.projection import EventProjection

pytestmark = pytest.mark.unit


def _ev(key: str, kind: str, agg: str, seq: int, data: dict) -> dict:
    return {"event_key": key, "type": kind, "aggregate": agg, "aggregate_seq": seq, "data": data}


def test_postings_add_once_whatever_the_order_and_redeliveries_are_skipped():
    p = EventProjection()
    second = _ev("t2", "ledger.transaction_posted", "transaction:2", 1,
                 {"legs": [{"account_id": 1, "amount": -30}, {"account_id": 2, "amount": 30}]})
    first = _ev("t1", "ledger.transaction_posted", "transaction:1", 1,
                {"legs": [{"account_id": 1, "amount": 100}, {"account_id": 3, "amount": -100}]})
    for e in (second, first, second):
        p.apply(e)
    assert (p.balance(1), p.balance(2), p.balance(3)) == ((70, 0), (30, 0), (-100, 0))
    assert (p.events, p.duplicates, p.duplicate_types) == (3, 1, {"ledger.transaction_posted"})


def test_a_late_older_state_changes_nothing():
    p = EventProjection()
    p.apply(_ev("h1-2", "ledger.hold_changed", "hold:1", 2, {"hold_id": 1, "account_id": 5, "held": 0}))
    p.apply(_ev("h1-1", "ledger.hold_changed", "hold:1", 1, {"hold_id": 1, "account_id": 5, "held": 40}))
    p.apply(_ev("w9-1", "withdrawal.state_changed", "withdrawal:9", 1, {"withdrawal_id": 9, "state": "requested"}))
    p.apply(_ev("w9-3", "withdrawal.state_changed", "withdrawal:9", 3, {"withdrawal_id": 9, "state": "final"}))
    p.apply(_ev("w9-2", "withdrawal.state_changed", "withdrawal:9", 2, {"withdrawal_id": 9, "state": "approved"}))
    assert p.balance(5) == (0, 0)
    assert p.withdrawals == {9: "final"}
    assert p.accounts() == {5}
