"""Ledger: `ledger_apply`, several hold and posting commands in one statement (one round trip), and
leaner single hold commands.

Revision ID: 0009_ledger_apply
Revises: 0008_lean_posting

A caller with a unit of work of many small ledger commands (the matching gateway settling a group
commit: holds, releases, fills) sends them together instead of one round trip each. Each command
runs through the same function as when sent alone (`ledger_place_hold`, `ledger_resolve_hold`,
`ledger_post`), in the order given, inside the caller's database transaction, and answers with the
same status it would alone; a refusal writes nothing for that command and does not stop the ones
after it (the caller decides what a refusal means for its transaction).

One command exists only here: `replace` swaps an order's pending hold for a new one in one step,
counting what the old hold still reserves as available (the old hold is released and the new one
placed only if the new amount fits; otherwise nothing changes and the answer is
insufficient_funds). It is what an amended order that needs a bigger reservation does. It writes
the rows a release and a placement write, with the checks of both, in fewer statements: a
bigger reservation is the most frequent ledger command of a busy order book.

Commands are given as parallel arrays (one element per command); a posting's transfers are the
slice p_first .. p_first + p_count - 1 of the transfer arrays; p_ids optionally names the id a
placed or replacing hold gets (reserved from hold_id_seq beforehand). Answers: one row per command, in
order: status, the hold id (hold, replace, release) or journal transaction id (post), and a
posting's failed transfer index.
"""
from alembic import op

revision = "0009_ledger_apply"
down_revision = "0008_lean_posting"
branch_labels = None
depends_on = None

APPLY_FUNCTION = """
CREATE FUNCTION ledger_apply(
    p_ops text[], p_keys text[], p_hashes text[], p_accounts bigint[], p_amounts numeric[],
    p_owners text[], p_refs text[], p_holds bigint[], p_ids bigint[], p_meta jsonb,
    p_first integer[], p_count integer[],
    p_debits bigint[], p_credits bigint[], p_transfer_amounts numeric[], p_transfer_holds bigint[]
) RETURNS TABLE (status text, id bigint, failed_index integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_first integer;
    v_last integer;
    v_post record;
    v_hold record;
    v_old_row record;
    v_found boolean;
    v_new hold;
    v_available numeric;
    v_remaining numeric;
    v_held numeric;
    c_max constant numeric := 10::numeric ^ 78 - 1;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ops), 0) LOOP
        status := NULL;
        id := NULL;
        failed_index := NULL;
        CASE p_ops[i]
        WHEN 'post' THEN
            v_first := p_first[i];
            v_last := p_first[i] + p_count[i] - 1;
            SELECT * INTO v_post FROM ledger_post(
                p_keys[i], p_hashes[i], p_refs[i], p_meta -> (i - 1),
                p_debits[v_first:v_last], p_credits[v_first:v_last], p_transfer_amounts[v_first:v_last],
                p_transfer_holds[v_first:v_last], p_owners[i], NULL);
            status := v_post.status;
            id := v_post.transaction_id;
            failed_index := v_post.failed_index;
        WHEN 'hold' THEN
            SELECT r.status, (r.hold_row).id AS hold_id INTO v_hold
              FROM ledger_place_hold(p_keys[i], p_hashes[i], p_accounts[i], p_amounts[i], p_owners[i],
                                     p_refs[i], NULL, p_ids[i]) r;
            status := v_hold.status;
            id := v_hold.hold_id;
        WHEN 'release' THEN
            SELECT r.status, (r.hold_row).id AS hold_id INTO v_hold
              FROM ledger_resolve_hold(p_holds[i], 'released', p_owners[i], NULL) r;
            status := v_hold.status;
            id := coalesce(v_hold.hold_id, p_holds[i]);
        WHEN 'replace' THEN
            -- The posting lock order: the account's balance shards, then the hold row with the
            -- account's flags (read after the balance lock, so a close committed meanwhile is seen).
            SELECT sum(b.posted) - sum(b.held), sum(b.held) INTO v_available, v_held
              FROM (SELECT s.posted, s.held FROM account_balance s
                     WHERE s.account_id = p_accounts[i] ORDER BY s.shard FOR UPDATE) b;
            SELECT h.*, a.may_go_negative, a.closed_at IS NOT NULL AS closed INTO v_old_row
              FROM hold h LEFT JOIN account a ON a.id = p_accounts[i]
             WHERE h.id = p_holds[i] AND h.account_id = p_accounts[i] FOR UPDATE OF h;
            v_found := FOUND;
            IF NOT v_found THEN  -- missing, or on another account: read it unlocked (its account's
                                 -- balance rows are not locked here, so neither is the hold)
                SELECT h.*, NULL::boolean AS may_go_negative, NULL::boolean AS closed INTO v_old_row
                  FROM hold h WHERE h.id = p_holds[i];
                v_found := FOUND;
            END IF;
            IF v_found THEN
                v_remaining := v_old_row.amount - v_old_row.captured - v_old_row.released;
            END IF;
            IF v_available IS NULL THEN
                status := 'account_not_found';
            ELSIF NOT v_found THEN
                status := 'hold_not_found';
            ELSIF v_old_row.owner <> p_owners[i] THEN
                status := 'hold_owner_mismatch';
            ELSIF v_old_row.account_id <> p_accounts[i] THEN
                status := 'hold_account_mismatch';
            ELSIF v_old_row.state <> 'pending' THEN
                status := 'hold_already_resolved';
            ELSIF v_old_row.closed THEN
                status := 'account_closed';
            ELSIF NOT v_old_row.may_go_negative AND v_available + v_remaining < p_amounts[i] THEN
                status := 'insufficient_funds';
            ELSIF v_held - v_remaining + p_amounts[i] > c_max THEN
                status := 'limit_exceeded';
            ELSIF p_ids[i] IS NOT NULL AND (p_ids[i] < 1 OR p_ids[i] > (SELECT s.last_value FROM hold_id_seq s)) THEN
                status := 'invalid_request';  -- not an id reserved from the sequence
            ELSE
                -- Place the new hold and release what remains of the old one: the rows
                -- ledger_place_hold and ledger_resolve_hold write, in three statements.
                INSERT INTO hold (id, idempotency_key, content_hash, account_id, amount, owner, reference)
                    VALUES (coalesce(p_ids[i], nextval('hold_id_seq')), p_keys[i], p_hashes[i], p_accounts[i],
                            p_amounts[i], p_owners[i], p_refs[i])
                    ON CONFLICT (idempotency_key) DO NOTHING
                    RETURNING hold.id INTO id;
                IF id IS NOT NULL THEN
                    UPDATE hold h SET released = h.amount - h.captured, state = 'released', resolved_at = now()
                     WHERE h.id = v_old_row.id;
                    UPDATE account_balance b SET held = b.held - v_remaining + p_amounts[i]
                     WHERE b.account_id = p_accounts[i] AND b.shard = 0;
                    status := 'created';
                END IF;
            END IF;
            -- Refused, or the new key exists: a replay of the new hold's key answers first, like
            -- place_hold's replay (a replayed replacement finds its old hold released).
            IF status IS DISTINCT FROM 'created' THEN
                SELECT * INTO v_new FROM hold h WHERE h.idempotency_key = p_keys[i];
                IF FOUND THEN
                    status := CASE WHEN v_new.content_hash = p_hashes[i] THEN 'exists' ELSE 'idempotency_conflict' END;
                    id := v_new.id;
                END IF;
            END IF;
        ELSE
            status := 'invalid_request';
        END CASE;
        RETURN NEXT;
    END LOOP;
END $$;
"""


# The single hold commands of 0001 with the same checks, order and answers, in fewer
# statements: the idempotency key is looked up only when the command is refused or its INSERT finds
# the key taken (a replay answers first either way), a release finds the hold's account inside the
# locking statement, and the answer is assigned to the output columns instead of selected by one
# more query. A hold may be placed under an id reserved beforehand from hold_id_seq
# (`Ledger.reserve_hold_ids`), so a caller that queues commands can name the hold in later commands
# of the same batch before the batch is sent.
HOLD_FUNCTIONS = """
DROP FUNCTION ledger_place_hold(text, text, bigint, numeric, text, text, timestamptz);
CREATE FUNCTION ledger_place_hold(
    p_key text, p_hash text, p_account bigint, p_amount numeric, p_owner text, p_reference text,
    p_expires timestamptz, p_id bigint DEFAULT NULL
) RETURNS TABLE (status text, available numeric, hold_row hold)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_posted numeric;
    v_held numeric;
    v_hold hold;
    v_closed boolean;
    v_may_go_negative boolean;
    c_max constant numeric := 10::numeric ^ 78 - 1;
BEGIN
    SELECT sum(b.posted), sum(b.held) INTO v_posted, v_held
        FROM (SELECT s.posted, s.held FROM account_balance s
               WHERE s.account_id = p_account ORDER BY s.shard FOR UPDATE) b;
    IF v_posted IS NULL THEN
        status := 'account_not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_id IS NOT NULL AND (p_id < 1 OR p_id > (SELECT s.last_value FROM hold_id_seq s)) THEN
        status := 'invalid_request';  -- not an id reserved from the sequence
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT a.closed_at IS NOT NULL, a.may_go_negative INTO v_closed, v_may_go_negative
        FROM account a WHERE a.id = p_account;
    IF v_closed THEN
        status := 'account_closed';
    ELSIF NOT v_may_go_negative AND v_posted - v_held < p_amount THEN
        status := 'insufficient_funds';
        available := v_posted - v_held;
    ELSIF v_held + p_amount > c_max THEN
        status := 'limit_exceeded';
        available := v_posted - v_held;
    ELSE
        INSERT INTO hold (id, idempotency_key, content_hash, account_id, amount, owner, reference, expires_at)
            VALUES (coalesce(p_id, nextval('hold_id_seq')), p_key, p_hash, p_account, p_amount, p_owner,
                    p_reference, p_expires)
            ON CONFLICT (idempotency_key) DO NOTHING
            RETURNING * INTO v_hold;
    END IF;
    -- Refused, or the key exists: a replay (same key, earlier or racing in) answers first.
    IF v_hold.id IS NULL THEN
        SELECT * INTO v_hold FROM hold h WHERE h.idempotency_key = p_key;
        IF FOUND THEN
            status := CASE WHEN v_hold.content_hash = p_hash THEN 'exists' ELSE 'idempotency_conflict' END;
            available := NULL;
            hold_row := v_hold;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE account_balance b SET held = b.held + p_amount WHERE b.account_id = p_account AND b.shard = 0;
    status := 'created';
    hold_row := v_hold;
    RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION ledger_resolve_hold(p_hold bigint, p_state text, p_owner text, p_now timestamptz)
RETURNS TABLE (status text, hold_row hold)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    v_account bigint;
    v_hold hold;
BEGIN
    -- The posting lock order: the hold's account's balance shards, then the hold row.
    PERFORM 1 FROM account_balance b WHERE b.account_id = (SELECT h.account_id FROM hold h WHERE h.id = p_hold)
        ORDER BY b.shard FOR UPDATE;
    IF NOT FOUND THEN
        status := 'hold_not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT * INTO v_hold FROM hold h WHERE h.id = p_hold FOR UPDATE;
    v_account := v_hold.account_id;
    IF p_owner IS NOT NULL AND v_hold.owner <> p_owner THEN
        status := 'hold_owner_mismatch';
        RETURN NEXT;
        RETURN;
    END IF;
    hold_row := v_hold;
    IF v_hold.state <> 'pending' THEN
        status := CASE WHEN v_hold.state = p_state THEN 'exists' ELSE 'hold_already_resolved' END;
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_state = 'expired' AND (v_hold.expires_at IS NULL OR v_hold.expires_at > coalesce(p_now, now())) THEN
        status := 'not_timed_out';
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE account_balance b SET held = b.held - (v_hold.amount - v_hold.captured - v_hold.released)
        WHERE b.account_id = v_account AND b.shard = 0;
    UPDATE hold h SET released = h.amount - h.captured, state = p_state, resolved_at = now()
        WHERE h.id = p_hold RETURNING * INTO v_hold;
    status := 'created';
    hold_row := v_hold;
    RETURN NEXT;
END $$;
"""


def upgrade() -> None:
    op.execute(HOLD_FUNCTIONS)
    op.execute(APPLY_FUNCTION)


def downgrade() -> None:
    raise NotImplementedError("the ledger schema is not downgraded: the journal is append-only")
