"""Batching rescreens many destinations at once (`DestinationGuard.refusals_at_payout`, one
lookup of the recorded own addresses for the whole batch): each row gets exactly the code the
one-destination decision (`_decide`, what a request is checked by) gives it, in the rows' order,
whatever the mix: an issued deposit address (recorded; also spelled in uppercase, which BIP173
allows), an address recorded as ours only (a hot coin's, not derived ahead: only the batch's one
lookup finds it), a hot change address the next batches will take (derived), a hot receive
address, an outside payee, and a row repeating an address."""
from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.destinations import DestinationGuard
from custody.errors import CustodyErrorCode
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.withdrawal_api import WithdrawalApi, with_bitcoin_wallets

log = logging.getLogger(__name__)
PAYEE_MNEMONIC = "legal winner thank year wave sausage worth useful legal winner thank yellow"


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    return with_bitcoin_wallets(WithdrawalApi(engine))


def test_a_batch_of_destinations_gets_each_rows_own_decision(api, ledger):
    custody = api.custody
    acct = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    issued = custody.wallets.issue_address(f"batched-{uuid.uuid4().hex}", acct).address
    with custody.engine.connect() as c:
        last_batch = c.execute(text("SELECT coalesce(max(id), 0) FROM withdrawal_batch")).scalar_one()
        hot_xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).scalar_one()
    payee_xpub = SignerKeys(seed_from_text(Secret(PAYEE_MNEMONIC)), "regtest").account_xpub("bitcoin", "deposit")
    outside = derive_btc_address(payee_xpub, "regtest", 0, 7)
    recorded_only = derive_btc_address(payee_xpub, "regtest", 0, 9)
    with custody.engine.begin() as c:  # as if a coin of ours had been recorded there
        c.execute(text("INSERT INTO wallet_utxo (txid, vout, address, derivation_change, derivation_index, amount) "
                       "VALUES (:t, 0, :a, 0, 999, 1000)"), {"t": uuid.uuid4().hex * 2, "a": recorded_only})
    destinations = {
        "issued deposit address": issued,
        "issued, in uppercase": issued.upper(),
        "recorded hot coin address": recorded_only,
        "next batch's change": derive_btc_address(hot_xpub, "regtest", 1, last_batch + 2),
        "hot receive": derive_btc_address(hot_xpub, "regtest", 0, 0),
        "outside payee": outside,
        "outside payee again": outside,
    }
    rows = [SimpleNamespace(asset="BTC", account_id=acct, destination=d, amount=20_000) for d in destinations.values()]
    guard = DestinationGuard(custody.engine, custody.wallets, {})
    ca = custody.wallets.chain_asset("BTC")
    with custody.engine.connect() as c:
        batched = guard.refusals_at_payout(c, rows)
        one_by_one = [guard._decide(c, ca, acct, r.destination, r.amount)[0] for r in rows]
    log.info("batched %s", dict(zip(destinations, batched)))
    assert_equal(batched, one_by_one)
    internal = CustodyErrorCode.destination_internal
    assert_equal(dict(zip(destinations, batched)), {
        "issued deposit address": internal, "issued, in uppercase": internal, "recorded hot coin address": internal,
        "next batch's change": internal,
        "hot receive": internal, "outside payee": None, "outside payee again": None})
