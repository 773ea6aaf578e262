"""Signed webhooks: registered endpoints and one delivery row per (endpoint, event) (issue 14).

Revision ID: 0024_webhooks
Revises: 0026_event_stream

Why: the exchange backend learned about deposits, fills and withdrawals only by polling. Outbox
events (written with the change that caused them, custody.controls.emit) are now also POSTed,
signed, to HTTP endpoints an admin registers (custody.webhooks).

What changes:
- `webhook_endpoint`: url, the event types it wants, enabled, its secret encrypted under the
  webhook key (custody.webhooks.keys) and, for a grace period after a rotation, the previous one.
  Deleting an endpoint sets `deleted_at` (its deliveries keep their history).
- `webhook_delivery`: one row per (endpoint, outbox event), unique, so a fan-out that runs twice
  makes no second delivery. State `pending` (with `next_attempt_at`), `delivered` or `dead`
  (after WEBHOOK_MAX_ATTEMPTS failures); an operator's replay makes it `pending` again.
- `outbox.webhooks_fanned_out_at`: when the webhooks job made the event's deliveries (NULL: not
  yet). It is the webhook sink's own mark, beside the log/broker dispatcher's `delivered_at`, so
  neither sink waits for the other. Events already in the outbox are marked as done now (no
  endpoint existed to receive them), through a constant default that is then dropped.

custody_api (0022's lists, redefined here with the two new tables): the api process serves the
admin routes, so it may INSERT endpoints and UPDATE their types, description, enabled flag,
secrets and deletion mark (never the URL: a new URL is a new endpoint), and UPDATE a delivery's
state, attempts and next attempt (replay). It never inserts a delivery: the fan-out is the
worker's.
"""
from alembic import op

revision = "0024_webhooks"
down_revision = "0026_event_stream"
branch_labels = None
depends_on = None

TABLES = """
CREATE TABLE webhook_endpoint (
    id                          bigserial PRIMARY KEY,
    url                         text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    description                 text NOT NULL DEFAULT '' CHECK (length(description) <= 500),
    event_types                 text[] NOT NULL CHECK (cardinality(event_types) BETWEEN 1 AND 100),
    enabled                     boolean NOT NULL DEFAULT true,
    secret_enc                  bytea NOT NULL,
    previous_secret_enc         bytea,
    previous_secret_expires_at  timestamptz,
    created_by                  text NOT NULL,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    deleted_at                  timestamptz,
    CHECK ((previous_secret_enc IS NULL) = (previous_secret_expires_at IS NULL))
);

CREATE TABLE webhook_delivery (
    id               bigserial PRIMARY KEY,
    endpoint_id      bigint NOT NULL REFERENCES webhook_endpoint (id),
    outbox_id        bigint NOT NULL REFERENCES outbox (id),
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    UNIQUE (endpoint_id, outbox_id)
);
CREATE INDEX webhook_delivery_due ON webhook_delivery (next_attempt_at, id) WHERE state = 'pending';
CREATE INDEX webhook_delivery_by_endpoint ON webhook_delivery (endpoint_id, state, id);

ALTER TABLE outbox ADD COLUMN webhooks_fanned_out_at timestamptz DEFAULT now();
ALTER TABLE outbox ALTER COLUMN webhooks_fanned_out_at DROP DEFAULT;
CREATE INDEX outbox_webhooks_pending ON outbox (id) WHERE webhooks_fanned_out_at IS NULL;
"""

READ_ONLY = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', "
             "'eth_nonce', 'matching_snapshot', 'btc_wallet_output'")  # 0022's, plus 0023's wallet index

# 0022's list as 0026 left it (outbox_aggregate added)
LIMITED_0026 = """
        ('wallet', 'UPDATE (next_index)'),
        ('wallet_utxo', 'UPDATE (reserved_by, rebalance_id)'),
        ('deposit_address', 'INSERT'),
        ('deposit_observation', 'UPDATE (state, updated_at, journal_transaction_id, return_withdrawal_id)'),
        ('withdrawal_batch', 'UPDATE (state, containment, updated_at)'),
        ('batch_output', 'DELETE'),
        ('sweep', 'UPDATE (containment, updated_at)'),
        ('rebalance', 'INSERT, UPDATE (state, containment, updated_at)'),
        ('reconciliation_line', 'INSERT, UPDATE'),
        ('reserve_report', 'INSERT'),
        ('reserve_leaf', 'INSERT'),
        ('audit_event', 'INSERT'),
        ('approval', 'INSERT'),
        ('outbox', 'INSERT'),
        ('outbox_aggregate', 'INSERT, UPDATE'),
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
        ('allowlist_entry', 'INSERT, UPDATE, DELETE')"""

LIMITED_0024 = LIMITED_0026 + """,
        ('webhook_endpoint', 'INSERT, UPDATE (description, event_types, enabled, secret_enc, previous_secret_enc, previous_secret_expires_at, updated_at, deleted_at)'),
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)')"""


def _lists(limited: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY[{READ_ONLY}]::text[] $$;

CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {limited}
    $$;
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(_lists(LIMITED_0024))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_lists(LIMITED_0026))
    op.execute("DROP TABLE webhook_delivery; DROP TABLE webhook_endpoint;")
    op.execute("DROP INDEX outbox_webhooks_pending; ALTER TABLE outbox DROP COLUMN webhooks_fanned_out_at;")
    op.execute("CALL custody_apply_role_grants()")
