"""Wallets, chain assets and deposit addresses; and the firm's own ledger accounts per asset.

Custody knows each wallet tier only by its extended PUBLIC key (from the signer at set-up, or
configured for cold storage) and derives deposit addresses from it (`custody.addresses`). The
derivation index is persisted with the address in one database transaction under the wallet's
row lock, so two requests never get the same index and a retried request gets the same address.

Firm accounts are opened here and only here (and matching's per-market fee accounts in
`matching.service`), idempotently, under fixed names outside the customer namespace:
`location:<chain>:<tier>:<asset>` (asset_location), `quarantine:<asset>`, `dust:<asset>`,
`suspense:<asset>`, `fees:<asset>`, `in_flight:<asset>`, `network_fees:<asset>`, `equity:<asset>`.
The per-asset ones are opened when the asset is created (`open_firm_accounts`), the rest on first
use. No API caller can open an account outside `customer:<owner>:...` (custody.money_rules), and the
database refuses a firm account named inside it, so these names cannot be squatted.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from custody.addresses import canonical_btc_account_key, derive_btc_address, derive_eth_address
from custody.controls import audit, open_incident
from custody.errors import CustodyError, CustodyErrorCode
from ledger.errors import ErrorCode, LedgerError
from ledger.model import AccountKind
from ledger.service import Ledger

log = logging.getLogger(__name__)

FIRM_ACCOUNTS = {
    "quarantine": AccountKind.quarantine,
    "dust": AccountKind.dust,
    "suspense": AccountKind.suspense,
    "fees": AccountKind.fee_income,
    "in_flight": AccountKind.in_flight,
    "network_fees": AccountKind.network_fee_expense,
    "equity": AccountKind.equity,
}


@dataclass(frozen=True)
class ChainAsset:
    asset: str
    chain: str
    contract_address: str | None
    finality_confirmations: int
    dust_minimum: int
    min_withdrawal: int = 1
    withdrawal_fee: int = 0
    withdrawal_fee_fast: int = 0


@dataclass(frozen=True)
class DepositAddress:
    id: int
    chain: str
    address: str
    derivation_index: int
    account_id: int
    owner: str
    created: bool


class Wallets:
    def __init__(self, engine: Engine, ledger: Ledger) -> None:
        self.engine = engine
        self.ledger = ledger
        self._account_ids: dict[str, int] = {}

    # ---- reference data -------------------------------------------------------------------

    def register_wallet(self, chain: str, tier: str, network: str, xpub: str, *, gap_limit: int = 20) -> int:
        """Record a wallet's account-level xpub; the same again is a no-op, a different one refused.
        A bitcoin key is stored in its BIP84 form (vpub/zpub) whichever form it is given in (a cold
        wallet's tpub from another tool, say), since the signer derives from that form."""
        if chain == "bitcoin":
            xpub = canonical_btc_account_key(xpub, network)
        with self.engine.begin() as c:
            c.execute(
                text("INSERT INTO wallet (chain, tier, network, xpub, gap_limit) VALUES (:c, :t, :n, :x, :g) "
                     "ON CONFLICT (chain, tier) DO NOTHING"),
                {"c": chain, "t": tier, "n": network, "x": xpub, "g": gap_limit},
            )
            row = c.execute(text("SELECT id, xpub, network FROM wallet WHERE chain = :c AND tier = :t"),
                            {"c": chain, "t": tier}).one()
        if (row.xpub, row.network) != (xpub, network):
            raise ValueError(f"wallet {chain}/{tier} is already registered with another key or network")
        return row.id

    def configure_asset(self, asset: str, decimals: int, chain: str, *, finality: int, dust_minimum: int = 0,
                        contract_address: str | None = None, min_withdrawal: int = 1, withdrawal_fee: int = 0,
                        withdrawal_fee_fast: int | None = None) -> ChainAsset:
        """Create the ledger asset and its chain data: finality depth, dust minimum, the minimum
        withdrawal and the network fee quoted to customers (normal and fast priority)."""
        self.ledger.create_asset(asset, decimals)
        fast = withdrawal_fee if withdrawal_fee_fast is None else withdrawal_fee_fast
        with self.engine.begin() as c:
            c.execute(
                text("INSERT INTO chain_asset (asset, chain, contract_address, finality_confirmations, dust_minimum, "
                     "min_withdrawal, withdrawal_fee, withdrawal_fee_fast) VALUES (:a, :c, :k, :f, :d, :m, :wf, :wff) "
                     "ON CONFLICT (asset) DO UPDATE SET finality_confirmations = :f, dust_minimum = :d, "
                     "min_withdrawal = :m, withdrawal_fee = :wf, withdrawal_fee_fast = :wff"),
                {"a": asset, "c": chain, "k": contract_address, "f": finality, "d": dust_minimum, "m": min_withdrawal,
                 "wf": withdrawal_fee, "wff": fast},
            )
        return self.chain_asset(asset)

    def chain_asset(self, asset: str, *, conn: Connection | None = None) -> ChainAsset:
        sql = text("SELECT asset, chain, contract_address, finality_confirmations, dust_minimum, min_withdrawal, "
                   "withdrawal_fee, withdrawal_fee_fast FROM chain_asset WHERE asset = :a")
        if conn is None:
            with self.engine.connect() as c:
                row = c.execute(sql, {"a": asset}).first()
        else:
            row = conn.execute(sql, {"a": asset}).first()
        if row is None:
            raise LedgerError(ErrorCode.asset_not_found, f"{asset} is not configured on any chain")
        return ChainAsset(row.asset, row.chain, row.contract_address, row.finality_confirmations, int(row.dust_minimum),
                          int(row.min_withdrawal), int(row.withdrawal_fee), int(row.withdrawal_fee_fast))

    def chain_assets(self, chain: str) -> list[ChainAsset]:
        with self.engine.connect() as c:
            assets = c.execute(text("SELECT asset FROM chain_asset WHERE chain = :c ORDER BY asset"), {"c": chain}).scalars().all()
        return [self.chain_asset(a) for a in assets]

    # ---- firm accounts --------------------------------------------------------------------

    def open_firm_accounts(self, asset: str) -> dict[str, int]:
        """Open every per-asset firm account of `asset` (idempotent): role -> account id."""
        return {role: self.firm_account(role, asset) for role in FIRM_ACCOUNTS}

    def firm_account(self, role: str, asset: str, *, conn: Connection | None = None) -> int:
        return self._open(f"{role}:{asset}", asset, FIRM_ACCOUNTS[role], conn)

    def location_account(self, chain: str, tier: str, asset: str, *, conn: Connection | None = None) -> int:
        return self._open(f"location:{chain}:{tier}:{asset}", asset, AccountKind.asset_location, conn)

    def customer_account(self, owner: str, asset: str, *, conn: Connection | None = None) -> int:
        return self._open(f"customer:{owner}:{asset}", asset, AccountKind.customer, conn, owner=owner)

    def _open(self, name: str, asset: str, kind: AccountKind, conn: Connection | None, owner: str | None = None) -> int:
        """The account's id, opening it on first use. It is opened in its own committed transaction
        (idempotent by name), never inside the caller's, so the id cached here can never belong to
        an account that a rolled-back caller took with it. `conn` is accepted for symmetry only."""
        if name not in self._account_ids:
            self._account_ids[name] = self.ledger.open_account(asset, kind, name, owner=owner).id
        return self._account_ids[name]

    # ---- deposit addresses ----------------------------------------------------------------

    def issue_address(self, key: str, account_id: int) -> DepositAddress:
        """The next deposit address for a customer account, idempotent per request `key`."""
        if not isinstance(key, str) or not 1 <= len(key) <= 300:  # a caller's 200 behind its namespace
            raise LedgerError(ErrorCode.invalid_request, "an idempotency key of 1-300 characters is required")
        account = self.ledger.get_account(account_id)
        if account.kind is not AccountKind.customer:
            raise CustodyError(CustodyErrorCode.kind_not_permitted, "deposit addresses are issued for customer accounts only",
                                  account_id=account.id, kind=account.kind.value)
        if account.closed:
            raise LedgerError(ErrorCode.account_closed)
        chain = self.chain_asset(account.asset).chain
        owner = account.owner or f"account-{account.id}"
        with self.engine.begin() as c:
            wallet = c.execute(
                text("SELECT id, network, xpub, next_index, gap_limit FROM wallet WHERE chain = :c AND tier = 'deposit' FOR UPDATE"),
                {"c": chain},
            ).first()
            if wallet is None:
                raise LedgerError(ErrorCode.invalid_request, f"no deposit wallet is configured for {chain}")
            existing = c.execute(text(f"{_ADDRESS_SQL} WHERE idempotency_key = :k"), {"k": key}).first()
            if existing is not None:
                if existing.account_id != account_id:
                    raise LedgerError(ErrorCode.idempotency_conflict, "the key was used for another account")
                return _address(existing, created=False)
            index = wallet.next_index
            if chain == "bitcoin":
                address = derive_btc_address(wallet.xpub, wallet.network, 0, index)
            else:
                address = derive_eth_address(wallet.xpub, index)
            row = c.execute(
                text("INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, owner, idempotency_key) "
                     "VALUES (:w, :c, :a, :i, :acc, :o, :k) RETURNING id"),
                {"w": wallet.id, "c": chain, "a": address, "i": index, "acc": account_id, "o": owner, "k": key},
            ).one()
            c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE id = :w"), {"w": wallet.id})
            audit(c, "custody", "deposit_address.issue", address, {"account_id": account_id, "index": index})
            self._check_gap(c, wallet.id, chain, wallet.gap_limit)
            return DepositAddress(row.id, chain, address, index, account_id, owner, True)

    def _check_gap(self, c: Connection, wallet_id: int, chain: str, gap_limit: int) -> None:
        """Alert while more than `gap_limit` issued addresses after the last used one are unused.

        Every issued address is watched whatever the gap, so nothing lands unwatched; the alert
        tells operators that wallets restored from the seed with a standard gap limit would not
        find later deposits. O(1) per issue at any address count: the deposit wallet's indices are
        0 .. next_index - 1 without holes (issued under its row lock), and the scanner keeps
        `last_used_index` (the highest index that received anything) as it records a first deposit
        (custody.deposits), so the unused tail is `next_index - 1 - last_used_index`."""
        row = c.execute(text("SELECT next_index, last_used_index FROM wallet WHERE id = :w"), {"w": wallet_id}).one()
        unused = gap_count(row.next_index, row.last_used_index)
        if unused > gap_limit:
            log.warning("wallet %s/%s: %d unused addresses beyond the last used one (gap limit %d)", chain, "deposit", unused, gap_limit)
            open_incident(c, "gap_limit", f"gap_limit:{wallet_id}:{unused // gap_limit}",
                          {"chain": chain, "unused": unused, "gap_limit": gap_limit}, severity="warning")

    def addresses_of(self, account_id: int) -> list[DepositAddress]:
        with self.engine.connect() as c:
            rows = c.execute(text(f"{_ADDRESS_SQL} WHERE account_id = :a ORDER BY id"), {"a": account_id}).all()
        return [_address(r, created=False) for r in rows]


def gap_count(next_index: int, last_used_index: int) -> int:
    """Issued addresses after the last used one (-1: none used yet)."""
    return next_index - 1 - last_used_index


_ADDRESS_SQL = "SELECT id, chain, address, derivation_index, account_id, owner FROM deposit_address"


def _address(row, *, created: bool) -> DepositAddress:
    return DepositAddress(row.id, row.chain, row.address, row.derivation_index, row.account_id, row.owner, created)
