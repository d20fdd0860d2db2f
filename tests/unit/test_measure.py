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


def _pod(name, ip, ready=True, promoted=None, deleting=False):
    meta = {"name": name, "namespace": "ns", "annotations": {"lookahead.dev/promoted": promoted} if promoted else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    return {"metadata": meta, "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_guard_jobs_drive_a_ready_pod_of_the_promoted_template_and_the_control():
    from types import SimpleNamespace as NS

    from lookahead_operator import statemachine as sm
    from lookahead_operator.measure import guard_jobs, newest_promoted

    spec = NS(promotion=NS(guard=NS(duration="20s"), wave_duration="10s"),
              load=NS(prompts=NS(builtin=NS(value="chat")), loadgen_image=None))
    policy = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1}}
    targets = [sm.Target("ns", "a", promoted="d1"), sm.Target("ns", "b", promoted="d1"), sm.Target("ns", "c")]
    newest = newest_promoted(targets)
    assert newest.name == "b" and newest_promoted([sm.Target("ns", "a")]) is None
    fleet = [_pod("b-old", "127.0.1.1"), _pod("b-new-unready", "127.0.1.2", ready=False, promoted="d1"),
             _pod("b-going", "127.0.1.3", promoted="d1", deleting=True), _pod("b-new", "127.0.1.4", promoted="d1")]
    jobs = guard_jobs(spec, policy, 1, 16, newest, fleet, [_pod("control-1", "127.0.1.9")])
    by_role = {j["metadata"]["labels"]["lookahead.dev/drives"]: j for j in jobs}
    assert set(by_role) == {"promoted", "control"}
    assert by_role["promoted"]["metadata"]["labels"]["lookahead.dev/pod"] == "b-new"
    args = by_role["promoted"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--url", "http://127.0.1.4:8000", "--concurrency", "16"]
    # no ready control: no load at all (a one-sided load would compare nothing)
    assert guard_jobs(spec, policy, 1, 16, newest, fleet, [_pod("control-1", "127.0.1.9", ready=False)]) == []
