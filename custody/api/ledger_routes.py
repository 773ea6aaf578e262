"""Ledger routes under /v1: assets, accounts, balances, statements, linked transfer batches,
reversals, holds, totals and self-verification. Each route names the roles it admits; every
command that moves money goes through `custody.ledger_access.CallerLedger`, which applies the
README's "who may move money" table (custody.money_rules) and the caller's key namespace."""
from __future__ import annotations

from fastapi import APIRouter, Query, Response

from custody.api.deps import Admin, Auditor, Backend, ContainerDep, Reader
from custody.api.errors import ApiError, responses
from custody.api.paging import PAGED, pager
from custody.convert.service import Convert
from custody.ledger_access import CallerLedger
from custody.money_rules import may_read_statement, may_read_transaction
from ledger.errors import ErrorCode, LedgerError
from custody.api.ledger_schemas import (
    AccountIn,
    AccountOut,
    AssetIn,
    AssetOut,
    BalanceOut,
    CaptureIn,
    CheckOut,
    HoldIn,
    EntryOut,
    HoldOut,
    JournalTransactionOut,
    Money,
    ReverseIn,
    StatementLineOut,
    StatementOut,
    TransactionIn,
    TransactionOut,
    VerifyOut,
)
from custody.api.params import MAX_ID, IdPath
from ledger.amounts import parse_amount
from ledger.model import Account, AccountKind, Hold, Transfer
from ledger.service import Ledger

router = APIRouter(prefix="/v1", tags=["ledger"])
AssetsPage = pager("assets", newest_first=False, default=1000, maximum=1000, key_type=str)
FirmAccountsPage = pager("firm-accounts", newest_first=False, default=1000, maximum=1000)
StatementPage = pager("statement", newest_first=False, default=100, maximum=1000)

# What any command that moves money can answer, besides its own resource's codes: amounts, the
# money rules (custody.money_rules), the ledger's balance and key checks, a racing duplicate.
MOVES = ("invalid_amount", "excess_precision", "accounts_must_be_different", "asset_mismatch", "idempotency_conflict",
         "insufficient_funds", "limit_exceeded", "account_closed", "account_not_found", "kind_not_permitted",
         "account_frozen", "conflict")
# A leg lists the ids of the other legs of its transaction when there are at most this many (a
# linked batch of thousands would repeat its ids quadratically: read `entries` instead).
MAX_REFERENCED_LEGS = 64
HOLD_STATE = ("hold_not_found", "hold_already_resolved", "hold_expired", "hold_owner_mismatch")


def _decimals(ledger: Ledger, account_id: int) -> int:
    return ledger.account_reference(account_id).decimals  # cached: no lookup per leg


def _account_out(a: Account) -> AccountOut:
    return AccountOut(**{**a.__dict__, "kind": a.kind.value})


def _hold_out(ledger: Ledger, h: Hold) -> HoldOut:
    d = _decimals(ledger, h.account_id)
    return HoldOut(
        id=h.id, account_id=h.account_id, state=h.state.value, owner=h.owner, reference=h.reference,
        amount=Money.of(h.amount, d), captured=Money.of(h.captured, d), released=Money.of(h.released, d),
        remaining=Money.of(h.remaining, d), expires_at=h.expires_at,
    )


@router.post("/assets", response_model=AssetOut, status_code=201, responses=responses("asset_exists_with_different_decimals", "conflict"))
def create_asset(body: AssetIn, c: ContainerDep, _: Admin) -> AssetOut:
    """Create an asset and open its firm accounts (fees, equity, suspense, ..., and convert's
    liquidity account `convert:liquidity:<asset>`) under reserved names."""
    asset = c.ledger.create_asset(body.code, body.decimals)
    c.wallets.open_firm_accounts(asset.code)
    Convert(c.engine, c.ledger, c.settings).open_accounts(asset.code)
    return AssetOut(code=asset.code, decimals=asset.decimals)


@router.get("/assets", response_model=list[AssetOut], responses=responses(*PAGED))
def list_assets(c: ContainerDep, _: Reader, page: AssetsPage) -> list[AssetOut]:
    """Assets by code (paged: `X-Next-Cursor`)."""
    return [AssetOut(code=a.code, decimals=a.decimals) for a in page.slice(c.ledger.list_assets(), key=lambda a: a.code)]


@router.post("/accounts", response_model=AccountOut, status_code=201, responses=responses("asset_not_found", "account_name_reserved", "kind_not_permitted", "conflict"))
def open_account(body: AccountIn, c: ContainerDep, who: Backend) -> AccountOut:
    """Open a customer account named `customer:<owner>:...` (idempotent by name). Firm accounts are
    the service's own (`GET /v1/firm-accounts`)."""
    return _account_out(CallerLedger(c.ledger, who).open_account(body.asset, body.kind, body.name, body.owner))


@router.get("/firm-accounts", response_model=list[AccountOut], responses=responses(*PAGED))
def firm_accounts(c: ContainerDep, _: Reader, page: FirmAccountsPage,
                  asset: str | None = Query(default=None, max_length=32)) -> list[AccountOut]:
    """The firm's own accounts (every kind but customer), e.g. `fees:<asset>` to credit a customer's fee to;
    by id (paged: `X-Next-Cursor`)."""
    kinds = [k for k in AccountKind if k is not AccountKind.customer]
    rows = c.ledger.list_accounts(asset=asset, kinds=kinds, after_id=page.key, limit=page.fetch)
    return [_account_out(a) for a in page.finish(rows, key=lambda a: a.id)]


@router.get("/accounts/{account_id}", response_model=AccountOut, responses=responses("account_not_found"))
def get_account(account_id: IdPath, c: ContainerDep, _: Reader) -> AccountOut:
    return _account_out(c.ledger.get_account(account_id))


@router.post("/accounts/{account_id}/close", response_model=AccountOut, responses=responses("account_not_found", "account_not_empty", "account_has_open_holds", "kind_not_permitted"))
def close_account(account_id: IdPath, c: ContainerDep, who: Admin) -> AccountOut:
    """Close an empty customer account; firm accounts are never closed over the API."""
    return _account_out(CallerLedger(c.ledger, who).close_account(account_id))


@router.get("/accounts/{account_id}/balance", response_model=BalanceOut, responses=responses("account_not_found"))
def balance(account_id: IdPath, c: ContainerDep, _: Reader) -> BalanceOut:
    b = c.ledger.balance(account_id)
    d = c.ledger.get_asset(b.asset).decimals
    return BalanceOut(
        account_id=b.account_id, asset=b.asset, posted=Money.of(b.posted, d), held=Money.of(b.held, d),
        available=Money.of(b.available, d), checkpoint=b.checkpoint,
    )


@router.get("/accounts/{account_id}/statement", response_model=StatementOut,
            responses=responses("account_not_found", *PAGED))
def statement(
    account_id: IdPath, c: ContainerDep, who: Reader, paging: StatementPage,
    after: int | None = Query(default=None, ge=0, le=MAX_ID,
                              description="older form of `cursor`: the last entry id of the previous page"),
) -> StatementOut:
    """The account's entries in posting order with the balance after each (paged: `cursor`, or the
    older `after`; not both). A full page always has a next cursor, which may lead to an empty page.
    A backend reads only the statements of accounts it may debit (customer accounts,
    custody.money_rules.may_read_statement); a firm account's answers `account_not_found`, as if it
    did not exist, like a firm-only transaction on `GET /v1/transactions/{id}`."""
    if after is not None and paging.key is not None:
        raise ApiError(422, "invalid_request", "send either cursor or after, not both")
    account = c.ledger.get_account(account_id)
    if not may_read_statement(who.role, account.kind):
        raise LedgerError(ErrorCode.account_not_found, f"no account {account_id}")
    d = c.ledger.get_asset(account.asset).decimals
    page = c.ledger.statement(account_id, after=paging.key if paging.key is not None else after, limit=paging.limit)
    paging.next_at(page.next_after)
    return StatementOut(
        account_id=account_id, asset=account.asset, next_after=page.next_after, next_cursor=paging.next_cursor,
        lines=[
            StatementLineOut(
                entry_id=l.entry_id, transaction_id=l.transaction_id, kind=l.kind, idempotency_key=l.idempotency_key,
                amount=Money.of(l.amount, d), balance_after=Money.of(l.balance_after, d), created_at=l.created_at,
                counterpart_entry_id=l.counterpart_entry_id, counterpart_account_id=l.counterpart_account_id,
            )
            for l in page.lines
        ],
    )


@router.post("/transactions", response_model=TransactionOut, status_code=201, responses=responses(*MOVES))
def post_transaction(body: TransactionIn, c: ContainerDep, who: Backend) -> Response:
    """Post a linked batch: every transfer commits or none does. A replay of the key answers 200.
    Debits customer accounts only; credits customer or fee-income accounts."""
    decimals: dict[int, int] = {}
    transfers = []
    for t in body.transfers:
        d = decimals.get(t.debit_account_id)
        if d is None:
            d = decimals[t.debit_account_id] = _decimals(c.ledger, t.debit_account_id)
        transfers.append(Transfer(t.debit_account_id, t.credit_account_id, parse_amount(t.amount, d)))
    result = CallerLedger(c.ledger, who).post(body.idempotency_key, transfers, kind=body.kind, metadata=body.metadata)
    # The answer is encoded here, once (the hot path): FastAPI would validate the model again
    # against `response_model` and encode it through its generic encoder. Same body and statuses.
    out = TransactionOut(transaction_id=result.transaction_id, created=result.created)
    return Response(out.model_dump_json(), status_code=201 if result.created else 200, media_type="application/json")


@router.get("/transactions/{transaction_id}", response_model=JournalTransactionOut,
            responses=responses("transaction_not_found"))
def get_transaction(transaction_id: IdPath, c: ContainerDep, who: Reader) -> JournalTransactionOut:
    """A journal transaction with its legs (`entries`: each with its own id, account, signed amount,
    the counterpart leg of its transfer, references to the other legs, and its own metadata) and
    the transaction's metadata. A backend reads only transactions
    with a leg on a customer account (custody.money_rules.may_read_transaction); any other answers
    `transaction_not_found`, as if it did not exist."""
    t = c.ledger.get_transaction(transaction_id)
    if not may_read_transaction(who.role, (e.account_kind for e in t.entries)):
        raise LedgerError(ErrorCode.transaction_not_found, f"no journal transaction {transaction_id}")
    decimals = {a: c.ledger.get_asset(a).decimals for a in {e.asset for e in t.entries}}
    return JournalTransactionOut(
        id=t.id, idempotency_key=t.idempotency_key, kind=t.kind, metadata=t.metadata, reverses_id=t.reverses_id,
        created_at=t.created_at,
        entries=[EntryOut(id=e.id, account_id=e.account_id, account_kind=e.account_kind.value, asset=e.asset,
                          amount=Money.of(e.amount, decimals[e.asset]), hold_id=e.hold_id,
                          transfer_index=e.transfer_index, counterpart_entry_id=e.counterpart_entry_id,
                          counterpart_account_id=e.counterpart_account_id,
                          references=[o.id for o in t.entries if o.id != e.id] if len(t.entries) <= MAX_REFERENCED_LEGS
                          else [], metadata=e.metadata)
                 for e in t.entries])


@router.post("/transactions/{transaction_id}/reverse", response_model=TransactionOut, status_code=201, responses=responses(*MOVES, "transaction_not_found", "transaction_not_reversible", "already_reversed"))
def reverse(transaction_id: IdPath, body: ReverseIn, c: ContainerDep, who: Admin, response: Response) -> TransactionOut:
    """Reverse a transaction written over the API whose reversal debits customer accounts only; a
    subsystem's transaction is corrected by a treasury adjustment (`transaction_not_reversible`)."""
    result = CallerLedger(c.ledger, who).reverse(transaction_id, body.idempotency_key)
    if not result.created:
        response.status_code = 200
    return TransactionOut(transaction_id=result.transaction_id, created=result.created)


@router.post("/holds", response_model=HoldOut, status_code=201, responses=responses(*MOVES))
def place_hold(body: HoldIn, c: ContainerDep, who: Backend, response: Response) -> HoldOut:
    """Place a hold owned by the calling API key; only that key may capture or release it."""
    amount = parse_amount(body.amount, _decimals(c.ledger, body.account_id))
    hold = CallerLedger(c.ledger, who).place_hold(body.idempotency_key, body.account_id, amount,
                                                  reference=body.reference, expires_at=body.expires_at)
    if not hold.created:
        response.status_code = 200
    return _hold_out(c.ledger, hold)


@router.get("/holds/{hold_id}", response_model=HoldOut, responses=responses("hold_not_found"))
def get_hold(hold_id: IdPath, c: ContainerDep, _: Reader) -> HoldOut:
    return _hold_out(c.ledger, c.ledger.get_hold(hold_id))


@router.post("/holds/{hold_id}/capture", response_model=TransactionOut, status_code=201, responses=responses(*MOVES, *HOLD_STATE, "hold_account_mismatch", "hold_exceeded"))
def capture(hold_id: IdPath, body: CaptureIn, c: ContainerDep, who: Backend, response: Response) -> TransactionOut:
    hold = c.ledger.get_hold(hold_id)
    d = _decimals(c.ledger, hold.account_id)
    legs = [Transfer(hold.account_id, t.credit_account_id, parse_amount(t.amount, d)) for t in body.transfers]
    result = CallerLedger(c.ledger, who).capture(body.idempotency_key, hold_id, legs, final=body.final)
    if not result.created:
        response.status_code = 200
    return TransactionOut(transaction_id=result.transaction_id, created=result.created)


@router.post("/holds/{hold_id}/release", response_model=HoldOut, responses=responses(*HOLD_STATE, "kind_not_permitted", "account_frozen"))
def release(hold_id: IdPath, c: ContainerDep, who: Backend) -> HoldOut:
    return _hold_out(c.ledger, CallerLedger(c.ledger, who).release(hold_id))


@router.get("/totals", response_model=dict[str, Money])
def totals(c: ContainerDep, _: Auditor) -> dict[str, Money]:
    decimals = {a.code: a.decimals for a in c.ledger.list_assets()}
    return {asset: Money.of(total, decimals[asset]) for asset, total in c.ledger.totals().items()}


@router.get("/verify", response_model=VerifyOut)
def verify(c: ContainerDep, _: Auditor) -> VerifyOut:
    checks = c.ledger.verify()
    return VerifyOut(ok=all(x.ok for x in checks), checks=[CheckOut(name=x.name, ok=x.ok, detail=x.detail) for x in checks])
