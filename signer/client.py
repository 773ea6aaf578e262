"""`SignerClient`: custody's side of the signer socket (signer.wire has the protocol and its tables).

Custody processes import this module; it imports no key code (`signer.keys`, `signer.service`).
It implements `signer.protocol.SignerPort`, plus `ping()` and `xpubs()`. A client speaks as one
named client of the signer's config (`client=`, with that client's own key); which methods it
may call is the signer's decision (its config), and a call outside them raises
`WireError(method_not_allowed)` without the signer reading anything.

Each call opens a fresh connection (a local socket: microseconds), sends one MACed request and
reads one answer whose MAC, id and nonce it checks, then closes; nothing is shared between calls,
so one client may be used from any number of threads.

What a call raises besides its result:
| raised | when |
| --- | --- |
| `SigningRefused(RefusalCode, message, withdrawal_id)` | the signer's checks refused (it audited the refusal); `withdrawal_id` names the one withdrawal it is about, or None |
| `SignerError(SignerErrorCode, message)` | the signing code refused a value |
| `SignerUnavailable` (a `chain_adapters.errors.NodeUnavailable`) | connection refused, reset or timed out, the socket is missing, the signer died mid-call, or it cannot reach its database: jobs retry next run |
| `WireError(unauthenticated / bad_request / unknown_method / method_not_allowed / internal / bad_response)` | see signer.wire |
| `TypeError` | a Python value of the wrong type (a float amount, say), refused before sending |

A timed-out signing call may still have been signed and audited by the signer; asking again is
safe, because the signer re-checks the rows and signs the same transaction (RFC 6979 signatures
are deterministic) or refuses.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Sequence

from signer.bitcoin_tx import SignedTx
from signer.errors import SignerError, SignerErrorCode
from signer.ethereum_tx import SignedEthTx
from signer.protocol import BatchOutput, BtcCoin, ReservesSignature
from signer.wire import (AUTH_KEY_MIN_BYTES, CLIENT_NAME, MAX_LINE, METHODS, Malformed, SignerInfo, SignerUnavailable,
                         WireError, WireErrorCode, Xpubs, check_answer, decode_refused, encode_line, new_request,
                         parse_endpoint, parse_line, read_auth_key)

_WIRE_CODES = {c.value: c for c in WireErrorCode}
_SIGNER_CODES = {c.value: c for c in SignerErrorCode}


class SignerClient:
    """A `SignerPort` that asks the signer process at `endpoint` (`unix:/path` or `tcp:127.0.0.1:PORT`)
    as `client` (a name of the signer's config) with that client's `auth_key`."""

    def __init__(self, endpoint: str, auth_key: bytes, *, client: str = "worker", timeout: float = 60.0,
                 connect_timeout: float = 5.0) -> None:
        if not isinstance(auth_key, bytes) or len(auth_key) < AUTH_KEY_MIN_BYTES:
            raise ValueError(f"the signer auth key must be at least {AUTH_KEY_MIN_BYTES} bytes")
        if not isinstance(client, str) or not CLIENT_NAME.fullmatch(client):
            raise ValueError(f"signer client name {client!r}: 1-64 of a-z, 0-9, '_', '-', starting with a letter")
        self.endpoint = parse_endpoint(endpoint)
        self.client = client
        self._key = auth_key
        self.timeout = timeout  # seconds for the whole call once connected (signing a large batch takes a few)
        self.connect_timeout = connect_timeout

    @classmethod
    def from_key_file(cls, endpoint: str, auth_key_file: str | os.PathLike[str], **kwargs: Any) -> SignerClient:
        return cls(endpoint, read_auth_key(auth_key_file), **kwargs)

    def __repr__(self) -> str:
        return f"SignerClient({str(self.endpoint)!r}, client={self.client!r})"

    # ---- the calls ---------------------------------------------------------------------------

    def ping(self) -> SignerInfo:
        return self._call("ping")

    def xpubs(self) -> Xpubs:
        return self._call("xpubs")

    def sign_bitcoin_batch(self, batch_id: int, coins: Sequence[BtcCoin], outputs: Sequence[BatchOutput],
                           change: tuple[str, int] | None) -> SignedTx:
        return self._call("sign_bitcoin_batch", batch_id=batch_id, coins=coins, outputs=outputs, change=change)

    def sign_bitcoin_replacement(self, batch_id: int, replaces_txid: str, coins: Sequence[BtcCoin],
                                 outputs: Sequence[BatchOutput], change: tuple[str, int] | None) -> SignedTx:
        return self._call("sign_bitcoin_replacement", batch_id=batch_id, replaces_txid=replaces_txid, coins=coins,
                          outputs=outputs, change=change)

    def sign_bitcoin_sweep(self, sweep_id: int, coins: Sequence[BtcCoin], destination: str, fee: int) -> SignedTx:
        return self._call("sign_bitcoin_sweep", sweep_id=sweep_id, coins=coins, destination=destination, fee=fee)

    def sign_bitcoin_rebalance(self, rebalance_id: int, coins: Sequence[BtcCoin], destination: str, amount: int,
                               change: tuple[str, int] | None, replaces_txid: str | None = None) -> SignedTx:
        return self._call("sign_bitcoin_rebalance", rebalance_id=rebalance_id, coins=coins, destination=destination,
                          amount=amount, change=change, replaces_txid=replaces_txid)

    def sign_bitcoin_cpfp(self, rebalance_id: int, parent_raw: bytes, parent_vout: int, destination: str, fee: int,
                          replaces_txid: str | None = None) -> SignedTx:
        return self._call("sign_bitcoin_cpfp", rebalance_id=rebalance_id, parent_raw=parent_raw, parent_vout=parent_vout,
                          destination=destination, fee=fee, replaces_txid=replaces_txid)

    def sign_reserves_message(self, chain: str, tier: str, change: int, index: int, message: str) -> ReservesSignature:
        return self._call("sign_reserves_message", chain=chain, tier=tier, change=change, index=index, message=message)

    def sign_ethereum_payment(self, batch_id: int, output: BatchOutput, *, hot_index: int, chain_id: int, nonce: int,
                              to: str, value: int, data: bytes, gas: int, max_fee_wei: int, priority_fee_wei: int,
                              replaces_txid: str | None = None) -> SignedEthTx:
        return self._call("sign_ethereum_payment", batch_id=batch_id, output=output, hot_index=hot_index,
                          chain_id=chain_id, nonce=nonce, to=to, value=value, data=data, gas=gas,
                          max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid)

    def sign_ethereum_gas_funding(self, sweep_id: int, *, deposit_index: int, chain_id: int, nonce: int, value: int,
                                  gas: int, max_fee_wei: int, priority_fee_wei: int,
                                  replaces_txid: str | None = None) -> SignedEthTx:
        return self._call("sign_ethereum_gas_funding", sweep_id=sweep_id, deposit_index=deposit_index, chain_id=chain_id,
                          nonce=nonce, value=value, gas=gas, max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei,
                          replaces_txid=replaces_txid)

    def sign_ethereum_rebalance(self, rebalance_id: int, *, asset: str, amount: int, destination_tier: str, chain_id: int,
                                nonce: int, gas: int, max_fee_wei: int, priority_fee_wei: int,
                                replaces_txid: str | None = None) -> SignedEthTx:
        return self._call("sign_ethereum_rebalance", rebalance_id=rebalance_id, asset=asset, amount=amount,
                          destination_tier=destination_tier, chain_id=chain_id, nonce=nonce, gas=gas, max_fee_wei=max_fee_wei,
                          priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid)

    def sign_ethereum_sweep(self, sweep_id: int, *, deposit_index: int, asset: str, amount: int, chain_id: int,
                            nonce: int, gas: int, max_fee_wei: int, priority_fee_wei: int,
                            replaces_txid: str | None = None) -> SignedEthTx:
        return self._call("sign_ethereum_sweep", sweep_id=sweep_id, deposit_index=deposit_index, asset=asset, amount=amount,
                          chain_id=chain_id, nonce=nonce, gas=gas, max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei,
                          replaces_txid=replaces_txid)

    # ---- one round trip ----------------------------------------------------------------------

    def _call(self, method: str, **params: Any) -> Any:
        spec = METHODS[method]
        request = new_request(self._key, method, spec.encode_params(params), client=self.client)
        outcome, body = check_answer(self._key, self._round_trip(encode_line(request)), request)
        if outcome == "result":
            try:
                return spec.result.decode(body, "result")
            except Malformed as exc:
                raise WireError(WireErrorCode.bad_response, str(exc)) from None
        if outcome == "refused":
            try:
                refused = decode_refused(body)
            except Malformed as exc:
                raise WireError(WireErrorCode.bad_response, str(exc)) from None
            raise refused
        code, message = _code_and_message(body)
        if code == WireErrorCode.unavailable.value:
            raise SignerUnavailable(f"signer at {self.endpoint}: {message}")
        if code in _SIGNER_CODES:
            raise SignerError(_SIGNER_CODES[code], message)
        raise WireError(_WIRE_CODES.get(code, WireErrorCode.bad_response), message if code in _WIRE_CODES else
                        f"unknown error code {code!r}: {message}")

    def _round_trip(self, line: bytes) -> dict[str, Any]:
        ep = self.endpoint
        family = socket.AF_UNIX if ep.kind == "unix" else (socket.AF_INET6 if ":" in ep.host else socket.AF_INET)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _connect(sock, ep.path if ep.kind == "unix" else (ep.host, ep.port), self.connect_timeout)
            sock.settimeout(self.timeout)
            sock.sendall(line)
            answer = _read_line(sock)
        except OSError as exc:  # refused, reset, broken pipe, timeout, no such socket file, permission
            raise SignerUnavailable(f"signer at {ep}: {exc.strerror or type(exc).__name__}") from None
        finally:
            sock.close()
        try:
            return parse_line(answer)
        except Malformed as exc:
            raise WireError(WireErrorCode.bad_response, str(exc)) from None


def _connect(sock: socket.socket, address: Any, timeout: float) -> None:
    """Connect, retrying while a unix listener's backlog is full (EAGAIN): nothing was sent yet."""
    deadline = time.monotonic() + timeout
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            sock.connect(address)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError(0, "the signer closed the connection without an answer")
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk:
            return b"".join(chunks).split(b"\n", 1)[0] + b"\n"
        if size > MAX_LINE:
            raise WireError(WireErrorCode.bad_response, "the answer is longer than the protocol allows")


def _code_and_message(body: Any) -> tuple[str, str]:
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise WireError(WireErrorCode.bad_response, "an error or refusal carries {code, message}")
    message = body.get("message")
    return body["code"], message if isinstance(message, str) else ""
