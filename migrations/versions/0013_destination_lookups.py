"""Withdrawal destinations: indexes for "is this address ours?" and "is it on the allowlist?".

Why: every withdrawal request, and every approved withdrawal again as it is batched, asks whether
its destination is one of the service's own addresses (custody.destinations, OWN_ADDRESS_SQL:
deposit addresses, hot-wallet coins, sweep and rebalance destinations, the ethereum hot sender) and,
for an ethereum contract, whether the account allowlisted it. Addresses are compared in normalised
(lowercase) form because ethereum addresses are stored EIP-55 checksummed and a bech32 address may
be spelled in uppercase, so each lookup is on `lower(address)`: without these expression indexes
each would read its whole table, and deposit addresses and chain transactions only grow.

What changes: expression indexes only; no data and no constraint changes.

Revision ID: 0013_destination_lookups
Revises: 0012_money_boundaries
"""
from alembic import op

revision = "0013_destination_lookups"
down_revision = "0012_money_boundaries"
branch_labels = None
depends_on = None

SQL = """
CREATE INDEX deposit_address_lower_address ON deposit_address (chain, lower(address));
CREATE INDEX wallet_utxo_lower_address ON wallet_utxo (lower(address));
CREATE INDEX sweep_lower_destination ON sweep (chain, lower(destination));
CREATE INDEX rebalance_lower_destination ON rebalance (chain, lower(destination));
CREATE INDEX chain_transaction_lower_sender ON chain_transaction (chain, lower(sender));
CREATE INDEX allowlist_entry_lower_address ON allowlist_entry (account_id, lower(address));
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute("""
DROP INDEX allowlist_entry_lower_address;
DROP INDEX chain_transaction_lower_sender;
DROP INDEX rebalance_lower_destination;
DROP INDEX sweep_lower_destination;
DROP INDEX wallet_utxo_lower_address;
DROP INDEX deposit_address_lower_address;
""")
