"""signer_boundary_r3: the signer's answers to issue 12's third review (R3), beyond R3's own tests
(test_review12b_approve_display, test_review12b_unapproved_cap; the ethereum re-sign at another
amount is in test_signer_ethereum_record).

| scenario | attacker | expected |
| --- | --- | --- |
| a decision whose policy_version carries ESC / CR sequences, written by the api role, on a withdrawal that needs no approval | compromised api (INSERT policy_decision, UPDATE withdrawal_request) | `payload_unprintable`, audited, nothing recorded |
| a custody role holds the advisory lock key of a withdrawal the signer is asked to sign | any custody role (advisory locks need no grant) | the request gives up after the signer's lock_timeout: OperationalError in process, `unavailable` over the wire (retried); signed once the lock is free |

Holds are released at the end of each scenario; the ledger verifies.
"""
from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import text
from sqlalchemy.exc import OperationalError

import signer.service as service_module
from regtest.util import assert_equal
from signer.server import SignerService
from signer.wire import METHODS, new_request
from tests.integration.test_signer_signatures import (COIN, FEE, Clock, api, batch_of, make_signer, outcome,  # noqa: F401
                                                      outputs_of, records, release, withdrawal)
from tests.unit.test_signer_wire import CLIENTS, KEY, NOW, XPUBS, ask

log = logging.getLogger(__name__)
_ = api  # the module-scoped fixture of test_signer_signatures


def as_role(api, role: str, sql: str, **params):
    with api.custody.engine.begin() as c:
        c.execute(text(f"SET LOCAL ROLE {role}"))
        result = c.execute(text(sql), params)
        return result.scalar() if result.returns_rows else None


def audit_codes(api, batch: int) -> list:
    with api.custody.engine.connect() as c:
        return c.execute(text("SELECT code FROM signer_audit WHERE batch_id = :b ORDER BY id"), {"b": batch}).scalars().all()


def test_a_policy_version_with_control_characters_is_never_signed(api, ledger):
    signer = make_signer(api, clock=Clock())
    wid = withdrawal(api, "0.1")  # auto-approved: no operator ever sees it, the signer alone refuses it
    batch, coins = batch_of(api, signer, [wid])
    outs = outputs_of(api, [wid])
    try:
        log.info("the api role writes a decision whose version redraws the approver's terminal, and points the withdrawal at it")
        decision = as_role(api, "custody_api",
                           "INSERT INTO policy_decision (withdrawal_id, outcome, required_approvals, reasons, policy_version, record, "
                           "decided_at, expires_at) VALUES (:w, 'approve', 0, '{}', :v, '{}', now(), now() + interval '1 day') "
                           "RETURNING id", w=wid, v="v1\x1b[1A\r\x1b[2Kpay 0.01 BTC\u202e")
        as_role(api, "custody_api", "UPDATE withdrawal_request SET decision_id = :d WHERE id = :w", d=decision, w=wid)
        code, _ = outcome(lambda: signer.sign_bitcoin_batch(batch, coins, outs, (signer._hot_address(1, batch), COIN - outs[0].amount - FEE)))
    finally:
        release(api, wid)
    assert_equal(code, "payload_unprintable")
    assert_equal(audit_codes(api, batch), ["payload_unprintable"])
    assert_equal(records(api, wid), [])


def outcome_or_error(call) -> str:
    try:
        return outcome(call)[0]
    except OperationalError as exc:
        return f"error {getattr(exc.orig, 'sqlstate', None)}"


def test_a_custody_role_holding_the_signers_lock_key_cannot_park_it(api, ledger, monkeypatch):
    monkeypatch.setattr(service_module, "LOCK_TIMEOUT", "1s")
    signer = make_signer(api, clock=Clock())
    wid = withdrawal(api, "0.1")
    batch, coins = batch_of(api, signer, [wid])
    outs = outputs_of(api, [wid])
    change = (signer._hot_address(1, batch), COIN - outs[0].amount - FEE)
    params = METHODS["sign_bitcoin_batch"].encode_params({"batch_id": batch, "coins": coins, "outputs": outs, "change": change})
    holder, asking = api.custody.engine.connect(), threading.Thread()
    try:
        log.info("the worker role takes the signer's advisory lock key for the withdrawal and keeps it")
        holder.execute(text("SET ROLE custody_worker"))
        holder.execute(text("SELECT pg_advisory_lock(hashtextextended(:k, 0))"), {"k": f"signer_signature:{wid}"})
        started, parked = time.monotonic(), []
        asking = threading.Thread(target=lambda: parked.append(outcome_or_error(
            lambda: signer.sign_bitcoin_batch(batch, coins, outs, change))))
        asking.start()
        asking.join(timeout=10)  # without a lock_timeout the request waits as long as the worker likes
        waited = time.monotonic() - started
        assert not asking.is_alive(), f"the signer's request is still waiting for the lock after {waited:.0f} s"
        assert_equal(parked, ["error 55P03"])
        answer = ask(SignerService(signer, xpubs=XPUBS, clients=CLIENTS, clock=lambda: NOW),
                     new_request(KEY, "sign_bitcoin_batch", params, now=NOW))
        assert_equal(answer["error"]["code"], "unavailable")
        assert "lock_timeout" in answer["error"]["message"], answer
        holder.execute(text("SELECT pg_advisory_unlock_all()"))
        log.info("the lock is free again: the same request is signed")
        code, _ = outcome(lambda: signer.sign_bitcoin_batch(batch, coins, outs, change))
    finally:
        holder.invalidate()  # its session-level lock goes with the database connection, whatever happened above
        holder.close()
        if asking.ident is not None:
            asking.join()
        release(api, wid)
    assert 0.9 < waited < 5, waited
    assert_equal(code, "signed")
    assert_equal(len(records(api, wid)), 1)
    assert_equal(audit_codes(api, batch), [None])  # the timed-out requests decided nothing and audited nothing
