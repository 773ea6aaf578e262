"""A withdrawal API without chain nodes, for the policy scenarios (allowlists, velocity): a
container whose withdrawal side is built with no adapters and no signer (requests are decided,
nothing is paid), BTC configured as on regtest, and an HTTP client per role. Its approver registry
(tests/approvers.py) holds the test keys of its two operator clients (`operator_name(n)`) and of the
fixed TEST_OPERATORS; `approve(n, wid)` signs and sends operator n's approval.

Each scenario works with accounts of its own (random names and owners) on the session database,
funds them from equity with the ledger, and rejects what it leaves pending or approved, so the
`ledger` fixture's verify() ends every scenario and no hold is left behind.
"""
from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import text

from custody.api.app import create_app
from custody.auth import Role, create_api_key
from custody.container import Container
from custody.policy_config import PolicyProvider
from custody.settings import Settings
from custody.wallets import Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from policies import PolicySet
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.approvers import TEST_OPERATORS, approve_over_api, registry

DEST = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # not ours


def with_bitcoin_wallets(api: "WithdrawalApi") -> "WithdrawalApi":
    """`api` with the bitcoin hot and deposit wallets of the BIP84 test-vector seed registered
    (regtest), so the destination guard has the service's own addresses to refuse."""
    keys = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
    for tier in ("hot", "deposit"):
        api.custody.wallets.register_wallet("bitcoin", tier, "regtest", keys.account_xpub("bitcoin", tier))
    return api


class WithdrawalApi:
    def __init__(self, engine, policy: PolicySet | None = None, extra_approvers: tuple[dict, ...] = (), *,
                 owner_engine=None) -> None:
        """`owner_engine` (default `engine`) writes what the api process may not: the asset's chain
        data (the worker's reference data), the API keys (the owner's CLI) and the customers'
        funding from equity, for an `engine` logged in as custody_api."""
        settings = Settings(environment="test")
        self.run = uuid.uuid4().hex[:8]
        approvers = registry(self.operator_name(1), self.operator_name(2), *TEST_OPERATORS, extra=extra_approvers)
        self.custody = Container(settings=settings, engine=engine, ledger=Ledger(engine)).with_chains(
            {}, policy=policy, approvers=approvers)
        owner_engine = owner_engine if owner_engine is not None else engine
        self.owner_ledger = Ledger(owner_engine)  # funds customers: custody_api never debits equity (0054)
        Wallets(owner_engine, Ledger(owner_engine)).configure_asset(
            "BTC", 8, "bitcoin", finality=3, dust_minimum=1_000, min_withdrawal=10_000, withdrawal_fee=5_000)
        app = create_app(self.custody)
        self.clients: dict[Role, TestClient] = {}
        for role in (Role.backend, Role.operator, Role.admin):
            for n in (1, 2):
                client = TestClient(app, raise_server_exceptions=False)
                client.headers["X-API-Key"] = create_api_key(owner_engine, f"{role.value}-{n}-{self.run}", role,
                                                             settings.api_key_pepper)
                self.clients[(role, n)] = client

    @property
    def backend(self) -> TestClient:
        return self.clients[(Role.backend, 1)]

    def operator(self, n: int = 1) -> TestClient:
        return self.clients[(Role.operator, n)]

    def operator_name(self, n: int = 1) -> str:
        """Operator client n's API key name, which is also its approver key's operator."""
        return f"{Role.operator.value}-{n}-{self.run}"

    def approve(self, n: int, withdrawal_id: int | str, comment: str = "checked"):
        """Operator n approves, signing the withdrawal's approval payload with its own test key."""
        return approve_over_api(self.operator(n), withdrawal_id, self.operator_name(n), comment)

    @property
    def admin(self) -> TestClient:
        return self.clients[(Role.admin, 1)]

    def use_policy(self, policy: PolicySet) -> None:
        self.custody.withdrawals.policies = PolicyProvider(policy)

    def open_customer(self, owner: str) -> int:
        """A customer account opened by the backend over the API, funded with 10 BTC from equity."""
        r = self.backend.post("/v1/accounts", json={"asset": "BTC", "kind": "customer", "owner": owner,
                                                    "name": f"customer:{owner}:BTC:{uuid.uuid4().hex[:8]}"})
        assert r.status_code == 201, r.text
        acct = r.json()["id"]
        equity = self.custody.wallets.firm_account("equity", "BTC")
        self.owner_ledger.post(f"test-fund:{uuid.uuid4().hex}", [Transfer(equity, acct, 1_000_000_000)], kind="treasury_credit")
        return acct

    def withdraw(self, acct: int, amount: str, destination: str = DEST) -> dict:
        r = self.backend.post("/v1/withdrawals", json={"client_withdrawal_id": uuid.uuid4().hex, "account_id": acct,
                                                       "amount": amount, "destination": destination})
        assert r.status_code in (201, 422), r.text
        return r.json() if r.status_code == 201 else {"state": "rejected", **r.json()["error"]["detail"]}

    def reasons(self, withdrawal_id: int | str) -> list[str]:
        with self.custody.engine.connect() as c:
            return list(c.execute(text("SELECT d.reasons FROM policy_decision d JOIN withdrawal_request w ON w.decision_id = d.id "
                                       "WHERE w.id = :w"), {"w": int(withdrawal_id)}).scalar_one())

    def reject_all(self, *accounts: int) -> None:
        """Leave nothing held: reject every withdrawal of `accounts` still pending or approved."""
        for acct in accounts:
            for w in self.custody.withdrawals.list(account_id=acct):
                if w.state in ("pending_approval", "approved"):
                    self.custody.withdrawals.reject(w.id, operator="op-cleanup", comment="test cleanup")
