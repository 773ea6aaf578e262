"""What the signer itself knows of each asset: its chain, its token contract, and how much of it may
be signed without approvals. No key code; custody may import it to wire an in-process signer.

The signer never takes an asset's chain or contract from `chain_asset` (custody writes it): the
approval payload names the asset, and this table (the signer's own configuration) says what paying
that asset means. An asset not in the table is refused (`asset_unknown`).

| field | meaning |
| --- | --- |
| `SignerAsset.chain` | `bitcoin` or `ethereum`: the only chain a withdrawal of this asset is signed on |
| `SignerAsset.contract` | ethereum tokens: the ERC-20 contract (EIP-55 checked); None for the chain's native coin (BTC, ETH) |
| `SignerAsset.decimals` | for people and messages only (amounts are minor units everywhere) |
| `UnapprovedLimit.amount` | minor units of the asset signed for withdrawals with NO valid approval, per window |
| `UnapprovedLimit.window_secs` | the sliding window, in seconds, counted from `signer_signature` |

`DEFAULT_ASSETS` (BTC on bitcoin, native) is what a signer knows when it is given no table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from signer.ethereum_tx import validate_eth_address

Chain = Literal["bitcoin", "ethereum"]


@dataclass(frozen=True)
class SignerAsset:
    chain: Chain
    contract: str | None = None  # checksummed ERC-20 address; None: the chain's native coin
    decimals: int | None = None


@dataclass(frozen=True)
class UnapprovedLimit:
    amount: int  # minor units signed without any approval per window (0: every withdrawal needs one)
    window_secs: int


DEFAULT_ASSETS: Mapping[str, SignerAsset] = {"BTC": SignerAsset("bitcoin")}


def assets_from_entries(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, SignerAsset]:
    """The table as TOML writes it ({SYMBOL: {chain, contract?, decimals?}}), validated: a known
    chain; no contract on bitcoin; a valid EIP-55 contract, used by one asset only; at most one
    native asset per chain. ValueError naming the asset."""
    out: dict[str, SignerAsset] = {}
    for symbol, e in entries.items():
        unknown = set(e) - {"chain", "contract", "decimals"}
        if unknown:
            raise ValueError(f"{symbol}: unknown key(s) {sorted(unknown)}")
        chain, contract, decimals = e.get("chain"), e.get("contract"), e.get("decimals")
        if chain not in ("bitcoin", "ethereum"):
            raise ValueError(f"{symbol}: chain must be bitcoin or ethereum")
        if contract is not None:
            if chain != "ethereum":
                raise ValueError(f"{symbol}: only an ethereum asset has a contract")
            try:
                contract = validate_eth_address(str(contract))
            except Exception as exc:  # noqa: BLE001 - reported as the asset's contract
                raise ValueError(f"{symbol}: contract: {exc}") from None
        if decimals is not None and (type(decimals) is not int or not 0 <= decimals <= 77):
            raise ValueError(f"{symbol}: decimals must be an integer 0..77")
        out[symbol] = SignerAsset(chain, contract, decimals)
    contracts = [a.contract.lower() for a in out.values() if a.contract]
    if len(set(contracts)) != len(contracts):
        raise ValueError("two assets name the same contract")
    natives = [a.chain for a in out.values() if a.contract is None]
    if len(set(natives)) != len(natives):
        raise ValueError("at most one native asset (no contract) per chain")
    return out
