"""decide(): one test per action, plus the regime config and the words."""

import json

import numpy as np
import pytest

from lookahead_operator.measurement.decision import Move, BatchOutcome, BatchComparison, Ruling, decide
from lookahead_operator.measurement.preflight import Preflight, PreflightVerdict
from lookahead_operator.measurement.stats import (ComparisonResult, Direction, PairedComparison, SequentialComparison,
                                           Thresholds, Verdict, compare_tail_latency)

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
    return BatchComparison(b, res(Direction.LOWER_IS_BETTER, *lat), res(Direction.HIGHER_IS_BETTER, *tp), 0.42)


def regress(b, tp=(-0.06, -0.08, -0.04)):
    return BatchComparison(b, res(Direction.LOWER_IS_BETTER, 0.05, 0.03, 0.07), res(Direction.HIGHER_IS_BETTER, *tp))


def no_gain(b):
    # latency fell 1% [-3%, +1%]: confidently short of the 5% improvement; throughput flat
    return BatchComparison(b, res(Direction.LOWER_IS_BETTER, -0.01, -0.03, 0.01),
                        res(Direction.HIGHER_IS_BETTER, 0.0, -0.01, 0.01))


def pending(b):
    return BatchComparison(b, missing(Direction.LOWER_IS_BETTER), missing(Direction.HIGHER_IS_BETTER))


def wide(b):
    # an interval that straddles the thresholds: data, but not enough of it
    return BatchComparison(b, res(Direction.LOWER_IS_BETTER, -0.06, -0.15, 0.03),
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


def test_promote_when_it_wins_everywhere_up_to_the_engines_max_batch_size():
    d = decide([win(16), win(1), win(4)], TH, deadline_passed=False, max_batch_size=16)
    assert d.action is Move.PROMOTE
    assert d.crossover_batch_size is None and d.lookahead_max_batch_size is None
    assert d.regime == [(1, 16, True)]
    assert "31%" in d.reason and "[27%, 35%]" in d.reason and "n=403/400" in d.reason
    assert "every measured batch size (1, 4, 16)" in d.reason


def test_never_enabled_beyond_the_largest_batch_size_measured_as_a_win():
    """Wins at every measured size, but the engine runs up to 256 (or an unknown maximum): lookahead
    is on for 1..16 only; no crossover was measured, so none is reported, and the reason says so."""
    for top, expect_top in ((256, 256), (None, 1024)):
        d = decide([win(16), win(1), win(4)], TH, deadline_passed=False, max_batch_size=top)
        assert d.action is Move.PROMOTE_REGIME_AWARE
        assert d.regime == [(1, 16, True), (17, expect_top, False)]
        assert d.lookahead_max_batch_size == 16 and d.crossover_batch_size is None
        assert "No crossover was measured: it lies above batch 16" in d.reason


def test_promote_regime_aware_with_crossover_and_engine_configs():
    d = decide([win(1), win(4), regress(8), regress(16)], TH, deadline_passed=False, max_batch_size=256)
    assert d.action is Move.PROMOTE_REGIME_AWARE
    assert d.crossover_batch_size == 8
    # on up to 4, the largest batch size measured as a win: 5-7 were never measured
    assert d.regime == [(1, 4, True), (5, 256, False)]
    assert d.lookahead_max_batch_size == 4
    assert d.vllm_num_speculative_tokens_per_batch_size(4) == [[1, 4, 4], [5, 256, 0]]
    # the reason a platform engineer reads, with the numbers
    assert d.reason.startswith("At batch 1 per-token latency fell 31% [27%, 35%] (99% CS, n=403/400)")
    assert "from batch 8 throughput fell 6% [4%, 8%]" in d.reason
    assert "lookahead enabled for batches 1-4 only" in d.reason
    assert "batches 5-7 were not measured and stay off" in d.reason
    json.dumps(d.to_dict())


def test_a_planned_batch_size_left_out_is_unmeasured_never_a_win():
    """decide() used to promote fully when the caller left a planned size out."""
    d = decide([win(1), win(4)], TH, deadline_passed=False, max_batch_size=8, planned=[1, 4, 8])
    assert d.action is Move.WAIT and d.outcomes[8] is BatchOutcome.UNMEASURED
    assert "8" in d.reason
    d = decide([win(1), win(4)], TH, deadline_passed=True, max_batch_size=8, planned=[1, 4, 8])
    assert d.action is Move.PROMOTE_REGIME_AWARE and d.action is not Move.PROMOTE
    assert d.regime == [(1, 4, True), (5, 8, False)] and d.crossover_batch_size is None
    assert "batch size 8 was planned but not measured" in d.reason and "Not measured: 8" in d.reason
    assert d.to_dict()["outcomes"]["8"] == "Unmeasured"
    # the smallest planned size unmeasured: nothing can be enabled
    d = decide([win(4)], TH, deadline_passed=True, planned=[1, 4])
    assert d.action is Move.INCONCLUSIVE and d.regime == []
    # measured but unplanned sizes still count
    assert decide([win(1), win(2)], TH, False, max_batch_size=2, planned=[1]).action is Move.PROMOTE


def test_after_the_deadline_a_pending_size_ends_the_enabled_range_without_losing_the_wins():
    d = decide([win(1), wide(4), regress(8)], TH, deadline_passed=True, max_batch_size=64)
    assert d.action is Move.PROMOTE_REGIME_AWARE and d.regime == [(1, 1, True), (2, 64, False)]
    assert d.crossover_batch_size is None and "between 2 and 8" in d.reason
    assert d.outcomes[4] is BatchOutcome.PENDING


def test_regime_aware_does_not_wait_for_batches_above_the_crossover():
    d = decide([win(1), no_gain(8), pending(32)], TH, deadline_passed=False)
    assert d.action is Move.PROMOTE_REGIME_AWARE and d.crossover_batch_size == 8
    assert "short of the required 5% improvement" in d.reason


def test_rollback_when_the_smallest_batch_does_not_pay():
    d = decide([regress(1), win(4)], TH, deadline_passed=False)
    assert d.action is Move.ROLLBACK and d.regime == []
    assert "throughput fell 6%" in d.reason and "rolled back" in d.reason
    d = decide([no_gain(1), regress(8)], TH, deadline_passed=False)
    assert d.action is Move.ROLLBACK
    assert "at batch 8 throughput fell 6%" in d.reason.lower()


def test_rollback_needs_no_deadline_but_pending_rest_does_not_block_it():
    d = decide([regress(1), pending(8)], TH, deadline_passed=False)
    assert d.action is Move.ROLLBACK


def test_not_a_candidate_from_preflight():
    pf = Preflight(False, PreflightVerdict.PREFILL_DOMINATED, ["prefill takes 70% of request time"], [])
    d = decide([win(1)], TH, deadline_passed=False, preflight=pf)
    assert d.action is Move.NOT_A_CANDIDATE and "PrefillDominated" in d.reason and "70%" in d.reason
    ok = Preflight(True, PreflightVerdict.DECODE_BOUND_IDLE_COMPUTE, [], [])
    assert decide([win(1)], TH, False, preflight=ok, max_batch_size=1).action is Move.PROMOTE


@pytest.mark.parametrize("batches", [[pending(1)], [win(1), pending(4)], [win(1), wide(4), regress(8)], []])
def test_wait_before_deadline_never_promotes_on_missing_data(batches):
    d = decide(batches, TH, deadline_passed=False)
    assert d.action is Move.WAIT and d.regime == []


@pytest.mark.parametrize("batches", [[pending(1)], [wide(1), win(4)], []])
def test_inconclusive_after_deadline(batches):
    d = decide(batches, TH, deadline_passed=True)
    assert d.action is Move.INCONCLUSIVE and d.regime == [] and d.lookahead_max_batch_size is None


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
        verdicts.append(BatchComparison(b, lat.result(), tp.result()))
    d = decide(verdicts, TH, deadline_passed=False, max_batch_size=64)
    assert d.action is Move.PROMOTE_REGIME_AWARE
    assert d.crossover_batch_size == 16 and d.lookahead_max_batch_size == 4
    assert isinstance(d, Ruling)


def test_end_to_end_paired_windows_with_drift_and_a_stalling_canary():
    """PairedComparisons on the same windows: shared drift cancels; a canary whose throughput stalls
    in a third of its windows is not a win even though its per-token latency is 30% lower."""
    rng = np.random.default_rng(1)
    th = TH.for_family(2)
    drift = np.exp(np.cumsum(rng.normal(0, 0.05, 18)))
    verdicts = []
    for b, stall in ((1, 0.0), (8, 1 / 3)):
        lat, tp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
        noise = rng.lognormal(0, 0.02, (4, 18))
        stalled = np.arange(18) % 3 == 2 if stall else np.zeros(18, dtype=bool)
        lat.add_pairs(0.02 * drift * noise[0], np.where(stalled, np.nan, 0.014 * drift * noise[1]))
        tp.add_pairs(500 / drift * noise[2], np.where(stalled, 0.0, 700 / drift * noise[3]))
        verdicts.append(BatchComparison(b, lat.result(), tp.result()))
    assert verdicts[0].outcome(th) is BatchOutcome.WINS
    assert verdicts[1].outcome(th) is not BatchOutcome.WINS
    assert verdicts[1].throughput.stalls_canary == 6
    d = decide(verdicts, th, deadline_passed=True, max_batch_size=64, planned=[1, 8])
    assert d.action is Move.PROMOTE_REGIME_AWARE and d.lookahead_max_batch_size == 1
    assert "paired windows" in d.reason


def test_decision_benchmark_methods_on_identical_streams_small():
    """The benchmark's vectorised 'ours' agrees with the operator code path (checked inside run())
    and behaves on two clear scenarios; every method reads the same streams."""
    from lookahead_dev import bench_decision as bd

    from dataclasses import replace

    quiet = replace(bd.PROFILES[0], tail_p=0.0, stall_arm=0.0)
    win_sc = bd.Scenario("grid", "win", "p", 1, 0.7, 1 / 0.7, quiet)
    reg_sc = bd.Scenario("grid", "reg", "p", 1, 1.2, 1 / 1.2, quiet)
    rows = bd.run(seeds=20, th=TH, scenarios=[win_sc, reg_sc])
    (s1, r1), (s2, r2) = rows
    assert s1.deserves_promotion(TH) and not s2.deserves_promotion(TH) and s2.regression_5pct
    assert (r1["ours"][0] == bd.PROMOTE).all() and (r2["ours"][0] == bd.ROLLBACK).all()
    assert (r1["ours"][1] <= bd.MAX_STEP_WINDOWS).all() and (r1["fixed_mwu"][1] == bd.FIXED_HORIZON).all()
    assert (r1["kayenta"][1] == bd.KAYENTA_LOOKS[-1]).all()  # a passing Kayenta reads every look
    for m in bd.HEADLINE:
        assert (r2[m][0] == bd.ROLLBACK).all(), m
    summary = bd.summarise(rows, TH)
    assert set(bd.HEADLINE) <= set(summary)
    for m in bd.HEADLINE:
        assert {"wrong_promotion_rate", "missed_regression_rate", "inconclusive_rate", "correct_promotion_rate",
                "mean_samples_to_decision"} <= set(summary[m])
    assert summary["ours"]["wrong_promotion_rate"] == 0 and summary["ours"]["missed_regression_rate"] == 0


def test_bench_streams_have_the_true_ratios_of_means():
    from lookahead_dev import bench_decision as bd

    rng = np.random.default_rng(3)
    sc = bd.Scenario("grid", "x", "p", 1, 0.8, 1.1, bd.PROFILES[2], canary_stall=0.1)
    lc, lk, tc, tk = bd.make_streams(sc, 400, 180, rng)
    assert np.nanmean(lk) / np.nanmean(lc) == pytest.approx(0.8, rel=0.02)
    assert tk.mean() / tc.mean() == pytest.approx(1.1 * 0.9, rel=0.02) == sc.tp_ratio_eff
    assert np.isnan(lk).sum() == (tk == 0).sum()  # a window with no output has no latency


def _tail(worse: bool):
    rng = np.random.default_rng(5)
    bounds = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)

    def hist(x):
        s = np.sort(x)
        return {**{le: int(np.searchsorted(s, le, side="right")) for le in bounds}, "+Inf": int(s.size)}

    c = 0.02 * rng.lognormal(0, 0.1, 10000)
    k = np.where(rng.random(10000) < 0.03, 0.3, 0.014) if worse else 0.014 * rng.lognormal(0, 0.1, 10000)
    return compare_tail_latency(hist(c), hist(k), TH.max_tail_latency_regression, TH.confidence)


@pytest.mark.parametrize("make", [
    lambda: win(1),
    lambda: pending(2),
    lambda: regress(8),
    lambda: BatchComparison(1, win(1).latency, win(1).throughput, 0.4, tail=_tail(True)),
    lambda: BatchComparison(2, win(2).latency, win(2).throughput, None, tail=_tail(False)),
])
def test_status_row_round_trip_rebuilds_the_same_verdict(make):
    """to_status -> (JSON) -> from_status -> to_status is the identity, and the outcome is the same:
    the operator rebuilds verdicts from stored rows after a restart."""
    v = make()
    row = json.loads(json.dumps(v.to_status(TH)))
    back = BatchComparison.from_status(row, TH)
    assert back.outcome(TH) is v.outcome(TH)
    assert back.to_status(TH) == row


def test_paired_status_row_round_trip():
    th = TH.for_family(3)
    lat, tp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
    rng = np.random.default_rng(6)
    lat.add_pairs(list(0.02 * rng.lognormal(0, 0.03, 17)) + [0.02], list(0.014 * rng.lognormal(0, 0.03, 17)) + [None])
    tp.add_pairs(list(500 * rng.lognormal(0, 0.03, 17)) + [480.0, 0.0],
                 list(700 * rng.lognormal(0, 0.03, 17)) + [0.0, 0.0])
    v = BatchComparison(4, lat.result(), tp.result(), 0.5, tail=_tail(False))
    row = json.loads(json.dumps(v.to_status(th)))
    assert row["paired"] is True and row["stallIntervals"] == {"control": 0, "canary": 1}
    assert row["droppedIntervals"] == {"latency": 1, "throughput": 1}
    assert row["latencySamples"] == 17 and row["throughputSamples"] == 18
    assert row["tailVerdict"] in ("Equivalent", "NotEnoughData", "Better") and row["tailThreshold"] == 1.0
    assert row["confidence"] == pytest.approx(1 - 0.01 / 9)
    back = BatchComparison.from_status(row, th)
    assert back.to_status(th) == row and back.outcome(th) is v.outcome(th)


def test_batch_status_row():
    row = win(1).to_status(TH)
    assert row["batchSize"] == 1 and row["verdict"] == "Wins" and row["tpotChange"] == -0.31
    assert row["tpotInterval"] == [-0.35, -0.27] and row["acceptanceRate"] == 0.42
    assert row["controlTpotMs"] == 1000.0  # control_mean 1.0 s in the hand-made result
    p = pending(2).to_status(TH)
    assert p["verdict"] == "Pending" and p["tpotInterval"] is None and p["tpotChange"] is None
    json.dumps(p)


def test_status_row_keeps_its_original_keys_for_unpaired_verdicts_without_a_tail():
    """Rows of independent-arms verdicts without a tail carry exactly the keys BatchResult has always
    had (so nothing is pruned by a CRD that predates the new fields)."""
    assert set(win(1).to_status(TH)) == {
        "batchSize", "controlTpotMs", "canaryTpotMs", "tpotChange", "tpotInterval", "controlTokensPerSecond",
        "canaryTokensPerSecond", "throughputChange", "throughputInterval", "samples", "confidence",
        "acceptanceRate", "latencyVerdict", "throughputVerdict", "verdict"}


def test_a_tail_veto_waits_for_the_steps_minimum_samples_like_every_verdict():
    """The shipped example's e2e test found a batch-8 step settled by the tail veto after fewer
    than minSamplesPerStep windows: the tail is a verdict too and waits for the step's minimum."""
    early = BatchComparison(8, missing(Direction.LOWER_IS_BETTER), missing(Direction.HIGHER_IS_BETTER), None,
                         tail=_tail(True))
    assert early.tail_regresses()
    assert early.outcome(TH) is BatchOutcome.PENDING and not early.settled(TH)
    later = BatchComparison(8, win(8).latency, win(8).throughput, None, tail=_tail(True))
    assert later.outcome(TH) is BatchOutcome.REGRESSES


def test_a_split_confidence_reads_with_one_decimal():
    from lookahead_operator.measurement.wording import confidence_words

    assert confidence_words(0.99) == "99%"
    assert confidence_words(0.95 / 0.95 - 0.05 / 6) == "99.2%"    # 1 - 0.05/6, the demo's per-test share
    assert confidence_words(0.9875) == "98.8%"
