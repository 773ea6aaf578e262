"""Exact conversion between decimal strings (the API edge) and integer minor units (everywhere else).

`parse_amount("0.5", 8) == 50_000_000`; `format_amount(50_000_000, 8) == "0.50000000"`.
Parsing refuses more decimals than the asset has (`excess_precision`) instead of rounding, and
refuses signs, exponents, whitespace and anything that is not plain digits with one optional point.
No float is ever involved.
"""
from __future__ import annotations

import re

from ledger.errors import ErrorCode, LedgerError

# ASCII digits only (`\d` would admit e.g. Arabic-Indic digits) and `fullmatch`, because `$` also
# matches before a trailing newline.
_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?")


def parse_amount(text: str, decimals: int, *, allow_zero: bool = False) -> int:
    """Parse a non-negative decimal string into minor units of an asset with `decimals` decimals."""
    if not isinstance(text, str):
        raise LedgerError(ErrorCode.invalid_amount, "amounts are decimal strings, e.g. \"0.5\"")
    match = _DECIMAL.fullmatch(text)
    if match is None:
        raise LedgerError(ErrorCode.invalid_amount, f"not a plain decimal amount: {text!r}")
    whole, frac = match.group(1), match.group(2) or ""
    if len(frac) > decimals:
        raise LedgerError(
            ErrorCode.excess_precision, f"{text!r} has {len(frac)} decimals; the asset allows {decimals}"
        )
    # Bound the size before int(): NUMERIC(78,0) holds at most 78 digits, and int() of a very long
    # string raises ValueError (Python's digit limit) instead of a ledger error.
    whole = whole.lstrip("0")
    if whole and len(whole) + decimals > 78:
        raise LedgerError(ErrorCode.invalid_amount, "amount exceeds 10^78-1 minor units")
    value = int(whole or "0") * 10**decimals + int(frac.ljust(decimals, "0") or "0")
    if value == 0 and not allow_zero:
        raise LedgerError(ErrorCode.invalid_amount, "amount must be greater than zero")
    return value


def format_amount(minor: int, decimals: int) -> str:
    """Format minor units exactly, with all of the asset's decimals (negative values keep their sign)."""
    sign = "-" if minor < 0 else ""
    whole, frac = divmod(abs(minor), 10**decimals)
    if decimals == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:0{decimals}d}"
