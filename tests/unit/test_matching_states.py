"""The declared order state machine."""
from __future__ import annotations

import pytest

from matching.errors import ErrorCode, IllegalTransition
from matching.states import (FIX_ORD_STATUS, HOLDING, TERMINAL, TRANSITIONS, OrderState,
                             can_transition, transition)

S = OrderState


def test_ten_states_all_declared_with_a_fix_mapping():
    assert len(OrderState) == 10
    assert set(TRANSITIONS) == set(OrderState) == set(FIX_ORD_STATUS)
    assert FIX_ORD_STATUS[S.pending_cancel] == "6" and FIX_ORD_STATUS[S.untriggered] is None


def test_terminal_states_have_no_exit():
    assert TERMINAL == {S.rejected, S.filled, S.cancelled, S.expired}
    for state in TERMINAL:
        with pytest.raises(IllegalTransition):
            transition("o", state, S.working)


def test_declared_transitions_pass_and_undeclared_raise_with_a_code():
    assert transition("o", S.working, S.partially_filled) is S.partially_filled
    assert can_transition(S.untriggered, S.received)
    with pytest.raises(IllegalTransition) as err:
        transition("o", S.untriggered, S.working)   # a stop must be held before it works
    assert err.value.code is ErrorCode.illegal_transition
    assert not can_transition(S.working, S.rejected)  # once acknowledged, never "rejected"


def test_untriggered_holds_nothing():
    assert S.untriggered not in HOLDING and S.received not in HOLDING
