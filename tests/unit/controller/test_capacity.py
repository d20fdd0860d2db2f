"""Capacity on a full GPU pool (issue 23, item 2): ``canary.capacity`` surge (canary and control
beside the fleet: a pod the scheduler cannot place says CapacityUnavailable within a pass) and
carveOut (their replicas taken out of the fleet, saved on it, given back on every exit). The state
machine on its clock, and the builders' patches; the real node runs it in tests/e2e/test_production_fleets.py."""

from dataclasses import replace

import pytest

from lookahead_operator.controller import builders as b
from lookahead_operator.controller import fleet
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import Target
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase

from .test_statemachine import (CANDIDATE, READY, T0, K, at, cond, decided, example_spec, kinds, promoting, run,
                               to_deciding, world)

ME = "inference/chat-fleet"
NO_GPU = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available"
CARVE = example_spec(**{"load.batchSizes": [1, 8], "canary.capacity": "carveOut"})


def launching(w):
    _, w = run(w)                                                   # Pending -> Preflight
    _, w = run(replace(w, preflight=CANDIDATE), preflight=None)     # Preflight -> Launching
    assert w.status.phase == Phase.Launching, w.status.message
    return w


def deployment(replicas=4, carved=None, lent=None, strategy=None, before=None) -> dict:
    ann = {}
    if carved is not None:
        ann[b.ANNOTATION_CARVED_OUT] = f"{carved}/{before}" if before else str(carved)
    if lent is not None:
        ann[b.ANNOTATION_PROMOTED_PODS] = str(lent)
    spec = {"replicas": replicas, "template": {"spec": {"containers": [{"name": "engine", "image": "vllm/vllm"}]}}}
    if strategy is not None:
        spec["strategy"] = strategy
    return {"metadata": {"namespace": "serving", "name": "a", "resourceVersion": "7", "annotations": ann},
            "spec": spec}


# --- surge: a pod the scheduler cannot place ---------------------------------------------------

def test_surge_on_a_full_pool_says_capacity_unavailable_at_once_with_the_schedulers_reason():
    w = launching(world())
    plan, w = run(at(replace(w, roles_unschedulable={"canary": NO_GPU, "control": NO_GPU}), 5))
    c = cond(w.status, ConditionType.CapacityAvailable)
    assert c.status == "False" and c.reason == "CapacityUnavailable"
    assert "Insufficient nvidia.com/gpu" in c.message and "canary.capacity: carveOut" in c.message
    warned = [e for e in plan.events if e[1] == "CapacityUnavailable"]
    assert len(warned) == 1 and warned[0][0] == "Warning"
    # said once, not every pass; still waiting (an autoscaler may make room)
    plan, w = run(at(w, 10))
    assert not [e for e in plan.events if e[1] == "CapacityUnavailable"] and w.status.phase == Phase.Launching
    # at the deadline: Failed naming the capacity, roles deleted, the fleet untouched
    plan = sm.reconcile(at(w, 3600))
    assert plan.status.phase == Phase.Failed and plan.status.conditions
    assert "could not be scheduled" in plan.status.message and "Insufficient nvidia.com/gpu" in plan.status.message
    assert K.DELETE_ROLES in kinds(plan) and K.PROMOTE not in kinds(plan) and K.RESTORE not in kinds(plan)


def test_capacity_available_once_the_scheduler_places_them():
    w = launching(world())
    _, w = run(at(replace(w, roles_unschedulable={"canary": NO_GPU}), 5))
    _, w = run(at(replace(w, roles_unschedulable={}), 10))    # (not placed yet either: no word)
    assert cond(w.status, ConditionType.CapacityAvailable).status == "False"
    _, w = run(at(replace(w, roles_scheduled={"canary", "control"}), 12))
    assert cond(w.status, ConditionType.CapacityAvailable).status == "True"
    _, w = run(at(replace(w, roles_ready=READY), 15))
    assert w.status.phase == Phase.Measuring and cond(w.status, ConditionType.CapacityAvailable) is None


def test_unschedulable_reads_the_pod_scheduled_condition_and_skips_pods_being_deleted():
    pending = {"metadata": {}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_GPU}]}}
    gone = {"metadata": {"deletionTimestamp": "2026-12-03T00:00:00Z"}, "status": pending["status"]}
    placed = {"metadata": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert fleet.unschedulable([placed, pending]) == NO_GPU
    assert fleet.unschedulable([gone, placed]) is None and fleet.unschedulable([]) is None


# --- carveOut: the fleet lends canary and control their replicas --------------------------------

def carve_world(replicas=4, **target_kw):
    targets = [Target("serving", "a", "reference", owner=ME, replicas=replicas, max_unavailable="1", max_surge="0",
                      **target_kw),
               Target("serving", "b", "reference", owner=ME, replicas=1, max_unavailable="1", max_surge="0")]
    return world(spec=CARVE, fingerprint=CARVE.fingerprint(), targets=targets)


def test_carve_out_from_a_fleet_too_small_is_refused_before_anything_is_created():
    plan, w = run(carve_world(replicas=2))
    _, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    assert w.status.phase == Phase.Failed and w.status.message.startswith("canary.capacity carveOut takes 2")
    assert "serving/a, which has 2" in w.status.message and cond(w.status, ConditionType.Accepted).reason == \
        "CapacityUnavailable"


def test_carve_out_refuses_a_target_whose_rollout_needs_a_spare_pod():
    w = carve_world()
    w = replace(w, targets=[w.targets[0], replace(w.targets[1], max_surge="25%", max_unavailable="25%")])
    _, w = run(w)
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    assert w.status.phase == Phase.Failed and "serving/b's rollout strategy" in w.status.message
    assert "maxUnavailable to 1" in w.status.message and K.ENSURE_ROLES not in kinds(plan)


@pytest.mark.parametrize("ending", ["rollback", "deadline", "abort", "success", "inconclusive"])
def test_every_exit_gives_the_carved_replicas_back_with_the_roles(ending):
    # target a, carved: two of its three replicas serve canary and control
    w = carve_world(replicas=1, carved=2)
    if ending == "inconclusive":
        w = to_deciding(w)
        plan = sm.reconcile(replace(w, decision=decided("Inconclusive")))
        assert plan.status.phase == Phase.Failed and K.PROMOTE not in kinds(plan)
    elif ending in ("deadline", "abort"):
        w = launching(w)
        plan = sm.reconcile(at(w, 3600) if ending == "deadline" else replace(w, abort_requested=True))
        assert plan.status.phase == (Phase.Failed if ending == "deadline" else Phase.RolledBack)
    else:
        w = promoting(w)
        did = w.status.decision.id
        promoted = [replace(t, promoted=did) for t in w.targets]
        if ending == "rollback":
            _, w = run(w)
            plan = sm.reconcile(replace(w, targets=promoted, guard=sm.GuardCheck(True, "throughput -20%")))
            assert plan.status.phase == Phase.RolledBack
        else:
            for i in range(1, 200):
                plan, w = run(replace(at(w, 60 * i), targets=promoted, guard=sm.GuardCheck(False, "ok")))
                if w.status.phase == Phase.Succeeded:
                    break
            assert w.status.phase == Phase.Succeeded
    deletes = [a for a in plan.actions if a.kind == K.DELETE_ROLES]
    assert deletes and deletes[0].targets == (("serving", "a"),), plan.actions


def test_deleting_the_policy_gives_the_carved_replicas_back():
    targets = [Target("serving", "a", "reference", owner=ME, carved=2), Target("serving", "b", "reference", owner=ME)]
    for phase in (Phase.Measuring, Phase.Guarding):
        plan = sm.deletion_plan(LookaheadPolicyStatus(phase=phase), targets, ME)
        assert [a for a in plan if a.kind == K.DELETE_ROLES][0].targets == (("serving", "a"),)


def test_carve_patch_saves_the_count_and_takes_them_in_one_optimistic_write():
    patch = b.carve_patch(deployment(4), 2)
    assert patch == {"metadata": {"resourceVersion": "7", "annotations": {b.ANNOTATION_CARVED_OUT: "2/4"}},
                     "spec": {"replicas": 2}}
    with pytest.raises(ValueError, match="no pod serving"):
        b.carve_patch(deployment(2), 2)
    with pytest.raises(ValueError, match="already carved"):
        b.carve_patch(deployment(2, carved=2), 1)


def test_every_give_back_returns_exactly_what_was_taken():
    d = deployment(2, carved=2)
    assert b.return_carved_patch(d) == {"metadata": {"resourceVersion": "7", "annotations": {
        b.ANNOTATION_CARVED_OUT: None}}, "spec": {"replicas": 4}}
    assert b.return_carved_patch(deployment(4)) == {}
    # released or left to its user: lent and carved back, every mark gone, in one write
    both = b.let_go_patch(deployment(1, carved=2, lent=1))
    assert both["spec"] == {"replicas": 4} and both["metadata"]["resourceVersion"] == "7"
    assert set(both["metadata"]["annotations"]) == set(b.TARGET_ANNOTATIONS)
    assert all(v is None for v in both["metadata"]["annotations"].values())
    # promoted whole: the lent replicas come back, the carved ones stay out while the roles run
    d = deployment(1, carved=2, lent=1)
    d["metadata"]["annotations"][b.ANNOTATION_ORIGINAL_TEMPLATE] = b.canonical(d["spec"]["template"])
    whole = b.promote_body(d, lambda c: {**c, "args": ["--on"]}, lambda c: True, "d1")
    assert whole["spec"]["replicas"] == 2 and whole["metadata"]["annotations"][b.ANNOTATION_CARVED_OUT] == "2"
    assert b.carved_replicas(deployment(2, carved=2, before=4)) == 2
    # restored: all of them back, the saved template exactly
    restored = b.restore_body(d)
    assert restored["spec"]["replicas"] == 4 and b.ANNOTATION_CARVED_OUT not in restored["metadata"]["annotations"]


@pytest.mark.parametrize("strategy, replicas, room", [
    (None, 4, 1),                                                    # 25% / 25% of 4
    (None, 2, 0),                                                    # 25% of 2 rounds down: surge only
    (None, 1, 0),
    ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, 2, 1),
    ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "0%", "maxUnavailable": "10%"}}, 2, 1),  # both 0: 1
    ({"type": "Recreate"}, 3, 3),
])
def test_rollout_unavailable_resolves_the_strategy_as_the_deployment_controller_does(strategy, replicas, room):
    t = fleet.target_of(deployment(replicas, strategy=strategy), "reference")
    assert fleet.rollout_unavailable(t, replicas) == room


# --- preflight: the pool's size against what the mode needs ------------------------------------

def node(name, gpus, labels=None, unschedulable=False):
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": str(gpus)}}}


def placed(node_name, gpus):
    return {"spec": {"nodeName": node_name, "containers": [
        {"name": "engine", "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}},
        {"name": "proxy", "resources": {"requests": {"cpu": "100m"}}}]}}


TP2 = {"spec": {"nodeSelector": {"pool": "h100"}, "containers": [
    {"name": "proxy", "resources": {"requests": {"cpu": "10m"}}},
    {"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "64Gi"},
                                     "requests": {"cpu": "4", "example.kubernetes.io/x": "1"}}}]}}


def test_the_pool_is_what_matching_schedulable_nodes_have_left_of_each_accelerator():
    assert fleet.accelerators(TP2) == {"nvidia.com/gpu": 2}   # (limits count; kubernetes.io names are not extended)
    nodes = [node("a", 8, {"pool": "h100"}), node("b", 8, {"pool": "h100"}), node("c", 8, {"pool": "a10"}),
             node("d", 8, {"pool": "h100"}, unschedulable=True)]
    pods = [placed("a", 2), placed("a", 2), placed("a", 2), placed("a", 2), placed("b", 4), placed("c", 8)]
    assert fleet.pool_room(nodes, pods, TP2) == {"nvidia.com/gpu": (4, 16)}
    assert fleet.pool_room(nodes, pods, {"spec": {"containers": [{"name": "cpu-only"}]}}) == {}


def preflight_world(capacity="surge", pool=None, error=None):
    spec = example_spec(**{"load.batchSizes": [1, 8], "canary.capacity": capacity})
    w = world(spec=spec, fingerprint=spec.fingerprint(), accelerators={"nvidia.com/gpu": 2}, pool=pool,
              pool_error=error,
              targets=[Target("serving", "a", "reference", owner=ME, replicas=4, max_unavailable="1", max_surge="0")])
    _, w = run(w)
    return sm.reconcile(replace(w, preflight=CANDIDATE))


def test_preflight_says_a_full_pool_before_creating_anything_and_launches_all_the_same():
    plan = preflight_world(pool={"nvidia.com/gpu": (0, 8)})
    c = cond(plan.status, ConditionType.CapacityAvailable)
    assert c.status == "False" and c.reason == "CapacityUnavailable"
    assert c.message.startswith("the pool has 0 of 8 nvidia.com/gpu free, surge needs 4 (2 pods x 2)")
    assert [e for e in plan.events if e[1] == "CapacityUnavailable"] and plan.status.phase == Phase.Launching
    plan = preflight_world(pool={"nvidia.com/gpu": (4, 8)})
    assert cond(plan.status, ConditionType.CapacityAvailable).reason == "PoolHasRoom"
    plan = preflight_world(error="ApiException: (403) nodes is forbidden")
    assert cond(plan.status, ConditionType.CapacityAvailable).reason == "PoolUnknown"
    plan = preflight_world("carveOut", pool={"nvidia.com/gpu": (0, 8)})
    assert cond(plan.status, ConditionType.CapacityAvailable).reason == "CarveOut"


def test_a_count_someone_else_set_after_the_carve_stands():
    """A GitOps self-heal (Argo CD, Flux) puts the fleet's replicas back to Git's four while the
    carve-out runs: giving ours back on top would leave six. The mark says what the carve left."""
    assert b.return_carved_patch(deployment(2, carved=2, before=4))["spec"] == {"replicas": 4}
    healed = deployment(4, carved=2, before=4)
    assert b.return_carved_patch(healed)["spec"] == {"replicas": 4}
    assert b.return_carved_patch(healed)["metadata"]["annotations"] == {b.ANNOTATION_CARVED_OUT: None}
    assert b.give_back_patch(deployment(6, carved=2, before=4))["spec"] == {"replicas": 6}   # a kubectl scale
    # lent to a wave Deployment meanwhile: the fleet's count is its own plus the lent ones
    assert b.give_back_patch(deployment(1, carved=2, before=4, lent=1))["spec"] == {"replicas": 4}


def test_a_restarted_operator_gives_back_what_the_deployment_says_was_carved():
    """The operator keeps nothing in memory: a new process reads the carve from the Deployment's
    annotation (``fleet.target_of``) and its phase from the status, and gives the replicas back."""
    w = launching(carve_world(replicas=1, carved=2))
    d = deployment(replicas=2, carved=2, before=4)
    d["metadata"]["annotations"][b.ANNOTATION_OWNER] = ME
    restarted = fleet.target_of(d, "reference")
    assert restarted.carved == 2
    fresh = world(spec=CARVE, fingerprint=CARVE.fingerprint(), status=w.status,   # only what is in the cluster
                  targets=[restarted, w.targets[1]], roles_present={"canary": True, "control": True},
                  abort_requested=True)
    plan = sm.reconcile(fresh)
    assert plan.status.phase == Phase.RolledBack
    deletes = [a for a in plan.actions if a.kind == K.DELETE_ROLES]
    assert deletes and deletes[0].targets == (("serving", "a"),), plan.actions
    assert b.return_carved_patch(d)["spec"] == {"replicas": 4}     # exactly the count it had
