"""Review of issue 12, third round (R4): a signature the signer recorded but custody never stored
pins the withdrawal for good.

The signer now records every withdrawal it signs (`signer_signature`) and signs it again only in a
transaction that conflicts with every earlier one (bitcoin: a common outpoint; ethereum: the same
chain id, sender and nonce), else `already_signed`. Custody asks inside a database transaction
that it rolls back when anything goes wrong after the signer committed: the client's 60 s timeout
on a slow signer (the signer commits at 61 s), a reset connection, a deadlock or dropped database
connection while storing, a worker SIGKILLed before its commit. What custody chose for that
attempt is rolled back with it, and later attempts choose again:

- ethereum: the nonce (`_allocate_nonce`, in the signing transaction) goes back to the counter and
  the next batch of the same run takes it; the first withdrawal's retry gets the next nonce, which
  its recorded signature does not share: `already_signed` on every run, forever.
- bitcoin: a batch signed-but-not-stored whose decisions then expire for some withdrawals
  (`drop_expired`) keeps its coins for the rest; the dropped withdrawal is re-decided and batched
  with other coins, which share no outpoint with its recorded signature: `already_signed`, forever.

Nothing is paid twice (the lost signature never left the worker's memory), but the withdrawal stays
`batched` with its customer's hold pending, the batch open and active; no incident is raised (a
refusal is only logged), `retry_batch` refuses an active batch, withdrawals have no cancel, and
`signer_signature` is append-only: there is no operator path short of the schema owner's SQL.

Fix (one of): custody fixes an attempt's choices BEFORE asking the signer, in a committed step
(the batch's nonce, as its coins already are), and never takes a withdrawal out of a batch the
signer has a record for (custody may read `signer_signature`): re-decide it in place; or a
documented operator path (the signer voiding an earlier signature once an admin quorum shows its
inputs or nonce were consumed by another final transaction).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time

from custody.policy_config import default_policy
from regtest.util import assert_equal
from signer.wire import SignerUnavailable
from tests.integration.own_database import own_database
from tests.integration.test_payout_step_races import DEST, make_world

log = logging.getLogger(__name__)


class ReplyLost:
    """The signer process as the worker's client sees it when the reply of the first signing request
    is lost after the signer committed (the client's timeout, a reset connection): the real signer
    signs and records, the caller gets SignerUnavailable."""

    def __init__(self, real) -> None:
        self.real, self.lost = real, False

    def __getattr__(self, name: str):  # noqa: ANN204
        method = getattr(self.real, name)

        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            result = method(*a, **kw)
            if not self.lost and name.startswith("sign_"):
                self.lost = True
                log.info("the signer signed and recorded (%s); its reply is lost", name)
                raise SignerUnavailable("signer at unix:/run/custody-signer/signer.sock: timed out")
            return result
        return call


def signer_codes(w, batch_id: int) -> list[str]:
    with w.eng.connect() as c:
        from sqlalchemy import text

        return [r.code or r.outcome for r in c.execute(text("SELECT outcome, code FROM signer_audit WHERE batch_id = :b "
                                                            "ORDER BY id"), {"b": batch_id})]


def test_an_ethereum_nonce_given_back_after_the_signer_signed_leaves_the_withdrawal_paid_not_stuck(database_url):
    with own_database(database_url, "r12c_eth_nonce") as eng:
        w = make_world(eng, "ethereum", amounts=(10**17, 2 * 10**17))
        first, second = w.withdrawal_ids
        p = w.container.payouts
        p.signer = ReplyLost(p.signer)
        b1, b2 = p.batch_ethereum()
        p.sign_open_batches()  # b1: signed at nonce 0, reply lost, rolled back; b2 takes nonce 0
        for _ in range(3):
            for step in (p.batch_ethereum, p.sign_open_batches, p.broadcast):
                step()
        states = {wid: w.container.withdrawals.get(wid).state for wid in (first, second)}
        nonces = w.one("SELECT array_agg(nonce ORDER BY id) AS n FROM chain_transaction").n
        recorded = w.one("SELECT array_agg(nonce ORDER BY id) AS n FROM signer_signature WHERE withdrawal_id = :w",
                         w=first).n
        codes = signer_codes(w, b1)
        log.info("withdrawals %s; stored nonces %s; the signer's record of %d: nonces %s; its answers on batch %d: %s",
                 states, nonces, first, recorded, b1, codes)
        w.ledger.assert_verified()
    assert_equal(states[second], "broadcast")
    assert "already_signed" not in codes, f"batch {b1} is refused already_signed on every run: {codes}"
    assert_equal(states[first], "broadcast")  # paid once, by the worker, without an operator


def test_a_bitcoin_withdrawal_dropped_from_a_signed_but_unstored_batch_is_paid_not_stuck(database_url):
    ttl = dt.timedelta(seconds=8)
    with own_database(database_url, "r12c_btc_drop") as eng:
        w = make_world(eng, "bitcoin", policy=dataclasses.replace(default_policy(), decision_ttl=ttl),
                       amounts=(10_000_000,))
        provider = w.container.withdrawals.policies
        provider.base = dataclasses.replace(provider.base, decision_ttl=dt.timedelta(hours=1))  # the next ones last
        [early] = w.withdrawal_ids
        acct = w.scalar("SELECT account_id FROM withdrawal_request WHERE id = :w", w=early)
        late = w.container.withdrawals.request(client_withdrawal_id="r12c-late", account_id=acct, amount=20_000_000,
                                               destination=DEST, requested_by="backend-test").id
        p = w.container.payouts
        p.signer = outage = ReplyLost(p.signer)
        batch = w.batch(p)
        p.sign_open_batches()  # signed {early, late} over coin X and recorded; the reply is lost: nothing stored
        assert outage.lost
        time.sleep(ttl.total_seconds() + 0.5)  # the signer stays slow/down past early's decision
        for _ in range(3):
            for step in (p.batch_bitcoin, p.sign_open_batches, p.broadcast):
                step()
        rows = {r.id: (r.state, r.batch_id) for r in w.container.withdrawals.list()}
        other = rows[early][1]
        codes = signer_codes(w, other) if other else []
        inputs = w.one("SELECT array_agg(array_to_string(inputs, ',') ORDER BY id) AS i FROM signer_signature "
                       "WHERE withdrawal_id = :w", w=early).i
        log.info("withdrawals %s; early's recorded inputs %s; the signer's answers on batch %s: %s", rows, inputs, other,
                 codes)
        w.ledger.assert_verified()
    assert_equal(rows[late], ("broadcast", batch))
    assert "already_signed" not in codes, f"withdrawal {early} is refused already_signed on every run: {codes}"
    assert_equal(rows[early][0], "broadcast")
