"""Proof of reserves published by the worker: a report is requested, then built off the request path.

Revision ID: 0043_reserves_jobs
Revises: 0038_treasury_tiers

Why (issue 16): `POST /v1/reserves/reports` built and stored the reports inside the request (about
five minutes for 1,000,000 accounts), so the api role wrote the leaves, the nodes and the report
itself. Now the api only records a request; the worker's `reserves` job (custody.jobs) builds the
reports, records its progress, and publishes them in one transaction.

What changes:
- `reserve_job`: one row per requested report; its `id` IS the report's id (`reserve_report.id`
  references it). `request_key` (the caller's namespaced idempotency key) groups the reports of one
  request, built from one ledger snapshot. `state` building -> published | failed (trigger
  `reserve_job_guard`: a row is inserted `building` with no progress; only building rows change;
  `published` needs the report row, which only the worker can write, in the same transaction);
  `leaves_built` / `leaves_total` the progress of the current attempt, `attempts`, `error_code`,
  `error` (the last attempt's failure). The api INSERTs (the request); the worker UPDATEs.
- `reserve_report`, `reserve_leaf`, `reserve_node` move to custody_api's read-only list: the api
  can no longer write a report, a leaf or a node, nor mark one published (its role has no UPDATE
  on `reserve_job`). Every existing report gets its `reserve_job` row (published), and
  `reserve_job_id_seq` starts past the newest report id.
- The role lists, written out in full below: LIMITED_0043 (0038's, without reserve_report,
  reserve_leaf, reserve_node; with `('reserve_job', 'INSERT')`), READ_ONLY_0043 (0038's plus the
  three report tables).

What a compromised api could still do: request reports (work for the worker, no money moved); it
cannot forge a published report, a progress figure or a leaf. A database writer with the worker's
role could write a report row, leaf or node: as before, a customer's verifier recomputes the root
from their own leaves and checks every signature, so a forged row fails the check, never passes.
"""
from alembic import op

revision = "0043_reserves_jobs"
down_revision = "0041_eth_sweep_fixes"
branch_labels = None
depends_on = None

# 0039's custody_api_limited_tables() (LIMITED_0039 there: 0038's with the console's activation columns), written out in full, without the report
# tables (the worker's now) and with reserve_job (the request).
LIMITED_0043 = """
        ('wallet', 'UPDATE (next_index)'),
        ('wallet_utxo', 'UPDATE (reserved_by, rebalance_id)'),
        ('deposit_address', 'INSERT'),
        ('deposit_observation', 'UPDATE (state, updated_at, journal_transaction_id, return_withdrawal_id)'),
        ('withdrawal_batch', 'UPDATE (state, containment, updated_at)'),
        ('batch_output', 'DELETE'),
        ('sweep', 'UPDATE (containment, updated_at)'),
        ('rebalance', 'INSERT, UPDATE (state, containment, updated_at, txid, raw, fee)'),
        ('rebalance_input', 'INSERT'),
        ('rebalance_approval', 'INSERT'),
        ('reconciliation_line', 'INSERT, UPDATE'),
        ('reserve_job', 'INSERT'),
        ('audit_event', 'INSERT'),
        ('approval', 'INSERT'),
        ('policy_decision', 'INSERT'),
        ('treasury_adjustment_vote', 'INSERT'),
        ('market', 'INSERT'),
        ('matching_command', 'INSERT'),
        ('fill', 'INSERT'),
        ('account', 'INSERT, UPDATE'),
        ('account_balance', 'INSERT, UPDATE'),
        ('asset', 'INSERT'),
        ('hold', 'INSERT, UPDATE'),
        ('journal_transaction', 'INSERT'),
        ('journal_entry', 'INSERT'),
        ('withdrawal_request', 'INSERT, UPDATE'),
        ('allowlist_change', 'INSERT, UPDATE'),
        ('allowlist_policy', 'INSERT, UPDATE'),
        ('treasury_adjustment', 'INSERT, UPDATE'),
        ('incident', 'INSERT, UPDATE'),
        ('control_flag', 'INSERT, UPDATE'),
        ('trade_order', 'INSERT, UPDATE'),
        ('allowlist_entry', 'INSERT, UPDATE, DELETE'),
        ('webhook_endpoint', 'INSERT, UPDATE (description, event_types, enabled, secret_enc, previous_secret_enc, previous_secret_expires_at, updated_at, deleted_at)'),
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)'),
        ('convert_price', 'INSERT, UPDATE'),
        ('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at, activation_key_id, activation_signature, activation_authenticator_data, activation_client_data)'),
        ('console_challenge', 'INSERT, UPDATE (used_at), DELETE'),
        ('console_session', 'INSERT, UPDATE (last_seen_at, ended_at, ended_reason)')"""
assert "reserve_report" not in LIMITED_0043 and "reserve_leaf" not in LIMITED_0043

# 0038's custody_api_read_only_tables() (READ_ONLY_0038 there), written out in full, plus the report tables.
READ_ONLY_0043 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output', 'deposit_address_check', 'node_view_health', "
                  "'outbox', 'outbox_aggregate', 'convert_quote', 'eth_sweep', 'eth_gas_funding', 'firm_tx_version', "
                  "'reserve_report', 'reserve_leaf', 'reserve_node'")

UPGRADE = """
CREATE TABLE reserve_job (
    id            bigserial PRIMARY KEY,          -- the report's id once published
    request_key   text NOT NULL,                  -- the caller's idempotency key (namespaced)
    asset         text NOT NULL REFERENCES asset(code),
    requested_by  text NOT NULL,
    state         text NOT NULL DEFAULT 'building' CHECK (state IN ('building', 'published', 'failed')),
    leaves_built  bigint NOT NULL DEFAULT 0 CHECK (leaves_built >= 0),
    leaves_total  bigint CHECK (leaves_total >= 0),
    attempts      integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    error_code    text,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    UNIQUE (request_key, asset),
    CHECK ((state = 'published') = (published_at IS NOT NULL))
);
CREATE INDEX reserve_job_building ON reserve_job (id) WHERE state = 'building';

-- every report published before this migration: its job, published
INSERT INTO reserve_job (id, request_key, asset, requested_by, state, leaves_built, leaves_total, created_at, updated_at,
                         published_at)
    SELECT r.id, 'migrated:0043:' || r.id, r.asset, 'before-0043', 'published',
           (SELECT count(*) FROM reserve_leaf l WHERE l.report_id = r.id), (SELECT count(*) FROM reserve_leaf l WHERE l.report_id = r.id),
           r.created_at, r.created_at, r.created_at
    FROM reserve_report r ORDER BY r.id;
SELECT setval('reserve_job_id_seq', greatest((SELECT max(id) FROM reserve_report), (SELECT max(id) FROM reserve_job), 0) + 1, false);
ALTER TABLE reserve_report ADD CONSTRAINT reserve_report_job FOREIGN KEY (id) REFERENCES reserve_job(id);

-- A request is inserted building with no progress; only a building row changes; published needs its report.
CREATE FUNCTION reserve_job_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'building' OR NEW.leaves_built <> 0 OR NEW.attempts <> 0 OR NEW.published_at IS NOT NULL THEN
            RAISE EXCEPTION 'reserve_job %: a request starts building, with no progress', NEW.id USING ERRCODE = '23514';
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.state <> 'building' THEN
        RAISE EXCEPTION 'reserve_job %: it is % already', OLD.id, OLD.state USING ERRCODE = '23514';
    END IF;
    IF (NEW.id, NEW.request_key, NEW.asset, NEW.requested_by, NEW.created_at)
       IS DISTINCT FROM (OLD.id, OLD.request_key, OLD.asset, OLD.requested_by, OLD.created_at) THEN
        RAISE EXCEPTION 'reserve_job %: the request itself never changes', OLD.id USING ERRCODE = '23514';
    END IF;
    IF NEW.state = 'published' AND NOT EXISTS (SELECT 1 FROM reserve_report WHERE id = NEW.id) THEN
        RAISE EXCEPTION 'reserve_job %: published without its report', OLD.id USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER reserve_job_guard BEFORE INSERT OR UPDATE ON reserve_job FOR EACH ROW EXECUTE FUNCTION reserve_job_guard();
CREATE TRIGGER reserve_job_no_delete BEFORE DELETE ON reserve_job FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def _read_only(tables: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{tables}]::text[] $$;")


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_limited(LIMITED_0043))
    op.execute(_read_only(READ_ONLY_0043))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    raise NotImplementedError("reserve requests and their reports are not downgraded")
