"""Ethereum sweeps with a gas station: booked ether and ERC-20 deposits move from deposit addresses
to the hot address; the hot address first pays each token-holding deposit address the gas its sweep
may burn.

A sweep never changes what a customer is owed: it moves value between two of the firm's own asset
locations, and the gas goes to the network-fee expense account. Only deposits already booked are
swept (credited, quarantined, released, returned, dust: custody.sweeps.BOOKED), so a reorg of a
deposit not yet final can never strand a sweep. Every amount is an integer (wei, token base units).

Guarantees:
- One unfinished move per deposit address (a partial unique index backs it): its nonces are used
  one after the other, each reserved in the `eth_sweep` row when the row is made, so a crash or a
  retry always signs the same slot again. A sweep row is never abandoned: a hole in a sender's
  nonces would block every later transaction of that address.
- At most one gas funding per sweep (`eth_gas_funding.sweep_id` is UNIQUE, and the signer refuses
  a second one on its own record), its hot-address nonce reserved from `eth_nonce` (the counter
  withdrawals use, custody.payouts) and committed with the row before the signer is asked: a crash
  between funding and sweep re-signs the same funding (same fields, RFC 6979: the same txid) or
  goes on from the stored one; it never funds twice. The sweep is signed only once its funding is
  booked final.
- A funding is signed under the hot counter's row lock (`eth_nonce`, held across the signer call,
  as custody.payouts holds it for withdrawals). When the signer refuses it, the nonce goes back to
  the counter (the row's `nonce` becomes NULL, migration 0041) if nothing was handed out after it
  and the signer recorded no funding of that sweep: the next hot-address transaction (a
  withdrawal) takes it, so a refused funding never leaves a gap. The row stays `open` and takes a
  nonce again, in the signing transaction, at its next attempt (the signer's recorded nonce for
  that sweep if it has one: a crash after the signer answered re-signs the same transaction);
  a refusal then rolls nothing forward. A nonce that cannot be given back stays a hole until
  the funding is signed: `eth_sweep_refused` is then critical, unless the refusal is transient
  (`nonce_gap`, `kill_switch_on`).
- A deposit address is swept only when what it holds of the due asset reaches the asset's
  per-address minimum (policy data: `AssetPolicy.sweep_min_per_address`, given here as
  `min_per_address`; absent, 1% of the asset's threshold): a dust deposit
  is never paid gas worth more than it (R15-S4); it stays booked where it is until more arrives.
- The signer builds both transactions itself from its own keys and asset table (signer.service,
  "Ethereum sweeps"): the destination is always our hot address or our own deposit address.
- Signed bytes are stored before anything is broadcast; broadcasting is idempotent.

Amounts, per deposit address (`booked_ether` is what the books hold there: its booked ether
deposits + gas funded to it - gas its sweeps burnt - ether swept from it, all final):
- token sweep: the booked, unswept deposits of the token there (each marked `eth_swept_by`); gas
  limit = the node's `eth_estimateGas` for the transfer + `gas_margin_percent`; the hot address
  funds `gas_funding_needed()` = gas limit x max fee per gas (node's estimate, capped) minus the
  booked ether already there (nothing when that covers it);
- ether sweep: `ether_sweep_amount()` = booked ether minus 21,000 x max fee (the gas it may burn).
  Ether nobody booked (sent to the address by a contract's internal call, say) stays there as
  reconciliation's surplus until someone books it; it is never swept into the books unexplained.
- leftover gas dust (the funded gas a sweep did not burn; the ether sweep's unburnt reserve) stays
  on the deposit address and in the books' deposit location: it is counted in `booked_ether` and
  taken by the next ether sweep of that address (or pays the next token sweep's gas).

Books (kind `sweep`, at the ETH finality depth):
- gas funding `eth_gas_funding:<id>:final`: hot -> deposit location (the ether sent), hot ->
  network-fee expense (the funding transaction's own gas);
- sweep `eth_sweep:<id>:final`: deposit -> hot location (the swept amount, its asset), deposit ETH
  -> network-fee expense (the gas the sweep burnt);
- a sweep mined but reverted (a token refusing the transfer) `eth_sweep:<id>:reverted`: only its
  gas, deposit ETH -> expense; its deposits are released for a later sweep.
Before finality reconciliation explains a mined move as in transit (`moves_in_transit`): a funding
as - (value + gas) on the hot ETH line and + value on the deposit ETH line; a sweep as - amount on
the deposit line of its asset, - gas on the deposit ETH line and + amount on the hot line.

Incidents: `eth_sweep_refused` (the signer refused a row: warning, retried every run; critical when
a refused funding's hot nonce could not be given back), `eth_sweep_failed`, `eth_sweep_nonce_conflict`
(below).

Jobs (`run_once()` runs them in order; each is callable alone): `plan()`, `sign()`, `broadcast()`,
`bump_fees()`, `track()`; the last three are custody.eth_moves' (shared with ethereum rebalances):
a funding or sweep stuck in the mempool is replaced at the same nonce with higher fees, every
version kept (`eth_tx_version`), the mined one booked with its own gas. A sweep's deposit address
pays its gas, so the sweep keeps gas money for its bumps: `max_fee_cap_wei` = max fee x (100 +
`bump_reserve_percent`) / 100 (at most the bump ceiling) is what the funding covers (token) or the
ether sweep holds back (ether): gas limit x cap in the amounts above, where the cap replaces the
max fee; the unburnt rest is gas dust as before. Nothing new is planned, signed or broadcast while the kill switch is engaged; tracking
and booking go on. A row whose step fails is logged (a node or database error is retried next run;
any other failure also opens an `eth_sweep_failed` incident, critical when the step was broadcast or
track, whose transaction may be on chain, else a warning) and the other rows go on; every step is
retried next run and books at most once (idempotency keys `eth_gas_funding:<id>:final`, ...). A
transaction of ours whose nonce something else consumed opens a critical incident
(`eth_sweep_nonce_conflict`): only a key outside this service could have done it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from sqlalchemy import Connection, Engine, text

from chain_adapters.ethereum import EthereumAdapter
from custody.controls import audit, kill_switch, open_incident
from custody.eth_moves import HOT_NONCE_RECORDED_SQL, EthBumpConfig, EthMoves, unsettled_versions
from custody.states import advance
from custody.sweeps import BOOKED
from custody.wallets import ChainAsset, Wallets
from ledger.model import Transfer
from ledger.service import Ledger
from signer.ethereum_tx import SignedEthTx, erc20_transfer_data
from signer.protocol import RefusalCode, SignerPort, SigningRefused

log = logging.getLogger(__name__)
TRANSFER_GAS = 21_000  # an ether transfer to an account without code
DUST_FRACTION = 100  # by default an address is swept once it holds 1/100 of its asset's threshold (R15-S4)
UNSETTLED = ("signed", "broadcast", "confirmed")  # signed, maybe mined, not booked yet
TABLES = ("eth_gas_funding", "eth_sweep")  # also the machines (custody.states); fundings first in every job


# ---- pure decisions ------------------------------------------------------------------------------

def gas_funding_needed(gas_limit: int, max_fee_wei: int, booked_ether: int) -> int:
    """Wei the hot address sends a deposit address so a token sweep of `gas_limit` at `max_fee_wei`
    per gas can be mined: what it may burn minus the booked ether already there (>= 0)."""
    return max(0, gas_limit * max_fee_wei - max(0, booked_ether))


def ether_sweep_amount(booked_ether: int, max_fee_wei: int) -> int:
    """Wei an ether sweep sends: the booked ether there minus the most its gas can cost (0: not worth it)."""
    return max(0, booked_ether - TRANSFER_GAS * max_fee_wei)


def gas_limit_with_margin(estimate: int, margin_percent: int) -> int:
    """The node's estimate plus `margin_percent`, rounded up (state may change before it is mined)."""
    return max(TRANSFER_GAS, -(-estimate * (100 + margin_percent) // 100))


@dataclass(frozen=True)
class MinedMove:
    """A sweep or gas funding mined and not booked yet: `kind` gas or sweep, what it carried
    (`asset`, `amount`), the gas it burnt (wei) and whether its execution reverted."""

    kind: str
    asset: str
    amount: int
    gas: int
    reverted: bool = False


def moves_in_transit(moves: Iterable[MinedMove], tier: str, asset: str, *, native: str = "ETH") -> int:
    """What mined, unbooked sweeps and fundings moved on chain but not yet in the books, for one
    reconciliation line (`tier` deposit or hot, `asset`), signed as the chain moved it."""
    total = 0
    for m in moves:
        moved = 0 if m.reverted else m.amount
        if m.kind == "gas":  # hot -> deposit address, ether; its gas paid by the hot address
            if asset == native:
                total += moved if tier == "deposit" else -(moved + m.gas)
            continue
        # a sweep: deposit address -> hot, its gas paid by the deposit address
        if m.asset == asset:
            total += -moved if tier == "deposit" else moved
        if asset == native and tier == "deposit":
            total -= m.gas
    return total


# ---- named queries -------------------------------------------------------------------------------

_UNSWEPT_TOTALS_SQL = text("""
SELECT asset, sum(amount) AS amount
FROM deposit_observation
WHERE chain = 'ethereum'
  AND eth_swept_by IS NULL
  AND state = ANY(:booked)
GROUP BY asset
""")

# per deposit address and asset due: the booked deposits not swept yet, at least the asset's
# per-address minimum (:minimums, in the order of :assets), where no move is unfinished (tokens
# first: an address's token is swept before its ether, which then pays no gas of it)
_CANDIDATES_SQL = text("""
SELECT o.asset, d.id AS deposit_address_id, d.address, d.derivation_index, sum(o.amount) AS amount
FROM deposit_observation o
JOIN deposit_address d ON d.id = o.deposit_address_id
JOIN unnest(CAST(:assets AS text[]), CAST(:minimums AS numeric[])) AS m(asset, minimum) ON m.asset = o.asset
WHERE o.chain = 'ethereum'
  AND o.eth_swept_by IS NULL
  AND o.state = ANY(:booked)
  AND NOT EXISTS (SELECT 1 FROM eth_sweep s WHERE lower(s.address) = lower(d.address) AND s.state NOT IN ('final', 'reverted'))
GROUP BY o.asset, d.id, d.address, d.derivation_index, m.minimum
HAVING sum(o.amount) >= m.minimum
ORDER BY o.asset = 'ETH', d.id
LIMIT :limit
""")

_UNSWEPT_AT_SQL = text("""
SELECT id, amount
FROM deposit_observation
WHERE deposit_address_id = :d
  AND asset = :a
  AND eth_swept_by IS NULL
  AND state = ANY(:booked)
ORDER BY id
FOR UPDATE
""")

_UNFINISHED_AT_SQL = text("""
SELECT id FROM eth_sweep WHERE lower(address) = lower(:a) AND state NOT IN ('final', 'reverted')
""")

# what the books hold in ether at one deposit address (module docstring: `booked_ether`)
_BOOKED_ETHER_SQL = text("""
SELECT (SELECT coalesce(sum(amount), 0) FROM deposit_observation
        WHERE deposit_address_id = :d AND asset = 'ETH' AND state = ANY(:booked))
     + (SELECT coalesce(sum(amount), 0) FROM eth_gas_funding WHERE lower(address) = lower(:a) AND state = 'final')
     - (SELECT coalesce(sum(fee), 0) FROM eth_sweep WHERE lower(address) = lower(:a) AND state IN ('final', 'reverted'))
     - (SELECT coalesce(sum(amount), 0) FROM eth_sweep WHERE lower(address) = lower(:a) AND asset = 'ETH' AND state = 'final')
""")

_NEXT_SWEEP_NONCE_SQL = text("""
SELECT coalesce(max(nonce) + 1, 0) FROM eth_sweep WHERE lower(address) = lower(:a)
""")

_INSERT_SWEEP_SQL = text("""
INSERT INTO eth_sweep (asset, address, deposit_index, nonce, amount, gas_limit, max_fee_wei, priority_fee_wei, max_fee_cap_wei,
                       state)
VALUES (:asset, :address, :index, :nonce, :amount, :gas, :max_fee, :priority, :cap, 'open')
RETURNING id
""")

_INSERT_FUNDING_SQL = text("""
INSERT INTO eth_gas_funding (sweep_id, address, nonce, amount, gas_limit, max_fee_wei, priority_fee_wei, state)
VALUES (:sweep, :address, :nonce, :amount, :gas, :max_fee, :priority, 'open')
RETURNING id
""")

# the hot nonce: the counter withdrawals use (custody.payouts), past every nonce the signer recorded
_HOT_NONCE_SEED_SQL = text("INSERT INTO eth_nonce (address, next_nonce) VALUES (:a, :n) ON CONFLICT DO NOTHING")
_HOT_NONCE_LOCK_SQL = text("SELECT next_nonce FROM eth_nonce WHERE address = :a FOR UPDATE")
_HOT_NONCE_SET_SQL = text("UPDATE eth_nonce SET next_nonce = :n WHERE address = :a")
# a funding: claimed with its nonce (NULL: given back after a refusal); given a nonce, or none
_CLAIM_FUNDING_SQL = text("SELECT id, nonce FROM eth_gas_funding WHERE id = :i AND state = 'open' FOR UPDATE SKIP LOCKED")
_FUNDING_NONCE_SET_SQL = text("UPDATE eth_gas_funding SET nonce = :n WHERE id = :i")
# the hot nonce the signer recorded a funding of sweep :s at (its own record, which custody may read)
_FUNDING_RECORDED_SQL = text("""
SELECT nonce FROM signer_eth_sweep WHERE kind = 'gas' AND sweep_id = :s AND lower(sender) = lower(:a) ORDER BY id DESC LIMIT 1
""")

_OPEN_FUNDINGS_SQL = text("""
SELECT f.id, f.sweep_id, f.nonce, f.amount, f.gas_limit, f.max_fee_wei, f.priority_fee_wei, s.deposit_index
FROM eth_gas_funding f
JOIN eth_sweep s ON s.id = f.sweep_id
WHERE f.state = 'open'
ORDER BY f.nonce
""")

_OPEN_SWEEPS_SQL = text("""
SELECT s.id, s.asset, s.deposit_index, s.nonce, s.amount, s.gas_limit, s.max_fee_wei, s.priority_fee_wei
FROM eth_sweep s
LEFT JOIN eth_gas_funding f ON f.sweep_id = s.id
WHERE s.state = 'open'
  AND (f.id IS NULL OR f.state = 'final')
ORDER BY s.id
""")

_CLAIM_SQL = {t: text(f"SELECT id FROM {t} WHERE id = :i AND state = 'open' FOR UPDATE SKIP LOCKED") for t in TABLES}


def unsettled(c: Connection) -> list:
    """Every signed version of the sweeps and gas fundings signed but not booked (kind, asset,
    amount, txid), gas fundings first: reconciliation asks the node which is mined and at what gas
    (`moves_in_transit`); one nonce per row, so at most one version of a row is."""
    return [*unsettled_versions(c, "eth_gas_funding", "'gas' AS kind, 'ETH' AS asset, m.amount", UNSETTLED),
            *unsettled_versions(c, "eth_sweep", "'sweep' AS kind, m.asset, m.amount", UNSETTLED)]


class EthSweeps(EthMoves):
    tables = TABLES
    prefix = "eth_sweep"
    label = "eth sweep"

    def _advance(self, c: Connection, table: str, row_id: int, from_state: str, to_state: str, **columns: object) -> None:
        advance(c, table, row_id, from_state, to_state, **columns)  # this module's name (a crash test replaces it)

    def __init__(self, engine: Engine, ledger: Ledger, wallets: Wallets, ethereum: EthereumAdapter, signer: SignerPort, *,
                 hot_address: str, thresholds: Mapping[str, int], gas_margin_percent: int = 10,
                 max_fee_wei: int = 500 * 10**9, max_addresses: int = 200,
                 min_per_address: Mapping[str, int] | None = None, bump: EthBumpConfig | None = None,
                 bump_reserve_percent: int = 0) -> None:
        super().__init__(engine, ledger, wallets, ethereum, signer, hot_address=hot_address, bump=bump)
        # gas money a sweep keeps for its bumps: funded (token) or held back (ether) at gas limit x
        # max fee x (100 + this) / 100, at most the bump ceiling (`max_fee_cap_wei`, module docstring)
        self.bump_reserve_percent = bump_reserve_percent
        self.thresholds = dict(thresholds)  # asset -> minor units (policy data: AssetPolicy.sweep_threshold)
        self.gas_margin_percent = gas_margin_percent
        self.max_fee_wei = max_fee_wei  # ceiling for the max fee per gas a sweep or funding is signed at
        self.max_addresses = max_addresses  # deposit addresses planned per run
        # asset -> minor units an address must hold to be swept (module docstring); absent: `minimum()`'s default
        self.min_per_address = dict(min_per_address or {})

    def minimum(self, asset: str) -> int:
        """What one deposit address must hold of `asset` (booked, unswept) to be swept: the asset's
        `min_per_address` (policy data, `AssetPolicy.sweep_min_per_address`, custody.policy_config
        `sweep_minimums`), else 1% of its threshold (at least 1 base unit)."""
        if asset in self.min_per_address:
            return self.min_per_address[asset]
        return max(1, self.thresholds.get(asset, 0) // DUST_FRACTION)

    def run_once(self) -> None:
        self.plan()
        self.sign()
        self.broadcast()
        self.bump_fees()
        self.track()

    def fee_cap(self, max_fee_wei: int) -> int:
        """The highest max fee per gas a sweep planned at `max_fee_wei` may be bumped to: what its
        deposit address is given (or keeps) gas money for."""
        return max(max_fee_wei, min(max_fee_wei * (100 + self.bump_reserve_percent) // 100, self.bump.max_fee_wei))

    # ---- plan ---------------------------------------------------------------------------------

    def plan(self) -> list[int]:
        """Make the sweep rows (and gas fundings) for every asset over its threshold; their ids."""
        if kill_switch(self.engine).engaged:
            return []
        assets = {a.asset: a for a in self.wallets.chain_assets("ethereum")}
        with self.engine.connect() as c:
            totals = {r.asset: int(r.amount) for r in c.execute(_UNSWEPT_TOTALS_SQL, {"booked": list(BOOKED)})}
            due = [a for a, limit in sorted(self.thresholds.items()) if a in assets and totals.get(a, 0) > limit]
            if not due:
                return []
            candidates = c.execute(_CANDIDATES_SQL, {"booked": list(BOOKED), "assets": due, "limit": self.max_addresses,
                                                     "minimums": [self.minimum(a) for a in due]}).all()
        fee = self.ethereum.estimate_fee()
        max_fee = min(fee.max_fee_wei, self.max_fee_wei)
        priority = min(max(fee.priority_fee_wei, 1), max_fee)
        made, seen = [], set()
        for cand in candidates:
            if cand.address.lower() in seen:  # one move per address at a time: its token first
                continue
            seen.add(cand.address.lower())
            sweep_id = self._guard("plan", cand.deposit_address_id,
                                   lambda cand=cand: self._plan_one(cand, assets[cand.asset], max_fee, priority))
            if sweep_id is not None:
                made.append(sweep_id)
        return made

    def _plan_one(self, cand, asset: ChainAsset, max_fee: int, priority: int) -> int | None:
        token = asset.contract_address
        gas = TRANSFER_GAS
        if token:
            on_chain = self.ethereum.token_balance(token, cand.address)
            if on_chain < int(cand.amount):
                log.warning("eth sweep of %s at %s skipped: %d booked, %d on chain", asset.asset, cand.address,
                            int(cand.amount), on_chain)
                return None
            estimate = self.ethereum.estimate_gas(cand.address, token, data=erc20_transfer_data(self.hot_address, int(cand.amount)))
            gas = gas_limit_with_margin(estimate, self.gas_margin_percent)
        chain_nonce = self.ethereum.nonce(cand.address, pending=True)
        on_chain_ether = self.ethereum.balance(cand.address)
        with self.engine.begin() as c:
            c.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": f"eth_sweep:{cand.address.lower()}"})
            if c.execute(_UNFINISHED_AT_SQL, {"a": cand.address}).first() is not None:
                return None  # another worker planned it meanwhile
            booked_ether = int(c.execute(_BOOKED_ETHER_SQL, {"d": cand.deposit_address_id, "a": cand.address,
                                                             "booked": list(BOOKED)}).scalar_one())
            rows = c.execute(_UNSWEPT_AT_SQL, {"d": cand.deposit_address_id, "a": asset.asset, "booked": list(BOOKED)}).all()
            if not rows:
                return None
            cap = self.fee_cap(max_fee)
            if token:
                amount, funding = sum(int(r.amount) for r in rows), gas_funding_needed(gas, cap, booked_ether)
            else:
                amount, funding = ether_sweep_amount(booked_ether, cap), 0
                if amount == 0 or on_chain_ether < booked_ether:
                    log.info("eth sweep of ether at %s skipped: %d booked, %d on chain", cand.address, booked_ether, on_chain_ether)
                    return None
            nonce = max(chain_nonce, int(c.execute(_NEXT_SWEEP_NONCE_SQL, {"a": cand.address}).scalar_one()))
            sweep_id = c.execute(_INSERT_SWEEP_SQL, {"asset": asset.asset, "address": cand.address, "index": cand.derivation_index,
                                                     "nonce": nonce, "amount": amount, "gas": gas, "max_fee": max_fee,
                                                     "priority": priority, "cap": cap}).scalar_one()
            c.execute(text("UPDATE deposit_observation SET eth_swept_by = :s WHERE id = ANY(:i)"),
                      {"s": sweep_id, "i": [r.id for r in rows]})
            detail = {"asset": asset.asset, "address": cand.address, "amount": str(amount), "nonce": nonce, "gas_limit": gas,
                      "max_fee_wei": str(max_fee), "deposits": len(rows)}
            if funding:
                hot_nonce = self._reserve_hot_nonce(c)
                c.execute(_INSERT_FUNDING_SQL, {"sweep": sweep_id, "address": cand.address, "nonce": hot_nonce, "amount": funding,
                                                "gas": TRANSFER_GAS, "max_fee": max_fee, "priority": priority})
                detail |= {"gas_funding": str(funding), "hot_nonce": hot_nonce}
            audit(c, "custody", "eth_sweep.create", f"eth_sweep:{sweep_id}", detail)
        log.info("eth sweep %d planned: %s", sweep_id, detail)
        return sweep_id

    def _reserve_hot_nonce(self, c: Connection) -> int:
        """The next hot-address nonce, taken for good in the caller's transaction (committed with the
        funding row, before the signer is asked): withdrawals' allocator (custody.payouts) reads the
        same counter under the same row lock, so no two rows ever hold one nonce."""
        c.execute(_HOT_NONCE_SEED_SQL, {"a": self.hot_address, "n": self.ethereum.nonce(self.hot_address)})
        counter = int(c.execute(_HOT_NONCE_LOCK_SQL, {"a": self.hot_address}).scalar_one())
        recorded = c.execute(HOT_NONCE_RECORDED_SQL, {"a": self.hot_address, "ci": None}).scalar()  # on any chain id
        nonce = max(counter, int(recorded) + 1 if recorded is not None else 0)
        c.execute(_HOT_NONCE_SET_SQL, {"n": nonce + 1, "a": self.hot_address})
        return nonce

    # ---- sign -----------------------------------------------------------------------------------

    def sign(self) -> list[str]:
        """Sign every open gas funding, then every open sweep whose funding (if any) is booked final;
        the signed bytes are stored in the same database transaction that moves the row to `signed`."""
        if kill_switch(self.engine).engaged:
            return []
        chain_id = self.ethereum.chain_id
        with self.engine.connect() as c:
            fundings = c.execute(_OPEN_FUNDINGS_SQL).all()
        signed = []
        for f in fundings:
            txid = self._guard("sign", f.sweep_id, lambda f=f: self._sign_funding(f, chain_id))
            signed += [txid] if txid else []
        with self.engine.connect() as c:
            sweeps = c.execute(_OPEN_SWEEPS_SQL).all()
        for s in sweeps:
            txid = self._guard("sign", s.id, lambda s=s: self._sign_one("eth_sweep", s, lambda: self.signer.sign_ethereum_sweep(
                s.id, deposit_index=s.deposit_index, asset=s.asset, amount=int(s.amount), chain_id=chain_id, nonce=int(s.nonce),
                gas=int(s.gas_limit), max_fee_wei=int(s.max_fee_wei), priority_fee_wei=int(s.priority_fee_wei))))
            signed += [txid] if txid else []
        return signed

    def _sign_one(self, table: str, row, ask: Callable) -> str | None:
        """Claim the open row (a second worker skips it), ask the signer, store, in one transaction."""
        row_id = row.id
        with self.engine.begin() as c:
            if c.execute(_CLAIM_SQL[table], {"i": row_id}).first() is None:
                return None
            try:
                tx = ask()
            except SigningRefused as refused:
                log.warning("%s %d not signed: %s", table, row_id, refused)
                open_incident(c, "eth_sweep_refused", f"eth_sweep_refused:{table}:{row_id}:{refused.code.value}",
                              {"table": table, "id": row_id, "code": refused.code.value, "message": refused.message},
                              severity="warning")
                return None
            self._store_signed(c, table, row_id, tx, gas=int(row.gas_limit), max_fee_wei=int(row.max_fee_wei),
                               priority_fee_wei=int(row.priority_fee_wei))
        log.info("%s %d signed: %s (nonce %d)", table, row_id, tx.txid, tx.nonce)
        return tx.txid

    def _sign_funding(self, f, chain_id: int) -> str | None:
        """Claim the open funding, lock the hot counter (`eth_nonce`, held across the signer call as
        custody.payouts does for withdrawals), take a hot nonce if the row has none (a refusal gave
        it back), ask the signer and store, in one transaction; a refusal gives the nonce back when
        it can (`_refused_funding`)."""
        with self.engine.begin() as c:
            claimed = c.execute(_CLAIM_FUNDING_SQL, {"i": f.id}).first()
            if claimed is None:
                return None
            c.execute(_HOT_NONCE_SEED_SQL, {"a": self.hot_address, "n": self.ethereum.nonce(self.hot_address)})
            c.execute(_HOT_NONCE_LOCK_SQL, {"a": self.hot_address})
            nonce = int(claimed.nonce) if claimed.nonce is not None else self._funding_nonce(c, f.sweep_id)
            if claimed.nonce is None:
                c.execute(_FUNDING_NONCE_SET_SQL, {"n": nonce, "i": f.id})
            try:
                tx = self.signer.sign_ethereum_gas_funding(
                    f.sweep_id, deposit_index=f.deposit_index, chain_id=chain_id, nonce=nonce, value=int(f.amount),
                    gas=int(f.gas_limit), max_fee_wei=int(f.max_fee_wei), priority_fee_wei=int(f.priority_fee_wei))
            except SigningRefused as refused:
                self._refused_funding(c, f.id, f.sweep_id, nonce, refused)
                return None
            self._store_signed(c, "eth_gas_funding", f.id, tx, gas=int(f.gas_limit), max_fee_wei=int(f.max_fee_wei),
                               priority_fee_wei=int(f.priority_fee_wei))
        log.info("eth_gas_funding %d signed: %s (hot nonce %d)", f.id, tx.txid, tx.nonce)
        return tx.txid

    def _funding_nonce(self, c: Connection, sweep_id: int) -> int:
        """The hot nonce for a funding that holds none: the one the signer recorded for this sweep
        (it signed it and custody lost the answer: the same transaction again), else the next one
        (`_reserve_hot_nonce`, the counter already locked by the caller)."""
        recorded = c.execute(_FUNDING_RECORDED_SQL, {"s": sweep_id, "a": self.hot_address}).scalar()
        return int(recorded) if recorded is not None else self._reserve_hot_nonce(c)

    def _refused_funding(self, c: Connection, funding_id: int, sweep_id: int, nonce: int, refused: SigningRefused) -> None:
        """The signer refused a funding at hot nonce `nonce` (the counter's row lock held). Nothing was
        signed at it, so unless something was handed out after it (the counter is past `nonce + 1`)
        or the signer recorded a funding of this sweep (it may be on the wire), the nonce goes back
        to the counter and the row holds none: the next hot-address transaction takes it, no gap.
        Otherwise the hole stays until the funding is signed: a warning when the refusal is
        transient (`nonce_gap`: an earlier hot nonce is not signed yet; `kill_switch_on`), else a
        critical incident (an operator must fill that nonce: every later hot transaction waits)."""
        counter = int(c.execute(_HOT_NONCE_LOCK_SQL, {"a": self.hot_address}).scalar_one())
        signed_before = c.execute(_FUNDING_RECORDED_SQL, {"s": sweep_id, "a": self.hot_address}).scalar() is not None
        given_back = counter == nonce + 1 and not signed_before
        if given_back:
            c.execute(_HOT_NONCE_SET_SQL, {"n": nonce, "a": self.hot_address})
            c.execute(_FUNDING_NONCE_SET_SQL, {"n": None, "i": funding_id})
        transient = refused.code in (RefusalCode.nonce_gap, RefusalCode.kill_switch_on)
        log.warning("eth_gas_funding %d not signed at hot nonce %d: %s (nonce given back: %s)", funding_id, nonce, refused,
                    given_back)
        open_incident(c, "eth_sweep_refused", f"eth_sweep_refused:eth_gas_funding:{funding_id}:{refused.code.value}"
                      + ("" if given_back or transient else f":hole:{nonce}"),
                      {"table": "eth_gas_funding", "id": funding_id, "code": refused.code.value, "message": refused.message,
                       "hot_nonce": nonce, "nonce_given_back": given_back},
                      severity="warning" if given_back or transient else "critical")

    # ---- fee bumps (custody.eth_moves) ----------------------------------------------------------

    def _bump_cap(self, c: Connection, table: str, row) -> int:
        """A funding (from hot): the bump ceiling. A sweep: also what its deposit address holds gas
        money for (`max_fee_cap_wei`; a row from before it: its own max fee, so never bumped)."""
        if table == "eth_sweep":
            return min(self.bump.max_fee_wei, int(row.max_fee_cap_wei if row.max_fee_cap_wei is not None else row.max_fee_wei))
        return self.bump.max_fee_wei

    def _resign(self, c: Connection, table: str, row, max_fee_wei: int, priority_fee_wei: int) -> SignedEthTx:
        chain_id = self.ethereum.chain_id
        if table == "eth_gas_funding":
            deposit_index = c.execute(text("SELECT deposit_index FROM eth_sweep WHERE id = :s"), {"s": row.sweep_id}).scalar_one()
            return self.signer.sign_ethereum_gas_funding(
                row.sweep_id, deposit_index=deposit_index, chain_id=chain_id, nonce=int(row.nonce), value=int(row.amount),
                gas=int(row.gas_limit), max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei, replaces_txid=row.txid)
        return self.signer.sign_ethereum_sweep(
            row.id, deposit_index=row.deposit_index, asset=row.asset, amount=int(row.amount), chain_id=chain_id,
            nonce=int(row.nonce), gas=int(row.gas_limit), max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei,
            replaces_txid=row.txid)

    def _book(self, c: Connection, table: str, row_id: int, gas: int, *, reverted: bool) -> None:
        """The row's journal transaction (module docstring, "Books"), in the caller's transaction."""
        expense = self.wallets.firm_account("network_fees", "ETH", conn=c)
        hot_eth = self.wallets.location_account("ethereum", "hot", "ETH", conn=c)
        deposit_eth = self.wallets.location_account("ethereum", "deposit", "ETH", conn=c)
        row = c.execute(text(f"SELECT * FROM {table} WHERE id = :i"), {"i": row_id}).one()
        amount = int(row.amount)
        if table == "eth_gas_funding":
            legs = ([] if reverted else [Transfer(deposit_eth, hot_eth, amount)]) + ([Transfer(expense, hot_eth, gas)] if gas else [])
            meta = {"eth_gas_funding_id": row_id, "sweep_id": row.sweep_id, "txid": row.txid, "gas": gas}
        else:
            legs = [] if reverted else [Transfer(self.wallets.location_account("ethereum", "hot", row.asset, conn=c),
                                                 self.wallets.location_account("ethereum", "deposit", row.asset, conn=c), amount)]
            legs += [Transfer(expense, deposit_eth, gas)] if gas else []
            meta = {"eth_sweep_id": row_id, "asset": row.asset, "txid": row.txid, "gas": gas, "reverted": reverted}
            if reverted:  # its deposits wait for a later sweep
                c.execute(text("UPDATE deposit_observation SET eth_swept_by = NULL WHERE eth_swept_by = :s"), {"s": row_id})
        if legs:
            self.ledger.post(f"{table}:{row_id}:{'reverted' if reverted else 'final'}", legs, kind="sweep", metadata=meta, conn=c)
        audit(c, "custody", f"{table}.{'reverted' if reverted else 'final'}", f"{table}:{row_id}",
              {"txid": row.txid, "amount": str(amount), "gas": str(gas)})
