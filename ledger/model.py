"""Pure value types of the ledger: the chart of accounts, transfers, holds, balances.

Vocabulary (fixed, after TigerBeetle):
- an **account** holds one asset; its balance is the sum of its entries, in minor units;
- a **transfer** moves `amount` from `debit_account_id` (balance goes down) to `credit_account_id`
  (balance goes up); a customer's balance is what the exchange owes them, so it is positive, and an
  asset-location account (coins the firm holds on chain) runs negative;
- a **journal transaction** is one balanced business event made of one or more transfers (a linked
  batch) that commit together or not at all, under one idempotency key;
- a **hold** is a two-phase pending transfer: it moves value from available to held on one account,
  and later is captured (in parts, each capture a transfer whose debit names the hold), released, or
  expired. `available = posted - held`.

Nothing here touches a database; `ledger.service` persists these.
"""
from __future__ import annotations

import datetime as dt
import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from ledger.errors import ErrorCode, LedgerError

MAX_AMOUNT = 10**78 - 1  # NUMERIC(78,0): wide enough for uint256
MAX_BATCH = 10_000
# A journal transaction's metadata, as JSON text, is at most this many bytes (the database's
# CHECK journal_transaction_metadata_size, migration 0032): its `ledger.transaction_posted` event
# carries it, and an event larger than the broker's max_payload could never be published.
MAX_METADATA_BYTES = 16_384


def metadata_size(metadata: dict | None) -> int:
    """The size in bytes of `metadata` as the database stores it (jsonb text: `", "` and `": "`)."""
    import json
    return len(json.dumps(metadata or {}, ensure_ascii=False, default=str).encode())


class AccountKind(str, enum.Enum):
    """The chart of accounts (DESIGN.md 5). The kind sets the default balance limits."""

    customer = "customer"  # what a customer is owed; never negative
    fee_income = "fee_income"  # fees earned; never negative
    liquidity = "liquidity"  # the firm's own trading/liquidity position; never negative
    in_flight = "in_flight"  # withdrawals signed but not final; never negative
    asset_location = "asset_location"  # coins held in one wallet tier on one chain; never positive
    network_fee_expense = "network_fee_expense"  # fees paid to miners/validators; never positive
    suspense = "suspense"  # unexplained differences awaiting an explanation; either sign
    quarantine = "quarantine"  # deposits held back by screening; never negative
    dust = "dust"  # amounts below a minimum, recorded not credited; never negative
    equity = "equity"  # the firm's capital / the outside world; either sign


# (may_go_negative, may_go_positive) per kind.
DEFAULT_LIMITS: dict[AccountKind, tuple[bool, bool]] = {
    AccountKind.customer: (False, True),
    AccountKind.fee_income: (False, True),
    AccountKind.liquidity: (False, True),
    AccountKind.in_flight: (False, True),
    AccountKind.asset_location: (True, False),
    AccountKind.network_fee_expense: (True, False),
    AccountKind.suspense: (True, True),
    AccountKind.quarantine: (False, True),
    AccountKind.dust: (False, True),
    AccountKind.equity: (True, True),
}


# Balance shards per kind (see ledger.service and the account_balance table). Firm accounts that
# every deposit, fill or fee touches are sharded so that postings which cannot break their limits
# do not queue on one row lock; customer accounts keep one shard (and a stored running balance).
HOT_SHARDS = 16
MAX_SHARDS = 64
DEFAULT_SHARDS: dict[AccountKind, int] = {
    kind: HOT_SHARDS if kind in {
        AccountKind.fee_income,
        AccountKind.asset_location,
        AccountKind.network_fee_expense,
        AccountKind.suspense,
        AccountKind.equity,
    } else 1
    for kind in AccountKind
}


class HoldState(str, enum.Enum):
    pending = "pending"
    captured = "captured"  # terminal: captured in full (possibly in parts)
    released = "released"  # terminal: the remainder went back to available
    expired = "expired"  # terminal: released by the expiry job after its timeout


TERMINAL_HOLD_STATES = frozenset({HoldState.captured, HoldState.released, HoldState.expired})


@dataclass(frozen=True)
class Asset:
    code: str
    decimals: int


@dataclass(frozen=True)
class Account:
    id: int
    asset: str
    kind: AccountKind
    name: str
    owner: str | None
    may_go_negative: bool
    may_go_positive: bool
    closed: bool
    balance_shards: int = 1  # rows carrying the balance projection; > 1 for hot firm accounts


@dataclass(frozen=True)
class Transfer:
    """One leg of a journal transaction. `hold_id` makes the debit a capture from that hold."""

    debit_account_id: int
    credit_account_id: int
    amount: int
    hold_id: int | None = None


@dataclass(frozen=True)
class Entry:
    """One journal entry, a leg of its transaction: `amount` is signed (positive credits the
    account), in minor units. The entries of a transaction are pairs (debit, credit), one pair per
    transfer in the order posted: `transfer_index` names the pair, `counterpart_entry_id` and
    `counterpart_account_id` the other side of it, `metadata` the transfer's own (the
    transaction's metadata `legs[transfer_index]`, when its poster gave one per transfer)."""

    id: int
    account_id: int
    account_kind: AccountKind
    asset: str
    amount: int
    hold_id: int | None
    transfer_index: int = 0
    counterpart_entry_id: int | None = None
    counterpart_account_id: int | None = None
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class JournalTransaction:
    """A posted transaction as the journal holds it: its entries in order, pairs of debit and credit."""

    id: int
    idempotency_key: str
    kind: str
    metadata: dict
    reverses_id: int | None
    created_at: dt.datetime
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class PostResult:
    transaction_id: int
    created: bool  # False: the key was posted before with the same content; nothing moved now


@dataclass(frozen=True)
class Hold:
    id: int
    account_id: int
    amount: int
    captured: int
    released: int
    state: HoldState
    owner: str
    reference: str
    expires_at: dt.datetime | None
    created: bool = True  # False on an idempotent replay of place_hold

    @property
    def remaining(self) -> int:
        return self.amount - self.captured - self.released


# ---- commands sent together (`Ledger.apply`) --------------------------------------------------

@dataclass(frozen=True)
class PlaceHold:
    """`Ledger.place_hold` as one command of a batch (no expiry: batched holds are order holds).
    `hold_id`, if given, is an id from `Ledger.reserve_hold_ids`: later commands of the same batch
    can then name the hold before it exists."""

    key: str
    account_id: int
    amount: int
    owner: str
    reference: str
    hold_id: int | None = None


@dataclass(frozen=True)
class ReleaseHold:
    """`Ledger.release_hold` as one command of a batch."""

    hold_id: int
    owner: str


@dataclass(frozen=True)
class ReplaceHold:
    """Swap pending hold `hold_id` for a new hold of `amount` under `key`, counting what the old one
    still reserves as available; if the new amount does not fit, nothing changes."""

    hold_id: int
    key: str
    account_id: int
    amount: int
    owner: str
    reference: str
    new_hold_id: int | None = None  # as PlaceHold.hold_id


@dataclass(frozen=True)
class PostTransfers:
    """`Ledger.post` as one command of a batch."""

    key: str
    transfers: tuple[Transfer, ...]
    kind: str = "transfer"
    metadata: dict[str, Any] | None = None
    hold_owner: str | None = None


LedgerCommand = PlaceHold | ReleaseHold | ReplaceHold | PostTransfers


@dataclass(frozen=True)
class CommandResult:
    """One command's answer: `status` is "created", "exists" (a replay, or releasing a released
    hold) or an ErrorCode value; `id` is the hold id (holds, replacements, releases) or the
    journal transaction id (postings); `index` the failing transfer of a refused posting."""

    status: str
    id: int | None
    index: int | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("created", "exists")


@dataclass(frozen=True)
class Headroom:
    """What `Ledger.lock_available` reads for an account: posted - held, and whether a hold may
    take it below zero (`may_go_negative`) or none may be placed at all (`closed`)."""

    available: int
    may_go_negative: bool
    closed: bool


@dataclass(frozen=True)
class Balance:
    account_id: int
    asset: str
    posted: int
    held: int
    checkpoint: int  # id of the last journal transaction reflected in `posted`

    @property
    def available(self) -> int:
        return self.posted - self.held


@dataclass(frozen=True)
class StatementLine:
    entry_id: int  # the leg's own id
    transaction_id: int
    amount: int  # signed: positive credits the account
    balance_after: int  # stored for one-shard accounts, computed at read time for sharded ones
    kind: str
    idempotency_key: str
    created_at: dt.datetime
    counterpart_entry_id: int | None = None  # the other side of this leg's transfer
    counterpart_account_id: int | None = None


def pair_entries(entries: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """For a transaction's entries [(id, account id)] in id order: [(transfer index, counterpart
    entry id, counterpart account id)] each. Entries are written as (debit, credit) pairs."""
    out = []
    for k in range(len(entries)):
        other = entries[k ^ 1] if (k ^ 1) < len(entries) else (None, None)
        out.append((k // 2, other[0], other[1]))
    return out


def leg_metadata(metadata: dict, transfer_index: int) -> dict:
    """A transfer's own metadata: `metadata["legs"][transfer_index]` when the poster gave a list of
    objects there (convert and fills do), else {}."""
    legs = metadata.get("legs") if isinstance(metadata, dict) else None
    if isinstance(legs, list) and transfer_index < len(legs) and isinstance(legs[transfer_index], dict):
        return legs[transfer_index]
    return {}


@dataclass(frozen=True)
class StatementPage:
    account_id: int
    lines: list[StatementLine]
    next_after: int | None  # pass as `after` to fetch the next page; None when this is the last


@dataclass(frozen=True)
class Check:
    """One named self-verification check and what it found."""

    name: str
    ok: bool
    detail: str = ""
    problems: list[Any] = field(default_factory=list)


def require_amount(amount: object, what: str = "amount") -> int:
    """Return `amount` if it is a positive int of minor units, else raise invalid_amount."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise LedgerError(ErrorCode.invalid_amount, f"{what} must be an integer of minor units")
    if amount <= 0 or amount > MAX_AMOUNT:
        raise LedgerError(ErrorCode.invalid_amount, f"{what} must be between 1 and 10^78-1")
    return amount


def validate_transfers(transfers: Sequence[Transfer]) -> None:
    """The checks that need no database: shape, amounts, distinct accounts."""
    if not transfers:
        raise LedgerError(ErrorCode.invalid_request, "a transaction needs at least one transfer")
    if len(transfers) > MAX_BATCH:
        raise LedgerError(ErrorCode.invalid_request, f"at most {MAX_BATCH} transfers per batch")
    for i, t in enumerate(transfers):
        require_amount(t.amount, f"transfers[{i}].amount")
        if t.debit_account_id == t.credit_account_id:
            raise LedgerError(ErrorCode.accounts_must_be_different, index=i)


def content_hash(kind: str, transfers: Sequence[Transfer], extra: dict[str, Any] | None = None) -> str:
    """A canonical digest of what a posting does, to tell a replay from a key reused for other content."""
    body = {
        "kind": kind,
        "transfers": [
            [t.debit_account_id, t.credit_account_id, str(t.amount), t.hold_id] for t in transfers
        ],
        "extra": extra or {},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def reversal_of(transfers: Sequence[Transfer]) -> list[Transfer]:
    """The compensating transfers: same amounts, accounts swapped, no hold references."""
    return [Transfer(t.credit_account_id, t.debit_account_id, t.amount) for t in reversed(transfers)]
