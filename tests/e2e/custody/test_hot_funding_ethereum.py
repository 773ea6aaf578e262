"""hot_funding_ethereum: an operator books treasury funding of the ethereum hot address through
`POST /v1/treasury/hot-funding`, from the chain's own figures. An outside account sends the hot
address ether and the test ERC-20; before finality the route refuses (`funding_not_final`); at
finality it books both to the wei and the token unit; a second call books nothing more; a
transaction paying someone else, a transaction not mined and a bitcoin request are refused, and
only operators may call it. Reconciliation's ethereum hot lines are zero afterwards. Everything
funded here is booked before the test ends (even if it fails midway), so later suites that
reconcile see clean books. Every call goes through the typed custody.client (its `chain` is a plain
string in the model, so the bitcoin request reaches the API's own schema check)."""
from __future__ import annotations

import uuid
from decimal import Decimal

from sqlalchemy import text

from custody.auth import create_api_key
from regtest.anvil_node import FAUCET_ADDRESS
from regtest.util import assert_equal
from tests.e2e import txbuild
from tests.e2e.custody.api_helpers import answered, in_process, refusal, refused
from tests.e2e.custody.conftest import ETH_FINALITY


def hot_differences(custody) -> dict:
    custody.deposits.run_once(["ethereum"])  # the scanner at the tip, as reconciliation needs for the deposit lines
    lines = custody.reconciliation.run(chains=["ethereum"])
    return {line.asset: line.difference for line in lines if line.tier == "hot"}


def test_operator_books_ethereum_hot_funding_from_the_chain(custody, anvil, usdt, engine, ledger, log):
    p = custody.payouts
    hot = p.hot_address("ethereum")
    run = uuid.uuid4().hex[:8]
    clients = {role: in_process(custody, create_api_key(engine, f"hot-funding-{role}-{run}", role, custody.settings.api_key_pepper))
               for role in ("operator", "backend", "auditor")}

    def book(txid, role="operator", chain="ethereum"):
        api = clients[role]
        return answered(api, 200, api.book_hot_funding(chain=chain, txid=txid))

    hot_eth = custody.wallets.location_account("ethereum", "hot", "ETH")
    hot_usdt = custody.wallets.location_account("ethereum", "hot", "USDT")

    def held():  # what the books say the hot address holds (asset locations run negative)
        return (-ledger.balance(hot_eth).posted, -ledger.balance(hot_usdt).posted)

    books_before = held()
    ether, tokens = 2 * 10**18 + 12_345, 7_654_321_001
    usdt.mint(FAUCET_ADDRESS, tokens)
    log.info("an outside account sends the hot address %s %d wei and %d USDT units", hot, ether, tokens)
    ether_tx = anvil.fund(hot, ether)
    token_tx = usdt.transfer(FAUCET_ADDRESS, hot, tokens)
    try:
        log.info("before finality: refused")
        for txid in (ether_tx, token_tx):
            assert_equal(refused(lambda: book(txid)), (409, "funding_not_final"))
        assert_equal(held(), books_before)

        log.info("roles: backend and auditor may not book; bitcoin is booked by the sync; unknown txid not mined")
        for role in ("backend", "auditor"):
            assert_equal(refusal(lambda: book(ether_tx, role=role)).status, 403)
        error = refusal(lambda: book("ab" * 32, chain="bitcoin"))
        assert_equal((error.status, error.code), (422, "invalid_request"))
        assert "ethereum" in error.message  # the schema allows ethereum only (bitcoin: the sync books it)
        assert_equal(refused(lambda: book("0x" + "00" * 32)), (409, "funding_not_mined"))

        log.info("final: each booked with the chain's exact amount")
        anvil.mine(ETH_FINALITY)
        [e] = book(ether_tx)
        assert_equal((e.asset, e.source, e.amount_minor, e.amount, e.created),
                     ("ETH", "value", ether, Decimal("2.000000000000012345"), True))
        assert_equal(str(e.amount), "2.000000000000012345")
        [t] = book(token_tx)
        assert_equal((t.asset, t.source.startswith("log"), t.amount_minor, t.amount, t.created),
                     ("USDT", True, tokens, Decimal("7654.321001"), True))
        assert_equal(str(t.amount), "7654.321001")
        books_after = held()
        assert_equal(books_after, (books_before[0] + ether, books_before[1] + tokens))

        log.info("again: already booked, nothing more moves")
        again = [book(txid)[0] for txid in (ether_tx, token_tx)]
        assert_equal([(i.journal_transaction_id, i.created) for i in again],
                     [(e.journal_transaction_id, False), (t.journal_transaction_id, False)])
        assert_equal(held(), books_after)

        log.info("a final transaction paying someone else is refused")
        elsewhere = anvil.fund(txbuild.eth_new_address(f"hot-funding-elsewhere-{run}"), 10**15)
        anvil.mine(ETH_FINALITY)
        assert_equal(refused(lambda: book(elsewhere)), (422, "funding_not_to_hot"))

        with engine.connect() as c:
            audited = c.execute(text("SELECT actor, detail FROM audit_event WHERE action = 'hot_funding.book' "
                                     "AND subject = :s ORDER BY id"), {"s": f"tx:{ether_tx.lower()}"}).all()
        assert_equal([(a.actor, [i["created"] for i in a.detail["items"]]) for a in audited],
                     [(f"api:hot-funding-operator-{run}", [True]), (f"api:hot-funding-operator-{run}", [False])])
    finally:  # never leave unbooked funding behind for the suites that reconcile after this one
        anvil.mine(ETH_FINALITY)
        for txid in (ether_tx, token_tx):
            p.book_ethereum_funding(txid, by="test-cleanup")

    log.info("reconciliation: the ethereum hot lines are zero")
    assert_equal(hot_differences(custody), {"ETH": 0, "USDT": 0})
    ledger.assert_verified()
