"""Anytime-valid sequential comparison of a canary against its control, one metric at a time.

What is estimated: the relative change of the canary's mean against the control's mean,
    change = mean(canary) / mean(control) - 1,
through the log-ratio D = log(mean_canary) - log(mean_control). By the delta method its variance
is v = s_k^2 / (n_k m_k^2) + s_c^2 / (n_c m_c^2); call I = 1/v the information.

The interval is a two-sided *confidence sequence*: it holds at every sample count simultaneously
with probability >= confidence, so the operator may look after every new sample and stop the
moment the answer is clear, without inflating the error (unlike re-running a fixed-horizon test).
It is the normal-mixture boundary of Robbins (1970) as used by Howard, Ramdas, McAuliffe and
Sekhon (2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences", eq. 14) and,
with a plug-in variance, the asymptotic confidence sequence of Waudby-Smith, Arbour, Sinha,
Kennedy and Ramdas (2021, "Time-uniform central limit theory and asymptotic confidence
sequences"). It is also exactly the mSPRT of Johari et al. and of Lindon, Sanden and Shirikian
(KDD 2022, "Rapid regression detection in software deployments through sequential testing")
inverted into an interval. Mixing the effect over N(0, tau^2), the mixture likelihood ratio
    L = (1 + tau^2 I)^(-1/2) * exp(tau^2 I^2 (D - delta)^2 / (2 (1 + tau^2 I)))
is a (asymptotic) nonnegative martingale under the true delta, and Ville's inequality keeps it
below 1/alpha forever with probability 1 - alpha. Solving L < 1/alpha for delta:
    |D - delta| < sqrt( (1 + tau^2 I) / (tau^2 I^2) * (2 log(1/alpha) + log(1 + tau^2 I)) ).
tau sets where the boundary is tightest; by default it is the metric's own threshold, the effect
size the decision cares about.

SciPy has no confidence sequences or mSPRT, so this is written out by hand here (a few lines of
numpy). The same vectorised function serves the operator and the decision benchmark.

Caveats, stated rather than hidden: the guarantee is asymptotic (plug-in variance, i.i.d.
samples); below `min_samples` per arm no verdict is given at all; serially correlated samples
(e.g. overlapping windows) would make the interval too narrow, so feed disjoint windows.

Added for issue 11 (docs/statistics.md has the reasoning and the Monte-Carlo evidence):

* `PairedComparison` -- canary vs control over *paired* windows (both arms measured over the same
  wall-clock windows), so drift and slowdowns common to both arms cancel instead of widening (or,
  with roles measured one after the other, biasing) the interval. Latency: the mean of per-window
  log-ratios log(canary_i / control_i). Throughput: the ratio of sums sum(canary_i) / sum(control_i)
  (Fieller's construction), where a window with zero tokens (a stall) is a sample of 0 against its
  arm; a window where both arms are zero carries no comparison and is dropped (counted); a missing
  value (None/NaN) drops its pair (counted). Both use the sequential t-test's confidence sequence
  (Lai 1976; Wang & Ramdas 2023): a scale-invariant mixture martingale, exact for Gaussian windows
  at every n, so it holds at the small per-test alphas of a family-wise split after 10-18 windows,
  where a plug-in variance does not.
* `SequentialComparison` (independent arms) keeps its API; a zero throughput sample now counts as a
  stall instead of being dropped (zeros are still rejected for latency, where they are impossible).
* `compare_tail_latency` -- p95/p99 per-token latency from Prometheus-style cumulative histogram
  buckets per arm, with time-uniform bucket-level bounds (a conjugate beta-binomial mixture
  martingale, exact rather than asymptotic) and a verdict against `maxTailLatencyRegression`.
* `per_test_confidence` / `Thresholds.for_family` -- the split of the policy's error budget over
  the planned batch sizes x metrics, so that `confidence` is the probability that the whole
  decision is right. Loss claims (NoGain, Regresses, a tail veto) get a Bonferroni share each, and
  a paired comparison spends only the canary-worse half of it (its one-sided worse bound); the
  half left over pays for the canary-better bounds that Wins claims read, which need one share in
  all (`win_confidence`): `decide()` reads wins only along the run from the smallest planned batch
  size, a fixed-sequence procedure (docs/statistics.md, section 4, has the argument).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from enum import Enum
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "Verdict",
    "Direction",
    "Thresholds",
    "ComparisonResult",
    "SequentialComparison",
    "PairedComparison",
    "TailComparison",
    "QuantileComparison",
    "compare_tail_latency",
    "histogram_quantile",
    "per_test_confidence",
    "win_confidence",
    "log_ratio_confidence_sequence",
    "paired_ratio_confidence_sequence",
    "paired_log_confidence_sequence",
    "mixture_half_width",
    "DEFAULT_MAX_TAIL_LATENCY_REGRESSION",
    "DEFAULT_METRICS_PER_BATCH",
    "PAIRED_EFFECT_PRIOR",
]

#: Proposed default of ``analysis.maxTailLatencyRegression``: the canary's p95/p99 per-token latency
#: may be at most twice the control's (docs/statistics.md, "Tails", says why 100%).
DEFAULT_MAX_TAIL_LATENCY_REGRESSION = 1.0
#: Tests per batch size in the family-wise split: per-token latency, throughput, tail latency.
DEFAULT_METRICS_PER_BATCH = 3
#: Prior precision c of the standardised effect in the paired tests' scale-invariant mixture
#: (`paired_log_confidence_sequence`): the effect / per-window sd is mixed over N(0, 1/c). Any fixed c
#: keeps the guarantee; c = 0.3 makes the boundary narrowest around 10-18 windows, the length of one
#: step at the CRD's defaults (docs/statistics.md has the table; re-checked for the one-sided win
#: bounds over a step's full share of 10-54 windows: c = 1 or 3 moves the benchmark by < 0.1 point).
PAIRED_EFFECT_PRIOR = 0.3


class Verdict(str, Enum):
    BETTER = "Better"  # the canary is better by more than the threshold, with confidence
    WORSE = "Worse"  # the canary is worse by more than the threshold, with confidence
    EQUIVALENT = "Equivalent"  # the whole interval lies inside +-threshold
    NOT_ENOUGH_DATA = "NotEnoughData"  # too few samples, bad samples, or the interval is still too wide


class Direction(str, Enum):
    LOWER_IS_BETTER = "lower"  # per-token latency, TTFT
    HIGHER_IS_BETTER = "higher"  # throughput


@dataclass(frozen=True)
class Thresholds:
    """The policy's analysis thresholds (fractions, not percent)."""

    min_latency_improvement: float = 0.05
    max_throughput_regression: float = 0.02
    confidence: float = 0.99
    min_samples: int = 10  # per arm, per metric, before any verdict
    # p95/p99 per-token latency may rise at most this much (1.0 = at most twice the control's)
    max_tail_latency_regression: float = DEFAULT_MAX_TAIL_LATENCY_REGRESSION
    # One-sided confidence of the canary-better bound of each paired interval (the bound a Wins claim
    # reads), set by `for_family`. None: paired intervals are two-sided at `confidence`. When set,
    # a paired interval's canary-worse bound is one-sided at 1 - (1 - confidence) / 2 instead.
    win_confidence: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError("confidence must be in (0, 1)")
        if self.win_confidence is not None and not 0.0 < self.win_confidence < 1.0:
            raise ValueError("win_confidence must be in (0, 1)")
        if self.min_latency_improvement < 0 or self.max_throughput_regression < 0:
            raise ValueError("thresholds must be >= 0")
        if self.max_tail_latency_regression < 0:
            raise ValueError("max_tail_latency_regression must be >= 0")
        if self.min_samples < 2:
            raise ValueError("min_samples must be >= 2 (a variance needs two samples)")

    def for_family(self, n_batch_sizes: int, n_metrics: int = DEFAULT_METRICS_PER_BATCH) -> "Thresholds":
        """The thresholds each single test runs at so that the policy's ``confidence`` holds for
        the whole decision (docs/statistics.md, section 4). ``confidence`` becomes the Bonferroni
        share of each of the ``n_batch_sizes`` x ``n_metrics`` planned tests (the bound of every loss
        claim: NoGain, Regresses, a tail veto; a paired comparison's canary-worse bound is one-sided
        at half of it); ``win_confidence`` the one-sided level of the canary-better bounds that Wins
        claims read (`win_confidence`). Margins are unchanged."""
        return replace(self, confidence=per_test_confidence(self.confidence, n_batch_sizes, n_metrics),
                       win_confidence=win_confidence(self.confidence, n_batch_sizes, n_metrics))


def per_test_confidence(confidence: float, n_batch_sizes: int, n_metrics: int = DEFAULT_METRICS_PER_BATCH) -> float:
    """Bonferroni: each of the ``n_batch_sizes * n_metrics`` planned tests runs at
    ``1 - (1 - confidence) / (n_batch_sizes * n_metrics)``, so the probability that *any* of the
    policy's confidence sequences ever misses its true value (at any look, any batch size, any
    metric) is at most ``1 - confidence``. E.g. 0.99 over 5 batch sizes x 3 metrics -> 0.999333..."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")
    k = int(n_batch_sizes) * int(n_metrics)
    if k < 1:
        raise ValueError("n_batch_sizes and n_metrics must be >= 1")
    return 1.0 - (1.0 - confidence) / k


def win_confidence(confidence: float, n_batch_sizes: int, n_metrics: int = DEFAULT_METRICS_PER_BATCH) -> float:
    """One-sided confidence of the canary-better bound of every paired interval of a policy: the
    bound that a Wins claim (latency better by the minimum improvement, throughput not worse than
    its tolerance) reads.

    Why one share of the budget covers all batch sizes: `decision.decide` enables lookahead only
    along the run of wins from the smallest planned batch size, so a wrong enablement needs a false
    Wins claim at the *first* planned size that does not deserve one -- a single, fixed (if
    unknown) size, whose two better-side bounds each hold at this level (an intersection-union
    claim: if latency misses its minimum, a false win needs the latency bound to fail; if
    throughput misses its tolerance, the throughput bound). That is the fixed-sequence
    procedure. What pays for it: the loss claims read only the canary-worse side of a paired
    interval, one-sided at half of the test's share ``(1 - per_test_confidence) / 2``, so latency
    and throughput together leave one share per batch size unspent, ``(1 - confidence) /
    n_metrics`` in all. The tail (the other metrics) spends its whole share. Hence
    ``1 - (1 - confidence) / max(n_metrics, 2)``: 0.99 over 6 sizes x 3 metrics -> 0.99667 for the
    win bounds, 0.99972 one-sided for the worse bounds, 0.99944 for the tail."""
    per_test_confidence(confidence, n_batch_sizes, n_metrics)  # validates
    return 1.0 - (1.0 - confidence) / max(int(n_metrics), 2)


def mixture_half_width(info: np.ndarray | float, alpha: float, tau: float) -> np.ndarray | float:
    """Half-width of the two-sided normal-mixture confidence sequence for an estimate with
    information `info` (1 / variance). Infinite where info <= 0 or is not finite."""
    info = np.asarray(info, dtype=float)
    t2 = tau * tau
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.sqrt((1.0 + t2 * info) / (t2 * info * info) * (2.0 * math.log(1.0 / alpha) + np.log1p(t2 * info)))
    w = np.where(np.isfinite(w) & (info > 0), w, np.inf)
    return w if w.ndim else float(w)


def log_ratio_confidence_sequence(
    n_c: np.ndarray | float,
    mean_c: np.ndarray | float,
    var_c: np.ndarray | float,
    n_k: np.ndarray | float,
    mean_k: np.ndarray | float,
    var_k: np.ndarray | float,
    alpha: float,
    tau: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised: (estimate D, lower, upper) of log(mean_k / mean_c) from per-arm counts, means and
    unbiased variances. NaN where the inputs cannot support an estimate (n < 2, mean <= 0)."""
    n_c, mean_c, var_c = (np.asarray(x, dtype=float) for x in (n_c, mean_c, var_c))
    n_k, mean_k, var_k = (np.asarray(x, dtype=float) for x in (n_k, mean_k, var_k))
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = (n_c >= 2) & (n_k >= 2) & (mean_c > 0) & (mean_k > 0) & np.isfinite(var_c) & np.isfinite(var_k)
        d = np.where(ok, np.log(mean_k) - np.log(mean_c), np.nan)
        # small-sample inflation of each arm's plug-in variance (1 + 3/n): at 10 samples a sample
        # variance is often far too small; measured in tests/unit/test_statistics.py, this keeps
        # the time-uniform miss rate under alpha from 10 samples per arm on
        v = var_k * (1.0 + 3.0 / n_k) / (n_k * mean_k**2) + var_c * (1.0 + 3.0 / n_c) / (n_c * mean_c**2)
        # a zero variance (identical samples) would make the interval a point; floor it at a
        # relative resolution of 1e-6 so that constant streams still give a finite, honest width
        v = np.maximum(v, 1e-12 * (1.0 / n_c + 1.0 / n_k))
        info = np.where(ok, 1.0 / v, 0.0)
    w = mixture_half_width(info, alpha, tau)
    lo = np.where(ok, d - w, np.nan)
    hi = np.where(ok, d + w, np.nan)
    return d, lo, hi


@dataclass(frozen=True)
class ComparisonResult:
    """Canary vs control on one metric, as of now. Changes are relative: +0.10 = canary 10% higher."""

    metric: str
    direction: Direction
    threshold: float
    confidence: float
    n_control: int
    n_canary: int
    control_mean: float | None
    canary_mean: float | None
    estimate: float | None  # relative change of the canary's mean vs the control's
    interval: tuple[float, float] | None  # confidence sequence for that change, at `confidence`
    verdict: Verdict
    note: str = ""  # why NotEnoughData, when it is
    # paired comparisons (PairedComparison): n_control == n_canary == number of paired intervals
    paired: bool = False
    stalls_control: int = 0  # intervals with zero output in that arm only, counted in (throughput)
    stalls_canary: int = 0
    dropped: int = 0  # intervals left out: a side missing, or both arms at zero (no comparison)
    # paired comparisons of a family split (Thresholds.for_family): the canary-better bound is
    # one-sided at this confidence, the canary-worse bound one-sided at 1 - (1 - confidence) / 2
    win_confidence: float | None = None

    # -- in "goodness" units: positive = canary better ---------------------------------------
    def _good(self) -> tuple[float, float] | None:
        if self.interval is None:
            return None
        lo, hi = self.interval
        if self.direction is Direction.LOWER_IS_BETTER:
            # latency: a relative change of -0.3 is an improvement of 0.3
            return (-hi, -lo)
        return (lo, hi)

    @property
    def improvement(self) -> float | None:
        """Estimated improvement (positive = better), e.g. 0.31 for a 31% latency drop."""
        if self.estimate is None:
            return None
        return -self.estimate if self.direction is Direction.LOWER_IS_BETTER else self.estimate

    @property
    def improvement_interval(self) -> tuple[float, float] | None:
        return self._good()

    def better_by_at_least(self, margin: float) -> bool:
        """With confidence, the canary is better by more than `margin` (a fraction)."""
        g = self._good()
        return g is not None and self.has_enough_data and g[0] > margin

    def worse_by_more_than(self, margin: float) -> bool:
        """With confidence, the canary is worse by more than `margin`."""
        g = self._good()
        return g is not None and self.has_enough_data and g[1] < -margin

    def not_worse_by_more_than(self, margin: float) -> bool:
        """With confidence, the canary is at most `margin` worse (non-inferiority)."""
        g = self._good()
        return g is not None and self.has_enough_data and g[0] > -margin

    def not_better_by(self, margin: float) -> bool:
        """With confidence, the canary does not improve by `margin` or more."""
        g = self._good()
        return g is not None and self.has_enough_data and g[1] < margin

    @property
    def has_enough_data(self) -> bool:
        return self.interval is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["direction"] = self.direction.value
        d["verdict"] = self.verdict.value
        d["interval"] = list(self.interval) if self.interval is not None else None
        return d


def _goodness(direction: Direction, lo: float, hi: float) -> tuple[float, float]:
    """A relative-change interval in "goodness" units (positive = canary better)."""
    return (-hi, -lo) if direction is Direction.LOWER_IS_BETTER else (lo, hi)


def _classify(good_lo: float, good_hi: float, threshold: float) -> Verdict:
    if good_lo > threshold:
        return Verdict.BETTER
    if good_hi < -threshold:
        return Verdict.WORSE
    if good_lo >= -threshold and good_hi <= threshold:
        return Verdict.EQUIVALENT
    return Verdict.NOT_ENOUGH_DATA


class _Welford:
    __slots__ = ("n", "mean", "m2", "rejected", "zeros", "allow_zero")

    def __init__(self, allow_zero: bool = False) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.rejected = 0
        self.zeros = 0
        self.allow_zero = allow_zero

    def add(self, x: float) -> None:
        x = float(x)
        if self.allow_zero and x == 0.0:
            # throughput: an interval with no output is a stall, a real observation that counts
            # against its arm (issue 11: a canary at [100, 0, 100, 0] tok/s is not "100 tok/s")
            self.zeros += 1
        elif not math.isfinite(x) or x <= 0.0:
            # latency and throughput are positive; NaN, inf, zero or negative is a broken sample,
            # counted so that status can say so, never folded into the estimate
            self.rejected += 1
            return
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    def merge(self, n: int, mean: float, m2: float) -> None:
        """Chan et al.'s parallel update: fold in a block summarised as (n, mean, M2)."""
        if n <= 0:
            return
        tot = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / tot
        self.m2 += m2 + delta * delta * self.n * n / tot
        self.n = tot

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n >= 2 else math.nan


class _Comparison:
    """What every comparison of canary against control shares: the metric, its direction, the
    threshold and confidence, and the two ways the operator builds one from its thresholds."""

    def __init__(self, metric: str, direction: Direction | str, threshold: float, confidence: float,
                 min_samples: int) -> None:
        self.metric = metric
        self.direction = Direction(direction)
        self.threshold = float(threshold)
        self.confidence = float(confidence)
        if not 0 < self.confidence < 1:
            raise ValueError("confidence must be in (0, 1)")
        self.min_samples = int(min_samples)

    @classmethod
    def for_latency(cls, thresholds: Thresholds, metric: str = "per_token_latency_seconds"):
        return cls(metric, Direction.LOWER_IS_BETTER, thresholds.min_latency_improvement,
                   thresholds.confidence, thresholds.min_samples)

    @classmethod
    def for_throughput(cls, thresholds: Thresholds, metric: str = "output_tokens_per_second"):
        return cls(metric, Direction.HIGHER_IS_BETTER, thresholds.max_throughput_regression,
                   thresholds.confidence, thresholds.min_samples)

    def add(self, role: str, samples: Any) -> None:  # pragma: no cover - each subclass defines it
        raise NotImplementedError

    def add_control(self, samples: Iterable[Any] | Any) -> None:
        self.add("control", samples)

    def add_canary(self, samples: Iterable[Any] | Any) -> None:
        self.add("canary", samples)


class SequentialComparison(_Comparison):
    """Feed samples per arm as they arrive; ask `result()` at any time.

    >>> c = SequentialComparison("tpot_seconds", Direction.LOWER_IS_BETTER, threshold=0.05)
    >>> c.add_control([0.021, 0.020, ...]); c.add_canary([0.013, ...]); c.result().verdict
    """

    def __init__(
        self,
        metric: str,
        direction: Direction | str,
        threshold: float,
        confidence: float = 0.99,
        min_samples: int = 10,
        mixture_scale: float | None = None,
    ) -> None:
        super().__init__(metric, direction, threshold, confidence, min_samples)
        # tau: the effect scale where the boundary is tightest; default the threshold itself
        # (floored so that a 0% threshold still gives a usable boundary)
        self.tau = float(mixture_scale) if mixture_scale is not None else max(self.threshold, 0.01)
        # a zero is a stall (counted) for throughput, an impossible value (rejected) for latency
        zeros = self.direction is Direction.HIGHER_IS_BETTER
        self._arms = {"control": _Welford(zeros), "canary": _Welford(zeros)}

    def add(self, role: str, samples: Iterable[float] | float) -> None:
        if role not in self._arms:
            raise ValueError(f"role must be 'control' or 'canary', got {role!r}")
        if isinstance(samples, (int, float, np.floating, np.integer)):
            samples = [samples]
        arm = self._arms[role]
        for x in samples:
            arm.add(x)

    def add_summary(self, role: str, n: int, mean: float, variance: float) -> None:
        """Fold in `n` samples known only by their mean and unbiased variance (e.g. a block the
        operator already reduced). Rejected (ignored) when not finite or not positive."""
        if role not in self._arms:
            raise ValueError(f"role must be 'control' or 'canary', got {role!r}")
        n = int(n)
        if n <= 0:
            return
        var = float(variance) if n >= 2 else 0.0
        floor_ok = mean >= 0 if self.direction is Direction.HIGHER_IS_BETTER else mean > 0
        if not (math.isfinite(mean) and floor_ok and math.isfinite(var) and var >= 0):
            self._arms[role].rejected += n
            return
        self._arms[role].merge(n, float(mean), var * (n - 1))

    def state(self) -> dict:
        """A JSON-ready snapshot (for the policy's status or a restart); see `from_state`."""
        return {
            "metric": self.metric, "direction": self.direction.value, "threshold": self.threshold,
            "confidence": self.confidence, "minSamples": self.min_samples, "tau": self.tau,
            "arms": {r: {"n": a.n, "mean": a.mean, "m2": a.m2, "rejected": a.rejected, "zeros": a.zeros}
                     for r, a in self._arms.items()},
        }

    @classmethod
    def from_state(cls, state: dict) -> "SequentialComparison":
        c = cls(state["metric"], state["direction"], state["threshold"], state["confidence"],
                state["minSamples"], mixture_scale=state["tau"])
        for role, a in state["arms"].items():
            arm = c._arms[role]
            arm.n, arm.mean, arm.m2, arm.rejected = int(a["n"]), float(a["mean"]), float(a["m2"]), int(a["rejected"])
            arm.zeros = int(a.get("zeros", 0))
        return c

    @property
    def n(self) -> tuple[int, int]:
        return self._arms["control"].n, self._arms["canary"].n

    def result(self) -> ComparisonResult:
        c, k = self._arms["control"], self._arms["canary"]
        base = dict(
            metric=self.metric, direction=self.direction, threshold=self.threshold,
            confidence=self.confidence, n_control=c.n, n_canary=k.n,
            control_mean=c.mean if c.n else None, canary_mean=k.mean if k.n else None,
        )
        rejected = c.rejected + k.rejected
        if c.n < self.min_samples or k.n < self.min_samples:
            note = f"need {self.min_samples} samples per arm, have {c.n} control / {k.n} canary"
            if rejected:
                note += f" ({rejected} non-finite or non-positive samples ignored)"
            est = (k.mean / c.mean - 1.0) if (c.n and k.n and c.mean > 0) else None
            return ComparisonResult(**base, estimate=est, interval=None, verdict=Verdict.NOT_ENOUGH_DATA, note=note)
        d, lo, hi = log_ratio_confidence_sequence(
            c.n, c.mean, c.var, k.n, k.mean, k.var, alpha=1.0 - self.confidence, tau=self.tau
        )
        d, lo, hi = float(d), float(lo), float(hi)
        if not (math.isfinite(d) and math.isfinite(lo) and math.isfinite(hi)):
            return ComparisonResult(**base, estimate=None, interval=None, verdict=Verdict.NOT_ENOUGH_DATA,
                                    note="samples do not support an estimate",
                                    stalls_control=c.zeros, stalls_canary=k.zeros)
        est, ilo, ihi = math.expm1(d), math.expm1(lo), math.expm1(hi)
        verdict = _classify(*_goodness(self.direction, ilo, ihi), self.threshold)
        return ComparisonResult(**base, estimate=est, interval=(ilo, ihi), verdict=verdict,
                                stalls_control=c.zeros, stalls_canary=k.zeros)


# --- paired intervals ---------------------------------------------------------------------------

def _lai_kappa(n: np.ndarray, alpha: float, prior: float) -> np.ndarray:
    """kappa_n = 1 - (alpha^2 c / (n + c))^(1/n): the scale-invariant mixture (below) stays under
    1/alpha exactly when S_n^2 < kappa_n (n + c) V_n."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.expm1(np.log(alpha * alpha * prior / (n + prior)) / n)


def _student_t_cdf(x: np.ndarray, nu: int) -> np.ndarray:
    """P(T <= x) for Student's t with an integer number of degrees of freedom ``nu`` >= 1, exactly
    (the finite series of Abramowitz & Stegun 26.7.3 / 26.7.4; numpy only, no SciPy at runtime)."""
    x = np.asarray(x, dtype=float)
    theta = np.arctan(x / math.sqrt(nu))
    c2 = np.cos(theta) ** 2
    coef = _t_series(int(nu))
    s = (c2[..., None] ** np.arange(coef.size)) @ coef
    if nu % 2 == 0:
        a = np.sin(theta) * s
    else:
        a = (2.0 / math.pi) * (theta + np.sin(theta) * np.cos(theta) * s)
    return np.clip(0.5 * (1.0 + a), 0.0, 1.0)


@lru_cache(maxsize=1024)
def _t_series(nu: int) -> np.ndarray:
    """Coefficients (in cos^2 theta) of the A&S series: even nu 1, 1/2, 1*3/(2*4), ...; odd nu
    1, 2/3, 2*4/(3*5), ... (none for nu = 1)."""
    if nu % 2 == 0:
        k = np.arange(1, nu // 2)
        return np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])
    if nu == 1:
        return np.zeros(1)
    k = np.arange(1, (nu - 1) // 2)
    return np.concatenate([[1.0], np.cumprod((2 * k) / (2 * k + 1))])


def _log_one_sided_mixture(rho: float, n: int, prior: float) -> float:
    """log of the one-sided scale-invariant mixture B+_n at rho = S / sqrt((n + c) V) > 0 (see
    `_one_sided_kappa`)."""
    a = rho / math.sqrt(1.0 - rho * rho)
    t = float(_student_t_cdf(np.array([math.sqrt(n) * a]), n)[0])
    return 0.5 * math.log(prior / (n + prior)) - 0.5 * n * math.log1p(-rho * rho) + math.log(2.0 * t)


@lru_cache(maxsize=4096)
def _one_sided_kappa_scalar(n: int, alpha: float, prior: float) -> float:
    if n < 2:
        return math.inf
    target = math.log(1.0 / alpha)
    top = math.sqrt(n / (n + prior))
    hi = top * (1.0 - 1e-15)
    if _log_one_sided_mixture(hi, n, prior) < target:
        return math.inf  # no mean is excluded yet: the bound is infinite
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _log_one_sided_mixture(mid, n, prior) >= target:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi * hi  # the rejection threshold itself (never below it: conservative by rounding)


def _one_sided_kappa(n: np.ndarray, alpha: float, prior: float) -> np.ndarray:
    """kappa such that the ONE-sided scale-invariant mixture stays under 1/alpha exactly when
    S_n < sqrt(kappa (n + c) V_n) (S, V the sums of d_i - m and (d_i - m)^2, as below).

    Mixing the standardised effect over a half-normal prior (effect > 0 only, precision c) instead
    of the two-sided N(0, 1/c) gives, with rho = S / sqrt((n + c) V) and T_n Student's t CDF,
        B+_n = sqrt(c / (n + c)) (1 - rho^2)^(-n/2) * 2 T_n( sqrt(n) rho / sqrt(1 - rho^2) ),
    the two-sided mixture times 2 P(Z <= a chi_n): a nonnegative martingale under the true mean for
    the same reason (a mixture of the scale-invariant likelihood ratios), increasing in rho > 0 and
    below 1 for every rho <= 0, so {B+_n >= 1/alpha} = {rho >= sqrt(kappa_n)}: the lower bound of a
    one-sided confidence sequence at level alpha. Solved numerically once per (n, alpha, c)."""
    n = np.asarray(n, dtype=float)
    out = np.full(n.shape, np.inf)
    ok = np.isfinite(n) & (n >= 2)
    if ok.any():
        uniq, inv = np.unique(n[ok].astype(np.int64), return_inverse=True)
        vals = np.array([_one_sided_kappa_scalar(int(u), float(alpha), float(prior)) for u in uniq])
        out[ok] = vals[inv]
    return out


def _side_kappas(n: np.ndarray, alpha: float | None, prior: float, alpha_lower: float | None,
                 alpha_upper: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(kappa for the lower bound, kappa for the upper bound): both the two-sided kappa at alpha,
    or one-sided kappas at alpha_lower and alpha_upper."""
    if alpha_lower is None and alpha_upper is None:
        if alpha is None or not 0 < alpha < 1:
            raise ValueError("alpha must be in (0, 1)")
        k = _lai_kappa(n, alpha, prior)
        return k, k
    if alpha_lower is None or alpha_upper is None or not (0 < alpha_lower < 1 and 0 < alpha_upper < 1):
        raise ValueError("alpha_lower and alpha_upper must both be in (0, 1)")
    return _one_sided_kappa(n, alpha_lower, prior), _one_sided_kappa(n, alpha_upper, prior)


def paired_log_confidence_sequence(
    n: np.ndarray | float,
    sum_d: np.ndarray | float,
    sum_dd: np.ndarray | float,
    alpha: float | None = None,
    prior: float | None = None,
    *,
    alpha_lower: float | None = None,
    alpha_upper: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised: (estimate, lower, upper) of the mean of i.i.d. paired differences d_i (here
    per-window log-ratios log(canary_i / control_i)) from the running sums of d and d^2.

    The confidence sequence of the sequential t-test (Lai 1976; Wang & Ramdas 2023, "Anytime-valid
    t-tests and confidence sequences for Gaussian means with unknown variance"): for a candidate
    mean m, with S = sum(d_i - m) and V = sum((d_i - m)^2), mixing the standardised effect
    (mean - m) / sigma over N(0, 1/c) and the scale over the right-Haar prior d(sigma)/sigma gives
        B_n(m) = sqrt(c / (n + c)) * (V / (V - S^2 / (n + c)))^(n / 2),
    a nonnegative martingale under the true mean (in the filtration of the scale-invariant
    statistics), so by Ville's inequality it stays below 1/alpha at every n with probability
    >= 1 - alpha. No plug-in variance, no asymptotics: exact for Gaussian d_i, at any n >= 2, so
    it holds at the small per-test alphas a family-wise split asks for. Solving B_n(m) < 1/alpha:
        |mean(d) - m| < s * sqrt(kappa (n + c) (n - 1) / (n (n - kappa (n + c)))),
    s the sample standard deviation (infinite while n <= kappa (n + c)). NaN where n < 2.

    ``alpha_lower`` / ``alpha_upper`` (both, instead of ``alpha``): two ONE-sided sequences, the
    lower bound at level alpha_lower and the upper at alpha_upper (half-normal mixtures,
    `_one_sided_kappa`), each valid at every n on its own; the interval then covers with
    probability >= 1 - alpha_lower - alpha_upper."""
    c = PAIRED_EFFECT_PRIOR if prior is None else float(prior)
    n, sum_d, sum_dd = (np.asarray(x, dtype=float) for x in (n, sum_d, sum_dd))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ok = n >= 2
        d = sum_d / n
        s2 = np.maximum(np.maximum(sum_dd - n * d * d, 0.0) / np.maximum(n - 1.0, 1.0), 1e-12)
        k_lo, k_hi = _side_kappas(n, alpha, c, alpha_lower, alpha_upper)

        def width(k: np.ndarray) -> np.ndarray:
            den = n - k * (n + c)
            return np.where(np.isfinite(k) & (den > 0), np.sqrt(k * (n + c) * (n - 1.0) * s2 / (n * den)), np.inf)

        d = np.where(ok, d, np.nan)
        return d, np.where(ok, d - width(k_lo), np.nan), np.where(ok, d + width(k_hi), np.nan)


def paired_ratio_confidence_sequence(
    n: np.ndarray | float,
    sum_c: np.ndarray | float,
    sum_k: np.ndarray | float,
    sum_cc: np.ndarray | float,
    sum_kk: np.ndarray | float,
    sum_ck: np.ndarray | float,
    alpha: float | None = None,
    prior: float | None = None,
    *,
    alpha_lower: float | None = None,
    alpha_upper: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised: (log R_hat, log lower, log upper) for R = E[canary] / E[control] from the running
    sums of ``n`` paired windows (control c_i, canary k_i, the same wall-clock windows).

    Fieller's construction made anytime-valid: R = r exactly when y_i(r) = k_i - r c_i has mean 0,
    so the set of r that the sequential t-test of `paired_log_confidence_sequence` does not reject
    for y(r) is a confidence sequence for R. With S(r) = sum(k) - r sum(c) and
    V(r) = sum(k^2) - 2 r sum(ck) + r^2 sum(c^2) the condition S(r)^2 < kappa (n + c) V(r) is a
    quadratic inequality in r: a bounded interval when sum(c)^2 > kappa (n + c) sum(c^2), unbounded
    (no information yet) otherwise. A factor common to both arms in a window (drift, a shared
    slowdown) scales c_i and k_i together and leaves y_i(R) small: that is what pairing buys. A
    stall (k_i = 0) enters as y_i = -r c_i, a large residual against the canary.

    NaN where the sums cannot support an estimate (n < 2, no control output); where the canary
    produced nothing at all the estimate and both bounds are -inf (-100%, with certainty); an upper
    bound of +inf when the interval is unbounded.

    ``alpha_lower`` / ``alpha_upper`` (both, instead of ``alpha``): one-sided sequences as in
    `paired_log_confidence_sequence`. The lower bound of R is the lower root of the quadratic with
    the lower side's kappa: below it S(r) > 0 is large enough for the one-sided mixture against
    "R > r" to exceed 1/alpha_lower; the upper bound the upper root with the upper side's kappa."""
    c0 = PAIRED_EFFECT_PRIOR if prior is None else float(prior)
    n, sc, sk, scc, skk, sck = (np.asarray(x, dtype=float) for x in (n, sum_c, sum_k, sum_cc, sum_kk, sum_ck))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ok = (n >= 2) & (sc > 0) & (sk > 0)
        nothing = (n >= 2) & (sc > 0) & (sk == 0)
        k_lo, k_hi = _side_kappas(n, alpha, c0, alpha_lower, alpha_upper)

        def roots(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            finite = np.isfinite(k)
            q = np.where(finite, k, 0.0) * (n + c0)
            eps = 1.0 + 1e-12  # a relative variance floor: constant streams still get a finite width
            a = sc * sc - q * scc * eps
            b = -2.0 * sk * sc + 2.0 * q * sck
            cc = sk * sk - q * skk * eps
            disc = b * b - 4.0 * a * cc
            root = np.sqrt(np.maximum(disc, 0.0))
            bounded = finite & (a > 0) & (disc >= 0)
            return np.where(bounded, (-b - root) / (2.0 * a), 0.0), np.where(bounded, (-b + root) / (2.0 * a), np.inf)

        r_lo, r_hi = roots(k_lo)
        if k_hi is not k_lo:
            _, r_hi = roots(k_hi)
        r_hat = sk / sc
        # the estimate always lies inside; a lower root below 0 means "down to -100%"
        lo = np.log(np.clip(np.minimum(r_lo, r_hat), 0.0, None))
        hi = np.log(np.maximum(r_hi, r_hat))
        d = np.where(ok, np.log(r_hat), np.where(nothing, -np.inf, np.nan))
        lo = np.where(ok, lo, np.where(nothing, -np.inf, np.nan))
        hi = np.where(ok, hi, np.where(nothing, -np.inf, np.nan))
    return d, lo, hi


_LOG_CLIP = 50.0


def _value(x: Any) -> float | None:
    """A sample as a float, or None when missing (None, NaN, inf, not a number)."""
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class PairedComparison(_Comparison):
    """Canary vs control on one metric over *paired* intervals: interval i of both arms covers the
    same wall-clock window under the same load. Feed intervals as they close; ask `result()` at any
    time (anytime-valid, like `SequentialComparison`, whose `ComparisonResult` it returns with
    ``paired=True``).

    >>> tp = PairedComparison.for_throughput(Thresholds())
    >>> tp.add_pairs(control=[60, 61, 59], canary=[100, 0, 100])   # a canary stall counts as 0 tok/s
    >>> lat = PairedComparison.for_latency(Thresholds())
    >>> lat.add("control", [0.020, None, 0.021]); lat.add("canary", [0.013, 0.014, None])

    Missing values (None, NaN) keep their place: `add(role, samples)` appends to that role's
    sequence and pairs are formed by position, so both roles must be given the same windows in the
    same order (an arm ahead of the other waits for its partner). Zero: for throughput
    (HIGHER_IS_BETTER) a stall, counted as a sample of 0 against its arm; when both arms are zero in
    the same window the window says nothing about the comparison and is dropped (counted in
    ``dropped``). For latency a zero is impossible and is treated as missing (rejected).
    Negative values are rejected (missing).
    """

    def __init__(
        self,
        metric: str,
        direction: Direction | str,
        threshold: float,
        confidence: float = 0.99,
        min_samples: int = 10,
        effect_prior: float | None = None,
        estimator: str | None = None,
        win_confidence: float | None = None,
    ) -> None:
        super().__init__(metric, direction, threshold, confidence, min_samples)
        # None: the interval is two-sided at `confidence`. Set (a family split, Thresholds.for_family):
        # the canary-better bound is one-sided at win_confidence, the canary-worse bound one-sided
        # at 1 - (1 - confidence) / 2 (docs/statistics.md, section 4)
        self.win_confidence = float(win_confidence) if win_confidence is not None else None
        if self.win_confidence is not None and not 0 < self.win_confidence < 1:
            raise ValueError("win_confidence must be in (0, 1)")
        # c: prior precision of the standardised effect in the mixture; see PAIRED_EFFECT_PRIOR
        self.effect_prior = float(effect_prior) if effect_prior is not None else PAIRED_EFFECT_PRIOR
        if self.effect_prior <= 0:
            raise ValueError("effect_prior must be > 0")
        self._zero_is_stall = self.direction is Direction.HIGHER_IS_BETTER
        # "log": mean of per-window log-ratios (robust to one-window spikes; latency, where a window
        # without output has no value); "ratio": ratio of sums (throughput, where a stall is a 0)
        self.estimator = estimator or ("ratio" if self._zero_is_stall else "log")
        if self.estimator not in ("log", "ratio"):
            raise ValueError("estimator must be 'log' or 'ratio'")
        if self.estimator == "log" and self._zero_is_stall:
            raise ValueError("a log-ratio cannot count a stall (a window with 0 output): use estimator='ratio'")
        self._pending: dict[str, list[float | None]] = {"control": [], "canary": []}
        self._c: list[float] = []
        self._k: list[float] = []
        self.dropped = 0  # windows with a side missing, or both sides at zero
        self.rejected = 0  # values that were present but impossible (negative; zero latency)

    # -- construction like SequentialComparison, plus the family split's win side -----------
    @classmethod
    def for_latency(cls, thresholds: Thresholds, metric: str = "per_token_latency_seconds"):
        return cls(metric, Direction.LOWER_IS_BETTER, thresholds.min_latency_improvement,
                   thresholds.confidence, thresholds.min_samples, win_confidence=thresholds.win_confidence)

    @classmethod
    def for_throughput(cls, thresholds: Thresholds, metric: str = "output_tokens_per_second"):
        return cls(metric, Direction.HIGHER_IS_BETTER, thresholds.max_throughput_regression,
                   thresholds.confidence, thresholds.min_samples, win_confidence=thresholds.win_confidence)

    def side_alphas(self) -> tuple[float, float] | None:
        """(alpha of the lower bound, alpha of the upper bound) of the relative change, one-sided;
        None when the interval is two-sided at `confidence`."""
        if self.win_confidence is None:
            return None
        better, worse = 1.0 - self.win_confidence, (1.0 - self.confidence) / 2.0
        # latency: a lower canary value is better, so the upper bound of the change is the better side
        return (worse, better) if self.direction is Direction.LOWER_IS_BETTER else (better, worse)

    # -- feeding --------------------------------------------------------------------------
    def _clean(self, x: Any) -> float | None:
        v = _value(x)
        if v is None:
            return None
        if v < 0 or (v == 0 and not self._zero_is_stall):
            self.rejected += 1
            return None
        return v

    def _pair(self, c: Any, k: Any) -> None:
        c, k = self._clean(c), self._clean(k)
        if c is None or k is None or (c == 0 and k == 0):
            self.dropped += 1
            return
        self._c.append(c)
        self._k.append(k)

    def add_pairs(self, control: Iterable[Any], canary: Iterable[Any]) -> None:
        """Windows closed in both arms: control[i] and canary[i] are the same window."""
        control, canary = list(control), list(canary)
        if len(control) != len(canary):
            raise ValueError(f"paired windows: {len(control)} control values but {len(canary)} canary values")
        if any(self._pending.values()):
            raise ValueError("add_pairs after a one-sided add(): finish the pending windows with add() first")
        for c, k in zip(control, canary):
            self._pair(c, k)

    def add(self, role: str, samples: Iterable[Any] | Any) -> None:
        """Append one role's windows (None/NaN for a window without a value); pairs form by position."""
        if role not in self._pending:
            raise ValueError(f"role must be 'control' or 'canary', got {role!r}")
        if samples is None or isinstance(samples, (int, float, np.floating, np.integer)):
            samples = [samples]
        self._pending[role].extend(samples)
        c, k = self._pending["control"], self._pending["canary"]
        m = min(len(c), len(k))
        for i in range(m):
            self._pair(c[i], k[i])
        del c[:m], k[:m]

    # -- state ----------------------------------------------------------------------------
    @property
    def n(self) -> tuple[int, int]:
        return len(self._c), len(self._k)

    @property
    def unmatched(self) -> int:
        """Windows one arm has reported and the other not yet."""
        return abs(len(self._pending["control"]) - len(self._pending["canary"]))

    def state(self) -> dict:
        """A JSON-ready snapshot; see `from_state`."""
        return {
            "paired": True, "metric": self.metric, "direction": self.direction.value,
            "threshold": self.threshold, "confidence": self.confidence, "minSamples": self.min_samples,
            "effectPrior": self.effect_prior, "estimator": self.estimator, "winConfidence": self.win_confidence,
            "control": list(self._c),
            "canary": list(self._k),
            "dropped": self.dropped,
            "rejected": self.rejected,
            "pending": {r: [_value(v) for v in p] for r, p in self._pending.items()},
        }

    @classmethod
    def from_state(cls, state: dict) -> "PairedComparison":
        c = cls(state["metric"], state["direction"], state["threshold"], state["confidence"],
                state["minSamples"], effect_prior=state.get("effectPrior"), estimator=state.get("estimator"),
                win_confidence=state.get("winConfidence"))
        c._c, c._k = [float(x) for x in state["control"]], [float(x) for x in state["canary"]]
        c.dropped, c.rejected = int(state.get("dropped", 0)), int(state.get("rejected", 0))
        for role, p in (state.get("pending") or {}).items():
            c._pending[role] = list(p)
        return c

    # -- the answer -----------------------------------------------------------------------
    def result(self) -> ComparisonResult:
        c = np.asarray(self._c, dtype=float)
        k = np.asarray(self._k, dtype=float)
        n = int(c.size)
        stalls_c = int(((c == 0) & (k > 0)).sum()) if n else 0
        stalls_k = int(((k == 0) & (c > 0)).sum()) if n else 0
        mc = float(c.mean()) if n else None
        mk = float(k.mean()) if n else None
        base = dict(
            metric=self.metric, direction=self.direction, threshold=self.threshold,
            confidence=self.confidence, n_control=n, n_canary=n, control_mean=mc, canary_mean=mk,
        )
        extra = dict(paired=True, stalls_control=stalls_c, stalls_canary=stalls_k, dropped=self.dropped,
                     win_confidence=self.win_confidence)
        if n < self.min_samples:
            note = f"need {self.min_samples} paired windows, have {n}"
            if self.dropped:
                note += f" ({self.dropped} windows without a value in both arms left out)"
            est = (mk / mc - 1.0) if (n and mc and mc > 0) else None
            return ComparisonResult(**base, estimate=est, interval=None, verdict=Verdict.NOT_ENOUGH_DATA,
                                    note=note, **extra)
        sides = self.side_alphas()
        level = dict(alpha=1.0 - self.confidence) if sides is None else dict(alpha_lower=sides[0], alpha_upper=sides[1])
        if self.estimator == "log":
            dl = np.log(k) - np.log(c)
            d, lo, hi = paired_log_confidence_sequence(n, dl.sum(), float(dl @ dl), prior=self.effect_prior, **level)
        else:
            d, lo, hi = paired_ratio_confidence_sequence(
                n, c.sum(), k.sum(), float(c @ c), float(k @ k), float(c @ k), prior=self.effect_prior, **level)
        d, lo, hi = float(d), float(lo), float(hi)
        if math.isnan(d) or math.isnan(lo) or math.isnan(hi):
            return ComparisonResult(**base, estimate=None, interval=None, verdict=Verdict.NOT_ENOUGH_DATA,
                                    note="the control produced nothing in these windows: no ratio", **extra)
        # a bound beyond e^+-50 says nothing more than "unbounded"; clip so that it stays a finite,
        # JSON-ready number (a canary with no output at all gets exactly -100%)
        est, ilo, ihi = (math.expm1(min(max(x, -_LOG_CLIP), _LOG_CLIP)) for x in (d, lo, hi))
        verdict = _classify(*_goodness(self.direction, ilo, ihi), self.threshold)
        return ComparisonResult(**base, estimate=est, interval=(ilo, ihi), verdict=verdict, **extra)


# --- tails from histogram buckets ----------------------------------------------------------------

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
