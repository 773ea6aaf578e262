"""Review 16 (R1, perf merge): custody_api forges events through the SECURITY DEFINER event trigger
functions, on a temporary table of its own.

Migration 0032 made the event triggers' functions SECURITY DEFINER so that the api's rows get their
events "written with the owner's rights", and took INSERT on outbox / outbox_aggregate from
custody_api so that it "neither forges an event nor rewinds a sequence" (README, roles table).
But custody_api keeps EXECUTE on those functions (default privileges) and, like every role, TEMP
on the database: it creates a temporary table with the columns a function reads, attaches the
function as a trigger (it owns the table) and every row it inserts is turned into an event written
as the owner. Migration 0048 adds four more such functions (`custody_event_holds_inserted`, ...,
statement triggers over any table's `new_rows`) and rewrote `custody_event_transaction_posted`,
which, attached the same way, squats `ledger.transaction_posted:<id>` of a posting to come: the
real posting's event is then skipped (its key taken) and consumers see the forged one.
Everything runs in one transaction, rolled back.
"""
from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind, Transfer

_FORGE = [
    "CREATE TEMP TABLE fake_hold (id bigint, account_id bigint, amount numeric, captured numeric, released numeric, "
    "state text, owner text, reference text) ON COMMIT DROP",
    "CREATE TRIGGER forge_hold AFTER INSERT ON fake_hold REFERENCING NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION custody_event_holds_inserted()",
    "CREATE TEMP TABLE fake_tx (id bigint, idempotency_key text, kind text, reverses_id bigint, metadata jsonb, "
    "created_at timestamptz) ON COMMIT DROP",
    "CREATE TRIGGER forge_tx AFTER INSERT ON fake_tx FOR EACH ROW EXECUTE FUNCTION custody_event_transaction_posted()",
]


def test_api_role_cannot_write_events_through_the_trigger_functions(engine, ledger):
    run = uuid.uuid4().hex[:8]
    ledger.create_asset("BTC", 8)
    world = ledger.open_account("BTC", AccountKind.equity, f"r16e:{run}:world").id
    alice = ledger.open_account("BTC", AccountKind.customer, f"r16e:{run}:alice").id
    with engine.connect() as c:
        tx = c.begin()
        try:
            start = c.execute(text("SELECT coalesce(max(id), 0) FROM outbox")).scalar_one()
            c.execute(text("SAVEPOINT forge"))
            c.execute(text("SET LOCAL ROLE custody_api"))
            try:
                for sql in _FORGE:
                    c.execute(text(sql))
                c.execute(text("INSERT INTO fake_hold VALUES (987654321, :a, 5000, 0, 5000, 'released', 'payouts', 'x')"),
                          {"a": alice})
                nxt = c.execute(text("SELECT last_value FROM journal_transaction_id_seq")).scalar_one()
                c.execute(text("INSERT INTO fake_tx SELECT g, 'forged', 'transfer', NULL, '{}'::jsonb, now() "
                               "FROM generate_series(CAST(:n AS bigint), CAST(:n AS bigint) + 20) g"), {"n": nxt})
                c.execute(text("RESET ROLE"))
                c.execute(text("RELEASE SAVEPOINT forge"))
            except DBAPIError:  # refused: what a fixed schema does
                c.execute(text("ROLLBACK TO SAVEPOINT forge"))
                c.execute(text("RESET ROLE"))
            posted = ledger.post(f"r16e:{run}:real", [Transfer(world, alice, 700)], conn=c).transaction_id
            c.execute(text("SET CONSTRAINTS journal_transaction_event IMMEDIATE"))
            events = c.execute(text("SELECT topic, event_key, payload FROM outbox WHERE id > :s ORDER BY id"),
                               {"s": start}).all()
        finally:
            tx.rollback()
    forged_holds = [e for e in events if e.event_key.startswith("hold:987654321#")]
    real = [e.payload.get("idempotency_key") for e in events if e.event_key == f"ledger.transaction_posted:{posted}"]
    assert forged_holds == [] and real == [f"r16e:{run}:real"], (forged_holds, real)
    ledger.verify()
