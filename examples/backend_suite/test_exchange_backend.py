"""A fake exchange backend's end-to-end test, written the way another team would: the custody
service's pytest plugin (`custody_regtest`) and its API only, nothing from the service's tests/.

Run from a clean checkout, after `scripts/bootstrap.sh` (or `python -m regtest install`):
    .venv/bin/python -m pytest examples/backend_suite
Alice deposits BTC, Bob USDT; they trade; Bob withdraws with two approvals; a deposit reorged out
before finality ends orphaned and never credited.
"""
import time


def until(probe, what, chain=None, timeout=240):
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"timed out: {what}"
        chain and chain.mine("bitcoin", 1)
        time.sleep(0.5)
    return value


def test_deposit_trade_withdraw_reorg(custody_client, custody_funded_customer, custody_approvers, custody_chain):
    backend, admin = custody_client("backend"), custody_client("admin")
    alice = custody_funded_customer(asset="BTC", amount=300_000_000)
    bob = custody_funded_customer(asset="USDT", amount=300_000_000)
    admin.post("/v1/markets", json={"symbol": "BTC-USDT", "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
                                    "quote_per_tick_lot": 1, "fees": {"default": {"maker_ppm": 0, "taker_ppm": 0}}})
    bob_btc = backend.post("/v1/accounts", json={"asset": "BTC", "kind": "customer", "owner": bob.owner,
                                                 "name": f"customer:{bob.owner}:BTC"}).json()["id"]
    for who, side in ((alice, "sell"), (bob, "buy")):
        r = backend.post("/v1/markets/BTC-USDT/orders", json={"account": who.owner, "client_order_id": f"{who.owner}-1",
                                                               "side": side, "qty": "2.5", "price": "100", "tif": "gtc"})
        assert r.status_code in (200, 201), r.text
    assert backend.get(f"/v1/accounts/{bob_btc}/balance").json()["posted"]["value"] == "2.50000000"
    dest = custody_chain.bitcoin.wallet("getnewaddress", "", "bech32")
    w = backend.post("/v1/withdrawals", json={"client_withdrawal_id": f"{bob.owner}-w1", "account_id": bob_btc,
                                              "amount": "2.2", "destination": dest}).json()
    assert w["state"] == "pending_approval", w
    assert [a.approve(w["id"])["state"] for a in custody_approvers] == ["pending_approval", "approved"]
    until(lambda: admin.get(f"/v1/withdrawals/{w['id']}").json()["state"] == "final", "withdrawal final", custody_chain)
    txid = custody_chain.faucet_bitcoin(alice.address, 40_000_000, confirm=True)  # one block: not final (3)
    seen = lambda: [d for d in backend.get(f"/v1/accounts/{alice.account_id}/deposits").json() if d["txid"] == txid]
    until(seen, "the second deposit seen")
    custody_chain.reorg_bitcoin(1, drop=[txid])
    until(lambda: seen()[0]["state"] == "orphaned", "the reorged deposit orphaned")
    assert backend.get(f"/v1/accounts/{alice.account_id}/balance").json()["posted"]["value"] == "0.50000000"
    assert admin.get("/v1/verify").json()["ok"]
