"""Measurement glue for the operator: Prometheus samples -> sequential statistics -> the rows,
decisions and guard checks the state machine consumes. Prometheus is read through
``prometheus`` (one implementation of the queries for the operator and ``analyze``).

The step's verdict is the one pipeline ``kubectl lookahead analyze`` runs too (docs/analyze.md,
"One pipeline"): per interval and role, the engine's counter increases
(``prometheus.Increments``; here from Prometheus, there from the engine's own ``/metrics``),
``prometheus.paired_sample`` for the pair, ``paired_verdict`` for the statistics, each test at
its share of the policy's confidence (``family_split``), and ``decision.decide``.

Samples are disjoint intervals of ``spec.analysis.sampleInterval`` (the confidence sequences assume
independent samples; overlapping windows would make intervals too narrow):
- per-token latency: the per-token-latency histogram's _sum / _count increase in the interval
  (request_time_per_output_token for vLLM, our per-token ITL for the reference engine; never
  vLLM's per-chunk ITL);
- throughput: the generated-tokens counter's increase in the interval / its length;
- tail per-token latency (p95, p99): the per-token-latency histogram's ``_bucket{le}`` increases over
  the whole step (after the warm-up), per role -- the same histogram as the means, read at bucket
  resolution -- compared by ``stats.compare_tail_latency`` (a veto on the step's verdict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol, Sequence

from lookahead_operator.api import names as api
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import BatchResult, Decision, DecisionAction, LookaheadPolicyStatus, PreflightStatus
from lookahead_operator.api.metric_names import MetricNames, metric_names
from lookahead_operator.measurement import prometheus
from lookahead_operator.measurement.decision import decide
from lookahead_operator.measurement.preflight import production_batch_sizes, screen
from lookahead_operator.measurement.results import (GUARD_PRODUCTION, GUARD_SYNTHETIC, GuardCheck, GuardPods,
                                                    PreflightResult, StepMeasurement, guard_batch_sizes)
from lookahead_operator.measurement.stats import (PairedComparison, TailComparison, Thresholds, compare_error_rate,
                                                  compare_tail_latency, family_split, policy_thresholds)
from lookahead_operator.measurement.verdict import BatchComparison
from lookahead_operator.measurement.wording import confidence_words


def thresholds(spec: LookaheadPolicySpec) -> Thresholds:
    """The policy's thresholds (``stats.policy_thresholds``, the one builder ``analyze`` uses too)."""
    a = spec.analysis
    return policy_thresholds(a.min_latency_improvement, a.max_throughput_regression, a.confidence,
                             spec.load.min_samples_per_step, a.max_tail_latency_regression)


# --- Prometheus ----------------------------------------------------------------------------------

#: What a failed Prometheus read raises; the handler turns these into ``controller.world.ReadError``.
READ_ERRORS: tuple[type[BaseException], ...] = (prometheus.ObservationError, OSError, TimeoutError)


#: Every Prometheus request is bounded: one quick retry, then the failure is data (a ReadError).
PROM_TIMEOUT_S = 10


def prom_client(spec: LookaheadPolicySpec, access: prometheus.PrometheusAccess | None = None):
    """The client of every query the operator makes (``prometheus.connect``: cached per URL and
    credentials, so its HTTP connections are reused across passes and a changed Secret gets a new
    one). ``access``: ``analysis.prometheus`` with its Secrets read (``controller.observe``); without
    it, the spec's URL and headers alone (a spec that names Secrets then raises
    ``prometheus.CredentialsError``, a read error)."""
    if access is None:
        access = prometheus.access_from_spec(spec.analysis.prometheus)
    return prometheus.connect(access, timeout=PROM_TIMEOUT_S)


def interval_samples(prom, names: MetricNames, labels: dict[str, str], start: datetime, end: datetime,
                     step: float) -> dict[str, Any]:
    """Disjoint-interval samples of per-token latency (s) and output throughput (tok/s) of the
    pods ``labels`` select over [start, end], read by ``prometheus.read_window`` (exact, reset-aware
    increases from the raw samples). One entry per window with a new scrape, ``None`` where a window
    has no value (no token finished); ``interval``: each entry's window index. A window without a
    new scrape has no entry (merged into the next); pairing goes through ``batch_verdict``'s
    increments, which keep one entry per window.

    Also, over the whole of [start, end]: ``acceptance`` (accepted / draft tokens),
    ``meanAcceptanceLength`` (1 + accepted / drafts: tokens per verification step) and
    ``acceptanceByPosition`` (per draft position, accepted / drafts), each ``None`` when not
    measured."""
    if end.timestamp() - start.timestamp() < step:
        return {"latency": [], "throughput": [], "interval": [], "acceptance": None, "meanAcceptanceLength": None,
                "acceptanceByPosition": None}
    obs = prometheus.read_window(prom, names, labels, start.timestamp(), end.timestamp(), interval_s=step)
    iv = obs.intervals
    return {"latency": list(iv.per_token_latency_s), "throughput": list(iv.output_tokens_per_s),
            "interval": list(iv.interval), **_acceptance_summary(obs)}


def _le(value: str) -> float:
    return math.inf if value.strip().lower() in ("+inf", "inf") else float(value)


def bucket_increases(prom, metric: str, labels: dict[str, str], start: datetime, end: datetime,
                     now: float | None = None, regex: dict[str, str] | None = None) -> dict[float, float] | None:
    """The cumulative bucket counts of histogram ``metric`` (base name) over [start, end], summed
    over the pods ``labels`` select: ``{le: increase of metric_bucket{le}}``, ``+Inf`` included --
    what ``stats.compare_tail_latency`` takes (``prometheus.increases_by_label`` by ``le``); the
    ``histogram_quantile`` of these counts is what Prometheus' own function gives for the step.
    None when the histogram has no bucket series or is not scraped past ``end`` yet. ``regex``:
    label matchers by regular expression besides ``labels``."""
    by_le = prometheus.increases_by_label(prom, f"{metric}_bucket", "le", labels, start, end, now, regex)
    if not by_le:
        return None
    out = dict(sorted((_le(le), v) for le, v in by_le.items()))
    return out if math.inf in out else None


def finished_by_reason(prom, metric: str, labels: dict[str, str], regex: dict[str, str] | None, start: datetime,
                       end: datetime, now: float | None = None) -> dict[str, float] | None:
    """Finished requests over [start, end] per ``finished_reason`` (``prometheus.increases_by_label``; a pod
    replaced inside the window counts up to its last sample)."""
    return prometheus.increases_by_label(prom, metric, "finished_reason", labels, start, end, now, regex, count_ended=True)


#: Engines whose per-token-latency histogram is observed once per generated token (so the
#: observations of one decode step -- every sequence of the batch, every token accepted in the
#: step -- share one step time); the others observe it once per finished request.
PER_TOKEN_OBSERVED = frozenset({"reference", "sglang"})


def tail_design_effect(engine: str, batch_size: int, mean_acceptance_length: float | None) -> float:
    """How many per-token-latency observations move together (``compare_tail_latency``'s
    ``design_effect``): per-request histograms (vLLM's request_time_per_output_token)
    1; per-token ones the observations one decode step records, batch size x tokens per step
    (the canary's mean acceptance length; the larger arm's, so conservative for both)."""
    if engine not in PER_TOKEN_OBSERVED:
        return 1.0
    return float(max(1, batch_size)) * max(1.0, mean_acceptance_length or 1.0)


def last_scraped(prom, names: MetricNames, label_sets: list[dict[str, str]],
                 regexes: list[dict[str, str] | None] | None = None) -> float | None:
    """The newest time Prometheus has scraped every one of the arms up to (its oldest newest sample),
    or None when one of them has no live series (never scraped, or its pods' targets went down)."""
    regexes = regexes or [None] * len(label_sets)
    times = [prometheus.last_scrape_time(prom, names.generation_tokens, labels, regex)
             for labels, regex in zip(label_sets, regexes)]
    if not times or any(t is None for t in times):
        return None
    return min(times)


def scraped_until(prom, names: MetricNames, label_sets: list[dict[str, str]], end: datetime,
                  regexes: list[dict[str, str] | None] | None = None) -> datetime:
    """``end``, or earlier: a window can only close where Prometheus has scraped every arm
    (``regexes``: each arm's regular-expression matchers, beside its ``label_sets`` entry)."""
    return until_seen(last_scraped(prom, names, label_sets, regexes), end)


def until_seen(seen: float | None, end: datetime) -> datetime:
    """``end``, or ``seen`` (``last_scraped``) where that is earlier; ``end`` when it is unknown."""
    return end if seen is None else min(end, datetime.fromtimestamp(seen, tz=timezone.utc))


def role_labels(policy: tuple[str, str], role: str) -> dict[str, str]:
    """Prometheus labels of a policy's canary or control pods (``policy``: namespace, name)."""
    namespace, name = policy
    return {api.PROM_LABEL_POLICY: name, api.PROM_LABEL_POLICY_NAMESPACE: namespace, api.PROM_LABEL_ROLE: role}


# --- the one pipeline: paired samples -> statistics -> verdict (the operator and `analyze`) ----------

def tail_from_buckets(control: dict[float, float] | None, canary: dict[float, float] | None, th: Thresholds,
                      design_effect: float = 1.0) -> TailComparison | None:
    """p95/p99 per-token latency, canary vs control, from each role's per-token-latency histogram
    buckets over the step (``stats.compare_tail_latency``). None when either role has no
    buckets (an engine without the histogram, or not read): no tail, no veto."""
    if control is None or canary is None:
        return None
    try:
        return compare_tail_latency(control, canary, th.max_tail_latency_regression, th.confidence,
                                    design_effect=design_effect)
    except ValueError:  # buckets that are not cumulative (series of one arm read apart): no tail this look
        return None


def paired_verdict(batch_size: int, pairs: list[prometheus.PairedSample], th: Thresholds, engine: str, *,
                   acceptance: float | None = None, acceptance_length: float | None = None) -> BatchComparison:
    """Canary vs control at one batch size from its paired samples (``prometheus.paired_sample``,
    one per interval, whichever source read them): per-token latency and throughput by the paired
    anytime-valid test (``PairedComparison``), the tail (p95/p99 from the summed histogram buckets)
    as a veto, and the canary's acceptance rate. ``th``: each test's share (``family_split``).
    ``acceptance`` / ``acceptance_length``: used only where the pairs carry no spec-decode
    counters (an engine with gauges only)."""
    lat, tp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
    lat.add_pairs([p.control.per_token_latency_s for p in pairs], [p.canary.per_token_latency_s for p in pairs])
    tp.add_pairs([p.control.tokens_per_s for p in pairs], [p.canary.tokens_per_s for p in pairs])
    canary = [p.canary for p in pairs]
    rate = prometheus.acceptance_rate(canary)
    length = prometheus.mean_acceptance_length(canary)
    effect = tail_design_effect(engine, batch_size, length if length is not None else acceptance_length)
    tail = tail_from_buckets(prometheus.summed_buckets(p.control for p in pairs),
                             prometheus.summed_buckets(canary), th, effect)
    return BatchComparison(batch_size, lat.result(), tp.result(), rate if rate is not None else acceptance, tail=tail)


# --- what each phase needs (statemachine.NEEDS) --------------------------------------------------

class FleetTarget(Protocol):
    """What the preflight reads of a target Deployment: where it is and which engine it runs."""

    namespace: str
    name: str
    engine: str | None


#: The preflight reads the fleet's last half hour.
PREFLIGHT_WINDOW_S = 1800.0


def read_preflight(spec: LookaheadPolicySpec, targets: Sequence[FleetTarget],
                   now: float | None = None, access: prometheus.PrometheusAccess | None = None) -> PreflightResult:
    """Preflight from the fleet's own metrics over the last ``PREFLIGHT_WINDOW_S``
    (``prometheus.fleet_signals`` of the targets' pods); an unreachable Prometheus or missing
    metrics degrade to Unknown (measurement goes ahead and says so), never to a promotion by themselves."""
    signals: dict[str, Any] = {}
    missing_note = None
    if targets:
        try:
            signals = _fleet_preflight_signals(spec, targets, time.time() if now is None else now, access)
        except READ_ERRORS as exc:  # Prometheus down or refusing: say so, measure anyway
            missing_note = (f"Prometheus at {spec.analysis.prometheus.url} could not be read "
                            f"({type(exc).__name__}: {exc})")
    return _preflight_result(spec, signals, missing_note)


def _fleet_preflight_signals(spec: LookaheadPolicySpec, targets: Sequence[FleetTarget], now: float,
                             access: prometheus.PrometheusAccess | None = None) -> dict[str, Any]:
    """``preflight.screen``'s input from the targets' pods (engine series by ``namespace``/``pod``,
    GPU series by either label pair), GPU_UTIL as a fraction. The engines' window closes where every
    engine series has been scraped; the GPU gauges are read up to now (dcgm-exporter is scraped on
    its own schedule, possibly after the engines' last sample)."""
    prom = prom_client(spec, access)
    names = metric_names(targets[0].engine or "reference")
    namespaces = sorted({t.namespace for t in targets})
    pods = [t.name for t in targets]
    labels, regex = prometheus.pod_match("namespace", "pod", namespaces, pods, deployments=True)
    scraped = prometheus.last_scrape_time(prom, names.generation_tokens, labels, regex)
    end = min(now, scraped) if scraped is not None else now
    # prefill and decode are what the preflight screens on (the runtime preflight never read TTFT
    # share); a pod replaced inside the window counts up to its last sample
    fleet = prometheus.fleet_signals(prom, names, labels, end - PREFLIGHT_WINDOW_S, end, namespace=namespaces,
                                     pods=pods, deployments=True, regex=regex, now=now, gauges_until=now,
                                     histograms=("prefill", "decode"), count_ended=True)
    signals = fleet.preflight_signals()
    if signals.get("gpu_util") is not None:
        signals["gpu_util"] /= 100.0   # dcgm-exporter's GPU_UTIL is a percentage
    return signals


def _preflight_result(spec: LookaheadPolicySpec, signals: dict[str, Any], missing_note: str | None
                      ) -> PreflightResult:
    """The preflight's status and sweep from the signals read (``preflight.screen``; ``batchSizes:
    auto`` from the running-batch quantiles, [1, 8] without them)."""
    from pydantic.alias_generators import to_camel

    result = screen({k: v for k, v in signals.items() if v is not None}).to_dict()
    reasons = ([missing_note] if missing_note else []) + list(result.get("reasons") or [])
    q = signals.get("running_batch_quantiles")
    sizes = list(spec.load.batch_sizes or (production_batch_sizes(q, 64) if q else [1, 8]))
    numbers = {to_camel(k): float(v) for k, v in signals.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    for quant, v in (q or {}).items():
        numbers[f"runningP{round(quant * 100)}"] = float(v)
    status = PreflightStatus(candidate=result.get("candidate", True), verdict=result.get("verdict"),
                             reasons=reasons or None, missing=result.get("missing") or None,
                             signals=numbers or None, batch_sizes=sizes)
    return PreflightResult(status=status, batch_sizes=sizes)


def batch_verdict(spec: LookaheadPolicySpec, policy: tuple[str, str], batch_size: int, start: datetime,
                  end: datetime, engine: str, planned: int = 1,
                  access: prometheus.PrometheusAccess | None = None) -> tuple[BatchComparison, dict[str, Any]]:
    """Canary vs control at one batch size over [start + warmup, end], window by window (both arms
    are driven at once, so window i of each covers the same wall-clock interval: drift shared by
    both cancels). The Prometheus source of the one pipeline: ``prometheus.read_window`` reads each
    role's per-window counter increases (``interval_increments``), ``prometheus.paired_sample``
    turns window i of both into a pair, ``paired_verdict`` gives the verdict -- the same functions
    ``kubectl lookahead analyze`` runs on its direct reads of the engines' ``/metrics``. Each test
    runs at its share of the policy's error budget (``planned`` batch sizes x latency, throughput
    and tail; ``family_split``). The tail (p95/p99 per-token latency from the histogram buckets
    over the whole step) is a veto: a canary faster on the mean but with a tail beyond
    ``maxTailLatencyRegression`` Regresses."""
    prom = prom_client(spec, access)
    names = metric_names(engine)
    th = family_thresholds(spec, planned)
    start = start + spec.load.warmup
    interval = spec.analysis.sample_interval.total_seconds()
    labels = {role: role_labels(policy, role) for role in api.ROLES}
    end = scraped_until(prom, names, list(labels.values()), end)
    obs = {role: (prometheus.read_window(prom, names, labels[role], start.timestamp(), end.timestamp(),
                                       interval_s=interval, tail_buckets=True)
                  if end.timestamp() - start.timestamp() >= interval else None) for role in api.ROLES}
    incs = {role: o.interval_increments if o is not None else [] for role, o in obs.items()}
    # the same bounds for both roles: interval i of each is the same window
    pairs = [prometheus.paired_sample(c, k, names) for c, k in zip(incs["control"], incs["canary"])]
    canary = _acceptance_summary(obs["canary"])
    bv = paired_verdict(batch_size, pairs, th, engine, acceptance=canary["acceptance"],
                        acceptance_length=canary["meanAcceptanceLength"])
    return bv, canary


def _acceptance_summary(obs: prometheus.Observation | None) -> dict[str, Any]:
    """Acceptance over the whole window as ``interval_samples`` reports it (each ``None`` when not
    measured)."""
    if obs is None:
        return {"acceptance": None, "meanAcceptanceLength": None, "acceptanceByPosition": None}
    by_pos = obs.acceptance_by_position
    return {"acceptance": obs.acceptance_rate.value if obs.acceptance_rate.ok else None,
            "meanAcceptanceLength": obs.mean_acceptance_length.value if obs.mean_acceptance_length.ok else None,
            # a vector only when every position has a value (positions share one denominator)
            "acceptanceByPosition": [m.value for m in by_pos][:64] if by_pos and all(m.ok for m in by_pos) else None}


def family_thresholds(spec: LookaheadPolicySpec, planned: int) -> Thresholds:
    return family_split(thresholds(spec), planned)


def step(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus,
         now: datetime, access: prometheus.PrometheusAccess | None = None) -> StepMeasurement | None:
    p = status.progress
    sizes = p.batch_sizes or [1]
    i = p.step or 0
    if i >= len(sizes) or p.load_started_at is None:
        return None   # the step's load is not running yet: nothing to measure
    th = family_thresholds(spec, len(sizes))
    bv, canary = batch_verdict(spec, policy, sizes[i], p.load_started_at, now, status_engine(status), len(sizes),
                               access)
    row = BatchResult.model_validate({**bv.to_status(th), "meanAcceptanceLength": canary.get("meanAcceptanceLength"),
                                      "acceptanceByPosition": canary.get("acceptanceByPosition")})
    return StepMeasurement(row=row, conclusive=bv.settled(th))


def status_engine(status: LookaheadPolicyStatus) -> str:
    targets = status.targets or []
    return (targets[0].engine if targets else None) or "reference"


def verdict_from_row(row: BatchResult, th: Thresholds) -> BatchComparison:
    """Rebuild a verdict from a stored status row (it holds every number the decision needs, at
    full precision), so a restarted operator decides from what is in the cluster, not from memory."""
    return BatchComparison.from_status(row.to_dict(), th)


def decision(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus, max_batch_size: int | None = None) -> Decision:
    """The decision from the stored rows (pure). Every step has been measured once the state
    machine is in Deciding: missing answers are final. ``planned`` is the sweep the policy set out
    to measure (an unmeasured size is never a win); lookahead is never enabled beyond the largest
    batch size measured as a win, and on everywhere only when that reaches ``max_batch_size`` (the
    engine's max_num_seqs). The engine config a regime-aware promotion writes is the controller's
    to add (``Decision.config``)."""
    planned = list(status.progress.batch_sizes or [r.batch_size for r in status.batches or []] or [1])
    th = family_thresholds(spec, len(planned))
    rows = status.batches or []
    d = decide([verdict_from_row(r, th) for r in rows], th, deadline_passed=True, planned=planned,
               max_batch_size=max_batch_size)
    out = d.to_dict()
    out.pop("outcomes", None)
    out["evidence"] = {"batches": [r.to_dict() for r in rows], "planned": planned, "maxBatchSize": max_batch_size,
                       "thresholds": {"minLatencyImprovement": th.min_latency_improvement,
                                      "maxThroughputRegression": th.max_throughput_regression,
                                      "maxTailLatencyRegression": th.max_tail_latency_regression,
                                      "confidence": spec.analysis.confidence, "perTestConfidence": th.confidence,
                                      "minSamples": th.min_samples}}
    return Decision.model_validate(out)


def regime_cap(d: Decision | None) -> int | None:
    """The largest batch size at which a regime-aware promotion keeps lookahead on, or None (no
    decision, or lookahead on everywhere)."""
    if d is None or d.action != DecisionAction.PromoteRegimeAware:
        return None
    on = [r.end for r in d.regime or [] if r.enabled]
    return max(on) if on else None


def promotion_regime(status: LookaheadPolicyStatus) -> int | None:
    """The largest batch size at which lookahead stays on (regime-aware), or None (everywhere)."""
    return regime_cap(status.decision)


#: The guard chooses its mode from the fleet's requests over this long before its first wave.
PRODUCTION_LOOKBACK_S = 120.0
#: ... and compares on production traffic when the fleet's pods started at least this many.
PRODUCTION_MIN_REQUESTS = 5


def guard(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus, now: datetime,
          jobs: list[dict], pods: GuardPods = GuardPods(),
          access: prometheus.PrometheusAccess | None = None) -> GuardCheck:
    """The guard's check this pass, in the mode the rollout guards in (``progress.guardMode``;
    until it is chosen, ``guard_mode`` reads which one the fleet needs). Both modes end in the same
    paired comparison (``guard_comparison``: ``prometheus.paired_sample`` per window, then
    ``PairedComparison``), the one the measurement's steps run."""
    mode = status.progress.guard_mode
    if mode is None:
        return guard_mode(spec, status, now, pods, access)
    if mode == GUARD_PRODUCTION:
        return production_guard(spec, status, now, pods, access)
    return synthetic_guard(spec, policy, status, now, jobs, access)


def guard_mode(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus, now: datetime,
               pods: GuardPods, access: prometheus.PrometheusAccess | None = None) -> GuardCheck:
    """Which guard the fleet needs, from the requests its pods started (the TTFT histogram's count)
    over the last ``PRODUCTION_LOOKBACK_S``: a fleet that serves users is guarded on their traffic
    and never given load of ours; one that served fewer than ``PRODUCTION_MIN_REQUESTS`` is
    idle, and its promoted pod and the control are driven by the guard's load Jobs."""
    names = metric_names(status_engine(status))
    if not pods.targets or not names.ttft:
        return GuardCheck(False, "guard: synthetic (the engine exports no time-to-first-token histogram to count "
                                 "the fleet's requests by)", enough_data=False, mode=GUARD_SYNTHETIC)
    t1 = now.timestamp()
    t0 = t1 - max(PRODUCTION_LOOKBACK_S, 4 * spec.analysis.sample_interval.total_seconds())
    labels, regex = prometheus.pod_match("namespace", "pod", sorted({ns for ns, _ in pods.targets}),
                                         [name for _, name in pods.targets], deployments=True)
    started = prometheus.counter_increase(prom_client(spec, access), f"{names.ttft}_count", labels, t0, t1, regex=regex,
                                          count_ended=True)
    if started is None:
        sel = prometheus.selector(labels, regex)
        return GuardCheck(False, f"guard: the fleet's pods are not scraped by Prometheus (no {names.ttft}_count"
                                 f"{sel}), so the guard cannot see whether they serve users: it drives a promoted "
                                 "pod and the control with its own load. If the fleet serves users, have Prometheus "
                                 "scrape its pods (docs/analyze.md) and the guard compares on their traffic instead",
                          enough_data=False, mode=GUARD_SYNTHETIC, warning=True)
    if started >= PRODUCTION_MIN_REQUESTS:
        return GuardCheck(False, f"guard: the fleet served {started:.0f} requests in the last "
                                 f"{t1 - t0:.0f}s: the guard compares on its production traffic", enough_data=False,
                          mode=GUARD_PRODUCTION)
    return GuardCheck(False, f"guard: the fleet served {started:.0f} requests in the last {t1 - t0:.0f}s (idle): "
                             "the guard drives a promoted pod and the control with its own load", enough_data=False,
                      mode=GUARD_SYNTHETIC)


def _pods_selector(pods: Sequence[tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    namespaces = sorted({ns for ns, _ in pods})
    return prometheus.pod_match("namespace", "pod", namespaces, sorted({p for _, p in pods}))


def production_guard(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus, now: datetime,
                     pods: GuardPods, access: prometheus.PrometheusAccess | None = None) -> GuardCheck:
    """The guard on production traffic: the promoted pods of the target promoted last against the
    baseline (the fleet's pods not promoted yet and the control, which serves beside them), over
    the same windows since this guard started (plus one window, for the control to join the
    Service and the new pods to fill), on per-token latency at equal offered load
    (``offered_load_adjusted``), through ``guard_comparison``."""
    start = status.progress.guard_leg_started_at
    if start is None:
        return GuardCheck(False, "guard: waiting for the wave to serve", enough_data=False, mode=GUARD_PRODUCTION)
    promoted = list(pods.promoted)
    baseline = list(pods.baseline) + list(pods.control)
    if not promoted or not baseline:
        return GuardCheck(False, f"guard: waiting for ready {'promoted' if not promoted else 'baseline'} pods",
                          enough_data=False, mode=GUARD_PRODUCTION)
    prom = prom_client(spec, access)
    names = metric_names(status_engine(status))
    interval = spec.analysis.sample_interval.total_seconds()
    t0 = (start + timedelta(seconds=interval)).timestamp()
    sel = {"promoted": _pods_selector(promoted), "baseline": _pods_selector(baseline)}
    end = scraped_until(prom, names, [lab for lab, _ in sel.values()], now, [rx for _, rx in sel.values()])
    n = int((end.timestamp() - t0) // interval)
    if n < 1:
        return GuardCheck(False, "guard: not enough data yet (no whole window of production traffic)",
                          enough_data=False, mode=GUARD_PRODUCTION,
                          numbers={"promotedPods": len(promoted), "baselinePods": len(baseline), "windows": 0})
    bounds = [t0 + k * interval for k in range(n + 1)]
    incs = {arm: prometheus.prometheus_increments(prom, names, labels, bounds, buckets=True, regex=regex)
            for arm, (labels, regex) in sel.items()}
    pairs = [prometheus.paired_sample(b, p, names) for b, p in zip(incs["baseline"], incs["promoted"])]
    # what users feel besides the per-token mean, over the same span: TTFT buckets, failed requests
    a, z = datetime.fromtimestamp(bounds[0], tz=timezone.utc), datetime.fromtimestamp(bounds[-1], tz=timezone.utc)
    felt = UsersFelt(
        ttft={arm: bucket_increases(prom, names.ttft, labels, a, z, regex=regex) if names.ttft else None
              for arm, (labels, regex) in sel.items()},
        finished={arm: finished_by_reason(prom, names.request_success, labels, regex, a, z)
                  if names.request_success else None for arm, (labels, regex) in sel.items()},
        error_reasons=names.error_reasons)
    return guard_comparison(spec, status, pairs, GUARD_PRODUCTION, len(promoted), len(baseline), interval,
                            f"production traffic: {len(promoted)} promoted pod(s)",
                            _baseline_words(len(baseline) - len(pods.control), len(pods.control)), felt)


def _baseline_words(fleet_pods: int, control_pods: int) -> str:
    """Who the production guard's baseline is, in words."""
    parts = ([f"{fleet_pods} not-yet-promoted pod(s)"] if fleet_pods else []) + (["the control"] if control_pods else [])
    return " and ".join(parts)


def synthetic_guard(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus,
                    now: datetime, jobs: list[dict], access: prometheus.PrometheusAccess | None = None) -> GuardCheck:
    """The guard of a fleet that serves no one: a promoted fleet pod and the control, both driven by
    the guard's current load Jobs at the batch size the state machine is guarding
    (``results.guard_batch_sizes``: after a regime-aware promotion one inside the lookahead range,
    then one above it), on output throughput, window by window since those Jobs started, through
    ``guard_comparison``. The confidence is split over the guard's batch sizes."""
    run = str(status.progress.load_run or 0)
    current = [j for j in jobs if j["metadata"]["labels"].get(api.LABEL_RUN) == run]
    promoted_job = next((j for j in current if j["metadata"]["labels"].get(api.LABEL_DRIVES) == "promoted"), None)
    if promoted_job is None:
        return GuardCheck(False, "guard: waiting for the guard load to start", enough_data=False)
    start = status.progress.load_started_at
    if start is None:
        return GuardCheck(False, "guard: waiting for the guard load's pods to run", enough_data=False)
    pod_ns = promoted_job["metadata"]["namespace"]
    pod = promoted_job["metadata"]["labels"][api.LABEL_POD]
    prom = prom_client(spec, access)
    names = metric_names(status_engine(status))
    interval = spec.analysis.sample_interval.total_seconds()
    start = start + timedelta(seconds=interval)  # let the closed loop fill
    labels = {"promoted": {"namespace": pod_ns, "pod": pod}, "control": role_labels(policy, "control")}
    pairs, n = [], 0
    if (now - start).total_seconds() >= interval:   # a whole window can have closed: ask Prometheus
        end = scraped_until(prom, names, list(labels.values()), now)
        n = int((end - start).total_seconds() // interval)
    if n >= 1:
        bounds = [start.timestamp() + k * interval for k in range(n + 1)]
        incs = {arm: prometheus.prometheus_increments(prom, names, sel, bounds) for arm, sel in labels.items()}
        pairs = [prometheus.paired_sample(c, p, names) for c, p in zip(incs["control"], incs["promoted"])]
    return guard_comparison(spec, status, pairs, GUARD_SYNTHETIC, 1, 1, interval,
                            f"promoted pod {pod_ns}/{pod}", "the control")


def rules_out(interval: tuple[float, float], mode: str, loss: float) -> bool:
    """Whether a guard's interval (the relative change, promoted over baseline) excludes a
    throughput loss of ``loss``: in production mode the per-token latency interval lies below the
    rise that costs it (``latency_tolerance``), in synthetic mode the throughput interval above
    ``-loss``."""
    if mode == GUARD_PRODUCTION:
        return interval[1] < latency_tolerance(loss)
    return interval[0] > -loss


def latency_tolerance(max_throughput_regression: float) -> float:
    """The per-token latency increase that costs ``max_throughput_regression`` of throughput at the
    same batch: tokens per second per running request is 1 / per-token latency, so a throughput
    loss r is a latency increase of 1 / (1 - r) - 1 (5% -> +5.26%)."""
    return 1.0 / (1.0 - max_throughput_regression) - 1.0


def offered_load_adjusted(pairs: Sequence[prometheus.PairedSample], promoted_pods: int, baseline_pods: int,
                          min_windows: int = 10) -> tuple[list[float | None], list[float | None], float]:
    """Per window, the (baseline, promoted) per-token latencies with the promoted one adjusted to the
    baseline's offered load: ``(baseline, promoted * exp(-b * x))``, where ``x`` is the log-ratio of
    the requests each arm's pods were routed in the window (``started`` per pod; + 1 so that a
    window with none stays defined) and ``b`` the slope of the windows' latency log-ratio on ``x``
    (least squares). The router sets ``x``, the treatment does not (a slower arm keeps requests
    longer, so its *running* batch is an outcome, but not what it was sent): the mean of the
    adjusted log-ratios is the change at equal offered load (a regression adjustment, like CUPED's
    on a pre-period covariate). ``b`` is 0 with fewer than ``min_windows`` usable windows or no
    spread in ``x``. Also returns ``b``."""
    base = [p.control.per_token_latency_s for p in pairs]
    prom = [p.canary.per_token_latency_s for p in pairs]
    xs, ds, idx = [], [], []
    for i, p in enumerate(pairs):
        c, k = p.control, p.canary
        if not (c.per_token_latency_s and k.per_token_latency_s) or c.started is None or k.started is None:
            continue
        xs.append(math.log((1.0 + k.started / max(1, promoted_pods)) / (1.0 + c.started / max(1, baseline_pods))))
        ds.append(math.log(k.per_token_latency_s / c.per_token_latency_s))
        idx.append(i)
    b = 0.0
    if len(xs) >= min_windows:
        mx, md = sum(xs) / len(xs), sum(ds) / len(ds)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx > 1e-12:
            b = sum((x - mx) * (d - md) for x, d in zip(xs, ds)) / sxx
    adjusted = list(prom)
    for x, i in zip(xs, idx):
        adjusted[i] = prom[i] * math.exp(-b * x)
    return base, adjusted, b


@dataclass(frozen=True)
class UsersFelt:
    """A production guard's reads over its whole span, per side (``promoted``, ``baseline``): the
    TTFT histogram's bucket increases, and finished requests by ``finished_reason`` (None where the
    engine exports neither), with the reasons that are failures."""
    ttft: dict[str, dict[float, float] | None]
    finished: dict[str, dict[str, float] | None]
    error_reasons: tuple[str, ...] = ()


def guard_comparison(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus, pairs: list[prometheus.PairedSample],
                     mode: str, promoted_pods: int, baseline_pods: int, interval_s: float, promoted_words: str,
                     baseline_words: str, felt: UsersFelt | None = None) -> GuardCheck:
    """THE guard's statistics, for both modes: the paired anytime-valid comparison
    (``PairedComparison``, as ``paired_verdict`` runs for a step) of promoted against baseline over
    ``pairs`` (window i of both arms is the same wall-clock window). Synthetic mode (both arms
    driven at one concurrency, a closed loop): output throughput, the tolerance
    ``promotion.guard.maxThroughputRegression``. Production mode (an open loop: throughput is what
    users send, not what the pods can do): per-token latency at equal offered load
    (``offered_load_adjusted``), its tolerance the latency increase that costs that much
    throughput (``latency_tolerance``); plus the p99/p95 per-token latency from the summed
    histogram buckets against ``analysis.maxTailLatencyRegression`` (a veto, as in a step). Worse
    with confidence beyond the tolerance rolls back; the confidence is split over the guard's
    batch sizes (synthetic) or its metrics (production). In production mode ``felt`` adds what
    users feel besides the mean: the p95 time to first token against
    ``promotion.guard.maxTtftRegression`` and the share of failed requests against
    ``promotion.guard.maxErrorRateIncrease`` (``users_felt``)."""
    th = thresholds(spec)
    tol = spec.guard_tolerance()
    power = spec.promotion.guard.min_detectable_regression
    legs = guard_batch_sizes(status)
    if mode == GUARD_PRODUCTION:
        th = th.for_family(1, 4)     # the mean, the per-token tail, the TTFT tail, the error rate
        base, promoted, _ = offered_load_adjusted(pairs, promoted_pods, baseline_pods)
        comp = PairedComparison("per_token_latency_seconds", "lower", latency_tolerance(tol), th.confidence,
                                th.min_samples)
        comp.add_pairs(base, promoted)
        what = "per-token latency"
    else:
        if len(legs) > 1:  # one rollback decision over the guard's batch sizes: split its error budget
            th = th.for_family(len(legs), 1)
        comp = PairedComparison("output_tokens_per_second", "higher", tol, th.confidence, th.min_samples)
        comp.add_pairs([p.control.tokens_per_s for p in pairs], [p.canary.tokens_per_s for p in pairs])
        what = "throughput"
    r = comp.result()
    numbers: dict[str, Any] = {"promotedPods": promoted_pods, "baselinePods": baseline_pods,
                               "windows": r.n_canary, "droppedWindows": r.dropped}
    if mode == GUARD_PRODUCTION:
        seconds = max(1e-9, interval_s * max(1, len(pairs)))
        for arm, n_pods, side in (("promoted", promoted_pods, "canary"), ("baseline", baseline_pods, "control")):
            total = sum(getattr(p, side).started or 0.0 for p in pairs)
            numbers[f"{arm}Offered"] = round(total / max(1, n_pods) / seconds, 4)
    if r.estimate is None or r.interval is None:
        return GuardCheck(False, f"guard: not enough data yet ({r.note or 'no samples'})", enough_data=False,
                          mode=mode, numbers=numbers)
    numbers["change"] = round(r.estimate, 6)
    if r.verdict.value != "Worse" and not rules_out(r.interval, mode, power):
        # a pass needs evidence: the interval must exclude a loss of minDetectableRegression (the
        # guard's power), or a config that costs that much could pass a short, noisy soak
        per_token = f"+{latency_tolerance(power) * 100:.0f}% per token; " if mode == GUARD_PRODUCTION else ""
        return GuardCheck(False, f"guard: not enough data yet ({r.n_canary} paired windows; {what} "
                                 f"{r.estimate * 100:+.1f}% [{r.interval[0] * 100:+.1f}%, {r.interval[1] * 100:+.1f}%] "
                                 f"still allows a {power * 100:.0f}% throughput loss ({per_token}"
                                 "promotion.guard.minDetectableRegression))",
                          enough_data=False, mode=mode, numbers=numbers)
    load = (f" at {numbers['promotedOffered']:.2f} vs {numbers['baselineOffered']:.2f} requests/s per pod"
            if mode == GUARD_PRODUCTION else "")
    words = (f"{promoted_words} {what} {r.estimate * 100:+.1f}% [{r.interval[0] * 100:+.1f}%, "
             f"{r.interval[1] * 100:+.1f}%] vs {baseline_words}{load} ({confidence_words(th.confidence)} CS, "
             f"{r.n_canary} paired windows)")
    regressed = r.verdict.value == "Worse"
    if mode == GUARD_PRODUCTION and not regressed:
        engine = status_engine(status)
        tail = tail_from_buckets(prometheus.summed_buckets(p.control for p in pairs),
                                 prometheus.summed_buckets(p.canary for p in pairs), th,
                                 tail_design_effect(engine, 1, None))
        worst = tail.worst() if tail is not None and tail.regresses else None
        felt_words = users_felt(spec, felt, th) if felt is not None else None
        if worst is not None:
            regressed = True
            words = (f"{promoted_words} p{round(worst.quantile * 100)} per-token latency regressed beyond "
                     f"analysis.maxTailLatencyRegression vs {baseline_words}; mean: {words}")
        elif felt_words is not None:
            regressed = True
            words = f"{promoted_words} {felt_words} vs {baseline_words}; per-token mean: {words}"
    return GuardCheck(regressed, words, mode=mode, numbers=numbers)


def users_felt(spec: LookaheadPolicySpec, felt: UsersFelt, th: Thresholds) -> str | None:
    """What users felt that rolls back, in words, or None: the promoted side's p95 time to first
    token above the baseline's by more than ``maxTtftRegression`` (``compare_tail_latency`` on the
    TTFT buckets, p95 only, one observation per request), or its share of failed requests above
    the baseline's by more than ``maxErrorRateIncrease`` (``compare_error_rate``), with confidence
    ``th.confidence`` each."""
    g = spec.promotion.guard
    base, prom = felt.ttft.get("baseline"), felt.ttft.get("promoted")
    if base and prom:
        try:
            tail = compare_tail_latency(base, prom, g.max_ttft_regression, th.confidence, quantiles=(0.95,))
        except ValueError:
            tail = None
        q = tail.q(0.95) if tail is not None else None
        if tail is not None and tail.regresses and q is not None:
            change = f" ({q.change * 100:+.0f}%)" if q.change is not None else ""
            return (f"p95 time to first token{change} rose beyond promotion.guard.maxTtftRegression "
                    f"({g.max_ttft_regression * 100:.0f}%)")
    counts = {arm: felt.finished.get(arm) for arm in ("baseline", "promoted")}
    if all(counts.values()) and felt.error_reasons:
        errors = {arm: sum(v for r, v in c.items() if r in felt.error_reasons) for arm, c in counts.items()}
        total = {arm: sum(c.values()) for arm, c in counts.items()}
        rate = compare_error_rate(errors["baseline"], total["baseline"], errors["promoted"], total["promoted"],
                                  g.max_error_rate_increase, th.confidence)
        if rate.worse:
            return (f"failed requests {rate.canary_rate * 100:.1f}% ({errors['promoted']:.0f} of "
                    f"{total['promoted']:.0f}) vs {rate.control_rate * 100:.1f}%, beyond "
                    f"promotion.guard.maxErrorRateIncrease ({g.max_error_rate_increase * 100:g} points)")
    return None
