"""Ethereum sweep fixes (review 15): a gas funding refused by the signer gives its hot nonce back.

Revision ID: 0041_eth_sweep_fixes
Revises: 0038_treasury_tiers

Why (R15-S3): a gas funding's hot-address nonce was reserved (committed) when the funding was
planned; when the signer refused the funding for good, the row kept that nonce open and every later
hot-address transaction (an ether withdrawal included) waited behind it on chain for ever.

What changes: `eth_gas_funding.nonce` may be NULL while the row is `open`: a refused funding gives
its nonce back to the `eth_nonce` counter (when nothing was handed out after it) and takes a fresh
one, under the counter's row lock held across the signer call, the next time it is signed
(custody/eth_sweeps.py, "Guarantees"). A row past `open` always has its nonce. No table is added; no
role list changes.
"""
from alembic import op

revision = "0041_eth_sweep_fixes"
down_revision = "0039_console_fixes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
ALTER TABLE eth_gas_funding ALTER COLUMN nonce DROP NOT NULL;
ALTER TABLE eth_gas_funding ADD CONSTRAINT eth_gas_funding_nonce_unless_open CHECK (nonce IS NOT NULL OR state = 'open');
""")


def downgrade() -> None:
    # a funding without a nonce cannot be kept: it never left custody (nothing was signed at it)
    op.execute("""
ALTER TABLE eth_gas_funding DROP CONSTRAINT eth_gas_funding_nonce_unless_open;
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM eth_gas_funding WHERE nonce IS NULL) THEN
        RAISE EXCEPTION 'eth_gas_funding rows without a hot nonce exist: sign or settle them before downgrading';
    END IF;
END $$;
ALTER TABLE eth_gas_funding ALTER COLUMN nonce SET NOT NULL;
""")
