"""Canary vs control on one metric, fed as samples arrive and asked at any time: independent
arms (``SequentialComparison``) or paired windows (``PairedComparison``)."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from lookahead_operator.measurement.stats.sequences import (PAIRED_EFFECT_PRIOR, log_ratio_confidence_sequence,
                                                            paired_log_confidence_sequence,
                                                            paired_ratio_confidence_sequence)
from lookahead_operator.measurement.stats.thresholds import Thresholds
from lookahead_operator.measurement.stats.verdicts import ComparisonResult, Direction, Verdict, classify, goodness


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

    def __init__(self, metric: str, direction: Direction | str, threshold: float, confidence: float = 0.99,
                 min_samples: int = 10, mixture_scale: float | None = None) -> None:
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
        verdict = classify(*goodness(self.direction, ilo, ihi), self.threshold)
        return ComparisonResult(**base, estimate=est, interval=(ilo, ihi), verdict=verdict,
                                stalls_control=c.zeros, stalls_canary=k.zeros)


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

    def __init__(self, metric: str, direction: Direction | str, threshold: float, confidence: float = 0.99,
                 min_samples: int = 10, effect_prior: float | None = None, estimator: str | None = None,
                 win_confidence: float | None = None) -> None:
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
        verdict = classify(*goodness(self.direction, ilo, ihi), self.threshold)
        return ComparisonResult(**base, estimate=est, interval=(ilo, ihi), verdict=verdict, **extra)

