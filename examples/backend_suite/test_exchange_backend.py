"""A fake exchange backend's end-to-end test, written the way another team would: the custody
service's pytest plugin (`custody_regtest`) and its API only, nothing from the service's tests/.

It talks to the service through the typed client (`custody.client`, what `custody_client` returns).
Run from a clean checkout, after `scripts/bootstrap.sh` (or `python -m regtest install`):
    .venv/bin/python -m pytest examples/backend_suite
Alice deposits BTC, Bob USDT; they trade; Bob withdraws with two approvals; a deposit reorged out
before finality ends orphaned and never credited.
"""
import time
from decimal import Decimal


def until(probe, what, chain=None, timeout=240):
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"timed out: {what}"
        chain and chain.mine("bitcoin", 1)
        time.sleep(0.5)
    return value


def test_deposit_trade_withdraw_reorg(custody_client, custody_funded_customer, custody_approvers, custody_chain):
    backend, admin = custody_client("backend"), custody_client("admin")  # custody.client.CustodyClient
    alice = custody_funded_customer(asset="BTC", amount=300_000_000)
    bob = custody_funded_customer(asset="USDT", amount=300_000_000)
    admin.create_market(symbol="BTC-USDT", base_asset="BTC", quote_asset="USDT", lot_size=10_000, quote_per_tick_lot=1,
                        fees={"default": {"maker_ppm": 0, "taker_ppm": 0}})
    bob_btc = backend.open_account(asset="BTC", kind="customer", owner=bob.owner, name=f"customer:{bob.owner}:BTC").id
    for who, side in ((alice, "sell"), (bob, "buy")):
        backend.place_order("BTC-USDT", account=who.owner, client_order_id=f"{who.owner}-1", side=side, qty="2.5",
                            price="100", tif="gtc")
    assert backend.get_balance(bob_btc).posted.minor == 250_000_000
    dest = custody_chain.bitcoin.wallet("getnewaddress", "", "bech32")
    w = backend.request_withdrawal(client_withdrawal_id=f"{bob.owner}-w1", account_id=bob_btc, amount=Decimal("2.2"),
                                   destination=dest)
    assert w.state == "pending_approval", w
    assert [a.approve(w.id).state for a in custody_approvers] == ["pending_approval", "approved"]
    until(lambda: admin.get_withdrawal(w.id).state == "final", "withdrawal final", custody_chain)
    txid = custody_chain.faucet_bitcoin(alice.address, 40_000_000, confirm=True)  # one block: not final (3)
    seen = lambda: [d for d in backend.list_account_deposits(alice.account_id) if d.txid == txid]  # noqa: E731
    until(seen, "the second deposit seen")
    custody_chain.reorg_bitcoin(1, drop=[txid])
    until(lambda: seen()[0].state == "orphaned", "the reorged deposit orphaned")
    assert backend.get_balance(alice.account_id).posted.minor == 50_000_000
    assert admin.verify().ok
