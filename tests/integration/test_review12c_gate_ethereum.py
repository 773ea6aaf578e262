"""Review of issue 12, third round (R4): the ethereum NetworkGate does not see a node restarted as
another chain for up to a minute.

custody.roots.guards promises that no adapter call reaches a node whose chain was not verified:
on first contact, after a call found the node unavailable, "after the RPC client opened a new
connection", and every RECHECK_SECONDS (60). The new-connection check exists for bitcoin only
(`JsonRpcClient.connection_serial`); the EthereumAdapter talks through web3's HTTPProvider, whose
pooled session reconnects silently when a node restart cut its keep-alive connection. A node
restarted between two job ticks on another chain (an anvil/geth restarted with another chain id or
genesis at the same URL; a load balancer sending the URL to another backend) answers every call
until the minute is up: the deposits job (every 2 s) scans its blocks (a different chain at the
cursor's height looks like a deep reorg of credited deposits), payouts read its nonces, fees and
receipts, broadcast sends our signed transactions to it.

Played with the real EthereumAdapter behind a NetworkGate against a JSON-RPC stand-in restarted on
the same port with chain id 1 instead of 31337: the next call must be refused (WrongNetwork), as
tests/unit/test_network_gate.py shows for bitcoin.

Fix: give the ethereum adapter the same connection serial (a requests transport adapter / session
hook counting new connections) or verify `eth_chainId` in the same HTTP batch as each call (web3
batch requests), or before each job run rather than each minute.
"""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chain_adapters.errors import WrongNetwork
from chain_adapters.ethereum import EthereumAdapter
from custody.roots.guards import NetworkGate

ADDRESS = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"


class EthNode:
    """eth_chainId and eth_getTransactionCount on `chain_id`, over HTTP/1.1 keep-alive; records the
    methods asked. `restart(chain_id)` stops it, cuts its open connections and starts it again on
    the same port."""

    def __init__(self, chain_id: int = 31337) -> None:
        self.chain_id, self.asked, self._sockets, self.port = chain_id, [], [], 0
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                node._sockets.append(self.request)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                node.asked.append(req["method"])
                result = {"eth_chainId": hex(node.chain_id), "eth_getTransactionCount": hex(node.chain_id % 1000)}[req["method"]]
                data = json.dumps({"jsonrpc": "2.0", "result": result, "id": req["id"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._handler = Handler
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> "EthNode":
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

    def restart(self, chain_id: int) -> None:
        self.stop()
        self.chain_id = chain_id
        self.start()


@pytest.fixture
def node():
    n = EthNode().start()
    yield n
    n.stop()


def test_an_ethereum_node_restarted_as_another_chain_is_refused_at_the_next_call(node: EthNode):
    reported = []
    gate = NetworkGate(EthereumAdapter(f"http://127.0.0.1:{node.port}", network="regtest", timeout=5),
                       on_wrong_network=lambda chain, exc: reported.append(chain))
    assert gate.nonce(ADDRESS) == 337  # verified (chain id 31337), then answered
    assert node.asked == ["eth_chainId", "eth_getTransactionCount"]
    node.restart(1)  # mainnet's chain id at the same URL, keep-alive connections cut
    try:
        answer = gate.nonce(ADDRESS)
    except WrongNetwork:
        answer = None
    assert answer is None, (f"the gate returned {answer}, the answer of a node on chain id 1, without verifying it "
                            f"(asked since the restart: {node.asked[2:]})")
    assert reported == ["ethereum"]
