"""Decimal strings <-> integer minor units: exact both ways, strict on input, never a float."""
from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.amounts import format_amount, parse_amount
from ledger.errors import ErrorCode, LedgerError
from ledger.model import MAX_AMOUNT


def _code(fn, *args, **kw) -> ErrorCode:
    with pytest.raises(LedgerError) as exc:
        fn(*args, **kw)
    return exc.value.code


@pytest.mark.parametrize(
    ("text", "decimals", "minor"),
    [
        ("0.5", 8, 50_000_000),
        ("1", 8, 100_000_000),
        ("0.00000001", 8, 1),
        ("21000000", 8, 2_100_000_000_000_000),
        ("20999999.99999999", 8, 2_099_999_999_999_999),
        ("1.000000000000000001", 18, 10**18 + 1),
        ("0.1", 18, 10**17),
        ("7", 0, 7),
        ("0.10", 2, 10),
        ("007.5", 1, 75),
        # the largest uint256, in wei: exact, where a float would have lost ~60 digits
        ("115792089237316195423570985008687907853269984665640564039457.584007913129639935", 18, 2**256 - 1),
    ],
)
def test_parse_is_exact(text, decimals, minor):
    assert parse_amount(text, decimals) == minor


@pytest.mark.parametrize(
    ("minor", "decimals", "text"),
    [
        (50_000_000, 8, "0.50000000"),
        (1, 8, "0.00000001"),
        (100_000_000, 8, "1.00000000"),
        (0, 8, "0.00000000"),
        (7, 0, "7"),
        (-150, 2, "-1.50"),
        (-1, 8, "-0.00000001"),
        (2**256 - 1, 18, "115792089237316195423570985008687907853269984665640564039457.584007913129639935"),
    ],
)
def test_format_is_exact(minor, decimals, text):
    assert format_amount(minor, decimals) == text


@pytest.mark.parametrize(
    ("text", "decimals"),
    [("0.000000001", 8), ("1.5", 0), ("0.123", 2), ("0.500000000", 8)],  # trailing zeros count too
)
def test_more_decimals_than_the_asset_is_excess_precision_not_rounding(text, decimals):
    assert _code(parse_amount, text, decimals) is ErrorCode.excess_precision


@pytest.mark.parametrize(
    "text",
    [
        "-1", "+1", "-0.5",  # signs
        "1e8", "1E-8", "1e0",  # exponents
        " 1", "1 ", "1\n", "\t1", "1 000", "1_000",  # whitespace and separators
        "", ".", ".5", "1.", "1..2", "1.2.3", "0x10", "1,5",
        "NaN", "inf", "Infinity",
        "\u0661\u0662",  # Arabic-Indic digits: int() would accept them
        "\uff11",  # fullwidth digit one
    ],
)
def test_rejects_anything_but_plain_digits(text):
    assert _code(parse_amount, text, 8) is ErrorCode.invalid_amount


@pytest.mark.parametrize("value", [0.5, 1.0, Decimal("0.5"), 5, None, b"1", True])
def test_rejects_non_string_input_including_float(value):
    assert _code(parse_amount, value, 8) is ErrorCode.invalid_amount


def test_zero_needs_allow_zero():
    assert _code(parse_amount, "0", 8) is ErrorCode.invalid_amount
    assert _code(parse_amount, "0.00000000", 8) is ErrorCode.invalid_amount
    assert parse_amount("0", 8, allow_zero=True) == 0
    assert parse_amount("0.00", 2, allow_zero=True) == 0


def test_size_is_bounded_by_numeric_78():
    assert parse_amount("9" * 70 + "." + "9" * 8, 8) == MAX_AMOUNT
    assert _code(parse_amount, "1" + "0" * 70, 8) is ErrorCode.invalid_amount
    # a huge string is a ledger error, not Python's int-size ValueError
    assert _code(parse_amount, "9" * 5000, 8) is ErrorCode.invalid_amount
    # leading zeros do not count
    assert parse_amount("0" * 5000 + "1.5", 8) == 150_000_000


decimals_st = st.integers(min_value=0, max_value=36)


@given(minor=st.integers(min_value=1, max_value=MAX_AMOUNT), decimals=decimals_st)
def test_format_then_parse_round_trips(minor, decimals):
    text = format_amount(minor, decimals)
    assert parse_amount(text, decimals) == minor


@given(minor=st.integers(min_value=0, max_value=MAX_AMOUNT), decimals=decimals_st)
def test_formatted_text_has_exactly_the_asset_decimals(minor, decimals):
    text = format_amount(minor, decimals)
    if decimals:
        whole, frac = text.split(".")
        assert len(frac) == decimals
    else:
        assert "." not in text
    with localcontext() as ctx:
        ctx.prec = 200  # the default 28 digits would round, which is the very thing under test
        assert Decimal(text).scaleb(decimals) == minor


@given(
    whole=st.integers(min_value=0, max_value=10**30),
    frac=st.text(alphabet="0123456789", min_size=0, max_size=18),
    decimals=st.integers(min_value=0, max_value=18),
)
def test_parse_agrees_with_decimal_arithmetic(whole, frac, decimals):
    text = f"{whole}.{frac}" if frac else str(whole)
    if len(frac) > decimals:
        assert _code(parse_amount, text, decimals) is ErrorCode.excess_precision
        return
    with localcontext() as ctx:
        ctx.prec = 200
        expected = Decimal(text).scaleb(decimals)
        assert expected == expected.to_integral_value()
    value = parse_amount(text, decimals, allow_zero=True)
    assert value == int(expected)
    assert parse_amount(format_amount(value, decimals), decimals, allow_zero=True) == value


@given(minor=st.integers(min_value=-MAX_AMOUNT, max_value=-1), decimals=decimals_st)
def test_negative_format_is_the_negation_of_positive(minor, decimals):
    assert format_amount(minor, decimals) == "-" + format_amount(-minor, decimals)
