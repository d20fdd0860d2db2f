"""The policy's thresholds and the split of its error budget over the planned tests (pure).

``Thresholds`` holds the margins and the confidence; ``Thresholds.for_family`` / ``family_split``
give each single test its share so that ``confidence`` holds for the whole decision
(docs/statistics.md, section 4); ``policy_thresholds`` is the one builder from the policy's
``analysis`` fields (the operator and ``kubectl lookahead analyze`` both use it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: Proposed default of ``analysis.maxTailLatencyRegression``: the canary's p95/p99 per-token latency
#: may be at most twice the control's (docs/statistics.md, "Tails", says why 100%).
DEFAULT_MAX_TAIL_LATENCY_REGRESSION = 1.0
#: Tests per batch size in the family-wise split: per-token latency, throughput, tail latency.
DEFAULT_METRICS_PER_BATCH = 3


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



def family_split(th: Thresholds, planned: int) -> Thresholds:
    """Each test's share of ``th.confidence`` over ``planned`` batch sizes x ``DEFAULT_METRICS_PER_BATCH``
    tests (``Thresholds.for_family``): the operator's split, and ``analyze``'s."""
    return th.for_family(max(1, planned), DEFAULT_METRICS_PER_BATCH)


def policy_thresholds(min_latency_improvement: float, max_throughput_regression: float, confidence: float,
                      min_samples: int, max_tail_latency_regression: float | None = None) -> Thresholds:
    """The policy's thresholds from its ``analysis`` fields (and ``load.minSamplesPerStep``); a tail
    tolerance left unset is ``DEFAULT_MAX_TAIL_LATENCY_REGRESSION``."""
    tail = DEFAULT_MAX_TAIL_LATENCY_REGRESSION if max_tail_latency_regression is None else max_tail_latency_regression
    return Thresholds(min_latency_improvement=min_latency_improvement,
                      max_throughput_regression=max_throughput_regression,
                      confidence=confidence, min_samples=min_samples, max_tail_latency_regression=tail)
