"""The ledger's SECURITY DEFINER functions check what their process-role caller may resolve, reverse,
close and rebuild (review R1 items 3, 4, 5, 6, 8, 9).

Revision ID: 0055_ledger_fn_hardening
Revises: 0054_ledger_privileges

Why (each with custody_api's credentials alone, after 0054):
3. `ledger_resolve_hold(p_hold, p_state, p_owner, p_now)` checked the owner only when `p_owner` was not
   NULL: the api released any hold with NULL (a withdrawal's, its coins already signed for, and the
   customer spent the same funds again); `ledger_apply`'s `replace` compared owners with `<>` (NULL
   passes; a named owner swapped a withdrawal's hold for a smaller one).
4. ... and with `p_state = 'expired'` and `p_now = 'infinity'` it expired a hold that had not timed out.
5. `ledger_post(..., p_reverses => X)` checked only that X exists and is not reversed: a one-cent
   posting between two customer accounts set `reverses_id = X` on a firm transaction (a deposit's reorg
   shortfall), and `custody.incidents` lifted the account's freeze on that marker.
6. `ledger_post` let the api debit `quarantine` into any customer account.
8. the api kept `UPDATE (closed_at)` on `account`: it closed a funded firm account (every posting to
   it refused) or re-opened a closed one; `ledger_close_account` closed any account kind.
9. `ledger_rebuild_projections` (EXCLUSIVE lock on every balance row) was EXECUTE for the process roles.

What changes (the caller is named as 0054's `ledger_post` names it: SET ROLE's role, else
`session_user`; the process roles are custody_api, custody_worker and custody_signer):
- `ledger_resolve_hold` (0009's text, 0029's planning, definer): a process role resolves only to
  `released` or `expired`, names the owner for a release (NULL refused, 42501; the expiry job names
  none: expiring a hold whose time has passed is everyone's), and its `p_now` is ignored (now()).
  custody_api names only the owners it releases for (42501 otherwise): `api:<key>` (CallerLedger),
  `matching:<symbol>` (order holds), `custody:reorg` (an operator's incident release: only while an
  unresolved reorg incident names that hold) and `withdrawals` (a request refused by policy, an
  operator's reject: only while the withdrawal holding it is requested, held, pending approval or
  approved, never once batched or signed).
- `ledger_apply` (0009's text, 0029's planning, definer): `replace` compares owners with IS DISTINCT
  FROM, and custody_api replaces only `matching:` and `api:` holds.
- `ledger_post` / `ledger_post_by` (0054's text with these edits): a reversal's legs mirror the
  original's entries exactly (its entries, in order, are the original's in reverse order with
  negated amounts; no capture), else `invalid_request`, for every caller; custody_api reverses only
  a transaction written over the API (key `api:...`) whose legs are all on customer accounts (42501),
  as `CallerLedger.reverse` allows; `transaction_not_found` / `already_reversed` keep their place.
  custody_api debits `customer` accounts only (quarantine leaves its list) and captures only
  `api:`, `matching:` and `custody:reorg` holds (a withdrawal's hold is the worker's to capture).
- `custody_release_quarantined(observation, hash, metadata)` (new, definer): an operator's release
  of a quarantined deposit: the observation must be `quarantined`, booked to quarantine under its
  own key (`deposit:<chain>:<asset>:<txid>:<index>:quarantined`) and have no return withdrawal that
  is live or paid; it posts exactly its amount from `quarantine:<asset>` into its own customer
  account under `...:release` (through `ledger_post_by` with no caller: the function is the check)
  and marks it `released`; a second call answers the first posting (`exists`).
- `ledger_close_account`: a process role closes only a customer account (42501); custody_api loses
  `UPDATE (closed_at)` on `account` (limited list: `INSERT`).
- `ledger_rebuild_projections`: EXECUTE for the owner only (`custody_apply_role_grants()` revokes it
  from PUBLIC and the process roles each time it runs).

Who can forge what (honest): custody_api still releases the holds of every API key and market by
naming their owner strings, releases a withdrawal's hold while the withdrawal is unbatched (and it can
UPDATE `withdrawal_request.state`, so it can walk a row back to `approved` first, visibly), releases a
reorg freeze while its incident is open (it can resolve incidents), and it can UPDATE
`deposit_observation.state` (0022), so it can walk a returned deposit whose return it first unlinked
back to `quarantined`. It still debits any customer account into any customer or fee account.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0055_ledger_fn_hardening"
down_revision = "0054_ledger_privileges"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0009 = _sibling("0009_ledger_apply.py")
_0049 = _sibling("0049_role_hardening.py")
_0054 = _sibling("0054_ledger_privileges.py")
_replaced = _0054._replaced

_DEFINER = _0054._DEFINER
_PLANNING = _0054._PLANNING
_CALLER = "CASE WHEN current_setting('role') <> 'none' THEN current_setting('role') ELSE session_user::text END"
_PROCESS = "('custody_api', 'custody_worker', 'custody_signer')"
_0009_SETS = ("SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off "
              "SET enable_mergejoin = off\n")


def _refuse(message: str) -> str:
    return f"RAISE EXCEPTION 'ledger: {message}', v_caller USING ERRCODE = 'insufficient_privilege';"


# ---- ledger_resolve_hold ----------------------------------------------------------------------------

_RESOLVE_0009 = _0009.HOLD_FUNCTIONS[_0009.HOLD_FUNCTIONS.index("CREATE OR REPLACE FUNCTION ledger_resolve_hold("):]
_RESOLVE_0009 = _RESOLVE_0009[: _RESOLVE_0009.index("END $$;") + len("END $$;")]

RESOLVE = _replaced(_RESOLVE_0009, _0009_SETS, f"{_PLANNING}\n{_DEFINER}\n")
RESOLVE = _replaced(RESOLVE, "    v_hold hold;\nBEGIN\n",
                    "    v_hold hold;\n"
                    f"    v_caller text := {_CALLER};  -- the process role that called (0055)\n"
                    f"    v_process boolean := v_caller IN {_PROCESS};\n"
                    "    v_now timestamptz := p_now;\n"
                    "BEGIN\n"
                    "    -- 0055: a process role releases (naming the owner) or expires (on the database's clock).\n"
                    "    IF v_process THEN\n"
                    "        v_now := now();\n"
                    "        IF p_state IS NULL OR p_state NOT IN ('released', 'expired') OR (p_owner IS NULL AND p_state <> 'expired') THEN\n"
                    "            " + _refuse("% may only release a hold naming its owner, or expire one") + "\n"
                    "        END IF;\n"
                    "        IF v_caller = 'custody_api' AND p_owner IS NOT NULL AND p_owner NOT LIKE 'api:%' AND p_owner NOT LIKE 'matching:%'\n"
                    "           AND p_owner NOT IN ('withdrawals', 'custody:reorg') THEN\n"
                    "            RAISE EXCEPTION 'ledger: % does not release holds of owner %', v_caller, p_owner\n"
                    "                USING ERRCODE = 'insufficient_privilege';\n"
                    "        END IF;\n"
                    "    END IF;\n")
RESOLVE = _replaced(RESOLVE, "v_hold.expires_at > coalesce(p_now, now())", "v_hold.expires_at > coalesce(v_now, now())")
RESOLVE = _replaced(RESOLVE, "    UPDATE account_balance b SET held = b.held - (v_hold.amount - v_hold.captured - v_hold.released)\n",
                    "    -- 0055: the api releases custody's own holds only while what they stand for still may be undone.\n"
                    "    IF v_caller = 'custody_api' AND p_state = 'released' THEN\n"
                    "        IF v_hold.owner = 'withdrawals' AND NOT EXISTS (\n"
                    "               SELECT 1 FROM withdrawal_request w\n"
                    "                WHERE w.hold_id = p_hold AND w.state IN ('requested', 'held', 'pending_approval', 'approved')) THEN\n"
                    "            " + _refuse("% releases a withdrawal''s hold only before the withdrawal is batched") + "\n"
                    "        ELSIF v_hold.owner = 'custody:reorg' AND NOT EXISTS (\n"
                    "               SELECT 1 FROM incident i\n"
                    "                WHERE i.kind = 'deposit_reorged_after_finality' AND i.resolved_at IS NULL\n"
                    "                  AND i.detail -> 'hold' ->> 'id' = p_hold::text) THEN\n"
                    "            " + _refuse("% releases a reorg freeze only by resolving its open incident") + "\n"
                    "        END IF;\n"
                    "    END IF;\n"
                    "    UPDATE account_balance b SET held = b.held - (v_hold.amount - v_hold.captured - v_hold.released)\n")
RESOLVE_DOWN = f"{_RESOLVE_0009}\nALTER FUNCTION ledger_resolve_hold(bigint, text, text, timestamp with time zone) " \
               f"RESET enable_seqscan RESET enable_hashjoin RESET enable_mergejoin SET seq_page_cost = 100 SET jit = off {_DEFINER};"

# ---- ledger_apply's replace -------------------------------------------------------------------------

APPLY = _replaced(_0009.APPLY_FUNCTION, "CREATE FUNCTION ledger_apply(", "CREATE OR REPLACE FUNCTION ledger_apply(")
APPLY = _replaced(APPLY, _0009_SETS, f"{_PLANNING}\n{_DEFINER}\n")
APPLY = _replaced(APPLY, "    c_max constant numeric := 10::numeric ^ 78 - 1;\nBEGIN\n",
                  "    c_max constant numeric := 10::numeric ^ 78 - 1;\n"
                  f"    v_caller text := {_CALLER};  -- the process role that called (0055)\n"
                  "BEGIN\n")
APPLY = _replaced(APPLY, "            IF v_available IS NULL THEN\n                status := 'account_not_found';\n",
                  "            IF v_caller = 'custody_api' AND (p_owners[i] IS NULL\n"
                  "               OR (p_owners[i] NOT LIKE 'matching:%' AND p_owners[i] NOT LIKE 'api:%')) THEN\n"
                  "                " + _refuse("% replaces only matching''s and API callers'' holds") + "\n"
                  "            END IF;\n"
                  "            IF v_available IS NULL THEN\n                status := 'account_not_found';\n")
APPLY = _replaced(APPLY, "ELSIF v_old_row.owner <> p_owners[i] THEN", "ELSIF v_old_row.owner IS DISTINCT FROM p_owners[i] THEN")
APPLY_DOWN = (_0009.APPLY_FUNCTION.replace("CREATE FUNCTION ledger_apply(", "CREATE OR REPLACE FUNCTION ledger_apply(", 1)
              + f"\nALTER FUNCTION {_0054.WRITERS[1]} RESET enable_seqscan RESET enable_hashjoin RESET enable_mergejoin "
              f"SET seq_page_cost = 100 SET jit = off {_DEFINER};")

# ---- ledger_post: reversals, quarantine, captures -----------------------------------------------------

_REVERSAL = """
    -- 4b. (0055) A reversal's legs mirror the original's entries exactly: its entries, in order, are
    --     the original's in reverse order with negated amounts, and it captures no hold. custody_api
    --     reverses only a transaction written over the API whose legs are all on customer accounts.
    IF v_status IS NULL AND p_reverses IS NOT NULL THEN
        IF v_caller = 'custody_api' AND (
               NOT EXISTS (SELECT 1 FROM journal_transaction t WHERE t.id = p_reverses AND t.idempotency_key LIKE 'api:%')
               OR EXISTS (SELECT 1 FROM journal_entry e JOIN account a ON a.id = e.account_id
                           WHERE e.transaction_id = p_reverses AND a.kind <> 'customer')) THEN
            RAISE EXCEPTION 'ledger: % reverses only a transaction written over the API between customer accounts', v_caller
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF v_captures OR (SELECT ROW(array_agg(e.account_id ORDER BY e.id DESC), array_agg(-e.amount ORDER BY e.id DESC))
                            FROM journal_entry e WHERE e.transaction_id = p_reverses)
                         IS DISTINCT FROM
                         (SELECT ROW(array_agg(l.account_id ORDER BY l.k), array_agg(l.amount ORDER BY l.k))
                            FROM (SELECT u.debit AS account_id, -u.amount AS amount, 2 * u.i - 1 AS k
                                    FROM unnest(p_debits, p_amounts) WITH ORDINALITY AS u(debit, amount, i)
                                  UNION ALL
                                  SELECT u.credit, u.amount, 2 * u.i
                                    FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)) l) THEN
            v_status := 'invalid_request';
            v_bad := 0;
        END IF;
    END IF;

"""
_API_CAPTURES = """
    -- (0055) custody_api captures only API callers', matching's and the reorg freeze's holds.
    IF v_caller = 'custody_api' AND v_captures
       AND (p_hold_owner IS NULL OR (p_hold_owner NOT LIKE 'api:%' AND p_hold_owner NOT LIKE 'matching:%'
                                     AND p_hold_owner <> 'custody:reorg')) THEN
        RAISE EXCEPTION 'ledger: % does not capture holds of owner %', v_caller, p_hold_owner
            USING ERRCODE = 'insufficient_privilege';
    END IF;
"""


def _post(source: str) -> str:
    f = _replaced(source, "('customer', 'quarantine')", "('customer')", count=2)
    f = _replaced(f, "may debit only customer and quarantine accounts", "may debit only customer accounts", count=2)
    f = _replaced(f, "    -- 5. Under the locks", _REVERSAL + "    -- 5. Under the locks")
    f = _replaced(f, "    -- 3. Captures:", _API_CAPTURES + "\n    -- 3. Captures:")
    return f


POST = _post(_0054.POST)
POST_BY = _post(_0054.POST_BY)

# ---- the release of a quarantined deposit -------------------------------------------------------------

_UNPAID_ENDS = "('rejected', 'cancelled', 'released', 'failed')"  # custody.deposits.UNPAID_ENDS
RELEASE = f"""
CREATE FUNCTION custody_release_quarantined(p_observation bigint, p_hash text, p_metadata jsonb)
RETURNS TABLE (status text, transaction_id bigint, failed_index integer)
LANGUAGE plpgsql {_DEFINER} AS $$
DECLARE
    v_obs record;
    v_key text;          -- the release's key: custody.deposits._deposit_key, then release
    v_booked text;       -- the quarantine booking's key
    v_quarantine bigint;
    v_customer bigint;
BEGIN
    SELECT o.id, o.chain, o.asset, o.txid, o.output_index, o.amount, o.account_id, o.state INTO v_obs
      FROM deposit_observation o WHERE o.id = p_observation FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'deposit_not_found'::text, NULL::bigint, NULL::integer;
        RETURN;
    END IF;
    v_key := format('deposit:%s:%s:%s:%s:release', v_obs.chain, v_obs.asset, v_obs.txid, v_obs.output_index);
    v_booked := format('deposit:%s:%s:%s:%s:quarantined', v_obs.chain, v_obs.asset, v_obs.txid, v_obs.output_index);
    IF v_obs.state = 'released' THEN
        RETURN QUERY SELECT CASE WHEN t.id IS NULL THEN 'not_quarantined' ELSE 'exists' END, t.id, NULL::integer
          FROM (VALUES (1)) one(x) LEFT JOIN journal_transaction t ON t.idempotency_key = v_key;
        RETURN;
    END IF;
    SELECT a.id INTO v_quarantine FROM account a
     WHERE a.name = 'quarantine:' || v_obs.asset AND a.kind = 'quarantine' AND a.asset = v_obs.asset;
    SELECT a.id INTO v_customer FROM account a
     WHERE a.id = v_obs.account_id AND a.kind = 'customer' AND a.asset = v_obs.asset;
    -- quarantined, booked to quarantine under its own key, never returned (a live or paid return)
    IF v_obs.state <> 'quarantined' OR v_quarantine IS NULL OR v_customer IS NULL
       OR NOT EXISTS (SELECT 1 FROM journal_transaction t JOIN journal_entry e ON e.transaction_id = t.id
                       WHERE t.idempotency_key = v_booked AND t.kind = 'deposit_quarantine'
                         AND e.account_id = v_quarantine AND e.amount = v_obs.amount)
       OR EXISTS (SELECT 1 FROM withdrawal_request w
                   WHERE w.return_of_deposit = v_obs.id AND w.state NOT IN {_UNPAID_ENDS}) THEN
        RETURN QUERY SELECT 'not_quarantined'::text, NULL::bigint, NULL::integer;
        RETURN;
    END IF;
    RETURN QUERY SELECT r.status, r.transaction_id, r.failed_index
      FROM ledger_post_by(NULL, v_key, p_hash, 'deposit_release', p_metadata,
                          ARRAY[v_quarantine], ARRAY[v_customer], ARRAY[v_obs.amount], ARRAY[NULL::bigint],
                          NULL, NULL) r;
    UPDATE deposit_observation o
       SET state = 'released', journal_transaction_id = t.id, updated_at = now()
      FROM journal_transaction t
     WHERE o.id = v_obs.id AND o.state = 'quarantined' AND t.idempotency_key = v_key;
END $$;
"""

# ---- closing accounts; the rebuild ---------------------------------------------------------------------

_CLOSE_0054 = _0054.HELPERS[_0054.HELPERS.index("CREATE FUNCTION ledger_close_account("):]
_CLOSE_0054 = _CLOSE_0054[: _CLOSE_0054.index("END $$;") + len("END $$;")].replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
CLOSE = _replaced(_CLOSE_0054, "    v_held numeric;\nBEGIN\n",
                  "    v_held numeric;\n"
                  f"    v_caller text := {_CALLER};  -- the process role that called (0055)\n"
                  "BEGIN\n"
                  f"    IF v_caller IN {_PROCESS} AND EXISTS (SELECT 1 FROM account a WHERE a.id = p_account AND a.kind <> 'customer') THEN\n"
                  "        " + _refuse("% closes only customer accounts (firm accounts are closed by the owner)") + "\n"
                  "    END IF;\n")

_END = "END $$;"
SECTION = """
    -- 0055: the projection rebuild (an EXCLUSIVE lock on every balance row) is the owner's alone.
    IF to_regprocedure('ledger_rebuild_projections()') IS NOT NULL THEN
        REVOKE EXECUTE ON FUNCTION ledger_rebuild_projections() FROM PUBLIC, custody_api, custody_worker, custody_signer;
    END IF;
"""
assert _0054.PROCEDURE.rstrip().endswith(_END)
PROCEDURE = _0054.PROCEDURE.rstrip()[: -len(_END)] + SECTION + _END + "\n"


def upgrade() -> None:
    op.execute(RESOLVE)
    op.execute(APPLY)
    op.execute(POST)
    op.execute(POST_BY)
    op.execute(RELEASE)
    op.execute(CLOSE)
    op.execute(PROCEDURE)
    op.execute(_0049.limited_privileges("account", "INSERT, UPDATE (closed_at)", "INSERT", migration="0055"))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_0049.limited_privileges("account", "INSERT", "INSERT, UPDATE (closed_at)", migration="0055"))
    op.execute(_0054.PROCEDURE)
    op.execute(_CLOSE_0054)
    op.execute("DROP FUNCTION custody_release_quarantined(bigint, text, jsonb)")
    op.execute(_0054.POST_BY)
    op.execute(_0054.POST)
    op.execute(APPLY_DOWN)
    op.execute(RESOLVE_DOWN)
    op.execute("GRANT EXECUTE ON FUNCTION ledger_rebuild_projections() TO custody_api, custody_worker")
    op.execute("CALL custody_apply_role_grants()")
