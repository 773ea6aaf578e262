"""The deployed topology, end to end: nodes started by `python -m regtest up` (not by the service),
config files written, `signer serve`, `custody worker` and `custody api` as separate OS processes.

- the money path: deposit -> credit -> a withdrawal needing two approvals, each signed with its
  approver's own key -> batch -> signed by the signer process -> broadcast -> final;
  reconciliation zero, the ledger verified;
- the boundary: the api and worker processes never loaded the signer's key code nor the seed;
  the signer's database role is refused the writes it must not make; the api process's signer
  client (its own name and key, read from the running process) publishes proof of reserves and
  is refused every money-moving method (`method_not_allowed`, nothing audited or read);
- forgery through the database: approval rows written in SQL (and the withdrawal pushed to
  `approved`) are refused by the signer process; nothing is broadcast;
- faults: the signer SIGKILLed while a batch waits on it, then restarted: exactly one payment; the
  worker holding the payout job SIGKILLed while a second worker runs: the second takes over, one
  batch; bitcoind restarted while the workers run: a new deposit is credited without anyone acting;
  bitcoind hung (SIGSTOP): the api process's `/health/ready` answers 503 naming `bitcoin` within a
  few seconds (READINESS_TIMEOUT_SECONDS, not the adapter's 60 s RPC timeout), a probe repeated
  meanwhile too, and 200 again once the node continues.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from custody.approve_cli import key_id_of, load_private_key
from custody.client import CustodyClient
from custody.client.models import WithdrawalOut
from custody.launch import Deployment, Nodes, deploy, role_url
from regtest import control
from regtest.cluster import cluster_from_state
from regtest.install import find_tools
from regtest.util import wait_until
from tests.e2e.custody.api_helpers import readiness

ROOT = Path(__file__).resolve().parents[2]
BTC = 100_000_000


def _until(what: str, probe, timeout: float = 120.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def nodes_up(tmp_path_factory):
    """bitcoind and anvil started by the regtest CLI, as an operator would, in a state dir of ours."""
    state = tmp_path_factory.mktemp("regtest-cli")
    env = {**os.environ, "REGTEST_STATE_DIR": str(state)}
    up = subprocess.run([sys.executable, "-m", "regtest", "up"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    described = json.loads((state / "state.json").read_text())
    cluster = cluster_from_state(described, find_tools())
    try:
        yield cluster, Nodes(cluster.bitcoin.rpc_url, cluster.anvil.rpc_url, described["token"]["address"])
    finally:
        subprocess.run([sys.executable, "-m", "regtest", "down"], cwd=ROOT, env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def owner_url(database_url):
    """A database of its own on the suite's server (the processes migrate it themselves)."""
    from custody.database import drop_database, ensure_database, with_database

    url = with_database(database_url, f"custody_topology_{uuid.uuid4().hex[:8]}")
    ensure_database(url)
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, nodes_up, owner_url) -> Deployment:
    from custody.broker import embedded_nats_url

    _, nodes = nodes_up
    root = tmp_path_factory.mktemp("topology")
    # The test process starts the events broker (stopped when it exits), as `custody demo` does: a
    # worker's own embedded server would outlive the workers SIGKILLed below.
    dep = deploy(root, owner_url=owner_url, nodes=nodes, job_scale=0.2, nats_url=embedded_nats_url(root / "broker"))
    yield dep
    dep.stop()


@pytest.fixture(scope="module")
def keys(deployment, owner_url):
    from custody.auth import create_api_key
    from custody.settings import get_settings

    engine = create_engine(owner_url)
    try:
        pepper = get_settings().api_key_pepper
        made = {"backend": create_api_key(engine, "exchange-backend", "backend", pepper),
                "admin": create_api_key(engine, "topology-admin", "admin", pepper)}
        for name in deployment.approver_keys:
            made[name] = create_api_key(engine, name, "operator", pepper)
    finally:
        engine.dispose()
    return made


@pytest.fixture(scope="module")
def clients(deployment, keys):
    """The typed client (custody.client) for each key, on one connection pool to the api process."""
    with CustodyClient(deployment.api_base, None, timeout=30) as base:
        yield {name: base.with_key(k) for name, k in keys.items()}


@pytest.fixture(scope="module")
def owner(owner_url):
    engine = create_engine(owner_url)
    yield engine
    engine.dispose()


def _funded_customer(clients, cluster, sat: int) -> int:
    backend = clients["backend"]
    owner_name = f"cust-{uuid.uuid4().hex[:8]}"
    acct = backend.open_account(asset="BTC", kind="customer", name=f"customer:{owner_name}:BTC", owner=owner_name).id
    addr = backend.issue_deposit_address(idempotency_key=f"addr-{acct}", account_id=acct)
    cluster.bitcoin.fund(addr.address, sat)

    def credited():
        cluster.bitcoin.mine(1)
        return any(d.state == "credited" for d in backend.list_account_deposits(acct))
    _until("deposit credited", credited, every=1.0)
    return acct


def _withdraw(clients, acct: int, amount: str, dest: str) -> WithdrawalOut:
    return clients["backend"].request_withdrawal(client_withdrawal_id=f"w-{uuid.uuid4().hex[:10]}", account_id=acct,
                                                 amount=Decimal(amount), destination=dest)


def _state(clients, wid: int) -> str:
    return clients["admin"].get_withdrawal(wid).state


def _until_final(clients, cluster, wid: int, timeout: float = 180.0) -> None:
    def final():
        state = _state(clients, wid)
        if state in ("broadcast", "confirmed"):
            cluster.bitcoin.mine(1)
        return state == "final"
    _until(f"withdrawal {wid} final", final, timeout=timeout, every=1.0)


def _payments_to(cluster, dest: str) -> int:
    """How many confirmed outputs on the chain pay `dest` (the node's own index, not our books)."""
    received = cluster.bitcoin.wallet("listreceivedbyaddress", 0, True, True, dest)
    return sum(len(r["txids"]) for r in received)


def test_money_path_on_three_processes(deployment, nodes_up, clients, owner):
    from custody.approve_cli import approve_with_client, load_private_key

    cluster, _ = nodes_up
    acct = _funded_customer(clients, cluster, 5 * BTC)
    dest = cluster.bitcoin.wallet("getnewaddress", "", "bech32")
    from custody.addresses import derive_btc_address

    hot = derive_btc_address(deployment.xpubs["bitcoin"]["hot"], "regtest", 0, 0)
    cluster.bitcoin.fund(hot, 10 * BTC)
    cluster.bitcoin.mine(1)  # the hot wallet counts confirmed coins only (the wallet index: walked blocks)
    w = _withdraw(clients, acct, "2.5", dest)
    assert w.state == "pending_approval", w
    names = list(deployment.approver_keys)
    first = approve_with_client(clients[names[0]], w.id, load_private_key(deployment.approver_keys[names[0]]),
                                comment="checked with the customer")
    assert first.state == "pending_approval", first
    second = approve_with_client(clients[names[1]], w.id, load_private_key(deployment.approver_keys[names[1]]),
                                 comment="second pair of eyes")
    assert second.state == "approved", second
    _until_final(clients, cluster, w.id)
    with owner.connect() as c:
        signed = c.execute(text("SELECT count(*) FROM signer_audit WHERE outcome = 'signed' AND batch_id = "
                                "(SELECT batch_id FROM withdrawal_request WHERE id = :w)"), {"w": w.id}).scalar()
    assert signed >= 1
    assert _payments_to(cluster, dest) == 1
    balance = clients["admin"].get_balance(acct)
    assert balance.posted.minor == 249_995_000, balance
    lines = clients["admin"].reconcile()
    assert lines and all(line.difference == 0 for line in lines), lines
    assert clients["admin"].verify().ok


def test_api_and_worker_never_load_key_code_or_the_seed(deployment):
    seed = (deployment.root / "dev-seed.txt").resolve()
    for name in ("custody-api", "custody-worker"):
        pid = deployment.processes.pid(name)
        dump = deployment.root / f"modules-{name}-{pid}.txt"
        dump.unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)
        modules = set(_until(f"{name} module list", lambda: dump.exists() and dump.read_text().split()))
        assert "custody" in modules and "sqlalchemy" in modules, sorted(modules)[:20]  # the dump is real
        assert not {"signer.keys", "signer.service", "signer.server"} & modules, name
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in environ if e.startswith((b"CUSTODY_SIGNER_SEED", b"SIGNER_SEED"))], name
        open_files = {os.path.realpath(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert str(seed) not in open_files
        assert str(seed) not in Path(f"/proc/{pid}/cmdline").read_text()
    signer_pid = deployment.processes.pid("custody-signer")
    assert "signer" in Path(f"/proc/{signer_pid}/cmdline").read_text()


def test_each_process_connects_as_its_own_role(deployment, owner):
    """After the money path every process has talked to the database: each under its own role."""
    with owner.connect() as c:
        seen = {(r.application_name, r.usename) for r in c.execute(text(
            "SELECT DISTINCT application_name, usename FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'custody-%'"))}
    assert {("custody-api", "custody_api"), ("custody-worker", "custody_worker"),
            ("custody-signer", "custody_signer")} <= seen, seen
    assert all(user == name.replace("-", "_").removesuffix("_2") for name, user in seen), seen


def test_the_api_process_may_not_ask_the_signer_to_move_money(deployment, nodes_up, clients, owner):
    import tomllib

    from custody.reserves import check_proof, check_report
    from regtest.util import assert_raises_code
    from signer.client import SignerClient
    from signer.protocol import BatchOutput
    from signer.wire import WireErrorCode

    cluster, _ = nodes_up
    pid = deployment.processes.pid("custody-api")
    environ = dict(e.decode().split("=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    client_name, key_file = environ["CUSTODY_API_SIGNER_CLIENT"], environ["CUSTODY_API_SIGNER_AUTH_KEY_FILE"]
    assert (client_name, Path(key_file)) == ("api", deployment.signer_clients["api"])
    worker_signer = tomllib.loads((deployment.root / "custody.toml").read_text())["signer"]
    assert worker_signer["client"] == "worker" and Path(worker_signer["auth_key_file"]) != Path(key_file)
    api = SignerClient.from_key_file(worker_signer["endpoint"], key_file, client=client_name)
    assert api.ping().network == "regtest"

    batch_id = 2**62 + uuid.uuid4().int % 2**40  # had the call got through, the signer would have audited a refusal
    dest = cluster.bitcoin.wallet("getnewaddress", "", "bech32")
    output = BatchOutput(batch_id, dest, 100_000)
    for call in (lambda: api.sign_bitcoin_batch(batch_id, [], [output], None),
                 lambda: api.sign_bitcoin_sweep(batch_id, [], dest, 1_000),
                 lambda: api.sign_bitcoin_rebalance(batch_id, [], dest, 1_000, None)):
        assert_raises_code(WireErrorCode.method_not_allowed, call)
    assert_raises_code(WireErrorCode.unauthenticated,  # its key cannot pass for the worker's
                       SignerClient.from_key_file(worker_signer["endpoint"], key_file, client="worker").sign_bitcoin_batch,
                       batch_id, [], [output], None)
    with owner.connect() as c:
        assert c.execute(text("SELECT count(*) FROM signer_audit WHERE batch_id = :b"), {"b": batch_id}).scalar() == 0
    signer_log = deployment.processes.log_path("custody-signer").read_text()
    assert "method_not_allowed: client api" in signer_log and "client=api method=sign_bitcoin_batch" in signer_log

    acct = _funded_customer(clients, cluster, 1 * BTC)  # a customer to commit to, coins to prove
    operator = clients[next(iter(deployment.approver_keys))]
    requested = operator.publish_reserve_report().model_dump(mode="json")["reports"]  # the worker's job builds and signs them
    wait_until(lambda: all(operator.get_reserve_report(r["report_id"]).state == "published" for r in requested), timeout=120,
               interval=1.0, what="the worker publishes the reserve reports")
    reports = [operator.get_reserve_report(r["report_id"]).model_dump(mode="json")["report"] for r in requested]
    report = next(r for r in reports if r["asset"] == "BTC")
    assert report["holdings"]["addresses"] and all(check_report(r) == [] for r in reports), [check_report(r) for r in reports]
    proof = clients["backend"].get_reserve_proof(report["report_id"], account_id=acct).model_dump(mode="json")
    assert check_proof(report, proof) == []
    assert operator.run_rebalances() is not None  # decides only; no signing method needed


def test_signer_role_cannot_write_what_it_checks(owner_url):
    from sqlalchemy.exc import ProgrammingError

    engine = create_engine(role_url(owner_url, "custody_signer"))
    try:
        for statement in ("UPDATE withdrawal_request SET amount = amount + 1",
                          "UPDATE policy_decision SET required_approvals = 0",
                          "INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment) VALUES (1, 1, 'x', 'approve', 'x')",
                          "UPDATE control_flag SET engaged = false"):
            with engine.connect() as c:
                with pytest.raises(ProgrammingError, match="permission denied"):
                    c.execute(text(statement))
    finally:
        engine.dispose()


def test_approvals_forged_in_the_database_are_refused_by_the_signer_process(deployment, nodes_up, clients, owner):
    cluster, _ = nodes_up
    acct = _funded_customer(clients, cluster, 4 * BTC)
    dest = cluster.bitcoin.wallet("getnewaddress", "", "bech32")
    w = _withdraw(clients, acct, "2.5", dest)
    assert w.state == "pending_approval"
    # A database writer approves it twice and moves it on. Unsigned rows would not even be batched
    # (custody counts only approvals whose key is live: custody.withdrawals live_approvers), so the
    # forgery names each approver's real key id with a signature it never made: custody counts it
    # (it verified signatures when approvals were recorded) and only the signer can tell.
    with owner.begin() as c:
        decision = c.execute(text("SELECT decision_id FROM withdrawal_request WHERE id = :w"), {"w": w.id}).scalar()
        for op, key_file in deployment.approver_keys.items():
            c.execute(text("INSERT INTO approval (withdrawal_id, decision_id, operator, action, comment, key_id, scheme, "
                           "signed_payload, signature) VALUES (:w, :d, :o, 'approve', 'looks fine', :k, 'ed25519', "
                           "'{}', :s)"),
                      {"w": w.id, "d": decision, "o": f"api:{op}", "k": key_id_of(load_private_key(key_file)),
                       "s": bytes(64)})
        c.execute(text("UPDATE withdrawal_request SET state = 'approved' WHERE id = :w"), {"w": w.id})

    def refused():  # the batch it was in (custody takes a refused withdrawal out: custody.payouts drop_refused)
        with owner.connect() as c:
            return c.execute(text("SELECT batch_id FROM batch_output WHERE withdrawal_id = :w UNION "
                                  "SELECT (detail->>'batch_id')::bigint FROM audit_event WHERE action = 'batch.drop_refused' "
                                  "AND (detail->>'withdrawal_id')::bigint = :w"), {"w": w.id}).scalar()
    batch = _until("batched", refused)
    def code():
        with owner.connect() as c:
            return c.execute(text("SELECT code FROM signer_audit WHERE outcome = 'refused' AND batch_id = :b"), {"b": batch}).scalar()
    assert _until("the signer's refusal", code) == "approval_signature_invalid"
    _until("back to the operators", lambda: _state(clients, w.id) == "pending_approval")
    cluster.bitcoin.mine(2)
    assert _payments_to(cluster, dest) == 0
    with owner.connect() as c:
        assert c.execute(text("SELECT count(*) FROM chain_transaction WHERE batch_id = :b"), {"b": batch}).scalar() == 0


def test_signer_killed_mid_batch_pays_exactly_once(deployment, nodes_up, clients, owner):
    cluster, _ = nodes_up
    acct = _funded_customer(clients, cluster, 2 * BTC)
    dest = cluster.bitcoin.wallet("getnewaddress", "", "bech32")
    procs = deployment.processes
    procs.kill("custody-signer", signal.SIGSTOP)  # the worker's signing call will hang on it
    w = _withdraw(clients, acct, "0.3", dest)
    _until("batched", lambda: _state(clients, w.id) == "batched")
    time.sleep(1.0)  # the worker is now waiting on the stopped signer
    procs.kill("custody-signer", signal.SIGKILL)
    procs.start("custody-signer")
    _until_final(clients, cluster, w.id)
    assert _payments_to(cluster, dest) == 1
    with owner.connect() as c:
        assert c.execute(text("SELECT count(DISTINCT batch_id) FROM batch_output WHERE withdrawal_id = :w"),
                         {"w": w.id}).scalar() == 1


def test_second_worker_takes_over_the_payout_job(deployment, nodes_up, clients, owner):
    cluster, _ = nodes_up
    procs = deployment.processes
    procs.start("custody-worker", instance="custody-worker-2")
    acct = _funded_customer(clients, cluster, 2 * BTC)

    def holder():
        with owner.connect() as c:
            return c.execute(text("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                                  "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE 'custody-worker%' "
                                  "LIMIT 1")).scalar()
    victim = _until("a worker holding a job lock", holder, every=0.05)
    procs.kill(victim, signal.SIGKILL)
    survivor = "custody-worker-2" if victim == "custody-worker" else "custody-worker"
    dests = [cluster.bitcoin.wallet("getnewaddress", "", "bech32") for _ in range(3)]
    ws = [_withdraw(clients, acct, "0.2", d) for d in dests]
    for w in ws:
        _until_final(clients, cluster, w.id)
    assert [_payments_to(cluster, d) for d in dests] == [1, 1, 1]
    with owner.connect() as c:
        per_withdrawal = c.execute(text("SELECT count(DISTINCT batch_id) FROM batch_output WHERE withdrawal_id = ANY(:w) "
                                        "GROUP BY withdrawal_id"), {"w": [w.id for w in ws]}).scalars().all()
    assert per_withdrawal == [1, 1, 1]
    assert procs.procs[survivor].poll() is None


def test_bitcoind_restart_needs_no_operator(deployment, nodes_up, clients):
    cluster, _ = nodes_up
    control.stop_node(cluster.bitcoin)
    time.sleep(3)  # the workers' jobs fail against the stopped node meanwhile
    control.start_node(cluster.bitcoin, detached=True)  # the chain kept, the faucet wallet loaded again
    acct = _funded_customer(clients, cluster, 1 * BTC)
    assert clients["admin"].get_balance(acct).posted.minor == 1 * BTC
    assert clients["admin"].verify().ok
    alive = [name for name, proc in deployment.processes.procs.items() if proc.poll() is None]
    assert {"custody-signer", "custody-api"} <= set(alive) and any(n.startswith("custody-worker") for n in alive), alive


def test_a_hung_bitcoind_makes_readiness_503_within_seconds(deployment, nodes_up):
    cluster, _ = nodes_up
    with CustodyClient(deployment.api_base, None, timeout=90, retries=0) as probe:
        assert _until("ready", lambda: readiness(probe)[0] == 200, timeout=60)
        with control.hang_node(cluster.bitcoin):
            for attempt in (1, 2):  # the second finds the first probe's call still waiting on the node
                started = time.monotonic()
                status, ready = readiness(probe)
                took = time.monotonic() - started
                checks = ready.checks
                assert (status, checks["bitcoin"].ok, checks["database"].ok) == (503, False, True), ready
                assert checks["bitcoin"].detail.startswith("TimeoutError: "), checks["bitcoin"]
                assert took < 6, f"probe {attempt} took {took:.1f} s"
        control.wait_answering(cluster.bitcoin)
        assert _until("ready again", lambda: readiness(probe)[0] == 200, timeout=60)
