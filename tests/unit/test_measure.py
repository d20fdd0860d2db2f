"""The status row round trip: what the operator stores is enough to decide again after a restart."""

from lookahead_operator.decision import BatchVerdict, decide
from lookahead_operator.measure import _comparison_from_row, batch_row
from lookahead_operator.statistics import SequentialComparison, Thresholds

TH = Thresholds(min_latency_improvement=0.05, max_throughput_regression=0.02, confidence=0.99, min_samples=5)


def verdict(batch, lat_control, lat_canary, tp_control, tp_canary, n=40):
    import numpy as np
    rng = np.random.default_rng(batch)
    lat, tp = SequentialComparison.for_latency(TH), SequentialComparison.for_throughput(TH)
    lat.add_control(rng.normal(lat_control, lat_control * 0.03, n))
    lat.add_canary(rng.normal(lat_canary, lat_canary * 0.03, n))
    tp.add_control(rng.normal(tp_control, tp_control * 0.03, n))
    tp.add_canary(rng.normal(tp_canary, tp_canary * 0.03, n))
    return BatchVerdict(batch, lat.result(), tp.result(), 0.4)


def test_decision_from_stored_rows_equals_decision_from_live_verdicts():
    live = [verdict(1, 0.020, 0.012, 50, 80), verdict(8, 0.020, 0.014, 400, 420), verdict(32, 0.02, 0.05, 1600, 700)]
    rows = [batch_row(v, TH) for v in live]
    rebuilt = [_comparison_from_row(r, TH) for r in rows]
    a, b = decide(live, TH, deadline_passed=True), decide(rebuilt, TH, deadline_passed=True)
    assert a.action == b.action and a.crossover_batch_size == b.crossover_batch_size
    assert [v.outcome(TH) for v in live] == [v.outcome(TH) for v in rebuilt]
    assert a.action.value == "PromoteRegimeAware"


def test_row_without_data_rebuilds_as_not_enough_data():
    row = {"batchSize": 4, "verdict": "Pending"}
    v = _comparison_from_row(row, TH)
    assert v.outcome(TH).value == "Pending"
