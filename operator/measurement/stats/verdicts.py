"""What a comparison of canary against control concludes: the ``Verdict`` of one metric, its
``Direction``, and the ``ComparisonResult`` every comparison returns (pure)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class Verdict(str, Enum):
    BETTER = "Better"  # the canary is better by more than the threshold, with confidence
    WORSE = "Worse"  # the canary is worse by more than the threshold, with confidence
    EQUIVALENT = "Equivalent"  # the whole interval lies inside +-threshold
    NOT_ENOUGH_DATA = "NotEnoughData"  # too few samples, bad samples, or the interval is still too wide


class Direction(str, Enum):
    LOWER_IS_BETTER = "lower"  # per-token latency, TTFT
    HIGHER_IS_BETTER = "higher"  # throughput


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


def goodness(direction: Direction, lo: float, hi: float) -> tuple[float, float]:
    """A relative-change interval in "goodness" units (positive = canary better)."""
    return (-hi, -lo) if direction is Direction.LOWER_IS_BETTER else (lo, hi)


def classify(good_lo: float, good_hi: float, threshold: float) -> Verdict:
    if good_lo > threshold:
        return Verdict.BETTER
    if good_hi < -threshold:
        return Verdict.WORSE
    if good_lo >= -threshold and good_hi <= threshold:
        return Verdict.EQUIVALENT
    return Verdict.NOT_ENOUGH_DATA

