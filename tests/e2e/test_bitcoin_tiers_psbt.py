"""bitcoin_tiers_psbt: cold -> hot through a PSBT. Custody builds the unsigned PSBT spending cold coins
to our hot receive address only (change to a fresh cold address); the operator exports it (the
`psbt` CLI over the API), signs it offline with a bitcoind descriptor wallet holding the cold
account's private key (`walletprocesspsbt`), and imports it. The PSBT states each key's BIP32
derivation (no origin recorded: the account xpub's own fingerprint, path `0/<index>` below it, as
bitcoind reads its origin-less descriptor). The import refuses the unsigned PSBT
and one signed for other outputs; the accepted one is broadcast by the worker's job and booked once
at finality: hot location debited the amount, cold location credited amount + fee, the fee to
network-fee expense. Reconciliation is zero at the end (cold line included), nothing is left in
flight, the ledger verifies."""
from __future__ import annotations

import uuid

from bip_utils import Base58Decoder, Base58Encoder, Bip39SeedGenerator, Bip84, Bip84Coins
from sqlalchemy import text

from chain_adapters.bitcoin import to_sat
from custody.addresses import btc_key_origin, derive_btc_address
from custody.psbt import PsbtInput, build, encode
from custody.psbt_cli import main as psbt_cli
from custody.rebalances import RebalanceConfig, RebalanceThreshold
from regtest.util import assert_equal
from signer.bitcoin_tx import address_to_script
from tests.approvers import operator_client
from tests.e2e.custody.conftest import BTC_FINALITY, TEST_MNEMONIC, custody, signer_keys  # noqa: F401 - fixtures
from tests.e2e.treasury_helpers import rebalances, reconciled, spendable  # noqa: F401 - fixture

BTC = 100_000_000
TPRV = bytes.fromhex("04358394")  # BIP32 version bytes of a testnet/regtest private key (what bitcoind reads)


def offline_signer(bitcoind, signer_keys):  # noqa: F811
    """A bitcoind descriptor wallet holding the cold account's PRIVATE key (what an offline machine holds)."""
    account = Bip84.FromSeed(Bip39SeedGenerator(TEST_MNEMONIC).Generate(), Bip84Coins.BITCOIN_REGTEST).Purpose().Coin().Account(3)
    assert_equal(account.PublicKey().ToExtended(), signer_keys.account_xpub("bitcoin", "cold"))  # the same cold account
    tprv = Base58Encoder.CheckEncode(TPRV + Base58Decoder.CheckDecode(account.PrivateKey().ToExtended())[4:])
    name = f"cold-offline-{uuid.uuid4().hex[:8]}"
    bitcoind.rpc("createwallet", name, False, True)  # blank: it holds only what is imported
    wallet = bitcoind._client(f"/wallet/{name}")  # noqa: SLF001 - a second wallet on the test node
    desc = f"wpkh({tprv}/0/*)"
    desc += "#" + bitcoind.rpc("getdescriptorinfo", desc)["checksum"]  # the checksum of the private form
    [imported] = wallet.call("importdescriptors", [{"desc": desc, "timestamp": "now", "range": [0, 200]}])
    assert imported["success"], imported
    return name, wallet


def test_cold_to_hot_through_a_psbt(custody, bitcoind, engine, ledger, signer_keys, rebalances, tmp_path, log):  # noqa: F811
    wallets, hot_address = custody.wallets, custody.payouts.hot_address("bitcoin")
    wallets.register_wallet("bitcoin", "cold", "regtest", signer_keys.account_xpub("bitcoin", "cold"))
    hot = wallets.location_account("bitcoin", "hot", "BTC")
    cold = wallets.location_account("bitcoin", "cold", "BTC")
    expense = wallets.firm_account("network_fees", "BTC")

    log.info("cold gets coins the way it does in production: a hot -> cold rebalance above the ceiling")
    bitcoind.mine(1)
    prior = reconciled(custody, ("deposit", "hot", "cold"))["cold"].on_chain  # what earlier suites left in cold
    base = spendable(custody, engine)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=base + BTC, target=base + BTC // 4)})
    bitcoind.fund(hot_address, 2 * BTC)
    bitcoind.mine(1)
    assert_equal(spendable(custody, engine), base + 2 * BTC)  # recorded (booked as treasury funding)
    assert rebalances.rebalance_bitcoin() is not None
    rebalances.run_once()
    bitcoind.mine(1)
    custody.deposits.run_once(["bitcoin"])  # the wallet index holds the new cold coin now
    client = operator_client(custody, "op-trent")
    more = prior + BTC  # payable only with the new coin, which is mined but not booked: not spendable yet
    early = client.post("/v1/rebalances/cold-to-hot", json={"amount": f"{more // BTC}.{more % BTC:08d}"})
    assert_equal((early.status_code, early.json()["error"]["code"]), (409, "rebalance_insufficient_funds"))
    bitcoind.mine(BTC_FINALITY - 1)
    assert_equal(rebalances.track(), 1)
    rebalances.config = RebalanceConfig(thresholds={"BTC": RebalanceThreshold(ceiling=base + 100 * BTC, target=base)})
    reconciled(custody, ("deposit", "hot", "cold"))
    before = {a: ledger.balance(a).posted for a in (hot, cold, expense)}
    held = spendable(custody, engine)

    log.info("an operator opens a 1.5 BTC cold -> hot move: custody builds the unsigned PSBT")
    opened = client.post("/v1/rebalances/cold-to-hot", json={"amount": "1.5"})
    assert_equal(opened.status_code, 201)
    move = opened.json()["rebalance"]
    rid = move["id"]
    assert_equal((move["source_tier"], move["destination_tier"], move["state"], move["amount_minor"], move["destination"]),
                 ("cold", "hot", "open", str(3 * BTC // 2), hot_address))
    again = client.post("/v1/rebalances/cold-to-hot", json={"amount": "0.1"})
    assert_equal((again.status_code, again.json()["error"]["code"]), (409, "rebalance_in_progress"))
    decoded = bitcoind.rpc("decodepsbt", opened.json()["psbt"])
    outputs = {o["scriptPubKey"]["address"]: to_sat(o["value"]) for o in decoded["tx"]["vout"]}
    assert_equal(outputs[hot_address], 3 * BTC // 2)
    with engine.connect() as c:
        change_address = c.execute(text("SELECT change_address FROM rebalance WHERE id = :r"), {"r": rid}).scalar_one()
    assert set(outputs) <= {hot_address, change_address}  # our hot address, change to our own cold address only
    assert_equal(decoded["fee"] > 0, True)
    log.info("every input and our outputs state their BIP32 derivation; no origin is recorded: below the account xpubs")
    own = {t: btc_key_origin(signer_keys.account_xpub("bitcoin", t), "regtest", 0, 0)[1].hex() for t in ("hot", "cold")}
    for vin in decoded["inputs"]:
        [derivation] = vin["bip32_derivs"]
        assert_equal((derivation["master_fingerprint"], derivation["path"].count("/")), (own["cold"], 2))
        assert derivation["path"].startswith("m/0/"), derivation
    for vout, out in zip(decoded["tx"]["vout"], decoded["outputs"]):
        [derivation] = out["bip32_derivs"]
        to_hot = vout["scriptPubKey"]["address"] == hot_address
        assert_equal((derivation["master_fingerprint"], derivation["path"].startswith("m/0/")),
                     (own["hot" if to_hot else "cold"], True))
        assert not to_hot or derivation["path"] == "m/0/0", derivation

    log.info("the operator exports it with the CLI and signs it offline")
    unsigned_file, signed_file, key_file = tmp_path / "unsigned.psbt", tmp_path / "signed.psbt", tmp_path / "api-key"
    key_file.write_text(client.headers["X-API-Key"])
    key_file.chmod(0o600)
    cli = ["--api-key-file", str(key_file)]
    assert_equal(psbt_cli(["export", str(rid), "--out", str(unsigned_file), *cli], http=client), 0)
    _name, offline = offline_signer(bitcoind, signer_keys)
    processed = offline.call("walletprocesspsbt", unsigned_file.read_text().strip())
    assert processed["complete"], processed
    signed_file.write_text(processed["psbt"])

    log.info("refused: the unsigned PSBT, and a PSBT signed by the same key for another output")
    unsigned = client.post(f"/v1/rebalances/{rid}/psbt", json={"psbt": unsigned_file.read_text().strip()})
    assert_equal((unsigned.status_code, unsigned.json()["error"]["code"]), (422, "psbt_not_signed"))
    with engine.connect() as c:
        inputs = c.execute(text("SELECT txid, vout, amount, derivation_index FROM rebalance_input WHERE rebalance_id = :r "
                                "ORDER BY txid, vout"), {"r": rid}).all()
    cold_xpub = signer_keys.account_xpub("bitcoin", "cold")
    stranger = bitcoind.wallet("getnewaddress", "", "bech32")
    elsewhere = build([PsbtInput(k.txid, k.vout, int(k.amount), address_to_script(
        derive_btc_address(cold_xpub, "regtest", 0, k.derivation_index), "regtest")) for k in inputs],
        [(address_to_script(stranger, "regtest"), 3 * BTC // 2)])
    redirected = offline.call("walletprocesspsbt", encode(elsewhere))
    assert redirected["complete"]
    wrong = client.post(f"/v1/rebalances/{rid}/psbt", json={"psbt": redirected["psbt"]})
    assert_equal((wrong.status_code, wrong.json()["error"]["code"]), (422, "psbt_transaction_mismatch"))
    garbage = client.post(f"/v1/rebalances/{rid}/psbt", json={"psbt": "bm90IGEgcHNidA=="})
    assert_equal((garbage.status_code, garbage.json()["error"]["code"]), (422, "psbt_malformed"))
    assert_equal(client.get(f"/v1/rebalances/{rid}/psbt").status_code, 200)  # still open: nothing accepted

    log.info("the signed PSBT is imported (the CLI again), broadcast by the worker's job and booked at finality")
    assert_equal(psbt_cli(["import", str(rid), str(signed_file), *cli], http=client), 0)
    with engine.connect() as c:
        moved = c.execute(text("SELECT state, txid, amount, fee FROM rebalance WHERE id = :r"), {"r": rid}).one()
    assert_equal(moved.state, "signed")
    exported = client.get(f"/v1/rebalances/{rid}/psbt")
    assert_equal((exported.status_code, exported.json()["error"]["code"]), (409, "invalid_state"))
    log.info("the api may write an imported transaction's columns: a forged fee (or raw) is never sent")
    with engine.begin() as c:
        c.execute(text("UPDATE rebalance SET fee = fee + 1000 WHERE id = :r"), {"r": rid})
    assert_equal(rebalances.broadcast(), 0)
    assert moved.txid not in bitcoind.rpc("getrawmempool")
    with engine.begin() as c:
        c.execute(text("UPDATE rebalance SET fee = fee - 1000 WHERE id = :r"), {"r": rid})
    rebalances.run_once()
    assert moved.txid in bitcoind.rpc("getrawmempool")
    assert_equal(to_sat(bitcoind.rpc("getmempoolentry", moved.txid)["fees"]["base"]), int(moved.fee))
    bitcoind.mine(BTC_FINALITY)
    assert_equal(rebalances.track(), 1)
    amount, fee = int(moved.amount), int(moved.fee)
    assert_equal(ledger.balance(hot).posted - before[hot], -amount)
    assert_equal(ledger.balance(cold).posted - before[cold], amount + fee)
    assert_equal(ledger.balance(expense).posted - before[expense], -fee)
    assert_equal(spendable(custody, engine), held + amount)  # final: the coin is hot's to spend, never "funding"
    assert_equal(ledger.balance(hot).posted - before[hot], -amount)
    with engine.connect() as c:
        assert_equal(c.execute(text("SELECT count(*) FROM rebalance WHERE state NOT IN ('final', 'abandoned')")).scalar_one(), 0)
    reconciled(custody, ("deposit", "hot", "cold"))
    ledger.assert_verified()
