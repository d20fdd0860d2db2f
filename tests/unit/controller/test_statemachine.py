"""The lifecycle state machine, driven with real specs parsed from YAML (the shipped example and
variations of it), so every default is the one a user gets."""

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from lookahead_operator.controller import statemachine as sm
from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.spec import DEFAULT_ROLLOUT_DEADLINE, LookaheadPolicySpec
from lookahead_operator.api.status import (
    BatchResult,
    ConditionType,
    Decision,
    LookaheadPolicyStatus,
    Phase,
    PreflightStatus,
)
from lookahead_operator.controller.world import ActionKind as K
from lookahead_operator.controller.world import Observed, ReadError, Target

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "chat-fleet.yaml"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def example_spec(**edits) -> LookaheadPolicySpec:
    """The shipped example's spec, with dotted-path edits ("load.batchSizes": [1, 8])."""
    body = yaml.safe_load(EXAMPLE.read_text())
    for path, value in edits.items():
        node = body["spec"]
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return LookaheadPolicy.from_body(body).spec


# The example with an explicit sweep of two batch sizes (the example itself leaves it on auto).
SPEC = example_spec(**{"load.batchSizes": [1, 8]})
STEP = SPEC.load.step_duration                  # 2m, the default
DEADLINE = SPEC.analysis.deadline               # 30m
ROLLOUT = DEFAULT_ROLLOUT_DEADLINE              # 10m: the example leaves promotion.rolloutDeadline unset


def world(status=None, **kw):
    base = dict(now=T0, load_running={"canary", "control", "promoted"},  # load pods run at once unless a test says
                name="chat-fleet", namespace="inference", generation=1, fingerprint=SPEC.fingerprint(),
                spec=SPEC, status=status or LookaheadPolicyStatus(),
                targets=[Target("serving", "a", "reference", owner="inference/chat-fleet"),
                         Target("serving", "b", "reference", owner="inference/chat-fleet")])
    base.update(kw)
    return Observed(**base)


def kinds(plan):
    return [a.kind for a in plan.actions]


def cond(status, type_):
    return next((c for c in status.conditions or [] if c.type == type_), None)


def run(w, **changes):
    """Apply a plan's status to the world, as the handler does after writing it."""
    plan = sm.reconcile(w)
    return plan, replace(w, status=plan.status, **changes)


def at(w, seconds):
    return replace(w, now=T0 + timedelta(seconds=seconds))


def row(bs, verdict="Wins", n=10):
    return BatchResult(batch_size=bs, verdict=verdict, samples={"control": n, "canary": n})


CANDIDATE = sm.PreflightResult(PreflightStatus(candidate=True, verdict="DecodeBoundIdleCompute"), [1, 8])
READY = {"canary": True, "control": True}


def to_measuring(w):
    _, w = run(w)                                            # Pending -> Preflight
    _, w = run(w, preflight=None) if False else run(replace(w, preflight=CANDIDATE), preflight=None)
    _, w = run(replace(w, roles_ready=READY))                # Launching -> Measuring
    assert w.status.phase == Phase.Measuring
    return w


def to_deciding(w):
    w = to_measuring(w)
    for bs in (1, 8):
        _, w = run(replace(w, step=sm.StepMeasurement(row(bs), True)), step=None)
    assert w.status.phase == Phase.Deciding
    return w


def decided(action, **kw):
    return Decision(action=action, reason=kw.pop("reason", f"{action} for the test"), **kw)


# --- admission: examples and defaults can reach a verdict ----------------------------------------

@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_loads_and_each_step_can_yield_the_required_samples(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    policies = [LookaheadPolicy.from_body(d) for d in docs if d.get("kind") == "LookaheadPolicy"]
    assert policies or all(d.get("kind") != "LookaheadPolicy" for d in docs)
    for p in policies:
        spec = p.spec
        window = spec.load.step_duration - spec.load.warmup
        fits = int(window.total_seconds() // spec.analysis.sample_interval.total_seconds())
        assert fits >= spec.load.min_samples_per_step, f"{path.name}: {fits} samples < {spec.load.min_samples_per_step}"
        assert spec.samples_per_step() == fits


def test_the_defaults_are_a_working_policy():
    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "x"}}}})
    assert spec.samples_per_step() >= spec.load.min_samples_per_step
    assert spec.analysis.deadline >= spec.load.step_duration
    assert 0 < spec.analysis.max_throughput_regression < 1 and 0 < spec.analysis.min_latency_improvement < 1


@pytest.mark.parametrize("edits, field", [
    ({"load.stepDuration": "1m", "load.warmup": "30s", "load.minSamplesPerStep": 10}, "minSamplesPerStep"),
    ({"analysis.sampleInterval": "30s"}, "minSamplesPerStep"),
    ({"load.batchSizes": [1, 2, 4, 8], "analysis.deadline": "6m"}, "analysis.deadline"),
    ({"analysis.minLatencyImprovement": "100%"}, "minLatencyImprovement"),
])
def test_a_spec_that_cannot_reach_a_verdict_is_refused(edits, field):
    with pytest.raises(ValueError, match=field):
        example_spec(**edits)


def test_durations_and_percents_are_typed_once():
    assert SPEC.load.step_duration == timedelta(minutes=2) and SPEC.load.warmup == timedelta(seconds=30)
    assert SPEC.analysis.max_throughput_regression == pytest.approx(0.02)
    assert SPEC.promotion.waves == [10, 50, 100]
    wire = SPEC.to_dict()
    assert wire["load"]["stepDuration"] == "2m" and wire["analysis"]["maxThroughputRegression"] == "2%"
    assert LookaheadPolicySpec.model_validate(wire) == SPEC


# --- the lifecycle ---------------------------------------------------------------------------------

def test_pending_claims_targets_and_moves_to_preflight():
    plan = sm.reconcile(world())
    assert plan.status.phase == Phase.Preflight and kinds(plan) == [K.CLAIM]
    assert plan.actions[0].targets == (("serving", "a"), ("serving", "b"))
    assert plan.status.progress.fingerprint == SPEC.fingerprint()


def test_no_targets_waits_with_condition():
    plan = sm.reconcile(world(targets=[]))
    assert plan.status.phase == Phase.Pending and plan.actions == []
    assert cond(plan.status, ConditionType.TargetsFound).reason == "NoTargets"


def test_second_policy_on_same_deployment_is_refused():
    plan = sm.reconcile(world(targets=[Target("serving", "a", owner="other/policy")]))
    c = cond(plan.status, ConditionType.TargetsFound)
    assert c.reason == "Conflict" and "other/policy" in c.message and plan.actions == []


def test_invalid_spec_fails_with_condition_and_touches_nothing():
    plan = sm.reconcile(world(spec=None, spec_error="spec.lookahead.window: must be >= 1"))
    assert plan.status.phase == Phase.Failed
    c = cond(plan.status, ConditionType.Accepted)
    assert c.status == "False" and "window" in c.message
    assert K.PROMOTE not in kinds(plan) and K.RESTORE not in kinds(plan)


def test_not_a_candidate_releases_and_stops():
    _, w = run(world())
    no = sm.PreflightResult(PreflightStatus(candidate=False, verdict="PrefillDominated",
                                            reasons=["prefill is 80% of request time"]), [1])
    plan = sm.reconcile(replace(w, preflight=no))
    assert plan.status.phase == Phase.NotACandidate and kinds(plan) == [K.RELEASE]
    assert "prefill" in plan.status.decision.reason and plan.requeue_after is None


def test_auto_batch_sizes_are_cut_to_what_the_deadline_fits():
    spec = example_spec(**{"analysis.deadline": "4m"})     # 2 steps of 2m
    _, w = run(world(spec=spec, fingerprint=spec.fingerprint()))
    many = sm.PreflightResult(PreflightStatus(candidate=True), [1, 4, 16, 32])
    plan = sm.reconcile(replace(w, preflight=many))
    assert plan.status.progress.batch_sizes == [1, 4] and "cut to [1, 4]" in plan.status.message


def test_measuring_walks_steps_records_rows_and_asks_to_look_at_the_next_sample():
    w = to_measuring(world())
    plan, w = run(w)
    load = [a for a in plan.actions if a.kind == K.ENSURE_LOAD]
    assert load and load[0].step == 0 and load[0].batch_size == 1
    assert load[0].until == sm.step_deadline(SPEC, 2, 0, w.status.progress.measuring_since), \
        "the load Jobs last as long as the state machine lets the step measure"
    assert plan.requeue_after == SPEC.analysis.sample_interval.total_seconds()
    plan, w2 = run(replace(w, step=sm.StepMeasurement(row(1, "Pending"), False)))
    assert w2.status.progress.step == 0 and w2.status.batches[0].verdict == "Pending"
    plan, w3 = run(replace(w2, step=sm.StepMeasurement(row(1), True)), step=None)
    assert w3.status.progress.step == 1 and K.DELETE_LOAD in kinds(plan)
    assert [r.batch_size for r in w3.status.batches] == [1]
    assert w3.status.progress.load_run == w2.status.progress.load_run + 1, "the next step's Jobs get new names"


def test_an_unclear_step_measures_on_to_its_share_a_starved_one_waits_and_the_deadline_ends_measurement():
    w = to_measuring(world())
    _, w = run(w)                                            # the load runs from T0
    until = (sm.step_deadline(SPEC, 2, 0, T0) - T0).total_seconds()
    assert until == DEADLINE.total_seconds() / 2 > STEP.total_seconds(), "30m / 2 batch sizes"
    _, w = run(replace(at(w, STEP.total_seconds() + 1), step=sm.StepMeasurement(row(1, "Pending", n=3), False)))
    assert w.status.progress.step == 0 and "waiting for data" in w.status.message, "too few samples: it waits"
    _, w = run(replace(at(w, STEP.total_seconds() + 2), step=sm.StepMeasurement(row(1, "Pending"), False)))
    assert w.status.progress.step == 0 and "measuring on" in w.status.message, "data, no answer: it measures on"
    _, w = run(replace(at(w, until - 1), step=sm.StepMeasurement(row(1, "Pending"), False)))
    assert w.status.progress.step == 0
    _, w = run(replace(at(w, until + 1), step=sm.StepMeasurement(row(1, "Pending"), False)))
    assert w.status.progress.step == 1, "its share of the deadline used: the step ends without an answer"
    _, w = run(replace(at(w, until + 1), step=None))       # step 1's load runs from here
    _, w = run(replace(at(w, DEADLINE.total_seconds() - 1), step=sm.StepMeasurement(row(8, "Pending"), False)))
    assert w.status.progress.step == 1 and w.status.phase == Phase.Measuring, "the last share, to the deadline"
    _, w = run(at(w, DEADLINE.total_seconds() + 1))
    assert w.status.phase == Phase.Deciding


def test_time_an_early_step_leaves_goes_to_the_next_unclear_one_never_the_later_ones_share():
    """Three planned sizes, 30m: batch 1 settles at stepDuration; batch 8, unclear, measures on with
    its own 10m and the 8m batch 1 left (to 20m from the start), and batch 16 still has its 10m."""
    three = example_spec(**{"load.batchSizes": [1, 8, 16]})
    assert (sm.step_deadline(three, 3, 1, T0) - T0) == 2 * DEADLINE / 3
    assert (sm.step_deadline(three, 3, 2, T0) - T0) == DEADLINE
    w = to_measuring(world(spec=three, fingerprint=three.fingerprint()))
    _, w = run(w)
    assert w.status.progress.batch_sizes == [1, 8, 16]
    _, w = run(replace(at(w, STEP.total_seconds() + 1), step=sm.StepMeasurement(row(1), True)), step=None)
    assert w.status.progress.step == 1
    _, w = run(at(w, STEP.total_seconds() + 1))              # batch 8's load runs from here
    longer = 2 * DEADLINE.total_seconds() / 3 - 1            # past its own 10m share from its start
    assert longer - STEP.total_seconds() > DEADLINE.total_seconds() / 3
    _, w = run(replace(at(w, longer), step=sm.StepMeasurement(row(8, "Pending"), False)))
    assert w.status.progress.step == 1 and "measuring on" in w.status.message
    _, w = run(replace(at(w, longer + 2), step=sm.StepMeasurement(row(8, "Pending"), False)))
    assert w.status.progress.step == 2, "the last size's share is not taken"


def test_a_step_gets_its_step_duration_even_when_earlier_steps_used_the_time_meant_for_it():
    """A step before waited on its pods past its share: the next step still measures for its full
    stepDuration (the analysis deadline bounds the whole), and does not measure on."""
    w = to_measuring(world())
    _, w = run(w)
    late = DEADLINE.total_seconds() - STEP.total_seconds() + 30   # past step 0's share and then some
    _, w = run(replace(at(w, late), step=sm.StepMeasurement(row(1), True)), step=None)
    assert w.status.progress.step == 1
    _, w = run(at(w, late))                                  # step 1's load runs from here
    _, w = run(replace(at(w, late + STEP.total_seconds() - 31), step=sm.StepMeasurement(row(8, "Pending"), False)))
    assert w.status.progress.step == 1 and w.status.phase == Phase.Measuring
    _, w = run(replace(at(w, DEADLINE.total_seconds() + 1), step=sm.StepMeasurement(row(8, "Pending"), False)))
    assert w.status.phase == Phase.Deciding, "the analysis deadline still ends it"


def test_a_step_waits_for_both_load_pods_and_its_clock_starts_when_they_run():
    """Issue 12: a load pod that stays pending (unschedulable on a full node) must not turn into
    windows of a role that "stalled". The step measures nothing and its clock does not run until
    both load Jobs have a running pod; a load that never runs ends at the analysis deadline with no
    answer (Deciding: Inconclusive), never with a verdict."""
    w = to_measuring(world(load_running=set()))
    _, w = run(replace(w, load_running={"control"}))
    assert w.status.progress.load_started_at is None and "waiting for the load Jobs' pods" in w.status.message
    _, w = run(at(w, 300))                                              # still only the control's
    assert w.status.progress.step == 0 and w.status.progress.load_started_at is None
    _, w = run(replace(at(w, 400), load_running={"canary", "control"}))
    assert w.status.progress.load_started_at == T0 + timedelta(seconds=400)
    _, w = run(replace(at(w, 400 + STEP.total_seconds() - 1), step=sm.StepMeasurement(row(1, "Pending"), False)))
    assert w.status.progress.step == 0 and "measuring on" not in w.status.message, \
        "stepDuration counts from when the load ran, not from the step's start"
    _, w = run(replace(at(w, 400 + STEP.total_seconds() + 1), step=sm.StepMeasurement(row(1), True)), step=None)
    assert w.status.progress.step == 1 and w.status.progress.load_started_at is None, "the next step waits afresh"

    never = to_measuring(world(load_running={"control"}))
    _, never = run(at(never, DEADLINE.total_seconds() - 1))
    assert never.status.phase == Phase.Measuring and never.status.batches in (None, [])
    plan, never = run(at(never, DEADLINE.total_seconds() + 1))
    assert never.status.phase == Phase.Deciding and K.DELETE_LOAD in kinds(plan)


def test_a_replaced_canary_pod_restarts_the_step_on_fresh_load():
    """Issue 12: the canary pod the step's load Job drives (by IP) is deleted mid-step (evicted, a
    node drained) and its Deployment starts a new one. The old load reaches nothing and the new pod
    is not driven: its windows would read as canary stalls. The step starts again on a new load
    run: the old Jobs deleted, loadStartedAt cleared (nothing measured before counts), a Warning
    event; the step's verdict then comes from the new load only."""
    w = to_measuring(world())
    _, w = run(w)
    started, run_before = w.status.progress.load_started_at, w.status.progress.load_run
    assert started is not None
    plan, w = run(replace(at(w, 40), load_pods_gone={"canary"}, step=sm.StepMeasurement(row(1, "Pending"), False)))
    assert K.DELETE_LOAD in kinds(plan) and w.status.progress.load_run == run_before + 1
    assert w.status.progress.load_started_at is None and w.status.progress.step == 0
    assert any(e[1] == "LoadRestarted" and "canary" in e[2] for e in plan.events), plan.events
    plan, w = run(replace(at(w, 45), load_pods_gone=set(), step=None))
    assert K.ENSURE_LOAD in kinds(plan) and w.status.progress.load_started_at == T0 + timedelta(seconds=45)


def test_step_load_is_both_roles_or_neither_and_lasts_as_long_as_the_step_may_measure():
    from lookahead_operator.controller import loadjobs

    def pod(role, ready=True):
        return {"metadata": {"name": f"{role}-0", "namespace": "serving"},
                "spec": {"containers": [{"name": "e", "ports": [{"name": "http", "containerPort": 8000}]}]},
                "status": {"podIP": "10.0.0.1", "phase": "Running",
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}

    policy = {"metadata": {"name": "chat-fleet", "namespace": "inference", "uid": "u"}}
    one = loadjobs.step_jobs(SPEC, policy, "serving", 0, 1, 8, {"canary": [pod("canary", False)], "control": [pod("control")]}, T0, T0)
    assert one == [], "the control alone would be driven while the canary sits idle"
    pods = {"canary": [pod("canary")], "control": [pod("control")]}
    both = loadjobs.step_jobs(SPEC, policy, "serving", 0, 1, 8, pods, sm.step_deadline(SPEC, 2, 0, T0),
                              T0 + timedelta(seconds=60))
    assert len(both) == 2
    budget = int((sm.step_deadline(SPEC, 2, 0, T0) - T0).total_seconds()) - 60
    assert budget > STEP.total_seconds()
    for job in both:
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--step-duration") + 1] == f"{budget}s", \
            "a step measures on past stepDuration when unclear: its load must still run"
    late = loadjobs.step_jobs(SPEC, policy, "serving", 0, 1, 8, pods, sm.step_deadline(SPEC, 2, 0, T0), T0 + DEADLINE)
    args = late[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--step-duration") + 1] == f"{int(STEP.total_seconds())}s", \
        "a step always gets its own stepDuration of load"


def test_launching_that_never_gets_ready_fails_within_the_rollout_deadline_and_cleans_up():
    _, w = run(world())
    _, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    plan, w = run(at(w, ROLLOUT.total_seconds() - 1))
    assert w.status.phase == Phase.Launching and cond(w.status, ConditionType.RolesReady).status == "False"
    plan = sm.reconcile(at(w, ROLLOUT.total_seconds() + 1))
    assert plan.status.phase == Phase.Failed and plan.status.message.startswith("canary and control were not ready")
    assert K.DELETE_ROLES in kinds(plan) and K.ENSURE_ROLES not in kinds(plan) and K.PROMOTE not in kinds(plan)


def test_rollback_decision_leaves_fleet_untouched():
    w = to_deciding(world())
    plan = sm.reconcile(replace(w, decision=decided("Rollback", reason="throughput fell 6% at batch 8")))
    assert plan.status.phase == Phase.RolledBack
    assert K.PROMOTE not in kinds(plan) and K.RESTORE not in kinds(plan) and K.DELETE_ROLES in kinds(plan)


def promoting(w, action="Promote", **kw):
    w = to_deciding(w)
    _, w = run(replace(w, decision=decided(action, **kw)), decision=None)
    assert w.status.phase == Phase.Promoting
    return w


def test_promotion_in_waves_then_guard_then_success():
    w = promoting(world(), "PromoteRegimeAware", crossover_batch_size=8)
    assert w.status.crossover_batch_size == 8
    did = w.status.decision.id
    plan, w = run(w)
    # waves 10%, 50%, 100% of two Deployments: a, then a (already), then b
    assert kinds(plan) == [K.PROMOTE] and plan.actions[0].targets == (("serving", "a"),)
    a_done = [Target("serving", "a", "reference", owner="inference/chat-fleet", promoted=did),
              Target("serving", "b", "reference", owner="inference/chat-fleet")]
    plan, w = run(replace(w, targets=a_done, guard=sm.GuardCheck(False, "ok")))
    assert kinds(plan) == [K.ENSURE_GUARD_LOAD] and w.status.current_wave == 1
    assert cond(w.status, ConditionType.WaveReady).status == "True"
    wave = SPEC.promotion.wave_duration.total_seconds()
    plan, w = run(at(w, wave + 1))
    assert w.status.progress.wave == 1 and K.DELETE_LOAD in kinds(plan)
    plan, w = run(at(w, wave + 2))                           # wave 2 (50%) is still just a
    plan, w = run(at(w, 2 * wave + 3))
    assert w.status.progress.wave == 2
    plan, w = run(at(w, 2 * wave + 4))
    assert kinds(plan) == [K.PROMOTE] and plan.actions[0].targets == (("serving", "b"),)
    both = [replace(t, promoted=did) for t in a_done]
    plan, w = run(replace(at(w, 3 * wave + 5), targets=both))
    assert w.status.phase == Phase.Guarding
    plan, w = run(at(w, 3 * wave + 6 + SPEC.promotion.guard.duration.total_seconds()))
    assert w.status.phase == Phase.Succeeded and K.DELETE_ROLES in kinds(plan)
    assert all(t.promoted for t in w.status.targets) and plan.requeue_after is None
    assert cond(w.status, ConditionType.Ready).status == "True"


def test_one_deployment_of_ten_replicas_is_promoted_1_then_5_then_10_pods_each_wave_guarded():
    """Issue 22: waves [10%, 50%, 100%] of one Deployment of 10 replicas promote 1, 5, then 10 of
    its pods: in part through its wave Deployment (the target lends it replicas), then whole (its
    template), and only then does the wave Deployment go. Each wave waits for its pods and is guarded."""
    fleet = Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10)
    w = promoting(world(targets=[fleet]))
    did = w.status.decision.id
    wave_s = SPEC.promotion.wave_duration.total_seconds()
    t = 0.0
    for wave, pods in enumerate([1, 5, 10]):
        plan, w = run(at(w, t))
        assert w.status.progress.wave == wave and kinds(plan) == [K.PROMOTE], (wave, kinds(plan))
        assert plan.actions[0].targets == (("serving", "a"),) and plan.actions[0].pods == (pods,)
        row = w.status.targets[0]
        assert (row.promoted, row.replicas, row.promoted_pods, row.wave) == (True, 10, pods, 1)
        lent = 0 if pods == 10 else pods
        # promoted, its wave Deployment still starting: the wave waits for it, guards nothing yet
        now = replace(fleet, promoted=did, lent=lent, wave_replicas=5 if pods == 10 else pods,
                      wave_ready=False)
        plan, w = run(replace(at(w, t + 1), targets=[now]))
        if pods < 10:
            assert cond(w.status, ConditionType.WaveReady).reason == "RollingOut"
            assert K.ENSURE_GUARD_LOAD not in kinds(plan)
        else:  # promoted whole: its own rollout is what counts; the old wave Deployment goes after it
            assert K.DELETE_WAVES in kinds(plan) and plan.actions[kinds(plan).index(K.DELETE_WAVES)].targets == \
                (("serving", "a"),)
        ready = replace(now, wave_ready=True) if pods < 10 else replace(now, wave_replicas=None)
        plan, w = run(replace(at(w, t + 2), targets=[ready], guard=sm.GuardCheck(False, "ok")))
        assert K.PROMOTE not in kinds(plan) and K.ENSURE_GUARD_LOAD in kinds(plan), (wave, kinds(plan))
        assert cond(w.status, ConditionType.WaveReady).status == "True"
        fleet = ready
        t += wave_s + 3
        plan, w = run(replace(at(w, t), targets=[ready]))
        t += 1
    assert w.status.phase == Phase.Guarding


def test_a_target_lends_replicas_only_once_its_wave_pods_serve_and_within_the_rollout_deadline():
    w = promoting(world(targets=[Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10)]))
    plan, w = run(w)
    assert [e[1] for e in plan.events].count("WaveStarted") == 1
    # the wave Deployment is there with its one replica, not yet serving: the target has lent nothing
    starting = [Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10, wave_replicas=1)]
    plan, w2 = run(replace(at(w, 60), targets=starting))
    assert kinds(plan) == [K.PROMOTE] and plan.actions[0].pods == (1,), "the action lends once the pods serve"
    assert "WaveStarted" not in [e[1] for e in plan.events], "the wave's clock is not restarted"
    assert cond(w2.status, ConditionType.WaveReady).reason == "RollingOut"
    assert w2.status.progress.wave_started_at == w.status.progress.wave_started_at
    plan = sm.reconcile(replace(at(w, ROLLOUT.total_seconds() + 1), targets=starting, status=w2.status))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "RolloutTimeout"
    assert "serving/a's wave Deployment" in plan.status.rollback.message
    assert K.DELETE_WAVES in kinds(plan) and K.PROMOTE not in kinds(plan)


def in_first_replica_wave():
    """A policy in the first wave over one Deployment of 10 replicas, and that Deployment as observed
    once it lent 1 replica to its (ready) wave Deployment."""
    w = promoting(world(targets=[Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10)]))
    _, w = run(w)
    return w, Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10,
                     promoted=w.status.decision.id, lent=1, wave_replicas=1, wave_ready=True)


def test_a_rollback_mid_wave_gives_the_lent_replicas_back_before_the_wave_deployment_goes():
    w, lent = in_first_replica_wave()
    part = [lent]
    plan = sm.reconcile(replace(at(w, 5), targets=part, guard=sm.GuardCheck(True, "throughput -20% [-25%, -15%]")))
    assert plan.status.phase == Phase.RolledBack
    assert kinds(plan)[:2] == [K.RESTORE, K.DELETE_WAVES] and plan.actions[0].targets == (("serving", "a"),)
    # a wave Deployment whose target had not lent yet (the operator stopped between the two writes)
    early = [Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10, wave_replicas=1)]
    plan = sm.reconcile(replace(at(w, 5), targets=early, abort_requested=True))
    assert K.DELETE_WAVES in kinds(plan) and K.RESTORE not in kinds(plan)


def test_a_target_its_user_edits_mid_wave_gets_its_replicas_back_and_loses_its_wave_deployment():
    w, lent = in_first_replica_wave()
    edited = [replace(lent, user_edited=True)]
    plan = sm.reconcile(replace(at(w, 5), targets=edited))
    got = [(a.kind, a.targets) for a in plan.actions]
    leave = got.index((K.LEAVE, (("serving", "a"),)))
    assert any(kind == K.DELETE_WAVES and targets in ((), (("serving", "a"),)) for kind, targets in got[leave:]), got
    assert not any(kind in (K.PROMOTE, K.RESTORE) for kind, _ in got), got


def test_a_deployment_that_starts_matching_mid_rollout_is_left_alone_and_named():
    """Issue 12: serving/c starts matching spec.targets while the rollout measures. It was not in
    the preflight nor in the plan: it is never claimed, promoted or restored, the waves are cut
    from the claimed targets only, and TargetsFound names it."""
    newcomer = Target("serving", "c", "reference")
    w = to_measuring(world())
    claimed = [t.key for t in w.targets]
    plan, w = run(replace(w, targets=[*w.targets, newcomer]))
    assert w.status.phase == Phase.Measuring and not any(("serving", "c") in a.targets for a in plan.actions)
    found = cond(w.status, ConditionType.TargetsFound)
    assert found.reason == "NewTargetsLeftAlone" and "serving/c" in found.message
    w = promoting(w)
    plan, w = run(at(w, 1))
    touched = [k for a in plan.actions for k in a.targets]
    assert touched and set(touched) <= set(claimed), touched
    assert [(t.namespace, t.name) for t in w.status.targets] == claimed
    aborted = sm.reconcile(replace(w, abort_requested=True))
    assert not any(("serving", "c") in a.targets for a in aborted.actions), "nothing of c is restored either"


def test_promoted_template_that_never_becomes_available_is_restored_within_the_rollout_deadline():
    w = promoting(world())
    did = w.status.decision.id
    _, w = run(w)
    stuck = [Target("serving", "a", "reference", owner="inference/chat-fleet", promoted=did, rolled_out=False),
             Target("serving", "b", "reference", owner="inference/chat-fleet")]
    plan, w2 = run(replace(at(w, 60), targets=stuck))
    assert w2.status.phase == Phase.Promoting and cond(w2.status, ConditionType.WaveReady).reason == "RollingOut"
    plan = sm.reconcile(replace(at(w, ROLLOUT.total_seconds() + 1), targets=stuck, status=w2.status))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "RolloutTimeout"
    assert kinds(plan)[0] == K.RESTORE and plan.actions[0].targets == (("serving", "a"),)
    assert cond(plan.status, ConditionType.WaveReady) is None


def test_progress_deadline_exceeded_rolls_back_at_once():
    w = promoting(world())
    did = w.status.decision.id
    _, w = run(w)
    broken = [Target("serving", "a", "reference", owner="inference/chat-fleet", promoted=did, rolled_out=False,
                     rollout_failed='ReplicaSet "a-1" has timed out progressing.'),
              Target("serving", "b", "reference", owner="inference/chat-fleet")]
    plan = sm.reconcile(replace(at(w, 5), targets=broken))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "RolloutFailed"
    assert "timed out progressing" in plan.status.rollback.message and kinds(plan)[0] == K.RESTORE


def first_wave_promoted():
    """A policy in its first wave, and its targets as observed once the wave's target is promoted."""
    w = promoting(world())
    did = w.status.decision.id
    _, w = run(w)
    return w, [Target("serving", "a", "reference", owner="inference/chat-fleet", promoted=did),
               Target("serving", "b", "reference", owner="inference/chat-fleet")]


def test_guard_regression_restores_promoted_targets():
    w, promoted = first_wave_promoted()
    plan = sm.reconcile(replace(w, targets=promoted, guard=sm.GuardCheck(True, "throughput -7% [-9%, -5%]")))
    assert plan.status.phase == Phase.RolledBack and kinds(plan)[0] == K.RESTORE
    assert kinds(plan).index(K.RESTORE) < kinds(plan).index(K.RELEASE)
    assert "-7%" in plan.status.rollback.message


def test_guard_without_data_rolls_back_at_the_deadline_and_never_says_wave_ready():
    w, promoted = first_wave_promoted()
    no_data = sm.GuardCheck(False, "guard: not enough data yet", enough_data=False)
    wave = SPEC.promotion.wave_duration.total_seconds()
    _, w2 = run(replace(at(w, wave + 1), targets=promoted, guard=no_data))
    assert w2.status.phase == Phase.Promoting and w2.status.progress.wave == 0, "no data is not a pass"
    assert cond(w2.status, ConditionType.GuardData).reason == "WaitingForData"
    plan = sm.reconcile(replace(w2, now=T0 + DEADLINE + timedelta(seconds=1)))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "GuardNoData"
    assert kinds(plan)[0] == K.RESTORE
    assert cond(plan.status, ConditionType.WaveReady) is None


def test_guard_load_restarts_when_its_promoted_pod_is_gone_or_its_jobs_end_without_data():
    """Issue 12, found by the soak: the promoted pod a guard Job drives was deleted (its Deployment
    made a new one), or the guard's Jobs ran out while Prometheus was down. The guard then had no
    load and no data, and rolled a winning rollout back at the deadline (GuardNoData). Now its load
    starts again on a new run (old Jobs deleted, a LoadRestarted event), and the comparison counts
    from the new Jobs; Jobs that end once the guard has its data change nothing."""
    w, promoted = first_wave_promoted()
    no_data = sm.GuardCheck(False, "guard: not enough data yet", enough_data=False)
    _, w = run(replace(at(w, 3), targets=promoted, guard=no_data, load_running={"promoted", "control"}))
    run_before = w.status.progress.load_run
    assert w.status.progress.load_started_at is not None
    plan, w = run(replace(at(w, 10), targets=promoted, guard=no_data, load_pods_gone={"promoted"}))
    assert w.status.phase == Phase.Promoting and K.DELETE_LOAD in kinds(plan)
    assert w.status.progress.load_run == run_before + 1 and w.status.progress.load_started_at is None
    assert any(e[1] == "LoadRestarted" and "promoted pod" in e[2] for e in plan.events), plan.events
    plan, w = run(replace(at(w, 12), targets=promoted, guard=no_data, load_pods_gone=set()))
    assert K.ENSURE_GUARD_LOAD in kinds(plan) and K.DELETE_LOAD not in kinds(plan)
    # the new Jobs ran out before the comparison had its data: again
    plan, w = run(replace(at(w, 50), targets=promoted, guard=no_data, load_finished={"promoted", "control"}))
    assert K.DELETE_LOAD in kinds(plan) and w.status.progress.load_run == run_before + 2
    assert any("load ended before enough data" in e[2] for e in plan.events), plan.events
    # ended with the data in hand: the wave goes on as before
    enough = sm.GuardCheck(False, "throughput +1% [-1%, +3%]", enough_data=True)
    _, w = run(replace(at(w, 52), targets=promoted, guard=no_data, load_running={"promoted", "control"},
                       load_finished=set()))
    wave = SPEC.promotion.wave_duration.total_seconds()
    plan, w = run(replace(at(w, 52 + wave + 1), targets=promoted, guard=enough, load_finished={"promoted", "control"}))
    assert not any(e[1] == "LoadRestarted" for e in plan.events), plan.events
    assert w.status.progress.wave == 1, "the wave passed on the data it had"


def test_analysis_only_never_touches_fleet():
    spec = example_spec(**{"load.batchSizes": [1, 8], "promotion.mode": "analysisOnly"})
    w = to_deciding(world(spec=spec, fingerprint=spec.fingerprint()))
    plan = sm.reconcile(replace(w, decision=decided("Promote")))
    assert plan.status.phase == Phase.Succeeded and K.PROMOTE not in kinds(plan)


def test_approval_gate_waits_until_approved():
    spec = example_spec(**{"load.batchSizes": [1, 8], "promotion.requireApproval": True})
    w = to_deciding(world(spec=spec, fingerprint=spec.fingerprint()))
    plan, w = run(replace(w, decision=decided("Promote")))
    assert w.status.phase == Phase.Deciding and plan.requeue_after is None, "waits for the annotation, not a timer"
    c = cond(w.status, ConditionType.Approved)
    assert c.reason == "AwaitingApproval" and "kubectl lookahead approve" in c.message
    _, w = run(replace(w, approved_decision="an-older-decision", decision=decided("Promote")))
    assert w.status.phase == Phase.Deciding, "an approval names the decision it approves"
    _, w = run(replace(w, approved_decision=w.status.decision.id, decision=decided("Promote")))
    assert w.status.phase == Phase.Promoting


def test_abort_rolls_back():
    w = to_measuring(world())
    plan = sm.reconcile(replace(w, abort_requested=True))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "Aborted"


def test_spec_change_restarts_measurement_and_restores():
    w = promoting(world())
    did = w.status.decision.id
    promoted = [Target("serving", "a", "reference", owner="inference/chat-fleet", promoted=did),
                Target("serving", "b", "reference", owner="inference/chat-fleet")]
    same = sm.reconcile(replace(w, generation=2, targets=promoted))
    assert same.status.phase == Phase.Promoting, "a new generation with the same fingerprint (pause) restarts nothing"
    plan = sm.reconcile(replace(w, generation=3, fingerprint="fp2", targets=promoted))
    assert plan.status.phase == Phase.Pending and not plan.status.batches and plan.status.decision is None
    assert kinds(plan)[:4] == [K.RESTORE, K.DELETE_WAVES, K.DELETE_LOAD, K.DELETE_ROLES]


def test_a_new_default_from_a_crd_or_operator_upgrade_restarts_nothing():
    """Issue 12: a CRD upgrade adds a field with a default (or a newer operator knows one): the
    stored spec now reads -- and hashes -- differently, though nobody wrote to it (metadata
    .generation unchanged). That is no change of intent: the new hash is adopted, measurement and
    promotion go on. A write to the spec (a new generation) with a new hash still restarts."""
    w = promoting(world())
    assert w.status.progress.fingerprint_generation == w.generation
    plan = sm.reconcile(replace(w, fingerprint="fp-with-new-default"))
    assert plan.status.phase == Phase.Promoting and plan.status.progress.fingerprint == "fp-with-new-default"
    assert K.RESTORE not in kinds(plan) and any(e[1] == "SpecDefaulted" for e in plan.events)
    paused_once = sm.reconcile(replace(w, generation=w.generation + 1))          # pause: same hash, new generation
    assert paused_once.status.progress.fingerprint_generation == w.generation + 1
    edited = sm.reconcile(replace(w, generation=w.generation + 1, fingerprint="fp-user-edit"))
    assert edited.status.phase == Phase.Pending and any(e[1] == "SpecChanged" for e in edited.events)


def test_a_phase_change_event_states_the_change_and_its_log_line_leaves_it_to_the_phase_line():
    """The Event of a phase change says ``Pending -> Preflight: <why>`` (``kubectl describe`` has
    no other line for it); the operator's log says the change on its own line, so the event's log
    line drops it (``without_transition``), and only it: other messages are logged as posted."""
    plan = sm.reconcile(world())
    (type_, reason, message), = [e for e in plan.events if e[1] == "TargetsClaimed"]
    assert message == sm.transition_message(Phase.Pending, Phase.Preflight, "claimed 2 Deployment(s); checking "
                                                                            "the workload")
    assert message.startswith("Pending -> Preflight: ")
    assert sm.without_transition(message) == "claimed 2 Deployment(s); checking the workload"
    for other in ("lookahead on in serving/a", "batch size 8: the canary pod is gone -> restarted",
                  "Measuring -> Exploded: not a phase", "x Pending -> Preflight: not at the start"):
        assert sm.without_transition(other) == other


def test_reconcile_is_idempotent_when_nothing_changes():
    w = promoting(world())
    a, b = sm.reconcile(w), sm.reconcile(w)
    assert a.actions == b.actions and a.status == b.status


def test_live_mode_through_an_http_route_is_accepted_and_wired():
    # split: gatewayAPI is wired (test_live_gateway.py): no longer refused as Unsupported
    spec = example_spec(**{"load.mode": "live", "load.livePercent": "10%", "load.split": "gatewayAPI",
                           "load.gatewayAPI": {"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat"}}})
    plan = sm.reconcile(world(spec=spec, fingerprint=spec.fingerprint()))
    c = cond(plan.status, ConditionType.Accepted)
    assert plan.status.phase == Phase.Preflight and c.status == "True"


# --- every wait bounded, every error a state -------------------------------------------------------

def outage():
    return [ReadError("prometheus", "http://prometheus:9090: ObservationError: connection refused")]


def test_prometheus_down_past_the_deadline_ends_inconclusive_with_the_fleet_untouched():
    from lookahead_operator.measurement import measure

    w = to_measuring(world())
    seen = []
    t = 0.0
    while w.status.phase == Phase.Measuring:
        plan, w = run(replace(at(w, t), read_errors=outage()), read_errors=[])
        seen += kinds(plan)
        if w.status.phase == Phase.Measuring:
            assert cond(w.status, ConditionType.MetricsAvailable).status == "False"
        t += plan.requeue_after
        assert t < DEADLINE.total_seconds() + 60, "the deadline must end measurement"
    assert w.status.phase == Phase.Deciding and w.now - T0 >= DEADLINE
    decision = measure.decision(SPEC, w.status)                 # what the handler computes when Deciding
    plan = sm.reconcile(replace(w, decision=decision))
    assert decision.action == "Inconclusive" and plan.status.phase == Phase.Failed
    assert K.PROMOTE not in seen + kinds(plan) and K.RESTORE not in seen + kinds(plan)
    assert K.DELETE_ROLES in kinds(plan) and K.RELEASE in kinds(plan)


def test_prometheus_down_briefly_then_back_the_policy_decides():
    w = to_measuring(world())
    _, w = run(replace(at(w, 10), read_errors=outage()), read_errors=[])
    assert cond(w.status, ConditionType.MetricsAvailable).status == "False" and w.status.progress.read_errors == 1
    _, w = run(replace(at(w, 20), step=sm.StepMeasurement(row(1), True)), step=None)
    assert cond(w.status, ConditionType.MetricsAvailable).status == "True" and not w.status.progress.read_errors
    _, w = run(replace(at(w, 30), step=sm.StepMeasurement(row(8, "Regresses"), True)), step=None)
    assert w.status.phase == Phase.Deciding


def test_pause_mid_step_freezes_clocks_stops_load_and_duplicates_nothing_on_resume():
    w = to_measuring(world())
    plan, w = run(at(w, 30))
    run_before = w.status.progress.load_run
    assert [a.run for a in plan.actions if a.kind == K.ENSURE_LOAD] == [run_before]
    paused_spec = SPEC.model_copy(update={"paused": True})
    plan, w = run(replace(at(w, 40), spec=paused_spec, generation=2))
    assert kinds(plan) == [K.DELETE_LOAD], "pausing stops the load and does nothing else"
    assert cond(w.status, ConditionType.Paused).status == "True" and plan.requeue_after is None
    for t in (100, 1000, 4000):                              # paused far past the step and the deadline
        plan, w = run(at(w, t))
        assert plan.actions == [] and w.status.phase == Phase.Measuring and w.status.progress.step == 0
    plan, w = run(replace(at(w, 4010), spec=SPEC, generation=3))
    p = w.status.progress
    assert p.load_run == run_before + 1, "resumed load gets fresh Job names"
    assert p.step == 0 and p.step_started_at == T0 + timedelta(seconds=4010), "the interrupted step starts afresh"
    assert p.measuring_since == T0 + timedelta(seconds=4010 - 40), "the deadline clock skipped the pause"
    loads = [a for a in plan.actions if a.kind == K.ENSURE_LOAD]
    assert len(loads) == 1 and loads[0].run == run_before + 1
    assert cond(w.status, ConditionType.Paused).status == "False"


def test_conditions_are_exactly_the_declared_types():
    w = promoting(world())
    statuses = [w.status]
    for _ in range(3):
        plan, w = run(w)
        statuses.append(plan.status)
    for s in statuses:
        assert {c.type for c in s.conditions} <= set(ConditionType)


def test_deletion_plan_restores_mid_rollout_and_keeps_lookahead_after_success():
    me = "inference/chat-fleet"
    targets = [Target("serving", "a", owner=me, promoted="d1"), Target("serving", "b", owner=me)]
    mid = sm.deletion_plan(LookaheadPolicyStatus(phase=Phase.Guarding), targets, me)
    # (DELETE_WAVES: this policy's wave Deployments, after the restore that gave their replicas back)
    assert [a.kind for a in mid] == [K.DELETE_LOAD, K.DELETE_ROLES, K.RESTORE, K.DELETE_WAVES, K.RELEASE]
    done = sm.deletion_plan(LookaheadPolicyStatus(phase=Phase.Succeeded), targets, me)
    assert [a.kind for a in done] == [K.DELETE_LOAD, K.DELETE_ROLES, K.DISOWN, K.DELETE_WAVES, K.RELEASE]
    other = sm.deletion_plan(LookaheadPolicyStatus(phase=Phase.Guarding),
                             [Target("serving", "a", owner="x/y", promoted="d1")], me)
    assert [a.kind for a in other] == [K.DELETE_LOAD, K.DELETE_ROLES, K.DELETE_WAVES], \
        "never touches another policy's targets"
    part = sm.deletion_plan(LookaheadPolicyStatus(phase=Phase.Promoting),
                            [Target("serving", "a", owner=me, promoted="d1", replicas=10, lent=1)], me)
    assert [(a.kind, a.targets) for a in part][2:] == [(K.RESTORE, (("serving", "a"),)), (K.DELETE_WAVES, ())]


# --- the guard after a regime-aware promotion watches the regime that changed ---------------------

SWEEP = example_spec(**{"load.batchSizes": [1, 4, 16, 64]})
WAVE = SWEEP.promotion.wave_duration.total_seconds()
ON_1_TO_4 = [{"start": 1, "end": 4, "enabled": True}, {"start": 5, "end": 256, "enabled": False}]


def promoted_after(rows, action, **kw):
    """SWEEP measured as ``rows``, decided ``action``, wave 1 promoted and rolled out."""
    w = world(spec=SWEEP, fingerprint=SWEEP.fingerprint())
    _, w = run(w)
    _, w = run(replace(w, preflight=sm.PreflightResult(PreflightStatus(candidate=True), [1, 4, 16, 64])),
               preflight=None)
    _, w = run(replace(w, roles_ready=READY))
    for r in rows:
        _, w = run(replace(w, step=sm.StepMeasurement(r, True)), step=None)
    assert w.status.phase == Phase.Deciding
    _, w = run(replace(w, decision=decided(action, **kw)), decision=None)
    plan, w = run(w)
    assert w.status.phase == Phase.Promoting and kinds(plan) == [K.PROMOTE]
    did = w.status.decision.id
    return replace(w, targets=[Target("serving", "a", "reference", owner="inference/chat-fleet", promoted=did),
                               Target("serving", "b", "reference", owner="inference/chat-fleet")])


def guard_loads(plan):
    return [(a.batch_size, a.run) for a in plan.actions if a.kind == K.ENSURE_GUARD_LOAD]


REGIME_ROWS = [row(1), row(4), row(16, "Regresses"), row(64, "Regresses")]
OK = sm.GuardCheck(False, "throughput +0.4% [-1.1%, +1.9%]")


def test_guard_after_a_regime_aware_promotion_drives_inside_the_lookahead_range_then_above_it():
    """Lookahead on for 1..4 only: the guard drives batch 4 (inside the range, where the promoted pods
    changed) for half the wave, then batch 16 (the crossover, where they must have switched it off);
    never batch 64 alone, where a regime-aware pod runs exactly as the control (the old behaviour)."""
    w = promoted_after(REGIME_ROWS, "PromoteRegimeAware", crossover_batch_size=16, regime=ON_1_TO_4)
    assert sm.guard_batch_sizes(w.status) == [(4, True), (16, False)]
    plan, w = run(replace(w, guard=OK))
    run0 = w.status.progress.load_run
    assert guard_loads(plan) == [(4, run0)]
    g = w.status.guard
    assert g.batch_size == 4 and [(x.batch_size, x.lookahead, x.state) for x in g.legs] == [
        (4, True, "Guarding"), (16, False, "Pending")]
    assert g.message.startswith("batch size 4 (inside the lookahead range): throughput")
    plan, w = run(at(w, WAVE / 2 - 1))                         # its share of the wave not over yet
    assert guard_loads(plan) == [(4, run0)] and w.status.progress.guard_leg is None
    plan, w = run(at(w, WAVE / 2 + 1))                         # batch 4 passed: on to batch 16, fresh Jobs
    assert K.DELETE_LOAD in kinds(plan) and w.status.progress.guard_leg == 1
    assert w.status.progress.load_run == run0 + 1 and w.status.progress.wave == 0, "same wave, next batch size"
    assert [x.state for x in w.status.guard.legs] == ["Passed", "Guarding"]
    plan, w = run(at(w, WAVE / 2 + 2))
    assert guard_loads(plan) == [(16, run0 + 1)]
    plan, w = run(at(w, WAVE))                                 # batch 16 has had less than its share
    assert w.status.progress.wave == 0 and guard_loads(plan) == [(16, run0 + 1)]
    plan, w = run(at(w, WAVE + 2))                             # both passed: the wave passes
    assert w.status.progress.wave == 1 and w.status.progress.guard_leg is None
    plan, w = run(at(w, WAVE + 3))                             # the next wave starts again inside the range
    assert guard_loads(plan) == [(4, run0 + 2)]


def test_a_regression_above_the_lookahead_range_rolls_back_naming_the_batch_size():
    w = promoted_after(REGIME_ROWS, "PromoteRegimeAware", crossover_batch_size=16, regime=ON_1_TO_4)
    _, w = run(replace(w, guard=OK))
    _, w = run(at(w, WAVE / 2 + 1))
    assert w.status.progress.guard_leg == 1
    worse = sm.GuardCheck(True, "promoted pod serving/a-1 throughput -9.0% [-11.0%, -7.0%] vs the control")
    plan = sm.reconcile(replace(at(w, WAVE / 2 + 60), guard=worse))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "GuardRegression"
    assert "wave 1, batch size 16 (above the lookahead range): promoted pod" in plan.status.rollback.message
    assert kinds(plan)[0] == K.RESTORE


def test_a_regression_inside_the_lookahead_range_rolls_back_naming_the_batch_size():
    w = promoted_after(REGIME_ROWS, "PromoteRegimeAware", crossover_batch_size=16, regime=ON_1_TO_4)
    worse = sm.GuardCheck(True, "promoted pod serving/a-1 throughput -9.0% [-11.0%, -7.0%] vs the control")
    plan = sm.reconcile(replace(w, guard=worse))
    assert plan.status.phase == Phase.RolledBack
    assert "wave 1, batch size 4 (inside the lookahead range)" in plan.status.rollback.message


def test_the_final_guard_also_drives_both_regimes():
    w = promoted_after(REGIME_ROWS, "PromoteRegimeAware", crossover_batch_size=16, regime=ON_1_TO_4)
    # straight to the final guard: one wave of 100%
    w.status.progress.wave = len(SWEEP.promotion.waves) - 1
    promoted = [replace(t, promoted=w.status.decision.id) for t in w.targets]
    t = 0
    while w.status.phase == Phase.Promoting and t < 10 * WAVE:
        t += WAVE / 2 + 1
        _, w = run(replace(at(w, t), targets=promoted, guard=OK))
    assert w.status.phase == Phase.Guarding and w.status.progress.guard_leg is None
    since = w.status.progress.guard_started_at
    half = SWEEP.promotion.guard.duration.total_seconds() / 2
    plan, w = run(replace(w, now=since))
    assert guard_loads(plan) == [(4, w.status.progress.load_run)] and w.status.guard.wave is None
    plan, w = run(replace(w, now=since + timedelta(seconds=half + 1)))
    assert w.status.progress.guard_leg == 1 and w.status.phase == Phase.Guarding
    plan, w = run(replace(w, now=since + timedelta(seconds=half + 2)))
    assert guard_loads(plan) == [(16, w.status.progress.load_run)]
    worse = sm.GuardCheck(True, "throughput -9%")
    plan = sm.reconcile(replace(w, now=since + timedelta(seconds=half + 30), guard=worse))
    assert plan.status.phase == Phase.RolledBack
    assert plan.status.rollback.message.startswith("batch size 16 (above the lookahead range): throughput -9%")


def test_guard_after_a_full_promotion_drives_the_largest_batch_size_only():
    """Unchanged: lookahead on everywhere, one comparison at the largest measured batch size for the
    whole wave."""
    w = promoted_after([row(b) for b in (1, 4, 16, 64)], "Promote")
    assert sm.guard_batch_sizes(w.status) == [(64, True)]
    plan, w = run(replace(w, guard=OK))
    run0 = w.status.progress.load_run
    assert guard_loads(plan) == [(64, run0)]
    plan, w = run(at(w, WAVE / 2 + 1))
    assert guard_loads(plan) == [(64, run0)] and K.DELETE_LOAD not in kinds(plan)
    assert w.status.progress.guard_leg is None and w.status.progress.wave == 0
    plan, w = run(at(w, WAVE + 1))
    assert w.status.progress.wave == 1
    assert [(x.batch_size, x.state) for x in w.status.guard.legs] == [(64, "Guarding")]


@pytest.mark.parametrize("rows, regime, expect", [
    # the run of wins ends at a measured loss: inside = the largest win, above = the crossover
    (REGIME_ROWS, ON_1_TO_4, [(4, True), (16, False)]),
    # the size right above the range was never measured (no samples): the next measured one
    ([row(1), row(4), row(16, "Pending", n=0), row(64, "Regresses")], ON_1_TO_4, [(4, True), (64, False)]),
    # a win at every measured size, the engine runs larger batches: nothing measured above the range
    ([row(1), row(4), row(16), row(64)], [{"start": 1, "end": 64, "enabled": True},
                                          {"start": 65, "end": 256, "enabled": False}], [(64, True)]),
    # a Pending size above the range after the deadline still has data: it is the one above
    ([row(1), row(4), row(16, "Pending"), row(64, "Pending")], ON_1_TO_4, [(4, True), (16, False)]),
])
def test_guard_batch_sizes_after_a_regime_aware_promotion(rows, regime, expect):
    st = LookaheadPolicyStatus(batches=rows, decision=decided("PromoteRegimeAware", regime=regime),
                               progress={"batchSizes": [1, 4, 16, 64]})
    assert sm.guard_batch_sizes(st) == expect
    assert sm.guard_batch_sizes(st.model_copy(update={"decision": decided("Promote")})) == [(64, True)]


def test_pause_during_the_second_guard_batch_size_shifts_its_clock():
    w = promoted_after(REGIME_ROWS, "PromoteRegimeAware", crossover_batch_size=16, regime=ON_1_TO_4)
    _, w = run(replace(w, guard=OK))
    _, w = run(at(w, WAVE / 2 + 1))
    leg_start = w.status.progress.guard_leg_started_at
    _, w = run(replace(at(w, WAVE / 2 + 10), spec=SWEEP.model_copy(update={"paused": True})))
    plan, w = run(replace(at(w, WAVE / 2 + 1010), spec=SWEEP))
    assert w.status.progress.guard_leg_started_at == leg_start + timedelta(seconds=1000)
    assert w.status.progress.guard_leg == 1 and guard_loads(plan) == [(16, w.status.progress.load_run)]


# --- the guard on production traffic (issue 22, part 3) -------------------------------------------

PRODUCTION = sm.GuardCheck(False, "guard: the fleet served 120 requests in the last 120s: the guard compares on "
                                  "its production traffic", enough_data=False, mode="production")


def test_a_fleet_that_serves_users_is_guarded_on_their_traffic_and_never_given_load():
    """The first guard pass finds the fleet serving: the mode is kept for the rollout, the control
    joins the fleet's Service, no guard load is created in any wave or in the final guard, each
    wave compares from when its guard starts, and a production check's numbers reach status.guard."""
    w = promoted_after([row(b) for b in (1, 4, 16, 64)], "Promote")
    plan, w = run(replace(w, guard=PRODUCTION))
    assert w.status.progress.guard_mode == "production"
    assert K.SERVE_CONTROL in kinds(plan) and K.ENSURE_GUARD_LOAD not in kinds(plan)
    assert ("Normal", "GuardMode", PRODUCTION.message.removeprefix("guard: ")) in plan.events
    started = w.status.progress.guard_leg_started_at
    assert started == w.now and w.status.guard.mode == "production"
    ok = sm.GuardCheck(False, "production traffic: 1 promoted pod(s) per-token latency -8.0% [-12.0%, -4.0%] vs ...",
                       mode="production", numbers={"promotedPods": 1, "baselinePods": 2, "windows": 12,
                                                   "droppedWindows": 1, "promotedOffered": 0.4,
                                                   "baselineOffered": 0.5, "change": -0.08})
    plan, w = run(replace(at(w, 30), guard=ok))
    g = w.status.guard
    assert (g.mode, g.promoted_pods, g.baseline_pods, g.windows, g.promoted_offered, g.change) == \
        ("production", 1, 2, 12, 0.4, -0.08)
    assert K.ENSURE_GUARD_LOAD not in kinds(plan) and w.status.phase == Phase.Promoting
    t = 30
    while w.status.phase == Phase.Promoting and t < 20 * WAVE:
        t += WAVE / 2
        targets = [replace(x, promoted=w.status.decision.id) for x in w.targets]
        plan, w = run(replace(at(w, t), targets=targets, guard=ok))
        assert K.ENSURE_GUARD_LOAD not in kinds(plan), "no load of ours on a serving fleet, in any wave"
    assert w.status.phase == Phase.Guarding and w.status.progress.guard_mode == "production"
    plan, w = run(replace(at(w, t + 1), guard=ok))
    assert K.SERVE_CONTROL in kinds(plan) and K.ENSURE_GUARD_LOAD not in kinds(plan)
    plan, w = run(replace(at(w, t + 2 + SWEEP.promotion.guard.duration.total_seconds()), guard=ok))
    assert w.status.phase == Phase.Succeeded and K.DELETE_ROLES in kinds(plan)


def test_a_production_regression_rolls_back_naming_the_wave_and_what_users_felt():
    w = promoted_after([row(b) for b in (1, 4, 16, 64)], "Promote")
    _, w = run(replace(w, guard=PRODUCTION))
    worse = sm.GuardCheck(True, "production traffic: 1 promoted pod(s) per-token latency +25.0% [+21.0%, +29.0%]",
                          mode="production")
    plan = sm.reconcile(replace(at(w, 20), guard=worse))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "GuardRegression"
    assert plan.status.rollback.message.startswith("wave 1: production traffic: 1 promoted pod(s) per-token latency")


def test_the_guard_drives_nothing_until_it_knows_whether_the_fleet_serves_users():
    """No check (Prometheus unread): no load is started on a fleet that may be serving, and the
    analysis deadline still bounds the wait; an idle fleet gets the synthetic guard in that same pass."""
    w = promoted_after([row(b) for b in (1, 4, 16, 64)], "Promote")
    plan, w1 = run(w)
    assert K.ENSURE_GUARD_LOAD not in kinds(plan) and w1.status.progress.guard_mode is None
    plan = sm.reconcile(at(w1, SWEEP.analysis.deadline.total_seconds() + 1))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "GuardNoData"
    idle = sm.GuardCheck(False, "guard: the fleet served 0 requests in the last 120s (idle): ...", enough_data=False)
    plan, w2 = run(replace(w1, guard=idle))
    assert w2.status.progress.guard_mode == "synthetic" and K.ENSURE_GUARD_LOAD in kinds(plan)
    assert K.SERVE_CONTROL not in kinds(plan)
