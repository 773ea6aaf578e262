"""withdrawal_set_aside_ethereum: two ether withdrawals, one batch each. A writer (a bug, or anyone
with the ledger's Python API) posts first under the first batch's capture key, so its capture is
refused at signing: that batch is set aside with a warning incident, and the nonce it had taken is
given back with the rolled-back transaction, so the other batch is signed with it, mined (no nonce
gap stalls the hot address) and booked final. An operator retries the set-aside batch over the API:
its withdrawal is re-batched, signed with the next nonce, paid and captured exactly once. The planted
transaction balances (1 wei equity -> suspense) and touches no asset location; it is reversed at the
end; reconciliation of ethereum at zero; verify() ok."""
from __future__ import annotations

from sqlalchemy import text

from custody.controls import kill_switch
from custody.jobs import payouts_once
from ledger.model import Transfer
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.api_helpers import answered, role_client
from tests.e2e.custody.conftest import ETH_FINALITY

ETH = 10**18
ETH_FEE = 10**15  # quoted per ether withdrawal


def captures_of(engine, withdrawal_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM journal_transaction WHERE kind = 'withdrawal_capture' "
                              "AND metadata -> 'withdrawals' @> CAST(:w AS jsonb)"), {"w": f"[{withdrawal_id}]"}).scalar_one()


def nonce_of(engine, withdrawal_id: int) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT t.nonce FROM chain_transaction t JOIN withdrawal_request w ON w.batch_id = t.batch_id "
                              "WHERE w.id = :w"), {"w": withdrawal_id}).scalar_one()


def test_refused_ethereum_capture_gives_its_nonce_back(custody, customer, anvil, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    acct = customer("ETH")
    anvil.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 5 * ETH)
    funding = anvil.fund(p.hot_address("ethereum"), 10 * ETH)
    p.book_hot_funding("ethereum", "ETH", 10 * ETH, f"hot-funding:ethereum:{funding}")
    anvil.mine(ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    assert_equal(ledger.balance(acct).posted, 5 * ETH)

    bad = w.request(client_withdrawal_id=f"bad-{acct}", account_id=acct, amount=ETH, destination=txbuild.eth_new_address("bad"),
                    requested_by="backend")
    good = w.request(client_withdrawal_id=f"good-{acct}", account_id=acct, amount=ETH // 2,
                     destination=txbuild.eth_new_address("good"), requested_by="backend")
    bad_batch, good_batch = p.batch_ethereum()
    log.info("a writer posts first under custody's capture key for batch %d (balanced: 1 wei equity -> suspense)", bad_batch)
    suspense, equity = custody.wallets.firm_account("suspense", "ETH"), custody.wallets.firm_account("equity", "ETH")
    planted = ledger.post(f"batch:{bad_batch}:capture", [Transfer(suspense, equity, 1)], kind="test_planted")

    log.info("the job: the poisoned batch is set aside (warning), the other signed with the nonce it gave back")
    next_nonce = anvil.w3.eth.get_transaction_count(p.hot_address("ethereum"), "pending")
    payouts_once(custody)
    with engine.connect() as c:
        incident = c.execute(text("SELECT kind, severity, detail FROM incident WHERE detail ->> 'batch_id' = :b"),
                             {"b": str(bad_batch)}).one()
        row = c.execute(text("SELECT state, containment FROM withdrawal_batch WHERE id = :b"), {"b": bad_batch}).one()
    assert_equal((incident.kind, incident.severity, incident.detail["code"], incident.detail["chain"]),
                 ("batch_set_aside", "warning", "idempotency_conflict", "ethereum"))
    assert_equal(tuple(row), ("open", "set_aside"))
    assert not kill_switch(engine).engaged
    assert w.get(good.id).state in ("broadcast", "confirmed")  # anvil mines it at once
    first_nonce = nonce_of(engine, good.id)
    assert_equal(first_nonce, next_nonce)  # the nonce the poisoned batch had taken came back: no gap
    anvil.mine(ETH_FINALITY)
    payouts_once(custody)
    assert_equal(w.get(good.id).state, "final")

    log.info("the operator retries it: re-batched, signed with the next nonce, paid once")
    operator = role_client(custody, "operator", "operator")
    answered(operator, 200, operator.retry_batch(bad_batch, comment="capture key squatted"))
    payouts_once(custody)
    assert w.get(bad.id).batch_id not in (None, bad_batch)
    assert_equal(nonce_of(engine, bad.id), first_nonce + 1)
    anvil.mine(ETH_FINALITY)
    payouts_once(custody)
    assert_equal((w.get(bad.id).state, captures_of(engine, bad.id)), ("final", 1))
    assert_equal(ledger.balance(acct).posted, 5 * ETH - ETH - ETH // 2 - 2 * ETH_FEE)

    ledger.reverse(planted.transaction_id, f"test:planted:{bad_batch}:reversal")
    custody.deposits.run_once(["ethereum"])
    lines = custody.reconciliation.run(chains=["ethereum"])
    assert {"deposit", "hot"} <= {ln.tier for ln in lines}
    assert_equal({ln.difference for ln in lines}, {0})
