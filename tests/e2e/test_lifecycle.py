"""A whole LookaheadPolicy, from apply to promote or roll back, as a user runs it: the operator
installed by `helm install` as a Pod on the real node, the fleet, canary, control and load Jobs as
Pods from the locally built images, and Prometheus discovering them through the apiserver with the
documented scrape configuration. The engines serve the reference engine's simulator backend, which
gives a known effect with real HTTP, real metrics and real scraping."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from lookahead_operator.controller import builders as b
from lookahead_dev.devcluster import wait_for
from lookahead_dev.node import image_name

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

GROUP, VERSION, PLURAL = "lookahead.dev", "v1alpha1", "lookaheadpolicies"
ENGINE_IMAGE = image_name("engine")  # built by hack/build-images.sh, imported into the real node

# A100 + Llama-3-8B roofline: decode is memory-bound at batch 1 (lookahead cuts per-token
# latency) and compute-bound at batch 32 (the extra Jacobi tokens cost real time).
# time_scale 3 keeps the simulated engines and the load generators light on two CPU cores.
GOOD_GPU = {"gpu": "a100-80gb", "model": "llama-3-8b", "acceptance": 0.6, "noise_sigma": 0.03, "time_scale": 3}
# Same hardware, but a workload where drafts are almost never accepted and speculating steps
# carry a large fixed cost: lookahead only loses.
BAD_GPU = {"gpu": "a100-80gb", "model": "llama-3-8b", "acceptance": 0.02, "noise_sigma": 0.03,
           "spec_overhead_s": 0.03, "time_scale": 3}


def engine_deployment(ns: str, name: str, sim: dict, app: str) -> dict:
    labels = {"app": app, "fleet": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {"containers": [{
                    "name": "engine",
                    "image": ENGINE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-m", "lookahead_canary.server"],
                    "args": ["--host", "$(POD_IP)", "--port", "8000", "--backend", "simulate",
                             "--sim-config", json.dumps(sim), "--max-num-seqs", "64",
                             "--served-model-name", "chat"],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
                    "resources": {"requests": {"cpu": "100m"}},
                }]},
            },
        },
    }


def policy(name: str, ns: str, app: str, prometheus_url: str, batch_sizes: list[int], mode: str,
           waves: list[str]) -> dict:
    """A policy with shortened clocks (60 s steps, 4 s warm-up, 5 samples, 6 m deadline, 15 s waves,
    20 s guard) so that a whole rollout fits a test: the defaults themselves are exercised end to end
    by test_shipped_example.py, and their physics (samples per step) by the unit tests."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LookaheadPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "targets": {"selector": {"matchLabels": {"app": app}}},
            "engine": "reference",
            "lookahead": {"method": "jacobi", "window": 7, "ngram": 5, "guessSet": 7},
            "load": {"mode": "sweep", "batchSizes": batch_sizes, "stepDuration": "60s", "warmup": "4s",
                     "minSamplesPerStep": 5, "prompts": {"builtin": "chat"}},
            "analysis": {"prometheus": {"url": prometheus_url}, "maxThroughputRegression": "2%",
                         "minLatencyImprovement": "5%", "confidence": 0.99, "deadline": "6m"},
            "promotion": {"mode": mode, "waves": waves, "waveDuration": "15s",
                          "guard": {"duration": "20s"}},
        },
    }



def make_namespace(core, ns):
    core.create_namespace({"metadata": {"name": ns}})


def get_policy(custom, ns, name):
    return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def wait_phase(custom, ns, name, phases, timeout, operator):
    seen = []

    def check():
        st = get_policy(custom, ns, name).get("status") or {}
        phase = st.get("phase")
        if not seen or seen[-1] != phase:
            seen.append(phase)
        return st if phase in phases else None

    try:
        return wait_for(check, timeout=timeout, interval=1.0, what=f"{ns}/{name} in {phases}")
    except Exception as exc:
        st = get_policy(custom, ns, name).get("status")
        raise AssertionError(f"phases seen {seen}; status {json.dumps(st, indent=1)[:3000]}\n"
                             f"operator log tail:\n{operator.log()[-3000:]}") from exc


def templates(apps, ns, names):
    return {n: apps.read_namespaced_deployment(n, ns).to_dict()["spec"]["template"] for n in names}


def sanitized(apps, ns, name):
    return client.ApiClient().sanitize_for_serialization(apps.read_namespaced_deployment(name, ns))


def events_of(core, ns, name):
    return [e for e in core.list_namespaced_event(ns).items if e.involved_object.name == name]


def no_leftovers(apps, batch, ns, policy_name):
    sel = f"{b.LABEL_POLICY}={policy_name},{b.LABEL_POLICY_NAMESPACE}={ns}"
    return (not apps.list_namespaced_deployment(ns, label_selector=sel).items
            and not [j for j in batch.list_namespaced_job(ns, label_selector=sel).items
                     if not j.metadata.deletion_timestamp])


def test_regime_aware_promotion_in_waves(apis, operator_pod, prometheus):
    apps, core, custom, batch = apis
    ns = "e2e-regime"
    make_namespace(core, ns)
    for name in ("chat-a", "chat-b"):
        apps.create_namespaced_deployment(ns, engine_deployment(ns, name, GOOD_GPU, "chat"))
    originals = {n: sanitized(apps, ns, n)["spec"]["template"] for n in ("chat-a", "chat-b")}
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           policy("chat", ns, "chat", prometheus.url, [1, 16], "regimeAware",
                                                  ["50%", "100%"]))
    st = wait_phase(custom, ns, "chat", {"Succeeded", "RolledBack", "Failed", "NotACandidate"}, 480,
                    operator_pod)
    assert st["phase"] == "Succeeded", (st.get("message"), st.get("guard"), operator_pod.log()[-4000:])
    assert st["decision"]["action"] == "PromoteRegimeAware", st["decision"]["reason"]
    rows = {r["batchSize"]: r for r in st["batches"]}
    assert rows[1]["verdict"] == "Wins" and rows[1]["tpotChange"] < -0.05
    assert rows[16]["throughputChange"] < -0.02
    assert rows[1]["acceptanceRate"] > 0
    assert st["decision"]["crossoverBatchSize"] == 16
    assert [r["enabled"] for r in st["decision"]["regime"]][:2] == [True, False]
    # the fleet was patched wave by wave, each Deployment with the regime-aware cap
    # events are posted off the reconcile's critical path: wait for them
    promoted = wait_for(lambda: [e for e in events_of(core, ns, "chat") if e.reason == "Promoted"][1:] and
                        [e for e in events_of(core, ns, "chat") if e.reason == "Promoted"], timeout=30, what="events")
    assert [e.message.split()[-1] for e in sorted(promoted, key=lambda e: e.first_timestamp)] == \
        [f"{ns}/chat-a", f"{ns}/chat-b"]
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--speculative-config" in args and "--lookahead-max-batch-size" in args
        assert b.original_template(d) == originals[name], "the exact original template is saved"
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")
    # what a user reads with `kubectl logs` of the operator Pod: the rollout, phase by phase
    log = operator_pod.log()
    for line in ("-> Measuring", "-> Promoting", "-> Guarding", "-> Succeeded"):
        assert f"{ns}/chat: phase " in log and line in log, f"{line!r} not in the operator's log:\n{log[-3000:]}"
    assert log.count(f"{ns}/chat: Promoted: ") == 2, log[-3000:]


def test_regressing_canary_rolls_back_with_fleet_untouched(apis, operator_pod, prometheus):
    apps, core, custom, batch = apis
    ns = "e2e-rollback"
    make_namespace(core, ns)
    for name in ("chat-a", "chat-b"):
        apps.create_namespaced_deployment(ns, engine_deployment(ns, name, BAD_GPU, "chat"))
    before = {n: sanitized(apps, ns, n) for n in ("chat-a", "chat-b")}
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           policy("chat", ns, "chat", prometheus.url, [1, 8], "regimeAware",
                                                  ["100%"]))
    st = wait_phase(custom, ns, "chat", {"Succeeded", "RolledBack", "Failed", "NotACandidate"}, 420,
                    operator_pod)
    assert st["phase"] == "RolledBack", st.get("message")
    assert st["decision"]["action"] == "Rollback"
    assert not any(e.reason == "Promoted" for e in events_of(core, ns, "chat"))
    for name, d0 in before.items():
        d = sanitized(apps, ns, name)
        # (a Deployment's generation also counts annotation edits, so the claim shows there; the spec must not move)
        assert d["spec"] == d0["spec"], "the fleet's spec was never patched"
        assert d["metadata"]["labels"] == d0["metadata"]["labels"]
        ann = d["metadata"].get("annotations") or {}
        assert b.ANNOTATION_OWNER not in ann and b.ANNOTATION_ORIGINAL_TEMPLATE not in ann
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


def test_guard_regression_restores_exact_templates(apis, operator_pod, prometheus):
    """A heterogeneous fleet: the canary is cloned from chat-a (where lookahead wins), but chat-b
    serves a workload where it loses. The guard catches it in the second wave and restores both."""
    apps, core, custom, batch = apis
    ns = "e2e-guard"
    make_namespace(core, ns)
    apps.create_namespaced_deployment(ns, engine_deployment(ns, "chat-a", GOOD_GPU, "chat"))
    apps.create_namespaced_deployment(ns, engine_deployment(ns, "chat-b", BAD_GPU, "chat"))
    originals = {n: sanitized(apps, ns, n)["spec"]["template"] for n in ("chat-a", "chat-b")}
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           policy("chat", ns, "chat", prometheus.url, [1], "regimeAware",
                                                  ["50%", "100%"]))
    st = wait_phase(custom, ns, "chat", {"Succeeded", "RolledBack", "Failed", "NotACandidate"}, 480,
                    operator_pod)
    assert st["phase"] == "RolledBack", (st.get("message"), st.get("guard"),
                                         [(e.reason, e.message) for e in events_of(core, ns, "chat")],
                                         [(j.metadata.name, j.metadata.labels, j.spec.template.spec.containers[0].args)
                                          for j in batch.list_namespaced_job(ns).items], operator_pod.log()[-3000:])
    # measured only at batch 1: lookahead is enabled up to 1 only (never beyond the largest measured win)
    assert st["decision"]["action"] == "PromoteRegimeAware"
    assert st["rollback"]["reason"] == "GuardRegression"
    assert sorted(st["rollback"]["restored"]) == [f"{ns}/chat-a", f"{ns}/chat-b"]
    reasons = wait_for(lambda: (r := [e.reason for e in events_of(core, ns, "chat")]).count("Restored") >= 2 and r,
                       timeout=30, what="Restored events")
    assert reasons.count("Promoted") == 2 and reasons.count("Restored") == 2
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        assert d["spec"]["template"] == originals[name]
        assert b.ANNOTATION_ORIGINAL_TEMPLATE not in (d["metadata"].get("annotations") or {})
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")
