"""The deployment configuration of the custody processes (`custody api`, `custody worker`): one TOML
file plus environment overrides, validated completely at start so that a typo or an inconsistency
stops the process before it touches a node or the database, naming the key and the file.

    config = DeploymentConfig.load("custody.toml")     # or CUSTODY_CONFIG=custody.toml
    config.settings          # custody.settings.Settings (API_KEY_PEPPER, STATE_DIR, ...) with the
                             # database URL and API address of this file
    config.assets["BTC"].withdrawal_fee                # int, minor units

Guarantees:
- Unknown keys are refused everywhere: in the file (`extra="forbid"` on every section) and in the
  environment (a `CUSTODY_*` variable that names no setting is refused, `CUSTODY_CONFIG` aside).
- Every amount is an `int` of the asset's minor unit. A float (`0.5`), a string with a decimal
  point or exponent (`"0.5"`, `"1e8"`) or a boolean is refused; a string of digits is accepted
  (TOML integers stop at 2^63 - 1; larger wei amounts are written `"1000000000000000000000"`).
- Custody never holds key material: a private extended key (xprv, tprv, zprv, vprv, ...) given
  as a wallet is refused without echoing it.
- The file is read once; the bitcoind cookie named here is read at connect time (bitcoind writes
  a new one at each start), and the signer's auth key file when the signer client is built.
- Each process speaks to the signer as its own client with its own key: the signer's config says
  which methods each client may call (deployed: `worker` every method, `api` ping, xpubs and
  sign_reserves_message), so the api process cannot even ask for a payout to be signed.

Environment overrides: `CUSTODY_<SECTION>__<KEY>` (double underscore between levels) wins over
the file, e.g. `CUSTODY_DATABASE__URL`, `CUSTODY_BITCOIN__RPC_PASSWORD`,
`CUSTODY_ASSETS__BTC__WITHDRAWAL_FEE`. Keep secrets there rather than in the file. The service's
own settings (`ENVIRONMENT`, `API_KEY_PEPPER`, `STATE_DIR`, `TREASURY_ADJUSTMENT_QUORUM`, and
`DATABASE_URL` / `API_HOST` / `API_PORT` when the file leaves them out) stay in
`custody.settings.Settings`, read from the environment as before.

| section | key | default | meaning |
| --- | --- | --- | --- |
| database | url | `DATABASE_URL` | PostgreSQL URL, with this process's own role (custody_api / custody_worker); `CUSTODY_API_DATABASE_URL` / `CUSTODY_WORKER_DATABASE_URL` override it per process |
| api | host, port | `API_HOST` / `API_PORT` | where `custody api` listens |
| bitcoin | rpc_url | required | bitcoind JSON-RPC URL (`user:password@` in it counts as rpc_user + rpc_password) |
| bitcoin | network | required | regtest, signet, testnet or mainnet: must be the node's chain |
| bitcoin | cookie_file | - | bitcoind's `.cookie`; or rpc_user + rpc_password, or both in rpc_url (exactly one scheme) |
| bitcoin | node_view_lookahead | 1000 | how far past the highest issued index each range of the node's watch-only wallet reaches (custody.node_view; widened when half is left) |
| ethereum | rpc_url, chain_id | required | node URL; its `eth_chainId` (1, 11155111, 17000 or 31337) |
| ethereum.tokens | SYMBOL | - | ERC-20 contract address of each ethereum asset other than ETH |
| assets.SYMBOL | chain, decimals, finality | required | bitcoin/ethereum; 0..36; confirmations before a credit |
| assets.SYMBOL | dust_minimum, min_withdrawal, withdrawal_fee | required | minor units |
| assets.SYMBOL | withdrawal_fee_fast | withdrawal_fee | minor units, fast priority |
| wallets.CHAIN | deposit, hot | required | account xpubs from `python -m signer xpubs` |
| wallets.CHAIN | warm | - | warm account xpub (`python -m signer xpubs`; the signer holds its key): hot above its ceiling may go there, refills come from it |
| wallets.CHAIN | cold | - | watch-only cold account xpub (rebalances need it) |
| wallets.bitcoin | hot_fingerprint, cold_fingerprint | - (the account xpub's own) | 8 hex digits: the master fingerprint of that account key's origin (`[fp/84h/<coin>h/<account>h]`), from which a cold -> hot PSBT states its BIP32 derivations (custody.psbt); without it they are relative to the account xpub, which Bitcoin Core signs with but a hardware wallet does not recognise |
| signer | endpoint | required | `unix:/abs/path.sock` or `tcp:127.0.0.1:PORT` (loopback only) |
| signer | client | required | this process's client name in the signer's `[[clients]]`; `CUSTODY_API_SIGNER_CLIENT` / `CUSTODY_WORKER_SIGNER_CLIENT` override it per process |
| signer | auth_key_file | required | that client's own auth key (hex, mode 600); `CUSTODY_API_SIGNER_AUTH_KEY_FILE` / `CUSTODY_WORKER_SIGNER_AUTH_KEY_FILE` override it per process |
| approvers | (list) | [] | the signer's approver keys, for early feedback at the API only |
| jobs | scale | 1.0 | multiplies every job interval (custody.jobs) |
| treasury | ceiling, target | 50 BTC, 20 BTC | satoshis: hot spendable above `ceiling` moves everything over `target` out of hot (custody.rebalances) |
| treasury | floor | - | satoshis, below `target`: hot below it is refilled from warm up to `target` (needs a `warm` wallet and a quorum) |
| treasury | excess_to | cold | where hot's excess goes: `warm` or `cold` |
| treasury | refill_quorum | 2 | distinct operators whose signed approvals a refill waits for (the signer applies its own `rebalance_quorum` too) |
| treasury | psbt_min_fee_rate_sat_per_kvb, psbt_max_fee_rate_sat_per_kvb | 1000, 100000 | the fee-rate bounds of a cold -> hot PSBT, built and imported |
| treasury | stuck_blocks, bump_percent, max_fee_rate_sat_per_kvb | 3, 50, 500000 | when a sweep or rebalance is fee-bumped, by how much, up to what (custody.firm_moves; the first two also for ethereum, custody.eth_moves, where bump_percent is at least 10) |
| treasury | ethereum_bump_max_fee_wei | 500000000000 | the highest max fee per gas a same-nonce replacement of an ethereum gas funding, sweep or rebalance offers (custody.eth_moves) |
| treasury | ethereum_sweep_bump_reserve_percent | 100 | gas money an ethereum sweep keeps for its bumps: its deposit address is funded (token) or keeps back (ether) gas limit x max fee x (100 + this) / 100, at most gas limit x `ethereum_bump_max_fee_wei`; 0: a sweep is bumped only as far as what its address already holds allows (custody.eth_sweeps) |
| treasury.ethereum.SYMBOL | ceiling, target, floor, excess_to | - (no ethereum rebalance) | wei or token base units, floor < target < ceiling: the hot address above `ceiling` sends everything over `target` to `warm` or `cold` (default cold); below `floor` (when set) warm refills it up to `target` once `refill_quorum` operators signed (custody.eth_rebalances) |
| treasury | ethereum_cold_address | - | the checksummed cold ethereum address (watch-only, reconciled); the signer pins its own copy (`cold_addresses`) and refuses any other |
| events | sink | jetstream | where the worker's outbox dispatcher delivers events: `jetstream` (custody.broker) or `log` (a log line per event, no broker) |
| events | nats_url | `NATS_URL` | the NATS server (`nats://host:port`); neither set: the embedded server in `STATE_DIR/nats` |
| events | stream | CUSTODY | the JetStream stream (subjects `<subject_prefix>.>`), created or updated at start |
| events | subject_prefix | custody | events are published on `<subject_prefix>.<type>`; a second deployment on the same NATS server needs its own stream and prefix (streams may not share subjects) |
| events | duplicate_window_s | 120 | seconds within which JetStream drops a redelivered event (same `Nats-Msg-Id`) |

Errors: `ConfigError`, whose message has one line per problem, `<file>: <key path>: <what>`.
"""
from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from custody.settings import Settings
from signer.approvals import ApproverRegistry

ENV_PREFIX = "CUSTODY_"
CONFIG_ENV = "CUSTODY_CONFIG"
# a process's own database URL, when one file serves both processes (see `DeploymentConfig.load`)
PROCESS_DATABASE_ENV: dict[str, str] = {"api": "CUSTODY_API_DATABASE_URL", "worker": "CUSTODY_WORKER_DATABASE_URL"}
# a process's own signer client and key, likewise: {process: {[signer] key: variable}}
PROCESS_SIGNER_ENV: dict[str, dict[str, str]] = {
    p: {"client": f"CUSTODY_{p.upper()}_SIGNER_CLIENT", "auth_key_file": f"CUSTODY_{p.upper()}_SIGNER_AUTH_KEY_FILE"}
    for p in ("api", "worker")}
PROCESS_ENV = frozenset([*PROCESS_DATABASE_ENV.values(), *(v for m in PROCESS_SIGNER_ENV.values() for v in m.values())])
BitcoinNetwork = Literal["regtest", "signet", "testnet", "mainnet"]
Chain = Literal["bitcoin", "ethereum"]
NATIVE_ASSET: dict[str, str] = {"bitcoin": "BTC", "ethereum": "ETH"}
# the ethereum adapter's networks by chain id (chain_adapters.ethereum.NETWORKS)
ETHEREUM_CHAIN_IDS: dict[int, str] = {1: "mainnet", 11155111: "sepolia", 17000: "holesky", 31337: "regtest"}
# bitcoind's `getblockchaininfo.chain` for each network
BITCOIN_CHAIN_NAMES: dict[str, str] = {"mainnet": "main", "testnet": "test", "signet": "signet", "regtest": "regtest"}
_ASSET_CODE = re.compile(r"[A-Z0-9_.\-]{1,32}")
_DIGITS = re.compile(r"[0-9]+(?:_[0-9]+)*")

# SLIP-132 version bytes of extended keys. Private ones are recognised only to refuse them.
_PRIVATE_VERSIONS = {bytes.fromhex(h): name for h, name in (
    ("0488ade4", "xprv"), ("049d7878", "yprv"), ("04b2430c", "zprv"), ("0295b005", "Yprv"), ("02aa7a99", "Zprv"),
    ("04358394", "tprv"), ("044a4e28", "uprv"), ("045f18bc", "vprv"), ("024285b5", "Uprv"), ("02575048", "Vprv"))}
_MAINNET_PUBLIC = {bytes.fromhex("0488b21e"): "xpub", bytes.fromhex("04b24746"): "zpub"}
_TESTNET_PUBLIC = {bytes.fromhex("043587cf"): "tpub", bytes.fromhex("045f1cf6"): "vpub"}


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one `<file>: <key>: <what>` line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _integer(value: Any, why: str) -> Any:
    """Integers only: an int, or a string of digits (for values past TOML's 64-bit integers)."""
    if isinstance(value, bool):
        raise ValueError(f"must be an integer{why}, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        return int(value.strip().replace("_", ""))
    if isinstance(value, float):
        raise ValueError(f"must be an integer{why}; {value!r} is a float")
    if isinstance(value, str):
        raise ValueError(f"must be an integer{why}; {value!r} is not a whole number")
    raise ValueError(f"must be an integer{why}, got {type(value).__name__}")


_AMOUNT_WHY = " of minor units (satoshi, wei, token base units: no decimal point)"
Whole = Annotated[int, BeforeValidator(lambda v: _integer(v, ""))]
Amount = Annotated[int, BeforeValidator(lambda v: _integer(v, _AMOUNT_WHY)), Field(ge=0)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSection(Section):
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _postgres(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("postgresql://", "postgresql+psycopg://", "postgres://")):
            raise ValueError("must be a PostgreSQL URL (postgresql://role@host:port/database)")
        return url


class ApiSection(Section):
    host: str | None = None
    port: Annotated[Whole, Field(ge=1, le=65535)] | None = None


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise ValueError("must not carry credentials")
    return url


def _without_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(url without user:password@, user, password): regtest nodes hand out URLs with them in."""
    parts = urlsplit(url)
    if not parts.username:
        return url, None, None
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host)), unquote(parts.username), unquote(parts.password or "")


class BitcoinSection(Section):
    rpc_url: str
    network: BitcoinNetwork
    cookie_file: Path | None = None
    rpc_user: str | None = None
    rpc_password: SecretStr | None = None
    node_view_lookahead: Annotated[int, Field(ge=2, le=1_000_000)] = 1000

    @model_validator(mode="before")
    @classmethod
    def _credentials_from_url(cls, data: Any) -> Any:
        """`http://user:password@host:port` is read as rpc_user + rpc_password (the URL is then
        kept without them, so it can be shown); with rpc_user or rpc_password also set, refused."""
        if not isinstance(data, dict) or not isinstance(data.get("rpc_url"), str):
            return data
        url, user, password = _without_credentials(data["rpc_url"])
        if user is None:
            return data
        if data.get("rpc_user") is not None or data.get("rpc_password") is not None:
            raise ValueError("rpc_url carries a user and password and rpc_user/rpc_password are set too: give them once")
        return {**data, "rpc_url": url, "rpc_user": user, "rpc_password": password}

    @field_validator("rpc_url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _http_url(url)

    @model_validator(mode="after")
    def _one_auth(self) -> "BitcoinSection":
        userpass = self.rpc_user is not None or self.rpc_password is not None
        if self.cookie_file is not None and userpass:
            raise ValueError("give cookie_file or rpc_user + rpc_password, not both")
        if self.cookie_file is None and not userpass:
            raise ValueError("bitcoind needs authentication: cookie_file, or rpc_user + rpc_password")
        if userpass and (self.rpc_user is None or self.rpc_password is None):
            raise ValueError("rpc_user and rpc_password go together")
        return self

    @property
    def address_network(self) -> str:
        """The network custody derives and checks addresses for (custody.addresses, signer.bitcoin_tx):
        signet shares testnet's key versions and `tb` addresses."""
        return "testnet" if self.network == "signet" else self.network


class EthereumSection(Section):
    rpc_url: str
    chain_id: Annotated[Whole, Field(gt=0)]
    tokens: dict[str, str] = Field(default_factory=dict)

    @field_validator("rpc_url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _http_url(url)

    @field_validator("chain_id")
    @classmethod
    def _known_chain(cls, chain_id: int) -> int:
        if chain_id not in ETHEREUM_CHAIN_IDS:
            known = ", ".join(f"{i} ({n})" for i, n in ETHEREUM_CHAIN_IDS.items())
            raise ValueError(f"chain id {chain_id} is not one the ethereum adapter knows: {known}")
        return chain_id

    @field_validator("tokens")
    @classmethod
    def _addresses(cls, tokens: dict[str, str]) -> dict[str, str]:
        from eth_utils import is_checksum_address, to_checksum_address

        out = {}
        for symbol, address in tokens.items():
            if not isinstance(address, str) or not re.fullmatch(r"0x[0-9a-fA-F]{40}", address):
                raise ValueError(f"{symbol}: a contract address is 0x and 40 hex digits")
            if address[2:] not in (address[2:].lower(), address[2:].upper()) and not is_checksum_address(address):
                raise ValueError(f"{symbol}: {address} fails its EIP-55 checksum (a typo?)")
            out[symbol] = to_checksum_address(address)
        return out

    @property
    def network(self) -> str:
        """The adapter's network name for this chain id (chain_adapters.ethereum.NETWORKS)."""
        return ETHEREUM_CHAIN_IDS[self.chain_id]


class AssetSection(Section):
    chain: Chain
    decimals: Annotated[Whole, Field(ge=0, le=36)]
    finality: Annotated[Whole, Field(ge=1)]
    dust_minimum: Amount
    min_withdrawal: Annotated[Amount, Field(ge=1)]
    withdrawal_fee: Amount
    withdrawal_fee_fast: Amount | None = None


class WalletSection(Section):
    deposit: str
    hot: str
    warm: str | None = None
    cold: str | None = None
    # bitcoin: the master fingerprint of the hot / cold account key's origin (8 hex digits), when
    # known: a cold -> hot PSBT's BIP32 derivations then start at that master (custody.psbt)
    hot_fingerprint: str | None = None
    cold_fingerprint: str | None = None

    @field_validator("hot_fingerprint", "cold_fingerprint")
    @classmethod
    def _fingerprint(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{8}", value):
            raise ValueError("a master fingerprint is 8 hex digits (as in a descriptor's key origin [d34db33f/84h/0h/0h])")
        return value.lower() if value is not None else None

    def master_fingerprints(self) -> dict[str, str]:
        """tier -> master fingerprint, of the tiers that name one."""
        return {t: f for t, f in (("hot", self.hot_fingerprint), ("cold", self.cold_fingerprint)) if f is not None}

    def tiers(self) -> dict[str, str]:
        return {t: x for t, x in (("deposit", self.deposit), ("hot", self.hot), ("warm", self.warm), ("cold", self.cold))
                if x is not None}


class SignerSection(Section):
    endpoint: str
    client: str
    auth_key_file: Path

    @field_validator("client")
    @classmethod
    def _client_name(cls, name: str) -> str:
        from signer.wire import CLIENT_NAME

        if not CLIENT_NAME.fullmatch(name):
            raise ValueError("a client name is 1-64 of a-z, 0-9, '_', '-', starting with a letter (as in the signer's [[clients]])")
        return name

    @field_validator("endpoint")
    @classmethod
    def _local(cls, endpoint: str) -> str:
        kind, _, rest = endpoint.partition(":")
        if kind == "unix":
            if not rest.startswith("/"):
                raise ValueError("a unix endpoint is unix:/absolute/path.sock")
            return endpoint
        if kind == "tcp":
            host, _, port = rest.rpartition(":")
            if host.strip("[]") not in ("127.0.0.1", "::1", "localhost"):
                raise ValueError("the signer listens on loopback only: tcp:127.0.0.1:PORT")
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError("a tcp endpoint is tcp:127.0.0.1:PORT with PORT 1..65535")
            return endpoint
        raise ValueError("must be unix:/path/to.sock or tcp:127.0.0.1:PORT")

    def auth_key(self) -> bytes:
        """This client's authentication key: the file holds it as hex (`openssl rand -hex 32`), the
        same file format as the signer's (signer.wire.read_auth_key)."""
        problem = auth_key_problem(self.auth_key_file)
        if problem:
            raise ValueError(f"auth_key_file: {problem}")
        return bytes.fromhex(self.auth_key_file.read_text(encoding="ascii").strip())


AUTH_KEY_MIN_BYTES = 32


def auth_key_problem(path: Path) -> str | None:
    """Why the signer auth key file is unusable (never its content), or None."""
    try:
        mode = path.stat().st_mode
        raw = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path}: cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})"
    if mode & 0o077:
        return f"{path} has mode {mode & 0o777:o}; only its owner may read it (chmod 600)"
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        return f"{path}: the key is written as hex (e.g. `openssl rand -hex 32`)"
    if len(key) < AUTH_KEY_MIN_BYTES:
        return f"{path}: the key is {len(key)} bytes; at least {AUTH_KEY_MIN_BYTES} are required"
    return None


class ApproverEntry(Section):
    """One approver key, as in the signer's own configuration; checked by
    signer.approvals.ApproverRegistry (key length, COSE key, rp_id/origin) at load."""

    key_id: Annotated[str, Field(min_length=1, max_length=200)]
    operator: Annotated[str, Field(min_length=1, max_length=200)]
    scheme: Literal["ed25519", "webauthn"]
    public_key: str
    rp_id: str | None = None
    origin: str | None = None


class JobsSection(Section):
    scale: Annotated[float, Field(gt=0, le=100)] = 1.0


class EthTreasuryAsset(Section):
    """One ethereum asset's hot-address thresholds (custody.eth_rebalances); below `floor` warm refills hot."""

    ceiling: Amount
    target: Amount
    floor: Amount | None = None
    excess_to: Literal["warm", "cold"] = "cold"

    @model_validator(mode="after")
    def _ordered(self) -> "EthTreasuryAsset":
        if not (self.floor if self.floor is not None else -1) < self.target < self.ceiling:
            raise ValueError("floor < target < ceiling is required (target < ceiling without a floor)")
        return self


class TreasurySection(Section):
    """Thresholds of the bitcoin hot wallet and the treasury's fee rules (custody.rebalances, custody.firm_moves)."""

    ceiling: Amount = 50 * 100_000_000
    target: Amount = 20 * 100_000_000
    floor: Amount | None = None
    excess_to: Literal["warm", "cold"] = "cold"
    refill_quorum: Annotated[Whole, Field(ge=1, le=100)] = 2
    psbt_min_fee_rate_sat_per_kvb: Annotated[Whole, Field(ge=1)] = 1_000
    psbt_max_fee_rate_sat_per_kvb: Annotated[Whole, Field(ge=1)] = 100_000
    stuck_blocks: Annotated[Whole, Field(ge=1)] = 3
    bump_percent: Annotated[Whole, Field(ge=1, le=1000)] = 50
    max_fee_rate_sat_per_kvb: Annotated[Whole, Field(ge=1)] = 500_000
    ethereum_bump_max_fee_wei: Annotated[Whole, Field(ge=1)] = 500 * 10**9
    ethereum_sweep_bump_reserve_percent: Annotated[Whole, Field(ge=0, le=1000)] = 100
    ethereum: dict[str, EthTreasuryAsset] = Field(default_factory=dict)
    ethereum_cold_address: str | None = None

    @field_validator("ethereum_cold_address")
    @classmethod
    def _checksummed(cls, v: str | None) -> str | None:
        from eth_utils import is_checksum_address

        if v is not None and not is_checksum_address(v):
            raise ValueError("must be a checksummed ethereum address")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> "TreasurySection":
        if not (self.floor if self.floor is not None else -1) < self.target < self.ceiling:
            raise ValueError("floor < target < ceiling is required")
        if self.psbt_min_fee_rate_sat_per_kvb > self.psbt_max_fee_rate_sat_per_kvb:
            raise ValueError("psbt_min_fee_rate_sat_per_kvb must not be above psbt_max_fee_rate_sat_per_kvb")
        return self


class EventsSection(Section):
    sink: Literal["jetstream", "log"] = "jetstream"
    nats_url: str | None = None
    stream: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "CUSTODY"
    subject_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,3}$")] = "custody"
    duplicate_window_s: Annotated[float, Field(gt=0, le=86400)] = 120.0

    @field_validator("nats_url")
    @classmethod
    def _nats(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("nats://", "tls://")):
            raise ValueError("must be a nats:// or tls:// URL")
        return url


class DeploymentConfig(BaseSettings):
    """The whole file (see the module docstring); build it with `load()`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid",
                                      case_sensitive=False, frozen=True)

    database: DatabaseSection = Field(default_factory=DatabaseSection)
    api: ApiSection = Field(default_factory=ApiSection)
    bitcoin: BitcoinSection | None = None
    ethereum: EthereumSection | None = None
    assets: dict[str, AssetSection] = Field(default_factory=dict)
    wallets: dict[Chain, WalletSection] = Field(default_factory=dict)
    signer: SignerSection
    approvers: list[ApproverEntry] = Field(default_factory=list)
    jobs: JobsSection = Field(default_factory=JobsSection)
    events: EventsSection = Field(default_factory=EventsSection)
    treasury: TreasurySection = Field(default_factory=TreasurySection)

    _source: Path | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)
    _key_file_from: str | None = PrivateAttr(default=None)  # the variable that overrode [signer] auth_key_file
    _process: str | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return (env_settings, init_settings)  # the environment overrides the file; nothing else is read

    @model_validator(mode="before")
    @classmethod
    def _merge_symbols(cls, data: Any) -> Any:
        """Environment variables arrive lower-cased (`CUSTODY_ASSETS__BTC__...` -> `btc`): fold them
        onto the file's upper-case symbols, the environment winning."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data["assets"] = _fold_upper(data.get("assets"))
        if isinstance(data.get("ethereum"), dict) and "tokens" in data["ethereum"]:
            data["ethereum"] = {**data["ethereum"], "tokens": _fold_upper(data["ethereum"]["tokens"])}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "DeploymentConfig":
        problems = self.inconsistencies()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def inconsistencies(self) -> list[str]:
        """Cross-section checks, one `<key>: <what>` line each (empty: consistent)."""
        problems: list[str] = []
        chains = {c for c in ("bitcoin", "ethereum") if getattr(self, c) is not None}
        if not chains:
            problems.append("bitcoin, ethereum: configure at least one chain")
        tokens = self.ethereum.tokens if self.ethereum else {}
        for symbol, asset in self.assets.items():
            where = f"assets.{symbol}"
            if not _ASSET_CODE.fullmatch(symbol):
                problems.append(f"{where}: an asset symbol is 1-32 of A-Z, 0-9, '_', '.', '-'")
            if asset.chain not in chains:
                problems.append(f"{where}.chain: {asset.chain} has no [{asset.chain}] section")
            elif asset.chain == "bitcoin" and symbol != "BTC":
                problems.append(f"{where}: the bitcoin chain carries BTC only")
            elif asset.chain == "ethereum" and symbol != "ETH" and symbol not in tokens:
                problems.append(f"{where}: an ethereum asset other than ETH needs its contract in [ethereum.tokens] {symbol}")
            elif asset.chain == "ethereum" and symbol == "ETH" and "ETH" in tokens:
                problems.append("ethereum.tokens.ETH: ETH is the chain's native asset, not a token")
            if symbol in NATIVE_ASSET.values() and asset.chain != next(c for c, a in NATIVE_ASSET.items() if a == symbol):
                problems.append(f"{where}.chain: {symbol} is the native asset of another chain")
        for symbol in tokens:
            if symbol not in self.assets:
                problems.append(f"ethereum.tokens.{symbol}: no [assets.{symbol}] describes this token")
            elif self.assets[symbol].chain != "ethereum":
                problems.append(f"ethereum.tokens.{symbol}: [assets.{symbol}] is on {self.assets[symbol].chain}")
        for chain in sorted(chains):
            native = self.assets.get(NATIVE_ASSET[chain])
            if native is None or native.chain != chain:
                problems.append(f"assets.{NATIVE_ASSET[chain]}: the {chain} chain needs its native asset (network fees)")
            if chain not in self.wallets:
                problems.append(f"wallets.{chain}: the {chain} chain needs its wallets (deposit and hot xpubs)")
        for chain, wallet in self.wallets.items():
            if chain not in chains:
                problems.append(f"wallets.{chain}: there is no [{chain}] section")
                continue
            seen: dict[str, str] = {}
            for tier, key in wallet.tiers().items():
                where = f"wallets.{chain}.{tier}"
                problem = _key_problem(key, chain, self.bitcoin.network if self.bitcoin and chain == "bitcoin" else None)
                if problem:
                    problems.append(f"{where}: {problem}")
                    continue
                canonical = _canonical(key, chain, self.bitcoin.address_network if self.bitcoin and chain == "bitcoin" else "")
                if canonical in seen:
                    problems.append(f"{where}: the same key as wallets.{chain}.{seen[canonical]}; each tier has its own account")
                seen[canonical] = tier
        ids = [a.key_id for a in self.approvers]
        for key_id in sorted({i for i in ids if ids.count(i) > 1}):
            problems.append(f"approvers: key_id {key_id!r} appears more than once")
        if not any(p.startswith("approvers") for p in problems):
            try:
                self.approver_registry()
            except ValueError as exc:
                problems.append(f"approvers: {exc}")
        return problems

    # ---- loading --------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None, *, process: str | None = None) -> "DeploymentConfig":
        """Read `path` (default: $CUSTODY_CONFIG) and the environment; ConfigError on any problem.
        With `process` ("api" or "worker"), `CUSTODY_<PROCESS>_DATABASE_URL` (when set) is that
        process's database URL, and `CUSTODY_<PROCESS>_SIGNER_CLIENT` / `..._SIGNER_AUTH_KEY_FILE`
        its signer client and key (a relative path is the working directory's): one file serves
        both, each connecting as its own role and speaking to the signer as its own client."""
        raw_path = path if path is not None else os.environ.get(CONFIG_ENV)
        if not raw_path:
            raise ConfigError([f"no configuration file: pass --config FILE or set {CONFIG_ENV}"])
        source = Path(raw_path)
        try:
            data = tomllib.loads(source.read_text())
        except FileNotFoundError:
            raise ConfigError([f"{source}: no such file"]) from None
        except OSError as exc:
            raise ConfigError([f"{source}: cannot read: {exc.strerror or exc}"]) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"{source}: not valid TOML: {exc}"]) from None
        problems = [f"{source}: {p}" for p in _lowercase_symbols(data) + unknown_environment(os.environ)]
        if problems:
            raise ConfigError(problems)
        _resolve_paths(data, source.parent)
        try:
            config = cls(**data)
        except ValidationError as exc:
            raise ConfigError([f"{source}: {line}" for line in _describe(exc)]) from None
        signer_env = {key: os.environ[name] for key, name in PROCESS_SIGNER_ENV.get(process or "", {}).items()
                      if os.environ.get(name)}
        if signer_env:
            try:
                section = SignerSection(**{**config.signer.model_dump(), **signer_env})
            except ValidationError as exc:
                names = PROCESS_SIGNER_ENV[process or ""]
                raise ConfigError([f"{source}: environment {names.get(str(e['loc'][0]), e['loc'][0])}: "
                                   f"{e['msg'].removeprefix('Value error, ')}"
                                   for e in exc.errors(include_input=False, include_url=False)]) from None
            config = config.model_copy(update={"signer": section})
            config._key_file_from = PROCESS_SIGNER_ENV[process or ""]["auth_key_file"] if "auth_key_file" in signer_env else None
        config._source = source
        config._process = process
        problems = [f"{source}: {p}" for p in config._files()]
        overrides: dict[str, Any] = {}
        own_url = os.environ.get(PROCESS_DATABASE_ENV.get(process or "", ""), "")
        if own_url:
            try:
                DatabaseSection(url=own_url)
            except ValidationError:
                problems.append(f"{source}: environment {PROCESS_DATABASE_ENV[process or '']}: must be a PostgreSQL URL")
            overrides["database_url"] = own_url
        elif config.database.url:
            overrides["database_url"] = config.database.url
        if config.api.host is not None:
            overrides["api_host"] = config.api.host
        if config.api.port is not None:
            overrides["api_port"] = config.api.port
        try:
            config._settings = Settings(**overrides)
        except ValidationError as exc:
            problems += [f"{source}: service settings: {line}" for line in _describe(exc)]
        if config._settings is not None and not config._settings.database_url:
            problems.append(f"{source}: database.url: required (or DATABASE_URL): the process's own database role")
        if problems:
            raise ConfigError(problems)
        return config

    def _files(self) -> list[str]:
        problem = auth_key_problem(self.signer.auth_key_file)
        where = f"environment {self._key_file_from}" if self._key_file_from else "signer.auth_key_file"
        return [f"{where}: {problem}"] if problem else []

    @property
    def source(self) -> Path | None:
        return self._source

    @property
    def process(self) -> str | None:
        """The process this file was loaded for ("api", "worker"), or None (`config check`, tests)."""
        return self._process

    @property
    def settings(self) -> Settings:
        """custody.settings.Settings with this file's database URL and API address applied."""
        if self._settings is None:
            raise RuntimeError("settings exist on a loaded configuration only (DeploymentConfig.load)")
        return self._settings

    @property
    def database_url(self) -> str:
        url = self.settings.database_url
        assert url  # load() refuses a configuration without one
        return url

    @property
    def chains(self) -> list[str]:
        return [c for c in ("bitcoin", "ethereum") if getattr(self, c) is not None]

    def approver_registry(self) -> ApproverRegistry:
        """The approver public keys as a signer.approvals.ApproverRegistry (the API verifies an
        approval against them for early feedback; the signer trusts only its own list)."""
        return ApproverRegistry.from_entries([a.model_dump(exclude_none=True) for a in self.approvers])


# ---- helpers ---------------------------------------------------------------------------------

def _resolve_paths(data: dict, base: Path) -> None:
    """Relative file paths in the file are relative to the file (not to the working directory)."""
    for section, key in (("signer", "auth_key_file"), ("bitcoin", "cookie_file")):
        table = data.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str) and not Path(table[key]).is_absolute():
            table[key] = str(base / table[key])


def _fold_upper(table: Any) -> Any:
    if not isinstance(table, dict):
        return table
    out: dict[str, Any] = {k: v for k, v in table.items() if k == k.upper()}
    for key, value in table.items():
        if key == key.upper():
            continue
        upper = key.upper()
        if isinstance(value, dict) and isinstance(out.get(upper), dict):
            out[upper] = {**out[upper], **value}
        else:
            out[upper] = value
    return out


def _lowercase_symbols(data: dict) -> list[str]:
    out = [f"assets.{s}: write asset symbols in capitals ({s.upper()})" for s in (data.get("assets") or {})
           if s != s.upper()]
    tokens = (data.get("ethereum") or {}).get("tokens") or {} if isinstance(data.get("ethereum"), dict) else {}
    out += [f"ethereum.tokens.{s}: write token symbols in capitals ({s.upper()})" for s in tokens if s != s.upper()]
    return out


def _model_at(model: Any, parts: list[str]) -> str | None:
    """Follow `parts` (lower-case) through the config's fields; the first unknown part, or None."""
    from typing import get_args, get_origin

    annotation: Any = model
    for i, part in enumerate(parts):
        while get_origin(annotation) not in (None, dict, list, Literal):  # Annotated[...], X | None
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        if get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
            continue  # any key (a symbol or a chain name)
        fields = getattr(annotation, "model_fields", None)
        if fields is None:
            return "__".join(parts[i:])  # a scalar has no sub-keys
        if part not in fields:
            return part
        annotation = fields[part].annotation
    return None


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """`CUSTODY_*` variables that name no setting (a typo would otherwise be silently ignored)."""
    out = []
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in (CONFIG_ENV, *PROCESS_ENV):
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        bad = _model_at(DeploymentConfig, parts) if all(parts) else name
        if bad is not None:
            out.append(f"environment {name}: no such setting ({bad!r} is unknown)")
    return out


def _describe(exc: ValidationError) -> list[str]:
    """One line per error: the key path and pydantic's reason, never the offending value (a
    secret or a private key must not reach a log)."""
    lines = []
    for err in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown setting (a typo? see deploy/custody.example.toml)"
        elif err["type"] == "missing":
            message = "required"
        for line in message.splitlines():
            lines.append(f"{where}: {line}" if where else line)
    return lines


def _decode(key: str) -> bytes | None:
    from bip_utils import Base58Decoder

    try:
        payload = Base58Decoder.CheckDecode(key.strip())
    except Exception:  # noqa: BLE001 - any decoding failure means "not an extended key"
        return None
    return payload if len(payload) == 78 else None


def _key_problem(key: str, chain: str, bitcoin_network: str | None) -> str | None:
    """Why `key` cannot be this chain's account xpub, without echoing it (it may be private)."""
    payload = _decode(key)
    prefix = key.strip()[:4]
    version = payload[:4] if payload else b""
    if version in _PRIVATE_VERSIONS or (payload is None and prefix.lower().endswith("prv")):
        name = _PRIVATE_VERSIONS.get(version, prefix)
        return (f"a private extended key ({name}...) was given: custody never holds key material; configure the "
                "account xpub the signer exports (python -m signer xpubs)")
    if payload is None:
        return "not an extended public key (base58check, 78 bytes)"
    if payload[4] != 3:
        return f"an account-level key (depth 3: m/purpose'/coin'/account') is needed, this one has depth {payload[4]}"
    if chain == "ethereum":
        if version not in _MAINNET_PUBLIC or _MAINNET_PUBLIC[version] != "xpub":
            return "an ethereum account key is an xpub (BIP44, coin 60)"
        return None
    expected = _MAINNET_PUBLIC if bitcoin_network == "mainnet" else _TESTNET_PUBLIC
    if version not in expected:
        other = _MAINNET_PUBLIC.get(version) or _TESTNET_PUBLIC.get(version) or version.hex()
        return (f"a {other} key does not belong to bitcoin {bitcoin_network} "
                f"(expected {' or '.join(expected.values())})")
    return None


def _canonical(key: str, chain: str, address_network: str) -> str:
    if chain == "bitcoin":
        from custody.addresses import canonical_btc_account_key

        return canonical_btc_account_key(key, address_network)
    return key.strip()


__all__ = ["ConfigError", "DeploymentConfig", "unknown_environment"]
