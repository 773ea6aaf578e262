"""Key custody for the signer: load the seed, derive account keys, release private keys inward.

What lives here and nowhere else:
- the BIP39 seed, read from a file or an environment variable, held in a `Secret` whose repr,
  str and format are redacted and which refuses to be pickled, so it cannot reach a log line,
  an exception message or a database row by accident;
- the account-level extended private keys derived from it.

What leaves: account-level extended PUBLIC keys (`SignerKeys.account_xpub`) for custody to
derive deposit addresses from, the master fingerprint (public; it labels descriptors), and raw
private keys through `SignerKeys.private_key_for`, which only the signer's own signing code calls.

Tier -> derivation path (the tier is the BIP44/BIP84 account index):

| tier    | account | bitcoin (BIP84, P2WPKH)                  | ethereum (BIP44)   | private keys here |
| ---     | ---     | ---                                      | ---                | ---               |
| deposit | 0       | m/84'/c'/0'/change/index                 | m/44'/60'/0'/0/i   | yes (sweeps)      |
| hot     | 1       | m/84'/c'/1'/change/index                 | m/44'/60'/1'/0/i   | yes               |
| warm    | 2       | m/84'/c'/2'/change/index                 | m/44'/60'/2'/0/i   | yes               |
| cold    | 3       | m/84'/c'/3'/change/index                 | m/44'/60'/3'/0/i   | no: watch-only    |

c is the BIP44 coin type: 0 on mainnet, 1 on testnet and regtest (SLIP-44). Ethereum always
uses coin 60 (anvil and mainnet alike) and only the external chain (change 0).

Cold is watch-only (DESIGN.md 7): `private_key_for` refuses it even though a single dev/regtest
seed could derive it. In production the cold account's xpub should come from an offline seed and
be configured in custody's wallet table directly; the seed-derived cold xpub exists so regtest
and the test suite have a complete set of tiers from one seed.
"""
from __future__ import annotations

import os
import stat
from enum import StrEnum
from pathlib import Path
from typing import Generic, Mapping, NoReturn, TypeVar

from bip_utils import (
    Bip39MnemonicValidator,
    Bip39SeedGenerator,
    Bip44,
    Bip44Changes,
    Bip44Coins,
    Bip84,
    Bip84Coins,
)

from signer.errors import SignerError, SignerErrorCode

T = TypeVar("T")

# Where deployment puts the seed. The file is preferred: an environment variable is visible to
# anything that can read /proc/<pid>/environ of the signer, a 0600 file only to its owner.
SEED_FILE_ENV = "CUSTODY_SIGNER_SEED_FILE"
SEED_ENV = "CUSTODY_SIGNER_SEED"
# Optional BIP39 passphrase ("25th word"), always from the environment when used.
PASSPHRASE_ENV = "CUSTODY_SIGNER_PASSPHRASE"

# BIP32 allows 128..512-bit seeds.
_MIN_SEED_BYTES, _MAX_SEED_BYTES = 16, 64
_MAX_INDEX = 2**31 - 1
_REDACTED = "Secret(<redacted>)"


class Secret(Generic[T]):
    """A value that must never be printed, logged, pickled or persisted.

    `reveal()` is the only way to read it, which makes every read greppable. Python cannot wipe
    an immutable bytes object from memory, so this guards against accidental disclosure
    (logs, tracebacks, reprs, serialisers), not against an attacker who can read process memory.
    Error reporters that capture frame locals (Sentry's with_locals, pytest --showlocals) can
    still see the short-lived plain strings handed to bip-utils; keep them off in the signer.
    """

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def reveal(self) -> T:
        return self._value

    def __repr__(self) -> str:
        return _REDACTED

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        return _REDACTED

    def __reduce__(self) -> NoReturn:
        # pickle, copy.deepcopy-to-disk and multiprocessing would otherwise carry the value.
        raise TypeError("a Secret cannot be pickled")

    def __eq__(self, other: object) -> bool:
        # Equality would let a caller probe the value; compare revealed values explicitly.
        return self is other

    __hash__ = object.__hash__


class Chain(StrEnum):
    BITCOIN = "bitcoin"
    ETHEREUM = "ethereum"


class Tier(StrEnum):
    """Wallet tiers; each is its own BIP44/BIP84 account, see TIER_ACCOUNT."""

    DEPOSIT = "deposit"
    HOT = "hot"
    WARM = "warm"
    COLD = "cold"


TIER_ACCOUNT: Mapping[Tier, int] = {Tier.DEPOSIT: 0, Tier.HOT: 1, Tier.WARM: 2, Tier.COLD: 3}

# Tiers whose private keys this signer releases. Cold is watch-only by design.
SIGNING_TIERS: frozenset[Tier] = frozenset({Tier.DEPOSIT, Tier.HOT, Tier.WARM})

_BTC_COINS: Mapping[str, Bip84Coins] = {
    "mainnet": Bip84Coins.BITCOIN,
    "testnet": Bip84Coins.BITCOIN_TESTNET,
    "regtest": Bip84Coins.BITCOIN_REGTEST,
}


# --- loading the seed -------------------------------------------------------------------------


def seed_from_text(text: Secret[str], passphrase: Secret[str] | None = None) -> Secret[bytes]:
    """Turn a BIP39 mnemonic (English, checksum verified) or a hex seed into a BIP32 seed.

    A hex seed is used as-is (this is how the BIP32 test vectors are stated); the passphrase
    applies to mnemonics only.
    """
    raw = " ".join(text.reveal().split())  # tolerate newlines and repeated spaces in files
    if not raw:
        raise SignerError(SignerErrorCode.SEED_INVALID, "the seed is empty")
    if " " not in raw:
        return _hex_seed(raw)
    # Never chain the library's exception: its message can name the offending word.
    try:
        valid = Bip39MnemonicValidator().IsValid(raw)
    except Exception:
        valid = False
    if not valid:
        raise SignerError(SignerErrorCode.SEED_INVALID, "the mnemonic is not a valid BIP39 phrase")
    try:
        seed = Bip39SeedGenerator(raw).Generate(passphrase.reveal() if passphrase else "")
    except Exception:
        raise SignerError(SignerErrorCode.SEED_INVALID, "the mnemonic could not be expanded") from None
    return Secret(bytes(seed))


def _hex_seed(raw: str) -> Secret[bytes]:
    try:
        seed = bytes.fromhex(raw)
    except ValueError:
        raise SignerError(SignerErrorCode.SEED_INVALID, "a one-word seed must be hex") from None
    if not _MIN_SEED_BYTES <= len(seed) <= _MAX_SEED_BYTES:
        raise SignerError(
            SignerErrorCode.SEED_INVALID,
            f"a hex seed must be {_MIN_SEED_BYTES}-{_MAX_SEED_BYTES} bytes, got {len(seed)}",
        )
    return Secret(seed)


def read_seed_file(path: str | os.PathLike[str], *, require_owner_only: bool = True) -> Secret[str]:
    """Read a seed file's text. Refuses files that group or others can access (like ssh does)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if require_owner_only and mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SignerError(
                SignerErrorCode.SEED_FILE_PERMISSIONS_TOO_OPEN,
                f"{path} has mode {stat.S_IMODE(mode):o}; chmod 600 it",
            )
        return Secret(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SignerError(
            SignerErrorCode.SEED_FILE_UNREADABLE, f"{path}: {exc.strerror or type(exc).__name__}"
        ) from None


def load_seed(
    *,
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    require_owner_only: bool = True,
) -> Secret[bytes]:
    """Load the signer's seed: an explicit `path`, else $CUSTODY_SIGNER_SEED_FILE, else
    $CUSTODY_SIGNER_SEED (the mnemonic or hex itself). The optional BIP39 passphrase comes from
    $CUSTODY_SIGNER_PASSPHRASE. `environ` defaults to `os.environ`; tests pass a dict.
    """
    env = os.environ if environ is None else environ
    passphrase = Secret(env[PASSPHRASE_ENV]) if env.get(PASSPHRASE_ENV) else None
    file_path = path if path is not None else env.get(SEED_FILE_ENV)
    if file_path:
        text = read_seed_file(file_path, require_owner_only=require_owner_only)
    elif env.get(SEED_ENV):
        text = Secret(env[SEED_ENV])
    else:
        raise SignerError(
            SignerErrorCode.SEED_NOT_CONFIGURED, f"set {SEED_FILE_ENV} (preferred) or {SEED_ENV}"
        )
    return seed_from_text(text, passphrase)


# --- deriving keys ----------------------------------------------------------------------------


def _parse(enum: type[StrEnum], value: str, code: SignerErrorCode):
    try:
        return enum(value)
    except ValueError:
        raise SignerError(code, f"{value!r} is not one of {[m.value for m in enum]}") from None


class SignerKeys:
    """The signer's key tree for one bitcoin network (ethereum has no network in its path).

    Account-level private contexts are derived once, on construction, so the hardened
    derivations (the slow part) are not repeated per signature.
    """

    __slots__ = ("_network", "_fingerprint", "_accounts")

    def __init__(self, seed: Secret[bytes], bitcoin_network: str) -> None:
        if bitcoin_network not in _BTC_COINS:
            raise SignerError(
                SignerErrorCode.UNKNOWN_NETWORK, f"{bitcoin_network!r} is not one of {sorted(_BTC_COINS)}"
            )
        self._network = bitcoin_network
        try:
            btc_root = Bip84.FromSeed(seed.reveal(), _BTC_COINS[bitcoin_network])
            eth_root = Bip44.FromSeed(seed.reveal(), Bip44Coins.ETHEREUM)
        except Exception:
            raise SignerError(SignerErrorCode.SEED_INVALID, "the seed does not yield a master key") from None
        self._fingerprint = bytes(btc_root.Bip32Object().FingerPrint().ToBytes()).hex()
        btc_coin, eth_coin = btc_root.Purpose().Coin(), eth_root.Purpose().Coin()
        self._accounts = {
            (chain, tier): coin.Account(TIER_ACCOUNT[tier])
            for chain, coin in ((Chain.BITCOIN, btc_coin), (Chain.ETHEREUM, eth_coin))
            for tier in Tier
        }

    @classmethod
    def load(
        cls,
        bitcoin_network: str,
        *,
        path: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> SignerKeys:
        """`load_seed` then construct: the one call deployment makes."""
        return cls(load_seed(path=path, environ=environ), bitcoin_network)

    def __repr__(self) -> str:
        return f"SignerKeys(bitcoin_network={self._network!r}, master_fingerprint={self._fingerprint!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("SignerKeys cannot be pickled")

    @property
    def bitcoin_network(self) -> str:
        return self._network

    @property
    def master_fingerprint(self) -> str:
        """The BIP32 master key fingerprint (8 hex digits); public, used in key origins."""
        return self._fingerprint

    def derivation_path(self, chain: str, tier: str, change: int | None = None, index: int | None = None) -> str:
        """The path of an account (no change/index) or of one key, e.g. m/84'/1'/1'/0/7."""
        chain_, tier_ = self._chain_tier(chain, tier)
        if chain_ is Chain.BITCOIN:
            coin = 0 if self._network == "mainnet" else 1
            path = f"m/84'/{coin}'/{TIER_ACCOUNT[tier_]}'"
        else:
            path = f"m/44'/60'/{TIER_ACCOUNT[tier_]}'"
        if change is None and index is None:
            return path
        self._check_child(chain_, change, index)
        return f"{path}/{change}/{index}"

    def account_xpub(self, chain: str, tier: str) -> str:
        """The account-level extended public key custody derives addresses from.

        Bitcoin keys serialise as BIP84 zpub (mainnet) or vpub (testnet/regtest); ethereum
        keys as xpub. `custody.addresses` accepts these directly.
        """
        return self._accounts[self._chain_tier(chain, tier)].PublicKey().ToExtended()

    def private_key_for(self, chain: str, tier: str, change: int, index: int) -> bytes:
        """The raw 32-byte secp256k1 private key at <account>/<change>/<index>.

        For the signer's signing code only; never log, return over an API or persist it.
        Refuses watch-only tiers.
        """
        chain_, tier_ = self._chain_tier(chain, tier)
        if tier_ not in SIGNING_TIERS:
            raise SignerError(SignerErrorCode.TIER_WATCH_ONLY, f"{tier_.value} keys are not held by the signer")
        self._check_child(chain_, change, index)
        branch = Bip44Changes.CHAIN_EXT if change == 0 else Bip44Changes.CHAIN_INT
        node = self._accounts[(chain_, tier_)].Change(branch).AddressIndex(index)
        return bytes(node.PrivateKey().Raw().ToBytes())

    @staticmethod
    def _chain_tier(chain: str, tier: str) -> tuple[Chain, Tier]:
        return (
            _parse(Chain, chain, SignerErrorCode.UNKNOWN_CHAIN),
            _parse(Tier, tier, SignerErrorCode.UNKNOWN_TIER),
        )

    @staticmethod
    def _check_child(chain: Chain, change: int | None, index: int | None) -> None:
        # Ethereum accounts use the external chain only; a change key there would be an
        # address custody never hands out, so signing for it is a bug.
        allowed_changes = (0, 1) if chain is Chain.BITCOIN else (0,)
        if type(change) is not int or change not in allowed_changes:
            raise SignerError(
                SignerErrorCode.INVALID_DERIVATION_INDEX, f"change must be one of {allowed_changes} on {chain.value}"
            )
        if type(index) is not int or not 0 <= index <= _MAX_INDEX:
            raise SignerError(SignerErrorCode.INVALID_DERIVATION_INDEX, f"index must be an int in 0..{_MAX_INDEX}")
