"""The signer's socket protocol (signer.wire, signer.server, signer.client) without a database.

The envelope: a named client, a MAC over the canonical JSON under that client's own key, a
30-second clock window, one use per nonce, MACed answers the client checks. Least privilege: a
client may call only the methods its grant lists (`method_not_allowed`, nothing reaches the
Signer); an unknown client or another client's key is `unauthenticated`. The values: integers only (a float or a bool amount is `bad_request`),
exact keys, hex bytes. The mapping: a refusal, a SignerError, a database outage and anything else
each come back as their own exception. The client and a server with a fake Signer run over a real
unix socket in this process; tests/integration/test_signer_process.py runs the real process.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

import signer.wire as wire
from chain_adapters.errors import NodeUnavailable
from regtest.util import assert_equal, assert_raises_code
from signer.bitcoin_tx import SignedTx
from signer.client import SignerClient
from signer.errors import SignerError, SignerErrorCode
from signer.ethereum_tx import SignedEthTx
from signer.protocol import BatchOutput, BtcCoin, RefusalCode, ReservesSignature, SignerPort, SigningRefused
from signer.server import SignerService, make_server
from signer.wire import (METHODS, SIGNING_METHODS, ClientGrant, RequestAuthenticator, SignerUnavailable,
                         WireErrorCode, Xpubs, check_answer, encode_line, new_answer, new_request, parse_endpoint,
                         parse_line, read_auth_key)

KEY = bytes(range(32))  # the worker's
OTHER_KEY = bytes(range(1, 33))  # nobody's
API_KEY = bytes(range(2, 34))  # the api's
API_METHODS = frozenset({"ping", "xpubs", "sign_reserves_message"})
CLIENTS = (ClientGrant("worker", KEY, frozenset(METHODS)), ClientGrant("api", API_KEY, API_METHODS))
NOW = 1_800_000_000
XPUBS = Xpubs("regtest", "73c5da0a", {"bitcoin": {"hot": "vpub-hot", "cold": "vpub-cold"}, "ethereum": {"hot": "xpub-eth"}})
TX = SignedTx(raw=b"\x02\x00\x01", txid="ab" * 32, vsize=141, fee=1410, change_vout=1, weight=561)
ETH_TX = SignedEthTx(raw=b"\x02\xf8", txid="0x" + "cd" * 32, sender="0x" + "11" * 20, nonce=7)
RESERVES_SIG = ReservesSignature(address="bcrt1qhot", signature="smpAkcw")
COINS = [BtcCoin("aa" * 32, 0, 150_000, 0, 3), BtcCoin("bb" * 32, 2, 2_100_000_000_000_000, 1, 2**31 - 1)]
OUTPUTS = [BatchOutput(41, "bcrt1qexample", 100_000, bytes.fromhex("0014" + "22" * 20))]


class FakeSigner:
    """A SignerPort that records each call and answers canned values, or raises `self.raises`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.raises: BaseException | None = None

    def _record(self, name: str, result, **kwargs):
        self.calls.append((name, kwargs))
        if self.raises is not None:
            raise self.raises
        return result

    def sign_bitcoin_batch(self, batch_id, coins, outputs, change):
        return self._record("sign_bitcoin_batch", TX, batch_id=batch_id, coins=coins, outputs=outputs, change=change)

    def sign_bitcoin_replacement(self, batch_id, replaces_txid, coins, outputs, change):
        return self._record("sign_bitcoin_replacement", TX, batch_id=batch_id, replaces_txid=replaces_txid, coins=coins,
                            outputs=outputs, change=change)

    def sign_bitcoin_sweep(self, sweep_id, coins, destination, fee):
        return self._record("sign_bitcoin_sweep", TX, sweep_id=sweep_id, coins=coins, destination=destination, fee=fee)

    def sign_bitcoin_rebalance(self, rebalance_id, coins, destination, amount, change, replaces_txid=None):
        return self._record("sign_bitcoin_rebalance", TX, rebalance_id=rebalance_id, coins=coins,
                            destination=destination, amount=amount, change=change, replaces_txid=replaces_txid)

    def sign_bitcoin_cpfp(self, rebalance_id, parent_raw, parent_vout, destination, fee, replaces_txid=None):
        return self._record("sign_bitcoin_cpfp", TX, rebalance_id=rebalance_id, parent_raw=parent_raw,
                            parent_vout=parent_vout, destination=destination, fee=fee, replaces_txid=replaces_txid)

    def sign_reserves_message(self, chain, tier, change, index, message):
        return self._record("sign_reserves_message", RESERVES_SIG, chain=chain, tier=tier, change=change, index=index,
                            message=message)

    def sign_ethereum_payment(self, batch_id, output, *, hot_index, chain_id, nonce, to, value, data, gas, max_fee_wei,
                              priority_fee_wei, replaces_txid=None):
        return self._record("sign_ethereum_payment", ETH_TX, batch_id=batch_id, output=output, hot_index=hot_index,
                            chain_id=chain_id, nonce=nonce, to=to, value=value, data=data, gas=gas,
                            max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid)

    def sign_ethereum_gas_funding(self, sweep_id, *, deposit_index, chain_id, nonce, value, gas, max_fee_wei, priority_fee_wei,
                                  replaces_txid=None):
        return self._record("sign_ethereum_gas_funding", ETH_TX, sweep_id=sweep_id, deposit_index=deposit_index,
                            chain_id=chain_id, nonce=nonce, value=value, gas=gas, max_fee_wei=max_fee_wei,
                            priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid)

    def sign_ethereum_rebalance(self, rebalance_id, *, asset, amount, destination_tier, chain_id, nonce, gas, max_fee_wei,
                                priority_fee_wei, replaces_txid=None):
        return self._record("sign_ethereum_rebalance", ETH_TX, rebalance_id=rebalance_id, asset=asset, amount=amount,
                            destination_tier=destination_tier, chain_id=chain_id, nonce=nonce, gas=gas,
                            max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid)

    def sign_ethereum_sweep(self, sweep_id, *, deposit_index, asset, amount, chain_id, nonce, gas, max_fee_wei,
                            priority_fee_wei, replaces_txid=None):
        return self._record("sign_ethereum_sweep", ETH_TX, sweep_id=sweep_id, deposit_index=deposit_index, asset=asset,
                            amount=amount, chain_id=chain_id, nonce=nonce, gas=gas, max_fee_wei=max_fee_wei,
                            priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid)


def service(fake: FakeSigner, now: float = NOW) -> SignerService:
    return SignerService(fake, xpubs=XPUBS, clients=CLIENTS, clock=lambda: now)


def ask(svc: SignerService, request: dict, key: bytes = KEY) -> dict:
    """Send one raw request line; the answer, after checking its MAC as the client does."""
    answer = parse_line(svc.handle(encode_line(request)))
    check_answer(key, answer, request)
    return answer


def refused_unauthenticated(svc: SignerService, request: dict) -> dict:
    """Send a request that must not authenticate: its answer is `unauthenticated` and verifies
    under no client's key (so it is no MAC oracle for a prober)."""
    answer = parse_line(svc.handle(encode_line(request)))
    assert_equal(answer["error"]["code"], "unauthenticated")
    for key in (KEY, API_KEY, OTHER_KEY):
        assert_raises_code(WireErrorCode.unauthenticated, check_answer, key, answer, request)
    return answer


BATCH_PARAMS = {"batch_id": 9, "coins": [{"txid": "aa" * 32, "vout": 0, "amount": 150_000, "change": 0, "index": 3}],
                "outputs": [{"withdrawal_id": 41, "address": "bcrt1qexample", "amount": 100_000, "script": ""}],
                "change": None}


# ---- the envelope --------------------------------------------------------------------------------


def test_a_request_with_a_good_mac_is_answered_with_a_maced_result():
    fake = FakeSigner()
    answer = ask(service(fake), new_request(KEY, "sign_bitcoin_batch", BATCH_PARAMS, now=NOW))
    assert_equal(answer["result"]["txid"], TX.txid)
    assert_equal(fake.calls[0][1]["outputs"], [BatchOutput(41, "bcrt1qexample", 100_000, b"")])


def test_a_changed_field_or_another_key_is_unauthenticated_and_nothing_is_signed():
    fake = FakeSigner()
    svc = service(fake)
    tampered = new_request(KEY, "sign_bitcoin_batch", BATCH_PARAMS, now=NOW)
    tampered["params"] = {**BATCH_PARAMS, "outputs": [{**BATCH_PARAMS["outputs"][0], "amount": 900_000}]}
    for request in (tampered, new_request(OTHER_KEY, "sign_bitcoin_batch", BATCH_PARAMS, now=NOW),
                    {k: v for k, v in new_request(KEY, "ping", {}, now=NOW).items() if k != "mac"}):
        refused_unauthenticated(service(fake), request)
    assert_equal(svc.handle(b"not json\n").count(b"bad_request"), 1)
    assert_equal(fake.calls, [])


@pytest.mark.parametrize("skew, accepted", [(-31, False), (-30, True), (0, True), (30, True), (31, False)])
def test_a_ts_more_than_30_seconds_from_the_signer_clock_is_unauthenticated(skew, accepted):
    answer = ask(service(FakeSigner()), new_request(KEY, "ping", {}, now=NOW + skew))
    assert_equal("result" in answer, accepted)
    if not accepted:
        assert_equal(answer["error"]["code"], "unauthenticated")


def test_a_replayed_request_is_unauthenticated_and_signed_once():
    fake = FakeSigner()
    svc = service(fake)
    request = new_request(KEY, "sign_bitcoin_batch", BATCH_PARAMS, now=NOW)
    assert "result" in ask(svc, request)
    assert_equal(ask(svc, request)["error"]["code"], "unauthenticated")
    assert_equal(len(fake.calls), 1)


def test_the_nonce_cache_forgets_only_nonces_whose_ts_is_no_longer_accepted():
    clock = [float(NOW)]
    auth = RequestAuthenticator(CLIENTS, clock=lambda: clock[0])
    first = new_request(KEY, "ping", {}, now=NOW)
    auth.check(first)
    for i in range(1100):  # enough to trigger pruning
        clock[0] = NOW + 29
        auth.check(new_request(KEY, "ping", {}, now=NOW + 29))
    assert_raises_code(WireErrorCode.unauthenticated, auth.check, first)  # still within the window: replay
    clock[0] = NOW + 31
    err = assert_raises_code(WireErrorCode.unauthenticated, auth.check, first)
    assert "stale" in err.message


def test_the_auth_key_never_reaches_the_log(caplog):
    caplog.set_level(logging.DEBUG)
    svc = service(FakeSigner())
    refused_unauthenticated(svc, new_request(OTHER_KEY, "ping", {}, now=NOW))
    ask(svc, new_request(KEY, "ping", {}, now=NOW))
    ask(svc, new_request(API_KEY, "sign_bitcoin_batch", BATCH_PARAMS, client="api", now=NOW), API_KEY)
    assert "unauthenticated" in caplog.text and "client=worker method=ping outcome=ok" in caplog.text
    assert "client=api method=sign_bitcoin_batch outcome=error:method_not_allowed" in caplog.text
    for key in (KEY, OTHER_KEY, API_KEY):
        assert key.hex() not in caplog.text


def test_an_answer_changed_on_the_way_or_for_another_request_is_refused_by_the_client():
    request = new_request(KEY, "ping", {}, now=NOW)
    answer = parse_line(service(FakeSigner()).handle(encode_line(request)))
    forged = {**answer, "result": {"network": "mainnet", "master_fingerprint": "00000000"}}
    assert_raises_code(WireErrorCode.bad_response, check_answer, KEY, forged, request)
    other = new_request(KEY, "ping", {}, now=NOW)
    assert_raises_code(WireErrorCode.bad_response, check_answer, KEY, answer, other)
    assert_raises_code(WireErrorCode.bad_response, check_answer, OTHER_KEY, answer, request)
    assert_equal(check_answer(KEY, answer, request)[0], "result")


@pytest.mark.parametrize("line", [b"[" * 100_000 + b"\n", b'{"ts": 1e400}\n', b'{"ts": NaN}\n', b"\xff\n", b"[1]\n",
                                  b'{"mac": "\\u00e9", "ts": 1}\n'])
def test_hostile_lines_are_bad_requests_never_internal_errors(line, caplog):
    answer = parse_line(service(FakeSigner()).handle(line))
    assert answer["error"]["code"] in ("bad_request", "unauthenticated"), answer
    assert "Traceback" not in caplog.text


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = json.dumps({"address": "[[[[" * 10 + '\\"' + "{{{{" * 10, "n": [[[1]]]})
    assert_equal(parse_line(text.encode() + b"\n")["n"], [[[1]]])


# ---- the values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path, bad", [
    (("coins", 0, "amount"), 150_000.0),
    (("coins", 0, "amount"), True),
    (("outputs", 0, "amount"), "100000"),
    (("batch_id",), 9.0),
    (("outputs", 0, "script"), "0X14"),
])
def test_a_float_bool_or_string_where_an_integer_or_hex_belongs_is_a_bad_request(path, bad):
    fake = FakeSigner()
    params = json.loads(json.dumps(BATCH_PARAMS))
    target = params
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = bad
    answer = ask(service(fake), new_request(KEY, "sign_bitcoin_batch", params, now=NOW))
    assert_equal(answer["error"]["code"], "bad_request")
    assert_equal(fake.calls, [])


def test_a_float_is_refused_by_the_client_before_it_is_sent():
    with pytest.raises(TypeError, match="never a float"):
        METHODS["sign_bitcoin_sweep"].encode_params({"sweep_id": 1, "coins": [], "destination": "x", "fee": 1.0})


def test_unknown_or_missing_params_and_unknown_methods_are_refused():
    fake = FakeSigner()
    svc = service(fake)
    assert_equal(ask(svc, new_request(KEY, "sign_bitcoin_batch", {**BATCH_PARAMS, "extra": 1}, now=NOW))["error"]["code"],
                 "bad_request")
    assert_equal(ask(svc, new_request(KEY, "sign_bitcoin_batch", {"batch_id": 9}, now=NOW))["error"]["code"], "bad_request")
    assert_equal(ask(svc, new_request(KEY, "export_seed", {}, now=NOW))["error"]["code"], "unknown_method")
    assert_equal(ask(svc, new_request(KEY, "_record", {}, now=NOW))["error"]["code"], "unknown_method")
    duplicate = encode_line(new_request(KEY, "ping", {}, now=NOW)).replace(b'"id":', b'"id":"x","id":', 1)
    assert b"bad_request" in svc.handle(duplicate)
    assert_equal(fake.calls, [])


# ---- the method table ----------------------------------------------------------------------------


def test_the_signing_methods_are_exactly_signer_port_with_its_argument_names():
    port_methods = {n for n, _ in inspect.getmembers(SignerPort, inspect.isfunction) if not n.startswith("_")}
    assert_equal(set(SIGNING_METHODS), port_methods)
    for name in SIGNING_METHODS:
        args = [p for p in inspect.signature(getattr(SignerPort, name)).parameters if p != "self"]
        assert_equal(list(METHODS[name].params), args)


def test_the_module_tables_name_every_method_and_error_code():
    doc = wire.__doc__ or ""
    assert_equal(set(re.findall(r"^\| (\w+) \| \{?[\w ,.{}:]*\}? \|", doc, re.M)) & set(METHODS), set(METHODS))
    for code in WireErrorCode:
        assert code.value in doc, code


# ---- client and server over a unix socket --------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path):
    """A server with a FakeSigner on a unix socket in a thread; (client, fake, server)."""
    fake = FakeSigner()
    path = f"/tmp/signer-unit-{os.getpid()}-{threading.get_ident() % 10**6}.sock"
    server = make_server(parse_endpoint(f"unix:{path}"), SignerService(fake, xpubs=XPUBS, clients=CLIENTS))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield SignerClient(f"unix:{path}", KEY, timeout=5), fake, server
    server.shutdown()
    server.server_close()
    server.remove_socket()


def test_every_method_round_trips_its_values(served):
    client, fake, _ = served
    assert_equal(client.ping().master_fingerprint, "73c5da0a")
    assert_equal(client.xpubs(), XPUBS)
    assert_equal(client.sign_bitcoin_batch(9, COINS, OUTPUTS, ("bcrt1qchange", 12_345)), TX)
    assert_equal(client.sign_bitcoin_replacement(9, "ef" * 32, COINS, OUTPUTS, None), TX)
    assert_equal(client.sign_bitcoin_sweep(3, COINS, "bcrt1qhot", 500), TX)
    assert_equal(client.sign_bitcoin_rebalance(4, COINS, "bcrt1qcold", 1_000, ("bcrt1qhot", 7)), TX)
    assert_equal(client.sign_bitcoin_rebalance(4, COINS, "bcrt1qcold", 1_000, ("bcrt1qhot", 5), replaces_txid="ab" * 32), TX)
    assert_equal(client.sign_reserves_message("bitcoin", "hot", 0, 5, "custody proof of reserves: x"), RESERVES_SIG)
    eth = dict(hot_index=0, chain_id=31337, nonce=7, to="0x" + "22" * 20, value=10**30, data=b"\xa9\x05\x9c\xbb",
               gas=65_000, max_fee_wei=2 * 10**9, priority_fee_wei=10**9, replaces_txid=None)
    assert_equal(client.sign_ethereum_payment(9, OUTPUTS[0], **eth), ETH_TX)
    funding = dict(deposit_index=17, chain_id=31337, nonce=8, value=12 * 10**13, gas=21_000, max_fee_wei=2 * 10**9,
                   priority_fee_wei=10**9, replaces_txid=None)
    assert_equal(client.sign_ethereum_gas_funding(5, **funding), ETH_TX)
    sweep = dict(deposit_index=17, asset="USDT", amount=10**30, chain_id=31337, nonce=0, gas=56_000, max_fee_wei=2 * 10**9,
                 priority_fee_wei=10**9, replaces_txid="cd" * 32)
    assert_equal(client.sign_ethereum_sweep(5, **sweep), ETH_TX)
    rebalance = dict(asset="USDT", amount=10**30, destination_tier="cold", chain_id=31337, nonce=9, gas=60_000,
                     max_fee_wei=2 * 10**9, priority_fee_wei=10**9, replaces_txid=None)
    assert_equal(client.sign_ethereum_rebalance(6, **rebalance), ETH_TX)
    assert_equal([c[1] for c in fake.calls], [
        dict(batch_id=9, coins=COINS, outputs=OUTPUTS, change=("bcrt1qchange", 12_345)),
        dict(batch_id=9, replaces_txid="ef" * 32, coins=COINS, outputs=OUTPUTS, change=None),
        dict(sweep_id=3, coins=COINS, destination="bcrt1qhot", fee=500),
        dict(rebalance_id=4, coins=COINS, destination="bcrt1qcold", amount=1_000, change=("bcrt1qhot", 7), replaces_txid=None),
        dict(rebalance_id=4, coins=COINS, destination="bcrt1qcold", amount=1_000, change=("bcrt1qhot", 5),
             replaces_txid="ab" * 32),
        dict(chain="bitcoin", tier="hot", change=0, index=5, message="custody proof of reserves: x"),
        dict(batch_id=9, output=OUTPUTS[0], **eth),
        dict(sweep_id=5, **funding),
        dict(sweep_id=5, **sweep),
        dict(rebalance_id=6, **rebalance),
    ])


def test_refusals_signer_errors_outages_and_crashes_come_back_as_their_own_exceptions(served, caplog):
    client, fake, _ = served
    fake.raises = SigningRefused(RefusalCode.decision_not_approved, "withdrawal 41 lacks its quorum")
    refused = assert_raises_code(RefusalCode.decision_not_approved, client.sign_bitcoin_batch, 9, COINS, OUTPUTS, None)
    assert_equal((refused.message, refused.withdrawal_id), ("withdrawal 41 lacks its quorum", None))
    fake.raises = SigningRefused(RefusalCode.approver_unknown, "withdrawal 41: approval 7: unknown key", 41)
    refused = assert_raises_code(RefusalCode.approver_unknown, client.sign_bitcoin_batch, 9, COINS, OUTPUTS, None)
    assert_equal(refused.withdrawal_id, 41)  # the withdrawal it is about crosses the socket
    fake.raises = SignerError(SignerErrorCode.WRONG_NETWORK, "a mainnet address")
    assert_raises_code(SignerErrorCode.WRONG_NETWORK, client.sign_bitcoin_sweep, 3, COINS, "bc1q", 500)
    fake.raises = OperationalError("SELECT 1", {}, ConnectionRefusedError())
    with pytest.raises(SignerUnavailable):
        client.sign_bitcoin_sweep(3, COINS, "bcrt1q", 500)
    fake.raises = RuntimeError("secret detail of a crash")
    err = assert_raises_code(WireErrorCode.internal, client.sign_bitcoin_sweep, 3, COINS, "bcrt1q", 500)
    assert "secret detail" not in str(err) and "secret detail" in caplog.text  # the traceback stays in the server's log


def test_a_wrong_key_is_unauthenticated_through_the_client(served):
    client, fake, server = served
    other = SignerClient(str(client.endpoint), OTHER_KEY)
    assert_raises_code(WireErrorCode.unauthenticated, other.ping)
    assert_equal(fake.calls, [])


# ---- clients and their grants --------------------------------------------------------------------


def test_an_unknown_client_is_unauthenticated_and_nothing_is_signed(served):
    client, fake, _ = served
    svc = service(fake)
    for name in ("nobody", "WORKER", ""):
        refused_unauthenticated(svc, new_request(KEY, "sign_bitcoin_batch", BATCH_PARAMS, client=name, now=NOW))
    request = new_request(KEY, "ping", {}, now=NOW)
    del request["client"]
    refused_unauthenticated(svc, request)
    err = assert_raises_code(WireErrorCode.unauthenticated,
                             SignerClient(str(client.endpoint), KEY, client="treasury").sign_bitcoin_batch, 9, COINS,
                             OUTPUTS, None)
    assert "treasury" in err.message
    assert_equal(fake.calls, [])


def test_another_clients_key_is_unauthenticated(served):
    """The MAC is checked under the key of the client the request names: the api's key cannot
    speak as the worker, the worker's cannot speak as the api, and the name is under the MAC."""
    client, fake, _ = served
    svc = service(fake)
    refused_unauthenticated(svc, new_request(API_KEY, "sign_bitcoin_batch", BATCH_PARAMS, client="worker", now=NOW))
    refused_unauthenticated(svc, new_request(KEY, "ping", {}, client="api", now=NOW))
    renamed = new_request(API_KEY, "ping", {}, client="api", now=NOW)
    renamed["client"] = "worker"
    refused_unauthenticated(svc, renamed)
    endpoint = str(client.endpoint)
    assert_raises_code(WireErrorCode.unauthenticated, SignerClient(endpoint, API_KEY, client="worker").sign_bitcoin_sweep,
                       3, COINS, "bcrt1qhot", 500)
    assert_raises_code(WireErrorCode.unauthenticated, SignerClient(endpoint, KEY, client="api").ping)
    assert_equal(fake.calls, [])


FORBIDDEN_TO_API = sorted(SIGNING_METHODS - API_METHODS)
CALLS = {  # one well-formed call of each signing method, through the client
    "sign_bitcoin_batch": lambda c: c.sign_bitcoin_batch(9, COINS, OUTPUTS, None),
    "sign_bitcoin_replacement": lambda c: c.sign_bitcoin_replacement(9, "ef" * 32, COINS, OUTPUTS, None),
    "sign_bitcoin_sweep": lambda c: c.sign_bitcoin_sweep(3, COINS, "bcrt1qhot", 500),
    "sign_bitcoin_rebalance": lambda c: c.sign_bitcoin_rebalance(4, COINS, "bcrt1qcold", 1_000, None),
    "sign_bitcoin_cpfp": lambda c: c.sign_bitcoin_cpfp(4, b"\x02\x00", 0, "bcrt1qhot", 500),
    "sign_ethereum_payment": lambda c: c.sign_ethereum_payment(
        9, OUTPUTS[0], hot_index=0, chain_id=31337, nonce=7, to="0x" + "22" * 20, value=1, data=b"", gas=21_000,
        max_fee_wei=2 * 10**9, priority_fee_wei=10**9),
    "sign_reserves_message": lambda c: c.sign_reserves_message("bitcoin", "hot", 0, 5, "custody proof of reserves: x"),
    "sign_ethereum_gas_funding": lambda c: c.sign_ethereum_gas_funding(
        5, deposit_index=1, chain_id=31337, nonce=8, value=1, gas=21_000, max_fee_wei=2 * 10**9, priority_fee_wei=10**9),
    "sign_ethereum_sweep": lambda c: c.sign_ethereum_sweep(
        5, deposit_index=1, asset="USDT", amount=1, chain_id=31337, nonce=0, gas=56_000, max_fee_wei=2 * 10**9,
        priority_fee_wei=10**9),
    "sign_ethereum_rebalance": lambda c: c.sign_ethereum_rebalance(
        6, asset="ETH", amount=1, destination_tier="warm", chain_id=31337, nonce=9, gas=21_000, max_fee_wei=2 * 10**9,
        priority_fee_wei=10**9),
}


def test_the_forbidden_list_is_every_signing_method_but_reserves():
    assert_equal(FORBIDDEN_TO_API, ["sign_bitcoin_batch", "sign_bitcoin_cpfp", "sign_bitcoin_rebalance", "sign_bitcoin_replacement",
                                    "sign_bitcoin_sweep", "sign_ethereum_gas_funding", "sign_ethereum_payment",
                                    "sign_ethereum_rebalance", "sign_ethereum_sweep"])
    assert_equal(set(CALLS), set(SIGNING_METHODS))


@pytest.mark.parametrize("method", FORBIDDEN_TO_API)
def test_a_method_outside_the_clients_grant_is_method_not_allowed_and_never_reaches_the_signer(served, method, caplog):
    client, fake, _ = served
    api = SignerClient(str(client.endpoint), API_KEY, client="api", timeout=5)
    err = assert_raises_code(WireErrorCode.method_not_allowed, CALLS[method], api)
    assert_equal(err.message, f"client api may not call {method}")
    assert_equal(fake.calls, [])
    assert "method_not_allowed: client api" in caplog.text and method in caplog.text
    # refused before the params are even decoded: garbage params get the same answer, not bad_request
    answer = ask(service(fake), new_request(API_KEY, method, {"anything": 1.5}, client="api", now=NOW), API_KEY)
    assert_equal(answer["error"]["code"], "method_not_allowed")
    assert_equal(fake.calls, [])
    assert_equal(type(CALLS[method](client)).__name__, "SignedTx" if "bitcoin" in method else "SignedEthTx")  # the worker may


def test_a_clients_allowed_methods_pass(served):
    client, fake, _ = served
    api = SignerClient(str(client.endpoint), API_KEY, client="api", timeout=5)
    assert_equal(api.ping().master_fingerprint, "73c5da0a")
    assert_equal(api.xpubs(), XPUBS)
    assert_equal(CALLS["sign_reserves_message"](api), RESERVES_SIG)
    assert_equal([name for name, _ in fake.calls], ["sign_reserves_message"])
    unknown = ask(service(fake), new_request(API_KEY, "export_seed", {}, client="api", now=NOW), API_KEY)
    assert_equal(unknown["error"]["code"], "unknown_method")  # a method nobody has is unknown, not "not allowed"


@pytest.mark.parametrize("make, why", [
    (lambda: ClientGrant("worker", KEY, frozenset({"ping", "sign_everything"})), "unknown methods"),
    (lambda: ClientGrant("worker", KEY, frozenset()), "at least one method"),
    (lambda: ClientGrant("Worker", KEY, frozenset({"ping"})), "client name"),
    (lambda: ClientGrant("worker", b"short", frozenset({"ping"})), "at least 32 bytes"),
    (lambda: RequestAuthenticator([ClientGrant("worker", KEY, frozenset({"ping"})),
                                   ClientGrant("api", KEY, frozenset({"ping"}))]), "same auth key"),
    (lambda: RequestAuthenticator([ClientGrant("worker", KEY, frozenset({"ping"})),
                                   ClientGrant("worker", API_KEY, frozenset({"ping"}))]), "listed twice"),
    (lambda: RequestAuthenticator([]), "at least one client"),
])
def test_grants_are_checked_when_built(make, why):
    with pytest.raises(ValueError, match=why):
        make()


def test_a_stopped_signer_is_unavailable_which_jobs_retry_next_run(served):
    client, _, server = served
    server.shutdown()
    server.server_close()
    server.remove_socket()
    with pytest.raises(NodeUnavailable):
        client.ping()
    tcp = SignerClient("tcp:127.0.0.1:1", KEY, connect_timeout=1)
    with pytest.raises(SignerUnavailable):
        tcp.ping()


def test_a_signer_dying_mid_call_is_unavailable(tmp_path: Path):
    """The server reads the request and closes without an answer (as a SIGKILL would)."""
    import socket

    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)

    def accept_and_drop():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=accept_and_drop, daemon=True).start()
    with pytest.raises(SignerUnavailable, match="without an answer"):
        SignerClient(f"unix:{path}", KEY, timeout=5).ping()
    listener.close()


def test_the_client_is_safe_to_share_between_threads(served):
    client, fake, _ = served
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            assert_equal(client.sign_bitcoin_sweep(i, COINS, "bcrt1qhot", i), TX)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert_equal(errors, [])
    assert_equal(sorted(c[1]["sweep_id"] for c in fake.calls), list(range(16)))


def test_the_unix_socket_is_owner_only(served):
    client, _, _ = served
    assert_equal(oct(os.stat(client.endpoint.path).st_mode & 0o777), "0o600")


# ---- endpoints and the auth key file --------------------------------------------------------------


@pytest.mark.parametrize("text", ["tcp:0.0.0.0:7000", "tcp:10.0.0.5:7000", "tcp:localhost:7000", "unix:relative.sock",
                                  "tcp:127.0.0.1:0", "tcp:127.0.0.1:70000", "http://127.0.0.1:7000"])
def test_endpoints_other_than_loopback_tcp_or_an_absolute_unix_path_are_refused(text):
    with pytest.raises(ValueError):
        parse_endpoint(text)


def test_loopback_endpoints_parse():
    assert_equal(str(parse_endpoint("tcp:127.0.0.1:7000")), "tcp:127.0.0.1:7000")
    assert_equal(str(parse_endpoint("tcp:[::1]:7000")), "tcp:[::1]:7000")
    assert_equal(parse_endpoint("unix:/run/signer/s.sock").path, "/run/signer/s.sock")


def test_the_auth_key_file_must_be_owner_only_hex_of_32_bytes(tmp_path: Path):
    good = tmp_path / "good"
    key = wire.write_auth_key(good)
    assert_equal(read_auth_key(good), key)
    for name, text, mode, why in (("open", key.hex(), 0o640, "chmod 600"), ("short", "ab" * 31, 0o600, "at least 32"),
                                  ("raw", "x" * 64, 0o600, "hex")):
        p = tmp_path / name
        p.write_text(text)
        p.chmod(mode)
        with pytest.raises(ValueError, match=why) as info:
            read_auth_key(p)
        assert key.hex() not in str(info.value)
    with pytest.raises(FileExistsError):
        wire.write_auth_key(good)


def test_time_is_unix_seconds_as_an_integer():
    request = new_request(KEY, "ping", {})
    assert type(request["ts"]) is int and abs(request["ts"] - time.time()) < 5
    assert re.fullmatch(r"[0-9a-f]{32}", request["nonce"])
    answer = new_answer(KEY, request["id"], request["nonce"], "result", {})
    assert_equal(check_answer(KEY, answer, request), ("result", {}))


def test_the_client_and_the_config_import_no_key_code():
    """Custody processes import signer.client (and may read signer.config); neither pulls in
    signer.keys or signer.service."""
    import subprocess
    import sys

    code = ("import sys, signer.client, signer.config, signer.wire; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('signer'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                          text=True, check=True)
    loaded = set(done.stdout.split())
    assert {"signer.client", "signer.wire"} <= loaded
    assert_equal(loaded & {"signer.keys", "signer.service", "signer.server"}, set())


def test_a_refusal_names_its_withdrawal_both_ways_and_a_malformed_one_is_refused():
    for wid in (None, 41, 2**63 - 1):
        body = wire.encode_refused(SigningRefused(RefusalCode.destination_denied, "withdrawal: denied", wid))
        assert_equal(body, {"code": "destination_denied", "message": "withdrawal: denied", "withdrawal_id": wid})
        back = wire.decode_refused(json.loads(json.dumps(body)))
        assert_equal((back.code, back.message, back.withdrawal_id), (RefusalCode.destination_denied, "withdrawal: denied", wid))
    assert_equal(wire.decode_refused({"code": "kill_switch_on", "message": "halted"}).withdrawal_id, None)  # an older signer
    for bad in ({"code": "kill_switch_on", "message": "m", "withdrawal_id": 4.0},
                {"code": "kill_switch_on", "message": "m", "withdrawal_id": True},
                {"code": "kill_switch_on", "message": "m", "withdrawal_id": "4"},
                {"code": "kill_switch_on", "message": "m", "withdrawal_id": 4, "extra": 1},
                {"code": "no_such_code", "message": "m"}, {"code": "kill_switch_on", "message": 5}, ["kill_switch_on"]):
        with pytest.raises(wire.Malformed):
            wire.decode_refused(bad)
