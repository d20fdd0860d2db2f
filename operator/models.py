"""The LookaheadPolicy API (``lookahead.dev/v1alpha1``) as pydantic v2 models.

These models are the single source of truth of the CRD: ``python3 -m lookahead_operator.crdgen``
turns their JSON schema into the OpenAPI v3 structural schema in ``crds/lookaheadpolicies.yaml``
(and the chart's copy). Every cross-field rule exists twice, on purpose: as a pydantic validator
here (what the operator and the unit tests use) and as a CEL ``x-kubernetes-validations`` rule in
the CRD (what the apiserver enforces on ``kubectl apply``). Both carry the same message.

Python attribute names are snake_case; the wire (JSON/YAML) names are camelCase aliases. Both are
accepted on input (``populate_by_name``); use :meth:`ApiModel.to_dict` to get the wire form.

    spec = LookaheadPolicySpec.model_validate(body["spec"])      # what the apiserver stores
    spec.analysis.max_throughput_regression_pct                    # 2.0
    spec.load.step_seconds                                         # 120.0

Gates (what ``kubectl lookahead pause|resume|approve|abort`` does):

* pause / resume: ``spec.paused`` (a spec field: it is desired state, and GitOps tools can own it).
  It bumps ``metadata.generation``, so the operator must not treat a change of ``paused`` alone as
  a spec edit: compare :meth:`LookaheadPolicySpec.fingerprint`, which leaves ``paused`` out.
* approve: annotation ``lookahead.dev/approve`` whose value is the ``metadata.generation`` being
  approved (what ``lookahead_operator.handlers`` reads). An approval of an earlier generation
  does not match after a spec edit and is ignored. Needed only when
  ``spec.promotion.requireApproval``.
* abort: annotation ``lookahead.dev/abort: "true"``. The operator rolls back what it promoted
  and ends in ``RolledBack``.

Annotations do not bump ``metadata.generation``, so approving or aborting never restarts a
measurement. What the operator saw of the gates is mirrored in ``status.gates``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

# --------------------------------------------------------------------------------------------
# identity of the API

GROUP = "lookahead.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LookaheadPolicy"
LIST_KIND = "LookaheadPolicyList"
PLURAL = "lookaheadpolicies"
SINGULAR = "lookaheadpolicy"
SHORT_NAMES = ["lap"]
CATEGORIES = ["lookahead"]
CRD_NAME = f"{PLURAL}.{GROUP}"

ANNOTATION_APPROVE = f"{GROUP}/approve"
ANNOTATION_ABORT = f"{GROUP}/abort"

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

_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%?\s*$")
# The CRD pattern for a percent given as a string: 0-100, up to any decimals, optional '%'.
PERCENT_PATTERN = r"^(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)%?$"
# A wave: a whole percent 1-100, as '10%' (or the integer 10).
WAVE_PATTERN = r"^(100|[1-9][0-9]?)%$"
# Go duration syntax (what CEL's duration() parses): 90s, 2m, 1h30m, 500ms, 1.5h.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
CONDITION_TYPE_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def parse_percent(value: Union[int, float, str], *, lo: float = 0.0, hi: float = 100.0) -> float:
    """A percentage as a float in percent units: ``"2%"`` -> 2.0, ``"2.5"`` -> 2.5, ``5`` -> 5.0.

    Numbers are percentages too (``2`` means 2 %, not 200 %). Raises ``ValueError`` outside
    ``[lo, hi]`` or when the text is not a percentage.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a percentage like '2%' or a number, got {value!r}")
    if isinstance(value, (int, float)):
        out = float(value)
    elif isinstance(value, str):
        m = _PERCENT_RE.match(value)
        if not m:
            raise ValueError(f"expected a percentage like '2%' or '2.5%', got {value!r}")
        out = float(m.group(1))
    else:
        raise ValueError(f"expected a percentage like '2%' or a number, got {value!r}")
    if math.isnan(out) or not (lo <= out <= hi):
        raise ValueError(f"percentage {value!r} must be between {lo:g}% and {hi:g}%")
    return out


def parse_duration(value: Union[str, int, float]) -> float:
    """Seconds in a Go-style duration: ``"2m"`` -> 120.0, ``"1h30m"`` -> 5400.0, ``"500ms"`` -> 0.5.

    A bare number is taken as seconds. Units: ms, s, m, h (the ones CEL's ``duration()`` and Go
    understand). Raises ``ValueError`` on anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '2m', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or math.isnan(value):
            raise ValueError(f"duration must not be negative, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration like '2m', got {value!r}")
    text = value.strip()
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"expected a duration like '90s', '2m' or '1h30m' (units ms, s, m, h), got {value!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_RE.findall(text))


def format_duration(seconds: float) -> str:
    """The inverse of :func:`parse_duration` for whole seconds: 5400 -> '1h30m'."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec else "")
    return out or "0s"


def _check_percent(lo: float, hi: float):
    def check(v: Any) -> Any:
        parse_percent(v, lo=lo, hi=hi)
        if isinstance(v, float):
            # The CRD field is int-or-string (a structural schema has no int-or-float-or-string),
            # so a fraction has to be written as a string.
            if not v.is_integer():
                raise ValueError(f"a fractional percentage must be a string like '{v:g}%', got the number {v!r}")
            return int(v)
        return v.strip() if isinstance(v, str) else v
    return check


def _check_duration(v: Any) -> Any:
    if not isinstance(v, str):
        raise ValueError(f"expected a duration string like '2m', got {v!r}")
    parse_duration(v)
    return v.strip()


def _percent_schema(description: str, lo: int = 0, hi: int = 100) -> dict:
    return {
        "x-kubernetes-int-or-string": True,
        "pattern": PERCENT_PATTERN,
        "minimum": lo,
        "maximum": hi,
        "maxLength": 16,
        "description": description,
    }


# A percentage: "2%", "2.5%", "2" or the integer 2 (all mean 2 %), 0-100. Fractions only as strings.
Percent = Annotated[
    Union[int, str],
    BeforeValidator(_check_percent(0, 100)),
    WithJsonSchema(_percent_schema("A percentage, 0-100: '2%', '2.5%' or the integer 2 (all mean 2 %); fractions only as strings.")),
]
# A wave size: a whole percent of the fleet, "10%" or 10, 1-100.
WavePercent = Annotated[
    Union[int, str],
    BeforeValidator(_check_percent(1, 100)),
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "pattern": WAVE_PATTERN,
        "minimum": 1,
        "maximum": 100,
        "maxLength": 4,
        "description": "Cumulative share of the fleet promoted by the end of this wave: '10%' or 10.",
    }),
]
Duration = Annotated[
    str,
    BeforeValidator(_check_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "maxLength": 32,
                    "description": "A Go duration: '90s', '2m', '1h30m'."}),
]
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def _wave_value(w: Union[int, str]) -> int:
    return int(parse_percent(w, lo=1, hi=100))


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

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_dict(self, *, exclude_none: bool = True) -> dict[str, Any]:
        """The wire (camelCase JSON) form, ready for a patch body."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=exclude_none)


class StatusModel(ApiModel):
    """Status models ignore unknown keys (a newer operator may have written more)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


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
    values: Optional[list[Annotated[str, Field(max_length=63)]]] = Field(
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

    match_labels: Optional[dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]]] = Field(
        default=None, max_length=MAX_LABELS, description="Labels that must all be present with these values.",
        json_schema_extra={"maxProperties": MAX_LABELS})
    match_expressions: Optional[list[LabelSelectorRequirement]] = Field(
        default=None, max_length=MAX_EXPRESSIONS, description="Requirements that must all hold.")

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


MAX_TOKENS_PER_STEP = 1024
_JACOBI_BUDGET_CEL = f"self.method != 'jacobi' || 1 + (self.window + self.guessSet) * (self.ngram - 1) <= {MAX_TOKENS_PER_STEP}"


class LookaheadConfig(ApiModel):
    """What the canary turns on. The engine adapter maps it onto the engine's flags.

    ``jacobi``: Jacobi lookahead decoding (Fu et al. 2024) with window W, n-gram size N and
    guess-set size G; it verifies ``1 + (W + G)(N - 1)`` tokens per step. Only the reference
    engine implements it. ``ngram``: prompt-lookup speculation (vLLM ``method: ngram``, SGLang
    ``NGRAM``) with ``numSpeculativeTokens`` drafts from n-grams of ``promptLookupMin`` to
    ``promptLookupMax`` tokens.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self.promptLookupMin <= self.promptLookupMax",
             "promptLookupMin must be less than or equal to promptLookupMax", ".promptLookupMin"),
        _cel(_JACOBI_BUDGET_CEL,
             f"jacobi: 1 + (window + guessSet) * (ngram - 1) tokens per step must be at most {MAX_TOKENS_PER_STEP}",
             ".window"),
    ]})

    method: LookaheadMethod = Field(default=LookaheadMethod.jacobi, description="jacobi (W, N, G) or ngram (prompt lookup).")
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
        from .engines import reference_speculative_config

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
    step_duration: Duration = Field(default="2m", description="How long each batch size is measured.")
    warmup: Duration = Field(default="30s", description="Discarded at the start of each step.")
    min_samples_per_step: int = Field(default=50, ge=1, le=100000,
                                      description="Completed requests per role needed before a step counts.")
    live_percent: Optional[Percent] = Field(
        default=None, description="live: share of the Service's traffic the canary and the control each take.")
    loadgen_image: Optional[str] = Field(default=None, min_length=1, max_length=MAX_IMAGE,
                                         description="Image of the load generator; default: the operator's own.")

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
        if parse_duration(self.warmup) >= parse_duration(self.step_duration):
            raise ValueError(f"warmup ({self.warmup}) must be shorter than stepDuration ({self.step_duration})")
        return self

    @property
    def auto_batch_sizes(self) -> bool:
        return not self.batch_sizes

    @property
    def step_seconds(self) -> float:
        return parse_duration(self.step_duration)

    @property
    def warmup_seconds(self) -> float:
        return parse_duration(self.warmup)

    @property
    def live_pct(self) -> Optional[float]:
        return None if self.live_percent is None else parse_percent(self.live_percent)


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
    confidence: float = Field(default=0.99, gt=0.5, lt=1.0,
                              description="Confidence of the intervals behind each verdict, in (0.5, 1).")
    deadline: Duration = Field(default="30m", description="Give up (never promote) if undecided by then.")

    @property
    def max_throughput_regression_pct(self) -> float:
        return parse_percent(self.max_throughput_regression)

    @property
    def min_latency_improvement_pct(self) -> float:
        return parse_percent(self.min_latency_improvement)

    @property
    def deadline_seconds(self) -> float:
        return parse_duration(self.deadline)


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

    @field_validator("waves")
    @classmethod
    def _waves(cls, v: list[Union[int, str]]) -> list[Union[int, str]]:
        nums = [_wave_value(w) for w in v]
        if any(b <= a for a, b in zip(nums, nums[1:])):
            raise ValueError(f"waves must be strictly increasing, got {v}")
        if nums[-1] != 100:
            raise ValueError(f"the last wave must be 100%, got {v[-1]!r}")
        return v

    @property
    def wave_percents(self) -> list[int]:
        return [_wave_value(w) for w in self.waves]

    @property
    def wave_seconds(self) -> float:
        return parse_duration(self.wave_duration)

    @property
    def guard_seconds(self) -> float:
        return parse_duration(self.guard.duration)


# --------------------------------------------------------------------------------------------
# spec


_DEADLINE_CEL = (f"!has(self.analysis) || !has(self.load) || !{_dur_ok('self.analysis.deadline')}"
                 f" || !{_dur_ok('self.load.stepDuration')}"
                 " || duration(self.analysis.deadline) >= duration(self.load.stepDuration)")
_ENGINE_METHOD_CEL = ("!has(self.lookahead) || !has(self.lookahead.method) || self.lookahead.method == 'ngram'"
                      " || !has(self.engine) || self.engine in ['auto', 'reference']")


class LookaheadPolicySpec(ApiModel):
    """A LookaheadPolicy: measure lookahead on a fleet, decide, and roll it out where it pays."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel(_ENGINE_METHOD_CEL,
             "lookahead.method jacobi runs only on the reference engine (vLLM and SGLang offer ngram): "
             "use method ngram, or engine reference or auto", ".lookahead.method"),
        _cel(_DEADLINE_CEL, "analysis.deadline must be at least load.stepDuration", ".analysis.deadline"),
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
        if self.analysis.deadline_seconds < self.load.step_seconds:
            raise ValueError(f"analysis.deadline ({self.analysis.deadline}) must be at least "
                             f"load.stepDuration ({self.load.step_duration})")
        return self

    def fingerprint(self) -> str:
        """A hash of everything that changes what is measured or promoted.

        Leaves out ``paused`` (a gate, not a change of intent): editing the spec otherwise means
        the measurement restarts, pausing does not.
        """
        data = self.to_dict(exclude_none=True)
        data.pop("paused", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


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


class ConditionType:
    """Condition types the operator sets (free strings in the schema, so they can grow)."""

    Accepted = "Accepted"          # the spec validated; the policy owns its targets
    Candidate = "Candidate"        # preflight: the workload is decode-bound with spare compute
    Ready = "Ready"                # canary and control are up
    Measured = "Measured"          # every batch size has a verdict
    Decided = "Decided"
    AwaitingApproval = "AwaitingApproval"
    Promoted = "Promoted"
    Healthy = "Healthy"            # guard: no throughput regression
    RolledBack = "RolledBack"
    Paused = "Paused"


class Condition(StatusModel):
    """A condition in the Kubernetes API convention (metav1.Condition)."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN, description="CamelCase type, e.g. Accepted.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN,
                        description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="Human-readable details.")
    last_transition_time: datetime = Field(description="When status last changed.",
                                           json_schema_extra={"format": "date-time"})
    observed_generation: Optional[int] = Field(default=None, ge=0,
                                               description="metadata.generation the condition was set for.")


class BatchVerdict(StrEnum):
    """Per batch size (the values of ``lookahead_operator.decision.BatchOutcome``, plus Inconclusive)."""

    Pending = "Pending"            # still measuring
    Wins = "Wins"                  # per-token latency better by >= minLatencyImprovement, throughput within bound
    NoGain = "NoGain"              # latency did not improve by minLatencyImprovement
    Regresses = "Regresses"        # batched throughput fell by more than maxThroughputRegression
    Inconclusive = "Inconclusive"  # not enough evidence by the deadline


class RoleSamples(StatusModel):
    control: Optional[int] = Field(default=None, ge=0)
    canary: Optional[int] = Field(default=None, ge=0)


class BatchResult(StatusModel):
    """One row of the per-batch-size table: control vs canary at one concurrency
    (what ``lookahead_operator.decision.BatchVerdict.to_status`` writes).

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
    samples: Optional[RoleSamples] = Field(default=None, description="Samples per role behind this row.")
    confidence: Optional[float] = Field(default=None, ge=0, le=1, description="Confidence of the intervals.")
    latency_verdict: Optional[str] = Field(default=None, max_length=64,
                                           description="Better, Worse, Equivalent or NotEnoughData (statistics.Verdict).")
    throughput_verdict: Optional[str] = Field(default=None, max_length=64,
                                              description="Better, Worse, Equivalent or NotEnoughData (statistics.Verdict).")
    verdict: BatchVerdict = Field(default=BatchVerdict.Pending)


class DecisionAction(StrEnum):
    """The values of ``lookahead_operator.decision.Action``."""

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
    """``lookahead_operator.decision.Decision.to_dict()`` plus when, an id and the promoted config."""

    id: Optional[str] = Field(default=None, max_length=64,
                              description="Identifies this decision (generation and action).")
    action: DecisionAction
    reason: str = Field(max_length=MAX_MESSAGE, description="The reason in words, with the numbers.")
    decided_at: Optional[datetime] = Field(default=None, json_schema_extra={"format": "date-time"})
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
    started_at: Optional[datetime] = Field(default=None, json_schema_extra={"format": "date-time"})
    finished_at: Optional[datetime] = Field(default=None, json_schema_extra={"format": "date-time"})
    throughput_change: Optional[float] = Field(default=None, description="Guard: promoted vs unpromoted, percent.")
    message: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)


class PreflightStatus(StatusModel):
    candidate: Optional[bool] = Field(default=None, description="Is the workload a lookahead candidate at all.")
    verdict: Optional[str] = Field(default=None, max_length=MAX_SHORT, description="The verdict in a word or two.")
    reasons: Optional[list[str]] = Field(default=None, description="Why, with the numbers.")
    missing: Optional[list[str]] = Field(default=None, description="Metrics that were not available (e.g. DCGM SM_ACTIVE).")
    batch_sizes: Optional[list[int]] = Field(default=None, description="Batch sizes to measure (auto: from running-request quantiles).")
    checked_at: Optional[datetime] = Field(default=None, json_schema_extra={"format": "date-time"})


class TargetStatus(StatusModel):
    namespace: str
    name: str
    engine: Optional[str] = Field(default=None, description="The engine detected or given.")
    promoted: bool = False
    wave: Optional[int] = Field(default=None, ge=1, description="The wave that promoted it.")
    saved_template: Optional[FreeForm] = Field(default=None, description="The pod template before the first patch.")


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
    approved_at: Optional[datetime] = Field(default=None, json_schema_extra={"format": "date-time"})
    aborted: Optional[bool] = None
    abort_reason: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)


class LookaheadPolicyStatus(StatusModel):
    phase: Phase = Phase.Pending
    message: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)
    observed_generation: Optional[int] = Field(default=None, ge=0)
    spec_fingerprint: Optional[str] = Field(default=None, description="LookaheadPolicySpec.fingerprint() being acted on.")
    phase_since: Optional[datetime] = Field(default=None, json_schema_extra={"format": "date-time"})
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
    guard: Optional[FreeForm] = Field(default=None, description="The latest guard comparison (promoted vs control).")
    rollback: Optional[FreeForm] = Field(default=None, description="Why and when the fleet was rolled back, and what was restored.")
    progress: Optional[FreeForm] = Field(
        default=None, description="The state machine's bookkeeping (step, wave, timestamps): what a restarted "
                                  "operator resumes from. See lookahead_operator.statemachine.")


class LookaheadPolicy(ApiModel):
    """A whole object, as the apiserver returns it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: Literal["lookahead.dev/v1alpha1"] = API_VERSION
    kind: Literal["LookaheadPolicy"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: LookaheadPolicySpec
    status: Optional[LookaheadPolicyStatus] = None

    @classmethod
    def from_body(cls, body: Any) -> "LookaheadPolicy":
        """From a Kopf body or a dict; ``status`` is read leniently."""
        data = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}
        if "metadata" in data:
            data["metadata"] = dict(data["metadata"])
        return cls.model_validate(data)


__all__ = [name for name in dir() if not name.startswith("_")]
