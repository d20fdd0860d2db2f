"""The LookaheadPolicy API (``lookahead.dev/v1alpha1``) as pydantic v2 models.

These models are the single source of truth of the CRD: ``python3 -m lookahead_dev.crdgen``
turns their JSON schema into the OpenAPI v3 structural schema in ``crds/lookaheadpolicies.yaml``
(and the chart's copy). Every cross-field rule exists twice, on purpose: as a pydantic validator
here (what the operator and the unit tests use) and as a CEL ``x-kubernetes-validations`` rule in
the CRD (what the apiserver enforces on ``kubectl apply``). Both carry the same message.

Python attribute names are snake_case; the wire (JSON/YAML) names are camelCase aliases. Both are
accepted on input (``populate_by_name``); use :meth:`ApiModel.to_dict` to get the wire form.

    spec = LookaheadPolicySpec.model_validate(body["spec"])      # what the apiserver stores
    spec.analysis.max_throughput_regression                        # 0.02 (written "2%")
    spec.load.step_duration                                        # timedelta(seconds=120)

Gates (what ``kubectl lookahead pause|resume|approve|abort`` does):

* pause / resume: ``spec.paused`` (a spec field: it is desired state, and GitOps tools can own it).
  It bumps ``metadata.generation``, so the operator must not treat a change of ``paused`` alone as
  a spec edit: compare :meth:`LookaheadPolicySpec.fingerprint`, which leaves ``paused`` out.
* approve: annotation ``lookahead.dev/approve`` whose value is the ``metadata.generation`` being
  approved (what ``lookahead_operator.runtime.handlers`` reads). An approval of an earlier generation
  does not match after a spec edit and is ignored. Needed only when
  ``spec.promotion.requireApproval``.
* abort: annotation ``lookahead.dev/abort: "true"``. The operator rolls back what it promoted
  and ends in ``RolledBack``.

Annotations do not bump ``metadata.generation``, so approving or aborting never restarts a
measurement. What the operator saw of the gates is mirrored in ``status.gates``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from kubernetes.utils import parse_quantity  # the client's own quantity parser
from pydantic.alias_generators import to_camel

from lookahead_canary import units

# --------------------------------------------------------------------------------------------
# identity of the API

from lookahead_operator.api.names import (  # noqa: F401 - re-exported: the API's names belong with its models
    DEFAULT_LOAD_LIMITS,
    DEFAULT_LOAD_REQUESTS,
    ANNOTATION_ABORT,
    ANNOTATION_APPROVE,
    API_VERSION,
    CATEGORIES,
    CRD_NAME,
    GROUP,
    KIND,
    LIST_KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)

# Limits that bound the CEL cost of the validation rules (the apiserver refuses a CRD whose
# estimated rule cost is unbounded) and keep a policy a reasonable size.
MAX_BATCH_SIZES = 32
MAX_BATCH_SIZE = 4096
MAX_WAVES = 10
MAX_LABELS = 64
MAX_EXPRESSIONS = 32
MAX_EXPRESSION_VALUES = 64
MAX_NAMESPACES = 256
MAX_STATUS_ROWS = 64
MAX_TARGETS = 1024
MAX_MESSAGE = 32768
MAX_SHORT = 1024
MAX_URL = 2048
MAX_IMAGE = 1024

# --------------------------------------------------------------------------------------------
# parsing helpers

DURATION_PATTERN = units.DURATION_PATTERN
# The CRD pattern for a percent given as a string: 0-100, up to any decimals, optional '%'.
PERCENT_PATTERN = r"^(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)%?$"
# A wave: a whole percent 1-100, as '10%' (or the integer 10).
WAVE_PATTERN = r"^(100|[1-9][0-9]?)%$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
CONDITION_TYPE_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
# Label values are at most 63 characters; the policy's name is one (lookahead.dev/policy).
MAX_POLICY_NAME = 63


def _percent_in(lo: float, hi: float):
    """Validator: a wire percentage ('2%', '2.5%', 2) -> a fraction (0.02)."""
    def check(v: Any) -> Any:
        if isinstance(v, float) and not v.is_integer():
            # The CRD field is int-or-string (a structural schema has no int-or-float-or-string),
            # so a fraction has to be written as a string.
            raise ValueError(f"a fractional percentage must be a string like '{v:g}%', got the number {v!r}")
        return units.parse_percent(v, lo=lo, hi=hi) / 100.0
    return check


def _duration_in(v: Any) -> Any:
    """Validator: a Go duration string ('2m') -> timedelta."""
    if isinstance(v, timedelta):
        return v
    if not isinstance(v, str) or not re.fullmatch(DURATION_PATTERN, v.strip()):
        raise ValueError(f"expected a duration like '90s', '2m' or '1h30m' (units ms, s, m, h), got {v!r}")
    return timedelta(seconds=units.parse_duration(v))


def _duration_out(v: timedelta) -> str:
    return units.format_duration(v.total_seconds())


def _percent_schema(description: str, lo: int = 0, hi: int = 100) -> dict:
    return {
        "x-kubernetes-int-or-string": True,
        "pattern": PERCENT_PATTERN,
        "minimum": lo,
        "maximum": hi,
        "maxLength": 16,
        "description": description,
    }


# A share: written "2%", "2.5%", "2" or the integer 2 (all mean 2 %), 0-100; held as the
# fraction 0.02; written back as "2%". Fractions only as strings on the wire.
Percent = Annotated[
    float,
    BeforeValidator(_percent_in(0, 100)),
    PlainSerializer(units.format_percent, return_type=str),
    WithJsonSchema(_percent_schema("A percentage, 0-100: '2%', '2.5%' or the integer 2 (all mean 2 %); fractions only as strings.")),
]
# A rise in percent of the control's value, 0-1000 ("100%" = at most twice the control's); held as
# the fraction 1.0. Unlike a share it may exceed 100%.
TAIL_PERCENT_PATTERN = r"^(1000(\.0+)?|[0-9]{1,3}(\.[0-9]+)?)%?$"
MAX_TAIL_PERCENT = 1000


def _rise_schema(description: str) -> dict:
    return {**_percent_schema(description, 0, MAX_TAIL_PERCENT), "pattern": TAIL_PERCENT_PATTERN}


RisePercent = Annotated[
    float,
    BeforeValidator(_percent_in(0, MAX_TAIL_PERCENT)),
    PlainSerializer(units.format_percent, return_type=str),
    WithJsonSchema(_rise_schema(f"A rise relative to the control, 0-{MAX_TAIL_PERCENT}%: '100%' (at most twice the "
                                "control's), '50%' or the integer 100; fractions only as strings.")),
]
# A wave size: a whole percent of the fleet, "10%" or 10, 1-100; held as the int 10.
WavePercent = Annotated[
    int,
    BeforeValidator(lambda v: v if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 100
                    else _wave_value(v)),
    PlainSerializer(lambda v: f"{v}%", return_type=str),
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "pattern": WAVE_PATTERN,
        "minimum": 1,
        "maximum": 100,
        "maxLength": 4,
        "description": "Cumulative share of the fleet promoted by the end of this wave: '10%' or 10.",
    }),
]
# A Go duration on the wire ("2m"), a timedelta in Python.
Duration = Annotated[
    timedelta,
    BeforeValidator(_duration_in),
    PlainSerializer(_duration_out, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "maxLength": 32,
                    "description": "A Go duration: '90s', '2m', '1h30m'."}),
]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def _wave_value(w: Union[int, str]) -> int:
    pct = units.parse_percent(w, lo=1, hi=100)
    if not float(pct).is_integer():
        raise ValueError(f"a wave is a whole percent of the fleet, got {w!r}")
    return int(pct)


def _cel(rule: str, message: str, field_path: Optional[str] = None, reason: Optional[str] = None) -> dict:
    out: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def _dur_ok(field: str) -> str:
    """CEL: ``field`` is present and a well-formed duration (so ``duration()`` cannot fail on it;
    a malformed one is reported once, by the pattern)."""
    obj, _, name = field.rpartition(".")
    return f"(has({obj}.{name}) && {field}.matches(r'{DURATION_PATTERN}'))"


def _obj_default(model: type) -> dict:
    """``json_schema_extra`` putting the model's defaults, in full, as the CRD default of an object field.

    (A bare ``default: {}`` is not enough: the apiserver checks a default against the CEL rules
    before the nested defaults fill it in.)
    """
    return {"default": model().to_dict()}


def _strictly_increasing_cel(items: str) -> str:
    """CEL: the int list expression ``items`` is strictly increasing (sorted and no repeats)."""
    return f"{items}.isSorted() && {items}.all(x, {items}.indexOf(x) == {items}.lastIndexOf(x))"


# --------------------------------------------------------------------------------------------
# base


class ApiModel(BaseModel):
    """Base of every API model: camelCase wire names, snake_case attributes.

    Enum fields always hold the ``StrEnum`` member (so ``spec.engine == "vllm"``,
    ``f"{spec.engine}"`` and ``spec.engine.value`` all work, whether the value came from YAML or
    from a default).
    """

    # validate_default: defaults are written as on the wire ("2m", "5%") and parsed like user input.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True)

    def to_dict(self, *, exclude_none: bool = True) -> dict[str, Any]:
        """The wire (camelCase JSON) form, ready for a patch body."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=exclude_none)


class StatusModel(ApiModel):
    """Status models ignore unknown keys (a newer operator may have written more)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", validate_default=True)


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
    trtllm = "trtllm"
    reference = "reference"


class LookaheadMethod(StrEnum):
    jacobi = "jacobi"
    ngram = "ngram"
    ngram_gpu = "ngram_gpu"
    suffix = "suffix"


MAX_TOKENS_PER_STEP = 1024
_JACOBI_BUDGET_CEL = f"self.method != 'jacobi' || 1 + (self.window + self.guessSet) * (self.ngram - 1) <= {MAX_TOKENS_PER_STEP}"


class LookaheadConfig(ApiModel):
    """What the canary turns on. The engine adapter maps it onto the engine's flags.

    ``jacobi``: Jacobi lookahead decoding (Fu et al. 2024) with window W, n-gram size N and
    guess-set size G; it verifies ``1 + (W + G)(N - 1)`` tokens per step. The reference engine
    implements it (and TensorRT-LLM's ``Lookahead`` decoding on its TensorRT backend). ``ngram``:
    prompt-lookup speculation (vLLM ``method: ngram``, SGLang ``NGRAM``, TensorRT-LLM ``NGram``)
    with ``numSpeculativeTokens`` drafts from n-grams of ``promptLookupMin`` to ``promptLookupMax``
    tokens; ``ngram_gpu`` and ``suffix`` are vLLM's other draft-free methods. What each engine
    version supports: ``docs/engines.md``.
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
        description="The engine's version (e.g. 0.11.0) when the image tag does not say it; overrides the tag. "
                    "Unset and no version in the tag: the current release is assumed (docs/engines.md).")

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

    def speculative_config(self) -> dict[str, Any]:
        """The ``--speculative-config`` JSON of the reference engine (vLLM's shape for ngram)."""
        from lookahead_operator.engines.adapters import reference_speculative_config

        return json.loads(reference_speculative_config(self))


class CanarySpec(ApiModel):
    """The canary (lookahead on); an equal control (lookahead off) is launched beside it."""

    replicas: int = Field(default=1, ge=1, le=64, description="Replicas of the canary, and of the control.")


# --------------------------------------------------------------------------------------------
# spec: load


class LoadMode(StrEnum):
    sweep = "sweep"
    live = "live"


class BuiltinPrompts(StrEnum):
    chat = "chat"
    code = "code"
    summarize = "summarize"


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the target's namespace: JSON lines ``{"prompt": ..., "max_tokens": ...}``."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                      description="ConfigMap name.")
    key: str = Field(default="prompts.jsonl", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
                     description="Key in the ConfigMap.")


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


# A Kubernetes resource quantity ("250m", "256Mi", 1): kept as the string the API server accepts.
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


def _quantity_in(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"expected a quantity like '250m' or '256Mi', got {v!r}")
    try:
        negative = parse_quantity(v) < 0
    except ValueError:
        raise ValueError(f"expected a quantity like '250m' or '256Mi', got {v!r}") from None
    if negative:
        raise ValueError(f"a resource quantity cannot be negative, got {v!r}")
    return str(v)


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_in),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "maxLength": 64,
                    "description": "A Kubernetes quantity: '250m', '256Mi', 1."}),
]
RESOURCE_NAME_PATTERN = r"^[a-zA-Z0-9]([-a-zA-Z0-9./_]{0,251}[a-zA-Z0-9])?$"
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


class LoadSpec(ApiModel):
    """How canary and control are driven.

    ``sweep``: the operator's load generator runs closed-loop at each batch size (concurrency)
    for ``stepDuration``. ``live``: canary and control join the fleet's Service and take a share
    of real traffic (``livePercent``, required in this mode).

    ``batchSizes`` omitted (or empty) means *auto*: from the fleet's own running-request
    quantiles, plus 1. (A CRD field cannot be "the string auto or a list" and stay structural
    and validated, so auto is spelled by leaving the list out; the Python model also accepts
    the string ``"auto"`` and stores it as ``None``.)
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self.mode != 'live' || has(self.livePercent)", "livePercent is required when mode is live",
             ".livePercent"),
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
                                  "the time the batch sizes before it left.")
    warmup: Duration = Field(default="30s", description="Discarded at the start of each step.")
    min_samples_per_step: int = Field(
        default=10, ge=2, le=10000,
        description="Samples (disjoint analysis.sampleInterval windows after the warm-up) per role and metric "
                    "before a step can give a verdict. Must fit: (stepDuration - warmup) / sampleInterval >= "
                    "minSamplesPerStep.")
    live_percent: Optional[Percent] = Field(
        default=None, description="live: share of the Service's traffic the canary and the control each take.")
    loadgen_image: Optional[str] = Field(default=None, min_length=1, max_length=MAX_IMAGE,
                                         description="Image of the load generator; default: the operator's own.")
    resources: LoadResources = Field(
        default_factory=LoadResources, description="Resources of the load generator Pods.",
        json_schema_extra={"default": {}})

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


class PrometheusSpec(ApiModel):
    url: str = Field(default="http://prometheus.monitoring:9090", max_length=MAX_URL, pattern=r"^https?://[^\s]+$",
                     description="Prometheus base URL (the operator queries /api/v1/query_range).")


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
    deadline: Duration = Field(default="30m", description="Give up (never promote) if undecided by then.")
    sample_interval: Duration = Field(
        default="5s", description="Length of one sample window (per-token latency and throughput are read per "
                                  "disjoint window); at least Prometheus' scrape interval.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.minLatencyImprovement) || double(string(self.minLatencyImprovement).replace('%', '')) < 100.0",
             "minLatencyImprovement must be below 100% (a 100% faster token would take no time)",
             ".minLatencyImprovement"),
        _cel("!has(self.maxThroughputRegression) || double(string(self.maxThroughputRegression).replace('%', '')) < 100.0",
             "maxThroughputRegression must be below 100%", ".maxThroughputRegression"),
        _cel(f"!{_dur_ok('self.sampleInterval')} || duration(self.sampleInterval) >= duration('1s')",
             "sampleInterval must be at least 1s", ".sampleInterval"),
    ]})

    @model_validator(mode="after")
    def _winnable(self) -> "AnalysisSpec":
        if self.min_latency_improvement >= 1.0:
            raise ValueError("minLatencyImprovement must be below 100% (a 100% faster token would take no time)")
        if self.max_throughput_regression >= 1.0:
            raise ValueError("maxThroughputRegression must be below 100%")
        if self.sample_interval < timedelta(seconds=1):
            raise ValueError("sampleInterval must be at least 1s")
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


_WAVE_INT = "int(string(w).replace('%', ''))"


class PromotionSpec(ApiModel):
    """How a winning config reaches the fleet.

    ``full``: lookahead on at every batch size. ``regimeAware``: on only up to the crossover batch
    size (vLLM ``num_speculative_tokens_per_batch_size``, reference ``--lookahead-max-batch-size``).
    ``analysisOnly``: measure and decide, never touch the fleet. ``waves`` are cumulative shares
    of the fleet's Deployments; each wave soaks for ``waveDuration`` under the guard before the next.
    """

    mode: PromotionMode = Field(default=PromotionMode.regimeAware, description="full, regimeAware or analysisOnly.")
    waves: list[WavePercent] = Field(
        default_factory=lambda: ["10%", "50%", "100%"], min_length=1, max_length=MAX_WAVES,
        description="Cumulative share of the fleet per wave, strictly increasing, ending at 100%.",
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

    rollout_deadline: Duration = Field(
        default="10m", description="How long a promoted Deployment may take to become available (and the canary "
                                   "and control to become ready) before the policy rolls back.")

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


_DEADLINE_CEL = (f"!has(self.analysis) || !has(self.load) || !{_dur_ok('self.analysis.deadline')}"
                 f" || !{_dur_ok('self.load.stepDuration')}"
                 " || duration(self.analysis.deadline) >= duration(self.load.stepDuration)")
_SAMPLES_FIT_CEL = (f"!has(self.load) || !has(self.analysis) || !{_dur_ok('self.load.stepDuration')}"
                    f" || !{_dur_ok('self.load.warmup')} || !{_dur_ok('self.analysis.sampleInterval')}"
                    " || !has(self.load.minSamplesPerStep)"
                    " || (duration(self.load.stepDuration) - duration(self.load.warmup)).getMilliseconds()"
                    " >= self.load.minSamplesPerStep * duration(self.analysis.sampleInterval).getMilliseconds()")
_SWEEP_FITS_CEL = (f"!has(self.load) || !has(self.analysis) || !has(self.load.batchSizes)"
                   f" || !{_dur_ok('self.load.stepDuration')} || !{_dur_ok('self.analysis.deadline')}"
                   " || duration(self.analysis.deadline).getSeconds()"
                   " >= size(self.load.batchSizes) * duration(self.load.stepDuration).getSeconds()")
_ENGINE_METHOD_CEL = ("!has(self.lookahead) || !has(self.lookahead.method) || self.lookahead.method == 'ngram'"
                      " || !has(self.engine) || self.engine in ['auto', 'reference']")


class LookaheadPolicySpec(ApiModel):
    """A LookaheadPolicy: measure lookahead on a fleet, decide, and roll it out where it pays."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel(_ENGINE_METHOD_CEL,
             "lookahead.method jacobi runs only on the reference engine (vLLM and SGLang offer ngram): "
             "use method ngram, or engine reference or auto", ".lookahead.method"),
        _cel(_DEADLINE_CEL, "analysis.deadline must be at least load.stepDuration", ".analysis.deadline"),
        _cel(_SAMPLES_FIT_CEL,
             "a step cannot yield load.minSamplesPerStep samples: (load.stepDuration - load.warmup) / "
             "analysis.sampleInterval must be at least load.minSamplesPerStep", ".load.minSamplesPerStep"),
        _cel(_SWEEP_FITS_CEL,
             "analysis.deadline must leave room for every batch size: at least size(load.batchSizes) * "
             "load.stepDuration", ".analysis.deadline"),
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
        if self.lookahead.method == "jacobi" and self.engine in ("vllm", "sglang"):
            raise ValueError("lookahead.method jacobi runs only on the reference engine (vLLM and SGLang offer "
                             "ngram): use method ngram, or engine reference or auto")
        load, analysis = self.load, self.analysis
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
        return self

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


# --------------------------------------------------------------------------------------------
# status


class Phase(StrEnum):
    Pending = "Pending"
    Preflight = "Preflight"
    Launching = "Launching"
    Measuring = "Measuring"
    Deciding = "Deciding"
    Promoting = "Promoting"
    Guarding = "Guarding"
    Succeeded = "Succeeded"
    RolledBack = "RolledBack"
    NotACandidate = "NotACandidate"
    Failed = "Failed"


TERMINAL_PHASES = frozenset({Phase.Succeeded, Phase.RolledBack, Phase.NotACandidate, Phase.Failed})


class ConditionStatus(StrEnum):
    true = "True"
    false = "False"
    unknown = "Unknown"


class ConditionType(StrEnum):
    """Every condition type the operator sets, and no other (``lookahead_operator.controller.conditions``
    derives them from the phase and what one reconcile pass found)."""

    Accepted = "Accepted"            # the spec is valid and can be acted on
    TargetsFound = "TargetsFound"    # Deployments match spec.targets and no other policy owns them
    TargetsEdited = "TargetsEdited"  # targets whose pod template their user changed mid-rollout: left to them
    RolesReady = "RolesReady"        # canary and control are up
    MetricsAvailable = "MetricsAvailable"  # Prometheus answered the last read
    Approved = "Approved"            # promotion may go on (or no approval is required)
    WaveReady = "WaveReady"          # the current wave rolled out and is being guarded
    GuardData = "GuardData"          # the guard has enough data to judge
    Paused = "Paused"                # spec.paused
    Reconciled = "Reconciled"        # the last pass's actions were carried out
    Ready = "Ready"                  # Succeeded: lookahead is on where it pays


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# A point in time, written as RFC 3339 to the second (as Kubernetes writes metav1.Time).
Timestamp = Annotated[datetime, PlainSerializer(_rfc3339, return_type=str), Field(json_schema_extra={"format": "date-time"})]


class Condition(StatusModel):
    """A condition in the Kubernetes API convention (metav1.Condition)."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN, description="CamelCase type, e.g. Accepted.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN,
                        description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="Human-readable details.")
    last_transition_time: Timestamp = Field(description="When status last changed.")
    observed_generation: Optional[int] = Field(default=None, ge=0,
                                               description="metadata.generation the condition was set for.")


class BatchVerdict(StrEnum):
    """Per batch size (the values of ``lookahead_operator.measurement.decision.BatchOutcome``, plus Inconclusive)."""

    Pending = "Pending"            # still measuring
    Wins = "Wins"                  # per-token latency better by >= minLatencyImprovement, throughput within bound
    NoGain = "NoGain"              # latency did not improve by minLatencyImprovement
    Regresses = "Regresses"        # batched throughput fell by more than maxThroughputRegression
    Inconclusive = "Inconclusive"  # not enough evidence by the deadline


class RoleSamples(StatusModel):
    control: Optional[int] = Field(default=None, ge=0)
    canary: Optional[int] = Field(default=None, ge=0)


class StallIntervals(StatusModel):
    control: int = Field(default=0, ge=0)
    canary: int = Field(default=0, ge=0)


class DroppedIntervals(StatusModel):
    latency: int = Field(default=0, ge=0)
    throughput: int = Field(default=0, ge=0)


class BatchResult(StatusModel):
    """One row of the per-batch-size table: control vs canary at one concurrency
    (what ``lookahead_operator.measurement.decision.BatchVerdict.to_status`` writes).

    Changes are relative, canary vs control, as fractions (``tpotChange: -0.37`` = per-token
    latency 37 % lower); intervals are ``[low, high]`` of that change at ``confidence``.
    """

    batch_size: int = Field(ge=1, description="Concurrent requests.")
    control_tpot_ms: Optional[float] = Field(default=None, description="Control per-token latency, ms.")
    canary_tpot_ms: Optional[float] = Field(default=None, description="Canary per-token latency, ms.")
    tpot_change: Optional[float] = Field(default=None, description="Canary vs control TPOT change, fraction (-0.37 = 37% lower).")
    tpot_interval: Optional[list[float]] = Field(default=None, min_length=2, max_length=2,
                                                 description="Confidence interval [low, high] of tpotChange.")
    control_tokens_per_second: Optional[float] = Field(default=None, description="Control generated tokens per second.")
    canary_tokens_per_second: Optional[float] = Field(default=None, description="Canary generated tokens per second.")
    throughput_change: Optional[float] = Field(default=None, description="Canary vs control throughput change, fraction.")
    throughput_interval: Optional[list[float]] = Field(default=None, min_length=2, max_length=2,
                                                       description="Confidence interval [low, high] of throughputChange.")
    acceptance_rate: Optional[float] = Field(default=None, ge=0, le=1,
                                             description="Accepted / proposed draft tokens on the canary.")
    mean_acceptance_length: Optional[float] = Field(
        default=None, ge=0,
        description="Canary tokens per verification step, bonus token included: 1 + accepted / drafts.")
    acceptance_by_position: Optional[list[float]] = Field(
        default=None, max_length=64,
        description="Canary per-position acceptance: index k is the share of drafts whose k-th token was accepted "
                    "(vllm:spec_decode_num_accepted_tokens_per_pos_total / drafts).")
    samples: Optional[RoleSamples] = Field(default=None, description="Samples per role behind this row.")
    confidence: Optional[float] = Field(default=None, ge=0, le=1, description="Confidence of the intervals.")
    latency_verdict: Optional[str] = Field(default=None, max_length=64,
                                           description="Better, Worse, Equivalent or NotEnoughData (statistics.Verdict).")
    throughput_verdict: Optional[str] = Field(default=None, max_length=64,
                                              description="Better, Worse, Equivalent or NotEnoughData (statistics.Verdict).")
    verdict: BatchVerdict = Field(default=BatchVerdict.Pending)
    paired: Optional[bool] = Field(default=None, description="Canary and control compared window by window.")
    stall_intervals: Optional[StallIntervals] = Field(
        default=None, description="Sample windows in which only one arm produced no tokens (counted against it).")
    dropped_intervals: Optional[DroppedIntervals] = Field(
        default=None, description="Sample windows without a value in either arm, per metric.")
    latency_samples: Optional[int] = Field(default=None, ge=0, description="Paired per-token latency windows.")
    throughput_samples: Optional[int] = Field(default=None, ge=0, description="Paired throughput windows.")
    tail_verdict: Optional[str] = Field(
        default=None, max_length=64,
        description="Tail per-token latency (p95/p99 from the histogram buckets), canary vs control: Worse (a veto: "
                    "the row Regresses), Equivalent, Better or NotEnoughData (statistics.TailComparison).")
    tail_threshold: Optional[float] = Field(default=None, ge=0,
                                            description="analysis.maxTailLatencyRegression, fraction (1.0 = 100%).")
    control_p95_ms: Optional[float] = Field(default=None, description="Control p95 per-token latency, ms (histogram_quantile).")
    canary_p95_ms: Optional[float] = Field(default=None, description="Canary p95 per-token latency, ms (histogram_quantile).")
    control_p99_ms: Optional[float] = Field(default=None, description="Control p99 per-token latency, ms (histogram_quantile).")
    canary_p99_ms: Optional[float] = Field(default=None, description="Canary p99 per-token latency, ms (histogram_quantile).")
    tail: Optional[FreeForm] = Field(
        default=None, description="The whole tail comparison at full precision (statistics.TailComparison.to_dict: "
                                  "per quantile the point estimates, the certified bucket bounds, the verdict), "
                                  "so a restarted operator rebuilds the same veto.")


class DecisionAction(StrEnum):
    """The values of ``lookahead_operator.measurement.decision.Action``."""

    Promote = "Promote"                        # lookahead on at every batch size
    PromoteRegimeAware = "PromoteRegimeAware"  # on below the crossover batch size
    Rollback = "Rollback"                      # lookahead pays nowhere (or the guard saw a regression)
    NotACandidate = "NotACandidate"            # preflight said no
    Inconclusive = "Inconclusive"              # deadline passed without a clear answer: do not promote
    Wait = "Wait"                              # not decided yet


class RegimeRange(StatusModel):
    """Lookahead on (``enabled``) or off for running batch sizes ``start..end`` (inclusive)."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    enabled: bool


class Decision(StatusModel):
    """``lookahead_operator.measurement.decision.Decision.to_dict()`` plus when, an id and the promoted config."""

    id: Optional[str] = Field(default=None, max_length=64,
                              description="Identifies this decision (generation and action).")
    action: DecisionAction
    reason: str = Field(max_length=MAX_MESSAGE, description="The reason in words, with the numbers.")
    decided_at: Optional[Timestamp] = None
    crossover_batch_size: Optional[int] = Field(default=None, ge=0,
                                                description="Smallest measured batch size at which lookahead stops paying.")
    regime: Optional[list[RegimeRange]] = Field(default=None, description="Where lookahead stays on (regimeAware).")
    outcomes: Optional[dict[str, str]] = Field(default=None, description="Batch size -> outcome.")
    config: Optional[FreeForm] = Field(default=None, description="The engine config to promote (adapter-specific).")
    evidence: Optional[FreeForm] = Field(default=None, description="Every value behind the decision.")


class WaveState(StrEnum):
    Pending = "Pending"
    Promoting = "Promoting"
    Guarding = "Guarding"
    Passed = "Passed"
    Failed = "Failed"
    RolledBack = "RolledBack"


class WaveStatus(StatusModel):
    index: int = Field(ge=1, description="1-based wave number.")
    percent: int = Field(ge=1, le=100, description="Cumulative share of the fleet by the end of this wave.")
    state: WaveState = WaveState.Pending
    targets: Optional[list[str]] = Field(default=None, max_length=MAX_TARGETS, description="namespace/name promoted in this wave.")
    started_at: Optional[Timestamp] = None
    finished_at: Optional[Timestamp] = None
    throughput_change: Optional[float] = Field(default=None, description="Guard: promoted vs unpromoted, percent.")
    message: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)


class PreflightStatus(StatusModel):
    candidate: Optional[bool] = Field(default=None, description="Is the workload a lookahead candidate at all.")
    verdict: Optional[str] = Field(default=None, max_length=MAX_SHORT, description="The verdict in a word or two.")
    reasons: Optional[list[str]] = Field(default=None, description="Why, with the numbers.")
    missing: Optional[list[str]] = Field(default=None, description="Metrics that were not available (e.g. DCGM SM_ACTIVE).")
    signals: Optional[dict[str, float]] = Field(
        default=None, description="The numbers read, by signal (DCGM counters as fractions 0..1, seconds, running "
                                  "requests as runningP50/P90/P99).")
    batch_sizes: Optional[list[int]] = Field(default=None, description="Batch sizes to measure (auto: from running-request quantiles).")
    checked_at: Optional[Timestamp] = None


class TargetStatus(StatusModel):
    namespace: str
    name: str
    engine: Optional[str] = Field(default=None, description="The engine detected or given.")
    promoted: bool = False
    wave: Optional[int] = Field(default=None, ge=1, description="The wave that promoted it.")
    saved_template: Optional[FreeForm] = Field(default=None, description="The pod template before the first patch.")
    user_edited: Optional[bool] = Field(
        default=None, description="Its pod template was changed by someone else mid-rollout: the user's change wins; "
                                  "the operator released it and neither promotes nor restores it.")


class WorkloadRef(StatusModel):
    """An object the operator created (canary, control, load Job)."""

    kind: str
    namespace: str
    name: str
    role: str
    target: Optional[str] = None


class Gates(StatusModel):
    """What the operator saw of the gates (see the module docstring)."""

    paused: Optional[bool] = None
    awaiting_approval: Optional[bool] = None
    approved: Optional[bool] = None
    approved_generation: Optional[int] = Field(default=None, ge=0, description="The generation the approval named.")
    approved_at: Optional[Timestamp] = None
    aborted: Optional[bool] = None
    abort_reason: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)


class Progress(StatusModel):
    """The state machine's bookkeeping: what a restarted operator resumes from. Every clock here
    is frozen while the policy is paused (shifted by the pause's length on resume)."""

    fingerprint: Optional[str] = Field(default=None, max_length=64,
                                       description="LookaheadPolicySpec.fingerprint() being acted on.")
    fingerprint_generation: Optional[int] = Field(
        default=None, ge=0, description="metadata.generation at which the spec last hashed to fingerprint: a new "
                                        "hash at the same generation is a default the user did not write (a CRD or "
                                        "operator upgrade), not a change, and restarts nothing.")
    started_at: Optional[Timestamp] = None
    phase_since: Optional[Timestamp] = None
    batch_sizes: Optional[list[int]] = Field(default=None, max_length=MAX_BATCH_SIZES,
                                             description="The planned sweep, fixed when measurement starts.")
    step: Optional[int] = Field(default=None, ge=0, description="Index into batchSizes being measured.")
    step_started_at: Optional[Timestamp] = None
    measuring_since: Optional[Timestamp] = None
    wave: Optional[int] = Field(default=None, ge=0, description="0-based wave in progress.")
    wave_started_at: Optional[Timestamp] = None
    guard_started_at: Optional[Timestamp] = None
    guard_leg: Optional[int] = Field(
        default=None, ge=0, description="0-based index into the guard's batch sizes (status.guard.legs) being "
                                        "driven in the current wave or final guard.")
    guard_leg_started_at: Optional[Timestamp] = Field(
        default=None, description="When the guard load at the current batch size started.")
    paused_at: Optional[Timestamp] = Field(default=None, description="When spec.paused was first seen true.")
    load_run: Optional[int] = Field(default=None, ge=0,
                                    description="Bumped whenever load is (re)started; load Job names carry it.")
    load_started_at: Optional[Timestamp] = Field(
        default=None, description="When every load Job of the current loadRun was first seen with a running pod: "
                                  "a step or guard measures from here (plus the warm-up), never from before.")
    read_errors: Optional[int] = Field(default=None, ge=0, description="Consecutive passes Prometheus could not be read.")


class GuardLeg(StatusModel):
    """The guard at one batch size of the wave (or final guard) in progress."""

    batch_size: int = Field(ge=1, description="Concurrent requests driven on the promoted pod and on the control.")
    lookahead: Optional[bool] = Field(default=None, description="Whether the promoted config has lookahead on at "
                                                                "this batch size (regime-aware: off above its range).")
    state: Literal["Pending", "Guarding", "Passed"] = Field(
        default="Pending", description="Pending (not driven yet), Guarding (being driven now) or Passed.")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="The latest comparison at this batch size.")


class GuardStatus(StatusModel):
    """The latest guard comparison: a promoted pod against the control."""

    wave: Optional[int] = Field(default=None, ge=1, description="The wave being guarded (none: the final guard).")
    message: str = Field(default="", max_length=MAX_MESSAGE)
    enough_data: bool = False
    regressed: bool = False
    batch_size: Optional[int] = Field(default=None, ge=1, description="The batch size being driven now.")
    legs: Optional[list[GuardLeg]] = Field(
        default=None, max_length=MAX_BATCH_SIZES,
        description="Every batch size this guard drives, one after the other: after a regime-aware promotion one "
                    "inside the lookahead range and one above it; otherwise the largest measured.")


class RollbackStatus(StatusModel):
    reason: str = Field(max_length=MAX_SHORT)
    message: str = Field(default="", max_length=MAX_MESSAGE)
    at: Optional[Timestamp] = None
    restored: Optional[list[str]] = Field(default=None, max_length=MAX_TARGETS,
                                          description="namespace/name restored to their saved templates.")


class LookaheadPolicyStatus(StatusModel):
    phase: Phase = Phase.Pending
    message: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)
    observed_generation: Optional[int] = Field(default=None, ge=0)
    conditions: Optional[list[Condition]] = Field(
        default=None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    preflight: Optional[PreflightStatus] = None
    targets: Optional[list[TargetStatus]] = None
    workloads: Optional[list[WorkloadRef]] = None
    batch_sizes: Optional[list[int]] = Field(default=None, description="The batch sizes being measured.")
    batches: Optional[list[BatchResult]] = None
    crossover_batch_size: Optional[int] = Field(
        default=None, ge=0, description="Smallest measured batch size at which lookahead stops paying.")
    decision: Optional[Decision] = None
    current_wave: Optional[int] = Field(default=None, ge=0, description="1-based wave in progress (0: none yet).")
    waves: Optional[list[WaveStatus]] = None
    gates: Optional[Gates] = None
    report: Optional[str] = Field(default=None, max_length=MAX_URL, description="Where the report is (a ConfigMap or URL).")
    guard: Optional[GuardStatus] = Field(default=None, description="The latest guard comparison (promoted vs control).")
    rollback: Optional[RollbackStatus] = Field(default=None, description="Why and when the fleet was rolled back, and what was restored.")
    progress: Progress = Field(default_factory=Progress, description="The state machine's bookkeeping (step, wave, "
                               "clocks): what a restarted operator resumes from. See lookahead_operator.controller.statemachine.")


NAME_TOO_LONG = (f"metadata.name must be at most {MAX_POLICY_NAME} characters: it is the value of the "
                 "lookahead.dev/policy label on every object the policy creates")
# Rules on the whole object (the CRD's root schema): only metadata.name is visible to CEL there.
ROOT_VALIDATIONS = [_cel(f"size(self.metadata.name) <= {MAX_POLICY_NAME}", NAME_TOO_LONG)]


class LookaheadPolicy(ApiModel):
    """A whole object, as the apiserver returns it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", validate_default=True)

    api_version: Literal["lookahead.dev/v1alpha1"] = API_VERSION
    kind: Literal["LookaheadPolicy"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: LookaheadPolicySpec
    status: Optional[LookaheadPolicyStatus] = None

    @model_validator(mode="after")
    def _name_fits(self) -> "LookaheadPolicy":
        name = self.metadata.get("name") or ""
        if len(name) > MAX_POLICY_NAME:
            raise ValueError(NAME_TOO_LONG)
        return self

    @classmethod
    def from_body(cls, body: Any) -> "LookaheadPolicy":
        """From a Kopf body or a dict; ``status`` is read leniently."""
        data = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}
        if "metadata" in data:
            data["metadata"] = dict(data["metadata"])
        return cls.model_validate(data)


__all__ = [name for name in dir() if not name.startswith("_")]
