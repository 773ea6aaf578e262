"""`python -m signer serve`: the signer process's socket server, the only process holding the seed.

- `SignerService.handle(line) -> line`: one request in, one answer out (signer.wire has the
  protocol, the order of the checks, the method and error tables). It authenticates the envelope
  under the key of the client it names (`unauthenticated`, logged with the reason and never the
  key), refuses a method that client's grant does not list (`method_not_allowed`, logged as a
  warning with the client, method and peer, before the params are decoded or the database is
  read), then decodes the params strictly, then calls the `Signer` (signer.service), which
  re-reads everything it checks from the database itself. No sockets here: unit tests drive it
  directly.
- `make_server(endpoint, service)`: a threading socket server, one thread per connection, one
  request per connection. A unix socket is created mode 0600 (umask 177 while binding); an
  existing path is removed only if it is a socket nobody answers on. TCP binds loopback only
  (signer.wire.parse_endpoint refuses anything else).
- `serve(cfg)`: load the seed and build the Signer (signer.config), bind, serve until SIGTERM or
  SIGINT, then finish the requests in flight, close and remove the socket file.

One log line per request: `request id=… client=… method=… outcome=… ms=…`, the outcome being `ok`,
`refused:<code>`, `error:<code>` or `unauthenticated:<reason>` (client `-` until it authenticated). Params, answers and keys are never
logged; an `internal` error's traceback is logged here and never sent.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import socketserver
import stat
import struct
import threading
import time
from typing import Any, Callable, Iterable

from sqlalchemy.exc import InterfaceError, OperationalError

from signer.errors import SignerError
from signer.protocol import SignerPort, SigningRefused
from signer.wire import (MAX_LINE, METHODS, SIGNING_METHODS, ClientGrant, Endpoint, Malformed, RequestAuthenticator,
                         SignerInfo, WireError, WireErrorCode, Xpubs, encode_line, encode_refused, new_answer, parse_line)

log = logging.getLogger("signer.server")
READ_TIMEOUT_SECONDS = 10  # a connection must send its request line within this
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's lock_not_available: signer.service's lock_timeout passed (answered `unavailable`)


class SignerService:
    """Answers request lines for a `SignerPort` (the in-process `Signer`) and the public key info,
    to the `clients` it knows (signer.wire.ClientGrant: ValueError for none, a name twice or two
    clients with one key)."""

    def __init__(self, port: SignerPort, *, xpubs: Xpubs, clients: Iterable[ClientGrant],
                 clock: Callable[[], float] = time.time) -> None:
        self._port = port
        self._xpubs = xpubs
        self._info = SignerInfo(xpubs.network, xpubs.master_fingerprint)
        self._auth = RequestAuthenticator(clients, clock=clock)
        self._nobody = os.urandom(32)  # MACs the answers to requests that did not authenticate: verifiable by nobody

    @property
    def clients(self) -> dict[str, ClientGrant]:
        return dict(self._auth.clients)

    def handle(self, line: bytes, peer: str = "-") -> bytes:
        started = time.monotonic()
        msg: dict[str, Any] = {}
        grant: ClientGrant | None = None
        try:
            msg = parse_line(line)
            grant = self._auth.identify(msg)
            self._auth.check_fresh(msg)
            outcome, body, label = "result", self._dispatch(grant, msg["method"], msg["params"], peer), "ok"
        except WireError as exc:
            if exc.code is WireErrorCode.unauthenticated:
                log.warning("unauthenticated request from %s: %s", peer, exc.message)
                label = f"unauthenticated:{exc.message.split(':')[0]}"
                outcome, body = "error", {"code": exc.code.value, "message": "unauthenticated"}
            else:
                outcome, body, label = "error", {"code": exc.code.value, "message": exc.message}, f"error:{exc.code.value}"
        except Malformed as exc:
            outcome, body, label = "error", {"code": WireErrorCode.bad_request.value, "message": str(exc)}, "error:bad_request"
        except SigningRefused as refused:
            outcome, body = "refused", encode_refused(refused)
            label = f"refused:{refused.code.value}"
        except SignerError as exc:
            outcome, body = "error", {"code": exc.code.value, "message": exc.detail or exc.code.meaning}
            label = f"error:{exc.code.value}"
        except (OperationalError, InterfaceError) as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                why = "a lock the signer needs was held by another session past its lock_timeout; retry"
            else:
                why = "the signer cannot reach its database"
            log.warning("%s: %s", why, type(exc.orig or exc).__name__)
            outcome, body, label = "error", {"code": WireErrorCode.unavailable.value, "message": why}, "error:unavailable"
        except Exception:  # noqa: BLE001 - answered as `internal`; the traceback stays in this log
            log.exception("request id=%s method=%s failed", _printable(msg.get("id")), _printable(msg.get("method")))
            outcome, body, label = "error", {"code": WireErrorCode.internal.value, "message": "internal error; see the signer's log"}, "error:internal"
        log.info("request id=%s client=%s method=%s outcome=%s ms=%.1f", _printable(msg.get("id")),
                 grant.name if grant else "-", _printable(msg.get("method")), label, (time.monotonic() - started) * 1000)
        request_id = msg.get("id") if isinstance(msg.get("id"), str) else None
        nonce = msg.get("nonce") if isinstance(msg.get("nonce"), str) else None
        return encode_line(new_answer(grant.key if grant else self._nobody, request_id, nonce, outcome, body))

    def refuse(self, code: WireErrorCode, message: str) -> bytes:
        """An error answer to a request that could not even be read (no id, no nonce, no client)."""
        log.info("request id=- client=- method=- outcome=error:%s ms=0", code.value)
        return encode_line(new_answer(self._nobody, None, None, "error", {"code": code.value, "message": message}))

    def _dispatch(self, grant: ClientGrant, method: str, params: Any, peer: str) -> Any:
        spec = METHODS.get(method)
        if spec is None:
            raise WireError(WireErrorCode.unknown_method, f"{method[:64]!r} is not a signer method")
        if method not in grant.methods:
            log.warning("method_not_allowed: client %s (from %s) asked for %s, which its grant does not list",
                        grant.name, peer, method)
            raise WireError(WireErrorCode.method_not_allowed, f"client {grant.name} may not call {method}")
        kwargs = spec.decode_params(params)
        if method == "ping":
            return spec.result.encode(self._info)
        if method == "xpubs":
            return spec.result.encode(self._xpubs)
        assert method in SIGNING_METHODS
        return spec.result.encode(getattr(self._port, method)(**kwargs))


def _printable(v: Any) -> str:
    return v[:64] if isinstance(v, str) and v.isprintable() else "-"


class _Handler(socketserver.StreamRequestHandler):
    timeout = READ_TIMEOUT_SECONDS
    server: "_Server"

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_LINE + 1)
        except (TimeoutError, OSError):
            return
        if not line:
            return
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            answer = self.server.service.refuse(WireErrorCode.bad_request, "request line too long or unterminated")
        else:
            answer = self.server.service.handle(line, peer=_peer(self.connection, self.client_address))
        try:
            self.wfile.write(answer)
        except OSError:
            log.warning("the client went away before its answer was written")


def _peer(sock: socket.socket, address: Any) -> str:
    """Who is calling, for the log: host:port, or the unix peer's pid and uid (SO_PEERCRED, Linux)."""
    if address:
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return f"unix pid={pid} uid={uid}"
    except (AttributeError, OSError):
        return "unix"


class _Server(socketserver.ThreadingMixIn):
    daemon_threads = False
    request_queue_size = 128  # the listen backlog; a full unix backlog refuses connects with EAGAIN
    block_on_close = True  # server_close() waits for the requests in flight
    service: SignerService
    endpoint: Endpoint


class UnixSignerServer(_Server, socketserver.UnixStreamServer):
    def __init__(self, endpoint: Endpoint, service: SignerService) -> None:
        self.endpoint, self.service = endpoint, service
        super().__init__(endpoint.path, _Handler)

    def server_bind(self) -> None:
        path = self.endpoint.path
        _clear_stale_socket(path)
        old = os.umask(0o177)
        try:
            super().server_bind()
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._inode = os.stat(path).st_ino

    def remove_socket(self) -> None:
        """Unlink the socket file if it is still ours (not a successor's)."""
        try:
            if os.stat(self.endpoint.path).st_ino == self._inode:
                os.unlink(self.endpoint.path)
        except FileNotFoundError:
            pass


class TcpSignerServer(_Server, socketserver.TCPServer):
    allow_reuse_address = True

    def __init__(self, endpoint: Endpoint, service: SignerService) -> None:
        self.endpoint, self.service = endpoint, service
        self.address_family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
        super().__init__((endpoint.host, endpoint.port), _Handler)

    def remove_socket(self) -> None:
        pass


class ServeError(Exception):
    """The server cannot start (another signer on the socket path, a path that is not a socket)."""


def _clear_stale_socket(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServeError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # a socket left by a signer that died: nobody listens on it
        return
    finally:
        probe.close()
    raise ServeError(f"another process is listening on {path}")


def make_server(endpoint: Endpoint, service: SignerService) -> UnixSignerServer | TcpSignerServer:
    """A bound, listening server for `endpoint` (not yet serving)."""
    return (UnixSignerServer if endpoint.kind == "unix" else TcpSignerServer)(endpoint, service)


def serve(cfg: Any) -> int:
    """Run the signer until SIGTERM/SIGINT; `cfg` is a signer.config.SignerConfig. Exit status."""
    from sqlalchemy import text

    from signer.config import build_signer, load_keys

    grants = cfg.client_grants()  # a bad key file fails before the seed is loaded
    keys = load_keys(cfg)
    signer = build_signer(cfg, keys=keys)
    service = SignerService(signer, xpubs=xpubs_of(keys, cfg.network), clients=grants)
    try:
        with signer.engine.connect() as c:
            c.execute(text("SELECT 1"))
    except (OperationalError, InterfaceError) as exc:
        log.warning("the database is not reachable yet (%s); signing calls answer `unavailable` until it is",
                    type(exc.orig or exc).__name__)
    server = make_server(cfg.endpoint, service)
    stopping = threading.Event()

    def warm_up() -> None:  # beside serving: a call that comes first derives what it needs itself
        try:
            log.info("own-address windows derived in %.1f s (the first signing call no longer pays for them)",
                     signer.warm_up())
        except Exception:  # noqa: BLE001 - only an optimisation; the checks derive on demand
            log.exception("warming the own-address windows failed; they are derived on the first signing call")

    threading.Thread(target=warm_up, name="signer-warm-up", daemon=True).start()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("signal %s: stopping after the requests in flight", signal.Signals(signum).name)
            threading.Thread(target=server.shutdown, name="signer-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("signer listening on %s (network=%s, master fingerprint %s); clients: %s", cfg.endpoint, cfg.network,
             keys.master_fingerprint, "; ".join(f"{g.name} ({', '.join(sorted(g.methods))})" for g in service.clients.values()))
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        server.remove_socket()
        signer.engine.dispose()
        log.info("signer stopped")
    return 0


def xpubs_of(keys: Any, network: str) -> Xpubs:
    """Every account xpub of `keys` (a SignerKeys), cold included: public keys only."""
    from signer.keys import Chain, Tier

    return Xpubs(network, keys.master_fingerprint,
                 {c.value: {t.value: keys.account_xpub(c.value, t.value) for t in Tier} for c in Chain})
