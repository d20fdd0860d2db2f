"""The shipped example, as a user applies it: examples/fleet-deployment.yaml and
examples/chat-fleet.yaml verbatim, every default of the policy kept.

The operator is installed by `helm install` of the chart as a Pod on the real node, and every
Pod of the example runs there. The policy is applied as shipped: its Prometheus URL,
``http://prometheus.monitoring:9090``, is the e2e Prometheus's Service on the test node (CoreDNS
resolves it, kube-proxy routes it). The fleet file is applied as shipped but for one thing, the
registry: the node pulls ``ghcr.io/lookahead-rollout/...`` from its own registry
(``lookahead_dev.registry``), where the same path and tag are pushed, as a user who builds and
pushes the images to their registry does (README, "Install on a real cluster", which
tests/e2e/test_readme.py runs with a ``sed`` of the registry). Its reference fleet is the real
thing: the engine image's numpy runtime serving SmolLM2-135M-Instruct, whose weights the image
ships, on this machine's two cores, at the CPU request the example asks for.

Its documented outcome (the example's comments, docs/operator.md): the Jacobi settings, sized for
a GPU's spare parallel compute, make every token slower on the reference fleet's CPUs, so the
policy measures a loss at its first batch size and rolls back, and the fleet is never touched.
The numbers are real, so the test asserts what they must show (the canary slower per token than
the control, by far: 118 vs 40 ms a token at batch 1 in one run here), not a recorded value. The vLLM Deployment of the example stays Pending (its GPU request fits no node
here), as the example intends: it is not a target.

The fleet serves production traffic through the example's Service throughout (the canary and the
control beside it on the same two cores), and no user request may fail; deleting the policy
leaves nothing behind.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from lookahead_operator.controller import builders as b
from lookahead_dev.devcluster import wait_for
from lookahead_dev.registry import local_reference
from lookahead_dev.traffic import ProductionTraffic
from lookahead_operator.api.policy import LookaheadPolicy

from .helpers import (GROUP, PLURAL, VERSION, apply_policy, assert_no_failed_requests, events_of, get_policy,
                      no_leftovers, sanitized)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def fleet_docs() -> list[dict]:
    """examples/fleet-deployment.yaml, the reference engine's image from the node's registry."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "fleet-deployment.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "chat-reference":
            c = d["spec"]["template"]["spec"]["containers"][0]
            assert c["image"].startswith("ghcr.io/lookahead-rollout/lookahead-rollout-engine:"), c["image"]
            assert "--model=smollm2" in c["args"], "the example serves the model its image ships"
            c["image"] = local_reference(c["image"])
            assert "imagePullPolicy" not in c  # the kubelet pulls it from the registry
    return docs


def test_shipped_example_with_its_defaults_reaches_its_documented_outcome(apis, operator_pod, prometheus, tmp_path):
    apps, core, custom, batch = apis
    for d in fleet_docs():
        if d["kind"] == "Namespace":
            core.create_namespace(d)
        elif d["kind"] == "Service":
            core.create_namespaced_service(d["metadata"]["namespace"], d)
        else:
            apps.create_namespaced_deployment(d["metadata"]["namespace"], d)
    body = yaml.safe_load((EXAMPLES / "chat-fleet.yaml").read_text())
    # The policy exactly as shipped: its Prometheus URL, http://prometheus.monitoring:9090, is the
    # e2e Prometheus's Service (tests/conftest.py), resolved by CoreDNS and routed by kube-proxy.
    assert body["spec"]["analysis"]["prometheus"]["url"] == prometheus.service_url
    spec = LookaheadPolicy.from_body(body).spec
    assert spec.load.batch_sizes is None, "the example measures the fleet's own batch sizes (auto)"
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    before = sanitized(apps, ns, "chat-reference")
    untouched = sanitized(apps, ns, "chat-vllm")
    # The fleet serves its users through the example's Service from before the policy is applied
    # to after it is deleted: no request may fail on the way (canary and control created beside
    # it on the same two cores and driven at batch sizes up to 8, then removed).
    svc = core.read_namespaced_service("chat", ns)
    wait_for(lambda: (apps.read_namespaced_deployment("chat-reference", ns).status.ready_replicas or 0) == 2,
             timeout=240, what="chat-reference's two pods ready (the engine image pulled, SmolLM2 loaded)",
             interval=1.0)
    # Users at the rate two quarter-core replicas of a 135M model on CPUs serve beside a canary and
    # a control driven at batch 8 on the same two cores: one chat or summary (96-128 tokens) every
    # 10 s, each allowed 120 s. (The helper's default, one request a second of up to 256 tokens
    # within 60 s, is for the simulated fleets: ~150 tokens a second, several times what these
    # pods produce here, so the queue would grow without bound.)
    traffic = ProductionTraffic(f"http://{svc.spec.cluster_ip}", out=tmp_path / "traffic.jsonl", schedule="0:0.1",
                                mix="chat=1,summarize=1", seed=7, timeout=120, log=tmp_path / "traffic.log").start()
    traffic.wait_requests(1, timeout=180, ok=True)
    t0 = time.time()
    with traffic:
        apply_policy(custom, body)

        def decided():
            st = get_policy(custom, ns, name).get("status") or {}
            if st.get("phase") in ("Failed", "NotACandidate") or st.get("decision"):
                return st
            return None

        # Auto batch sizes with no fleet history are [1, 8]: at most two steps of 2m each, plus launch.
        st = wait_for(decided, timeout=600, interval=2.0, what=f"{ns}/{name} decided")
        assert st["progress"]["batchSizes"] == [1, 8], st.get("message")
        rows = {r["batchSize"]: r for r in st["batches"]}
        one = rows.get(1)
        assert one is not None, json.dumps(st["batches"], indent=1)
        # The documented outcome, from real numbers: every token slower with lookahead on the CPUs
        # (the margin is wide: ~3x here), so the first batch size loses and the policy rolls back.
        assert one["verdict"] in ("Regresses", "NoGain"), json.dumps(one, indent=1)
        assert one["canaryTpotMs"] > 1.3 * one["controlTpotMs"], json.dumps(one, indent=1)
        assert one["samples"]["control"] >= spec.load.min_samples_per_step, one["samples"]
        assert one["acceptanceRate"] is not None and 0 <= one["acceptanceRate"] <= 1, one
        if 8 in rows:  # measured if batch 1's step was still open when batch 8's began
            assert rows[8]["verdict"] in ("Regresses", "NoGain"), json.dumps(rows[8], indent=1)
        assert st["decision"]["action"] == "Rollback", st["decision"]
        assert st["decision"]["reason"]
        st = wait_for(lambda: (s := get_policy(custom, ns, name).get("status") or {}).get("phase") == "RolledBack"
                      and s, timeout=120, interval=1.0, what="phase RolledBack")
        # never promoted: the fleet as the user left it, no wave, no saved template left on it
        d = sanitized(apps, ns, "chat-reference")
        assert d["spec"] == before["spec"]
        assert not set(b.TARGET_ANNOTATIONS) & set(d["metadata"].get("annotations") or {})
        assert not any(e.reason == "Promoted" for e in events_of(core, ns, name))
        assert not apps.list_namespaced_deployment(ns, label_selector=f"{b.LABEL_ROLE}=wave").items
        wait_for(lambda: no_leftovers(apps, batch, ns, name), timeout=90, what="canary/control/Jobs removed")

        # Deleting the policy leaves nothing behind and the fleet as it was.
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

        def gone():
            try:
                get_policy(custom, ns, name)
                return False
            except client.ApiException as exc:
                return exc.status == 404

        wait_for(gone, timeout=120, interval=1.0, what="policy deleted (finalizer ran)")
        assert sanitized(apps, ns, "chat-reference")["spec"] == before["spec"]
        assert sanitized(apps, ns, "chat-vllm")["spec"] == untouched["spec"], "not a target: never touched"
        wait_for(lambda: (apps.read_namespaced_deployment("chat-reference", ns).status.ready_replicas or 0) == 2,
                 timeout=60, what="chat-reference still at two serving pods", interval=1.0)
    print(f"\nthe shipped example on SmolLM2 (CPU): batch 1 control {one['controlTpotMs']:.1f} ms/token, canary "
          f"{one['canaryTpotMs']:.1f} ms/token, acceptance {one['acceptanceRate']:.2f}; {st['decision']['action']}: "
          f"{st['decision']['reason']}\nproduction traffic through it: "
          f"{assert_no_failed_requests(traffic, t0, 'measurement, rollback, deletion')}")
