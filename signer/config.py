"""The signer process's configuration: a TOML file given by path, overridden by `SIGNER_*` env.

`load_config(path)` reads and validates it; any unknown key (a typo), missing key or bad value is
a `ConfigError` naming the key, raised at start and never later. Relative file paths in the TOML
are relative to the TOML file's directory. `build_signer(cfg)` makes the database engine and the
`signer.service.Signer`; `load_keys(cfg)` loads the seed (the only place the process does).

| key | type | default | meaning |
| --- | --- | --- | --- |
| network | regtest, testnet, signet, mainnet | required | the bitcoin network (signet uses testnet's keys and addresses: coin 1, `tb`) |
| seed_file | path | required | the BIP39 mnemonic (or hex seed); refused if group or others can access it (signer.keys) |
| database_url | PostgreSQL URL | required | read as the signer's own role (`custody_signer` in deployment): reads what it checks, writes `signer_audit` |
| listen | `unix:/abs/path` or `tcp:127.0.0.1:PORT` | required | the socket custody's worker calls; non-loopback TCP is refused |
| clients | array of tables | required (1+) | {name, auth_key_file, methods}: who may call, each with its own key (hex of a 32+ byte secret, mode 0600, signer.wire.read_auth_key) and the methods of signer.wire.METHODS it may call; deployed: `worker` all of them, `api` ping, xpubs, sign_reserves_message |
| approvers | array of tables | [] | {key_id, operator, scheme = "ed25519" or "webauthn", public_key (base64), rp_id?, origin?}: the only keys whose approval signatures count; none means no approval is valid |
| quorum | table | required | {ASSET = [[limit, approvals], ...]} in minor units: approvals an amount up to `limit` needs (`quorum_entries(policy)` writes it from a PolicySet) |
| max_fee_rate_sat_per_kvb | int | 500000 | no bitcoin transaction is signed at a higher fee rate |
| max_eth_fee_wei | int | 10**17 | no ethereum transaction may spend more than gas x max fee |
| deposit_window, receive_window, change_window | int | 10000, 20, 1000 | how many of its own addresses the signer refuses as destinations (signer.own_addresses) |
| assets | table | {BTC = {chain = "bitcoin"}} | {SYMBOL = {chain = "bitcoin" or "ethereum", contract? (ERC-20, EIP-55), decimals?}}: the only assets the signer pays and what paying them means; the token contract comes from here, never from `chain_asset` (signer.assets) |
| ethereum_chain_id | int | none | the only chain id the signer signs ethereum transactions for; required when `assets` has an ethereum asset; none: no ethereum transaction is signed |
| rebalance_quorum | int | 2 | distinct operators whose signed approvals (`rebalance-approval`, verified against `approvers`) a warm -> hot refill needs; the larger of this and the row's own count applies |
| cold_xpubs | table | {} | {bitcoin = "vpub..." / "zpub..."}: the cold wallet's BIP84 account PUBLIC key a hot -> cold rebalance must pay (never read from custody's `wallet` table); none: every rebalance is refused (`destination_not_cold`) |
| cold_addresses | table | {} | {ethereum = "0x..."}: the checksummed cold ETHEREUM address an ethereum hot -> cold rebalance must pay (custody.eth_rebalances; never read from custody); none: every ethereum rebalance to cold is refused (`destination_not_cold`) |
| unapproved_limit | table | regtest: none (no cap); other networks: 0 for every asset | {SYMBOL = {amount, window_secs}}: minor units the signer signs for withdrawals with NO valid approval per sliding window (from its own `signer_signature`); an asset not listed has cap 0, so every withdrawal of it needs an approval; `amount` may be a string of digits (beyond TOML's 64-bit integers) |

`quorum` is required on every network: the signer computes each withdrawal's quorum itself and
never takes it from custody (and the signer imports nothing from custody, whose development
policy lives in `custody.policy_config`); whoever writes the file for regtest writes
`quorum_entries(default_policy())`. Environment: `SIGNER_<KEY>` overrides the file's key (`clients`,
`approvers` and `quorum` as JSON).

`clients` is checked at load: names distinct (1-64 of a-z, 0-9, `_`, `-`), every method one of the
wire's method table (a typo fails at start, never later as a refused call), at least one method
each. `client_grants()` reads the keys; two clients with the same key are refused (a key is the
client's identity: a shared one would let either call the other's methods).

`unapproved_limit` unset on a network other than regtest means a cap of 0 for every asset: a
withdrawal the quorum table lets through with no approval is still refused
(`unapproved_limit_reached`) until the operator writes how much may leave unapproved per window;
the signer logs this at start. An ethereum asset without `ethereum_chain_id`, a contract that is not
EIP-55, a cold key that is not a public BIP84 key of the network, or an `unapproved_limit` asset not
in `assets` fails at load.
"""
from __future__ import annotations

import base64
import binascii
import logging
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from signer.own_addresses import CHANGE_WINDOW, DEPOSIT_WINDOW, RECEIVE_WINDOW
from signer.wire import CLIENT_NAME, METHODS, ClientGrant, Endpoint, parse_endpoint, read_auth_key

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from policies import PolicySet
    from signer.keys import SignerKeys
    from signer.service import Signer

log = logging.getLogger(__name__)
# The clients a deployment gives the signer (custody.launch writes them): the worker signs everything
# custody's jobs sign; the api only publishes proof of reserves and reads public keys.
DEPLOYED_CLIENTS: dict[str, tuple[str, ...]] = {
    "worker": tuple(METHODS),
    "api": ("ping", "xpubs", "sign_reserves_message"),
}
KEYS_NETWORK = {"regtest": "regtest", "testnet": "testnet", "signet": "testnet", "mainnet": "mainnet"}


class ConfigError(Exception):
    """The signer's configuration is unusable; the message names the key and why (never a secret)."""


def _no_float(v: Any) -> Any:
    if isinstance(v, float):
        raise ValueError("must be an integer (never a float)")
    return v


Int = Annotated[int, BeforeValidator(_no_float)]


class ApproverEntry(BaseModel):
    """One approver public key as the TOML writes it (handed to signer.approvals.ApproverRegistry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_id: str = Field(min_length=1)
    operator: str = Field(min_length=1)
    scheme: Literal["ed25519", "webauthn"]
    public_key: str
    rp_id: str | None = None
    origin: str | None = None

    @field_validator("public_key")
    @classmethod
    def _base64(cls, v: str) -> str:
        try:
            base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("public_key must be base64") from None
        return v

    @model_validator(mode="after")
    def _webauthn_needs_origin(self) -> ApproverEntry:
        if self.scheme == "webauthn" and not (self.rp_id and self.origin):
            raise ValueError(f"approver {self.key_id}: a webauthn key needs rp_id and origin")
        return self


class ClientEntry(BaseModel):
    """One caller of the signer as the TOML writes it: [[clients]] name, auth_key_file, methods."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    auth_key_file: Path
    methods: list[str] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not CLIENT_NAME.fullmatch(v):
            raise ValueError(f"client name {v!r}: 1-64 of a-z, 0-9, '_', '-', starting with a letter")
        return v

    @field_validator("methods")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; the signer's methods are {sorted(METHODS)}")
        if len(set(v)) != len(v):
            raise ValueError(f"methods listed twice: {sorted({m for m in v if v.count(m) > 1})}")
        return v


class AssetEntry(BaseModel):
    """One asset the signer pays, as the TOML writes it (handed to signer.assets.assets_from_entries)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chain: Literal["bitcoin", "ethereum"]
    contract: str | None = None
    decimals: Int | None = Field(default=None, ge=0, le=77)


def _minor_units(v: Any) -> Any:
    """An amount in minor units: an int, or a string of digits (TOML integers stop at 2**63)."""
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return _no_float(v)


class UnapprovedLimitEntry(BaseModel):
    """`unapproved_limit.SYMBOL`: minor units signed without approvals per sliding window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    amount: Annotated[int, BeforeValidator(_minor_units)] = Field(ge=0)
    window_secs: Int = Field(gt=0, le=366 * 86_400)


class SignerConfig(BaseSettings):
    """The module table, validated. Construct with `load_config(path)`."""

    model_config = SettingsConfigDict(env_prefix="SIGNER_", case_sensitive=False, extra="forbid", frozen=True)

    network: Literal["regtest", "testnet", "signet", "mainnet"]
    seed_file: Path
    database_url: str
    listen: str
    clients: list[ClientEntry] = Field(min_length=1)
    approvers: list[ApproverEntry] = []
    quorum: dict[str, list[tuple[Int, Int]]]
    max_fee_rate_sat_per_kvb: Int = Field(default=500_000, gt=0)
    max_eth_fee_wei: Int = Field(default=10**17, gt=0)
    deposit_window: Int = Field(default=DEPOSIT_WINDOW, ge=1, le=1_000_000)
    receive_window: Int = Field(default=RECEIVE_WINDOW, ge=1, le=1_000_000)
    change_window: Int = Field(default=CHANGE_WINDOW, ge=1, le=1_000_000)
    assets: dict[str, AssetEntry] = {"BTC": AssetEntry(chain="bitcoin")}
    ethereum_chain_id: Int | None = Field(default=None, gt=0)
    cold_xpubs: dict[Literal["bitcoin"], str] = {}
    cold_addresses: dict[Literal["ethereum"], str] = {}
    rebalance_quorum: Int = Field(default=2, ge=1, le=100)
    unapproved_limit: dict[str, UnapprovedLimitEntry] | None = None

    @classmethod
    def settings_customise_sources(cls, settings_cls: Any, init_settings: Any, env_settings: Any,
                                   dotenv_settings: Any, file_secret_settings: Any) -> tuple[Any, ...]:
        return (env_settings, init_settings)  # the environment overrides the file (passed as init values)

    @field_validator("database_url")
    @classmethod
    def _postgres(cls, v: str) -> str:
        if not v.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ValueError("must be a PostgreSQL URL (postgresql://ROLE@HOST:PORT/DB)")
        return v

    @field_validator("listen")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        parse_endpoint(v)
        return v

    @field_validator("clients")
    @classmethod
    def _distinct_clients(cls, v: list[ClientEntry]) -> list[ClientEntry]:
        names = [c.name for c in v]
        if len(set(names)) != len(names):
            raise ValueError(f"client names must be distinct: {sorted(n for n in set(names) if names.count(n) > 1)}")
        return v

    @field_validator("approvers")
    @classmethod
    def _distinct_keys(cls, v: list[ApproverEntry]) -> list[ApproverEntry]:
        ids = [a.key_id for a in v]
        if len(set(ids)) != len(ids):
            raise ValueError(f"approver key_id values must be distinct: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
        return v

    @field_validator("quorum")
    @classmethod
    def _tiers(cls, v: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
        if not v:
            raise ValueError("at least one asset: {ASSET = [[limit, approvals], ...]}")
        for asset, tiers in v.items():
            if not tiers:
                raise ValueError(f"{asset}: at least one [limit, approvals] tier")
            limits = [limit for limit, _ in tiers]
            if any(limit <= 0 for limit in limits) or limits != sorted(set(limits)):
                raise ValueError(f"{asset}: limits must be positive and strictly increasing")
            if any(n < 0 for _, n in tiers):
                raise ValueError(f"{asset}: approvals must be >= 0")
        return v

    @field_validator("assets")
    @classmethod
    def _assets(cls, v: dict[str, AssetEntry]) -> dict[str, AssetEntry]:
        from signer.assets import assets_from_entries

        assets_from_entries({k: a.model_dump(exclude_none=True) for k, a in v.items()})  # ValueError naming the asset
        return v

    @model_validator(mode="after")
    def _boundary_consistent(self) -> SignerConfig:
        if any(a.chain == "ethereum" for a in self.assets.values()) and self.ethereum_chain_id is None:
            raise ValueError("ethereum_chain_id: required when assets has an ethereum asset")
        for chain, xpub in self.cold_xpubs.items():
            problem = _cold_key_problem(xpub, self.bitcoin_network)
            if problem:
                raise ValueError(f"cold_xpubs.{chain}: {problem}")
        for chain, address in self.cold_addresses.items():
            from eth_utils import is_checksum_address

            if not is_checksum_address(address):
                raise ValueError(f"cold_addresses.{chain}: not a checksummed ethereum address")
        unknown = sorted(set(self.unapproved_limit or {}) - set(self.assets))
        if unknown:
            raise ValueError(f"unapproved_limit: {unknown} not in assets")
        return self

    @property
    def endpoint(self) -> Endpoint:
        return parse_endpoint(self.listen)

    @property
    def bitcoin_network(self) -> str:
        """The network name signer.keys and signer.bitcoin_tx know (signet signs as testnet)."""
        return KEYS_NETWORK[self.network]

    @property
    def sqlalchemy_url(self) -> str:
        scheme, rest = self.database_url.split("://", 1)
        return "postgresql+psycopg://" + rest

    def client_grants(self) -> list[ClientGrant]:
        """Each client with its key (ConfigError naming the client if a key file is missing, too
        open, not hex or short, or if two clients share a key)."""
        grants: list[ClientGrant] = []
        for entry in self.clients:
            try:
                key = read_auth_key(entry.auth_key_file)
            except ValueError as exc:
                raise ConfigError(f"clients.{entry.name}.auth_key_file: {exc}") from None
            for other in grants:
                if other.key == key:
                    raise ConfigError(f"clients.{entry.name}.auth_key_file: the same key as client {other.name}'s; "
                                      "each client needs its own key (a key is the client's identity)")
            grants.append(ClientGrant(entry.name, key, frozenset(entry.methods)))
        return grants


def load_config(path: str | Path) -> SignerConfig:
    """Read and validate the TOML at `path` (plus SIGNER_* env); ConfigError naming each bad key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror or type(exc).__name__})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    if "auth_key_file" in data:
        raise ConfigError(f"{path}: auth_key_file: the one shared key is replaced by one key per client: "
                          "[[clients]] name = \"worker\", auth_key_file = \"...\", methods = [...] (see signer.config)")
    for key in ("seed_file",):
        if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
            data[key] = str(path.parent / data[key])
    for client in data.get("clients") or []:
        if isinstance(client, dict) and isinstance(client.get("auth_key_file"), str) and \
                not Path(client["auth_key_file"]).is_absolute():
            client["auth_key_file"] = str(path.parent / client["auth_key_file"])
    try:
        return SignerConfig(**data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: "
                             f"{'unknown key (a typo?)' if e['type'] == 'extra_forbidden' else e['msg'].removeprefix('Value error, ')}"
                             for e in exc.errors())
        raise ConfigError(f"{path}: {problems}") from None


def load_keys(cfg: SignerConfig) -> SignerKeys:
    """Load the seed from `cfg.seed_file` (signer.keys refuses a file group or others can access)."""
    from signer.keys import SignerKeys

    return SignerKeys.load(cfg.bitcoin_network, path=cfg.seed_file)


def make_engine(cfg: SignerConfig) -> Engine:
    """A small pool: requests are few and each holds one connection while it checks."""
    from sqlalchemy import create_engine

    return create_engine(cfg.sqlalchemy_url, pool_size=4, max_overflow=4, pool_pre_ping=True, pool_recycle=1800)


def approval_arguments(cfg: SignerConfig) -> dict[str, Any]:
    """`approvers=` and `quorum=` for the Signer, from the config (signer.approvals)."""
    import signer.approvals as approvals

    try:
        registry = approvals.ApproverRegistry.from_entries([a.model_dump(exclude_none=True) for a in cfg.approvers])
    except Exception as exc:  # noqa: BLE001 - reported as the config key it came from
        raise ConfigError(f"approvers: {exc}") from None
    try:
        quorum = approvals.QuorumTable.from_entries({k: [list(t) for t in v] for k, v in cfg.quorum.items()})
    except Exception as exc:  # noqa: BLE001 - reported as the config key it came from
        raise ConfigError(f"quorum: {exc}") from None
    if not cfg.approvers:
        log.warning("no approvers configured: only withdrawals that need no approval can be signed")
    return {"approvers": registry, "quorum": quorum}


def quorum_entries(policy: PolicySet) -> dict[str, list[list[int]]]:
    """The `quorum` table of a PolicySet's amount tiers, as the TOML writes it (for whoever writes
    the signer's file from custody's policy). ValueError for an unbounded tier: TOML has no way to
    write an unbounded limit, so every limit is named."""
    out: dict[str, list[list[int]]] = {}
    for asset, rules in sorted(policy.assets.items()):
        if any(t.up_to is None for t in rules.tiers):
            raise ValueError(f"{asset}: an unbounded amount tier cannot be written as a signer quorum limit")
        out[asset] = [[int(t.up_to), int(t.approvals)] for t in rules.tiers]  # type: ignore[arg-type]
    return out


def _cold_key_problem(xpub: str, network: str) -> str | None:
    """Why `xpub` is not a BIP84 account PUBLIC key of `network` (None: it is)."""
    from bip_utils import Bip84, Bip84Coins

    coin = {"regtest": Bip84Coins.BITCOIN_REGTEST, "testnet": Bip84Coins.BITCOIN_TESTNET}.get(network, Bip84Coins.BITCOIN)
    try:
        account = Bip84.FromExtendedKey(xpub, coin)
    except Exception:  # noqa: BLE001 - any parse failure is the same answer
        return f"not a BIP84 extended key of {network}"
    return "a PRIVATE key: the cold wallet is watch-only, give its public key" if not account.IsPublicOnly() else None


def boundary_arguments(cfg: SignerConfig) -> dict[str, Any]:
    """`assets=`, `ethereum_chain_id=`, `cold_xpubs=` and `unapproved_limits=` for the Signer, from
    the config (module table: an unset `unapproved_limit` is no cap on regtest, cap 0 elsewhere)."""
    from signer.assets import UnapprovedLimit, assets_from_entries

    assets = assets_from_entries({k: a.model_dump(exclude_none=True) for k, a in cfg.assets.items()})
    if cfg.unapproved_limit is None:
        limits = None if cfg.network == "regtest" else {}
        if limits is not None:
            log.warning("no unapproved_limit on %s: every withdrawal needs a valid approval to be signed", cfg.network)
    else:
        limits = {k: UnapprovedLimit(v.amount, v.window_secs) for k, v in cfg.unapproved_limit.items()}
    if not cfg.cold_xpubs:
        log.warning("no cold_xpubs configured: every rebalance is refused")
    return {"assets": assets, "ethereum_chain_id": cfg.ethereum_chain_id, "cold_xpubs": dict(cfg.cold_xpubs),
            "unapproved_limits": limits, **({"cold_addresses": dict(cfg.cold_addresses)} if cfg.cold_addresses else {})}


def build_signer(cfg: SignerConfig, *, keys: SignerKeys | None = None, engine: Engine | None = None) -> Signer:
    """The Signer the process serves: its keys (loaded here unless given), its engine, its limits."""
    from signer.service import Signer

    return Signer(engine or make_engine(cfg), keys or load_keys(cfg), bitcoin_network=cfg.bitcoin_network,
                  max_fee_rate_sat_per_kvb=cfg.max_fee_rate_sat_per_kvb, max_eth_fee_wei=cfg.max_eth_fee_wei,
                  deposit_window=cfg.deposit_window, receive_window=cfg.receive_window,
                  change_window=cfg.change_window, rebalance_quorum=cfg.rebalance_quorum, **approval_arguments(cfg),
                  **boundary_arguments(cfg))
