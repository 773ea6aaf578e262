"""Review 16 (R2): refill expiry is enforced only at the api's door (`refuse_late_approval`) and by
the worker's `expire_refill`, which never expires a refill whose stored approvals make up the
quorum. Neither the worker's count nor the signer looks at when an approval was given, and an
approval's payload carries no time. custody_api may INSERT `rebalance_approval` and UPDATE
`rebalance.state`: it can take an approval the door refused as late, store it, and put an expired
bitcoin refill back to `open`; the worker then hands the refill to the signer."""
from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text

from custody.errors import CustodyErrorCode
from regtest.util import assert_equal
from signer.service import Signer
from tests.approvers import sign_approval
from tests.integration.test_refill_approval_keys import KEYS, TTL, age, btc_refill, env, refused, state  # noqa: F401 - fixture


def test_a_late_approval_written_by_the_api_role_does_not_complete_an_expired_refill(env):  # noqa: F811
    engine, _, btc, _, _ = env
    rebalance_id = btc_refill(engine)
    payload = btc.refill_payload(rebalance_id)
    btc.approve_refill(rebalance_id, operator="op-alice", signature=sign_approval(payload, "op-alice"))
    age(engine, "rebalance", rebalance_id, TTL + dt.timedelta(seconds=1))
    late = sign_approval(payload, "op-bob")
    refused(CustodyErrorCode.refill_expired, lambda: btc.approve_refill(rebalance_id, operator="op-bob", signature=late))
    assert_equal(btc._claim_refill(signable=True), None)  # noqa: SLF001 - the worker's pass expires it
    assert_equal(state(engine, "rebalance", rebalance_id), "expired")

    with engine.begin() as c:  # what custody_api's grants allow (rebalance UPDATE (state, ...), rebalance_approval INSERT)
        c.execute(text("SET LOCAL ROLE custody_api"))
        c.execute(text("UPDATE rebalance SET state = 'open' WHERE id = :r"), {"r": rebalance_id})
        c.execute(text("INSERT INTO rebalance_approval (rebalance_id, operator, key_id, scheme, signed_payload, signature) "
                       "VALUES (:r, 'op-bob', :k, :s, :p, :sig)"),
                  {"r": rebalance_id, "k": late.key_id, "s": late.scheme, "p": payload, "sig": late.signature})
    claimed = btc._claim_refill(signable=True)  # noqa: SLF001 - the step that hands a refill to the signer
    try:
        if claimed is not None:  # and the signer's own gate for a refill (approvals over the payload) lets it through
            signer = Signer(engine, KEYS, bitcoin_network="regtest", approvers=btc.approvers, rebalance_quorum=2)
            with engine.connect() as c:
                signer._check_rebalance_approvals(c, rebalance_id, claimed[2])  # noqa: SLF001 - raises if refused
        assert claimed is None, f"refill {rebalance_id}, past its TTL of {TTL}, is handed to the signer, which passes it"
    finally:
        with engine.begin() as c:
            c.execute(text("UPDATE rebalance SET state = 'abandoned' WHERE id = :r AND state = 'open'"), {"r": rebalance_id})


def test_a_late_ethereum_approval_written_by_the_api_role_is_not_counted(env):  # noqa: F811
    from tests.integration.test_refill_approval_keys import eth_refill

    engine, eth, _, signer, _ = env
    rebalance_id = eth_refill(engine)
    payload = eth.refill_payload(rebalance_id)
    eth.approve_refill(rebalance_id, operator="op-alice", signature=sign_approval(payload, "op-alice"))
    age(engine, "eth_rebalance", rebalance_id, TTL + dt.timedelta(minutes=5))
    late = sign_approval(payload, "op-bob")
    refused(CustodyErrorCode.refill_expired, lambda: eth.approve_refill(rebalance_id, operator="op-bob", signature=late))
    with engine.begin() as c:  # custody_api's grant: eth_rebalance_approval INSERT (0044)
        c.execute(text("SET LOCAL ROLE custody_api"))
        c.execute(text("INSERT INTO eth_rebalance_approval (rebalance_id, operator, key_id, scheme, signed_payload, signature) "
                       "VALUES (:r, 'api:op-bob', :k, :s, :p, :sig)"),
                  {"r": rebalance_id, "k": late.key_id, "s": late.scheme, "p": payload, "sig": late.signature})
    asked = len(signer.asked)
    eth.sign()
    try:
        assert_equal((state(engine, "eth_rebalance", rebalance_id), signer.asked[asked:]), ("expired", []))
    finally:
        with engine.begin() as c:
            c.execute(text("UPDATE eth_rebalance SET state = 'expired' WHERE id = :r AND state = 'open'"), {"r": rebalance_id})


def test_the_stamps_a_refill_expires_by_are_the_databases(env):  # noqa: F811
    """Migration 0049: an approval's `at` and a refill's `created_at` are now() whatever the inserter
    wrote (custody_api may INSERT both), and no process role moves `created_at` afterwards."""
    engine, _, btc, _, _ = env
    rebalance_id = btc_refill(engine)
    payload = btc.refill_payload(rebalance_id)
    early = sign_approval(payload, "op-bob")
    for table in ("rebalance_approval", "eth_rebalance_approval"):
        target = rebalance_id if table == "rebalance_approval" else _eth_refill(engine)
        with engine.begin() as c:
            c.execute(text("SET LOCAL ROLE custody_api"))
            stamped = c.execute(text(
                f"INSERT INTO {table} (rebalance_id, operator, key_id, scheme, signed_payload, signature, at) "
                "VALUES (:r, 'op-bob', :k, :s, :p, :sig, now() - interval '2 days') RETURNING at = now()"),
                {"r": target, "k": early.key_id, "s": early.scheme, "p": payload, "sig": early.signature}).scalar_one()
        assert stamped, f"{table}: custody_api back-dated an approval"
    with engine.begin() as c:  # any inserter: the default was now() already, an explicit value is overwritten
        created_now = c.execute(text(
            "INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, destination_index, amount, "
            "fee, change_amount, fee_rate, spendable, ceiling, target, floor, approvals_required, created_at) VALUES "
            "('bitcoin', 'BTC', 'warm', 'hot', 'abandoned', 'x', 0, 1, 1, 0, 1, 0, 5, 2, 1, 2, now() + interval '1 day') "
            "RETURNING created_at = now()")).scalar_one()
    assert created_now, "a refill was stored with a creation stamp of the inserter's choice"
    for role, refused_with in (("custody_api", "42501"), ("custody_worker", "23001")):  # no column grant / 0049's trigger
        for table, row_id in (("rebalance", rebalance_id), ("eth_rebalance", _eth_refill(engine))):
            with pytest.raises(Exception) as exc, engine.begin() as c:
                c.execute(text(f"SET LOCAL ROLE {role}"))
                c.execute(text(f"UPDATE {table} SET created_at = created_at + interval '1 day' WHERE id = :r"), {"r": row_id})
            sqlstate = getattr(exc.value.orig, "sqlstate", None)  # type: ignore[attr-defined]
            assert sqlstate == refused_with, f"{role} moved {table}.created_at ({exc.value})"
    with engine.begin() as c:
        c.execute(text("UPDATE rebalance SET state = 'abandoned' WHERE id = :r AND state = 'open'"), {"r": rebalance_id})


def _eth_refill(engine) -> int:
    from tests.integration.test_refill_approval_keys import eth_refill

    return eth_refill(engine)
