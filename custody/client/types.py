"""The client's money types: amounts are `Decimal` (asset units) or `int` (minor units), never float.

- `Amount`: a decimal string on the wire ("0.25"), a `Decimal` in Python. A `float` is refused (pydantic's
  `ValidationError`, a ValueError) before anything is sent: a binary float
  cannot say 0.1 exactly, and the API refuses more decimals than the asset has.
- `Minor`: an integer count of the asset's minor unit (satoshi, wei). The API sends it as a string
  (an uint256 does not fit a JSON number everywhere); the client parses it to `int` and sends it
  back as a string.
- `Money`: the API's `{value, minor}` pair on every answer that carries an amount.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer


def _no_float(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError("amounts are Decimal, int or decimal strings, never float")
    if isinstance(value, Decimal) and not value.is_finite():
        raise ValueError("an amount must be a finite number")
    return value


def _no_float_minor(value: Any) -> Any:
    if isinstance(value, float):
        raise ValueError("minor units are int (or an integer string), never float")
    return value


Amount = Annotated[Decimal, BeforeValidator(_no_float), PlainSerializer(lambda d: format(d, "f"), return_type=str)]
Minor = Annotated[int, BeforeValidator(_no_float_minor), PlainSerializer(str, return_type=str)]


class Money(BaseModel):
    """An amount as the API answers it: `value` in the asset's units, `minor` in its minor unit."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    value: Amount
    minor: Minor
