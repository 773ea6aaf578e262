"""Matching: markets, the append-only command journal, orders, fills and book snapshots.

Revision ID: 0004_matching
Revises: 0003_custody_deposits
"""
from alembic import op

revision = "0004_matching"
down_revision = "0003_custody_deposits"
branch_labels = None
depends_on = None

SQL = """
-- Reference: what the matcher reads. Units: matching/model.py (prices in ticks, quantities in lots;
-- base = lots * lot_size, quote = ticks * lots * quote_per_tick_lot). fees: {"tier": [maker_ppm, taker_ppm]}.
CREATE TABLE market (
    symbol              text PRIMARY KEY CHECK (symbol ~ '^[A-Za-z0-9_.-]{1,40}$'),
    base_asset          text NOT NULL REFERENCES asset(code),
    quote_asset         text NOT NULL REFERENCES asset(code),
    lot_size            numeric(78,0) NOT NULL CHECK (lot_size > 0),
    quote_per_tick_lot  numeric(78,0) NOT NULL CHECK (quote_per_tick_lot > 0),
    min_notional        numeric(78,0) NOT NULL DEFAULT 0 CHECK (min_notional >= 0),
    fees                jsonb NOT NULL,
    default_stp         text NOT NULL CHECK (default_stp IN ('cancel_newest', 'cancel_oldest', 'decrement_both')),
    fee_account_id      bigint NOT NULL REFERENCES account(id),
    created_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (base_asset <> quote_asset)
);
CREATE TRIGGER market_never_deleted BEFORE DELETE ON market
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- Append-only: every sequenced command of a market, in order. The book is a function of this table.
CREATE TABLE matching_command (
    market      text NOT NULL REFERENCES market(symbol),
    seq         bigint NOT NULL CHECK (seq > 0),
    record      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (market, seq)
);
CREATE TRIGGER matching_command_append_only BEFORE UPDATE OR DELETE ON matching_command
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER matching_command_no_truncate BEFORE TRUNCATE ON matching_command
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();

-- Operational: one row per order, mirroring the engine (state is one of the ten order states).
-- seq is NULL for an order the gateway rejected before sequencing (e.g. insufficient funds).
CREATE TABLE trade_order (
    id                text PRIMARY KEY,
    market            text NOT NULL REFERENCES market(symbol),
    account           text NOT NULL,
    client_order_id   text NOT NULL CHECK (length(client_order_id) BETWEEN 1 AND 64),
    side              text NOT NULL CHECK (side IN ('buy', 'sell')),
    order_type        text NOT NULL CHECK (order_type IN ('limit', 'market', 'stop', 'stop_limit')),
    tif               text,
    post_only         boolean NOT NULL DEFAULT false,
    price             numeric(78,0),
    qty               numeric(78,0),
    display_qty       numeric(78,0),
    stop_price        numeric(78,0),
    budget            numeric(78,0),
    fee_tier          text NOT NULL,
    state             text NOT NULL CHECK (state IN ('received', 'rejected', 'pending_new', 'working',
                          'partially_filled', 'filled', 'pending_cancel', 'cancelled', 'expired', 'untriggered')),
    seq               bigint,
    last_seq          bigint,
    filled            numeric(78,0) NOT NULL DEFAULT 0,
    remaining         numeric(78,0),
    quote_traded      numeric(78,0) NOT NULL DEFAULT 0,
    fees_paid         numeric(78,0) NOT NULL DEFAULT 0,
    hold_id           bigint REFERENCES hold(id),
    hold_no           integer NOT NULL DEFAULT 0,
    prior_captured    numeric(78,0) NOT NULL DEFAULT 0,
    reject_code       text,
    close_reason      text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (market, account, client_order_id)
);
CREATE INDEX trade_order_open ON trade_order (market, state)
    WHERE state NOT IN ('rejected', 'filled', 'cancelled', 'expired');
CREATE INDEX trade_order_account ON trade_order (account, market, id);
CREATE TRIGGER trade_order_never_deleted BEFORE DELETE ON trade_order
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- Append-only: one row per execution, committed with its journal transaction.
CREATE TABLE fill (
    id                      bigserial PRIMARY KEY,
    market                  text NOT NULL,
    seq                     bigint NOT NULL,
    match_no                integer NOT NULL CHECK (match_no > 0),
    maker_order_id          text NOT NULL REFERENCES trade_order(id),
    taker_order_id          text NOT NULL REFERENCES trade_order(id),
    maker_account           text NOT NULL,
    taker_account           text NOT NULL,
    taker_side              text NOT NULL CHECK (taker_side IN ('buy', 'sell')),
    price_ticks             numeric(78,0) NOT NULL CHECK (price_ticks > 0),
    qty_lots                numeric(78,0) NOT NULL CHECK (qty_lots > 0),
    base_amount             numeric(78,0) NOT NULL,
    quote_amount            numeric(78,0) NOT NULL,
    maker_fee               numeric(78,0) NOT NULL CHECK (maker_fee >= 0),
    taker_fee               numeric(78,0) NOT NULL CHECK (taker_fee >= 0),
    journal_transaction_id  bigint NOT NULL UNIQUE REFERENCES journal_transaction(id),
    created_at              timestamptz NOT NULL DEFAULT now(),
    UNIQUE (market, seq, match_no),
    FOREIGN KEY (market, seq) REFERENCES matching_command (market, seq)
);
CREATE INDEX fill_maker ON fill (maker_order_id);
CREATE INDEX fill_taker ON fill (taker_order_id);
CREATE TRIGGER fill_append_only BEFORE UPDATE OR DELETE ON fill
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- Derived: engine state at seq (canonical JSON, sha256 in hash). Rebuildable from the journal.
CREATE TABLE matching_snapshot (
    market      text NOT NULL REFERENCES market(symbol),
    seq         bigint NOT NULL,
    hash        text NOT NULL,
    data        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (market, seq)
);
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("the matching journal is append-only and is not downgraded")
