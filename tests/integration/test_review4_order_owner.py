"""Review 4 of issue 11: OrderIn, CancelIn and AmendIn now take the owner rule (letters, digits,
. _ @ + -, at most 100). Before, matching took any owner of up to 120 characters for a place and
any string for a cancel or an amend, so orders resting from before the change (an owner with a
space, a '/', a ':' or of 101-120 characters) can no longer be cancelled or amended over the API:
their holds keep the owner's money locked for as long as they rest (GTC: for ever). The rule
belongs on the place (new owners), not on the cancel of an order that already exists."""
from __future__ import annotations

import uuid

from custody.api.order_routes import _Units
from custody.trading import attach
from ledger.model import AccountKind
from matching.model import Side
from regtest.util import assert_equal
from tests.integration.test_review_deposit_boundaries import Chain, api  # noqa: F401 - fixture


def test_an_order_resting_from_before_the_owner_rule_can_still_be_cancelled(api, ledger):
    chain = Chain(api)
    ledger.create_asset("USDT", 6)
    symbol = f"BTC-USDT-{uuid.uuid4().hex[:8]}"
    api.admin.post("/v1/markets", json={"symbol": symbol, "base_asset": "BTC", "quote_asset": "USDT", "lot_size": 10_000,
                                        "quote_per_tick_lot": 1, "fees": {"default": {"maker_ppm": 0, "taker_ppm": 0}}}
                   ).raise_for_status()
    legacy = f"desk {uuid.uuid4().hex[:6]}"  # an owner the old OrderIn took (any string up to 120)
    account = ledger.open_account("BTC", AccountKind.customer, f"customer:{legacy}:BTC", owner=legacy)
    chain.deposit(account.id, 50_000_000)
    trading = attach(api.custody)
    u = _Units(trading, symbol)
    placed = trading.place(symbol, legacy, "before-the-rule", Side.sell, qty=u.lots("0.5"), price=u.ticks("100000"))
    assert_equal(ledger.balance(account.id).available, 0)  # the resting sell holds the whole balance
    r = api.backend.post(f"/v1/markets/{symbol}/orders/{placed.order_id}/cancel", json={"account": legacy})
    assert (r.status_code, ledger.balance(account.id).available) == (200, 50_000_000), r.text[:200]
