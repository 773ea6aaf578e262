"""Events for a consumer that builds balances, orders and withdrawals from events only (issue 14).

Revision ID: 0026_event_stream
Revises: 0023_wallet_index

Why: the outbox carried deposit, withdrawal, batch, incident and adjustment events only; a backend
could not follow fills, order states, holds or balance changes without polling, and the outbox
said nothing about order: ids are assigned at INSERT, not at commit, so a row with a lower id can
commit after a higher one was already delivered.

What changes:
- `outbox` gains `aggregate` (what the event is about: `order:<id>`, `withdrawal:<id>`, ...),
  `aggregate_seq` (1, 2, 3, ... per aggregate, gapless) and `version` (of the event type's shape).
  Rows written before this migration get `aggregate = 'event:' || event_key`, seq 1.
- `outbox_aggregate` holds each aggregate's last sequence number. `custody_emit(topic, key,
  aggregate, version, payload)` is the one writer of outbox rows (custody.controls.emit calls it):
  it takes the aggregate's row lock (upsert) BEFORE the outbox row gets its id, so a second
  transaction emitting on the same aggregate waits until the first commits or rolls back. Hence,
  per aggregate: sequence order = id order = commit order, and a visible row's predecessors are
  visible. A key that exists already is not written again (nothing is numbered for it). A NULL key
  becomes `<aggregate>#<seq>` (trigger-emitted state changes, unique by construction).
- Triggers emit, in the writer's own transaction, what the ledger and the matching engine write:
  the ledger and matching packages import nothing of custody (DESIGN.md 2), and the database is
  the one place that sees every journal transaction (API postings, fills, deposits, withdrawals,
  sweeps, adjustments, fast paths in SQL functions) and every order row, whatever process wrote it:
  - `ledger.transaction_posted` per journal transaction, with its legs (a deferred constraint
    trigger: it runs at COMMIT, when every entry of the transaction exists);
  - `ledger.hold_changed` when a hold is placed, captured (in part), released or expired;
  - `order.<accepted|amended|partially_filled|filled|cancelled|expired|rejected>` when an order
    row's state, filled quantity, price or quantity changes;
  - `fill.executed` per fill row;
  - `withdrawal.state_changed` when a withdrawal request is created or changes state.
- custody_api writes `outbox_aggregate` (INSERT, UPDATE): its requests emit events too.
"""
from alembic import op

revision = "0026_event_stream"
down_revision = "0023_wallet_index"
branch_labels = None
depends_on = None

SQL = r"""
ALTER TABLE outbox ADD COLUMN aggregate text, ADD COLUMN aggregate_seq bigint,
                   ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1);
UPDATE outbox SET aggregate = 'event:' || event_key, aggregate_seq = 1;
ALTER TABLE outbox ALTER COLUMN aggregate SET NOT NULL, ALTER COLUMN aggregate_seq SET NOT NULL,
                   ADD CONSTRAINT outbox_aggregate_seq UNIQUE (aggregate, aggregate_seq);

-- Operational: the last sequence number of each aggregate's events (custody_emit).
CREATE TABLE outbox_aggregate (
    aggregate  text PRIMARY KEY,
    last_seq   bigint NOT NULL CHECK (last_seq >= 0)
);
INSERT INTO outbox_aggregate (aggregate, last_seq) SELECT aggregate, 1 FROM outbox;

CREATE FUNCTION custody_emit(p_topic text, p_key text, p_aggregate text, p_version integer, p_payload jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_seq bigint;
    v_id bigint;
BEGIN
    IF p_key IS NOT NULL AND EXISTS (SELECT 1 FROM outbox WHERE event_key = p_key) THEN
        RETURN false;
    END IF;
    INSERT INTO outbox_aggregate AS a (aggregate, last_seq) VALUES (p_aggregate, 1)
        ON CONFLICT (aggregate) DO UPDATE SET last_seq = a.last_seq + 1
        RETURNING last_seq INTO v_seq;
    INSERT INTO outbox (topic, event_key, aggregate, aggregate_seq, version, payload)
        VALUES (p_topic, coalesce(p_key, p_aggregate || '#' || v_seq), p_aggregate, v_seq, p_version, p_payload)
        ON CONFLICT (event_key) DO NOTHING
        RETURNING id INTO v_id;
    IF v_id IS NULL THEN  -- written meanwhile by a transaction that committed: keep the numbering gapless
        UPDATE outbox_aggregate SET last_seq = last_seq - 1 WHERE aggregate = p_aggregate;
        RETURN false;
    END IF;
    RETURN true;
END $$;

CREATE FUNCTION custody_event_transaction_posted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM custody_emit('ledger.transaction_posted', 'ledger.transaction_posted:' || NEW.id,
        'journal_transaction:' || NEW.id, 1, jsonb_build_object(
            'transaction_id', NEW.id, 'idempotency_key', NEW.idempotency_key, 'kind', NEW.kind,
            'reverses_id', NEW.reverses_id, 'metadata', NEW.metadata, 'posted_at', NEW.created_at,
            'legs', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'entry_id', e.id, 'account_id', e.account_id, 'asset', e.asset,
                        'amount', e.amount, 'hold_id', e.hold_id) ORDER BY e.id), '[]'::jsonb)
                     FROM journal_entry e WHERE e.transaction_id = NEW.id)));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER journal_transaction_event AFTER INSERT ON journal_transaction
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION custody_event_transaction_posted();

CREATE FUNCTION custody_event_hold_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.state, OLD.captured, OLD.released) IS NOT DISTINCT FROM
                            (NEW.state, NEW.captured, NEW.released) THEN
        RETURN NULL;
    END IF;
    PERFORM custody_emit('ledger.hold_changed', NULL, 'hold:' || NEW.id, 1, jsonb_build_object(
        'hold_id', NEW.id, 'account_id', NEW.account_id,
        'asset', (SELECT asset FROM account WHERE id = NEW.account_id),
        'amount', NEW.amount, 'captured', NEW.captured, 'released', NEW.released,
        'held', CASE WHEN NEW.state = 'pending' THEN NEW.amount - NEW.captured - NEW.released ELSE 0 END,
        'state', NEW.state, 'owner', NEW.owner, 'reference', NEW.reference));
    RETURN NULL;
END $$;
CREATE TRIGGER hold_event AFTER INSERT OR UPDATE ON hold
    FOR EACH ROW EXECUTE FUNCTION custody_event_hold_changed();

CREATE FUNCTION custody_event_order_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_topic text;
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.state, OLD.filled, OLD.price, OLD.qty) IS NOT DISTINCT FROM
                            (NEW.state, NEW.filled, NEW.price, NEW.qty) THEN
        RETURN NULL;
    END IF;
    v_topic := CASE
        WHEN NEW.state IN ('received', 'pending_new', 'working', 'untriggered', 'pending_cancel')
             AND TG_OP = 'UPDATE' AND OLD.state = NEW.state AND OLD.filled = NEW.filled THEN 'order.amended'
        WHEN NEW.state IN ('received', 'pending_new', 'working', 'untriggered', 'pending_cancel') THEN 'order.accepted'
        ELSE 'order.' || NEW.state END;
    PERFORM custody_emit(v_topic, NULL, 'order:' || NEW.id, 1, jsonb_build_object(
        'order_id', NEW.id, 'market', NEW.market, 'account', NEW.account,
        'client_order_id', NEW.client_order_id, 'side', NEW.side, 'order_type', NEW.order_type,
        'price_ticks', NEW.price, 'qty_lots', NEW.qty, 'budget', NEW.budget, 'state', NEW.state,
        'filled_lots', NEW.filled, 'remaining_lots', NEW.remaining, 'quote_traded', NEW.quote_traded,
        'fees_paid', NEW.fees_paid, 'hold_id', NEW.hold_id, 'reject_code', NEW.reject_code,
        'close_reason', NEW.close_reason, 'last_seq', NEW.last_seq));
    RETURN NULL;
END $$;
CREATE TRIGGER trade_order_event AFTER INSERT OR UPDATE ON trade_order
    FOR EACH ROW EXECUTE FUNCTION custody_event_order_changed();

CREATE FUNCTION custody_event_fill() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM custody_emit('fill.executed', 'fill:' || NEW.market || ':' || NEW.seq || ':' || NEW.match_no,
        'market:' || NEW.market, 1, jsonb_build_object(
            'fill_id', NEW.id, 'market', NEW.market, 'seq', NEW.seq, 'match_no', NEW.match_no,
            'maker_order_id', NEW.maker_order_id, 'taker_order_id', NEW.taker_order_id,
            'maker_account', NEW.maker_account, 'taker_account', NEW.taker_account,
            'taker_side', NEW.taker_side, 'price_ticks', NEW.price_ticks, 'qty_lots', NEW.qty_lots,
            'base_amount', NEW.base_amount, 'quote_amount', NEW.quote_amount,
            'maker_fee', NEW.maker_fee, 'taker_fee', NEW.taker_fee,
            'journal_transaction_id', NEW.journal_transaction_id));
    RETURN NULL;
END $$;
CREATE TRIGGER fill_event AFTER INSERT ON fill
    FOR EACH ROW EXECUTE FUNCTION custody_event_fill();

CREATE FUNCTION custody_event_withdrawal_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state IS NOT DISTINCT FROM NEW.state THEN
        RETURN NULL;
    END IF;
    PERFORM custody_emit('withdrawal.state_changed', NULL, 'withdrawal:' || NEW.id, 1, jsonb_build_object(
        'withdrawal_id', NEW.id, 'client_withdrawal_id', NEW.client_withdrawal_id,
        'account_id', NEW.account_id, 'asset', NEW.asset, 'chain', NEW.chain, 'amount', NEW.amount,
        'fee_quoted', NEW.fee_quoted, 'destination', NEW.destination, 'priority', NEW.priority,
        'state', NEW.state, 'previous_state', CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END,
        'hold_id', NEW.hold_id, 'batch_id', NEW.batch_id));
    RETURN NULL;
END $$;
CREATE TRIGGER withdrawal_request_event AFTER INSERT OR UPDATE OF state ON withdrawal_request
    FOR EACH ROW EXECUTE FUNCTION custody_event_withdrawal_state();
"""

# 0022's lists plus outbox_aggregate (written by the api's requests through custody_emit).
LISTS = """
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text)
LANGUAGE sql IMMUTABLE AS $$ VALUES
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
        ('allowlist_entry', 'INSERT, UPDATE, DELETE')
    $$;
"""

LISTS_0022 = LISTS.replace("        ('outbox_aggregate', 'INSERT, UPDATE'),\n", "")

DOWN = """
DROP TRIGGER withdrawal_request_event ON withdrawal_request;
DROP TRIGGER fill_event ON fill;
DROP TRIGGER trade_order_event ON trade_order;
DROP TRIGGER hold_event ON hold;
DROP TRIGGER journal_transaction_event ON journal_transaction;
DROP FUNCTION custody_event_withdrawal_state(), custody_event_fill(), custody_event_order_changed(),
              custody_event_hold_changed(), custody_event_transaction_posted(),
              custody_emit(text, text, text, integer, jsonb);
DROP TABLE outbox_aggregate;
ALTER TABLE outbox DROP COLUMN aggregate, DROP COLUMN aggregate_seq, DROP COLUMN version;
"""


def upgrade() -> None:
    op.execute(SQL)
    op.execute(LISTS)
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(LISTS_0022)
    op.execute(DOWN)
    op.execute("CALL custody_apply_role_grants()")
