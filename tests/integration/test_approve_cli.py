"""approve_cli: a scripted approver makes a key with `custody approver-key new`, its printed entry is
registered, and `custody approve --key FILE WITHDRAWAL_ID` signs the payload the API serves and
approves over HTTP. A missing API key, a key file others may read, a key custody does not know and
another operator's key are refused with their exit status, and nothing is approved."""
from __future__ import annotations

import logging
import tomllib
import uuid

from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.approve_cli import main
from custody.auth import Role, create_api_key
from regtest.util import assert_equal
from tests.approvers import key_id, private_key
from tests.integration.withdrawal_api import WithdrawalApi

log = logging.getLogger(__name__)


def test_a_scripted_approver_approves_with_its_key_file(engine, ledger, tmp_path, capsys, monkeypatch):
    name = f"cli-op-{uuid.uuid4().hex[:8]}"
    key_file = tmp_path / "approver.pem"
    assert_equal(main(["approver-key", "new", str(key_file), "--operator", name]), 0)
    printed = capsys.readouterr().out
    log.info("approver entry:\n%s", printed)
    assert_equal(oct(key_file.stat().st_mode & 0o777), "0o600")
    [entry] = tomllib.loads(printed)["approvers"]
    assert_equal((entry["operator"], entry["scheme"]), (name, "ed25519"))
    assert_equal(main(["approver-key", "new", str(key_file), "--operator", name]), 2)  # never overwritten

    api = WithdrawalApi(engine, extra_approvers=(entry,))
    app = api.operator().app
    api_key_file = tmp_path / "api-key"
    api_key_file.write_text(create_api_key(engine, name, Role.operator, api.custody.settings.api_key_pepper) + "\n")
    acct = api.open_customer(f"cli-{uuid.uuid4().hex[:8]}")
    wid = api.withdraw(acct, "5")["id"]

    def approve(*extra: str, key: str = str(key_file)) -> int:
        return main(["approve", "--key", key, str(wid), *extra], http=TestClient(app, raise_server_exceptions=False))

    log.info("no API key anywhere: refused before anything is sent")
    monkeypatch.delenv("CUSTODY_API_KEY", raising=False)
    assert_equal(approve(), 2)
    log.info("a key file others may read is refused")
    key_file.chmod(0o644)
    assert_equal(approve("--api-key-file", str(api_key_file)), 2)
    key_file.chmod(0o600)
    log.info("a key custody does not know: approver_unknown")
    other = tmp_path / "other.pem"
    assert_equal(main(["approver-key", "new", str(other), "--operator", "someone"]), 0)
    capsys.readouterr()
    assert_equal(approve("--api-key-file", str(api_key_file), key=str(other)), 1)
    assert "approver_unknown" in capsys.readouterr().err
    log.info("operator 2's registered key, used with this operator's API key: approver_not_caller")
    theirs = tmp_path / "theirs.pem"
    theirs.write_bytes(private_key(api.operator_name(2)).private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    theirs.chmod(0o600)
    assert_equal(approve("--api-key-file", str(api_key_file), "--key-id", key_id(api.operator_name(2)), key=str(theirs)), 1)
    assert "approver_not_caller" in capsys.readouterr().err
    assert_equal(api.custody.withdrawals.get(int(wid)).state, "pending_approval")

    log.info("the approver's own key: the payload is shown, signed and approved")
    monkeypatch.setenv("CUSTODY_API_KEY", api_key_file.read_text().strip())
    assert_equal(approve("--comment", "scripted: matches ticket 7"), 0)
    out = capsys.readouterr().out
    log.info("%s", out)
    assert "pay 5.00000000 BTC on bitcoin to" in out and f"withdrawal {wid} is pending_approval" in out
    assert_equal(api.approve(2, wid).json()["state"], "approved")
    with engine.connect() as c:
        approvals = c.execute(text("SELECT operator, key_id FROM approval WHERE withdrawal_id = :w ORDER BY id"),
                              {"w": int(wid)}).all()
    assert_equal([tuple(a) for a in approvals], [(f"api:{name}", entry["key_id"]),
                                                 (f"api:{api.operator_name(2)}", key_id(api.operator_name(2)))])
    api.reject_all(acct)
