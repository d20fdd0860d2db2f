"""Tail latency from Prometheus-style cumulative histogram buckets: ``histogram_quantile``, and
p95/p99 canary vs control with time-uniform bucket-level bounds (``compare_tail_latency``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from lookahead_operator.measurement.stats.thresholds import DEFAULT_MAX_TAIL_LATENCY_REGRESSION
from lookahead_operator.measurement.stats.verdicts import Verdict


def _buckets(h: Mapping[Any, Any] | Sequence[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(upper bounds, cumulative counts), sorted, +Inf last. Accepts {le: count} or [(le, count)];
    le may be a number, "+Inf" or math.inf. Counts are the increases of ``_bucket{le=...}`` over the
    window; they must be non-decreasing in le."""
    items = list(h.items()) if isinstance(h, Mapping) else list(h)
    pairs = []
    for le, cnt in items:
        b = math.inf if (isinstance(le, str) and le.strip().lower() in ("+inf", "inf")) else float(le)
        v = float(cnt)
        if math.isnan(b) or not math.isfinite(v) or v < 0:
            raise ValueError(f"bad histogram bucket le={le!r} count={cnt!r}")
        pairs.append((b, v))
    if not pairs:
        return np.zeros(0), np.zeros(0)
    pairs.sort()
    le = np.array([p[0] for p in pairs])
    cum = np.array([p[1] for p in pairs])
    if np.any(np.diff(cum) < -1e-9 * max(1.0, float(cum[-1]))):
        raise ValueError("histogram bucket counts must be cumulative (non-decreasing in le)")
    return le, np.maximum.accumulate(cum)


def histogram_quantile(q: float, buckets: Mapping[Any, Any] | Sequence[tuple[Any, Any]]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank
    q * total, the first bucket starting at 0; in the +Inf bucket, the largest finite bound.
    None without observations."""
    le, cum = _buckets(buckets)
    if le.size == 0 or cum[-1] <= 0:
        return None
    total = cum[-1]
    rank = q * total
    j = int(np.searchsorted(cum, rank, side="left"))
    j = min(j, le.size - 1)
    if math.isinf(le[j]):
        finite = le[np.isfinite(le)]
        return float(finite[-1]) if finite.size else None
    lo_b = le[j - 1] if j > 0 else 0.0
    lo_c = cum[j - 1] if j > 0 else 0.0
    width = cum[j] - lo_c
    if width <= 0:
        return float(le[j])
    return float(lo_b + (le[j] - lo_b) * (rank - lo_c) / width)


def _log_mixture_lr(s: float, n: float, p: float, a: float, b: float) -> float:
    """log of the conjugate beta-binomial mixture likelihood ratio against Bernoulli(p) after s
    successes in n trials (prior Beta(a, b)): a nonnegative martingale under p, so by Ville's
    inequality it exceeds 1/alpha at any time with probability <= alpha."""
    def betaln(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)
    ll = s * math.log(p) if s > 0 else 0.0
    ll += (n - s) * math.log1p(-p) if n - s > 0 else 0.0
    return betaln(a + s, b + n - s) - betaln(a, b) - ll


def _quantile_bounds(le: np.ndarray, cum: np.ndarray, q: float, alpha: float,
                     design_effect: float) -> tuple[float, float]:
    """(L, U): the q-quantile lies in (L, U] with the time-uniform confidence 1 - alpha, at bucket
    resolution. L is the largest bound b with F(b) < q certified, U the smallest with F(b) > q
    certified (0 and +inf when none). The claims are nested in b (counts grow with b), so one
    level alpha covers every bucket at once."""
    total = float(cum[-1]) / design_effect
    if total <= 0:
        return 0.0, math.inf
    # prior centred on q with the weight of 2 / (1 - q) observations (b = 2 "tail" observations)
    b0 = 2.0
    a0 = b0 * q / (1.0 - q)
    thresh = math.log(1.0 / alpha)
    lower, upper = 0.0, math.inf
    for bound, c in zip(le, cum):
        if math.isinf(bound):
            continue
        s = float(c) / design_effect
        phat = s / total
        if phat < q and _log_mixture_lr(s, total, q, a0, b0) >= thresh:
            lower = float(bound)  # F(bound) < q: the quantile is above this bound
        elif phat > q and _log_mixture_lr(s, total, q, a0, b0) >= thresh and math.isinf(upper):
            upper = float(bound)  # F(bound) > q: the quantile is at or below this bound
    return lower, upper


@dataclass(frozen=True)
class QuantileComparison:
    """One tail quantile, canary vs control. Latencies in the histogram's unit (seconds)."""

    quantile: float
    control: float | None  # histogram_quantile point estimates (for people)
    canary: float | None
    change: float | None  # canary / control - 1 of the point estimates
    control_bounds: tuple[float, float]  # (L, U]: where the control's quantile lies, with confidence
    canary_bounds: tuple[float, float]
    verdict: Verdict  # WORSE: canary's quantile above (1 + threshold) x the control's, with confidence


@dataclass(frozen=True)
class TailComparison:
    """Tail per-token latency (p95, p99), canary vs control, from histogram buckets.

    ``verdict`` is WORSE when some quantile is, with confidence, more than ``threshold`` above the
    control's (``regresses``): that blocks a promotion. EQUIVALENT / BETTER when every quantile is
    certified not worse (better) by more than the threshold, NOT_ENOUGH_DATA otherwise. Only
    WORSE changes a decision: the tail is a veto, never a reason to promote."""

    threshold: float
    confidence: float
    n_control: float
    n_canary: float
    quantiles: tuple[QuantileComparison, ...]
    verdict: Verdict
    note: str = ""

    @property
    def regresses(self) -> bool:
        return self.verdict is Verdict.WORSE

    def q(self, quantile: float) -> QuantileComparison | None:
        return next((x for x in self.quantiles if abs(x.quantile - quantile) < 1e-9), None)

    def worst(self) -> QuantileComparison | None:
        """The quantile that regressed (the highest, if several), else the highest quantile."""
        worse = [x for x in self.quantiles if x.verdict is Verdict.WORSE]
        pool = worse or list(self.quantiles)
        return max(pool, key=lambda x: x.quantile) if pool else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, full precision (inf as None); `from_dict` rebuilds an equal object."""
        def f(x: float | None) -> float | None:
            return None if x is None or (isinstance(x, float) and math.isinf(x)) else x
        return {
            "threshold": self.threshold, "confidence": self.confidence, "verdict": self.verdict.value,
            "samples": {"control": self.n_control, "canary": self.n_canary}, "note": self.note,
            "quantiles": [
                {"quantile": x.quantile, "control": x.control, "canary": x.canary, "change": x.change,
                 "controlBounds": [f(x.control_bounds[0]), f(x.control_bounds[1])],
                 "canaryBounds": [f(x.canary_bounds[0]), f(x.canary_bounds[1])],
                 "verdict": x.verdict.value}
                for x in self.quantiles],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TailComparison":
        def bounds(b: Sequence[Any] | None) -> tuple[float, float]:
            lo, hi = (list(b) + [None, None])[:2] if b else (None, None)
            return (0.0 if lo is None else float(lo), math.inf if hi is None else float(hi))
        qs = tuple(QuantileComparison(float(x["quantile"]), x.get("control"), x.get("canary"), x.get("change"),
                                      bounds(x.get("controlBounds")), bounds(x.get("canaryBounds")),
                                      Verdict(x.get("verdict") or Verdict.NOT_ENOUGH_DATA.value))
                   for x in d.get("quantiles") or [])
        s = d.get("samples") or {}
        return cls(float(d["threshold"]), float(d["confidence"]), float(s.get("control") or 0),
                   float(s.get("canary") or 0), qs, Verdict(d.get("verdict") or Verdict.NOT_ENOUGH_DATA.value),
                   d.get("note") or "")


def compare_tail_latency(
    control: Mapping[Any, Any] | Sequence[tuple[Any, Any]],
    canary: Mapping[Any, Any] | Sequence[tuple[Any, Any]],
    max_regression: float = DEFAULT_MAX_TAIL_LATENCY_REGRESSION,
    confidence: float = 0.99,
    quantiles: Sequence[float] = (0.95, 0.99),
    design_effect: float = 1.0,
) -> TailComparison:
    """Tail per-token latency, canary vs control, from each arm's cumulative histogram buckets
    (``le`` upper bound -> count of observations <= le, as the increases of ``_bucket{le=...}`` over
    the step give; the ``+Inf`` bucket is the total).

    Per quantile and arm, the quantile is bracketed at bucket resolution with a time-uniform
    confidence (conjugate beta-binomial mixture on the bucket counts, valid at every look); the
    error budget ``1 - confidence`` is split over the quantiles x 2 arms. A quantile is WORSE when
    the canary's lower bound exceeds ``(1 + max_regression)`` x the control's upper bound: a claim
    that survives the bucket coarseness, so a regression of less than one bucket step can never be
    certified (the default threshold of 100% is about one step of the usual latency buckets).

    ``design_effect``: observations are treated as independent; when they are not (per-token
    observations of one decode step share its time), divide the counts by the number of
    observations that move together (e.g. the batch size) -- conservative, never looser."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if max_regression < 0:
        raise ValueError("max_regression must be >= 0")
    if design_effect < 1:
        raise ValueError("design_effect must be >= 1")
    quantiles = tuple(float(x) for x in quantiles)
    if not quantiles or any(not 0 < x < 1 for x in quantiles):
        raise ValueError("quantiles must be in (0, 1)")
    le_c, cum_c = _buckets(control)
    le_k, cum_k = _buckets(canary)
    n_c = float(cum_c[-1]) if cum_c.size else 0.0
    n_k = float(cum_k[-1]) if cum_k.size else 0.0
    alpha = (1.0 - confidence) / (2 * len(quantiles))
    need = max(1.0 / (1.0 - x) for x in quantiles) * design_effect
    results = []
    for qq in quantiles:
        pc = histogram_quantile(qq, list(zip(le_c, cum_c))) if n_c > 0 else None
        pk = histogram_quantile(qq, list(zip(le_k, cum_k))) if n_k > 0 else None
        change = (pk / pc - 1.0) if (pc and pk is not None and pc > 0) else None
        if n_c < need or n_k < need:
            results.append(QuantileComparison(qq, pc, pk, change, (0.0, math.inf), (0.0, math.inf),
                                              Verdict.NOT_ENOUGH_DATA))
            continue
        cb = _quantile_bounds(le_c, cum_c, qq, alpha, design_effect)
        kb = _quantile_bounds(le_k, cum_k, qq, alpha, design_effect)
        f = 1.0 + max_regression
        if kb[0] > f * cb[1]:
            v = Verdict.WORSE
        elif kb[1] <= f * cb[0]:
            v = Verdict.BETTER if kb[1] * f < cb[0] else Verdict.EQUIVALENT
        else:
            v = Verdict.NOT_ENOUGH_DATA
        results.append(QuantileComparison(qq, pc, pk, change, cb, kb, v))
    vs = [x.verdict for x in results]
    if Verdict.WORSE in vs:
        verdict = Verdict.WORSE
    elif Verdict.NOT_ENOUGH_DATA in vs:
        verdict = Verdict.NOT_ENOUGH_DATA
    elif all(v is Verdict.BETTER for v in vs):
        verdict = Verdict.BETTER
    else:
        verdict = Verdict.EQUIVALENT
    note = ""
    if n_c < need or n_k < need:
        note = (f"need {need:.0f} observations per arm for p{max(quantiles) * 100:g}, "
                f"have {n_c:.0f} control / {n_k:.0f} canary")
    return TailComparison(float(max_regression), float(confidence), n_c, n_k, tuple(results), verdict, note)


def proportion_bounds(events: float, trials: float, alpha: float) -> tuple[float, float]:
    """(lo, hi): a time-uniform confidence interval for a Bernoulli rate after ``events`` in
    ``trials`` (the same conjugate beta-binomial mixture martingale as the quantile bounds, with a
    Beta(1/2, 1/2) prior): every rate p whose mixture likelihood ratio stays below 1/alpha, found
    on a grid fine enough for a rate of errors (1e-6 .. 1 - 1e-6, log-spaced below 1/2)."""
    if trials <= 0:
        return 0.0, 1.0
    events = min(max(float(events), 0.0), float(trials))
    thresh = math.log(1.0 / alpha)
    low = np.geomspace(1e-6, 0.5, 400)
    grid = np.concatenate([low, 1.0 - low[::-1][1:]])
    inside = [p for p in grid if _log_mixture_lr(events, float(trials), float(p), 0.5, 0.5) < thresh]
    if not inside:
        rate = events / trials
        return rate, rate
    return float(min(inside)), float(max(inside))


@dataclass(frozen=True)
class RateComparison:
    """Error rate, canary vs control: ``worse`` when the canary's rate exceeds the control's by
    more than ``max_increase`` (absolute), with confidence (each side's ``proportion_bounds`` at
    half the error budget: the canary's lower bound minus the control's upper bound)."""

    control_rate: float | None
    canary_rate: float | None
    excess_lower: float | None      # canary lo - control hi: above max_increase -> worse
    max_increase: float
    worse: bool


def compare_error_rate(control_errors: float, control_requests: float, canary_errors: float,
                       canary_requests: float, max_increase: float, confidence: float = 0.99) -> RateComparison:
    alpha = (1.0 - confidence) / 2.0
    if control_requests <= 0 or canary_requests <= 0:
        return RateComparison(None, None, None, max_increase, False)
    _, control_hi = proportion_bounds(control_errors, control_requests, alpha)
    canary_lo, _ = proportion_bounds(canary_errors, canary_requests, alpha)
    excess = canary_lo - control_hi
    return RateComparison(control_errors / control_requests, canary_errors / canary_requests, excess, max_increase,
                          excess > max_increase)
