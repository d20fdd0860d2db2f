"""The sequential comparisons: verdicts, guards against missing data, and their error guarantees
(independent arms, paired windows, tails from histogram buckets, the family-wise split)."""

import json
import math

import numpy as np
import pytest

from lookahead_operator.measurement.stats import (
    ComparisonResult,
    Direction,
    PairedComparison,
    SequentialComparison,
    Thresholds,
    Verdict,
    compare_tail_latency,
    histogram_quantile,
    log_ratio_confidence_sequence,
    mixture_half_width,
    paired_log_confidence_sequence,
    paired_ratio_confidence_sequence,
    per_test_confidence,
    win_confidence,
)


def _feed(cmp, control, canary):
    cmp.add_control(control)
    cmp.add_canary(canary)
    return cmp.result()


def _lat(th=Thresholds()):
    return SequentialComparison.for_latency(th)


def _tp(th=Thresholds()):
    return SequentialComparison.for_throughput(th)


def test_clear_latency_improvement_is_better_with_interval_and_counts():
    rng = np.random.default_rng(0)
    r = _feed(_lat(), 0.020 * np.exp(rng.normal(0, 0.05, 40)), 0.014 * np.exp(rng.normal(0, 0.05, 41)))
    assert r.verdict is Verdict.BETTER
    assert r.n_control == 40 and r.n_canary == 41
    lo, hi = r.interval
    assert lo < r.estimate < hi < -0.05
    assert lo < -0.30 < hi  # true change is -30%
    assert r.improvement == pytest.approx(-r.estimate)
    assert r.better_by_at_least(0.05) and not r.worse_by_more_than(0.0)


def test_clear_throughput_regression_is_worse():
    rng = np.random.default_rng(1)
    r = _feed(_tp(), 1000 * np.exp(rng.normal(0, 0.02, 60)), 900 * np.exp(rng.normal(0, 0.02, 60)))
    assert r.verdict is Verdict.WORSE
    assert r.worse_by_more_than(0.02)
    assert r.interval[1] < -0.02


def test_no_change_becomes_equivalent_with_enough_data():
    rng = np.random.default_rng(2)
    r = _feed(_lat(), 0.02 * np.exp(rng.normal(0, 0.02, 200)), 0.02 * np.exp(rng.normal(0, 0.02, 200)))
    assert r.verdict is Verdict.EQUIVALENT
    assert -0.05 < r.interval[0] < 0 < r.interval[1] < 0.05


def test_below_min_samples_is_never_a_verdict_even_for_huge_effects():
    th = Thresholds(min_samples=10)
    r = _feed(_lat(th), [0.02] * 9, [0.001] * 30)
    assert r.verdict is Verdict.NOT_ENOUGH_DATA and r.interval is None
    assert "10" in r.note
    assert not r.better_by_at_least(0.05) and not r.worse_by_more_than(0.0)


def test_empty_and_nan_samples_are_not_enough_data():
    assert _lat().result().verdict is Verdict.NOT_ENOUGH_DATA
    c = _lat()
    r = _feed(c, [math.nan] * 50 + [0.0, -1.0, math.inf], [math.nan] * 50)
    assert r.verdict is Verdict.NOT_ENOUGH_DATA
    assert r.n_control == 0 and r.n_canary == 0
    assert "ignored" in r.note


def test_nan_samples_are_skipped_not_zeroed():
    rng = np.random.default_rng(3)
    ctrl = list(0.02 * np.exp(rng.normal(0, 0.03, 30))) + [math.nan] * 30
    can = list(0.02 * np.exp(rng.normal(0, 0.03, 30))) + [0.0] * 30
    r = _feed(_lat(), ctrl, can)
    assert r.n_control == 30 and r.n_canary == 30
    assert abs(r.estimate) < 0.05  # zeros would have made the canary look 50% faster


def test_wide_interval_is_not_enough_data():
    rng = np.random.default_rng(4)
    r = _feed(_tp(), 1000 * np.exp(rng.normal(0, 0.3, 12)), 1000 * np.exp(rng.normal(0, 0.3, 12)))
    assert r.verdict is Verdict.NOT_ENOUGH_DATA and r.interval is not None


def test_incremental_feeding_equals_batch_feeding():
    rng = np.random.default_rng(5)
    a, b = rng.lognormal(0, 0.1, 50), rng.lognormal(-0.1, 0.1, 50)
    one = _feed(_lat(), a, b)
    inc = _lat()
    for x, y in zip(a, b):
        inc.add_control(float(x))
        inc.add("canary", float(y))
    two = inc.result()
    assert one.estimate == pytest.approx(two.estimate) and one.interval == pytest.approx(two.interval)
    with pytest.raises(ValueError):
        inc.add("baseline", 1.0)


def test_interval_shrinks_with_information_and_is_infinite_without():
    w = mixture_half_width(np.array([10.0, 100.0, 1e4, 1e6]), 0.01, 0.05)
    assert np.all(np.diff(w) < 0)
    assert mixture_half_width(0.0, 0.01, 0.05) == math.inf


def _time_uniform_false_claims(true_ratio, sigma, n_max=300, sims=2000, seed=0, alpha=0.01, tau=0.05, min_n=10):
    """Fraction of runs in which the interval, checked after EVERY sample, ever excludes the truth."""
    rng = np.random.default_rng(seed)
    c = np.exp(rng.normal(0, sigma, (sims, n_max)))
    k = true_ratio * np.exp(rng.normal(0, sigma, (sims, n_max)))
    n = np.arange(1, n_max + 1)

    def run(x):
        m = np.cumsum(x, 1) / n
        v = (np.cumsum(x * x, 1) - n * m * m) / np.maximum(n - 1, 1)
        return m, v

    mc, vc = run(c)
    mk, vk = run(k)
    d, lo, hi = log_ratio_confidence_sequence(n, mc, vc, n, mk, vk, alpha, tau)
    truth = math.log(true_ratio)
    return ((lo > truth) | (hi < truth))[:, min_n - 1:].any(axis=1).mean()


@pytest.mark.parametrize("ratio,sigma", [(1.0, 0.02), (1.0, 0.1), (0.7, 0.05), (1.05, 0.2)])
def test_confidence_sequence_holds_its_error_under_continuous_peeking(ratio, sigma):
    # A fixed-horizon 99% interval re-checked after every one of 300 samples would miss far more
    # often than 1%; the confidence sequence must not (small slack for Monte-Carlo error).
    assert _time_uniform_false_claims(ratio, sigma) <= 0.015


def test_naive_fixed_interval_with_peeking_would_fail_the_same_check():
    # the check above has teeth: a z-interval (z=2.576) peeked at every sample misses often
    rng = np.random.default_rng(9)
    sims, n_max = 2000, 300
    c = np.exp(rng.normal(0, 0.05, (sims, n_max)))
    k = np.exp(rng.normal(0, 0.05, (sims, n_max)))
    n = np.arange(1, n_max + 1)
    diff = np.cumsum(np.log(k) - np.log(c), 1) / n
    se = 0.05 * np.sqrt(2 / n)
    assert (np.abs(diff) > 2.576 * se)[:, 9:].any(axis=1).mean() > 0.05


def test_thresholds_refuse_a_certain_confidence():
    with pytest.raises(ValueError):
        Thresholds(confidence=1.0)


def test_result_to_dict_is_json_ready():
    import json

    rng = np.random.default_rng(6)
    r = _feed(_lat(), rng.lognormal(0, 0.05, 20), rng.lognormal(-0.3, 0.05, 20))
    d = r.to_dict()
    assert d["verdict"] == "Better" and d["direction"] == "lower" and len(d["interval"]) == 2
    json.dumps(d)
    assert isinstance(r, ComparisonResult) and r.direction is Direction.LOWER_IS_BETTER


def test_summaries_and_state_round_trip_equal_raw_samples():
    import json

    rng = np.random.default_rng(7)
    a, b = rng.lognormal(0, 0.1, 37), rng.lognormal(-0.2, 0.1, 41)
    raw = _feed(_lat(), a, b)
    summ = _lat()
    for role, x in (("control", a), ("canary", b)):
        summ.add(role, x[:5])  # mix raw samples and a summarised block
        summ.add_summary(role, len(x) - 5, float(np.mean(x[5:])), float(np.var(x[5:], ddof=1)))
    r = summ.result()
    assert r.n_control == 37 and r.n_canary == 41
    assert r.estimate == pytest.approx(raw.estimate) and r.interval == pytest.approx(raw.interval)
    back = SequentialComparison.from_state(json.loads(json.dumps(summ.state())))
    assert back.result() == r
    bad = _lat()
    bad.add_summary("control", 20, math.nan, 1.0)
    assert bad.n == (0, 0)


# --- stalls in the independent-arms comparison ---------------------------------------------------

def test_unpaired_throughput_counts_a_stall_instead_of_dropping_it():
    # issue 11: canary [100, 0, 100, 0] tok/s against a control at 60 was judged Better (zeros dropped)
    r = _feed(_tp(), [60.0] * 20, [100.0, 0.0] * 10)
    assert r.canary_mean == pytest.approx(50.0) and r.estimate == pytest.approx(-1 / 6)
    assert r.stalls_canary == 10 and r.verdict is not Verdict.BETTER
    assert not r.better_by_at_least(0.0)


# --- paired windows ------------------------------------------------------------------------------

def _ptp(th=Thresholds()):
    return PairedComparison.for_throughput(th)


def _plat(th=Thresholds()):
    return PairedComparison.for_latency(th)


@pytest.mark.parametrize("n", [10, 18, 100, 1000])
def test_stalling_canary_is_never_better(n):
    """The issue's example, at any number of windows: half the canary's windows produced nothing."""
    from lookahead_operator.measurement.decision import BatchOutcome, BatchComparison

    tp = _ptp()
    tp.add_pairs([60.0] * n, [100.0, 0.0] * (n // 2))
    r = tp.result()
    assert r.paired and r.stalls_canary == n // 2 and r.n_canary == n
    assert r.estimate == pytest.approx(-1 / 6)
    assert r.verdict is not Verdict.BETTER and not r.not_worse_by_more_than(0.02)
    lat = _plat()
    lat.add_pairs([0.02] * n, [0.012, None] * (n // 2))  # stalled windows finish no token: no latency
    assert BatchComparison(1, lat.result(), r).outcome(Thresholds()) is not BatchOutcome.WINS


def test_canary_with_no_output_at_all_is_worse_by_100_percent():
    tp = _ptp()
    tp.add_pairs([60.0] * 12, [0.0] * 12)
    r = tp.result()
    assert r.verdict is Verdict.WORSE and r.estimate == -1.0 and r.interval == (-1.0, -1.0)


def test_paired_windows_missing_and_common_stalls_are_dropped_and_counted():
    tp = _ptp(Thresholds(min_samples=2))
    tp.add_pairs([60, 0, None, 61, float("nan"), 59], [90, 0, 91, 92, 93, 0])
    # (0, 0): a common stall says nothing about the comparison; None/NaN: no pair; (59, 0): a canary stall
    assert tp.n == (3, 3) and tp.dropped == 3
    r = tp.result()
    assert r.dropped == 3 and r.stalls_canary == 1 and r.stalls_control == 0
    lat = _plat(Thresholds(min_samples=2))
    lat.add_pairs([0.02, 0.0, -1, 0.021], [0.013, 0.014, 0.012, 0.0])  # zero/negative latency is impossible
    assert lat.n == (1, 1) and lat.rejected == 3 and lat.dropped == 3


def test_paired_add_by_role_pairs_by_position_and_waits_for_the_other_arm():
    a, b = _plat(), _plat()
    ctrl = [0.020, None, 0.021, 0.019, 0.020]
    can = [0.014, 0.013, None, 0.015, 0.014]
    a.add_pairs(ctrl, can)
    b.add("control", ctrl[:3])
    b.add("canary", can)
    assert b.unmatched == 2 and b.n == (1, 1)
    b.add("control", ctrl[3:])
    assert b.unmatched == 0 and b.n == a.n == (3, 3) and b.dropped == a.dropped == 2
    with pytest.raises(ValueError):
        a.add_pairs([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        a.add("baseline", [1.0])
    with pytest.raises(ValueError):
        PairedComparison("tp", Direction.HIGHER_IS_BETTER, 0.02, estimator="log")  # a log cannot count a stall


def test_paired_state_round_trips_through_json():
    rng = np.random.default_rng(11)
    tp = _ptp()
    tp.add_pairs(list(500 * rng.lognormal(0, 0.03, 15)) + [0.0], list(540 * rng.lognormal(0, 0.03, 15)) + [0.0])
    tp.add("control", [501.0])  # one window waiting for its canary value
    back = PairedComparison.from_state(json.loads(json.dumps(tp.state())))
    assert back.result() == tp.result() and back.unmatched == 1
    back.add("canary", [530.0])
    assert back.n == (16, 16)


def test_paired_latency_estimate_is_the_geometric_mean_ratio_and_verdicts_follow():
    rng = np.random.default_rng(12)
    lat = _plat()
    c = 0.020 * np.exp(rng.normal(0, 0.03, 18))
    k = 0.014 * np.exp(rng.normal(0, 0.03, 18))
    lat.add_pairs(c, k)
    r = lat.result()
    assert r.verdict is Verdict.BETTER and r.paired and r.n_control == r.n_canary == 18
    assert r.estimate == pytest.approx(math.expm1(np.mean(np.log(k / c))))
    lo, hi = r.interval
    assert lo < -0.3 < hi < -0.05


def _ar1(rng, sigma, rho, shape):
    e = rng.normal(0, sigma * math.sqrt(1 - rho * rho), (shape[0], shape[1] + 50))
    out = np.empty_like(e)
    out[:, 0] = rng.normal(0, sigma, shape[0])
    for t in range(1, e.shape[1]):
        out[:, t] = rho * out[:, t - 1] + e[:, t]
    return out[:, 50:]


def _streams(rng, sims, n, ratio, sigma, drift=0.0, tail_p=0.0, stall_arm=0.0, stall_common=0.0):
    """Per-window throughput-like values of both arms over the SAME windows: a common drift (both
    arms slow down together), per-arm noise, heavy-tailed per-arm slowdowns and stalls. The true
    ratio of means is `ratio` (every disturbance has the same law in both arms)."""
    shape = (sims, n)
    common = np.exp(_ar1(rng, drift, 0.95, shape)) if drift else 1.0
    arms = []
    for r in (1.0, ratio):
        x = r * common * np.exp(rng.normal(0, sigma, shape))
        if tail_p:
            x = x / np.where(rng.random(shape) < tail_p, 1 + rng.pareto(2.5, shape), 1.0)
        arms.append(x)
    c, k = arms
    if stall_common:
        hit = rng.random(shape) < stall_common
        c, k = np.where(hit, 0.0, c), np.where(hit, 0.0, k)
    if stall_arm:
        c = np.where(rng.random(shape) < stall_arm, 0.0, c)
        k = np.where(rng.random(shape) < stall_arm, 0.0, k)
    return c, k


def _paired_cs(c, k, alpha, estimator, sides=None):
    """(n, lower, upper) of the paired confidence sequence after every window (log scale); `sides`:
    (alpha_lower, alpha_upper) one-sided instead of two-sided `alpha`."""
    cs = lambda x: np.cumsum(x, 1)  # noqa: E731
    level = dict(alpha=alpha) if sides is None else dict(alpha_lower=sides[0], alpha_upper=sides[1])
    if estimator == "ratio":
        keep = ~((c == 0) & (k == 0))
        c0, k0 = np.where(keep, c, 0), np.where(keep, k, 0)
        n = cs(keep)
        _, lo, hi = paired_ratio_confidence_sequence(n, cs(c0), cs(k0), cs(c0 * c0), cs(k0 * k0), cs(c0 * k0),
                                                     **level)
    else:
        keep = (c > 0) & (k > 0)
        d = np.where(keep, np.log(np.where(keep, k, 1)) - np.log(np.where(keep, c, 1)), 0)
        n = cs(keep)
        _, lo, hi = paired_log_confidence_sequence(n, cs(d), cs(d * d), **level)
    return n, lo, hi


def _paired_misses(c, k, truth, alpha, estimator, min_n=10, sides=None):
    """Per run: did the paired confidence sequence, checked after EVERY window, ever exclude the
    truth? With `sides`: (lower bound ever above the truth, upper bound ever below it)."""
    n, lo, hi = _paired_cs(c, k, alpha, estimator, sides)
    t = math.log(truth)
    if sides is not None:
        return ((lo > t) & (n >= min_n)).any(axis=1), ((hi < t) & (n >= min_n)).any(axis=1)
    return (((lo > t) | (hi < t)) & (n >= min_n)).any(axis=1)


@pytest.mark.parametrize("estimator", ["ratio", "log"])
@pytest.mark.parametrize("ratio,kw", [
    (1.0, dict(sigma=0.03)),
    (0.7, dict(sigma=0.05, drift=0.2)),  # machine drift common to both arms
    (1.0, dict(sigma=0.03, drift=0.3, tail_p=0.03, stall_common=0.02)),
    (1.4, dict(sigma=0.10, drift=0.2, tail_p=0.02, stall_arm=0.01)),
])
def test_paired_confidence_sequence_holds_alpha_under_peeking_with_common_drift(estimator, ratio, kw):
    """Time-uniform miss rate <= alpha over 300 looks, with drift, stalls and heavy tails
    (the log estimator has no stalls: its windows without a value are dropped)."""
    if estimator == "log":
        kw = {k: v for k, v in kw.items() if k != "stall_arm"}
    rng = np.random.default_rng(21)
    c, k = _streams(rng, 2000, 300, ratio, **kw)
    assert _paired_misses(c, k, ratio, 0.01, estimator).mean() <= 0.015


def test_paired_confidence_sequence_holds_the_small_per_test_alpha_of_a_family_split():
    """At 0.99 split over 6 batch sizes x 3 metrics each test runs at alpha = 0.00056, where plug-in
    variances fail at 10-18 windows; the sequential t-test's boundary is exact for Gaussian windows."""
    alpha = 1 - per_test_confidence(0.99, 6, 3)
    rng = np.random.default_rng(22)
    c, k = _streams(rng, 40000, 18, 0.8, sigma=0.05, drift=0.2)
    assert _paired_misses(c, k, 0.8, alpha, "ratio").mean() <= 1.5 * alpha
    assert _paired_misses(c, k, 0.8, alpha, "log").mean() <= 1.5 * alpha


def test_pairing_cancels_common_drift_where_the_independent_arms_test_cannot_decide():
    """The same windows, drift common to both arms (20%, slow) and 2% per-arm noise, a true 10%
    latency drop: the paired test certifies it within one step (18 windows) almost always; the
    independent-arms test, whose variance carries the drift, almost never does. This test fails for
    the independent-arms method."""
    rng = np.random.default_rng(23)
    c, k = _streams(rng, 400, 18, 0.9, sigma=0.02, drift=0.2)
    th = Thresholds(min_latency_improvement=0.05)

    def certified(method):
        ok = 0
        for i in range(c.shape[0]):
            cmp = (PairedComparison if method == "paired" else SequentialComparison).for_latency(th)
            if method == "paired":
                cmp.add_pairs(c[i], k[i])
            else:
                cmp.add_control(c[i])
                cmp.add_canary(k[i])
            ok += cmp.result().better_by_at_least(0.05)
        return ok / c.shape[0]

    assert certified("paired") >= 0.95
    assert certified("independent") <= 0.05


def test_drift_landing_on_one_role_breaks_the_independent_arms_test_and_not_the_paired_one():
    """Roles measured one after the other in blocks of 10 windows (control, then canary, ...) under
    a slow drift: the drift lands on one role at a time and the independent-arms interval, which
    treats the windows as independent draws, misses the truth far more often than alpha. Pairing
    adjacent windows (control i, canary i measured back to back) holds alpha on the same drift."""
    rng = np.random.default_rng(24)
    sims, blocks, b = 2000, 20, 10
    f = np.exp(_ar1(rng, 0.2, 0.98, (sims, 2 * blocks * b)))
    noise = np.exp(rng.normal(0, 0.03, f.shape))
    x = f * noise  # true ratio 1: the same engine in both roles
    idx = np.arange(2 * blocks * b).reshape(blocks, 2, b)
    ctrl_seq, can_seq = x[:, idx[:, 0, :].ravel()], x[:, idx[:, 1, :].ravel()]
    n = np.arange(1, blocks * b + 1)

    def run(v):
        m = np.cumsum(v, 1) / n
        return m, (np.cumsum(v * v, 1) - n * m * m) / np.maximum(n - 1, 1)

    mc, vc = run(ctrl_seq)
    mk, vk = run(can_seq)
    _, lo, hi = log_ratio_confidence_sequence(n, mc, vc, n, mk, vk, 0.01, 0.05)
    unpaired_miss = ((lo > 0) | (hi < 0))[:, 9:].any(axis=1).mean()
    assert unpaired_miss > 0.10
    inter_c, inter_k = x[:, 0::2], x[:, 1::2]  # alternate every window instead
    assert _paired_misses(inter_c, inter_k, 1.0, 0.01, "ratio").mean() <= 0.015


# --- the family-wise split ----------------------------------------------------------------------

def test_per_test_confidence_is_the_bonferroni_split():
    assert per_test_confidence(0.99, 5, 3) == pytest.approx(1 - 0.01 / 15)
    assert per_test_confidence(0.95, 1, 1) == pytest.approx(0.95)
    th = Thresholds(confidence=0.99).for_family(6)
    assert th.confidence == pytest.approx(1 - 0.01 / 18) and th.min_latency_improvement == 0.05
    with pytest.raises(ValueError):
        per_test_confidence(0.99, 0, 3)
    with pytest.raises(ValueError):
        per_test_confidence(1.0, 2, 3)


def test_family_split_gives_the_win_bounds_the_share_the_paired_loss_bounds_leave():
    """Per batch size, latency and throughput spend only the canary-worse half of their shares on
    loss claims and the tail its whole share: (n_metrics - 1) shares per size. The one share per size
    left over, (1 - confidence) / n_metrics in all, is the win side's single budget."""
    th = Thresholds(confidence=0.99).for_family(6)  # 6 sizes x (latency, throughput, tail)
    assert th.win_confidence == pytest.approx(1 - 0.01 / 3) == win_confidence(0.99, 6, 3)
    lat, tp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
    assert lat.win_confidence == tp.win_confidence == th.win_confidence
    # latency: lower is better, so the better side is the upper bound of the change
    assert lat.side_alphas() == pytest.approx((0.01 / 36, 0.01 / 3))
    assert tp.side_alphas() == pytest.approx((0.01 / 3, 0.01 / 36))
    spent = 6 * (0.01 / 36 + 0.01 / 36 + (1 - th.confidence)) + (1 - th.win_confidence)
    assert spent == pytest.approx(0.01)
    two = Thresholds(confidence=0.99).for_family(6, 2)  # no tail: the operator before it was wired
    assert two.win_confidence == pytest.approx(1 - 0.01 / 2)
    assert 6 * 2 * (1 - two.confidence) / 2 + (1 - two.win_confidence) == pytest.approx(0.01)
    assert Thresholds().win_confidence is None and PairedComparison.for_latency(Thresholds()).side_alphas() is None
    with pytest.raises(ValueError):
        Thresholds(win_confidence=1.0)


def test_one_sided_boundary_is_the_half_normal_mixture_and_matches_scipy():
    """The one-sided bound solves B+_n = 1/alpha for the half-normal mixture (Student's t CDF in
    numpy, checked against SciPy); B+ never reaches 1/alpha on the other side (rho <= 0)."""
    stats = pytest.importorskip("scipy.stats")
    from lookahead_operator.measurement.stats.sequences import PAIRED_EFFECT_PRIOR as c, _one_sided_kappa, _student_t_cdf

    x = np.linspace(-40, 40, 4001)
    for nu in (1, 2, 3, 10, 11, 54, 55, 301):
        assert np.abs(_student_t_cdf(x, nu) - stats.t.cdf(x, nu)).max() < 1e-12

    def log_b(rho, n):
        a = rho / np.sqrt(1 - rho * rho)
        return 0.5 * np.log(c / (n + c)) - n / 2 * np.log1p(-rho * rho) + np.log(2 * stats.t.cdf(np.sqrt(n) * a, n))

    for alpha in (0.01 / 3, 0.01 / 36):
        ns = np.arange(2, 80)
        k = _one_sided_kappa(ns, alpha, c)
        for n, kk in zip(ns, k):
            if np.isfinite(kk):
                assert log_b(np.sqrt(kk), n) == pytest.approx(np.log(1 / alpha), abs=1e-9)
            else:  # unbounded: not even the largest rho reaches 1/alpha
                assert log_b(np.sqrt(n / (n + c)) * (1 - 1e-12), n) < np.log(1 / alpha)
            rho = np.linspace(-np.sqrt(n / (n + c)) * (1 - 1e-9), 0, 2001)
            assert log_b(rho, n).max() < 0
    # one-sided at alpha/2 on each side is (almost exactly) the two-sided symmetric mixture at alpha
    n = np.array([10.0, 18.0, 54.0])
    _, lo1, hi1 = paired_log_confidence_sequence(n, np.zeros(3), n - 1, alpha_lower=0.0005, alpha_upper=0.0005)
    _, lo2, hi2 = paired_log_confidence_sequence(n, np.zeros(3), n - 1, 0.001)
    assert np.all(hi1 >= hi2) and np.allclose(hi1, hi2, rtol=1e-3) and np.allclose(lo1, -hi1)


@pytest.mark.parametrize("estimator", ["ratio", "log"])
def test_one_sided_bounds_hold_their_own_levels_under_peeking(estimator):
    """A family split's paired interval: the canary-better bound one-sided at 0.01/3, the
    canary-worse bound at 0.01/36, each checked after EVERY window of a step's full share (10..54
    windows, 40,000 runs), drift, heavy tails and stalls included: each misses at most its own alpha."""
    a_lo, a_hi = 0.01 / 3, 0.01 / 36
    rng = np.random.default_rng(25)
    kw = dict(sigma=0.05, drift=0.2, tail_p=0.02) if estimator == "log" else dict(sigma=0.05, drift=0.2,
                                                                                 tail_p=0.02, stall_arm=0.01)
    c, k = _streams(rng, 40000, 54, 0.9, **kw)
    lo_miss, hi_miss = _paired_misses(c, k, 0.9, None, estimator, sides=(a_lo, a_hi))
    assert lo_miss.mean() <= a_lo and hi_miss.mean() <= 1.5 * a_hi
    # and the one-sided bound is not vacuous: it does get within reach of its alpha
    assert lo_miss.mean() >= a_lo / 10


def test_family_wise_error_is_at_most_one_minus_confidence_at_every_look():
    """A policy with 5 batch sizes x 3 metrics, every canary equal to its control (the null): the
    probability that ANY of the 15 confidence sequences excludes its truth at ANY look (10..100
    windows) stays below 1 - confidence with the split, and exceeds it without. (Two-sided
    intervals at the Bonferroni share; the decision-level check of the split with one-sided win
    bounds is `test_family_wise_error_of_the_decision_is_at_most_one_minus_confidence`.)"""
    rng = np.random.default_rng(31)
    sims, n, confidence = 3000, 100, 0.99
    split = 1 - per_test_confidence(confidence, 5, 3)
    any_split = np.zeros(sims, dtype=bool)
    any_plain = np.zeros(sims, dtype=bool)
    for b in range(5):
        for metric in range(3):
            c, k = _streams(rng, sims, n, 1.0, sigma=0.05, drift=0.1, tail_p=0.01)
            est = "ratio" if metric == 1 else "log"
            any_split |= _paired_misses(c, k, 1.0, split, est)
            any_plain |= _paired_misses(c, k, 1.0, 1 - confidence, est)
    assert any_split.mean() <= 1 - confidence
    assert any_plain.mean() > any_split.mean()


PENDING, WINS, NO_GAIN, REGRESSES = 0, 1, 2, 3


def _step_outcomes(lat, tp, th, horizon=54):
    """One load step per run, as the operator runs it: the paired latency and throughput sequences
    at `th`'s levels (PairedComparison's own `side_alphas`), looked at after every window from
    min_samples on, stopped at the first settled look (`BatchComparison.outcome`'s order), Pending at
    `horizon`. Returns (outcome, windows read) per run."""
    (lc, lk), (tc, tk) = lat, tp
    lat_cmp, tp_cmp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
    n_l, l_lo, l_hi = _paired_cs(lc[:, :horizon], lk[:, :horizon], 1 - lat_cmp.confidence, "log",
                                 lat_cmp.side_alphas())
    n_t, t_lo, t_hi = _paired_cs(tc[:, :horizon], tk[:, :horizon], 1 - tp_cmp.confidence, "ratio",
                                 tp_cmp.side_alphas())
    l_good_lo, l_good_hi = -np.expm1(l_hi), -np.expm1(l_lo)  # latency improvement
    t_lo, t_hi = np.expm1(t_lo), np.expm1(t_hi)
    lat_ok, tp_ok = n_l >= th.min_samples, n_t >= th.min_samples
    reg = tp_ok & (t_hi < -th.max_throughput_regression)
    win = lat_ok & tp_ok & (l_good_lo > th.min_latency_improvement) & (t_lo > -th.max_throughput_regression)
    nog = lat_ok & (l_good_hi < th.min_latency_improvement)
    settled = reg | win | nog
    rows = np.arange(lc.shape[0])
    idx = np.where(settled.any(1), settled.argmax(1), horizon - 1)
    out = np.full(lc.shape[0], PENDING)
    out[settled.any(1) & nog[rows, idx]] = NO_GAIN
    out[settled.any(1) & win[rows, idx]] = WINS
    out[settled.any(1) & reg[rows, idx]] = REGRESSES
    return out, idx + 1


def _decision_reads_a_false_claim(outcomes, claim_true):
    """Per run: does `decide()` read a false claim? It reads the outcome of the smallest size; after
    a run of Wins the first size that is not a win (a loss: the crossover; Pending: the first loss
    above it, for the bracket); a loss at the smallest size also names the first Regresses.
    ``claim_true[s][o]``: is outcome o a true claim at size s."""
    runs, sizes = outcomes.shape
    false = np.zeros(runs, dtype=bool)
    truth = np.array([[claim_true[s].get(o, True) for o in range(4)] for s in range(sizes)])
    for r in range(runs):
        o = outcomes[r]
        read = []
        if o[0] in (NO_GAIN, REGRESSES):
            read = [0] + [s for s in range(sizes) if o[s] == REGRESSES][:1]
        elif o[0] == WINS:
            w = 0
            while w + 1 < sizes and o[w + 1] == WINS:
                w += 1
            read = list(range(w + 1))
            if w + 1 < sizes:
                read.append(w + 1)
                if o[w + 1] == PENDING:
                    read += [s for s in range(w + 2, sizes) if o[s] in (NO_GAIN, REGRESSES)][:1]
        false[r] = any(o[s] != PENDING and not truth[s, o[s]] for s in read)
    return false


# per size: (latency ratio, throughput ratio, which outcomes are TRUE claims there)
_CLEAR_WIN = (0.70, 1.30, {WINS: True, NO_GAIN: False, REGRESSES: False})
# latency exactly at the 5% minimum: "improved by MORE than 5%" and "by less" are both false
_ON_THE_WIN_LINE = (0.95, 1.00, {WINS: False, NO_GAIN: False, REGRESSES: False})
# the same with throughput clearly fine: only the latency bound stands between it and a false win
_ON_THE_LATENCY_LINE = (0.95, 1.30, {WINS: False, NO_GAIN: False, REGRESSES: False})
# throughput exactly at its -2% tolerance and latency exactly at 5%: every claim is false
_ON_BOTH_LINES = (0.95, 0.98, {WINS: False, NO_GAIN: False, REGRESSES: False})
_CLEAR_LOSS = (1.00, 0.90, {WINS: False, NO_GAIN: True, REGRESSES: True})


def _policy_outcomes(rng, th, sizes, runs, horizon=54):
    """(runs, sizes) step outcomes of one policy whose sizes have the given true ratios."""
    outs = []
    for lat_ratio, tp_ratio, _ in sizes:
        lat = _streams(rng, runs, horizon, lat_ratio, sigma=0.05, drift=0.2, tail_p=0.02)
        tp = _streams(rng, runs, horizon, tp_ratio, sigma=0.03, drift=0.2, tail_p=0.02, stall_arm=0.01)
        outs.append(_step_outcomes(lat, tp, th, horizon)[0])
    return np.stack(outs, 1)


@pytest.mark.parametrize("config", [
    [_CLEAR_WIN] + [_ON_THE_WIN_LINE] * 4,  # the first size that does not deserve a win is on the line
    [_ON_BOTH_LINES] * 5,  # every claim anywhere would be false
    [_CLEAR_WIN, _CLEAR_WIN, _ON_BOTH_LINES, _CLEAR_LOSS, _ON_THE_WIN_LINE],
])
def test_family_wise_error_of_the_decision_is_at_most_one_minus_confidence(config):
    """The policy's promise (docs/statistics.md, section 4): with `Thresholds.for_family`, the
    probability that the decision reads a false claim -- enabling a size that does not deserve it,
    a false NoGain/Regresses at the crossover or at the smallest size, a false loss named in the
    reason -- is at most 1 - confidence, on truths placed exactly on the thresholds (where every
    bound is closest to failing), with drift, heavy tails and stalls, every window looked at."""
    th = Thresholds(confidence=0.99).for_family(len(config))
    rng = np.random.default_rng(32)
    outcomes = _policy_outcomes(rng, th, config, 20000)
    wrong = _decision_reads_a_false_claim(outcomes, [c[2] for c in config])
    assert wrong.mean() <= 1 - 0.99


def test_one_win_share_suffices_only_because_decide_reads_wins_along_the_run():
    """Why the win bounds may hold 1/n_metrics of the whole budget although every batch size has
    them: a wrong enablement needs a false Wins at the FIRST size that does not deserve it. With eight
    sizes whose latency is exactly on the line after a clear win, the run's false-win rate stays
    under the win share while a decision that enabled every size claiming Wins (reading them out of
    order) would exceed it. The vectorised steps are checked against the operator's own
    PairedComparison, BatchComparison and decide() on the first policies."""
    from lookahead_operator.measurement.decision import Move, BatchOutcome, BatchComparison, decide

    config = [_CLEAR_WIN] + [_ON_THE_LATENCY_LINE] * 8
    th = Thresholds(confidence=0.99).for_family(len(config))
    a_win = 1 - th.win_confidence
    rng = np.random.default_rng(33)
    runs, horizon = 30000, 54
    streams = [(_streams(rng, runs, horizon, lr, sigma=0.05, drift=0.2),
                _streams(rng, runs, horizon, tr, sigma=0.03, drift=0.2))
               for lr, tr, _ in config]
    steps = [_step_outcomes(lat, tp, th, horizon) for lat, tp in streams]
    outcomes = np.stack([o for o, _ in steps], 1)
    first_false_win = (outcomes[:, 0] == WINS) & (outcomes[:, 1] == WINS)
    any_false_win = (outcomes[:, 1:] == WINS).any(axis=1)
    assert first_false_win.mean() <= a_win < any_false_win.mean()

    code = {BatchOutcome.PENDING: PENDING, BatchOutcome.WINS: WINS, BatchOutcome.NO_GAIN: NO_GAIN,
            BatchOutcome.REGRESSES: REGRESSES}
    planned = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    checked = list(range(30)) + list(np.flatnonzero(any_false_win)[:10])
    for r in checked:
        verdicts = []
        for s, (lat, tp) in enumerate(streams):
            n = int(steps[s][1][r])
            lc, tc = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
            lc.add_pairs(lat[0][r, :n], lat[1][r, :n])
            tc.add_pairs(tp[0][r, :n], tp[1][r, :n])
            bv = BatchComparison(planned[s], lc.result(), tc.result())
            assert code[bv.outcome(th)] == outcomes[r, s], (r, s)
            verdicts.append(bv)
        d = decide(verdicts, th, deadline_passed=True, planned=planned, max_batch_size=64)
        run = 0
        while run < len(planned) and outcomes[r, run] == WINS:
            run += 1
        if run == 0:
            assert d.action in (Move.ROLLBACK, Move.INCONCLUSIVE)
        else:
            assert d.lookahead_max_batch_size in (planned[run - 1], None)
            assert d.action in (Move.PROMOTE, Move.PROMOTE_REGIME_AWARE)


# --- tails ---------------------------------------------------------------------------------------

VLLM_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)


def _hist(samples, bounds=VLLM_BUCKETS):
    """Cumulative bucket counts as `_bucket{le=...}` increases give them, +Inf last."""
    s = np.sort(np.asarray(samples))
    h = {le: int(np.searchsorted(s, le, side="right")) for le in bounds}
    h["+Inf"] = int(s.size)
    return h


def test_histogram_quantile_interpolates_like_prometheus():
    h = {0.1: 10, 0.2: 60, 0.4: 100, "+Inf": 100}
    assert histogram_quantile(0.5, h) == pytest.approx(0.1 + 0.1 * (50 - 10) / 50)
    assert histogram_quantile(0.05, h) == pytest.approx(0.05)  # first bucket starts at 0
    assert histogram_quantile(0.99, {0.1: 10, "+Inf": 20}) == 0.1  # in +Inf: the largest finite bound
    assert histogram_quantile(0.5, {0.1: 0, "+Inf": 0}) is None
    with pytest.raises(ValueError):
        histogram_quantile(0.5, {0.1: 10, 0.2: 5})


def test_tail_regression_hidden_behind_a_better_mean_is_worse_and_blocks_promotion():
    """A canary 30% faster on mean per-token latency with a p99 seven times worse is not promoted."""
    from lookahead_operator.measurement.decision import Move, BatchOutcome, BatchComparison, decide

    rng = np.random.default_rng(41)
    ctrl = 0.020 * rng.lognormal(0, 0.12, 20000)
    can = 0.0125 * rng.lognormal(0, 0.12, 20000)
    slow = rng.random(20000) < 0.02
    can = np.where(slow, 0.16 * rng.lognormal(0, 0.1, 20000), can)  # 2% of tokens wait ~8x longer
    assert np.mean(can) / np.mean(ctrl) < 0.8
    assert np.quantile(can, 0.99) / np.quantile(ctrl, 0.99) > 5
    th = Thresholds()
    tail = compare_tail_latency(_hist(ctrl), _hist(can), th.max_tail_latency_regression, th.confidence)
    assert tail.regresses and tail.verdict is Verdict.WORSE
    p99 = tail.q(0.99)
    # at bucket resolution: the canary's p99 is above 150 ms, the control's at most 50 ms
    assert p99.verdict is Verdict.WORSE and p99.canary_bounds[0] >= 2.9 * p99.control_bounds[1]

    lat, tp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
    w = rng.lognormal(0, 0.02, (2, 18))
    lat.add_pairs(0.020 * w[0], 0.0140 * w[1])
    tp.add_pairs(500 / w[0], 700 / w[1])
    mean_only = BatchComparison(1, lat.result(), tp.result())
    assert mean_only.outcome(th) is BatchOutcome.WINS  # what comparing means alone would do
    bv = BatchComparison(1, lat.result(), tp.result(), tail=tail)
    assert bv.outcome(th) is BatchOutcome.REGRESSES and bv.settled(th)
    d = decide([bv], th, deadline_passed=True, planned=[1])
    assert d.action is Move.ROLLBACK and "p99 per-token latency" in d.reason and "tail tolerance" in d.reason


def test_equal_tails_are_not_worse_and_small_counts_are_not_enough_data():
    rng = np.random.default_rng(42)
    a, b = 0.03 * rng.lognormal(0, 0.3, 5000), 0.03 * rng.lognormal(0, 0.3, 5000)
    t = compare_tail_latency(_hist(a), _hist(b))
    assert not t.regresses and t.verdict in (Verdict.EQUIVALENT, Verdict.NOT_ENOUGH_DATA)
    small = compare_tail_latency(_hist(a[:50]), _hist(50 * b[:50]))
    assert small.verdict is Verdict.NOT_ENOUGH_DATA and "observations" in small.note
    d = json.loads(json.dumps(t.to_dict()))
    from lookahead_operator.measurement.stats import TailComparison
    assert TailComparison.from_dict(d) == t


def test_tail_bounds_hold_at_every_look():
    """Identical tails in both arms, the comparison repeated as observations accumulate (20 looks):
    a WORSE verdict at ANY look is a false alarm; they stay below 1 - confidence. With a zero
    tolerance the bucket-level bounds still hold (no quantile is claimed outside its bucket)."""
    rng = np.random.default_rng(43)
    sims, looks, per_look = 300, 20, 250
    false = 0
    for _ in range(sims):
        a = 0.03 * rng.lognormal(0, 0.5, looks * per_look)
        b = 0.03 * rng.lognormal(0, 0.5, looks * per_look)
        for j in range(1, looks + 1):
            t = compare_tail_latency(_hist(a[: j * per_look]), _hist(b[: j * per_look]), max_regression=0.0,
                                     confidence=0.99)
            if t.regresses:
                false += 1
                break
    assert false / sims <= 0.01
