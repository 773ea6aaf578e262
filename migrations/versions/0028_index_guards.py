"""Guards on what the wallet index watches and on the node view's health (issue 13, review R1).

Revision ID: 0028_index_guards
Revises: 0029_no_planner_trap

Why: the worker's wallet index (custody.wallet_index) watched whatever address a `deposit_address`
row held, and derived every cold index below `wallet.next_index`; custody_api may INSERT the first
and UPDATE the second (migration 0022), so a compromised api could make the scanner credit an
address whose key it holds, move the hot receive address into the deposit tier, or make the worker
derive millions of addresses. And a node view the worker could not read left no trace anywhere.

What changes:
- `deposit_address_check`: the worker's verdict on each deposit address row, written once, the
  first time its index loads the row: `derived` is true when the address is the deposit key's
  derivation at the row's `derivation_index` (and that index was handed out: below the wallet's
  `next_index`), false otherwise (the row is never watched, and a critical incident is open). A
  process start loads the rows with their verdict and derives only the rows without one: O(new
  rows). custody_api only reads it (`custody_api_read_only_tables()`), so it cannot vouch for a
  row it forged. Rows are never updated or deleted (triggers).
- `wallet.next_index` may only stay or grow by exactly 1 in one UPDATE, for every role
  (`wallet_next_index_step`, SQLSTATE 23514 check_violation): issuing an address and opening a
  rebalance each take one index; a jump (to 3,000, to 2^31 - 1) is refused.
- `node_view_health`: per chain, how many consecutive worker reconciliation passes ran without
  the node's own figure (custody.node_view) and since when, the last error, and when the view
  was last read; custody.reconciliation escalates from it. Written by the worker only
  (`custody_api_read_only_tables()`), so a compromised api cannot reset the count.
"""
from alembic import op

revision = "0028_index_guards"
down_revision = "0029_no_planner_trap"
branch_labels = None
depends_on = None

READ_ONLY_0025 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output'")

UPGRADE = """
CREATE TABLE deposit_address_check (
    deposit_address_id  bigint PRIMARY KEY REFERENCES deposit_address(id),
    derived             boolean NOT NULL,   -- true: watched; false: refused (not the deposit key's derivation)
    reason              text,               -- why it was refused
    checked_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (derived = (reason IS NULL))
);
CREATE TRIGGER deposit_address_check_never_updated BEFORE UPDATE OR DELETE ON deposit_address_check
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

CREATE FUNCTION custody_wallet_next_index_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.next_index <> OLD.next_index AND NEW.next_index <> OLD.next_index + 1 THEN
        RAISE EXCEPTION 'wallet %: next_index may only stay or grow by 1 in one update (% -> %)',
            OLD.id, OLD.next_index, NEW.next_index USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER wallet_next_index_step BEFORE UPDATE OF next_index ON wallet
    FOR EACH ROW EXECUTE FUNCTION custody_wallet_next_index_step();

CREATE TABLE node_view_health (
    chain             text PRIMARY KEY,
    missed_passes     integer NOT NULL DEFAULT 0 CHECK (missed_passes >= 0),
    blind_since       timestamptz,        -- the first pass of the current run without the node's figure
    severity          text CHECK (severity IN ('warning', 'critical')),  -- the incident opened for this run
    last_error        text,
    last_read_at      timestamptz,        -- the last pass that read the node's figure
    last_read_height  bigint,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((missed_passes = 0) = (blind_since IS NULL))
);
"""

DOWNGRADE = """
DROP TABLE node_view_health;
DROP TRIGGER wallet_next_index_step ON wallet;
DROP FUNCTION custody_wallet_next_index_step();
DROP TABLE deposit_address_check;
"""


def _read_only(extra: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{READ_ONLY_0025}{extra}]::text[] $$;")


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_read_only(", 'deposit_address_check', 'node_view_health'"))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_read_only(""))
    op.execute(DOWNGRADE)
    op.execute("CALL custody_apply_role_grants()")
