"""Reconciliation severity: a shortfall (the chain holds less than books + in transit) is critical
and halts withdrawals; a surplus (the chain holds more: nobody's money is missing, and anyone can
cause one by sending a wei or a satoshi to one of our addresses) is a warning, opened once per line
and amount; a line that reconciles opens nothing."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chain_adapters.base import BlockRef
from custody.reconciliation import Line, PreviousPass, incident_key, line_severity, shortfall_since

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


# ---- a surplus that shrinks: compared with the line's previous pass (shortfall_since) ----------

ETHER = 10**18


def previous(difference: int, booked_off_chain: int = 0) -> PreviousPass:
    return PreviousPass(difference, booked_off_chain, 0, 100)


def test_unbooked_funding_does_not_mask_a_later_theft():
    """+1 ETH funding unbooked (a surplus, a warning), then 0.4 ETH leaves unbooked: +0.6 ETH is
    still a surplus, but it fell by 0.4 with nothing booked: critical."""
    funded, stolen = line(2 * ETHER, ETHER), line(2 * ETHER - 4 * ETHER // 10, ETHER)
    assert line_severity(funded, previous(0)) == "warning"
    assert shortfall_since(previous(ETHER), stolen) == 4 * ETHER // 10
    assert line_severity(stolen, previous(ETHER)) == "critical"
    assert line_severity(line(ETHER, ETHER), previous(ETHER)) == "critical"  # all of it gone: zero, yet critical


def test_booking_the_funding_explains_the_fall():
    booked = Line("ethereum", "ETH", "hot", 2 * ETHER, 2 * ETHER, 0, booked_off_chain=ETHER)
    assert shortfall_since(previous(ETHER), booked) == 0
    assert line_severity(booked, previous(ETHER)) is None
    partly = Line("ethereum", "ETH", "hot", 2 * ETHER - 1, 2 * ETHER, 0, booked_off_chain=ETHER)
    assert line_severity(partly, previous(ETHER)) == "critical"  # booked, and one wei more missing


def test_a_deposit_recorded_late_explains_the_fall_on_a_deposit_line():
    """The scanner missed a block (a surplus), then rescanned it: the deposit moves into transit."""
    rescanned = Line("ethereum", "ETH", "deposit", 5, 0, 5, observed_late=5)
    assert line_severity(rescanned, previous(5)) is None
    assert line_severity(Line("ethereum", "ETH", "deposit", 5, 0, 5), previous(5)) == "critical"


def test_a_growing_surplus_or_a_first_pass_is_judged_on_its_sign():
    assert line_severity(line(12, 10), previous(1)) == "warning"
    assert line_severity(line(11, 10), None) == "warning"
    assert line_severity(line(10, 10), None) is None
    assert shortfall_since(None, line(0, 10)) == 0


@given(st.integers(-(2**80), 2**80), st.integers(-(2**80), 2**80), st.integers(-(2**80), 2**80), st.integers(0, 2**80))
def test_critical_exactly_when_negative_or_fallen_beyond_what_was_booked(before, now, booked, late):
    cur = Line("ethereum", "ETH", "hot", now, 0, 0, booked_off_chain=booked, observed_late=late)
    fell_unexplained = before - now > booked + late
    expected = "critical" if now < 0 or fell_unexplained else "warning" if now > 0 else None
    assert line_severity(cur, previous(before)) == expected


def test_an_unexplained_fall_is_opened_again_at_each_tip_like_a_shortfall():
    fallen = line(2 * ETHER - 4 * ETHER // 10, ETHER)
    assert incident_key(fallen, TIP, "critical") != incident_key(fallen, NEXT, "critical")
    assert incident_key(fallen, TIP) == incident_key(fallen, NEXT)  # judged alone: a surplus
