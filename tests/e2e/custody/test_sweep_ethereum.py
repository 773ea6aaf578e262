"""sweep_ethereum: booked ether and USDT deposits on many deposit addresses are swept to the hot
address against anvil. Each USDT address is first paid the gas its sweep may burn by the hot
address (gas limit x max fee, from the node); the signer signs every sweep with the deposit key it
derives itself, to the hot address it derives itself, at the next nonce of that address. At every
step (planned, funding mined, funding final, sweep mined, sweep final) reconciliation's ethereum
lines are exactly what they were before the test (zero on a fresh session): the funding and the
sweeps are in transit while mined and not final, then booked. Afterwards the deposit addresses hold
only leftover gas dust, which the books hold too; the gas of every transaction is in the network-fee
expense to the wei.

The second scenario kills the process (a BaseException) at the step boundaries: after the signer
signed the gas funding and before custody stored it; after the node took the funding and before
custody recorded the broadcast; after the signer signed the sweep and before custody stored it. A
restart (fresh service objects on the same database and nodes) finishes the sweep with one funding
and one sweep on chain, nothing lost and the books exact.

The third shows a funding and a withdrawal taking consecutive hot nonces from one counter; the
fourth a token sweep that reverts on chain: only its gas is booked, its deposits are swept again at
the next nonce. Every scenario leaves nothing in flight.
"""
from __future__ import annotations

import uuid

import pytest
from eth_utils import keccak
from sqlalchemy import text

import custody.eth_sweeps as eth_sweeps_module
from custody.container import Container
from custody.devchains import signer_asset_entries
from regtest.util import assert_equal
from signer.assets import assets_from_entries
from tests.approvers import registry
from tests.e2e import txbuild
from tests.e2e.custody.conftest import ETH_FINALITY

USDT = 10**6
ETHER = 10**18


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler of ours swallows it."""


def restart(custody, signer_keys, usdt, eth_adapter, thresholds) -> Container:
    """Fresh service objects on the same database and nodes, wired as the session's custody is."""
    fresh = Container(settings=custody.settings, engine=custody.engine, ledger=custody.ledger)
    fresh.with_chains(custody.adapters, signer_keys=signer_keys, approvers=registry(),
                      signer_assets=assets_from_entries(signer_asset_entries(usdt.address)), ethereum_chain_id=eth_adapter.chain_id)
    fresh.eth_sweeps.thresholds = dict(thresholds)
    return fresh


def differences(custody) -> dict:
    """Every ethereum reconciliation line's difference, with the scanner brought to the tip first."""
    custody.deposits.run_once(["ethereum"])
    lines = custody.reconciliation.run(chains=["ethereum"])
    assert_equal(sorted((line.tier, line.asset) for line in lines), [("deposit", "ETH"), ("deposit", "USDT"),
                                                                     ("hot", "ETH"), ("hot", "USDT")])
    return {(line.tier, line.asset): line.difference for line in lines}


def fund_hot(custody, anvil, wei: int) -> None:
    """Treasury sends the hot address ether, booked from the chain once final (equity -> hot)."""
    txid = anvil.fund(custody.payouts.hot_address("ethereum"), wei)
    anvil.mine(ETH_FINALITY)
    custody.payouts.book_ethereum_funding(txid, by="test-sweep-ethereum")


def deposit(custody, customer, anvil, usdt, *, ether: int = 0, tokens: int = 0) -> str:
    """A new customer's deposit address paid `ether` wei and `tokens` USDT units (not yet credited)."""
    owner = f"sweep-eth-{uuid.uuid4().hex[:8]}"
    acct = customer("ETH" if ether else "USDT", owner)
    address = custody.wallets.issue_address(f"addr:{acct}", acct).address
    if ether:
        anvil.fund(address, ether)
    if tokens:
        customer("USDT", owner)
        usdt.mint(address, tokens)
    return address


def rows(engine, table: str, addresses: list[str]) -> list:
    with engine.connect() as c:
        return c.execute(text(f"SELECT * FROM {table} WHERE lower(address) = ANY(:a) ORDER BY id"),
                         {"a": [a.lower() for a in addresses]}).all()


def unfinished(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT (SELECT count(*) FROM eth_sweep WHERE state NOT IN ('final', 'reverted')) "
                              "+ (SELECT count(*) FROM eth_gas_funding WHERE state NOT IN ('final', 'reverted'))")).scalar_one()


def clean_slate(custody, anvil, log) -> dict:
    """Sweep whatever booked deposits earlier suites left (thresholds 0 for the while), so this test
    sweeps only its own; the reconciliation differences afterwards, the test's baseline."""
    s = custody.eth_sweeps
    kept, s.thresholds = s.thresholds, {"ETH": 0, "USDT": 0}
    try:
        drain(custody, anvil, differences(custody), log)
    finally:
        s.thresholds = kept
    return differences(custody)


def drain(custody, anvil, baseline, log, rounds: int = 8) -> None:
    """Run the sweep jobs, mining as the chain would, until nothing is in flight; reconciliation
    equals `baseline` after every step."""
    s = custody.eth_sweeps
    for _ in range(rounds):
        s.plan()
        s.sign()
        s.broadcast()
        assert_equal(differences(custody), baseline)  # signed or sent, mined or not: explained
        anvil.mine(1)
        s.track()
        assert_equal(differences(custody), baseline)  # mined, not final: in transit
        anvil.mine(ETH_FINALITY)
        s.track()
        assert_equal(differences(custody), baseline)  # booked
        if unfinished(custody.engine) == 0 and not s.plan():
            return
    raise AssertionError(f"sweeps still in flight after {rounds} rounds")


@pytest.fixture
def thresholds(custody):
    """Sweep USDT above 500 and ether above 0.5 in this test; restored afterwards."""
    before = dict(custody.eth_sweeps.thresholds)
    custody.eth_sweeps.thresholds = {"ETH": ETHER // 2, "USDT": 500 * USDT}
    yield dict(custody.eth_sweeps.thresholds)
    custody.eth_sweeps.thresholds = before


def test_ether_and_usdt_deposits_are_swept_to_hot_with_gas_funding(custody, customer, anvil, usdt, eth_adapter, engine,
                                                                  ledger, thresholds, log):
    s = custody.eth_sweeps
    hot = custody.payouts.hot_address("ethereum")
    accounts = {(tier, asset): custody.wallets.location_account("ethereum", tier, asset)
                for tier in ("deposit", "hot") for asset in ("ETH", "USDT")}
    expense = custody.wallets.firm_account("network_fees", "ETH")

    def held(tier: str, asset: str) -> int:  # asset locations run negative
        return -ledger.balance(accounts[(tier, asset)]).posted

    fund_hot(custody, anvil, 5 * ETHER)
    baseline = clean_slate(custody, anvil, log)
    log.info("baseline reconciliation %s", baseline)

    log.info("five USDT addresses, three ether addresses, one address with both")
    token_amounts = [150 * USDT + i for i in range(5)]
    ether_amounts = [ETHER // 5 + i for i in range(3)]
    token_addresses = [deposit(custody, customer, anvil, usdt, tokens=t) for t in token_amounts]
    ether_addresses = [deposit(custody, customer, anvil, usdt, ether=e) for e in ether_amounts]
    both = deposit(custody, customer, anvil, usdt, ether=ETHER // 10, tokens=200 * USDT)
    mine = token_addresses + ether_addresses + [both]
    log.info("below the thresholds while not credited: nothing is planned")
    assert_equal(s.plan(), [])
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    assert_equal(differences(custody), baseline)

    books_before = {k: held(*k) for k in accounts}
    expense_before = ledger.balance(expense).posted
    hot_usdt_before, hot_eth_before = usdt.balance_of(hot), eth_adapter.balance(hot)

    log.info("over the thresholds: USDT addresses get a gas funding each; the one with ether pays its own gas")
    planned = s.plan()
    sweeps = rows(engine, "eth_sweep", mine)
    assert_equal(sorted(r.id for r in sweeps), sorted(planned))
    assert_equal(sorted((r.address, r.asset, int(r.nonce)) for r in sweeps),
                 sorted([(a, "USDT", 0) for a in token_addresses] + [(a, "ETH", 0) for a in ether_addresses]
                        + [(both, "USDT", 0)]))  # one move per address at a time: `both`'s token first
    for a, t in zip(token_addresses + [both], token_amounts + [200 * USDT]):
        [r] = [r for r in sweeps if r.address == a]
        assert_equal(int(r.amount), t)  # exactly its booked deposits
    for a, e in zip(ether_addresses, ether_amounts):
        [r] = [r for r in sweeps if r.address == a]
        assert_equal(int(r.amount), e - 21_000 * int(r.max_fee_wei))  # balance minus the gas it may burn
    fundings = rows(engine, "eth_gas_funding", mine)
    assert_equal(sorted(f.address for f in fundings), sorted(token_addresses))  # `both` holds ether enough for its gas
    for f in fundings:
        [sw] = [r for r in sweeps if r.id == f.sweep_id]
        assert_equal(int(f.amount), int(sw.gas_limit) * int(sw.max_fee_wei))  # just the gas its sweep may burn
    assert_equal(differences(custody), baseline)

    log.info("fundings first: the token sweeps wait until their funding is final")
    s.sign()
    assert_equal({f.state for f in rows(engine, "eth_gas_funding", mine)}, {"signed"})
    assert_equal([r.state for r in rows(engine, "eth_sweep", token_addresses)], ["open"] * len(token_addresses))
    assert_equal({r.state for r in rows(engine, "eth_sweep", ether_addresses + [both])}, {"signed"})  # no funding needed
    drain(custody, anvil, baseline, log)

    log.info("every deposit address holds no USDT, only leftover gas; the hot address has it all")
    assert_equal([usdt.balance_of(a) for a in mine], [0] * len(mine))
    swept_usdt = sum(token_amounts) + 200 * USDT
    assert_equal(usdt.balance_of(hot) - hot_usdt_before, swept_usdt)
    sweeps, fundings = rows(engine, "eth_sweep", mine), rows(engine, "eth_gas_funding", mine)
    assert_equal({r.state for r in sweeps + fundings}, {"final"})
    log.info("`both` paid its token sweep's gas from its own booked ether, which stays below the threshold, unswept")
    [both_sweep] = [r for r in sweeps if r.address == both]
    assert_equal((both_sweep.asset, int(both_sweep.nonce)), ("USDT", 0))
    assert_equal(eth_adapter.balance(both), ETHER // 10 - int(both_sweep.fee))
    for a in token_addresses:
        [f] = [f for f in fundings if f.address == a]
        [sw] = [r for r in sweeps if r.address == a]
        dust = eth_adapter.balance(a)
        assert_equal(dust, int(f.amount) - int(sw.fee))  # what the sweep did not burn stays there ...
        assert dust > 0
    for a in ether_addresses:
        [r] = [r for r in sweeps if r.address == a]
        dust = eth_adapter.balance(a)
        assert_equal(dust, 21_000 * int(r.max_fee_wei) - int(r.fee))  # the gas reserve it did not burn
        assert dust < 21_000 * int(r.max_fee_wei)

    log.info("a gas funding is the firm's own ether at the deposit address: never recorded as a customer's deposit")
    with engine.connect() as c:
        recorded = c.execute(text("SELECT count(*) FROM deposit_observation WHERE txid = ANY(:t)"),
                             {"t": [f.txid for f in fundings]}).scalar_one()
    assert_equal(recorded, 0)

    log.info("books: USDT deposit -> hot exactly, every wei of gas in the expense, dust still at the deposit location")
    gas = sum(int(r.fee) for r in sweeps + fundings)
    swept_ether = sum(int(r.amount) for r in sweeps if r.asset == "ETH")
    funded = sum(int(f.amount) for f in fundings)
    assert_equal(held("deposit", "USDT") - books_before[("deposit", "USDT")], -swept_usdt)
    assert_equal(held("hot", "USDT") - books_before[("hot", "USDT")], swept_usdt)
    assert_equal(expense_before - ledger.balance(expense).posted, gas)  # debited: credits count positive
    assert_equal(held("hot", "ETH") - books_before[("hot", "ETH")], swept_ether - funded
                 - sum(int(f.fee) for f in fundings))
    assert_equal(held("deposit", "ETH") - books_before[("deposit", "ETH")],
                 funded - swept_ether - sum(int(r.fee) for r in sweeps))
    assert_equal(eth_adapter.balance(hot) - hot_eth_before, swept_ether - funded - sum(int(f.fee) for f in fundings))
    assert_equal(differences(custody), baseline)
    assert_equal(unfinished(engine), 0)
    ledger.assert_verified()


def test_crash_between_funding_and_sweep_recovers_without_loss_or_double_funding(
        custody, customer, anvil, usdt, eth_adapter, engine, ledger, signer_keys, thresholds, log, monkeypatch):
    hot = custody.payouts.hot_address("ethereum")
    fund_hot(custody, anvil, ETHER)
    baseline = clean_slate(custody, anvil, log)
    address = deposit(custody, customer, anvil, usdt, tokens=600 * USDT)
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    hot_usdt_before, hot_nonce_before = usdt.balance_of(hot), eth_adapter.nonce(hot)
    [sweep_id] = custody.eth_sweeps.plan()

    real_advance = eth_sweeps_module.advance

    def dies_when(table: str, to: str):
        def advance(c, machine, row_id, from_state, to_state, **columns):
            if (machine, to_state) == (table, to):
                raise Crash()
            return real_advance(c, machine, row_id, from_state, to_state, **columns)
        return advance

    log.info("the signer signs the gas funding; the process dies before it is stored")
    monkeypatch.setattr(eth_sweeps_module, "advance", dies_when("eth_gas_funding", "signed"))
    with pytest.raises(Crash):
        custody.eth_sweeps.sign()
    monkeypatch.undo()
    assert_equal([f.state for f in rows(engine, "eth_gas_funding", [address])], ["open"])
    assert_equal(eth_adapter.nonce(hot), hot_nonce_before)  # nothing sent
    assert_equal(differences(custody), baseline)

    log.info("restart: the same funding (same nonce, same bytes) is signed and stored; the node takes it; "
             "the process dies before recording the broadcast")
    s = restart(custody, signer_keys, usdt, eth_adapter, thresholds).eth_sweeps
    assert_equal(s.plan(), [])  # the address has its sweep: nothing new, no second funding
    [txid] = s.sign()
    monkeypatch.setattr(eth_sweeps_module, "advance", dies_when("eth_gas_funding", "broadcast"))
    with pytest.raises(Crash):
        s.broadcast()
    monkeypatch.undo()
    anvil.mine(1)
    assert_equal(differences(custody), baseline)  # mined, recorded as signed only: still explained

    log.info("restart: the broadcast is sent again (the node knows it), final, booked once")
    s = restart(custody, signer_keys, usdt, eth_adapter, thresholds).eth_sweeps
    assert_equal(s.broadcast(), 1)
    anvil.mine(ETH_FINALITY)
    s.track()
    [funding] = rows(engine, "eth_gas_funding", [address])
    assert_equal((funding.state, funding.txid), ("final", txid))
    assert_equal(eth_adapter.nonce(hot), hot_nonce_before + 1)  # exactly one funding left the hot address
    assert_equal(eth_adapter.balance(address), int(funding.amount))
    assert_equal(differences(custody), baseline)

    log.info("the signer signs the sweep; the process dies before it is stored")
    monkeypatch.setattr(eth_sweeps_module, "advance", dies_when("eth_sweep", "signed"))
    with pytest.raises(Crash):
        s.sign()
    monkeypatch.undo()
    assert_equal([r.state for r in rows(engine, "eth_sweep", [address])], ["open"])

    log.info("restart: the sweep is signed again at the same nonce, sent once, booked once")
    drain(restart(custody, signer_keys, usdt, eth_adapter, thresholds), anvil, baseline, log)
    [sweep] = rows(engine, "eth_sweep", [address])
    assert_equal((sweep.id, sweep.state, int(sweep.nonce)), (sweep_id, "final", 0))
    with engine.connect() as c:
        signed = c.execute(text("SELECT kind, nonce, txid FROM signer_eth_sweep WHERE sweep_id = :s ORDER BY id"),
                           {"s": sweep_id}).all()
    assert_equal([(r.kind, int(r.nonce)) for r in signed], [("gas", int(funding.nonce))] * 2 + [("sweep", 0)] * 2)
    assert_equal({r.txid for r in signed if r.kind == "sweep"}, {sweep.txid})  # the same transaction, signed twice
    assert_equal(eth_adapter.nonce(address), 1)
    assert_equal(usdt.balance_of(address), 0)
    assert_equal(usdt.balance_of(hot) - hot_usdt_before, 600 * USDT)
    assert_equal(eth_adapter.balance(address), int(funding.amount) - int(sweep.fee))  # the dust, booked at the deposit location
    assert_equal(eth_adapter.nonce(hot), hot_nonce_before + 1)  # one funding, never two
    assert_equal(differences(custody), baseline)
    assert_equal(unfinished(engine), 0)
    ledger.assert_verified()


def test_a_gas_funding_and_a_withdrawal_never_share_a_hot_nonce(custody, customer, anvil, usdt, eth_adapter, engine, ledger,
                                                                thresholds, log):
    """The funding's hot nonce is reserved when the sweep is planned, from the counter withdrawals
    take theirs from: a withdrawal signed before the funding takes the next one, waits in the
    node's queue until the funding is sent, and both are mined."""
    hot = custody.payouts.hot_address("ethereum")
    fund_hot(custody, anvil, ETHER)
    baseline = clean_slate(custody, anvil, log)
    address = deposit(custody, customer, anvil, usdt, tokens=700 * USDT)
    owner = f"sweep-eth-withdrawer-{uuid.uuid4().hex[:8]}"
    acct = customer("ETH", owner)
    anvil.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, ETHER // 5)
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])

    log.info("the sweep is planned: its funding holds the next hot nonce")
    [sweep_id] = custody.eth_sweeps.plan()
    [funding] = rows(engine, "eth_gas_funding", [address])
    assert_equal(int(funding.nonce), eth_adapter.nonce(hot))

    log.info("a withdrawal is signed and sent before the funding: it takes the nonce after, and waits")
    w, p = custody.withdrawals, custody.payouts
    wd = w.request(client_withdrawal_id=f"sweep-nonce-{uuid.uuid4().hex[:8]}", account_id=acct, amount=ETHER // 10,
                   destination=txbuild.eth_new_address(f"sweep-nonce-{owner}"), requested_by="backend")
    assert_equal(wd.state, "approved")
    [batch] = p.batch_ethereum()
    [txid] = p.sign_open_batches()
    with engine.connect() as c:
        nonce = c.execute(text("SELECT nonce FROM chain_transaction WHERE txid = :t"), {"t": txid}).scalar_one()
    assert_equal(int(nonce), int(funding.nonce) + 1)
    assert_equal(p.broadcast(), 1)
    anvil.mine(1)
    assert eth_adapter.mined(txid) is None  # the node holds it behind the funding's nonce
    assert_equal(differences(custody), baseline)

    log.info("the funding is signed and sent: both are mined, then the sweep, everything booked")
    drain(custody, anvil, baseline, log)
    p.track()
    assert_equal(w.get(wd.id).state, "final")
    [sweep] = rows(engine, "eth_sweep", [address])
    assert_equal((sweep.id, sweep.state), (sweep_id, "final"))
    assert_equal(usdt.balance_of(address), 0)
    assert_equal(differences(custody), baseline)
    assert_equal(unfinished(engine), 0)
    ledger.assert_verified()


def token_balance_slot(address: str) -> str:
    """The storage slot of TestToken's `balanceOf[address]` (the mapping is its 4th slot, 3)."""
    return "0x" + keccak(bytes(12) + bytes.fromhex(address[2:]) + (3).to_bytes(32, "big")).hex()


def test_a_reverted_token_sweep_books_only_its_gas_and_its_deposits_are_swept_again(custody, customer, anvil, usdt, eth_adapter,
                                                                                   engine, ledger, thresholds, log):
    """A token that refuses the transfer (here: the deposit address's token balance is taken away on
    the node after the sweep was signed, and given back once the sweep is booked) costs the sweep its
    gas only: booked deposit ETH -> expense, the deposits freed, a new sweep at the next nonce."""
    fund_hot(custody, anvil, ETHER)
    baseline = clean_slate(custody, anvil, log)
    address = deposit(custody, customer, anvil, usdt, tokens=800 * USDT)
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    s = custody.eth_sweeps
    [first] = s.plan()
    s.sign()
    s.broadcast()
    anvil.mine(ETH_FINALITY)
    s.track()
    assert_equal(differences(custody), baseline)

    log.info("the sweep is signed; the token's balance of the address is taken away on the node before it is sent")
    s.sign()
    slot = token_balance_slot(address)
    anvil.call("anvil_setStorageAt", usdt.address, slot, "0x" + (0).to_bytes(32, "big").hex())
    assert_equal(usdt.balance_of(address), 0)
    s.broadcast()
    anvil.mine(ETH_FINALITY)
    s.track()
    [sweep] = rows(engine, "eth_sweep", [address])
    assert_equal((sweep.id, sweep.state, int(sweep.nonce)), (first, "reverted", 0))
    with engine.connect() as c:
        booked = c.execute(text("SELECT kind, metadata FROM journal_transaction WHERE idempotency_key = :k"),
                           {"k": f"eth_sweep:{first}:reverted"}).one()
        freed = c.execute(text("SELECT count(*) FROM deposit_observation WHERE lower(address) = lower(:a) AND eth_swept_by IS NULL"),
                          {"a": address}).scalar_one()
    assert_equal((booked.kind, int(booked.metadata["gas"])), ("sweep", int(sweep.fee)))
    assert_equal(freed, 1)
    anvil.call("anvil_setStorageAt", usdt.address, slot, "0x" + (800 * USDT).to_bytes(32, "big").hex())
    assert_equal(differences(custody), baseline)  # the gas left the deposit address and the books alike

    log.info("the deposits are swept again at the next nonce; everything booked")
    drain(custody, anvil, baseline, log)
    swept = [r for r in rows(engine, "eth_sweep", [address]) if r.state == "final"]
    assert_equal([(int(r.nonce), int(r.amount)) for r in swept], [(1, 800 * USDT)])
    assert_equal(usdt.balance_of(address), 0)
    assert_equal(unfinished(engine), 0)
    ledger.assert_verified()
