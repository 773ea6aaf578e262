"""withdrawal_fee_bump: a batch stuck past N blocks is replaced at a higher fee (RBF on bitcoind, same
nonce on anvil), linked by `replaces`; only the version that confirms is booked, exactly once."""
from __future__ import annotations

from decimal import Decimal

from sqlalchemy import text

from regtest import control
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.conftest import BTC_FINALITY, ETH_FINALITY
from tests.e2e.custody.test_withdrawal_signer_refusals import fund

OTHER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"


def chain_rows(engine, batch_id):
    with engine.connect() as c:
        return c.execute(text("SELECT id, txid, state, fee, replaces_id FROM chain_transaction WHERE batch_id = :b ORDER BY id"),
                         {"b": batch_id}).all()


def test_bitcoin_rbf_bump(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    [acct] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = w.request(client_withdrawal_id="bump-btc", account_id=acct, amount=10_000_000, destination=dest, requested_by="backend")
    batch = p.batch_bitcoin()
    [first] = p.sign_open_batches()
    p.broadcast()
    expense = custody.wallets.firm_account("network_fees", "BTC")
    expense_before = ledger.balance(expense).posted

    log.info("%d empty blocks: the batch is stuck", p.config.stuck_blocks)
    for _ in range(p.config.stuck_blocks):
        bitcoind.rpc("generateblock", OTHER, [])
    [second] = p.bump_fees()
    assert_equal(p.bump_fees(), [])  # one replacement per stuck version
    p.broadcast()
    assert second in bitcoind.rpc("getrawmempool") and first not in bitcoind.rpc("getrawmempool")
    p.track()
    rows = chain_rows(engine, batch)
    # a version is never written off on mempool evidence: both are followed until one is mined
    assert_equal([(r.txid, r.state) for r in rows], [(first, "broadcast"), (second, "broadcast")])
    assert_equal(rows[1].replaces_id, rows[0].id)
    assert int(rows[1].fee) > int(rows[0].fee)
    log.info("fee %d -> %d sat", rows[0].fee, rows[1].fee)

    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal([r.state for r in chain_rows(engine, batch)], ["replaced", "final"])
    assert_equal(w.get(wd.id).state, "final")
    assert_equal(ledger.balance(expense).posted, expense_before - int(rows[1].fee))
    assert_equal(ledger.balance(acct).posted, 100_000_000 - 10_000_000 - 5_000)
    assert_equal(int(Decimal(str(bitcoind.wallet("getreceivedbyaddress", dest))) * 100_000_000), 10_000_000)


def test_ethereum_same_nonce_bump(custody, customer, anvil, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    acct = customer("ETH")
    anvil.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 3 * 10**18)
    hot = p.hot_address("ethereum")
    funding = anvil.fund(hot, 5 * 10**18)
    p.book_hot_funding("ethereum", "ETH", 5 * 10**18, f"hot-funding:ethereum:{funding}")
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    dest = txbuild.eth_new_address("bump-eth")
    wd = w.request(client_withdrawal_id=f"bump-eth-{acct}", account_id=acct, amount=10**18, destination=dest, requested_by="backend")
    [batch] = p.batch_ethereum()
    with control.manual_mining(anvil):
        [first] = p.sign_open_batches()
        p.broadcast()
        log.info("block gas limit below 21,000 for %d blocks: the transaction cannot be included", p.config.stuck_blocks)
        gas_limit = anvil.w3.eth.get_block("latest")["gasLimit"]
        anvil.call("evm_setBlockGasLimit", hex(20_000))
        anvil.mine(p.config.stuck_blocks)
        assert_equal(anvil.w3.eth.get_transaction_count(hot), anvil.w3.eth.get_transaction_count(hot, "pending") - 1)
        [second] = p.bump_fees()
        anvil.call("evm_setBlockGasLimit", hex(gas_limit))  # no block is mined until we say so
        p.broadcast()
        p.track()
        rows = chain_rows(engine, batch)
        assert_equal([r.state for r in rows], ["broadcast", "broadcast"])
        log.info("gas limit restored: the replacement (same nonce) is mined")
        anvil.mine(ETH_FINALITY)
    expense = custody.wallets.firm_account("network_fees", "ETH")
    before = ledger.balance(expense).posted
    p.track()
    assert_equal([r.state for r in chain_rows(engine, batch)], ["replaced", "final"])
    assert_equal(w.get(wd.id).state, "final")
    receipt = anvil.w3.eth.get_transaction_receipt(second)
    assert_equal(ledger.balance(expense).posted, before - int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"]))
    assert_equal(anvil.w3.eth.get_balance(dest), 10**18)
    assert first != second


def test_the_replaced_version_mined_after_all_is_booked_once(custody, customer, bitcoind, engine, ledger, log):
    """A miner that never saw the bump mines the original: it is followed and booked, once, and the
    bump is retired; nothing is refunded although the bump became conflicted."""
    w, p = custody.withdrawals, custody.payouts
    [acct] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = w.request(client_withdrawal_id="bump-mined-old", account_id=acct, amount=6_000_000, destination=dest, requested_by="backend")
    batch = p.batch_bitcoin()
    [first] = p.sign_open_batches()
    p.broadcast()
    raw_first = bitcoind.rpc("getrawtransaction", first)
    for _ in range(p.config.stuck_blocks):
        bitcoind.rpc("generateblock", OTHER, [])
    [second] = p.bump_fees()
    p.broadcast()
    assert second in bitcoind.rpc("getrawmempool")
    log.info("a block carrying the ORIGINAL version (not the bump) is mined")
    bitcoind.rpc("generateblock", OTHER, [raw_first])
    expense = custody.wallets.firm_account("network_fees", "BTC")
    expense_before = ledger.balance(expense).posted
    p.track()
    bitcoind.mine(BTC_FINALITY)
    p.track()
    rows = chain_rows(engine, batch)
    assert_equal([(r.txid, r.state) for r in rows], [(first, "final"), (second, "replaced")])
    assert_equal(w.get(wd.id).state, "final")
    assert_equal(ledger.balance(expense).posted, expense_before - int(rows[0].fee))
    assert_equal(ledger.balance(acct).posted, 100_000_000 - 6_000_000 - 5_000)
    assert_equal(int(Decimal(str(bitcoind.wallet("getreceivedbyaddress", dest))) * 100_000_000), 6_000_000)
