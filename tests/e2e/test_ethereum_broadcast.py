"""ethereum_broadcast: an EIP-1559 transfer signed with eth-account is accepted through the
adapter; broadcasting it again is success without a second effect; a same-nonce replacement is
reported as such and an underpriced one is refused with `insufficient_fee`.
"""
from __future__ import annotations

from chain_adapters.base import TxState
from chain_adapters.errors import ErrorCode
from regtest import control
from regtest.util import assert_equal, assert_raises_code
from tests.e2e import txbuild


def _transfer(ad, to, value, *, nonce, tip_mult=1):
    fee = ad.estimate_fee()
    return txbuild.eip1559_transfer(txbuild.ETH_DEV_KEY_1, to=to, value=value, nonce=nonce, chain_id=ad.chain_id,
                                    max_fee=fee.max_fee_wei * tip_mult, priority_fee=fee.priority_fee_wei * tip_mult)


def test_eip1559_broadcast_twice_one_effect(anvil, eth_adapter, log):
    ad = eth_adapter
    to = txbuild.eth_new_address("eip1559")
    sender = txbuild.eth_address(txbuild.ETH_DEV_KEY_1)
    raw = _transfer(ad, to, 424_242, nonce=ad.nonce(sender))
    first = ad.broadcast(raw)
    assert_equal(first.already_known, False)
    anvil.wait_mined(first.txid)
    log.info("Mined as %s; broadcast again", first.txid)
    assert_equal(ad.tx_status(first.txid).state, TxState.CONFIRMED)
    second = ad.broadcast(raw)
    assert_equal((second.txid, second.already_known), (first.txid, True))
    anvil.mine(1)
    assert_equal(ad.balance(to), 424_242)


def test_same_nonce_replacement(anvil, eth_adapter, log):
    ad = eth_adapter
    to = txbuild.eth_new_address("replace")
    sender = txbuild.eth_address(txbuild.ETH_DEV_KEY_1)
    with control.manual_mining(anvil):
        nonce = ad.nonce(sender)
        original = _transfer(ad, to, 1_000, nonce=nonce)
        old = ad.broadcast(original)
        log.info("Same nonce, same fee, different payload: underpriced")
        assert_raises_code(ErrorCode.INSUFFICIENT_FEE, ad.broadcast, _transfer(ad, to, 2_000, nonce=nonce))
        log.info("Same nonce, doubled fees: replaces the original")
        new = ad.broadcast(_transfer(ad, to, 3_000, nonce=nonce, tip_mult=2))
        assert_equal(ad.tx_status(old.txid, raw=original).state, TxState.REPLACED)
        assert_equal(ad.tx_status(new.txid).state, TxState.MEMPOOL)
        anvil.mine(1)
    assert_equal(ad.tx_status(old.txid, raw=original).state, TxState.CONFLICTED)
    assert_equal(ad.tx_status(new.txid).state, TxState.CONFIRMED)
    assert_equal(ad.balance(to), 3_000)
