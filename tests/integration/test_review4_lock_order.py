"""Review 4 of issue 11: `reject_for_reorg` now takes the account's balance lock
(`lock_available`) *before* it locks the account's unbatched withdrawal rows. Every other path
that rejects a withdrawal locks the row first and the balance second (the batcher rejecting at
payout, `_take_approved`: row FOR UPDATE SKIP LOCKED, then `release_hold`; an operator's reject).
The two orders meet in a deadlock: PostgreSQL aborts one of them, the freeze's transaction (the
deposit scan) or the other path. Before the change the freeze locked the rows first."""
from __future__ import annotations

import threading
import time

from sqlalchemy import text

from custody.withdrawals import HOLD_OWNER, reject_for_reorg
from regtest.util import assert_equal
from tests.integration.test_review_deposit_boundaries import Chain, api, customer  # noqa: F401 - fixture


def test_the_freeze_and_a_rejection_at_payout_do_not_deadlock(api, ledger):
    chain = Chain(api)
    alice = customer(api, "alice")
    chain.deposit(alice, 100_000_000)
    w = api.withdraw(alice, "0.29")
    assert_equal(w["state"], "approved")
    engine, errors = api.custody.engine, []
    with engine.connect() as batcher:
        batcher.execute(text("SET lock_timeout = '10s'"))
        row = batcher.execute(text("SELECT id, hold_id FROM withdrawal_request WHERE id = :w FOR UPDATE SKIP LOCKED"),
                              {"w": int(w["id"])}).one()  # the batcher takes the row (payouts._take_approved)

        def freeze() -> None:  # the deposit scan's freeze of a 2.0 reorged-out credit on the account
            try:
                with engine.begin() as c:
                    c.execute(text("SET LOCAL lock_timeout = '10s'"))
                    reject_for_reorg(c, ledger, alice, 200_000_000, by="custody:reorg")
            except Exception as e:  # noqa: BLE001 - the finding
                errors.append(f"freeze: {type(e).__name__}: {str(e).splitlines()[0]}")

        t = threading.Thread(target=freeze)
        t.start()
        time.sleep(1.0)  # the freeze now holds the balance lock and waits for the row
        try:  # the batcher rejects the row (a sanctioned destination, say): releases its hold
            ledger.release_hold(row.hold_id, owner=HOLD_OWNER, conn=batcher)
            batcher.commit()
        except Exception as e:  # noqa: BLE001 - the finding
            batcher.rollback()
            errors.append(f"batcher: {type(e).__name__}: {str(e).splitlines()[0]}")
        t.join(30)
    assert_equal(errors, [])
