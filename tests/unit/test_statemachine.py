from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace as NS

import pytest

from lookahead_operator import statemachine as sm

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def spec(**over):
    s = NS(
        paused=False,
        load=NS(mode="sweep", batch_sizes=[1, 8], step_duration=60.0),
        analysis=NS(deadline=600.0),
        promotion=NS(mode="regimeAware", waves=["50%", "100%"], wave_duration="10s", guard=NS(duration="20s"), require_approval=False),
    )
    for k, v in over.items():
        setattr(s, k, v)
    return s


def world(status=None, **kw):
    base = dict(now=T0, name="p", namespace="ns", generation=1, fingerprint="fp1", spec=spec(), status=status or {},
                targets=[sm.Target("ns", "a", "reference"), sm.Target("ns", "b", "reference")])
    base.update(kw)
    return sm.Observed(**base)


def kinds(plan):
    return [a.kind for a in plan.actions]


def run(w, **changes):
    """Apply a plan's status to the world, as the handler would after writing it."""
    plan = sm.reconcile(w)
    return plan, replace(w, status=plan.status, **changes)


def test_pending_claims_targets_and_moves_to_preflight():
    plan = sm.reconcile(world())
    assert plan.status["phase"] == "Preflight"
    assert kinds(plan) == ["ClaimTargets"]
    assert plan.actions[0].args["targets"] == [("ns", "a"), ("ns", "b")]
    assert plan.status["progress"]["fingerprint"] == "fp1"
    assert any(e[1] == "TargetsClaimed" for e in plan.events)


def test_no_targets_waits_with_condition():
    plan = sm.reconcile(world(targets=[]))
    assert plan.status.get("phase", "Pending") == "Pending" and plan.actions == []
    cond = {c["type"]: c for c in plan.status["conditions"]}["TargetsFound"]
    assert cond["status"] == "False" and cond["reason"] == "NoTargets"


def test_second_policy_on_same_deployment_is_refused():
    w = world(targets=[sm.Target("ns", "a", owner="ns/other")])
    plan = sm.reconcile(w)
    cond = {c["type"]: c for c in plan.status["conditions"]}["TargetsFound"]
    assert cond["reason"] == "Conflict" and "ns/other" in cond["message"]
    assert plan.actions == [] and plan.status.get("phase", "Pending") == "Pending"


def test_invalid_spec_fails_with_condition():
    plan = sm.reconcile(world(spec_error="spec.lookahead.window: must be >= 1"))
    assert plan.status["phase"] == "Failed"
    cond = {c["type"]: c for c in plan.status["conditions"]}["Accepted"]
    assert cond["status"] == "False" and "window" in cond["message"]


def test_not_a_candidate_releases_and_stops():
    _, w = run(world())
    plan = sm.reconcile(replace(w, preflight={"candidate": False, "verdict": "PrefillDominated",
                                              "reasons": ["prefill is 80% of request time"]}))
    assert plan.status["phase"] == "NotACandidate"
    assert kinds(plan) == ["ReleaseTargets"]
    assert "prefill" in plan.status["decision"]["reason"]


def full_measure(w, rows_conclusive=True):
    """Drive a world from Pending through measurement with conclusive steps."""
    _, w = run(w)
    _, w = run(w, preflight={"candidate": True, "verdict": "DecodeBoundIdleCompute"})
    plan, w = run(w, roles_ready={"canary": True, "control": True})
    assert "EnsureRoles" in kinds(plan)
    plan, w = run(w)
    assert w.status["phase"] == "Measuring"
    for bs in (1, 8):
        step = sm.StepMeasurement({"batchSize": bs, "verdict": "Faster" if bs == 1 else "Slower"}, rows_conclusive)
        plan, w = run(replace(w, step=step), step=None)
    return plan, w


def test_measuring_walks_steps_and_records_rows():
    _, w = run(world())
    _, w = run(w, preflight={"candidate": True})
    _, w = run(w, roles_ready={"canary": True, "control": True})
    plan, w = run(w)
    assert w.status["phase"] == "Measuring"
    plan, w = run(w)
    assert "EnsureLoadJobs" in kinds(plan) and plan.actions[-1].args == {"step": 0, "batch_size": 1}
    # an inconclusive sample keeps the step going
    plan, w2 = run(replace(w, step=sm.StepMeasurement({"batchSize": 1, "verdict": "NotEnoughData"}, False)))
    assert w2.status["progress"]["step"] == 0 and w2.status["batches"][0]["verdict"] == "NotEnoughData"
    # a conclusive one moves to the next batch size
    plan, w3 = run(replace(w2, step=sm.StepMeasurement({"batchSize": 1, "verdict": "Faster"}, True)), step=None)
    assert w3.status["progress"]["step"] == 1 and "DeleteLoadJobs" in kinds(plan)
    assert w3.status["batches"] == [{"batchSize": 1, "verdict": "Faster"}]


def test_step_times_out_and_deadline_ends_measurement():
    _, w = run(world())
    _, w = run(w, preflight={"candidate": True})
    _, w = run(w, roles_ready={"canary": True, "control": True})
    _, w = run(w)
    plan, w = run(replace(w, now=T0 + timedelta(seconds=61)))
    assert w.status["progress"]["step"] == 1
    plan, w = run(replace(w, now=T0 + timedelta(seconds=601)))
    assert w.status["phase"] == "Deciding"


def test_rollback_decision_leaves_fleet_untouched():
    _, w = full_measure(world())
    assert w.status["phase"] == "Deciding"
    plan = sm.reconcile(replace(w, decision={"action": "Rollback", "reason": "throughput fell 6% at batch 8"}))
    assert plan.status["phase"] == "RolledBack"
    assert "PromoteTargets" not in kinds(plan) and "RestoreTargets" not in kinds(plan)
    assert "DeleteRoles" in kinds(plan)


def test_inconclusive_never_promotes():
    _, w = full_measure(world(), rows_conclusive=False)
    assert w.status["phase"] == "Measuring"
    _, w = run(replace(w, now=T0 + timedelta(seconds=601)))
    assert w.status["phase"] == "Deciding"
    plan = sm.reconcile(replace(w, decision={"action": "Inconclusive", "reason": "deadline"}))
    assert plan.status["phase"] == "Failed" and "PromoteTargets" not in kinds(plan)


def test_promotion_in_waves_then_guard_then_success():
    _, w = full_measure(world())
    plan, w = run(replace(w, decision={"action": "PromoteRegimeAware", "reason": "wins below 8",
                                       "crossoverBatchSize": 8}))
    assert w.status["phase"] == "Promoting" and w.status["crossoverBatchSize"] == 8
    did = w.status["decision"]["id"]
    plan, w = run(w)
    assert kinds(plan) == ["PromoteTargets"] and plan.actions[0].args["targets"] == [("ns", "a")]
    # the fleet now shows a promoted; the wave is guarded before the next one
    a_promoted = [sm.Target("ns", "a", "reference", promoted=did), sm.Target("ns", "b", "reference")]
    plan, w = run(replace(w, targets=a_promoted, guard=sm.GuardCheck(False, "ok")))
    assert kinds(plan) == ["EnsureGuardLoad"] and w.status["currentWave"] == 1
    assert plan.actions[0].args == {"wave": 0, "batch_size": 8}
    plan, w = run(replace(w, now=T0 + timedelta(seconds=11)))
    assert kinds(plan) == ["EnsureGuardLoad", "DeleteLoadJobs"]
    plan, w = run(w)
    assert kinds(plan) == ["PromoteTargets"] and plan.actions[0].args["targets"] == [("ns", "b")]
    both = [sm.Target("ns", "a", "reference", promoted=did), sm.Target("ns", "b", "reference", promoted=did)]
    plan, w = run(replace(w, targets=both, now=T0 + timedelta(seconds=30)))
    assert w.status["phase"] == "Guarding"
    plan, w = run(replace(w, now=T0 + timedelta(seconds=60)))
    assert w.status["phase"] == "Succeeded" and "DeleteRoles" in kinds(plan)
    assert all(t["promoted"] for t in w.status["targets"])


def test_guard_regression_restores_promoted_targets():
    _, w = full_measure(world())
    _, w = run(replace(w, decision={"action": "Promote", "reason": "wins everywhere"}))
    did = w.status["decision"]["id"]
    _, w = run(w)
    promoted = [sm.Target("ns", "a", "reference", promoted=did), sm.Target("ns", "b", "reference")]
    plan = sm.reconcile(replace(w, targets=promoted, guard=sm.GuardCheck(True, "throughput -7% [-9%, -5%]")))
    assert plan.status["phase"] == "RolledBack"
    assert kinds(plan)[0] == "RestoreTargets" and plan.actions[0].args["targets"] == [("ns", "a")]
    assert kinds(plan).index("RestoreTargets") < kinds(plan).index("ReleaseTargets")
    assert "-7%" in plan.status["rollback"]["message"]


def test_analysis_only_never_touches_fleet():
    w0 = world(spec=spec(promotion=NS(mode="analysisOnly", waves=[100], guard=NS(duration=1), require_approval=False)))
    _, w = full_measure(w0)
    plan = sm.reconcile(replace(w, decision={"action": "Promote", "reason": "wins"}))
    assert plan.status["phase"] == "Succeeded" and "PromoteTargets" not in kinds(plan)


def test_approval_gate_waits_until_approved():
    w0 = world(spec=spec(promotion=NS(mode="full", waves=[100], guard=NS(duration=1), require_approval=True)))
    _, w = full_measure(w0)
    plan, w = run(replace(w, decision={"action": "Promote", "reason": "wins"}))
    assert w.status["phase"] == "Deciding"
    cond = {c["type"]: c for c in w.status["conditions"]}["Approved"]
    assert cond["reason"] == "AwaitingApproval" and "kubectl lookahead approve" in cond["message"]
    plan, w = run(replace(w, approved_decision="an-older-decision"))
    assert w.status["phase"] == "Deciding", "an approval names the decision it approves"
    plan, w = run(replace(w, approved_decision=w.status["decision"]["id"]))
    assert w.status["phase"] == "Promoting"


def test_pause_holds_everything():
    _, w = run(world())
    plan = sm.reconcile(replace(w, spec=spec(paused=True), preflight={"candidate": True}))
    assert plan.actions == [] and plan.status["phase"] == "Preflight"


def test_abort_rolls_back():
    _, w = full_measure(world())
    plan = sm.reconcile(replace(w, abort_requested=True))
    assert plan.status["phase"] == "RolledBack" and plan.status["rollback"]["reason"] == "Aborted"


def test_spec_change_restarts_measurement_and_restores():
    _, w = full_measure(world())
    _, w = run(replace(w, decision={"action": "Promote", "reason": "wins"}))
    did = w.status["decision"]["id"]
    promoted = [sm.Target("ns", "a", "reference", promoted=did), sm.Target("ns", "b", "reference")]
    paused_only = sm.reconcile(replace(w, generation=2, targets=promoted))
    assert paused_only.status["phase"] == "Promoting", "a new generation with the same fingerprint (pause) restarts nothing"
    plan = sm.reconcile(replace(w, generation=3, fingerprint="fp2", targets=promoted))
    assert plan.status["phase"] == "Pending" and plan.status["batches"] == []
    assert kinds(plan)[:3] == ["RestoreTargets", "DeleteLoadJobs", "DeleteRoles"]


def test_reconcile_is_idempotent_when_nothing_changes():
    _, w = full_measure(world())
    _, w = run(replace(w, decision={"action": "Promote", "reason": "wins"}))
    a = sm.reconcile(w)
    b = sm.reconcile(w)
    assert a.actions == b.actions and a.status == b.status


def test_guard_without_data_waits_then_rolls_back_at_the_deadline():
    _, w = full_measure(world())
    _, w = run(replace(w, decision={"action": "Promote", "reason": "wins"}))
    did = w.status["decision"]["id"]
    _, w = run(w)
    promoted = [sm.Target("ns", "a", "reference", promoted=did), sm.Target("ns", "b", "reference")]
    no_data = sm.GuardCheck(False, "guard: not enough data yet", enough_data=False)
    plan, w2 = run(replace(w, targets=promoted, guard=no_data, now=T0 + timedelta(seconds=30)))
    assert w2.status["phase"] == "Promoting" and w2.status["progress"]["wave"] == 0, "no data is not a pass"
    assert {c["type"]: c for c in w2.status["conditions"]}["GuardData"]["reason"] == "WaitingForData"
    plan = sm.reconcile(replace(w2, now=T0 + timedelta(seconds=700)))
    assert plan.status["phase"] == "RolledBack" and plan.status["rollback"]["reason"] == "GuardNoData"
    assert kinds(plan)[0] == "RestoreTargets"


def test_live_mode_is_refused_with_a_condition_naming_the_field():
    s = spec()
    s.load = NS(mode="live", batch_sizes=None, step_duration=60.0)
    plan = sm.reconcile(world(spec=s))
    cond = {c["type"]: c for c in plan.status["conditions"]}["Accepted"]
    assert plan.status["phase"] == "Failed" and cond["status"] == "False" and "spec.load.mode" in cond["message"]
    assert plan.actions == []
