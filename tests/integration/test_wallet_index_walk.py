"""The wallet index's block application (issue 13), against PostgreSQL, driven through the real
walk: `Deposits.scan` over a `BitcoinAdapter` whose node reads are a scripted chain of blocks in
bitcoind's `getblock <hash> 2` shape (so the adapter's own output and spend matching runs).

Shows: outputs to deposit, hot receive, hot change and cold addresses are indexed with their tier
and derivation; only deposit outputs become `deposit_observation` rows; a spend of an output
created earlier in the same block (and in an earlier block of the same scan) is recorded; a reorg
deletes the outputs of the undone blocks and clears their spends, then the new blocks apply; a
second worker scanning in between makes the first reload its outpoints; the index always equals
a recomputation from the scripted main chain.

Each test runs on a database of its own (own_database): it forges the bitcoin cursor and wallets.
"""
from __future__ import annotations

import hashlib
from decimal import Decimal

import pytest
from sqlalchemy import text

from chain_adapters.base import BlockRef, BlockWalker
from chain_adapters.bitcoin import BitcoinAdapter
from custody.addresses import derive_btc_address
from custody.deposits import Deposits
from custody.wallet_index import holdings, unspent
from custody.wallets import Wallets
from ledger.model import AccountKind
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
STRANGER = "bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080"  # someone else's address


def _h(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


class ScriptedNode(BitcoinAdapter):
    """A BitcoinAdapter whose node is a list of blocks; `reorg(n, blocks)` replaces the chain from
    height n. Transactions are (txid, [(prev txid, vout)], [(address, sat)])."""

    def __init__(self) -> None:
        BlockWalker.__init__(self)
        self.network = "regtest"
        self.main: list[dict] = [{"hash": _h("genesis"), "height": 0, "tx": []}]
        self.known: dict[str, dict] = {self.main[0]["hash"]: self.main[0]}

    def mine(self, *txs: tuple[str, list, list], tag: str = "") -> dict:
        parent = self.main[-1]
        height = parent["height"] + 1
        block = {"hash": _h(parent["hash"], height, tag, txs), "height": height, "previousblockhash": parent["hash"],
                 "tx": [{"txid": t, "vin": [{"txid": p, "vout": v} for p, v in ins] or [{"coinbase": "00"}],
                         "vout": [{"n": n, "value": Decimal(sat) / 10**8, "scriptPubKey": {"address": a}}
                                  for n, (a, sat) in enumerate(outs)]} for t, ins, outs in txs]}
        self.main.append(block)
        self.known[block["hash"]] = block
        return block

    def reorg(self, height: int) -> None:
        del self.main[height:]

    def tip(self) -> BlockRef:
        return BlockRef(self.main[-1]["height"], self.main[-1]["hash"])

    def _tip_height(self) -> int:
        return len(self.main) - 1

    def _hash_at(self, height: int) -> str | None:
        return self.main[height]["hash"] if 0 <= height < len(self.main) else None

    def _raw_blocks(self, first: int, last: int):
        return iter(self.main[first:last + 1])

    def _raw_block_by_hash(self, block_hash: str) -> dict | None:
        return self.known.get(block_hash)

    def expected_unspent(self, ours: set[str]) -> dict[tuple[str, int], int]:
        """Our unspent outputs, recomputed from the main chain from scratch."""
        outs: dict[tuple[str, int], int] = {}
        for block in self.main:
            for tx in block["tx"]:
                for vin in tx["vin"]:
                    outs.pop((vin.get("txid"), vin.get("vout")), None)
                for o in tx["vout"]:
                    if o["scriptPubKey"]["address"] in ours:
                        outs[(tx["txid"], o["n"])] = int(o["value"] * 10**8)
        return outs


@pytest.fixture()
def world(database_url):
    with own_database(database_url, "wallet_index") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
        for tier in ("deposit", "hot", "cold"):
            wallets.register_wallet("bitcoin", tier, "regtest", KEYS.account_xpub("bitcoin", tier))
        cold_xpub = KEYS.account_xpub("bitcoin", "cold")
        with eng.begin() as c:  # two rebalances were told to pay cold 0/0 and 0/1 (as Rebalances._open records them)
            for i in (0, 1):
                c.execute(text("UPDATE wallet SET next_index = next_index + 1 WHERE chain = 'bitcoin' AND tier = 'cold'"))
                c.execute(text("INSERT INTO rebalance (chain, asset, source_tier, destination_tier, state, destination, "
                               "destination_index, amount, fee, fee_rate, spendable, ceiling, target) VALUES ('bitcoin', "
                               "'BTC', 'hot', 'cold', 'abandoned', :d, :i, 1000, 0, 1000, 0, 0, 0)"),
                          {"d": derive_btc_address(cold_xpub, "regtest", 0, i), "i": i})
            batch = c.execute(text("INSERT INTO withdrawal_batch (chain, asset, state, fee_rate) VALUES ('bitcoin', 'BTC', "
                                   "'open', 1000) RETURNING id")).scalar_one()
        account = ledger.open_account("BTC", AccountKind.customer, "customer:alice:BTC", owner="alice").id
        node = ScriptedNode()
        deposits = Deposits(eng, ledger, wallets, {"bitcoin": node})
        deposits.start_cursor("bitcoin", node.tip())
        xpub = {t: eng.connect().execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = :t"), {"t": t}).scalar_one()
                for t in ("hot", "cold")}
        addr = {"deposit": wallets.issue_address("alice-1", account).address,
                "hot": derive_btc_address(xpub["hot"], "regtest", 0, 0),
                "change": derive_btc_address(xpub["hot"], "regtest", 1, batch),
                "cold": derive_btc_address(xpub["cold"], "regtest", 0, 1)}
        yield eng, ledger, wallets, node, deposits, addr
        ledger.assert_verified()


def _index(eng) -> dict[tuple[str, int], int]:
    with eng.connect() as c:
        return {(u.txid, u.index): u.amount for tier in ("deposit", "hot", "cold") for u in unspent(c, tier)}


def _observations(eng) -> list[tuple[str, int, str]]:
    with eng.connect() as c:
        return [tuple(r) for r in c.execute(text("SELECT txid, output_index, state FROM deposit_observation ORDER BY txid"))]


def test_outputs_spends_in_the_same_block_and_scan_and_a_reorg(world):
    eng, _ledger, _wallets, node, deposits, addr = world
    ours = set(addr.values())
    fund, dep, pay, spend_change = _h("fund"), _h("dep"), _h("pay"), _h("spend-change")
    node.mine((fund, [], [(addr["hot"], 500_000), (STRANGER, 1)]), (dep, [], [(addr["deposit"], 70_000)]))
    # block 2: a payout spends the hot coin, pays a stranger and our change address; a second
    # transaction IN THE SAME BLOCK spends that change to the cold address
    node.mine((pay, [(fund, 0)], [(STRANGER, 100_000), (addr["change"], 399_000)]),
              (spend_change, [(pay, 1)], [(addr["cold"], 398_000)]))
    summary = deposits.scan("bitcoin")
    assert_equal(summary.blocks, 2)
    assert_equal(_index(eng), node.expected_unspent(ours))
    assert_equal(_index(eng), {(dep, 0): 70_000, (spend_change, 0): 398_000})
    with eng.connect() as c:
        assert_equal((holdings(c, "deposit"), holdings(c, "hot"), holdings(c, "cold")), (70_000, 0, 398_000))
        spent = dict(c.execute(text("SELECT txid || ':' || vout, spent_txid FROM btc_wallet_output WHERE spent_txid IS NOT NULL")).all())
        tiers = dict(c.execute(text("SELECT txid || ':' || vout, tier || ' ' || derivation_change || '/' || derivation_index "
                                    "FROM btc_wallet_output")).all())
    assert_equal(spent, {f"{fund}:0": pay, f"{pay}:1": spend_change})
    assert_equal(tiers[f"{pay}:1"].split("/")[0], "hot 1")
    assert_equal(tiers[f"{spend_change}:0"], "cold 0/1")
    assert_equal(_observations(eng), [(dep, 0, "seen")])  # hot and cold outputs are not deposits
    with eng.connect() as c:  # the gap bookkeeping follows the first deposit to an address (O(1) at issue)
        assert_equal(c.execute(text("SELECT last_used_index FROM wallet WHERE chain = 'bitcoin' AND tier = 'deposit'")).scalar_one(), 0)

    # a later scan spends an output created in an earlier scan (from the in-memory outpoints)
    sweep = _h("sweep")
    node.mine((sweep, [(dep, 0)], [(addr["hot"], 69_000)]))
    deposits.scan("bitcoin")
    assert_equal(_index(eng), node.expected_unspent(ours))

    # reorg: blocks 2 and 3 leave the main chain (the change, its spend, the sweep); block 2' holds nothing of ours
    node.reorg(2)
    node.mine((_h("other"), [], [(STRANGER, 5)]), tag="fork")
    summary = deposits.scan("bitcoin")
    assert summary.cursor == node.tip()
    assert_equal(_index(eng), node.expected_unspent(ours))
    assert_equal(_index(eng), {(fund, 0): 500_000, (dep, 0): 70_000})  # the spends are cleared, the change is gone
    with eng.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM btc_wallet_output")).scalar_one(), 2)

    # and the block holding the deposit goes too: the deposit is orphaned, the index is empty
    node.reorg(1)
    node.mine((_h("other2"), [], [(STRANGER, 5)]), tag="fork2")
    node.mine(tag="fork2b")
    deposits.scan("bitcoin")
    assert_equal(_index(eng), {})
    assert_equal(_observations(eng), [(dep, 0, "orphaned")])


def test_a_second_worker_scanning_makes_the_first_reload_its_outpoints(world):
    eng, ledger, wallets, node, deposits, addr = world
    ours = set(addr.values())
    other_worker = Deposits(eng, ledger, wallets, {"bitcoin": node})
    a, b = _h("a"), _h("b")
    node.mine((a, [], [(addr["hot"], 10_000)]))
    deposits.scan("bitcoin")  # worker 1's outpoints: {a:0}, exact at block 1
    node.mine((b, [(a, 0)], [(addr["hot"], 9_000)]))
    other_worker.scan("bitcoin")  # worker 2 walks block 2: a:0 spent, b:0 created
    node.mine((_h("c"), [(b, 0)], [(STRANGER, 8_000)]))
    deposits.scan("bitcoin")  # worker 1 must know b:0 (created by worker 2's scan) to see it spent
    assert_equal(_index(eng), node.expected_unspent(ours))
    assert_equal(_index(eng), {})
