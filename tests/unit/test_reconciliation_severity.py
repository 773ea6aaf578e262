"""Reconciliation severity: a shortfall (the chain holds less than books + in transit) is critical
and halts withdrawals; a surplus (the chain holds more: nobody's money is missing, and anyone can
cause one by sending a wei or a satoshi to one of our addresses) is a warning, opened once per line
and amount; a line that reconciles opens nothing."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chain_adapters.base import BlockRef
from custody.reconciliation import Line, incident_key, line_severity

TIP, NEXT = BlockRef(100, "aa" * 32), BlockRef(101, "bb" * 32)


def line(on_chain: int, books: int, in_transit: int = 0) -> Line:
    return Line("ethereum", "ETH", "hot", on_chain, books, in_transit)


def test_a_line_that_reconciles_opens_nothing():
    assert line_severity(line(10**18, 10**18)) is None
    assert line_severity(line(10**18 - 21_000, 10**18, -21_000)) is None


def test_one_unsolicited_wei_is_a_warning():
    assert line_severity(line(10**18 + 1, 10**18)) == "warning"


def test_one_missing_wei_is_critical():
    assert line_severity(line(10**18 - 1, 10**18)) == "critical"
    assert line_severity(line(10**18, 10**18, 1)) == "critical"  # expected in transit, not on chain


def test_a_surplus_is_one_incident_per_line_and_amount_a_shortfall_one_per_tip():
    surplus, shortfall = line(11, 10), line(9, 10)
    assert incident_key(surplus, TIP) == incident_key(surplus, NEXT) == "recon:ethereum:hot:ETH:surplus:1"
    assert incident_key(line(12, 10), TIP) != incident_key(surplus, TIP)
    assert incident_key(shortfall, TIP) != incident_key(shortfall, NEXT)
    deposit = Line("ethereum", "ETH", "deposit", 11, 10, 0)
    assert incident_key(deposit, TIP) != incident_key(surplus, TIP)


@given(st.integers(0, 2**96), st.integers(0, 2**96), st.integers(-(2**96), 2**96))
def test_critical_exactly_when_the_chain_holds_less_than_books_and_transit(on_chain, books, in_transit):
    expected = None if on_chain == books + in_transit else "warning" if on_chain > books + in_transit else "critical"
    assert line_severity(line(on_chain, books, in_transit)) == expected
