"""ethereum_reorg: anvil_reorg undoes two blocks carrying an ether and an ERC-20 deposit; the
ether transfer is re-mined in the new chain, the token transfer is not.

The adapter must report the fork point, both orphaned observations, and the re-mined ether
deposit again (same key, new block).
"""
from __future__ import annotations

from chain_adapters.base import Watch
from regtest import control
from regtest.util import assert_equal
from tests.e2e import txbuild


def test_ethereum_reorg_orphans_and_remines(anvil, usdt, eth_adapter, log):
    ad = eth_adapter
    ether_to, token_to = txbuild.eth_new_address("reorg-eth"), txbuild.eth_new_address("reorg-usdt")
    watch = Watch(frozenset({ether_to, token_to}), tokens=ad.tokens)
    usdt.mint(txbuild.eth_address(txbuild.ETH_DEV_KEY_1), 10_000_000)
    # Automine off for the two deposit blocks: anvil's automine seals asynchronously, and a block
    # sealed late (by this or an earlier test) must not slip in between; we mine each one ourselves.
    with control.manual_mining(anvil):
        anvil.mine(1)
        fork = ad.tip()
        log.info("Block %d: a Python-signed EIP-1559 ether deposit", fork.height + 1)
        sender = txbuild.eth_address(txbuild.ETH_DEV_KEY_1)
        fee = ad.estimate_fee()
        raw = txbuild.eip1559_transfer(txbuild.ETH_DEV_KEY_1, to=ether_to, value=777_000_000_000_000_001,
                                       nonce=ad.nonce(sender), chain_id=ad.chain_id,
                                       max_fee=fee.max_fee_wei, priority_fee=fee.priority_fee_wei)
        ether_tx = ad.broadcast(raw).txid
        anvil.mine(1)
        log.info("Block %d: an ERC-20 deposit of 2.500001 USDT", fork.height + 2)
        token_tx = usdt.transfer(sender, token_to, 2_500_001, wait=False)
        anvil.mine(1)
    assert_equal(ad.tip().height, fork.height + 2)

    first = ad.scan(fork, watch)
    assert_equal(sorted((o.asset, o.txid, o.amount) for o in first.observations),
                 sorted([("ETH", ether_tx, 777_000_000_000_000_001), ("USDT", token_tx, 2_500_001)]))
    old_blocks = [b.ref for b in first.blocks]

    log.info("anvil_reorg depth 2: the new chain re-mines only the ether transfer")
    # the ether transfer goes into the SECOND new block, so the first new block cannot come out
    # identical to the old one (same contents in the same second would give the same hash)
    anvil.call("anvil_reorg", 2, [["0x" + raw.hex(), 1]])
    second = ad.scan(first.cursor, watch)
    assert second.reorg is not None
    assert_equal(second.reorg.fork_point, fork)
    assert_equal(list(second.reorg.undone), old_blocks[::-1])
    assert_equal({o.key for o in second.reorg.orphaned}, {("ETH", ether_tx, 0), ("USDT", token_tx, first.observations[1].index)})
    [again] = second.observations
    assert_equal((again.key, again.amount), (("ETH", ether_tx, 0), 777_000_000_000_000_001))
    assert again.block not in old_blocks
    assert_equal(ad.tx_status(ether_tx).block, again.block)
    assert_equal(usdt.balance_of(token_to), 0)
