"""stats.live: strata by offered load, Pending below min_samples, wins and regressions per stratum,
the crossover as a load level, and the family split over strata x metrics."""

import math

import numpy as np
import pytest

from lookahead_operator.measurement.stats import (LIVE_METRICS_PER_STRATUM, ArmWindow, LiveComparison, LiveWindow,
                                                  Strata, StratumOutcome, Thresholds, live_thresholds,
                                                  per_test_confidence, read_run, win_confidence)

TH = Thresholds()


def window(load, lat_c, lat_k, rng, noise=0.03, running=(8.0, 6.0), ttft=(0.3, 0.3)):
    """A pair of arm windows with per-token latencies around lat_c / lat_k and the token rate
    following them (tokens per second per running request = 1 / latency)."""
    ec, ek = np.exp(rng.normal(0, noise, 2))
    lc, lk = lat_c * ec, lat_k * ek
    return LiveWindow(load, ArmWindow(lc, 1 / lc, ttft[0], requests=5, errors=0, running=running[0]),
                      ArmWindow(lk, 1 / lk, ttft[1], requests=5, errors=1, running=running[1]))


def test_geometric_strata_are_explicit_and_deterministic():
    s = Strata.geometric(1.0, 32.0)
    assert s.edges == (2.0, 4.0, 8.0, 16.0) and len(s) == 5
    assert [s.index(x) for x in (0.0, 1.99, 2.0, 3.9, 8.0, 1e6)] == [0, 0, 1, 1, 3, 4]
    assert list(s.index(np.array([0.5, 4.0, 16.0]))) == [0, 2, 4]
    assert s.bounds(0) == (0.0, 2.0) and s.bounds(4) == (16.0, math.inf)
    assert Strata.geometric(1.0, 10.0, ratio=3.0).edges == (3.0, 9.0)
    with pytest.raises(ValueError):
        Strata((2.0, 2.0))
    with pytest.raises(ValueError):
        Strata.geometric(0.0, 4.0)
    live = LiveComparison(TH, (2.0, 4.0))
    with pytest.raises(ValueError):
        live.add(LiveWindow(float("nan"), ArmWindow(1.0, 1.0), ArmWindow(1.0, 1.0)))


def test_family_split_is_over_strata_times_metrics():
    live = LiveComparison(TH, Strata.geometric(1.0, 32.0))
    n = 5 * LIVE_METRICS_PER_STRATUM
    assert live.thresholds.confidence == pytest.approx(per_test_confidence(0.99, 5, 3)) == pytest.approx(1 - 0.01 / n)
    assert live.thresholds.win_confidence == pytest.approx(win_confidence(0.99, 5, 3))
    assert live_thresholds(TH, 5) == live.thresholds
    res = live.results()
    assert res.thresholds.confidence == live.thresholds.confidence
    # every comparison of every stratum runs at the split
    r = res.strata[0]
    assert r.latency.confidence == r.token_rate.confidence == r.ttft.confidence == live.thresholds.confidence
    assert r.latency.win_confidence == live.thresholds.win_confidence
    # more strata, a smaller share each
    assert LiveComparison(TH, Strata.geometric(1.0, 64.0)).thresholds.confidence > live.thresholds.confidence


def test_a_stratum_without_min_samples_pairs_is_pending_never_a_win():
    rng = np.random.default_rng(1)
    live = LiveComparison(TH, (4.0,))
    for _ in range(TH.min_samples - 1):  # a 50% faster canary, one window short
        live.add(window(1.0, 0.020, 0.010, rng, noise=0.001))
    res = live.results()
    assert res.strata[0].outcome is StratumOutcome.PENDING and res.strata[0].pairs == TH.min_samples - 1
    assert res.enabled == () and res.enabled_below is None and res.crossover is None
    # windows without a latency in one arm do not count as pairs
    live.add(LiveWindow(1.0, ArmWindow(None, None, None), ArmWindow(0.01, 100.0, 0.3)))
    assert live.results().strata[0].outcome is StratumOutcome.PENDING


def test_clear_win_at_low_load_and_regression_at_high_load_give_the_crossover_as_a_load_level():
    rng = np.random.default_rng(2)
    strata = Strata.geometric(1.0, 16.0)  # [0,2) [2,4) [4,8) [8,inf)
    live = LiveComparison(TH, strata)
    truth = {0.5: 0.70, 3.0: 0.80, 6.0: 1.25, 12.0: 1.6}  # canary / control per-token latency by load
    running = {0.5: 1.0, 3.0: 3.5, 6.0: 7.0, 12.0: 14.0}
    for _ in range(30):
        for load, ratio in truth.items():
            live.add(window(load, 0.02, 0.02 * ratio, rng, running=(running[load], running[load] * ratio)))
    res = live.results()
    assert [s.outcome for s in res.strata] == [StratumOutcome.WINS, StratumOutcome.WINS, StratumOutcome.REGRESSES,
                                               StratumOutcome.REGRESSES]
    assert res.strata[2].vetoes == ("token_rate",)
    assert res.enabled == (0, 1) and res.enabled_below == 4.0
    c = res.crossover
    assert c.stratum == 2 and c.offered_load == 4.0 and c.outcome is StratumOutcome.REGRESSES
    assert c.control_running == pytest.approx(7.0)  # the control's batch there, not the canary's
    assert res.strata[0].requests == (150, 150) and res.strata[0].errors == (0, 30)
    d = res.to_dict()
    assert d["crossover"]["controlRunning"] == pytest.approx(7.0) and d["enabledBelow"] == 4.0
    assert d["strata"][3]["offeredLoadHigh"] is None


def test_no_gain_and_a_ttft_veto():
    rng = np.random.default_rng(3)
    live = LiveComparison(TH, (2.0,))
    for _ in range(40):
        live.add(window(1.0, 0.02, 0.02, rng))  # equal: NoGain
        live.add(window(3.0, 0.02, 0.014, rng, ttft=(0.3, 0.9)))  # 30% faster per token, TTFT x3
    res = live.results()
    assert res.strata[0].outcome is StratumOutcome.NO_GAIN
    assert res.strata[1].outcome is StratumOutcome.REGRESSES and res.strata[1].vetoes == ("ttft",)
    assert res.enabled == () and res.crossover.stratum == 0


def test_freeze_keeps_the_first_settled_outcome_and_counts_later_windows():
    rng = np.random.default_rng(4)
    live = LiveComparison(TH, (2.0,), freeze=True)
    for _ in range(30):
        live.add(window(1.0, 0.02, 0.01, rng))
    first = live.results().strata[0]
    assert first.outcome is StratumOutcome.WINS and first.ignored > 0
    for _ in range(200):  # the canary turns slow: a frozen stratum does not read it
        live.add(window(1.0, 0.02, 0.04, rng))
    assert live.results().strata[0].outcome is StratumOutcome.WINS
    assert live.results().strata[0].windows == 230
    again = LiveComparison(TH, (2.0,))  # the default re-reads every window
    rng = np.random.default_rng(4)
    for _ in range(30):
        again.add(window(1.0, 0.02, 0.01, rng))
    for _ in range(200):
        again.add(window(1.0, 0.02, 0.04, rng))
    assert again.results().strata[0].outcome is StratumOutcome.REGRESSES


def test_the_run_starts_at_the_lowest_visited_stratum_and_pending_ends_it_without_a_crossover():
    W, N, R, P = StratumOutcome.WINS, StratumOutcome.NO_GAIN, StratumOutcome.REGRESSES, StratumOutcome.PENDING
    assert read_run([P, W, W, R], [False, True, True, True]) == ((1, 2), 3)
    assert read_run([W, P, R], [True, True, True]) == ((0,), None)
    assert read_run([N, W], [True, True]) == ((), 0)
    assert read_run([W, W], [True, True]) == ((0, 1), None)
    assert read_run([P, P], [False, False]) == ((), None)
    # a Pending stratum leaning the canary's way is passed over below the run, not inside it
    assert read_run([P, W, W], [True, True, True], [True, False, False]) == ((1, 2), None)
    assert read_run([P, W, W], [True, True, True], [False, False, False]) == ((), None)
    assert read_run([W, P, W], [True, True, True], [False, True, False]) == ((0,), None)
    assert read_run([P, P, N], [True, True, True], [True, True, False]) == ((), 2)
    assert read_run([P], [True], [True]) == ((), None)


def test_pairs_form_by_window_so_drift_common_to_both_arms_cancels():
    """A 20% shared drift per window and a true 10% latency drop: paired per window, the stratum
    wins; the same values with the canary's windows shuffled (pairing broken) cannot decide."""
    rng = np.random.default_rng(5)
    drift = np.exp(rng.normal(0, 0.2, 60))
    paired, broken = LiveComparison(TH, (2.0,)), LiveComparison(TH, (2.0,))
    lat_c = 0.02 * drift * np.exp(rng.normal(0, 0.01, 60))
    lat_k = 0.018 * drift * np.exp(rng.normal(0, 0.01, 60))
    shuffled = rng.permutation(lat_k)
    for c, k, s in zip(lat_c, lat_k, shuffled):
        paired.add(LiveWindow(1.0, ArmWindow(c, 1 / c, 0.3), ArmWindow(k, 1 / k, 0.3)))
        broken.add(LiveWindow(1.0, ArmWindow(c, 1 / c, 0.3), ArmWindow(s, 1 / s, 0.3)))
    assert paired.results().strata[0].outcome is StratumOutcome.WINS
    assert broken.results().strata[0].outcome is StratumOutcome.PENDING
