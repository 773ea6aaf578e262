"""Proof of reserves (bitcoin): liabilities as a Merkle sum tree, holdings as signed control messages.

A report, at one stated block height, publishes:
- the root (hash and sum) of a Merkle sum tree over EVERY customer account of the asset, each leaf a
  salted commitment to one balance (never negative); a customer gets their own inclusion proof
  (`proof(report, account)`), which shows their balance is counted and the sums add up;
- the on-chain holdings: every address of ours holding coins at that height (deposit addresses and
  the hot wallet, read from the wallet index, custody.wallet_index, never the node's UTXO set), its
  amount, and a message naming the report, address, height and block hash,
  signed with that address's key (compressed public key + DER ECDSA over SHA-256 of the message),
  which anyone can check with `verify_control()`.

It is NOT a proof of solvency: it shows holdings and a commitment to liabilities at one moment; it
says nothing about debts outside the ledger, keys held by others, or what happens after that block.
The report says so in its body.
"""
from __future__ import annotations

import hashlib
import json
import secrets

from sqlalchemy import Engine, text

from chain_adapters.base import ChainAdapter
from chain_adapters.errors import NotFound
from custody import wallet_index
from custody.errors import CustodyError, CustodyErrorCode
from custody.merkle_sum import MerkleSumTree, Node, Step, leaf
from ledger.model import AccountKind
from signer.protocol import RESERVES_PREFIX, SignerPort

DISCLAIMER = ("This is a proof of reserves, not a proof of solvency: it shows the listed holdings and a commitment to "
              "customer liabilities at one block height, and nothing about other obligations or later changes.")


class Reserves:
    def __init__(self, engine: Engine, bitcoin: ChainAdapter, signer: SignerPort, *, network: str) -> None:
        self.engine = engine
        self.bitcoin = bitcoin
        self.signer = signer
        self.network = network

    def _hash_at(self, height: int) -> str | None:
        try:
            return self.bitcoin.block_at(height).hash
        except NotFound:  # the node's chain is shorter than the cursor (a reorg)
            return None

    def publish(self, asset: str = "BTC") -> dict:
        """Build, store and return a report for `asset` (bitcoin) at the wallet index's block.

        Holdings come from the wallet index (custody.wallet_index: our unspent outputs in the chain
        up to the deposit scanner's cursor), read in the same snapshot as the liabilities, so both
        are as of one block: the report's height and hash are the cursor's. Refused with
        `reserves_index_behind` when that block is no longer in the node's main chain (a reorg the
        scanner has not walked yet): ask again once it has."""
        with self.engine.connect().execution_options(isolation_level="REPEATABLE READ") as c, c.begin():
            tip = wallet_index.cursor(c, "bitcoin")
            accounts = c.execute(text(
                "SELECT a.id, coalesce(sum(b.posted), 0) AS posted FROM account a JOIN account_balance b ON b.account_id = a.id "
                "WHERE a.asset = :s AND a.kind = :k GROUP BY a.id ORDER BY a.id"), {"s": asset, "k": AccountKind.customer.value}).all()
            coins = [*wallet_index.unspent(c, "deposit"), *wallet_index.unspent(c, "hot")]
        paths = {u.address: (u.tier, u.change, u.derivation_index) for u in coins}
        held: dict[str, int] = {}
        for u in coins:
            held[u.address] = held.get(u.address, 0) + u.amount
        if not accounts:  # a Merkle sum tree needs a leaf; an empty commitment would prove nothing
            raise CustodyError(CustodyErrorCode.no_customer_accounts,
                               f"no customer account of {asset} exists: a report has no liabilities to commit to")
        if tip is None or self._hash_at(tip.height) != tip.hash:
            raise CustodyError(CustodyErrorCode.reserves_index_behind,
                               "the wallet index is not at a block of the node's main chain (the scanner has not caught up "
                               "with a reorg yet): ask again shortly")
        salts = {a.id: secrets.token_bytes(16) for a in accounts}
        tree = MerkleSumTree([leaf(a.id, int(a.posted), salts[a.id]) for a in accounts])
        with self.engine.begin() as c:
            # the id is taken first so each signed statement can name the report it belongs to
            report_id = c.execute(text("SELECT nextval(pg_get_serial_sequence('reserve_report', 'id'))")).scalar_one()
            addresses = []
            for address, amount in sorted(held.items()):
                message = (f"{RESERVES_PREFIX} report {report_id} asset {asset} address {address} "
                           f"height {tip.height} block {tip.hash}")
                pub, sig = self.signer.sign_reserves_message(*paths[address], message)
                addresses.append({"address": address, "amount": str(amount), "message": message,
                                  "public_key": pub.hex(), "signature": sig.hex()})
            body = {"report_id": report_id, "asset": asset, "height": tip.height, "block_hash": tip.hash,
                    "liabilities": {"root_hash": tree.root.hash.hex(), "total": str(tree.root.sum), "accounts": len(accounts)},
                    "holdings": {"total": str(sum(held.values())), "addresses": addresses}, "disclaimer": DISCLAIMER}
            c.execute(text(
                "INSERT INTO reserve_report (id, asset, chain_height, block_hash, root_hash, liabilities, holdings, body) "
                "VALUES (:id, :a, :h, :b, :r, :l, :s, CAST(:body AS jsonb))"),
                {"id": report_id, "a": asset, "h": tip.height, "b": tip.hash, "r": tree.root.hash.hex(), "l": tree.root.sum,
                 "s": sum(held.values()), "body": json.dumps(body)})
            c.execute(text("INSERT INTO reserve_leaf (report_id, leaf_index, account_id, balance, salt) "
                           "SELECT :r, unnest(CAST(:i AS int[])), unnest(CAST(:a AS bigint[])), unnest(CAST(:b AS numeric[])), "
                           "unnest(CAST(:s AS bytea[]))"),
                      {"r": report_id, "i": list(range(len(accounts))), "a": [a.id for a in accounts],
                       "b": [int(a.posted) for a in accounts], "s": [salts[a.id] for a in accounts]})
        return body

    def proof(self, report_id: int, account_id: int) -> dict:
        """A customer's inclusion proof: their leaf (balance, salt) and the path to the root."""
        with self.engine.connect() as c:
            rows = c.execute(text("SELECT leaf_index, account_id, balance, salt FROM reserve_leaf WHERE report_id = :r "
                                  "ORDER BY leaf_index"), {"r": report_id}).all()
        mine = next((r for r in rows if r.account_id == account_id), None)
        if mine is None:
            raise LookupError(f"account {account_id} is not in report {report_id}")
        tree = MerkleSumTree([leaf(r.account_id, int(r.balance), bytes(r.salt)) for r in rows])
        return {"report_id": report_id, "account_id": account_id, "balance": str(mine.balance), "salt": bytes(mine.salt).hex(),
                "root": {"hash": tree.root.hash.hex(), "sum": str(tree.root.sum)},
                "steps": [{"hash": s.sibling.hash.hex(), "sum": str(s.sibling.sum), "left": s.sibling_is_left}
                          for s in tree.proof(mine.leaf_index)]}


def verify_proof(proof: dict) -> bool:
    """Check a customer's proof from its JSON alone (what a customer-side verifier does)."""
    from custody.merkle_sum import verify

    node = leaf(proof["account_id"], int(proof["balance"]), bytes.fromhex(proof["salt"]))
    steps = [Step(Node(bytes.fromhex(s["hash"]), int(s["sum"])), s["left"]) for s in proof["steps"]]
    return verify(node, steps, Node(bytes.fromhex(proof["root"]["hash"]), int(proof["root"]["sum"])))


def verify_control(entry: dict, network: str) -> bool:
    """Check one signed holding: the signature is valid for the message and the key is the address's."""
    from bip_utils import P2WPKHAddrEncoder
    from coincurve import PublicKey

    hrp = {"mainnet": "bc", "testnet": "tb", "regtest": "bcrt"}[network]
    pub = bytes.fromhex(entry["public_key"])
    if P2WPKHAddrEncoder.EncodeKey(pub, hrp=hrp) != entry["address"]:
        return False
    if f"address {entry['address']} " not in entry["message"]:
        return False
    return PublicKey(pub).verify(bytes.fromhex(entry["signature"]), hashlib.sha256(entry["message"].encode()).digest(),
                                 hasher=None)
