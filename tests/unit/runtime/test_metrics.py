"""The operator's own metrics (``lookahead_operator.runtime.metrics``): the per-policy series the
chart's alerts and dashboard read, kept equal to the policies' status, and the process's health."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lookahead_operator.api.status import LookaheadPolicyStatus
from lookahead_operator.runtime import metrics


def samples(name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def policy_samples(name: str, policy: str) -> dict[tuple, float]:
    return {k: v for k, v in samples(name).items() if ("policy", policy) in k}


@pytest.fixture()
def policy(request):
    """A policy name of this test's own (the registry is the process's); its series go at the end."""
    key = f"ns-{request.node.name[:20]}/p"
    yield key
    metrics.record_policy(key, None)


def status(phase: str, batches: list[dict] | None = None) -> LookaheadPolicyStatus:
    return LookaheadPolicyStatus.model_validate({"phase": phase, "batches": batches})


def test_one_phase_series_per_policy_follows_its_phase(policy):
    ns, name = policy.split("/")
    metrics.record_policy(policy, status("Measuring"))
    assert policy_samples("lookahead_operator_policy_phase", name) == {
        (("phase", "Measuring"), ("policy", name), ("policy_namespace", ns)): 1.0}
    metrics.record_policy(policy, status("Failed"))
    assert policy_samples("lookahead_operator_policy_phase", name) == {
        (("phase", "Failed"), ("policy", name), ("policy_namespace", ns)): 1.0}
    assert samples("lookahead_operator_policies")[(("phase", "Failed"),)] >= 1


def test_batch_rows_become_verdict_and_change_series_replaced_whole(policy):
    ns, name = policy.split("/")
    metrics.record_policy(policy, status("Measuring", [
        {"batchSize": 1, "verdict": "Wins", "tpotChange": -0.3, "throughputChange": 0.01},
        {"batchSize": 8, "verdict": "Pending"}]))
    assert policy_samples("lookahead_operator_policy_batch_verdict", name) == {
        (("batch_size", "1"), ("policy", name), ("policy_namespace", ns), ("verdict", "Wins")): 1.0,
        (("batch_size", "8"), ("policy", name), ("policy_namespace", ns), ("verdict", "Pending")): 1.0}
    assert policy_samples("lookahead_operator_policy_batch_tpot_change", name) == {
        (("batch_size", "1"), ("policy", name), ("policy_namespace", ns)): -0.3}
    assert policy_samples("lookahead_operator_policy_batch_throughput_change", name) == {
        (("batch_size", "1"), ("policy", name), ("policy_namespace", ns)): 0.01}

    metrics.record_policy(policy, status("Measuring", [
        {"batchSize": 1, "verdict": "Wins", "tpotChange": -0.3, "throughputChange": 0.01},
        {"batchSize": 8, "verdict": "Regresses", "tpotChange": 0.1, "throughputChange": -0.2}]))
    verdicts = policy_samples("lookahead_operator_policy_batch_verdict", name)
    assert {dict(k)["batch_size"]: dict(k)["verdict"] for k in verdicts} == {"1": "Wins", "8": "Regresses"}
    assert policy_samples("lookahead_operator_policy_batch_tpot_change", name)[
        (("batch_size", "8"), ("policy", name), ("policy_namespace", ns))] == 0.1


def test_a_deleted_policy_leaves_no_series(policy):
    _, name = policy.split("/")
    metrics.record_policy(policy, status("RolledBack", [{"batchSize": 2, "verdict": "NoGain", "tpotChange": 0.0}]))
    before = samples("lookahead_operator_policies")[(("phase", "RolledBack"),)]
    metrics.record_policy(policy, None)
    for name_ in ("lookahead_operator_policy_phase", "lookahead_operator_policy_batch_verdict",
                  "lookahead_operator_policy_batch_tpot_change", "lookahead_operator_policy_batch_throughput_change"):
        assert policy_samples(name_, name) == {}, name_
    assert samples("lookahead_operator_policies")[(("phase", "RolledBack"),)] == before - 1


def test_reconcile_errors_start_at_zero_for_every_phase_and_process_health_is_exported():
    errors = samples("lookahead_operator_reconcile_errors_total")
    assert {dict(k)["phase"] for k in errors} >= {"Pending", "Measuring", "Failed", "RolledBack"}
    assert samples("process_cpu_seconds_total") and samples("process_resident_memory_bytes")


def test_a_pass_that_raises_counts_a_reconcile_error_in_the_policys_phase(monkeypatch):
    import asyncio

    from lookahead_operator.kube import cache
    from lookahead_operator.runtime import handlers

    def boom(*_):
        raise RuntimeError("the API went away")

    monkeypatch.setattr(handlers, "reconcile_once", boom)
    monkeypatch.setattr(cache.Snapshot, "of", classmethod(lambda cls, *_: None))
    body = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u"}, "spec": {},
            "status": {"phase": "Guarding"}}
    key = (("phase", "Guarding"),)
    before = samples("lookahead_operator_reconcile_errors_total")[key]
    with pytest.raises(RuntimeError):
        asyncio.run(handlers._pass("team-a", "p", body, ()))
    assert samples("lookahead_operator_reconcile_errors_total")[key] == before + 1
