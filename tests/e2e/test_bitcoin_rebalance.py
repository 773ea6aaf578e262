"""bitcoin_rebalance: the hot wallet above its ceiling sends spendable - target to a fresh address of
the watch-only cold wallet in ONE transaction (change back to the hot receive address). Nothing
happens without a registered cold wallet, under the kill switch, or at/below the ceiling. A crash
after signing but before storing is followed by a run that signs the same transaction again (same
txid); one stored but not broadcast is sent by the next run; never a second rebalance while one is
open. The signer refuses a destination not derived from the cold xpub. Reconciliation (deposit,
hot and cold lines) is exact mid-flight and at the end; at finality one journal transaction moves
hot -> cold (amount) and hot -> network-fee expense (fee), equal to the chain's figures. The
treasury routes are called through the typed custody.client."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from chain_adapters.bitcoin import to_sat
from custody.addresses import derive_btc_address
from custody.controls import set_kill_switch
from custody.jobs import build_scheduler
from custody.rebalances import RebalanceConfig, RebalanceThreshold
from regtest.util import assert_equal
from signer.service import BtcCoin, SigningRefused
from tests.e2e.custody.api_helpers import answered, refusal, refused, role_client
from tests.e2e.custody.conftest import BTC_FINALITY, custody, signer_keys  # noqa: F401 - the custody suite's fixtures
from tests.e2e.treasury_helpers import rebalances, spendable  # noqa: F401 - the fixture

BTC = 100_000_000


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler of ours swallows it."""


def die(*_a, **_k):
    raise Crash()


def lines(custody) -> dict:
    custody.deposits.run_once(["bitcoin"])  # the scanner at the tip, so the deposit line is compared too
    by_tier = {line.tier: line for line in custody.reconciliation.run(chains=["bitcoin"])}
    assert {"cold", "deposit", "hot"} <= set(by_tier)  # warm too, once a later suite registered it
    assert_equal({line.difference for line in by_tier.values()}, {0})
    return by_tier


def last_audit(engine) -> tuple:
    with engine.connect() as c:
        return tuple(c.execute(text("SELECT outcome, code, txid FROM signer_audit ORDER BY id DESC LIMIT 1")).one())


def test_rebalance_hot_to_cold(custody, bitcoind, engine, ledger, signer_keys, rebalances, log):  # noqa: F811
    wallets, hot_address = custody.wallets, custody.payouts.hot_address("bitcoin")
    hot = wallets.location_account("bitcoin", "hot", "BTC")
    cold = wallets.location_account("bitcoin", "cold", "BTC")
    expense = wallets.firm_account("network_fees", "BTC")
    with engine.connect() as c:
        rows_before = c.execute(text("SELECT count(*) FROM rebalance")).scalar_one()

    log.info("treasury funds the hot wallet 3 BTC above what it holds; thresholds: ceiling +2 BTC, target +0.5 BTC")
    bitcoind.mine(1)  # anything earlier suites left in the mempool is confirmed and counted first
    base = spendable(custody, engine)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=base + 2 * BTC, target=base + BTC // 2)})
    bitcoind.fund(hot_address, 3 * BTC)
    bitcoind.mine(1)
    held = spendable(custody, engine)
    assert_equal(held, base + 3 * BTC)

    log.info("no cold wallet registered: nothing happens")
    assert rebalances.rebalance_bitcoin() is None
    cold_xpub = signer_keys.account_xpub("bitcoin", "cold")
    wallets.register_wallet("bitcoin", "cold", "regtest", cold_xpub)

    log.info("kill switch engaged: nothing happens")
    with engine.begin() as c:
        set_kill_switch(c, True, "test: rebalance under the kill switch", "op-test")
    assert rebalances.rebalance_bitcoin() is None
    with engine.begin() as c:
        set_kill_switch(c, False, "test: over", "op-test")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance")).scalar_one(), rows_before)
    before = {a: ledger.balance(a).posted for a in (hot, cold, expense)}
    chain_before = lines(custody)

    log.info("crash: the signer signs, the process dies before the signed bytes are stored")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rebalances, "_store_signed", die)
        with pytest.raises(Crash):
            rebalances.rebalance_bitcoin()
    with engine.connect() as c:
        rb = c.execute(text("SELECT id, state, destination, destination_index, amount, fee, change_amount, txid FROM rebalance "
                            "ORDER BY id DESC LIMIT 1")).one()
        coins = [BtcCoin(k.txid, k.vout, int(k.amount), k.derivation_change, k.derivation_index) for k in c.execute(text(
            "SELECT txid, vout, amount, derivation_change, derivation_index FROM wallet_utxo WHERE rebalance_id = :r "
            "ORDER BY txid, vout"), {"r": rb.id})]
    outcome, _code, first_txid = last_audit(engine)
    assert_equal((rb.state, rb.txid, outcome), ("open", None, "signed"))
    amount, fee, change = int(rb.amount), int(rb.fee), int(rb.change_amount)
    assert_equal(amount, held - (base + BTC // 2))  # spendable - target
    assert_equal(rb.destination, derive_btc_address(cold_xpub, "regtest", 0, rb.destination_index))
    assert_equal(sum(k.amount for k in coins), amount + fee + change)
    assert first_txid not in bitcoind.rpc("getrawmempool")

    log.info("the signer refuses destinations not derived from the cold xpub (a stranger's, our own hot one)")
    stranger = bitcoind.wallet("getnewaddress", "", "bech32")
    for wrong in (stranger, hot_address):
        with pytest.raises(SigningRefused) as err:
            rebalances.signer.sign_bitcoin_rebalance(rb.id, coins, wrong, amount, (hot_address, change) if change else None)
        assert_equal(err.value.code.value, "destination_not_cold")
        assert_equal(last_audit(engine), ("refused", "destination_not_cold", None))
    assert_equal(bitcoind.wallet("getreceivedbyaddress", stranger, 0), 0)  # nothing paid it, not even in the mempool
    log.info("... and coins that are not the rebalance's reservation")
    with pytest.raises(SigningRefused) as err:
        rebalances.signer.sign_bitcoin_rebalance(rb.id, coins[:-1] or [BtcCoin("00" * 32, 0, 1, 0, 0)], rb.destination, amount, None)
    assert_equal(err.value.code.value, "unknown_input")

    log.info("next run: the same open rebalance is signed again, same txid, and stored; the process dies before broadcast")
    txid = rebalances.rebalance_bitcoin()
    assert_equal(txid, first_txid)
    assert txid not in bitcoind.rpc("getrawmempool")
    assert rebalances.rebalance_bitcoin() is None  # one in progress: never a second
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state, txid FROM rebalance WHERE id = :r"), {"r": rb.id}).one()[:], ("signed", txid))

    log.info("next run completes it: the stored bytes are broadcast, nothing new is opened")
    rebalances.run_once()
    assert txid in bitcoind.rpc("getrawmempool")
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance")).scalar_one(), rows_before + 1)
    tx = bitcoind.rpc("getrawtransaction", txid, True)
    paid = {o["scriptPubKey"]["address"]: to_sat(o["value"]) for o in tx["vout"]}  # Decimal BTC -> int sat
    assert_equal(paid, {rb.destination: amount, hot_address: change} if change else {rb.destination: amount})
    assert_equal(sorted((i["txid"], i["vout"]) for i in tx["vin"]), sorted((k.txid, k.vout) for k in coins))
    chain_fee = sum(k.amount for k in coins) - sum(paid.values())
    assert_equal(chain_fee, fee)

    log.info("mined, not final: nothing booked; reconciliation explains it as in transit on hot and cold")
    bitcoind.mine(1)
    assert_equal(rebalances.track(), 0)
    mid = lines(custody)
    assert_equal(mid["cold"].in_transit - chain_before["cold"].in_transit, amount)
    assert_equal(mid["hot"].in_transit - chain_before["hot"].in_transit, -(amount + fee))
    assert_equal({a: ledger.balance(a).posted for a in (hot, cold, expense)}, before)  # the change is not "funding"

    log.info("final: one journal transaction, equal to the chain's figures")
    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(rebalances.track(), 1)
    end = lines(custody)
    assert_equal(ledger.balance(cold).posted - before[cold], -amount)
    assert_equal(ledger.balance(hot).posted - before[hot], amount + fee)
    assert_equal(ledger.balance(expense).posted - before[expense], -chain_fee)
    assert_equal(end["cold"].on_chain - chain_before["cold"].on_chain, amount, -(ledger.balance(cold).posted - before[cold]))
    assert_equal(end["hot"].on_chain - chain_before["hot"].on_chain, -(amount + fee))
    with engine.connect() as c:
        entries = c.execute(text("SELECT e.account_id FROM journal_entry e JOIN journal_transaction t ON t.id = e.transaction_id "
                                 "WHERE t.idempotency_key = :k"), {"k": f"rebalance:{rb.id}:final"}).scalars().all()
    assert_equal(set(entries), {hot, cold, expense})  # never a customer

    log.info("a second run does nothing: the hot wallet is below its ceiling now (the scheduler runs the same job)")
    assert build_scheduler(custody).get_job("rebalances") is not None
    assert spendable(custody, engine) <= base + 2 * BTC
    rebalances.run_once()
    assert rebalances.rebalance_bitcoin() is None
    assert_equal(rebalances.track(), 0)
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance")).scalar_one(), rows_before + 1)
    assert_equal(ledger.balance(cold).posted - before[cold], -amount)
    lines(custody)


def test_an_open_rebalance_can_be_abandoned(custody, bitcoind, engine, ledger, rebalances, log):  # noqa: F811
    log.info("a rebalance left open (signed, never stored) is abandoned by an operator: its coins are free again")
    bitcoind.mine(1)
    held = spendable(custody, engine)
    assert held > 1_000_000  # the previous test left the hot wallet at its target
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=held - 1, target=held // 2)})
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rebalances, "_store_signed", die)
        with pytest.raises(Crash):
            rebalances.rebalance_bitcoin()
    with engine.connect() as c:
        rb = c.execute(text("SELECT id, state FROM rebalance ORDER BY id DESC LIMIT 1")).one()
    assert_equal(rb.state, "open")
    assert spendable(custody, engine) < held  # its coins are reserved

    log.info("treasury API: auditors and operators list it; the backend may not; an operator abandons it")
    api = {role: role_client(custody, role, role) for role in ("auditor", "operator", "backend")}
    (row,) = [r for r in api["auditor"].list_rebalances(state="open") if r.id == rb.id]
    assert_equal((row.state, row.source_tier, row.destination_tier, row.txid), ("open", "hot", "cold", None))
    assert_equal(row.amount_minor, held - held // 2)
    assert_equal(str(row.amount), f"{(held - held // 2) // BTC}.{(held - held // 2) % BTC:08d}")  # as the API wrote it
    for name in ("amount", "fee"):
        money = row.amounts[name]
        assert_equal((str(money.value), money.minor), (str(getattr(row, name)), getattr(row, f"{name}_minor")))
    assert_equal({k: row.amounts[k].minor for k in ("spendable", "ceiling", "target")},
                 {k: getattr(row, f"{k}_minor") for k in ("spendable", "ceiling", "target")})
    assert_equal(refusal(lambda: api["backend"].list_rebalances()).status, 403)
    assert_equal(refusal(lambda: api["auditor"].abandon_rebalance(rb.id, comment="x")).status, 403)
    assert_equal(refused(lambda: api["operator"].abandon_rebalance(999999999, comment="x")), (404, "not_found"))
    abandoned = answered(api["operator"], 200, api["operator"].abandon_rebalance(rb.id, comment="test: superseded"))
    assert_equal(abandoned.state, "abandoned")
    assert_equal(refused(lambda: api["operator"].abandon_rebalance(rb.id, comment="twice")), (409, "invalid_state"))
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT state FROM rebalance WHERE id = :r"), {"r": rb.id}).scalar_one(), "abandoned")
        assert_equal(c.execute(text("SELECT count(*) FROM wallet_utxo WHERE rebalance_id = :r"), {"r": rb.id}).scalar_one(), 0)
    assert_equal(spendable(custody, engine), held)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=held + BTC, target=held)})
    ran = answered(api["operator"], 200, api["operator"].run_rebalances())  # below the ceiling now: nothing new
    assert_equal([r.state for r in ran if r.state not in ("final", "abandoned")], [])
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance WHERE state NOT IN ('final', 'abandoned')")).scalar_one(), 0)
    lines(custody)


class NoSigning:
    """Stands in for the API process's signer client, which may not sign a rebalance: any call fails the test."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the API's rebalance route must not reach the signer, yet {name} was called")


def test_the_api_route_decides_and_the_worker_job_signs(custody, bitcoind, engine, ledger, rebalances, log):  # noqa: F811
    """`POST /v1/rebalances/run` runs the deciding step only (the API process's signer client may
    not sign a rebalance): it answers the new rebalance `open`, without a txid, its coins reserved;
    the worker's rebalance job signs, broadcasts and books that same rebalance."""
    bitcoind.mine(1)
    held = spendable(custody, engine)
    assert held > 1_000_000
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=held - 1, target=held // 2)})
    hot = custody.wallets.location_account("bitcoin", "hot", "BTC")
    cold = custody.wallets.location_account("bitcoin", "cold", "BTC")
    before = {a: ledger.balance(a).posted for a in (hot, cold)}
    operator = role_client(custody, "operator", "operator")

    log.info("the operator asks for a rebalance now: decided and opened, nothing signed")
    signer = rebalances.signer
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rebalances, "signer", NoSigning())
        newest = answered(operator, 200, operator.run_rebalances())[0]
        assert_equal((newest.state, newest.txid, newest.amount_minor), ("open", None, held - held // 2))
        again = operator.run_rebalances()  # still one: never a second
        assert_equal([r.id for r in again if r.state == "open"], [newest.id])
    assert rebalances.signer is signer
    assert spendable(custody, engine) < held  # its coins are reserved
    with engine.connect() as c:
        # ids of bitcoin and ethereum rebalances overlap (two tables): only the bitcoin move's audits
        assert_equal(c.execute(text("SELECT count(*) FROM signer_audit WHERE detail->>'rebalance_id' = :r "
                                    "AND detail->>'kind' IS DISTINCT FROM 'eth_rebalance'"),
                               {"r": str(newest.id)}).scalar_one(), 0)

    log.info("the worker's job signs and broadcasts that same rebalance, and books it at finality")
    rebalances.run_once()
    with engine.connect() as c:
        row = c.execute(text("SELECT state, txid, amount, fee FROM rebalance WHERE id = :r"), {"r": newest.id}).one()
    assert_equal(row.state, "broadcast")
    assert row.txid in bitcoind.rpc("getrawmempool")
    bitcoind.mine(BTC_FINALITY)
    assert_equal(rebalances.track(), 1)
    assert_equal(ledger.balance(cold).posted - before[cold], -int(row.amount))
    assert_equal(ledger.balance(hot).posted - before[hot], int(row.amount) + int(row.fee))
    lines(custody)
    ledger.assert_verified()
