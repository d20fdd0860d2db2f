"""Engine faults mid-step, on the real node (issue 12):

* the canary's pod is deleted mid-step (an eviction, a drained node): its Deployment starts a new
  one; the step's load, aimed at the old pod's IP, reaches nothing -> the step starts again on
  fresh load Jobs aimed at the new pod (LoadRestarted) and the policy decides as without the fault.
  Before, the new pod was never driven and its idle windows read as canary stalls: a winning
  canary came out Regresses;
* the canary's engine hangs (every process of its container SIGSTOPped from the host: the kernel
  still accepts connections, nothing answers, not even /metrics) -> Prometheus gets no canary
  sample, so the step has no answer; it waits for data until the analysis deadline, which ends
  the rollout Inconclusive with nothing promoted (a safe, exact state, not a guess).
The scenarios run at the same time, each in its own namespaces, on the module's one operator
(tests/e2e/together.py): each fault is local to its scenario (its own proxy, quota, pod).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from lookahead_operator.controller import builders as b
from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import wait_for

from . import together
from .helpers import (GOOD_GPU, apply_policy, deploy_fleet, events_of, measuring_under_load, no_leftovers, policy,
                      sanitized, wait_phase)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

scenarios = together.Scenarios()


@pytest.fixture(scope="module")
def running(request, kube_api, operator_process, prometheus, tmp_path_factory):
    yield from scenarios.run(request, kube_api, tmp_path_factory, operator_process=operator_process,
                             prometheus=prometheus)


def _canary_pod(core, ns) -> str:
    pods = [p for p in core.list_namespaced_pod(ns, label_selector=f"{b.LABEL_ROLE}=canary").items
            if not p.metadata.deletion_timestamp and p.status.phase == "Running"]
    return pods[0].metadata.name if pods else ""


def _measured_a_while(custom, ns):
    st = measuring_under_load(custom, ns, "chat") or {}
    rows = st.get("batches") or []
    n = ((rows[0].get("samples") or {}).get("canary") or 0) if rows else 0
    return st if n >= 2 else None


@scenarios.add
def the_canary_pod_deleted_mid_step_restarts_the_step_on_fresh_load(apis, operator_process,
                                                                    prometheus, reliability) -> None:
    reliability.expect("The canary's pod deleted mid-step (grace 0); its Deployment starts a new one",
                       "LoadRestarted: the step starts again on load aimed at the new pod; the policy decides as "
                       "without the fault (batch 1 Wins, PromoteRegimeAware), fleet untouched (analysisOnly)")
    apps, core, custom, batch = apis
    ns = "fault-canary-pod"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    before = sanitized(apps, ns, "chat-a")["spec"]
    apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1], "analysisOnly", ["100%"]))
    st = wait_for(lambda: _measured_a_while(custom, ns), timeout=240, what="measuring with data", interval=1.0)
    run_before = st["progress"]["loadRun"]
    old = _canary_pod(core, ns)
    core.delete_namespaced_pod(old, ns, grace_period_seconds=0)
    wait_for(lambda: any(e.reason == "LoadRestarted" for e in events_of(core, ns, "chat")), timeout=60,
             what="the step's load restarted", interval=1.0)
    st = wait_phase(custom, ns, "chat", TERMINAL, 420, operator_process)
    new = _canary_pod(core, ns) if st["phase"] != "Succeeded" else "(deleted with the roles)"
    reliability.observed(f"LoadRestarted after {old} was deleted (loadRun {run_before} -> "
                         f"{st['progress'].get('loadRun')}); {st['phase']} ({st['decision']['action']}), batch 1 "
                         f"{st['batches'][0]['verdict']}; new canary {new}", injected=1)
    assert st["phase"] == "Succeeded" and st["decision"]["action"] == "PromoteRegimeAware", st.get("message")
    assert st["batches"][0]["verdict"] == "Wins", st["batches"]
    assert st["progress"]["loadRun"] > run_before
    assert sanitized(apps, ns, "chat-a")["spec"] == before, "analysisOnly: the fleet is untouched"
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


def _container_pids(pod: str) -> list[int]:
    """The host PIDs of a pod's container processes (the kubelet runs them on this machine; each
    has HOSTNAME=<pod name> in its environment)."""
    want = f"HOSTNAME={pod}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if want in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


@scenarios.add
def a_hung_canary_engine_ends_at_the_deadline_with_nothing_promoted(apis, operator_process,
                                                                    prometheus, reliability) -> None:
    reliability.expect("The canary's engine hangs mid-step (its processes SIGSTOPped: connections accepted, "
                       "nothing answered, /metrics included)", "no canary samples: no answer for the step; "
                       "Inconclusive at the analysis deadline (2 m here), nothing promoted, the fleet untouched")
    apps, core, custom, batch = apis
    ns = "fault-canary-hang"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    before = sanitized(apps, ns, "chat-a")["spec"]
    body = policy("chat", ns, "chat", prometheus.url, [1], "regimeAware", ["100%"])
    body["spec"]["analysis"]["deadline"] = "2m"   # (the test's 6 m default would only make it longer)
    apply_policy(custom, body)
    wait_for(lambda: _measured_a_while(custom, ns), timeout=240, what="measuring with data", interval=1.0)
    pod = _canary_pod(core, ns)
    pids = _container_pids(pod)
    assert pids, f"no host process of {pod}"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        st = wait_phase(custom, ns, "chat", TERMINAL, 420, operator_process)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    row = (st.get("batches") or [{}])[0]
    reliability.observed(f"{len(pids)} processes of {pod} stopped; {st['phase']} ({st['decision']['action']}): "
                         f"batch 1 {row.get('verdict')}; {st['decision'].get('reason', '')[:120]}", injected=1)
    assert st["decision"]["action"] == "Inconclusive" and st["phase"] == "Failed", (st["phase"], st["decision"])
    assert row.get("verdict") != "Wins", row
    assert not any(e.reason == "Promoted" for e in events_of(core, ns, "chat"))
    assert sanitized(apps, ns, "chat-a")["spec"] == before, "nothing was promoted"
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


# the tests: each waits for its scenario, all started together by ``running``

def test_the_canary_pod_deleted_mid_step_restarts_the_step_on_fresh_load(running, request, reliability):
    running.result(request)


def test_a_hung_canary_engine_ends_at_the_deadline_with_nothing_promoted(running, request, reliability):
    running.result(request)
