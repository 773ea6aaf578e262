"""Refill approvals (warm -> hot, bitcoin and ethereum) under the withdrawals' key rules, and their expiry.

Keys: an approval of a refill is checked at the door with the very function withdrawal approvals
use (custody.withdrawals `verify_operator_approval`): a `console:` key whose credential was revoked
is `approver_unknown` and nothing is stored. When the worker counts the quorum before it asks the
signer (custody.rebalances `counted_refill_approvals`), an approval counts only while its key still
does: a console credential revoked AFTER it approved, or an ed25519 approver taken out of the
registry, no longer makes up the quorum, and the signer is not asked. The signer counts on its own
against its own registry: a key removed from it (how the signer learns a revocation) is refused.

Expiry: a refill waiting for its quorum longer than the policy's `refill_ttl` (PolicySet) expires at
the worker's next pass (open -> expired, audited `<machine>.expire`; its warm coins are free
again); a refill whose quorum is complete is signed, never expired. An approval once the time is
up is `refill_expired` (409), whether the worker expired the row yet or not, and stores nothing.
An expired ethereum refill no longer blocks the next one (migration 0045's indexes).

Rows are written directly (no chain: the fakes answer the few node calls the steps make; the signer
fake records what it was asked). Own database."""
from __future__ import annotations

import datetime as dt
import os

import pytest
from eth_utils import keccak, to_checksum_address
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.settings import Settings

from custody.addresses import derive_btc_address, derive_eth_address
from custody.errors import CustodyError, CustodyErrorCode
from custody.eth_rebalances import EthRebalanceConfig, EthRebalances
from custody.rebalances import _TIER_COINS_SQL, IN_PROGRESS, RebalanceConfig, Rebalances, RebalanceThreshold
from custody.rebalances import counted_refill_approvals
from custody.wallets import Wallets
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.approvals import ApproverRegistry, b64url
from signer.assets import SignerAsset
from signer.keys import Secret, SignerKeys, seed_from_text
from signer.protocol import RefusalCode, SigningRefused
from signer.service import Signer
from tests.approvers import SoftAuthenticator, entry, sign_approval, signature_json
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
HOT_ETH = derive_eth_address(KEYS.account_xpub("ethereum", "hot"), 0)  # the signer's own hot address
WARM_ETH = to_checksum_address("0x" + keccak(b"refill-approval-keys: warm")[-20:].hex())
HOT_BTC = derive_btc_address(KEYS.account_xpub("bitcoin", "hot"), "regtest", 0, 0)
TTL = dt.timedelta(hours=1)
ETHER = 10**18


class FakeSigner:
    """Records every refill it is asked to sign and refuses it (what the real one says is not the point here)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def sign_ethereum_rebalance(self, rebalance_id: int, **_: object):
        self.asked.append(rebalance_id)
        raise SigningRefused(RefusalCode.rebalance_not_approved, "fake signer: asked")


class FakeEthereum:
    chain_id = 31337

    def nonce(self, address: str) -> int:
        return 0


class FakeBitcoin:
    class _Fee:
        sat_per_kvb = 1_000

    def estimate_fee(self):
        return self._Fee()


class ConsoleKey(SoftAuthenticator):
    """A console credential's passkey: key id `console:<credential id, base64url>`, as the console exports it."""

    def __init__(self, username: str, credential_id: bytes) -> None:
        super().__init__(username, label=f"console-{credential_id.hex()}")
        self.credential_id = credential_id
        self.key_id = f"console:{b64url(credential_id)}"


def console_credential(engine, username: str) -> ConsoleKey:
    """An active console credential (enrolled pending, approved by an admin), its key."""
    key = ConsoleKey(username, os.urandom(16))
    with engine.begin() as c:
        c.execute(text("INSERT INTO console_credential (username, credential_id, public_key, rp_id, origin) "
                       "VALUES (:u, :i, :k, :rp, :o)"),
                  {"u": username, "i": key.credential_id, "k": key.public_key_cose, "rp": key.rp_id, "o": key.origin})
        c.execute(text("UPDATE console_credential SET state = 'active', role = 'operator', decided_by = 'admin-root', "
                       "decided_at = now() WHERE credential_id = :i"), {"i": key.credential_id})
    return key


def revoke(engine, key: ConsoleKey) -> None:
    with engine.begin() as c:
        c.execute(text("UPDATE console_credential SET state = 'revoked', decided_by = 'admin-root', decided_at = now() "
                       "WHERE credential_id = :i"), {"i": key.credential_id})


def age(engine, table: str, row_id: int, by: dt.timedelta) -> None:
    """Make the refill and the approvals it has so far look `by` older (their stamps moved back), as if
    it had waited that long since: an approval stored afterwards is `by` later than those. As the
    database's owner (migration 0049 refuses the process roles a change of `created_at`), the
    approvals' append-only trigger set aside for this statement (session_replication_role)."""
    approvals = {"rebalance": "rebalance_approval", "eth_rebalance": "eth_rebalance_approval"}[table]
    with engine.begin() as c:
        c.execute(text(f"UPDATE {table} SET created_at = created_at - :by WHERE id = :r"), {"by": by, "r": row_id})
        c.execute(text("SET LOCAL session_replication_role = replica"))
        c.execute(text(f"UPDATE {approvals} SET at = at - :by WHERE rebalance_id = :r"), {"by": by, "r": row_id})
        c.execute(text("SET LOCAL session_replication_role = origin"))


def eth_refill(engine, quorum: int = 2) -> int:
    """An open ethereum refill; the unfinished earlier ones closed."""
    with engine.begin() as c:
        c.execute(text("UPDATE eth_rebalance SET state = 'final', txid = 'x' || id, raw = '\\x00', nonce = 1000000 + id "
                       "WHERE source_tier = 'warm' AND state = 'open'"))
        return c.execute(text(
            "INSERT INTO eth_rebalance (asset, source_tier, destination_tier, destination, amount, spendable, ceiling, target, "
            "floor, gas_limit, max_fee_wei, priority_fee_wei, state, approvals_required) VALUES ('ETH', 'warm', 'hot', :d, :m, "
            "0, 3000000000000000000, 1000000000000000000, 500000000000000000, 21000, 2000000000, 1000000000, 'open', :q) "
            "RETURNING id"), {"d": HOT_ETH, "m": ETHER, "q": quorum}).scalar_one()


def btc_refill(engine, quorum: int = 2) -> int:
    """An open bitcoin refill; the earlier open ones abandoned."""
    with engine.begin() as c:
        c.execute(text("UPDATE rebalance SET state = 'abandoned' WHERE source_tier = 'warm' AND state = 'open'"))
        return c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, amount, "
            "fee, change_amount, fee_rate, spendable, ceiling, target, floor, approvals_required) VALUES ('bitcoin', 'BTC', "
            "'warm', 'hot', 'open', :d, 0, 100000000, 1000, 0, 1000, 0, 5000000000, 2000000000, 1000000000, :q) RETURNING id"),
            {"d": HOT_BTC, "q": quorum}).scalar_one()


def refused(code: CustodyErrorCode, call) -> None:
    with pytest.raises(CustodyError) as exc:
        call()
    assert_equal(exc.value.code, code)


def stored(engine, table: str, rebalance_id: int) -> list[str]:
    with engine.connect() as c:
        return c.execute(text(f"SELECT key_id FROM {table} WHERE rebalance_id = :r ORDER BY id"), {"r": rebalance_id}).scalars().all()


@pytest.fixture(scope="module")
def env(database_url):
    with own_database(database_url, "refill_approval_keys") as engine:
        ledger = Ledger(engine)
        wallets = Wallets(engine, ledger)
        wallets.configure_asset("ETH", 18, "ethereum", finality=2)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
        wallets.register_wallet("bitcoin", "warm", "regtest", KEYS.account_xpub("bitcoin", "warm"))
        anna = console_credential(engine, "anna-console")
        zoe = console_credential(engine, "zoe-console")
        approvers = ApproverRegistry.from_entries([entry("op-alice"), entry("op-bob"), anna.entry(), zoe.entry()])
        signer = FakeSigner()
        eth = EthRebalances(engine, ledger, wallets, FakeEthereum(), signer,  # type: ignore[arg-type]
                            hot_address=HOT_ETH, warm_address=WARM_ETH, approvers=approvers,
                            config=EthRebalanceConfig(refill_quorum=2, refill_ttl=TTL))
        btc = Rebalances(engine, ledger, wallets, FakeBitcoin(), None, hot_address=HOT_BTC, approvers=approvers,  # type: ignore[arg-type]
                         config=RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=50 * 10**8, target=20 * 10**8,
                                                                                     floor=10 * 10**8)}, refill_ttl=TTL))
        yield engine, eth, btc, signer, {"anna": anna, "zoe": zoe}
        ledger.assert_verified()


def test_a_revoked_console_key_approves_no_refill(env):
    engine, eth, btc, _, keys = env
    revoked = console_credential(engine, "rita-console")
    eth.approvers = btc.approvers = ApproverRegistry.from_entries(
        [entry("op-alice"), entry("op-bob"), keys["anna"].entry(), keys["zoe"].entry(), revoked.entry()])
    revoke(engine, revoked)  # its entry is still configured: only the credential's state says it is revoked
    for service, table, rebalance_id in ((eth, "eth_rebalance_approval", eth_refill(engine)),
                                         (btc, "rebalance_approval", btc_refill(engine))):
        payload = service.refill_payload(rebalance_id)
        refused(CustodyErrorCode.approver_unknown, lambda: service.approve_refill(
            rebalance_id, operator="rita-console", signature=revoked.assertion(payload)))
        assert_equal(stored(engine, table, rebalance_id), [])
        assert_equal(service.approve_refill(rebalance_id, operator="anna-console",
                                            signature=keys["anna"].assertion(payload)), 1)  # an active one is taken


def test_a_key_revoked_after_it_approved_no_longer_counts_towards_the_quorum(env):
    engine, eth, _, signer, keys = env
    zoe = keys["zoe"]
    rebalance_id = eth_refill(engine)
    payload = eth.refill_payload(rebalance_id)
    eth.approve_refill(rebalance_id, operator="op-alice", signature=sign_approval(payload, "op-alice"))
    assert_equal(eth.approve_refill(rebalance_id, operator="zoe-console", signature=zoe.assertion(payload)), 2)
    revoke(engine, zoe)
    with engine.connect() as c:
        assert_equal(counted_refill_approvals(c, "eth_rebalance_approval", rebalance_id, eth.approvers,
                                              ttl=TTL), 1)
    asked = len(signer.asked)
    assert_equal(eth.sign(), [])
    assert_equal(signer.asked[asked:], [])  # one valid approval of two: the signer is not asked
    assert_equal(eth.approve_refill(rebalance_id, operator="op-bob", signature=sign_approval(payload, "op-bob")), 2)
    eth.sign()
    assert_equal(signer.asked[asked:], [rebalance_id])  # two live keys: now it is


def test_an_approver_taken_out_of_the_registry_no_longer_counts(env):
    engine, _, btc, _, _ = env
    rebalance_id = btc_refill(engine)
    payload = btc.refill_payload(rebalance_id)
    for operator in ("op-alice", "op-bob"):
        btc.approve_refill(rebalance_id, operator=operator, signature=sign_approval(payload, operator))
    claimed = btc._claim_refill(signable=True)  # noqa: SLF001 - the worker's step that hands a refill to the signer
    assert claimed is not None and claimed[0] == rebalance_id
    registry = btc.approvers
    btc.approvers = ApproverRegistry([k for k in registry.keys() if k.operator != "op-bob"])
    try:
        assert_equal(btc._claim_refill(signable=True), None)  # noqa: SLF001
    finally:
        btc.approvers = registry


def test_a_bitcoin_refill_short_of_its_quorum_expires_after_the_ttl(env):
    engine, _, btc, _, keys = env
    rebalance_id = btc_refill(engine)
    payload = btc.refill_payload(rebalance_id)
    btc.approve_refill(rebalance_id, operator="op-alice", signature=sign_approval(payload, "op-alice"))
    with engine.begin() as c:  # a warm coin reserved for it
        c.execute(text("INSERT INTO btc_wallet_output (txid, vout, address, tier, derivation_change, derivation_index, amount, "
                       "block_height, block_hash) VALUES (:t, 0, 'warm-address', 'warm', 0, 0, 200000000, 1, 'h')"),
                  {"t": "ee" * 32})
        c.execute(text("INSERT INTO rebalance_input (rebalance_id, txid, vout, amount, derivation_change, derivation_index) "
                       "VALUES (:r, :t, 0, 200000000, 0, 0)"), {"r": rebalance_id, "t": "ee" * 32})

    def free_warm_coins() -> list[str]:
        with engine.connect() as c:
            return [k.txid for k in c.execute(_TIER_COINS_SQL, {"tier": "warm", "next_index": 1, "busy": list(IN_PROGRESS)})]

    assert_equal(free_warm_coins(), [])
    assert_equal(btc._claim_refill(signable=True), None)  # noqa: SLF001 - waits for approvals, not expired yet
    assert_equal(state(engine, "rebalance", rebalance_id), "open")

    age(engine, "rebalance", rebalance_id, TTL)
    late = sign_approval(payload, "op-bob")
    refused(CustodyErrorCode.refill_expired, lambda: btc.approve_refill(rebalance_id, operator="op-bob", signature=late))
    assert_equal(stored(engine, "rebalance_approval", rebalance_id), ["test-ed25519:op-alice"])
    assert_equal(btc._claim_refill(signable=True), None)  # noqa: SLF001 - the worker's pass expires it
    assert_equal(state(engine, "rebalance", rebalance_id), "expired")
    assert_equal(audits(engine, "rebalance.expire", f"rebalance:{rebalance_id}"), 1)
    assert_equal(free_warm_coins(), ["ee" * 32])
    refused(CustodyErrorCode.refill_expired, lambda: btc.approve_refill(rebalance_id, operator="op-bob", signature=late))
    with engine.begin() as c:
        c.execute(text("UPDATE btc_wallet_output SET spent_txid = 'x', spent_height = 2, spent_block_hash = 'h2' "
                       "WHERE txid = :t"), {"t": "ee" * 32})


def test_an_ethereum_refill_expires_and_no_longer_blocks_the_next(env):
    engine, eth, _, signer, keys = env
    rebalance_id = eth_refill(engine)
    payload = eth.refill_payload(rebalance_id)
    eth.approve_refill(rebalance_id, operator="op-alice", signature=sign_approval(payload, "op-alice"))
    age(engine, "eth_rebalance", rebalance_id, TTL + dt.timedelta(seconds=1))
    late = sign_approval(payload, "op-bob")
    refused(CustodyErrorCode.refill_expired, lambda: eth.approve_refill(rebalance_id, operator="op-bob", signature=late))
    assert_equal(stored(engine, "eth_rebalance_approval", rebalance_id), ["test-ed25519:op-alice"])
    asked = len(signer.asked)
    assert_equal(eth.sign(), [])
    assert_equal((state(engine, "eth_rebalance", rebalance_id), signer.asked[asked:]), ("expired", []))
    assert_equal(audits(engine, "eth_rebalance.expire", f"eth_rebalance:{rebalance_id}"), 1)
    refused(CustodyErrorCode.refill_expired, lambda: eth.approve_refill(rebalance_id, operator="op-bob", signature=late))
    with engine.begin() as c:  # the next refill may be opened while the expired one stays (one refill at a time otherwise)
        nxt = c.execute(text(
            "INSERT INTO eth_rebalance (asset, source_tier, destination_tier, destination, amount, spendable, ceiling, target, "
            "floor, gas_limit, max_fee_wei, priority_fee_wei, state, approvals_required) VALUES ('ETH', 'warm', 'hot', :d, 1, "
            "0, 3, 2, 1, 21000, 2000000000, 1000000000, 'open', 2) RETURNING id"), {"d": HOT_ETH}).scalar_one()
    assert nxt > rebalance_id


def test_a_late_approval_over_http_is_409_refill_expired(env):
    engine, eth, _, _, _ = env
    rebalance_id = eth_refill(engine)
    payload = eth.refill_payload(rebalance_id)
    age(engine, "eth_rebalance", rebalance_id, TTL)
    settings = Settings(environment="test")
    custody = Container(settings=settings, engine=engine, ledger=Ledger(engine))
    custody.eth_rebalances = eth
    client = TestClient(create_app(custody), raise_server_exceptions=False)
    client.headers["X-API-Key"] = create_api_key(engine, "op-alice", Role.operator, settings.api_key_pepper)
    r = client.post(f"/v1/eth-rebalances/{rebalance_id}/approve",
                    json={"comment": "late", "signature": signature_json(sign_approval(payload, "op-alice"))})
    assert_equal((r.status_code, r.json()["error"]["code"]), (409, "refill_expired"))
    assert_equal(stored(engine, "eth_rebalance_approval", rebalance_id), [])


def test_a_refill_whose_quorum_is_complete_is_signed_not_expired(env):
    engine, eth, _, signer, _ = env
    rebalance_id = eth_refill(engine)
    payload = eth.refill_payload(rebalance_id)
    for operator in ("op-alice", "op-bob"):
        eth.approve_refill(rebalance_id, operator=operator, signature=sign_approval(payload, operator))
    age(engine, "eth_rebalance", rebalance_id, 2 * TTL)  # the worker was down past the TTL: the quorum was met in time
    asked = len(signer.asked)
    eth.sign()
    assert_equal((state(engine, "eth_rebalance", rebalance_id), signer.asked[asked:]), ("open", [rebalance_id]))


def test_the_signer_counts_only_keys_of_its_own_registry(env):
    """How the signer learns a revocation: the key leaves its `[[approvers]]`. Two valid approvals are
    stored; a signer configured without op-bob's key counts one and refuses."""
    engine, eth, _, _, _ = env
    rebalance_id = eth_refill(engine)
    payload = eth.refill_payload(rebalance_id)
    for operator in ("op-alice", "op-bob"):
        eth.approve_refill(rebalance_id, operator=operator, signature=sign_approval(payload, operator))
    signer = Signer(engine, KEYS, bitcoin_network="regtest", ethereum_chain_id=FakeEthereum.chain_id,
                    assets={"ETH": SignerAsset("ethereum", None, 18)},
                    approvers=ApproverRegistry.from_entries([entry("op-alice")]), rebalance_quorum=2)
    with pytest.raises(SigningRefused) as exc:
        signer.sign_ethereum_rebalance(rebalance_id, asset="ETH", amount=ETHER, destination_tier="hot",
                                       chain_id=FakeEthereum.chain_id, nonce=0, gas=21000, max_fee_wei=2 * 10**9,
                                       priority_fee_wei=10**9)
    assert_equal(exc.value.code, RefusalCode.rebalance_not_approved)


def state(engine, table: str, row_id: int) -> str:
    with engine.connect() as c:
        return c.execute(text(f"SELECT state FROM {table} WHERE id = :r"), {"r": row_id}).scalar_one()


def audits(engine, action: str, subject: str) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM audit_event WHERE action = :a AND subject = :s"),
                         {"a": action, "s": subject}).scalar_one()
