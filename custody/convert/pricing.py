"""Convert pricing: the exact integer arithmetic of a quote. Pure: values in, values out.

A rate is an exact fraction: minor units of the to-asset per minor unit of the from-asset
(`fractions.Fraction` of integers, never a float). Where a rule rounds, it names its direction:

- **fee**: `ceil(from_amount * fee_ppm / 10^6)` from-asset minor units, rounded UP (the house's
  favour), charged out of the amount the customer sells;
- **payout**: `floor(net * rate)` to-asset minor units (`net = from_amount - fee`), rounded DOWN
  (the house's favour);
- **cost**: `ceil(payout / rate)`, the from-asset minor units the payout costs at the rate, rounded
  UP (the house's favour): what the house's liquidity account of the from-asset receives;
- **rounding**: `net - cost`, the whole from-asset minor units of the sale that bought nothing
  because the payout was rounded down: booked to the named account `convert:rounding:<asset>`
  (kind dust), never lost and never mixed into the liquidity;
- **remainder**: `cost - payout / rate`, the part of one from-asset minor unit (< 1) the house keeps
  beyond that; it cannot be booked in whole minor units, so the quote states it exactly;
- **spread**: the house's rate is the reference rate times `(10^6 - spread_ppm) / 10^6`;
- **band**: a book's average rate is usable only within `band_ppm` of a reference rate (the
  market's last trade, else the operator's price): `|average - reference| <= reference * band_ppm / 10^6`
  (`within_band`); the database bounds the house's side of it again (migration 0040);
- **long rates**: a book's average rate whose denominator exceeds 10^30 is rounded DOWN to a
  denominator of 10^30 (the database stores numerator and denominator as NUMERIC(78,0)).

The reference rate comes from an order book's depth (the average price of filling the amount:
`spend_through` / `receive_through` over levels best first) or from an operator's price for a pair
without a market (`operator_rate`). The worked example of the README: selling 100.00 EUR
(10,000 cents) at 58,000.00 EUR/BTC with a 0.25% fee: fee 25 cents, payout
floor(9,975 * 500 / 29) = 171,982 satoshi (0.00171982 BTC), cost ceil(171,982 * 29 / 500) = 9,975
cents, rounding 0, remainder 11/250 of a cent.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

PPM = 1_000_000
MAX_RATE_DENOMINATOR = 10**30
MAX_NUMERIC = 10**78 - 1  # NUMERIC(78,0)


class PricingRefused(ValueError):
    """No quote can be made: `reason` is `depth` (the book cannot fill the amount), `too_small`
    (the payout rounds to nothing) or `too_large` (a figure exceeds NUMERIC(78,0))."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Level:
    """One price level as the converting customer meets it: taking all of it costs `gives`
    from-asset minor units and yields `takes` to-asset minor units."""

    gives: int
    takes: int


@dataclass(frozen=True)
class Figures:
    """A quote's amounts in minor units; `rate` is to-asset per from-asset (after the spread)."""

    from_amount: int  # what the customer pays in total (the fee included)
    fee: int  # from-asset, to fee income
    to_amount: int  # what the customer receives
    rate: Fraction

    @property
    def net(self) -> int:
        """From-asset minor units converted: the liquidity's cost plus the rounding."""
        return self.from_amount - self.fee

    @property
    def cost(self) -> int:
        return cost_of(self.to_amount, self.rate)

    @property
    def rounding(self) -> int:
        return self.net - self.cost

    @property
    def remainder(self) -> Fraction:
        return self.cost - self.to_amount / self.rate


def cost_of(payout: int, rate: Fraction) -> int:
    """The from-asset minor units `payout` costs at `rate`, rounded up."""
    return ceil_div(payout * rate.denominator, rate.numerator)


def ceil_div(numerator: int, denominator: int) -> int:
    return -((-numerator) // denominator)


def fee_for(amount: int, fee_ppm: int) -> int:
    """The fee on `amount`, rounded up."""
    return ceil_div(amount * fee_ppm, PPM)


def apply_spread(reference: Fraction, spread_ppm: int) -> Fraction:
    """The house's rate: the reference less the spread, its denominator bounded (rounded down)."""
    rate = reference * Fraction(PPM - spread_ppm, PPM)
    if rate.denominator > MAX_RATE_DENOMINATOR:
        rate = Fraction(rate.numerator * MAX_RATE_DENOMINATOR // rate.denominator, MAX_RATE_DENOMINATOR)
    if rate <= 0:
        raise PricingRefused("too_small", "the rate rounds to nothing")
    return rate


def within_band(rate: Fraction, reference: Fraction, band_ppm: int) -> bool:
    """Whether `rate` lies within `band_ppm` parts per million of `reference` (both sides)."""
    return abs(rate - reference) * PPM <= reference * band_ppm


def operator_rate(price_minor_per_base_unit: int, base_decimals: int, *, selling_base: bool) -> Fraction:
    """The reference rate of an operator's price (quote minor units per whole base unit)."""
    per_base_minor = Fraction(price_minor_per_base_unit, 10**base_decimals)
    return per_base_minor if selling_base else 1 / per_base_minor


def spend_through(levels: Sequence[Level], amount: int) -> Fraction:
    """The to-asset (exact) that `amount` from-asset buys through `levels`, best first."""
    left, got = amount, Fraction(0)
    for level in levels:
        if left <= 0:
            break
        if left >= level.gives:
            left -= level.gives
            got += level.takes
        else:
            got += Fraction(level.takes * left, level.gives)
            left = 0
    if left > 0:
        raise PricingRefused("depth", "the order book cannot fill this amount")
    return got


def receive_through(levels: Sequence[Level], amount: int) -> Fraction:
    """The from-asset (exact) it takes to receive `amount` to-asset through `levels`, best first."""
    return spend_through([Level(level.takes, level.gives) for level in levels], amount)


def figures_for_from(from_amount: int, rate: Fraction, fee_ppm: int) -> Figures:
    """Selling exactly `from_amount` (the fee included) at `rate`."""
    fee = fee_for(from_amount, fee_ppm)
    exact = (from_amount - fee) * rate
    to_amount = exact.numerator // exact.denominator
    if to_amount <= 0:
        raise PricingRefused("too_small", "the payout rounds down to nothing")
    return _bounded(Figures(from_amount, fee, to_amount, rate))


def figures_for_to(to_amount: int, rate: Fraction, fee_ppm: int) -> Figures:
    """Receiving at least `to_amount`: the smallest amount sold (fee included) whose payout reaches
    it. The payout is then computed as for any sale, so it may exceed `to_amount` by less than what
    one from-asset minor unit buys."""
    net = ceil_div(to_amount * rate.denominator, rate.numerator)  # smallest net with floor(net*rate) >= to
    gross = ceil_div(net * PPM, PPM - fee_ppm)  # smallest gross with gross - fee(gross) >= net
    return figures_for_from(gross, rate, fee_ppm)


def _bounded(figures: Figures) -> Figures:
    for value in (figures.from_amount, figures.to_amount, figures.rate.numerator, figures.rate.denominator):
        if value > MAX_NUMERIC:
            raise PricingRefused("too_large", "a figure of the quote exceeds 10^78 - 1")
    return figures
