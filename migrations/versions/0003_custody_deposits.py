"""Custody: wallets, chain assets, deposit addresses, observations, cursors, incidents, controls, outbox.

Revision ID: 0003_custody_deposits
Revises: 0002_service
"""
from alembic import op

revision = "0003_custody_deposits"
down_revision = "0002_service"
branch_labels = None
depends_on = None

SQL = """
-- Reference: what each asset is on its chain and the policy data its deposits follow.
CREATE TABLE chain_asset (
    asset                   text PRIMARY KEY REFERENCES asset(code),
    chain                   text NOT NULL CHECK (chain IN ('bitcoin', 'ethereum')),
    contract_address        text,
    finality_confirmations  integer NOT NULL CHECK (finality_confirmations >= 1),
    dust_minimum            numeric(78,0) NOT NULL DEFAULT 0 CHECK (dust_minimum >= 0),
    UNIQUE (chain, contract_address)
);

-- Reference: one extended PUBLIC key per chain and tier, and how far it has been derived.
CREATE TABLE wallet (
    id              bigserial PRIMARY KEY,
    chain           text NOT NULL CHECK (chain IN ('bitcoin', 'ethereum')),
    tier            text NOT NULL CHECK (tier IN ('deposit', 'hot', 'warm', 'cold')),
    network         text NOT NULL,
    xpub            text NOT NULL,
    next_index      integer NOT NULL DEFAULT 0 CHECK (next_index >= 0),
    gap_limit       integer NOT NULL DEFAULT 20 CHECK (gap_limit > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (chain, tier)
);

-- Operational: an address handed to a customer; never deleted, never reassigned.
CREATE TABLE deposit_address (
    id                bigserial PRIMARY KEY,
    wallet_id         bigint NOT NULL REFERENCES wallet(id),
    chain             text NOT NULL,
    address           text NOT NULL,
    derivation_index  integer NOT NULL,
    account_id        bigint NOT NULL REFERENCES account(id),
    owner             text NOT NULL,
    idempotency_key   text NOT NULL UNIQUE,
    issued_at         timestamptz NOT NULL DEFAULT now(),
    first_seen_at     timestamptz,
    UNIQUE (chain, address),
    UNIQUE (wallet_id, derivation_index)
);

CREATE TABLE chain_cursor (
    chain       text PRIMARY KEY,
    height      bigint NOT NULL,
    hash        text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Operational: one row per output / transfer / log paying a watched address.
-- seen -> confirming -> final -> credited | quarantined -> released | returned | dust ; seen/confirming/final -> orphaned
CREATE TABLE deposit_observation (
    id                     bigserial PRIMARY KEY,
    chain                  text NOT NULL,
    asset                  text NOT NULL REFERENCES asset(code),
    txid                   text NOT NULL,
    output_index           integer NOT NULL,
    address                text NOT NULL,
    senders                text[] NOT NULL DEFAULT '{}',
    amount                 numeric(78,0) NOT NULL CHECK (amount > 0),
    block_hash             text NOT NULL,
    block_height           bigint NOT NULL,
    confirmations          integer NOT NULL DEFAULT 0,
    state                  text NOT NULL CHECK (state IN ('seen', 'confirming', 'final', 'credited',
                                'orphaned', 'quarantined', 'released', 'returned', 'dust')),
    deposit_address_id     bigint NOT NULL REFERENCES deposit_address(id),
    account_id             bigint NOT NULL REFERENCES account(id),
    journal_transaction_id bigint REFERENCES journal_transaction(id),
    screening              jsonb,
    reorg_count            integer NOT NULL DEFAULT 0,
    return_withdrawal_id   bigint,  -- a quarantined deposit sent back: the withdrawal paying it
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    UNIQUE (chain, asset, txid, output_index)
);
CREATE INDEX deposit_observation_open ON deposit_observation (chain, state)
    WHERE state IN ('seen', 'confirming', 'final');
CREATE INDEX deposit_observation_account ON deposit_observation (account_id, id);

-- Reference: addresses the compliance screen refuses (deposit senders, withdrawal destinations).
CREATE TABLE denylist_address (
    address     text PRIMARY KEY,
    reason      text NOT NULL,
    added_at    timestamptz NOT NULL DEFAULT now()
);

-- Operational: incidents an operator must explain (reorg below finality, reconciliation gaps...).
CREATE TABLE incident (
    id           bigserial PRIMARY KEY,
    kind         text NOT NULL,
    severity     text NOT NULL CHECK (severity IN ('warning', 'critical')),
    dedupe_key   text NOT NULL UNIQUE,
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb,
    opened_at    timestamptz NOT NULL DEFAULT now(),
    resolved_at  timestamptz,
    resolved_by  text
);

-- Operational: named switches; 'withdrawals_halted' is the kill switch.
CREATE TABLE control_flag (
    name        text PRIMARY KEY,
    engaged     boolean NOT NULL,
    reason      text NOT NULL,
    changed_by  text NOT NULL,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

-- Events committed with the change that caused them; delivered at least once by the dispatcher.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    topic         text NOT NULL,
    event_key     text NOT NULL UNIQUE,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    attempts      integer NOT NULL DEFAULT 0
);
CREATE INDEX outbox_pending ON outbox (id) WHERE delivered_at IS NULL;

CREATE TRIGGER deposit_observation_never_deleted BEFORE DELETE ON deposit_observation
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER deposit_address_never_deleted BEFORE DELETE ON deposit_address
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER incident_never_deleted BEFORE DELETE ON incident
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("custody tables hold operational history and are not downgraded")
