"""Live mode's measurement: canary and control serve a share of the fleet's real traffic, and each
pass reads, from Prometheus, every whole ``analysis.sampleInterval`` window since they serve.

Per window and arm (``arm_window``, an ``stats.live.ArmWindow``):

* per-token latency: the per-token histogram's ``_sum`` / ``_count`` increase (``role_sample``);
* the token rate per running request: tokens generated in the window over its request-seconds
  in flight (each pod's running-requests gauge mean, added up, x the window's length): under open-loop
  traffic a pod's tokens per second follow what users ask, tokens per second per request being
  served are what each user gets;
* time to first token: the TTFT histogram's ``_sum`` / ``_count`` increase;
* requests: those that got their first token; running: that gauge's mean per pod (an outcome:
  reported, never a stratum key).

The stratum key is the **fleet's** offered load: requests its own pods (not the arms') started in
the window, per fleet pod (docs/statistics.md, "Live traffic"). The strata's edges are fixed
before any window is compared, from the fleet's request rate over the ``PRE_PERIOD_S`` before
canary and control started serving (``edges_from_rate``): one stratum per doubling, the fleet's
load then in the middle of one.

The safety abort reads each arm over the last ``analysis.abort.window``: its latencies from the
windows above (summed), and one read of its own, the requests it finished and failed since it
served (``request_success_total`` by ``finished_reason``, the engine's error reasons), so that the
error check runs from the first request on. The controller judges it
(``controller.livesplit.abort_reason``).
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone
from typing import Any, NamedTuple, Sequence

from lookahead_operator.api.metric_names import MetricNames, metric_names
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import Decision, DecisionAction, LiveStratum, LookaheadPolicyStatus, RegimeRange
from lookahead_operator.measurement import prometheus
from lookahead_operator.measurement.measure import (
    prom_client,
    finished_by_reason,
    role_labels,
    last_scraped,
    until_seen,
    status_engine,
    thresholds,
)
from lookahead_operator.measurement.results import LiveMeasurement
from lookahead_operator.measurement.rules import DEFAULT_MAX_BATCH_SIZE
from lookahead_operator.measurement.stats.live import (
    ArmWindow,
    LiveComparison,
    LiveWindow,
    Strata,
    StratumOutcome,
    is_visited,
    leans_to_canary,
    read_run,
)

#: The fleet's request rate that fixes the strata is read over this long before the arms serve.
PRE_PERIOD_S = 300.0
#: Strata: this many doublings of the offered load below and above the fleet's load at the start.
STRATA_DOUBLINGS = 2


def edges_from_rate(per_window: float | None) -> tuple[float, ...]:
    """The strata's interior edges for a fleet whose pods were each offered ``per_window`` requests
    per window before the arms served: edges at ``per_window * 2^(k - 1/2)`` for k in
    -STRATA_DOUBLINGS+1 .. STRATA_DOUBLINGS, so that load sits in the middle of a stratum and each
    stratum spans one doubling (an idle fleet, or an unknown rate: one stratum, no edges)."""
    if per_window is None or not math.isfinite(per_window) or per_window <= 0:
        return ()
    return tuple(round(per_window * 2 ** (k - 0.5), 6) for k in range(-STRATA_DOUBLINGS + 1, STRATA_DOUBLINGS + 1))


def arm_window(s: prometheus.RoleSample, pod_running: Sequence[float] = (), errors: int = 0,
               served: int = 0) -> ArmWindow:
    """One arm over one window from its Prometheus sample and each of its pods' mean running
    requests (module docstring): the token rate is per request in flight on the whole arm, the
    running batch the pods' mean (a pod's batch, what the engine's switch reads). ``served``:
    requests finished by any reason, where they were read (a failed request may never have started)."""
    seconds = s.seconds or 0.0
    busy = sum(pod_running)
    rate = None
    if busy > 0 and seconds > 0 and s.output_tokens is not None:
        # 0 when requests were in flight and no token came out: a stall, counted against the arm
        rate = s.output_tokens / (busy * seconds)
    return ArmWindow(per_token_latency=s.per_token_latency_s, token_rate=rate, ttft=s.ttft_s,
                     requests=max(int(round(s.started or 0.0)), served), errors=errors,
                     running=statistics.fmean(pod_running) if pod_running else None)


def _fleet_match(targets: Sequence[tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """The fleet's own pods (their Deployments' ReplicaSets' pods; never canary or control, named
    after the policy)."""
    return prometheus.pod_match("namespace", "pod", sorted({ns for ns, _ in targets}), [n for _, n in targets],
                                deployments=True)


def _per_pod(prom, names: MetricNames, fleet: tuple[dict, dict], pods: int, t0: float, t1: float) -> float | None:
    """The fleet's requests per second per pod over [t0, t1] (as far as its pods were scraped)."""
    rate = prometheus.counter_rate(prom, f"{names.ttft}_count", fleet[0], t0, t1, regex=fleet[1])
    return None if rate is None else rate / max(1, pods)


def recent(prom, names: MetricNames, labels: dict[str, str], windows: Sequence[prometheus.Increments | None],
           start: float, end: float) -> ArmWindow:
    """One arm over the abort's window: its latencies from the ``windows`` already read for the
    comparison (their counters summed), its finished and failed requests over [start, end] (the
    one read of its own: failures by ``finished_reason``, from when the arm served)."""
    a = datetime.fromtimestamp(start, tz=timezone.utc)
    z = datetime.fromtimestamp(end, tz=timezone.utc)
    finished = finished_by_reason(prom, names.request_success, labels, None, a, z) if names.request_success else None
    errors = int(round(sum(v for r, v in (finished or {}).items() if r in names.error_reasons)))
    return arm_window(prometheus.role_sample(prometheus.merged(windows), names), errors=errors,
                      served=int(round(sum((finished or {}).values()))))


class _Span(NamedTuple):
    """What every live read starts from: the client, the engine's metric names, each arm's labels,
    when the arms began to serve and how far both are scraped, and the whole windows in between."""

    prom: Any
    names: MetricNames
    arms: dict[str, dict[str, str]]
    start: float     # the arms serve from here (progress.measuringSince)
    end: float       # both arms scraped up to here
    seen: float | None  # ... as Prometheus says (None: an arm has no live series: the abort cannot see it)
    interval: float  # analysis.sampleInterval
    t0: float        # the first window's start: one window after start (pods fill, endpoints settle)
    n: int           # whole windows in [t0, end]


def _span(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus, now: datetime,
          access: prometheus.PrometheusAccess | None) -> _Span | None:
    since = status.progress.measuring_since
    if since is None:
        return None
    prom = prom_client(spec, access)
    names = metric_names(status_engine(status))
    arms = {role: role_labels(policy, role) for role in ("control", "canary")}
    start = since.timestamp()
    seen = last_scraped(prom, names, list(arms.values()))
    end = until_seen(seen, now).timestamp()
    interval = spec.analysis.sample_interval.total_seconds()
    t0 = start + interval
    return _Span(prom, names, arms, start, end, seen, interval, t0, int((end - t0) // interval) if end > t0 else 0)


def abort_reading(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus, now: datetime,
                  access: prometheus.PrometheusAccess | None = None) -> LiveMeasurement:
    """The safety abort's reading alone (``_abort_reading``), no comparison: what a live decision
    waiting for approval reads every ``checkInterval`` (its arms still serve users), so that a long
    wait does not re-read every window since the arms served."""
    span = _span(spec, policy, status, now, access)
    if span is None:
        return LiveMeasurement(windows=0, note="canary and control are not serving yet")
    recent_arms = _abort_reading(spec, span)
    return LiveMeasurement(windows=span.n, canary_recent=recent_arms.get("canary"),
                           control_recent=recent_arms.get("control"), seen_until=_seen(span))


def _seen(span: _Span) -> datetime | None:
    return None if span.seen is None else datetime.fromtimestamp(span.seen, tz=timezone.utc)


def _abort_reading(spec: LookaheadPolicySpec, span: _Span) -> dict[str, ArmWindow]:
    """Each arm over the last ``analysis.abort.window`` (``recent``: its latencies from the whole
    windows in it, its finished and failed requests over it); none before the arms served 1 s."""
    if span.end - span.start < 1.0:
        return {}
    window = spec.analysis.abort.window.total_seconds()
    last = min(span.n, max(1, math.ceil(window / span.interval)))
    bounds = [span.t0 + k * span.interval for k in range(span.n - last, span.n + 1)]
    a = max(span.start, span.end - window)
    return {role: recent(span.prom, span.names, labels,
                         prometheus.prometheus_increments(span.prom, span.names, labels, bounds) if last else [],
                         a, span.end)
            for role, labels in span.arms.items()}


def measure(spec: LookaheadPolicySpec, policy: tuple[str, str], status: LookaheadPolicyStatus, now: datetime,
            targets: Sequence[tuple[str, str]], fleet_pods: int,
            access: prometheus.PrometheusAccess | None = None) -> LiveMeasurement:
    """This pass's live reading (module docstring): the per-stratum comparison over every whole
    window since the arms served, and the abort's reading (``abort_reading``). ``targets``: the
    fleet's Deployments (namespace, name); ``fleet_pods``: how many pods they run (the offered load
    is per pod)."""
    span = _span(spec, policy, status, now, access)
    if span is None:
        return LiveMeasurement(windows=0, note="canary and control are not serving yet")
    prom, names, n = span.prom, span.names, span.n
    p = status.progress
    fleet = _fleet_match(targets)
    edges = None
    if p.live_edges is None:
        rate = _per_pod(prom, names, fleet, fleet_pods, span.start - PRE_PERIOD_S, span.start) if names.ttft else None
        edges = edges_from_rate(None if rate is None else rate * span.interval)
    live_edges = edges if edges is not None else tuple(p.live_edges or ())
    comparison = LiveComparison(thresholds(spec), Strata(tuple(live_edges)),
                                max_ttft_regression=spec.promotion.guard.max_ttft_regression)
    if n >= 1:
        bounds = [span.t0 + k * span.interval for k in range(n + 1)]
        incs = {role: prometheus.prometheus_increments(prom, names, labels, bounds)
                for role, labels in span.arms.items()}
        fleet_incs = prometheus.prometheus_increments(prom, names, fleet[0], bounds, regex=fleet[1])
        running = {role: prometheus.gauge_series_means(prom, names.running, labels, bounds) if names.running
                   else [[]] * n for role, labels in span.arms.items()}
        for i in range(n):
            f = prometheus.role_sample(fleet_incs[i], names)
            if f.started is None:
                continue  # the fleet's pods were not scraped there: no stratum key
            comparison.add(LiveWindow(
                offered_load=f.started / max(1, fleet_pods),
                control=arm_window(prometheus.role_sample(incs["control"][i], names), running["control"][i]),
                canary=arm_window(prometheus.role_sample(incs["canary"][i], names), running["canary"][i])))
    # the abort's last windows are read once more there (a dozen, beside every window here), so that
    # the abort has one reader: the one a decision waiting for approval uses alone
    recent_arms = _abort_reading(spec, span)
    return LiveMeasurement(windows=n, results=comparison.results(), canary_recent=recent_arms.get("canary"),
                           control_recent=recent_arms.get("control"), edges=edges, seen_until=_seen(span),
                           note="" if n else "no whole window of live traffic yet")


def decision(spec: LookaheadPolicySpec, status: LookaheadPolicyStatus, max_batch_size: int | None = None
             ) -> Decision:
    """The decision from ``status.live``'s strata (pure; ``stats.live.read_run`` reads them as the
    sweep's rules read batch sizes):

    A stratum is *visited* when it holds ``load.minSamplesPerStep`` windows and as many paired ones
    (both arms served tokens in the window: at a low load an arm of one pod idles in many windows).
    A stratum with the windows but not the pairs could never be answered: below the lowest visited
    stratum it is read as unmeasured, as a load the traffic did not reach is (the reason names it).
    So is a visited stratum still Pending at the deadline whose latency estimate favours the canary,
    below the lowest settled one (``read_run``: a load below a measured Win is covered by it, since
    lookahead's gain only shrinks as load rises); it stays Pending, never a Win, and the reason
    names it.

    * no run of Wins from the lowest visited stratum and a visited stratum loses (NoGain or
      Regresses): **Rollback**, lookahead measured not to pay at a load the fleet carries (also when
      a briefly visited lower load is still Pending: nothing could be enabled there alone, since
      lookahead is enabled from batch 1 up, and a Pending answer is not a win);
    * no stratum visited (fewer than ``load.minSamplesPerStep`` windows each), or the run from the
      lowest visited stratum starts Pending with no loss measured above: **Inconclusive**;
    * a run of Wins: lookahead on up to the control's mean running batch in the run's busiest
      stratum (rounded up: the batch size that load corresponds to on the fleet as it runs), below
      the crossover's when one was measured, and off above: **PromoteRegimeAware**, or **Promote**
      when that reaches the engine's ``max_batch_size`` (lookahead is never enabled beyond the load
      it was measured at)."""
    live = status.live
    strata = list(live.strata or []) if live is not None else []
    minimum = spec.load.min_samples_per_step
    outcomes = [_OUTCOME.get(s.outcome, StratumOutcome.PENDING) for s in strata]
    visited = [is_visited(s.windows, s.pairs, minimum) for s in strata]
    leaning = [leans_to_canary(o, s.latency_change) for o, s in zip(outcomes, strata)]
    run, cross = read_run(outcomes, visited, leaning)
    table = "; ".join(_row_words(s) for s in strata if s.windows) or "no window of live traffic"
    evidence = {"live": live.to_dict() if live is not None else None, "minWindows": minimum,
                "maxBatchSize": max_batch_size}
    first = next((i for i, v in enumerate(visited) if v), None)
    loss = next((i for i, v in enumerate(visited) if v and outcomes[i].loss), None)
    if not run and loss is not None:
        where = ("the fleet's lowest load measured" if loss == first else
                 f"a load the fleet carries, and the lower load it visited has no answer "
                 f"({_row_words(strata[first])})")
        return Decision(action=DecisionAction.Rollback,
                        reason=f"live: lookahead does not pay at {where} ({_row_words(strata[loss])}); {table}",
                        evidence=evidence)
    if first is None or not run:
        why = (f"no offered-load stratum got {minimum} paired windows of live traffic" if first is None else
               f"the lowest stratum the traffic visited has no answer ({_row_words(strata[first])})")
        return Decision(action=DecisionAction.Inconclusive, reason=f"live: {why} by the analysis deadline; "
                                                                   f"lookahead stays off ({table})", evidence=evidence)
    unanswered = [_row_words(strata[i]) for i in range(run[0]) if strata[i].windows >= minimum]
    below = (f"; below it {'; '.join(unanswered)}: too few windows to answer (leaning lookahead's way where "
             f"measured), read as unmeasured: a lower load is covered by the win above it"
             if unanswered else "")
    top = max_batch_size or DEFAULT_MAX_BATCH_SIZE
    busiest = max((strata[i].control_running or 0.0) for i in run)
    cap = max(1, math.ceil(busiest - 1e-9))
    crossover = None
    if cross is not None:
        at = strata[cross].control_running
        crossover = max(1, math.ceil(at - 1e-9)) if at else None
        if crossover is not None:
            cap = max(1, min(cap, crossover - 1))
    where = f"up to a running batch of {cap} (the control's at the busiest winning load)"
    if cap >= top:
        return Decision(action=DecisionAction.Promote, reason=f"live: lookahead pays at every load measured, "
                                                              f"{where}, the engine's maximum {top}{below}; {table}",
                        regime=[RegimeRange(start=1, end=top, enabled=True)], evidence=evidence)
    cross_words = (f"; it stops paying at {strata[cross].offered_low:g} requests per pod per window "
                   f"(running batch {crossover})" if cross is not None and crossover else "; above it unmeasured")
    return Decision(action=DecisionAction.PromoteRegimeAware, crossover_batch_size=crossover,
                    reason=f"live: lookahead pays {where}, off above{cross_words}{below}; {table}",
                    regime=[RegimeRange(start=1, end=cap, enabled=True),
                            RegimeRange(start=cap + 1, end=max(top, cap + 1), enabled=False)],
                    evidence=evidence)


_OUTCOME = {o.value: o for o in StratumOutcome}


def _row_words(s: LiveStratum) -> str:
    hi = f"{s.offered_high:g}" if s.offered_high is not None else "inf"
    change = f" latency {s.latency_change * 100:+.1f}%" if s.latency_change is not None else ""
    paired = f" ({s.pairs} paired)" if s.pairs < s.windows else ""
    return f"load [{s.offered_low:g}, {hi}): {s.outcome}{change} over {s.windows} windows{paired}"
