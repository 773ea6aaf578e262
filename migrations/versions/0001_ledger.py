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
    -- How many account_balance rows carry this account's projection (see account_balance).
    balance_shards   integer NOT NULL DEFAULT 1 CHECK (balance_shards BETWEEN 1 AND 64),
    closed_at        timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Derived: rebuildable from journal_entry and hold at any time (rebuild_projections()).
-- One row per shard (0 .. balance_shards - 1); the account's balance is the sum over its shards.
-- A hot account (fee income, a deposit pool) has several shards so that postings which cannot
-- break its limits each lock one shard instead of queueing on one row through every commit's
-- fsync; a posting that could break a limit locks all shards and checks the sum. held lives on
-- shard 0 only.
CREATE TABLE account_balance (
    account_id           bigint NOT NULL REFERENCES account(id),
    shard                integer NOT NULL DEFAULT 0 CHECK (shard >= 0),
    posted               numeric(78,0) NOT NULL DEFAULT 0,
    held                 numeric(78,0) NOT NULL DEFAULT 0 CHECK (held >= 0),
    last_transaction_id  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, shard),
    CHECK (shard = 0 OR held = 0)
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
-- posted balance after this entry for an account with one balance shard (its entries are written
-- in id order under its one lock); NULL for a sharded account, whose postings do not serialise:
-- its statement computes running balances at read time.
CREATE TABLE journal_entry (
    id              bigserial PRIMARY KEY,
    -- transaction_id and account_id are checked once per INSERT statement by the trigger
    -- journal_entry_references (below) instead of per row by foreign keys: per-row checks cost
    -- about as much as the rest of a 1,000-transfer batch. Neither referenced row can go away:
    -- journal transactions are append-only, accounts are never deleted, truncated or renumbered.
    transaction_id  bigint NOT NULL,
    account_id      bigint NOT NULL,
    asset           text NOT NULL,
    amount          numeric(78,0) NOT NULL CHECK (amount <> 0),
    balance_after   numeric(78,0),
    hold_id         bigint REFERENCES hold(id)
);
-- amount included: a sharded account's statement sums earlier entries with an index-only scan.
CREATE INDEX journal_entry_account ON journal_entry (account_id, id) INCLUDE (amount);
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
CREATE TRIGGER account_no_truncate BEFORE TRUNCATE ON account
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER account_id_fixed BEFORE UPDATE OF id ON account
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- Entries may only join a journal transaction created in the same database transaction, so a
-- committed transaction can never gain entries later; and each names an existing account and
-- carries that account's asset. One set-based check per INSERT statement (see journal_entry).
CREATE FUNCTION ledger_entries_references() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_orphan_tx boolean;
    v_bad_account boolean;
BEGIN
    SELECT bool_or(t.id IS NULL OR t.created_txid <> pg_current_xact_id()),
           bool_or(a.id IS NULL OR a.asset <> n.asset)
      INTO v_orphan_tx, v_bad_account
      FROM new_rows n
      LEFT JOIN journal_transaction t ON t.id = n.transaction_id
      LEFT JOIN account a ON a.id = n.account_id;
    IF v_orphan_tx THEN
        RAISE EXCEPTION 'ledger: entries may only be added to a journal transaction in the '
                        'database transaction that created it' USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF v_bad_account THEN
        RAISE EXCEPTION 'ledger: an entry must name an existing account and carry its asset'
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER journal_entry_references AFTER INSERT ON journal_entry
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_references();

-- Deferred to commit: every journal transaction has entries and they sum to zero per asset.
CREATE FUNCTION ledger_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_assets integer;
    v_bad text;
BEGIN
    SELECT count(*), min(asset) FILTER (WHERE total <> 0) INTO v_assets, v_bad
        FROM (SELECT asset, sum(amount) AS total FROM journal_entry WHERE transaction_id = NEW.id
              GROUP BY asset) s;
    IF v_assets = 0 THEN
        RAISE EXCEPTION 'ledger: journal transaction % has no entries', NEW.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'ledger: journal transaction % does not balance in %', NEW.id, v_bad
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER journal_transaction_balanced AFTER INSERT ON journal_transaction
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_check_balanced();
"""

# The one path by which entries reach the journal. Validates (under row locks where it matters),
# then writes the transaction, its entries (with running balances), the projection and hold
# captures in one go: four SQL statements for a plain transfer.
# Returns a status instead of raising so that a refusal writes nothing and callers read a code,
# never an error text. Check order = precedence of the codes.
#
# Locking: balance rows are locked in (account_id, shard) order, so postings never deadlock. An
# account with one shard is locked whole. For a sharded account, a posting whose net effect on it
# cannot break its limits (a credit where it may not go negative, a debit where it may not go
# positive, anything where it has no limits; never a hold capture) locks ONE shard, the first free
# one from a per-backend starting point (SKIP LOCKED, waiting only when all are busy), and puts
# the account's delta there; any other posting locks every shard and checks the sum.
POST_FUNCTION = """
CREATE FUNCTION ledger_post(
    p_key text, p_hash text, p_kind text, p_metadata jsonb,
    p_debits bigint[], p_credits bigint[], p_amounts numeric[], p_holds bigint[],
    p_hold_owner text, p_reverses bigint
) RETURNS TABLE (status text, transaction_id bigint, failed_index integer)
-- Plan once per session (re-planning on every call cost more than running the statements), and
-- plan for key lookups: a generic plan made while the tables are small would otherwise pick
-- sequential scans and hash joins, whose cost grows with the table (and its dead row versions).
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_id bigint;
    v_hash text;
    v_bad integer;
    v_status text;
    v_accounts bigint[];   -- touched accounts, ascending
    v_shards integer[];    -- their balance_shards
    v_whole boolean[];     -- lock every shard (true) or one (false)
    v_target integer[];    -- the shard that takes the account's delta
    v_shard integer;
    v_near_max boolean;
    v_captures boolean := cardinality(array_remove(p_holds, NULL)) > 0;
    v_start integer := pg_backend_pid();
    c_max constant numeric := 10::numeric ^ 78 - 1;
BEGIN
    -- 1. One pass before any lock: an earlier posting of the key (a replay answers at once), the
    --    first transfer whose accounts are missing, closed or in different assets, and per touched
    --    account whether it must be locked whole, decided from the batch's net effect on it.
    --    Amounts within a factor of the NUMERIC(78,0) range also lock whole, so that step 6 can
    --    bound a sharded account's total exactly (never reached by real amounts).
    SELECT r.id, r.content_hash, v.bad, v.why, x.accounts, x.shards, x.whole
      INTO v_id, v_hash, v_bad, v_status, v_accounts, v_shards, v_whole
      FROM (SELECT array_agg(n.account_id ORDER BY n.account_id) AS accounts,
                   array_agg(coalesce(a.balance_shards, 1) ORDER BY n.account_id) AS shards,
                   array_agg(coalesce(a.balance_shards, 1) = 1 OR n.captures
                             OR (NOT a.may_go_negative AND n.delta < 0)
                             OR (NOT a.may_go_positive AND n.delta > 0)
                             OR n.volume > c_max / (4 * a.balance_shards)
                             OR (SELECT sum(abs(s.posted)) FROM account_balance s WHERE s.account_id = a.id) > c_max / 4
                             ORDER BY n.account_id) AS whole
              FROM (SELECT account_id, sum(delta) AS delta, sum(abs(delta)) AS volume, bool_or(capture) AS captures
                      FROM (SELECT u.debit AS account_id, -u.amount AS delta, u.hold_id IS NOT NULL AS capture
                              FROM unnest(p_debits, p_amounts, p_holds) AS u(debit, amount, hold_id)
                            UNION ALL
                            SELECT u.credit, u.amount, false
                              FROM unnest(p_credits, p_amounts) AS u(credit, amount)) legs
                     GROUP BY account_id) n
              LEFT JOIN account a ON a.id = n.account_id) x
     CROSS JOIN (SELECT min(l.i) - 1 AS bad, CASE
                        WHEN bool_or(d.id IS NULL OR c.id IS NULL) THEN 'account_not_found'
                        WHEN bool_or(d.closed_at IS NOT NULL OR c.closed_at IS NOT NULL) THEN 'account_closed'
                        ELSE 'asset_mismatch' END AS why
                   FROM unnest(p_debits, p_credits) WITH ORDINALITY AS l(debit, credit, i)
                   LEFT JOIN account d ON d.id = l.debit
                   LEFT JOIN account c ON c.id = l.credit
                  WHERE d.id IS NULL OR c.id IS NULL OR d.closed_at IS NOT NULL OR c.closed_at IS NOT NULL
                        OR d.asset <> c.asset) v
      LEFT JOIN journal_transaction r ON r.idempotency_key = p_key;
    IF v_id IS NOT NULL THEN
        status := CASE WHEN v_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END;
        transaction_id := v_id;
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_bad IS NOT NULL THEN
        status := v_status;
        failed_index := v_bad;
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_accounts IS NULL THEN  -- no transfers at all
        status := 'invalid_request';
        RETURN NEXT;
        RETURN;
    END IF;
    v_status := NULL;

    -- 2. Lock the balance rows in (account_id, shard) order (no deadlocks between postings).
    IF NOT (false = ANY (v_whole)) THEN
        PERFORM 1 FROM account_balance b
            WHERE b.account_id = ANY (v_accounts) ORDER BY b.account_id, b.shard FOR UPDATE;
        v_target := array_fill(0, ARRAY[cardinality(v_accounts)]);
    ELSE
        v_target := array_fill(0, ARRAY[cardinality(v_accounts)]);
        FOR i IN 1 .. cardinality(v_accounts) LOOP
            IF v_whole[i] THEN
                PERFORM 1 FROM account_balance b
                    WHERE b.account_id = v_accounts[i] ORDER BY b.shard FOR UPDATE;
            ELSE
                SELECT b.shard INTO v_shard FROM account_balance b
                    WHERE b.account_id = v_accounts[i]
                    ORDER BY (b.shard + v_start) % v_shards[i] LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF v_shard IS NULL THEN  -- every shard busy: queue on this backend's own
                    v_shard := v_start % v_shards[i];
                    PERFORM 1 FROM account_balance b
                        WHERE b.account_id = v_accounts[i] AND b.shard = v_shard FOR UPDATE;
                END IF;
                v_target[i] := v_shard;
                v_shard := NULL;
            END IF;
        END LOOP;
    END IF;

    -- 3. Captures: the hold exists, belongs to the caller, is on the debited account, is pending,
    --    has not timed out, and is not overdrawn (summing all captures of one hold in the batch).
    IF v_captures THEN
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
        IF v_bad IS NULL THEN
            SELECT min(l.first_i) - 1 INTO v_bad
                FROM (SELECT hold_id, sum(amount) AS total, min(i) AS first_i
                      FROM unnest(p_holds, p_amounts) WITH ORDINALITY AS u(hold_id, amount, i)
                      WHERE hold_id IS NOT NULL GROUP BY hold_id) l
                JOIN hold h ON h.id = l.hold_id
                WHERE l.total > h.amount - h.captured - h.released;
            v_status := CASE WHEN v_bad IS NOT NULL THEN 'hold_exceeded' END;
        END IF;
    END IF;

    -- 4. Reversals happen once.
    IF v_bad IS NULL AND p_reverses IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM journal_transaction WHERE id = p_reverses) THEN
            v_status := 'transaction_not_found';
        ELSIF EXISTS (SELECT 1 FROM journal_transaction WHERE reverses_id = p_reverses) THEN
            v_status := 'already_reversed';
        END IF;
    END IF;

    -- 5. Under the locks: no account was closed since step 1, and the balance limits hold on the
    --    batch's net effect per account, against the sum of its shards. Only accounts locked whole
    --    can fail a limit (step 1 sent the others to one shard because their net effect cannot
    --    break one). The same pass bounds every balance by NUMERIC(78,0) cheaply (overflow would
    --    otherwise be a raw error instead of a code) and flags the batch for the exact check of
    --    step 6 (in practice never: only amounts within a factor of 10^78 get there).
    IF v_bad IS NULL AND v_status IS NULL THEN
        SELECT min(n.first_i) FILTER (
                   WHERE a.closed_at IS NOT NULL
                      OR (NOT a.may_go_negative AND n.delta < 0 AND b.posted + n.delta - (b.held + n.held_delta) < 0)
                      OR (NOT a.may_go_positive AND n.delta > 0 AND b.posted + n.delta > 0)) - 1,
               CASE WHEN bool_or(a.closed_at IS NOT NULL) THEN 'account_closed'
                    WHEN bool_or(NOT a.may_go_negative AND n.delta < 0
                                 AND b.posted + n.delta - (b.held + n.held_delta) < 0) THEN 'insufficient_funds'
                    ELSE 'limit_exceeded' END,
               sum(b.magnitude + n.volume) > c_max / 4
            INTO v_bad, v_status, v_near_max
            FROM (SELECT account_id, sum(delta) AS delta, sum(abs(delta)) AS volume, sum(held_delta) AS held_delta,
                         min(i) AS first_i
                  FROM (SELECT u.debit AS account_id, -u.amount AS delta,
                               CASE WHEN u.hold_id IS NULL THEN 0 ELSE -u.amount END AS held_delta, u.i
                          FROM unnest(p_debits, p_amounts, p_holds) WITH ORDINALITY AS u(debit, amount, hold_id, i)
                        UNION ALL
                        SELECT u.credit, u.amount, 0, u.i
                          FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)) legs
                  GROUP BY account_id) n
            JOIN account a ON a.id = n.account_id
            JOIN (SELECT s.account_id, sum(s.posted) AS posted, sum(s.held) AS held, sum(abs(s.posted)) AS magnitude
                    FROM account_balance s WHERE s.account_id = ANY (v_accounts) GROUP BY s.account_id) b
              ON b.account_id = n.account_id;
        IF v_bad IS NULL THEN
            v_status := NULL;
        END IF;
    END IF;

    -- 6. Every balance must fit NUMERIC(78,0): each stored shard after each leg (the running
    --    balance_after of a one-shard account), and each account's total. A sharded account
    --    updated on one shard must also stay below half the range, counting what it reads now on
    --    every shard: together with step 1 (small amounts only) this bounds what postings still
    --    in flight on its other shards can add.
    IF v_status IS NULL AND v_near_max THEN
        SELECT min(n.first_i) - 1 INTO v_bad
            FROM (SELECT account_id, sum(delta) AS delta, min(i) AS first_i
                    FROM (SELECT u.debit AS account_id, -u.amount AS delta, u.i
                            FROM unnest(p_debits, p_amounts) WITH ORDINALITY AS u(debit, amount, i)
                          UNION ALL
                          SELECT u.credit, u.amount, u.i
                            FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)) l
                   GROUP BY account_id) n
            JOIN unnest(v_accounts, v_whole) AS t(account_id, whole) ON t.account_id = n.account_id
            JOIN (SELECT s.account_id, sum(s.posted) AS posted, sum(abs(s.posted)) AS magnitude
                    FROM account_balance s WHERE s.account_id = ANY (v_accounts) GROUP BY s.account_id) b
              ON b.account_id = n.account_id
            WHERE abs(b.posted + n.delta) > c_max
               OR (NOT t.whole AND b.magnitude + abs(n.delta) > c_max / 2);
        IF v_bad IS NULL THEN
            SELECT min(r.i) - 1 INTO v_bad
                FROM (SELECT l.i, l.account_id,
                             b.posted + sum(l.delta) OVER (PARTITION BY l.account_id ORDER BY l.ord) AS after
                        FROM (SELECT u.debit AS account_id, -u.amount AS delta, 2 * u.i AS ord, u.i
                                FROM unnest(p_debits, p_amounts) WITH ORDINALITY AS u(debit, amount, i)
                              UNION ALL
                              SELECT u.credit, u.amount, 2 * u.i + 1, u.i
                                FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)) l
                        JOIN unnest(v_accounts, v_target) AS t(account_id, shard) ON t.account_id = l.account_id
                        JOIN account_balance b ON b.account_id = t.account_id AND b.shard = t.shard) r
                WHERE abs(r.after) > c_max;
        END IF;
        IF v_bad IS NOT NULL THEN
            v_status := 'limit_exceeded';
        END IF;
    END IF;

    -- A refusal under the locks may be a replay whose original we waited for: it answers first.
    IF v_status IS NOT NULL THEN
        SELECT t.id, t.content_hash INTO v_id, v_hash FROM journal_transaction t
            WHERE t.idempotency_key = p_key;
        IF v_id IS NOT NULL THEN
            status := CASE WHEN v_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END;
            transaction_id := v_id;
        ELSE
            status := v_status;
            failed_index := v_bad;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;

    -- 7. Write the transaction, its entries and the projection in one statement. If the key's
    --    unique constraint says a concurrent posting of it won (with other accounts, so no lock
    --    stopped it), nothing is written and the original answers.
    WITH tx AS (
        INSERT INTO journal_transaction (idempotency_key, content_hash, kind, metadata, reverses_id)
        VALUES (p_key, p_hash, p_kind, coalesce(p_metadata, '{}'::jsonb), p_reverses)
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING id
    ), legs AS (
        SELECT u.debit AS account_id, -u.amount AS delta,
               CASE WHEN u.hold_id IS NULL THEN 0 ELSE -u.amount END AS held_delta,
               u.hold_id, 2 * u.i AS ord
          FROM unnest(p_debits, p_amounts, p_holds) WITH ORDINALITY AS u(debit, amount, hold_id, i)
        UNION ALL
        SELECT u.credit, u.amount, 0, NULL::bigint, 2 * u.i + 1
          FROM unnest(p_credits, p_amounts) WITH ORDINALITY AS u(credit, amount, i)
    ), targets AS (
        SELECT * FROM unnest(v_accounts, v_shards, v_target) AS t(account_id, shards, shard)
    ), entries AS (
        INSERT INTO journal_entry (transaction_id, account_id, asset, amount, balance_after, hold_id)
        SELECT tx.id, l.account_id, a.asset, l.delta,
               CASE WHEN t.shards = 1
                    THEN b.posted + sum(l.delta) OVER (PARTITION BY l.account_id ORDER BY l.ord) END,
               l.hold_id
          FROM tx, legs l
          JOIN account a ON a.id = l.account_id
          JOIN targets t ON t.account_id = l.account_id
          JOIN account_balance b ON b.account_id = t.account_id AND b.shard = t.shard
         ORDER BY l.ord
        RETURNING 1
    ), projection AS (
        UPDATE account_balance b
           SET posted = b.posted + n.delta, held = b.held + n.held_delta, last_transaction_id = tx.id
          FROM tx, (SELECT l.account_id, t.shard, sum(l.delta) AS delta, sum(l.held_delta) AS held_delta
                      FROM legs l JOIN targets t ON t.account_id = l.account_id
                     GROUP BY l.account_id, t.shard) n
         WHERE b.account_id = n.account_id AND b.shard = n.shard
        RETURNING 1
    )
    SELECT tx.id INTO v_id FROM tx;
    IF v_id IS NULL THEN
        SELECT t.id, t.content_hash INTO v_id, v_hash FROM journal_transaction t
            WHERE t.idempotency_key = p_key;
        status := CASE WHEN v_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END;
        transaction_id := v_id;
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_captures THEN
        UPDATE hold h
           SET captured = h.captured + c.total,
               state = CASE WHEN h.captured + c.total + h.released = h.amount THEN 'captured' ELSE h.state END,
               resolved_at = CASE WHEN h.captured + c.total + h.released = h.amount THEN now() ELSE NULL END
          FROM (SELECT hold_id, sum(amount) AS total
                  FROM unnest(p_holds, p_amounts) AS u(hold_id, amount)
                 WHERE hold_id IS NOT NULL GROUP BY hold_id) c
         WHERE h.id = c.hold_id;
    END IF;

    status := 'created';
    transaction_id := v_id;
    RETURN NEXT;
END $$;
"""

# Holds, each one statement: lock every balance shard of the account, then the hold row (the
# posting lock order), check, write, and return the hold's row with a status like ledger_post.
HOLD_FUNCTIONS = """
CREATE FUNCTION ledger_place_hold(
    p_key text, p_hash text, p_account bigint, p_amount numeric, p_owner text, p_reference text,
    p_expires timestamptz
) RETURNS TABLE (status text, available numeric, hold_row hold)
-- Plan once per session (re-planning on every call cost more than running the statements), and
-- plan for key lookups: a generic plan made while the tables are small would otherwise pick
-- sequential scans and hash joins, whose cost grows with the table (and its dead row versions).
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_posted numeric;
    v_held numeric;
    v_hold hold;
    v_account account;
    c_max constant numeric := 10::numeric ^ 78 - 1;
BEGIN
    SELECT sum(b.posted), sum(b.held) INTO v_posted, v_held
        FROM (SELECT s.posted, s.held FROM account_balance s
               WHERE s.account_id = p_account ORDER BY s.shard FOR UPDATE) b;
    IF v_posted IS NULL THEN
        RETURN QUERY SELECT 'account_not_found', NULL::numeric, NULL::hold;
        RETURN;
    END IF;
    SELECT * INTO v_hold FROM hold h WHERE h.idempotency_key = p_key;
    IF FOUND THEN
        RETURN QUERY SELECT CASE WHEN v_hold.content_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END,
                            NULL::numeric, v_hold;
        RETURN;
    END IF;
    SELECT * INTO v_account FROM account a WHERE a.id = p_account;
    IF v_account.closed_at IS NOT NULL THEN
        RETURN QUERY SELECT 'account_closed', NULL::numeric, NULL::hold;
        RETURN;
    END IF;
    IF NOT v_account.may_go_negative AND v_posted - v_held < p_amount THEN
        RETURN QUERY SELECT 'insufficient_funds', v_posted - v_held, NULL::hold;
        RETURN;
    END IF;
    IF v_held + p_amount > c_max THEN
        RETURN QUERY SELECT 'limit_exceeded', v_posted - v_held, NULL::hold;
        RETURN;
    END IF;
    INSERT INTO hold (idempotency_key, content_hash, account_id, amount, owner, reference, expires_at)
        VALUES (p_key, p_hash, p_account, p_amount, p_owner, p_reference, p_expires)
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING * INTO v_hold;
    IF v_hold.id IS NULL THEN  -- the same key raced in on another account: compare like any replay
        SELECT * INTO v_hold FROM hold h WHERE h.idempotency_key = p_key;
        RETURN QUERY SELECT CASE WHEN v_hold.content_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END,
                            NULL::numeric, v_hold;
        RETURN;
    END IF;
    UPDATE account_balance b SET held = b.held + p_amount WHERE b.account_id = p_account AND b.shard = 0;
    RETURN QUERY SELECT 'created', NULL::numeric, v_hold;
END $$;

-- Release (p_state 'released', by its owner) or expire (p_state 'expired', p_owner NULL: the job,
-- only once the timeout has passed at p_now) what remains of a pending hold. Resolving it again
-- into the same state answers 'exists'.
CREATE FUNCTION ledger_resolve_hold(p_hold bigint, p_state text, p_owner text, p_now timestamptz)
RETURNS TABLE (status text, hold_row hold)
-- Plan once per session (re-planning on every call cost more than running the statements), and
-- plan for key lookups: a generic plan made while the tables are small would otherwise pick
-- sequential scans and hash joins, whose cost grows with the table (and its dead row versions).
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_account bigint;
    v_hold hold;
BEGIN
    SELECT h.account_id INTO v_account FROM hold h WHERE h.id = p_hold;
    IF v_account IS NULL THEN
        RETURN QUERY SELECT 'hold_not_found', NULL::hold;
        RETURN;
    END IF;
    PERFORM 1 FROM account_balance b WHERE b.account_id = v_account ORDER BY b.shard FOR UPDATE;
    SELECT * INTO v_hold FROM hold h WHERE h.id = p_hold FOR UPDATE;
    IF p_owner IS NOT NULL AND v_hold.owner <> p_owner THEN
        RETURN QUERY SELECT 'hold_owner_mismatch', NULL::hold;
        RETURN;
    END IF;
    IF v_hold.state <> 'pending' THEN
        RETURN QUERY SELECT CASE WHEN v_hold.state = p_state THEN 'exists' ELSE 'hold_already_resolved' END, v_hold;
        RETURN;
    END IF;
    IF p_state = 'expired' AND (v_hold.expires_at IS NULL OR v_hold.expires_at > coalesce(p_now, now())) THEN
        RETURN QUERY SELECT 'not_timed_out', v_hold;
        RETURN;
    END IF;
    UPDATE account_balance b SET held = b.held - (v_hold.amount - v_hold.captured - v_hold.released)
        WHERE b.account_id = v_account AND b.shard = 0;
    UPDATE hold h SET released = h.amount - h.captured, state = p_state, resolved_at = now()
        WHERE h.id = p_hold RETURNING * INTO v_hold;
    RETURN QUERY SELECT 'created', v_hold;
END $$;
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(GUARDS)
    op.execute(POST_FUNCTION)
    op.execute(HOLD_FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("the ledger schema is not downgraded: the journal is append-only")
