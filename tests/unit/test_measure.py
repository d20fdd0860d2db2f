"""The status row round trip (what the operator stores is enough to decide again after a restart,
and decides the same), and the load Jobs the measurement drives."""

import json

import numpy as np
import pytest

from lookahead_operator import statemachine as sm
from lookahead_operator.decision import BatchVerdict, decide
from lookahead_operator.fleet import newest_promoted
from lookahead_operator.loadjobs import guard_jobs
from lookahead_operator.loadjobs import step_jobs as load_jobs
from lookahead_operator.measure import thresholds, verdict_from_row
from lookahead_operator.models import BatchResult, LookaheadPolicySpec, LookaheadPolicyStatus
from lookahead_operator.statistics import SequentialComparison, Thresholds

TH = Thresholds(min_latency_improvement=0.05, max_throughput_regression=0.02, confidence=0.99, min_samples=5)


def verdict(rng, batch, lat_control, lat_canary, tp_control, tp_canary, n=40, noise=0.03):
    lat, tp = SequentialComparison.for_latency(TH), SequentialComparison.for_throughput(TH)
    lat.add_control(rng.normal(lat_control, lat_control * noise, n))
    lat.add_canary(rng.normal(lat_canary, lat_canary * noise, n))
    tp.add_control(rng.normal(tp_control, tp_control * noise, n))
    tp.add_canary(rng.normal(tp_canary, tp_canary * noise, n))
    return BatchVerdict(batch, lat.result(), tp.result(), 0.4)


def stored(v: BatchVerdict) -> BatchResult:
    """Through everything a row goes through: the status model, JSON (the apiserver), and back."""
    row = BatchResult.model_validate(v.to_status(TH))
    wire = json.loads(json.dumps(LookaheadPolicyStatus(batches=[row]).to_dict()))
    return LookaheadPolicyStatus.model_validate(wire).batches[0]


def test_decision_from_stored_rows_equals_decision_from_live_verdicts():
    rng = np.random.default_rng(0)
    live = [verdict(rng, 1, 0.020, 0.012, 50, 80), verdict(rng, 8, 0.020, 0.014, 400, 420),
            verdict(rng, 32, 0.02, 0.05, 1600, 700)]
    rebuilt = [verdict_from_row(stored(v), TH) for v in live]
    a, b = decide(live, TH, deadline_passed=True), decide(rebuilt, TH, deadline_passed=True)
    assert a == b and a.action.value == "PromoteRegimeAware"


def test_rebuilt_verdicts_equal_live_ones_over_many_seeds_near_the_thresholds():
    """Streams whose true effects sit on the thresholds, so sequential stopping lands right at
    them: a rounded row used to flip Regresses to Pending (9 of 40 decisions in a ground-truth run)."""
    flips = 0
    outcomes = set()
    for seed in range(300):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(5, 60))
        lat_gain = rng.choice([0.0, 0.05, 0.2])
        tp_change = rng.choice([-0.02, 0.0, 0.02, -0.1])
        live = verdict(rng, 1 + seed % 16, 0.02, 0.02 * (1 - lat_gain), 100, 100 * (1 + tp_change), n=n,
                       noise=float(rng.choice([0.01, 0.03, 0.1])))
        again = verdict_from_row(stored(live), TH)
        outcomes.add(live.outcome(TH))
        flips += live.outcome(TH) != again.outcome(TH)
        assert again.to_status(TH) == live.to_status(TH)
    assert flips == 0
    assert len(outcomes) >= 3, "the seeds exercise several outcomes"


def test_row_without_data_rebuilds_as_pending():
    v = verdict_from_row(BatchResult(batch_size=4), TH)
    assert v.outcome(TH).value == "Pending"


def test_thresholds_come_from_the_typed_spec():
    spec = LookaheadPolicySpec.model_validate({
        "targets": {"selector": {"matchLabels": {"app": "x"}}},
        "analysis": {"maxThroughputRegression": "3%", "minLatencyImprovement": "7.5%", "confidence": 0.95},
        "load": {"minSamplesPerStep": 12}})
    assert thresholds(spec) == Thresholds(0.075, 0.03, 0.95, 12)


def _pod(name, ip, ready=True, promoted=None, deleting=False):
    meta = {"name": name, "namespace": "ns", "annotations": {"lookahead.dev/promoted": promoted} if promoted else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    return {"metadata": meta, "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _spec(**load) -> LookaheadPolicySpec:
    return LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "x"}}},
                                               "load": load})


POLICY = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 7}}


def test_guard_jobs_drive_a_ready_pod_of_the_promoted_template_and_the_control():
    spec = _spec()
    targets = [sm.Target("ns", "a", promoted="d1"), sm.Target("ns", "b", promoted="d1"), sm.Target("ns", "c")]
    newest = newest_promoted(targets)
    assert newest.name == "b" and newest_promoted([sm.Target("ns", "a")]) is None
    fleet = [_pod("b-old", "127.0.1.1"), _pod("b-new-unready", "127.0.1.2", ready=False, promoted="d1"),
             _pod("b-going", "127.0.1.3", promoted="d1", deleting=True), _pod("b-new", "127.0.1.4", promoted="d1")]
    jobs = guard_jobs(spec, POLICY, 1, 3, 16, newest, fleet, [_pod("control-1", "127.0.1.9")])
    by_role = {j["metadata"]["labels"]["lookahead.dev/drives"]: j for j in jobs}
    assert set(by_role) == {"promoted", "control"}
    assert by_role["promoted"]["metadata"]["labels"]["lookahead.dev/pod"] == "b-new"
    assert by_role["promoted"]["metadata"]["labels"]["lookahead.dev/run"] == "3"
    args = by_role["promoted"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["--url", "http://127.0.1.4:8000", "--concurrency", "16"]
    # no ready control: no load at all (a one-sided load would compare nothing)
    assert guard_jobs(spec, POLICY, 1, 3, 16, newest, fleet, [_pod("control-1", "127.0.1.9", ready=False)]) == []


def test_load_job_names_carry_the_run_not_the_generation():
    pods = {"canary": [_pod("k", "127.0.2.1")], "control": [_pod("c", "127.0.2.2")]}
    first = load_jobs(_spec(), POLICY, "ns", 0, 1, 4, pods)
    paused = {**POLICY, "metadata": {**POLICY["metadata"], "generation": 9}}    # pause/resume bumps it
    same = load_jobs(_spec(), paused, "ns", 0, 1, 4, pods)
    assert [j["metadata"]["name"] for j in first] == [j["metadata"]["name"] for j in same]
    again = load_jobs(_spec(), POLICY, "ns", 0, 2, 4, pods)
    assert not {j["metadata"]["name"] for j in first} & {j["metadata"]["name"] for j in again}


def test_config_map_prompts_reach_the_load_generator():
    spec = _spec(prompts={"configMapRef": {"name": "team-prompts", "key": "chat.jsonl"}})
    pods = {"canary": [_pod("k", "127.0.2.1")], "control": [_pod("c", "127.0.2.2")]}
    for job in load_jobs(spec, POLICY, "ns", 0, 1, 4, pods):
        pod = job["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert c["args"][c["args"].index("--prompts") + 1] == "/etc/lookahead/prompts/chat.jsonl"
        assert pod["volumes"] == [{"name": "prompts", "configMap": {
            "name": "team-prompts", "items": [{"key": "chat.jsonl", "path": "chat.jsonl"}]}}]
        assert c["volumeMounts"][0]["mountPath"] == "/etc/lookahead/prompts"
    builtin = load_jobs(_spec(prompts={"builtin": "code"}), POLICY, "ns", 0, 1, 4, pods)[0]
    args = builtin["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prompts") + 1] == "code" and "volumes" not in builtin["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", ["x" * 63, "a.b-c"])
def test_derived_names_fit_whatever_the_policy_name(name):
    pods = {"canary": [_pod("k", "127.0.2.1")], "control": [_pod("c", "127.0.2.2")]}
    policy = {"metadata": {"name": name, "namespace": "n" * 63, "uid": "u"}}
    for job in load_jobs(_spec(), policy, "ns", 31, 12345, 4, pods):
        assert len(job["metadata"]["name"]) <= 63
        assert all(len(v) <= 63 for v in job["metadata"]["labels"].values())
