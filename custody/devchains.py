"""Regtest reference data, in one place: the assets (decimals, finality, dust minimum, minimum
withdrawal, quoted fees) the demo's configuration file carries (custody.launch) and the in-process
suites apply directly (`configure_regtest`), the signer's own asset table for them
(`signer_asset_entries`, for signer.toml and the in-process signer), and the development seed file
(regtest only).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from bip_utils import Bip39MnemonicGenerator, Bip39WordsNum

if TYPE_CHECKING:
    from custody.container import Container
    from signer.keys import SignerKeys

log = logging.getLogger(__name__)
BTC_FINALITY, ETH_FINALITY = 3, 12

# As the deployment config's [assets.*] tables write them (custody.config); USDT's contract comes
# from [ethereum.tokens].
REGTEST_ASSETS: dict[str, dict[str, int | str]] = {
    "BTC": {"chain": "bitcoin", "decimals": 8, "finality": BTC_FINALITY, "dust_minimum": 1_000,
            "min_withdrawal": 10_000, "withdrawal_fee": 5_000, "withdrawal_fee_fast": 20_000},
    "ETH": {"chain": "ethereum", "decimals": 18, "finality": ETH_FINALITY, "dust_minimum": 10**9,
            "min_withdrawal": 10**15, "withdrawal_fee": 10**15},
    "USDT": {"chain": "ethereum", "decimals": 6, "finality": ETH_FINALITY, "dust_minimum": 10_000,
             "min_withdrawal": 10**6, "withdrawal_fee": 10**6},
}


def signer_asset_entries(token_address: str) -> dict[str, dict[str, int | str]]:
    """The signer's own `assets` table (signer.config) for the regtest assets: BTC and ETH native,
    USDT the test token at `token_address`."""
    return {code: {"chain": a["chain"], "decimals": a["decimals"], **({"contract": token_address} if code == "USDT" else {})}
            for code, a in REGTEST_ASSETS.items()}


def dev_seed_file(state_dir: Path) -> Path:
    """A 24-word development seed in `state_dir/dev-seed.txt` (0600), made once; regtest only."""
    path = state_dir / "dev-seed.txt"
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(Bip39MnemonicGenerator().FromWordsNumber(Bip39WordsNum.WORDS_NUM_24)) + "\n")
        log.info("generated a development seed in %s (regtest only)", path)
    return path


def configure_regtest(container: Container, keys: SignerKeys, token_address: str) -> None:
    """The in-process suites' wiring of the same data: deposit and hot wallets from the signer's
    xpubs, the three assets, each chain's scan cursor at the node's tip."""
    w = container.wallets
    for chain in ("bitcoin", "ethereum"):
        for tier in ("deposit", "hot"):
            w.register_wallet(chain, tier, "regtest", keys.account_xpub(chain, tier))
    for code, a in REGTEST_ASSETS.items():
        extra = {k: v for k, v in a.items() if k not in ("chain", "decimals")}
        w.configure_asset(code, a["decimals"], a["chain"], contract_address=token_address if code == "USDT" else None,
                          **extra)
    for chain in ("bitcoin", "ethereum"):
        container.deposits.start_cursor(chain)
