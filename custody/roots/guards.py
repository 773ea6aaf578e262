"""What a custody process checks about the world before it acts on it, and keeps checking while it
runs: that each chain node is on the configured chain (`NetworkGate`), and that the signer holds
the keys of the configured wallets (`WalletCheck`, `signer_gated`).

Guarantees:
- No adapter call of a process built by custody.roots reaches a node whose chain has not been
  verified (bitcoind `getblockchaininfo.chain`, ethereum `eth_chainId`): on the first successful
  contact, again after any call that found the node unavailable, after the RPC client opened a new
  connection (bitcoin: `JsonRpcClient.connection_serial`; ethereum: `EthereumAdapter.connection_serial`,
  which counts the connects of web3's HTTP session; an answer read over a connection opened
  during the call is only returned once the node it reached is verified), and at least every
  `RECHECK_SECONDS`. A node found on another chain closes its gate for the life of the process:
  every call raises `WrongNetwork` (a `NodeUnavailable`: jobs log and retry, containment does not
  blame a batch), a critical log says so once and `on_wrong_network` opens a critical incident
  (custody.roots.common: `chain_wrong_network`, which engages the kill switch). Fix the node or
  the file, then restart the process.
- The worker runs no job that derives an address or moves coins (deposits, payouts, sweeps,
  rebalances, reconciliation) until the signer's `xpubs()` equal [wallets.*] deposit and hot
  (`WalletCheck.attempt`, retried at most every `RETRY_SECONDS` from those jobs' runs while the
  signer does not answer); the other jobs run meanwhile. A mismatch found at start is a
  StartupError; found later (the signer came up holding other keys) it is a critical log, a
  critical incident (`wallet_keys_not_the_signers`) and the gated jobs never run in this process.
  The cold tier is not compared: it is watch-only and in production comes from an offline seed
  (signer/keys.py), so it need not be the signer's.

| raised / logged | meaning |
| --- | --- |
| `WrongNetwork` (chain_adapters.errors, code `wrong_network`) | the node answers for another chain; nothing was read from or sent to it by the gated call |
| `NodeUnavailable` | the node could not be reached; the gate verifies it again at the next call |
| log `signer unreachable: ... wait` (warning, at most once a minute) | deposits, payouts, sweeps, rebalances and reconciliation are waiting for the wallet check |
| log `... are not the signer's xpubs` (critical) | the wallet check failed; the gated jobs stay stopped |
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from chain_adapters.errors import NodeUnavailable, WrongNetwork
from custody.config import DeploymentConfig

log = logging.getLogger(__name__)

RECHECK_SECONDS = 60.0  # a verified node is verified again after this long, even with no reconnect seen
RETRY_SECONDS = 1.0  # the wallet check asks an unreachable signer again at most this often
QUIET_SECONDS = 60.0  # "still waiting" is logged at most this often
HELD_TIERS = ("deposit", "hot")  # the tiers whose keys the signer must hold (cold is watch-only)


# ---- chain nodes ----------------------------------------------------------------------------------

class NetworkGate:
    """A chain adapter whose every call first makes sure the node is on the adapter's network
    (see the module's guarantees). Attributes pass through; methods other than `close` and
    `verify_network` are gated. `isinstance(gate, type(adapter))` holds (`__class__` answers the
    adapter's class), so code that checks an adapter's type sees the gated one as what it wraps.
    Custody code calls the adapter's methods only, never its `rpc` or `w3` directly."""

    _UNGATED = frozenset({"close", "verify_network"})

    def __init__(self, adapter: Any, *, on_wrong_network: Callable[[str, WrongNetwork], None] | None = None,
                 recheck_seconds: float = RECHECK_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._adapter = adapter
        self.on_wrong_network = on_wrong_network
        self._recheck = recheck_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._verified_at: float | None = None
        self._serial: int | None = None
        self._wrong: WrongNetwork | None = None

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - isinstance() sees the wrapped adapter's class
        return type(self._adapter)

    def __repr__(self) -> str:
        return f"NetworkGate({self._adapter!r})"

    @property
    def adapter(self) -> Any:
        return self._adapter

    @property
    def wrong_network(self) -> WrongNetwork | None:
        """The mismatch that closed this gate, or None."""
        return self._wrong

    def verify(self) -> None:
        """Ask the node for its chain now: returns when it is ours; WrongNetwork (the gate closes,
        `on_wrong_network` is told once) or NodeUnavailable otherwise."""
        chain = getattr(self._adapter, "chain", "?")
        with self._lock:
            self._raise_if_wrong()
            was_verified = self._verified_at is not None
            try:
                self._adapter.verify_network()
            except WrongNetwork as exc:
                self._wrong = exc
                self._verified_at = None
                log.critical("%s: the node is not on the configured network (%s): every %s call of this process is "
                             "refused; correct the node or the configuration, then restart the process",
                             chain, exc.detail, chain)
                if self.on_wrong_network is not None:
                    try:
                        self.on_wrong_network(chain, exc)
                    except Exception:  # noqa: BLE001 - the gate stays closed whatever the report did
                        log.exception("%s: could not record the wrong network as an incident", chain)
                raise
            except NodeUnavailable:
                self._verified_at = None
                raise
            self._verified_at = self._clock()
            self._serial = self._current_serial()
        if not was_verified:
            log.info("%s: the node is on the configured network (%s)", chain, getattr(self._adapter, "network", "?"))

    def _raise_if_wrong(self) -> None:
        if self._wrong is not None:
            raise WrongNetwork(self._wrong.detail)

    def _current_serial(self) -> int | None:
        serial = getattr(self._adapter, "connection_serial", None)  # ethereum: web3's session
        return serial if serial is not None else getattr(getattr(self._adapter, "rpc", None), "connection_serial", None)

    def _fresh(self) -> bool:
        at = self._verified_at
        return at is not None and self._clock() - at < self._recheck and self._current_serial() == self._serial

    def _ensure(self) -> None:
        self._raise_if_wrong()
        if not self._fresh():
            self.verify()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._adapter, name)
        if name.startswith("_") or name in self._UNGATED or not callable(attr):
            return attr

        def gated(*args: Any, **kwargs: Any) -> Any:
            self._ensure()
            try:
                result = attr(*args, **kwargs)
            except NodeUnavailable:
                self._verified_at = None  # it may come back as another node: verify before the next use
                raise
            if self._current_serial() != self._serial:  # the call reconnected: is that node ours?
                self._verified_at = None
                self._ensure()
            return result

        gated.__name__ = name
        return gated


def gate_adapters(adapters: Mapping[str, Any], *,
                  on_wrong_network: Callable[[str, WrongNetwork], None] | None = None) -> dict[str, Any]:
    """Each adapter that can verify its network behind a NetworkGate (a test's stand-in without
    `verify_network` is used as it is)."""
    return {chain: NetworkGate(a, on_wrong_network=on_wrong_network)
            if hasattr(a, "verify_network") and not isinstance(a, NetworkGate) else a
            for chain, a in adapters.items()}


# ---- the signer's keys ----------------------------------------------------------------------------

def signer_accounts(xpubs: Any) -> dict[str, dict[str, str]]:
    """{chain: {tier: xpub}} from the signer's `xpubs()` answer (signer.wire.Xpubs); ValueError when
    the answer has no such mapping."""
    accounts = getattr(xpubs, "accounts", xpubs)
    if not isinstance(accounts, Mapping):
        raise ValueError(f"the signer's xpubs answer is not understood ({type(xpubs).__name__})")
    return {str(c): {str(t): str(x) for t, x in tiers.items()} for c, tiers in accounts.items() if isinstance(tiers, Mapping)}


def wallet_mismatches(config: DeploymentConfig, xpubs: Any) -> list[str]:
    """The `wallets.<chain>.<tier>` keys (deposit and hot) whose xpub is not the signer's; bitcoin
    keys compare in their canonical form (xpub/zpub, tpub/vpub are the same key)."""
    from custody.addresses import canonical_btc_account_key

    accounts = signer_accounts(xpubs)
    out = []
    for chain, section in sorted(config.wallets.items()):
        for tier in HELD_TIERS:
            mine, theirs = getattr(section, tier), accounts.get(chain, {}).get(tier)
            if theirs is None:
                out.append(f"wallets.{chain}.{tier}")
                continue
            if chain == "bitcoin" and config.bitcoin is not None:
                try:
                    same = canonical_btc_account_key(theirs, config.bitcoin.address_network) == \
                        canonical_btc_account_key(mine, config.bitcoin.address_network)
                except ValueError:  # a key of another network (or not an account key): not ours
                    same = False
            else:
                same = theirs.strip() == mine.strip()
            if not same:
                out.append(f"wallets.{chain}.{tier}")
    return out


class WalletCheck:
    """Whether the signer holds the configured wallets' deposit and hot keys: pending until the
    signer answers `xpubs()`, then passed or failed for the life of the process.

    `on_pass` runs once when the check passes at run time (the worker registers the wallets then);
    while it raises, the check stays pending. `on_mismatch(keys)` runs once when it fails at run
    time. Only `xpubs()` is asked of the signer (the api's client may answer nothing else)."""

    def __init__(self, config: DeploymentConfig, signer: Any, *, on_pass: Callable[[], object] | None = None,
                 on_mismatch: Callable[[list[str]], None] | None = None, retry_seconds: float = RETRY_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.signer = signer
        self.on_pass = on_pass
        self.on_mismatch = on_mismatch
        self.retry_seconds = retry_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self.state = "pending"  # pending | passed | failed
        self.mismatched: list[str] = []
        self._tried_at: float | None = None
        self._logged_at: float | None = None

    @property
    def passed(self) -> bool:
        return self.state == "passed"

    @property
    def where(self) -> str:
        return self.config.signer.endpoint

    def mismatch_message(self, keys: list[str]) -> str:
        return (f"{', '.join(keys)}: not the signer's xpubs (signer at {self.where}); deposit addresses issued from a "
                "key the signer does not hold can never be swept or paid from: fill [wallets] from `python -m signer "
                "xpubs` of this signer")

    def at_start(self) -> str:
        """The first attempt, while the process starts: 'passed' or 'pending' (the signer did not
        answer); raises ValueError(message) when the signer's keys differ or its answer is refused
        (the caller turns it into a StartupError)."""
        from signer.wire import WireError

        with self._lock:
            self._tried_at = self._clock()
            try:
                xpubs = self.signer.xpubs()
            except NodeUnavailable as exc:
                self._logged_at = self._clock()
                log.warning("signer unreachable at start (%s): the wallets are compared with its xpubs once it answers",
                            exc)
                return self.state
            except WireError as exc:
                raise ValueError(f"signer at {self.where}: {exc} (the auth key file is not the signer's?)") from None
            mismatched = wallet_mismatches(self.config, xpubs)
            if mismatched:
                self.state, self.mismatched = "failed", mismatched
                raise ValueError(self.mismatch_message(mismatched))
            self.state = "passed"
        log.info("the signer at %s holds the configured wallets' deposit and hot keys", self.where)
        return self.state

    def attempt(self) -> bool:
        """True once the check has passed. Pending: asks the signer (at most every retry_seconds)."""
        if self.state != "pending":
            return self.passed
        with self._lock:
            if self.state != "pending":
                return self.passed
            now = self._clock()
            if self._tried_at is not None and now - self._tried_at < self.retry_seconds:
                return False
            self._tried_at = now
            try:
                mismatched = wallet_mismatches(self.config, self.signer.xpubs())
            except Exception as exc:  # noqa: BLE001 - unreachable, refused or garbled: still pending
                self._quietly(f"signer unreachable ({exc}): the configured wallets are not yet compared with its xpubs; "
                              "deposits, payouts, sweeps, rebalances and reconciliation wait (asked again each run)")
                return False
            if mismatched:
                self.state, self.mismatched = "failed", mismatched
                log.critical("%s; deposits, payouts, sweeps, rebalances and reconciliation stay stopped in this process",
                             self.mismatch_message(mismatched))
                if self.on_mismatch is not None:
                    try:
                        self.on_mismatch(mismatched)
                    except Exception:  # noqa: BLE001 - the jobs stay stopped whatever the report did
                        log.exception("could not record the wallet mismatch as an incident")
                return False
            if self.on_pass is not None:
                try:
                    self.on_pass()
                except Exception:  # noqa: BLE001 - retried on the next run; the jobs wait meanwhile
                    log.exception("the signer holds the wallets' keys, but registering them failed; retried next run")
                    return False
            self.state = "passed"
        log.info("the signer at %s holds the configured wallets' deposit and hot keys: the jobs that derive or pay "
                 "start", self.where)
        return True

    def _quietly(self, message: str) -> None:
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= QUIET_SECONDS:
            self._logged_at = now
            log.warning(message)


class SignerGated:
    """`service` whose methods do nothing (return None) until `check` has passed: the worker's
    scheduler sees these in place of the services that derive or pay (see `signer_gated`)."""

    def __init__(self, service: Any, check: WalletCheck) -> None:
        self._service = service
        self._check = check

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._service, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def gated(*args: Any, **kwargs: Any) -> Any:
            return attr(*args, **kwargs) if self._check.attempt() else None

        gated.__name__ = getattr(attr, "__name__", name)
        return gated


GATED_SERVICES = ("deposits", "payouts", "sweeps", "eth_sweeps", "rebalances", "reconciliation")


def signer_gated(root: Any, check: WalletCheck) -> Any:
    """`root` (a dataclass) as the scheduler should see it: when `check` has not passed, its
    GATED_SERVICES wrapped in SignerGated; otherwise `root` itself."""
    import dataclasses

    if check.passed:
        return root
    return dataclasses.replace(root, **{name: SignerGated(getattr(root, name), check)
                                        for name in GATED_SERVICES if getattr(root, name, None) is not None})


__all__ = ["GATED_SERVICES", "HELD_TIERS", "NetworkGate", "SignerGated", "WalletCheck", "gate_adapters",
           "signer_accounts", "signer_gated", "wallet_mismatches"]
