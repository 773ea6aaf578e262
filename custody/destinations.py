"""Where a withdrawal may not go: the firm's own addresses, and ethereum addresses that swallow value.

A withdrawal pays a customer (or, for a quarantine return, an outside sender). Paid to an address
the service itself controls, the coins come straight back to the firm while the customer's balance
is gone; the next reconciliation sees a difference, opens a critical incident and engages the kill
switch, halting everyone's withdrawals. Paid to a reserved or contract address on ethereum, the
value is burned, locked in a contract, or the transaction reverts and the firm pays the gas.

Guarantees:
- A destination is compared in normalised form (`normalise`): bech32 in lowercase (BIP173 allows
  an all-uppercase spelling of the same address), ethereum in lowercase hex; base58 is case-bearing
  and kept as given.
- "Ours" (`destination_internal`) is every address the service controls or derived, on both
  chains: issued deposit addresses, the hot wallet's receive addresses and its change addresses
  (one per bitcoin batch, `1/<batch id>`), cold addresses derived for rebalances, addresses coins
  of ours were recorded at (`wallet_utxo`), sweep and rebalance destinations and the hot wallet's
  sending address on ethereum (one named query, `OWN_ADDRESS_SQL`), and the addresses the
  registered wallets will derive next (`derived_addresses`: the next `CHANGE_LOOKAHEAD` batch ids'
  change addresses, counted from the batch id sequence itself so ids burned by rolled-back batching
  runs do not open a gap; the next `LOOKAHEAD` deposit and cold indices), so an address derived
  after the request is usually refused at once, and always before payment. At batching the window
  starts at the id the new batch is about to take, so the change address of THIS batch and of
  every existing one is refused.
- A change address further ahead than the window is not refused (no window is infinite, and
  anyone with the hot xpub, which every database copy holds, can derive one). Paid anyway, it
  harms no one else: when that batch exists, the coin is not taken as our change (only the exact
  change output of our own transaction is, custody.payouts `hot_coin_origin`) but booked as hot
  funding with a warning incident, and reconciliation reports a surplus as a warning only.
- The request refuses (nothing held, nothing written) and the payout jobs refuse again when a
  withdrawal is batched (`DestinationGuard.refusals_at_payout`: a destination can become internal,
  or grow contract code, after the request); such a withdrawal is rejected with its hold released,
  never paid.
- A destination with contract code is paid only if it is on the account's allowlist, and only if
  the exact payout (from the hot address, with its value, calldata and gas limit) does not revert
  when simulated at the tip. A simulation that fails because the hot wallet cannot cover the
  payout says nothing about the destination and refuses nothing (the payout waits for funding as
  any other would).

Codes (`refusal` returns the first that applies, in this order; HTTP 422 each, custody.errors):
| code | meaning |
| --- | --- |
| destination_zero_address | ethereum: the zero address |
| destination_burn_address | ethereum: a well-known burn address (`BURN_ADDRESSES`) |
| destination_precompile | ethereum: an address whose integer value is below 2**16 (precompiles 0x01..0x11, 0x100, and room reserved for more) |
| destination_token_contract | ethereum: the contract of a configured token (chain_asset.contract_address), for any asset |
| destination_internal | an address the service controls or derived (see above), either chain |
| destination_contract_not_allowlisted | ethereum: the destination has code and is not on the account's allowlist |
| destination_would_revert | ethereum: the simulated payout reverts while the hot wallet could cover it |
The first three need no lookup and are checked before the address's format (a zero address is told
as such, not as a malformed one); the rest after it (`invalid_destination`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy import Connection, Engine, text

from chain_adapters.base import ChainAdapter
from chain_adapters.ethereum import CallOutcome, CallResult, EthereumAdapter
from custody.addresses import derive_btc_address, derive_eth_address
from custody.errors import CustodyError, CustodyErrorCode
from custody.wallets import ChainAsset, Wallets
from signer.ethereum_tx import erc20_transfer_data

ZERO_ADDRESS = "0x" + "0" * 40
BURN_ADDRESSES = frozenset({
    "0x000000000000000000000000000000000000dead",
    "0xdead000000000000000042069420694206942069",
})
PRECOMPILE_LIMIT = 2**16  # 0x01..0x11 today, 0x100 (P-256); everything below 2**16 is kept free for more
LOOKAHEAD = 20  # derived-but-unused addresses refused ahead: cold, hot receive and deposit indices
CHANGE_LOOKAHEAD = 1_000  # bitcoin hot change addresses 1/<batch id> refused ahead of the next batch id
ETH_GAS_ETHER, ETH_GAS_TOKEN = 21_000, 100_000  # gas limits of an ether and an ERC-20 payout
HOT_RECEIVE_INDEX = 0  # the hot wallet's receive address (bitcoin 0/0) and ethereum sending account
_BECH32_PREFIXES = ("bc1", "tb1", "bcrt1")
_HEX = frozenset("0123456789abcdef")


# ---- pure decisions ------------------------------------------------------------------------------

def normalise(chain: str, address: str) -> str:
    """The one spelling an address is compared in: bech32 and ethereum hex in lowercase."""
    address = address.strip()
    if chain == "ethereum":
        return address.lower()
    lowered = address.lower()
    return lowered if lowered.startswith(_BECH32_PREFIXES) else address


def reserved(chain: str, address: str) -> CustodyErrorCode | None:
    """Zero, burn or precompile: an ethereum address no withdrawal may pay, whatever its asset.
    Anything that is not 0x and 40 hex digits is left to the format check (None)."""
    a = normalise(chain, address)
    if chain != "ethereum" or len(a) != 42 or not a.startswith("0x") or not set(a[2:]) <= _HEX:
        return None
    if a == ZERO_ADDRESS:
        return CustodyErrorCode.destination_zero_address
    if a in BURN_ADDRESSES:
        return CustodyErrorCode.destination_burn_address
    if int(a, 16) < PRECOMPILE_LIMIT:
        return CustodyErrorCode.destination_precompile
    return None


@dataclass(frozen=True)
class DestinationFacts:
    """What the edge looked up about one destination. `has_code`, `allowlisted`, `simulation` and
    `hot_covers` are None where they were not looked up (bitcoin, or decided earlier)."""

    internal: bool
    token_contract: bool = False
    has_code: bool | None = None
    allowlisted: bool | None = None
    simulation: CallResult | None = None
    hot_covers: bool | None = None


def refusal(chain: str, destination: str, facts: DestinationFacts) -> CustodyErrorCode | None:
    """The first code of the module's table that applies to `destination`, or None to pay it."""
    code = reserved(chain, destination)
    if code is not None:
        return code
    if facts.token_contract:
        return CustodyErrorCode.destination_token_contract
    if facts.internal:
        return CustodyErrorCode.destination_internal
    if facts.has_code and not facts.allowlisted:
        return CustodyErrorCode.destination_contract_not_allowlisted
    if facts.has_code and facts.simulation is CallResult.REVERTED and facts.hot_covers:
        return CustodyErrorCode.destination_would_revert
    return None


@dataclass(frozen=True)
class EthPayoutCall:
    """The one transaction paying an ethereum withdrawal: ether to the destination, or the token
    contract called with `transfer(destination, amount)`. Simulated and signed alike."""

    to: str
    value: int
    data: bytes
    gas: int


def eth_payout_call(contract_address: str | None, destination: str, amount: int) -> EthPayoutCall:
    if contract_address:
        return EthPayoutCall(contract_address, 0, erc20_transfer_data(destination, amount), ETH_GAS_TOKEN)
    return EthPayoutCall(destination, amount, b"", ETH_GAS_ETHER)


@dataclass(frozen=True)
class WalletKey:
    """One registered wallet: its account-level public key and how far it has been derived."""

    chain: str
    tier: str
    network: str
    xpub: str
    next_index: int
    gap_limit: int


@lru_cache(maxsize=200_000)
def _derive(chain: str, xpub: str, network: str, change: int, index: int) -> str:
    if chain == "bitcoin":
        return derive_btc_address(xpub, network, change, index)
    return derive_eth_address(xpub, index)


def derived_addresses(keys: Iterable[WalletKey], *, bitcoin_batch_ids: Sequence[int], next_batch_id: int,
                      lookahead: int = LOOKAHEAD, change_lookahead: int = CHANGE_LOOKAHEAD) -> frozenset[str]:
    """Normalised addresses the registered wallets derived or will derive next, beyond what the
    tables record: hot receive 0/0..0/lookahead-1; bitcoin hot change 1/<id> for every bitcoin
    batch and the next `change_lookahead` batch ids from `next_batch_id` (ids are shared by both
    chains); cold 0/0 up to `lookahead` past its next index; deposit addresses not yet issued, up
    to the gap limit (the issued ones are in deposit_address)."""
    out: set[str] = set()
    for k in keys:
        if k.tier == "deposit":
            paths = [(0, i) for i in range(k.next_index, k.next_index + max(k.gap_limit, lookahead))]
        elif k.tier == "hot":
            paths = [(0, i) for i in range(HOT_RECEIVE_INDEX, HOT_RECEIVE_INDEX + lookahead)]
            if k.chain == "bitcoin":
                upcoming = range(next_batch_id, next_batch_id + change_lookahead)
                paths += [(1, b) for b in sorted({*bitcoin_batch_ids, *upcoming})]
        else:  # warm, cold: receive addresses handed out by rebalances
            paths = [(0, i) for i in range(0, k.next_index + lookahead)]
        out.update(normalise(k.chain, _derive(k.chain, k.xpub, k.network, change, index)) for change, index in paths)
    return frozenset(out)


# ---- named queries -------------------------------------------------------------------------------

# Is `:address` (normalised) one the service recorded as its own on `:chain`? The source, or no row.
_OWN_ADDRESS_TEMPLATE = """
SELECT 'deposit_address' AS source, lower(address) AS address FROM deposit_address WHERE chain = :chain AND lower(address) {m}
UNION ALL
SELECT 'hot_wallet_coin', lower(address) FROM wallet_utxo WHERE :chain = 'bitcoin' AND lower(address) {m}
UNION ALL
SELECT 'rebalance_destination', lower(destination) FROM rebalance WHERE chain = :chain AND lower(destination) {m}
UNION ALL
SELECT 'sweep_destination', lower(destination) FROM sweep WHERE chain = :chain AND lower(destination) {m}
UNION ALL
SELECT 'hot_sender', lower(sender) FROM chain_transaction WHERE chain = :chain AND lower(sender) {m}
UNION ALL
SELECT 'hot_sender', lower(address) FROM eth_nonce WHERE :chain = 'ethereum' AND lower(address) {m}
"""
OWN_ADDRESS_SQL = text(_OWN_ADDRESS_TEMPLATE.format(m="= :address") + "LIMIT 1")
OWN_ADDRESSES_SQL = text(_OWN_ADDRESS_TEMPLATE.format(m="= ANY(CAST(:addresses AS text[]))"))  # many at once

_WALLET_KEYS_SQL = text("""
SELECT chain, tier, network, xpub, next_index, gap_limit
FROM wallet
WHERE chain = :chain
ORDER BY tier
""")

_BITCOIN_BATCH_IDS_SQL = text("""
SELECT id
FROM withdrawal_batch
WHERE chain = 'bitcoin'
ORDER BY id
""")

# next_id: the id the next batch takes (the sequence's, not max(id) + 1: a batching run that rolls
# back has consumed its id all the same)
_BATCH_COUNTS_SQL = text("""
SELECT count(*) FILTER (WHERE chain = 'bitcoin') AS bitcoin_batches,
       (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END FROM withdrawal_batch_id_seq s) AS next_id
FROM withdrawal_batch
""")

_TOKEN_CONTRACTS_SQL = text("""
SELECT lower(contract_address)
FROM chain_asset
WHERE chain = 'ethereum'
AND contract_address IS NOT NULL
""")

_ALLOWLISTED_SQL = text("""
SELECT 1
FROM allowlist_entry
WHERE account_id = :account
AND lower(address) = :address
""")


def own_address_source(c: Connection, chain: str, address: str) -> str | None:
    """Where the service recorded `address` as its own on `chain` (OWN_ADDRESS_SQL), or None."""
    return c.execute(OWN_ADDRESS_SQL, {"chain": chain, "address": normalise(chain, address).lower()}).scalar()


def own_address_sources(c: Connection, chain: str, addresses: Iterable[str]) -> dict[str, str]:
    """`own_address_source` for many addresses in one statement: for each of them recorded as ours,
    its normalised lowercase spelling -> where (the first place found)."""
    found: dict[str, str] = {}
    wanted = sorted({normalise(chain, a).lower() for a in addresses})
    for row in c.execute(OWN_ADDRESSES_SQL, {"chain": chain, "addresses": wanted}) if wanted else ():
        found.setdefault(row.address, row.source)
    return found


def wallet_keys(c: Connection, chain: str) -> list[WalletKey]:
    return [WalletKey(r.chain, r.tier, r.network, r.xpub, int(r.next_index), int(r.gap_limit))
            for r in c.execute(_WALLET_KEYS_SQL, {"chain": chain})]


# ---- the edge ------------------------------------------------------------------------------------

class DestinationGuard:
    """Looks up the facts about a destination (database, node) and asks `refusal`."""

    def __init__(self, engine: Engine, wallets: Wallets, adapters: Mapping[str, ChainAdapter]) -> None:
        self.engine = engine
        self.wallets = wallets
        ethereum = adapters.get("ethereum")
        self.ethereum = ethereum if isinstance(ethereum, EthereumAdapter) else None
        self._derived: dict[str, tuple[tuple, frozenset[str]]] = {}  # chain -> (what it was derived from, the set)

    @staticmethod
    def check_reserved(chain: str, destination: str) -> None:
        """Raise a reserved address's code (zero, burn, precompile) before the format is checked."""
        code = reserved(chain, destination)
        if code is not None:
            raise CustodyError(code, f"{destination} may not be paid: it is reserved ({code.value})", destination=destination)

    def check_request(self, ca: ChainAsset, account_id: int, destination: str, amount: int) -> None:
        """Raise the destination's refusal code (CustodyError) for a new request, or return."""
        with self.engine.connect() as c:
            code, detail = self._decide(c, ca, account_id, destination, amount)
        if code is not None:
            raise CustodyError(code, f"{destination} may not be paid: {detail}", destination=destination)

    def refusals_at_payout(self, c: Connection, rows: Sequence) -> list[CustodyErrorCode | None]:
        """The refusal code for each approved withdrawal row (asset, account_id, destination,
        amount) as it is about to be batched, or None to pay it; in the rows' order. The same
        decisions as one `_decide` per row, with the lookups done once per batch: each asset's
        chain, each chain's wallets and derived addresses, and the recorded own addresses of all
        the rows in one statement (a batch of 500 made some 2,000 statements). An ethereum
        destination still asks the node about itself (`_ethereum_facts`)."""
        assets = {a: self.wallets.chain_asset(a, conn=c) for a in sorted({w.asset for w in rows})}
        lookups = {}
        for chain in sorted({ca.chain for ca in assets.values()}):
            keys = wallet_keys(c, chain)
            mine = [w.destination for w in rows if assets[w.asset].chain == chain]
            lookups[chain] = keys, own_address_sources(c, chain, mine), self._derived_addresses(c, chain, keys)
        codes = []
        for w in rows:
            ca = assets[w.asset]
            keys, recorded, derived = lookups[ca.chain]
            address = normalise(ca.chain, w.destination)
            source = recorded.get(address.lower()) or ("derived" if address in derived else None)
            codes.append(self._decide_for(c, ca, int(w.account_id), w.destination, int(w.amount), keys, source)[0])
        return codes

    def _decide(self, c: Connection, ca: ChainAsset, account_id: int, destination: str,
                amount: int) -> tuple[CustodyErrorCode | None, str]:
        chain, address = ca.chain, normalise(ca.chain, destination)
        keys = wallet_keys(c, chain)
        source = own_address_source(c, chain, address)
        if source is None:
            source = "derived" if address in self._derived_addresses(c, chain, keys) else None
        return self._decide_for(c, ca, account_id, destination, amount, keys, source)

    def _decide_for(self, c: Connection, ca: ChainAsset, account_id: int, destination: str, amount: int,
                    keys: list[WalletKey], source: str | None) -> tuple[CustodyErrorCode | None, str]:
        """`_decide` once the address's own-address `source` (or None) is known."""
        chain, address = ca.chain, normalise(ca.chain, destination)
        facts = DestinationFacts(internal=source is not None)
        detail = f"it is the service's own address ({source})" if source else ""
        if chain == "ethereum" and refusal(chain, address, facts) is None:
            facts, detail = self._ethereum_facts(c, ca, account_id, destination, amount, keys, facts)
        code = refusal(chain, address, facts)
        return code, detail or (code.value if code else "")

    def _derived_addresses(self, c: Connection, chain: str, keys: list[WalletKey]) -> frozenset[str]:
        """`derived_addresses` for the wallets and batches as they are now, derived again only when a
        wallet moved on or a batch id was taken (batching asks once per approved withdrawal). Batches
        are never deleted, so their count and the next id tell whether the set is still the same."""
        counts = c.execute(_BATCH_COUNTS_SQL).one()
        inputs = (tuple(keys), int(counts.bitcoin_batches), int(counts.next_id))
        cached = self._derived.get(chain)
        if cached is None or cached[0] != inputs:
            bitcoin_batch_ids = c.execute(_BITCOIN_BATCH_IDS_SQL).scalars().all() if chain == "bitcoin" else []
            cached = (inputs, derived_addresses(keys, bitcoin_batch_ids=bitcoin_batch_ids, next_batch_id=int(counts.next_id)))
            self._derived[chain] = cached
        return cached[1]

    def _ethereum_facts(self, c: Connection, ca: ChainAsset, account_id: int, destination: str, amount: int,
                        keys: list[WalletKey], facts: DestinationFacts) -> tuple[DestinationFacts, str]:
        address = normalise("ethereum", destination)
        tokens = set(c.execute(_TOKEN_CONTRACTS_SQL).scalars())
        if address in tokens:
            return DestinationFacts(facts.internal, token_contract=True), "it is a token contract"
        if self.ethereum is None:  # fail closed: without a node nothing about the destination is known
            raise CustodyError(CustodyErrorCode.asset_not_withdrawable, f"{ca.asset}: no ethereum node is configured")
        if not self.ethereum.has_code(destination):
            return DestinationFacts(facts.internal, has_code=False), ""
        allowlisted = c.execute(_ALLOWLISTED_SQL, {"account": account_id, "address": address}).first() is not None
        if not allowlisted:
            return DestinationFacts(facts.internal, has_code=True, allowlisted=False), \
                "it has contract code and is not on the account's allowlist"
        hot_key = next((k for k in keys if k.tier == "hot"), None)
        if hot_key is None:
            raise CustodyError(CustodyErrorCode.asset_not_withdrawable, f"{ca.asset}: no ethereum hot wallet is registered")
        if type(amount) is not int or amount <= 0:  # the ledger refuses the amount itself
            return DestinationFacts(facts.internal, has_code=True, allowlisted=True), ""
        hot = _derive("ethereum", hot_key.xpub, hot_key.network, 0, HOT_RECEIVE_INDEX)
        call = eth_payout_call(ca.contract_address, destination, amount)
        outcome: CallOutcome = self.ethereum.simulate(hot, call.to, value=call.value, data=call.data, gas=call.gas)
        if ca.contract_address:
            covers = self.ethereum.token_balance(ca.contract_address, hot) >= amount
        else:
            covers = self.ethereum.balance(hot) >= call.value
        return (DestinationFacts(facts.internal, has_code=True, allowlisted=True, simulation=outcome.result, hot_covers=covers),
                f"the payout would revert ({outcome.detail})" if outcome.result is CallResult.REVERTED else "")
