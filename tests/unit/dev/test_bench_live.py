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


def test_strata_are_the_operators_fixed_per_seed_from_the_load_before_the_arms_serve():
    from lookahead_operator.measurement.live import STRATA_DOUBLINGS, edges_from_rate
    sc = bl.LiveScenario("t", CFG, "diurnal", "service", bl.bd.PROFILES[0])
    st = bl.make_live_streams(sc, bl.Curves(CFG), 40, np.random.default_rng(5))
    strata = bl.seed_strata(st)
    assert len({tuple(x.edges) for x in strata}) > 1  # a diurnal phase per seed: strata per seed
    for s, x in enumerate(strata):
        assert tuple(x.edges) == edges_from_rate(float(st.pre_rate[s]))
        assert int(x.index(np.array([st.pre_rate[s]]))[0]) == STRATA_DOUBLINGS  # that load mid-strata
    # the pre-period's rate is the load the run starts at (its first minute, per pod per window)
    ratio = st.offered[:, :12].mean(1) / st.pre_rate
    assert 0.8 < float(np.median(ratio)) < 1.25, ratio
    key, n_s = bl.stratum_keys(st)
    assert n_s == 2 * STRATA_DOUBLINGS + 1 and key.shape == st.offered.shape


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
    # who caught the regressions adds up to them, and what the test left is the missed rate
    b, n_reg = live["by_abort"], live["units"]["regressions"]
    assert (b["regressions_aborted"] + b["regressions_rolled_back_by_test"] + b["regressions_pending"]
            + b["regressions_promoted"]) == n_reg
    if n_reg:
        missed = (b["regressions_pending"] + b["regressions_promoted"]) / n_reg
        assert abs(missed - live["ours"]["missed_regression_rate"]) < 1e-4
    assert 0 <= b["deserving_aborted"] <= live["units"]["deserving"]
