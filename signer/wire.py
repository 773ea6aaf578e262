"""The signer's socket protocol: one authenticated JSON request, one authenticated JSON answer.

Custody's worker (`signer.client.SignerClient`) and the signer process (`signer.server`) both use
this module; it holds no key code (no `signer.keys`, no `signer.service`), only the envelope, the
MACs, the method table and the codecs between Python values and JSON.

Framing: one connection carries one request line and one answer line, each a UTF-8 JSON object
ended by `\\n` (at most MAX_LINE bytes), then the server closes the connection.

| envelope | fields |
| --- | --- |
| request | `id` (str, chosen by the client), `client` (str, its name in the signer's config), `method` (str), `params` (object), `ts` (int, unix seconds), `nonce` (32 hex digits, random), `mac` |
| answer | `id` and `nonce` of the request, exactly one of `result`, `refused` {code, message, withdrawal_id}, `error` {code, message}; `mac` |

Clients: the signer knows each caller by name (`ClientGrant`: name, its own auth key, the methods
it may call; the signer's config lists them). Deployed, `worker` may call every method and `api`
only `ping`, `xpubs` and `sign_reserves_message`, so a compromised API process cannot even ask for
a batch, sweep or rebalance to be signed. Two clients never share a key (a key is the identity).

`mac` is hex HMAC-SHA256 under the auth key of the client the request names (AUTH_KEY_MIN_BYTES+
bytes, a 0600 file of hex, `read_auth_key`) over a direction label ("signer-wire/1 request\\n" or
"... answer\\n") followed by the canonical JSON (sorted keys, no spaces, ASCII) of every other field.
The server refuses an unknown client, a bad MAC, a `ts` more than MAX_SKEW_SECONDS from its clock
and a nonce already seen within that window; the client refuses an answer whose MAC fails or that
names another request's id or nonce, so nobody on the socket can forge or replay a signed
transaction answer. An answer is MACed under the same client's key; the answer to a request that
did not authenticate (unknown client, bad MAC, an unreadable line) under a random key of the
server's, so it verifies for nobody and tells a prober nothing.

A request is checked in this order; the first failure is the answer:
| step | failure |
| --- | --- |
| the line is one JSON object | `bad_request` |
| `client` names a configured client and the MAC verifies under its key | `unauthenticated` |
| `ts` within MAX_SKEW_SECONDS, nonce not seen | `unauthenticated` |
| exactly the envelope's keys, of their types | `bad_request` |
| `method` is in the method table | `unknown_method` |
| the client's grant lists `method` | `method_not_allowed` (logged with client, method and peer; no database read) |
| `params` decode | `bad_request` |
| the Signer's own checks | `refused` / `error` |

Values: bytes as lowercase hex, amounts and ids as JSON integers (a float, even 1.0, is refused
with `bad_request`; so are booleans), tuples as arrays, absent optionals as null. Unknown and
missing keys are refused.

Methods (and nothing else):
| method | params | result |
| --- | --- | --- |
| ping | {} | {network, master_fingerprint} |
| xpubs | {} | {network, master_fingerprint, accounts: {chain: {tier: account xpub}}} (public keys only; cold included) |
| sign_bitcoin_batch | batch_id, coins, outputs, change | signed bitcoin tx {raw, txid, vsize, fee, change_vout, weight} |
| sign_bitcoin_replacement | batch_id, replaces_txid, coins, outputs, change | signed bitcoin tx |
| sign_bitcoin_sweep | sweep_id, coins, destination, fee | signed bitcoin tx |
| sign_bitcoin_rebalance | rebalance_id, coins, destination, amount, change, replaces_txid | signed bitcoin tx |
| sign_bitcoin_cpfp | rebalance_id, parent_raw, parent_vout, destination, fee, replaces_txid | signed bitcoin tx (a CPFP child of a stuck rebalance into hot) |
| sign_reserves_message | chain, tier, change, index, message | {address, signature} (BIP-322 simple or EIP-191; message: a signer.protocol.ReservesStatement) |
| sign_ethereum_payment | batch_id, output, hot_index, chain_id, nonce, to, value, data, gas, max_fee_wei, priority_fee_wei, replaces_txid | signed ethereum tx {raw, txid, sender, nonce} |
| sign_ethereum_gas_funding | sweep_id, deposit_index, chain_id, nonce, value, gas, max_fee_wei, priority_fee_wei, replaces_txid | signed ethereum tx |
| sign_ethereum_sweep | sweep_id, deposit_index, asset, amount, chain_id, nonce, gas, max_fee_wei, priority_fee_wei, replaces_txid | signed ethereum tx |
| sign_ethereum_rebalance | rebalance_id, asset, amount, destination_tier, chain_id, nonce, gas, max_fee_wei, priority_fee_wei, replaces_txid | signed ethereum tx |

coins: [{txid, vout, amount, change, index}]; outputs / output: {withdrawal_id, address, amount,
script}; change: null or [address, amount]. The signing methods are `signer.protocol.SignerPort`'s.

Answers that are not a result:
| answer | client raises | meaning |
| --- | --- | --- |
| refused {code, message, withdrawal_id} | `signer.protocol.SigningRefused(RefusalCode(code), message, withdrawal_id)` | the signer's checks refused; it wrote its audit row. `withdrawal_id` (an integer, or null) names the one withdrawal the refusal is about; absent is read as null (a signer from before it existed). `encode_refused` / `decode_refused` |
| error {code: a `SignerErrorCode`} | `signer.errors.SignerError` | the signing code refused the values (bad address, index...) |
| error unauthenticated | `WireError` | unknown client, bad MAC (the wrong client's key), `ts` more than 30 s away, or a replayed nonce (logged by the server) |
| error bad_request | `WireError` | not JSON, a missing or unknown field, a float or bool where an integer belongs, bad hex |
| error unknown_method | `WireError` | a method not in the table above |
| error method_not_allowed | `WireError` | a method in the table that this client's grant does not list (logged by the server; refused before any database read) |
| error unavailable | `SignerUnavailable` | the signer cannot reach its database, or waited past its lock_timeout (10 s) for a lock another session holds (signer.service); retried next tick |
| error internal | `WireError` | anything else; the traceback is in the signer's log only |
| (none: refused, reset, timeout) | `SignerUnavailable` | the signer is not running or died mid-call; retried next tick |
| (client-side) bad_response | `WireError` | the answer failed its MAC, or is malformed, or answers another request |

`SignerUnavailable` subclasses `chain_adapters.errors.NodeUnavailable`, which custody's jobs and
containment already treat as "retry next run".
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import re
import stat
import time
import threading
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from chain_adapters.errors import NodeUnavailable
from signer.bitcoin_tx import SignedTx
from signer.ethereum_tx import SignedEthTx
from signer.protocol import BatchOutput, BtcCoin, RefusalCode, ReservesSignature, SigningRefused

T = TypeVar("T")

MAX_LINE = 4 * 1024 * 1024  # bytes per request or answer line; a 500-output batch is ~100 KB
MAX_SKEW_SECONDS = 30
AUTH_KEY_MIN_BYTES = 32
_NONCE = re.compile(r"[0-9a-f]{32}")
_REQUEST_KEYS = frozenset({"id", "client", "method", "params", "ts", "nonce", "mac"})
CLIENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_LABELS = {"request": b"signer-wire/1 request\n", "answer": b"signer-wire/1 answer\n"}


class WireErrorCode(StrEnum):
    """Protocol-level failures (module table); the signer's own refusals are RefusalCode and SignerErrorCode."""

    unauthenticated = "unauthenticated"
    bad_request = "bad_request"
    unknown_method = "unknown_method"
    method_not_allowed = "method_not_allowed"
    unavailable = "unavailable"
    internal = "internal"
    bad_response = "bad_response"


class WireError(Exception):
    """A protocol failure with a `WireErrorCode` (not a refusal of the signer's checks)."""

    def __init__(self, code: WireErrorCode, message: str = "") -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code.value}: {message}" if message else code.value)


class SignerUnavailable(NodeUnavailable):
    """The signer process could not be reached or did not answer (refused, reset, timeout, no database)."""


class Malformed(ValueError):
    """A value that does not decode; `bad_request` on the server, `bad_response` on the client."""


# ---- endpoints and the auth key ----------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where the signer listens: `unix:/abs/path.sock` or `tcp:127.0.0.1:PORT` / `tcp:[::1]:PORT`."""

    kind: str  # "unix" | "tcp"
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        return f"tcp:[{self.host}]:{self.port}" if ":" in self.host else f"tcp:{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """Parse an endpoint; ValueError (with the reason) for anything but an absolute unix socket
    path or a loopback IP literal with a port in 1..65535. Non-loopback TCP is refused: the
    protocol authenticates but does not encrypt."""
    if not isinstance(text, str):
        raise ValueError("an endpoint is a string: unix:/path/to.sock or tcp:127.0.0.1:PORT")
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path.startswith("/"):
            raise ValueError(f"{text!r}: a unix socket path must be absolute")
        if len(path.encode()) > 100:  # sun_path is 108 bytes on Linux, 104 on the BSDs
            raise ValueError(f"{text!r}: a unix socket path must be at most 100 bytes")
        return Endpoint("unix", path=path)
    if text.startswith("tcp:"):
        rest = text[len("tcp:"):]
        m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})", rest) or re.fullmatch(r"([0-9.]+):(\d{1,5})", rest)
        if not m:
            raise ValueError(f"{text!r}: write tcp:127.0.0.1:PORT or tcp:[::1]:PORT (an IP literal, not a name)")
        try:
            host = ipaddress.ip_address(m.group(1))
        except ValueError:
            raise ValueError(f"{text!r}: {m.group(1)!r} is not an IP address") from None
        if not host.is_loopback:
            raise ValueError(f"{text!r}: the signer listens on loopback only (127.0.0.0/8 or ::1); "
                             "the protocol authenticates but does not encrypt")
        port = int(m.group(2))
        if not 1 <= port <= 65535:
            raise ValueError(f"{text!r}: port must be in 1..65535")
        return Endpoint("tcp", host=str(host), port=port)
    raise ValueError(f"{text!r}: an endpoint starts with unix: or tcp:")


def read_auth_key(path: str | os.PathLike[str]) -> bytes:
    """One client's auth key from a file of hex (AUTH_KEY_MIN_BYTES+ bytes, surrounding whitespace
    ignored) that group and others cannot access. ValueError with the reason; never the key."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        raw = p.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"auth key file {p}: cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"auth key file {p} has mode {stat.S_IMODE(mode):o}; chmod 600 it")
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"auth key file {p}: the key must be written as hex (e.g. `openssl rand -hex 32`)") from None
    if len(key) < AUTH_KEY_MIN_BYTES:
        raise ValueError(f"auth key file {p}: the key is {len(key)} bytes; at least {AUTH_KEY_MIN_BYTES} are required")
    return key


def write_auth_key(path: str | os.PathLike[str], nbytes: int = AUTH_KEY_MIN_BYTES) -> bytes:
    """Create a new random auth key file (mode 0600, refusing to overwrite one); return the key."""
    key = os.urandom(nbytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key.hex() + "\n")
    return key


# ---- envelope and MACs -------------------------------------------------------------------------


def canonical(obj: Any) -> bytes:
    """The bytes a MAC covers: sorted keys, no whitespace, ASCII, no NaN/Infinity."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def compute_mac(key: bytes, direction: str, message: Mapping[str, Any]) -> str:
    body = {k: v for k, v in message.items() if k != "mac"}
    return hmac.new(key, _LABELS[direction] + canonical(body), hashlib.sha256).hexdigest()


def _mac_ok(key: bytes, direction: str, message: Mapping[str, Any]) -> bool:
    mac = message.get("mac")
    try:
        return isinstance(mac, str) and hmac.compare_digest(mac, compute_mac(key, direction, message))
    except (ValueError, TypeError):  # not canonicalisable, or a non-ASCII mac string
        return False


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise Malformed(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise Malformed(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise Malformed(f"{text[:20]} is out of range")
    return value  # parsed so the MAC can be checked; refused later wherever a value is decoded


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")
MAX_DEPTH = 16  # our messages nest 4 deep; json's C decoder recurses per level (and eth_account's
#                 py_ecc raises the recursion limit to 100,000, so a deep line would crash the process)


def _check_depth(text: str) -> None:
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            raise Malformed(f"nested more than {MAX_DEPTH} deep")


def parse_line(line: bytes) -> dict[str, Any]:
    """One JSON object from one line; Malformed for anything else (duplicate keys, NaN, not UTF-8,
    nested more than MAX_DEPTH deep)."""
    try:
        text = line.decode("utf-8")
        _check_depth(text)
        obj = json.loads(text, object_pairs_hook=_refuse_duplicates, parse_constant=_no_constant,
                         parse_float=_finite_float)
    except Malformed:
        raise
    except RecursionError:
        raise Malformed("nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise Malformed(f"not a JSON line: {exc}") from None
    if not isinstance(obj, dict):
        raise Malformed("a message is a JSON object")
    return obj


def encode_line(message: Mapping[str, Any]) -> bytes:
    return canonical(message) + b"\n"


def new_request(key: bytes, method: str, params: Mapping[str, Any], *, client: str = "worker",
                request_id: str | None = None, now: float | None = None) -> dict[str, Any]:
    """A request envelope from `client`, MACed under `key` (a fresh random nonce; `id` random unless given)."""
    msg = {"id": request_id or os.urandom(8).hex(), "client": client, "method": method, "params": dict(params),
           "ts": int(time.time() if now is None else now), "nonce": os.urandom(16).hex()}
    msg["mac"] = compute_mac(key, "request", msg)
    return msg


def new_answer(key: bytes, request_id: Any, nonce: Any, outcome: str, body: Any) -> dict[str, Any]:
    """A signed answer: `outcome` is "result", "refused" or "error"."""
    msg = {"id": request_id, "nonce": nonce, outcome: body}
    msg["mac"] = compute_mac(key, "answer", msg)
    return msg


@dataclass(frozen=True)
class ClientGrant:
    """One caller the signer knows: its name, its own auth key and the methods it may call.
    ValueError for a bad name, a short key, an empty list or a method not in METHODS."""

    name: str
    key: bytes = field(repr=False)
    methods: frozenset[str]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not CLIENT_NAME.fullmatch(self.name):
            raise ValueError(f"client name {self.name!r}: 1-64 of a-z, 0-9, '_', '-', starting with a letter")
        if not isinstance(self.key, bytes) or len(self.key) < AUTH_KEY_MIN_BYTES:
            raise ValueError(f"client {self.name}: the auth key must be at least {AUTH_KEY_MIN_BYTES} bytes")
        object.__setattr__(self, "methods", frozenset(self.methods))
        unknown = sorted(m for m in self.methods if m not in METHODS)
        if unknown:
            raise ValueError(f"client {self.name}: unknown methods {unknown}; the methods are {sorted(METHODS)}")
        if not self.methods:
            raise ValueError(f"client {self.name}: at least one method")


class RequestAuthenticator:
    """The server's check of a request envelope: which client, its MAC, clock skew, nonce replay
    (thread-safe), in the order of the module's table.

    A nonce is remembered while its `ts` is still acceptable (MAX_SKEW_SECONDS either side), so
    the cache holds at most the nonces of the last minute of authenticated requests; only a
    holder of a client's key can add to it."""

    def __init__(self, clients: Iterable[ClientGrant], *, clock: Callable[[], float] = time.time,
                 max_skew: int = MAX_SKEW_SECONDS) -> None:
        self.clients: dict[str, ClientGrant] = {}
        for grant in clients:
            if grant.name in self.clients:
                raise ValueError(f"client {grant.name} is listed twice")
            shared = [g.name for g in self.clients.values() if hmac.compare_digest(g.key, grant.key)]
            if shared:
                raise ValueError(f"clients {shared[0]} and {grant.name} have the same auth key; each client needs "
                                 "its own (a key is the client's identity)")
            self.clients[grant.name] = grant
        if not self.clients:
            raise ValueError("at least one client")
        self._clock = clock
        self._max_skew = max_skew
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def identify(self, msg: Mapping[str, Any]) -> ClientGrant:
        """The grant of the client the request names, whose MAC verifies under that client's key;
        WireError(unauthenticated, reason) otherwise (an unknown client and a bad MAC alike)."""
        name = msg.get("client")
        grant = self.clients.get(name) if isinstance(name, str) else None
        if grant is None:
            raise WireError(WireErrorCode.unauthenticated, "unknown client")
        if not _mac_ok(grant.key, "request", msg):
            raise WireError(WireErrorCode.unauthenticated, "bad mac")
        return grant

    def check(self, msg: Mapping[str, Any]) -> ClientGrant:
        """`identify`, then WireError(unauthenticated) unless fresh and new, then
        WireError(bad_request) for a malformed envelope; the client's grant."""
        grant = self.identify(msg)
        self.check_fresh(msg)
        return grant

    def check_fresh(self, msg: Mapping[str, Any]) -> None:
        """After `identify`: the clock window, the nonce's one use, the envelope's keys and types."""
        ts, nonce = msg.get("ts"), msg.get("nonce")
        if type(ts) is not int:
            raise WireError(WireErrorCode.bad_request, "ts must be an integer (unix seconds)")
        if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
            raise WireError(WireErrorCode.bad_request, "nonce must be 32 lowercase hex digits")
        now = self._clock()
        if abs(now - ts) > self._max_skew:
            raise WireError(WireErrorCode.unauthenticated, f"stale ts: {ts - int(now):+d} s from the signer's clock")
        with self._lock:
            horizon = now - self._max_skew
            if len(self._seen) > 1024:
                self._seen = {n: t for n, t in self._seen.items() if t >= horizon}
            if nonce in self._seen:
                raise WireError(WireErrorCode.unauthenticated, "replayed nonce")
            self._seen[nonce] = ts
        if set(msg) != _REQUEST_KEYS:
            raise WireError(WireErrorCode.bad_request, f"a request has exactly the keys {sorted(_REQUEST_KEYS)}")
        if not isinstance(msg["id"], str) or not 1 <= len(msg["id"]) <= 64:
            raise WireError(WireErrorCode.bad_request, "id must be a string of 1..64 characters")
        if not isinstance(msg["method"], str) or not isinstance(msg["params"], dict):
            raise WireError(WireErrorCode.bad_request, "method must be a string and params an object")


def check_answer(key: bytes, answer: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[str, Any]:
    """The client's check of an answer: (outcome, body) or WireError. An `unauthenticated` error
    whose own MAC fails (the keys differ, so it cannot verify) is still reported as such."""
    outcomes = [k for k in ("result", "refused", "error") if k in answer]
    if not _mac_ok(key, "answer", answer):
        err = answer.get("error")
        if isinstance(err, dict) and err.get("code") == WireErrorCode.unauthenticated.value:
            raise WireError(WireErrorCode.unauthenticated,
                            f"the signer refused the request of client {request.get('client')!r} as unauthenticated "
                            "and its answer does not verify under our key: the signer knows no such client, or "
                            "another key for it")
        raise WireError(WireErrorCode.bad_response, "the answer failed its MAC check")
    if answer.get("id") != request["id"] or answer.get("nonce") != request["nonce"]:
        raise WireError(WireErrorCode.bad_response, "the answer is for another request")
    if len(outcomes) != 1 or set(answer) != {"id", "nonce", "mac", outcomes[0]}:
        raise WireError(WireErrorCode.bad_response, "an answer has exactly one of result, refused, error")
    return outcomes[0], answer[outcomes[0]]


def encode_refused(refused: SigningRefused) -> dict[str, Any]:
    """The body of a `refused` answer: {code, message, withdrawal_id (int or null)}."""
    wid = refused.withdrawal_id
    return {"code": refused.code.value, "message": refused.message, "withdrawal_id": None if wid is None else _enc_int(wid)}


_REFUSAL_CODES = {c.value: c for c in RefusalCode}


def decode_refused(body: Any) -> SigningRefused:
    """The SigningRefused a `refused` body stands for; Malformed for a body that is not an object,
    an unknown code, a message that is not a string, a `withdrawal_id` that is neither an integer
    nor null (absent: null), or any other key."""
    if not isinstance(body, dict) or not set(body) <= {"code", "message", "withdrawal_id"}:
        raise Malformed("a refusal is {code, message, withdrawal_id}")
    code, message, wid = body.get("code"), body.get("message", ""), body.get("withdrawal_id")
    if not isinstance(code, str) or code not in _REFUSAL_CODES:
        raise Malformed(f"unknown refusal code {code!r}: {message}")
    if not isinstance(message, str):
        raise Malformed("a refusal's message is a string")
    return SigningRefused(_REFUSAL_CODES[code], message, None if wid is None else _dec_int(wid, "refused.withdrawal_id"))


# ---- codecs: Python values <-> JSON --------------------------------------------------------------


@dataclass(frozen=True)
class Codec(Generic[T]):
    """`encode` a Python value to JSON; `decode(json, where)` back, raising Malformed."""

    encode: Callable[[T], Any]
    decode: Callable[[Any, str], T]


def _dec_int(v: Any, where: str) -> int:
    if type(v) is not int:  # bool is a subclass of int and float is not: both refused
        raise Malformed(f"{where} must be an integer (minor units; never a float), got {type(v).__name__}")
    return v


def _enc_int(v: int) -> int:
    if type(v) is not int:
        raise TypeError(f"an integer is required (never a float), got {type(v).__name__}")
    return v


def _dec_str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise Malformed(f"{where} must be a string, got {type(v).__name__}")
    return v


def _enc_str(v: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"a string is required, got {type(v).__name__}")
    return v


def _dec_hex(v: Any, where: str) -> bytes:
    s = _dec_str(v, where)
    if not re.fullmatch(r"(?:[0-9a-f]{2})*", s):
        raise Malformed(f"{where} must be lowercase hex of whole bytes")
    return bytes.fromhex(s)


INT: Codec[int] = Codec(_enc_int, _dec_int)
STR: Codec[str] = Codec(_enc_str, _dec_str)
HEX: Codec[bytes] = Codec(lambda b: bytes(b).hex(), _dec_hex)


def optional(codec: Codec[T]) -> Codec[T | None]:
    return Codec(lambda v: None if v is None else codec.encode(v),
                 lambda v, where: None if v is None else codec.decode(v, where))


def list_of(codec: Codec[T]) -> Codec[list[T]]:
    def dec(v: Any, where: str) -> list[T]:
        if not isinstance(v, list):
            raise Malformed(f"{where} must be an array")
        return [codec.decode(x, f"{where}[{i}]") for i, x in enumerate(v)]
    return Codec(lambda vs: [codec.encode(v) for v in vs], dec)


def _decode_object(v: Any, where: str, spec: Mapping[str, Codec[Any]]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise Malformed(f"{where} must be an object")
    if set(v) != set(spec):
        missing, unknown = sorted(set(spec) - set(v)), sorted(set(v) - set(spec))
        raise Malformed(f"{where}: " + "; ".join(filter(None, [missing and f"missing {missing}",
                                                             unknown and f"unknown {unknown}"])))
    return {k: c.decode(v[k], f"{where}.{k}" if where else k) for k, c in spec.items()}


def record(cls: type[T], **spec: Codec[Any]) -> Codec[T]:
    """A frozen dataclass as a JSON object with exactly its fields."""
    assert {f.name for f in fields(cls)} == set(spec), cls  # type: ignore[arg-type]
    return Codec(lambda obj: {k: c.encode(getattr(obj, k)) for k, c in spec.items()},
                 lambda v, where: cls(**_decode_object(v, where, spec)))


def _pair_dec(v: Any, where: str) -> tuple[str, int]:
    if not isinstance(v, list) or len(v) != 2:
        raise Malformed(f"{where} must be [address, amount]")
    return _dec_str(v[0], f"{where}[0]"), _dec_int(v[1], f"{where}[1]")


COIN = record(BtcCoin, txid=STR, vout=INT, amount=INT, change=INT, index=INT)
OUTPUT = record(BatchOutput, withdrawal_id=INT, address=STR, amount=INT, script=HEX)
CHANGE: Codec[tuple[str, int] | None] = optional(Codec(lambda p: [_enc_str(p[0]), _enc_int(p[1])], _pair_dec))
SIGNED_TX = record(SignedTx, raw=HEX, txid=STR, vsize=INT, fee=INT, change_vout=optional(INT), weight=INT)
SIGNED_ETH_TX = record(SignedEthTx, raw=HEX, txid=STR, sender=STR, nonce=INT)
RESERVES_SIGNATURE = record(ReservesSignature, address=STR, signature=STR)


@dataclass(frozen=True)
class SignerInfo:
    """What `ping` answers: public facts to check custody talks to the signer it expects."""

    network: str
    master_fingerprint: str


@dataclass(frozen=True)
class Xpubs:
    """Account-level extended PUBLIC keys per chain and tier (cold included), as `xpubs` answers
    and `python -m signer xpubs` prints; custody's wallet configuration is filled from these."""

    network: str
    master_fingerprint: str
    accounts: dict[str, dict[str, str]]

    def get(self, chain: str, tier: str) -> str:
        return self.accounts[chain][tier]


def _dec_accounts(v: Any, where: str) -> dict[str, dict[str, str]]:
    if not isinstance(v, dict):
        raise Malformed(f"{where} must be an object")
    out: dict[str, dict[str, str]] = {}
    for chain, tiers in v.items():
        if not isinstance(tiers, dict):
            raise Malformed(f"{where}.{chain} must be an object")
        out[chain] = {t: _dec_str(x, f"{where}.{chain}.{t}") for t, x in tiers.items()}
    return out


INFO = record(SignerInfo, network=STR, master_fingerprint=STR)
XPUBS = record(Xpubs, network=STR, master_fingerprint=STR, accounts=Codec(lambda a: a, _dec_accounts))


@dataclass(frozen=True)
class Method:
    """A method's params (name -> codec, in SignerPort's argument names) and its result codec."""

    params: Mapping[str, Codec[Any]]
    result: Codec[Any]

    def encode_params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        if set(values) != set(self.params):
            raise TypeError(f"params {sorted(values)} differ from {sorted(self.params)}")
        return {k: c.encode(values[k]) for k, c in self.params.items()}

    def decode_params(self, params: Any) -> dict[str, Any]:
        return _decode_object(params, "params", self.params)


METHODS: dict[str, Method] = {
    "ping": Method({}, INFO),
    "xpubs": Method({}, XPUBS),
    "sign_bitcoin_batch": Method({"batch_id": INT, "coins": list_of(COIN), "outputs": list_of(OUTPUT), "change": CHANGE},
                                 SIGNED_TX),
    "sign_bitcoin_replacement": Method({"batch_id": INT, "replaces_txid": STR, "coins": list_of(COIN),
                                        "outputs": list_of(OUTPUT), "change": CHANGE}, SIGNED_TX),
    "sign_bitcoin_sweep": Method({"sweep_id": INT, "coins": list_of(COIN), "destination": STR, "fee": INT}, SIGNED_TX),
    "sign_bitcoin_rebalance": Method({"rebalance_id": INT, "coins": list_of(COIN), "destination": STR, "amount": INT,
                                      "change": CHANGE, "replaces_txid": optional(STR)}, SIGNED_TX),
    "sign_bitcoin_cpfp": Method({"rebalance_id": INT, "parent_raw": HEX, "parent_vout": INT, "destination": STR, "fee": INT,
                                 "replaces_txid": optional(STR)}, SIGNED_TX),
    "sign_reserves_message": Method({"chain": STR, "tier": STR, "change": INT, "index": INT, "message": STR},
                                    RESERVES_SIGNATURE),
    "sign_ethereum_payment": Method({"batch_id": INT, "output": OUTPUT, "hot_index": INT, "chain_id": INT, "nonce": INT,
                                     "to": STR, "value": INT, "data": HEX, "gas": INT, "max_fee_wei": INT,
                                     "priority_fee_wei": INT, "replaces_txid": optional(STR)}, SIGNED_ETH_TX),
    "sign_ethereum_gas_funding": Method({"sweep_id": INT, "deposit_index": INT, "chain_id": INT, "nonce": INT, "value": INT,
                                         "gas": INT, "max_fee_wei": INT, "priority_fee_wei": INT,
                                         "replaces_txid": optional(STR)}, SIGNED_ETH_TX),
    "sign_ethereum_sweep": Method({"sweep_id": INT, "deposit_index": INT, "asset": STR, "amount": INT, "chain_id": INT,
                                   "nonce": INT, "gas": INT, "max_fee_wei": INT, "priority_fee_wei": INT,
                                   "replaces_txid": optional(STR)}, SIGNED_ETH_TX),
    "sign_ethereum_rebalance": Method({"rebalance_id": INT, "asset": STR, "amount": INT, "destination_tier": STR,
                                       "chain_id": INT, "nonce": INT, "gas": INT, "max_fee_wei": INT, "priority_fee_wei": INT,
                                       "replaces_txid": optional(STR)}, SIGNED_ETH_TX),
}
SIGNING_METHODS = frozenset(METHODS) - {"ping", "xpubs"}
