"""Treasury adjustments approved by signatures and posted by the worker; the liquidity guard trusts no row the api writes (review 16, R1).

Revision ID: 0051_adjustment_signatures
Revises: 0050_refill_times

Why: the liquidity guard (`journal_entry_liquidity_guard`, 0033, one call per statement since 0048)
let custody_api debit a liquidity account under the key `treasury-adjustment:<id>` of a `proposed`
adjustment with `quorum` approving votes naming the leg's debit account and amount. custody_api
INSERTs both `treasury_adjustment` and `treasury_adjustment_vote` and calls `ledger_post` as
itself, so alone, under invented operator names, it proposed, "approved" and drained a liquidity
account into an account of its choosing (the credit account was not checked), twice the amount in
one posting (nor was how many legs use the one approved transfer).

What changes:
- `treasury_adjustment_vote` gains `key_id`, `scheme`, `signature`, `authenticator_data` and
  `client_data_json`: an approving vote carries the operator's signature over the adjustment's
  canonical payload (signer.approvals.adjustment_approval_payload). No CHECK requires them: a vote
  without a signature (written before this migration, or by hand) is a row, and a row approves
  nothing: it never counts towards a quorum (custody.adjustments.counted_approvers). A proposal left
  pending over this migration is approved again, by other operators, or proposed again.
- `treasury_adjustment.state` may be `approved` (proposed -> approved -> posted; custody.states).
  The api process verifies the signatures and moves a proposal to `approved`; the worker's
  `adjustments` job verifies every stored signature again against its own approver keys and posts.
- The guard (`convert_guard_liquidity_debits()`, same trigger, same WHEN on the writer) refuses every
  debit of a liquidity account custody_api writes, and one custody_worker writes unless the journal
  transaction's key is `treasury-adjustment:<id>` of an `approved` adjustment and its entries, in the
  order `ledger_post` writes them (debit then credit of each leg), are exactly the adjustment's
  transfers: same accounts, same amounts, as many legs, no hold. The owner (migrations, and
  `convert_accept`, SECURITY DEFINER) is not judged, as before. Same message and SQLSTATE (42501).
- custody_api keeps INSERT on `treasury_adjustment` but UPDATEs only `state` and `updated_at`: the
  legs, reason, quorum and proposer the signatures cover, and the posting's `transaction_id`, are
  fixed once proposed (the worker records the posting).
- custody_api may no longer emit `treasury.adjustment_posted` (`custody_api_event_topics()`, 0032):
  the worker posts, so only it (or the owner) writes that event.

Who can still do what (honest): custody_api writes proposals and votes and moves states, so it can
hold an adjustment back (reject it, mark it posted) and store votes that the worker then refuses;
it cannot make the worker post anything no quorum of configured approver keys signed. custody_worker
is trusted to have verified the signatures: the database cannot verify Ed25519 or WebAuthn, so it
binds the worker to the stored legs of an approved adjustment, posted once (the key is unique).
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0051_adjustment_signatures"
down_revision = "0050_refill_times"
branch_labels = None
depends_on = None


# Migration 0049, loaded by path (the names start with a digit); its `_sibling` loads the others.
_spec = importlib.util.spec_from_file_location("_migration_0049", Path(__file__).with_name("0049_role_hardening.py"))
assert _spec is not None and _spec.loader is not None
_0049 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_0049)
_0048 = _0049._sibling("0048_set_based_triggers.py")

ADJUSTMENT_BEFORE = "INSERT, UPDATE"
ADJUSTMENT_AFTER = "INSERT, UPDATE (state, updated_at)"

# 0032's topics, without the posting's event (the worker's now) and with it.
API_TOPICS = ("'withdrawal.requested', 'withdrawal.approved', 'withdrawal.rejected', 'incident.opened', "
              "'kill_switch.engaged', 'kill_switch.released', 'deposit.credited'")
API_TOPICS_0032 = API_TOPICS.replace("'kill_switch.released', ", "'kill_switch.released', 'treasury.adjustment_posted', ")


def _topics(topics: str) -> str:
    return (f"CREATE OR REPLACE FUNCTION custody_api_event_topics() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{topics}]::text[] $$;")


LIQUIDITY_GUARD = r"""
CREATE OR REPLACE FUNCTION convert_guard_liquidity_debits() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_tx bigint;
    v_transfers jsonb;
    v_posted text[];
    v_approved text[];
BEGIN
    -- lookups by key per row only (scalar subqueries): see 0048's _emit_statement on transition tables
    FOR v_tx IN
        SELECT DISTINCT n.transaction_id
          FROM new_rows n
         WHERE n.amount < 0
           AND (SELECT acc.kind FROM account acc WHERE acc.id = n.account_id) = 'liquidity'
    LOOP
        v_transfers := NULL;
        IF current_user = 'custody_worker' THEN  -- custody_api never debits a liquidity account
            SELECT a.transfers INTO v_transfers
              FROM journal_transaction t
              JOIN treasury_adjustment a
                ON a.id = CASE WHEN t.idempotency_key ~ '^treasury-adjustment:[0-9]{1,18}$'
                               THEN split_part(t.idempotency_key, ':', 2)::bigint END
             WHERE t.id = v_tx AND a.state = 'approved';
        END IF;
        IF v_transfers IS NOT NULL THEN
            -- every entry of the journal transaction (this statement's and any before it), in the
            -- order ledger_post writes them: leg 1 debit, leg 1 credit, leg 2 debit, ...
            SELECT array_agg(e.account_id || ' ' || e.amount || ' ' || coalesce(e.hold_id::text, '-') ORDER BY e.id)
              INTO v_posted
              FROM journal_entry e
             WHERE e.transaction_id = v_tx;
            SELECT array_agg(l.account_id || ' ' || l.amount || ' -' ORDER BY x.i, l.side)
              INTO v_approved
              FROM jsonb_array_elements(v_transfers) WITH ORDINALITY AS x(leg, i)
             CROSS JOIN LATERAL (VALUES (0, (x.leg->>'debit_account_id')::bigint, -((x.leg->>'amount')::numeric)),
                                        (1, (x.leg->>'credit_account_id')::bigint, (x.leg->>'amount')::numeric))
                   AS l(side, account_id, amount);
        END IF;
        IF v_transfers IS NULL OR v_posted IS DISTINCT FROM v_approved THEN
            RAISE EXCEPTION 'ledger: % may debit a liquidity account only through convert_accept or, as custody_worker, '
                            'by posting exactly the legs of an approved treasury adjustment', current_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
    RETURN NULL;
END $$;
"""

UPGRADE = r"""
ALTER TABLE treasury_adjustment_vote
    ADD COLUMN key_id             text,
    ADD COLUMN scheme             text CHECK (scheme IN ('ed25519', 'webauthn')),
    ADD COLUMN signature          bytea,
    ADD COLUMN authenticator_data bytea,
    ADD COLUMN client_data_json   bytea;

ALTER TABLE treasury_adjustment DROP CONSTRAINT treasury_adjustment_state_check;
ALTER TABLE treasury_adjustment ADD CONSTRAINT treasury_adjustment_state_check
    CHECK (state IN ('proposed', 'approved', 'posted', 'rejected'));
"""

DOWNGRADE = r"""
UPDATE treasury_adjustment SET state = 'proposed', updated_at = now() WHERE state = 'approved';
ALTER TABLE treasury_adjustment DROP CONSTRAINT treasury_adjustment_state_check;
ALTER TABLE treasury_adjustment ADD CONSTRAINT treasury_adjustment_state_check
    CHECK (state IN ('proposed', 'posted', 'rejected'));
ALTER TABLE treasury_adjustment_vote DROP COLUMN key_id, DROP COLUMN scheme, DROP COLUMN signature, DROP COLUMN authenticator_data,
    DROP COLUMN client_data_json;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(LIQUIDITY_GUARD)
    op.execute(_topics(API_TOPICS))
    op.execute(_0049.limited_privileges("treasury_adjustment", ADJUSTMENT_BEFORE, ADJUSTMENT_AFTER, migration="0051"))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_0049.limited_privileges("treasury_adjustment", ADJUSTMENT_AFTER, ADJUSTMENT_BEFORE, migration="0051"))
    op.execute(_topics(API_TOPICS_0032))
    op.execute(_0048.LIQUIDITY_GUARD.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(DOWNGRADE)
    op.execute("CALL custody_apply_role_grants()")
