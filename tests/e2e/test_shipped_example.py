"""The shipped example, as a user applies it: examples/fleet-deployment.yaml and
examples/chat-fleet.yaml with every default of the policy kept.

The operator is installed by `helm install` of the chart as a Pod on the real node, and every
Pod of the example runs there from the locally built images. The policy is applied verbatim: its
Prometheus URL, ``http://prometheus.monitoring:9090``, is the e2e Prometheus's Service on the test
node (CoreDNS resolves it, kube-proxy routes it). The fleet file is adapted to the test cluster,
and nothing else:
* the sample fleet's engine backend: the reference engine serves the roofline simulator instead
  of the SmolLM2 weights, so the true answer is known (computed below from the simulator);
* its CPU request: the example asks for 2 CPUs a replica, a real serving node's size; the test
  node is this 2-core machine, where two replicas plus a canary and a control could never be
  scheduled, so each asks for 100m (the simulator needs little);
* its image's registry: the node pulls ``ghcr.io/lookahead-rollout/...`` from its own registry
  (``lookahead_dev.registry``), where the same path and tag are pushed, as a user who builds and
  pushes the images to their registry does (README, "Install on a cluster").
The vLLM Deployment of the example stays Pending (its GPU request fits no node here), as the
example intends: it is not a target.

It must reach a decision, and the right one; then deleting the policy mid-rollout restores the
fleet exactly. The fleet serves production traffic through the example's Service throughout, and
no user request may fail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from lookahead_canary.simulator import RooflineSimulator
from lookahead_operator.controller import builders as b
from lookahead_dev.devcluster import wait_for
from lookahead_dev.registry import local_reference
from lookahead_operator.api.policy import LookaheadPolicy

from .helpers import (GOOD_GPU, GROUP, PLURAL, VERSION, apply_policy, assert_no_failed_requests, events_of,
                      get_policy, no_leftovers, production_traffic, sanitized)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def expected_outcome(sim_config: dict, batch_size: int, th_latency: float, th_throughput: float) -> str:
    """What the decision rule must conclude at a batch size, from the simulator's expected values
    (closed loop: throughput ratio = 1 / per-token latency ratio)."""
    sim = RooflineSimulator.from_json(json.dumps(sim_config))
    ratio = ((sim.expected_step_seconds(batch_size, True) / sim.expected_tokens_per_step(True))
             / (sim.expected_step_seconds(batch_size, False) / sim.expected_tokens_per_step(False)))
    latency_gain, throughput_change = 1 - ratio, 1 / ratio - 1
    # the test is only meaningful where the truth is far from the thresholds
    assert abs(latency_gain - th_latency) > 2 * th_latency and abs(throughput_change + th_throughput) > 2 * th_throughput
    if throughput_change < -th_throughput:
        return "Regresses"
    return "Wins" if latency_gain > th_latency else "NoGain"


def fleet_docs(sim: dict) -> list[dict]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "fleet-deployment.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "chat-reference":
            c = d["spec"]["template"]["spec"]["containers"][0]
            args = [a for a in c["args"] if not a.startswith("--model=")]
            c["args"] = ["--backend=simulate", f"--sim-config={json.dumps(sim)}"] + args
            c["resources"]["requests"]["cpu"] = "100m"
            c["image"] = local_reference(c["image"])
            assert "imagePullPolicy" not in c  # the kubelet pulls it from the registry
    return docs


def test_shipped_example_with_its_defaults_reaches_the_right_decision(apis, operator_pod, prometheus, tmp_path):
    apps, core, custom, batch = apis
    for d in fleet_docs(GOOD_GPU):
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
    # to after it is deleted: no request may fail on the way (canary and control created, the
    # first wave's pod started and the replica lent, the policy deleted and the fleet restored).
    svc = core.read_namespaced_service("chat", ns)
    wait_for(lambda: (apps.read_namespaced_deployment("chat-reference", ns).status.ready_replicas or 0) == 2,
             timeout=120, what="chat-reference's two pods ready", interval=1.0)
    traffic = production_traffic(f"http://{svc.spec.cluster_ip}", tmp_path, seed=7).start()
    traffic.wait_requests(3, timeout=60, ok=True)
    t0 = time.time()
    with traffic:
        apply_policy(custom, body)

        def decided():
            st = get_policy(custom, ns, name).get("status") or {}
            if st.get("phase") in ("Failed", "RolledBack", "NotACandidate") or st.get("decision"):
                return st
            return None

        # Auto batch sizes with no fleet history are [1, 8]; two steps of at most 2m each, plus launch.
        st = wait_for(decided, timeout=600, interval=2.0, what=f"{ns}/{name} decided")
        sizes = st["progress"]["batchSizes"]
        assert sizes == [1, 8], st.get("message")
        th_lat, th_tp = spec.analysis.min_latency_improvement, spec.analysis.max_throughput_regression
        truth = {bs: expected_outcome(GOOD_GPU, bs, th_lat, th_tp) for bs in sizes}
        assert truth == {1: "Wins", 8: "Regresses"}
        rows = {r["batchSize"]: r for r in st["batches"]}
        assert {bs: rows[bs]["verdict"] for bs in sizes} == truth, json.dumps(st["batches"], indent=1)
        assert st["decision"]["action"] == "PromoteRegimeAware", st["decision"]["reason"]
        assert st["decision"]["crossoverBatchSize"] == 8
        assert all(r["samples"]["control"] >= spec.load.min_samples_per_step for r in st["batches"])

        # The first wave (10% of the fleet's serving pods: one of chat-reference's two replicas) runs
        # the regime-capped config on one pod of chat-reference's wave Deployment, which chat-reference
        # lends a replica to; chat-reference's own template is not touched.
        def promoted():
            d = sanitized(apps, ns, "chat-reference")
            ann = d["metadata"].get("annotations") or {}
            return d if ann.get(b.ANNOTATION_PROMOTED) and ann.get(b.ANNOTATION_PROMOTED_PODS) == "1" else None

        d = wait_for(promoted, timeout=120, interval=1.0, what="one pod of chat-reference promoted")
        assert d["spec"]["replicas"] == 1 and d["spec"]["template"] == before["spec"]["template"]
        assert b.original_template(d) == before["spec"]["template"]
        waves = [w for w in apps.list_namespaced_deployment(ns, label_selector=f"{b.LABEL_ROLE}=wave").items
                 if w.metadata.labels.get(b.LABEL_POLICY) == name]
        assert len(waves) == 1 and waves[0].spec.replicas == 1, [w.metadata.name for w in waves]
        args = waves[0].spec.template.spec.containers[0].args
        # on up to the largest batch size measured as a win (1), off from there (loss measured at 8)
        assert "--speculative-config" in args and args[args.index("--lookahead-max-batch-size") + 1] == "1"
        # its pod serves behind the example's Service, as the fleet's own do
        assert all(waves[0].spec.template.metadata.labels.get(k) == v
                   for k, v in before["spec"]["selector"]["matchLabels"].items())

        # The first wave's guard chooses its mode. The example's fleet pods carry no scrape
        # annotation, so Prometheus has no series of theirs: the guard cannot see the users they
        # serve, falls back to driving a promoted pod and the control with its own load, and says
        # so as a Warning naming what to do (issue 24 gives the example a scraped fleet; with one,
        # the guard compares on its production traffic, as tests/e2e/test_lifecycle.py shows).
        st = wait_for(lambda: ((s := get_policy(custom, ns, name).get("status") or {}).get("progress") or {})
                      .get("guardMode") and s, timeout=180, interval=1.0, what="the guard's mode chosen")
        assert st["progress"]["guardMode"] == "synthetic", (st.get("guard"), st.get("message"))
        mode = wait_for(lambda: [e for e in events_of(core, ns, name) if e.reason == "GuardMode"], timeout=30,
                        interval=1.0, what="the GuardMode event")
        assert mode[0].type == "Warning" and "not scraped by Prometheus" in mode[0].message, mode[0].message

        # Deleting the policy mid-rollout puts the fleet back exactly and leaves nothing behind.
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

        def gone():
            try:
                get_policy(custom, ns, name)
                return False
            except client.ApiException as exc:
                return exc.status == 404

        wait_for(gone, timeout=120, interval=1.0, what="policy deleted (finalizer ran)")
        d = sanitized(apps, ns, "chat-reference")
        assert d["spec"]["template"] == before["spec"]["template"]
        assert d["spec"]["replicas"] == before["spec"]["replicas"] == 2, "the lent replica is given back"
        assert not set(b.TARGET_ANNOTATIONS) & set(d["metadata"].get("annotations") or {})
        assert sanitized(apps, ns, "chat-vllm")["spec"] == untouched["spec"], "not a target: never touched"
        wait_for(lambda: any(e.reason == "Restored" for e in events_of(core, ns, name)), timeout=30,
                 what="a Restored event (events are posted off the critical path)")
        wait_for(lambda: no_leftovers(apps, batch, ns, name), timeout=60, what="canary/control/Jobs removed")
        # the lent replica back and serving, the wave's pod gone: what users are left with
        wait_for(lambda: (apps.read_namespaced_deployment("chat-reference", ns).status.ready_replicas or 0) == 2
                 and not apps.list_namespaced_deployment(ns, label_selector=f"{b.LABEL_ROLE}=wave").items,
                 timeout=120, what="chat-reference back at two serving pods", interval=1.0)
    print(f"\nproduction traffic through the shipped example's rollout and deletion: "
          f"{assert_no_failed_requests(traffic, t0, 'decision, first wave, deletion')}")
