"""Withdrawals: requests, policy decisions, approvals, batches, chain transactions, hot-wallet coins.

Revision ID: 0005_withdrawals
Revises: 0004_matching
"""
from alembic import op

revision = "0005_withdrawals"
down_revision = "0004_matching"
branch_labels = None
depends_on = None

SQL = """
ALTER TABLE chain_asset
    ADD COLUMN min_withdrawal      numeric(78,0) NOT NULL DEFAULT 1 CHECK (min_withdrawal > 0),
    ADD COLUMN withdrawal_fee      numeric(78,0) NOT NULL DEFAULT 0 CHECK (withdrawal_fee >= 0),
    ADD COLUMN withdrawal_fee_fast numeric(78,0) NOT NULL DEFAULT 0 CHECK (withdrawal_fee_fast >= 0);

-- Operational: one customer withdrawal. States in custody/states.py (WITHDRAWAL_TRANSITIONS).
CREATE TABLE withdrawal_request (
    id                    bigserial PRIMARY KEY,
    client_withdrawal_id  text NOT NULL CHECK (length(client_withdrawal_id) BETWEEN 1 AND 200),
    account_id            bigint NOT NULL REFERENCES account(id),
    asset                 text NOT NULL REFERENCES asset(code),
    chain                 text NOT NULL,
    amount                numeric(78,0) NOT NULL CHECK (amount > 0),
    fee_quoted            numeric(78,0) NOT NULL CHECK (fee_quoted >= 0),
    destination           text NOT NULL,
    destination_script    bytea,  -- bitcoin: the output script, resolved once when the request is validated
    priority              text NOT NULL CHECK (priority IN ('normal', 'fast')),
    requested_by          text NOT NULL,
    content_hash          text NOT NULL,
    state                 text NOT NULL,
    hold_id               bigint REFERENCES hold(id),
    decision_id           bigint,
    batch_id              bigint,
    reject_reasons        text[] NOT NULL DEFAULT '{}',
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, client_withdrawal_id)
);
CREATE INDEX withdrawal_request_state ON withdrawal_request (state, asset, id);

-- Append-only: every policy evaluation, with the rule version, inputs, outcome and reasons.
CREATE TABLE policy_decision (
    id                  bigserial PRIMARY KEY,
    withdrawal_id       bigint NOT NULL REFERENCES withdrawal_request(id),
    outcome             text NOT NULL CHECK (outcome IN ('approve', 'needs_approval', 'reject')),
    required_approvals  integer NOT NULL,
    reasons             text[] NOT NULL,
    policy_version      text NOT NULL,
    record              jsonb NOT NULL,
    decided_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL
);
ALTER TABLE withdrawal_request ADD FOREIGN KEY (decision_id) REFERENCES policy_decision(id);

-- Append-only: operator actions on a decision; one operator counts once per decision.
CREATE TABLE approval (
    id             bigserial PRIMARY KEY,
    withdrawal_id  bigint NOT NULL REFERENCES withdrawal_request(id),
    decision_id    bigint NOT NULL REFERENCES policy_decision(id),
    operator       text NOT NULL,
    action         text NOT NULL CHECK (action IN ('approve', 'reject')),
    comment        text NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),
    UNIQUE (decision_id, operator)
);

-- Operational: a group of withdrawals paid by one chain transaction (bitcoin) or one each (ethereum).
CREATE TABLE withdrawal_batch (
    id           bigserial PRIMARY KEY,
    chain        text NOT NULL,
    asset        text NOT NULL,
    state        text NOT NULL,
    fee_rate     numeric(78,0) NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE withdrawal_request ADD FOREIGN KEY (batch_id) REFERENCES withdrawal_batch(id);

CREATE TABLE batch_output (
    batch_id       bigint NOT NULL REFERENCES withdrawal_batch(id),
    withdrawal_id  bigint NOT NULL REFERENCES withdrawal_request(id),
    output_index   integer,
    amount         numeric(78,0) NOT NULL,
    PRIMARY KEY (batch_id, withdrawal_id)
);

-- The only table that holds a txid. The signed raw transaction is stored before broadcast.
CREATE TABLE chain_transaction (
    id             bigserial PRIMARY KEY,
    batch_id       bigint NOT NULL REFERENCES withdrawal_batch(id),
    chain          text NOT NULL,
    txid           text NOT NULL UNIQUE,
    raw            bytea NOT NULL,
    fee            numeric(78,0) NOT NULL CHECK (fee >= 0),
    fee_rate       numeric(78,0) NOT NULL DEFAULT 0,
    nonce          bigint,
    sender         text,
    replaces_id    bigint REFERENCES chain_transaction(id),
    state          text NOT NULL,
    block_hash     text,
    block_height   bigint,
    confirmations  integer NOT NULL DEFAULT 0,
    broadcast_at   timestamptz,
    broadcast_height bigint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chain_transaction_open ON chain_transaction (state) WHERE state IN ('signed', 'broadcast', 'confirmed');

-- Operational: unspent outputs of our hot wallet that custody tracks for coin selection.
CREATE TABLE wallet_utxo (
    txid            text NOT NULL,
    vout            integer NOT NULL,
    address         text NOT NULL,
    derivation_change integer NOT NULL,
    derivation_index  integer NOT NULL,
    amount          numeric(78,0) NOT NULL CHECK (amount > 0),
    spent_by        bigint REFERENCES chain_transaction(id),
    reserved_by     bigint REFERENCES withdrawal_batch(id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (txid, vout)
);

-- Ethereum nonces per sending address, allocated without gaps or reuse under a row lock.
CREATE TABLE eth_nonce (
    address     text PRIMARY KEY,
    next_nonce  bigint NOT NULL CHECK (next_nonce >= 0)
);

-- Reference: a customer account's destination allowlist (mode, cooling-off, approvals) and entries.
CREATE TABLE allowlist_policy (
    account_id        bigint PRIMARY KEY REFERENCES account(id),
    mode              text NOT NULL CHECK (mode IN ('enforce', 'review')),
    cooling_off_secs  integer NOT NULL DEFAULT 0 CHECK (cooling_off_secs >= 0),
    approvals         integer NOT NULL DEFAULT 1 CHECK (approvals >= 1),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE allowlist_entry (
    account_id  bigint NOT NULL REFERENCES account(id),
    address     text NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT now(),
    added_by    text NOT NULL,
    PRIMARY KEY (account_id, address)
);

-- Append-only: the signer's own record of everything it signed or refused.
CREATE TABLE signer_audit (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    batch_id  bigint,
    outcome   text NOT NULL,
    code      text,
    txid      text,
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb
);

CREATE TRIGGER policy_decision_append_only BEFORE UPDATE OR DELETE ON policy_decision
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER approval_append_only BEFORE UPDATE OR DELETE ON approval
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER signer_audit_append_only BEFORE UPDATE OR DELETE ON signer_audit
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER withdrawal_request_never_deleted BEFORE DELETE ON withdrawal_request
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER chain_transaction_never_deleted BEFORE DELETE ON chain_transaction
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("withdrawal history is not downgraded")
