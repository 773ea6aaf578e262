"""Review R1 (branch int, 0054): what custody_api's SECURITY DEFINER ledger functions still let it forge.

- `ledger_resolve_hold(p_hold, p_state, p_owner, p_now)` checks the owner only when `p_owner` is not
  NULL: custody_api releases any hold with NULL, e.g. a withdrawal's hold whose coins are already
  signed for, and the customer spends the same funds again. With `p_state = 'expired'` and a far
  `p_now` it also "expires" holds that have not timed out (the caller chooses the clock).
- `ledger_post(..., p_reverses)` checks only that the transaction exists and is not reversed yet:
  custody_api "reverses" any firm transaction with a one-cent posting between two customer accounts
  of its own. What trusts `reverses_id` then believes it: the reorg freeze (custody.incidents:
  an account stays frozen until the deposit's shortfall booking is reversed) lifts, and the real
  reversal is refused `already_reversed`.
Everything runs in one rolled-back transaction per test.
"""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.model import AccountKind


@pytest.fixture()
def accounts(ledger):
    run = uuid.uuid4().hex[:6].upper()
    asset = f"H{run}"
    ledger.create_asset(asset, 8)
    equity = ledger.open_account(asset, AccountKind.equity, f"equity:{asset}").id
    suspense = ledger.open_account(asset, AccountKind.suspense, f"suspense:{asset}").id
    alice = ledger.open_account(asset, AccountKind.customer, f"customer:alice{run.lower()}:{asset}",
                                owner=f"alice{run.lower()}").id
    m1 = ledger.open_account(asset, AccountKind.customer, f"customer:m{run.lower()}:{asset}", owner=f"m{run.lower()}").id
    m2 = ledger.open_account(asset, AccountKind.customer, f"customer:m{run.lower()}:{asset}:2",
                             owner=f"m{run.lower()}").id
    ledger.transfer(f"r1h:{run}:fund", equity, alice, 1_000)
    ledger.transfer(f"r1h:{run}:fund-m", equity, m1, 10)
    return {"run": run, "equity": equity, "suspense": suspense, "alice": alice, "m1": m1, "m2": m2}


def _as_api(engine, body):
    with engine.connect() as c:
        tx = c.begin()
        try:
            c.execute(text("SET LOCAL ROLE custody_api"))
            try:
                with c.begin_nested():
                    return body(c)
            except DBAPIError as exc:
                return exc.orig.sqlstate
        finally:
            tx.rollback()


def test_api_role_cannot_release_a_hold_it_does_not_own(engine, ledger, accounts):
    hold = ledger.place_hold(f"r1h:{accounts['run']}:wd", accounts["alice"], 900, owner="withdrawal",
                             reference="withdrawal:1").id
    status = _as_api(engine, lambda c: c.execute(
        text("SELECT status FROM ledger_resolve_hold(:h, 'released', NULL, NULL)"), {"h": hold}).scalar_one())
    assert status in ("hold_owner_mismatch", "42501"), status
    ledger.verify()


def test_api_role_cannot_expire_a_hold_before_its_time(engine, ledger, accounts):
    import datetime as dt
    hold = ledger.place_hold(f"r1h:{accounts['run']}:exp", accounts["alice"], 900, owner="withdrawal",
                             reference="withdrawal:2",
                             expires_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).id
    status = _as_api(engine, lambda c: c.execute(
        text("SELECT status FROM ledger_resolve_hold(:h, 'expired', 'withdrawal', 'infinity')"),
        {"h": hold}).scalar_one())
    assert status in ("not_timed_out", "42501"), status
    ledger.verify()


def test_api_role_cannot_mark_a_firm_transaction_reversed(engine, ledger, accounts):
    # a deposit's reorg shortfall booked to suspense (the transaction the freeze waits on)
    shortfall = ledger.transfer(f"r1h:{accounts['run']}:shortfall", accounts["suspense"], accounts["alice"], 5,
                                kind="deposit_reorg").transaction_id

    def forge(c):
        status = c.execute(text(
            "SELECT status FROM ledger_post(:k, 'h', 'reversal', '{}'::jsonb, ARRAY[:d]::bigint[], ARRAY[:cr]::bigint[], "
            "ARRAY[1]::numeric[], ARRAY[NULL]::bigint[], NULL, :r)"),
            {"k": f"r1h:{accounts['run']}:fake-reversal", "d": accounts["m1"], "cr": accounts["m2"],
             "r": shortfall}).scalar_one()
        marked = c.execute(text("SELECT count(*) FROM journal_transaction WHERE reverses_id = :t"),
                           {"t": shortfall}).scalar_one()
        return status, marked

    outcome = _as_api(engine, forge)
    assert outcome == "42501" or outcome[1] == 0, outcome
    ledger.verify()


def test_api_role_cannot_release_quarantine_into_an_account_of_its_choice(engine, ledger, accounts):
    asset = ledger.get_account(accounts["alice"]).asset
    quarantine = ledger.open_account(asset, AccountKind.quarantine, f"quarantine:{asset}").id
    ledger.transfer(f"r1h:{accounts['run']}:quarantined", accounts["equity"], quarantine, 700)

    def release(c):
        return c.execute(text(
            "SELECT status FROM ledger_post(:k, 'h', 'deposit_release', '{}'::jsonb, ARRAY[:d]::bigint[], "
            "ARRAY[:cr]::bigint[], ARRAY[700]::numeric[], ARRAY[NULL]::bigint[], NULL, NULL)"),
            {"k": f"r1h:{accounts['run']}:to-mallory", "d": quarantine, "cr": accounts["m1"]}).scalar_one()

    assert _as_api(engine, release) == "42501"
    ledger.verify()


def test_api_role_expires_on_the_databases_clock_for_an_owner_it_serves(engine, ledger, accounts):
    """0055: with an owner the api may name (an API caller's), its `p_now` is still ignored."""
    import datetime as dt
    hold = ledger.place_hold(f"r1h:{accounts['run']}:exp-api", accounts["alice"], 900, owner="api:r1",
                             reference="r1", expires_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).id
    status = _as_api(engine, lambda c: c.execute(
        text("SELECT status FROM ledger_resolve_hold(:h, 'expired', 'api:r1', 'infinity')"), {"h": hold}).scalar_one())
    assert status == "not_timed_out", status
    ledger.verify()


def test_a_reversal_must_mirror_its_original_for_every_caller(engine, ledger, accounts):
    """0055: the owner's own session may not mark a transaction reversed with other legs either."""
    original = ledger.transfer(f"r1h:{accounts['run']}:orig", accounts["alice"], accounts["m1"], 7).transaction_id

    def forge(c):
        status = c.execute(text(
            "SELECT status FROM ledger_post(:k, 'h', 'reversal', '{}'::jsonb, ARRAY[:d]::bigint[], ARRAY[:cr]::bigint[], "
            "ARRAY[7]::numeric[], ARRAY[NULL]::bigint[], NULL, :r)"),
            {"k": f"r1h:{accounts['run']}:skewed", "d": accounts["m1"], "cr": accounts["m2"], "r": original}).scalar_one()
        return status, c.execute(text("SELECT count(*) FROM journal_transaction WHERE reverses_id = :t"),
                                 {"t": original}).scalar_one()

    with engine.connect() as c:
        with c.begin():
            outcome = forge(c)
            c.rollback()
    assert outcome == ("invalid_request", 0), outcome
    assert ledger.reverse(original, f"r1h:{accounts['run']}:real").created  # the mirrored one posts
    ledger.verify()
