"""Addresses the signer derives from its own keys, so a batch that pays one of them is refused.

The signer must trust no database row custody could forge: custody refuses a withdrawal to one of
the firm's own addresses (custody.destinations), but a forged `withdrawal_request` row could still
name the hot wallet as its destination. Paid, the coins come straight back to the firm while the
customer's balance is gone; the next reconciliation halts every withdrawal. So the signer derives,
from its own seed and nothing the database says, a bounded set of its own addresses and refuses
an output paying any of them (`RefusalCode.destination_internal`):

| what | bitcoin (BIP84) | ethereum (BIP44) |
| --- | --- | --- |
| hot receive / sender | hot 0/0 .. 0/(receive_window - 1) | hot 0/0 .. 0/(receive_window - 1) |
| hot change | hot 1/<b> for b in batch id +- change_window (the change output the signer builds itself is separate and allowed) | none (no change) |
| deposit | deposit 0/0 .. 0/(deposit_window - 1) | deposit 0/0 .. 0/(deposit_window - 1) |
| warm | warm 0/0 .. 0/(receive_window - 1) | warm 0/0 .. 0/(receive_window - 1) |

Bounds, on purpose: the deposit window is a setting (`deposit_window`, default 10,000 indexes per
chain), NOT custody's count of issued addresses: the signer cannot tell a true count from a forged
one, so it checks what it can decide from its keys alone. A deposit address issued beyond the
window is still refused by custody's own guard (which reads its issued list), not here; raise the
setting before custody issues that many. Cold addresses are not derived here: the cold key is
watch-only and registered in custody's table (in production from an offline seed), which the
signer cannot vouch for. The change window matches custody's look-ahead (1,000 batch ids).
Derivations are cached per process (each set is derived once per key and window; ~0.25 ms an
address).
"""
from __future__ import annotations

from functools import lru_cache

from bip_utils import Bip44, Bip44Changes, Bip44Coins, Bip84, Bip84Coins

from signer.bitcoin_tx import address_to_script

RECEIVE_WINDOW = 20
CHANGE_WINDOW = 1_000
DEPOSIT_WINDOW = 10_000
_COINS = {"regtest": Bip84Coins.BITCOIN_REGTEST, "testnet": Bip84Coins.BITCOIN_TESTNET}


def is_ethereum_address(address: str) -> bool:
    return len(address) == 42 and address[:2].lower() == "0x"


def change_indexes(batch_id: int, window: int = CHANGE_WINDOW) -> range:
    """The hot change indexes refused for batch `batch_id`: its own and `window` on either side
    (custody refuses the next 1,000 batch ids' change addresses; a forged row may name any)."""
    return range(max(0, batch_id - window), min(batch_id + window, 2**31 - 1) + 1)


@lru_cache(maxsize=16)
def _bitcoin_chain(account_xpub: str, network: str, change: int):
    account = Bip84.FromExtendedKey(account_xpub, _COINS.get(network, Bip84Coins.BITCOIN))
    return account.Change(Bip44Changes.CHAIN_INT if change else Bip44Changes.CHAIN_EXT)


@lru_cache(maxsize=64)
def _bitcoin_branch(account_xpub: str, network: str, change: int, start: int, stop: int) -> frozenset[bytes]:
    return frozenset(_bitcoin_script(account_xpub, network, change, i) for i in range(start, stop))


@lru_cache(maxsize=200_000)
def _bitcoin_script(account_xpub: str, network: str, change: int, index: int) -> bytes:
    address = _bitcoin_chain(account_xpub, network, change).AddressIndex(index).PublicKey().ToAddress()
    return address_to_script(address, network)


@lru_cache(maxsize=64)
def _ethereum_branch(account_xpub: str, stop: int) -> frozenset[str]:
    branch = Bip44.FromExtendedKey(account_xpub, Bip44Coins.ETHEREUM).Change(Bip44Changes.CHAIN_EXT)
    return frozenset(branch.AddressIndex(i).PublicKey().ToAddress().lower() for i in range(stop))


def bitcoin_own_scripts(xpubs: dict[str, str], network: str, *, receive_window: int = RECEIVE_WINDOW,
                        deposit_window: int = DEPOSIT_WINDOW) -> frozenset[bytes]:
    """Output scripts of the receive branches (tier -> account xpub: deposit, hot, warm)."""
    out: set[bytes] = set()
    for tier, xpub in xpubs.items():
        out |= _bitcoin_branch(xpub, network, 0, 0, deposit_window if tier == "deposit" else receive_window)
    return frozenset(out)


def bitcoin_change_scripts(hot_xpub: str, network: str, batch_id: int, window: int = CHANGE_WINDOW) -> frozenset[bytes]:
    return frozenset(_bitcoin_script(hot_xpub, network, 1, i) for i in change_indexes(batch_id, window))


def ethereum_own_addresses(xpubs: dict[str, str], *, receive_window: int = RECEIVE_WINDOW,
                           deposit_window: int = DEPOSIT_WINDOW) -> frozenset[str]:
    """Lowercase addresses of the deposit, hot and warm accounts' external branches."""
    out: set[str] = set()
    for tier, xpub in xpubs.items():
        out |= _ethereum_branch(xpub, deposit_window if tier == "deposit" else receive_window)
    return frozenset(out)


def pays_own_address(address: str, script: bytes, *, bitcoin_scripts: frozenset[bytes],
                     ethereum_addresses: frozenset[str], network: str) -> bool:
    """Does an output to `address` (bitcoin: paying `script` when given, else the address's) pay
    one of the signer's own addresses? An address that cannot be parsed is left to the other checks."""
    if is_ethereum_address(address):
        return address.lower() in ethereum_addresses
    try:
        paid = script or address_to_script(address, network)
    except Exception:  # noqa: BLE001 - a malformed address is not ours; signing it fails elsewhere
        return False
    return paid in bitcoin_scripts
