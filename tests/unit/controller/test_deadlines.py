"""Deadlines that fit model loads (issue 23, item 3): the launch and rollout deadlines follow the
fleet's own readiness (its engine container's probes, its progressDeadlineSeconds, the measured
load time of its pods) unless the policy sets promotion.rolloutDeadline. On the state machine's
clock, with the shipped example's spec (which leaves rolloutDeadline unset)."""

from dataclasses import replace
from datetime import timedelta

import pytest

from lookahead_operator.controller import fleet
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.statemachine.clocks import fleet_deadline
from lookahead_operator.controller.world import LoadBudget, Target
from lookahead_operator.api.spec import DEFAULT_ROLLOUT_DEADLINE
from lookahead_operator.api.status import ConditionType, Phase

from .test_statemachine import CANDIDATE, READY, SPEC, T0, K, at, cond, example_spec, kinds, promoting, run, world

ME = "inference/chat-fleet"


def deployment(*containers, progress_deadline=None) -> dict:
    spec = {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}},
            "template": {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": list(containers)}}}
    if progress_deadline is not None:
        spec["progressDeadlineSeconds"] = progress_deadline
    return {"metadata": {"namespace": "serving", "name": "a", "generation": 1}, "spec": spec, "status": {}}


def engine(**probes) -> dict:
    return {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model=big"], **probes}


SIDECAR = {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:stable",
           "readinessProbe": {"httpGet": {"path": "/ready", "port": 4191}, "initialDelaySeconds": 3000}}
#: a large model's engine: the kubelet gives it 90 x 10s = 15m to start
SLOW = engine(startupProbe={"httpGet": {"path": "/health", "port": 8000}, "failureThreshold": 90, "periodSeconds": 10})


def slow_fleet() -> list[Target]:
    """The example's two targets, read from Deployments whose engine has SLOW's startupProbe."""
    budget = fleet.target_of(deployment(SLOW), "vllm").load_budget
    return [Target("serving", n, "vllm", owner=ME, load_budget=budget) for n in ("a", "b")]


def launching(w):
    _, w = run(w)                                                   # Pending -> Preflight
    _, w = run(replace(w, preflight=CANDIDATE), preflight=None)     # Preflight -> Launching
    assert w.status.phase == Phase.Launching and w.status.progress.phase_since == T0
    return w


# --- reading the fleet ---------------------------------------------------------------------------

def test_the_fleet_says_how_long_its_engine_may_take_to_start():
    assert fleet.load_budget_of(deployment(SLOW)) == LoadBudget(probe_s=900, probe="startupProbe")
    # Kubernetes' defaults: period 10, threshold 3, delay 0
    bare = engine(startupProbe={"exec": {"command": ["true"]}}, livenessProbe={"initialDelaySeconds": 3000})
    assert fleet.load_budget_of(deployment(bare)) == LoadBudget(probe_s=30, probe="startupProbe"), \
        "a startupProbe is what bounds the start; the other probes only begin after it"
    # no startupProbe: the larger of the readiness and liveness probes' budgets
    old_style = engine(readinessProbe={"initialDelaySeconds": 60, "periodSeconds": 5},
                       livenessProbe={"initialDelaySeconds": 600, "failureThreshold": 5, "periodSeconds": 20})
    assert fleet.load_budget_of(deployment(old_style, progress_deadline=1200)) == \
        LoadBudget(probe_s=700, probe="livenessProbe", progress_deadline_s=1200)
    assert fleet.load_budget_of(deployment(engine())) == LoadBudget(), "no probe; progressDeadlineSeconds 600"
    # the engine container, found by what it is, not the sidecar before it
    assert fleet.load_budget_of(deployment(SIDECAR, SLOW)).probe_s == 900


def pod(start="2026-11-30T12:00:00Z", ready_at="2026-11-30T12:12:00Z", ready=True, **status) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"containers": [SIDECAR, SLOW]},
            "status": {"startTime": start, "containerStatuses": status.pop("containers", []), **status,
                       "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": ready_at}]}}


def test_the_fleets_pods_say_how_long_they_took_to_load():
    assert fleet.pod_load_s(pod()) == 720
    assert fleet.pod_load_s(pod(ready=False)) is None, "a pod not ready has not loaded yet"
    gone = pod()
    gone["metadata"]["deletionTimestamp"] = "2026-11-30T13:00:00Z"
    assert fleet.pod_load_s(gone) is None
    # its engine container restarted: the load since its last start counts (the sidecar's does not)
    restarted = pod(ready_at="2026-11-30T13:10:00Z", containers=[
        {"name": "linkerd-proxy", "restartCount": 0, "state": {"running": {"startedAt": "2026-11-30T12:00:01Z"}}},
        {"name": "vllm", "restartCount": 2, "state": {"running": {"startedAt": "2026-11-30T13:00:00Z"}}}])
    assert fleet.pod_load_s(restarted) == 600
    # the median of the ready pods: one whose readiness flapped a day later reads as a day-long load
    pods = [pod(), pod(ready_at="2026-11-30T12:10:00Z"), pod(ready_at="2026-12-01T12:00:00Z"), pod(ready=False)]
    assert fleet.measured_load_s(pods) == 720 and fleet.measured_load_s([pod(ready=False)]) is None
    t = fleet.with_load_time(Target("serving", "a"), pods)
    assert t.load_budget == LoadBudget(measured_s=720)
    assert fleet.with_load_time(t, []) == t, "no ready pod: nothing measured, nothing changed"


# --- the deadline and where it came from ---------------------------------------------------------

@pytest.mark.parametrize("budget, policy, want, why", [
    (LoadBudget(), None, 600, "the default, 10m; promotion.rolloutDeadline unset, and the fleet's readiness asks no longer"),
    (LoadBudget(probe_s=120, probe="readinessProbe"), None, 600, "the default, 10m;"),
    (LoadBudget(probe_s=900, probe="startupProbe"), None, 900,
     "the fleet's startupProbe allows 15m; promotion.rolloutDeadline unset"),
    (LoadBudget(progress_deadline_s=1200), None, 1200,
     "the fleet's progressDeadlineSeconds is 20m; promotion.rolloutDeadline unset"),
    (LoadBudget(probe_s=900, probe="startupProbe", measured_s=720), None, 1080,
     "the fleet's pods took 12m to become ready, 1.5x is 18m; promotion.rolloutDeadline unset"),
    (LoadBudget(probe_s=900, probe="startupProbe", measured_s=720), timedelta(minutes=5), 300,
     "promotion.rolloutDeadline"),
])
def test_the_deadline_is_the_policys_when_set_else_the_largest_of_the_default_and_the_fleets(budget, policy, want,
                                                                                              why):
    limit, source = fleet_deadline(policy, [Target("serving", "a", load_budget=budget)])
    assert limit == timedelta(seconds=want) and source.startswith(why), source


def test_over_several_targets_the_deadline_names_the_one_that_set_it():
    slow = Target("serving", "b", load_budget=LoadBudget(probe_s=900, probe="startupProbe"))
    limit, source = fleet_deadline(None, [Target("serving", "a"), slow])
    assert limit == timedelta(minutes=15) and source.startswith("serving/b's startupProbe allows 15m"), source
    assert fleet_deadline(None, []) == (DEFAULT_ROLLOUT_DEADLINE, fleet_deadline(None, [Target("x", "y")])[1])


def test_a_policy_stored_with_the_old_schema_default_keeps_its_10m_and_its_fingerprint():
    """Until this change the CRD defaulted rolloutDeadline to 10m, so every stored policy carries
    it: it reads as set (the operator cannot tell it from a user's 10m), so an upgrade changes
    neither its deadline nor its fingerprint (a running rollout does not restart). A policy without
    it serialises without it, as the apiserver now stores it."""
    stored = example_spec(**{"load.batchSizes": [1, 8], "promotion.rolloutDeadline": "10m"})
    assert stored.promotion.rollout_deadline == timedelta(minutes=10)
    assert stored.to_dict()["promotion"]["rolloutDeadline"] == "10m"
    assert fleet_deadline(stored.promotion.rollout_deadline, slow_fleet()) == (timedelta(minutes=10),
                                                                                "promotion.rolloutDeadline")
    assert "rolloutDeadline" not in SPEC.to_dict()["promotion"] and stored.fingerprint() != SPEC.fingerprint()


# --- on the state machine's clock ----------------------------------------------------------------

def test_a_default_policy_waits_out_a_12_minute_load_and_fails_only_past_the_fleets_startup_budget():
    """Issue 23: the engine takes 12 minutes to become ready; its startupProbe allows 15. A policy
    that sets no rolloutDeadline is not failed at 10m (today's default) nor at 12m, and measures
    once the roles are ready; a canary that never gets ready fails at the fleet's 15m, saying so."""
    assert SPEC.promotion.rollout_deadline is None, "the example leaves promotion.rolloutDeadline unset"
    w = launching(world(targets=slow_fleet()))
    for minute in (10, 12):
        plan, _ = run(at(w, minute * 60 + 1))
        assert plan.status.phase == Phase.Launching, f"failed at {minute}m: {plan.status.message}"
        assert K.DELETE_ROLES not in kinds(plan)
    _, ready = run(replace(at(w, 12 * 60), roles_ready=READY))
    assert ready.status.phase == Phase.Measuring, "the 12-minute load is measured"
    plan, _ = run(at(w, 15 * 60 - 1))
    assert plan.status.phase == Phase.Launching
    plan, _ = run(at(w, 15 * 60))
    assert plan.status.phase == Phase.Failed and K.DELETE_ROLES in kinds(plan)
    assert plan.status.message == ("canary and control were not ready within 15m (the fleet's startupProbe allows "
                                   "15m; promotion.rolloutDeadline unset); they were deleted and the fleet was not "
                                   "touched")


def test_an_explicit_rollout_deadline_still_fails_at_its_own_time():
    spec = example_spec(**{"load.batchSizes": [1, 8], "promotion.rolloutDeadline": "5m"})
    w = launching(world(targets=slow_fleet(), spec=spec, fingerprint=spec.fingerprint()))
    plan, _ = run(at(w, 5 * 60 - 1))
    assert plan.status.phase == Phase.Launching
    plan, _ = run(at(w, 5 * 60))
    assert plan.status.phase == Phase.Failed
    assert "not ready within 5m (promotion.rolloutDeadline)" in plan.status.message


def test_the_launch_deadline_follows_the_measured_load_of_the_fleets_pods():
    measured = [replace(t, load_budget=LoadBudget(measured_s=800)) for t in slow_fleet()]
    w = launching(world(targets=measured))
    plan, _ = run(at(w, 20 * 60 - 1))
    assert plan.status.phase == Phase.Launching
    plan, _ = run(at(w, 20 * 60))
    assert plan.status.phase == Phase.Failed
    assert "within 20m (the fleet's pods took 13m20s to become ready, 1.5x is 20m;" in plan.status.message


def test_a_promoted_deployment_gets_the_fleets_startup_budget_to_roll_out():
    targets = slow_fleet()
    w = promoting(world(targets=targets))
    did = w.status.decision.id
    _, w = run(w)
    stuck = [replace(targets[0], promoted=did, rolled_out=False), targets[1]]
    _, w2 = run(replace(at(w, 60), targets=stuck))
    plan = sm.reconcile(replace(at(w, 12 * 60), targets=stuck, status=w2.status))
    assert plan.status.phase == Phase.Promoting and cond(plan.status, ConditionType.WaveReady).reason == "RollingOut"
    plan = sm.reconcile(replace(at(w, 15 * 60 + 1), targets=stuck, status=w2.status))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "RolloutTimeout"
    assert plan.status.rollback.message == ("wave 1: serving/a not available within 15m (serving/a's startupProbe "
                                            "allows 15m; promotion.rolloutDeadline unset)")


def test_the_operators_default_replaces_the_10m_floor_and_a_slower_fleet_still_wins():
    """The chart's operator.defaultRolloutDeadline (LOOKAHEAD_DEFAULT_ROLLOUT_DEADLINE) is the floor
    in place of 10m: the e2e runs every launch clock scaled down twentyfold with it at 30s."""
    quick = Target("serving", "a", load_budget=LoadBudget(progress_deadline_s=20))
    assert fleet_deadline(None, [quick], timedelta(seconds=30)) == (
        timedelta(seconds=30), "the default, 30s; promotion.rolloutDeadline unset, and the fleet's readiness asks no longer")
    slow = Target("serving", "a", load_budget=LoadBudget(probe_s=45, probe="startupProbe", progress_deadline_s=60))
    assert fleet_deadline(None, [slow], timedelta(seconds=30))[0] == timedelta(seconds=60)
