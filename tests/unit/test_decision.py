"""decide(): one test per action, plus the regime config and the words."""

import json

import numpy as np
import pytest

from lookahead_operator.decision import Action, BatchOutcome, BatchVerdict, Decision, decide
from lookahead_operator.preflight import Preflight, PreflightVerdict
from lookahead_operator.statistics import ComparisonResult, Direction, SequentialComparison, Thresholds, Verdict

TH = Thresholds(min_latency_improvement=0.05, max_throughput_regression=0.02, confidence=0.99)


def res(direction, est, lo, hi, n=400, verdict=Verdict.NOT_ENOUGH_DATA):
    return ComparisonResult(
        metric="m", direction=direction, threshold=0.05, confidence=0.99, n_control=n, n_canary=n + 3,
        control_mean=1.0, canary_mean=1.0 + est, estimate=est, interval=(lo, hi), verdict=verdict,
    )


def missing(direction):
    return ComparisonResult(metric="m", direction=direction, threshold=0.05, confidence=0.99, n_control=3,
                            n_canary=2, control_mean=1.0, canary_mean=1.0, estimate=None, interval=None,
                            verdict=Verdict.NOT_ENOUGH_DATA, note="need 10 samples per arm, have 3 control / 2 canary")


def win(b, lat=(-0.31, -0.35, -0.27), tp=(0.40, 0.33, 0.47)):
    return BatchVerdict(b, res(Direction.LOWER_IS_BETTER, *lat), res(Direction.HIGHER_IS_BETTER, *tp), 0.42)


def regress(b, tp=(-0.06, -0.08, -0.04)):
    return BatchVerdict(b, res(Direction.LOWER_IS_BETTER, 0.05, 0.03, 0.07), res(Direction.HIGHER_IS_BETTER, *tp))


def no_gain(b):
    # latency fell 1% [-3%, +1%]: confidently short of the 5% improvement; throughput flat
    return BatchVerdict(b, res(Direction.LOWER_IS_BETTER, -0.01, -0.03, 0.01),
                        res(Direction.HIGHER_IS_BETTER, 0.0, -0.01, 0.01))


def pending(b):
    return BatchVerdict(b, missing(Direction.LOWER_IS_BETTER), missing(Direction.HIGHER_IS_BETTER))


def wide(b):
    # an interval that straddles the thresholds: data, but not enough of it
    return BatchVerdict(b, res(Direction.LOWER_IS_BETTER, -0.06, -0.15, 0.03),
                        res(Direction.HIGHER_IS_BETTER, 0.01, -0.06, 0.08))


def test_outcomes():
    assert win(1).outcome(TH) is BatchOutcome.WINS
    assert regress(8).outcome(TH) is BatchOutcome.REGRESSES
    assert no_gain(4).outcome(TH) is BatchOutcome.NO_GAIN
    assert pending(2).outcome(TH) is BatchOutcome.PENDING
    assert wide(2).outcome(TH) is BatchOutcome.PENDING
    # latency better but throughput interval still reaching below -2%: not a win yet
    half = win(1, tp=(0.01, -0.03, 0.05))
    assert half.outcome(TH) is BatchOutcome.PENDING and not half.settled(TH)


def test_promote_when_it_wins_everywhere():
    d = decide([win(16), win(1), win(4)], TH, deadline_passed=False)
    assert d.action is Action.PROMOTE
    assert d.crossover_batch_size is None and d.lookahead_max_batch_size is None
    assert d.regime == [(1, 1024, True)]
    assert "31%" in d.reason and "[27%, 35%]" in d.reason and "n=403/400" in d.reason
    assert "every measured batch size (1, 4, 16)" in d.reason


def test_promote_regime_aware_with_crossover_and_engine_configs():
    d = decide([win(1), win(4), regress(8), regress(16)], TH, deadline_passed=False, max_batch_size=256)
    assert d.action is Action.PROMOTE_REGIME_AWARE
    assert d.crossover_batch_size == 8
    assert d.regime == [(1, 7, True), (8, 256, False)]
    assert d.lookahead_max_batch_size == 7
    assert d.vllm_num_speculative_tokens_per_batch_size(4) == [[1, 7, 4], [8, 256, 0]]
    # the reason a platform engineer reads, with the numbers
    assert d.reason.startswith("At batch 1 per-token latency fell 31% [27%, 35%] (99% CS, n=403/400)")
    assert "from batch 8 throughput fell 6% [4%, 8%]" in d.reason
    assert "lookahead enabled for batches 1-7 only" in d.reason
    assert "batches 5-7 were not measured" in d.reason
    json.dumps(d.to_dict())


def test_regime_aware_does_not_wait_for_batches_above_the_crossover():
    d = decide([win(1), no_gain(8), pending(32)], TH, deadline_passed=False)
    assert d.action is Action.PROMOTE_REGIME_AWARE and d.crossover_batch_size == 8
    assert "short of the required 5% improvement" in d.reason


def test_rollback_when_the_smallest_batch_does_not_pay():
    d = decide([regress(1), win(4)], TH, deadline_passed=False)
    assert d.action is Action.ROLLBACK and d.regime == []
    assert "throughput fell 6%" in d.reason and "rolled back" in d.reason
    d = decide([no_gain(1), regress(8)], TH, deadline_passed=False)
    assert d.action is Action.ROLLBACK
    assert "at batch 8 throughput fell 6%" in d.reason.lower()


def test_rollback_needs_no_deadline_but_pending_rest_does_not_block_it():
    d = decide([regress(1), pending(8)], TH, deadline_passed=False)
    assert d.action is Action.ROLLBACK


def test_not_a_candidate_from_preflight():
    pf = Preflight(False, PreflightVerdict.PREFILL_DOMINATED, ["prefill takes 70% of request time"], [])
    d = decide([win(1)], TH, deadline_passed=False, preflight=pf)
    assert d.action is Action.NOT_A_CANDIDATE and "PrefillDominated" in d.reason and "70%" in d.reason
    ok = Preflight(True, PreflightVerdict.DECODE_BOUND_IDLE_COMPUTE, [], [])
    assert decide([win(1)], TH, False, preflight=ok).action is Action.PROMOTE


@pytest.mark.parametrize("batches", [[pending(1)], [win(1), pending(4)], [win(1), wide(4), regress(8)], []])
def test_wait_before_deadline_never_promotes_on_missing_data(batches):
    d = decide(batches, TH, deadline_passed=False)
    assert d.action is Action.WAIT and d.regime == []


@pytest.mark.parametrize("batches", [[pending(1)], [win(1), pending(4)], [win(1), wide(4), regress(8)], []])
def test_inconclusive_after_deadline(batches):
    d = decide(batches, TH, deadline_passed=True)
    assert d.action is Action.INCONCLUSIVE and d.regime == [] and d.lookahead_max_batch_size is None


def test_duplicate_batch_sizes_rejected():
    with pytest.raises(ValueError):
        decide([win(1), win(1)], TH, False)


def test_end_to_end_from_samples_to_regime_aware_decision():
    """Real SequentialComparisons fed with simulated samples, not hand-made intervals."""
    rng = np.random.default_rng(0)
    true = {1: (0.70, 1.43), 4: (0.80, 1.25), 16: (1.10, 0.91)}  # (latency ratio, throughput ratio)
    verdicts = []
    for b, (lr, tr) in true.items():
        lat, tp = SequentialComparison.for_latency(TH), SequentialComparison.for_throughput(TH)
        lat.add_control(0.02 * rng.lognormal(0, 0.05, 60))
        lat.add_canary(0.02 * lr * rng.lognormal(0, 0.05, 60))
        tp.add_control(500 * rng.lognormal(0, 0.03, 60))
        tp.add_canary(500 * tr * rng.lognormal(0, 0.03, 60))
        verdicts.append(BatchVerdict(b, lat.result(), tp.result()))
    d = decide(verdicts, TH, deadline_passed=False, max_batch_size=64)
    assert d.action is Action.PROMOTE_REGIME_AWARE
    assert d.crossover_batch_size == 16 and d.lookahead_max_batch_size == 15
    assert isinstance(d, Decision)


def test_decision_benchmark_methods_on_identical_streams_small():
    """The benchmark's vectorised 'ours' agrees with the operator code path (checked inside run())
    and behaves on two clear scenarios; Kayenta always reads 50 samples, ours stops early."""
    from lookahead_operator import bench_decision as bd

    win_sc = bd.Scenario("grid", "win", 1, 0.7, 1.43, "cv2%", sigma=0.02)
    reg_sc = bd.Scenario("grid", "reg", 1, 0.7, 0.90, "cv2%", sigma=0.02)
    rows = bd.run(seeds=20, horizon=300, th=TH, scenarios=[win_sc, reg_sc])
    (s1, r1), (s2, r2) = rows
    assert s1.deserves_promotion(TH) and not s2.deserves_promotion(TH) and s2.regression_5pct
    assert (r1["ours"][0] == bd.PROMOTE).all() and (r2["ours"][0] == bd.ROLLBACK).all()
    assert (r1["kayenta"][1] == bd.FIXED_HORIZON).all()
    assert np.median(r1["ours"][1]) < bd.FIXED_HORIZON / 3
    summary = bd.summarise(rows, TH)
    assert summary["ours"]["wrong_promotion_rate"] == 0 and summary["ours"]["missed_regression_rate"] == 0


def test_batch_status_row():
    row = win(1).to_status(TH)
    assert row["batchSize"] == 1 and row["verdict"] == "Wins" and row["tpotChange"] == -0.31
    assert row["tpotInterval"] == [-0.35, -0.27] and row["acceptanceRate"] == 0.42
    assert row["controlTpotMs"] == 1000.0  # control_mean 1.0 s in the hand-made result
    p = pending(2).to_status(TH)
    assert p["verdict"] == "Pending" and p["tpotInterval"] is None and p["tpotChange"] is None
    json.dumps(p)
