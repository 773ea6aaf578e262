"""Who may move money over the API: the permission table for ledger commands, as data.

Guarantees (enforced by `custody.ledger_access.CallerLedger`, the only way routes reach the ledger's
commands, and, where cheap, by the database):
- the exchange backend opens customer accounts only, in the customer namespace
  (`customer:<owner>:<asset>[:<suffix>]`, so a name custody or matching opens for an owner and
  asset can only ever hold exactly that owner's account in that asset); every other account name is reserved for the firm's subsystems, so a
  caller can never squat the name of a firm account (migration 0012 also refuses, in the database,
  any firm account named in the customer namespace);
- a caller debits (directly, or by placing a hold and capturing it) customer accounts only; it may
  credit customer accounts and fee income (charging a customer's fee); it never debits a firm
  account (equity, asset locations, in-flight, suspense, quarantine, dust, fee income, liquidity,
  network-fee expense);
- a caller's idempotency keys (postings, holds, captures, reversals) live in its own namespace
  `api:<key name>:<key>`, so no caller can collide with another caller's or a subsystem's keys
  (subsystem keys never start with `api:`);
- a transaction written by a subsystem (a deposit credit, a capture, a fill, a sweep) is never
  reversed over the API; an admin may reverse a transaction written over the API only when the
  reversal itself obeys the table (it debits customer accounts only). Everything else is corrected
  by a treasury adjustment (`custody.adjustments`): proposed by one operator, approved by a quorum
  of others, audited with its reason.

The README's "Who may move money" table is this table in words; a test holds them equal.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
import re

from custody.auth import Role
from ledger.model import AccountKind


class MoneyAction(str, enum.Enum):
    open = "open"  # open an account of the kind
    debit = "debit"  # be the debit side of a posting (the balance goes down)
    credit = "credit"  # be the credit side of a posting or a capture (the balance goes up)
    hold = "hold"  # place a hold on the account (and later capture from it, a debit through the hold)


_CUSTOMER = frozenset({AccountKind.customer})
_CUSTOMER_OR_FEES = frozenset({AccountKind.customer, AccountKind.fee_income})
_NOTHING: frozenset[AccountKind] = frozenset()

# Role -> action -> the account kinds it may touch. Admin passes every route's role check but is
# bound by the same money rules as the backend: configuring the service is not moving money.
PERMITTED: dict[Role, dict[MoneyAction, frozenset[AccountKind]]] = {
    Role.backend: {
        MoneyAction.open: _CUSTOMER,
        MoneyAction.debit: _CUSTOMER,
        MoneyAction.credit: _CUSTOMER_OR_FEES,
        MoneyAction.hold: _CUSTOMER,
    },
    Role.admin: {
        MoneyAction.open: _CUSTOMER,
        MoneyAction.debit: _CUSTOMER,
        MoneyAction.credit: _CUSTOMER_OR_FEES,
        MoneyAction.hold: _CUSTOMER,
    },
    Role.operator: {action: _NOTHING for action in MoneyAction},
    Role.auditor: {action: _NOTHING for action in MoneyAction},
}

CUSTOMER_NAMESPACE = "customer:"
API_KEY_NAMESPACE = "api:"
# Customer owners named by the backend: no separator, so `customer:<owner>:` is unambiguous.
OWNER_PATTERN = re.compile(r"^[A-Za-z0-9._@+-]{1,100}$")


def permitted(role: Role, action: MoneyAction, kind: AccountKind) -> bool:
    return kind in PERMITTED[role][action]


def may_read_transaction(role: Role, kinds: Iterable[AccountKind]) -> bool:
    """Who may read a journal transaction (`GET /v1/transactions/{id}`): operators, auditors and
    admins every one; a backend only one with a leg on an account it may move money on itself
    (debit: customer accounts), so the firm's own movements (sweeps, rebalances, treasury
    adjustments) stay out of its reach. Otherwise the transaction answers as if it did not exist."""
    if role is not Role.backend:
        return True
    return any(permitted(role, MoneyAction.debit, kind) for kind in kinds)


def may_read_statement(role: Role, kind: AccountKind) -> bool:
    """Who may read an account's statement (`GET /v1/accounts/{id}/statement`): the rule of
    may_read_transaction applied to the account: operators, auditors and admins every account; a
    backend only an account it may move money on itself (debit: customer accounts), since a firm
    account's statement lists the firm's own movements (transaction ids, idempotency keys, kinds,
    amounts) that may_read_transaction hides from it. Otherwise the account answers as if it did
    not exist."""
    return may_read_transaction(role, (kind,))


def caller_namespace(key_name: str) -> str:
    """The prefix of every idempotency key a caller sends (and the owner of its holds)."""
    return f"{API_KEY_NAMESPACE}{key_name}:"


def caller_key(key_name: str, key: str) -> str:
    return caller_namespace(key_name) + key


def written_over_api(idempotency_key: str) -> bool:
    """True for a journal transaction an API caller posted (its key is in a caller's namespace);
    False for one a subsystem wrote (custody, matching, treasury)."""
    return idempotency_key.startswith(API_KEY_NAMESPACE)


def customer_name_ok(name: str, owner: str, asset: str) -> bool:
    """A customer account opened over the API is named `customer:<owner>:<asset>` (the name custody
    and matching open for that owner and asset, so opening it first changes nothing for them) or
    `customer:<owner>:<asset>:<suffix>` for further accounts of the owner in that asset. A name that
    custody or matching would open for another asset can therefore never be taken by an account in
    this one."""
    base = f"{CUSTOMER_NAMESPACE}{owner}:{asset}"
    return name == base or (name.startswith(base + ":") and len(name) > len(base) + 1)
