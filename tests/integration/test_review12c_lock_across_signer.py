"""Review of issue 12, third round (R4): the signing step holds its customers' balance rows locked
for as long as the signer takes to answer (up to the client's 60 s timeout).

`_sign_bitcoin` / `_sign_ethereum` now capture the batch's holds (`_capture_first`) BEFORE asking
the signer, in the transaction that then waits for the signer's answer. The capture is a ledger
posting from every customer account of the batch (up to `max_batch_outputs`, 500), so each of
those accounts' balance rows stays locked (FOR UPDATE, uncommitted) across the signer call. While
a signer is slow (a large batch, its database busy, its process stopped: the client waits 60 s),
every write to those accounts waits with it, in the API process too, which sets no lock_timeout:
the customer's next withdrawal request (its hold), a deposit credit (the worker's deposits job,
which then stalls for every customer), and the matching sequencer settling a fill against one of
them (the whole market waits). Before this round the capture came after the signer's answer and
held these locks for milliseconds.

Played here with the real Payouts and Signer, the signer answering after 6 s: the same customer's
withdrawal request, made meanwhile, must not wait for it.

Fix: do not hold ledger row locks across an external call: e.g. capture in its own committed
transaction with the batch marked as signing (reversed by a compensating posting if the signer
refuses; the signer then accepts a hold captured for exactly this batch), or check the capture in a
savepoint that is rolled back before the call and post it after the answer; at the least a short
client timeout for signing and `lock_timeout` on the API's transactions (503 temporarily_unavailable).
"""
from __future__ import annotations

import logging
import threading
import time

from regtest.util import assert_equal
from tests.integration.own_database import own_database
from tests.integration.test_payout_step_races import DEST, make_world

log = logging.getLogger(__name__)
SIGNER_SECONDS = 6.0


class SlowSigner:
    """The real signer, answering after SIGNER_SECONDS (a large batch, a busy database)."""

    def __init__(self, real) -> None:
        self.real, self.asked = real, threading.Event()

    def __getattr__(self, name: str):  # noqa: ANN204
        method = getattr(self.real, name)

        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            self.asked.set()
            time.sleep(SIGNER_SECONDS)
            return method(*a, **kw)
        return call


def test_a_customer_in_a_batch_being_signed_can_still_request_a_withdrawal(database_url):
    with own_database(database_url, "r12c_lock_signer") as eng:
        w = make_world(eng, "bitcoin")
        [first] = w.withdrawal_ids
        acct = w.scalar("SELECT account_id FROM withdrawal_request WHERE id = :w", w=first)
        p = w.container.payouts
        p.signer = slow = SlowSigner(p.signer)
        w.batch(p)
        signed: list = []
        worker = threading.Thread(target=lambda: signed.extend(p.sign_open_batches()), daemon=True)
        worker.start()
        assert slow.asked.wait(30), "the signer was never asked"
        started = time.monotonic()
        second = w.container.withdrawals.request(client_withdrawal_id="r12c-lock-2", account_id=acct, amount=10_000_000,
                                                 destination=DEST, requested_by="backend-test")
        waited = time.monotonic() - started
        worker.join(60)
        log.info("withdrawal %d (%s) took %.1f s while the signer was answering batch of %d; signed %s", second.id,
                 second.state, waited, first, signed)
        w.ledger.assert_verified()
    assert_equal(len(signed), 1)
    assert waited < 2.0, (f"the customer's withdrawal request waited {waited:.1f} s on the balance row the payouts job "
                          "keeps locked across the signer call")
