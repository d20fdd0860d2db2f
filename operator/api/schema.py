"""What every LookaheadPolicy model is built from: the limits, the patterns, the wire types, the
CEL helpers and the base models.

* Limits (``MAX_*``) bound the CEL cost of the validation rules and the size of a policy.
* Wire types are parsed on the way in and written back on the way out: ``Percent`` ("2%" <->
  0.02), ``RisePercent``, ``WavePercent``, ``Duration`` ("2m" <-> ``timedelta``), ``Quantity``
  ("250m"), ``Timestamp`` (RFC 3339); each carries the JSON schema the CRD gets.
* Every cross-field rule exists twice, on purpose: as a pydantic validator (what the operator and
  the unit tests use) and as a CEL ``x-kubernetes-validations`` rule in the CRD (what the apiserver
  enforces on ``kubectl apply``), built with ``_cel``. Both carry the same message.
* Python attribute names are snake_case; the wire (JSON/YAML) names are camelCase aliases. Both are
  accepted on input (``populate_by_name``); :meth:`ApiModel.to_dict` gives the wire form.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Optional, Union

from kubernetes.utils import parse_quantity  # the client's own quantity parser
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema
from pydantic.alias_generators import to_camel

from lookahead_canary import units

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


def _percent_in(lo: float, hi: float):
    """Validator: a wire percentage ('2%', '2.5%', 2) -> a fraction (0.02)."""
    def check(v: Any) -> Any:
        if isinstance(v, float) and not v.is_integer():
            # The CRD field is int-or-string (a structural schema has no int-or-float-or-string),
            # so a fraction has to be written as a string.
            raise ValueError(f"a fractional percentage must be a string like '{v:g}%', got the number {v!r}")
        return units.parse_percent(v, lo=lo, hi=hi) / 100.0
    return check


# The longest duration a policy field takes. Without a bound, a value such as '9999999h' overflows
# CEL's duration() (Go's int64 nanoseconds, about 2562047h) in the cross-field rules, and the
# apiserver answers a type-conversion error on `spec` that names no field.
MAX_DURATION = timedelta(hours=24)
MAX_DURATION_TEXT = "24h"
# DURATION_PATTERN with at most as many digits per part as a duration up to MAX_DURATION can need
# (99999h, 9999999m, 99999999s, 99999999999ms: more digits are more than 24h, leading zeros
# aside), so that CEL's duration() cannot overflow on a value it matches (32 characters at most:
# under 700000h in all).
BOUNDED_DURATION_PATTERN = (r"^([0-9]{1,5}(\.[0-9]+)?h|[0-9]{1,7}(\.[0-9]+)?m|[0-9]{1,8}(\.[0-9]+)?s"
                            r"|[0-9]{1,11}(\.[0-9]+)?ms)+$")
DURATION_LIMIT_MESSAGE = f"must be at most {MAX_DURATION_TEXT}"


def _duration_in(v: Any) -> Any:
    """Validator: a Go duration string ('2m') -> timedelta, at most ``MAX_DURATION``."""
    if isinstance(v, timedelta):
        td = v
    elif not isinstance(v, str) or not re.fullmatch(DURATION_PATTERN, v.strip()):
        raise ValueError(f"expected a duration like '90s', '2m' or '1h30m' (units ms, s, m, h), got {v!r}")
    else:
        td = timedelta(seconds=units.parse_duration(v)) \
            if re.fullmatch(BOUNDED_DURATION_PATTERN, v.strip()) else None
    if td is None or td > MAX_DURATION:
        raise ValueError(f"{DURATION_LIMIT_MESSAGE}, got {v if isinstance(v, str) else _duration_out(v)!r}")
    return td


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
        "description": "Cumulative share of the fleet's serving pods promoted by the end of this wave: '10%' or 10.",
    }),
]
# A Go duration on the wire ("2m"), a timedelta in Python.
Duration = Annotated[
    timedelta,
    BeforeValidator(_duration_in),
    PlainSerializer(_duration_out, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "maxLength": 32,
                    "description": f"A Go duration: '90s', '2m', '1h30m'; at most {MAX_DURATION_TEXT}.",
                    # on the field itself, so a value out of range is refused naming it (and the
                    # cross-field rules, guarded by _dur_ok, skip it rather than fail on duration())
                    "x-kubernetes-validations": [{
                        "rule": f"!self.matches(r'{DURATION_PATTERN}') || (self.matches(r'{BOUNDED_DURATION_PATTERN}')"
                                f" && duration(self) <= duration('{MAX_DURATION_TEXT}'))",
                        "message": DURATION_LIMIT_MESSAGE}]}),
]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


# Kubernetes' own label rules (apimachinery validation.IsQualifiedName, IsValidLabelValue), lengths
# included, which the patterns above leave to maxLength: a key's name part is at most 63
# characters, its prefix (a DNS subdomain) at most 253; a value at most 63.
LABEL_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: LABEL_KEY_PATTERN with the name part's 63-character limit (CEL and JSON schema: with
#: ``indexOf('/') <= 253`` and ``size <= 317`` it is Kubernetes' rule).
LABEL_KEY_STRICT_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_KEY_RULE = ("an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at most 63 "
                  "characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")
LABEL_VALUE_RULE = ("at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an "
                    "alphanumeric (or empty)")


def label_problem(key: Any, value: Any) -> Optional[str]:
    """Why ``key: value`` is not a Kubernetes label (as the apiserver would refuse it on an object's
    metadata.labels), ``None`` when it is one."""
    if not isinstance(key, str) or not isinstance(value, str):
        return f"label {key!r}: {value!r}: keys and values are strings"
    prefix, slash, name = key.rpartition("/")
    if (not re.fullmatch(LABEL_NAME_PATTERN, name)
            or (slash and (len(prefix) > 253 or not re.fullmatch(DNS_SUBDOMAIN_PATTERN, prefix)))):
        return f"label key {key!r} is not a valid Kubernetes label key: {LABEL_KEY_RULE}"
    if len(value) > 63 or not re.fullmatch(LABEL_VALUE_PATTERN, value):
        return f"label {key!r}: value {value!r} is not a valid Kubernetes label value: {LABEL_VALUE_RULE}"
    return None
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def _wave_value(w: Union[int, str]) -> int:
    pct = units.parse_percent(w, lo=1, hi=100)
    if not float(pct).is_integer():
        raise ValueError(f"a wave is a whole percent of the fleet, got {w!r}")
    return int(pct)


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


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# A point in time, written as RFC 3339 to the second (as Kubernetes writes metav1.Time).
Timestamp = Annotated[datetime, PlainSerializer(_rfc3339, return_type=str), Field(json_schema_extra={"format": "date-time"})]


# --------------------------------------------------------------------------------------------
# CEL helpers


def _cel(rule: str, message: str, field_path: Optional[str] = None, reason: Optional[str] = None) -> dict:
    out: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def _dur_ok(field: str) -> str:
    """CEL: ``field`` is present, a well-formed duration and at most ``MAX_DURATION`` (so
    ``duration()`` cannot fail on it; a malformed or too long one is reported once, on the field,
    by the pattern or the Duration type's own rule)."""
    obj, _, name = field.rpartition(".")
    return (f"(has({obj}.{name}) && {field}.matches(r'{BOUNDED_DURATION_PATTERN}')"
            f" && duration({field}) <= duration('{MAX_DURATION_TEXT}'))")


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
