"""Measurement glue for the operator: Prometheus samples -> sequential statistics -> the rows,
decisions and guard checks the state machine consumes. Prometheus is read through
``observations`` (one implementation of the queries for the operator and ``analyze``).

Samples are disjoint intervals of ``spec.analysis.sampleInterval`` (the confidence sequences assume
independent samples; overlapping windows would make intervals too narrow):
- per-token latency: the per-token-latency histogram's _sum / _count increase in the interval
  (request_time_per_output_token for vLLM, our per-token ITL for the reference engine; never
  vLLM's per-chunk ITL);
- throughput: the generated-tokens counter's increase in the interval / its length.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

from . import api
from . import builders as b
from . import engines, observations
from . import statemachine as sm
from .decision import Action, BatchVerdict, decide
from .models import (BatchResult, Decision, DecisionAction, LookaheadPolicySpec, LookaheadPolicyStatus,
                     PreflightStatus)
from .preflight import preflight as run_preflight
from .preflight import production_batch_sizes
from .statistics import SequentialComparison, Thresholds


def thresholds(spec: LookaheadPolicySpec) -> Thresholds:
    a = spec.analysis
    return Thresholds(min_latency_improvement=a.min_latency_improvement,
                      max_throughput_regression=a.max_throughput_regression,
                      confidence=a.confidence, min_samples=spec.load.min_samples_per_step)


# --- Prometheus ----------------------------------------------------------------------------------

#: What a failed Prometheus read raises; the handler turns these into ``statemachine.ReadError``.
READ_ERRORS: tuple[type[BaseException], ...] = (observations.ObservationError, OSError, TimeoutError)


#: Every Prometheus request is bounded: one quick retry, then the failure is data (a ReadError).
PROM_TIMEOUT_S = 10


_clients: dict[str, Any] = {}


def _prom(spec: LookaheadPolicySpec):
    """One client per Prometheus URL, kept: its HTTP connections are reused across passes."""
    url = spec.analysis.prometheus.url
    client = _clients.get(url)
    if client is None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        client = _clients[url] = PrometheusConnect(
            url=url, disable_ssl=True, timeout=PROM_TIMEOUT_S,
            retry=Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504]))
    return client


def interval_samples(prom, names: engines.MetricNames, labels: dict[str, str], start: datetime, end: datetime,
                     step: float) -> dict[str, Any]:
    """Disjoint-interval samples of per-token latency (s) and output throughput (tok/s) of the
    pods ``labels`` select, read by ``observations.observe`` (exact, reset-aware increases from
    the raw samples). Intervals without a finished token carry no latency sample: never a zero."""
    # A window can only end where Prometheus has scraped: past the newest sample nothing is known yet.
    scraped = observations.last_scrape_time(prom, names.generation_tokens, labels)
    end_s = min(end.timestamp(), scraped) if scraped is not None else end.timestamp()
    if end_s - start.timestamp() < step:
        return {"latency": [], "throughput": [], "acceptance": None}
    obs = observations.observe(prom, names, labels, start.timestamp(), end_s, interval_s=step)
    iv = obs.intervals
    return {"latency": [x for x in iv.per_token_latency_s if x is not None],
            "throughput": [x for x in iv.output_tokens_per_s if x is not None],
            "acceptance": obs.acceptance_rate.value if obs.acceptance_rate.ok else None}


def _scalar(prom, query: str) -> float | None:
    res = prom.custom_query(query)
    if not res:
        return None
    x = float(res[0]["value"][1])
    return x if math.isfinite(x) else None


def role_labels(policy: tuple[str, str], role: str) -> dict[str, str]:
    """Prometheus labels of a policy's canary or control pods (``policy``: namespace, name)."""
    namespace, name = policy
    return {api.PROM_LABEL_POLICY: name, api.PROM_LABEL_POLICY_NAMESPACE: namespace, api.PROM_LABEL_ROLE: role}


# --- what each phase needs (statemachine.NEEDS) --------------------------------------------------

def preflight(spec: LookaheadPolicySpec, targets: list[sm.Target]) -> sm.PreflightResult:
    """Preflight from the fleet's own metrics; an unreachable Prometheus or missing metrics
    degrade to Unknown (measurement goes ahead and says so), never to a promotion by themselves."""
    names = engines.metric_names(targets[0].engine or "reference") if targets else engines.metric_names("reference")
    signals: dict[str, Any] = {}
    missing_note = None
    try:
        prom = _prom(spec)
        pods = "|".join(f"{t.name}-.*" for t in targets)
        namespaces = "|".join(sorted({t.namespace for t in targets}))
        sel = f'{{namespace=~"{namespaces}",pod=~"{pods}"}}'
        queries: dict[str, str] = {}
        if names.prefill_time and names.decode_time:
            queries["prefill_seconds"] = (f"sum(increase({names.prefill_time}_sum{sel}[30m])) / "
                                          f"sum(increase({names.prefill_time}_count{sel}[30m]))")
            queries["decode_seconds"] = (f"sum(increase({names.decode_time}_sum{sel}[30m])) / "
                                         f"sum(increase({names.decode_time}_count{sel}[30m]))")
        if names.running:
            for quant in (0.5, 0.9, 0.99):
                queries[f"q{quant}"] = f"quantile_over_time({quant}, sum({names.running}{sel})[30m:15s])"
        for key, metric in (("dram_active", "DCGM_FI_PROF_DRAM_ACTIVE"), ("sm_active", "DCGM_FI_PROF_SM_ACTIVE"),
                            ("tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                            ("gpu_util", "DCGM_FI_DEV_GPU_UTIL")):
            queries[key] = f"avg(avg_over_time({metric}{sel}[30m]))"
        # the queries are independent: ask them at once (the pass waits for the slowest, not the sum)
        with ThreadPoolExecutor(max_workers=len(queries)) as pool:
            values = dict(zip(queries, pool.map(lambda q: _scalar(prom, q), queries.values())))
        quantiles = {float(k[1:]): v for k, v in values.items() if k.startswith("q") and v is not None}
        if names.running:
            signals["running_batch_quantiles"] = quantiles or None
        for key, v in values.items():
            if key.startswith("q") or v is None:
                continue
            signals[key] = v / 100.0 if key == "gpu_util" else v
    except Exception as exc:  # noqa: BLE001 - Prometheus down or refusing: say so, measure anyway
        missing_note = f"Prometheus at {spec.analysis.prometheus.url} could not be read ({type(exc).__name__}: {exc})"
    result = run_preflight({k: v for k, v in signals.items() if v is not None}).to_dict()
    reasons = ([missing_note] if missing_note else []) + list(result.get("reasons") or [])
    q = signals.get("running_batch_quantiles")
    auto = production_batch_sizes(q, 64) if q else [1, 8]
    sizes = list(spec.load.batch_sizes or auto)
    status = PreflightStatus(candidate=result.get("candidate", True), verdict=result.get("verdict"),
                             reasons=reasons or None, missing=result.get("missing") or None, batch_sizes=sizes)
    return sm.PreflightResult(status=status, batch_sizes=sizes)


def batch_verdict(spec: LookaheadPolicySpec, policy: tuple[str, str], batch_size: int, start: datetime,
                  end: datetime, engine: str) -> BatchVerdict:
    """Canary vs control at one batch size over [start + warmup, end]."""
    prom = _prom(spec)
    names = engines.metric_names(engine)
    th = thresholds(spec)
    start = start + spec.load.warmup
    lat, tp = SequentialComparison.for_latency(th), SequentialComparison.for_throughput(th)
    acc = None
    interval = spec.analysis.sample_interval.total_seconds()
    for role in b.ROLES:
        s = interval_samples(prom, names, role_labels(policy, role), start, end, interval)
        lat.add(role, s["latency"])
        tp.add(role, s["throughput"])
        if role == "canary":
            acc = s["acceptance"]
    return BatchVerdict(batch_size, lat.result(), tp.result(), acc)


def step(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus,
         now: datetime) -> sm.StepMeasurement | None:
    p = status.progress
    sizes = p.batch_sizes or [1]
    i = p.step or 0
    if i >= len(sizes) or p.step_started_at is None:
        return None
    th = thresholds(spec)
    bv = batch_verdict(spec, policy, sizes[i], p.step_started_at, now, _engine(status))
    return sm.StepMeasurement(row=BatchResult.model_validate(bv.to_status(th)), conclusive=bv.settled(th))


def _engine(status: LookaheadPolicyStatus) -> str:
    targets = status.targets or []
    return (targets[0].engine if targets else None) or "reference"


def verdict_from_row(row: BatchResult, th: Thresholds) -> BatchVerdict:
    """Rebuild a verdict from a stored status row (it holds every number the decision needs, at
    full precision), so a restarted operator decides from what is in the cluster, not from memory."""
    from .statistics import ComparisonResult, Direction, Verdict

    samples = row.samples
    n_control = int(samples.control or 0) if samples else 0
    n_canary = int(samples.canary or 0) if samples else 0
    confidence = float(row.confidence or th.confidence)

    def comp(metric, direction, threshold, c_mean, k_mean, change, interval, verdict):
        return ComparisonResult(metric, direction, threshold, confidence, n_control, n_canary, c_mean, k_mean,
                                change, tuple(interval) if interval else None,
                                Verdict(verdict or Verdict.NOT_ENOUGH_DATA.value))

    def seconds(ms):
        return None if ms is None else ms / 1e3

    lat = comp("per_token_latency_seconds", Direction.LOWER_IS_BETTER, th.min_latency_improvement,
               seconds(row.control_tpot_ms), seconds(row.canary_tpot_ms), row.tpot_change, row.tpot_interval,
               row.latency_verdict)
    tp = comp("output_tokens_per_second", Direction.HIGHER_IS_BETTER, th.max_throughput_regression,
              row.control_tokens_per_second, row.canary_tokens_per_second, row.throughput_change,
              row.throughput_interval, row.throughput_verdict)
    return BatchVerdict(int(row.batch_size), lat, tp, row.acceptance_rate)


def decision(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus) -> Decision:
    """The decision from the stored rows (pure). Every step has been measured once the state
    machine is in Deciding: missing answers are final."""
    th = thresholds(spec)
    rows = status.batches or []
    d = decide([verdict_from_row(r, th) for r in rows], th, deadline_passed=True)
    out = d.to_dict()
    out.pop("outcomes", None)
    engine = _engine(status)
    if d.action is Action.PROMOTE_REGIME_AWARE and d.lookahead_max_batch_size:
        try:
            out["config"] = engines.regime_config(engine, spec.lookahead, d.lookahead_max_batch_size)
        except engines.EngineError as exc:
            out["config"] = {"error": str(exc)}
    out["evidence"] = {"batches": [r.to_dict() for r in rows],
                       "thresholds": {"minLatencyImprovement": th.min_latency_improvement,
                                      "maxThroughputRegression": th.max_throughput_regression,
                                      "confidence": th.confidence, "minSamples": th.min_samples}}
    return Decision.model_validate(out)


def promotion_regime(status: LookaheadPolicyStatus) -> int | None:
    """The largest batch size at which lookahead stays on (regime-aware), or None (everywhere)."""
    d = status.decision
    if d is not None and d.action == DecisionAction.PromoteRegimeAware and d.crossover_batch_size:
        return max(1, int(d.crossover_batch_size) - 1)
    return None


def guard(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus, now: datetime,
          jobs: list[dict]) -> sm.GuardCheck:
    """A promoted fleet pod vs the control, both driven by the guard's load Jobs at the largest
    measured batch size, on output throughput since the current guard Jobs started. A regression
    beyond the guard's tolerance, with confidence, rolls back."""
    run = str(status.progress.load_run or 0)
    current = [j for j in jobs if j["metadata"]["labels"].get(b.LABEL_RUN) == run]
    promoted_job = next((j for j in current if j["metadata"]["labels"].get(b.LABEL_DRIVES) == "promoted"), None)
    if promoted_job is None:
        return sm.GuardCheck(False, "guard: waiting for the guard load to start", enough_data=False)
    pod_ns = promoted_job["metadata"]["namespace"]
    pod = promoted_job["metadata"]["labels"][b.LABEL_POD]
    start = datetime.fromisoformat(str(promoted_job["metadata"]["creationTimestamp"]).replace("Z", "+00:00"))
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    th = thresholds(spec)
    tol = spec.promotion.guard.max_throughput_regression
    tol = tol if tol is not None else th.max_throughput_regression
    prom = _prom(spec)
    names = engines.metric_names(_engine(status))
    interval = spec.analysis.sample_interval.total_seconds()
    comp = SequentialComparison("output_tokens_per_second", "higher", tol, th.confidence, th.min_samples)
    start = start + timedelta(seconds=interval)  # let the closed loop fill
    comp.add("canary", interval_samples(prom, names, {"namespace": pod_ns, "pod": pod}, start, now,
                                        interval)["throughput"])
    comp.add("control", interval_samples(prom, names, role_labels(policy, "control"), start, now,
                                         interval)["throughput"])
    r = comp.result()
    if r.estimate is None or r.interval is None:
        return sm.GuardCheck(False, f"guard: not enough data yet ({r.note or 'no samples'})", enough_data=False)
    words = (f"promoted pod {pod_ns}/{pod} throughput {r.estimate * 100:+.1f}% [{r.interval[0] * 100:+.1f}%, "
             f"{r.interval[1] * 100:+.1f}%] vs the control ({th.confidence * 100:g}% CS, "
             f"n={r.n_canary}/{r.n_control})")
    return sm.GuardCheck(r.verdict.value == "Worse", words)
