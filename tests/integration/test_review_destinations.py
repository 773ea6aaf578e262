"""Adversarial review of issue 11 (observation 3): an address the service will derive later is
still payable once it lies beyond `custody.destinations.LOOKAHEAD`.

The guard refuses issued and recorded addresses and the next LOOKAHEAD derived ones (hot change
addresses `1/<batch id>` for the next 20 batch ids; deposit addresses up to the gap limit past the
next index). The module says such an address is refused "always before payment"; one a little
further on is not refused at the request, nor at batching (the lookahead moves with the batches,
so the address is still ahead when the payout is batched and paid).

Why it matters: anyone who knows the hot wallet's account xpub (it is in the `wallet` table, so
in every database copy and backup; the API key design assumes such copies can leak) pays 0.0001
BTC to the change address of batch id last+21. Batches later, batch last+21 exists, and
reconciliation's hot line (`Reconciliation._hot_wallet`) counts the unspent coins at `1/<id>` of
every batch: the customer's payout is on chain at our address and in no book, a difference, a
critical incident, the kill switch, every customer's withdrawals halted (observation 3 again),
for the price of one minimum withdrawal, repeatable at will. (`Payouts.sync_hot_wallet` also
records the coin as spendable without booking it: `_record_coin` matches "ours" by txid alone.)
(Fixed: change addresses are refused `CHANGE_LOOKAHEAD` batch ids ahead; one further ahead, paid
anyway, is booked as hot funding with a warning when its batch exists, never taken as our change:
tests/e2e/custody/test_withdrawal_future_change_address.py.)
The deposit wallet is open the same way: pay the first deposit index not derived ahead, then ask
for deposit addresses until it is issued; the scanner never saw the payment (its block was scanned
before the address was watched) and `Reconciliation._deposit_addresses` counts it.
"""
from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import text

from custody.addresses import derive_btc_address
from custody.destinations import CHANGE_LOOKAHEAD, LOOKAHEAD
from regtest.util import assert_equal
from tests.integration.withdrawal_api import WithdrawalApi, with_bitcoin_wallets

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def api(engine) -> WithdrawalApi:
    return with_bitcoin_wallets(WithdrawalApi(engine))


def test_a_hot_change_address_beyond_the_lookahead_is_refused_as_internal(api, ledger):
    with api.custody.engine.connect() as c:
        last_batch = c.execute(text("SELECT coalesce(max(id), 0) FROM withdrawal_batch")).scalar_one()
        hot_xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'hot'")).scalar_one()
    within = derive_btc_address(hot_xpub, "regtest", 1, last_batch + LOOKAHEAD)
    beyond = derive_btc_address(hot_xpub, "regtest", 1, last_batch + LOOKAHEAD + 1)
    far = derive_btc_address(hot_xpub, "regtest", 1, last_batch + CHANGE_LOOKAHEAD)
    acct = api.open_customer(f"cust-{uuid.uuid4().hex[:8]}")
    answers = {}
    for name, address in (("change of batch last+20", within), ("change of batch last+21", beyond),
                          ("change of batch last+CHANGE_LOOKAHEAD", far)):
        r = api.backend.post("/v1/withdrawals", json={"client_withdrawal_id": uuid.uuid4().hex, "account_id": acct,
                                                       "amount": "0.0001", "destination": address})
        answers[name] = (r.status_code, r.json().get("error", {}).get("code") or r.json()["state"])
        log.info("%s %s -> %s", name, address, answers[name])
    api.reject_all(acct)
    assert_equal(answers, {"change of batch last+20": (422, "destination_internal"),
                           "change of batch last+21": (422, "destination_internal"),
                           "change of batch last+CHANGE_LOOKAHEAD": (422, "destination_internal")})
