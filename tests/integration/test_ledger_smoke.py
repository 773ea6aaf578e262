from ledger.model import AccountKind, Transfer


def test_post_and_balance(ledger):
    ledger.create_asset("BTC", 8)
    a = ledger.open_account("BTC", AccountKind.asset_location, "smoke:pool")
    c = ledger.open_account("BTC", AccountKind.customer, "smoke:alice")
    r = ledger.post("smoke:1", [Transfer(a.id, c.id, 5)])
    assert r.created
    assert ledger.balance(c.id).posted == 5
    assert ledger.post("smoke:1", [Transfer(a.id, c.id, 5)]).created is False
