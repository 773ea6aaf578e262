"""console in a browser (issue 15, must show 1, without chain nodes): Playwright drives Debian's
Chromium with a DevTools virtual authenticator per person (tests/browser.py).

An admin, two operators and an auditor enrol their keys in the page; the admin (approved by the
bootstrap admin API key) approves the others in the Enrolments tab and copies the operators'
approver entries from the page, which configure custody's approver keys. Then, each step
screenshotted into test-artifacts/console/<test>/:
- a 5 BTC withdrawal (two operators) is approved by both through the page: the confirmation repeats
  asset, amount in units with the symbol, destination with allowlist status and first sight,
  requester and policy reasons; the second operator's row shows "1 of 2" with the first's name;
- the first operator's own request shows as theirs, with no Approve button (the service refuses it
  too: tests/integration/test_console_approvals.py);
- a failed action (approving a withdrawal whose decision expired (two days later by custody's clock) while the
  page was open) shows its
  error in the row;
- the auditor sees the queue and the kill switch but no action button;
- cancelling the kill-switch dialog engages nothing; engaging needs a typed reason; only the admin
  releases it;
- a treasury adjustment proposed in the page is marked as the proposer's own; another operator
  approves it there (signing its payload with their key): it is approved, and posted by the
  worker's job; every page renders for the auditor without a button, and
  the audit trail finds the approvals with their comments.
The payout on regtest after approvals in the page: tests/e2e/custody/test_console_payout.py.
"""
from __future__ import annotations

import datetime as dt
import logging
import uuid

import pytest

from playwright.sync_api import expect

from custody.settings import Settings
from regtest.util import assert_equal
from tests.browser import Browser, artifacts_dir, free_port, needs_browser, serve
from tests.console_team import approve_in_page, enrol_team
from tests.integration.adjustment_helpers import run_adjustments_job
from tests.integration.console_helpers import Console
from tests.integration.withdrawal_api import DEST, WithdrawalApi

pytestmark = [needs_browser, pytest.mark.timeout(600)]
log = logging.getLogger(__name__)


@pytest.fixture
def browser(request):
    b = Browser(artifacts_dir(request))
    yield b
    b.close()


def test_the_team_works_in_the_console(engine, ledger, browser):
    port = free_port()
    origin = f"http://localhost:{port}"
    settings = Settings(environment="test", console_origin=origin, console_rp_id="localhost")
    run = uuid.uuid4().hex[:6]
    api = WithdrawalApi(engine)
    api.custody.settings = settings
    console = Console(api.custody)
    with serve(console.app, port):
        team = enrol_team(browser, console, origin, {"anna": "operator", "ben": "operator", "audrey": "auditor"}, run)
        log.info("the operators' approver entries, as an admin adds them to the signer's and custody's configuration")
        api_with_keys = WithdrawalApi(engine, extra_approvers=tuple(team.entries.values()))
        api_with_keys.custody.settings = settings
        console.app.state.container = api_with_keys.custody  # "restart" custody with the new approvers
        api = api_with_keys
        anna, ben, audrey, admin = team["anna"], team["ben"], team["audrey"], team["admin"]

        acct = api.open_customer(f"browser-{run}")
        w = api.withdraw(acct, "5")
        own = api.custody.withdrawals.request(client_withdrawal_id=uuid.uuid4().hex, account_id=acct, amount=100_000_000,
                                              destination=DEST, requested_by=f"api:{anna.name}")  # e.g. a quarantine return
        doomed = api.withdraw(acct, "3")
        assert_equal((w["state"], own.state, doomed["state"]), ("pending_approval",) * 3)

        for person in (anna, ben, audrey):
            person.sign_in()
        anna.shot("queue")
        own_row = anna.page.locator(f"tr[data-withdrawal='{own.id}']")
        assert_equal(own_row.get_by_role("button", name="Approve").count(), 0)
        assert "your request" in own_row.inner_text()

        log.info("anna approves the 5 BTC withdrawal through the page")
        facts = approve_in_page(anna, w["id"], "destination confirmed with the customer by phone")
        assert_equal(facts["Amount"], "5.00000000 BTC")
        assert_equal((facts["Destination"], facts["Requested by"]), (DEST, f"api:backend-1-{api.run}"))
        assert facts["Allowlist"] and facts["Policy reasons"] != "none" and facts["Destination first seen"]
        note = anna.page.get_by_test_id(f"note-w:{w['id']}")
        assert "pending_approval" in note.inner_text(), note.inner_text()
        anna.shot("approved-first")

        log.info("ben sees 1 of 2 by anna and gives the second approval")
        ben.page.reload()
        ben.page.get_by_test_id(f"progress-{w['id']}").filter(has_text="1 of 2").wait_for()
        assert anna.name in ben.page.get_by_test_id(f"progress-{w['id']}").inner_text()
        ben.shot("queue-1-of-2")
        approve_in_page(ben, w["id"], "second pair of eyes")
        assert "approved" in ben.page.get_by_test_id(f"note-w:{w['id']}").inner_text()
        ben.shot("approved-second")
        assert_equal(api.custody.withdrawals.get(w["id"]).state, "approved")

        log.info("a failed action shows its error next to its row: the decision expired while the page was open")
        ben.page.reload()
        ben.page.locator(f"tr[data-withdrawal='{doomed['id']}']").wait_for()
        withdrawals = api.custody.withdrawals
        withdrawals.clock = lambda: dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)  # the decision lives 24 h
        approve_in_page(ben, doomed["id"], "looks fine")
        withdrawals.clock = lambda: dt.datetime.now(dt.timezone.utc)
        row = ben.page.locator(f"tr[data-withdrawal='{doomed['id']}']")
        error = row.get_by_test_id(f"note-w:{doomed['id']}")
        assert "decision_expired" in error.inner_text() and "row-error" in error.get_attribute("class")
        assert_equal(api.custody.withdrawals.get(doomed["id"]).state, "pending_approval")
        ben.shot("error-next-to-row")

        log.info("the auditor sees everything and no action")
        audrey.page.reload()
        audrey.page.locator(f"tr[data-withdrawal='{own.id}']").wait_for()
        assert_equal(audrey.page.locator("#queue button").count(), 0)
        assert "(auditor)" in audrey.page.get_by_test_id("who").inner_text()
        audrey.tab("kill")
        audrey.page.get_by_test_id("kill-state").wait_for()
        assert_equal(audrey.page.locator("#kill button").count(), 0)
        audrey.shot("auditor-no-actions")

        log.info("cancelling the kill-switch dialog engages nothing; a typed reason engages it; the admin releases it")
        anna.tab("kill")
        anna.page.click("#engage")
        anna.page.locator("#confirm").wait_for()
        anna.shot("kill-dialog")
        anna.page.click("#confirm-cancel")
        anna.page.get_by_test_id("note-kill").wait_for()
        assert "Off" in anna.page.get_by_test_id("kill-state").inner_text()
        assert_equal(console.admin_key.get("/v1/kill-switch").json()["engaged"], False)
        anna.shot("kill-cancelled")
        anna.page.click("#engage")
        anna.page.click("#confirm-ok")  # without a reason: refused in the dialog
        assert "required" in anna.page.locator("#confirm-error").inner_text()
        anna.page.fill("#confirm-input", "browser test: suspicious activity")
        anna.page.click("#confirm-ok")
        anna.page.get_by_test_id("kill-state").filter(has_text="ENGAGED").wait_for()
        assert_equal(anna.page.locator("#release").count(), 0)  # an operator cannot release it
        anna.shot("kill-engaged")
        admin.tab("kill")
        admin.page.click("#release")
        admin.page.fill("#confirm-input", "false alarm, checked")
        admin.page.click("#confirm-ok")
        admin.page.get_by_test_id("kill-state").filter(has_text="Off").wait_for()
        admin.shot("kill-released")
        assert_equal(console.admin_key.get("/v1/kill-switch").json()["engaged"], False)

        log.info("anna proposes a treasury adjustment in the page; it is hers to wait on; ben approves it")
        equity, suspense = (api.custody.wallets.firm_account(role, "BTC") for role in ("equity", "suspense"))
        anna.tab("adjustments")
        form = anna.page.locator("#propose")
        form.locator("[name=debit]").fill(str(equity))
        form.locator("[name=credit]").fill(str(suspense))
        form.locator("[name=amount]").fill("0.001")
        form.locator("[name=reason]").fill(f"browser test {run}: move to suspense")
        form.get_by_role("button", name="Propose").click()
        mine = anna.page.locator("#adjustments tr", has_text=f"browser test {run}")
        mine.filter(has_text="your proposal").wait_for()
        anna.shot("adjustment-proposed")
        ben.tab("adjustments")
        ben.page.locator("#adjustments tr", has_text=f"browser test {run}").get_by_role("button", name="Approve").click()
        ben.page.fill("#confirm-input", "checked the ticket")
        ben.page.click("#confirm-ok")
        ben.page.locator("#adjustments tr", has_text=f"browser test {run}").filter(has_text="the worker posts it next").wait_for()
        ben.shot("adjustment-approved")
        log.info("the worker's job verifies ben's signature again and posts it")
        assert_equal(len(run_adjustments_job(api.custody)), 1)
        ben.tab("adjustments")
        ben.page.locator("#adjustments tr", has_text=f"browser test {run}").filter(has_text="posted").wait_for()
        ben.shot("adjustment-posted")
        assert_equal(api.custody.ledger.balance(suspense).posted >= 100_000, True)

        log.info("every page renders for the auditor, the audit trail finds anna's approval")
        for tab in ("audit", "incidents", "deposits", "adjustments", "balances", "reconciliation", "payouts", "queue"):
            audrey.tab(tab)
            audrey.page.locator(f"#tab-{tab} table, #tab-{tab} p.muted").first.wait_for()
            assert_equal((tab, audrey.page.locator(f"#tab-{tab} p.message").count()), (tab, 0))
            assert_equal((tab, audrey.page.locator(f"#tab-{tab} button:visible:not(#audit-search):not(#audit-more)").count()), (tab, 0))
        audrey.tab("audit")
        audrey.page.fill("#audit-q", anna.name)
        audrey.page.click("#audit-search")
        rows = audrey.page.locator("#audit tr", has_text="withdrawal.approve").filter(has_text=f"withdrawal:{w['id']}")
        expect(rows).to_have_count(1)  # anna's approval, not ben's
        assert "destination confirmed with the customer by phone" in audrey.page.locator("#audit").inner_text()
        audrey.shot("audit-trail")
        api.reject_all(acct)
    assert_equal(browser.errors(), [])
