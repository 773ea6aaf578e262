"""chain_adapters.rpc.JsonRpcClient authentication against a local HTTP server that checks Basic
auth the way bitcoind does (401 on a wrong or missing credential): credentials in the URL (the
existing callers), user + password, and a cookie file read at connect time and read again after
the node rewrote it (a bitcoind restart), without building a new client."""
from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.errors import NodeUnavailable
from chain_adapters.rpc import JsonRpcClient


class FakeNode:
    """Answers `getblockcount` with 7 to requests carrying `self.credential`, 401 otherwise."""

    def __init__(self) -> None:
        self.credential = "custody:regtest"
        self.seen: list[str | None] = []
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization")
                node.seen.append(auth)
                expected = "Basic " + base64.b64encode(node.credential.encode()).decode()
                if auth != expected:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                reply = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": 7, "error": None}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def node() -> Iterator[FakeNode]:
    n = FakeNode()
    yield n
    n.server.shutdown()
    n.server.server_close()


def test_credentials_in_the_url_still_work(node):
    assert JsonRpcClient(node.url.replace("http://", "http://custody:regtest@")).call("getblockcount") == 7
    with pytest.raises(NodeUnavailable, match="HTTP 401"):
        JsonRpcClient(node.url.replace("http://", "http://custody:wrong@")).call("getblockcount")


def test_user_and_password(node):
    adapter = BitcoinAdapter(node.url, network="regtest", rpc_user="custody", rpc_password="regtest")
    assert adapter.rpc.call("getblockcount") == 7
    with pytest.raises(ValueError, match="go together"):
        BitcoinAdapter(node.url, network="regtest", rpc_user="custody")


def test_the_cookie_is_read_at_connect_time_and_again_after_a_restart(node, tmp_path: Path):
    cookie = tmp_path / ".cookie"
    adapter = BitcoinAdapter(node.url, network="regtest", cookie_file=cookie)  # the node has not written it yet
    with pytest.raises(NodeUnavailable, match="cannot read the RPC cookie"):
        adapter.rpc.call("getblockcount")
    node.credential = "__cookie__:first"
    cookie.write_text("__cookie__:first")
    assert adapter.rpc.call("getblockcount") == 7

    # bitcoind restarts: a new cookie; the kept-alive client gets a 401, re-reads and succeeds
    node.credential = "__cookie__:second"
    cookie.write_text("__cookie__:second\n")
    before = len(node.seen)
    assert adapter.rpc.call("getblockcount") == 7
    assert node.seen[before:] == ["Basic " + base64.b64encode(b"__cookie__:first").decode(),
                                  "Basic " + base64.b64encode(b"__cookie__:second").decode()]

    # a cookie that no longer matches anything is a 401 after one re-read, not a loop
    node.credential = "__cookie__:third"
    with pytest.raises(NodeUnavailable, match="HTTP 401"):
        adapter.rpc.call("getblockcount")


def test_one_scheme_only(node, tmp_path: Path):
    with pytest.raises(ValueError, match="one RPC authentication"):
        JsonRpcClient(node.url.replace("http://", "http://u:p@"), cookie_file=tmp_path / ".cookie")
    with pytest.raises(ValueError, match="one RPC authentication"):
        BitcoinAdapter(node.url, network="regtest", cookie_file=tmp_path / ".cookie", rpc_user="u", rpc_password="p")
