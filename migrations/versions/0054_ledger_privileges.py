"""No process role writes the ledger's tables except through the ledger's own functions, and
`ledger_post` refuses custody_api a debit it never makes (the lead's brief H4).

Revision ID: 0054_ledger_privileges
Revises: 0053_set_based_order_events

Why: custody_api held INSERT, UPDATE on `account_balance` and `hold` and INSERT on `journal_transaction`
and `journal_entry` (0022: "the ledger's functions run as the caller"); custody_worker every write.
With the api's credentials alone (the internet-facing process):
1. `UPDATE account_balance SET posted = posted + 10^12` on its own customer account minted money that
   postings and withdrawals then spent (the projection is what `ledger_post` checks);
2. a balanced journal transaction, by hand or through `ledger_post` (SECURITY INVOKER, no caller
   check), debiting equity, an asset location, suspense or network fees (accounts that may go
   negative: money from nothing) and crediting its own customer account;
3. an UPDATE of a `hold`: someone's hold released, its amount, account or owner changed.
The worker could do 1 and 3 as well.

What changes:
- `custody_ledger_tables()` (new list): `account_balance`, `hold`, `journal_entry`,
  `journal_transaction`. `custody_apply_role_grants()` (0049's body, one section added at its end)
  revokes INSERT, UPDATE, DELETE on them and USAGE, UPDATE on their sequences from custody_api and
  custody_worker each time it runs; custody_api's lists move the four from its limited list to its
  read-only one. `account` and `asset` keep their grants (0049/0052: opening accounts and assets).
- The ledger's writers run as the tables' owner, `SECURITY DEFINER SET search_path = public, pg_temp`
  (their other SET clauses kept): `ledger_post`, `ledger_apply`, `ledger_place_hold`,
  `ledger_resolve_hold`. What the Python ledger did with table privileges is now a function of the
  same kind: `ledger_open_balances` (an account's zero balance rows; `Ledger.open_account`),
  `ledger_close_account` (lock, check empty, close; `close_account`), `ledger_lock_available`
  (`lock_available`: FOR UPDATE needs UPDATE), `ledger_share_balance` (`statement`'s FOR SHARE),
  `ledger_reserve_hold_ids` (nextval of the holds' sequence), `ledger_rebuild_projections`. None can
  move money: each creates zero rows, locks, or sets the projection to what the journal says.
- `ledger_post` names its caller: `current_setting('role')` when a session SET ROLE (the tests), else
  `session_user` (deployment), as `custody_called_by_service_role()` (0031). For custody_api, on the
  account rows it already reads (one-transfer path: the two it selects; general path: its per-account
  loop, net effect per account), it refuses (42501) a net debit of any kind but `customer` and
  `quarantine` (operators' release of a quarantined deposit), except a debit of a kind that may go
  negative (equity, asset location, suspense, network fees) in a posting that credits only such
  kinds (`POST /v1/treasury/hot-funding`: hot location -> equity). So the api never debits
  liquidity, fee income, in-flight or dust, and never moves a firm source into a customer account.
- `ledger_post_by(caller, ...)`: the same body with the caller given, EXECUTE for no process role;
  `convert_accept` (SECURITY DEFINER, 0033) calls it with NULL: its liquidity legs are its own checked
  quote's. Both are generated here from 0010's text, so a later change of one changes both.
- The liquidity guard (0048) fired `WHEN current_user IN (custody_api, custody_worker)`, which is the
  owner inside a definer function: `ledger_post` now names its caller in `ledger.posting_caller`
  (transaction-local, set in the statement that writes the entries, as `ledger.entries_written_by`),
  and the guard's function returns at once unless that is a process role. A process role cannot set
  it for an INSERT of its own: it may not INSERT into the journal at all.

Who can forge what (honest): custody_api still places a hold on any account and releases or captures
any hold whose owner string it names (`ledger_resolve_hold` takes the owner as a parameter; the owner
strings are readable), and through captures and postings still debits any customer account into any
customer or fee account; it still opens accounts (0052) and assets. The worker keeps every kind.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0054_ledger_privileges"
down_revision = "0053_set_based_order_events"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0010 = _sibling("0010_posting_fast_path.py")
_0022 = _sibling("0022_api_role_narrowed.py")
_0033 = _sibling("0033_convert.py")
_0040 = _sibling("0040_convert_fixes.py")
_0048 = _sibling("0048_set_based_triggers.py")
_0049 = _sibling("0049_role_hardening.py")
_0051 = _sibling("0051_adjustment_signatures.py")

LEDGER_TABLES = ("account_balance", "hold", "journal_entry", "journal_transaction")
_DEFINER = "SECURITY DEFINER SET search_path = public, pg_temp"
_PLANNING = "SET plan_cache_mode = force_generic_plan SET seq_page_cost = 100 SET jit = off"  # 0029's, kept
_POST_ARGS = "text, text, text, jsonb, bigint[], bigint[], numeric[], bigint[], text, bigint"
WRITERS = (
    f"ledger_post({_POST_ARGS})",
    "ledger_apply(text[], text[], text[], bigint[], numeric[], text[], text[], bigint[], bigint[], jsonb, integer[], "
    "integer[], bigint[], bigint[], numeric[], bigint[])",
    "ledger_place_hold(text, text, bigint, numeric, text, text, timestamp with time zone, bigint)",
    "ledger_resolve_hold(bigint, text, text, timestamp with time zone)",
)


def _replaced(source: str, old: str, new: str, count: int = 1) -> str:
    assert source.count(old) == count, (old, source.count(old))
    return source.replace(old, new)


# ---- grants ----------------------------------------------------------------------------------------

LEDGER_LIST = """
CREATE FUNCTION custody_ledger_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['account_balance', 'hold', 'journal_entry', 'journal_transaction']::text[] $$;
"""

_END = "END $$;"
LEDGER_SECTION = f"""
    -- The ledger's tables (0054): written by the ledger's SECURITY DEFINER functions only, whatever
    -- the lists above say; their sequences are the functions' too (ledger_reserve_hold_ids).
    SELECT min(s) INTO v_missing FROM unnest(custody_ledger_tables()) s
     WHERE to_regclass(format('public.%I', s)) IS NULL OR s = ANY (v_signer);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'custody_ledger_tables() names %, which is not a table in public or is the signer''s', v_missing;
    END IF;
    FOR t IN SELECT s AS relname FROM unnest(custody_ledger_tables()) s LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON public.%I FROM custody_api, custody_worker', t.relname);
    END LOOP;
    FOR t IN SELECT s.relname FROM pg_depend d
               JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
               JOIN pg_class c ON c.oid = d.refobjid
              WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                AND d.deptype IN ('a', 'i') AND c.relnamespace = 'public'::regnamespace
                AND c.relname = ANY (custody_ledger_tables()) LOOP
        EXECUTE format('REVOKE USAGE, UPDATE ON SEQUENCE public.%I FROM custody_api, custody_worker', t.relname);
    END LOOP;
    -- ... and ledger_post_by (a caller named by the ledger's own functions) is theirs alone.
    IF to_regprocedure('ledger_post_by(text, {_POST_ARGS})') IS NOT NULL THEN
        REVOKE EXECUTE ON FUNCTION ledger_post_by(text, {_POST_ARGS}) FROM PUBLIC, custody_api, custody_worker, custody_signer;
    END IF;
"""
assert _0049.PROCEDURE.rstrip().endswith(_END)
PROCEDURE = _0049.PROCEDURE.rstrip()[: -len(_END)] + LEDGER_SECTION + _END + "\n"


def _api_lists(to_read_only: bool) -> str:
    """custody_api's lists, rewritten from the database's own: the ledger's tables moved from the
    limited list to the read-only one (or back, with 0022's privileges)."""
    tables = ", ".join(f"'{t}'" for t in LEDGER_TABLES)
    if to_read_only:
        limited = f"SELECT relation, privileges, n FROM custody_api_limited_tables() WITH ORDINALITY AS l(relation, privileges, n) WHERE relation NOT IN ({tables})"
        read_only = f"custody_api_read_only_tables() || ARRAY[{tables}]"
    else:
        back = " UNION ALL ".join(f"SELECT '{t}', '{p}', {1000000 + i}" for i, (t, p) in enumerate(
            (("account_balance", "INSERT, UPDATE"), ("hold", "INSERT, UPDATE"), ("journal_transaction", "INSERT"),
             ("journal_entry", "INSERT"))))
        limited = f"SELECT relation, privileges, n FROM custody_api_limited_tables() WITH ORDINALITY AS l(relation, privileges, n) UNION ALL {back}"
        read_only = "custody_api_read_only_tables()"
        for t in LEDGER_TABLES:
            read_only = f"array_remove({read_only}, '{t}')"
    return _0040._set_limited(limited) + _0040._set_read_only(read_only)


# ---- ledger_post, with its caller -------------------------------------------------------------------

_SOURCES = "('equity', 'asset_location', 'suspense', 'network_fee_expense')"  # kinds that may go negative
_API_DEBITS = "('customer', 'quarantine')"
_REFUSAL = (
    "RAISE EXCEPTION 'ledger: % may debit only customer and quarantine accounts, and an account that may go negative "
    "only into another such account (not %)', v_caller, {what} USING ERRCODE = 'insufficient_privilege';"
)
_CALLER = "CASE WHEN current_setting('role') <> 'none' THEN current_setting('role') ELSE session_user::text END"


def _post_function(name: str, caller_param: bool) -> str:
    f = _0010.POST_FUNCTION
    f = _replaced(f, "CREATE OR REPLACE FUNCTION ledger_post(\n    p_key text,",
                  f"CREATE OR REPLACE FUNCTION {name}(\n    " + ("p_caller text, " if caller_param else "") + "p_key text,")
    f = _replaced(f, "SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off "
                     "SET enable_mergejoin = off\n", f"{_PLANNING}\n{_DEFINER}\n")
    f = _replaced(f, "    v_start integer := pg_backend_pid();\n",
                  "    v_start integer := pg_backend_pid();\n"
                  f"    v_caller text := {'p_caller' if caller_param else _CALLER};  -- the process role that called (0054)\n"
                  "    v_api_source boolean := false;   -- custody_api: an account that may go negative is debited\n"
                  "    v_api_credit boolean := false;   -- ... and one that may not is credited\n"
                  "    v_api_refused text;              -- ... or a kind it never debits is\n")
    # One-transfer path: the kinds of the two account rows it reads.
    f = _replaced(f, "        SELECT a.asset, a.may_go_negative, a.closed_at",
                  "        SELECT a.asset, a.kind, a.may_go_negative, a.closed_at")
    f = _replaced(f, "        SELECT a.asset, a.may_go_positive, a.closed_at",
                  "        SELECT a.asset, a.kind, a.may_go_positive, a.closed_at")
    f = _replaced(f, "        IF v_debit.plain AND v_credit.plain AND v_debit.asset = v_credit.asset THEN\n",
                  "        IF v_debit.plain AND v_credit.plain AND v_debit.asset = v_credit.asset THEN\n"
                  f"            IF v_caller = 'custody_api' AND v_debit.kind NOT IN {_API_DEBITS}\n"
                  f"               AND (v_debit.kind NOT IN {_SOURCES} OR v_credit.kind NOT IN {_SOURCES}) THEN\n"
                  "                " + _REFUSAL.format(what="v_debit.kind || ' into ' || v_credit.kind") + "\n"
                  "            END IF;\n")
    # General path: each account's net effect, in the loop over the account rows.
    f = _replaced(f, "                    a.asset, a.may_go_negative, a.may_go_positive, coalesce(a.balance_shards, 1) AS shards,",
                  "                    a.asset, a.kind, a.may_go_negative, a.may_go_positive, coalesce(a.balance_shards, 1) AS shards,")
    f = _replaced(f, "        v_all_whole := v_all_whole AND v_whole[n];\n",
                  "        v_all_whole := v_all_whole AND v_whole[n];\n"
                  "        IF v_caller = 'custody_api' THEN\n"
                  f"            IF rec.delta < 0 AND rec.kind NOT IN {_API_DEBITS} THEN\n"
                  f"                IF rec.kind IN {_SOURCES} THEN\n"
                  "                    v_api_source := true;\n"
                  "                ELSE\n"
                  "                    v_api_refused := coalesce(v_api_refused, rec.kind);\n"
                  "                END IF;\n"
                  f"            ELSIF rec.delta > 0 AND rec.kind NOT IN {_SOURCES} THEN\n"
                  "                v_api_credit := true;\n"
                  "            END IF;\n"
                  "        END IF;\n")
    f = _replaced(f, "    IF n = 0 THEN  -- no transfers at all\n",
                  "    IF v_api_refused IS NOT NULL OR (v_api_source AND v_api_credit) THEN\n"
                  "        " + _REFUSAL.format(what="coalesce(v_api_refused, 'a firm source into a customer')") + "\n"
                  "    END IF;\n"
                  "    IF n = 0 THEN  -- no transfers at all\n")
    # Both writes name the caller to the liquidity guard, in the statement that writes the entries.
    f = _replaced(f, "RETURNING j.id, set_config('ledger.entries_written_by', j.id::text, true) AS named\n",
                  "RETURNING j.id, set_config('ledger.entries_written_by', j.id::text, true) AS named,\n"
                  "                          set_config('ledger.posting_caller', coalesce(v_caller, ''), true) AS caller\n",
                  count=2)
    return f


POST = _post_function("ledger_post", caller_param=False)
POST_BY = _post_function("ledger_post_by", caller_param=True)
POST_0010 = _0010.POST_FUNCTION  # its SET clauses are 0010's: the downgrade sets 0029's again

_ACCEPT_0033 = _0033.UPGRADE[_0033.UPGRADE.index("CREATE FUNCTION convert_accept("):]
_ACCEPT_0033 = _ACCEPT_0033[: _ACCEPT_0033.index("END $$;") + len("END $$;")].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
ACCEPT = _replaced(_ACCEPT_0033, "FROM ledger_post(v_key,", "FROM ledger_post_by(NULL, v_key,")

# ---- the liquidity guard, on the named caller ----------------------------------------------------

# 0051's guard (the api never debits liquidity; the worker only by an approved adjustment's exact
# legs), with the caller that ledger_post names instead of current_user (the owner in a definer).
_GUARD_0051 = _0051.LIQUIDITY_GUARD
_CALLER = "current_setting('ledger.posting_caller', true)"
GUARD = _replaced(_GUARD_0051, "BEGIN\n",
                  "BEGIN\n"
                  "    -- 0054: the ledger's functions write as the owner and name their caller (ledger_post)\n"
                  f"    IF coalesce({_CALLER}, '') NOT IN ('custody_api', 'custody_worker') THEN\n"
                  "        RETURN NULL;\n"
                  "    END IF;\n")
GUARD = _replaced(GUARD, "IF current_user = 'custody_worker' THEN", f"IF {_CALLER} = 'custody_worker' THEN")
GUARD = _replaced(GUARD, "approved treasury adjustment', current_user\n",
                  f"approved treasury adjustment', {_CALLER}\n")
GUARD_TRIGGER = """
DROP TRIGGER journal_entry_liquidity_guard ON journal_entry;
CREATE TRIGGER journal_entry_liquidity_guard AFTER INSERT ON journal_entry REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION convert_guard_liquidity_debits();
"""
GUARD_TRIGGER_0048 = """
DROP TRIGGER journal_entry_liquidity_guard ON journal_entry;
CREATE TRIGGER journal_entry_liquidity_guard AFTER INSERT ON journal_entry REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (current_user IN ('custody_api', 'custody_worker'))
    EXECUTE FUNCTION convert_guard_liquidity_debits();
"""

# ---- what the Python ledger did with table privileges ---------------------------------------------

HELPERS = f"""
CREATE FUNCTION ledger_open_balances(p_account bigint) RETURNS void
LANGUAGE sql {_DEFINER} AS $$
    INSERT INTO account_balance (account_id, shard)
    SELECT a.id, s FROM account a, generate_series(0, a.balance_shards - 1) s WHERE a.id = p_account
    ON CONFLICT (account_id, shard) DO NOTHING
$$;

CREATE FUNCTION ledger_close_account(p_account bigint)
RETURNS TABLE (found boolean, posted numeric, held numeric)
LANGUAGE plpgsql {_DEFINER} AS $$
DECLARE
    v_found boolean;
    v_posted numeric;
    v_held numeric;
BEGIN
    -- every shard locked in shard order (the postings' order), then their sum
    SELECT count(*) > 0, coalesce(sum(b.posted), 0), coalesce(sum(b.held), 0) INTO v_found, v_posted, v_held
      FROM (SELECT s.posted, s.held FROM account_balance s WHERE s.account_id = p_account ORDER BY s.shard FOR UPDATE) b;
    IF v_found AND v_posted = 0 AND v_held = 0 THEN
        UPDATE account SET closed_at = now() WHERE id = p_account AND closed_at IS NULL;
        IF FOUND THEN
            -- a new version of the locked rows (same values): a posting at REPEATABLE READ or
            -- SERIALIZABLE that waited for them fails to serialize instead of missing the close
            UPDATE account_balance SET last_transaction_id = last_transaction_id WHERE account_id = p_account;
        END IF;
    END IF;
    RETURN QUERY SELECT v_found, v_posted, v_held;
END $$;

CREATE FUNCTION ledger_lock_available(p_accounts bigint[])
RETURNS TABLE (account_id bigint, available numeric, may_go_negative boolean, closed boolean)
LANGUAGE sql {_DEFINER} AS $$
    SELECT b.account_id, b.posted - b.held, a.may_go_negative, a.closed_at IS NOT NULL
      FROM (SELECT s.account_id, sum(s.posted) AS posted, sum(s.held) AS held
              FROM (SELECT l.account_id, l.posted, l.held FROM account_balance l WHERE l.account_id = ANY (p_accounts)
                     ORDER BY l.account_id, l.shard FOR UPDATE) s GROUP BY s.account_id) b
      JOIN account a ON a.id = b.account_id
$$;

CREATE FUNCTION ledger_share_balance(p_account bigint) RETURNS void
LANGUAGE sql {_DEFINER} AS $$
    SELECT 1 FROM account_balance WHERE account_id = p_account ORDER BY shard FOR SHARE
$$;

CREATE FUNCTION ledger_reserve_hold_ids(p_count integer) RETURNS SETOF bigint
LANGUAGE sql {_DEFINER} AS $$
    SELECT nextval('hold_id_seq') FROM generate_series(1, least(greatest(p_count, 0), 10000))
$$;

CREATE FUNCTION ledger_rebuild_projections() RETURNS integer
LANGUAGE plpgsql {_DEFINER} AS $$
DECLARE
    v_repaired bigint[];
    v_more bigint[];
BEGIN
    LOCK TABLE account_balance IN EXCLUSIVE MODE;
    WITH added AS (
        INSERT INTO account_balance (account_id, shard)
        SELECT a.id, s FROM account a, generate_series(0, a.balance_shards - 1) s
        ON CONFLICT (account_id, shard) DO NOTHING RETURNING account_id)
    SELECT coalesce(array_agg(account_id), '{{}}') INTO v_repaired FROM added;
    WITH truth AS (
           SELECT a.id,
                  coalesce((SELECT sum(amount) FROM journal_entry e WHERE e.account_id = a.id), 0) AS posted,
                  coalesce((SELECT sum(amount - captured - released) FROM hold h
                             WHERE h.account_id = a.id AND h.state = 'pending'), 0) AS held,
                  coalesce((SELECT max(transaction_id) FROM journal_entry e WHERE e.account_id = a.id), 0) AS last_tx
             FROM account a),
         stored AS (
           SELECT account_id, sum(posted) AS posted, sum(held) AS held,
                  max(last_transaction_id) AS last_tx, bool_or(shard > 0 AND held <> 0) AS stray_held
             FROM account_balance GROUP BY account_id),
         bad AS (
           SELECT t.* FROM truth t JOIN stored s ON s.account_id = t.id
            WHERE (s.posted, s.held, s.last_tx) IS DISTINCT FROM (t.posted, t.held, t.last_tx) OR s.stray_held),
         fixed AS (
           UPDATE account_balance b
              SET posted = CASE WHEN b.shard = 0 THEN bad.posted ELSE 0 END,
                  held = CASE WHEN b.shard = 0 THEN bad.held ELSE 0 END,
                  last_transaction_id = CASE WHEN b.shard = 0 THEN bad.last_tx ELSE 0 END
             FROM bad WHERE b.account_id = bad.id
           RETURNING b.account_id)
    SELECT coalesce(array_agg(account_id), '{{}}') INTO v_more FROM fixed;
    RETURN (SELECT count(DISTINCT x) FROM unnest(v_repaired || v_more) x);
END $$;
"""
HELPERS_DOWN = """
DROP FUNCTION ledger_open_balances(bigint);
DROP FUNCTION ledger_close_account(bigint);
DROP FUNCTION ledger_lock_available(bigint[]);
DROP FUNCTION ledger_share_balance(bigint);
DROP FUNCTION ledger_reserve_hold_ids(integer);
DROP FUNCTION ledger_rebuild_projections();
"""


def upgrade() -> None:
    op.execute(LEDGER_LIST)
    op.execute(PROCEDURE)
    op.execute(_api_lists(to_read_only=True))
    op.execute(POST)
    op.execute(POST_BY)
    op.execute(ACCEPT)
    for function in WRITERS[1:]:
        op.execute(f"ALTER FUNCTION {function} {_DEFINER}")
    op.execute(GUARD)
    op.execute(GUARD_TRIGGER)
    op.execute(HELPERS)
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(HELPERS_DOWN)
    op.execute(GUARD_TRIGGER_0048)
    op.execute(_GUARD_0051)
    for function in WRITERS[1:]:
        op.execute(f"ALTER FUNCTION {function} SECURITY INVOKER RESET search_path")
    op.execute(_ACCEPT_0033)
    op.execute(f"DROP FUNCTION ledger_post_by(text, {_POST_ARGS})")
    op.execute(POST_0010)
    op.execute(f"ALTER FUNCTION {WRITERS[0]} SECURITY INVOKER RESET search_path RESET enable_seqscan "
               "RESET enable_hashjoin RESET enable_mergejoin SET seq_page_cost = 100 SET jit = off")
    op.execute(_api_lists(to_read_only=False))
    op.execute(_0049.PROCEDURE)
    op.execute("DROP FUNCTION custody_ledger_tables()")
    op.execute("CALL custody_apply_role_grants()")
