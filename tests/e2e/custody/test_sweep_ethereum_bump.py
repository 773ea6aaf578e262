"""sweep_ethereum_bump: a stuck gas funding and a stuck token sweep are replaced at the same nonce
with higher fees (custody.eth_moves), against anvil.

Anvil's block gas limit is set below 21,000 for `stuck_blocks` blocks (manual mining), so nothing
of ours is mined: the funding (hot nonce) and then the sweep (deposit-address nonce) wait in the
mempool. `bump_fees()` asks the signer for the same transaction at higher fees, stores the version
(`eth_tx_version`, linked to the one it replaces) and sends it; once the limit is back, the
replacement is mined and only it is booked, with its real gas. The sweep's deposit address was
funded with gas for a bumped sweep (`bump_reserve_percent`), so its replacement can pay too.
Reconciliation's ethereum lines equal the baseline before, while a replaced version waits, while
the mined one is in transit, and after it is booked.

The second scenario asks a bump twice: the process dies after the signer answered and before
custody stored the replacement; the restart asks again and gets the SAME replacement (one record
at the signer, one version stored). Its broadcast fails, so the node still has only the first
version, which is mined: tracking follows that version (no nonce-conflict incident) and books it,
once, with its gas; the sweep then goes through. The third has two workers bump the same stuck
funding at once: one replacement. The ledger verifies at the end of each.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from chain_adapters.errors import ChainError
from custody.eth_moves import EthBumpConfig
from regtest import control
from regtest.util import assert_equal
from tests.e2e.custody.conftest import ETH_FINALITY
from tests.e2e.custody.test_sweep_ethereum import clean_slate, deposit, differences, drain, fund_hot, restart, rows, unfinished

USDT = 10**6
ETHER = 10**18
STUCK = 2


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler of ours swallows it."""


@pytest.fixture
def sweeps(custody, ledger, anvil):
    """The session's ethereum sweeps with a low threshold, bumps after STUCK blocks (+25%) and gas
    money for two bumps at each token sweep's address; restored afterwards (and anvil's block gas
    limit), the ledger verified."""
    s = custody.eth_sweeps
    kept = (dict(s.thresholds), s.bump, s.bump_reserve_percent)
    limit = anvil.w3.eth.get_block("latest")["gasLimit"]
    s.thresholds = {"ETH": ETHER // 2, "USDT": 100 * USDT}
    s.bump, s.bump_reserve_percent = EthBumpConfig(stuck_blocks=STUCK, bump_percent=25), 100
    yield s
    anvil.call("evm_setBlockGasLimit", hex(limit))
    s.thresholds, s.bump, s.bump_reserve_percent = kept
    assert_equal(unfinished(custody.engine), 0)
    assert_equal([c.name for c in ledger.verify() if not c.ok], [])


def versions(engine, machine: str, row_id: int) -> list:
    with engine.connect() as c:
        return c.execute(text("SELECT id, txid, replaces_id, max_fee_wei FROM eth_tx_version WHERE machine = :m AND row_id = :r "
                              "ORDER BY id"), {"m": machine, "r": row_id}).all()


def gas_of(anvil, txid: str) -> int:
    receipt = anvil.w3.eth.get_transaction_receipt(txid)
    return int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])


def pending(anvil) -> list[str]:
    """The txids anvil holds in its mempool."""
    pool = anvil.call("txpool_content")
    return [tx["hash"].lower() for section in ("pending", "queued") for txs in (pool.get(section) or {}).values()
            for tx in txs.values()]


def conflicts(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM incident WHERE kind = 'eth_sweep_nonce_conflict'")).scalar_one()


def stall(anvil) -> int:
    """STUCK blocks that cannot hold any transaction of ours; the gas limit to restore (an eth_call,
    such as reconciliation's token balances, fails meanwhile: reconciled once it is restored)."""
    limit = anvil.w3.eth.get_block("latest")["gasLimit"]
    anvil.call("evm_setBlockGasLimit", hex(20_000))
    anvil.mine(STUCK)
    return limit


def planned_token_sweep(custody, customer, anvil, usdt, sweeps, log) -> tuple:
    """A credited 300 USDT deposit planned for a sweep with its gas funding; (sweep row, funding row)."""
    fund_hot(custody, anvil, 2 * ETHER)
    baseline = clean_slate(custody, anvil, log)
    address = deposit(custody, customer, anvil, usdt, tokens=300 * USDT)
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    assert_equal(differences(custody), baseline)
    [sweep_id] = sweeps.plan()
    [sweep] = rows(custody.engine, "eth_sweep", [address])
    [funding] = rows(custody.engine, "eth_gas_funding", [address])
    assert_equal(sweep.id, sweep_id)
    assert_equal(int(sweep.max_fee_cap_wei), 2 * int(sweep.max_fee_wei))  # room for its bumps ...
    assert_equal(int(funding.amount), int(sweep.gas_limit) * int(sweep.max_fee_cap_wei))  # ... funded
    return baseline, address, sweep, funding


def test_a_stuck_gas_funding_and_a_stuck_token_sweep_are_replaced_and_only_the_mined_versions_are_booked(
        custody, customer, anvil, usdt, engine, ledger, sweeps, log):
    s = sweeps
    baseline, address, sweep, funding = planned_token_sweep(custody, customer, anvil, usdt, s, log)
    expense = custody.wallets.firm_account("network_fees", "ETH")
    expense_before = ledger.balance(expense).posted
    with control.manual_mining(anvil):
        log.info("the funding is signed and sent, then no block can hold it for %d blocks", STUCK)
        [first] = s.sign()
        s.broadcast()
        limit = stall(anvil)
        s.track()
        [second] = s.bump_fees()
        assert_equal(s.bump_fees(), [])  # one replacement per stuck version
        [v1, v2] = versions(engine, "eth_gas_funding", funding.id)
        assert_equal((v1.txid, v2.txid, v2.replaces_id), (first, second, v1.id))
        assert int(v2.max_fee_wei) >= int(v1.max_fee_wei) * 125 // 100
        log.info("blocks may hold transactions again (anvil refused the replacement above the block gas limit: "
                 "stored, it is sent by track); none is mined yet")
        anvil.call("evm_setBlockGasLimit", hex(limit))
        s.track()
        assert second in pending(anvil)
        assert first not in pending(anvil)
        assert_equal(differences(custody), baseline)  # the replaced version waits: nothing moved
        log.info("the replacement (same hot nonce) is mined")
        anvil.mine(1)
        s.track()
        assert_equal(differences(custody), baseline)  # mined, not final: in transit, counted once
        anvil.mine(ETH_FINALITY)
        s.track()
        assert_equal(differences(custody), baseline)
        [f] = rows(engine, "eth_gas_funding", [address])
        assert_equal((f.state, f.txid, int(f.fee)), ("final", second, gas_of(anvil, second)))

        log.info("the sweep is signed and sent, then stuck as well")
        [sweep_first] = s.sign()
        s.broadcast()
        limit = stall(anvil)
        s.track()
        [sweep_second] = s.bump_fees()
        [w1, w2] = versions(engine, "eth_sweep", sweep.id)
        assert_equal((w1.txid, w2.txid, w2.replaces_id), (sweep_first, sweep_second, w1.id))
        anvil.call("evm_setBlockGasLimit", hex(limit))
        s.track()
        assert_equal(pending(anvil), [sweep_second])
        assert_equal(differences(custody), baseline)
        anvil.mine(1)
        s.track()
        assert_equal(differences(custody), baseline)
        anvil.mine(ETH_FINALITY)
        s.track()
        assert_equal(differences(custody), baseline)
    [sw] = rows(engine, "eth_sweep", [address])
    assert_equal((sw.state, sw.txid, int(sw.fee)), ("final", sweep_second, gas_of(anvil, sweep_second)))
    log.info("only the mined versions' gas is booked; the deposit address keeps the unburnt gas, booked there")
    assert_equal(expense_before - ledger.balance(expense).posted, gas_of(anvil, second) + gas_of(anvil, sweep_second))
    assert_equal(usdt.balance_of(address), 0)
    assert_equal(custody.adapters["ethereum"].balance(address), int(funding.amount) - gas_of(anvil, sweep_second))
    assert_equal(conflicts(engine), 0)


def test_a_bump_asked_again_after_a_crash_is_the_same_replacement_and_the_first_version_mined_is_booked(
        custody, customer, anvil, usdt, engine, ledger, sweeps, log, monkeypatch):
    s = sweeps
    baseline, address, sweep, funding = planned_token_sweep(custody, customer, anvil, usdt, s, log)
    expense = custody.wallets.firm_account("network_fees", "ETH")
    expense_before = ledger.balance(expense).posted
    signer, answers = s.signer, []

    class CrashAfterAnswer:
        """The signer answers the replacement; the worker dies before storing it."""

        def __getattr__(self, name):
            return getattr(signer, name)

        def sign_ethereum_gas_funding(self, *args, **kwargs):
            tx = signer.sign_ethereum_gas_funding(*args, **kwargs)
            if kwargs.get("replaces_txid"):
                answers.append(tx.txid)
                raise Crash()
            return tx

    conflicts_before = conflicts(engine)
    with control.manual_mining(anvil):
        [first] = s.sign()
        s.broadcast()
        limit = stall(anvil)
        s.signer = CrashAfterAnswer()
        try:
            with pytest.raises(Crash):
                s.bump_fees()
        finally:
            s.signer = signer
        assert_equal(len(versions(engine, "eth_gas_funding", funding.id)), 1)  # nothing stored
        log.info("restarted: the bump is asked again; the node refuses nothing but the send fails")
        adapter = custody.adapters["ethereum"]
        real_broadcast = adapter.broadcast

        def lost(raw: bytes):
            if raw != bytes(rows(engine, "eth_gas_funding", [address])[0].raw):
                return real_broadcast(raw)
            raise ChainError("connection reset while sending")

        monkeypatch.setattr(adapter, "broadcast", lost)
        [again] = s.bump_fees()
        monkeypatch.setattr(adapter, "broadcast", real_broadcast)
        assert_equal(again, answers[0])  # the same replacement, not a second one
        with engine.connect() as c:
            recorded = c.execute(text("SELECT count(*) FROM signer_eth_sweep WHERE kind = 'gas' AND sweep_id = :s"),
                                 {"s": sweep.id}).scalar_one()
        assert_equal(recorded, 2)  # the first version and one replacement, recorded once
        assert_equal([v.txid for v in versions(engine, "eth_gas_funding", funding.id)], [first, again])
        log.info("the node only has the first version; it is mined")
        anvil.call("evm_setBlockGasLimit", hex(limit))
        assert_equal(differences(custody), baseline)
        anvil.mine(1)
        assert_equal(anvil.w3.eth.get_transaction_receipt(first)["status"], 1)
        s.track()
        assert_equal(differences(custody), baseline)
        [f] = rows(engine, "eth_gas_funding", [address])
        assert_equal(f.txid, first)  # the mined version followed
        anvil.mine(ETH_FINALITY)
        s.track()
        assert_equal(differences(custody), baseline)
    [f] = rows(engine, "eth_gas_funding", [address])
    assert_equal((f.state, int(f.fee)), ("final", gas_of(anvil, first)))
    assert_equal(conflicts(engine), conflicts_before)  # our own version holds the nonce: no incident
    assert_equal(expense_before - ledger.balance(expense).posted, gas_of(anvil, first))
    log.info("the sweep then goes through")
    drain(custody, anvil, baseline, log)
    [sw] = rows(engine, "eth_sweep", [address])
    assert_equal(sw.state, "final")
    assert_equal(expense_before - ledger.balance(expense).posted, gas_of(anvil, first) + gas_of(anvil, sw.txid))


def test_two_workers_bumping_at_once_make_one_replacement(custody, customer, anvil, usdt, engine, signer_keys, eth_adapter,
                                                          sweeps, log):
    """Two worker processes (fresh service objects) run `bump_fees` side by side on the same stuck
    funding: the row lock held across the signer call lets one replace it; the other finds the new
    txid and stops. One replacement, one record at the signer, two versions."""
    s = sweeps
    baseline, address, sweep, funding = planned_token_sweep(custody, customer, anvil, usdt, s, log)
    workers = []
    for _ in range(2):
        w = restart(custody, signer_keys, usdt, eth_adapter, s.thresholds).eth_sweeps
        w.bump, w.bump_reserve_percent = s.bump, s.bump_reserve_percent
        workers.append(w)
    with control.manual_mining(anvil):
        [first] = s.sign()
        s.broadcast()
        limit = stall(anvil)
        with ThreadPoolExecutor(2) as pool:
            made = [txid for new in pool.map(lambda w: w.bump_fees(), workers) for txid in new]
        assert_equal(len(made), 1)
        assert_equal([v.txid for v in versions(engine, "eth_gas_funding", funding.id)], [first, made[0]])
        with engine.connect() as c:
            replacements = c.execute(text("SELECT count(*) FROM signer_eth_sweep WHERE kind = 'gas' AND sweep_id = :s "
                                          "AND replaces_txid IS NOT NULL"), {"s": sweep.id}).scalar_one()
        assert_equal(replacements, 1)
        anvil.call("evm_setBlockGasLimit", hex(limit))
        s.track()
        assert_equal(differences(custody), baseline)
    log.info("the replacement is mined and booked; the sweep goes through")
    drain(custody, anvil, baseline, log)
    [f] = rows(engine, "eth_gas_funding", [address])
    assert_equal((f.state, f.txid, int(f.fee)), ("final", made[0], gas_of(anvil, made[0])))
