"""Live mode's pure building blocks: how canary and control get their share of the fleet's real
traffic, how that is undone exactly, and when a canary that serves users is aborted.

Nothing here reads or writes the API server: the state machine (``statemachine.live``) and the
actions call these pieces, each pure and tested on its own (tests/unit/controller/test_livesplit.py).

* ``split: service``: the arm pods join the fleet's Service (``live_service_template``: the
  Service's selector labels back on the canary's and the control's pod templates, their own
  ``lookahead.dev/role`` label kept), and the share follows from replica counts
  (``service_split``).
* ``split: gatewayAPI``: the operator owns one backend per arm (``build_arm_service`` or
  ``build_arm_inference_pool``), keeps the arm pods out of the fleet's own backend
  (``gateway_arm_template``) and re-weights one rule of the user's HTTPRoute (``split_route``),
  saving that rule's ``backendRefs`` verbatim on the route so ``restore_route`` writes them back
  exactly, after a restart too.
* The safety abort (``abort_reason``): one window's facts per arm against ``analysis.abort``.

Every refusal is a ``LiveSplitError`` whose message names the spec field or the object at fault.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from fractions import Fraction
from typing import Any, Mapping, Optional, Sequence

from lookahead_canary.units import format_duration
from lookahead_operator.api.names import (
    ANNOTATION_ORIGINAL_BACKEND_REFS,
    GROUP,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGED_BY,
    ROLES,
)
from lookahead_operator.api.spec import (
    BACKEND_GROUPS,
    AbortSpec,
    BackendKind,
    CanaryCapacity,
    EndpointPickerRef,
    GatewayAPISplit,
    LoadMode,
    LookaheadPolicySpec,
)
from lookahead_operator.api.status import LookaheadPolicyStatus
from lookahead_operator.measurement.stats.live import ArmWindow  # one arm over one window: the live comparison's record
from lookahead_operator.controller.builders import owned_metadata, policy_labels, role_deployment_name

#: Gateway API's bounds on a backendRef's weight (shared_types.go: Minimum=0, Maximum=1000000).
MAX_WEIGHT = 1_000_000
#: The Inference Extension's InferencePool, the GA version (inference.networking.k8s.io/v1).
INFERENCE_POOL_API_VERSION = f"{BACKEND_GROUPS[BackendKind.InferencePool]}/v1"
#: Gateway API's bound on a rule's backendRefs (HTTPRouteRule.backendRefs: MaxItems=16).
MAX_BACKEND_REFS = 16
#: The most replicas per arm a Service split asks for (CanarySpec.replicas' own bound).
MAX_ARM_REPLICAS = 64


class LiveSplitError(ValueError):
    """Why live mode cannot split (or restore) this way; ``field`` is what the message names first:
    a spec field (``spec.load.livePercent``) or an object (``HTTPRoute gw/chat``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _pct(fraction: float) -> str:
    """0.0833 -> '8.33%', 0.05 -> '5%' (three significant digits, no trailing zeros)."""
    return f"{fraction * 100:.3g}%"


# --------------------------------------------------------------------------------------------
# split: service


@dataclass(frozen=True)
class ServiceSplit:
    """A Service split: ``arm_replicas`` pods each for canary and control beside
    ``fleet_replicas`` fleet pods, all behind the fleet's Service."""

    requested: float      # load.livePercent, a fraction
    arm_replicas: int     # per arm
    fleet_replicas: int   # the fleet's serving pods while the arms serve
    capacity: str         # canary.capacity: surge or carveOut

    @property
    def endpoints(self) -> int:
        """Every serving pod behind the Service: the fleet's and both arms'."""
        return self.fleet_replicas + 2 * self.arm_replicas

    @property
    def share(self) -> float:
        """Each arm's share of the Service's traffic: its replicas over all serving replicas."""
        return self.arm_replicas / self.endpoints

    @property
    def exact(self) -> bool:
        return math.isclose(self.share, self.requested, rel_tol=1e-9, abs_tol=1e-12)

    def describe(self) -> str:
        """The sentence for status and Events."""
        head = (f"canary and control {self.arm_replicas} replica{'s' if self.arm_replicas != 1 else ''} each beside "
                f"{self.fleet_replicas} fleet replica{'s' if self.fleet_replicas != 1 else ''} ({self.capacity}): "
                f"{_pct(self.share)} of the Service's endpoints each")
        return head + (f" (load.livePercent {_pct(self.requested)})" if self.exact else
                       f", the nearest a Service split offers at or below load.livePercent {_pct(self.requested)}")


def service_split(serving_replicas: int, live_percent: float, capacity: str = CanaryCapacity.surge,
                  max_arm_replicas: int = MAX_ARM_REPLICAS) -> ServiceSplit:
    """How many replicas each arm gets so that it serves ``live_percent`` of the fleet's Service.

    A Service (kube-proxy, or a gateway in front of it) spreads connections evenly over its ready
    endpoints, so an arm of ``r`` pods takes ``r / (fleet + 2r)`` of the traffic in expectation:
    only replica ratios are offered. With ``surge`` the fleet keeps its ``serving_replicas`` and
    the arms come on top (``r / (N + 2r)``); with ``carveOut`` the fleet lends ``2r`` of them
    (``r / N``) and must keep one.

    The chosen ``r`` is the largest whose share is at or below ``live_percent`` (the nearest
    achievable share from below: ``livePercent`` bounds how many users meet the canary, so it is
    never exceeded), at most ``max_arm_replicas``. When even one replica per arm is above it,
    this refuses, naming the smallest share the fleet allows (use ``split: gatewayAPI`` for an
    exact share on a small fleet). The achieved share is in the result (``share``, ``describe``)."""
    n = int(serving_replicas)
    if n < 1:
        raise LiveSplitError("spec.load.split", "the fleet has no serving replicas: a Service split has no traffic "
                                                "to share")
    if not 0.0 < live_percent < 0.5:
        raise LiveSplitError("spec.load.livePercent", f"{_pct(live_percent)} is not above 0% and below 50%")
    carve = capacity == CanaryCapacity.carve_out
    if carve and n < 3:
        raise LiveSplitError("spec.canary.capacity", f"carveOut takes 2 of the fleet's {n} serving replicas for one "
                                                     "replica per arm and must leave it one: use surge")

    def share(r: int) -> float:
        return r / n if carve else r / (n + 2 * r)

    best = 0
    for r in range(1, max(1, int(max_arm_replicas)) + 1):
        if carve and n - 2 * r < 1:
            break
        if share(r) > live_percent * (1 + 1e-9):
            break
        best = r
    if best == 0:
        smallest = share(1)
        raise LiveSplitError("spec.load.livePercent",
                             f"{_pct(live_percent)} is below what a Service split of {n} serving replicas offers: one "
                             f"replica per arm is {_pct(smallest)} each ({'1/' + str(n) if carve else f'1/({n}+2)'}); "
                             f"set livePercent to at least {_pct(smallest)}, or split gatewayAPI for an exact share")
    return ServiceSplit(requested=live_percent, arm_replicas=best, fleet_replicas=n - 2 * best if carve else n,
                        capacity=str(CanaryCapacity(capacity).value))


def _ours(key: str) -> bool:
    return key.startswith(f"{GROUP}/") or key == LABEL_MANAGED_BY


def service_selector(service: dict) -> dict[str, str]:
    """A Service's ``spec.selector`` (empty when it has none)."""
    return dict(((service.get("spec") or {}).get("selector")) or {})


def _name(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def arm_join_labels(service: dict, target: dict) -> dict[str, str]:
    """The labels an arm pod needs to join the fleet's ``service``: its selector, as ``target``'s
    pod template carries it (the canary and control are cloned from ``target``).

    Refuses a Service that cannot be shared this way: one without a selector (its endpoints are
    managed by hand), one that selects on the operator's own labels, one that does not select
    ``target``'s pods, and a ``target`` whose Deployment selector holds the operator's role label
    (the label that tells arm pods from fleet pods must be in no fleet selector)."""
    where = f"Service {_name(service)}"
    selector = service_selector(service)
    if not selector:
        raise LiveSplitError(where, "has no selector: its endpoints are not chosen by labels, so canary and control "
                                    "cannot join it (use split gatewayAPI)")
    ours = sorted(k for k in selector if _ours(k))
    if ours:
        raise LiveSplitError(where, f"selects on the operator's own label(s) {', '.join(ours)}")
    labels = ((((target.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")) or {}
    missing = sorted(k for k, v in selector.items() if labels.get(k) != v)
    if missing:
        raise LiveSplitError(where, f"does not select the pods of Deployment {_name(target)} (their template lacks "
                                    f"{', '.join(f'{k}={selector[k]}' for k in missing)}): it is not this fleet's "
                                    "Service")
    fleet_selector = (target.get("spec") or {}).get("selector") or {}
    keys = set(fleet_selector.get("matchLabels") or {}) | {e.get("key") for e in
                                                            fleet_selector.get("matchExpressions") or []}
    if LABEL_ROLE in keys:
        raise LiveSplitError(f"Deployment {_name(target)}", f"its selector uses {LABEL_ROLE}, the label that tells "
                                                            "canary and control pods from the fleet's")
    return selector


def arm_replicas(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus) -> int:
    """Replicas per arm: a Service split's (``status.live.armReplicas``, fixed at Preflight from
    ``load.livePercent``), else ``canary.replicas``."""
    if spec.load.mode == LoadMode.live and status.live is not None and status.live.arm_replicas:
        return status.live.arm_replicas
    return spec.canary.replicas


def fleet_service(services: Sequence[dict], target: dict) -> dict:
    """The Service the arm pods join: of ``services`` (the target's namespace's), those that select
    ``target``'s pods by labels (``arm_join_labels`` accepts them), the first by name. Refuses,
    naming ``spec.load.split``, when none does: canary and control would serve no one."""
    fits = []
    for svc in sorted(services, key=lambda s: (s.get("metadata") or {}).get("name", "")):
        try:
            arm_join_labels(svc, target)
        except LiveSplitError:
            continue
        fits.append(svc)
    if not fits:
        raise LiveSplitError("spec.load.split", f"service: no Service in namespace "
                                                f"{(target.get('metadata') or {}).get('namespace', '')} selects the "
                                                f"pods of Deployment {_name(target)}, so canary and control would "
                                                "serve no one; create the fleet's Service, or use split gatewayAPI")
    return fits[0]


def live_service_template(role_deployment: dict, service: dict, target: dict) -> dict:
    """A copy of a canary or control Deployment (``builders.build_role_deployment``'s) whose pods
    join the fleet's ``service``: the Service's selector labels are put back on its pod template
    (the sweep path leaves them off, so clones never serve users). Everything else stays: the
    Deployment's own selector (the policy's labels and ``lookahead.dev/role``, which no fleet
    Deployment selects on, so no fleet ReplicaSet adopts these pods) and the role label on the
    pods, which tells arm pods from fleet pods in every query (Prometheus' ``lookahead_dev_role``).

    The sweep path is unchanged: this is applied only for ``mode: live`` with ``split: service``."""
    labels = arm_join_labels(service, target)
    out = copy.deepcopy(role_deployment)
    tmeta = out["spec"]["template"].setdefault("metadata", {})
    role = (tmeta.get("labels") or {}).get(LABEL_ROLE)
    if role not in ROLES:
        raise LiveSplitError(f"Deployment {_name(role_deployment)}", "is not a canary or control Deployment (its pod "
                                                                     f"template has no {LABEL_ROLE} canary|control)")
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}
    return out


def is_arm_pod(pod: dict) -> bool:
    """A canary's or control's pod (role label canary|control), as opposed to a fleet pod that
    answers the same Service."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) in ROLES


# --------------------------------------------------------------------------------------------
# split: gatewayAPI, the arm backends


def backend_selector(backend: dict) -> dict[str, str]:
    """The labels a fleet backend selects its pods by: a Service's ``spec.selector``, an
    InferencePool's ``spec.selector.matchLabels``."""
    spec = backend.get("spec") or {}
    if backend.get("kind") == BackendKind.InferencePool:
        return dict((spec.get("selector") or {}).get("matchLabels") or {})
    return dict(spec.get("selector") or {})


def gateway_arm_template(role_deployment: dict, fleet_backend: dict) -> dict:
    """A copy of a canary or control Deployment whose pods are NOT in the fleet's own backend
    (its Service or InferencePool): every key of that backend's selector is taken off the pod
    template. With ``split: gatewayAPI`` an arm is reached through its own backend only; an arm
    pod also in the fleet's pool would take fleet traffic on top of its share, and in a load-aware
    pool the endpoint picker would route by the treatment itself."""
    selector = backend_selector(fleet_backend)
    ours = sorted(k for k in selector if _ours(k))
    if ours:
        raise LiveSplitError(f"{fleet_backend.get('kind', 'Service')} {_name(fleet_backend)}",
                             f"selects on the operator's own label(s) {', '.join(ours)}")
    out = copy.deepcopy(role_deployment)
    tmeta = out["spec"]["template"].setdefault("metadata", {})
    tmeta["labels"] = {k: v for k, v in (tmeta.get("labels") or {}).items() if k not in selector}
    return out


def arm_pod_selector(policy: dict, role: str) -> dict[str, str]:
    """The labels of one arm's pods that its own backend selects: the arm Deployment's selector
    (the policy's name and namespace, and ``lookahead.dev/role``)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    return {**policy_labels(policy), LABEL_ROLE: role}


def arm_backend_name(policy: dict, role: str, namespace: str) -> str:
    """The name of an arm's Service or InferencePool: the arm Deployment's, ``lap-<policy>-<role>``
    (with a hash of the policy's namespace in another namespace), so users can name the pool in
    the Endpoint Picker they deploy for it before the policy runs."""
    meta = policy["metadata"]
    return role_deployment_name(meta["name"], role, meta.get("namespace"), namespace)


def _arm_labels(policy: dict, role: str) -> dict[str, str]:
    return {**policy_labels(policy), LABEL_ROLE: role, LABEL_MANAGED_BY: MANAGED_BY}


def arm_service_ports(fleet_backend: dict) -> list[dict]:
    """The ports an arm's Service exposes, like the fleet's backend: a Service's ``spec.ports``
    (names, numbers, target ports and app protocols; node ports left out), or an InferencePool's
    target ports, each as ``http``/``http-<n>`` on the same number."""
    spec = fleet_backend.get("spec") or {}
    if fleet_backend.get("kind") == BackendKind.InferencePool:
        numbers = [int(p["number"]) for p in spec.get("targetPorts") or []]
        return [{"name": "http" if i == 0 else f"http-{i}", "port": n, "targetPort": n, "protocol": "TCP"}
                for i, n in enumerate(numbers)]
    keep = ("name", "port", "targetPort", "protocol", "appProtocol")
    return [{k: copy.deepcopy(p[k]) for k in keep if k in p} for p in spec.get("ports") or []]


def build_arm_service(policy: dict, namespace: str, role: str, ports: Sequence[dict]) -> dict:
    """An arm's own Service (``split: gatewayAPI`` with Service arms): ClusterIP, selecting only
    that arm's pods, exposing ``ports`` (``arm_service_ports``). Owned by the policy in its own
    namespace (else deleted by its finalizer, like the arm Deployments)."""
    if not ports:
        raise LiveSplitError("spec.load.gatewayAPI.backendRef", "the fleet's backend exposes no port to mirror")
    name = arm_backend_name(policy, role, namespace)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owned_metadata(policy, name, namespace, _arm_labels(policy, role)),
        "spec": {"type": "ClusterIP", "selector": arm_pod_selector(policy, role),
                 "ports": [copy.deepcopy(dict(p)) for p in ports]},
    }


def build_arm_inference_pool(policy: dict, namespace: str, role: str, target_ports: Sequence[int],
                             picker: EndpointPickerRef, app_protocol: Optional[str] = None) -> dict:
    """An arm's own InferencePool (inference.networking.k8s.io/v1): ``selector.matchLabels`` the
    arm's pods only, ``targetPorts`` as the fleet's pool (1 to 8 unique numbers), and the arm's
    own Endpoint Picker (``endpointPickerRef``: a Service and its port; ``failureMode``). One pool
    per arm, never one for both (its picker would score the arms on the treatment itself)."""
    numbers = [int(n) for n in target_ports]
    if not 1 <= len(numbers) <= 8 or len(set(numbers)) != len(numbers) or not all(1 <= n <= 65535 for n in numbers):
        raise LiveSplitError("spec.load.gatewayAPI.backendRef",
                             f"an InferencePool needs 1 to 8 unique target ports (1-65535), got {numbers}")
    spec: dict[str, Any] = {
        "selector": {"matchLabels": arm_pod_selector(policy, role)},
        "targetPorts": [{"number": n} for n in numbers],
        "endpointPickerRef": {"group": "", "kind": "Service", "name": picker.name, "port": {"number": picker.port},
                              "failureMode": str(picker.failure_mode.value)},
    }
    if app_protocol:
        spec["appProtocol"] = app_protocol
    name = arm_backend_name(policy, role, namespace)
    return {"apiVersion": INFERENCE_POOL_API_VERSION, "kind": "InferencePool",
            "metadata": owned_metadata(policy, name, namespace, _arm_labels(policy, role)), "spec": spec}


def arm_inference_pool_like(fleet_pool: dict, policy: dict, role: str, picker: EndpointPickerRef) -> dict:
    """``build_arm_inference_pool`` with the fleet pool's target ports and app protocol, in its namespace."""
    spec = fleet_pool.get("spec") or {}
    return build_arm_inference_pool(policy, fleet_pool["metadata"]["namespace"], role,
                                    [p["number"] for p in spec.get("targetPorts") or []], picker,
                                    spec.get("appProtocol"))


# --------------------------------------------------------------------------------------------
# split: gatewayAPI, the route


@dataclass(frozen=True)
class SavedBackendRefs:
    """What ``restore_route`` needs to put a split rule back exactly: the rule (its position and
    its name, if it has one), its ``backendRefs`` as they were, verbatim, and the arms' refs (kind
    and name) that find the rule again should rules have moved. Saved as JSON on the route
    (annotation ``lookahead.dev/original-backend-refs``), so a restarted operator restores too."""

    rule_index: int
    rule_name: Optional[str]
    backend_refs: tuple[Any, ...]
    arms: tuple[tuple[str, str], ...]

    def to_annotation(self) -> str:
        return json.dumps({"ruleIndex": self.rule_index, "ruleName": self.rule_name,
                           "backendRefs": list(self.backend_refs), "arms": [list(a) for a in self.arms]},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str, where: str = "HTTPRoute") -> "SavedBackendRefs":
        try:
            data = json.loads(text)
            return cls(rule_index=int(data["ruleIndex"]), rule_name=data.get("ruleName"),
                       backend_refs=tuple(data["backendRefs"]), arms=tuple(tuple(a) for a in data.get("arms") or ()))
        except (ValueError, KeyError, TypeError) as exc:
            raise LiveSplitError(where, f"annotation {ANNOTATION_ORIGINAL_BACKEND_REFS} cannot be read ({exc}): "
                                        "restore the rule's backendRefs by hand, then remove the annotation") from None


@dataclass(frozen=True)
class RouteWeights:
    """A split rule's weights: the fleet's backendRef's (reduced), each arm's, the other backendRefs'
    (scaled alike, so their share of the rule is unchanged), and each arm's achieved share of what
    the rule sent the fleet's backendRef."""

    fleet: int
    arm: int
    others: tuple[int, ...]

    @property
    def share(self) -> float:
        return self.arm / (self.fleet + 2 * self.arm)


@dataclass(frozen=True)
class RouteSplit:
    """``split_route``'s answer: the route to write (one update, the annotation included), what it
    saved, and the weights it set."""

    route: dict
    saved: SavedBackendRefs
    weights: RouteWeights
    rule_index: int


def _weight(ref: dict) -> int:
    w = ref.get("weight")
    return 1 if w is None else int(w)


def split_weights(fleet_weight: int, other_weights: Sequence[int], live_percent: float) -> RouteWeights:
    """Integer weights giving each arm ``live_percent`` of the fleet backendRef's traffic: the fleet's
    weight ``W`` becomes ``W (1 - 2p) K``, each arm's ``W p K``, every other backendRef's ``w K``,
    with the smallest ``K`` making them all integers, then divided by their common divisor. Exact
    for any percent of up to six decimals while the weights fit Gateway API's 1,000,000; beyond
    that they are scaled down to fit and rounded, and ``share`` says what was reached."""
    if not 0.0 < live_percent < 0.5:
        raise LiveSplitError("spec.load.livePercent", f"{_pct(live_percent)} is not above 0% and below 50%")
    if fleet_weight <= 0:
        raise LiveSplitError("spec.load.gatewayAPI.backendRef", "the fleet's backendRef has weight 0 in the rule: it "
                                                                 "gets none of the rule's traffic to share")
    p = Fraction(live_percent).limit_denominator(10**8)
    w = Fraction(int(fleet_weight))
    scale = (w * p).denominator
    fleet, arm = w * (1 - 2 * p) * scale, w * p * scale
    weights = [int(fleet), int(arm), *(int(o) * scale for o in other_weights)]
    divisor = math.gcd(*[x for x in weights if x]) or 1
    weights = [x // divisor for x in weights]
    if max(weights) > MAX_WEIGHT:
        k = MAX_WEIGHT // max(int(fleet_weight), *[int(o) for o in other_weights], 1)
        arm_w = max(1, round(fleet_weight * k * float(p)))
        fleet_w = fleet_weight * k - 2 * arm_w
        if fleet_w < 1:
            raise LiveSplitError("spec.load.gatewayAPI.backendRef",
                                 f"the fleet's backendRef weight {fleet_weight} is too small beside the rule's other "
                                 f"weights {list(other_weights)} to carve two shares of {_pct(live_percent)} within "
                                 f"Gateway API's weights (at most {MAX_WEIGHT})")
        weights = [fleet_w, arm_w, *(int(o) * k for o in other_weights)]
    return RouteWeights(fleet=weights[0], arm=weights[1], others=tuple(weights[2:]))


def _matches(ref: dict, gw: GatewayAPISplit, route_namespace: str) -> bool:
    want = gw.backend_ref
    return ((ref.get("group") or "") == BACKEND_GROUPS[want.kind]
            and (ref.get("kind") or "Service") == want.kind.value
            and ref.get("name") == want.name
            and (ref.get("namespace") or route_namespace) == (want.namespace or route_namespace)
            and (want.port is None or ref.get("port") == want.port))


def _route_where(route: dict) -> str:
    return f"HTTPRoute {_name(route)}"


def _describe_ref(gw: GatewayAPISplit) -> str:
    ref = gw.backend_ref
    return (f"{ref.kind.value} {ref.namespace + '/' if ref.namespace else ''}{ref.name}"
            f"{':' + str(ref.port) if ref.port is not None else ''}")


def find_rule(route: dict, gw: GatewayAPISplit) -> int:
    """The index of the rule ``gw`` splits: by ``ruleName``, by ``ruleIndex``, or else the one rule
    whose backendRefs hold the fleet's backendRef. Refuses a route without it, naming the field."""
    rules = (route.get("spec") or {}).get("rules") or []
    ns = (route.get("metadata") or {}).get("namespace", "")
    if gw.rule_name is not None:
        found = [i for i, r in enumerate(rules) if r.get("name") == gw.rule_name]
        if not found:
            raise LiveSplitError("spec.load.gatewayAPI.ruleName",
                                 f"{_route_where(route)} has no rule named {gw.rule_name!r}")
        return found[0]
    if gw.rule_index is not None:
        if gw.rule_index >= len(rules):
            raise LiveSplitError("spec.load.gatewayAPI.ruleIndex",
                                 f"{_route_where(route)} has {len(rules)} rule(s): no rule {gw.rule_index}")
        return gw.rule_index
    found = [i for i, r in enumerate(rules) if any(_matches(b, gw, ns) for b in r.get("backendRefs") or [])]
    if len(found) != 1:
        raise LiveSplitError("spec.load.gatewayAPI.backendRef",
                             f"{_route_where(route)} has {'no rule' if not found else f'rules {found}'} with "
                             f"backendRef {_describe_ref(gw)}" + ("" if not found else ": set ruleName or ruleIndex"))
    return found[0]


def arm_backend_ref(fleet_ref: dict, kind: BackendKind, name: str, port: Optional[int] = None) -> dict:
    """An arm's backendRef, made from the fleet's: the same filters and namespace (so the arm sees
    the requests the fleet does), the arm's own backend (``kind``, ``name``; a Service's ``port``),
    and no weight yet (``split_route`` sets it)."""
    out = {k: copy.deepcopy(v) for k, v in fleet_ref.items() if k not in ("group", "kind", "name", "port", "weight")}
    out.update({"group": BACKEND_GROUPS[kind], "kind": kind.value, "name": name})
    if kind == BackendKind.Service:
        if port is None:
            raise LiveSplitError("spec.load.gatewayAPI.armBackend", "a Service arm's backendRef needs a port")
        out["port"] = int(port)
    return out


def saved_backend_refs(route: dict) -> Optional[SavedBackendRefs]:
    """What a split saved on ``route`` (its annotation), or None when the route is not split."""
    text = ((route.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ORIGINAL_BACKEND_REFS)
    return None if text is None else SavedBackendRefs.from_annotation(text, _route_where(route))


def _ref_key(ref: dict) -> tuple[str, str]:
    return (ref.get("kind") or "Service", ref.get("name") or "")


def split_route(route: dict, gw: GatewayAPISplit, arms: Mapping[str, dict], live_percent: float) -> RouteSplit:
    """The user's HTTPRoute with one rule re-weighted: the canary's and the control's backendRefs
    (``arms``: role -> ``arm_backend_ref``) appended at ``live_percent`` each of what the rule sent
    the fleet's backendRef, the fleet's weight reduced by as much, the rule's other backendRefs
    scaled so their share is unchanged; and the rule's ``backendRefs`` as they were saved verbatim
    on the route (annotation), the only other change.

    Idempotent: a route already split (the annotation present) is restored first, then split, so
    applying this twice, or again after a restart, gives the same route. Refuses (``LiveSplitError``
    naming the field) a route without the rule, a rule without the fleet's backendRef or with it
    twice, and a rule that already holds a backendRef named like an arm's."""
    if set(arms) != set(ROLES):
        raise ValueError(f"arms must be given for {ROLES}, got {sorted(arms)}")
    base = restore_route(route)
    index = find_rule(base, gw)
    rule = base["spec"]["rules"][index]
    refs = list(rule.get("backendRefs") or [])
    ns = (base.get("metadata") or {}).get("namespace", "")
    hits = [i for i, b in enumerate(refs) if _matches(b, gw, ns)]
    if len(hits) != 1:
        where = f"rule {rule['name']!r}" if rule.get("name") else f"rule {index}"
        raise LiveSplitError("spec.load.gatewayAPI.backendRef",
                             f"{_route_where(base)} {where} holds backendRef {_describe_ref(gw)} "
                             f"{'nowhere' if not hits else f'{len(hits)} times'}")
    arm_keys = {_ref_key(arms[r]) for r in ROLES}
    if len(arm_keys) != len(ROLES):
        raise ValueError("the canary's and the control's backendRefs must name different backends")
    clash = sorted(f"{k} {n}" for k, n in arm_keys if any(_ref_key(b) == (k, n) for b in refs))
    if clash:
        raise LiveSplitError(_route_where(base), f"rule {index} already has a backendRef to {', '.join(clash)}, the "
                                                 "name of an arm's backend: remove it, or rename the policy")
    fleet_at = hits[0]
    weights = split_weights(_weight(refs[fleet_at]), [_weight(b) for i, b in enumerate(refs) if i != fleet_at],
                            live_percent)
    saved = SavedBackendRefs(rule_index=index, rule_name=rule.get("name"), backend_refs=tuple(copy.deepcopy(refs)),
                             arms=tuple(sorted(arm_keys)))
    others = iter(weights.others)
    new_refs = []
    for i, b in enumerate(refs):
        b = copy.deepcopy(b)
        b["weight"] = weights.fleet if i == fleet_at else next(others)
        new_refs.append(b)
    for role in ROLES:
        new_refs.append({**copy.deepcopy(arms[role]), "weight": weights.arm})
    rule["backendRefs"] = new_refs
    meta = base.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_ORIGINAL_BACKEND_REFS: saved.to_annotation()}
    return RouteSplit(route=base, saved=saved, weights=weights, rule_index=index)


def _saved_rule_index(route: dict, saved: SavedBackendRefs) -> int:
    """Where the split rule is now: the one rule holding the arms' backendRefs, else the rule of
    the saved name, else the saved position."""
    rules = (route.get("spec") or {}).get("rules") or []
    arms = set(saved.arms)
    holding = [i for i, r in enumerate(rules) if arms and arms <= {_ref_key(b) for b in r.get("backendRefs") or []}]
    if len(holding) == 1:
        return holding[0]
    if saved.rule_name is not None:
        named = [i for i, r in enumerate(rules) if r.get("name") == saved.rule_name]
        if named:
            return named[0]
    if saved.rule_index < len(rules):
        return saved.rule_index
    raise LiveSplitError(_route_where(route), f"the split rule ({saved.rule_name or saved.rule_index}) is gone: its "
                                              "original backendRefs are in annotation "
                                              f"{ANNOTATION_ORIGINAL_BACKEND_REFS}")


def restore_route(route: dict, saved: Optional[SavedBackendRefs] = None) -> dict:
    """The route as it was before ``split_route``: the split rule's ``backendRefs`` written back
    verbatim (weights, order, filters, the fields Gateway API defaults included), the annotation
    removed (and ``annotations`` itself when that leaves it empty). Everything else on the route,
    the user's edits to other rules included, is kept. ``saved`` defaults to the route's own
    annotation; a route with neither is returned unchanged (restoring twice is restoring once)."""
    out = copy.deepcopy(route)
    saved = saved or saved_backend_refs(out)
    if saved is None:
        return out
    index = _saved_rule_index(out, saved)
    out["spec"]["rules"][index]["backendRefs"] = copy.deepcopy(list(saved.backend_refs))
    annotations = (out.get("metadata") or {}).get("annotations")
    if annotations is not None:
        annotations.pop(ANNOTATION_ORIGINAL_BACKEND_REFS, None)
        if not annotations:
            del out["metadata"]["annotations"]
    return out



# --------------------------------------------------------------------------------------------
# split: gatewayAPI, the pieces above put together for the state machine and its actions


def gateway_arm_replicas(serving_replicas: int, live_percent: float, capacity: str = CanaryCapacity.surge) -> int:
    """Replicas per arm with ``split: gatewayAPI``. The share is exact from the route's weights
    whatever the replicas, so this only sizes the arms for the traffic they get: the number a
    Service split of the same ``livePercent`` would give (``service_split``: each arm pod then
    meets about the offered load of a fleet pod, so the strata, keyed on the fleet's load per pod,
    describe the arms' pods too), and one when the share is below what one replica of a Service
    split gives (the case a gatewayAPI split exists for). carveOut's own bound (the fleet keeps a
    replica) still refuses, naming ``spec.canary.capacity``."""
    try:
        return service_split(serving_replicas, live_percent, capacity).arm_replicas
    except LiveSplitError as exc:
        if exc.field == "spec.load.livePercent" and 0.0 < live_percent < 0.5 and serving_replicas >= 1:
            return 1
        raise


def route_ref(gw: GatewayAPISplit, policy_namespace: str) -> tuple[str, str]:
    """The HTTPRoute ``gw`` names: (namespace, name); its namespace defaults to the policy's."""
    return (gw.http_route_ref.namespace or policy_namespace, gw.http_route_ref.name)


def fleet_backend_ref(gw: GatewayAPISplit, route_namespace: str) -> tuple[BackendKind, str, str]:
    """The fleet's backend ``gw.backendRef`` names: (kind, namespace, name); its namespace defaults
    to the route's, as Gateway API's does."""
    ref = gw.backend_ref
    return (ref.kind, ref.namespace or route_namespace, ref.name)


def _first_port(fleet_backend: Optional[dict]) -> Optional[int]:
    ports = arm_service_ports(fleet_backend) if fleet_backend is not None else []
    return int(ports[0]["port"]) if ports else None


def gateway_split(route: dict, policy: dict, gw: GatewayAPISplit, namespace: str, live_percent: float,
                  fleet_backend: Optional[dict] = None) -> RouteSplit:
    """``split_route`` with the arms' backendRefs made from the fleet's own (``arm_backend_ref``):
    each arm's backend ``arm_backend_name`` in ``namespace`` (where the arm pods and their backends
    live), of kind ``gw.arm_kind``; a Service arm's port is the fleet's backendRef's (else the
    first port of ``fleet_backend``, an InferencePool's first target port). The backendRef names
    ``namespace`` only when it is not the route's (a ReferenceGrant there must allow it).
    Idempotent like ``split_route``: a route it split gives the same route again."""
    base = restore_route(route)
    route_ns = (base.get("metadata") or {}).get("namespace", "")
    index = find_rule(base, gw)
    refs = (base["spec"]["rules"][index].get("backendRefs") or [])
    if len(refs) + len(ROLES) > MAX_BACKEND_REFS:
        raise LiveSplitError("spec.load.gatewayAPI.backendRef",
                             f"{_route_where(base)} rule {index} holds {len(refs)} backendRefs: with the canary's and "
                             f"the control's it would hold more than Gateway API's {MAX_BACKEND_REFS}")
    fleet = next((r for r in refs if _matches(r, gw, route_ns)), {})
    port = fleet.get("port") if (fleet.get("kind") or "Service") == "Service" else None
    if port is None and gw.arm_kind == BackendKind.Service:
        port = _first_port(fleet_backend) if fleet else 0  # (no fleet backendRef: split_route says so)
    arms = {}
    for role in ROLES:
        ref = arm_backend_ref(fleet, gw.arm_kind, arm_backend_name(policy, role, namespace), port)
        if namespace == route_ns:
            ref.pop("namespace", None)
        else:
            ref["namespace"] = namespace
        arms[role] = ref
    return split_route(route, gw, arms, live_percent)


def route_split_in_place(route: dict, want: RouteSplit) -> bool:
    """Whether ``route`` is already the split ``want`` (its spec and the saved annotation)."""
    ann = ((route.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ORIGINAL_BACKEND_REFS)
    return route.get("spec") == want.route.get("spec") and ann == want.saved.to_annotation()


def arm_backends(policy: dict, gw: GatewayAPISplit, namespace: str, fleet_backend: dict) -> dict[str, dict]:
    """Each arm's own backend, by role, in ``namespace``: a Service (``build_arm_service``, the
    fleet backend's ports) or an InferencePool (``build_arm_inference_pool``: the fleet pool's
    target ports and app protocol, or a fleet Service's numeric target ports; the arm's Endpoint
    Picker from ``gw.endpointPickers``). Refuses (``LiveSplitError``) a fleet backend that selects
    on the operator's labels, or that gives no port to mirror."""
    selector = backend_selector(fleet_backend)
    ours = sorted(k for k in selector if _ours(k))
    if ours:
        raise LiveSplitError(f"{fleet_backend.get('kind', 'Service')} {_name(fleet_backend)}",
                             f"selects on the operator's own label(s) {', '.join(ours)}")
    out = {}
    for role in ROLES:
        if gw.arm_kind == BackendKind.Service:
            out[role] = build_arm_service(policy, namespace, role, arm_service_ports(fleet_backend))
            continue
        if gw.endpoint_pickers is None:  # (the spec's CEL rule requires them)
            raise LiveSplitError("spec.load.gatewayAPI.endpointPickers", "InferencePool arms need an Endpoint Picker each")
        picker = getattr(gw.endpoint_pickers, role)
        spec = fleet_backend.get("spec") or {}
        if fleet_backend.get("kind") == BackendKind.InferencePool:
            numbers = [p["number"] for p in spec.get("targetPorts") or []]
            protocol = spec.get("appProtocol")
        else:
            numbers = [p.get("targetPort") if isinstance(p.get("targetPort"), int) else p.get("port")
                       for p in spec.get("ports") or []]
            protocol = None
        out[role] = build_arm_inference_pool(policy, namespace, role, numbers, picker, protocol)
    return out

# --------------------------------------------------------------------------------------------
# the safety abort


class AbortSignal(StrEnum):
    errors = "errors"
    ttft = "ttft"
    token_latency = "tokenLatency"
    blind = "blind"


#: The condition reason (and Event reason) of each abort.
ABORT_REASONS = {AbortSignal.errors: "CanaryErrorRate", AbortSignal.ttft: "CanaryTimeToFirstToken",
                 AbortSignal.token_latency: "CanaryTokenLatency", AbortSignal.blind: "AbortBlind"}


@dataclass(frozen=True)
class AbortReason:
    """Why the canary is aborted: the signal, the condition reason, the sentence, and the numbers
    it compared (canary's, control's and the limit: rates as fractions, latencies as ratios)."""

    signal: AbortSignal
    message: str
    canary: float
    control: float
    limit: float

    @property
    def reason(self) -> str:
        return ABORT_REASONS[self.signal]


def _secs(s: float) -> str:
    return f"{s:.3g}s" if s >= 1 else f"{s * 1000:.3g}ms"


def _ratio_reason(signal: AbortSignal, what: str, field: str, canary: ArmWindow, control: ArmWindow,
                  c: Optional[float], k: Optional[float], rise: float, min_requests: int) -> Optional[AbortReason]:
    if canary.served < min_requests or control.served < min_requests:
        return None
    if c is None or k is None or not (math.isfinite(c) and math.isfinite(k)) or k <= 0:
        return None
    ratio, limit = c / k, 1.0 + rise
    if ratio <= limit:
        return None
    return AbortReason(signal, f"canary {what} {_secs(c)} vs control {_secs(k)} ({ratio:.3g}x) over {canary.served} "
                               f"and {control.served} requests: more than {limit:.3g}x the control's "
                               f"(analysis.abort.{field} {_pct(rise)})", ratio, 1.0, limit)


def blind_reason(seen_until: Optional[datetime], serving_since: Optional[datetime], now: datetime,
                 abort: AbortSpec, why: str) -> Optional[AbortReason]:
    """Whether the abort has been blind too long: it has not seen both arms' metrics (Prometheus had
    scraped them up to ``seen_until``) for more than ``maxBlind``, counted from when the arms began
    to serve (``serving_since``) at the latest. A canary serving users that nobody watches is not
    left serving, as a failed check counts against a Flagger canary. ``why``: what the abort could
    not read, in words. None when it saw them recently enough, or nothing serves yet."""
    seen = [t for t in (seen_until, serving_since) if t is not None]
    if not seen:
        return None
    blind_for = (now - max(seen)).total_seconds()
    limit = abort.max_blind.total_seconds()
    if blind_for <= limit:
        return None
    return AbortReason(AbortSignal.blind,
                       f"the safety abort has not seen both arms' metrics for {blind_for:.0f}s "
                       f"(analysis.abort.maxBlind is {format_duration(limit)}): {why}", blind_for, 0.0, limit)


def abort_reason(canary: ArmWindow, control: ArmWindow, abort: AbortSpec) -> Optional[AbortReason]:
    """Whether one window's facts abort the canary, and why; None when they do not.

    Checked in this order, the first that holds wins:

    1. errors: the canary's share of failed requests above the control's by more than
       ``maxErrorRateIncrease`` points, once the canary served ``minRequests`` requests or failed
       ``minErrors`` (defaults 20 and 3: one failed request never aborts on its own, whatever the
       control did; three failed of three do, as do two of twenty against a clean control). A
       control that served nothing counts as 0% failed: the canary alone is judged.
    2. time to first token: the canary's mean above ``1 + maxTtftRegression`` times the control's.
    3. per-token latency: the canary's mean above ``1 + maxTokenLatencyRegression`` times the
       control's.

    The latency checks need ``minRequests`` served by each arm (a mean over a handful of requests
    is one prompt's length) and a control value above 0."""
    if canary.served >= abort.min_requests or canary.errors >= abort.min_errors:
        c, k = canary.error_rate, control.error_rate
        if c - k > abort.max_error_rate_increase + 1e-12:
            points = abort.max_error_rate_increase * 100
            return AbortReason(AbortSignal.errors,
                               f"canary error rate {_pct(c)} vs control {_pct(k)} over {canary.served} requests "
                               f"({max(0, int(canary.errors))} failed): more than {points:.3g} points above the "
                               f"control's (analysis.abort.maxErrorRateIncrease)", c, k, abort.max_error_rate_increase)
    return (_ratio_reason(AbortSignal.ttft, "time to first token", "maxTtftRegression", canary, control,
                          canary.ttft, control.ttft, abort.max_ttft_regression, abort.min_requests)
            or _ratio_reason(AbortSignal.token_latency, "per-token latency", "maxTokenLatencyRegression", canary,
                             control, canary.per_token_latency, control.per_token_latency,
                             abort.max_token_latency_regression, abort.min_requests))
