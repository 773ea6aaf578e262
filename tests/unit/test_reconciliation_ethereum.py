"""Ethereum reconciliation arithmetic: what a hot-address transaction mined but not yet settled in
the books takes off each line. Value on its own asset's line, gas always on the ether line; a
reverted transaction moved no value, only gas; integers throughout."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from custody.reconciliation import Line, Unsettled, hot_in_transit

GWEI = 10**9


def test_nothing_unsettled_is_nothing_in_transit():
    assert hot_in_transit([], "ETH") == 0
    assert hot_in_transit([], "USDT") == 0


def test_an_ether_payment_takes_value_and_gas_off_the_ether_line():
    paid = Unsettled("ETH", 1_234_567_890_123_456_789, 21_000 * 3 * GWEI, reverted=False)
    assert hot_in_transit([paid], "ETH") == -(1_234_567_890_123_456_789 + 63_000 * GWEI)
    assert hot_in_transit([paid], "USDT") == 0


def test_a_token_payment_takes_tokens_off_its_line_and_its_gas_off_the_ether_line():
    paid = Unsettled("USDT", 1_234_567_891, 51_000 * 2 * GWEI, reverted=False)
    assert hot_in_transit([paid], "USDT") == -1_234_567_891
    assert hot_in_transit([paid], "ETH") == -102_000 * GWEI
    assert hot_in_transit([paid], "DAI") == 0


def test_a_reverted_transaction_moved_only_its_gas():
    failed = Unsettled("USDT", 10**12, 30_000 * GWEI, reverted=True)
    assert hot_in_transit([failed], "USDT") == 0
    assert hot_in_transit([failed], "ETH") == -30_000 * GWEI
    failed_ether = Unsettled("ETH", 10**18, 21_000 * GWEI, reverted=True)
    assert hot_in_transit([failed_ether], "ETH") == -21_000 * GWEI


def test_the_native_asset_is_a_parameter():
    paid = Unsettled("USDT", 5, 7, reverted=False)
    assert hot_in_transit([paid], "MATIC", native="MATIC") == -7
    assert hot_in_transit([paid], "ETH", native="MATIC") == 0


def test_a_line_balances_with_what_is_in_transit():
    # the hot address paid 1 ETH + gas on chain; the books still hold the ether in flight
    gas = 21_000 * GWEI
    line = Line("ethereum", "ETH", "hot", on_chain=4 * 10**18 - 10**18 - gas, books=4 * 10**18,
                in_transit=hot_in_transit([Unsettled("ETH", 10**18, gas, reverted=False)], "ETH"))
    assert line.difference == 0
    assert Line("ethereum", "ETH", "hot", on_chain=10, books=10, in_transit=1).difference == -1


_unsettled = st.builds(Unsettled, st.sampled_from(["ETH", "USDT", "DAI"]), st.integers(0, 10**30),
                       st.integers(0, 10**22), st.booleans())


@given(st.lists(_unsettled, max_size=20))
def test_every_wei_and_unit_that_left_is_on_exactly_one_line(unsettled):
    by_line = {asset: hot_in_transit(unsettled, asset) for asset in ("ETH", "USDT", "DAI")}
    assert all(isinstance(v, int) and v <= 0 for v in by_line.values())
    gas = sum(u.gas for u in unsettled)
    value = {a: sum(u.amount for u in unsettled if u.asset == a and not u.reverted) for a in by_line}
    assert by_line["ETH"] == -(value["ETH"] + gas)
    assert by_line["USDT"] == -value["USDT"]
    assert by_line["DAI"] == -value["DAI"]
