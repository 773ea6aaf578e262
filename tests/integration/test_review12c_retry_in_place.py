"""Review of issue 12, third round (R4), follow-up: a batch the signer signed but custody did not
store is retried on the same coins (bitcoin) or nonce (ethereum), never re-batched.

The signing step now signs first and captures after the signer's answer (custody.payouts
`_try_capture`, `_record_signed`). Anything that fails after the signer committed its record
(`signer_signature`) leaves the batch open with nothing stored. Two paths are played here with the
real Payouts and Signer:
- the capture refused AFTER the signer answered (its key taken meanwhile): the signature is never
  stored or sent; the batch is set aside (warning), its hold still pending, the signer's record kept;
- a non-passing failure after the signer answered sets the batch aside; the operator's
  `retry_batch` keeps it open on its coins or nonce (audited `batch.retry_in_place`) instead of
  abandoning it, and the next run re-signs the same slot, which the signer accepts: paid once.
  Re-batched under a new id (what retry_batch did before), the signer would refuse the withdrawal
  `already_signed` on every run.
"""
from __future__ import annotations

import logging

import pytest

from ledger.model import Transfer
from regtest.util import assert_equal
from tests.integration.own_database import own_database
from tests.integration.test_payout_step_races import make_world

log = logging.getLogger(__name__)


class AfterSigning:
    """The real signer; once, after it signed and recorded, `then()` runs in the worker (the
    worker's store then fails, or finds its capture key taken)."""

    def __init__(self, real, then) -> None:
        self.real, self.then, self.done = real, then, False

    def __getattr__(self, name: str):  # noqa: ANN204
        method = getattr(self.real, name)

        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            result = method(*a, **kw)
            if not self.done and name.startswith("sign_"):
                self.done = True
                self.then(a[0])
            return result
        return call


def _fail(batch_id: int) -> None:
    raise RuntimeError(f"storing batch {batch_id} failed after the signer answered")


@pytest.mark.parametrize("chain", ["bitcoin", "ethereum"])
def test_a_capture_refused_after_the_signer_answered_is_never_stored(database_url, chain):
    with own_database(database_url, f"r12c_cap_after_{chain[:3]}") as eng:
        w = make_world(eng, chain)
        [wid] = w.withdrawal_ids
        asset = "BTC" if chain == "bitcoin" else "ETH"
        suspense, equity = w.container.wallets.firm_account("suspense", asset), w.container.wallets.firm_account("equity", asset)
        planted: list = []
        p = w.container.payouts
        p.signer = AfterSigning(p.signer, lambda b: planted.append(
            w.ledger.post(f"batch:{b}:capture", [Transfer(suspense, equity, 1)], kind="test_planted")))
        batch = w.batch(p)
        assert_equal(p.sign_open_batches(), [])
        stored = w.scalar("SELECT count(*) FROM chain_transaction WHERE batch_id = :b", b=batch)
        row = tuple(w.one("SELECT state, containment FROM withdrawal_batch WHERE id = :b", b=batch))
        code = w.scalar("SELECT detail ->> 'code' FROM incident WHERE detail ->> 'batch_id' = :b", b=str(batch))
        hold = w.scalar("SELECT h.state FROM hold h JOIN withdrawal_request r ON r.hold_id = h.id WHERE r.id = :w", w=wid)
        recorded = w.scalar("SELECT count(*) FROM signer_signature WHERE withdrawal_id = :w", w=wid)
        log.info("%s batch %d: %s, %d stored, incident %s, hold %s, signer records %d", chain, batch, row, stored, code,
                 hold, recorded)
        w.ledger.reverse(planted[0].transaction_id, f"test:planted:{batch}:reversal")
        w.ledger.assert_verified()
    assert_equal((stored, row, code, hold, recorded), (0, ("open", "set_aside"), "idempotency_conflict", "pending", 1))


@pytest.mark.parametrize("chain", ["bitcoin", "ethereum"])
def test_retry_of_a_batch_the_signer_signed_keeps_its_coins_or_nonce_and_pays_once(database_url, chain):
    with own_database(database_url, f"r12c_retry_place_{chain[:3]}") as eng:
        w = make_world(eng, chain)
        [wid] = w.withdrawal_ids
        p = w.container.payouts
        p.signer = AfterSigning(p.signer, _fail)
        batch = w.batch(p)
        assert_equal(p.sign_open_batches(), [])
        assert_equal(tuple(w.one("SELECT state, containment FROM withdrawal_batch WHERE id = :b", b=batch)),
                     ("open", "set_aside"))
        retried = p.retry_batch(batch, by="operator-test", comment="store fixed")
        for _ in range(2):
            for step in ((p.batch_bitcoin if chain == "bitcoin" else p.batch_ethereum), p.sign_open_batches, p.broadcast):
                step()
        state = tuple(w.one("SELECT state, batch_id FROM withdrawal_request WHERE id = :w", w=wid))
        refusals = w.scalar("SELECT count(*) FROM signer_audit WHERE outcome = 'refused'")
        slots = w.one("SELECT array_agg(DISTINCT coalesce(array_to_string(inputs, ','), nonce::text)) AS s "
                      "FROM signer_signature WHERE withdrawal_id = :w", w=wid).s
        stored = w.one("SELECT count(*) AS n, max(nonce) AS nonce FROM chain_transaction WHERE batch_id = :b", b=batch)
        in_place = w.scalar("SELECT count(*) FROM audit_event WHERE action = 'batch.retry_in_place'")
        log.info("%s: retried %s; withdrawal %s; signer refusals %d; its slots %s; stored %s", chain, retried, state,
                 refusals, slots, tuple(stored))
        w.ledger.assert_verified()
    assert_equal(retried.state, "open")
    assert_equal(in_place, 1)
    assert_equal(refusals, 0)  # no already_signed: the re-sign conflicts with the recorded signature
    assert_equal(len(slots), 1)  # both signatures spend the same coin / use the same nonce
    assert_equal(state, ("broadcast", batch))
    assert_equal(stored.n, 1)
    if chain == "ethereum":
        assert_equal(int(stored.nonce), int(slots[0]))
