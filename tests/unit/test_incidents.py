"""Pure decisions behind a reorged-out credit: how much custody freezes, how much of it other holds
hid (the remainder that freezes the account), which resolution an incident takes, and whether a
capture may take the remainder now (custody.deposits.reorg_freeze_amount, reorg_remainder,
custody.incidents.resolution_plan, hidden_remainder)."""
from __future__ import annotations

import pytest

from custody.deposits import reorg_freeze_amount, reorg_remainder
from custody.errors import CustodyError
from custody.incidents import hidden_remainder, resolution_plan
from regtest.util import assert_equal

HOLDING = {"hold": {"id": 7, "account_id": 3, "amount": "500", "owner": "custody:reorg", "capture_to": 9}}
HIDDEN = {"hold": {"id": None, "account_id": 3, "amount": "0", "owner": "custody:reorg", "capture_to": 9, "remainder": "700"}}


@pytest.mark.parametrize(("credited", "available", "frozen"),
                         [(700, 1_000, 700), (700, 700, 700), (700, 500, 500), (700, 0, 0), (700, -5, 0)])
def test_freeze_what_is_still_available_never_more_than_the_credit(credited, available, frozen):
    assert_equal(reorg_freeze_amount(credited, available), frozen)


@pytest.mark.parametrize(("credited", "frozen", "held", "remainder"), [
    (700, 700, 300, 0),    # all frozen: nothing hidden
    (700, 0, 700, 700),    # another hold covered the whole credit: all of it may come back
    (700, 200, 1_000, 500),  # never more than the credit's unfrozen part
    (700, 200, 100, 100),  # the rest left the account before the reorg: gone, not counted
    (700, 0, 0, 0),
])
def test_the_remainder_is_what_other_holds_hid_from_the_freeze(credited, frozen, held, remainder):
    assert_equal(reorg_remainder(credited, frozen, held), remainder)


@pytest.mark.parametrize("detail", [HOLDING, HIDDEN])
@pytest.mark.parametrize("decision", ["release", "capture"])
def test_an_incident_holding_or_hiding_money_takes_release_or_capture(detail, decision):
    assert_equal(resolution_plan(detail, decision, shortfall_reversed=False), decision)


@pytest.mark.parametrize(("detail", "decision", "reversed_"), [
    (HOLDING, None, False),                      # money held: a decision is required
    (HIDDEN, None, False),                       # a remainder freezes the account: a decision is required
    (HIDDEN, "capture", True),                   # re-mined: nothing to recover
    (HOLDING, "capture", True),                  # re-mined: nothing to recover
    ({"hold": {**HOLDING["hold"], "id": None}}, "capture", False),  # nothing was available to hold
    ({}, "release", False),                      # an incident without a hold takes no decision
])
def test_a_decision_that_does_not_fit_is_refused(detail, decision, reversed_):
    with pytest.raises(CustodyError) as err:
        resolution_plan(detail, decision, shortfall_reversed=reversed_)
    assert_equal(err.value.code.value, "incident_decision_invalid")


def test_re_mined_incident_may_still_be_released_and_one_without_hold_just_closes():
    assert_equal(resolution_plan(HOLDING, "release", shortfall_reversed=True), "release")
    assert_equal(resolution_plan({"kind": "gap"}, None, shortfall_reversed=False), None)


@pytest.mark.parametrize(("remainder", "available", "hidden"), [
    (700, 1_000, 0),   # all of it available again: the capture takes the whole remainder
    (700, 700, 0),
    (700, 0, 700),     # still behind the backend's hold: the capture is refused, the account stays frozen
    (700, 300, 400),   # partly released: refused too, never a partial capture that ends the freeze
    (700, -5, 700),
    (0, 0, 0),
])
def test_a_capture_takes_the_whole_remainder_or_waits(remainder, available, hidden):
    assert_equal(hidden_remainder(remainder, available), hidden)
