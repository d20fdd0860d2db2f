"""The spec of a LookaheadPolicy: what its user asks for.

The fleet (``Targets`` and label selectors), the engine and the lookahead to turn on
(``LookaheadConfig``), the canary,
the load (``LoadSpec``), the decision rule (``AnalysisSpec``) and the rollout (``PromotionSpec``),
gathered in ``LookaheadPolicySpec`` with its cross-field rules (pydantic and CEL alike).
``spec_error`` says why a spec cannot be acted on, naming its first invalid field.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Any, Optional

from kubernetes.utils import parse_quantity  # the client's own quantity parser
from pydantic import AfterValidator, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from lookahead_operator.api.names import DEFAULT_LOAD_LIMITS, DEFAULT_LOAD_REQUESTS, GROUP, LABEL_MANAGED_BY
from lookahead_operator.api.schema import (
    DNS_LABEL_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_KEY_RULE,
    LABEL_KEY_STRICT_PATTERN,
    MAX_BATCH_SIZE,
    MAX_BATCH_SIZES,
    MAX_EXPRESSION_VALUES,
    MAX_EXPRESSIONS,
    MAX_IMAGE,
    MAX_LABELS,
    MAX_NAMESPACES,
    MAX_URL,
    MAX_WAVES,
    PERCENT_PATTERN,
    RESOURCE_NAME_PATTERN,
    TAIL_PERCENT_PATTERN,
    ApiModel,
    Duration,
    LabelValue,
    Percent,
    Quantity,
    RisePercent,
    WavePercent,
    _cel,
    _dur_ok,
    _duration_out,
    _obj_default,
    _strictly_increasing_cel,
    label_problem,
)


# --------------------------------------------------------------------------------------------
# spec: targets


class SelectorOperator(StrEnum):
    In = "In"
    NotIn = "NotIn"
    Exists = "Exists"
    DoesNotExist = "DoesNotExist"


class LabelSelectorRequirement(ApiModel):
    """One ``matchExpressions`` entry, as in Kubernetes' LabelSelector."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0)"
             " : (!has(self.values) || size(self.values) == 0)",
             "values must be non-empty for operator In and NotIn, and empty for Exists and DoesNotExist",
             ".values"),
    ]})

    key: str = Field(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN, description="The label key.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: Optional[list[LabelValue]] = Field(
        default=None, max_length=MAX_EXPRESSION_VALUES,
        description="Values for In and NotIn; empty for Exists and DoesNotExist.")

    @model_validator(mode="after")
    def _values_match_operator(self) -> "LabelSelectorRequirement":
        has_values = bool(self.values)
        if (self.operator in ("In", "NotIn")) != has_values:
            raise ValueError("values must be non-empty for operator In and NotIn, "
                             "and empty for Exists and DoesNotExist")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in (self.values or [])
        return not present or labels[self.key] not in (self.values or [])


class LabelSelector(ApiModel):
    """A Kubernetes label selector: ``matchLabels`` and ``matchExpressions``, ANDed."""

    match_labels: Optional[dict[Annotated[str, Field(max_length=317)], LabelValue]] = Field(
        default=None, max_length=MAX_LABELS, description="Labels that must all be present with these values.",
        json_schema_extra={"maxProperties": MAX_LABELS, "x-kubernetes-validations": [
            _cel(f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY_PATTERN}'))",
                 "label keys must be valid Kubernetes label keys: an optional DNS prefix and '/', then a name of "
                 "alphanumerics, '-', '_' or '.' that starts and ends with an alphanumeric"),
        ]})
    match_expressions: Optional[list[LabelSelectorRequirement]] = Field(
        default=None, max_length=MAX_EXPRESSIONS, description="Requirements that must all hold.")

    @field_validator("match_labels")
    @classmethod
    def _label_keys(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        for key in v or {}:
            if not re.fullmatch(LABEL_KEY_PATTERN, key):
                raise ValueError(f"label key {key!r} is not a valid Kubernetes label key")
        return v

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Optional[dict[str, str]]) -> bool:
        labels = labels or {}
        if any(labels.get(k) != v for k, v in (self.match_labels or {}).items()):
            return False
        return all(e.matches(labels) for e in self.match_expressions or [])

    def to_label_selector_string(self) -> str:
        """The ``labelSelector=`` query string for list calls."""
        parts = [f"{k}={v}" for k, v in sorted((self.match_labels or {}).items())]
        for e in self.match_expressions or []:
            if e.operator == "Exists":
                parts.append(e.key)
            elif e.operator == "DoesNotExist":
                parts.append(f"!{e.key}")
            else:
                op = "in" if e.operator == "In" else "notin"
                parts.append(f"{e.key} {op} ({','.join(e.values or [])})")
        return ",".join(parts)


_SELECTOR_NONEMPTY = ("(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0)"
                      " || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)")


class Targets(ApiModel):
    """The fleet: Deployments picked by labels, in one or more namespaces.

    Namespaces searched: those in ``namespaces``, plus those matching ``namespaceSelector``
    (``{}`` selects every namespace). With neither, only the policy's own namespace.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel(_SELECTOR_NONEMPTY,
             "selector must not be empty: give matchLabels or matchExpressions (an empty selector would take every Deployment)",
             ".selector"),
    ]})

    selector: LabelSelector = Field(description="Labels of the target Deployments (on the Deployment's metadata).")
    namespace_selector: Optional[LabelSelector] = Field(
        default=None, description="Labels of the namespaces to search; {} means all namespaces.")
    namespaces: Optional[list[Annotated[str, Field(max_length=63, pattern=DNS_LABEL_PATTERN)]]] = Field(
        default=None, max_length=MAX_NAMESPACES, description="Explicit namespaces to search.",
        json_schema_extra={"x-kubernetes-list-type": "set"})

    @model_validator(mode="after")
    def _selector_not_empty(self) -> "Targets":
        if self.selector.is_empty():
            raise ValueError("selector must not be empty: give matchLabels or matchExpressions "
                             "(an empty selector would take every Deployment)")
        return self

    def namespace_scope(self, policy_namespace: str) -> tuple[Optional[list[str]], Optional[LabelSelector]]:
        """``(explicit namespaces, namespace selector)``; ``([policy ns], None)`` when neither is set."""
        if self.namespaces is None and self.namespace_selector is None:
            return [policy_namespace], None
        return list(self.namespaces or []), self.namespace_selector


# --------------------------------------------------------------------------------------------
# spec: engine and lookahead


class Engine(StrEnum):
    auto = "auto"
    vllm = "vllm"
    sglang = "sglang"
    reference = "reference"


class LookaheadMethod(StrEnum):
    jacobi = "jacobi"
    ngram = "ngram"
    ngram_gpu = "ngram_gpu"
    suffix = "suffix"


#: The engines each lookahead method runs on: what their adapters render (``operator/engines/``:
#: the reference engine runs jacobi and ngram, vLLM ngram, ngram_gpu and suffix, SGLang ngram;
#: ``tests/unit/engines/test_adapter_contract.py`` checks the two agree). ``engine: auto`` takes
#: any method (the detected engine's adapter refuses one it does not run, in Pending). The one
#: source of the method/engine rule: its CEL rules and its pydantic check are both made from it.
METHOD_ENGINES: dict[LookaheadMethod, tuple[Engine, ...]] = {
    LookaheadMethod.jacobi: (Engine.reference,),
    LookaheadMethod.ngram: (Engine.vllm, Engine.sglang, Engine.reference),
    LookaheadMethod.ngram_gpu: (Engine.vllm,),
    LookaheadMethod.suffix: (Engine.vllm,),
}


def _either(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def method_engine_error(method: str, engine: str) -> Optional[str]:
    """Why ``lookahead.method`` cannot run on ``engine`` (one message per refused pair, the same in
    the CRD's rule and the model's check), or ``None`` when it can."""
    method, engine = LookaheadMethod(method), Engine(engine)
    runs_on = [e.value for e in METHOD_ENGINES[method]]
    if engine == Engine.auto or engine.value in runs_on:
        return None
    offers = [m.value for m, engines in METHOD_ENGINES.items() if engine in engines]
    return (f"lookahead.method {method.value} does not run on engine {engine.value} ({engine.value} runs "
            f"{_either(offers)}; {method.value} runs on {_either(runs_on)}): set method {_either(offers)}, "
            f"or engine {_either(runs_on + ['auto'])}")


def _method_engine_rules() -> list[dict]:
    """The CEL rules of ``METHOD_ENGINES``: one per refused (method, engine) pair, with its message."""
    return [_cel(f"!has(self.lookahead) || !has(self.lookahead.method) || !has(self.engine)"
                 f" || self.lookahead.method != '{m.value}' || self.engine != '{e.value}'",
                 method_engine_error(m, e), ".lookahead.method")
            for m in LookaheadMethod for e in Engine if method_engine_error(m, e)]


MAX_TOKENS_PER_STEP = 1024
_JACOBI_BUDGET_CEL = f"self.method != 'jacobi' || 1 + (self.window + self.guessSet) * (self.ngram - 1) <= {MAX_TOKENS_PER_STEP}"


class LookaheadConfig(ApiModel):
    """What the canary turns on. The engine adapter maps it onto the engine's flags.

    ``jacobi``: Jacobi lookahead decoding (Fu et al. 2024) with window W, n-gram size N and
    guess-set size G; it verifies ``1 + (W + G)(N - 1)`` tokens per step. The reference engine
    implements it. ``ngram``: prompt-lookup speculation (vLLM ``method: ngram``, SGLang ``NGRAM``)
    with ``numSpeculativeTokens`` drafts from n-grams of ``promptLookupMin`` to ``promptLookupMax``
    tokens; ``ngram_gpu`` and ``suffix`` are vLLM's other draft-free methods. What each engine
    version supports: ``docs/engines.md``.

    The control runs the fleet's engine as it is, its own speculation included; the canary is the
    fleet plus this. A fleet already on the same method keeps its other settings of it in the
    canary; a fleet on a different one (EAGLE-3, MTP, a draft model) is refused unless
    ``replaceExisting`` is true.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self.promptLookupMin <= self.promptLookupMax",
             "promptLookupMin must be less than or equal to promptLookupMax", ".promptLookupMin"),
        _cel(_JACOBI_BUDGET_CEL,
             f"jacobi: 1 + (window + guessSet) * (ngram - 1) tokens per step must be at most {MAX_TOKENS_PER_STEP}",
             ".window"),
    ]})

    method: LookaheadMethod = Field(default=LookaheadMethod.jacobi, description="jacobi (W, N, G), ngram (prompt lookup), ngram_gpu (vLLM 0.18+) or suffix (vLLM 0.11.1+, needs arctic-inference in the image).")
    window: int = Field(default=7, ge=1, le=64, description="jacobi: W, the lookahead window (future positions).")
    ngram: int = Field(default=5, ge=2, le=16, description="jacobi: N, the n-gram size (N-1 past Jacobi iterations kept).")
    guess_set: int = Field(default=7, ge=0, le=64, description="jacobi: G, the most pool n-grams verified per step.")
    num_speculative_tokens: int = Field(default=4, ge=1, le=32, description="ngram: K, draft tokens proposed per step.")
    prompt_lookup_min: int = Field(default=2, ge=1, le=32, description="ngram: shortest n-gram matched in the context.")
    prompt_lookup_max: int = Field(default=5, ge=1, le=32, description="ngram: longest n-gram matched in the context.")
    prompt_lookup_tokens: int = Field(
        default=0, ge=0, le=64,
        description="jacobi: also verify a draft of up to this many tokens copied from the prompt each step, and "
                    "skip the Jacobi window on steps that have one (0: off). Pays on CPUs and for code, where "
                    "output repeats the input.")
    engine_version: str | None = Field(
        default=None, max_length=64, pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-.+_a-zA-Z0-9]*)$",
        description="The engine's version (e.g. 0.11.0), your statement: taken when the running engine's own "
                    "version (vLLM /version, SGLang /server_info, read from a ready fleet pod) cannot be read, "
                    "and a contradiction (version-gated features refused) when it says another release. The "
                    "image tag alone is not proof (docs/engines.md).")
    replace_existing: bool = Field(
        default=False,
        description="The fleet already runs a different speculative method (e.g. vLLM EAGLE-3, SGLang NEXTN): "
                    "true compares it with this method (the control keeps the fleet's, the canary runs this one, "
                    "a promotion replaces it); false (the default) refuses such a fleet with a condition naming "
                    "its method. A fleet on this same method keeps its other settings of it either way.")

    @model_validator(mode="after")
    def _cross_field(self) -> "LookaheadConfig":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"promptLookupMin ({self.prompt_lookup_min}) must be less than or equal to "
                             f"promptLookupMax ({self.prompt_lookup_max})")
        if self.method == "jacobi" and self.tokens_per_step > MAX_TOKENS_PER_STEP:
            raise ValueError(f"jacobi: 1 + (window + guessSet) * (ngram - 1) = {self.tokens_per_step} tokens per "
                             f"step must be at most {MAX_TOKENS_PER_STEP}")
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens one lookahead step verifies (jacobi) or proposes plus the bonus token (ngram)."""
        if self.method == "jacobi":
            return 1 + (self.window + self.guess_set) * (self.ngram - 1)
        return 1 + self.num_speculative_tokens


class CanaryCapacity(StrEnum):
    """Where the canary's and the control's accelerators come from."""

    surge = "surge"
    carve_out = "carveOut"


class CanarySpec(ApiModel):
    """The canary (lookahead on); an equal control (lookahead off) is launched beside it."""

    replicas: int = Field(default=1, ge=1, le=64, description="Replicas of the canary, and of the control.")
    # surge by default: it never takes a serving pod from the fleet's users, and a full pool is
    # said within a minute (CapacityAvailable False, the scheduler's reason) naming carveOut.
    capacity: CanaryCapacity = Field(
        default=CanaryCapacity.surge,
        description="surge: canary and control are created beside the fleet and need free capacity (GPUs) for "
                    "2 x replicas pods. carveOut: the fleet's Deployment the roles are cloned from is scaled down by "
                    "2 x replicas first (saved on it) and gets them back exactly on every exit, so a full GPU pool "
                    "needs no spare accelerator; it must keep at least one serving pod.")


# --------------------------------------------------------------------------------------------
# spec: load


class LoadMode(StrEnum):
    sweep = "sweep"
    live = "live"


class BuiltinPrompts(StrEnum):
    chat = "chat"
    code = "code"
    summarize = "summarize"


#: An object's name (a DNS subdomain: a ConfigMap, a Secret, a priority class) and a key of a
#: ConfigMap's or Secret's data, as Kubernetes allows: [-._a-zA-Z0-9]+, not '.' and not starting
#: with '..' (validation.IsConfigMapKey: a mounted key is a file name).
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
_DATA_KEY_DOTS = "a key cannot be '.' or start with '..'"


def _not_dots(v: str) -> str:
    if v == "." or v.startswith(".."):
        raise ValueError(_DATA_KEY_DOTS)
    return v


DataKey = Annotated[str, Field(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN,
                               description="The key: letters, digits, '-', '_' and '.', not '.' and not starting "
                                           "with '..'.",
                               json_schema_extra={"x-kubernetes-validations": [
                                   _cel("self != '.' && !self.startsWith('..')", _DATA_KEY_DOTS)]}),
                    AfterValidator(_not_dots)]


class ObjectKeyRef(ApiModel):
    """One key of a ConfigMap or Secret in the policy's namespace (Kubernetes' ConfigMapKeySelector
    and SecretKeySelector): what every reference to a key in the API is made of."""

    name: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN, description="The object's name.")
    key: DataKey


class ConfigMapKeyRef(ObjectKeyRef):
    """A key of a ConfigMap in the target's namespace: JSON lines ``{"prompt": ..., "max_tokens": ...}``."""

    key: DataKey = "prompts.jsonl"


class PromptSource(ApiModel):
    """Exactly one of ``builtin`` (a bundled set) or ``configMapRef`` (the team's own prompts)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("has(self.builtin) != has(self.configMapRef)",
             "prompts: set exactly one of builtin or configMapRef"),
    ]})

    builtin: Optional[BuiltinPrompts] = Field(default=None, description="A bundled prompt set: chat, code or summarize.")
    config_map_ref: Optional[ConfigMapKeyRef] = Field(default=None, description="A ConfigMap holding JSON-lines prompts.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "PromptSource":
        if (self.builtin is None) == (self.config_map_ref is None):
            raise ValueError("prompts: set exactly one of builtin or configMapRef")
        return self


_RESOURCE_MAP_CEL = {"x-kubernetes-validations": [
    _cel(f"self.all(k, k.matches('{RESOURCE_NAME_PATTERN}'))", "resource names are like cpu, memory or nvidia.com/gpu"),
    _cel("self.all(k, isQuantity(string(self[k])) && !quantity(string(self[k])).isLessThan(quantity('0')))",
         "quantities are like 250m, 256Mi or 1, and not negative"),
]}


class LoadResources(ApiModel):
    """The load generator Pods' resources (a container's ``resources``). The defaults fit one
    closed-loop generator of up to a few hundred requests in flight; on a small node, lower the
    CPU request so that both roles' generators schedule at once (they run side by side)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) "
             "|| !isQuantity(string(self.requests[k])) || !isQuantity(string(self.limits[k])) "
             "|| quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
             "a request cannot be above its limit", ".requests"),
    ]})

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: dict(DEFAULT_LOAD_REQUESTS), description="Requested resources.",
        json_schema_extra={"default": DEFAULT_LOAD_REQUESTS, "maxProperties": 16, **_RESOURCE_MAP_CEL})
    limits: dict[str, Quantity] = Field(
        default_factory=lambda: dict(DEFAULT_LOAD_LIMITS), description="Resource limits.",
        json_schema_extra={"default": DEFAULT_LOAD_LIMITS, "maxProperties": 16, **_RESOURCE_MAP_CEL})

    @field_validator("requests", "limits")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not re.fullmatch(RESOURCE_NAME_PATTERN, name):
                raise ValueError(f"{name!r} is not a resource name (like cpu, memory or nvidia.com/gpu)")
        return v

    @model_validator(mode="after")
    def _requests_within_limits(self) -> "LoadResources":
        for name in sorted(self.requests.keys() & self.limits.keys()):
            if parse_quantity(self.requests[name]) > parse_quantity(self.limits[name]):
                raise ValueError(f"requests.{name} ({self.requests[name]}) is above "
                                 f"limits.{name} ({self.limits[name]})")
        return self

    def as_container(self) -> dict[str, dict[str, str]]:
        return {k: dict(v) for k, v in (("requests", self.requests), ("limits", self.limits)) if v}


# An image reference has no whitespace; a blank one would leave the load Jobs unable to start.
_IMAGE_BLANK = "an image reference has no blanks or whitespace (leave loadgenImage out for the operator's own image)"


class TolerationOperator(StrEnum):
    Exists = "Exists"
    Equal = "Equal"


class TaintEffect(StrEnum):
    NoSchedule = "NoSchedule"
    PreferNoSchedule = "PreferNoSchedule"
    NoExecute = "NoExecute"


class Toleration(ApiModel):
    """A pod toleration, as in Kubernetes (``key`` empty with ``Exists``: every taint)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
             "a toleration with operator Exists has no value", ".value"),
    ]})

    key: Optional[str] = Field(default=None, max_length=317, pattern=r"^$|" + LABEL_KEY_PATTERN,
                               description="The taint key; empty (with operator Exists) matches every key.")
    operator: Optional[TolerationOperator] = Field(default=None, description="Exists or Equal (the default).")
    value: Optional[LabelValue] = Field(default=None, description="The taint value, for operator Equal.")
    effect: Optional[TaintEffect] = Field(default=None, description="NoSchedule, PreferNoSchedule or NoExecute; "
                                                                    "empty: every effect.")
    toleration_seconds: Optional[int] = Field(default=None, ge=0, le=86400 * 365,
                                              description="For NoExecute: how long the pod stays once tainted.")

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> "Toleration":
        if self.operator == TolerationOperator.Exists and self.value:
            raise ValueError("a toleration with operator Exists has no value")
        return self


class LocalObjectName(ApiModel):
    """A reference by name to an object in the policy's namespace (an image pull Secret)."""

    name: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN)


#: The load generator pod spec's fields a policy (and the operator's defaults) may set.
LOAD_POD_FIELDS = ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets")


# --------------------------------------------------------------------------------------------
# spec: load, live mode's split


class LoadSplit(StrEnum):
    """How live mode gives canary and control their share of the fleet's traffic."""

    service = "service"
    gateway_api = "gatewayAPI"


class BackendKind(StrEnum):
    """What a Gateway API backendRef of the fleet (and of an arm) is: a core Service, or an
    Inference Extension ``InferencePool`` (group ``inference.networking.k8s.io``, v1)."""

    Service = "Service"
    InferencePool = "InferencePool"


#: The API group of each backend kind, as an HTTPRoute's backendRef spells it ("" is the core group).
BACKEND_GROUPS: dict[BackendKind, str] = {BackendKind.Service: "", BackendKind.InferencePool: "inference.networking.k8s.io"}
#: Gateway API's SectionName (an HTTPRoute rule's ``name``).
SECTION_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: An HTTPRoute holds at most this many rules (Gateway API's MaxItems).
MAX_ROUTE_RULES = 16


class HTTPRouteRef(ApiModel):
    """The user's HTTPRoute (``gateway.networking.k8s.io/v1``) whose rule the operator re-weights."""

    name: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN, description="The HTTPRoute's name.")
    namespace: Optional[str] = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN,
                                     description="Its namespace; default: the policy's.")


class FleetBackendRef(ApiModel):
    """The fleet's backendRef in the route's rule, as the rule names it (matched on kind, name,
    namespace and, when given, port; the group follows from the kind)."""

    kind: BackendKind = Field(default=BackendKind.Service,
                              description="Service (core group) or InferencePool (inference.networking.k8s.io/v1).")
    name: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN, description="The backend's name.")
    namespace: Optional[str] = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN,
                                     description="The backend's namespace as the rule names it; default: the route's.")
    port: Optional[int] = Field(default=None, ge=1, le=65535,
                                description="The backendRef's port, when the rule names one (a Service's).")


class EndpointPickerFailureMode(StrEnum):
    FailClose = "FailClose"
    FailOpen = "FailOpen"


class EndpointPickerRef(ApiModel):
    """An Endpoint Picker's Service, as an InferencePool v1's ``endpointPickerRef`` names it (kind
    Service in the pool's namespace)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN,
                      description="The Endpoint Picker's Service.")
    port: int = Field(default=9002, ge=1, le=65535, description="Its Service port (the Endpoint Picker's gRPC port).")
    failure_mode: EndpointPickerFailureMode = Field(
        default=EndpointPickerFailureMode.FailClose,
        description="FailClose (the gateway drops a request the picker cannot answer) or FailOpen.")


ENDPOINT_PICKERS_DISTINCT = ("endpointPickers.canary and endpointPickers.control must name different Endpoint "
                             "Pickers (an Endpoint Picker serves one InferencePool)")


class ArmEndpointPickers(ApiModel):
    """One Endpoint Picker per arm's InferencePool: never one load-aware pool for both arms (its
    queue, KV-cache and prefix scores would route by the treatment itself)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self.canary.name != self.control.name", ENDPOINT_PICKERS_DISTINCT, ".control.name"),
    ]})

    canary: EndpointPickerRef = Field(description="The canary's pool's Endpoint Picker (deployed with pool name "
                                                  "lap-<policy>-canary).")
    control: EndpointPickerRef = Field(description="The control's pool's Endpoint Picker (pool name lap-<policy>-control).")

    @model_validator(mode="after")
    def _distinct(self) -> "ArmEndpointPickers":
        if self.canary.name == self.control.name:
            raise ValueError(ENDPOINT_PICKERS_DISTINCT)
        return self


RULE_ONE_SELECTOR = "gatewayAPI: set at most one of ruleName and ruleIndex"
PICKERS_REQUIRED = ("gatewayAPI.endpointPickers is required for InferencePool arms (armBackend InferencePool, or "
                    "armBackend left out with an InferencePool backendRef): each arm's pool needs its own Endpoint Picker")
PICKERS_UNUSED = "gatewayAPI.endpointPickers is only used with InferencePool arms"
# CEL: the arms are InferencePools (armBackend, or else the fleet's backendRef's kind)
_ARMS_ARE_POOLS_CEL = ("(has(self.armBackend) ? self.armBackend == 'InferencePool'"
                       " : (has(self.backendRef.kind) && self.backendRef.kind == 'InferencePool'))")


class GatewayAPISplit(ApiModel):
    """``split: gatewayAPI``: the operator owns one backend per arm (a Service, or an InferencePool
    with its own Endpoint Picker) and re-weights one rule of your HTTPRoute so that the canary's and
    the control's backendRefs each get ``livePercent`` of what the rule sent the fleet's backendRef,
    the fleet's weight reduced by as much (the rule's other backendRefs keep their share). The
    rule's ``backendRefs`` as they were are saved (on the route, annotation
    ``lookahead.dev/original-backend-refs``) and written back verbatim on every exit."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!(has(self.ruleName) && has(self.ruleIndex))", RULE_ONE_SELECTOR, ".ruleIndex"),
        _cel(f"!{_ARMS_ARE_POOLS_CEL} || has(self.endpointPickers)", PICKERS_REQUIRED, ".endpointPickers"),
        _cel(f"{_ARMS_ARE_POOLS_CEL} || !has(self.endpointPickers)", PICKERS_UNUSED, ".endpointPickers"),
    ]})

    http_route_ref: HTTPRouteRef = Field(description="The HTTPRoute whose rule is split.")
    rule_name: Optional[str] = Field(
        default=None, min_length=1, max_length=253, pattern=SECTION_NAME_PATTERN,
        description="The rule, by its name. Neither ruleName nor ruleIndex: the one rule holding backendRef.")
    rule_index: Optional[int] = Field(default=None, ge=0, le=MAX_ROUTE_RULES - 1,
                                      description="The rule, by its position in spec.rules (from 0).")
    backend_ref: FleetBackendRef = Field(description="The fleet's backendRef in that rule: the traffic the arms "
                                                     "take their share of.")
    arm_backend: Optional[BackendKind] = Field(
        default=None, description="What the operator creates per arm: Service or InferencePool; default: the kind "
                                  "of backendRef.")
    endpoint_pickers: Optional[ArmEndpointPickers] = Field(
        default=None, description="InferencePool arms: each arm's Endpoint Picker (you deploy them).")

    @model_validator(mode="after")
    def _cross_field(self) -> "GatewayAPISplit":
        if self.rule_name is not None and self.rule_index is not None:
            raise ValueError(RULE_ONE_SELECTOR)
        pools = self.arm_kind == BackendKind.InferencePool
        if pools and self.endpoint_pickers is None:
            raise ValueError(PICKERS_REQUIRED)
        if not pools and self.endpoint_pickers is not None:
            raise ValueError(PICKERS_UNUSED)
        return self

    @property
    def arm_kind(self) -> BackendKind:
        """What each arm's backend is: ``armBackend``, or else the fleet's backendRef's kind."""
        return self.arm_backend if self.arm_backend is not None else self.backend_ref.kind


#: load.livePercent's bounds: each arm's share above 0, both arms' together below 100%.
LIVE_PERCENT_MAX = 50.0
LIVE_PERCENT_RANGE = ("livePercent must be above 0% and below 50%: canary and control each take livePercent, and "
                      "together they must leave the fleet a share")
GATEWAY_REQUIRED = "gatewayAPI is required when split is gatewayAPI"
GATEWAY_UNUSED = "gatewayAPI is only used with mode live and split gatewayAPI"


def _pct_cel(field: str) -> str:
    """CEL: the int-or-string percent ``field`` as a double (call it once the pattern matched)."""
    return f"double(string({field}).replace('%', ''))"


class LoadSpec(ApiModel):
    """How canary and control are driven.

    ``sweep``: the operator's load generator runs closed-loop at each batch size (concurrency)
    for ``stepDuration``. ``live``: canary and control each take ``livePercent`` of the fleet's real
    traffic (required in this mode), split by ``split``: ``service`` (the arm pods join the fleet's
    Service; the share follows from replica counts; ``stepDuration`` is the least time measured,
    ``minSamplesPerStep`` the windows a stratum needs) or ``gatewayAPI`` (the weights of a rule of
    your HTTPRoute, ``gatewayAPI``: exact integer weights; the rule's backendRefs are saved on the
    route and written back verbatim on every exit).
    docs/operator.md, "Live mode".

    ``batchSizes`` omitted (or empty) means *auto*: from the fleet's own running-request
    quantiles, plus 1. (A CRD field cannot be "the string auto or a list" and stay structural
    and validated, so auto is spelled by leaving the list out; the Python model also accepts
    the string ``"auto"`` and stores it as ``None``.)
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self.mode != 'live' || has(self.livePercent)", "livePercent is required when mode is live",
             ".livePercent"),
        _cel(f"!has(self.livePercent) || !string(self.livePercent).matches(r'{PERCENT_PATTERN}')"
             f" || ({_pct_cel('self.livePercent')} > 0.0 && {_pct_cel('self.livePercent')} < {LIVE_PERCENT_MAX})",
             LIVE_PERCENT_RANGE, ".livePercent"),
        _cel("!has(self.split) || self.split != 'gatewayAPI' || has(self.gatewayAPI)", GATEWAY_REQUIRED,
             ".gatewayAPI"),
        _cel("!has(self.gatewayAPI) || (self.mode == 'live' && has(self.split) && self.split == 'gatewayAPI')",
             GATEWAY_UNUSED, ".gatewayAPI"),
        _cel(f"!{_dur_ok('self.warmup')} || !{_dur_ok('self.stepDuration')} || duration(self.warmup) < duration(self.stepDuration)",
             "warmup must be shorter than stepDuration", ".warmup"),
    ]})

    mode: LoadMode = Field(default=LoadMode.sweep, description="sweep (our load generator) or live (a share of real traffic).")
    batch_sizes: Optional[list[int]] = Field(
        default=None, max_length=MAX_BATCH_SIZES,
        description="Batch sizes (concurrent requests) to measure, strictly increasing; omit for auto.",
        json_schema_extra={
            "items": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH_SIZE},
            "x-kubernetes-validations": [
                _cel(_strictly_increasing_cel("self"), "batchSizes must be strictly increasing"),
            ],
        })
    prompts: PromptSource = Field(default_factory=lambda: PromptSource(builtin=BuiltinPrompts.chat),
                                  description="Prompts for sweep mode.",
                                  json_schema_extra={"default": {"builtin": "chat"}})
    step_duration: Duration = Field(
        default="2m", description="How long each batch size is measured; a step whose answer is still unclear "
                                  "measures on, up to its share of analysis.deadline (deadline / batch sizes) and "
                                  "the time the batch sizes before it left. Live mode: the least time measured "
                                  "before a decision.")
    warmup: Duration = Field(default="30s", description="Discarded at the start of each step.")
    min_samples_per_step: int = Field(
        default=10, ge=2, le=10000,
        description="Samples (disjoint analysis.sampleInterval windows after the warm-up) per role and metric "
                    "before a step can give a verdict. Must fit: (stepDuration - warmup) / sampleInterval >= "
                    "minSamplesPerStep.")
    live_percent: Optional[Percent] = Field(
        default=None, description="live: the share of the fleet's traffic the canary and the control each take, above "
                                  "0% and below 50%. split service: the nearest share replica counts give at or "
                                  "below it (arm replicas / all serving replicas); split gatewayAPI: exact weights.")
    split: LoadSplit = Field(
        default=LoadSplit.service,
        description="live: service (canary and control pods join the fleet's Service; their share is their part of "
                    "its ready endpoints, so only replica ratios are offered) or gatewayAPI (the weights of one rule "
                    "of your HTTPRoute: gatewayAPI).")
    gateway_api: Optional[GatewayAPISplit] = Field(
        default=None, alias="gatewayAPI",
        description="split gatewayAPI: the HTTPRoute, its rule and the fleet's backendRef the arms take their share of.")
    loadgen_image: Optional[str] = Field(
        default=None, min_length=1, max_length=MAX_IMAGE,
        description="Image of the load generator; default (left out): the operator's own.",
        json_schema_extra={"x-kubernetes-validations": [_cel(r"!self.matches(r'\s')", _IMAGE_BLANK)]})
    resources: LoadResources = Field(
        default_factory=LoadResources, description="Resources of the load generator Pods.",
        json_schema_extra={"default": {}})
    # Where the load generator Pods may run and how they pull their image. Each field left out takes
    # the operator's default (the chart's operator.loadJobs), else none.
    node_selector: Optional[dict[Annotated[str, Field(max_length=317)], LabelValue]] = Field(
        default=None, description="The load generator Pods' nodeSelector (e.g. a CPU pool beside the GPU fleet).",
        json_schema_extra={"maxProperties": MAX_LABELS, "x-kubernetes-validations": [
            _cel(f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY_PATTERN}'))",
                 "nodeSelector keys must be valid Kubernetes label keys"),
        ]})
    tolerations: Optional[list[Toleration]] = Field(
        default=None, max_length=32, description="The load generator Pods' tolerations (e.g. a tainted pool).")
    priority_class_name: Optional[str] = Field(
        default=None, min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN,
        description="The load generator Pods' priorityClassName.")
    image_pull_secrets: Optional[list[LocalObjectName]] = Field(
        default=None, max_length=16,
        description="Secrets in the policy's namespace to pull the load generator image with (a private registry).")

    @field_validator("node_selector")
    @classmethod
    def _node_selector_keys(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        for key in v or {}:
            if not re.fullmatch(LABEL_KEY_PATTERN, key):
                raise ValueError(f"nodeSelector key {key!r} is not a valid Kubernetes label key")
        return v

    def pod_options(self, defaults: dict | None = None) -> dict:
        """The load generator pod spec's nodeSelector, tolerations, priorityClassName and
        imagePullSecrets: this spec's, each field left out taken from ``defaults`` (the operator's,
        in the pod spec's own camelCase), absent when neither sets it."""
        mine = self.to_dict()
        out = {}
        for field in LOAD_POD_FIELDS:
            value = mine.get(field) if mine.get(field) is not None else (defaults or {}).get(field)
            if value:
                out[field] = value
        return out

    @field_validator("loadgen_image")
    @classmethod
    def _image(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and re.search(r"\s", v):
            raise ValueError(_IMAGE_BLANK)
        return v

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _auto(cls, v: Any) -> Any:
        if isinstance(v, str):
            if v.strip().lower() == "auto":
                return None
            raise ValueError("batchSizes must be 'auto' or a list of positive integers")
        return v

    @field_validator("batch_sizes")
    @classmethod
    def _increasing(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if not v:
            return None
        for b in v:
            if not (1 <= b <= MAX_BATCH_SIZE):
                raise ValueError(f"batchSizes: {b} is outside 1..{MAX_BATCH_SIZE}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"batchSizes must be strictly increasing, got {v}")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "LoadSpec":
        if self.mode == "live" and self.live_percent is None:
            raise ValueError("livePercent is required when mode is live")
        if self.live_percent is not None and not 0.0 < self.live_percent < LIVE_PERCENT_MAX / 100:
            raise ValueError(LIVE_PERCENT_RANGE)
        if self.split == LoadSplit.gateway_api and self.gateway_api is None:
            raise ValueError(GATEWAY_REQUIRED)
        if self.gateway_api is not None and (self.mode != LoadMode.live or self.split != LoadSplit.gateway_api):
            raise ValueError(GATEWAY_UNUSED)
        if self.warmup >= self.step_duration:
            raise ValueError(f"warmup ({_duration_out(self.warmup)}) must be shorter than stepDuration "
                             f"({_duration_out(self.step_duration)})")
        return self

    @property
    def auto_batch_sizes(self) -> bool:
        return not self.batch_sizes

    @property
    def measured_window(self) -> timedelta:
        """The part of each step that is measured: stepDuration minus the warm-up."""
        return self.step_duration - self.warmup


# --------------------------------------------------------------------------------------------
# spec: analysis and promotion


#: analysis.prometheus.headers: at most this many, names an HTTP token (RFC 9110), values one line.
MAX_PROMETHEUS_HEADERS = 16
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
HEADER_VALUE_PATTERN = r"^[\x20-\x7e]*$"
#: Headers the client sets itself, or that carry credentials (which belong in a Secret: basicAuth,
#: bearerTokenSecret), refused in analysis.prometheus.headers. Lower case.
RESERVED_HEADERS = ("authorization", "proxy-authorization", "cookie", "host", "content-length", "content-type",
                    "content-encoding", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer")


class SecretKeySelector(ObjectKeyRef):
    """One key of a Secret in the policy's namespace."""


class ConfigMapKeySelector(ObjectKeyRef):
    """One key of a ConfigMap in the policy's namespace."""


class PrometheusBasicAuth(ApiModel):
    """HTTP basic auth, both parts from Secrets in the policy's namespace (the Prometheus Operator's ``basicAuth``)."""

    username: SecretKeySelector = Field(description="The Secret key holding the user name.")
    password: SecretKeySelector = Field(description="The Secret key holding the password.")


class PrometheusCA(ApiModel):
    """A PEM CA bundle: exactly one of ``secret`` or ``configMap`` (the Prometheus Operator's ``ca``)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("has(self.secret) != has(self.configMap)",
             "analysis.prometheus.tlsConfig.ca: set exactly one of secret or configMap"),
    ]})

    secret: Optional[SecretKeySelector] = Field(default=None, description="A Secret key holding the PEM CA bundle.")
    config_map: Optional[ConfigMapKeySelector] = Field(default=None,
                                                       description="A ConfigMap key holding the PEM CA bundle.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "PrometheusCA":
        if (self.secret is None) == (self.config_map is None):
            raise ValueError("analysis.prometheus.tlsConfig.ca: set exactly one of secret or configMap")
        return self


class PrometheusTLS(ApiModel):
    """How an https Prometheus is verified: against the system's CAs, or ``ca`` alone."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!(has(self.ca) && has(self.insecureSkipVerify) && self.insecureSkipVerify)",
             "analysis.prometheus.tlsConfig: set ca or insecureSkipVerify, not both", ".insecureSkipVerify"),
    ]})

    ca: Optional[PrometheusCA] = Field(default=None, description="The CA bundle that signed Prometheus' certificate "
                                                                 "(instead of the system's CAs).")
    insecure_skip_verify: bool = Field(default=False, description="Do not verify Prometheus' certificate (testing "
                                                                  "only: anyone on the path can read the credentials).")

    @model_validator(mode="after")
    def _ca_or_skip(self) -> "PrometheusTLS":
        if self.ca is not None and self.insecure_skip_verify:
            raise ValueError("analysis.prometheus.tlsConfig: set ca or insecureSkipVerify, not both")
        return self


#: analysis.prometheus.podMonitorLabels (and the chart's podMonitor.labels): at most this many.
MAX_POD_MONITOR_LABELS = 16
#: Label keys on the PodMonitor that are the operator's own, refused in podMonitorLabels (and in the
#: chart's podMonitor.labels): every key under this prefix, and these keys.
RESERVED_LABEL_PREFIX = f"{GROUP}/"
RESERVED_LABEL_KEYS = (LABEL_MANAGED_BY,)
POD_MONITOR_LABELS_RULE = (f"label keys are Kubernetes label keys ({LABEL_KEY_RULE}), and not the operator's own "
                           f"({RESERVED_LABEL_PREFIX}*, {', '.join(RESERVED_LABEL_KEYS)})")


def pod_monitor_label_problem(key: Any, value: Any) -> Optional[str]:
    """Why ``key: value`` may not be put on a PodMonitor the operator creates: not a Kubernetes
    label, or one of the operator's own labels (refused, never silently dropped: the operator's
    selectors and cleanup rely on them). ``None`` when it may."""
    problem = label_problem(key, value)
    if problem is None and (key.startswith(RESERVED_LABEL_PREFIX) or key in RESERVED_LABEL_KEYS):
        problem = (f"label key {key!r} is the operator's own ({RESERVED_LABEL_PREFIX}* and "
                   f"{', '.join(RESERVED_LABEL_KEYS)} are set by the operator and cannot be overridden)")
    return problem


def _reserved_label_cel() -> str:
    keys = ", ".join(f"'{k}'" for k in RESERVED_LABEL_KEYS)
    return f"!k.startsWith('{RESERVED_LABEL_PREFIX}') && !(k in [{keys}])"


HeaderName = Annotated[str, Field(max_length=256)]
HeaderValue = Annotated[str, Field(max_length=1024, pattern=HEADER_VALUE_PATTERN)]
_RESERVED_CEL = "[" + ", ".join(f"'{h}'" for h in RESERVED_HEADERS) + "]"


class PrometheusSpec(ApiModel):
    """Where the operator reads metrics, and how it authenticates (Thanos, Mimir, managed Prometheus): at
    most one of ``bearerTokenSecret`` and ``basicAuth``, a CA bundle, extra headers (a tenant ID)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!(has(self.bearerTokenSecret) && has(self.basicAuth))",
             "analysis.prometheus: set at most one of bearerTokenSecret and basicAuth", ".basicAuth"),
    ]})

    url: str = Field(default="http://prometheus.monitoring:9090", max_length=MAX_URL, pattern=r"^https?://[^\s]+$",
                     description="Prometheus base URL (the operator queries /api/v1/query_range).")
    bearer_token_secret: Optional[SecretKeySelector] = Field(
        default=None, description="Send 'Authorization: Bearer <token>', the token read from this key of a Secret in "
                                  "the policy's namespace. Not with basicAuth.")
    basic_auth: Optional[PrometheusBasicAuth] = Field(
        default=None, description="HTTP basic auth from Secrets in the policy's namespace. Not with bearerTokenSecret.")
    tls_config: Optional[PrometheusTLS] = Field(
        default=None, description="How an https URL is verified (default: against the system's CAs).")
    headers: Optional[dict[HeaderName, HeaderValue]] = Field(
        default=None, max_length=MAX_PROMETHEUS_HEADERS,
        description="Extra HTTP headers sent with every query, e.g. X-Scope-OrgID: tenant-a (Mimir, Cortex, Thanos "
                    "tenancy). Not for credentials: Authorization, Cookie and the headers the client sets are refused.",
        json_schema_extra={"maxProperties": MAX_PROMETHEUS_HEADERS, "x-kubernetes-validations": [
            _cel(f"self.all(k, size(k) <= 256 && k.matches(r\"{HEADER_NAME_PATTERN}\") "
                 f"&& !(k.lowerAscii() in {_RESERVED_CEL}))",
                 "analysis.prometheus.headers: header names are HTTP tokens (letters, digits and !#$%&'*+.^_`|~-), "
                 "and not Authorization, Cookie or a header the client sets (" + ", ".join(RESERVED_HEADERS) + ")"),
        ]})

    pod_monitor_labels: Optional[dict[Annotated[str, Field(max_length=317)], LabelValue]] = Field(
        default=None, max_length=MAX_POD_MONITOR_LABELS,
        description="Labels on the PodMonitor the operator creates for this policy's canary and control (where the "
                    "Prometheus Operator's CRDs are installed), over the chart's podMonitor.labels (same key: this "
                    "value): the labels your Prometheus' podMonitorSelector picks, e.g. release: <the "
                    "kube-prometheus-stack release's name>. The operator's own labels (lookahead.dev/*, "
                    "app.kubernetes.io/managed-by) are refused. Read when the PodMonitor is created.",
        json_schema_extra={"maxProperties": MAX_POD_MONITOR_LABELS, "x-kubernetes-validations": [
            _cel(f"self.all(k, size(k) <= 317 && k.indexOf('/') <= 253 && k.matches(r'{LABEL_KEY_STRICT_PATTERN}') "
                 f"&& {_reserved_label_cel()})",
                 f"analysis.prometheus.podMonitorLabels: {POD_MONITOR_LABELS_RULE}"),
        ]})

    @field_validator("pod_monitor_labels", mode="before")
    @classmethod
    def _pod_monitor_labels(cls, v: Any) -> Any:
        for key, value in (v.items() if isinstance(v, dict) else ()):
            problem = pod_monitor_label_problem(key, value)
            if problem:
                raise ValueError(f"analysis.prometheus.podMonitorLabels: {problem}")
        return v

    @field_validator("headers")
    @classmethod
    def _header_names(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        for name in v or {}:
            if not re.fullmatch(HEADER_NAME_PATTERN, name) or name.lower() in RESERVED_HEADERS:
                raise ValueError("analysis.prometheus.headers: header names are HTTP tokens (letters, digits and "
                                 "!#$%&'*+.^_`|~-), and not Authorization, Cookie or a header the client sets ("
                                 + ", ".join(RESERVED_HEADERS) + ")")
        return v or None

    @model_validator(mode="after")
    def _one_auth(self) -> "PrometheusSpec":
        if self.bearer_token_secret is not None and self.basic_auth is not None:
            raise ValueError("analysis.prometheus: set at most one of bearerTokenSecret and basicAuth")
        return self


#: analysis.abort's cadence bounds: the abort has to come within a minute of the first error.
ABORT_CHECK_MIN = timedelta(seconds=1)
ABORT_CHECK_MAX = timedelta(minutes=1)
ABORT_WINDOW_MAX = timedelta(minutes=10)
ABORT_CHECK_RANGE = "checkInterval must be between 1s and 1m (the abort has to come within a minute)"
ABORT_WINDOW_RANGE = "window must be at least checkInterval and at most 10m"
ABORT_ERRORS_ABOVE_ZERO = "maxErrorRateIncrease must be above 0% (at 0% any excess failed request aborts, noise included)"
#: analysis.abort's latency thresholds: a rise below this is within one window's noise.
ABORT_MIN_RISE = 0.10
ABORT_TTFT_FLOOR = "maxTtftRegression must be at least 10% (one window's mean is noisier than that)"
ABORT_TOKEN_FLOOR = "maxTokenLatencyRegression must be at least 10% (one window's mean is noisier than that)"
ABORT_WINDOW_SAMPLES = "abort.window must be at least sampleInterval (Prometheus has to scrape within it)"
#: analysis.abort.maxBlind's bounds: longer than one check and a scrape, short enough to protect users.
ABORT_BLIND_MIN = timedelta(seconds=30)
ABORT_BLIND_MAX = timedelta(minutes=30)
ABORT_BLIND_RANGE = (f"maxBlind must be at least {_duration_out(ABORT_BLIND_MIN)} and checkInterval, and at most "
                     f"{_duration_out(ABORT_BLIND_MAX)}")


class AbortSpec(ApiModel):
    """Live mode's safety abort: checked every ``checkInterval`` on the last ``window`` of both arms'
    traffic. The canary is aborted (its share sent back to the fleet at once, a condition and an
    Event saying why, RolledBack without touching the fleet) when, over that window:

    * its share of failed requests exceeds the control's by more than ``maxErrorRateIncrease``
      (percentage points), once it served ``minRequests`` requests or failed ``minErrors`` of them
      (so one failed request alone never aborts, three failed of three do);
    * its mean time to first token is above the control's by more than ``maxTtftRegression``
      (200% = three times), both arms having served ``minRequests``;
    * its mean per-token latency is above the control's by more than ``maxTokenLatencyRegression``
      (100% = twice), both arms having served ``minRequests``.

    The abort also ends a canary it cannot watch: when it has not seen both arms' metrics (Prometheus
    unreachable, or not scraping an arm's pods) for ``maxBlind`` while they serve users (AbortBlind).

    No confidence interval: these are tripwires for a canary that hurts users, far beyond what the
    decision measures, and they act within seconds. Used by ``load.mode: live``.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel(f"!{_dur_ok('self.checkInterval')} || (duration(self.checkInterval) >= duration('1s')"
             " && duration(self.checkInterval) <= duration('1m'))", ABORT_CHECK_RANGE, ".checkInterval"),
        _cel(f"!{_dur_ok('self.window')} || !{_dur_ok('self.checkInterval')}"
             " || (duration(self.window) >= duration(self.checkInterval) && duration(self.window) <= duration('10m'))",
             ABORT_WINDOW_RANGE, ".window"),
        _cel(f"!has(self.maxErrorRateIncrease) || !string(self.maxErrorRateIncrease).matches(r'{PERCENT_PATTERN}')"
             f" || {_pct_cel('self.maxErrorRateIncrease')} > 0.0", ABORT_ERRORS_ABOVE_ZERO, ".maxErrorRateIncrease"),
        _cel(f"!has(self.maxTtftRegression) || !string(self.maxTtftRegression).matches(r'{TAIL_PERCENT_PATTERN}')"
             f" || {_pct_cel('self.maxTtftRegression')} >= {ABORT_MIN_RISE * 100}", ABORT_TTFT_FLOOR,
             ".maxTtftRegression"),
        _cel(f"!has(self.maxTokenLatencyRegression)"
             f" || !string(self.maxTokenLatencyRegression).matches(r'{TAIL_PERCENT_PATTERN}')"
             f" || {_pct_cel('self.maxTokenLatencyRegression')} >= {ABORT_MIN_RISE * 100}", ABORT_TOKEN_FLOOR,
             ".maxTokenLatencyRegression"),
        _cel(f"!{_dur_ok('self.maxBlind')} || !{_dur_ok('self.checkInterval')}"
             f" || (duration(self.maxBlind) >= duration('{_duration_out(ABORT_BLIND_MIN)}')"
             " && duration(self.maxBlind) >= duration(self.checkInterval)"
             f" && duration(self.maxBlind) <= duration('{_duration_out(ABORT_BLIND_MAX)}'))", ABORT_BLIND_RANGE,
             ".maxBlind"),
    ]})

    check_interval: Duration = Field(
        default="10s", description="How often the abort rule is checked, 1s to 1m. With the defaults a canary that "
                                   "fails every request is aborted within about 35s of its first error at one request "
                                   "every 10s (two more failures, one Prometheus scrape, one check), sooner with more "
                                   "traffic.")
    window: Duration = Field(
        default="1m", description="How much of the arms' recent traffic each check reads: at least checkInterval "
                                  "and analysis.sampleInterval, at most 10m. Longer lets a canary with little traffic "
                                  "reach minErrors; the check still runs every checkInterval.")
    max_error_rate_increase: Percent = Field(
        default="5%", description="Largest rise of the canary's share of failed requests over the control's, in "
                                  "percentage points, above 0%; 100% never aborts on errors.")
    min_requests: int = Field(
        default=20, ge=1, le=100000,
        description="Requests an arm must have served in the window before its error rate or its latencies are "
                    "compared (the error check also fires on minErrors failed requests).")
    min_errors: int = Field(
        default=3, ge=1, le=10000,
        description="Failed canary requests in the window that are enough for the error check below minRequests: "
                    "one failed request never aborts by default, three failed of three do.")
    max_ttft_regression: RisePercent = Field(
        default="200%", description="Largest rise of the canary's mean time to first token over the control's: "
                                    "200% = three times; at least 10%.")
    max_token_latency_regression: RisePercent = Field(
        default="100%", description="Largest rise of the canary's mean per-token latency over the control's: "
                                    "100% = twice; at least 10%.")
    max_blind: Duration = Field(
        default="2m", description="Longest time the canary keeps serving users while the abort cannot see both arms "
                                  "(Prometheus unreachable, or not scraping an arm's pods): past it the canary's share "
                                  "is removed and the policy ends RolledBack (AbortBlind), the fleet untouched. 30s to "
                                  "30m, at least checkInterval.")

    @model_validator(mode="after")
    def _sane(self) -> "AbortSpec":
        if not ABORT_CHECK_MIN <= self.check_interval <= ABORT_CHECK_MAX:
            raise ValueError(ABORT_CHECK_RANGE)
        if not self.check_interval <= self.window <= ABORT_WINDOW_MAX:
            raise ValueError(ABORT_WINDOW_RANGE)
        if self.max_error_rate_increase <= 0.0:
            raise ValueError(ABORT_ERRORS_ABOVE_ZERO)
        if self.max_ttft_regression < ABORT_MIN_RISE - 1e-12:
            raise ValueError(ABORT_TTFT_FLOOR)
        if self.max_token_latency_regression < ABORT_MIN_RISE - 1e-12:
            raise ValueError(ABORT_TOKEN_FLOOR)
        if not (max(ABORT_BLIND_MIN, self.check_interval) <= self.max_blind <= ABORT_BLIND_MAX):
            raise ValueError(ABORT_BLIND_RANGE)
        return self


#: analysis.deadline when the policy leaves it out: a sweep drives every load level in turn; live
#: traffic visits them when its users do (docs/benchmarks/decision.md, "Live streams", measured
#: what 30m misses there).
DEFAULT_DEADLINE = timedelta(minutes=30)
DEFAULT_LIVE_DEADLINE = timedelta(hours=1)
#: The same as CEL: the deadline a rule compares, written or defaulted.
_DEADLINE_OF = ("(has(self.analysis.deadline) ? duration(self.analysis.deadline)"
                f" : (has(self.load.mode) && self.load.mode == 'live' ? duration('{_duration_out(DEFAULT_LIVE_DEADLINE)}')"
                f" : duration('{_duration_out(DEFAULT_DEADLINE)}')))")


class AnalysisSpec(ApiModel):
    """The decision rule: per batch size, per-token latency (TPOT) and throughput, canary vs control,
    with anytime-valid confidence intervals at ``confidence``; no data means wait, up to ``deadline``."""

    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, json_schema_extra=_obj_default(PrometheusSpec))
    max_throughput_regression: Percent = Field(
        default="2%", description="Largest batched-throughput drop tolerated at a batch size where lookahead stays on.")
    min_latency_improvement: Percent = Field(
        default="5%", description="Smallest per-token latency gain worth turning lookahead on for.")
    max_tail_latency_regression: RisePercent = Field(
        default="100%",
        description="Largest rise of the canary's p95 and p99 per-token latency over the control's (from the "
                    "per-token histogram's buckets) tolerated at a batch size where lookahead stays on; a rise "
                    "beyond it, with confidence, vetoes that batch size. 100% = at most twice the control's "
                    "(about one bucket step of vLLM's latency buckets; docs/statistics.md says why).")
    confidence: float = Field(default=0.99, gt=0.5, lt=1.0,
                              description="Confidence of the intervals behind each verdict, in (0.5, 1).")
    deadline: Optional[Duration] = Field(
        default=None, description="Give up (never promote) if undecided by then. Default 30m; 1h with load.mode live, "
                                  "whose traffic visits a load level when its users send it, not when a sweep drives "
                                  "it (a live measurement still decides as soon as every load it saw has an answer).")
    sample_interval: Duration = Field(
        default="5s", description="Length of one sample window (per-token latency and throughput are read per "
                                  "disjoint window); at least Prometheus' scrape interval.")
    abort: AbortSpec = Field(
        default_factory=AbortSpec, json_schema_extra=_obj_default(AbortSpec),
        description="Live mode's safety abort: the canary's errors, time to first token and per-token latency far "
                    "beyond the control's send its share back to the fleet and roll back.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.minLatencyImprovement) || double(string(self.minLatencyImprovement).replace('%', '')) < 100.0",
             "minLatencyImprovement must be below 100% (a 100% faster token would take no time)",
             ".minLatencyImprovement"),
        _cel("!has(self.maxThroughputRegression) || double(string(self.maxThroughputRegression).replace('%', '')) < 100.0",
             "maxThroughputRegression must be below 100%", ".maxThroughputRegression"),
        _cel(f"!{_dur_ok('self.sampleInterval')} || duration(self.sampleInterval) >= duration('1s')",
             "sampleInterval must be at least 1s", ".sampleInterval"),
        _cel(f"!has(self.abort) || !{_dur_ok('self.abort.window')} || !{_dur_ok('self.sampleInterval')}"
             " || duration(self.abort.window) >= duration(self.sampleInterval)", ABORT_WINDOW_SAMPLES, ".abort.window"),
    ]})

    @model_serializer(mode="wrap")
    def _wire(self, handler):
        """``deadline`` only where the policy wrote it: a defaulted one depends on the mode, which the
        apiserver cannot default by, so it stores none (``LookaheadPolicySpec`` fills it in)."""
        out = handler(self)
        if "deadline" not in self.model_fields_set:
            out.pop("deadline", None)
        return out

    @model_validator(mode="after")
    def _winnable(self) -> "AnalysisSpec":
        if self.min_latency_improvement >= 1.0:
            raise ValueError("minLatencyImprovement must be below 100% (a 100% faster token would take no time)")
        if self.max_throughput_regression >= 1.0:
            raise ValueError("maxThroughputRegression must be below 100%")
        if self.sample_interval < timedelta(seconds=1):
            raise ValueError("sampleInterval must be at least 1s")
        if self.abort.window < self.sample_interval:
            raise ValueError(ABORT_WINDOW_SAMPLES)
        return self


class PromotionMode(StrEnum):
    full = "full"
    regimeAware = "regimeAware"
    analysisOnly = "analysisOnly"


class GuardSpec(ApiModel):
    """After the last wave: keep comparing promoted and unpromoted (or control) for ``duration``."""

    duration: Duration = Field(default="10m", description="How long the guard watches after the last wave.")
    max_throughput_regression: Optional[Percent] = Field(
        default=None, description="Throughput drop that triggers rollback; default: analysis.maxThroughputRegression.")
    min_detectable_regression: Percent = Field(
        default="20%", description="The throughput loss at the fleet's load a passing guard has ruled out: a wave "
                                   "(and the final guard) passes only once the guard's confidence interval excludes "
                                   "a loss this large; until then it keeps watching, up to analysis.deadline, then "
                                   "rolls back (GuardNoData). Must be above the tolerated maxThroughputRegression.")
    max_ttft_regression: RisePercent = Field(
        default="50%", description="Largest rise of the promoted pods' p95 time to first token over the baseline's "
                                   "(production traffic) before a rollback, with confidence; 50% = at most 1.5x.")
    max_error_rate_increase: Percent = Field(
        default="1%", description="Largest rise of the promoted pods' share of failed requests (the engine's "
                                  "request_success_total by finished_reason: abort) over the baseline's, in "
                                  "percentage points (production traffic), before a rollback, with confidence.")


_WAVE_INT = "int(string(w).replace('%', ''))"

#: promotion.rolloutDeadline when unset, unless the fleet's own readiness allows longer
#: (``statemachine.clocks.launch_deadline`` and ``rollout_deadline``).
DEFAULT_ROLLOUT_DEADLINE = timedelta(minutes=10)


class PromotionSpec(ApiModel):
    """How a winning config reaches the fleet.

    ``full``: lookahead on at every batch size. ``regimeAware``: on only up to the crossover batch
    size (vLLM ``num_speculative_tokens_per_batch_size``, reference ``--lookahead-max-batch-size``).
    ``analysisOnly``: measure and decide, never touch the fleet. ``waves`` are cumulative shares
    of the fleet's serving pods, across its Deployments (``builders.wave_pods``); each wave soaks for ``waveDuration`` under the guard before the next.
    """

    mode: PromotionMode = Field(default=PromotionMode.regimeAware, description="full, regimeAware or analysisOnly.")
    waves: list[WavePercent] = Field(
        default_factory=lambda: ["10%", "50%", "100%"], min_length=1, max_length=MAX_WAVES,
        description="Cumulative share of the fleet's serving pods (across its Deployments) per wave, strictly "
                    "increasing, ending at 100%.",
        json_schema_extra={
            "default": ["10%", "50%", "100%"],
            "x-kubernetes-validations": [
                _cel(_strictly_increasing_cel(f"self.map(w, {_WAVE_INT})"), "waves must be strictly increasing"),
                _cel("int(string(self[size(self) - 1]).replace('%', '')) == 100", "the last wave must be 100%"),
            ],
        })
    wave_duration: Duration = Field(default="5m", description="How long each wave is guarded before the next one starts.")
    guard: GuardSpec = Field(default_factory=GuardSpec, json_schema_extra=_obj_default(GuardSpec))
    require_approval: bool = Field(
        default=False, description="Wait for `kubectl lookahead approve` (annotation lookahead.dev/approve) before the first wave.")

    rollout_deadline: Optional[Duration] = Field(
        default=None, description="How long a promoted Deployment may take to become available (and the canary "
                                  "and control to become ready) before the policy rolls back (Launching: fails). "
                                  "Unset: the largest of 10m and what the fleet's own readiness allows (the engine "
                                  "container's startupProbe, else its readiness and liveness probes; the "
                                  "Deployment's progressDeadlineSeconds; 1.5x the load time of its current pods).")

    @field_validator("waves")
    @classmethod
    def _waves(cls, v: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"waves must be strictly increasing, got {[f'{w}%' for w in v]}")
        if v[-1] != 100:
            raise ValueError(f"the last wave must be 100%, got '{v[-1]}%'")
        return v


# --------------------------------------------------------------------------------------------
# spec


_DEADLINE_OK = f"(!has(self.analysis.deadline) || {_dur_ok('self.analysis.deadline')})"
_DEADLINE_CEL = (f"!has(self.analysis) || !has(self.load) || !{_DEADLINE_OK}"
                 f" || !{_dur_ok('self.load.stepDuration')}"
                 f" || {_DEADLINE_OF} >= duration(self.load.stepDuration)")
_SAMPLES_FIT_CEL = (f"!has(self.load) || !has(self.analysis) || !{_dur_ok('self.load.stepDuration')}"
                    f" || !{_dur_ok('self.load.warmup')} || !{_dur_ok('self.analysis.sampleInterval')}"
                    " || !has(self.load.minSamplesPerStep)"
                    " || (duration(self.load.stepDuration) - duration(self.load.warmup)).getMilliseconds()"
                    " >= self.load.minSamplesPerStep * duration(self.analysis.sampleInterval).getMilliseconds()")
_SWEEP_FITS_CEL = (f"!has(self.load) || !has(self.analysis) || !has(self.load.batchSizes)"
                   f" || !{_dur_ok('self.load.stepDuration')} || !{_DEADLINE_OK}"
                   f" || {_DEADLINE_OF}.getSeconds()"
                   " >= size(self.load.batchSizes) * duration(self.load.stepDuration).getSeconds()")


_GUARD_G = "self.promotion.guard"
# the loss the guard tolerates: the guard's own maxThroughputRegression, or else the analysis's
_GUARD_TOL = (f"(has({_GUARD_G}.maxThroughputRegression) ? string({_GUARD_G}.maxThroughputRegression)"
              " : string(self.analysis.maxThroughputRegression))")
_GUARD_POWER_CEL = (f"!has(self.promotion) || !has({_GUARD_G}) || !has({_GUARD_G}.minDetectableRegression)"
                    f" || (!has({_GUARD_G}.maxThroughputRegression)"
                    " && (!has(self.analysis) || !has(self.analysis.maxThroughputRegression)))"
                    f" || !string({_GUARD_G}.minDetectableRegression).matches(r'{PERCENT_PATTERN}')"
                    f" || !{_GUARD_TOL}.matches(r'{PERCENT_PATTERN}')"
                    f" || double(string({_GUARD_G}.minDetectableRegression).replace('%', ''))"
                    f" > double({_GUARD_TOL}.replace('%', ''))")


class LookaheadPolicySpec(ApiModel):
    """A LookaheadPolicy: measure lookahead on a fleet, decide, and roll it out where it pays."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        *_method_engine_rules(),
        _cel(_DEADLINE_CEL, "analysis.deadline must be at least load.stepDuration", ".analysis.deadline"),
        _cel(_SAMPLES_FIT_CEL,
             "a step cannot yield load.minSamplesPerStep samples: (load.stepDuration - load.warmup) / "
             "analysis.sampleInterval must be at least load.minSamplesPerStep", ".load.minSamplesPerStep"),
        _cel(_SWEEP_FITS_CEL,
             "analysis.deadline must leave room for every batch size: at least size(load.batchSizes) * "
             "load.stepDuration", ".analysis.deadline"),
        _cel(_GUARD_POWER_CEL,
             "promotion.guard.minDetectableRegression must be above the throughput regression the guard tolerates "
             "(promotion.guard.maxThroughputRegression, or else analysis.maxThroughputRegression)",
             ".promotion.guard.minDetectableRegression"),
    ]})

    targets: Targets = Field(description="The fleet of inference Deployments.")
    engine: Engine = Field(default=Engine.auto, description="auto (detected from the pod template), vllm, sglang or reference.")
    lookahead: LookaheadConfig = Field(default_factory=LookaheadConfig, json_schema_extra=_obj_default(LookaheadConfig))
    canary: CanarySpec = Field(default_factory=CanarySpec, json_schema_extra=_obj_default(CanarySpec))
    load: LoadSpec = Field(default_factory=LoadSpec, json_schema_extra=_obj_default(LoadSpec))
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec, json_schema_extra=_obj_default(AnalysisSpec))
    promotion: PromotionSpec = Field(default_factory=PromotionSpec, json_schema_extra=_obj_default(PromotionSpec))
    paused: bool = Field(default=False, description="Hold the policy where it is (no new actions) until false again.")

    @model_validator(mode="after")
    def _cross_field(self) -> "LookaheadPolicySpec":
        method_engine = method_engine_error(self.lookahead.method, self.engine)
        if method_engine:
            raise ValueError(method_engine)
        load, analysis = self.load, self.analysis
        if analysis.deadline is None:
            # the mode's default: what the operator reads; left out of the wire form as the user left it
            # out (no default is written back that the apiserver would not have stored: AnalysisSpec._wire)
            object.__setattr__(analysis, "deadline",
                               DEFAULT_LIVE_DEADLINE if load.mode == LoadMode.live else DEFAULT_DEADLINE)
        if analysis.deadline < load.step_duration:
            raise ValueError(f"analysis.deadline ({_duration_out(analysis.deadline)}) must be at least "
                             f"load.stepDuration ({_duration_out(load.step_duration)})")
        if self.samples_per_step() < load.min_samples_per_step:
            raise ValueError(
                f"a step cannot yield load.minSamplesPerStep samples: (load.stepDuration "
                f"{_duration_out(load.step_duration)} - load.warmup {_duration_out(load.warmup)}) / "
                f"analysis.sampleInterval {_duration_out(analysis.sample_interval)} = {self.samples_per_step()} "
                f"< {load.min_samples_per_step}")
        if load.batch_sizes and analysis.deadline < load.step_duration * len(load.batch_sizes):
            raise ValueError(f"analysis.deadline ({_duration_out(analysis.deadline)}) must leave room for every "
                             f"batch size: at least {len(load.batch_sizes)} x load.stepDuration "
                             f"({_duration_out(load.step_duration * len(load.batch_sizes))})")
        guard = self.promotion.guard
        tolerated = self.guard_tolerance()
        if guard.min_detectable_regression <= tolerated:
            raise ValueError(f"promotion.guard.minDetectableRegression ({guard.min_detectable_regression:.1%}) must be "
                             f"above the throughput regression the guard tolerates ({tolerated:.1%}, "
                             f"{'promotion.guard' if guard.max_throughput_regression is not None else 'analysis'}"
                             ".maxThroughputRegression)")
        return self

    def guard_tolerance(self) -> float:
        """The throughput loss the guard tolerates: ``promotion.guard.maxThroughputRegression``, or
        else ``analysis.maxThroughputRegression``."""
        g = self.promotion.guard.max_throughput_regression
        return g if g is not None else self.analysis.max_throughput_regression

    def samples_per_step(self) -> int:
        """The most samples one step yields per role and metric: whole sample windows after the warm-up."""
        return int(self.load.measured_window.total_seconds() // self.analysis.sample_interval.total_seconds())

    def fingerprint(self) -> str:
        """A hash of everything that changes what is measured or promoted.

        Leaves out ``paused`` (a gate, not a change of intent): editing the spec otherwise means
        the measurement restarts, pausing does not.
        """
        data = self.to_dict(exclude_none=True)
        data.pop("paused", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

    @classmethod
    def parse_stored(cls, raw: Any) -> tuple["LookaheadPolicySpec", list[str]]:
        """The spec as the apiserver stores it, and the dotted names (``spec.analysis.futureKnob``)
        of the fields it ignored. The apiserver prunes fields its CRD does not declare, so a field
        this model does not know comes from a newer CRD (an upgrade under way): it is ignored
        rather than failing the rollout. Anything else invalid raises ``ValidationError`` (of the
        spec without the unknown fields, when those were all that was wrong)."""
        data = dict(raw or {})
        try:
            return cls.model_validate(data), []
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not unknown or len(unknown) != len(exc.errors()):
                raise
        spec = cls.model_validate(_without(data, unknown))
        return spec, ["spec." + ".".join(str(p) for p in loc) for loc in unknown]


def _without(data: Any, paths: list[tuple]) -> Any:
    """A copy of ``data`` without the keys at ``paths`` (pydantic error locations)."""
    out = copy.deepcopy(data)
    for path in paths:
        node = out
        for part in path[:-1]:
            node = node[part]
        node.pop(path[-1], None)
    return out


def spec_error(exc: ValidationError) -> str:
    """Why a spec cannot be acted on, naming its first invalid field (``spec.analysis.confidence: ...``)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"spec{'.' + where if where else ''}: {first['msg']}"

