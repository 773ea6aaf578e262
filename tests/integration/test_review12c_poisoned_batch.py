"""Review of issue 12, third round (R4): one withdrawal the signer refuses holds every other
withdrawal of its batch, for good, with no incident and no operator path.

`_sign_one` handles one refusal only (`decision_expired`: `drop_expired`). Any other refusal that
names ONE withdrawal of the batch leaves the batch open and active, refused on every run: an
approver whose key was taken out of the signer's own registry (an operator who left: every
approval row they signed is `approver_unknown`, even when other approvals meet the quorum), a
destination denylisted after batching (`destination_denied`), a quorum table raised in signer.toml
(`decision_not_approved`), an asset removed from the signer's table. Bitcoin batches take EVERY
approved withdrawal (up to 500), so all the other customers' withdrawals stay `batched`, their holds
pending. The signer checks approvals before the decision's expiry, so the batch is not even dropped
when the decisions expire. Custody opens no incident for a refusal (`Payouts.refusals` and a log
line), `retry_batch` refuses an active batch, and nothing reaches `drop_from_batch` (no route, no job).

Played with the real Payouts and Signer: 0.6 BTC needs one operator and op-alice approved it; her
key is then removed from the signer's registry (approver rotation); a 0.1 BTC withdrawal of another
customer is approved without operators. Both are batched together.

Fix: a refusal that names a withdrawal (the signer's message does; give SigningRefused a
`withdrawal_id`) takes that withdrawal out of the batch (`drop_from_batch`: back to the operators
for an approval refusal, rejected with its hold released for a denylisted destination) so the rest
is signed; open an incident for every refusal that is not transient; give operators a route.
"""
from __future__ import annotations

import logging
import uuid

from sqlalchemy import text

from ledger.model import AccountKind, Transfer
from regtest.util import assert_equal
from tests.approvers import TEST_OPERATORS, approve, registry
from tests.integration.own_database import own_database
from tests.integration.test_payout_step_races import DEST, make_world

log = logging.getLogger(__name__)


def test_a_withdrawal_whose_approver_left_the_signer_does_not_hold_the_rest_of_its_batch(database_url):
    with own_database(database_url, "r12c_poison") as eng:
        w = make_world(eng, "bitcoin", amounts=(60_000_000,))
        [big] = w.withdrawal_ids
        approve(w.container.withdrawals, big, "op-alice")
        equity = w.container.wallets.firm_account("equity", "BTC")
        other = w.ledger.open_account("BTC", AccountKind.customer, f"r12c:carol:{uuid.uuid4().hex[:6]}", owner="r12c-carol").id
        w.ledger.post("r12c-fund-carol", [Transfer(equity, other, 100_000_000)], kind="treasury_credit")
        small = w.container.withdrawals.request(client_withdrawal_id="r12c-small", account_id=other, amount=10_000_000,
                                                destination=DEST, requested_by="backend-test")
        assert_equal((w.container.withdrawals.get(big).state, small.state), ("approved", "approved"))
        p = w.container.payouts
        p.signer.approvers = registry(*(o for o in TEST_OPERATORS if o != "op-alice"))  # signer.toml: op-alice left
        for _ in range(3):
            for step in (p.batch_bitcoin, p.sign_open_batches, p.broadcast):
                step()
        states = {wid: w.container.withdrawals.get(wid).state for wid in (big, small.id)}
        with eng.connect() as c:
            found = [tuple(r) for r in c.execute(text("SELECT kind, severity FROM incident ORDER BY id"))]
        log.info("withdrawals %s; refusals %s; incidents %s", states, p.refusals, found)
        w.ledger.assert_verified()
    assert_equal(states[small.id], "broadcast")  # carol's withdrawal is not held hostage by alice's approval
    assert states[big] != "batched", "the refused withdrawal stays batched forever, no operator told"
