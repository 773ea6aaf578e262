"""Review of issue 12 (R2): two workers in the same payout step, as happens when a job's advisory
lock is lost mid-run.

custody.jobs holds a job's lock on a session of its own while the job runs on other connections.
When that one session dies (a PostgreSQL restart or failover, a network cut of the idle lock
connection longer than the keepalives, pg_terminate_backend) the run goes on, another worker takes
the lock and runs the same steps at the same time; JobLocks says so and relies on "the idempotent
steps". These tests play that interleaving with the real Payouts and the real (deterministic,
RFC 6979) Signer, on a bitcoin node stand-in:

- sign: worker A's signer call returns; before A stores it, worker B signs the same open batch
  (the same coins, outputs and fee: the same bytes) and stores it. A's INSERT of the same txid
  into chain_transaction fails with unique_violation, which custody.containment does not count as
  a passing race (only IllegalTransition, OperationalError, ChainError are), so the batch, already
  signed and captured by B, is SET ASIDE: broadcast skips it until an operator retries.
- fee bump: the same with `bump_fees`: the duplicate replacement's unique_violation sets aside a
  batch that is on chain, a CRITICAL incident, which engages the kill switch and halts every
  withdrawal of every customer.

Fix: in `_sign_bitcoin` / `_record_replacement` (and the ethereum twins), lock the batch / the
replaced version (`SELECT ... FOR UPDATE`) and check it is still open / unreplaced before the
INSERT, returning quietly when another worker got there; or count a unique_violation on
chain_transaction.txid as the passing race it is. Either way the second worker must leave the row
active and raise no incident.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from chain_adapters.base import BitcoinFee, BlockRef, BroadcastResult, TxState, TxStatus
from chain_adapters.bitcoin import BitcoinAdapter, txid_of
from custody.addresses import derive_btc_address
from custody.container import Container
from custody.controls import kill_switch
from custody.payouts import PayoutConfig, Payouts
from custody.settings import Settings
from ledger.model import AccountKind, Transfer
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.approvers import registry
from tests.integration.own_database import own_database
from tests.integration.hot_coins import index_hot_coin

log = logging.getLogger(__name__)
KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
DEST = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # not ours
HOT_COIN = 300_000_000


class StandInBitcoin(BitcoinAdapter):
    """A node that answers what batching, broadcast and fee bumps ask: a fee, a tip that the test
    moves, every broadcast accepted, every sent transaction pending in the mempool."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", network="regtest")
        self.height = 200

    def estimate_fee(self, target_blocks: int = 6) -> BitcoinFee:
        return BitcoinFee(10_000, target_blocks, "node")

    def tip(self) -> BlockRef:
        return BlockRef(self.height, f"{self.height:064x}")

    def broadcast(self, raw: bytes) -> BroadcastResult:
        return BroadcastResult(txid_of(raw), already_known=False)

    def tx_status(self, txid: str, raw: bytes | None = None) -> TxStatus:
        return TxStatus(txid, TxState.MEMPOOL)


class Interleave:
    """Worker A's signer: the real signer answers A, then `meanwhile` (worker B's whole step) runs
    before A gets the answer, once."""

    def __init__(self, real, meanwhile) -> None:
        self.real, self.meanwhile, self.done = real, meanwhile, False

    def _then(self, result):
        if not self.done:
            self.done = True
            log.info("worker A has its signature; worker B runs the same step now")
            self.meanwhile()
        return result

    def sign_bitcoin_batch(self, *a, **kw):
        return self._then(self.real.sign_bitcoin_batch(*a, **kw))

    def sign_bitcoin_replacement(self, *a, **kw):
        return self._then(self.real.sign_bitcoin_replacement(*a, **kw))


@pytest.fixture()
def world(database_url):
    """One approved 0.1 BTC withdrawal and one confirmed hot coin (booked as funding) on a database
    of the test's own; worker A and worker B are two Payouts on it (two processes' pipelines)."""
    with own_database(database_url, "r12w_lock") as eng:
        ledger = Ledger(eng)
        node = StandInBitcoin()
        c = Container(settings=Settings(environment="test"), engine=eng, ledger=ledger).with_chains(
            {"bitcoin": node}, signer_keys=KEYS, approvers=registry())
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
        acct = ledger.open_account("BTC", AccountKind.customer, "r12w:alice", owner="r12w-alice").id
        ledger.post("r12w-fund", [Transfer(equity, acct, 100_000_000)], kind="treasury_credit")
        w = c.withdrawals.request(client_withdrawal_id="r12w-1", account_id=acct, amount=10_000_000, destination=DEST,
                                  requested_by="backend-test")
        assert_equal(w.state, "approved")
        real = c.payouts.signer
        config = PayoutConfig(bitcoin_network="regtest")

        def worker(signer) -> Payouts:
            p = Payouts(eng, ledger, c.wallets, {"bitcoin": node}, signer, config)
            p.withdrawals = c.withdrawals
            return p

        yield eng, ledger, node, real, worker


def batch_row(eng, batch_id: int):
    with eng.connect() as c:
        return c.execute(text("SELECT state, containment FROM withdrawal_batch WHERE id = :b"), {"b": batch_id}).one()


def incidents(eng) -> list[tuple[str, str]]:
    with eng.connect() as c:
        return [tuple(r) for r in c.execute(text("SELECT kind, severity FROM incident ORDER BY id"))]


def test_a_second_worker_signing_the_same_batch_does_not_set_it_aside(world):
    eng, ledger, node, real, worker = world
    b = worker(real)
    a = worker(Interleave(real, b.sign_open_batches))
    batch = a.batch_bitcoin()
    assert batch is not None
    a.sign_open_batches()  # B signs and stores while A holds the same signature
    with eng.connect() as c:
        versions = c.execute(text("SELECT count(*) FROM chain_transaction WHERE batch_id = :b"), {"b": batch}).scalar_one()
    log.info("batch %d: %s, %d version(s), incidents %s", batch, tuple(batch_row(eng, batch)), versions, incidents(eng))
    a.broadcast()
    b.broadcast()
    state = tuple(batch_row(eng, batch))
    found = incidents(eng)
    ledger.assert_verified()
    assert_equal(versions, 1)  # stored once, captured once
    assert_equal(found, [])  # nothing failed: another worker did the step
    assert_equal(state, ("broadcast", "active"))  # and it is sent, with no operator needed


def test_a_second_worker_bumping_the_same_version_does_not_halt_withdrawals(world):
    eng, ledger, node, real, worker = world
    first = worker(real)
    batch = first.batch_bitcoin()
    first.sign_open_batches()
    first.broadcast()
    assert_equal(tuple(batch_row(eng, batch)), ("broadcast", "active"))
    node.height += PayoutConfig().stuck_blocks  # pending for stuck_blocks: both workers bump it
    b = worker(real)
    a = worker(Interleave(real, b.bump_fees))
    a.bump_fees()
    with eng.connect() as c:
        replacements = c.execute(text("SELECT count(*) FROM chain_transaction WHERE batch_id = :b AND replaces_id IS NOT NULL"),
                                 {"b": batch}).scalar_one()
    halted = kill_switch(eng).engaged
    state, found = tuple(batch_row(eng, batch)), incidents(eng)
    log.info("batch %d: %s; %d replacement(s); incidents %s; kill switch %s", batch, state, replacements, found, halted)
    ledger.assert_verified()
    assert_equal(replacements, 1)
    assert_equal(found, [])  # no "batch_set_aside" critical incident for a race between two workers
    assert not halted, "a duplicate fee bump by two workers engaged the kill switch: every withdrawal is halted"
    assert_equal(state, ("broadcast", "active"))
