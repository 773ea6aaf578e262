"""Review of issue 12 (R2): an open batch whose decisions expire before the signer answers is stuck
for good.

A batch is made in one run of the payouts job and signed by the signer process. If the signer is
down (SIGKILLed and restarting, a bad config being fixed), or the kill switch is on, for longer than
the policy's decision TTL (30 minutes by default), the signer then refuses the batch with
`decision_expired` on every run: `_sign_one` logs the refusal and leaves the batch open, and only
`approved` withdrawals are ever re-decided (`_take_approved`), never `batched` ones. The withdrawals
stay `batched`, their holds pending, forever; and no route reaches `Payouts.drop_from_batch` (the
set-aside retry refuses an active batch), so an operator cannot free them without SQL.

Played here with the real Payouts and Signer on a bitcoin node stand-in, a decision TTL of 2 s,
and the signer unavailable (what SignerClient raises when its socket is gone) across it.

Fix: on a `decision_expired` refusal (or before signing, from the batch's own rows), drop the
expired withdrawals from the open batch back to `approved` (the batch is abandoned and its coins
freed when it empties), so the next run re-decides them and pays them under a new batch.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid

from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.container import Container
from custody.policy_config import default_policy
from custody.settings import Settings
from ledger.model import AccountKind, Transfer
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.wire import SignerUnavailable
from tests.approvers import registry
from tests.integration.own_database import own_database
from tests.integration.test_review12w_lost_lock import DEST, HOT_COIN, KEYS, StandInBitcoin
from tests.integration.hot_coins import index_hot_coin

log = logging.getLogger(__name__)
TTL = dt.timedelta(seconds=2)


class Outage:
    """The signer process as its client sees it: unavailable while `down`."""

    def __init__(self, real) -> None:
        self.real, self.down = real, False

    def __getattr__(self, name: str):  # noqa: ANN204
        method = getattr(self.real, name)

        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            if self.down:
                raise SignerUnavailable("signer at unix:/run/custody-signer/signer.sock: Connection refused")
            return method(*a, **kw)
        return call


def test_a_batch_whose_decisions_expired_while_the_signer_was_down_is_paid_after_it_returns(database_url):
    with own_database(database_url, "r12w_stuck") as eng:
        ledger = Ledger(eng)
        node = StandInBitcoin()
        c = Container(settings=Settings(environment="test"), engine=eng, ledger=ledger).with_chains(
            {"bitcoin": node}, signer_keys=KEYS, approvers=registry(),
            policy=dataclasses.replace(default_policy(), decision_ttl=TTL))
        c.wallets.configure_asset("BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000,
                                  withdrawal_fee=5_000)
        for tier in ("deposit", "hot"):
            c.wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
        txid = uuid.uuid4().hex * 2
        with eng.begin() as conn:
            conn.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                              "VALUES (:t, 0, :a, 0, 0, :m)"), {"t": txid, "a": hot, "m": HOT_COIN})
            index_hot_coin(conn, txid, 0, hot, HOT_COIN)
            c.payouts.book_hot_funding("bitcoin", "BTC", HOT_COIN, f"hot-funding:bitcoin:{txid}:0", conn=conn)
        equity = c.wallets.firm_account("equity", "BTC")
        acct = ledger.open_account("BTC", AccountKind.customer, "r12w:bob", owner="r12w-bob").id
        ledger.post("r12w-fund-bob", [Transfer(equity, acct, 100_000_000)], kind="treasury_credit")
        w = c.withdrawals.request(client_withdrawal_id="r12w-stuck", account_id=acct, amount=10_000_000, destination=DEST,
                                  requested_by="backend-test")
        assert_equal(w.state, "approved")
        p = c.payouts
        signer = Outage(p.signer)
        p.signer = signer

        log.info("the payouts job batches it; the signer process is down")
        assert p.batch_bitcoin() is not None
        signer.down = True
        p.sign_open_batches()
        time.sleep(TTL.total_seconds() + 1)
        log.info("the signer is back after the decision expired; the payouts job runs on")
        signer.down = False
        for _ in range(4):
            for step in (p.batch_bitcoin, p.sign_open_batches, p.broadcast):
                step()
        with eng.connect() as conn:
            state = conn.execute(text("SELECT state FROM withdrawal_request WHERE id = :w"), {"w": w.id}).scalar_one()
            open_batches = conn.execute(text("SELECT count(*) FROM withdrawal_batch WHERE state = 'open'")).scalar_one()
        log.info("withdrawal %d: %s; open batches %d; refusals %s", w.id, state, open_batches, p.refusals)
        ledger.assert_verified()
    assert_equal(state, "broadcast")  # re-decided (a fresh decision) and paid, without an operator
    assert_equal(open_batches, 0)
