"""Chain adapter errors: one root, a stable code per failure, node messages kept as detail.

| code               | meaning                                                                    |
| ------------------ | -------------------------------------------------------------------------- |
| `node_unavailable` | the node could not be reached or answered with a transport error          |
| `node_busy`        | the node runs a call it allows once at a time (a UTXO-set scan, a block-filter scan, a wallet rescan) and refused another: wait or skip this tick |
| `wrong_network`    | the node answers for another chain than configured (a `NodeUnavailable`: ours is not there) |
| `insufficient_fee` | the node refused the transaction's fee (too low, or too low to replace)   |
| `conflict`         | the transaction spends what another transaction already spends (or nonce) |
| `invalid`          | the node rejected the transaction as malformed or not valid               |
| `insufficient_funds` | the sender cannot pay value + fee (ethereum)                            |
| `not_found`        | a block or transaction the caller named is not known to the node          |
| `reorg_too_deep`   | the fork point is below the history the node can still show us            |
| `node_error`       | any other node error (see `detail`)                                       |

Callers branch on `.code`, never on message text. Idempotent replays are not errors: a broadcast
of an already known or already mined transaction returns a `BroadcastResult` with `already_known`.
"""
from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    NODE_UNAVAILABLE = "node_unavailable"
    NODE_BUSY = "node_busy"
    WRONG_NETWORK = "wrong_network"
    INSUFFICIENT_FEE = "insufficient_fee"
    CONFLICT = "conflict"
    INVALID = "invalid"
    INSUFFICIENT_FUNDS = "insufficient_funds"
    NOT_FOUND = "not_found"
    REORG_TOO_DEEP = "reorg_too_deep"
    NODE_ERROR = "node_error"


class ChainError(Exception):
    """Root of every chain adapter error; `.code` is an ErrorCode, `.detail` the node's words."""

    code: ErrorCode = ErrorCode.NODE_ERROR

    def __init__(self, detail: str = "", *, code: ErrorCode | None = None) -> None:
        super().__init__(f"{code or self.code}: {detail}")
        if code is not None:
            self.code = code
        self.detail = detail


class NodeUnavailable(ChainError):
    """The node could not be reached."""

    code = ErrorCode.NODE_UNAVAILABLE


class WrongNetwork(NodeUnavailable):
    """The node answers for another chain than the adapter's network: nothing may be read from it
    or sent to it (callers that retry an unavailable node retry this too)."""

    code = ErrorCode.WRONG_NETWORK


class NodeBusy(ChainError):
    """The node is up but already runs a call it allows only once at a time (bitcoind:
    `scantxoutset`, `scanblocks`, a wallet rescan) and refused this one. Nothing was done; the
    same call may succeed later. Not a `NodeUnavailable`: the node is reachable and on its chain."""

    code = ErrorCode.NODE_BUSY


class InsufficientFee(ChainError):
    """The node refused the fee (below relay minimum, or too low to replace)."""

    code = ErrorCode.INSUFFICIENT_FEE


class Conflict(ChainError):
    """Another transaction already spends the same inputs / uses the same nonce."""

    code = ErrorCode.CONFLICT


class InvalidTransaction(ChainError):
    """The node rejected the transaction as malformed or invalid."""

    code = ErrorCode.INVALID


class InsufficientFunds(ChainError):
    """The sender cannot pay value plus fee."""

    code = ErrorCode.INSUFFICIENT_FUNDS


class NotFound(ChainError):
    """A named block or transaction is not known to the node."""

    code = ErrorCode.NOT_FOUND


class ReorgTooDeep(ChainError):
    """The fork point could not be found in the history the node still serves."""

    code = ErrorCode.REORG_TOO_DEEP


class RpcError(ChainError):
    """A JSON-RPC error response (`rpc_code` is the node's own number); mapped by the adapters."""

    code = ErrorCode.NODE_ERROR

    def __init__(self, rpc_code: int, message: str) -> None:
        super().__init__(f"rpc {rpc_code}: {message}")
        self.rpc_code = rpc_code
        self.message = message
