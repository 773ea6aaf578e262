"""Two workers in one payout step, and batches whose decisions expired before they were signed.

Two workers can run the same step at once when a job's advisory lock is lost mid-run (custody.jobs
relies on the steps being idempotent). Here worker B runs its whole step in a thread of its own
(another process) while worker A holds its signer's answer, on both chains, for signing and for a
fee bump, with the real (deterministic) Signer: the signer is asked once, one version is stored,
nothing is captured twice, no incident, the batch stays active (custody.payouts `_claim_batch`,
`_claim_version`).

A batch whose withdrawals' decisions expired while it waited (the signer down, the kill switch
on) is refused `decision_expired` on every run. Those withdrawals, and only those, go back to
`approved` (custody.payouts `drop_expired`); the batch keeps the others, or is abandoned with its
coins freed when it empties; the next run re-decides them: paid under a new batch, or back to the
operators when the fresh decision needs approvals (the old approval signed the old decision).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid

import pytest
from sqlalchemy import text

from chain_adapters.base import BlockRef, BroadcastResult, EthereumFee, TxState, TxStatus
from chain_adapters.ethereum import EthereumAdapter
from custody.addresses import derive_btc_address
from custody.container import Container
from custody.controls import kill_switch, set_kill_switch
from custody.payouts import PayoutConfig, Payouts
from custody.policy_config import default_policy
from custody.settings import Settings
from ledger.model import AccountKind, Transfer
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.assets import assets_from_entries
from tests.approvers import approve, registry
from tests.integration.own_database import own_database
from tests.integration.test_review12w_lost_lock import DEST, HOT_COIN, KEYS, StandInBitcoin
from tests.integration.hot_coins import index_hot_coin

log = logging.getLogger(__name__)
ETH_DEST = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"  # EIP-55 test vector: not ours
ETH_HOT = 50 * 10**18


class StandInEthereum(EthereumAdapter):
    """A node that answers batching, signing, broadcast and bumps: no code at the destination,
    nonce 0, a fee, a tip the test moves, every broadcast accepted, every sent transaction pending."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", network="regtest")
        self.height = 200

    def has_code(self, address: str) -> bool:
        return False

    def nonce(self, address: str, *, pending: bool = True) -> int:
        return 0

    def estimate_fee(self, target_blocks: int = 6) -> EthereumFee:
        return EthereumFee(10**9, 10**9, 3 * 10**9)

    def tip(self) -> BlockRef:
        return BlockRef(self.height, f"{self.height:064x}")

    def broadcast(self, raw: bytes) -> BroadcastResult:
        from eth_utils import keccak

        return BroadcastResult("0x" + keccak(raw).hex(), already_known=False)

    def tx_status(self, txid: str, *, raw: bytes | None = None) -> TxStatus:
        return TxStatus(txid, TxState.MEMPOOL)


class Meanwhile:
    """Worker A's signer: the real signer answers A; then worker B's step runs in a thread (another
    process), and A waits for it up to `patience` s before it takes the answer (once). A B that
    waits on A's locks is left waiting and finishes after A; `finish()` joins it."""

    def __init__(self, real, step, patience: float = 3.0) -> None:
        self.real, self.step, self.patience = real, step, patience
        self.thread: threading.Thread | None = None
        self.errors: list[BaseException] = []

    def __getattr__(self, name: str):  # noqa: ANN204
        method = getattr(self.real, name)

        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            result = method(*a, **kw)
            if self.thread is None:
                log.info("worker A has its signature (%s); worker B runs the same step now", name)
                self.thread = threading.Thread(target=self._run, daemon=True)
                self.thread.start()
                self.thread.join(self.patience)
            return result
        return call

    def _run(self) -> None:
        try:
            self.step()
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.errors.append(exc)

    def finish(self) -> None:
        assert self.thread is not None, "worker A never asked the signer"
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker B is still blocked"
        assert_equal(self.errors, [])


@dataclasses.dataclass
class World:
    eng: object
    ledger: Ledger
    container: Container
    node: object
    chain: str
    withdrawal_ids: list[int]

    def worker(self, signer=None) -> Payouts:
        p = Payouts(self.eng, self.ledger, self.container.wallets, {self.chain: self.node},
                    signer or self.container.payouts.signer, PayoutConfig(bitcoin_network="regtest"))
        p.withdrawals = self.container.withdrawals
        return p

    def batch(self, p: Payouts) -> int:
        made = p.batch_bitcoin() if self.chain == "bitcoin" else p.batch_ethereum()
        assert made, "nothing batched"
        return made if self.chain == "bitcoin" else made[0]

    def one(self, sql: str, **params):  # noqa: ANN003, ANN201
        with self.eng.connect() as c:
            return c.execute(text(sql), params).one()

    def scalar(self, sql: str, **params):  # noqa: ANN003, ANN201
        with self.eng.connect() as c:
            return c.execute(text(sql), params).scalar_one()


def make_world(eng, chain: str, *, policy=None, amounts: tuple[int, ...] = ()) -> World:
    """Hot wallet funded and booked, one customer account funded; `amounts` are requested as
    withdrawals (default: one small one) and must come out approved or pending approval."""
    ledger = Ledger(eng)
    node = StandInBitcoin() if chain == "bitcoin" else StandInEthereum()
    c = Container(settings=Settings(environment="test"), engine=eng, ledger=ledger).with_chains(
        {chain: node}, signer_keys=KEYS, approvers=registry(), policy=policy,
        signer_assets=assets_from_entries({"BTC": {"chain": "bitcoin"}, "ETH": {"chain": "ethereum"}}),
        ethereum_chain_id=getattr(node, "chain_id", None))
    asset = "BTC" if chain == "bitcoin" else "ETH"
    if chain == "bitcoin":
        c.wallets.configure_asset("BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000,
                                  withdrawal_fee=5_000)
        for tier in ("deposit", "hot"):
            c.wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        hot = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
        for _ in range(2):  # two confirmed coins: a batch that keeps one leaves the other for a new batch
            txid = uuid.uuid4().hex * 2
            with eng.begin() as conn:
                conn.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                                  "VALUES (:t, 0, :a, 0, 0, :m)"), {"t": txid, "a": hot, "m": HOT_COIN})
                index_hot_coin(conn, txid, 0, hot, HOT_COIN)
                c.payouts.book_hot_funding("bitcoin", "BTC", HOT_COIN, f"hot-funding:bitcoin:{txid}:0", conn=conn)
        amounts, dest, funding = amounts or (10_000_000,), DEST, 100_000_000
    else:
        c.wallets.configure_asset("ETH", 18, "ethereum", finality=2, min_withdrawal=10**15, withdrawal_fee=10**15)
        c.wallets.register_wallet("ethereum", "hot", "regtest", KEYS.account_xpub("ethereum", "hot"))
        c.payouts.book_hot_funding("ethereum", "ETH", ETH_HOT, "hot-funding:ethereum:test")
        amounts, dest, funding = amounts or (10**17,), ETH_DEST, 10**19
    equity = c.wallets.firm_account("equity", asset)
    acct = ledger.open_account(asset, AccountKind.customer, f"races:{chain}", owner=f"races-{chain}").id
    ledger.post(f"races-fund:{chain}", [Transfer(equity, acct, funding)], kind="treasury_credit")
    ids = []
    for i, amount in enumerate(amounts):
        w = c.withdrawals.request(client_withdrawal_id=f"races-{chain}-{i}", account_id=acct, amount=amount,
                                  destination=dest, requested_by="backend-test")
        assert w.state in ("approved", "pending_approval"), w
        ids.append(w.id)
    return World(eng, ledger, c, node, chain, ids)


def incidents(w: World) -> list[tuple[str, str]]:
    with w.eng.connect() as c:
        return [tuple(r) for r in c.execute(text("SELECT kind, severity FROM incident ORDER BY id"))]


def signer_asked(w: World, batch_id: int) -> int:
    """How often the signer was asked about this batch: its own audit, signed or refused."""
    return w.scalar("SELECT count(*) FROM signer_audit WHERE batch_id = :b", b=batch_id)


# ---- two workers in one step -------------------------------------------------------------------

@pytest.mark.parametrize("chain", ["bitcoin", "ethereum"])
def test_two_workers_signing_one_batch_ask_the_signer_once_and_store_it_once(database_url, chain):
    with own_database(database_url, f"races_sign_{chain[:3]}") as eng:
        w = make_world(eng, chain)
        b = w.worker()
        a_signer = Meanwhile(w.container.payouts.signer, b.sign_open_batches)
        a = w.worker(a_signer)
        batch = w.batch(a)
        a.sign_open_batches()
        a_signer.finish()
        a.broadcast()
        b.broadcast()
        versions = w.scalar("SELECT count(*) FROM chain_transaction WHERE batch_id = :b", b=batch)
        asked = signer_asked(w, batch)
        captures = w.scalar("SELECT count(*) FROM journal_transaction WHERE kind = 'withdrawal_capture'")
        state = tuple(w.one("SELECT state, containment FROM withdrawal_batch WHERE id = :b", b=batch))
        nonce = w.scalar("SELECT coalesce(max(next_nonce), 0) FROM eth_nonce")
        found = incidents(w)
        log.info("%s batch %d: %s, %d version(s), signer asked %d time(s), nonce counter %d, incidents %s",
                 chain, batch, state, versions, asked, nonce, found)
        w.ledger.assert_verified()
    assert_equal((versions, captures), (1, 1))
    assert_equal(asked, 1)  # worker B found the batch being signed and left it: no second signing request
    assert_equal(found, [])
    assert_equal(state, ("broadcast", "active"))
    assert_equal(nonce, 1 if chain == "ethereum" else 0)  # no nonce taken by the worker that did nothing


@pytest.mark.parametrize("chain", ["bitcoin", "ethereum"])
def test_two_workers_bumping_one_version_replace_it_once_and_halt_nothing(database_url, chain):
    with own_database(database_url, f"races_bump_{chain[:3]}") as eng:
        w = make_world(eng, chain)
        first = w.worker()
        batch = w.batch(first)
        assert first.sign_open_batches()
        assert_equal(first.broadcast(), 1)
        w.node.height += PayoutConfig().stuck_blocks
        b = w.worker()
        a_signer = Meanwhile(w.container.payouts.signer, b.bump_fees)
        a = w.worker(a_signer)
        new = a.bump_fees()
        a_signer.finish()
        replacements = w.scalar("SELECT count(*) FROM chain_transaction WHERE batch_id = :b AND replaces_id IS NOT NULL", b=batch)
        spent_by_newest = w.scalar("SELECT count(*) FROM wallet_utxo u JOIN chain_transaction t ON t.id = u.spent_by "
                                   "WHERE t.batch_id = :b AND t.replaces_id IS NOT NULL", b=batch)
        asked = signer_asked(w, batch)
        halted = kill_switch(eng).engaged
        state, found = tuple(w.one("SELECT state, containment FROM withdrawal_batch WHERE id = :b", b=batch)), incidents(w)
        assert_equal(a.broadcast() + b.broadcast(), 1)  # the replacement, once
        log.info("%s batch %d: %s; %d replacement(s); signer asked %d time(s); incidents %s; kill switch %s",
                 chain, batch, state, replacements, asked, found, halted)
        w.ledger.assert_verified()
    assert_equal(len(new), 1)
    assert_equal(replacements, 1)
    assert_equal(asked, 2)  # the first version and one replacement: worker B asked for nothing
    assert_equal(spent_by_newest, 1 if chain == "bitcoin" else 0)  # the coin is spent by the replacement
    assert_equal(found, [])
    assert not halted, "two workers bumping one version engaged the kill switch"
    assert_equal(state, ("broadcast", "active"))


# ---- decisions that expired before signing -----------------------------------------------------

def test_only_the_withdrawals_whose_decision_expired_leave_the_batch(database_url):
    ttl = dt.timedelta(seconds=3)
    with own_database(database_url, "races_expired_part") as eng:
        w = make_world(eng, "bitcoin", policy=dataclasses.replace(default_policy(), decision_ttl=ttl),
                       amounts=(10_000_000,))
        provider = w.container.withdrawals.policies
        provider.base = dataclasses.replace(provider.base, decision_ttl=dt.timedelta(hours=1))  # the next ones last
        acct = w.scalar("SELECT account_id FROM withdrawal_request WHERE id = :w", w=w.withdrawal_ids[0])
        late = w.container.withdrawals.request(client_withdrawal_id="races-late", account_id=acct, amount=20_000_000,
                                               destination=DEST, requested_by="backend-test")
        early = w.withdrawal_ids[0]
        first_decision = w.scalar("SELECT decision_id FROM withdrawal_request WHERE id = :w", w=early)
        p = w.container.payouts
        batch = w.batch(p)
        assert_equal(p.drop_expired(batch), [])  # nothing expired yet: a refusal by a signer's fast clock drops nothing
        time.sleep(ttl.total_seconds() + 0.5)
        assert_equal(p.sign_open_batches(), [])
        assert_equal(p.refusals[-1], (batch, "decision_expired"))
        after = {r.id: (r.state, r.batch_id) for r in w.container.withdrawals.list()}
        batch_state = w.scalar("SELECT state FROM withdrawal_batch WHERE id = :b", b=batch)
        outputs = w.scalar("SELECT array_agg(withdrawal_id) FROM batch_output WHERE batch_id = :b", b=batch)
        dropped = w.one("SELECT actor, detail FROM audit_event WHERE action = 'batch.drop_expired'")
        log.info("after the refusal: %s; batch %d %s with %s; audit %s", after, batch, batch_state, outputs, tuple(dropped))
        assert_equal(after, {early: ("approved", None), late.id: ("batched", batch)})
        assert_equal((batch_state, outputs), ("open", [late.id]))
        assert_equal(dropped.detail["withdrawals"], [early])
        for _ in range(3):
            for step in (p.batch_bitcoin, p.sign_open_batches, p.broadcast):
                step()
        rows = {r.id: (r.state, r.batch_id, r.decision_id) for r in w.container.withdrawals.list()}
        captures = w.scalar("SELECT count(*) FROM journal_transaction WHERE kind = 'withdrawal_capture'")
        w.ledger.assert_verified()
    assert_equal(rows[late.id][:2], ("broadcast", batch))  # the rest of the batch was signed as it was
    assert_equal(rows[early][0], "broadcast")
    assert rows[early][1] != batch and rows[early][2] != first_decision, rows  # a new batch, a fresh decision
    assert_equal(captures, 2)


def test_an_expired_approved_withdrawal_goes_back_to_the_operators_after_a_kill_switch(database_url):
    """0.6 BTC needs one operator. Approved, batched; the kill switch is on until its decision
    expired. Released, the batch is refused, the withdrawal leaves it and is re-decided: pending
    approval under a new decision, which the first approval does not cover; a fresh approval pays it."""
    ttl = dt.timedelta(seconds=3)
    with own_database(database_url, "races_expired_appr") as eng:
        w = make_world(eng, "bitcoin", policy=dataclasses.replace(default_policy(), decision_ttl=ttl),
                       amounts=(60_000_000,))
        [wid] = w.withdrawal_ids
        p = w.container.payouts
        approve(w.container.withdrawals, wid, "op-alice")
        batch = w.batch(p)
        with eng.begin() as c:
            set_kill_switch(c, True, "incident drill", "op-admin")
        assert_equal(p.sign_open_batches(), [])
        assert_equal(p.refusals[-1], (batch, "kill_switch_on"))
        time.sleep(ttl.total_seconds() + 0.5)
        provider = w.container.withdrawals.policies
        provider.base = dataclasses.replace(provider.base, decision_ttl=dt.timedelta(hours=1))
        with eng.begin() as c:
            set_kill_switch(c, False, "drill over", "op-admin")
        for _ in range(2):
            for step in (p.batch_bitcoin, p.sign_open_batches, p.broadcast):
                step()
        view = w.container.withdrawals.get(wid)
        batch_state = w.scalar("SELECT state FROM withdrawal_batch WHERE id = :b", b=batch)
        coins_held = w.scalar("SELECT count(*) FROM wallet_utxo WHERE reserved_by = :b", b=batch)
        decisions = w.scalar("SELECT count(*) FROM policy_decision WHERE withdrawal_id = :w", w=wid)
        log.info("after the kill switch: withdrawal %s, batch %d %s, %d coin(s) still reserved, %d decisions",
                 view.state, batch, batch_state, coins_held, decisions)
        assert_equal((view.state, batch_state, coins_held, decisions), ("pending_approval", "abandoned", 0, 2))
        approve(w.container.withdrawals, wid, "op-alice", "approved again under the new decision")
        for step in (p.batch_bitcoin, p.sign_open_batches, p.broadcast):
            step()
        final = w.container.withdrawals.get(wid)
        captures = w.scalar("SELECT count(*) FROM journal_transaction WHERE kind = 'withdrawal_capture'")
        w.ledger.assert_verified()
    assert_equal((final.state, captures), ("broadcast", 1))
    assert final.batch_id != batch


def test_an_expired_ethereum_batch_is_abandoned_without_taking_a_nonce(database_url):
    ttl = dt.timedelta(seconds=3)
    with own_database(database_url, "races_expired_eth") as eng:
        w = make_world(eng, "ethereum", policy=dataclasses.replace(default_policy(), decision_ttl=ttl))
        [wid] = w.withdrawal_ids
        p = w.container.payouts
        batch = w.batch(p)
        time.sleep(ttl.total_seconds() + 0.5)
        assert_equal(p.sign_open_batches(), [])
        batch_state = w.scalar("SELECT state FROM withdrawal_batch WHERE id = :b", b=batch)
        nonce = w.scalar("SELECT coalesce(max(next_nonce), 0) FROM eth_nonce")
        assert_equal((w.container.withdrawals.get(wid).state, batch_state, nonce), ("approved", "abandoned", 0))
        provider = w.container.withdrawals.policies
        provider.base = dataclasses.replace(provider.base, decision_ttl=dt.timedelta(hours=1))
        for step in (p.batch_ethereum, p.sign_open_batches, p.broadcast):
            step()
        final = w.container.withdrawals.get(wid)
        nonces = w.one("SELECT array_agg(nonce ORDER BY id) AS n FROM chain_transaction").n
        w.ledger.assert_verified()
    assert_equal((final.state, nonces), ("broadcast", [0]))
    assert final.batch_id != batch
