"""The sequential comparison: verdicts, guards against missing data, and its error guarantee."""

import math

import numpy as np
import pytest

from lookahead_operator.statistics import (
    ComparisonResult,
    Direction,
    SequentialComparison,
    Thresholds,
    Verdict,
    log_ratio_confidence_sequence,
    mixture_half_width,
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
