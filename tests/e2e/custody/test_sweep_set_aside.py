"""sweep_set_aside: two sweeps are on chain and final; a writer (a bug, or anyone with the ledger's
Python API) posts a balanced entry crediting the deposit location (equity -> deposit location)
so that the larger sweep's final booking would take that location above zero (`limit_exceeded`).
The sweeps' tracking does not raise: the smaller sweep is booked, the larger one is set aside with
a critical incident (its coins moved on chain; the kill switch engages) and skipped from then on.
Once the planted entry is reversed and an operator retries the sweep over the API, it is booked
exactly once; reconciliation at zero (not while the planted entry stands: it changes the deposit
location's books by design); verify() ok. The operator retries through the typed custody.client."""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import kill_switch, set_kill_switch
from ledger.model import Transfer
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import answered, refused, role_client
from tests.e2e.custody.conftest import BTC_FINALITY


def deposit(custody, customer, bitcoind, amount: int) -> None:
    acct = customer("BTC")
    bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, amount)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])


def books_of(engine, sweep_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key = :k"),
                         {"k": f"sweep:{sweep_id}:final"}).scalar_one()


def test_refused_sweep_booking_is_set_aside_and_retried_once(custody, customer, bitcoind, engine, ledger, log):
    sweeps = custody.sweeps
    log.info("two sweeps of different sizes, broadcast and mined to finality")
    deposit(custody, customer, bitcoind, 5_000_000)
    first = sweeps.sweep_bitcoin()
    deposit(custody, customer, bitcoind, 200_000)
    second = sweeps.sweep_bitcoin()
    assert_equal(sweeps.broadcast(), 2)
    bitcoind.mine(BTC_FINALITY)
    with engine.connect() as c:
        small, large = c.execute(text("SELECT id, amount FROM sweep WHERE txid = ANY(:t) ORDER BY amount"),
                                 {"t": [first, second]}).all()
    assert int(large.amount) > int(small.amount)

    log.info("a writer credits the deposit location so that the small sweep still fits under zero, the large one not "
             "(in either order)")
    location = custody.wallets.location_account("bitcoin", "deposit", "BTC")
    equity = custody.wallets.firm_account("equity", "BTC")
    room = -ledger.balance(location).posted  # asset locations run negative
    planted = ledger.post(f"test:poison-sweep:{large.id}", [Transfer(equity, location, room - int(large.amount) + 1)],
                          kind="test_planted")

    log.info("tracking books the small sweep and sets the large one aside, critical")
    assert_equal(sweeps.track(), 1)
    assert_equal((books_of(engine, small.id), books_of(engine, large.id)), (1, 0))
    with engine.connect() as c:
        incident = c.execute(text("SELECT id, kind, severity, detail FROM incident WHERE kind = 'sweep_set_aside' "
                                  "AND detail ->> 'id' = :s"), {"s": str(large.id)}).one()
        row = c.execute(text("SELECT state, containment, set_aside_step FROM sweep WHERE id = :s"), {"s": large.id}).one()
    assert_equal((incident.severity, incident.detail["code"], incident.detail["step"], incident.detail["on_chain"]),
                 ("critical", "limit_exceeded", "track", True))
    assert kill_switch(engine).engaged
    assert_equal(tuple(row), ("broadcast", "set_aside", "track"))
    assert_equal(sweeps.track(), 0)  # skipped from now on

    log.info("the planted entry is reversed; the operator retries the sweep over the API")
    ledger.reverse(planted.transaction_id, f"test:poison-sweep:{large.id}:reversal")
    operator = role_client(custody, "operator", "operator")
    for retry, code in ((lambda: operator.retry_sweep(small.id, comment="x"), "retry_not_set_aside"),
                        (lambda: operator.retry_rebalance(999999999, comment="x"), "retry_unknown")):
        assert_equal(refused(retry)[1], code)
    answer = answered(operator, 200, operator.retry_sweep(large.id, comment="planted credit reversed"))
    assert_equal((answer.kind, answer.failed_step), ("sweep", "track"))
    assert_equal(sweeps.track(), 1)
    assert_equal(sweeps.track(), 0)
    assert_equal(books_of(engine, large.id), 1)

    with engine.begin() as c:  # an admin's decision once the incident is explained
        set_kill_switch(c, False, "test: set-aside sweep booked after retry", "op-test")
    custody.deposits.run_once(["bitcoin"])
    custody.payouts.sync_hot_wallet()
    lines = custody.reconciliation.run(chains=["bitcoin"])
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.difference for ln in lines}, {0})
