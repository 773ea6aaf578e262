"""The end-to-end demo that `scripts/run` performs against the running API, narrated step by step.

It uses only the public HTTP API, through the typed client `custody.client` (what another team's
backend would use), with API keys made for it (custody.launch creates them), so what it shows is
what the exchange backend sees; operators approve by signing the withdrawal's payload with their own
Ed25519 keys, as `python -m custody approve --key FILE ID` does (`approve_with_client`). Each run
uses its own account names, so it can be repeated on one database. A step the API refuses (the
client's `CustodyApiError`, with its code) or an answer the demo did not expect (`DemoFailed`) ends
the demo with "demo failed: ..." and `run_demo` answers False.
"""
from __future__ import annotations

import logging
import time
import uuid
from decimal import Decimal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from custody.approve_cli import PayloadRefused, approve_adjustment_with_client, approve_with_client, load_private_key
from custody.client import CustodyApiError, CustodyClient, models

log = logging.getLogger("demo")


class DemoFailed(Exception):
    pass


@dataclass
class DemoWorld:
    """What the demo needs besides the API: API keys made for it (admin, and two operators who are
    also the scripted approvers, with their Ed25519 key files) and, for the chain part, the
    outside world: a faucet paying a bitcoin address, a fresh address outside the service, and
    the hot wallet's receive address (derived from the hot xpub the signer exported)."""

    admin_key: str
    operator_keys: tuple[str, str]
    approver_key_files: tuple[Path, Path] = ()
    fund_btc: Callable[[str, int], str] | None = None
    external_btc_address: Callable[[], str] | None = None
    hot_btc_address: str | None = None


def run_demo(base: str, world: DemoWorld) -> bool:
    run = uuid.uuid4().hex[:8]
    log.info("admin API key for this demo: %s (send it as X-API-Key)", world.admin_key)
    try:
        with CustodyClient(base, world.admin_key, timeout=10) as api:
            ops = (api.with_key(world.operator_keys[0]), api.with_key(world.operator_keys[1]))
            _ledger_demo(api, ops, world.approver_key_files[1], run)
            if world.fund_btc is not None:
                _chain_demo(api, ops, world, run)
    except CustodyApiError as exc:
        log.error("demo failed: %s", exc)
        return False
    except DemoFailed as exc:
        log.error("demo failed: %s", exc)
        return False
    log.info("demo finished: every step above went through the HTTP API; the ledger verified")
    return True


def _wait(what: str, probe, done, timeout: float = 90.0):
    """Poll `probe()` until `done(value)`; log each change so a person sees progress."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        value = probe()
        if value != last:
            log.info("  %s: %s", what, value)
            last = value
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out waiting for {what} (last: {value})")
        time.sleep(0.5)


def _refused(expected: int, call: Callable[[], object]) -> str:
    """The error code of a call the demo expects the API to refuse with HTTP status `expected`."""
    try:
        answer = call()
    except CustodyApiError as exc:
        if exc.status != expected:
            raise DemoFailed(f"expected {expected}, got {exc}") from None
        return exc.code
    raise DemoFailed(f"expected {expected}, the API accepted: {answer}")


def _adjust(maker: CustodyClient, checker: CustodyClient, checker_key: Path, key: str, debit: int, credit: int,
            amount: str, reason: str):
    """A treasury adjustment: one operator proposes, another signs its approval payload with their
    Ed25519 key; the worker verifies the signature again and posts it."""
    proposal = maker.propose_adjustment(idempotency_key=key, reason=reason, transfers=[
        {"debit_account_id": debit, "credit_account_id": credit, "amount": amount}])
    try:
        approved = approve_adjustment_with_client(checker, proposal.id, load_private_key(checker_key),
                                                  comment="demo: checked against the ticket",
                                                  show=lambda line: log.info("operators: %s", line))
    except PayloadRefused as exc:
        raise DemoFailed(f"the approver did not sign: {exc}") from None
    if approved.state != "approved":
        raise DemoFailed(f"adjustment not approved: {approved}")
    _wait(f"adjustment {proposal.id}", lambda: checker.get_adjustment(proposal.id).state, lambda s: s == "posted")
    return checker.get_adjustment(proposal.id)


def _firm_account(api: CustodyClient, name: str, asset: str) -> int:
    return next(a.id for a in api.iter_firm_accounts(asset=asset) if a.name == name)


def _chain_demo(api: CustodyClient, ops: tuple[CustodyClient, CustodyClient], world: DemoWorld, run: str) -> None:
    hot = world.hot_btc_address
    world.fund_btc(hot, 10 * 100_000_000)
    log.info("treasury: 10 BTC into the hot wallet %s (booked equity -> hot location once confirmed)", hot)
    owner = f"demo-bob-{run}"
    acct = api.open_account(asset="BTC", kind="customer", name=f"customer:{owner}:BTC", owner=owner).id
    addr = api.issue_deposit_address(idempotency_key=f"demo:{run}:addr", account_id=acct)
    log.info("deposits: issued %s (BIP84 index %d) to customer account %d", addr.address, addr.derivation_index, acct)
    txid = world.fund_btc(addr.address, 500_000_000)
    log.info("deposits: the regtest faucet paid 5 BTC in %s; a block is mined every 2 s", txid)
    _wait("deposit", lambda: [(d.state, d.confirmations) for d in api.list_account_deposits(acct)],
          lambda v: v and v[0][0] == "credited")
    bal = api.get_balance(acct)
    log.info("deposits: credited once at finality (3 confirmations): available %s BTC", _v(bal.available))

    dest = world.external_btc_address()
    small = api.request_withdrawal(client_withdrawal_id=f"demo-{run}-1", account_id=acct, amount=Decimal("0.1"),
                                   destination=dest)
    log.info("withdrawals: 0.1 BTC to %s -> %s by policy", dest, small.state)
    big = api.request_withdrawal(client_withdrawal_id=f"demo-{run}-2", account_id=acct, amount=Decimal("2.5"),
                                 destination=dest)
    log.info("withdrawals: 2.5 BTC -> %s (the two-approver tier)", big.state)
    for n, (op, key_file) in enumerate(zip(ops, world.approver_key_files), 1):
        try:
            approved = approve_with_client(op, big.id, load_private_key(key_file),
                                           comment=f"demo: approver {n} verified by phone",
                                           show=lambda line: log.info("operators: %s", line))
        except CustodyApiError as exc:
            raise DemoFailed(f"approval refused: {exc}") from None
        except PayloadRefused as exc:
            raise DemoFailed(f"approver {n} did not sign: {exc}") from None
        log.info("operators: approver %d signed that payload with its own Ed25519 key -> %s", n, approved.state)
    for w in (small, big):
        _wait(f"withdrawal {w.id}", lambda w=w: api.get_withdrawal(w.id).state, lambda s: s == "final")
    bal = api.get_balance(acct)
    log.info("withdrawals: both final after batching, signing by the signer process, broadcast and 3 confirmations; "
             "bob has %s BTC (5 - 0.1 - 2.5 - 2 x 0.00005 quoted fee)", _v(bal.posted))
    if bal.posted.minor != 239_990_000:
        raise DemoFailed(f"unexpected balance {bal}")
    lines = api.reconcile()
    for line in lines:
        log.info("reconciliation: %s %s: chain %s = books %s + in transit %s (difference %s)", line.tier, line.asset,
                 line.on_chain, line.books, line.in_transit, line.difference)
    if any(line.difference != 0 for line in lines):
        raise DemoFailed(f"reconciliation found a difference: {lines}")
    _matching_demo(api, ops, world.approver_key_files[1], run, owner)
    if not api.verify().ok:
        raise DemoFailed("ledger verification failed")
    log.info("ledger: verify passed after the chain and matching demo")


def _matching_demo(api: CustodyClient, ops: tuple[CustodyClient, CustodyClient], checker_key: Path, run: str,
                   seller: str) -> None:
    """The Bitsten scenario over the API: price improvement must return to the buyer."""
    symbol = f"BTC-USDT-{run}"
    api.create_market(symbol=symbol, base_asset="BTC", quote_asset="USDT", lot_size=10_000, quote_per_tick_lot=1,
                      fees={"default": {"maker_ppm": 1_000, "taker_ppm": 2_000}})
    buyer = f"demo-alice-{run}"
    usdt = api.open_account(asset="USDT", kind="customer", name=f"customer:{buyer}:USDT", owner=buyer).id
    _adjust(ops[0], ops[1], checker_key, f"demo:{run}:usdt", _firm_account(api, "equity:USDT", "USDT"), usdt, "40000",
            "demo: alice's USDT opening balance")
    log.info("matching: market %s (lot 0.0001 BTC, tick 0.01 USDT, maker 0.1%% / taker 0.2%%); alice has 40,000 USDT", symbol)
    ask = api.place_order(symbol, account=seller, client_order_id="ask-1", side="sell", qty=Decimal("0.2"),
                          price=Decimal("59900"))
    log.info("matching: bob rests an ask, 0.2 BTC at 59,900 -> %s", ask.state)
    bid = api.place_order(symbol, account=buyer, client_order_id="bid-1", side="buy", qty=Decimal("0.5"),
                          price=Decimal("60000"))
    bal = api.get_balance(usdt)
    log.info("matching: alice bids 0.5 BTC at 60,000 -> %s, filled %s at the maker's price; USDT held %s",
             bid.state, format(bid.filled, "f"), _v(bal.held))
    cancelled = api.cancel_order(symbol, bid.order_id, account=buyer)
    bal = api.get_balance(usdt)
    log.info("matching: alice cancels (%s): USDT %s = 40,000 - 11,980 - 23.96 taker fee, held %s",
             cancelled.state, _v(bal.posted), _v(bal.held))
    if (bal.posted.minor, bal.held.minor) != (27_996_040_000, 0):
        raise DemoFailed(f"the buyer's price improvement did not come back exactly: {bal}")


def _v(money) -> str:  # noqa: ANN001
    """A Money's value as the API wrote it ("0.00000000", not Decimal's "0E-8")."""
    return format(money.value, "f")


def _ledger_demo(api: CustodyClient, ops: tuple[CustodyClient, CustodyClient], checker_key: Path, run: str) -> None:
    log.info("ledger: creating assets BTC (8 decimals) and USDT (6 decimals); each comes with its firm accounts")
    api.create_asset(code="BTC", decimals=8)
    api.create_asset(code="USDT", decimals=6)
    acct = {}
    for name in ("alice", "carol"):
        owner = f"demo-{name}-{run}"
        acct[name] = api.open_account(asset="BTC", kind="customer", name=f"customer:{owner}:BTC", owner=owner).id
    acct["fees"] = _firm_account(api, "fees:BTC", "BTC")
    acct["equity"] = _firm_account(api, "equity:BTC", "BTC")
    log.info("ledger: opened customer accounts %s; the firm's fee income is fees:BTC (%d)",
             {k: acct[k] for k in ("alice", "carol")}, acct["fees"])
    code = _refused(403, lambda: api.post_transaction(idempotency_key=f"demo:{run}:mint", transfers=[
        {"debit_account_id": acct["equity"], "credit_account_id": acct["alice"], "amount": Decimal("0.5")}]))
    log.info("ledger: an API key posting from the firm's equity is refused: %s", code)

    posted = _adjust(ops[0], ops[1], checker_key, f"demo:{run}:opening", acct["equity"], acct["alice"], "0.5",
                     "demo: alice's opening balance")
    log.info("ledger: a treasury adjustment (proposed by one operator, signed by another, posted by the worker) "
             "credited alice 0.5 BTC "
             "(transaction %s)", posted.transaction_id)
    transfer = models.TransactionIn(idempotency_key=f"demo:{run}:gift", kind="transfer", transfers=[
        models.TransferIn(debit_account_id=acct["alice"], credit_account_id=acct["carol"], amount=Decimal("0.05"))])
    tx = api.post_transaction(transfer)
    log.info("ledger: alice sent carol 0.05 BTC (transaction %s)", tx.transaction_id)
    again = api.post_transaction(transfer)
    if again.created or again.transaction_id != tx.transaction_id:
        raise DemoFailed(f"the same key moved money again: {again}")
    log.info("ledger: the same key again answers 200 with transaction %s and moves nothing", again.transaction_id)
    too_fine = transfer.model_copy(update={"idempotency_key": f"demo:{run}:bad", "transfers": [
        transfer.transfers[0].model_copy(update={"amount": Decimal("0.123456789")})]})
    code = _refused(422, lambda: api.post_transaction(too_fine))
    log.info("ledger: 9 decimals for BTC is refused: %s", code)

    hold = api.place_hold(idempotency_key=f"demo:{run}:hold", account_id=acct["alice"], amount=Decimal("0.2"),
                          reference="withdrawal demo")
    bal = api.get_balance(acct["alice"])
    log.info("ledger: held 0.2 BTC: posted %s, held %s, available %s", _v(bal.posted), _v(bal.held), _v(bal.available))
    api.capture_hold(hold.id, idempotency_key=f"demo:{run}:capture", final=True, transfers=[
        {"credit_account_id": acct["carol"], "amount": Decimal("0.15")},
        {"credit_account_id": acct["fees"], "amount": Decimal("0.0001")}])
    bal = api.get_balance(acct["alice"])
    log.info("ledger: captured 0.15 to carol + 0.0001 fee, released the rest: alice posted %s, held %s",
             _v(bal.posted), _v(bal.held))
    if (bal.posted.minor, bal.held.minor) != (29_990_000, 0):
        raise DemoFailed(f"unexpected balance {bal}")
    for line in api.iter_statement(acct["alice"]):
        log.info("ledger: statement  %-10s %14s -> %s", line.kind, _v(line.amount), _v(line.balance_after))
    totals = api.get_totals()
    log.info("ledger: totals per asset (always zero): %s", {k: _v(v) for k, v in totals.items()})
    verify = api.verify()
    log.info("ledger: verify: %s", ", ".join(f"{x.name}={'ok' if x.ok else 'FAIL'}" for x in verify.checks))
    if not verify.ok:
        raise DemoFailed("ledger verification failed")
