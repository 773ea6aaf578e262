"""Shared set-up for the chain benchmarks: a private regtest bitcoind, a fresh database on the
configured server, and the custody container wired to both with the BIP84 test-vector seed.
Everything is torn down on exit (node stopped by PID, database dropped, data directory removed)."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chain_adapters.bitcoin import BitcoinAdapter  # noqa: E402
from custody.container import Container  # noqa: E402
from custody.database import drop_database, ensure_database, make_engine, migrate, server_url, with_database  # noqa: E402
from custody.settings import Settings  # noqa: E402
from ledger.service import Ledger  # noqa: E402
from regtest.bitcoin_node import BitcoinNode, start_bitcoind  # noqa: E402
from regtest.install import find_tools  # noqa: E402
from signer.keys import Secret, SignerKeys, seed_from_text  # noqa: E402

TEST_MNEMONIC = "abandon " * 11 + "about"  # BIP84 test vector: regtest only


def bench_keys() -> SignerKeys:
    """The signer keys of the BIP84 test-vector seed (regtest only): deterministic addresses."""
    return SignerKeys(seed_from_text(Secret(TEST_MNEMONIC)), "regtest")


def bitcoin_container(url: str, node: BitcoinNode, signer_keys: SignerKeys | None, *,
                      node_view: bool = False) -> Container:
    """The custody container on the (migrated) database at `url` and `node`'s RPC; with
    `signer_keys` the withdrawal side too (payouts, hot-wallet sync, reconciliation); `node_view`:
    reconciliation cross-checks against the node's watch-only wallet (custody.node_view). The caller
    disposes `container.engine`."""
    engine = make_engine(url)
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    container.with_chains({"bitcoin": BitcoinAdapter(node.rpc_url, network="regtest")}, signer_keys=signer_keys,
                          node_view=node_view)
    return container


@contextlib.contextmanager
def custody_on_regtest(name: str, *, with_signer: bool) -> Iterator[tuple[Container, BitcoinNode, SignerKeys]]:
    root = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    url = with_database(server_url(Settings()), f"bench_{name}_{os.getpid()}")
    node = start_bitcoind(find_tools(), root / "bitcoind")
    try:
        ensure_database(url)
        migrate(url)
        keys = bench_keys()
        container = bitcoin_container(url, node, keys if with_signer else None)
        try:
            yield container, node, keys
            container.ledger.assert_verified()
            print("ledger verified")
        finally:
            container.engine.dispose()
    finally:
        node.stop()
        drop_database(url)
        shutil.rmtree(root, ignore_errors=True)
