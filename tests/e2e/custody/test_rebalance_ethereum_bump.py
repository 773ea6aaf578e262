"""rebalance_ethereum_bump: a stuck ethereum rebalance (hot -> warm, ether) is replaced at the same
hot nonce with higher fees (custody.eth_moves), against anvil.

The hot address is funded past its ceiling and the move is decided, signed and sent; anvil's block
gas limit is then below 21,000 for `stuck_blocks` blocks (manual mining), so it waits in the
mempool. `bump_fees()` has the signer sign the same transfer (same nonce, destination and value)
at higher fees, stores it as a second version linked to the first and sends it; once blocks can
hold it, the replacement is mined and booked hot -> warm with its own gas, once. Reconciliation's
ethereum lines (warm and cold included) equal the baseline before, while the replaced version
waits, while the mined one is in transit, and after booking; the ledger verifies at the end.
"""
from __future__ import annotations

import contextlib

from sqlalchemy import text

from custody.eth_moves import EthBumpConfig
from custody.eth_rebalances import EthRebalanceConfig
from regtest import control
from regtest.util import assert_equal
from tests.e2e.custody.conftest import ETH_FINALITY
from tests.e2e.custody.test_rebalance_ethereum import COLD, differences, fund_hot, svc, thresholds_over  # noqa: F401 - fixture

USDT = 10**6
ETHER = 10**18
STUCK = 2


@contextlib.contextmanager
def restored_gas_limit(anvil, limit: int):
    try:
        yield
    finally:
        anvil.call("evm_setBlockGasLimit", hex(limit))


def test_a_stuck_rebalance_is_replaced_at_the_same_nonce_and_only_the_mined_version_is_booked(svc, anvil, usdt, ledger,  # noqa: F811
                                                                                               log):
    r = svc.eth_rebalances
    r.bump = EthBumpConfig(stuck_blocks=STUCK, bump_percent=25)
    warm = r.warm_address
    baseline = differences(svc)
    r.config = EthRebalanceConfig(thresholds={"ETH": thresholds_over(svc, eth_extra=3 * ETHER, usdt_extra=3)["ETH"]},
                                  cold_address=COLD)
    fund_hot(svc, anvil, usdt, ether=3 * ETHER, tokens=1)
    assert_equal(differences(svc), baseline)
    expense = svc.wallets.firm_account("network_fees", "ETH")
    warm_account = svc.wallets.location_account("ethereum", "warm", "ETH")
    expense_before, warm_before = ledger.balance(expense).posted, ledger.balance(warm_account).posted
    warm_chain_before = svc.adapters["ethereum"].balance(warm)
    [rid] = r.decide()
    limit = anvil.w3.eth.get_block("latest")["gasLimit"]
    with control.manual_mining(anvil), restored_gas_limit(anvil, limit):
        [first] = r.sign()
        r.broadcast()
        log.info("no block can hold it for %d blocks", STUCK)
        anvil.call("evm_setBlockGasLimit", hex(20_000))
        anvil.mine(STUCK)
        r.track()
        [second] = r.bump_fees()
        assert_equal(r.bump_fees(), [])
        with svc.engine.connect() as c:
            kept = c.execute(text("SELECT id, txid, replaces_id, nonce FROM eth_tx_version WHERE machine = 'eth_rebalance' "
                                  "AND row_id = :r ORDER BY id"), {"r": rid}).all()
        assert_equal([(v.txid, int(v.nonce)) for v in kept], [(first, int(kept[0].nonce))] + [(second, int(kept[0].nonce))])
        assert_equal(kept[1].replaces_id, kept[0].id)
        anvil.call("evm_setBlockGasLimit", hex(limit))  # reconciliation's token eth_calls need it
        r.track()  # anvil refused the replacement above the block gas limit: stored, track sends it
        assert_equal(differences(svc), baseline)  # the replaced version waits: nothing moved
        anvil.mine(1)
        r.track()
        assert_equal(differences(svc), baseline)  # in transit: the mined version only
        anvil.mine(ETH_FINALITY)
        r.track()
        assert_equal(differences(svc), baseline)
    receipt = anvil.w3.eth.get_transaction_receipt(second)
    gas = int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])
    with svc.engine.connect() as c:
        row = c.execute(text("SELECT state, txid, fee, amount FROM eth_rebalance WHERE id = :r"), {"r": rid}).one()
    assert_equal((row.state, row.txid, int(row.fee)), ("final", second, gas))
    assert_equal(expense_before - ledger.balance(expense).posted, gas)
    assert_equal(warm_before - ledger.balance(warm_account).posted, int(row.amount))  # asset locations run negative
    assert_equal(svc.adapters["ethereum"].balance(warm) - warm_chain_before, int(row.amount))
