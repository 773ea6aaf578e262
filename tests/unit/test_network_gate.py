"""custody.roots.guards.NetworkGate: no call of a gated adapter is answered by a node whose chain
was not verified. A real BitcoinAdapter against a local JSON-RPC stand-in that can be restarted on
the same port as another chain (its keep-alive connections cut, as a node restart cuts them):

- a node down at the first call is verified when it comes up, before the call is made;
- a node restarted between two calls as another chain is caught by the call that reconnected: its
  answer is not returned, the gate closes (WrongNetwork, reported once), later calls never reach it;
- a node that failed a call is verified again before the next one; a verified node is verified
  again after RECHECK seconds; the gate is an instance of the adapter's class.

And guards.SignerGated / WalletCheck with stand-ins: a service behind the wallet check is not
called until the signer has answered with the configured xpubs.
"""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.errors import ErrorCode, NodeUnavailable, WrongNetwork
from custody.roots.guards import NetworkGate, SignerGated, WalletCheck
from regtest.util import assert_raises_code


class ChainNode:
    """bitcoind's getblockchaininfo / getblockcount on `chain`, over HTTP/1.1 keep-alive; records
    the methods asked. `restart(chain)` stops it, cuts its open connections and starts it again
    on the same port."""

    def __init__(self, chain: str = "regtest", port: int = 0) -> None:
        self.chain, self.asked, self._sockets = chain, [], []
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                node._sockets.append(self.request)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                node.asked.append(req["method"])
                result = {"getblockchaininfo": {"chain": node.chain, "blocks": 7, "bestblockhash": "ab" * 32},
                          "getblockcount": 7}[req["method"]]
                data = json.dumps({"result": result, "error": None, "id": req["id"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._handler = Handler
        self.port = port
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> "ChainNode":
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for sock in self._sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._sockets.clear()

    def restart(self, chain: str) -> None:
        self.stop()
        self.chain = chain
        self.start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adapter(port: int) -> BitcoinAdapter:
    return BitcoinAdapter(f"http://127.0.0.1:{port}", network="regtest", rpc_user="u", rpc_password="p", timeout=5)


@pytest.fixture
def node():
    n = ChainNode().start()
    yield n
    n.stop()


def test_a_node_down_at_the_first_call_is_verified_when_it_comes_up():
    port = free_port()
    gate = NetworkGate(adapter(port))
    with pytest.raises(NodeUnavailable):
        gate.tip()
    n = ChainNode("regtest", port).start()
    try:
        assert gate.tip().height == 7
        assert n.asked == ["getblockchaininfo", "getblockchaininfo"]  # verified, then the call
        assert gate.tip().height == 7
        assert n.asked[2:] == ["getblockchaininfo"]  # verified once: the next call goes straight through
    finally:
        n.stop()


def test_a_node_restarted_as_another_chain_between_two_calls_is_refused(node: ChainNode):
    reported = []
    gate = NetworkGate(adapter(node.port), on_wrong_network=lambda chain, exc: reported.append((chain, exc.detail)))
    assert gate.tip().height == 7
    node.restart("test")  # same port, keep-alive connections cut: the client reconnects within the next call
    assert_raises_code(ErrorCode.WRONG_NETWORK, gate.tip)
    assert reported == [("bitcoin", "node is on 'test', adapter configured for 'regtest'")]
    asked = len(node.asked)
    with pytest.raises(WrongNetwork):
        gate.tip()
    with pytest.raises(WrongNetwork):
        gate.verify()
    assert len(node.asked) == asked, "a closed gate still reached the node"
    assert reported == [("bitcoin", "node is on 'test', adapter configured for 'regtest'")]  # reported once


def test_the_answer_of_a_call_that_reached_another_chain_is_not_returned(node: ChainNode):
    gate = NetworkGate(adapter(node.port))
    assert gate.tip().height == 7
    node.restart("test")
    with pytest.raises(WrongNetwork):
        gate.tip()  # the node answered the tip; the gate verified the new connection and refused the answer
    assert node.asked[-2:] == ["getblockchaininfo", "getblockchaininfo"]


class FakeAdapter:
    """A stand-in adapter: verify_network and tip as a node at `chain` answers them (or is down)."""

    chain, network = "bitcoin", "regtest"

    def __init__(self) -> None:
        self.on, self.up, self.calls = "regtest", True, []

    def verify_network(self) -> None:
        self.calls.append("verify")
        if not self.up:
            raise NodeUnavailable("down")
        if self.on != self.network:
            raise WrongNetwork(f"node is on {self.on!r}")

    def tip(self) -> int:
        self.calls.append("tip")
        if not self.up:
            raise NodeUnavailable("down")
        return 7


def test_a_failed_call_and_time_each_make_the_gate_verify_again():
    now = [0.0]
    fake = FakeAdapter()
    gate = NetworkGate(fake, recheck_seconds=60, clock=lambda: now[0])
    assert isinstance(gate, FakeAdapter) and gate.network == "regtest"
    assert gate.tip() == 7 and gate.tip() == 7
    assert fake.calls == ["verify", "tip", "tip"]
    fake.up = False
    with pytest.raises(NodeUnavailable):
        gate.tip()
    fake.up, fake.on, fake.calls = True, "test", []
    with pytest.raises(WrongNetwork):
        gate.tip()  # it failed a call: verified again before this one, and it came back on another chain
    assert fake.calls == ["verify"]

    fake2 = FakeAdapter()
    gate2 = NetworkGate(fake2, recheck_seconds=60, clock=lambda: now[0])
    assert gate2.tip() == 7
    now[0] = 59.0
    assert gate2.tip() == 7
    fake2.on = "main"
    now[0] = 61.0
    with pytest.raises(WrongNetwork):
        gate2.tip()
    assert fake2.calls == ["verify", "tip", "tip", "verify"]


class Xpubs:
    def __init__(self, accounts: dict) -> None:
        self.network, self.accounts = "regtest", accounts


class Signer:
    """xpubs() as a signer holding `accounts` answers it, or SignerUnavailable-like when down."""

    def __init__(self, accounts: dict | None) -> None:
        self.accounts = accounts

    def xpubs(self) -> Xpubs:
        if self.accounts is None:
            raise NodeUnavailable("signer at unix:/x.sock: No such file or directory")
        return Xpubs(self.accounts)


class Recorder:
    def __init__(self) -> None:
        self.ran = 0
        self.name = "payouts"

    def run_once(self) -> str:
        self.ran += 1
        return "ran"


def test_a_service_behind_the_wallet_check_runs_only_after_the_signer_holds_the_wallets():
    from types import SimpleNamespace

    ethereum = "xpub-of-the-ethereum-deposit-account"  # ethereum keys compare as text
    config = SimpleNamespace(wallets={"ethereum": SimpleNamespace(deposit=ethereum, hot=ethereum + "x")}, bitcoin=None,
                             signer=SimpleNamespace(endpoint="unix:/x.sock"))
    signer, passed, mismatches = Signer(None), [], []
    check = WalletCheck(config, signer, on_pass=lambda: passed.append(1), on_mismatch=mismatches.append, retry_seconds=0)  # type: ignore[arg-type]
    assert check.at_start() == "pending"
    service = Recorder()
    gated = SignerGated(service, check)
    assert gated.name == "payouts"
    assert gated.run_once() is None and service.ran == 0  # the signer is down: nothing runs
    signer.accounts = {"ethereum": {"deposit": ethereum, "hot": ethereum + "x"}}
    assert gated.run_once() == "ran" and service.ran == 1 and passed == [1] and check.passed
    signer.accounts = None  # once passed, never asked again
    assert gated.run_once() == "ran"

    other = WalletCheck(config, Signer(None), on_mismatch=mismatches.append, retry_seconds=0)  # type: ignore[arg-type]
    other.signer.accounts = {"ethereum": {"deposit": ethereum + "x", "hot": ethereum}}  # type: ignore[attr-defined]
    gated_other = SignerGated(Recorder(), other)
    assert gated_other.run_once() is None and other.state == "failed"
    assert mismatches == [["wallets.ethereum.deposit", "wallets.ethereum.hot"]]
    other.signer.accounts = {"ethereum": {"deposit": ethereum, "hot": ethereum + "x"}}  # type: ignore[attr-defined]
    assert gated_other.run_once() is None, "a failed check stays failed for the life of the process"
