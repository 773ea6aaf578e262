"""Ledger: `ledger_apply`, several hold and posting commands in one statement (one round trip).

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
insufficient_funds). It is what an amended order that needs a bigger reservation does.

Commands are given as parallel arrays (one element per command); a posting's transfers are the
slice p_first .. p_first + p_count - 1 of the transfer arrays. Answers: one row per command, in
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
    p_owners text[], p_refs text[], p_holds bigint[], p_meta jsonb,
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
    v_old hold;
    v_new hold;
    v_available numeric;
    v_may_go_negative boolean;
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
                                     p_refs[i], NULL) r;
            status := v_hold.status;
            id := v_hold.hold_id;
        WHEN 'release' THEN
            SELECT r.status, (r.hold_row).id AS hold_id INTO v_hold
              FROM ledger_resolve_hold(p_holds[i], 'released', p_owners[i], NULL) r;
            status := v_hold.status;
            id := coalesce(v_hold.hold_id, p_holds[i]);
        WHEN 'replace' THEN
            -- A replay of the new hold's key answers like place_hold's replay.
            SELECT * INTO v_new FROM hold h WHERE h.idempotency_key = p_keys[i];
            IF FOUND THEN
                status := CASE WHEN v_new.content_hash = p_hashes[i] THEN 'exists' ELSE 'idempotency_conflict' END;
                id := v_new.id;
            ELSE
                -- The posting lock order: the account's balance shards, then the hold row.
                SELECT sum(b.posted) - sum(b.held) INTO v_available
                  FROM (SELECT s.posted, s.held FROM account_balance s
                         WHERE s.account_id = p_accounts[i] ORDER BY s.shard FOR UPDATE) b;
                SELECT * INTO v_old FROM hold h WHERE h.id = p_holds[i] FOR UPDATE;
                SELECT a.may_go_negative INTO v_may_go_negative FROM account a WHERE a.id = p_accounts[i];
                IF v_available IS NULL THEN
                    status := 'account_not_found';
                ELSIF v_old.id IS NULL THEN
                    status := 'hold_not_found';
                ELSIF v_old.owner <> p_owners[i] THEN
                    status := 'hold_owner_mismatch';
                ELSIF v_old.account_id <> p_accounts[i] THEN
                    status := 'hold_account_mismatch';
                ELSIF v_old.state <> 'pending' THEN
                    status := 'hold_already_resolved';
                ELSIF NOT v_may_go_negative
                      AND v_available + (v_old.amount - v_old.captured - v_old.released) < p_amounts[i] THEN
                    status := 'insufficient_funds';
                ELSE
                    SELECT r.status INTO status FROM ledger_resolve_hold(p_holds[i], 'released', p_owners[i], NULL) r;
                    IF status = 'created' THEN
                        SELECT r.status, (r.hold_row).id AS hold_id INTO v_hold
                          FROM ledger_place_hold(p_keys[i], p_hashes[i], p_accounts[i], p_amounts[i], p_owners[i],
                                                 p_refs[i], NULL) r;
                        status := v_hold.status;
                        id := v_hold.hold_id;
                        IF status NOT IN ('created', 'exists') THEN  -- cannot happen under the locks
                            RAISE EXCEPTION 'ledger: replacing hold % failed after its release: %', p_holds[i], status
                                USING ERRCODE = 'internal_error';
                        END IF;
                    END IF;
                END IF;
            END IF;
        ELSE
            status := 'invalid_request';
        END CASE;
        RETURN NEXT;
    END LOOP;
END $$;
"""


def upgrade() -> None:
    op.execute(APPLY_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION ledger_apply")
