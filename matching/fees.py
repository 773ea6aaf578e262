"""Maker/taker fee rates per account tier, and the exact integer fee arithmetic.

- Rates are integer parts per million (ppm) of the fill's quote amount, 0 <= rate <= 1,000,000.
  Rebates (negative rates) are not supported.
- Fees are charged in the QUOTE asset on both sides: the buyer pays quote + fee out of its hold,
  the seller receives quote - fee.
- Rounding is UP, in the exchange's favour, and is applied to an order's CUMULATIVE fee, not per
  fill: each order keeps `fee_num = sum(quote_i * rate_i)` over its fills, has paid
  `ceil(fee_num / 1e6)` in total, and a fill's fee is the increase of that ceiling. Per-fill
  rounding would let many small fills charge more than the hold's fee allowance; the cumulative
  ceiling telescopes, so an order's lifetime fee is exactly ceil(sum(quote_i * rate_i) / 10**6),
  never more than `ceil(max_quote * max_rate / 10**6)` that `hold_requirement` reserves. No dust
  is left over: every fee unit rounded up is income, named as such in the fill.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

PPM = 1_000_000


def ceil_div(numerator: int, denominator: int) -> int:
    """Integer ceiling of numerator / denominator for non-negative numerator, positive denominator."""
    return -((-numerator) // denominator)


def fee_increment(fee_num: int, quote: int, rate_ppm: int) -> tuple[int, int]:
    """Fee owed for one more fill of `quote` at `rate_ppm`, and the order's new fee numerator.
    (`ceil_div` written out: this runs twice per fill.)"""
    new_num = fee_num + quote * rate_ppm
    return (-fee_num) // PPM - (-new_num) // PPM, new_num


@dataclass(frozen=True)
class FeeTier:
    """Maker and taker rates of one tier, in parts per million of the quote amount."""

    maker_ppm: int
    taker_ppm: int
    # The larger rate: what a hold must allow for, since an order may make or take. Derived once
    # (holds read it for every amend), not part of the tier's identity.
    max_ppm: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for rate in (self.maker_ppm, self.taker_ppm):
            if type(rate) is not int or not 0 <= rate <= PPM:
                raise ValueError(f"fee rate must be an int in [0, {PPM}] ppm, got {rate!r}")
        object.__setattr__(self, "max_ppm", max(self.maker_ppm, self.taker_ppm))


@dataclass(frozen=True)
class FeeSchedule:
    """Fee tiers by name. Part of the engine's configuration and of its state hash."""

    tiers: Mapping[str, FeeTier] = field(default_factory=dict)

    def tier(self, name: str) -> FeeTier:
        """The named tier; raises KeyError if absent (the engine checks `has` first)."""
        return self.tiers[name]

    def has(self, name: str) -> bool:
        return name in self.tiers

    def to_record(self) -> dict:
        return {name: [t.maker_ppm, t.taker_ppm] for name, t in sorted(self.tiers.items())}

    @classmethod
    def from_record(cls, record: dict) -> "FeeSchedule":
        return cls({name: FeeTier(m, t) for name, (m, t) in record.items()})
