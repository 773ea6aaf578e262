"""withdrawal_internal_destinations (issue 11, observation 3): a customer asks, over the HTTP API, to
withdraw to addresses the service itself controls. Bitcoin: another customer's deposit address, the
hot receive address (also spelled in uppercase, which bech32 allows), the change address of a batch
just paid; ethereum: ether and USDT to the hot address and to a deposit address. Each is refused at
once with `destination_internal` (422): nothing is held or written. A quarantine return to the hot
address is refused the same way. A deposit address that is derived only after a withdrawal to it was
approved (further ahead than the lookahead) is caught when the withdrawal is batched: rejected, hold
released, never paid. The withdrawal that is paid leaves the books verified and the bitcoin lines
reconciled to zero."""
from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.destinations import LOOKAHEAD
from custody.errors import CustodyErrorCode
from regtest.util import assert_equal, assert_raises_code
from tests.e2e.custody.api_helpers import backend_client, credit, refused, withdraw
from tests.e2e.custody.conftest import BTC_FINALITY


@pytest.fixture
def api(custody):
    return backend_client(custody, "backend-int")


def test_bitcoin_withdrawals_to_our_own_addresses_are_refused(custody, customer, api, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    acct, other = customer("BTC"), customer("BTC")
    credit(custody, acct, "BTC", 100_000_000)
    log.info("treasury funds the hot wallet; one ordinary withdrawal is paid, leaving change")
    bitcoind.fund(p.hot_address("bitcoin"), 200_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    external = bitcoind.wallet("getnewaddress", "", "bech32")
    r = withdraw(api, acct, "0.1", external)
    assert_equal(r.state, "approved")
    paid = r.id
    batch_id = p.batch_bitcoin()
    [txid] = p.sign_open_batches()
    assert_equal(p.broadcast(), 1)
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(w.get(paid).state, "final")
    with engine.connect() as c:
        change = c.execute(text("SELECT address FROM wallet_utxo WHERE txid = :t AND derivation_change = 1"), {"t": txid}).scalar_one()
    assert_equal(change, p.hot_address("bitcoin", 1, batch_id))

    deposit = custody.wallets.issue_address(f"addr:{other}", other).address
    hot = p.hot_address("bitcoin")
    ours = {"another customer's deposit address": deposit, "the hot receive address": hot,
            "the hot receive address in uppercase": hot.upper(), "the change address": change}
    answers = {name: refused(lambda: withdraw(api, acct, "0.01", destination)) for name, destination in ours.items()}
    for name, answer in answers.items():
        log.info("to %s %s -> %s", name, ours[name], answer)
    assert_equal(answers, {name: (422, "destination_internal") for name in ours})
    assert_equal(ledger.balance(acct).held, 0)
    assert_equal([x.id for x in w.list(account_id=acct, state=None)], [paid])  # nothing written

    log.info("a quarantine return goes through the same check (refused before it names any deposit row)")
    quarantine = custody.wallets.firm_account("quarantine", "BTC")
    assert_raises_code(CustodyErrorCode.destination_internal, w.request, client_withdrawal_id=f"return-to-hot-{acct}",
                       account_id=quarantine, amount=50_000, destination=hot, requested_by="op-test", _return_of_deposit=987654321)

    log.info("an address derived only after the request: refused when the withdrawal is batched")
    with engine.connect() as c:
        wallet = c.execute(text("SELECT xpub, network, next_index, gap_limit FROM wallet "
                                "WHERE chain = 'bitcoin' AND tier = 'deposit'")).one()
    ahead = wallet.next_index + max(wallet.gap_limit, LOOKAHEAD)  # the first index not derived ahead
    future = derive_btc_address(wallet.xpub, wallet.network, 0, ahead)
    r = withdraw(api, acct, "0.02", future)
    assert_equal(r.state, "approved")
    later = r.id
    issued = [custody.wallets.issue_address(f"addr:{other}:{i}", other).address for i in range(ahead - wallet.next_index + 1)]
    assert_equal(issued[-1], future)
    assert_equal(p.batch_bitcoin(), None)
    assert_equal((w.get(later).state, w.get(later).reject_reasons), ("rejected", ("destination_internal",)))
    assert_equal(ledger.balance(acct).held, 0)
    assert_equal(ledger.balance(acct).posted, 100_000_000 - 10_000_000 - 5_000)

    log.info("the books reconcile: deposit and hot lines at zero")
    custody.deposits.run_once(["bitcoin"])
    lines = custody.reconciliation.run(chains=["bitcoin"])
    for line in lines:
        log.info("%s: chain %d = books %d + in transit %d", line.tier, line.on_chain, line.books, line.in_transit)
    assert_equal({line.difference for line in lines}, {0})


def test_ethereum_withdrawals_to_our_own_addresses_are_refused(custody, customer, api, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    owner = f"eth-int-{uuid.uuid4().hex[:8]}"
    eth_acct, usdt_acct = customer("ETH", owner), customer("USDT", owner)
    credit(custody, eth_acct, "ETH", 10**18)
    credit(custody, usdt_acct, "USDT", 1_000 * 10**6)
    hot = p.hot_address("ethereum")
    other = customer("ETH")
    deposit = custody.wallets.issue_address(f"addr:{other}", other).address
    answers = {}
    for acct, asset, amount in ((eth_acct, "ETH", "0.01"), (usdt_acct, "USDT", "10")):
        for name, destination in (("the hot address", hot), ("a deposit address", deposit)):
            answers[f"{amount} {asset} to {name}"] = answer = refused(lambda: withdraw(api, acct, amount, destination))
            log.info("%s %s to %s %s -> %s", amount, asset, name, destination, answer)
    assert_equal(answers, {case: (422, "destination_internal") for case in answers})
    for acct in (eth_acct, usdt_acct):
        assert_equal(ledger.balance(acct).held, 0)
        assert_equal(w.list(account_id=acct, state=None), [])
