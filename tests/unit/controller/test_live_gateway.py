"""Live mode, split gatewayAPI, through the state machine: Preflight fixes the exact split from the
user's HTTPRoute (or refuses, naming the field, creating nothing), Launching creates the arms' own
backends and writes the route once both arms are ready, every exit (the safety abort, Deciding
whatever it decides, a deadline, a spec change, deletion) restores the route first, and a restart
resumes from what is in the cluster (the annotation on the route)."""

from dataclasses import replace
from datetime import timedelta

import pytest

from lookahead_operator.api.names import ANNOTATION_ORIGINAL_BACKEND_REFS
from lookahead_operator.api.status import ConditionType, DecisionAction, Phase
from lookahead_operator.controller import livesplit
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import ActionKind as K
from lookahead_operator.controller.world import Target
from lookahead_operator.measurement.results import LiveMeasurement
from lookahead_operator.measurement.stats.live import ArmWindow

from .test_live_mode import healthy, results, run
from .test_statemachine import CANDIDATE, T0, cond, example_spec, kinds, world

GW = {"httpRouteRef": {"name": "chat", "namespace": "serving"}, "backendRef": {"name": "chat", "port": 8000}}
SPEC = example_spec(**{"load.mode": "live", "load.livePercent": "2.5%", "load.split": "gatewayAPI",
                       "load.gatewayAPI": GW})
FLEET = [Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10)]
READY = {"canary": True, "control": True}
BACKEND = {"kind": "Service", "metadata": {"name": "chat", "namespace": "serving"},
           "spec": {"selector": {"app": "chat"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}}
ROUTE = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
         "metadata": {"name": "chat", "namespace": "serving", "resourceVersion": "7"},
         "spec": {"parentRefs": [{"name": "gw"}],
                  "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                             "backendRefs": [{"group": "", "kind": "Service", "name": "chat", "port": 8000,
                                              "weight": 1}]}]}}
POLICY = {"metadata": {"name": "chat-fleet", "namespace": "inference"}}


def gw_world(**kw):
    base = dict(spec=SPEC, fingerprint=SPEC.fingerprint(), targets=FLEET, live_route=ROUTE, live_backend=BACKEND)
    base.update(kw)
    return world(**base)


def split(route=ROUTE):
    """The route as SPLIT_ROUTE writes it."""
    return livesplit.gateway_split(route, POLICY, SPEC.load.gateway_api, "serving", 0.025, BACKEND).route


def to_launching(w):
    _, w = run(w)                                                     # Pending -> Preflight
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)    # Preflight -> Launching
    assert w.status.phase == Phase.Launching, w.status.message
    return plan, w


def to_measuring(w):
    _, w = to_launching(w)
    plan, w = run(replace(w, roles_ready=READY, roles_present=READY))  # ready: the route is written
    assert w.status.phase == Phase.Launching and K.SPLIT_ROUTE in kinds(plan)
    _, w = run(replace(w, live_route=split()))                         # read back split: Measuring
    assert w.status.phase == Phase.Measuring
    return w                                   # (read again on every pass of Measuring: still split so)


def at(w, seconds):
    return replace(w, now=T0 + timedelta(seconds=seconds))


def restores_first(plan):
    """The route is restored before anything else of the rollout goes, and the arms' backends after
    the arms."""
    ks = kinds(plan)
    assert ks[0] == K.RESTORE_ROUTE and ks.count(K.RESTORE_ROUTE) == 1, ks
    assert next(a for a in plan.actions if a.kind == K.RESTORE_ROUTE).route == ("serving", "chat")
    assert ks.index(K.DELETE_ROLES) < ks.index(K.DELETE_ARM_BACKENDS), ks


def test_preflight_fixes_the_exact_share_from_the_routes_weights_and_the_route():
    plan, w = to_launching(gw_world())
    live = w.status.live
    # 2.5% each of a weight-1 backendRef: fleet 38, canary 1, control 1 (1/40 exactly)
    assert live.split == "gatewayAPI" and live.share == pytest.approx(0.025) and live.route == "serving/chat"
    assert "HTTPRoute serving/chat rule 0" in live.message and "weight 38" in live.message
    # one replica per arm: 2.5% is below what a Service split of 10 replicas offers (1/12)
    assert live.arm_replicas == 1
    ks = kinds(plan)
    assert ks.index(K.ENSURE_ARM_BACKENDS) < ks.index(K.ENSURE_ROLES)
    assert K.SPLIT_ROUTE not in ks  # never before both arms serve
    assert cond(w.status, ConditionType.Accepted).status == "True"


def test_arm_replicas_follow_what_a_service_split_would_give_on_a_big_fleet():
    big = [replace(FLEET[0], replicas=40)]
    spec = example_spec(**{"load.mode": "live", "load.livePercent": "10%", "load.split": "gatewayAPI",
                           "load.gatewayAPI": GW})
    _, w = to_launching(gw_world(targets=big, spec=spec, fingerprint=spec.fingerprint()))
    assert w.status.live.arm_replicas == 5 and w.status.live.share == pytest.approx(0.1)


@pytest.mark.parametrize("edit,field", [
    (dict(live_route=None, live_backend=None,
          live_gateway_refusal=("spec.load.gatewayAPI.httpRouteRef", "HTTPRoute serving/chat not found")),
     "spec.load.gatewayAPI.httpRouteRef"),
    (dict(live_backend=None, live_gateway_refusal=("spec.load.gatewayAPI.backendRef", "Service serving/chat not found")),
     "spec.load.gatewayAPI.backendRef"),
    (dict(live_route={**ROUTE, "spec": {"rules": [{"backendRefs": [{"name": "other", "port": 8000}]}]}}),
     "spec.load.gatewayAPI.backendRef"),
    (dict(live_backend={**BACKEND, "spec": {"selector": {"lookahead.dev/role": "canary"}, "ports": [{"port": 1}]}}),
     "Service serving/chat"),
])
def test_a_route_that_cannot_be_split_fails_naming_the_field_and_creates_nothing(edit, field):
    w = gw_world(**edit)
    _, w = run(w)
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    assert w.status.phase == Phase.Failed
    c = cond(w.status, ConditionType.Accepted)
    assert c.status == "False" and c.reason == "LiveSplitRefused" and field in c.message
    assert kinds(plan) == [K.RELEASE]  # nothing created, the route untouched


def test_launching_writes_the_route_only_once_both_arms_are_ready_then_measures():
    _, w = to_launching(gw_world())
    plan, w = run(replace(w, roles_ready={"canary": True, "control": False}))
    assert w.status.phase == Phase.Launching and K.SPLIT_ROUTE not in kinds(plan)
    plan, w = run(replace(w, roles_ready=READY, roles_present=READY))
    split_action = next(a for a in plan.actions if a.kind == K.SPLIT_ROUTE)
    assert split_action.route == ("serving", "chat") and plan.requeue_after == 1.0
    assert w.status.progress.measuring_since is None  # nothing is measured before the route is split
    plan, w = run(replace(at(w, 3), live_route=split()))
    assert w.status.phase == Phase.Measuring and K.SPLIT_ROUTE not in kinds(plan)
    assert w.status.progress.measuring_since == T0 + timedelta(seconds=3)


def test_a_route_that_cannot_be_written_by_the_launch_deadline_fails_with_the_route_restored():
    _, w = to_launching(gw_world())
    unreadable = ("spec.load.gatewayAPI.httpRouteRef", "HTTPRoute serving/chat could not be read: 503")
    plan, w = run(replace(w, roles_ready=READY, roles_present=READY, live_route=None, live_gateway_refusal=unreadable))
    assert w.status.phase == Phase.Launching and K.SPLIT_ROUTE in kinds(plan)
    plan, w = run(at(w, 3600))
    assert w.status.phase == Phase.Failed and w.status.conditions
    assert "RouteNotSplit" in [r for _, r, _ in plan.events] and "could not be read: 503" in w.status.message
    restores_first(plan)


def test_a_route_whose_rule_went_away_before_the_split_fails_with_the_arms_deleted():
    _, w = to_launching(gw_world())
    gone = {**ROUTE, "spec": {"rules": [{"backendRefs": [{"name": "other", "port": 8000}]}]}}
    plan, w = run(replace(w, roles_ready=READY, roles_present=READY, live_route=gone))
    assert w.status.phase == Phase.Failed and cond(w.status, ConditionType.Accepted).reason == "LiveSplitRefused"
    restores_first(plan)


def test_the_safety_abort_restores_the_route_before_anything_else():
    w = to_measuring(gw_world())
    failing = ArmWindow(per_token_latency=0.02, token_rate=50.0, ttft=0.1, requests=6, errors=4)
    m = LiveMeasurement(windows=2, results=results(1.0, n=2), canary_recent=failing, control_recent=healthy())
    plan, w = run(replace(at(w, 40), live=m), live=None)
    assert w.status.phase == Phase.RolledBack and w.status.rollback.reason == "CanaryErrorRate"
    restores_first(plan)


def test_a_blind_abort_restores_the_route_before_anything_else():
    from .test_live_mode import UNREACHABLE
    w = to_measuring(gw_world())
    plan, w = run(replace(at(w, 121), live=None, read_errors=UNREACHABLE))
    assert w.status.phase == Phase.RolledBack and w.status.rollback.reason == "AbortBlind"
    restores_first(plan)


@pytest.mark.parametrize("measured,action", [
    (dict(windows=30, results=results(0.6)), DecisionAction.PromoteRegimeAware),
    (dict(windows=30, results=results(1.6)), DecisionAction.Rollback),
    (dict(windows=4, results=results(0.5, n=4)), DecisionAction.Inconclusive),
])
def test_deciding_gives_the_route_back_unless_it_promotes_then_the_guard_does(measured, action):
    from lookahead_operator.measurement import live as live_measure

    w = to_measuring(gw_world())
    m = LiveMeasurement(canary_recent=healthy(), control_recent=healthy(), **measured)
    _, w = run(replace(at(w, SPEC.analysis.deadline.total_seconds() + 1), live=m), live=None)
    assert w.status.phase == Phase.Deciding
    decision = live_measure.decision(SPEC, w.status, max_batch_size=32)
    assert decision.action == action
    plan, w = run(replace(w, decision=decision))
    if action == DecisionAction.PromoteRegimeAware:
        # the route stays split through the waves and the guard: on a fleet that serves users the
        # guard compares the promoted pods with the control serving its share beside them
        assert w.status.phase == Phase.Promoting and K.DELETE_ROLES not in kinds(plan)
        assert K.RESTORE_ROUTE not in kinds(plan)
    else:
        assert w.status.phase == (Phase.RolledBack if action == DecisionAction.Rollback else Phase.Failed)
        restores_first(plan)


def test_a_spec_change_restores_the_route_of_the_old_spec():
    w = to_measuring(gw_world())
    other = example_spec(**{"load.mode": "live", "load.livePercent": "10%"})  # now split: service
    plan, w = run(replace(w, spec=other, fingerprint=other.fingerprint(), generation=2))
    assert w.status.phase == Phase.Pending
    restores_first(plan)


def test_an_abort_request_restores_the_route():
    w = to_measuring(gw_world())
    plan, w = run(replace(w, abort_requested=True))
    assert w.status.phase == Phase.RolledBack
    restores_first(plan)


def test_deleting_the_policy_restores_the_route_first_and_deletes_the_arms_backends():
    w = to_measuring(gw_world())
    plan = sm.deletion_plan(w.status, w.targets, w.key)
    assert plan[0].kind == K.RESTORE_ROUTE and plan[0].route == ("serving", "chat")
    ks = [a.kind for a in plan]
    assert ks.index(K.DELETE_ROLES) < ks.index(K.DELETE_ARM_BACKENDS)


def test_a_restarted_operator_resumes_from_the_route_in_the_cluster():
    """An operator restarted after the route was written (Launching, status not yet Measuring):
    the split read back is in place, so it is not written again; and one that finds the split
    annotation mid-Measuring restores from it on the way out."""
    _, w = to_launching(gw_world())
    plan, w2 = run(replace(w, roles_ready=READY, roles_present=READY, live_route=split()))
    assert w2.status.phase == Phase.Measuring and K.SPLIT_ROUTE not in kinds(plan)
    # the split saved the route's backendRefs verbatim: restoring gives the route back exactly
    assert livesplit.restore_route(split()) == ROUTE
    assert ANNOTATION_ORIGINAL_BACKEND_REFS in split()["metadata"]["annotations"]


def test_a_lost_arm_is_recreated_with_its_backend_in_measuring():
    w = to_measuring(gw_world())
    m = LiveMeasurement(windows=1, results=results(1.0, n=1), canary_recent=healthy(), control_recent=healthy())
    plan, _ = run(replace(at(w, 20), live=m, roles_present={"canary": False, "control": True},
                          live_route=split(), live_backend=BACKEND), live=None)
    ks = kinds(plan)
    assert ks.index(K.ENSURE_ARM_BACKENDS) < ks.index(K.ENSURE_ROLES)
    plan, _ = run(replace(at(w, 20), live=m), live=None)
    assert K.ENSURE_ARM_BACKENDS not in kinds(plan)  # not asked on every pass


def test_arms_not_ready_by_the_launch_deadline_fail_with_their_backends_deleted_and_the_route_restored():
    _, w = to_launching(gw_world())
    plan, w = run(at(w, 3600))
    assert w.status.phase == Phase.Failed and "CanaryNotReady" in [r for _, r, _ in plan.events]
    restores_first(plan)
    assert K.ENSURE_ARM_BACKENDS not in kinds(plan) and K.ENSURE_ROLES not in kinds(plan)


@pytest.mark.parametrize("edit", ["reverted", "reweighted", "deleted"])
def test_a_route_changed_by_someone_else_while_measuring_ends_failed_never_rewritten(edit):
    # a GitOps tool putting back the route in git (no annotation, no arms), a user's new weights on
    # the split rule, or the route deleted: the arms' windows no longer mean their share
    w = to_measuring(gw_world())
    m = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(), control_recent=healthy())
    plan, same = run(replace(at(w, 30), live=m))
    assert same.status.phase == Phase.Measuring and K.SPLIT_ROUTE not in kinds(plan)
    changed = split()
    if edit == "reverted":
        changed = ROUTE
    elif edit == "reweighted":
        changed["spec"]["rules"][0]["backendRefs"][0]["weight"] = 1
    gone = edit == "deleted"
    plan, w = run(replace(at(w, 40), live=m, live_route=None if gone else changed, live_route_gone=gone))
    assert w.status.phase == Phase.Failed and ("Warning", "RouteChanged") in [e[:2] for e in plan.events], plan.events
    assert "changed while measuring" in w.status.message and "2.5% each" in w.status.message
    assert K.SPLIT_ROUTE not in kinds(plan)
    restores_first(plan)


def test_a_route_that_could_not_be_read_while_measuring_is_read_again():
    w = to_measuring(gw_world())
    m = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(), control_recent=healthy())
    _, w = run(replace(at(w, 30), live=m, live_route=None, live_backend=None,
                       live_gateway_refusal=("spec.load.gatewayAPI.httpRouteRef", "HTTPRoute serving/chat could not "
                                             "be read: 503")))
    assert w.status.phase == Phase.Measuring
