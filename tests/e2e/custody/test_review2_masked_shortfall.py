"""Second adversarial review of issue 11: a real shortfall that reconciliation reports as a surplus.

Since a surplus became a warning (`custody.reconciliation.line_severity`), each line is judged on
its NET difference at one pass. Treasury funding of the ethereum hot address is booked by an
operator by hand after finality (`POST /v1/treasury/hot-funding`); until then it is a surplus on
the hot line, on purpose. Any shortfall on that line in the meantime (coins leaving the hot address
without a booking: a leaked hot key, a payout the books do not know) is netted against it and
opens one more warning: the kill switch never engages, and withdrawals go on, for as long as the
funding stays unbooked and the theft is smaller than it.

The scenario: a clean pass; treasury sends 1 ETH to the hot address (a surplus: warning, as
designed); then 0.4 ETH leaves the hot address with no booking (simulated with anvil_setBalance,
which spends no nonce, so the service's nonce counter is untouched); the next pass reports a
surplus of 0.6 ETH, a warning again. Expected: money left the hot address that nothing explains
(the unexplained surplus shrank between two passes), which is a shortfall: critical, halting.
The test books the funding, restores the balance, resolves what it opened and releases the switch.
"""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from custody.incidents import Incidents
from ledger.model import Transfer
from regtest.util import assert_equal

ETHER = 10**18


def test_a_theft_from_the_hot_address_under_unbooked_funding_is_only_a_warning(custody, anvil, engine, ledger, log):
    p, recon = custody.payouts, custody.reconciliation
    hot = p.hot_address("ethereum")
    custody.deposits.run_once(["ethereum"])
    before = {(l.tier, l.asset): l.difference for l in recon.run(chains=["ethereum"])}
    log.info("before: %s; kill switch %s", before, kill_switch(engine).engaged)
    assert not any(before.values()) and not kill_switch(engine).engaged

    log.info("treasury funds the hot address %s with 1 ETH (booked later by an operator)", hot)
    anvil.fund(hot, ETHER)
    custody.deposits.run_once(["ethereum"])
    funded = {(l.tier, l.asset): l.difference for l in recon.run(chains=["ethereum"])}
    log.info("funded, unbooked: %s; kill switch %s", funded, kill_switch(engine).engaged)

    balance = anvil.w3.eth.get_balance(hot)
    log.info("0.4 ETH leaves the hot address with no booking")
    anvil.call("anvil_setBalance", hot, hex(balance - 4 * ETHER // 10))
    anvil.mine()
    custody.deposits.run_once(["ethereum"])
    stolen = {(l.tier, l.asset): l.difference for l in recon.run(chains=["ethereum"])}
    halted = kill_switch(engine).engaged
    log.info("after the theft: %s; kill switch %s", stolen, halted)

    log.info("clean-up: restore the balance, book the funding, resolve, release the switch")
    anvil.call("anvil_setBalance", hot, hex(balance))
    anvil.mine()
    ledger.post(f"review2:funding:{hot}:{balance}", [
        Transfer(custody.wallets.location_account("ethereum", "hot", "ETH"),
                 custody.wallets.firm_account("equity", "ETH"), ETHER)], kind="review_cleanup")
    with engine.connect() as c:
        opened = c.execute(text("SELECT id FROM incident WHERE kind = 'reconciliation_difference' "
                                "AND resolved_at IS NULL")).scalars().all()
    for incident in opened:
        Incidents(engine, ledger).resolve(incident, operator="review2-cleanup", comment="review2 test cleanup")
    with engine.begin() as c:
        set_kill_switch(c, False, "review2 test cleanup", "review2-cleanup")
    custody.deposits.run_once(["ethereum"])
    assert not any(l.difference for l in recon.run(chains=["ethereum"]))

    assert_equal((funded[("hot", "ETH")], stolen[("hot", "ETH")]), (ETHER, 6 * ETHER // 10))
    assert halted, "0.4 ETH left the hot address unexplained and withdrawals were not halted"
