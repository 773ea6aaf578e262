"""The matching engine's result codes: a stable vocabulary for rejections and refusals.

A code reaches callers in two ways: inside an event (`OrderRejected.code`, `RequestRejected.code`),
when the engine refuses a well-formed command as part of normal operation; or inside a
`MatchingError`, when the caller broke the engine's contract (a sequence gap, an illegal state
transition). Codes are listed in the order the engine checks them; each has a one-line meaning and
the HTTP status the API edge maps it to (only the HTTP layer uses the status). Codes never change
meaning; new ones are appended.

| code | HTTP | meaning |
| --- | --- | --- |
| invalid_request | 422 | the command is malformed: unknown command, or a field of the wrong type (raised, never journaled) |
| invalid_quantity | 422 | a quantity is not a positive integer number of lots (or is given where it must not be) |
| invalid_price | 422 | a limit price is not a positive integer number of ticks (or is given for a market order) |
| invalid_budget | 422 | a market bid needs a positive integer quote budget; nothing else may carry one |
| invalid_stop_price | 422 | a stop order needs a positive integer stop price; nothing else may carry one |
| invalid_display_quantity | 422 | an iceberg's display quantity must be positive, below its quantity, on a resting limit |
| invalid_time_in_force | 422 | the time in force does not fit the order type (e.g. post-only IOC, market GTC) |
| unknown_fee_tier | 422 | the fee schedule has no such tier |
| below_min_notional | 422 | the order's quote value at its limit price (or its budget) is below the market minimum |
| duplicate_order_id | 409 | another order already uses this order id |
| post_only_would_cross | 409 | a post-only order would have taken liquidity |
| self_trade_prevented | 409 | self-trade prevention removed the order before any quantity traded |
| order_not_found | 404 | no order with that id on this market |
| order_owner_mismatch | 403 | the order belongs to another account |
| order_not_open | 409 | the order is in a terminal state (or not in the state the command needs) |
| order_not_amendable | 409 | market orders never rest and cannot be amended |
| hold_failed | 409 | the money layer could not place the hold for a triggered stop |
| sequence_gap | 500 | a command's sequence number is not the next one; the journal is broken |
| illegal_transition | 500 | an order state change not in the declared table was attempted (a bug) |
| market_not_found | 404 | no market with that symbol is configured |
| market_assets_must_be_different | 422 | a market's base and quote asset are the same |
"""
from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    """Stable matching result codes. `.http_status` and `.meaning` document each one."""

    invalid_request = "invalid_request"
    invalid_quantity = "invalid_quantity"
    invalid_price = "invalid_price"
    invalid_budget = "invalid_budget"
    invalid_stop_price = "invalid_stop_price"
    invalid_display_quantity = "invalid_display_quantity"
    invalid_time_in_force = "invalid_time_in_force"
    unknown_fee_tier = "unknown_fee_tier"
    below_min_notional = "below_min_notional"
    duplicate_order_id = "duplicate_order_id"
    post_only_would_cross = "post_only_would_cross"
    self_trade_prevented = "self_trade_prevented"
    order_not_found = "order_not_found"
    order_owner_mismatch = "order_owner_mismatch"
    order_not_open = "order_not_open"
    order_not_amendable = "order_not_amendable"
    hold_failed = "hold_failed"
    sequence_gap = "sequence_gap"
    illegal_transition = "illegal_transition"
    market_not_found = "market_not_found"
    market_assets_must_be_different = "market_assets_must_be_different"

    @property
    def http_status(self) -> int:
        return _TABLE[self][0]

    @property
    def meaning(self) -> str:
        return _TABLE[self][1]


_TABLE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.invalid_request: (422, "the command is malformed"),
    ErrorCode.invalid_quantity: (422, "a quantity is not a positive integer number of lots"),
    ErrorCode.invalid_price: (422, "a limit price is not a positive integer number of ticks"),
    ErrorCode.invalid_budget: (422, "a market bid needs a positive integer quote budget"),
    ErrorCode.invalid_stop_price: (422, "a stop order needs a positive integer stop price"),
    ErrorCode.invalid_display_quantity: (422, "bad iceberg display quantity"),
    ErrorCode.invalid_time_in_force: (422, "the time in force does not fit the order type"),
    ErrorCode.unknown_fee_tier: (422, "the fee schedule has no such tier"),
    ErrorCode.below_min_notional: (422, "the order's quote value is below the market minimum"),
    ErrorCode.duplicate_order_id: (409, "another order already uses this order id"),
    ErrorCode.post_only_would_cross: (409, "a post-only order would have taken liquidity"),
    ErrorCode.self_trade_prevented: (409, "self-trade prevention removed the order"),
    ErrorCode.order_not_found: (404, "no order with that id on this market"),
    ErrorCode.order_owner_mismatch: (403, "the order belongs to another account"),
    ErrorCode.order_not_open: (409, "the order is closed or not in the state the command needs"),
    ErrorCode.order_not_amendable: (409, "market orders cannot be amended"),
    ErrorCode.hold_failed: (409, "the money layer could not place the hold"),
    ErrorCode.sequence_gap: (500, "a command's sequence number is not the next one"),
    ErrorCode.illegal_transition: (500, "an undeclared order state change was attempted"),
    ErrorCode.market_not_found: (404, "no market with that symbol is configured"),
    ErrorCode.market_assets_must_be_different: (422, "a market's base and quote asset are the same"),
}


class MatchingError(Exception):
    """Any contract violation reported by the matching engine; `code` says which."""

    def __init__(self, code: ErrorCode, message: str | None = None, **detail: object) -> None:
        self.code = ErrorCode(code)
        self.message = message or self.code.meaning
        self.detail = detail
        super().__init__(f"{self.code.value}: {self.message}")


class SequenceError(MatchingError):
    """A command arrived with a sequence number other than the next one."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(ErrorCode.sequence_gap, f"expected seq {expected}, got {got}",
                         expected=expected, got=got)


class IllegalTransition(MatchingError):
    """An order state change that the declared transition table does not allow."""

    def __init__(self, order_id: str, old: object, new: object) -> None:
        super().__init__(ErrorCode.illegal_transition, f"{order_id}: {old} -> {new}",
                         order_id=order_id, old=old, new=new)
