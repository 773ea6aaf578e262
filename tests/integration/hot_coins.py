"""A hot coin planted for a scenario with a stand-in node: recorded in `wallet_utxo` by the test and
indexed in `btc_wallet_output` as the block walk would have (custody.wallet_index), since coin
selection (`custody.payouts.spendable_coins`) takes only coins the index holds unspent."""
from __future__ import annotations

from sqlalchemy import Connection, text


def index_hot_coin(conn: Connection, txid: str, vout: int, address: str, amount: int, *, change: int = 0,
                   index: int = 0, block_height: int = 1) -> None:
    conn.execute(text(
        "INSERT INTO btc_wallet_output (txid, vout, address, tier, derivation_change, derivation_index, amount, "
        "block_height, block_hash) VALUES (:t, :v, :a, 'hot', :c, :i, :m, :h, :b) ON CONFLICT DO NOTHING"),
        {"t": txid, "v": vout, "a": address, "c": change, "i": index, "m": amount, "h": block_height,
         "b": f"planted-{block_height:064d}"[-64:]})
