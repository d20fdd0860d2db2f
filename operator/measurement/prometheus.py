"""Observations from Prometheus: what each role (canary / control) did in one step window.

``read_window(prom, engine_metrics, selector_labels, start, end) -> Observation`` reads, for the
series matching ``selector_labels`` (e.g. ``{"lookahead_dev_policy": "p", "lookahead_dev_role":
"canary"}``) in the window ``[start, end]`` (Unix seconds):

* per-token latency -- increase of the per-token histogram's ``_sum`` over the increase of its
  ``_count`` (vLLM: ``request_time_per_output_token``; never the per-chunk ITL, which is biased
  against speculation); if the engine lacks it, decode time / (generated tokens - requests);
* output throughput -- increase of the generation-tokens counter / window seconds;
* TTFT, e2e, queue, prefill and decode time -- histogram means, same way;
* acceptance rate -- increase of accepted draft tokens / increase of draft tokens (SGLang: only
  its gauge, averaged, and labelled as such);
* acceptance as users read it -- mean acceptance length, tokens per verification step,
  ``1 + accepted / drafts`` (SGLang: generated tokens / ``spec_verify_calls``; engines with only a
  gauge: its mean, labelled), and per-position acceptance, the increase of
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`` over the drafts' increase;
* mean running batch and waiting queue -- time average of the gauges per pod, averaged over pods;
* per-interval samples (throughput, per-token latency) for the sequential statistics.

One pipeline (the operator and ``kubectl lookahead analyze`` alike): an observation of one role
over one interval is an :class:`Increments` -- the increases of the engine's own counters and of
its per-token-latency histogram's buckets -- and :func:`paired_sample` turns the control's and the
canary's over one interval into the :class:`PairedSample` the statistics read
(``measure.paired_verdict``). Only the source of the increments differs: Prometheus
(:func:`prometheus_increments`, ``Observation.interval_increments``; the operator), or two direct
reads of the engine's ``/metrics`` (:func:`scrape_engine`, :func:`increments_between`; ``analyze``).

Every value is a :class:`Measured`: a number with ``state == "ok"``, or an explicit ``sparse``
(too little data: the estimate is kept but flagged) or ``missing`` (no series, nothing finished,
not scraped yet) state with the reason in words. Nothing missing ever reads as zero.

How increases are computed: not with PromQL ``increase()``, which extrapolates to the window
edges and so neither equals what the engine counted nor stays exact for short windows. Instead
the raw samples are fetched (``metric[range]`` at an evaluation time) and, per series, the
increase is taken from the last sample at or before ``start`` to the first sample at or after
``end``, adding across counter resets. With a quiet gap of one scrape between steps (the load
generator's ``after_step`` hook waits for it, see :func:`wait_scraped`), that is exactly what the
engine recorded for the step. A series that first appears inside the window counts from 0 (a new
pod, or labels created at the first observation); a window not yet scraped past its end is
``missing`` ("not scraped since the window end") until Prometheus catches up.

Labels the queries rely on (set by the pod harness / Prometheus relabelling from the labels the
operator puts on everything it creates, see docs/architecture.md):
``lookahead_dev_policy``, ``lookahead_dev_role`` (``canary`` | ``control`` | ``loadgen``),
``lookahead_dev_target`` (and ``lookahead_dev_policy_namespace``). DCGM series: ``namespace``,
``pod`` (dcgm-exporter's Kubernetes mapping), or ``exported_namespace``, ``exported_pod`` when
Prometheus scraped the exporter with ``honorLabels: false`` (its Helm chart's ServiceMonitor):
both are matched.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import statistics
import tempfile
import threading
import time
from collections import OrderedDict, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from lookahead_operator.api.names import PROM_LABEL_ROLE as LABEL_ROLE
from lookahead_operator.api.metric_names import MetricNames, metric_names
from lookahead_operator.measurement.acceptance import acceptance_length, position_key
from lookahead_operator.measurement.preflight import DCGM_MISSING_HINTS, DCGM_SIGNALS

#: How far before ``start`` to look for the baseline sample (Prometheus' own staleness limit).
DEFAULT_LOOKBACK_S = 300.0
DEFAULT_MIN_REQUESTS = 3

#: DCGM signal key -> dcgm-exporter metric (``preflight.DCGM_SIGNALS``); hints in ``DCGM_MISSING_HINTS``.
DCGM_METRICS = dict(DCGM_SIGNALS)
#: The label pairs a GPU series may carry the workload pod under: dcgm-exporter's own Kubernetes
#: mapping, and the same renamed by Prometheus when the exporter is scraped with honorLabels: false.
DCGM_POD_LABELS = (("namespace", "pod"), ("exported_namespace", "exported_pod"))


class ObservationError(RuntimeError):
    """Prometheus could not be queried (distinct from data being missing)."""


class State(str, Enum):
    OK = "ok"
    SPARSE = "sparse"
    MISSING = "missing"


class NotMeasured(ValueError):
    """Raised by ``float(m)`` on a value that is not ``ok``."""


@dataclass(frozen=True)
class Measured:
    """A value, or an explicit reason why there is none (or too little data behind it)."""

    state: State
    value: float | None = None
    reason: str = ""
    samples: int = 0          # requests (histograms), raw samples (gauges) or series behind the value
    unit: str = ""

    @classmethod
    def of(cls, value: float, samples: int = 0, unit: str = "", reason: str = "") -> "Measured":
        return cls(State.OK, float(value), reason, samples, unit)

    @classmethod
    def missing(cls, reason: str, unit: str = "") -> "Measured":
        return cls(State.MISSING, None, reason, 0, unit)

    @classmethod
    def sparse(cls, value: float | None, reason: str, samples: int = 0, unit: str = "") -> "Measured":
        return cls(State.SPARSE, None if value is None else float(value), reason, samples, unit)

    @property
    def ok(self) -> bool:
        return self.state is State.OK

    def __float__(self) -> float:
        if not self.ok or self.value is None:
            raise NotMeasured(f"{self.state.value}: {self.reason}")
        return self.value

    def get(self, default: float | None = None) -> float | None:
        """The value when ``ok``, else ``default``."""
        return self.value if self.ok else default

    def to_dict(self) -> dict:
        return {"state": self.state.value, "value": self.value, "reason": self.reason,
                "samples": self.samples, "unit": self.unit}

    def __str__(self) -> str:
        if self.value is not None:
            s = f"{self.value:.6g}{(' ' + self.unit) if self.unit else ''}"
            return s if self.ok else f"{s} ({self.state.value}: {self.reason})"
        return f"{self.state.value}: {self.reason}"


@dataclass
class IntervalSamples:
    """Per-interval samples inside a window, for the sequential statistics.

    ``t`` is each interval's end (Unix seconds, the sample time actually used); an interval in
    which no request finished has no per-token latency (``None``), never a zero. An interval with
    no new scrape has no entry (it is merged into the next one), so ``interval`` gives, per entry,
    the index of the nominal interval (``[start + k * interval_s, start + (k + 1) * interval_s]``)
    it ends: two roles read with the same bounds pair up by that index, never by list position.
    A scraped interval with zero tokens is an entry (a stall, 0 tok/s), not a gap.
    """

    t: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    output_tokens: list[float] = field(default_factory=list)
    output_tokens_per_s: list[float] = field(default_factory=list)
    requests: list[float] = field(default_factory=list)
    per_token_latency_s: list[float | None] = field(default_factory=list)
    interval: list[int] = field(default_factory=list)


@dataclass
class Observation:
    """One role in one window."""

    selector: dict
    start: float
    end: float
    engine: str
    per_token_latency_s: Measured
    per_token_latency_source: str
    output_tokens: Measured
    output_tokens_per_s: Measured
    requests: Measured
    ttft_s: Measured
    e2e_s: Measured
    queue_time_s: Measured
    prefill_time_s: Measured
    decode_time_s: Measured
    acceptance_rate: Measured
    draft_tokens: Measured
    accepted_tokens: Measured
    mean_running: Measured
    mean_waiting: Measured
    intervals: IntervalSamples
    notes: list[str] = field(default_factory=list)
    drafts: Measured = field(default_factory=lambda: Measured.missing("not read"))
    mean_acceptance_length: Measured = field(default_factory=lambda: Measured.missing("not read"))
    #: index = draft position (vLLM's ``position`` label); empty when unavailable (reason below)
    acceptance_by_position: list[Measured] = field(default_factory=list)
    acceptance_by_position_reason: str = ""
    #: the per-interval counter increases behind ``intervals``, one per interval of the window
    #: (None where Prometheus had no new scrape: merged into the next), for ``paired_sample``
    interval_increments: list["Increments | None"] = field(default_factory=list)

    @property
    def role(self) -> str | None:
        return self.selector.get(LABEL_ROLE)

    def values(self) -> dict[str, Measured]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, Measured)}

    def complete(self) -> bool:
        """The two numbers a decision needs are there."""
        return self.per_token_latency_s.ok and self.output_tokens_per_s.ok

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"selector": self.selector, "role": self.role, "start": self.start, "end": self.end,
                             "engine": self.engine, "per_token_latency_source": self.per_token_latency_source,
                             "notes": self.notes, "intervals": asdict(self.intervals),
                             "acceptance_by_position": [m.to_dict() for m in self.acceptance_by_position],
                             "acceptance_by_position_reason": self.acceptance_by_position_reason}
        for k, v in self.values().items():
            d[k] = v.to_dict()
        return d


# ---------------------------------------------------------------------------------------------
# One pipeline: increments -> paired sample (the operator and ``kubectl lookahead analyze`` alike)


@dataclass(frozen=True)
class Increments:
    """What one role's engines counted over one interval ``[start, end]`` (Unix seconds): the
    increase of each counter sample of their own ``/metrics`` (sample name -> increase, summed over
    series: ``vllm:generation_tokens_total``, ``vllm:inter_token_latency_seconds_sum`` / ``_count``,
    ``vllm:spec_decode_num_draft_tokens_total``, ...), and where read the per-token-latency
    histogram's bucket increases (``le`` -> count, ``+Inf`` included; for the tail comparison).

    Two sources make them, and nothing downstream knows which: two direct reads of the engine's
    ``/metrics`` (:func:`scrape_engine`, :func:`increments_between`; ``kubectl lookahead analyze``),
    or Prometheus (:func:`prometheus_increments`; the operator), whose ``start``/``end`` are the
    times of the samples the increase runs between."""

    start: float
    end: float
    counters: Mapping[str, float]
    buckets: Mapping[float, float] | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def get(self, name: str | None) -> float | None:
        return self.counters.get(name) if name else None


@dataclass(frozen=True)
class RoleSample:
    """One role's numbers for one interval, as the sequential statistics read them.

    ``per_token_latency_s``: None when no token after a request's first was observed (never 0);
    ``tokens_per_s``: 0.0 in a stall (the engine was read and generated nothing), None when there
    is no reading at all."""

    per_token_latency_s: float | None = None
    tokens_per_s: float | None = None
    output_tokens: float | None = None
    seconds: float | None = None
    requests: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    drafts: float | None = None
    buckets: Mapping[float, float] | None = None
    started: float | None = None   # requests that got their first token (the TTFT histogram's count)
    ttft_s: float | None = None    # their mean time to first token (None when none started)


@dataclass(frozen=True)
class PairedSample:
    """Control and canary over one interval (the same wall-clock window for the operator, which
    drives both at once; round i of each for ``analyze``, which alternates them)."""

    control: RoleSample
    canary: RoleSample


def _counter_names(m: MetricNames) -> list[str]:
    """The counter samples :func:`role_sample` reads."""
    names = [m.generation_tokens]
    if m.per_token_latency:
        names += [f"{m.per_token_latency}_sum", f"{m.per_token_latency}_count"]
    if m.e2e:
        names.append(f"{m.e2e}_count")
    if m.ttft:
        names += [f"{m.ttft}_count", f"{m.ttft}_sum"]
    if m.decode_time:
        names.append(f"{m.decode_time}_sum")
    names += [n for n in (m.drafts, m.draft_tokens, m.accepted_tokens) if n]
    return names


def role_sample(inc: Increments | None, m: MetricNames) -> RoleSample:
    """One role's sample from its increments over one interval:

    * per-token latency: increase of the per-token histogram's ``_sum`` / of its ``_count``
      (the reference engine's and SGLang's per-token ITL, vLLM's ``request_time_per_output_token``;
      never vLLM's per-chunk ITL); where the engine lacks it, decode time / (generated tokens -
      requests);
    * throughput: increase of the generated-tokens counter / the interval's seconds (0 in a stall);
    * the spec-decode counters' increases and the histogram's buckets, passed on for acceptance
      and the tail."""
    if inc is None:
        return RoleSample()
    gen = inc.get(m.generation_tokens)
    secs = inc.seconds
    requests = inc.get(f"{m.e2e}_count") if m.e2e else None
    ptl = None
    if m.per_token_latency:
        s, c = inc.get(f"{m.per_token_latency}_sum"), inc.get(f"{m.per_token_latency}_count")
        if s is not None and c is not None and c > 0:
            ptl = s / c
    elif m.decode_time and gen is not None and requests is not None:
        d = inc.get(f"{m.decode_time}_sum")
        if d is not None and gen - requests > 0:
            ptl = d / (gen - requests)
    return RoleSample(
        per_token_latency_s=ptl,
        tokens_per_s=(gen / secs) if gen is not None and secs > 0 else None,
        output_tokens=gen, seconds=secs, requests=requests,
        draft_tokens=inc.get(m.draft_tokens), accepted_tokens=inc.get(m.accepted_tokens), drafts=inc.get(m.drafts),
        buckets=dict(inc.buckets) if inc.buckets is not None else None,
        started=inc.get(f"{m.ttft}_count") if m.ttft else None,
        ttft_s=_ratio(inc.get(f"{m.ttft}_sum"), inc.get(f"{m.ttft}_count")) if m.ttft else None)


def _ratio(total: float | None, count: float | None) -> float | None:
    """A histogram's mean over an interval: its ``_sum`` increase over its ``_count`` increase."""
    return total / count if total is not None and count else None


def paired_sample(control: Increments | None, canary: Increments | None, m: MetricNames) -> PairedSample:
    """THE one function from an observation of both roles over one interval to the paired sample
    the statistics read, whichever source the increments came from (module docstring). ``None``
    for a role without a reading: its values are missing (the pair is left out), never 0."""
    return PairedSample(role_sample(control, m), role_sample(canary, m))


def _total(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) if vals else None


def summed_buckets(samples: Iterable[RoleSample]) -> dict[float, float] | None:
    """One role's per-token-latency buckets over all its intervals (None if any read lacks them)."""
    out: dict[float, float] = {}
    seen = False
    for s in samples:
        if s.tokens_per_s is None:
            continue            # no reading in this interval (merged into the next, or failed)
        if s.buckets is None:
            return None
        seen = True
        for le, v in s.buckets.items():
            out[le] = out.get(le, 0.0) + v
    return out if seen and math.inf in out else None


def acceptance_rate(samples: Iterable[RoleSample]) -> float | None:
    """Accepted / draft tokens over the intervals (None when nothing was drafted)."""
    samples = list(samples)
    d, a = _total(s.draft_tokens for s in samples), _total(s.accepted_tokens for s in samples)
    return a / d if d and a is not None else None


def mean_acceptance_length(samples: Iterable[RoleSample]) -> float | None:
    """Tokens per verification step over the intervals, bonus token included: 1 + accepted /
    drafts (an engine without an accepted-token counter: generated / drafts, as SGLang)."""
    samples = list(samples)
    return acceptance_length(_total(s.drafts for s in samples), _total(s.accepted_tokens for s in samples),
                             _total(s.output_tokens for s in samples))


# --- the direct source: an engine's own /metrics --------------------------------------------


@dataclass(frozen=True)
class EngineScrape:
    """One read of an engine's ``/metrics``: sample name -> value summed over label sets (the
    per-position acceptance counter also per position, under ``acceptance.position_key``), and the
    per-token-latency histogram's cumulative buckets (``le`` -> count)."""

    t: float
    values: Mapping[str, float]
    buckets: Mapping[float, float] | None = None


def parse_exposition(text: str, bucket_metric: str | None = None) -> tuple[dict[str, float], dict[float, float]]:
    """Prometheus text exposition -> (sample name -> value summed over label sets, ``_bucket`` and
    ``_created`` samples left out; buckets of ``bucket_metric`` (base name) by ``le``, summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    buckets: dict[float, float] = {}
    want = f"{bucket_metric}_bucket" if bucket_metric else None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                if s.name == want and "le" in s.labels:
                    le = _le_of((("le", s.labels["le"]),))
                    buckets[le] = buckets.get(le, 0.0) + float(s.value)
                continue
            if s.name.endswith("_created"):
                continue
            values[s.name] = values.get(s.name, 0.0) + float(s.value)
            if POSITION_LABEL in s.labels:
                key = position_key(s.name, int(s.labels[POSITION_LABEL]))
                values[key] = values.get(key, 0.0) + float(s.value)
    return values, buckets


def scrape_engine(url: str, engine_metrics: MetricNames | str | None = None, timeout: float = 10.0) -> EngineScrape:
    """Read an engine's ``/metrics`` once (``urllib``; raises ``OSError`` when it cannot). The time
    is the middle of the request (the engine renders its counters while answering)."""
    import urllib.request

    m = engine_metrics if isinstance(engine_metrics, MetricNames) or engine_metrics is None \
        else metric_names(engine_metrics)
    t0 = time.time()
    with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    t1 = time.time()
    values, buckets = parse_exposition(text, m.per_token_latency if m is not None else None)
    return EngineScrape(t=(t0 + t1) / 2.0, values=values, buckets=buckets or None)


def increments_between(before: EngineScrape, after: EngineScrape) -> Increments:
    """The direct source of :class:`Increments`: what the engine counted between two reads of its
    ``/metrics``. A value that went down is a restart: the new value is all new (as Prometheus
    counts a counter reset)."""
    if after.t <= before.t:
        raise ValueError(f"snapshots out of order: {before.t} then {after.t}")

    def inc(b: float | None, a: float) -> float:
        return a - (b or 0.0) if a >= (b or 0.0) else a

    counters = {k: inc(before.values.get(k), v) for k, v in after.values.items()}
    buckets = None
    if after.buckets is not None and before.buckets is not None:
        buckets = {le: inc(before.buckets.get(le), v) for le, v in sorted(after.buckets.items())}
    elif after.buckets is not None:
        buckets = dict(sorted(after.buckets.items()))
    return Increments(start=before.t, end=after.t, counters=counters, buckets=buckets)


# ---------------------------------------------------------------------------------------------
# Prometheus access


class CredentialsError(ObservationError):
    """What ``analysis.prometheus`` names could not be read (a Secret, a ConfigMap, a key): the
    message names the field and the object, never a value. Like an unreachable Prometheus, it is
    data for the state machine (``MetricsAvailable=False``), not a crash."""


@dataclass(frozen=True)
class PrometheusAccess:
    """How to reach one Prometheus: ``analysis.prometheus`` with its Secrets resolved
    (``access_from_spec``). The clients are cached by the whole value (``connect``), so a changed
    Secret makes a new client. ``error``: what could not be read (``connect`` raises it)."""

    url: str
    bearer_token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    error: str | None = None

    def http_headers(self) -> dict[str, str]:
        """Every header sent with a query: the spec's, and the bearer token's ``Authorization``."""
        out = dict(self.headers)
        if self.bearer_token is not None:
            out["Authorization"] = f"Bearer {self.bearer_token}"
        return out


#: ``read(kind, name, key)``: the text of a key of a Secret or ConfigMap in the policy's namespace
#: (``kind``: "Secret" or "ConfigMap"); a ``LookupError`` saying why when it cannot be read.
KeyReader = Callable[[str, str, str], str]

_TOKEN = re.compile(r"^[\x21-\x7e]+$")   # one line of visible ASCII: what a header value can carry


def access_from_spec(spec: Any, read: KeyReader | None = None) -> PrometheusAccess:
    """``analysis.prometheus`` (an ``api.spec.PrometheusSpec``) -> a ``PrometheusAccess``, its
    Secrets and ConfigMap read with ``read`` (the operator's: ``Kube.data_key`` in the policy's
    namespace). What cannot be read is the access's ``error``, naming the field."""
    url = spec.url.rstrip("/")
    headers = tuple(sorted((spec.headers or {}).items()))
    tls = spec.tls_config
    where, what = "", ""

    def value(path: str, kind: str, ref: Any) -> str:
        nonlocal where, what
        where, what = f"analysis.prometheus.{path}", f"{kind} {ref.name} key {ref.key!r}"
        if read is None:
            raise LookupError(f"{kind} {ref.name} was not read (no reader given)")
        return read(kind, ref.name, ref.key)

    try:
        token = basic = ca = None
        if spec.bearer_token_secret is not None:
            token = value("bearerTokenSecret", "Secret", spec.bearer_token_secret).strip()
            if not _TOKEN.match(token):
                raise LookupError(f"{what} is empty or not one line of printable ASCII")
        if spec.basic_auth is not None:
            user = value("basicAuth.username", "Secret", spec.basic_auth.username).strip()
            password = value("basicAuth.password", "Secret", spec.basic_auth.password).strip()
            basic = (user, password)
        if tls is not None and tls.ca is not None:
            ref, kind = (tls.ca.secret, "Secret") if tls.ca.secret is not None else (tls.ca.config_map, "ConfigMap")
            ca = value(f"tlsConfig.ca.{'secret' if kind == 'Secret' else 'configMap'}", kind, ref)
            if "-----BEGIN CERTIFICATE-----" not in ca:
                raise LookupError(f"{what} holds no PEM certificate")
    except LookupError as exc:
        msg = str(exc.args[0]) if exc.args else str(exc)
        return PrometheusAccess(url=url, headers=headers, error=f"{where}: {msg}")
    return PrometheusAccess(url=url, bearer_token=token, basic_auth=basic, ca_pem=ca,
                            insecure_skip_verify=bool(tls is not None and tls.insecure_skip_verify), headers=headers)


#: Clients kept (least recently used first out): one per access, so connections are reused.
MAX_CLIENTS = 64
_clients: "OrderedDict[tuple[PrometheusAccess, float | None], Any]" = OrderedDict()
_clients_lock = threading.Lock()


def _ca_file(pem: str) -> str:
    """A file holding ``pem`` (requests verifies against a file): named by its content, in a
    private directory under the temp dir (the chart mounts an emptyDir there)."""
    d = Path(tempfile.gettempdir()) / f"lookahead-prometheus-ca-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    path = d / f"{hashlib.sha256(pem.encode()).hexdigest()}.pem"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(pem)
        os.replace(tmp, path)
    return str(path)


def connect(access: PrometheusAccess, timeout: float | None = None) -> Any:
    """The one builder of Prometheus clients (``prometheus_api_client.PrometheusConnect``): the
    access's headers (the bearer token's among them), basic auth, and TLS verification against
    its CA bundle (else the system's, or none with ``insecureSkipVerify``); one quick retry on a
    gateway error. Cached per access (URL and credentials) and ``timeout``. Raises
    ``CredentialsError`` for an access whose Secrets could not be read."""
    if access.error:
        raise CredentialsError(access.error)
    key = (access, timeout)
    with _clients_lock:
        client = _clients.get(key)
        if client is not None:
            _clients.move_to_end(key)
            return client
    import requests
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    session = requests.Session()
    session.verify = False if access.insecure_skip_verify else (_ca_file(access.ca_pem) if access.ca_pem else True)
    client = PrometheusConnect(url=access.url, headers=access.http_headers() or None, auth=access.basic_auth,
                               session=session, timeout=timeout,
                               retry=Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504]))
    with _clients_lock:
        _clients[key] = client
        while len(_clients) > MAX_CLIENTS:
            _clients.popitem(last=False)   # not closed: a pass may still be using it
    return client


def _client(prom: Any):
    """A client for ``prom``: a URL (no credentials), a ``PrometheusAccess``, or a client already."""
    if isinstance(prom, str):
        return connect(PrometheusAccess(url=prom.rstrip("/")))
    if isinstance(prom, PrometheusAccess):
        return connect(prom)
    return prom


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(labels: Mapping[str, str], regex: Mapping[str, str] | None = None) -> str:
    """``{k="v",...}`` (and ``k=~"re"`` for ``regex``)."""
    parts = [f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())]
    parts += [f'{k}=~"{_escape(v)}"' for k, v in sorted((regex or {}).items())]
    return "{" + ",".join(parts) + "}"


Series = list[tuple[float, float]]


def raw_samples(prom: Any, metric: str, sel: str, since: float, until: float) -> dict[tuple, Series]:
    """Raw samples of ``metric{sel}`` with timestamps in ``(since, until]``, per series."""
    client = _client(prom)
    rng = max(1, int(math.ceil(until - since)))
    query = f"{metric}{sel}[{rng}s]"
    try:
        result = client.custom_query(query=query, params={"time": f"{until:.3f}"})
    except Exception as exc:  # noqa: BLE001 - prometheus-api-client raises several types
        raise ObservationError(f"query {query!r} failed: {exc}") from exc
    out: dict[tuple, Series] = {}
    for r in result or []:
        labels = tuple(sorted((k, v) for k, v in r.get("metric", {}).items() if k != "__name__"))
        pts = sorted((float(t), float(v)) for t, v in r.get("values", []))
        if pts:
            out[labels] = pts
    return out


@dataclass
class _Delta:
    value: float = 0.0
    series: int = 0
    born_inside: int = 0        # series with no sample at/before start (counted from 0)
    unscraped: int = 0          # series with no sample at/after end yet
    final_t: float = 0.0        # latest end-sample time used
    base_t: float = math.inf    # earliest baseline time used


def _value_before(pts: Series, t: float) -> tuple[float, float] | None:
    best = None
    for p in pts:
        if p[0] <= t + 1e-9:
            best = p
        else:
            break
    return best


def _value_after(pts: Series, t: float) -> tuple[float, float] | None:
    for p in pts:
        if p[0] >= t - 1e-9:
            return p
    return None


def _counter_increase(pts: Series, t0: float, t1: float) -> tuple[float, tuple[float, float] | None,
                                                                   tuple[float, float] | None, bool]:
    """Increase between the last sample <= t0 and the first sample >= t1 (resets added).

    Returns (increase, base point, end point, born_inside). End point None: not scraped yet.
    """
    base = _value_before(pts, t0)
    born = base is None
    end = _value_after(pts, t1)
    if end is None:
        return 0.0, base, None, born
    seg = [p for p in pts if (base is None or p[0] >= base[0]) and p[0] <= end[0]]
    prev = 0.0 if born else seg[0][1]
    inc = 0.0
    for _, v in (seg if born else seg[1:]):
        inc += v - prev if v >= prev else v   # a drop is a counter reset: the new value is all new
        prev = v
    return inc, base if base else (seg[0][0], 0.0), end, born


def _delta(all_series: Mapping[tuple, Series], t0: float, t1: float, count_ended: bool = False) -> _Delta:
    """Reset-aware increases over [t0, t1], summed over series. A series with no sample at or after
    t1 is not scraped yet (``unscraped``), unless ``count_ended``: then it ended before t1 (its pod
    went away) and counts up to its last sample."""
    d = _Delta()
    for pts in all_series.values():
        inc, base, end, born = _counter_increase(pts, t0, t1)
        if end is None and count_ended and pts:
            inc, base, end, born = _counter_increase(pts, t0, pts[-1][0])
        d.series += 1
        if end is None:
            d.unscraped += 1
            continue
        d.value += inc
        d.born_inside += int(born)
        d.final_t = max(d.final_t, end[0])
        if base:
            d.base_t = min(d.base_t, base[0])
    return d


class _Reader:
    """Fetches raw samples once per metric for a window and answers delta / gauge questions."""

    def __init__(self, prom: Any, labels: Mapping[str, str], start: float, end: float,
                 lookback_s: float = DEFAULT_LOOKBACK_S, now: float | None = None,
                 regex: Mapping[str, str] | None = None, count_ended: bool = False):
        self.prom = _client(prom)
        self.sel = selector(labels, regex)
        self.count_ended = count_ended   # see _delta
        self.start = start
        self.end = end
        self.since = start - lookback_s
        now = time.time() if now is None else now
        self.until = max(end, min(now, end + lookback_s))
        self._cache: dict[str, dict[tuple, Series]] = {}

    def series(self, metric: str) -> dict[tuple, Series]:
        if metric not in self._cache:
            self._cache[metric] = raw_samples(self.prom, metric, self.sel, self.since, self.until)
        return self._cache[metric]

    def delta(self, metric: str, t0: float | None = None, t1: float | None = None) -> _Delta | None:
        s = self.series(metric)
        if not s:
            return None
        return _delta(s, self.start if t0 is None else t0, self.end if t1 is None else t1, self.count_ended)

    def prefetch(self, metrics: Iterable[str | None]) -> None:
        """Fetch ``metrics`` at once (one request each, in parallel): the answers are cached for
        ``series``; the first failure is raised, as ``series`` would raise it."""
        todo = [mt for mt in dict.fromkeys(metrics) if mt and mt not in self._cache]
        if len(todo) < 2:
            return
        with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
            for metric, got in zip(todo, pool.map(lambda mt: raw_samples(self.prom, mt, self.sel, self.since,
                                                                         self.until), todo)):
                self._cache[metric] = got

    def gauge_points(self, metric: str) -> dict[tuple, list[float]]:
        out = {}
        for labels, pts in self.series(metric).items():
            vals = [v for t, v in pts if self.start - 1e-9 <= t <= self.end + 1e-9]
            out[labels] = vals
        return out


def counter_rate(prom: Any, metric: str, labels: Mapping[str, str], start: float, end: float,
                 regex: Mapping[str, str] | None = None) -> float | None:
    """Counter ``metric``'s increase per second over [start, end], summed over the series selected,
    over the part of the span its samples cover (series born inside it count from their first
    sample: a fleet that started serving a minute ago has a minute's rate, not a fifth of it);
    None when nothing was scraped there."""
    d = _Reader(prom, labels, start, end, regex=regex, count_ended=True).delta(metric)
    if d is None or not d.series:
        return None
    span = d.final_t - max(d.base_t, start)
    return d.value / span if span > 0 else None


def gauge_series_means(prom: Any, metric: str, labels: Mapping[str, str], bounds: Sequence[float],
                       regex: Mapping[str, str] | None = None) -> list[list[float]]:
    """Per interval between consecutive ``bounds``: the gauge ``metric``'s mean over its samples
    in the interval, one per series that ``labels`` and ``regex`` select and that was scraped there
    (a pod's mean running requests, one value per pod; empty where none was). One read."""
    series = raw_samples(prom, metric, selector(labels, regex), bounds[0], bounds[-1])
    return [[statistics.fmean(v) for pts in series.values() if (v := [x for t, x in pts if a < t <= z])]
            for a, z in zip(bounds, bounds[1:])]


def merged(incs: Sequence["Increments | None"]) -> "Increments | None":
    """Consecutive intervals' increments as one interval's: from the first's start to the last's
    end, each counter summed (buckets left out); None when none was read."""
    read = [i for i in incs if i is not None]
    if not read:
        return None
    counters: dict[str, float] = {}
    for inc in read:
        for name, value in inc.counters.items():
            counters[name] = counters.get(name, 0.0) + value
    return Increments(start=read[0].start, end=read[-1].end, counters=counters)


def counter_increase(prom: Any, metric: str, labels: Mapping[str, str], start: float, end: float,
                     regex: Mapping[str, str] | None = None, count_ended: bool = False) -> float | None:
    """The increase of counter ``metric`` over [start, end] (Unix seconds), summed over the series
    ``labels`` and ``regex`` select: reset-aware, from the raw samples, up to the newest sample when
    ``end`` is not scraped yet. None when no series matches (nothing scraped there at all)."""
    d = _Reader(prom, labels, start, end, regex=regex, count_ended=count_ended).delta(metric)
    return None if d is None else d.value


def increases_by_label(prom, metric: str, label: str, labels: dict[str, str], start: datetime, end: datetime,
                       now: float | None = None, regex: dict[str, str] | None = None,
                       count_ended: bool = False) -> dict[str, float] | None:
    """The increase of counter ``metric`` over [start, end] per value of ``label``, summed over the
    series ``labels`` (and ``regex``) select: exact reset-aware increases from the raw samples, as
    ``prometheus`` reads every counter (no PromQL ``increase()`` extrapolation). Series without
    ``label`` are left out. None when there is no such series or one is not scraped past ``end``
    yet. ``count_ended``: a series that ended inside the window counts up to its last sample."""
    t0, t1 = start.timestamp(), end.timestamp()
    if t1 <= t0:
        return None
    now = time.time() if now is None else now
    lookback = DEFAULT_LOOKBACK_S
    until = max(t1, min(now, t1 + lookback))
    series = raw_samples(prom, metric, selector(labels, regex), t0 - lookback, until)
    groups: dict[str, dict[tuple, Any]] = defaultdict(dict)
    for key, pts in series.items():
        value = dict(key).get(label)
        if value is not None:
            groups[value][key] = pts
    out = {}
    for value, group in groups.items():
        d = _delta(group, t0, t1, count_ended)
        if d.unscraped:
            return None
        out[value] = d.value
    return out or None


def _not_scraped_reason(metric: str, sel: str, end: float) -> str:
    return f"{metric}{sel} not scraped since the window end ({end:.3f}) yet"


def _histogram_mean(r: _Reader, base: str | None, unit: str, min_requests: int, what: str) -> Measured:
    if not base:
        return Measured.missing(f"the engine exports no {what} histogram", unit)
    s = r.delta(f"{base}_sum")
    c = r.delta(f"{base}_count")
    if s is None or c is None:
        return Measured.missing(f"no series {base}{r.sel}", unit)
    if c.unscraped or s.unscraped:
        return Measured.missing(_not_scraped_reason(base, r.sel, r.end), unit)
    n = int(round(c.value))
    if n <= 0:
        return Measured.missing(f"no requests finished in the window ({base}_count did not increase)", unit)
    mean = s.value / c.value
    if n < min_requests:
        return Measured.sparse(mean, f"only {n} request(s) finished (< {min_requests})", n, unit)
    return Measured.of(mean, n, unit)


def _gauge_mean(r: _Reader, metric: str | None, what: str) -> Measured:
    if not metric:
        return Measured.missing(f"the engine exports no {what} gauge")
    pts = r.gauge_points(metric)
    if not pts:
        return Measured.missing(f"no series {metric}{r.sel}")
    per_series = [statistics.fmean(v) for v in pts.values() if v]
    n = sum(len(v) for v in pts.values())
    if not per_series:
        return Measured.missing(f"no samples of {metric}{r.sel} inside the window")
    mean = statistics.fmean(per_series)
    if min(len(v) for v in pts.values() if v) < 2:
        return Measured.sparse(mean, f"fewer than 2 scrapes of {metric} inside the window", n)
    return Measured.of(mean, n)


def read_window(prom: Any, engine_metrics: MetricNames | str, selector_labels: Mapping[str, str],
            start: float, end: float, *, interval_s: float | None = None,
            min_requests: int = DEFAULT_MIN_REQUESTS, lookback_s: float = DEFAULT_LOOKBACK_S,
            now: float | None = None, tail_buckets: bool = False) -> Observation:
    """Observe one role (``selector_labels``) in one window ``[start, end]`` (Unix seconds).

    ``prom``: a Prometheus URL or a ``PrometheusConnect``. ``interval_s``: length of the
    per-interval samples (default: a tenth of the window, at least 1 s); use at least the
    scrape interval. ``tail_buckets``: the per-interval increments (``interval_increments``) also
    carry the per-token-latency histogram's buckets (for the tail comparison).
    """
    if end <= start:
        raise ValueError(f"empty window: end {end} <= start {start}")
    m = engine_metrics if isinstance(engine_metrics, MetricNames) else metric_names(engine_metrics)
    r = _Reader(prom, selector_labels, start, end, lookback_s=lookback_s, now=now)
    window = end - start
    notes: list[str] = []

    # --- tokens and throughput
    gen = r.delta(m.generation_tokens)
    if gen is None:
        output_tokens = tput = Measured.missing(f"no series {m.generation_tokens}{r.sel}")
    elif gen.unscraped:
        output_tokens = tput = Measured.missing(_not_scraped_reason(m.generation_tokens, r.sel, end))
    elif gen.value <= 0:
        output_tokens = tput = Measured.missing("no tokens generated in the window (no load reached these pods)")
    else:
        if gen.born_inside:
            notes.append(f"{gen.born_inside} series of {m.generation_tokens} started inside the window "
                         "(counted from 0)")
        output_tokens = Measured.of(gen.value, gen.series, "tokens")
        tput = Measured.of(gen.value / window, gen.series, "tokens/s")

    # --- latency histograms
    ttft = _histogram_mean(r, m.ttft, "s", min_requests, "TTFT")
    e2e = _histogram_mean(r, m.e2e, "s", min_requests, "end-to-end latency")
    queue = _histogram_mean(r, m.queue_time, "s", min_requests, "queue time")
    prefill = _histogram_mean(r, m.prefill_time, "s", min_requests, "prefill time")
    decode = _histogram_mean(r, m.decode_time, "s", min_requests, "decode time")
    count_metric = next((f"{b}_count" for b in (m.e2e, m.ttft, m.per_token_latency) if b), None)
    cnt = r.delta(count_metric) if count_metric else None
    if cnt is None:
        requests = Measured.missing("no request-count series")
    elif cnt.unscraped:
        requests = Measured.missing(_not_scraped_reason(count_metric, r.sel, end))
    elif cnt.value <= 0:
        requests = Measured.missing("no requests finished in the window")
    else:
        requests = Measured.of(cnt.value, int(cnt.value), "requests")

    source = "per_token_histogram"
    ptl = _histogram_mean(r, m.per_token_latency, "s", min_requests, "per-token latency")
    if ptl.state is State.MISSING and m.decode_time and decode.value is not None and gen is not None \
            and not gen.unscraped and requests.value:
        # decode time covers every token after each request's first
        tokens_after_first = gen.value - requests.value
        dsum = r.delta(f"{m.decode_time}_sum")
        if tokens_after_first > 0 and dsum is not None:
            value = dsum.value / tokens_after_first
            source = "decode_time/generated_tokens"
            ptl = (Measured.of(value, int(requests.value), "s") if decode.ok else
                   Measured.sparse(value, decode.reason, int(requests.value), "s"))

    # --- acceptance
    draft_tokens = accepted = acceptance = None
    if m.draft_tokens and m.accepted_tokens:
        dd, da = r.delta(m.draft_tokens), r.delta(m.accepted_tokens)
        if dd is None or da is None:
            acceptance = Measured.missing(f"no series {m.draft_tokens}{r.sel} (speculation off, or not reported)")
        elif dd.unscraped or da.unscraped:
            acceptance = Measured.missing(_not_scraped_reason(m.draft_tokens, r.sel, end))
        elif dd.value <= 0:
            acceptance = Measured.missing("no draft tokens in the window (speculation off, or off at this batch size)")
        else:
            acceptance = Measured.of(da.value / dd.value, int(dd.value), "ratio")
        if dd is not None and not dd.unscraped:
            draft_tokens = Measured.of(dd.value, dd.series, "tokens") if dd.value > 0 else \
                Measured.missing("no draft tokens in the window")
        if da is not None and not da.unscraped:
            accepted = Measured.of(da.value, da.series, "tokens") if dd is not None and dd.value > 0 else \
                Measured.missing("no draft tokens in the window")
    elif m.acceptance_rate_gauge:
        g = _gauge_mean(r, m.acceptance_rate_gauge, "acceptance rate")
        acceptance = Measured(g.state, g.value, ("from a point-in-time gauge (the engine exports no "
                                                "acceptance counters)" + (f"; {g.reason}" if g.reason else "")),
                              g.samples, "ratio")
    else:
        acceptance = Measured.missing("the engine exports no acceptance metrics")
    draft_tokens = draft_tokens or Measured.missing("the engine exports no draft-token counter")
    accepted = accepted or Measured.missing("the engine exports no accepted-token counter")
    drafts, mean_length, by_position, by_position_reason = _acceptance_detail(r, m, gen)

    running = _gauge_mean(r, m.running, "running requests")
    waiting = _gauge_mean(r, m.waiting, "waiting requests")

    increments = _interval_increments(r, m, _bounds(start, end, interval_s or max(1.0, window / 10.0)),
                                      buckets=tail_buckets)
    intervals = _interval_samples(increments, m)
    return Observation(selector=dict(selector_labels), start=start, end=end, engine=m.engine,
                       per_token_latency_s=ptl, per_token_latency_source=source, output_tokens=output_tokens,
                       output_tokens_per_s=tput, requests=requests, ttft_s=ttft, e2e_s=e2e, queue_time_s=queue,
                       prefill_time_s=prefill, decode_time_s=decode, acceptance_rate=acceptance,
                       draft_tokens=draft_tokens, accepted_tokens=accepted, mean_running=running,
                       mean_waiting=waiting, intervals=intervals, notes=notes, drafts=drafts,
                       mean_acceptance_length=mean_length, acceptance_by_position=by_position,
                       acceptance_by_position_reason=by_position_reason, interval_increments=increments)


POSITION_LABEL = "position"


def _acceptance_detail(r: _Reader, m: MetricNames, gen: _Delta | None
                       ) -> tuple[Measured, Measured, list[Measured], str]:
    """(drafts, mean acceptance length, per-position acceptance, why per-position is empty).

    Mean acceptance length is tokens per verification step, bonus token included, as vLLM defines
    it: ``1 + increase(accepted) / increase(drafts)``. SGLang has no accepted-token counter; its
    ``spec_verify_calls_total`` and ``generation_tokens_total`` both move when a request finishes,
    so over the same window ``generated / verify calls`` is the same quantity (each request's first
    token, from prefill, is counted too). An engine with only an acceptance-length gauge gets the
    gauge's mean, labelled as such. Per position ``k``: ``increase(accepted_per_pos{position=k}) /
    increase(drafts)``, the share of drafts whose ``k``-th token was accepted.
    """
    dd = r.delta(m.drafts) if m.drafts else None
    if not m.drafts:
        drafts = Measured.missing("the engine exports no drafts counter")
    elif dd is None:
        drafts = Measured.missing(f"no series {m.drafts}{r.sel} (speculation off, or not reported)")
    elif dd.unscraped:
        drafts = Measured.missing(_not_scraped_reason(m.drafts, r.sel, r.end))
    elif dd.value <= 0:
        drafts = Measured.missing("no drafts in the window (speculation off, or off at this batch size)")
    else:
        drafts = Measured.of(dd.value, dd.series, "drafts")

    unit = "tokens/step"
    if m.drafts and m.accepted_tokens and (dd is not None or not m.acceptance_length_gauge):
        da = r.delta(m.accepted_tokens)
        if not drafts.ok:
            length = Measured.missing(drafts.reason, unit)
        elif da is None:
            length = Measured.missing(f"no series {m.accepted_tokens}{r.sel}", unit)
        elif da.unscraped:
            length = Measured.missing(_not_scraped_reason(m.accepted_tokens, r.sel, r.end), unit)
        else:
            length = Measured.of(acceptance_length(drafts.value, da.value, None), int(drafts.value), unit)
    elif m.drafts and (dd is not None or not m.acceptance_length_gauge):
        if not drafts.ok:
            length = Measured.missing(drafts.reason, unit)
        elif gen is None or gen.unscraped or gen.value <= 0:
            length = Measured.missing(f"no generated tokens of {m.generation_tokens}{r.sel} in the window", unit)
        else:
            length = Measured.of(acceptance_length(drafts.value, None, gen.value), int(drafts.value), unit,
                                 reason=f"{m.generation_tokens} / {m.drafts} (both counted when a request "
                                        "finishes; each request's first token, from prefill, included)")
    elif m.acceptance_length_gauge:
        g = _gauge_mean(r, m.acceptance_length_gauge, "acceptance length")
        length = Measured(g.state, g.value, ("from a point-in-time gauge (the engine exports no drafts "
                                             "counter)" + (f"; {g.reason}" if g.reason else "")), g.samples, unit)
    else:
        length = Measured.missing("the engine exports no acceptance-length metrics", unit)

    by_position: list[Measured] = []
    if not m.accepted_per_position:
        return drafts, length, by_position, "the engine exports no per-position acceptance counter"
    if not drafts.ok:
        return drafts, length, by_position, drafts.reason
    groups: dict[int, dict[tuple, Series]] = {}
    for labels, pts in r.series(m.accepted_per_position).items():
        pos = dict(labels).get(POSITION_LABEL, "")
        if pos.isdigit():
            groups.setdefault(int(pos), {})[labels] = pts
    if not groups:
        return drafts, length, by_position, f"no series {m.accepted_per_position}{r.sel}"
    for pos in range(max(groups) + 1):
        if pos not in groups:
            by_position.append(Measured.missing(f"no series for position {pos}", "ratio"))
            continue
        d = _delta(groups[pos], r.start, r.end)
        if d.unscraped:
            return drafts, length, [], _not_scraped_reason(m.accepted_per_position, r.sel, r.end)
        by_position.append(Measured.of(d.value / drafts.value, int(drafts.value), "ratio"))
    return drafts, length, by_position, ""


def _point_at(pts: Series, b: float, is_start: bool, is_end: bool) -> tuple[float, float] | None:
    if is_end:
        return _value_after(pts, b)
    return _value_before(pts, b)


def _series_boundary_values(pts: Series, bounds: Sequence[float]) -> list[tuple[float, float] | None]:
    """Per boundary: (sample time, reset-corrected cumulative value)."""
    # reset-corrected running total
    corrected: Series = []
    total = 0.0
    prev = None
    for t, v in pts:
        if prev is None:
            total = v
        else:
            total += v - prev if v >= prev else v
        prev = v
        corrected.append((t, total))
    out = []
    for i, b in enumerate(bounds):
        p = _point_at(corrected, b, i == 0, i == len(bounds) - 1)
        if p is None and corrected and b < corrected[0][0]:
            # series born inside the window: it was 0 before its first sample
            p = (b, 0.0)
        out.append(p)
    return out


def _bounds(start: float, end: float, interval_s: float) -> list[float]:
    """``start, start + interval_s, ...`` and ``end``: the last interval takes the remainder."""
    n = max(1, int(math.ceil((end - start) / interval_s - 1e-9)))
    return [start + k * interval_s for k in range(n)] + [end]


def _boundary_values(r: _Reader, metric: str | None, bounds: Sequence[float],
                     group: Callable[[tuple], Any] | None = None) -> dict[Any, list[tuple[float, float] | None]] | None:
    """Per boundary: (sample time, reset-corrected cumulative value summed over the series of
    ``metric``), None where a series has no sample there yet. ``group``: sum the series per key of
    their labels instead (the ``le`` of a histogram's buckets); without it, one key, None."""
    if not metric:
        return None
    series = r.series(metric)
    if not series:
        return None
    by_key: dict[Any, list[list[tuple[float, float] | None]]] = {}
    for labels, pts in series.items():
        key = group(labels) if group else None
        if group and key is None:
            continue
        by_key.setdefault(key, []).append(_series_boundary_values(pts, bounds))
    out: dict[Any, list[tuple[float, float] | None]] = {}
    for key, cols in by_key.items():
        agg: list[tuple[float, float] | None] = []
        for k in range(len(bounds)):
            pts = [c[k] for c in cols]
            agg.append(None if any(p is None for p in pts) else (max(p[0] for p in pts), sum(p[1] for p in pts)))
        out[key] = agg
    return out or None


def _le_of(labels: tuple) -> float | None:
    le = dict(labels).get("le")
    if le is None:
        return None
    return math.inf if le.strip().lower() in ("+inf", "inf") else float(le)


def _interval_increments(r: _Reader, m: MetricNames, bounds: Sequence[float],
                         buckets: bool = False) -> list["Increments | None"]:
    """The Prometheus source of :class:`Increments`: one per interval ``[bounds[k], bounds[k+1]]``,
    from the raw samples (reset-aware; the last sample at or before an inner boundary, the first at
    or after the last one). An interval without a new scrape of the generation counter is ``None``
    and merged into the next (which then spans both), so the list stays aligned with ``bounds``:
    the same bounds for two roles give pairs by position."""
    names = _counter_names(m)
    cols = {name: _boundary_values(r, name, bounds) for name in names}
    gen = (cols.get(m.generation_tokens) or {}).get(None)
    hist = (_boundary_values(r, f"{m.per_token_latency}_bucket", bounds, group=_le_of)
            if buckets and m.per_token_latency else None)
    out: list[Increments | None] = []
    if gen is None:
        return [None] * (len(bounds) - 1)
    last = 0
    for k in range(1, len(bounds)):
        a, b = gen[last], gen[k]
        if a is None or b is None or b[0] - a[0] <= 1e-9:
            out.append(None)   # no new scrape in this interval: merged into the next
            continue
        counters = {}
        for name, col in cols.items():
            vals = (col or {}).get(None)
            if vals and vals[k] is not None and vals[last] is not None:
                counters[name] = vals[k][1] - vals[last][1]
        bk = None
        if hist is not None and math.inf in hist and all(v[k] is not None and v[last] is not None
                                                         for v in hist.values()):
            bk = {le: v[k][1] - v[last][1] for le, v in sorted(hist.items())}
        out.append(Increments(start=a[0], end=b[0], counters=counters, buckets=bk))
        last = k
    return out


def _interval_samples(incs: Sequence["Increments | None"], m: MetricNames) -> IntervalSamples:
    """``IntervalSamples`` of the intervals that have a reading (``role_sample`` of each)."""
    out = IntervalSamples()
    for k, inc in enumerate(incs):
        if inc is None:
            continue
        s = role_sample(inc, m)
        out.interval.append(k)
        out.t.append(inc.end)
        out.seconds.append(inc.seconds)
        out.output_tokens.append(s.output_tokens or 0.0)
        out.output_tokens_per_s.append(s.tokens_per_s or 0.0)
        out.requests.append(s.requests or 0.0)
        out.per_token_latency_s.append(s.per_token_latency_s)
    return out


def prometheus_increments(prom: Any, engine_metrics: MetricNames | str, selector_labels: Mapping[str, str],
                          bounds: Sequence[float], *, buckets: bool = False,
                          lookback_s: float = DEFAULT_LOOKBACK_S, now: float | None = None,
                          regex: Mapping[str, str] | None = None) -> list["Increments | None"]:
    """:class:`Increments` of the engines ``selector_labels`` select, per interval between
    consecutive ``bounds`` (Unix seconds), read from Prometheus (range queries of the raw samples;
    see the module docstring for why not ``increase()``). ``buckets``: also the per-token-latency
    histogram's bucket increases (for the tail comparison). ``regex``: label matchers by regular
    expression besides ``selector_labels`` (``pod_match``)."""
    if len(bounds) < 2 or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"bounds must be at least two increasing times, got {list(bounds)}")
    m = engine_metrics if isinstance(engine_metrics, MetricNames) else metric_names(engine_metrics)
    r = _Reader(prom, selector_labels, bounds[0], bounds[-1], lookback_s=lookback_s, now=now, regex=regex)
    return _interval_increments(r, m, bounds, buckets=buckets)


def read_windows(prom: Any, engine_metrics: MetricNames | str, base_labels: Mapping[str, str],
                  start: float, end: float, roles: Iterable[str] = ("control", "canary"),
                  **kwargs: Any) -> dict[str, Observation]:
    """:func:`read_window` for each role (``lookahead_dev_role``) under the same base labels."""
    return {role: read_window(prom, engine_metrics, {**base_labels, LABEL_ROLE: role}, start, end, **kwargs)
            for role in roles}


def last_scrape_time(prom: Any, metric: str, selector_labels: Mapping[str, str],
                     regex: Mapping[str, str] | None = None) -> float | None:
    """Time of the newest sample of ``metric{selector}`` (min over series), or None."""
    client = _client(prom)
    q = f"min(timestamp({metric}{selector(selector_labels, regex)}))"
    try:
        res = client.custom_query(query=q)
    except Exception as exc:  # noqa: BLE001
        raise ObservationError(f"query {q!r} failed: {exc}") from exc
    if not res:
        return None
    return float(res[0]["value"][1])


def wait_scraped(prom: Any, engine_metrics: MetricNames | str, selector_labels: Mapping[str, str],
                 after: float, timeout: float = 60.0, poll_s: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until every series of the generation counter under ``selector_labels`` has a sample
    at or after ``after``; returns that sample time. Raises ``TimeoutError``."""
    m = engine_metrics if isinstance(engine_metrics, MetricNames) else metric_names(engine_metrics)
    deadline = time.monotonic() + timeout
    while True:
        t = last_scrape_time(prom, m.generation_tokens, selector_labels)
        if t is not None and t >= after:
            return t
        if time.monotonic() > deadline:
            raise TimeoutError(f"Prometheus did not scrape {m.generation_tokens}{selector(selector_labels)} "
                               f"after {after:.3f} within {timeout:.0f} s (last sample: {t})")
        sleep(poll_s)


# ---------------------------------------------------------------------------------------------
# fleet signals for the preflight


@dataclass
class FleetSignals:
    """What the preflight reads from the fleet's own metrics over a window.

    Engine signals aggregate every series under the selector; DCGM signals are means over the
    window, overall and per ``namespace/pod`` (the workload pod: ``exported_namespace`` /
    ``exported_pod`` where the exporter was scraped with honorLabels: false). Missing DCGM counters
    say which and why (``preflight.DCGM_MISSING_HINTS``).
    """

    start: float
    end: float
    engine: str
    prefill_time_s: Measured
    decode_time_s: Measured
    ttft_s: Measured
    e2e_s: Measured
    per_token_latency_s: Measured
    running_p50: Measured
    running_p90: Measured
    running_p99: Measured
    running_max: Measured
    running_mean: Measured
    dram_active: Measured
    sm_active: Measured
    tensor_active: Measured
    gpu_util: Measured
    gr_engine_active: Measured
    sm_occupancy: Measured
    by_pod: dict[str, dict[str, Measured]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def preflight_signals(self) -> dict[str, Any]:
        """The input of ``lookahead_operator.measurement.preflight.screen``: plain numbers, ``None`` where
        a signal is missing (sparse values are passed on: the preflight only screens)."""
        def v(m: Measured) -> float | None:
            return m.value if m.state is not State.MISSING else None

        quantiles = {q: v(m) for q, m in ((0.5, self.running_p50), (0.9, self.running_p90),
                                          (0.99, self.running_p99)) if v(m) is not None}
        ttft, e2e = v(self.ttft_s), v(self.e2e_s)
        return {
            "prefill_seconds": v(self.prefill_time_s),
            "decode_seconds": v(self.decode_time_s),
            "running_batch_quantiles": quantiles or None,
            "ttft_share": (ttft / e2e) if ttft is not None and e2e else None,
            "dram_active": v(self.dram_active),
            "gr_engine_active": v(self.gr_engine_active),
            "sm_active": v(self.sm_active),
            "sm_occupancy": v(self.sm_occupancy),
            "tensor_active": v(self.tensor_active),
            "gpu_util": v(self.gpu_util),
        }

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"start": self.start, "end": self.end, "engine": self.engine, "notes": self.notes}
        for k, v in self.__dict__.items():
            if isinstance(v, Measured):
                d[k] = v.to_dict()
        d["by_pod"] = {p: {k: v.to_dict() for k, v in vals.items()} for p, vals in self.by_pod.items()}
        return d


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _regex_literal(text: str) -> str:
    """``text`` matched literally inside a Prometheus (RE2) regex."""
    return re.sub(r"([.+*?()\[\]{}|^$\\])", r"\\\1", text)


def pod_match(ns_label: str, pod_label: str, namespace: str | Sequence[str] | None, pods: Sequence[str] | None,
              deployments: bool = False, base: Mapping[str, str] | None = None
              ) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, regex) for ``selector``: the series of ``pods`` in ``namespace`` (one name, or
    several) under the label pair ``ns_label`` / ``pod_label``. ``deployments``: ``pods`` are
    Deployment names, whose pods are named ``<name>-...``."""
    labels, regex = dict(base or {}), {}
    namespaces = sorted({namespace} if isinstance(namespace, str) else set(namespace or ()))
    if len(namespaces) == 1:
        labels[ns_label] = namespaces[0]
    elif namespaces:
        regex[ns_label] = "|".join(_regex_literal(n) for n in namespaces)
    if pods:
        regex[pod_label] = "|".join(_regex_literal(p) + ("-.*" if deployments else "") for p in pods)
    return labels, regex


def _running_quantiles(r: _Reader, m: MetricNames) -> dict[str, Measured]:
    """p50 / p90 / p99 / max / mean of the running-requests gauge, pooled over its series (each
    engine's own running batch) and samples in the window."""
    keys = ("p50", "p90", "p99", "max", "mean")
    if not m.running:
        return {k: Measured.missing("the engine exports no running-requests gauge") for k in keys}
    allv = [v for vals in r.gauge_points(m.running).values() for v in vals]
    if not allv:
        return {k: Measured.missing(f"no samples of {m.running}{r.sel} in the window") for k in keys}
    n = len(allv)
    make = Measured.of if n >= 10 else (lambda v, k, u: Measured.sparse(v, f"only {k} samples of the running gauge", k, u))
    values = (_quantile(allv, 0.5), _quantile(allv, 0.9), _quantile(allv, 0.99), max(allv), statistics.fmean(allv))
    return {k: make(v, n, "requests") for k, v in zip(keys, values)}


def _dcgm_signals(readers: Sequence[_Reader]) -> tuple[dict[str, Measured], dict[str, dict[str, Measured]], list[str]]:
    """(each DCGM signal's window mean, the same per workload pod, notes) over the series any of
    ``readers`` selects (a series both select counts once)."""
    dcgm: dict[str, Measured] = {}
    by_pod: dict[str, dict[str, Measured]] = {}
    notes: list[str] = []
    for key, metric in DCGM_METRICS.items():
        series: dict[tuple, list[float]] = {}
        for d in readers:
            series.update(d.gauge_points(metric))
        vals = [v for vs in series.values() for v in vs]
        unit = "%" if key == "gpu_util" else "fraction"
        if not series or not vals:
            dcgm[key] = Measured.missing(DCGM_MISSING_HINTS[key], unit)
            notes.append(f"{metric} missing: {DCGM_MISSING_HINTS[key]}")
            continue
        dcgm[key] = Measured.of(statistics.fmean(vals), len(vals), unit)
        for labels, vs in series.items():
            if vs:
                pod = by_pod.setdefault(_workload_pod(dict(labels)), {})
                prev = pod.get(key)   # several GPUs per pod: average them
                if prev is None:
                    pod[key] = Measured.of(statistics.fmean(vs), len(vs), unit)
                else:
                    n = prev.samples + len(vs)
                    pod[key] = Measured.of((prev.value * prev.samples + sum(vs)) / n, n, unit)
    if dcgm["gpu_util"].ok:
        notes.append("DCGM_FI_DEV_GPU_UTIL is kernel residency (reads 90%+ on memory-bound decode); "
                     "it is reported, never used as evidence of no spare compute")
    return dcgm, by_pod, notes


#: The latency histograms fleet_signals can read, by key: prefill, decode, TTFT, end-to-end, per-token.
FLEET_HISTOGRAMS: tuple[str, ...] = ("prefill", "decode", "ttft", "e2e", "ptl")


def fleet_signals(prom: Any, engine_metrics: MetricNames | str, selector_labels: Mapping[str, str],
                  start: float, end: float, *, namespace: str | Sequence[str] | None = None,
                  pods: Sequence[str] | None = None, deployments: bool = False,
                  regex: Mapping[str, str] | None = None, dcgm_labels: Mapping[str, str] | None = None,
                  min_requests: int = DEFAULT_MIN_REQUESTS, lookback_s: float = DEFAULT_LOOKBACK_S,
                  now: float | None = None, gauges_until: float | None = None,
                  histograms: Sequence[str] = FLEET_HISTOGRAMS, count_ended: bool = False) -> FleetSignals:
    """Preflight signals for a fleet: prefill vs decode time, running-request quantiles (for
    ``batchSizes: auto``), and the DCGM counters of ``preflight.DCGM_SIGNALS`` (DRAM, GR engine,
    SM, SM occupancy and tensor-pipe activity, GPU_UTIL).

    DCGM series are selected by ``dcgm_labels`` plus ``namespace`` and ``pod=~"pod1|pod2"``
    (dcgm-exporter's Kubernetes mapping; ``deployments``: ``pods`` are Deployment names, matched as
    ``name-.*``) -- and, as a second selector whose series are merged in, ``exported_namespace`` /
    ``exported_pod`` (the same labels when Prometheus scraped the exporter with ``honorLabels:
    false``, as its Helm chart does); with none of these given, by ``selector_labels``. Engine
    series are selected by ``selector_labels`` and ``regex``. Profiling counters are fractions 0..1;
    GPU_UTIL is a percentage and is reported but means kernel residency, not spare compute.
    ``gauges_until``: the DCGM window's end where it differs from the engines' ``end`` (the
    exporter's own scrapes). ``histograms``: which of ``FLEET_HISTOGRAMS`` to read (the others are
    missing, "not read"). ``count_ended``: an engine series that stopped before ``end`` (its pod went
    away) counts up to its last sample instead of making its signal missing. Every series is
    fetched at once, one request per metric and selector, in parallel.
    """
    m = engine_metrics if isinstance(engine_metrics, MetricNames) else metric_names(engine_metrics)
    window = dict(lookback_s=lookback_s, now=now)
    r = _Reader(prom, selector_labels, start, end, regex=regex, count_ended=count_ended, **window)
    bases = {"prefill": (m.prefill_time, "prefill time"), "decode": (m.decode_time, "decode time"),
             "ttft": (m.ttft, "TTFT"), "e2e": (m.e2e, "end-to-end latency"),
             "ptl": (m.per_token_latency, "per-token latency")}
    gpu_end = end if gauges_until is None else gauges_until
    if namespace or pods:
        matches = [pod_match(ns, pod, namespace, pods, deployments, dcgm_labels) for ns, pod in DCGM_POD_LABELS]
        readers = [_Reader(prom, lb, start, gpu_end, regex=rx or None, **window) for lb, rx in matches]
    else:
        readers = [_Reader(prom, dict(dcgm_labels or selector_labels), start, gpu_end, **window)]
    engine_series = [m.running] + [f"{bases[k][0]}_{part}" for k in histograms if bases[k][0] for part in ("sum", "count")]
    with ThreadPoolExecutor(max_workers=1 + len(readers)) as pool:
        list(pool.map(lambda job: job[0].prefetch(job[1]),
                      [(r, engine_series)] + [(d, DCGM_METRICS.values()) for d in readers]))
    means = {key: _histogram_mean(r, base, "s", min_requests, what) if key in histograms
             else Measured.missing("not read") for key, (base, what) in bases.items()}
    qs = _running_quantiles(r, m)
    dcgm, by_pod, notes = _dcgm_signals(readers)
    return FleetSignals(start=start, end=end, engine=m.engine, prefill_time_s=means["prefill"],
                        decode_time_s=means["decode"], ttft_s=means["ttft"], e2e_s=means["e2e"],
                        per_token_latency_s=means["ptl"], running_p50=qs["p50"], running_p90=qs["p90"],
                        running_p99=qs["p99"], running_max=qs["max"], running_mean=qs["mean"],
                        dram_active=dcgm["dram_active"], sm_active=dcgm["sm_active"],
                        tensor_active=dcgm["tensor_active"], gpu_util=dcgm["gpu_util"],
                        gr_engine_active=dcgm["gr_engine_active"], sm_occupancy=dcgm["sm_occupancy"],
                        by_pod=by_pod, notes=notes)


def _workload_pod(labels: Mapping[str, str]) -> str:
    """``namespace/pod`` of the workload a GPU series belongs to: ``exported_*`` first (with
    honorLabels: false, ``namespace``/``pod`` are the exporter's own), else dcgm-exporter's labels,
    else the host."""
    if labels.get("exported_pod"):
        return f"{labels.get('exported_namespace', '?')}/{labels['exported_pod']}"
    return f"{labels.get('namespace', '?')}/{labels.get('pod', labels.get('Hostname', '?'))}"
