"""The bitcoin wallet index, maintained by the block walk (issue 13), and O(1) gap bookkeeping.

Revision ID: 0023_wallet_index
Revises: 0022_api_role_narrowed

`btc_wallet_output`: every output of a main-chain block (up to the deposit scanner's cursor)
paying an address the service derived: deposit addresses, the hot receive address `<hot>/0/0`, the
hot change addresses `<hot>/1/<batch id>`, and the cold addresses `<cold>/0/i`. A row is written
by the scanner in the database transaction that moves `chain_cursor` (custody.wallet_index), with
the block that created it and, once a block spends it, the spending transaction and block. A reorg
deletes the rows its undone blocks created and clears the spends they recorded (both by block
hash, indexed), so the table is always exactly "our outputs in the chain up to the cursor".
Amounts are satoshis (bigint: at most 21e14, far inside it).

`wallet.last_used_index`: the highest derivation index of a deposit address that has received
anything (-1: none), kept by the scanner as it records a first deposit to an address, so the
gap-limit check at issue is `next_index - 1 - last_used_index`, O(1) whatever the address count
(it counted the wallet's addresses with a subquery on every issue before).

custody_api may only read the index (the api never writes it): it joins
`custody_api_read_only_tables()`, redefined here with 0022's list plus the new table.
"""
from alembic import op

revision = "0023_wallet_index"
down_revision = "0022_api_role_narrowed"
branch_labels = None
depends_on = None

READ_ONLY_0022 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', "
                  "'eth_nonce', 'matching_snapshot'")

UPGRADE = """
CREATE TABLE btc_wallet_output (
    txid              text NOT NULL,
    vout              integer NOT NULL CHECK (vout >= 0),
    address           text NOT NULL,
    tier              text NOT NULL CHECK (tier IN ('deposit', 'hot', 'cold')),
    derivation_change integer NOT NULL CHECK (derivation_change IN (0, 1)),
    derivation_index  integer NOT NULL CHECK (derivation_index >= 0),
    amount            bigint NOT NULL CHECK (amount >= 0),
    block_height      bigint NOT NULL,
    block_hash        text NOT NULL,
    spent_txid        text,
    spent_height      bigint,
    spent_block_hash  text,
    indexed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (txid, vout),
    CHECK ((spent_txid IS NULL) = (spent_block_hash IS NULL) AND (spent_txid IS NULL) = (spent_height IS NULL))
);
-- undoing a block: its outputs (delete) and its spends (clear), each by block hash
CREATE INDEX btc_wallet_output_block ON btc_wallet_output (block_hash);
CREATE INDEX btc_wallet_output_spent_block ON btc_wallet_output (spent_block_hash) WHERE spent_block_hash IS NOT NULL;
-- "unspent outputs of tier X" and "holdings of tier X" (index-only with the amount included)
CREATE INDEX btc_wallet_output_unspent ON btc_wallet_output (tier, address) INCLUDE (amount, block_height)
    WHERE spent_txid IS NULL;

ALTER TABLE wallet ADD COLUMN last_used_index integer NOT NULL DEFAULT -1 CHECK (last_used_index >= -1);
UPDATE wallet w SET last_used_index = coalesce(
    (SELECT max(derivation_index) FROM deposit_address d WHERE d.wallet_id = w.id AND d.first_seen_at IS NOT NULL), -1);
"""


def _read_only(extra: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{READ_ONLY_0022}{extra}]::text[] $$;")


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_read_only(", 'btc_wallet_output'"))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_read_only(""))
    op.execute("DROP TABLE btc_wallet_output; ALTER TABLE wallet DROP COLUMN last_used_index;")
    op.execute("CALL custody_apply_role_grants()")
