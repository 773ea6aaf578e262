"""console payout (issue 15, must show 1): two operators enrol and sign in through the console in
Debian's Chromium (Playwright, DevTools virtual authenticators), approve a withdrawal that needs two
approvals through the page, and the payout reaches `final` on regtest.

The admin approves both enrolments in the page and copies their approver entries from it; custody
and the signer are then wired again with those entries (as operations would add them to
signer.toml's `[[approvers]]` and custody's `approvers` and restart both), the running console now
serving the new wiring. The signer verifies both WebAuthn approvals against its own registry and
signs; the batch is broadcast and mined to finality. Screenshots of each step go to
test-artifacts/console/<test>/ (the path is printed). The other browser checks (own request,
auditor, kill-switch dialog, errors in the row) are in tests/integration/test_console_browser.py.
"""
from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from custody.container import Container
from custody.devchains import signer_asset_entries
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.assets import assets_from_entries
from tests.approvers import registry
from tests.browser import Browser, artifacts_dir, free_port, needs_browser, serve
from tests.console_team import approve_in_page, enrol_team
from tests.e2e.custody.api_helpers import credit
from tests.e2e.custody.conftest import BTC_FINALITY
from tests.integration.console_helpers import Console

pytestmark = [needs_browser, pytest.mark.timeout(900)]
AMOUNT = 250_000_000  # 2.5 BTC: the default policy's two-operator tier


@pytest.fixture
def browser(request):
    b = Browser(artifacts_dir(request))
    yield b
    b.close()


def test_two_operators_approve_in_the_console_and_the_payout_is_final(custody, engine, ledger, bitcoind, customer,
                                                                       signer_keys, btc_adapter, eth_adapter, usdt,
                                                                       browser, log):
    port = free_port()
    origin = f"http://localhost:{port}"
    settings = Settings(environment="test", console_origin=origin, console_rp_id="localhost")
    run = uuid.uuid4().hex[:6]
    console = Console(Container(settings=settings, engine=engine, ledger=Ledger(engine)))
    with serve(console.app, port):
        log.info("an admin, then two operators, enrol their keys in the page; the admin approves them there")
        team = enrol_team(browser, console, origin, {"anna": "operator", "ben": "operator"}, run)
        anna, ben = team["anna"], team["ben"]

        log.info("custody and the signer, wired again with the two approver entries copied from the page")
        wired = Container(settings=settings, engine=engine, ledger=Ledger(engine))
        wired.with_chains({"bitcoin": btc_adapter, "ethereum": eth_adapter}, signer_keys=signer_keys,
                          approvers=registry(extra=tuple(team.entries.values())),
                          signer_assets=assets_from_entries(signer_asset_entries(usdt.address)),
                          ethereum_chain_id=eth_adapter.chain_id,
                          cold_xpubs={"bitcoin": signer_keys.account_xpub("bitcoin", "cold")})
        console.app.state.container = wired
        p = wired.payouts
        bitcoind.fund(p.hot_address("bitcoin"), 5 * 100_000_000)
        bitcoind.mine(1)
        p.sync_hot_wallet()

        acct = customer("BTC")
        credit(wired, acct, "BTC", 3 * 100_000_000)
        destination = bitcoind.wallet("getnewaddress", "", "bech32")
        w = wired.withdrawals.request(client_withdrawal_id=f"console-{run}", account_id=acct, amount=AMOUNT,
                                      destination=destination, requested_by="backend")
        assert_equal(w.state, "pending_approval")

        log.info("anna and ben sign in and approve withdrawal %d in the page", w.id)
        anna.sign_in()
        anna.shot("queue")
        facts = approve_in_page(anna, w.id, "customer confirmed the address by phone")
        assert_equal((facts["Amount"], facts["Destination"]), ("2.50000000 BTC", destination))
        anna.shot("approved-first")
        ben.sign_in()
        ben.page.get_by_test_id(f"progress-{w.id}").filter(has_text="1 of 2").wait_for()
        ben.shot("queue-1-of-2")
        approve_in_page(ben, w.id, "second pair of eyes")
        assert "approved" in ben.page.get_by_test_id(f"note-w:{w.id}").inner_text()
        ben.shot("approved-second")
        assert_equal(wired.withdrawals.get(w.id).state, "approved")

        log.info("batch, sign (the signer verifies both WebAuthn approvals), broadcast, mine to finality")
        assert p.batch_bitcoin() is not None
        [txid] = p.sign_open_batches()
        assert_equal(p.broadcast(), 1)
        bitcoind.mine(BTC_FINALITY)
        p.track()
        assert_equal(wired.withdrawals.get(w.id).state, "final")
        received = Decimal(str(bitcoind.wallet("getreceivedbyaddress", destination)))
        assert_equal(int(received * 100_000_000), AMOUNT)

        ben.tab("payouts")
        batch = ben.page.locator("#batches tr", has_text=txid)
        batch.wait_for()
        assert f"{txid} final, {BTC_FINALITY} conf." in batch.inner_text()
        batch.locator("summary").click()
        assert f"#{w.id}: 2.50000000 BTC to {destination} (final)" in batch.inner_text()
        ben.shot("payout-final")
        ben.tab("balances")
        ben.page.locator("#balances td", has_text="hot").first.wait_for()
        ben.shot("balances")
    assert_equal(browser.errors(), [])
