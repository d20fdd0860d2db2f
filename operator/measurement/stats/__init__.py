"""The statistics, pure (numpy only): anytime-valid sequential comparison of a canary against its
control, one metric at a time.

Modules by family: ``thresholds`` (the policy's margins and the family-wise split), ``verdicts``
(what a comparison concludes), ``sequences`` (the confidence sequences), ``comparisons``
(``SequentialComparison``, ``PairedComparison``), ``tails`` (histogram quantiles and the tail
veto), ``live`` (live traffic: ``LiveComparison``, paired windows per offered-load stratum, the
crossover as a load level). This package imports nothing from the operator but itself.

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

from lookahead_operator.measurement.stats.comparisons import PairedComparison, SequentialComparison
from lookahead_operator.measurement.stats.live import (DEFAULT_MAX_TTFT_REGRESSION, LIVE_METRICS_PER_STRATUM,
                                                       ArmWindow, Crossover, LiveComparison, LiveResults, LiveWindow,
                                                       Strata, StratumOutcome, StratumResult, is_visited,
                                                       leans_to_canary, live_thresholds, read_run, stratum_outcome)
from lookahead_operator.measurement.stats.sequences import (PAIRED_EFFECT_PRIOR, log_ratio_confidence_sequence,
                                                            mixture_half_width, paired_log_confidence_sequence,
                                                            paired_ratio_confidence_sequence)
from lookahead_operator.measurement.stats.tails import (QuantileComparison, RateComparison, TailComparison,
                                                        compare_error_rate, compare_tail_latency, histogram_quantile,
                                                        proportion_bounds)
from lookahead_operator.measurement.stats.thresholds import (DEFAULT_MAX_TAIL_LATENCY_REGRESSION,
                                                             DEFAULT_METRICS_PER_BATCH, Thresholds, family_split,
                                                             per_test_confidence, policy_thresholds, win_confidence)
from lookahead_operator.measurement.stats.verdicts import ComparisonResult, Direction, Verdict

__all__ = [
    "Verdict", "Direction", "Thresholds", "ComparisonResult", "SequentialComparison", "PairedComparison",
    "TailComparison", "QuantileComparison", "compare_tail_latency", "RateComparison", "compare_error_rate",
    "proportion_bounds", "histogram_quantile", "per_test_confidence",
    "win_confidence", "family_split", "policy_thresholds", "log_ratio_confidence_sequence",
    "paired_ratio_confidence_sequence", "paired_log_confidence_sequence", "mixture_half_width",
    "DEFAULT_MAX_TAIL_LATENCY_REGRESSION", "DEFAULT_METRICS_PER_BATCH", "PAIRED_EFFECT_PRIOR",
    "LiveComparison", "LiveWindow", "ArmWindow", "Strata", "StratumOutcome", "StratumResult", "LiveResults",
    "Crossover", "stratum_outcome", "live_thresholds", "read_run", "is_visited", "leans_to_canary",
    "LIVE_METRICS_PER_STRATUM",
    "DEFAULT_MAX_TTFT_REGRESSION",
]
