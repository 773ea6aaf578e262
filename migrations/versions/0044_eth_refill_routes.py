"""Ethereum refill routes (issue 16): the api may INSERT an operator's approval of an ethereum refill.

Revision ID: 0044_eth_refill_routes
Revises: 0040_convert_fixes

Why: `POST /v1/eth-rebalances/{id}/approve` (custody.api.treasury_routes) stores an operator's
signed approval in `eth_rebalance_approval` through `custody.rebalances.store_refill_approval`, in
the api process. 0042 made the table read-only for custody_api (no route wrote it then).

What changes: `eth_rebalance_approval` leaves custody_api's read-only list and joins its limited
list with INSERT only (as `rebalance_approval` for bitcoin refills): no UPDATE, no DELETE, so an
approval once stored is never changed or withdrawn by the api.

Who can forge what (honest): a compromised api can insert rows here naming any operator, but a row
is worth nothing without a valid signature over the refill's exact payload by that operator's key:
the signer (`sign_ethereum_rebalance`) verifies every stored approval against its own approver keys
and counts distinct valid keys only, so the api can neither forge nor inflate a quorum; it can at
most add junk rows the signer ignores (and `approvals_required` stays the worker's, read-only here).

The lists are rewritten from what the database holds at this point of the chain (0040's way:
`custody_api_limited_tables()` and `custody_api_read_only_tables()` read, edited, recreated), so no
row another migration added is lost by a re-chaining; then `custody_apply_role_grants()`.
"""
import importlib.util
from pathlib import Path

from alembic import op

revision = "0044_eth_refill_routes"
down_revision = "0040_convert_fixes"
branch_labels = None
depends_on = None


# 0040's list rewriters (LIMITED_NOW, _set_limited, _set_read_only), its module loaded by path (the
# name starts with a digit)
_spec = importlib.util.spec_from_file_location("_migration_0040", Path(__file__).with_name("0040_convert_fixes.py"))
assert _spec is not None and _spec.loader is not None
_0040 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_0040)

TO_0044 = f"""
DO $do$
BEGIN
    IF NOT ('eth_rebalance_approval' = ANY (custody_api_read_only_tables())) THEN
        RAISE EXCEPTION 'migration 0044: eth_rebalance_approval is not in custody_api_read_only_tables()';
    END IF;
END $do$;
{_0040._set_read_only("array_remove(custody_api_read_only_tables(), 'eth_rebalance_approval')")}
{_0040._set_limited(_0040.LIMITED_NOW + " UNION ALL SELECT 'eth_rebalance_approval', 'INSERT', 1000000")}
CALL custody_apply_role_grants();
"""
FROM_0044 = f"""
{_0040._set_limited(_0040.LIMITED_NOW + " WHERE relation <> 'eth_rebalance_approval'")}
{_0040._set_read_only("custody_api_read_only_tables() || ARRAY['eth_rebalance_approval']")}
CALL custody_apply_role_grants();
"""


def upgrade() -> None:
    op.execute(TO_0044)


def downgrade() -> None:
    op.execute(FROM_0044)
