"""Role hardening (review 16, R1-1 and R1-2): no role attaches the owner's trigger functions to a table of
its own, and custody_api updates only an account's `closed_at`.

Revision ID: 0049_role_hardening
Revises: 0048_set_based_triggers

Why:
- R1-1. The event trigger functions (`custody_event_*`, 0026/0032/0048) are SECURITY DEFINER: they
  write `outbox` with the owner's rights, which custody_api does not have. But custody_api (and
  custody_worker) kept EXECUTE on them (the procedure's `GRANT EXECUTE ON ALL FUNCTIONS` and the
  default privileges) and, like every role, TEMPORARY on the database: it could create a temporary
  table with the columns a function reads, attach the function to it as a trigger (it owns the
  table) and turn each row it inserts into an event written as the owner, or squat the key
  `ledger.transaction_posted:<id>` of a posting to come so that the real posting's event is skipped.
  CREATE TRIGGER needs EXECUTE on the function; firing a trigger does not (the check is made when the
  trigger is created, by its creator), and a trigger function cannot be called directly. So no
  process role needs EXECUTE on any trigger function, and without it none can attach one.
- R1-2. custody_api had UPDATE on every column of `account` (0022's list: `INSERT, UPDATE`), so it
  could set `may_go_negative` on a customer account and post from an empty one (money from
  nothing), turn a liquidity account into a customer one for the liquidity guard (`kind`), or move
  an account to another owner. The only UPDATE of `account` the api makes is closing one
  (`Ledger.close_account`: `closed_at`); the ledger's functions run as the caller and only read
  `account`; row locks the api takes are on `account_balance`.

What changes:
- `custody_apply_role_grants()` (0022's body, one section added at its end): every function of the
  schema returning `trigger` loses EXECUTE for PUBLIC, custody_api, custody_worker and custody_signer,
  each time the procedure runs, after its broad `GRANT EXECUTE ON ALL FUNCTIONS`: a trigger function
  a later migration creates (the default privileges grant it to custody_api and custody_worker) is
  revoked the next time a migration calls the procedure, and `test_db_roles` checks that none is
  executable at the head. It also revokes TEMPORARY on the database from PUBLIC and the three process
  roles (nothing in the service creates a temporary table; SECURITY DEFINER functions' `pg_temp` in
  `search_path` needs no privilege): a defence in depth, so a role that gets EXECUTE on some
  function again still has no table of its own to attach it to. The owner keeps TEMPORARY (an owner's
  implicit privileges).
- custody_api's limited list: `account` becomes `INSERT, UPDATE (closed_at)` (rewritten from what
  the database holds, 0040's way, so a re-chaining keeps every other migration's rows). A column-level
  UPDATE still lets the api lock an account row (FOR UPDATE / SHARE need UPDATE on some column).

Who can forge what (honest): custody_api still INSERTs accounts (`POST /v1/accounts`, the matching
engine's market accounts) and so chooses a new account's kind and flags; that is not changed here.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0049_role_hardening"
down_revision = "0048_set_based_triggers"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0022 = _sibling("0022_api_role_narrowed.py")
_0040 = _sibling("0040_convert_fixes.py")

_END = "END $$;"
assert _0022.PROCEDURE.rstrip().endswith(_END)

# Appended to 0022's procedure body: after every GRANT of it, so nothing it grants gives them back.
HARDENING = """
    -- Trigger functions (0049, review 16 R1-1): nobody but the owner may attach one to a table
    -- (CREATE TRIGGER needs EXECUTE; firing does not), whenever the function was created.
    FOR t IN SELECT p.oid::regprocedure AS f FROM pg_proc p
              WHERE p.pronamespace = 'public'::regnamespace AND p.prorettype = 'trigger'::regtype LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC, custody_api, custody_worker, custody_signer', t.f);
    END LOOP;
    -- ... nor create a temporary table to attach one to (nothing in the service uses one).
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC, custody_api, custody_worker, custody_signer',
                   current_database());
"""
PROCEDURE = _0022.PROCEDURE.rstrip()[: -len(_END)] + HARDENING + _END + "\n"

ACCOUNT_BEFORE = "INSERT, UPDATE"
ACCOUNT_AFTER = "INSERT, UPDATE (closed_at)"


def limited_privileges(relation: str, before: str, after: str, *, migration: str = "0049") -> str:
    """custody_api's limited list, rewritten from the database's own with `relation`'s privileges
    `before` replaced by `after` (refused if `relation` is not listed with `before`). Migration
    0051 uses it too."""
    return f"""
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM custody_api_limited_tables() WHERE relation = '{relation}' AND privileges = '{before}') THEN
        RAISE EXCEPTION 'migration {migration}: {relation} is not in custody_api_limited_tables() with {before}';
    END IF;
END $do$;
{_0040._set_limited(
        "SELECT relation, CASE WHEN relation = '" + relation + "' THEN '" + after + "' ELSE privileges END AS privileges, n "
        "FROM custody_api_limited_tables() WITH ORDINALITY AS l(relation, privileges, n)")}
"""


def _account_privileges(before: str, after: str) -> str:
    return limited_privileges("account", before, after)


def upgrade() -> None:
    op.execute(PROCEDURE)
    op.execute(_account_privileges(ACCOUNT_BEFORE, ACCOUNT_AFTER))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_0022.PROCEDURE)
    op.execute(_account_privileges(ACCOUNT_AFTER, ACCOUNT_BEFORE))
    op.execute("DO $do$ BEGIN EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database()); END $do$")
    op.execute("CALL custody_apply_role_grants()")
