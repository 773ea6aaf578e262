"""ethereum_simulate: the adapter tells a contract from a plain account (`has_code`) and says what a
payout would do before it is sent (`simulate`, eth_call at the tip): a plain ether transfer succeeds;
ether to a contract that rejects it reverts, with ample gas (its own refusal) and with the 21,000
an ether payout carries (out of gas); a token transfer the sender cannot cover reverts in the token;
a sender without the ether is `unfunded`, which says nothing about the destination. Nothing is sent."""
from __future__ import annotations

from pathlib import Path

import pytest

from chain_adapters.ethereum import CallResult
from regtest.anvil_node import FAUCET_ADDRESS, compile_contract, deploy_contract
from regtest.install import find_tools
from regtest.util import assert_equal
from signer.ethereum_tx import erc20_transfer_data
from tests.e2e import txbuild

REJECTS_ETHER = Path(__file__).resolve().parents[2] / "contracts" / "RejectsEther.sol"


def test_has_code_and_simulate(anvil, eth_adapter, usdt, log):
    ad = eth_adapter
    plain, empty = txbuild.eth_new_address("simulate-plain"), txbuild.eth_new_address("simulate-empty")
    rejecter = deploy_contract(anvil.w3, compile_contract(find_tools(), REJECTS_ETHER, "RejectsEther"))
    assert_equal((ad.has_code(usdt.address), ad.has_code(rejecter), ad.has_code(plain)), (True, True, False))
    tip = ad.tip()

    log.info("ether to a plain address: ok; to the contract: reverts, with ample gas and with 21,000")
    assert_equal(ad.simulate(FAUCET_ADDRESS, plain, value=10**15, data=b"", gas=21_000).result, CallResult.OK)
    for gas in (100_000, 21_000):
        outcome = ad.simulate(FAUCET_ADDRESS, rejecter, value=10**15, data=b"", gas=gas)
        log.info("gas %d: %s (%s)", gas, outcome.result, outcome.detail)
        assert_equal(outcome.result, CallResult.REVERTED)

    log.info("a token transfer the sender cannot cover reverts in the token; missing ether is unfunded")
    outcome = ad.simulate(empty, usdt.address, value=0, data=erc20_transfer_data(plain, 1), gas=100_000)
    assert_equal(outcome.result, CallResult.REVERTED)
    assert "balance" in outcome.detail
    outcome = ad.simulate(empty, plain, value=10**18, data=b"", gas=21_000)
    log.info("unfunded: %s", outcome.detail)
    assert_equal(outcome.result, CallResult.UNFUNDED)
    with pytest.raises(ValueError):
        ad.simulate(FAUCET_ADDRESS, plain, value=-1, data=b"", gas=21_000)
    assert_equal((ad.balance(plain), ad.tip().height), (0, tip.height))  # nothing was sent or mined
