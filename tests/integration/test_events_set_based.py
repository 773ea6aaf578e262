"""The statement-level event triggers of migration 0045 write the same events as the per-row
triggers they replaced (0026/0032): same topics, keys, aggregates, per-aggregate sequence numbers,
payloads, and the same order of outbox ids, up to the ids the sequences hand out.

One database transaction, rolled back at the end: first the migration's downgrade SQL puts the
per-row triggers back (inside a savepoint), a scenario runs and its outbox rows are read; the
savepoint is rolled back (the statement triggers are in place again, the scenario undone) and the
same scenario runs again with the same keys. The scenario covers what the payout job and the API
do to holds and withdrawals: single and multi-row INSERTs and UPDATEs in one statement, UPDATEs
that change nothing an event reports, an UPDATE that changes the state of some rows only, a
`custody_emit` on the same aggregate after a trigger's event, hold place / capture / release, a
batch of hold commands in one `ledger_apply` statement, and postings (the deferred event,
fired by SET CONSTRAINTS ... IMMEDIATE before the outbox is read).
"""
from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text

from ledger.model import AccountKind, PlaceHold, ReleaseHold, Transfer

_MIGRATION = Path(__file__).resolve().parents[2] / "migrations/versions/0048_set_based_triggers.py"
_spec = importlib.util.spec_from_file_location("set_based_events_0045", _MIGRATION)
_migration = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_migration)

_DEFERRED = "journal_transaction_balanced, journal_transaction_event"


def _scenario(c, ledger, run: str, alice: int, bob: int, pool: int) -> list[tuple]:
    """Run the scenario on `c` (inside its transaction); return its outbox rows in id order."""
    start = c.execute(text("SELECT coalesce(max(id), 0) FROM outbox")).scalar_one()
    k = f"diff:{run}"
    h1 = ledger.place_hold(f"{k}:h1", alice, 5_000, owner="diff", reference="r1", conn=c).id
    h2 = ledger.place_hold(f"{k}:h2", alice, 3_000, owner="diff", reference="r2", conn=c).id
    ledger.capture_hold(f"{k}:cap1", h1, [Transfer(alice, pool, 1_000)], owner="diff", conn=c)
    ledger.post(f"{k}:p1", [Transfer(alice, bob, 10), Transfer(bob, alice, 5), Transfer(pool, bob, 7)], conn=c)
    ledger.release_hold(h2, owner="diff", conn=c)
    results = ledger.apply([PlaceHold(f"{k}:h3", alice, 100, "diff", "r3"), PlaceHold(f"{k}:h4", bob, 1, "diff", "r4"),
                            ReleaseHold(h1, "diff")], conn=c)
    assert all(r.ok for r in results), results
    held = [r.id for r in results[:2]]
    # several holds changed by one statement; one of them in a way no event reports
    c.execute(text("UPDATE hold SET expires_at = now() + interval '1 hour' WHERE id = ANY(:h)"), {"h": held})
    c.execute(text("UPDATE hold SET released = CASE WHEN id = :a THEN amount ELSE 0 END, "
                   "state = CASE WHEN id = :a THEN 'released' ELSE state END, "
                   "resolved_at = CASE WHEN id = :a THEN now() END WHERE id = ANY(:h)"), {"h": held, "a": held[0]})
    wids = c.execute(text(
        "INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, "
        "priority, requested_by, content_hash, state, hold_id) "
        "SELECT :k || '-w' || g, :a, 'BTC', 'bitcoin', 1000 * g, 50, 'bcrt1qdest' || g, 'normal', 'diff', 'h', "
        "'pending_approval', :h FROM generate_series(1, 3) g ORDER BY g RETURNING id"),
        {"k": k, "a": alice, "h": h1}).scalars().all()
    for wid in wids:  # as custody.controls.emit does after the request's INSERT
        c.execute(text("SELECT custody_emit('withdrawal.requested', NULL, 'withdrawal:' || CAST(:w AS text), 1, "
                       "CAST(:p AS jsonb))"), {"w": wid, "p": json.dumps({"withdrawal_id": wid})})
    one = c.execute(text(
        "INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, "
        "priority, requested_by, content_hash, state) VALUES (:k || '-w9', :a, 'BTC', 'bitcoin', 9, 0, 'd', 'fast', "
        "'diff', 'h', 'approved') RETURNING id"), {"k": k, "a": bob}).scalar_one()
    c.execute(text("UPDATE withdrawal_request SET state = 'approved', updated_at = now() WHERE id = ANY(:w)"), {"w": wids})
    c.execute(text("UPDATE withdrawal_request SET updated_at = now() WHERE id = ANY(:w)"), {"w": wids})  # no event
    c.execute(text("UPDATE withdrawal_request SET state = 'approved' WHERE id = :o"), {"o": one})  # same state: none
    c.execute(text("UPDATE withdrawal_request SET state = CASE WHEN id = :w THEN 'rejected' ELSE state END "
                   "WHERE id = ANY(:all)"), {"w": wids[1], "all": wids + [one]})
    c.execute(text("UPDATE withdrawal_request SET state = 'signed' WHERE id = :o"), {"o": one})
    many = c.execute(text(  # a statement of many rows after ones of few (the trigger's plans are cached)
        "INSERT INTO withdrawal_request (client_withdrawal_id, account_id, asset, chain, amount, fee_quoted, destination, "
        "priority, requested_by, content_hash, state) SELECT :k || '-m' || g, :a, 'BTC', 'bitcoin', g, 0, 'd', 'normal', "
        "'diff', 'h', 'approved' FROM generate_series(1, 200) g ORDER BY g RETURNING id"), {"k": k, "a": bob}).scalars().all()
    c.execute(text("UPDATE withdrawal_request SET state = CASE WHEN id % 3 = 0 THEN 'approved' ELSE 'batched' END "
                   "WHERE id = ANY(:m)"), {"m": many})
    ledger.post(f"{k}:p2", [Transfer(bob, alice, 3)], conn=c)
    c.execute(text(f"SET CONSTRAINTS {_DEFERRED} IMMEDIATE"))  # the postings' events and checks, now
    rows = c.execute(text("SELECT topic, event_key, aggregate, aggregate_seq, version, payload FROM outbox "
                          "WHERE id > :s ORDER BY id"), {"s": start}).all()
    c.execute(text(f"SET CONSTRAINTS {_DEFERRED} DEFERRED"))
    return [tuple(r) for r in rows]


class _Ids:
    """Renames the ids the sequences handed out, per kind, in order of first appearance."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, Any], int] = {}

    def __call__(self, kind: str, value: Any) -> Any:
        if value is None:
            return None
        return f"{kind}#{self.seen.setdefault((kind, str(value)), len(self.seen))}"

    def text(self, s: str) -> str:
        for prefix, kind in (("ledger.transaction_posted:", "transaction"), ("journal_transaction:", "transaction"),
                             ("hold:", "hold"), ("withdrawal:", "withdrawal")):
            if s.startswith(prefix):
                ident, _, seq = s[len(prefix):].partition("#")
                return prefix + self(kind, ident) + (f"#{seq}" if seq else "")
        return s

    def payload(self, p: dict) -> dict:
        out = dict(p)
        for field, kind in (("hold_id", "hold"), ("withdrawal_id", "withdrawal"), ("transaction_id", "transaction"),
                            ("batch_id", "batch")):
            if field in out:
                out[field] = self(kind, out[field])
        if "legs" in out:
            out["legs"] = [{**leg, "entry_id": self("entry", leg["entry_id"]), "hold_id": self("hold", leg["hold_id"])}
                           for leg in out["legs"]]
        return out


def _normalized(rows: list[tuple]) -> list[tuple]:
    ids = _Ids()
    return [(topic, ids.text(key), ids.text(aggregate), seq, version, ids.payload(payload))
            for topic, key, aggregate, seq, version, payload in rows]


def test_statement_triggers_write_the_events_the_row_triggers_wrote(engine, ledger):
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    world = ledger.open_account("BTC", AccountKind.equity, f"diff:{run}:world").id
    pool = ledger.open_account("BTC", AccountKind.customer, f"diff:{run}:carol").id
    alice = ledger.open_account("BTC", AccountKind.customer, f"diff:{run}:alice").id
    bob = ledger.open_account("BTC", AccountKind.customer, f"diff:{run}:bob").id
    ledger.transfer(f"diff:{run}:fund-a", world, alice, 100_000)
    ledger.transfer(f"diff:{run}:fund-b", world, bob, 100_000)
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SAVEPOINT row_triggers"))
            c.exec_driver_sql(_migration.DOWNGRADE)  # 0032's per-row triggers and posting event
            triggers = set(c.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid IN ('hold'::regclass, "
                                          "'withdrawal_request'::regclass) AND NOT tgisinternal")).scalars())
            assert {"hold_event", "withdrawal_request_event"} <= triggers
            before = _scenario(c, ledger, run, alice, bob, pool)
            c.execute(text("ROLLBACK TO SAVEPOINT row_triggers"))
            triggers = set(c.execute(text("SELECT tgname FROM pg_trigger WHERE tgrelid IN ('hold'::regclass, "
                                          "'withdrawal_request'::regclass) AND NOT tgisinternal")).scalars())
            assert {"hold_event_insert", "hold_event_update", "withdrawal_request_event_insert",
                    "withdrawal_request_event_update"} <= triggers and "hold_event" not in triggers
            after = _scenario(c, ledger, run, alice, bob, pool)
        finally:
            tx.rollback()
    topics = [r[0] for r in before]
    assert topics.count("ledger.transaction_posted") == 3 and topics.count("withdrawal.state_changed") >= 9 + 200 + 120
    assert topics.count("ledger.hold_changed") == 8 and topics.count("withdrawal.requested") == 3
    assert _normalized(after) == _normalized(before)
