"""Two operator replicas, as the chart runs them with `replicaCount=2` and `peering.enabled=true`
(Kopf peering): one acts and the other waits; deleting the active replica's Pod mid-measurement
hands the rollout over; never are two replicas acting at once (issue 12).

Before the fix, both replicas ran at Kopf's default priority 0, and Kopf pauses *every* operator
that sees a peer of the same priority: two replicas served nothing at all. Each replica now takes
a distinct priority from its pod name (`handlers.peering_priority`)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from lookahead_operator.runtime.handlers import peering_priority
from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import wait_for

from .conftest import OperatorPod
from .helpers import GOOD_GPU, apply_policy, deploy_fleet, get_policy, policy

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
PAUSED, RESUMED = "Pausing operations in favour of", "Resuming operations after the pause"


def _acting(log: str) -> bool:
    """Whether a replica's log (so far) ends in the acting state. A replica starts paused until it
    has seen its peers, and logs only the changes: acting once it resumed after its last pause."""
    return log.rfind(RESUMED) > log.rfind(PAUSED)


def test_two_replicas_one_acts_and_killing_it_hands_over(devcluster, crd_installed, real_node, prometheus, kube_api,
                                                          reliability):
    reliability.expect(
        "Two operator replicas with Kopf peering (the chart's replicaCount=2, peering.enabled); the active "
        "replica's Pod deleted (grace 0) mid-measurement",
        "the lower-priority replica pauses and never acts while the other does; after the kill a replica takes "
        "over within the peering lifetime (20 s) plus start-up and the rollout completes; no invariant violation")
    core, apps, custom = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)
    op = OperatorPod(devcluster, real_node)
    op.install("--set", "replicaCount=2", "--set", "peering.enabled=true")
    try:
        pods = wait_for(lambda: p if len(p := op.pods()) == 2 else None, timeout=60, what="two operator replicas")
        prio = {p: peering_priority(p) for p in pods}
        assert len(set(prio.values())) == 2, prio
        active, waiting = max(pods, key=prio.get), min(pods, key=prio.get)
        wait_for(lambda: _acting(op.pod_log(active)), timeout=60, what=f"{active} acting", interval=1.0)
        assert not _acting(op.pod_log(waiting)), "the lower priority waits"

        ns = "e2e-peering"
        deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
        apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1], "analysisOnly", ["100%"]))
        wait_for(lambda: (get_policy(custom, ns, "chat").get("status") or {}).get("phase") == "Measuring",
                 timeout=180, what="measuring", interval=1.0)
        assert f"{ns}/chat: phase" in op.pod_log(active)
        assert f"{ns}/chat" not in op.pod_log(waiting), "the paused replica never acted"

        t_kill = time.monotonic()
        core.delete_namespaced_pod(active, op.NAMESPACE, grace_period_seconds=0)

        def taken_over():
            for p in op.pods():
                if p != active and _acting(log := op.pod_log(p)) and f"{ns}/chat: phase" in log:
                    return p
            return None

        successor = wait_for(taken_over, timeout=180, what="a replica acting on the policy again", interval=1.0)
        handover = time.monotonic() - t_kill
        st = wait_for(lambda: s if (s := get_policy(custom, ns, "chat").get("status") or {}).get("phase") in TERMINAL
                      else None, timeout=300, what="the rollout ends", interval=1.0)
        logs = {p: op.pod_log(p) for p in op.pods()}
        acting = [p for p, log in logs.items() if _acting(log)]
        reliability.observed(f"{waiting} paused while {active} acted; {active} deleted in Measuring; {successor} "
                             f"carried the policy to its next phase {handover:.0f} s later; {st['phase']} "
                             f"({(st.get('decision') or {}).get('action')}); replicas acting at the end: "
                             f"{len(acting)} of {len(logs)}", injected=1)
        assert st["phase"] == "Succeeded", st.get("message")
        assert len(acting) == 1, {p: log[-1500:] for p, log in logs.items()}
    finally:
        # The policy's finalizer needs an operator: its namespace goes before the operators do.
        try:
            core.delete_namespace("e2e-peering")
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        wait_for(lambda: "e2e-peering" not in {n.metadata.name for n in core.list_namespace().items}, timeout=120,
                 what="e2e-peering deleted while an operator runs", interval=1.0)
        op.uninstall()
