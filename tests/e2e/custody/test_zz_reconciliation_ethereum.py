"""reconciliation_ethereum (named to run after every custody suite): ether and the test ERC-20 held
at the deposit addresses and at the hot address equal the books plus what is legitimately in
transit, to the wei and the token unit, read at one pinned block: deposits mined but not yet
credited; an ether and an ERC-20 withdrawal mined but not final (value on its asset's line, the
gas of both on the ether line); everything final. Then two planted differences are caught: a
hot-wallet funding booked that never reached the chain (a shortfall: a critical incident that
halts withdrawals), and ether at a deposit address that the deposit pipeline never recorded
although the scanner's cursor is at the tip (a scanner that skipped a block: a surplus, nobody's
money missing, so a warning incident and withdrawals go on). Both are explained (the forged entry
reversed; the cursor put back, the block rescanned and the deposit credited) and the kill switch
released, so later suites see clean books and chain."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from custody.errors import CustodyError
from ledger.model import Transfer
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.conftest import ETH_FINALITY

LINES = [("deposit", "ETH"), ("deposit", "USDT"), ("hot", "ETH"), ("hot", "USDT")]


def eth_lines(custody, log) -> dict:
    custody.deposits.run_once(["ethereum"])  # the scanner at the tip, so the deposit lines are compared too
    lines = {(line.tier, line.asset): line for line in custody.reconciliation.run(chains=["ethereum"])}
    for key, line in sorted(lines.items()):
        log.info("%s/%s: chain %d = books %d + in transit %d (difference %d)", *key, line.on_chain, line.books,
                 line.in_transit, line.difference)
    assert_equal(sorted(lines), LINES)
    return lines


def differences(lines: dict) -> dict:
    return {key: line.difference for key, line in lines.items()}


def in_transit_since(lines: dict, start: dict) -> dict:
    return {key: lines[key].in_transit - start[key].in_transit for key in LINES}


def last_incident(engine):
    with engine.connect() as c:
        return c.execute(text("SELECT kind, severity, detail FROM incident ORDER BY id DESC LIMIT 1")).one()


ZERO = dict.fromkeys(LINES, 0)


def test_ethereum_reconciles_mid_flight_and_catches_planted_differences(custody, customer, anvil, usdt, engine,
                                                                        ledger, log):
    w, p = custody.withdrawals, custody.payouts
    start = eth_lines(custody, log)
    assert_equal(differences(start), ZERO)

    owner = f"eth-recon-{id(log)}"
    eth_acct, usdt_acct = customer("ETH", owner), customer("USDT", owner)
    eth_addr = custody.wallets.issue_address(f"addr:{eth_acct}", eth_acct).address
    usdt_addr = custody.wallets.issue_address(f"addr:{usdt_acct}", usdt_acct).address
    ether_in, tokens_in = 3 * 10**18 + 7, 900_000_001
    hot = p.hot_address("ethereum")
    log.info("deposits of %d wei and %d USDT units; treasury funds the hot address %s with 4 ETH and 10,000 USDT",
             ether_in, tokens_in, hot)
    before_deposits = anvil.w3.eth.block_number
    anvil.fund(eth_addr, ether_in)
    usdt.mint(usdt_addr, tokens_in)
    funding, minted = anvil.fund(hot, 4 * 10**18), usdt.mint(hot, 10_000 * 10**6)
    p.book_hot_funding("ethereum", "ETH", 4 * 10**18, f"hot-funding:ethereum:{funding}")
    p.book_hot_funding("ethereum", "USDT", 10_000 * 10**6, f"hot-funding:ethereum:{minted}")

    log.info("deposits mined, not final: in transit on the deposit lines")
    lines = eth_lines(custody, log)
    assert_equal(differences(lines), ZERO)
    assert_equal(in_transit_since(lines, start), {**ZERO, ("deposit", "ETH"): ether_in, ("deposit", "USDT"): tokens_in})
    assert_equal(ledger.balance(eth_acct).posted, 0)

    log.info("final and credited: nothing in transit")
    anvil.mine(ETH_FINALITY)
    lines = eth_lines(custody, log)
    assert_equal((ledger.balance(eth_acct).posted, ledger.balance(usdt_acct).posted), (ether_in, tokens_in))
    assert_equal(differences(lines), ZERO)
    assert_equal(in_transit_since(lines, start), ZERO)
    eth = custody.adapters["ethereum"]  # reads pinned at a block ignore everything after it
    assert_equal((eth.balance(eth_addr, block=before_deposits), eth.balance(eth_addr)), (0, ether_in))
    assert_equal((eth.token_balance(usdt.address, usdt_addr, block=before_deposits), eth.token_balance(usdt.address, usdt_addr)),
                 (0, tokens_in))

    log.info("an ether and an ERC-20 withdrawal are signed, broadcast and mined")
    ether_out, tokens_out = 1_234_567_890_123_456_789, 123_456_789
    we = w.request(client_withdrawal_id=f"recon-eth-{eth_acct}", account_id=eth_acct, amount=ether_out,
                   destination=txbuild.eth_new_address("recon-eth"), requested_by="backend")
    wt = w.request(client_withdrawal_id=f"recon-usdt-{usdt_acct}", account_id=usdt_acct, amount=tokens_out,
                   destination=txbuild.eth_new_address("recon-usdt"), requested_by="backend")
    assert_equal((we.state, wt.state), ("approved", "approved"))
    assert_equal(len(p.batch_ethereum()), 2)
    txids = p.sign_open_batches()
    assert_equal(p.broadcast(), 2)
    for t in txids:
        anvil.wait_mined(t)
    gas = sum(eth.mined(t).fee for t in txids)
    assert gas > 0
    books_before = {key: line.books for key, line in lines.items()}

    log.info("mined, not final: value and gas (%d wei for both) explained as in transit on the hot lines", gas)
    p.track()
    lines = eth_lines(custody, log)
    assert_equal(differences(lines), ZERO)
    assert_equal(in_transit_since(lines, start), {**ZERO, ("hot", "ETH"): -(ether_out + gas), ("hot", "USDT"): -tokens_out})
    assert_equal({key: line.books for key, line in lines.items()}, books_before)

    log.info("final: booked in-flight -> hot location and gas -> expense; nothing in transit")
    anvil.mine(ETH_FINALITY)
    assert_equal(p.track(), 2)
    assert_equal((w.get(we.id).state, w.get(wt.id).state), ("final", "final"))
    end = eth_lines(custody, log)
    assert_equal(differences(end), ZERO)
    assert_equal(in_transit_since(end, start), ZERO)
    assert_equal(end[("hot", "ETH")].on_chain - start[("hot", "ETH")].on_chain, 4 * 10**18 - ether_out - gas)
    assert_equal(end[("hot", "USDT")].on_chain - start[("hot", "USDT")].on_chain, 10_000 * 10**6 - tokens_out)

    log.info("plant 1: a hot-wallet funding of 5 USDT is booked that never happened on chain")
    hot_usdt = custody.wallets.location_account("ethereum", "hot", "USDT")
    forged = ledger.post(f"test:forged-eth-funding:{owner}",
                         [Transfer(hot_usdt, custody.wallets.firm_account("equity", "USDT"), 5_000_000)], kind="hot_funding")
    lines = eth_lines(custody, log)
    assert_equal(differences(lines), {**ZERO, ("hot", "USDT"): -5_000_000})
    incident = last_incident(engine)
    assert_equal((incident.kind, incident.severity, incident.detail["chain"], incident.detail["tier"],
                  incident.detail["asset"], incident.detail["difference"]),
                 ("reconciliation_difference", "critical", "ethereum", "hot", "USDT", -5_000_000))
    assert kill_switch(engine).engaged
    with pytest.raises(CustodyError) as err:
        w.request(client_withdrawal_id=f"recon-halted-{eth_acct}", account_id=eth_acct, amount=10**16,
                  destination=txbuild.eth_new_address("recon-halted"), requested_by="backend")
    assert_equal(err.value.code.value, "withdrawals_halted")
    ledger.reverse(forged.transaction_id, f"test:forged-eth-funding:{owner}:reversal")
    assert_equal(differences(eth_lines(custody, log)), ZERO)
    with engine.begin() as c:
        set_kill_switch(c, False, "test: forged funding reversed", "op-test")

    log.info("plant 2: 0.5 ETH reaches a deposit address in a block the scanner's cursor passes without recording it")
    with engine.connect() as c:
        saved = c.execute(text("SELECT height, hash FROM chain_cursor WHERE chain = 'ethereum'")).one()
    anvil.fund(eth_addr, 5 * 10**17)
    tip = eth.tip()
    with engine.begin() as c:  # a scanner that skipped the block: the cursor at the tip, nothing observed
        c.execute(text("UPDATE chain_cursor SET height = :h, hash = :x WHERE chain = 'ethereum'"), {"h": tip.height, "x": tip.hash})
    lines = {(line.tier, line.asset): line for line in custody.reconciliation.run(chains=["ethereum"])}
    assert_equal(differences(lines), {**ZERO, ("deposit", "ETH"): 5 * 10**17})
    incident = last_incident(engine)
    assert_equal((incident.kind, incident.severity, incident.detail["chain"], incident.detail["tier"], incident.detail["asset"]),
                 ("reconciliation_difference", "warning", "ethereum", "deposit", "ETH"))
    assert not kill_switch(engine).engaged

    log.info("explained: the cursor is put back and the block rescanned; the deposit is in transit, then credited")
    with engine.begin() as c:
        c.execute(text("UPDATE chain_cursor SET height = :h, hash = :x WHERE chain = 'ethereum'"), {"h": saved.height, "x": saved.hash})
    lines = eth_lines(custody, log)
    assert_equal(differences(lines), ZERO)
    assert_equal(in_transit_since(lines, start)[("deposit", "ETH")], 5 * 10**17)
    anvil.mine(ETH_FINALITY)
    assert_equal(differences(eth_lines(custody, log)), ZERO)
    assert_equal(ledger.balance(eth_acct).posted, ether_in - ether_out - custody.wallets.chain_asset("ETH").withdrawal_fee + 5 * 10**17)
    with engine.begin() as c:
        set_kill_switch(c, False, "test: reconciliation explained", "op-test")
    ledger.assert_verified()
