"""Request and response bodies of the ledger routes. Amounts cross the API as decimal strings in
the asset's units ("0.5" BTC); each response also gives the exact minor-unit integer as a string."""
from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from custody.api.params import Id
from ledger.model import MAX_METADATA_BYTES, AccountKind, metadata_size
from ledger.amounts import format_amount

Key = Field(min_length=1, max_length=200, description="idempotency key chosen from business ids")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AssetIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'code': 'BTC', 'decimals': 8}]})
    code: str = Field(min_length=1, max_length=32, pattern=r"^[A-Z0-9][A-Z0-9_.-]*$")
    decimals: int = Field(ge=0, le=36)


class AssetOut(BaseModel):
    code: str
    decimals: int


class AccountIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'asset': 'BTC', 'kind': 'customer', 'name': 'customer:alice:BTC', 'owner': 'alice'}]})
    asset: str
    kind: AccountKind
    name: str = Field(min_length=1, max_length=200)
    owner: str | None = Field(default=None, max_length=200)


class AccountOut(BaseModel):
    id: int
    asset: str
    kind: str
    name: str
    owner: str | None
    may_go_negative: bool
    may_go_positive: bool
    closed: bool


class TransferIn(Strict):
    debit_account_id: Id
    credit_account_id: Id
    amount: str = Field(description='decimal string in the asset\'s units, e.g. "0.5"')


class TransactionIn(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "idempotency_key": "trade-42-settle", "kind": "transfer", "metadata": {"trade": "42"},
        "transfers": [{"debit_account_id": 7, "credit_account_id": 8, "amount": "0.25"}]}]})
    idempotency_key: str = Key
    kind: str = Field(default="transfer", min_length=1, max_length=64)
    metadata: dict[str, Any] = Field(default_factory=dict, description=(
        f"free JSON object, at most {MAX_METADATA_BYTES} bytes as JSON text (it travels in the posting's event)"))
    transfers: list[TransferIn] = Field(min_length=1, max_length=10_000)

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        if metadata_size(metadata) > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is at most {MAX_METADATA_BYTES} bytes as JSON")
        return metadata


class TransactionOut(BaseModel):
    transaction_id: int
    created: bool


class ReverseIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'idempotency_key': 'reverse-trade-42-settle'}]})
    idempotency_key: str = Key


class HoldIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'idempotency_key': 'order-17-hold', 'account_id': 7, 'amount': '0.25', 'reference': 'order:17', 'expires_at': '2030-01-01T00:00:00Z'}]})
    idempotency_key: str = Key
    account_id: Id
    amount: str
    reference: str = Field(min_length=1, max_length=200)
    expires_at: dt.datetime | None = None


class CaptureLegIn(Strict):
    credit_account_id: Id
    amount: str


class CaptureIn(Strict):
    model_config = ConfigDict(json_schema_extra={'examples': [{'idempotency_key': 'order-17-capture-1', 'final': True, 'transfers': [{'credit_account_id': 8, 'amount': '0.1'}]}]})
    idempotency_key: str = Key
    transfers: list[CaptureLegIn] = Field(min_length=1, max_length=1000)
    final: bool = False


class Money(BaseModel):
    value: str
    minor: str

    @classmethod
    def of(cls, minor: int, decimals: int) -> "Money":
        return cls(value=format_amount(minor, decimals), minor=str(minor))


class HoldOut(BaseModel):
    id: int
    account_id: int
    state: str
    owner: str
    reference: str
    amount: Money
    captured: Money
    released: Money
    remaining: Money
    expires_at: dt.datetime | None


class BalanceOut(BaseModel):
    account_id: int
    asset: str
    posted: Money
    held: Money
    available: Money
    checkpoint: int


class StatementLineOut(BaseModel):
    entry_id: int = Field(description="this leg's own id (`GET /v1/transactions/{transaction_id}` lists it)")
    transaction_id: int
    kind: str
    idempotency_key: str
    amount: Money
    balance_after: Money
    created_at: dt.datetime
    counterpart_entry_id: int | None = Field(default=None, description="the other side of this leg's transfer")
    counterpart_account_id: int | None = Field(default=None, description="the account of the counterpart leg")


class StatementOut(BaseModel):
    account_id: int
    asset: str
    lines: list[StatementLineOut]
    next_after: int | None = Field(description="the entry id to send as `after` for the next page (kept for existing "
                                               "clients; `next_cursor` is the same position as a cursor)")
    next_cursor: str | None = Field(default=None, description="the next page's `cursor`; null on the last page")


class CheckOut(BaseModel):
    name: str
    ok: bool
    detail: str


class VerifyOut(BaseModel):
    ok: bool
    checks: list[CheckOut]


class EntryOut(BaseModel):
    """One leg of a journal transaction: `amount` signed as {value, minor} (negative debits the
    account). Legs come in pairs, one pair per transfer (`transfer_index`); `counterpart_entry_id`
    is the other side of this leg's transfer, `references` every other leg of the transaction (they
    commit together or not at all; empty when it has more than 64 legs), `metadata` the transfer's own (`metadata.legs[transfer_index]`
    of the transaction, when its poster gave one per transfer; else empty)."""

    id: int
    account_id: int
    account_kind: str
    asset: str
    amount: Money
    hold_id: int | None
    transfer_index: int = 0
    counterpart_entry_id: int | None = None
    counterpart_account_id: int | None = None
    references: list[int] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class JournalTransactionOut(BaseModel):
    id: int
    idempotency_key: str
    kind: str
    metadata: dict[str, Any]
    reverses_id: int | None
    created_at: dt.datetime
    entries: list[EntryOut]
