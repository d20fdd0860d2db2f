"""bench_live: the live streams' model (the simulator's curves, Little's law), the vectorised
comparison against LiveComparison, and a small fixed-seed run of both methods."""

import numpy as np
import pytest

from lookahead_canary.simulator import RooflineSimulator, SimConfig
from lookahead_dev import bench_live as bl
from lookahead_operator.measurement.stats import Thresholds

TH = Thresholds()
CFG = SimConfig(gpu="h100-sxm", model="llama-3-8b", method="jacobi", acceptance=0.45)


def test_curves_are_the_simulators_and_the_batch_is_littles_law_fixed_point():
    curves, sim = bl.Curves(CFG), RooflineSimulator(CFG, seed=0)
    for b in (1, 2, 8, 32):
        for spec in (False, True):
            assert curves.tpot(np.array(float(b)), spec) == pytest.approx(sim.expected_per_token_seconds(b, spec))
    k = np.array([20.0, 200.0, 2000.0])  # arrival rate x output tokens x slowness
    b, overload = curves.solve(k, True)
    ok = overload == 1.0
    assert ok.any()
    assert b[ok] == pytest.approx(k[ok] * curves.tpot(b[ok], True), rel=1e-6)  # B = lambda L tpot(B)
    # a faster arm runs fewer requests at the same arrival rate: the running batch is an outcome
    fast, _ = curves.solve(np.array([200.0]), True)
    slow, _ = curves.solve(np.array([200.0]), False)
    assert (fast < slow).all() == bool(curves.tpot(fast, True) < curves.tpot(slow, False))


def test_vectorised_ours_agrees_with_live_comparison():
    bl.check_against_live_code(TH, np.random.default_rng(7), seeds=2)


def test_small_fixed_seed_run_gives_the_five_rates_per_method():
    scenarios = bl.live_scenarios()[::54]
    u = bl.run_live(4, TH, seed=3, scenarios=scenarios)
    live = bl.live_report(u, TH, 4, len(scenarios))
    for m in bl.METHODS:
        for key in ("wrong_promotion_rate", "missed_regression_rate", "inconclusive_rate", "correct_promotion_rate"):
            assert 0.0 <= live[m][key] <= 1.0, (m, key)
        assert live[m]["mean_windows"] > 0
    assert live["units"]["all"] > 0 and live["scenarios"] == len(scenarios)
    # ours never promotes a 5% regression here and keeps wrong promotions within the goal
    assert live["ours"]["promoted_regression_rate"] == 0.0
    assert live["ours"]["wrong_promotion_rate"] <= 0.01
