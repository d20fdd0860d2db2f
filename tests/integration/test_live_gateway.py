"""Live mode, split gatewayAPI, against a real kube-apiserver with Gateway API's standard-channel
HTTPRoute CRD and the Inference Extension's InferencePool CRD installed (``hack/fetch-gateway-crds.sh``,
from the Go module proxy): the operator's own passes (``observe.observe`` -> ``statemachine.reconcile``
-> ``actions.ACTIONS``, and the deletion plan) create the arms' own backends, re-weight the user's
route, and restore it byte for byte (the stored spec and metadata compared as dicts) on the way out,
from the annotation on the route (after a restart too), re-reading on a write conflict.

There is no node here: canary and control pods are never ready, so a pass is handed
``roles_ready`` (and Prometheus' preflight answer) as a node and Prometheus would give them; every
read and write of the route and the backends is the operator's real code against the real apiserver."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_dev.gatewaycrds import install_gateway_crds
from lookahead_operator.api.names import ANNOTATION_ABORT, ANNOTATION_ORIGINAL_BACKEND_REFS, ROLES
from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.status import LookaheadPolicyStatus, Phase, PreflightStatus
from lookahead_operator.controller import actions, livesplit, observe
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import ActionKind as K
from lookahead_operator.kube.client import Kube

from .helpers import namespace_while_used
from .test_crd import install_crd

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ROUTES = ("gateway.networking.k8s.io", "v1", "httproutes")
POOLS = ("inference.networking.k8s.io", "v1", "inferencepools")
READY = {"canary": True, "control": True}
CANDIDATE = sm.PreflightResult(PreflightStatus(candidate=True, verdict="DecodeBoundIdleCompute"), [1])


@pytest.fixture(scope="module")
def gateway_crds(kube_api):
    install_crd(kube_api)  # the LookaheadPolicy CRD: the arms' backends are owned by a real policy
    return install_gateway_crds(kube_api)


@pytest.fixture()
def namespace(kube_api, gateway_crds):
    yield from namespace_while_used(kube_api, "live-gw")


def _fleet(kube_api, ns: str) -> None:
    """The example's reference-engine fleet Deployment (its pods never run here: no node)."""
    docs = [d for d in yaml.safe_load_all((REPO / "examples" / "fleet-deployment.yaml").read_text())
            if d and d.get("kind") == "Deployment" and d["metadata"]["labels"].get("engine") == "reference"]
    d = docs[0]
    d["metadata"]["namespace"] = ns
    d["spec"]["replicas"] = 10
    client.AppsV1Api(kube_api).create_namespaced_deployment(ns, d)


def _policy(kube_api, ns: str, gateway_api: dict, percent: str = "2.5%") -> dict:
    body = yaml.safe_load((REPO / "examples" / "chat-fleet.yaml").read_text())
    body["metadata"] = {"name": "chat-fleet", "namespace": ns}
    body["spec"]["targets"] = {"selector": {"matchLabels": {"app": "llm-chat", "engine": "reference"}}}
    body["spec"]["load"] = {"mode": "live", "livePercent": percent, "split": "gatewayAPI", "gatewayAPI": gateway_api}
    body["spec"]["analysis"]["prometheus"] = {"url": "http://127.0.0.1:9"}  # (nothing is measured here)
    return client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        "lookahead.dev", "v1alpha1", ns, "lookaheadpolicies", body)


def _route(kube_api, ns: str, backend_ref: dict) -> dict:
    body = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "chat", "namespace": ns, "annotations": {"team": "chat"}},
            "spec": {"parentRefs": [{"name": "inference-gateway"}], "rules": [
                {"name": "health", "matches": [{"path": {"type": "PathPrefix", "value": "/health"}}],
                 "backendRefs": [{"name": "health", "port": 8080}]},
                {"name": "chat", "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                 "backendRefs": [{**backend_ref, "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                     "set": [{"name": "x-fleet", "value": "chat"}]}}]}]}]}}
    return client.CustomObjectsApi(kube_api).create_namespaced_custom_object(*ROUTES[:2], ns, ROUTES[2], body)


def _read_route(kube_api, ns: str) -> dict:
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(*ROUTES[:2], ns, ROUTES[2], "chat")


def _same_route(before: dict, after: dict) -> None:
    """Restored byte for byte: the spec, the labels and annotations as they were."""
    assert after["spec"] == before["spec"]
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["metadata"].get("labels") == before["metadata"].get("labels")


class Operator:
    """One operator process: its API client and the policy's status as it last wrote it."""

    def __init__(self, kube_api, policy: dict, status: LookaheadPolicyStatus, k: Kube | None = None):
        self.k = k or Kube(kube_api)
        self.policy = policy
        self.spec = LookaheadPolicy.from_body(policy).spec
        self.status = status

    def observe(self, **given):
        """``observe.observe`` for real, with what a node and Prometheus would add: no read error,
        and a ready fleet pod whose engine version passes (no pod runs here)."""
        world = observe.observe(self.k, self.policy, self.spec, None, self.status, datetime.now(timezone.utc))
        return replace(world, **{"read_errors": [], "version_wait": None, "support_problems": [], **given})

    def pass_(self, **given):
        """observe -> reconcile -> every action of the plan, as the handler carries them out."""
        world = self.observe(**given)
        plan = sm.reconcile(world)
        ctx = actions.Ctx(self.k, self.policy, self.spec, world)
        for action in plan.actions:
            actions.ACTIONS[action.kind](ctx, action)
        self.status = plan.status
        return plan, world


def _claimed(op: Operator) -> Operator:
    """Pending's claim, carried out for real (the fleet Deployment marked ours), then Preflight."""
    op.status = LookaheadPolicyStatus()
    plan, _ = op.pass_()
    assert op.status.phase == Phase.Preflight and K.CLAIM in [a.kind for a in plan.actions]
    return op


def _backends(kube_api, ns: str, kind: str) -> dict[str, dict]:
    names = {r: livesplit.arm_backend_name({"metadata": {"name": "chat-fleet", "namespace": ns}}, r, ns) for r in ROLES}
    out = {}
    for role, name in names.items():
        try:
            if kind == "Service":
                out[role] = client.ApiClient().sanitize_for_serialization(
                    client.CoreV1Api(kube_api).read_namespaced_service(name, ns))
            else:
                out[role] = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(*POOLS[:2], ns, POOLS[2], name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return out


def _launch_and_split(kube_api, op: Operator, ns: str, kind: str) -> dict:
    """Preflight -> Launching (arm backends and arms created) -> the route split -> Measuring."""
    before = _read_route(kube_api, ns)
    plan, _ = op.pass_(preflight=CANDIDATE)
    assert op.status.phase == Phase.Launching, op.status.message
    assert op.status.live.route == f"{ns}/chat" and op.status.live.share == pytest.approx(0.025)
    made = _backends(kube_api, ns, kind)
    assert set(made) == set(ROLES)
    for role, obj in made.items():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == op.policy["metadata"]["uid"]
        selector = obj["spec"]["selector"] if kind == "Service" else obj["spec"]["selector"]["matchLabels"]
        assert selector["lookahead.dev/role"] == role and "app" not in selector
    assert _read_route(kube_api, ns)["spec"] == before["spec"], "the route is not touched before the arms serve"
    plan, _ = op.pass_(roles_ready=READY)                   # the arms ready: the route is written
    assert K.SPLIT_ROUTE in [a.kind for a in plan.actions] and op.status.phase == Phase.Launching
    split = _read_route(kube_api, ns)
    refs = split["spec"]["rules"][1]["backendRefs"]
    assert [r["weight"] for r in refs] == [38, 1, 1]         # 2.5% each, exact
    assert refs[1]["filters"] == refs[0]["filters"] == before["spec"]["rules"][1]["backendRefs"][0]["filters"]
    assert split["spec"]["rules"][0] == before["spec"]["rules"][0]
    saved = livesplit.SavedBackendRefs.from_annotation(split["metadata"]["annotations"][ANNOTATION_ORIGINAL_BACKEND_REFS])
    assert list(saved.backend_refs) == before["spec"]["rules"][1]["backendRefs"]  # as stored, defaults included
    plan, _ = op.pass_(roles_ready=READY)                   # read back split: measuring starts
    assert op.status.phase == Phase.Measuring and K.SPLIT_ROUTE not in [a.kind for a in plan.actions]
    return before


def _service_fleet(kube_api, ns: str) -> Operator:
    """A fleet behind its Service, the route's chat rule sending to it, and a claimed policy that
    splits that rule with Service arms."""
    _fleet(kube_api, ns)
    client.CoreV1Api(kube_api).create_namespaced_service(ns, {"metadata": {"name": "chat"}, "spec": {
        "selector": {"app": "llm-chat"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}})
    _route(kube_api, ns, {"name": "chat", "port": 8000})
    return _claimed(Operator(kube_api, _policy(kube_api, ns, {"httpRouteRef": {"name": "chat"},
                                                              "backendRef": {"name": "chat", "port": 8000}}),
                             LookaheadPolicyStatus()))


def test_a_service_backend_is_split_and_restored_exactly_by_the_safety_path(kube_api, namespace):
    ns = namespace
    op = _service_fleet(kube_api, ns)
    before = _launch_and_split(kube_api, op, ns, "Service")
    # `kubectl lookahead abort`: the route first, then the arms and their backends
    op.policy = {**op.policy, "metadata": {**op.policy["metadata"], "annotations": {ANNOTATION_ABORT: "true"}}}
    plan, _ = op.pass_()
    assert op.status.phase == Phase.RolledBack and plan.actions[0].kind == K.RESTORE_ROUTE
    _same_route(before, _read_route(kube_api, ns))
    assert _backends(kube_api, ns, "Service") == {}
    assert client.AppsV1Api(kube_api).list_namespaced_deployment(
        ns, label_selector="lookahead.dev/role in (canary,control)").items == []


def test_a_restarted_operator_restores_from_the_annotation_when_the_policy_is_deleted(kube_api, namespace):
    ns = namespace
    _fleet(kube_api, ns)
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "chat-pool", "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": "llm-chat"}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}}}}
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(*POOLS[:2], ns, POOLS[2], pool)
    _route(kube_api, ns, {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-pool"})
    policy = _policy(kube_api, ns, {"httpRouteRef": {"name": "chat"},
                                    "backendRef": {"kind": "InferencePool", "name": "chat-pool"},
                                    "endpointPickers": {"canary": {"name": "epp-canary"},
                                                        "control": {"name": "epp-control"}}})
    op = _claimed(Operator(kube_api, policy, LookaheadPolicyStatus()))
    before = _launch_and_split(kube_api, op, ns, "InferencePool")
    pools = _backends(kube_api, ns, "InferencePool")
    assert pools["canary"]["spec"]["endpointPickerRef"]["name"] == "epp-canary"
    assert pools["canary"]["spec"]["targetPorts"] == [{"number": 8000}]
    # a new operator process (nothing in memory) carries out the deletion plan from the status written
    again = Operator(kube_api, policy, op.status)
    world = again.observe()
    ctx = actions.Ctx(again.k, policy, again.spec, world)
    plan = sm.deletion_plan(op.status, world.targets, world.key)
    assert plan[0].kind == K.RESTORE_ROUTE
    for action in plan:
        actions.ACTIONS[action.kind](ctx, action)
    _same_route(before, _read_route(kube_api, ns))
    assert _backends(kube_api, ns, "InferencePool") == {}


class EditingKube(Kube):
    """The API client, with a user who edits the route between the operator's read and its write
    (once): the operator's update then carries a stale resourceVersion."""

    def __init__(self, api_client, edit):
        super().__init__(api_client)
        self.edit = edit

    def get_http_route(self, namespace, name):
        route = super().get_http_route(namespace, name)
        if self.edit is not None:
            edit, self.edit = self.edit, None
            edit()
        return route


def test_a_conflicting_write_is_read_again_and_the_users_edit_kept(kube_api, namespace):
    ns = namespace
    _fleet(kube_api, ns)
    client.CoreV1Api(kube_api).create_namespaced_service(ns, {"metadata": {"name": "chat"}, "spec": {
        "selector": {"app": "llm-chat"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}})
    _route(kube_api, ns, {"name": "chat", "port": 8000})
    policy = _policy(kube_api, ns, {"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat", "port": 8000}})
    op = _claimed(Operator(kube_api, policy, LookaheadPolicyStatus()))
    op.pass_(preflight=CANDIDATE)
    assert op.status.phase == Phase.Launching

    def users_edit():
        route = _read_route(kube_api, ns)
        route["spec"]["rules"][0]["backendRefs"][0]["port"] = 8081
        client.CustomObjectsApi(kube_api).replace_namespaced_custom_object(*ROUTES[:2], ns, ROUTES[2], "chat", route)

    world = op.observe(roles_ready=READY)
    plan = sm.reconcile(world)
    (split,) = [a for a in plan.actions if a.kind == K.SPLIT_ROUTE]
    actions.ACTIONS[K.SPLIT_ROUTE](actions.Ctx(EditingKube(kube_api, users_edit), policy, op.spec, world), split)
    route = _read_route(kube_api, ns)
    assert route["spec"]["rules"][0]["backendRefs"][0]["port"] == 8081          # the user's edit stands
    assert [r["weight"] for r in route["spec"]["rules"][1]["backendRefs"]] == [38, 1, 1]  # and the split
    edited = copy.deepcopy(route)
    restored = livesplit.restore_route(edited)
    actions.ACTIONS[K.RESTORE_ROUTE](actions.Ctx(Kube(kube_api), policy, op.spec, world),
                                     next(a for a in sm.deletion_plan(op.status, [], "") if a.kind == K.RESTORE_ROUTE))
    after = _read_route(kube_api, ns)
    assert after["spec"] == restored["spec"] and ANNOTATION_ORIGINAL_BACKEND_REFS not in (
        after["metadata"].get("annotations") or {})


def test_a_missing_route_is_refused_at_preflight_naming_the_field_and_nothing_is_created(kube_api, namespace):
    ns = namespace
    _fleet(kube_api, ns)
    policy = _policy(kube_api, ns, {"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat", "port": 8000}})
    op = _claimed(Operator(kube_api, policy, LookaheadPolicyStatus()))
    plan, _ = op.pass_(preflight=CANDIDATE)
    assert op.status.phase == Phase.Failed
    accepted = next(c for c in op.status.conditions if c.type == "Accepted")
    assert accepted.reason == "LiveSplitRefused" and "spec.load.gatewayAPI.httpRouteRef" in accepted.message
    assert [a.kind for a in plan.actions] == [K.RELEASE]
    assert _backends(kube_api, ns, "Service") == {}


def test_inference_pool_arms_beside_a_service_fleet(kube_api, namespace):
    """armBackend InferencePool with a Service as the fleet's backendRef: Preflight finds the kind
    served (API discovery), the arm pools take the Service's numeric target ports."""
    ns = namespace
    _fleet(kube_api, ns)
    client.CoreV1Api(kube_api).create_namespaced_service(ns, {"metadata": {"name": "chat"}, "spec": {
        "selector": {"app": "llm-chat"}, "ports": [{"name": "http", "port": 80, "targetPort": 8000}]}})
    _route(kube_api, ns, {"name": "chat", "port": 80})
    policy = _policy(kube_api, ns, {"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat", "port": 80},
                                    "armBackend": "InferencePool",
                                    "endpointPickers": {"canary": {"name": "epp-canary"},
                                                        "control": {"name": "epp-control"}}})
    op = _claimed(Operator(kube_api, policy, LookaheadPolicyStatus()))
    before = _launch_and_split(kube_api, op, ns, "InferencePool")
    assert _backends(kube_api, ns, "InferencePool")["control"]["spec"]["targetPorts"] == [{"number": 8000}]
    refs = _read_route(kube_api, ns)["spec"]["rules"][1]["backendRefs"]
    assert refs[1]["kind"] == "InferencePool" and "port" not in refs[1]
    op.policy = {**op.policy, "metadata": {**op.policy["metadata"], "annotations": {ANNOTATION_ABORT: "true"}}}
    op.pass_()
    _same_route(before, _read_route(kube_api, ns))
    assert _backends(kube_api, ns, "InferencePool") == {}


def test_a_route_put_back_by_gitops_while_measuring_ends_the_measurement_and_is_left_as_put(kube_api, namespace):
    # a GitOps tool (Argo CD, Flux) syncs the route back to what is in git while the arms measure:
    # the operator stops instead of fighting it, and writes nothing more to the route
    ns = namespace
    op = _service_fleet(kube_api, ns)
    before = _launch_and_split(kube_api, op, ns, "Service")
    synced = _read_route(kube_api, ns)
    synced["spec"], synced["metadata"]["annotations"] = before["spec"], before["metadata"]["annotations"]
    client.CustomObjectsApi(kube_api).replace_namespaced_custom_object(*ROUTES[:2], ns, ROUTES[2], "chat", synced)
    as_put = _read_route(kube_api, ns)
    plan, _ = op.pass_(roles_ready=READY, roles_present=READY)
    assert op.status.phase == Phase.Failed and "changed while measuring" in op.status.message, op.status.message
    assert K.SPLIT_ROUTE not in [a.kind for a in plan.actions]
    after = _read_route(kube_api, ns)
    assert after["metadata"]["resourceVersion"] == as_put["metadata"]["resourceVersion"]  # not written again
    _same_route(before, after)
    assert _backends(kube_api, ns, "Service") == {}
