"""Targets someone else owns (issue 23, item 7): a Deployment with an owner reference (a KServe
InferenceService, an Argo Rollout through ``workloadRef``, a LeaderWorkerSet) would have every write
of the operator reverted by its owner. It is refused in Pending, naming the owner, and never claimed
or promoted on any path."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase
from lookahead_operator.controller import actions, fleet
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import Action, ActionKind, Observed, Target

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
SPEC = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "llama"}}},
                                           "load": {"batchSizes": [1]}})
ISVC = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "name": "llama", "uid": "i-1",
        "controller": True, "blockOwnerDeletion": True}


def deployment(*owners: dict) -> dict:
    d = {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "llama-predictor", "namespace": "serving", "resourceVersion": "7",
                      "annotations": {}},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llama"}},
                  "template": {"metadata": {"labels": {"app": "llama"}},
                               "spec": {"containers": [{"name": "kserve-container", "image": "vllm/vllm-openai:v0.11.0",
                                                        "args": ["--model", "m"]}]}}},
         "status": {}}
    if owners:
        d["metadata"]["ownerReferences"] = list(owners)
    return d


def test_target_of_names_the_controller_owner_else_the_first_owner_else_none():
    assert fleet.target_of(deployment(), "auto").owned_by is None
    mesh = {"apiVersion": "v1", "kind": "ConfigMap", "name": "pin", "uid": "c-1"}
    assert fleet.target_of(deployment(mesh, ISVC), "auto").owned_by == \
        "InferenceService/llama (serving.kserve.io/v1beta1)"
    rollout = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "llama", "uid": "r-1"}
    assert fleet.target_of(deployment(rollout, mesh), "auto").owned_by == "Rollout/llama (argoproj.io/v1alpha1)"


def world(*targets: Target) -> Observed:
    return Observed(now=T0, name="llama", namespace="serving", generation=1, spec=SPEC,
                    fingerprint=SPEC.fingerprint(), status=LookaheadPolicyStatus(), targets=list(targets))


def test_an_owned_target_stays_pending_naming_its_owner_and_nothing_is_claimed():
    owned = fleet.target_of(deployment(ISVC), "auto")
    plan = sm.reconcile(world(owned, Target("serving", "free", "vllm")))
    assert plan.status.phase == Phase.Pending and plan.actions == []
    assert ActionKind.CLAIM not in [a.kind for a in plan.actions]
    c = next(c for c in plan.status.conditions if c.type == ConditionType.TargetsFound)
    assert c.status == "False" and c.reason == "OwnedByController"
    assert "serving/llama-predictor is managed by InferenceService/llama (serving.kserve.io/v1beta1)" in c.message
    assert "reverted" in c.message and "not supported" in c.message
    assert plan.requeue_after and plan.requeue_after > 0          # it polls, like a Conflict
    # the owner gone (the Deployment adopted by nobody): the next pass claims it
    free = sm.reconcile(world(fleet.target_of(deployment(), "auto")))
    assert [a.kind for a in free.actions] == [ActionKind.CLAIM]


class RecordingKube:
    """Answers reads with one Deployment; any write fails the test."""

    def __init__(self, d: dict):
        self.d = d

    def fresh_deployment(self, ns, name):
        return copy.deepcopy(self.d)

    get_deployment = fresh_deployment

    def patch_deployment(self, *args, **kw):
        pytest.fail(f"patched an owned Deployment: {args}")

    def replace_deployment(self, *args, **kw):
        pytest.fail(f"replaced an owned Deployment: {args}")

    def create_if_absent(self, *args, **kw):
        pytest.fail(f"created something for an owned Deployment: {args}")


@pytest.mark.parametrize("kind", [ActionKind.CLAIM, ActionKind.PROMOTE])
def test_claim_and_promote_never_write_an_owned_deployment(kind):
    status = LookaheadPolicyStatus(phase=Phase.Promoting)
    w = world(Target("serving", "llama-predictor", "vllm", owner="serving/llama"))
    w.status = status
    body = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
            "metadata": {"name": "llama", "namespace": "serving", "uid": "p-1"}}
    c = actions.Ctx(RecordingKube(deployment(ISVC)), body, SPEC, w)
    actions.ACTIONS[kind](c, Action(kind, targets=(("serving", "llama-predictor"),), decision_id="d1", pods=(2,)))
