"""Treasury tiers: fee bumps of sweeps and rebalances, cold -> hot through a PSBT, warm refills under a quorum.

Revision ID: 0038_treasury_tiers
Revises: 0032_event_guards

Why (issue 16): sweeps and rebalances had one transaction each and no fee bump; the way back from
cold was an undocumented manual job; the warm tier was unused.

What changes:
- `firm_tx_version`: every signed version of a sweep's or rebalance's transaction (the first and
  each RBF replacement, `replaces_id`). The row itself (`sweep`, `rebalance`) keeps the version
  that is followed now in `txid`, `raw`, `fee`; a version mined instead of the newest one becomes
  the row's again (custody.firm_moves), so only the mined version is ever booked. Written by the
  worker only: read-only for custody_api.
- `sweep.broadcast_height`, `rebalance.broadcast_height`: the tip when a version was first sent,
  from which "stuck for N blocks" is counted.
- `rebalance.change_address`, `change_index`: where a move from warm or cold returns its change
  (a fresh receive address of the source tier; hot -> out keeps returning change to the hot
  receive address). `UNIQUE (chain, destination)` becomes a partial index: a move into hot pays
  the hot receive address every time.
- `rebalance.psbt` (the unsigned BIP 174 PSBT custody built for a cold -> hot move; exported to
  the operator who signs it offline), `rebalance.floor` (the hot floor that triggered a warm -> hot
  refill), `rebalance.approvals_required` (the quorum recorded when a refill was opened; the
  signer computes its own and takes the larger).
- `rebalance_input`: the coins a rebalance from warm or cold spends (those tiers have no
  `wallet_utxo`; hot coins stay reserved there through `wallet_utxo.rebalance_id`). Custody_api
  INSERTs (an operator opens a cold -> hot move, `POST /v1/rebalances/cold-to-hot`; the deciding
  step of `POST /v1/rebalances/run` may open a refill); never updated or deleted.
- `rebalance_approval`: an operator's SIGNED approval of a warm -> hot refill (payload kind
  `rebalance-approval`, signer.approvals); the signer verifies each signature against its own
  approver registry, so a row inserted underneath counts for nothing. Append-only.
- `btc_wallet_output.tier` accepts `warm` (the wallet index follows the warm wallet like cold).
- `rebalance_one_open` is per source tier: a cold -> hot PSBT waiting for its offline signature
  no longer blocks hot -> warm/cold above the ceiling.
- custody_api: `rebalance` UPDATE adds (txid, raw, fee) for the import of a signed PSBT (the
  worker checks the bytes against the PSBT it built again before it broadcasts them, so a forged
  `raw` is never sent); `rebalance_input` INSERT; `rebalance_approval` INSERT; `firm_tx_version`
  read-only. The role lists are written out in full below (LIMITED_0038, READ_ONLY_0038).
"""
from alembic import op

revision = "0038_treasury_tiers"
down_revision = "0036_reserves_v2"
branch_labels = None
depends_on = None

# 0032's custody_api_limited_tables(), written out in full, with this migration's changes.
LIMITED_0032 = """
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
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)')"""
# the migrations merged before this one added to 0032's list: convert_price (0033), the console's
# tables (0034), reserve_node (0036)
LIMITED_0036 = (LIMITED_0032.replace("        ('reserve_leaf', 'INSERT'),\n", "        ('reserve_leaf', 'INSERT'),\n        ('reserve_node', 'INSERT'),\n")
                + """,
        ('convert_price', 'INSERT, UPDATE'),
        ('console_credential', 'INSERT, UPDATE (role, state, decided_by, decided_at, sign_count, last_used_at)'),
        ('console_challenge', 'INSERT, UPDATE (used_at), DELETE'),
        ('console_session', 'INSERT, UPDATE (last_seen_at, ended_at, ended_reason)')""")
assert LIMITED_0036.count("reserve_node") == 1
LIMITED_0038 = (LIMITED_0036
                .replace("('rebalance', 'INSERT, UPDATE (state, containment, updated_at)'),",
                         "('rebalance', 'INSERT, UPDATE (state, containment, updated_at, txid, raw, fee)'),\n"
                         "        ('rebalance_input', 'INSERT'),\n"
                         "        ('rebalance_approval', 'INSERT'),"))
assert LIMITED_0038.count("rebalance_approval") == 1

READ_ONLY_0032 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output', 'deposit_address_check', 'node_view_health', "
                  "'outbox', 'outbox_aggregate'")
# 0033 added convert_quote, 0037 the ethereum sweeps' tables
READ_ONLY_0037 = READ_ONLY_0032 + ", 'convert_quote', 'eth_sweep', 'eth_gas_funding'"
READ_ONLY_0038 = READ_ONLY_0037 + ", 'firm_tx_version'"


def _read_only(tables: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{tables}]::text[] $$;")


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


UPGRADE = """
-- Every signed version of a sweep's or rebalance's transaction; the row follows one of them.
CREATE TABLE firm_tx_version (
    id               bigserial PRIMARY KEY,
    machine          text NOT NULL CHECK (machine IN ('sweep', 'rebalance')),
    row_id           bigint NOT NULL,
    txid             text NOT NULL UNIQUE,
    raw              bytea NOT NULL,
    fee              numeric(78,0) NOT NULL CHECK (fee >= 0),
    fee_rate         numeric(78,0) NOT NULL CHECK (fee_rate >= 0),
    replaces_id      bigint REFERENCES firm_tx_version(id),
    created_at       timestamptz NOT NULL DEFAULT now()
);  -- two workers bump a version once: the row is locked across the signer call (custody.firm_moves)
CREATE INDEX firm_tx_version_row ON firm_tx_version (machine, row_id);
-- the rows signed before this migration: their one version
INSERT INTO firm_tx_version (machine, row_id, txid, raw, fee, fee_rate)
    SELECT 'sweep', id, txid, raw, fee, fee_rate FROM sweep WHERE txid IS NOT NULL ORDER BY id;
INSERT INTO firm_tx_version (machine, row_id, txid, raw, fee, fee_rate)
    SELECT 'rebalance', id, txid, raw, fee, fee_rate FROM rebalance WHERE txid IS NOT NULL ORDER BY id;
CREATE TRIGGER firm_tx_version_append_only BEFORE UPDATE OR DELETE ON firm_tx_version
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

ALTER TABLE sweep ADD COLUMN broadcast_height bigint;
ALTER TABLE rebalance ADD COLUMN broadcast_height bigint,
    ADD COLUMN psbt bytea,
    ADD COLUMN floor numeric(78,0) CHECK (floor >= 0),
    ADD COLUMN approvals_required integer NOT NULL DEFAULT 0 CHECK (approvals_required >= 0),
    ADD COLUMN change_address text,
    ADD COLUMN change_index integer CHECK (change_index >= 0);
-- A move into hot pays the hot receive address every time: only a warm or cold destination is fresh.
ALTER TABLE rebalance DROP CONSTRAINT rebalance_chain_destination_key;
CREATE UNIQUE INDEX rebalance_destination_once ON rebalance (chain, destination) WHERE destination_tier <> 'hot';

-- Coins a rebalance from warm or cold spends (hot coins: wallet_utxo.rebalance_id).
CREATE TABLE rebalance_input (
    rebalance_id      bigint NOT NULL REFERENCES rebalance(id),
    txid              text NOT NULL,
    vout              integer NOT NULL CHECK (vout >= 0),
    amount            numeric(78,0) NOT NULL CHECK (amount > 0),
    derivation_change integer NOT NULL CHECK (derivation_change IN (0, 1)),
    derivation_index  integer NOT NULL CHECK (derivation_index >= 0),
    PRIMARY KEY (rebalance_id, txid, vout)
);
CREATE INDEX rebalance_input_outpoint ON rebalance_input (txid, vout);
CREATE TRIGGER rebalance_input_append_only BEFORE UPDATE OR DELETE ON rebalance_input
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- An operator's signed approval of a warm -> hot refill (signer.approvals, kind rebalance-approval).
CREATE TABLE rebalance_approval (
    id                 bigserial PRIMARY KEY,
    rebalance_id       bigint NOT NULL REFERENCES rebalance(id),
    operator           text NOT NULL,
    key_id             text NOT NULL,
    scheme             text NOT NULL,
    signed_payload     bytea NOT NULL,
    signature          bytea NOT NULL,
    authenticator_data bytea,
    client_data_json   bytea,
    at                 timestamptz NOT NULL DEFAULT now(),
    UNIQUE (rebalance_id, key_id)
);
CREATE TRIGGER rebalance_approval_append_only BEFORE UPDATE OR DELETE ON rebalance_approval
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

ALTER TABLE btc_wallet_output DROP CONSTRAINT btc_wallet_output_tier_check;
ALTER TABLE btc_wallet_output ADD CONSTRAINT btc_wallet_output_tier_check CHECK (tier IN ('deposit', 'hot', 'warm', 'cold'));

DROP INDEX rebalance_one_open;
CREATE UNIQUE INDEX rebalance_one_open ON rebalance (chain, asset, source_tier)
    WHERE state IN ('open', 'signed', 'broadcast', 'confirmed');
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_limited(LIMITED_0038))
    op.execute(_read_only(READ_ONLY_0038))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    raise NotImplementedError("treasury history (fee-bump versions, approvals, PSBTs) is not downgraded")
