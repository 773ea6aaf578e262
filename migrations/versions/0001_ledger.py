"""Ledger: assets, accounts, balance projection, append-only journal, holds, posting function.

Revision ID: 0001_ledger
Revises:
"""
from alembic import op

revision = "0001_ledger"
down_revision = None
branch_labels = None
depends_on = None

TABLES = """
CREATE TABLE asset (
    code        text PRIMARY KEY CHECK (code ~ '^[A-Z0-9][A-Z0-9_.-]{0,31}$'),
    decimals    integer NOT NULL CHECK (decimals BETWEEN 0 AND 36),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE account (
    id               bigserial PRIMARY KEY,
    asset            text NOT NULL REFERENCES asset(code),
    kind             text NOT NULL,
    name             text NOT NULL UNIQUE,
    owner            text,
    may_go_negative  boolean NOT NULL,
    may_go_positive  boolean NOT NULL,
    closed_at        timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Derived: rebuildable from journal_entry and hold at any time (rebuild_projections()).
CREATE TABLE account_balance (
    account_id           bigint PRIMARY KEY REFERENCES account(id),
    posted               numeric(78,0) NOT NULL DEFAULT 0,
    held                 numeric(78,0) NOT NULL DEFAULT 0 CHECK (held >= 0),
    last_transaction_id  bigint NOT NULL DEFAULT 0
);

-- Append-only.
CREATE TABLE journal_transaction (
    id               bigserial PRIMARY KEY,
    idempotency_key  text NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    content_hash     text NOT NULL,
    kind             text NOT NULL,
    metadata         jsonb NOT NULL DEFAULT '{}'::jsonb,
    reverses_id      bigint UNIQUE REFERENCES journal_transaction(id),
    created_txid     xid8 NOT NULL DEFAULT pg_current_xact_id(),
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Operational: state advances in place (pending -> captured | released | expired), never deleted.
CREATE TABLE hold (
    id               bigserial PRIMARY KEY,
    idempotency_key  text NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    content_hash     text NOT NULL,
    account_id       bigint NOT NULL REFERENCES account(id),
    amount           numeric(78,0) NOT NULL CHECK (amount > 0),
    captured         numeric(78,0) NOT NULL DEFAULT 0 CHECK (captured >= 0),
    released         numeric(78,0) NOT NULL DEFAULT 0 CHECK (released >= 0),
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'captured', 'released', 'expired')),
    owner            text NOT NULL,
    reference        text NOT NULL,
    expires_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    CHECK (captured + released <= amount),
    CHECK ((state = 'pending') = (resolved_at IS NULL)),
    CHECK (state = 'pending' OR captured + released = amount)
);
CREATE INDEX hold_pending_expiry ON hold (expires_at) WHERE state = 'pending';
CREATE INDEX hold_pending_account ON hold (account_id) WHERE state = 'pending';

-- Append-only. amount is signed: positive credits the account. balance_after is the account's
-- posted balance after this entry (entries of one account are written in id order under its lock).
CREATE TABLE journal_entry (
    id              bigserial PRIMARY KEY,
    transaction_id  bigint NOT NULL REFERENCES journal_transaction(id),
    account_id      bigint NOT NULL REFERENCES account(id),
    asset           text NOT NULL,
    amount          numeric(78,0) NOT NULL CHECK (amount <> 0),
    balance_after   numeric(78,0) NOT NULL,
    hold_id         bigint REFERENCES hold(id)
);
CREATE INDEX journal_entry_account ON journal_entry (account_id, id);
CREATE INDEX journal_entry_transaction ON journal_entry (transaction_id);
CREATE INDEX journal_entry_hold ON journal_entry (hold_id) WHERE hold_id IS NOT NULL;
"""

GUARDS = """
CREATE FUNCTION ledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger: % on % is refused: the table is append-only; post a compensating row instead',
        TG_OP, TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END $$;

CREATE TRIGGER journal_transaction_append_only BEFORE UPDATE OR DELETE ON journal_transaction
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER journal_transaction_no_truncate BEFORE TRUNCATE ON journal_transaction
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER journal_entry_append_only BEFORE UPDATE OR DELETE ON journal_entry
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER journal_entry_no_truncate BEFORE TRUNCATE ON journal_entry
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER hold_never_deleted BEFORE DELETE ON hold
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER account_never_deleted BEFORE DELETE ON account
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- Entries may only join a journal transaction created in the same database transaction, so a
-- committed transaction can never gain entries later.
CREATE FUNCTION ledger_entries_same_xact() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows n JOIN journal_transaction t ON t.id = n.transaction_id
               WHERE t.created_txid <> pg_current_xact_id()) THEN
        RAISE EXCEPTION 'ledger: entries may only be added to a journal transaction in the '
                        'database transaction that created it' USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER journal_entry_same_xact AFTER INSERT ON journal_entry
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_same_xact();

-- Deferred to commit: every journal transaction has entries and they sum to zero per asset.
CREATE FUNCTION ledger_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_bad text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM journal_entry WHERE transaction_id = NEW.id) THEN
        RAISE EXCEPTION 'ledger: journal transaction % has no entries', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    SELECT asset INTO v_bad FROM journal_entry WHERE transaction_id = NEW.id
        GROUP BY asset HAVING sum(amount) <> 0 LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger: journal transaction % does not balance in %', NEW.id, v_bad
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER journal_transaction_balanced AFTER INSERT ON journal_transaction
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_check_balanced();
"""

# The one path by which entries reach the journal. Validates under row locks, then writes the
# transaction, its entries (with running balances), the projection and hold captures in one go.
# Returns a status instead of raising so that a refusal writes nothing and callers read a code,
# never an error text. Check order = precedence of the codes.
POST_FUNCTION = """
CREATE FUNCTION ledger_post(
    p_key text, p_hash text, p_kind text, p_metadata jsonb,
    p_debits bigint[], p_credits bigint[], p_amounts numeric[], p_holds bigint[],
    p_hold_owner text, p_reverses bigint
) RETURNS TABLE (status text, transaction_id bigint, failed_index integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_hash text;
    v_bad integer;
    v_status text;
BEGIN
    -- 1. Lock every touched balance row in id order (no deadlocks between postings).
    PERFORM 1 FROM account_balance b
        WHERE b.account_id = ANY (p_debits || p_credits) ORDER BY b.account_id FOR UPDATE;

    -- 2. A replay answers with the original outcome and moves nothing.
    SELECT t.id, t.content_hash INTO v_id, v_hash FROM journal_transaction t
        WHERE t.idempotency_key = p_key;
    IF v_id IS NOT NULL THEN
        RETURN QUERY SELECT CASE WHEN v_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END,
                            v_id, NULL::integer;
        RETURN;
    END IF;

    -- 3. Accounts exist, are open, and each transfer stays in one asset.
    SELECT min(l.i) - 1, CASE
               WHEN bool_or(d.id IS NULL OR c.id IS NULL) THEN 'account_not_found'
               WHEN bool_or(d.closed_at IS NOT NULL OR c.closed_at IS NOT NULL) THEN 'account_closed'
               ELSE 'asset_mismatch' END
        INTO v_bad, v_status
        FROM unnest(p_debits, p_credits) WITH ORDINALITY AS l(debit, credit, i)
        LEFT JOIN account d ON d.id = l.debit
        LEFT JOIN account c ON c.id = l.credit
        WHERE d.id IS NULL OR c.id IS NULL OR d.closed_at IS NOT NULL OR c.closed_at IS NOT NULL
              OR d.asset <> c.asset;
    IF v_bad IS NOT NULL THEN
        RETURN QUERY SELECT v_status, NULL::bigint, v_bad;
        RETURN;
    END IF;

    -- 4. Captures: the hold exists, belongs to the caller, is on the debited account, is pending,
    --    has not timed out, and is not overdrawn (summing all captures of one hold in the batch).
    IF EXISTS (SELECT 1 FROM unnest(p_holds) h WHERE h IS NOT NULL) THEN
        PERFORM 1 FROM hold WHERE id = ANY (p_holds) ORDER BY id FOR UPDATE;
        SELECT min(l.i) - 1, CASE
                   WHEN bool_or(h.id IS NULL) THEN 'hold_not_found'
                   WHEN bool_or(h.owner IS DISTINCT FROM p_hold_owner) THEN 'hold_owner_mismatch'
                   WHEN bool_or(h.account_id <> l.debit) THEN 'hold_account_mismatch'
                   WHEN bool_or(h.state <> 'pending') THEN 'hold_already_resolved'
                   ELSE 'hold_expired' END
            INTO v_bad, v_status
            FROM unnest(p_debits, p_holds) WITH ORDINALITY AS l(debit, hold_id, i)
            LEFT JOIN hold h ON h.id = l.hold_id
            WHERE l.hold_id IS NOT NULL
              AND (h.id IS NULL OR h.owner IS DISTINCT FROM p_hold_owner OR h.account_id <> l.debit
                   OR h.state <> 'pending' OR h.expires_at <= now());
        IF v_bad IS NOT NULL THEN
            RETURN QUERY SELECT v_status, NULL::bigint, v_bad;
            RETURN;
        END IF;
        SELECT min(l.first_i) - 1 INTO v_bad
            FROM (SELECT hold_id, sum(amount) AS total, min(i) AS first_i
                  FROM unnest(p_holds, p_amounts) WITH ORDINALITY AS u(hold_id, amount, i)
                  WHERE hold_id IS NOT NULL GROUP BY hold_id) l
            JOIN hold h ON h.id = l.hold_id
            WHERE l.total > h.amount - h.captured - h.released;
        IF v_bad IS NOT NULL THEN
            RETURN QUERY SELECT 'hold_exceeded', NULL::bigint, v_bad;
            RETURN;
        END IF;
    END IF;

    -- 5. Reversals happen once.
    IF p_reverses IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM journal_transaction WHERE id = p_reverses) THEN
            RETURN QUERY SELECT 'transaction_not_found', NULL::bigint, NULL::integer;
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM journal_transaction WHERE reverses_id = p_reverses) THEN
            RETURN QUERY SELECT 'already_reversed', NULL::bigint, NULL::integer;
            RETURN;
        END IF;
    END IF;

    -- 6. Balance limits, on the batch's net effect per account, under the locks taken in step 1.
    SELECT min(n.first_i) - 1,
           CASE WHEN bool_or(NOT a.may_go_negative AND n.delta < 0
                             AND b.posted + n.delta - (b.held + n.held_delta) < 0)
                THEN 'insufficient_funds' ELSE 'limit_exceeded' END
        INTO v_bad, v_status
        FROM (SELECT account_id, sum(delta) AS delta, sum(held_delta) AS held_delta, min(i) AS first_i
              FROM (SELECT u.debit AS account_id, -u.amount AS delta,
                           CASE WHEN u.hold_id IS NULL THEN 0 ELSE -u.amount END AS held_delta, u.i
                      FROM unnest(p_debits, p_amounts, p_holds) WITH ORDINALITY AS u(debit, amount, hold_id, i)
                    UNION ALL
                    SELECT u.credit, u.amount, 0, u.i
                      FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)) legs
              GROUP BY account_id) n
        JOIN account a ON a.id = n.account_id
        JOIN account_balance b ON b.account_id = n.account_id
        WHERE (NOT a.may_go_negative AND n.delta < 0 AND b.posted + n.delta - (b.held + n.held_delta) < 0)
           OR (NOT a.may_go_positive AND n.delta > 0 AND b.posted + n.delta > 0);
    IF v_bad IS NOT NULL THEN
        RETURN QUERY SELECT v_status, NULL::bigint, v_bad;
        RETURN;
    END IF;

    -- 6b. Every balance, each running balance_after included, must fit NUMERIC(78,0); otherwise the
    --     write would fail with a raw overflow instead of a code. The full check runs only when the
    --     cheap bound says an overflow is possible at all.
    IF (SELECT sum(u.amount) FROM unnest(p_amounts) AS u(amount))
       + (SELECT coalesce(max(abs(b.posted)), 0) FROM account_balance b
           WHERE b.account_id = ANY (p_debits || p_credits)) > 10::numeric ^ 78 - 1 THEN
        SELECT min(r.i) - 1 INTO v_bad
            FROM (SELECT l.i, b.posted + sum(l.delta) OVER (PARTITION BY l.account_id ORDER BY l.ord) AS after
                    FROM (SELECT u.debit AS account_id, -u.amount AS delta, 2 * u.i AS ord, u.i
                            FROM unnest(p_debits, p_amounts) WITH ORDINALITY AS u(debit, amount, i)
                          UNION ALL
                          SELECT u.credit, u.amount, 2 * u.i + 1, u.i
                            FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)) l
                    JOIN account_balance b ON b.account_id = l.account_id) r
            WHERE abs(r.after) > 10::numeric ^ 78 - 1;
        IF v_bad IS NOT NULL THEN
            RETURN QUERY SELECT 'limit_exceeded', NULL::bigint, v_bad;
            RETURN;
        END IF;
    END IF;

    -- 7. Write. A concurrent posting of the same key with other accounts may have won the race.
    INSERT INTO journal_transaction (idempotency_key, content_hash, kind, metadata, reverses_id)
        VALUES (p_key, p_hash, p_kind, coalesce(p_metadata, '{}'::jsonb), p_reverses)
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT t.id, t.content_hash INTO v_id, v_hash FROM journal_transaction t
            WHERE t.idempotency_key = p_key;
        RETURN QUERY SELECT CASE WHEN v_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END,
                            v_id, NULL::integer;
        RETURN;
    END IF;

    WITH legs AS (
        SELECT u.debit AS account_id, -u.amount AS delta,
               CASE WHEN u.hold_id IS NULL THEN 0 ELSE -u.amount END AS held_delta,
               u.hold_id, 2 * u.i AS ord
          FROM unnest(p_debits, p_amounts, p_holds) WITH ORDINALITY AS u(debit, amount, hold_id, i)
        UNION ALL
        SELECT u.credit, u.amount, 0, NULL::bigint, 2 * u.i + 1
          FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)
    ), entries AS (
        INSERT INTO journal_entry (transaction_id, account_id, asset, amount, balance_after, hold_id)
        SELECT v_id, l.account_id, a.asset, l.delta,
               b.posted + sum(l.delta) OVER (PARTITION BY l.account_id ORDER BY l.ord), l.hold_id
          FROM legs l
          JOIN account a ON a.id = l.account_id
          JOIN account_balance b ON b.account_id = l.account_id
         ORDER BY l.ord
        RETURNING 1
    )
    UPDATE account_balance b
       SET posted = b.posted + n.delta, held = b.held + n.held_delta, last_transaction_id = v_id
      FROM (SELECT account_id, sum(delta) AS delta, sum(held_delta) AS held_delta
              FROM legs GROUP BY account_id) n
     WHERE b.account_id = n.account_id;

    UPDATE hold h
       SET captured = h.captured + c.total,
           state = CASE WHEN h.captured + c.total + h.released = h.amount THEN 'captured' ELSE h.state END,
           resolved_at = CASE WHEN h.captured + c.total + h.released = h.amount THEN now() ELSE NULL END
      FROM (SELECT hold_id, sum(amount) AS total
              FROM unnest(p_holds, p_amounts) AS u(hold_id, amount)
             WHERE hold_id IS NOT NULL GROUP BY hold_id) c
     WHERE h.id = c.hold_id;

    RETURN QUERY SELECT 'created', v_id, NULL::integer;
END $$;
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(GUARDS)
    op.execute(POST_FUNCTION)


def downgrade() -> None:
    raise NotImplementedError("the ledger schema is not downgraded: the journal is append-only")
