"""Construction-time checks shared by the policy data types (not part of the public API).

A policy or request built with a float amount or a naive datetime is a programming error, so
these raise at construction instead of producing a reason code at evaluation.
"""
from __future__ import annotations

from datetime import datetime


def require_int(name: str, value: object, minimum: int | None = None) -> None:
    # bool is a subclass of int and float is never acceptable for money (DESIGN.md 3).
    if type(value) is not int:
        raise TypeError(f"{name} must be an int (minor units), got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def require_aware(name: str, value: object) -> None:
    # Mixing naive and aware datetimes raises deep inside a comparison; fail at the door.
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime")


def normalise_address(address: str) -> str:
    """The form in which addresses are compared against allow- and denylists.

    Hex (ethereum) and bech32 (segwit) addresses are case-insensitive, so they compare in lower
    case; base58 addresses are case-sensitive and compare exactly. Folding base58 case would
    let one address match another on an allowlist.
    """
    stripped = address.strip()
    lowered = stripped.lower()
    if lowered.startswith("0x"):
        return lowered
    if lowered.startswith(("bc1", "tb1", "bcrt1")):
        return lowered
    return stripped
