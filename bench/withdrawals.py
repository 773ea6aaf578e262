"""Withdrawal batch benchmark: our coin selection + signing of 500 payments vs bitcoind's `sendmany`.

    .venv/bin/python bench/withdrawals.py                      # 500 outputs, 200 coins a side, 9 reps
    .venv/bin/python bench/withdrawals.py --outputs 1000 --coins 400 --reps 15

Starts its own regtest bitcoind. Both sides get the same coins to choose from (N confirmed P2WPKH
outputs of 1,000,000 sat: ours at the signer's hot keys, bitcoind's in a fresh descriptor wallet)
and pay the same 500 addresses at the same fee rate. Per repetition it times:

- ours: `select_coins` + deriving the chosen coins' private keys + `sign_batch`, with the
  destinations' scripts resolved when the withdrawals were requested (`pay_output`), which is
  how custody hands a batch to the signer;
- ours, parsing all 500 addresses at batch time instead (bech32 decoding in pure Python);
- ours + `sendrawtransaction` of the result (bitcoind's mempool acceptance, which `sendmany`
  also does), so the last comparison is like for like;
- bitcoind's `sendmany` on the same node (its own coin selection, signing, mempool, wallet db).

A block is mined between repetitions (untimed) so neither mempool grows. Medians are printed.
`time_sign_500` is the timed core; the custody batch job's database work can be wrapped around it.
Not part of the test suite.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chain_adapters.bitcoin import to_sat  # noqa: E402
from chain_adapters.rpc import JsonRpcClient  # noqa: E402
from custody.addresses import derive_btc_address  # noqa: E402
from regtest.bitcoin_node import BitcoinNode, start_bitcoind  # noqa: E402
from regtest.install import find_tools  # noqa: E402
from signer.bitcoin_tx import (  # noqa: E402
    PayOutput,
    SignedTx,
    SpendInput,
    address_to_script,
    pay_output,
    select_coins,
    sign_batch,
)
from signer.keys import Secret, SignerKeys, seed_from_text  # noqa: E402

NETWORK = "regtest"
MNEMONIC = "abandon " * 11 + "about"
PAYEE_MNEMONIC = "legal winner thank year wave sausage worth useful legal winner thank yellow"  # BIP39 vector
COIN_SAT = 1_000_000
SAT_PER_BTC = Decimal(100_000_000)
BENCH_WALLET = "bench"


@dataclass(frozen=True)
class HotCoin:
    """An unspent output of the hot wallet as custody tracks it: outpoint, amount, key path."""

    txid: str
    vout: int
    amount: int
    script_pubkey: bytes
    change: int
    index: int


@dataclass(frozen=True)
class Timing:
    seconds: float
    signed: SignedTx
    chosen: list[HotCoin]
    change: int  # 0: no change output


def time_sign_500(keys: SignerKeys, coins: list[HotCoin], outputs: list[PayOutput], change_address: str,
                  fee_rate_sat_per_kvb: int, network: str = NETWORK) -> Timing:
    """Select coins for `outputs`, derive the chosen coins' keys and sign: one timed batch.

    Outputs without a script are parsed here (the slow path); with `pay_output` scripts they are not.
    """
    start = time.perf_counter()
    resolved = [o if o.script else pay_output(o.address, o.amount, network) for o in outputs]
    change_script = address_to_script(change_address, network)
    chosen, change, _fee = select_coins(coins, sum(o.amount for o in resolved), fee_rate_sat_per_kvb,
                                        [o.script for o in resolved], change_script)
    inputs = [SpendInput(c.txid, c.vout, c.amount, keys.private_key_for("bitcoin", "hot", c.change, c.index),
                         c.script_pubkey) for c in chosen]
    signed = sign_batch(inputs, resolved, network,
                        change=PayOutput(change_address, change, change_script) if change else None)
    return Timing(time.perf_counter() - start, signed, chosen, change)


def _btc(sat: int) -> str:
    return str(Decimal(sat) / SAT_PER_BTC)


def _fund(node: BitcoinNode, addresses: list[str]) -> str:
    """One faucet transaction paying COIN_SAT to each address."""
    return node.wallet("sendmany", "", {a: _btc(COIN_SAT) for a in addresses})


def _our_coins(node: BitcoinNode, keys: SignerKeys, n: int) -> list[HotCoin]:
    xpub = keys.account_xpub("bitcoin", "hot")
    by_address = {derive_btc_address(xpub, NETWORK, 0, i): i for i in range(n)}
    txid = _fund(node, list(by_address))
    coins = []
    for out in node.rpc("getrawtransaction", txid, True)["vout"]:
        address = out["scriptPubKey"].get("address")
        if address in by_address:
            coins.append(HotCoin(txid, out["n"], to_sat(out["value"]), bytes.fromhex(out["scriptPubKey"]["hex"]),
                                 0, by_address[address]))
    return coins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=int, default=500)
    parser.add_argument("--coins", type=int, default=200, help="confirmed coins each side chooses from")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--fee-rate", type=int, default=10, help="sat/vB, both sides")
    args = parser.parse_args()
    rate_kvb = args.fee_rate * 1000

    root = Path(tempfile.mkdtemp(prefix="bench-withdrawals-"))
    node = start_bitcoind(find_tools(), root / "bitcoind")
    wallet = None
    try:
        keys = SignerKeys(seed_from_text(Secret(MNEMONIC)), NETWORK)
        node.rpc("createwallet", BENCH_WALLET)
        wallet = JsonRpcClient(f"{node.rpc_url}/wallet/{BENCH_WALLET}", timeout=120)
        coins = _our_coins(node, keys, args.coins)
        _fund(node, [wallet.call("getnewaddress", "", "bech32") for _ in range(args.coins)])
        node.mine(1)
        # payees no wallet on this node owns (a customer's address is foreign to us): paying the
        # faucet's own addresses would time its wallet's bookkeeping, not the transaction
        payee_xpub = SignerKeys(seed_from_text(Secret(PAYEE_MNEMONIC)), NETWORK).account_xpub("bitcoin", "deposit")
        destinations = [derive_btc_address(payee_xpub, NETWORK, 0, i) for i in range(args.outputs)]
        amounts = [20_000 + i for i in range(args.outputs)]
        requested = [pay_output(a, v, NETWORK) for a, v in zip(destinations, amounts)]  # at request time
        unparsed = [PayOutput(a, v) for a, v in zip(destinations, amounts)]
        sendmany_amounts = {a: _btc(v) for a, v in zip(destinations, amounts)}
        print(f"{args.outputs} outputs ({sum(amounts):,} sat), {len(coins)} coins of {COIN_SAT:,} sat on each side, "
              f"{args.fee_rate} sat/vB, {args.reps} repetitions after 1 warm-up; medians:", flush=True)

        ours, parsed, with_send, sendmany = [], [], [], []
        ours_shape = theirs_shape = None
        for rep in range(args.reps + 1):
            change_address = derive_btc_address(keys.account_xpub("bitcoin", "hot"), NETWORK, 1, rep)
            a = time_sign_500(keys, coins, requested, change_address, rate_kvb)
            b = time_sign_500(keys, coins, unparsed, change_address, rate_kvb)
            assert b.signed.raw == a.signed.raw  # same batch either way (RFC6979 signatures)
            t0 = time.perf_counter()
            sent = node.rpc("sendrawtransaction", a.signed.raw.hex())
            send_s = time.perf_counter() - t0
            assert sent == a.signed.txid
            coins = _after_spend(coins, a, change_address, rep)

            t0 = time.perf_counter()
            txid = wallet.call("sendmany", "", sendmany_amounts, 1, "", [], True, None, "unset", args.fee_rate)
            sendmany_s = time.perf_counter() - t0
            entry = node.rpc("getmempoolentry", txid)
            theirs_shape = (len(node.rpc("getrawtransaction", txid, True)["vin"]), entry["vsize"],
                            to_sat(entry["fees"]["base"]))
            ours_shape = (len(a.chosen), a.signed.vsize, a.signed.fee)
            node.mine(1)
            if rep == 0:
                continue  # warm-up: first-call costs (imports, caches, wallet db) on both sides
            ours.append(a.seconds)
            parsed.append(b.seconds)
            with_send.append(a.seconds + send_s)
            sendmany.append(sendmany_s)

        series = {"ours": ours, "parsed": parsed, "send": with_send, "sendmany": sendmany}
        m = {k: statistics.median(v) * 1e3 for k, v in series.items()}
        lo = {k: min(v) * 1e3 for k, v in series.items()}
        line = "  {:<62} {:8.2f} ms  (min {:6.2f})"
        print(line.format("ours: select + derive keys + sign (scripts from request time)", m["ours"], lo["ours"])
              + f"  [{ours_shape[0]} inputs, {ours_shape[1]} vB, fee {ours_shape[2]} sat]")
        print(line.format(f"ours, parsing the {args.outputs} addresses at batch time", m["parsed"], lo["parsed"]))
        print(line.format("ours + sendrawtransaction (the node's mempool acceptance)", m["send"], lo["send"]))
        print(line.format("bitcoind sendmany (select, sign, mempool, wallet db)", m["sendmany"], lo["sendmany"])
              + f"  [{theirs_shape[0]} inputs, {theirs_shape[1]} vB, fee {theirs_shape[2]} sat]")
        print(f"  ratio of medians, ours / sendmany (< 1: ours is faster): {m['ours'] / m['sendmany']:.2f} signing, "
              f"{m['parsed'] / m['sendmany']:.2f} parsing addresses in the batch, "
              f"{m['send'] / m['sendmany']:.2f} signing + sendrawtransaction")
    finally:
        if wallet is not None:
            wallet.close()
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def _after_spend(coins: list[HotCoin], timing: Timing, change_address: str, rep: int) -> list[HotCoin]:
    """The hot wallet's coins once `timing.signed` is broadcast: chosen ones gone, change added."""
    spent = {(c.txid, c.vout) for c in timing.chosen}
    left = [c for c in coins if (c.txid, c.vout) not in spent]
    if timing.signed.change_vout is not None:
        left.append(HotCoin(timing.signed.txid, timing.signed.change_vout, timing.change,
                            address_to_script(change_address, NETWORK), 1, rep))
    return left


if __name__ == "__main__":
    main()
