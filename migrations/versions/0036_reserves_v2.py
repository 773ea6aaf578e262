"""Proof of reserves v2: customers' balances split into several leaves, and the tree's upper nodes kept.

Revision ID: 0036_reserves_v2
Revises: 0032_event_guards

Why (issue 16): a v1 inclusion proof showed other customers' exact balances as sibling sums (one
leaf per account, in account order). A v2 report (custody.reserves, custody.merkle_sum) splits each
balance into several leaves of random amounts, each with its own random nonce, adds padding leaves
and shuffles them; and a proof is built from the 16 leaves of its chunk plus the stored nodes above
the chunks, instead of rebuilding the whole tree per request (a million accounts are four million
leaves).

What changes:
- `reserve_report.version` (1 for the reports already published, 2 from now on): v1 reports stay
  as published (append-only), but their proofs are no longer served (they are the defect).
- `reserve_leaf`: an account now has several leaves (the UNIQUE (report_id, account_id) goes, an
  index on the pair stays for the proof's lookup); `account_id` is NULL on a padding leaf; the
  columns are renamed for what they hold: `balance` -> `amount` (this leaf's piece), `salt` ->
  `nonce` (per leaf). The foreign key to `account` goes: a report writes its leaves once, from
  the account rows of its own snapshot, and checking four million keys for a million accounts cost
  a third of the time to store the report (bench/reserves.py).
- `reserve_node` (append-only, like the other two): the nodes at level 4 and above of each report's
  tree (custody.merkle_sum.Tree.stored_nodes: chunk roots up to the root, fixed padding nodes where
  a level was padded). Written by whoever publishes the report: custody_api gets INSERT on it
  (`POST /v1/reserves/reports`), listed in `custody_api_limited_tables()`, redefined here with
  0032's list written out in full plus `('reserve_node', 'INSERT')`.

What a database writer could forge: a report row, leaf or node is only a claim until checked; the
customer's verifier (`python -m custody.reserves verify`) recomputes the root from its own leaves
and the path, checks the sums, and checks every address signature (BIP-322 / EIP-191, made by the
signer, which signs only statements naming an address of its own keys); a forged node makes the
proof fail, never pass.
"""
from alembic import op

revision = "0036_reserves_v2"
down_revision = "0037_eth_sweeps"
branch_labels = None
depends_on = None

# 0034's custody_api_limited_tables() (0032's, convert_price from 0033, the console's tables from 0034),
# written out in full, plus reserve_node.
LIMITED_0036 = """
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
        ('reserve_node', 'INSERT'),
        ('audit_event', 'INSERT'),
        ('approval', 'INSERT'),
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
        ('allowlist_entry', 'INSERT, UPDATE, DELETE'),
        ('webhook_endpoint', 'INSERT, UPDATE (description, event_types, enabled, secret_enc, previous_secret_enc, previous_secret_expires_at, updated_at, deleted_at)'),
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)'),
        ('convert_price', 'INSERT, UPDATE'),
        ('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at)'),
        ('console_challenge', 'INSERT, UPDATE (used_at), DELETE'),
        ('console_session', 'INSERT, UPDATE (last_seen_at, ended_at, ended_reason)')"""
# the list before this migration (0034's: 0032's, plus convert_price from 0033 and the console's tables)
LIMITED_0034 = LIMITED_0036.replace("        ('reserve_node', 'INSERT'),\n", "")
assert LIMITED_0034.count("reserve_node") == 0

UPGRADE = """
ALTER TABLE reserve_report ADD COLUMN version smallint NOT NULL DEFAULT 1 CHECK (version IN (1, 2));
-- the total of balances of numeric(78,0) each may pass numeric(78,0) (sums are 40 bytes in the tree)
ALTER TABLE reserve_report ALTER COLUMN liabilities TYPE numeric, ALTER COLUMN holdings TYPE numeric;
ALTER TABLE reserve_leaf DROP CONSTRAINT reserve_leaf_report_id_account_id_key;
ALTER TABLE reserve_leaf ALTER COLUMN account_id DROP NOT NULL;
ALTER TABLE reserve_leaf DROP CONSTRAINT reserve_leaf_account_id_fkey;
ALTER TABLE reserve_leaf RENAME COLUMN balance TO amount;
ALTER TABLE reserve_leaf RENAME COLUMN salt TO nonce;
CREATE INDEX reserve_leaf_account ON reserve_leaf (report_id, account_id);
CREATE TABLE reserve_node (
    report_id  bigint NOT NULL REFERENCES reserve_report(id),
    level      smallint NOT NULL CHECK (level >= 4),
    position   integer NOT NULL CHECK (position >= 0),
    hash       bytea NOT NULL CHECK (length(hash) = 32),
    sum        numeric NOT NULL CHECK (sum >= 0),  -- a sum of balances may pass numeric(78,0)
    PRIMARY KEY (report_id, level, position)
);
CREATE TRIGGER reserve_node_append_only BEFORE UPDATE OR DELETE ON reserve_node
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_limited(LIMITED_0036))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    raise NotImplementedError("published reports are not downgraded (v2 leaves have no single balance per account)")
