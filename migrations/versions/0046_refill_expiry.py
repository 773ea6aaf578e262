"""Refills expire (issue 16): an ethereum refill may end `expired`, and no longer blocks the next one.

Revision ID: 0046_refill_expiry
Revises: 0045_eth_fee_bumps

Why: a warm -> hot refill that waits longer than the policy's `refill_ttl` (policies.PolicySet) for
its operator quorum expires (custody.rebalances `expire_refill`), so an approval gathered days
later can never complete a quorum for an amount decided on an old balance. Bitcoin's `rebalance`
has no CHECK on its state (custody.states is the table of its transitions), and its
`rebalance_one_open` index already lists only the states in progress; `eth_rebalance` checks its
states and its two one-at-a-time indexes list the states that END a row.

What changes: `eth_rebalance.state` may be 'expired' (with no transaction or nonce, like 'open': it
was never signed; a downgrade fails while an expired row exists); `eth_rebalance_one_in_progress` and
`eth_rebalance_one_refill` treat an expired row as finished (so the worker can open a fresh refill
while hot is still below its floor). No table is added and no grant changes: the worker expires
rows (custody_worker may already UPDATE `eth_rebalance`); the api only refuses late approvals.
"""
from alembic import op

revision = "0046_refill_expiry"
down_revision = "0045_eth_fee_bumps"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE eth_rebalance DROP CONSTRAINT eth_rebalance_state_check;
ALTER TABLE eth_rebalance ADD CONSTRAINT eth_rebalance_state_check
    CHECK (state IN ('open', 'signed', 'broadcast', 'confirmed', 'final', 'reverted', 'expired'));
-- an expired refill was never signed: no transaction, no nonce (0042's check, which named 'open' only)
ALTER TABLE eth_rebalance DROP CONSTRAINT eth_rebalance_check;
ALTER TABLE eth_rebalance ADD CONSTRAINT eth_rebalance_check
    CHECK (state IN ('open', 'expired') OR (txid IS NOT NULL AND raw IS NOT NULL AND nonce IS NOT NULL));
DROP INDEX eth_rebalance_one_in_progress;
CREATE UNIQUE INDEX eth_rebalance_one_in_progress ON eth_rebalance (asset, source_tier)
    WHERE state NOT IN ('final', 'reverted', 'expired');
DROP INDEX eth_rebalance_one_refill;
CREATE UNIQUE INDEX eth_rebalance_one_refill ON eth_rebalance (source_tier)
    WHERE source_tier = 'warm' AND state NOT IN ('final', 'reverted', 'expired');
"""
DOWNGRADE = """
DROP INDEX eth_rebalance_one_refill;
CREATE UNIQUE INDEX eth_rebalance_one_refill ON eth_rebalance (source_tier)
    WHERE source_tier = 'warm' AND state NOT IN ('final', 'reverted');
DROP INDEX eth_rebalance_one_in_progress;
CREATE UNIQUE INDEX eth_rebalance_one_in_progress ON eth_rebalance (asset, source_tier)
    WHERE state NOT IN ('final', 'reverted');
ALTER TABLE eth_rebalance DROP CONSTRAINT eth_rebalance_check;
ALTER TABLE eth_rebalance ADD CONSTRAINT eth_rebalance_check
    CHECK (state = 'open' OR (txid IS NOT NULL AND raw IS NOT NULL AND nonce IS NOT NULL));
ALTER TABLE eth_rebalance DROP CONSTRAINT eth_rebalance_state_check;
ALTER TABLE eth_rebalance ADD CONSTRAINT eth_rebalance_state_check
    CHECK (state IN ('open', 'signed', 'broadcast', 'confirmed', 'final', 'reverted'));
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
