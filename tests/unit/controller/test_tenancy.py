"""Least privilege (issue 24, item 4): a policy targets Deployments in its own namespace only,
unless the cluster admin's allow-list (the chart's crossNamespaceTargets) lists more. The operator
refuses the rest in Pending, naming the namespace, and never reads, claims or changes anything
there; listing the namespace lets the same policy go on."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase
from lookahead_operator.controller import observe, tenancy
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.kube import cache

from ..kube.test_cache import FakeKube, target

NOW = datetime(2026, 12, 5, tzinfo=timezone.utc)


class Reads(FakeKube):
    """Besides the cached view: no fleet pod to read an engine version from (none is needed here)."""

    def pods(self, namespace, selector):
        return []


def test_the_allow_list_parses_from_json_and_refuses_what_is_malformed():
    assert tenancy.parse_allow_list(None) == {} and tenancy.parse_allow_list("  ") == {}
    allow = tenancy.parse_allow_list('{"platform": ["*"], "team-a": ["inference", "batch"]}')
    assert allow == {"platform": frozenset({"*"}), "team-a": frozenset({"inference", "batch"})}
    for raw, says in (("{", "not JSON"), ('["a"]', "expected a JSON object"), ('{"a": "b"}', "'a' must map"),
                      ('{"a": [""]}', "'a' must map")):
        with pytest.raises(ValueError, match=says) as err:
            tenancy.parse_allow_list(raw)
        assert str(err.value).startswith(tenancy.ENV)


def test_own_namespace_always_listed_ones_and_any_for_a_star():
    allow = tenancy.parse_allow_list('{"platform": ["*"], "team-a": ["inference"]}')
    assert tenancy.may_target("team-b", "team-b", {})
    assert not tenancy.may_target("team-b", "kube-system", allow)
    assert tenancy.may_target("team-a", "inference", allow) and not tenancy.may_target("team-a", "kube-system", allow)
    assert tenancy.may_target("platform", "kube-system", allow)
    assert tenancy.refused_namespaces("team-a", ["team-a", "kube-system", "inference", "batch"], allow) == \
        ["batch", "kube-system"]


def observed(namespaces: dict, policy: dict):
    """One pass's world from a cached view of the given namespaces' Deployments."""
    spec = LookaheadPolicySpec.model_validate(policy)
    snap = cache.Snapshot(namespaces={ns: {} for ns in namespaces})
    for ns, deployments in namespaces.items():
        snap.deployments[ns] = [cache.slim_deployment(d) for d in deployments]
    body = {"metadata": {"name": "bench", "namespace": "team-a", "generation": 1}}
    return observe.observe(cache.CachedView(Reads(), snap), body, spec, None, LookaheadPolicyStatus(), NOW)


POLICY = {"targets": {"selector": {"matchLabels": {"app": "llm"}}, "namespaces": ["team-a", "kube-system"]},
          "engine": "reference", "promotion": {"mode": "full"}, "load": {"batchSizes": [1]}}


def test_a_policy_naming_another_namespace_waits_refused_and_nothing_there_is_read(monkeypatch):
    monkeypatch.setattr(observe, "CROSS_NAMESPACE", {})
    fleet = {"team-a": [target("team-a")], "kube-system": [target("kube-system", "coredns")]}
    world = observed(fleet, POLICY)
    assert [t.key for t in world.targets] == [("team-a", "llm")]      # kube-system's never read
    plan = sm.reconcile(world)
    assert plan.status.phase == Phase.Pending and plan.actions == []  # nothing claimed, anywhere
    found = next(c for c in plan.status.conditions if c.type == ConditionType.TargetsFound)
    assert (found.status, found.reason) == ("False", "NamespaceNotAllowed")
    assert "a policy in namespace team-a may not target namespace(s) kube-system" in found.message
    assert "crossNamespaceTargets" in found.message and "no entry for team-a" in found.message
    assert plan.requeue_after and plan.requeue_after > 0
    # the cluster admin lists it (the operator restarts with the chart's new values): the same policy goes on
    monkeypatch.setattr(observe, "CROSS_NAMESPACE", tenancy.parse_allow_list('{"team-a": ["kube-system"]}'))
    world = observed(fleet, POLICY)
    plan = sm.reconcile(world)
    assert sorted(t.key for t in world.targets) == [("kube-system", "coredns"), ("team-a", "llm")]
    assert [a.kind for a in plan.actions] == [ActionKind.CLAIM]


def test_a_namespace_selector_is_held_to_the_same_list(monkeypatch):
    monkeypatch.setattr(observe, "CROSS_NAMESPACE", tenancy.parse_allow_list('{"team-a": ["inference"]}'))
    selector = {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}, "namespaceSelector": {}}}
    fleet = {"team-a": [target("team-a")], "inference": [target("inference")], "kube-system": []}
    plan = sm.reconcile(observed(fleet, selector))
    found = next(c for c in plan.status.conditions if c.type == ConditionType.TargetsFound)
    assert found.reason == "NamespaceNotAllowed" and "namespace(s) kube-system:" in found.message
    assert "it lists inference for team-a" in found.message
    # its own namespace alone (no selector, no list: the default) needs no entry
    own = {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}}}
    monkeypatch.setattr(observe, "CROSS_NAMESPACE", {})
    assert [a.kind for a in sm.reconcile(observed(fleet, own)).actions] == [ActionKind.CLAIM]
