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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Iterable

import numpy as np

__all__ = [
    "Verdict",
    "Direction",
    "Thresholds",
    "ComparisonResult",
    "SequentialComparison",
    "log_ratio_confidence_sequence",
    "mixture_half_width",
]


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

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError("confidence must be in (0, 1)")
        if self.min_latency_improvement < 0 or self.max_throughput_regression < 0:
            raise ValueError("thresholds must be >= 0")
        if self.min_samples < 2:
            raise ValueError("min_samples must be >= 2 (a variance needs two samples)")


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


def _classify(good_lo: float, good_hi: float, threshold: float) -> Verdict:
    if good_lo > threshold:
        return Verdict.BETTER
    if good_hi < -threshold:
        return Verdict.WORSE
    if good_lo >= -threshold and good_hi <= threshold:
        return Verdict.EQUIVALENT
    return Verdict.NOT_ENOUGH_DATA


class _Welford:
    __slots__ = ("n", "mean", "m2", "rejected")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.rejected = 0

    def add(self, x: float) -> None:
        x = float(x)
        if not math.isfinite(x) or x <= 0.0:
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


class SequentialComparison:
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
        self.metric = metric
        self.direction = Direction(direction)
        self.threshold = float(threshold)
        self.confidence = float(confidence)
        if not 0 < self.confidence < 1:
            raise ValueError("confidence must be in (0, 1)")
        self.min_samples = int(min_samples)
        # tau: the effect scale where the boundary is tightest; default the threshold itself
        # (floored so that a 0% threshold still gives a usable boundary)
        self.tau = float(mixture_scale) if mixture_scale is not None else max(self.threshold, 0.01)
        self._arms = {"control": _Welford(), "canary": _Welford()}

    @classmethod
    def for_latency(cls, thresholds: Thresholds, metric: str = "per_token_latency_seconds") -> "SequentialComparison":
        return cls(metric, Direction.LOWER_IS_BETTER, thresholds.min_latency_improvement,
                   thresholds.confidence, thresholds.min_samples)

    @classmethod
    def for_throughput(cls, thresholds: Thresholds, metric: str = "output_tokens_per_second") -> "SequentialComparison":
        return cls(metric, Direction.HIGHER_IS_BETTER, thresholds.max_throughput_regression,
                   thresholds.confidence, thresholds.min_samples)

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
        if not (math.isfinite(mean) and mean > 0 and math.isfinite(var) and var >= 0):
            self._arms[role].rejected += n
            return
        self._arms[role].merge(n, float(mean), var * (n - 1))

    def state(self) -> dict:
        """A JSON-ready snapshot (for the policy's status or a restart); see `from_state`."""
        return {
            "metric": self.metric, "direction": self.direction.value, "threshold": self.threshold,
            "confidence": self.confidence, "minSamples": self.min_samples, "tau": self.tau,
            "arms": {r: {"n": a.n, "mean": a.mean, "m2": a.m2, "rejected": a.rejected} for r, a in self._arms.items()},
        }

    @classmethod
    def from_state(cls, state: dict) -> "SequentialComparison":
        c = cls(state["metric"], state["direction"], state["threshold"], state["confidence"],
                state["minSamples"], mixture_scale=state["tau"])
        for role, a in state["arms"].items():
            arm = c._arms[role]
            arm.n, arm.mean, arm.m2, arm.rejected = int(a["n"]), float(a["mean"]), float(a["m2"]), int(a["rejected"])
        return c

    def add_control(self, samples: Iterable[float] | float) -> None:
        self.add("control", samples)

    def add_canary(self, samples: Iterable[float] | float) -> None:
        self.add("canary", samples)

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
                                    note="samples do not support an estimate")
        est, ilo, ihi = math.expm1(d), math.expm1(lo), math.expm1(hi)
        if self.direction is Direction.LOWER_IS_BETTER:
            g_lo, g_hi = -ihi, -ilo
        else:
            g_lo, g_hi = ilo, ihi
        verdict = _classify(g_lo, g_hi, self.threshold)
        return ComparisonResult(**base, estimate=est, interval=(ilo, ihi), verdict=verdict)
