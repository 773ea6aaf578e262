"""Review of issue 12, round 2 (R3): the signer's cap on value signed WITHOUT approvals
(`unapproved_limits`, signer.service `_check_unapproved`) can be exceeded.

| scenario | attacker | today | expected |
| --- | --- | --- | --- |
| a withdrawal signed first at a tiny amount, then its amount row raised and re-signed over the same coin | compromised worker / custody DB writer (UPDATE withdrawal_request) | the re-sign "conflicts" with the first signature, so it is not counted: 0.1 BTC unapproved with 0.05 of cap left | refused (`already_signed`: a re-sign must pay what was recorded; or the cap counts the new amount) |
| two unapproved withdrawals of different batches signed at the same moment | compromised worker (the server is threaded; the advisory lock is per WITHDRAWAL, not per asset) | both pass the cap check before either records: 0.2 BTC with 0.15 of cap left | exactly one signed, the other `unapproved_limit_reached` |

Both use the default policy's quorum table: 0.1 BTC needs no approval (tier <= 0.5 BTC: 0), so the
cap is the only limit the signer puts on it. Each scenario releases its holds; the ledger verifies.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading

from sqlalchemy import text

import signer.service as service_module
from regtest.util import assert_equal
from signer.assets import UnapprovedLimit
from tests.integration.test_signer_signatures import (COIN, FEE, Clock, api, batch_of, make_signer,  # noqa: F401 - fixture
                                                      outcome, outputs_of, records, release, withdrawal)

log = logging.getLogger(__name__)
_ = api  # the module-scoped fixture of test_signer_signatures (its fake coins are deleted at the end)


WINDOW = 300


def capped_signer(api, headroom: int):
    """A signer whose clock runs two hours behind (its records stay out of the hour window of
    test_signer_signatures' cap scenario; decisions are checked against the same clock, so they are
    live) and whose BTC cap leaves `headroom` sat above what the window already holds."""
    clock = Clock()
    clock.now -= dt.timedelta(hours=2)
    with api.custody.engine.connect() as c:
        used = int(c.execute(text(service_module._UNAPPROVED_SQL),
                             {"a": "BTC", "since": clock.now - dt.timedelta(seconds=WINDOW)}).scalar_one())
    return make_signer(api, clock=clock, unapproved_limits={"BTC": UnapprovedLimit(used + headroom, WINDOW)})


def as_worker(api, sql: str, **params) -> None:
    """A write made with custody_worker's privileges (a compromised worker or DB writer)."""
    with api.custody.engine.begin() as c:
        c.execute(text("SET LOCAL ROLE custody_worker"))
        c.execute(text(sql), params)


def test_a_resign_at_a_raised_amount_escapes_the_unapproved_cap(api, ledger):
    capped = capped_signer(api, 5_000_000)
    wid = withdrawal(api, "0.1")  # 10_000_000 sat, auto-approved: no approval at all
    batch, coins = batch_of(api, capped, [wid])
    change = lambda outs: (capped._hot_address(1, batch), COIN - outs[0].amount - FEE)  # noqa: E731
    outs = outputs_of(api, [wid])
    try:
        assert_equal(outcome(lambda: capped.sign_bitcoin_batch(batch, coins, outs, change(outs)))[0], "unapproved_limit_reached")
        log.info("the worker lowers the amount row to 10 000 sat: that is signed and counted as 10 000")
        as_worker(api, "UPDATE withdrawal_request SET amount = 10000 WHERE id = :w", w=wid)
        as_worker(api, "UPDATE batch_output SET amount = 10000 WHERE withdrawal_id = :w", w=wid)
        small = outputs_of(api, [wid])
        assert_equal(outcome(lambda: capped.sign_bitcoin_batch(batch, coins, small, change(small)))[0], "signed")
        log.info("... then restores 0.1 BTC and asks again over the same coin: a 'conflicting' re-sign, never counted")
        as_worker(api, "UPDATE withdrawal_request SET amount = 10000000 WHERE id = :w", w=wid)
        as_worker(api, "UPDATE batch_output SET amount = 10000000 WHERE withdrawal_id = :w", w=wid)
        big = outputs_of(api, [wid])
        code, tx = outcome(lambda: capped.sign_bitcoin_batch(batch, coins, big, change(big)))
        signed_unapproved = sorted({(r.txid, r.approvals) for r in records(api, wid)})
    finally:
        release(api, wid)
    assert code != "signed", (
        f"the signer signed {big[0].amount} sat with no approval with 5 000 000 sat left under its cap "
        f"(txid {tx.txid if tx else None}); its record shows {signed_unapproved}: the re-sign at a raised amount "
        f"was not counted because withdrawal {wid} had been signed before (at 10 000 sat)")


def test_two_unapproved_withdrawals_at_once_pass_the_cap_together(api, ledger, monkeypatch):
    capped = capped_signer(api, 15_000_000)
    wids = [withdrawal(api, "0.1") for _ in range(2)]  # 0.1 BTC each, no approval; the cap lets one through
    plans = []
    for wid in wids:
        batch, coins = batch_of(api, capped, [wid])
        outs = outputs_of(api, [wid])
        plans.append((batch, coins, outs, (capped._hot_address(1, batch), COIN - outs[0].amount - FEE)))
    meet = threading.Barrier(2, timeout=3)
    real = service_module.sign_batch

    def sign_after_both_checked(*args, **kw):  # both requests have passed _check_unapproved when they meet here
        try:
            meet.wait()
        except threading.BrokenBarrierError:  # serialised (the fix): the first one signs alone
            pass
        return real(*args, **kw)

    monkeypatch.setattr(service_module, "sign_batch", sign_after_both_checked)
    results: dict[int, str] = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(p[0], outcome(lambda: capped.sign_bitcoin_batch(*p))[0]))
               for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    release(api, *wids)
    assert_equal(sorted(results.values()), ["signed", "unapproved_limit_reached"])
