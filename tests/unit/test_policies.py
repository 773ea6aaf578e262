"""The withdrawal policy engine: each outcome, each reason code, quorum rules, edges."""
from __future__ import annotations

import ast
import dataclasses
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import (
    Allowlist,
    AllowlistEntry,
    AllowlistMode,
    AllowlistRule,
    AmountTier,
    Approval,
    AssetPolicy,
    Decision,
    Effect,
    Outcome,
    PolicyContext,
    PolicySet,
    PriorWithdrawal,
    QuarantineReturn,
    ReasonCode,
    VelocityLimit,
    WithdrawalRequest,
    evaluate,
    normalise_address,
    plan_allowlist_change,
    quorum_met,
)

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(hours=24)
SAFE = "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"
OTHER = "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"
SANCTIONED = "0x8589427373D6D84E98730D7795D8f6f8731FDA16"
ETH_DEST = "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"

BTC = AssetPolicy(
    tiers=(AmountTier(100_000, 0), AmountTier(1_000_000, 1), AmountTier(10_000_000, 2)),
    fee_ceiling=50_000,
    min_amount=1_000,
    velocity=VelocityLimit(window=DAY, max_amount=2_000_000, approvals=1),
)
ETH = AssetPolicy(
    tiers=(AmountTier(10**18, 0), AmountTier(None, 2)),
    fee_ceiling=10**16,
)


def make_policy(**changes: object) -> PolicySet:
    base = PolicySet(
        version="2024-05-01.1",
        assets={"BTC": BTC, "ETH": ETH},
        denylist=frozenset({SANCTIONED}),
        decision_ttl=timedelta(minutes=30),
    )
    return dataclasses.replace(base, **changes) if changes else base


def make_request(**changes: object) -> WithdrawalRequest:
    base = WithdrawalRequest(
        withdrawal_id="wd-1",
        account_id="acct-1",
        asset="BTC",
        amount=50_000,
        fee=2_000,
        destination=SAFE,
        requested_by="backend-key-1",
    )
    return dataclasses.replace(base, **changes) if changes else base


def decide(request: WithdrawalRequest | None = None, history=(), now=NOW, policy=None, owner_history=()) -> Decision:
    return evaluate(
        request or make_request(),
        PolicyContext(now=now, recent_withdrawals=tuple(history), owner_withdrawals=tuple(owner_history)),
        policy or make_policy(),
    )


# --- outcomes ------------------------------------------------------------------------------------


def test_small_withdrawal_is_approved() -> None:
    decision = decide()
    assert decision.outcome is Outcome.APPROVE
    assert decision.required_approvals == 0
    assert decision.reasons == ()
    assert decision.policy_version == "2024-05-01.1"
    assert decision.decided_at == NOW
    assert decision.expires_at == NOW + timedelta(minutes=30)


def test_inputs_are_echoed() -> None:
    request = make_request(amount=60_000)
    history = (PriorWithdrawal("BTC", 10_000, NOW - timedelta(hours=1)),)
    decision = decide(request, history)
    assert decision.request is request
    assert decision.context.now == NOW and decision.context.recent_withdrawals == history
    assert decision.velocity_window_total == 70_000
    record = decision.to_record()
    json.dumps(record)  # must be storable as JSON as-is
    assert record["inputs"]["amount"] == 60_000 and isinstance(record["inputs"]["amount"], int)
    assert record["inputs"]["destination"] == SAFE
    assert record["reasons"] == [] and record["outcome"] == "approve"
    assert record["expires_at"] == (NOW + timedelta(minutes=30)).isoformat()


def test_middle_tier_needs_one_approval() -> None:
    decision = decide(make_request(amount=500_000))
    assert decision.outcome is Outcome.NEEDS_APPROVAL
    assert decision.required_approvals == 1
    assert decision.reasons == (ReasonCode.AMOUNT_TIER_REQUIRES_APPROVAL,)


@pytest.mark.parametrize(
    ("amount", "approvals"),
    [(1_000, 0), (100_000, 0), (100_001, 1), (1_000_000, 1), (1_000_001, 2), (10_000_000, 2)],
)
def test_tier_bounds_are_inclusive(amount: int, approvals: int) -> None:
    # Velocity off so only the tier speaks.
    policy = make_policy(assets={"BTC": dataclasses.replace(BTC, velocity=None)})
    decision = decide(make_request(amount=amount), policy=policy)
    assert decision.required_approvals == approvals


def test_reject_has_no_approvals_and_lists_every_reason() -> None:
    request = make_request(amount=20_000_000, fee=60_000, destination=SANCTIONED)
    decision = decide(request)
    assert decision.outcome is Outcome.REJECT
    assert decision.required_approvals == 0
    assert decision.reasons == (
        ReasonCode.DESTINATION_SANCTIONED,
        ReasonCode.AMOUNT_ABOVE_MAXIMUM,
        ReasonCode.FEE_ABOVE_CEILING,
        ReasonCode.VELOCITY_LIMIT_EXCEEDED,
    )


def test_largest_k_wins_when_several_rules_ask_for_approval() -> None:
    # 5,000,000 is in the 2-approval tier and also over the 1-approval velocity limit.
    decision = decide(make_request(amount=5_000_000))
    assert decision.outcome is Outcome.NEEDS_APPROVAL
    assert decision.required_approvals == 2
    assert decision.reasons == (ReasonCode.AMOUNT_TIER_REQUIRES_APPROVAL, ReasonCode.VELOCITY_LIMIT_EXCEEDED)


# --- each reason code ----------------------------------------------------------------------------

_ALLOW_ENFORCE = {"acct-1": Allowlist(entries=(AllowlistEntry(OTHER),), mode=AllowlistMode.ENFORCE)}
_ALLOW_REVIEW = {"acct-1": Allowlist(entries=(AllowlistEntry(OTHER),), mode=AllowlistMode.REVIEW, approvals=2)}
_ALLOW_COOLING = {
    "acct-1": Allowlist(
        entries=(AllowlistEntry(SAFE, added_at=NOW - timedelta(hours=1)),), cooling_off=DAY, approvals=1
    )
}

REASON_CASES: dict[ReasonCode, tuple[dict, dict, list, Outcome, int]] = {
    # code: (request changes, policy changes, history, expected outcome, expected k)
    ReasonCode.KILL_SWITCH_ON: ({}, {"kill_switch": True}, [], Outcome.REJECT, 0),
    ReasonCode.ASSET_NOT_CONFIGURED: ({"asset": "DOGE"}, {}, [], Outcome.REJECT, 0),
    ReasonCode.AMOUNT_MUST_BE_POSITIVE: ({"amount": 0}, {}, [], Outcome.REJECT, 0),
    ReasonCode.FEE_MUST_NOT_BE_NEGATIVE: ({"fee": -1}, {}, [], Outcome.REJECT, 0),
    ReasonCode.DESTINATION_SANCTIONED: ({"destination": SANCTIONED.lower()}, {}, [], Outcome.REJECT, 0),
    ReasonCode.DESTINATION_NOT_ALLOWLISTED: ({}, {"allowlists": _ALLOW_ENFORCE}, [], Outcome.REJECT, 0),
    ReasonCode.AMOUNT_BELOW_MINIMUM: ({"amount": 999}, {}, [], Outcome.REJECT, 0),
    ReasonCode.AMOUNT_ABOVE_MAXIMUM: ({"amount": 10_000_001}, {"assets": {"BTC": dataclasses.replace(BTC, velocity=None)}}, [], Outcome.REJECT, 0),
    ReasonCode.FEE_ABOVE_CEILING: ({"fee": 50_001}, {}, [], Outcome.REJECT, 0),
    ReasonCode.AMOUNT_TIER_REQUIRES_APPROVAL: ({"amount": 200_000}, {}, [], Outcome.NEEDS_APPROVAL, 1),
    ReasonCode.VELOCITY_LIMIT_EXCEEDED: (
        {"amount": 50_000},
        {},
        [PriorWithdrawal("BTC", 1_990_000, NOW - timedelta(hours=2))],
        Outcome.NEEDS_APPROVAL,
        1,
    ),
    ReasonCode.DESTINATION_NOT_YET_ALLOWLISTED: ({}, {"allowlists": _ALLOW_REVIEW}, [], Outcome.NEEDS_APPROVAL, 2),
    ReasonCode.DESTINATION_COOLING_OFF: ({}, {"allowlists": _ALLOW_COOLING}, [], Outcome.NEEDS_APPROVAL, 1),
    # history as {"owner": [...]}: the owner's other accounts, the account's own history empty
    ReasonCode.OWNER_VELOCITY_LIMIT_EXCEEDED: (
        {"amount": 50_000, "owner": "alice"},
        {},
        {"owner": [PriorWithdrawal("BTC", 1_990_000, NOW - timedelta(hours=2))]},
        Outcome.NEEDS_APPROVAL,
        1,
    ),
    ReasonCode.QUARANTINE_RETURN_REQUIRES_APPROVAL: (
        {"return_of": QuarantineReturn("dep-1", (SAFE.upper(),))}, {}, [], Outcome.NEEDS_APPROVAL, 1),
    ReasonCode.RETURN_DESTINATION_NOT_ORIGINAL_SENDER: (
        {"return_of": QuarantineReturn("dep-1", (OTHER,))}, {"quarantine_return_approvals": 2}, [], Outcome.NEEDS_APPROVAL, 2),
}


def test_every_reason_code_has_a_case_and_a_meaning() -> None:
    assert set(REASON_CASES) == set(ReasonCode)
    for code in ReasonCode:
        assert code.meaning and "\n" not in code.meaning
        assert code.effect in (Effect.REJECT, Effect.APPROVAL)


@pytest.mark.parametrize("code", list(ReasonCode), ids=[c.value for c in ReasonCode])
def test_each_reason_code_alone(code: ReasonCode) -> None:
    request_changes, policy_changes, history, outcome, k = REASON_CASES[code]
    history, owner_history = (history, ()) if isinstance(history, list) else ((), history["owner"])
    decision = decide(make_request(**request_changes), history, policy=make_policy(**policy_changes),
                      owner_history=owner_history)
    assert decision.reasons == (code,)
    assert decision.outcome is outcome
    assert decision.required_approvals == k
    assert code.rejects == (outcome is Outcome.REJECT)


def test_negative_amount_is_rejected_without_tier_noise() -> None:
    decision = decide(make_request(amount=-5))
    assert decision.reasons == (ReasonCode.AMOUNT_MUST_BE_POSITIVE,)


# --- kill switch ---------------------------------------------------------------------------------


@given(
    amount=st.integers(min_value=-(10**20), max_value=10**20),
    fee=st.integers(min_value=-10, max_value=10**18),
    asset=st.sampled_from(["BTC", "ETH", "DOGE"]),
    destination=st.sampled_from([SAFE, OTHER, SANCTIONED, ETH_DEST]),
)
def test_kill_switch_rejects_everything(amount: int, fee: int, asset: str, destination: str) -> None:
    request = make_request(amount=amount, fee=fee, asset=asset, destination=destination)
    decision = decide(request, policy=make_policy(kill_switch=True))
    assert decision.outcome is Outcome.REJECT
    assert decision.reasons[0] is ReasonCode.KILL_SWITCH_ON
    assert not quorum_met(decision, [Approval(f"op{i}", NOW) for i in range(5)], "backend-key-1")


# --- velocity ------------------------------------------------------------------------------------


def _history(amount: int, age: timedelta, asset: str = "BTC") -> list[PriorWithdrawal]:
    return [PriorWithdrawal(asset, amount, NOW - age)]


def test_velocity_limit_is_inclusive() -> None:
    # 1,950,000 earlier + 50,000 now = exactly the 2,000,000 limit: allowed.
    decision = decide(history=_history(1_950_000, timedelta(hours=1)))
    assert decision.outcome is Outcome.APPROVE
    assert decision.velocity_window_total == 2_000_000
    over = decide(history=_history(1_950_001, timedelta(hours=1)))
    assert over.reasons == (ReasonCode.VELOCITY_LIMIT_EXCEEDED,)


def test_withdrawal_exactly_one_window_old_has_left_the_window() -> None:
    at_edge = decide(history=_history(1_990_000, DAY))
    assert at_edge.outcome is Outcome.APPROVE and at_edge.velocity_window_total == 50_000
    just_inside = decide(history=_history(1_990_000, DAY - timedelta(microseconds=1)))
    assert just_inside.reasons == (ReasonCode.VELOCITY_LIMIT_EXCEEDED,)


def test_velocity_counts_only_the_same_asset_and_future_stamps_count() -> None:
    assert decide(history=_history(10**19, timedelta(hours=1), asset="ETH")).outcome is Outcome.APPROVE
    skewed = decide(history=_history(1_990_000, -timedelta(seconds=5)))
    assert skewed.reasons == (ReasonCode.VELOCITY_LIMIT_EXCEEDED,)


def test_velocity_history_sums_many_entries() -> None:
    history = [PriorWithdrawal("BTC", 400_000, NOW - timedelta(hours=h)) for h in range(1, 6)]
    decision = decide(history=history)  # 5 x 400,000 + 50,000
    assert decision.velocity_window_total == 2_050_000
    assert decision.reasons == (ReasonCode.VELOCITY_LIMIT_EXCEEDED,)


def test_per_account_velocity_override() -> None:
    tight = VelocityLimit(window=timedelta(hours=1), max_amount=10_000, approvals=2)
    policy = make_policy(velocity_overrides={("acct-1", "BTC"): tight})
    assert decide(policy=policy).required_approvals == 2
    assert decide(make_request(account_id="acct-2"), policy=policy).outcome is Outcome.APPROVE


# --- allowlists, denylist ------------------------------------------------------------------------


def test_allowlisted_destination_passes_and_other_accounts_are_unaffected() -> None:
    policy = make_policy(allowlists=_ALLOW_ENFORCE)
    assert decide(make_request(destination=OTHER), policy=policy).outcome is Outcome.APPROVE
    assert decide(make_request(account_id="acct-2"), policy=policy).outcome is Outcome.APPROVE


def test_cooling_off_ends_exactly_at_its_end() -> None:
    policy = make_policy(allowlists=_ALLOW_COOLING)
    added = NOW - timedelta(hours=1)
    assert decide(now=added + DAY - timedelta(microseconds=1), policy=policy).reasons == (
        ReasonCode.DESTINATION_COOLING_OFF,
    )
    assert decide(now=added + DAY, policy=policy).outcome is Outcome.APPROVE


def test_address_matching_folds_case_only_where_the_format_is_case_insensitive() -> None:
    assert normalise_address(SANCTIONED) == SANCTIONED.lower()
    assert normalise_address(SAFE.upper()) == SAFE
    base58 = "1BvBMSEYstWetqTFn5Au4m4GFg7xJaNVN2"
    assert normalise_address(base58) == base58
    assert normalise_address(base58.lower()) != base58
    assert decide(make_request(destination=f"  {SANCTIONED.upper().replace('0X', '0x')} ")).outcome is Outcome.REJECT


# --- quorum --------------------------------------------------------------------------------------


def _needs_two() -> Decision:
    decision = decide(make_request(amount=5_000_000, requested_by="alice"))
    assert decision.outcome is Outcome.NEEDS_APPROVAL and decision.required_approvals == 2
    return decision


def _at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def test_two_distinct_operators_meet_a_quorum_of_two() -> None:
    decision = _needs_two()
    assert not quorum_met(decision, [Approval("bob", _at(1))], "alice")
    assert quorum_met(decision, [Approval("bob", _at(1)), Approval("carol", _at(2))], "alice")


def test_requester_never_counts() -> None:
    decision = _needs_two()
    approvals = [Approval("alice", _at(1)), Approval("bob", _at(2))]
    assert not quorum_met(decision, approvals, "alice")
    # Even if the caller names someone else, the requester recorded in the request is excluded.
    assert not quorum_met(decision, approvals, "someone-else")
    # And the caller-named requester is excluded too.
    assert not quorum_met(decision, [Approval("bob", _at(1)), Approval("carol", _at(1))], "carol")


def test_an_operator_counts_once() -> None:
    decision = _needs_two()
    approvals = [Approval("bob", _at(1)), Approval("bob", _at(2)), Approval(" BOB", _at(3))]
    assert not quorum_met(decision, approvals, "alice")
    assert not quorum_met(decision, [Approval("Alice", _at(1)), Approval("bob", _at(1))], "alice")


def test_approvals_after_expiry_or_before_the_decision_do_not_count() -> None:
    decision = _needs_two()
    assert decision.expires_at == _at(30)
    late = [Approval("bob", _at(1)), Approval("carol", _at(30))]  # exactly at expiry: expired
    assert not quorum_met(decision, late, "alice")
    just_in_time = [Approval("bob", _at(1)), Approval("carol", _at(30) - timedelta(microseconds=1))]
    assert quorum_met(decision, just_in_time, "alice")
    early = [Approval("bob", _at(-1)), Approval("carol", _at(1))]
    assert not quorum_met(decision, early, "alice")


def test_quorum_for_approve_and_reject_decisions() -> None:
    assert quorum_met(decide(), [], "backend-key-1")
    rejected = decide(make_request(destination=SANCTIONED))
    assert not quorum_met(rejected, [Approval("bob", _at(1)), Approval("carol", _at(1))], "alice")


def test_blank_operator_ids_do_not_count() -> None:
    decision = _needs_two()
    assert not quorum_met(decision, [Approval("", _at(1)), Approval("  ", _at(1)), Approval("bob", _at(1))], "alice")


def test_decision_liveness_interval() -> None:
    decision = decide()
    assert decision.is_live(NOW) and decision.is_live(_at(29.9))
    assert not decision.is_live(_at(30)) and not decision.is_live(_at(-0.1))


# --- construction guards -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.0, 50_000.0, True, "50000", None])
def test_amounts_must_be_ints(bad: object) -> None:
    with pytest.raises(TypeError):
        make_request(amount=bad)
    with pytest.raises(TypeError):
        make_request(fee=bad)
    with pytest.raises(TypeError):
        AmountTier(100, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tiers",
    [
        (),
        (AmountTier(None, 0), AmountTier(100, 1)),  # unbounded before the end
        (AmountTier(100, 0), AmountTier(100, 1)),  # not strictly ascending
        (AmountTier(100, 2), AmountTier(200, 1)),  # fewer approvals for more money
    ],
)
def test_malformed_tiers_are_refused(tiers: tuple[AmountTier, ...]) -> None:
    with pytest.raises(ValueError):
        AssetPolicy(tiers=tiers, fee_ceiling=1)


def test_naive_datetimes_are_refused() -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    with pytest.raises(ValueError):
        PolicyContext(now=naive)
    with pytest.raises(ValueError):
        Approval("bob", naive)
    with pytest.raises(ValueError):
        PriorWithdrawal("BTC", 1, naive)


def test_policy_set_is_immutable_data() -> None:
    policy = make_policy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.kill_switch = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.assets["DOGE"] = BTC  # type: ignore[index]
    with pytest.raises(TypeError):
        PolicySet(version="v", assets={}, denylist=SANCTIONED)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PolicySet(version=" ", assets={})


def test_evaluate_is_deterministic() -> None:
    request, history = make_request(amount=700_000), _history(1_000, timedelta(hours=3))
    assert decide(request, history) == decide(request, history)


def test_policies_package_imports_only_the_standard_library() -> None:
    package = Path(__file__).resolve().parents[2] / "policies"
    allowed_roots = {"policies", "__future__", "collections", "dataclasses", "datetime", "enum", "types", "typing"}
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= allowed_roots, f"{source.name} imports {roots - allowed_roots}"


# --- velocity per owner --------------------------------------------------------------------------


def test_a_second_account_of_one_owner_gets_no_fresh_limit() -> None:
    """Observation 7 of issue 11: the owner's other accounts count against the same limit."""
    elsewhere = _history(1_990_000, timedelta(hours=2))
    fresh_account = decide(make_request(owner="alice"), owner_history=elsewhere)
    assert fresh_account.reasons == (ReasonCode.OWNER_VELOCITY_LIMIT_EXCEEDED,)
    assert fresh_account.velocity_window_total == 50_000
    assert fresh_account.owner_window_total == 2_040_000
    record = fresh_account.to_record()["inputs"]
    assert record["owner"] == "alice" and record["owner_window_total"] == 2_040_000
    assert record["owner_withdrawals"][0]["amount"] == 1_990_000


def test_owner_velocity_counts_only_the_asset_and_the_window() -> None:
    other_asset = _history(1_990_000, timedelta(hours=2), asset="ETH")
    expired = _history(1_990_000, DAY)
    decision = decide(make_request(owner="alice"), owner_history=other_asset + expired)
    assert decision.outcome is Outcome.APPROVE and decision.owner_window_total == 50_000


def test_owner_velocity_has_its_own_figures_and_overrides() -> None:
    owner_limit = VelocityLimit(window=DAY, max_amount=100_000, approvals=2)
    policy = make_policy(assets={"BTC": dataclasses.replace(BTC, owner_velocity=owner_limit), "ETH": ETH})
    history = _history(60_000, timedelta(hours=1))
    decision = decide(make_request(owner="alice"), owner_history=history, policy=policy)
    assert (decision.reasons, decision.required_approvals) == ((ReasonCode.OWNER_VELOCITY_LIMIT_EXCEEDED,), 2)
    raised = dataclasses.replace(policy, owner_velocity_overrides={("alice", "BTC"): VelocityLimit(DAY, 10**9)})
    assert decide(make_request(owner="alice"), owner_history=history, policy=raised).outcome is Outcome.APPROVE


def test_an_account_without_owner_has_only_its_own_limit() -> None:
    decision = decide(make_request(owner=None), owner_history=_history(1_990_000, timedelta(hours=2)))
    assert decision.outcome is Outcome.APPROVE and decision.owner_window_total is None


# --- quarantine returns --------------------------------------------------------------------------


def test_a_quarantine_return_needs_operators_whatever_the_amount() -> None:
    """Observation 4 of issue 11: a small return (automatic tier) still needs an operator."""
    to_sender = decide(make_request(amount=1_000, return_of=QuarantineReturn("dep-9", (SAFE,))))
    assert (to_sender.outcome, to_sender.required_approvals) == (Outcome.NEEDS_APPROVAL, 1)
    big = decide(make_request(amount=5_000_000, return_of=QuarantineReturn("dep-9", (SAFE,))))
    assert big.required_approvals == 2  # the tier's quorum when larger
    elsewhere = decide(make_request(amount=1_000, return_of=QuarantineReturn("dep-9", (OTHER,))))
    assert elsewhere.reasons == (ReasonCode.RETURN_DESTINATION_NOT_ORIGINAL_SENDER,)
    flag = elsewhere.to_record()["inputs"]["quarantine_return"]
    assert flag == {"deposit_id": "dep-9", "original_senders": [OTHER], "destination_is_original_sender": False}
    unknown_sender = decide(make_request(return_of=QuarantineReturn("dep-9", ())))
    assert unknown_sender.reasons == (ReasonCode.RETURN_DESTINATION_NOT_ORIGINAL_SENDER,)


def test_quarantine_return_approvals_is_at_least_one() -> None:
    with pytest.raises(ValueError):
        make_policy(quarantine_return_approvals=0)


# --- allowlist changes ---------------------------------------------------------------------------

REVIEW_1H = AllowlistRule(AllowlistMode.REVIEW, timedelta(hours=1), 2)


@pytest.mark.parametrize(
    ("requested", "loosened"),
    [
        (AllowlistRule(AllowlistMode.ENFORCE, timedelta(hours=1), 2), ()),
        (AllowlistRule(AllowlistMode.REVIEW, timedelta(hours=48), 3), ()),
        (AllowlistRule(AllowlistMode.REVIEW, timedelta(0), 2), ("cooling_off",)),
        (AllowlistRule(AllowlistMode.REVIEW, timedelta(hours=1), 1), ("approvals",)),
        (AllowlistRule(AllowlistMode.REVIEW, timedelta(0), 1), ("cooling_off", "approvals")),
    ],
)
def test_allowlist_change_tightens_at_once_and_holds_loosening(requested: AllowlistRule, loosened: tuple) -> None:
    plan = plan_allowlist_change(REVIEW_1H, requested)
    assert plan.loosened == loosened
    if not loosened:
        assert (plan.apply_now, plan.pending) == (requested, None)
    else:
        assert plan.apply_now == REVIEW_1H and plan.pending == requested


def test_allowlist_change_mixed_request_tightens_now_and_loosens_later() -> None:
    enforce = AllowlistRule(AllowlistMode.ENFORCE, timedelta(hours=1), 2)
    relaxed = AllowlistRule(AllowlistMode.REVIEW, timedelta(hours=6), 1)
    plan = plan_allowlist_change(enforce, relaxed)
    assert plan.loosened == ("mode", "approvals")
    assert plan.apply_now == AllowlistRule(AllowlistMode.ENFORCE, timedelta(hours=6), 2)
    assert plan.pending == relaxed


def test_turning_an_allowlist_on_is_a_tightening() -> None:
    plan = plan_allowlist_change(None, AllowlistRule(AllowlistMode.REVIEW))
    assert (plan.apply_now, plan.pending, plan.loosened) == (AllowlistRule(AllowlistMode.REVIEW), None, ())


def test_a_shorter_cooling_off_never_shortens_an_entry_already_added() -> None:
    """Observation 6 of issue 11: the entry keeps the cooling-off in force when it was added."""
    entry = AllowlistEntry(SAFE, added_at=NOW - timedelta(hours=1), cooling_off=DAY)
    loosened = {"acct-1": Allowlist((entry,), AllowlistMode.REVIEW, cooling_off=timedelta(0), approvals=1)}
    decision = decide(policy=make_policy(allowlists=loosened))
    assert decision.reasons == (ReasonCode.DESTINATION_COOLING_OFF,)
    assert entry.usable_from(timedelta(0)) == NOW + timedelta(hours=23)
    assert decide(now=NOW + timedelta(hours=23), policy=make_policy(allowlists=loosened)).outcome is Outcome.APPROVE


def test_a_longer_cooling_off_applies_to_entries_already_added() -> None:
    entry = AllowlistEntry(SAFE, added_at=NOW - timedelta(hours=1), cooling_off=timedelta(0))
    tightened = {"acct-1": Allowlist((entry,), AllowlistMode.REVIEW, cooling_off=DAY, approvals=1)}
    assert decide(policy=make_policy(allowlists=tightened)).reasons == (ReasonCode.DESTINATION_COOLING_OFF,)
