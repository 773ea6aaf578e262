"""withdrawal_not_reversible (issue 11, observation 5): an admin key once reversed a withdrawal's
capture after its transaction was broadcast, so the customer got the money back while the coins had
left (paid twice). Now a subsystem's transaction cannot be reversed over the API at any stage: the
customer's balance stays debited, the payout goes final once, and the books reconcile at zero."""
from __future__ import annotations

import uuid
from decimal import Decimal

from sqlalchemy import text

from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered, refused, role_client
from tests.e2e.custody.conftest import BTC_FINALITY

AMOUNT = 20_000_000
FEE = 5_000


def test_an_admin_cannot_reverse_a_broadcast_withdrawal(custody, customer, bitcoind, engine, ledger, log):
    run = uuid.uuid4().hex[:8]
    backend, admin = (role_client(custody, role, f"rev-{role}") for role in ("backend", "admin"))

    log.info("a customer deposit of 1 BTC, credited at finality; the hot wallet funded")
    acct = customer("BTC")
    address = custody.wallets.issue_address(f"rev:{run}", acct).address
    bitcoind.fund(address, 100_000_000)
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 5 * 100_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    p.sync_hot_wallet()
    assert_equal(ledger.balance(acct).posted, 100_000_000)

    log.info("the backend withdraws 0.2 BTC; it is batched, signed and broadcast")
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = answered(backend, 201, backend.request_withdrawal(client_withdrawal_id=f"rev-{run}", account_id=acct,
                                                           amount=Decimal("0.2"), destination=dest))
    assert_equal(wd.state, "approved")
    wid = wd.id
    p.batch_bitcoin()
    p.sign_open_batches()
    assert_equal(p.broadcast(), 1)
    with engine.connect() as c:
        capture = c.execute(text(
            "SELECT t.id FROM journal_transaction t JOIN withdrawal_request w ON t.idempotency_key = "
            "'batch:' || w.batch_id || :suffix WHERE w.id = :w"), {"w": wid, "suffix": ":capture"}).scalar_one()
    assert_equal(ledger.balance(acct).posted, 100_000_000 - AMOUNT - FEE)

    log.info("an admin tries to reverse the capture: refused, nothing moves")
    assert_equal(refused(lambda: admin.reverse_transaction(capture, idempotency_key=f"undo-{run}")),
                 (409, "transaction_not_reversible"))
    assert_equal(ledger.balance(acct).posted, 100_000_000 - AMOUNT - FEE)

    log.info("mined to finality: paid once, booked once, reconciliation at zero")
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(backend.get_withdrawal(wid).state, "final")
    assert_equal(ledger.balance(acct).posted, 100_000_000 - AMOUNT - FEE)
    custody.deposits.run_once(["bitcoin"])
    lines = custody.reconciliation.run(chains=["bitcoin"])
    assert_equal({ln.difference for ln in lines}, {0})
