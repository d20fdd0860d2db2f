from datetime import datetime, timedelta, timezone

from lookahead_operator.conditions import get_condition, set_condition

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def test_new_condition_gets_transition_time_and_generation():
    conds = set_condition([], "Accepted", True, "Valid", "ok", 3, T0)
    assert conds == [{"type": "Accepted", "status": "True", "reason": "Valid", "message": "ok",
                      "lastTransitionTime": "2026-11-30T12:00:00Z", "observedGeneration": 3}]


def test_transition_time_moves_only_when_status_changes():
    conds = set_condition([], "Ready", False, "Waiting", "a", 1, T0)
    same = set_condition(conds, "Ready", False, "StillWaiting", "b", 2, T0 + timedelta(minutes=5))
    assert get_condition(same, "Ready")["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    assert get_condition(same, "Ready")["reason"] == "StillWaiting"
    assert get_condition(same, "Ready")["observedGeneration"] == 2
    flipped = set_condition(same, "Ready", True, "Done", "c", 2, T0 + timedelta(minutes=7))
    assert get_condition(flipped, "Ready")["lastTransitionTime"] == "2026-11-30T12:07:00Z"


def test_other_conditions_are_kept_and_input_not_mutated():
    conds = set_condition([], "A", True, "r", "m", 1, T0)
    conds = set_condition(conds, "B", False, "r", "m", 1, T0)
    before = [dict(c) for c in conds]
    set_condition(conds, "A", False, "x", "y", 2, T0)
    assert conds == before
    assert [c["type"] for c in set_condition(conds, "A", False, "x", "y", 2, T0)] == ["A", "B"]
