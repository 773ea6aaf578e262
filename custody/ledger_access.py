"""The ledger as an API caller may use it: every command checked against `custody.money_rules`.

Routes never call the ledger's commands directly; they build a `CallerLedger` for the
authenticated caller and call it. It:
- refuses, before anything is written, a command that would open, debit, credit or hold on an
  account kind the caller's role may not touch (`kind_not_permitted`, 403) or open an account
  outside the customer namespace (`account_name_reserved`, 422);
- puts every idempotency key the caller sends into the caller's namespace (`api:<key name>:`), so
  a replay by the same caller answers the original result and no caller can take a key that a
  subsystem or another caller uses;
- reverses only transactions written over the API whose reversal obeys the same table
  (`transaction_not_reversible`, 409): a subsystem's transaction is corrected by a treasury
  adjustment instead.
- refuses a debit, a hold or a capture on an account frozen by a reorged-out credit that custody
  could not hold in full (`account_frozen`, 409; `custody.incidents.refuse_frozen`).

Account kinds never change after an account is opened, so checking them before the ledger's own
locked checks leaves no window: the ledger then checks balances and limits under its locks.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from custody.auth import Principal
from custody.errors import CustodyError, CustodyErrorCode
from custody.incidents import frozen_precheck, refuse_frozen
from custody.money_rules import (
    OWNER_PATTERN,
    MoneyAction,
    caller_key,
    customer_name_ok,
    permitted,
    written_over_api,
)
from ledger.errors import ErrorCode, LedgerError
from ledger.model import Account, AccountKind, Hold, PostResult, Transfer
from ledger.service import Ledger


class CallerLedger:
    """One caller's view of the ledger's commands (reads need no checks and stay on `Ledger`)."""

    def __init__(self, ledger: Ledger, caller: Principal) -> None:
        self.ledger = ledger
        self.caller = caller
        self._accounts: dict[int, Account] = {}

    @property
    def hold_owner(self) -> str:
        return f"api:{self.caller.name}"

    def key(self, key: str) -> str:
        return caller_key(self.caller.name, key)

    def account(self, account_id: int) -> Account:
        if account_id not in self._accounts:
            self._accounts[account_id] = self.ledger.get_account(account_id)
        return self._accounts[account_id]

    def _violation(self, action: MoneyAction, account_ids: Iterable[int]) -> tuple[int, AccountKind] | None:
        """The first account (and its kind) that the caller may not `action`, or None."""
        for account_id in account_ids:
            kind = self.ledger.account_reference(account_id).kind  # cached: a kind never changes
            if not permitted(self.caller.role, action, kind):
                return account_id, kind
        return None

    def _require(self, action: MoneyAction, account_ids: Iterable[int]) -> None:
        found = self._violation(action, account_ids)
        if found is not None:
            account_id, kind = found
            raise CustodyError(
                CustodyErrorCode.kind_not_permitted,
                f"role {self.caller.role.value} may not {action.value} a {kind.value} account",
                account_id=account_id, action=action.value, kind=kind.value,
            )

    # ---- commands -------------------------------------------------------------------------

    def open_account(self, asset: str, kind: str, name: str, owner: str | None) -> Account:
        try:
            account_kind = AccountKind(kind)
        except ValueError:
            raise LedgerError(ErrorCode.invalid_request, f"unknown account kind {kind!r}") from None
        if not permitted(self.caller.role, MoneyAction.open, account_kind):
            raise CustodyError(CustodyErrorCode.kind_not_permitted,
                               f"role {self.caller.role.value} may not open a {account_kind.value} account; "
                               "firm accounts are opened by the service itself", action="open", kind=account_kind.value)
        if owner is None or not OWNER_PATTERN.match(owner):
            raise LedgerError(ErrorCode.invalid_request,
                              "a customer account needs an owner of 1-100 letters, digits or . _ @ + -")
        if not customer_name_ok(name, owner, asset):
            raise CustodyError(CustodyErrorCode.account_name_reserved,
                               f"a customer account's name must be 'customer:{owner}:{asset}' or start with "
                               f"'customer:{owner}:{asset}:'; other names are reserved")
        return self.ledger.open_account(asset, account_kind, name, owner=owner)

    def close_account(self, account_id: int) -> Account:
        """Close an account the caller could have opened (a firm account closed under a subsystem
        would stop its bookings: firm accounts are closed by the service, never over the API)."""
        kind = self.account(account_id).kind
        if not permitted(self.caller.role, MoneyAction.open, kind):
            raise CustodyError(CustodyErrorCode.kind_not_permitted,
                               f"role {self.caller.role.value} may not close a {kind.value} account",
                               account_id=account_id, action="close", kind=kind.value)
        return self.ledger.close_account(account_id)

    def post(self, key: str, transfers: Sequence[Transfer], *, kind: str, metadata: dict[str, Any]) -> PostResult:
        self._require(MoneyAction.debit, (t.debit_account_id for t in transfers))
        self._require(MoneyAction.credit, (t.credit_account_id for t in transfers))
        return self.ledger.post(self.key(key), transfers, kind=kind, metadata=metadata,
                                precheck=frozen_precheck(t.debit_account_id for t in transfers))  # a reorged-out credit

    def place_hold(self, key: str, account_id: int, amount: int, *, reference: str,
                   expires_at: dt.datetime | None) -> Hold:
        self._require(MoneyAction.hold, [account_id])
        return self.ledger.place_hold(self.key(key), account_id, amount, owner=self.hold_owner,
                                      reference=reference, expires_at=expires_at,
                                      precheck=frozen_precheck([account_id]))  # a reorged-out credit

    def capture(self, key: str, hold_id: int, legs: Sequence[Transfer], *, final: bool) -> PostResult:
        # The hold's owner check (only this caller's holds) is the ledger's, under its locks; a
        # hold is only ever placed on an account this caller may hold on.
        self._require(MoneyAction.credit, (t.credit_account_id for t in legs))
        refuse_frozen(self.ledger.engine, [self.ledger.get_hold(hold_id).account_id])
        return self.ledger.capture_hold(self.key(key), hold_id, legs, owner=self.hold_owner, final=final)

    def release(self, hold_id: int) -> Hold:
        return self.ledger.release_hold(hold_id, owner=self.hold_owner)

    def reverse(self, transaction_id: int, key: str) -> PostResult:
        original = self.ledger.transaction_key(transaction_id)
        if not written_over_api(original):
            raise CustodyError(CustodyErrorCode.transaction_not_reversible,
                               f"transaction {transaction_id} was written by a subsystem; correct it with a "
                               "treasury adjustment", transaction_id=transaction_id)
        transfers = self.ledger.transaction_transfers(transaction_id)
        # The reversal debits what the original credited: it must obey the table as a posting would.
        found = (self._violation(MoneyAction.debit, (t.credit_account_id for t in transfers))
                 or self._violation(MoneyAction.credit, (t.debit_account_id for t in transfers)))
        if found is not None:
            account_id, kind = found
            raise CustodyError(CustodyErrorCode.transaction_not_reversible,
                               f"reversing transaction {transaction_id} would move money on {kind.value} account "
                               f"{account_id}; correct it with a treasury adjustment",
                               transaction_id=transaction_id, account_id=account_id, kind=kind.value)
        refuse_frozen(self.ledger.engine, (t.credit_account_id for t in transfers))  # what the reversal debits
        return self.ledger.reverse(transaction_id, self.key(key))
