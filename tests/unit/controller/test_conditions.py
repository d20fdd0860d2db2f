from datetime import datetime, timedelta, timezone

from lookahead_operator.controller.conditions import Fact, derive, get
from lookahead_operator.api.status import ConditionType as C, LookaheadPolicyStatus, Phase

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def test_new_condition_gets_transition_time_and_generation_and_ready_follows_the_phase():
    conds = derive([], {C.Accepted: Fact(True, "Valid", "ok")}, Phase.Measuring, "measuring", 3, T0)
    wire = LookaheadPolicyStatus(conditions=conds).to_dict()["conditions"]
    assert wire[0] == {"type": "Accepted", "status": "True", "reason": "Valid", "message": "ok",
                       "lastTransitionTime": "2026-11-30T12:00:00Z", "observedGeneration": 3}
    assert get(conds, C.Ready).status == "False" and get(conds, C.Ready).reason == "Measuring"
    done = derive(conds, {}, Phase.Succeeded, "guard passed", 3, T0 + timedelta(minutes=1))
    assert get(done, C.Ready).status == "True"


def test_transition_time_moves_only_when_status_changes():
    conds = derive([], {C.RolesReady: Fact(False, "Waiting", "a")}, Phase.Launching, "", 1, T0)
    same = derive(conds, {C.RolesReady: Fact(False, "StillWaiting", "b")}, Phase.Launching, "", 2,
                  T0 + timedelta(minutes=5))
    c = get(same, C.RolesReady)
    assert c.last_transition_time == T0 and c.reason == "StillWaiting" and c.observed_generation == 2
    flipped = derive(same, {C.RolesReady: Fact(True, "Ready", "c")}, Phase.Launching, "", 2,
                     T0 + timedelta(minutes=7))
    assert get(flipped, C.RolesReady).last_transition_time == T0 + timedelta(minutes=7)


def test_phase_scoped_conditions_disappear_outside_their_phases():
    conds = derive([], {C.WaveReady: Fact(True, "Guarding", "wave 1"), C.GuardData: Fact(True, "Enough", "")},
                   Phase.Promoting, "", 1, T0)
    assert get(conds, C.WaveReady) is not None
    after = derive(conds, {C.WaveReady: Fact(True, "Guarding", "late fact")}, Phase.RolledBack, "", 1, T0)
    assert get(after, C.WaveReady) is None and get(after, C.GuardData) is None


def test_input_is_not_mutated_and_order_is_stable():
    conds = derive([], {C.Paused: Fact(False, "Running", ""), C.Accepted: Fact(True, "Valid", "")},
                   Phase.Pending, "", 1, T0)
    before = [c.model_copy() for c in conds]
    derive(conds, {C.Accepted: Fact(False, "InvalidSpec", "x")}, Phase.Failed, "", 2, T0)
    assert conds == before
    assert [c.type for c in conds] == ["Accepted", "Paused", "Ready"]


def test_targets_edited_is_kept_through_the_end_of_the_rollout_and_sorts_after_targets_found():
    conds = derive([], {C.TargetsEdited: Fact(True, "UserEdited", "left to their users: serving/b"),
                        C.TargetsFound: Fact(True, "Found", "2 Deployment(s)")}, Phase.Promoting, "", 1, T0)
    assert [c.type for c in conds][:2] == ["TargetsFound", "TargetsEdited"]
    done = derive(conds, {}, Phase.Succeeded, "guard passed", 1, T0 + timedelta(minutes=5))
    c = get(done, C.TargetsEdited)
    assert c is not None and c.reason == "UserEdited" and "serving/b" in c.message, "a record, not a phase state"
