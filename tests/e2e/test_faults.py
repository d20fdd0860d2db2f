"""Faults the typed core must turn into states, end to end (real operator, apiserver, Prometheus,
engines):

* a promoted template that never becomes available (a ResourceQuota leaves no room for the
  rolling update's surge pod) -> the Deployment controller's ProgressDeadlineExceeded -> the
  policy rolls back and the template is restored exactly;
* a promoted template whose pods crash on the real kubelet (part of the fleet runs an engine
  build that exits on the lookahead flags) -> CrashLoopBackOff -> ProgressDeadlineExceeded ->
  rolled back, the template restored exactly, the old pods serving throughout;
* Prometheus unreachable for longer than the analysis deadline while measuring -> Inconclusive
  at the deadline, the fleet untouched; unreachable briefly -> the policy resumes and decides;
* pause and resume mid-step -> never more than one load Job per role, clocks frozen, nothing
  duplicated.

Prometheus "outages" cut the operator's path to the real Prometheus with a TCP proxy that
refuses connections while down (Prometheus itself keeps scraping, as when a network path or a
Service breaks).
The scenarios run at the same time, each in its own namespaces, on the module's one operator
(tests/e2e/together.py): each fault is local to its scenario (its own proxy, quota, pod).
"""

from __future__ import annotations

import socket
import threading
from datetime import datetime

import pytest

from lookahead_operator.controller import builders as b
from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import free_port, wait_for

from . import together
from .helpers import (FLEET, GOOD_GPU, apply_policy, conditions, deploy_fleet, engine_deployment, events_of,
                      get_policy, make_namespace, no_leftovers, policy, sanitized, saved_templates, wait_phase)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

scenarios = together.Scenarios()


@pytest.fixture(scope="module")
def running(request, kube_api, operator_process, prometheus, tmp_path_factory):
    yield from scenarios.run(request, kube_api, tmp_path_factory, operator_process=operator_process,
                             prometheus=prometheus)


class Outage:
    """A TCP proxy to Prometheus that can be taken down (connections refused, open ones cut)."""

    def __init__(self, upstream_url: str):
        host, port = upstream_url.split("//", 1)[1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client_sock, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client_sock.close()
                continue
            with self._lock:
                self._conns += [client_sock, upstream]
            for a, z in ((client_sock, upstream), (upstream, client_sock)):
                threading.Thread(target=self._pipe, args=(a, z), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@scenarios.add
def promoted_template_that_cannot_roll_out_is_restored_exactly(apis, operator_process,
                                                               prometheus, reliability) -> None:
    reliability.expect("A promoted template cannot roll out (a ResourceQuota refuses the surge pod)",
                       "RolledBack with RolloutFailed on the Deployment's own ProgressDeadlineExceeded, well inside "
                       "the rollout deadline; both targets restored exactly")
    apps, core, custom, batch = apis
    ns_a, ns_b = "fault-rollout-a", "fault-rollout-b"
    for ns in (ns_a, ns_b):
        make_namespace(core, ns)
    apps.create_namespaced_deployment(ns_a, engine_deployment(ns_a, "chat-a", GOOD_GPU, "chat"))
    stuck = engine_deployment(ns_b, "chat-b", GOOD_GPU, "chat")
    stuck["spec"]["progressDeadlineSeconds"] = 10
    apps.create_namespaced_deployment(ns_b, stuck)
    wait_for(lambda: (apps.read_namespaced_deployment("chat-b", ns_b).status.ready_replicas or 0) == 1,
             timeout=60, what="chat-b ready")
    # chat-b's namespace has room for exactly its one pod: the promoted template's surge pod is refused.
    core.create_namespaced_resource_quota(ns_b, {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}})
    originals = {ns: sanitized(apps, ns, n) for ns, n in ((ns_a, "chat-a"), (ns_b, "chat-b"))}
    body = policy("chat", ns_a, "chat", prometheus.url, [1], "regimeAware", ["100%"])
    body["spec"]["targets"]["namespaces"] = [ns_a, ns_b]
    apply_policy(custom, body)
    st = wait_phase(custom, ns_a, "chat", TERMINAL, 420, operator_process)
    reliability.observed(f"{st['phase']} ({(st.get('rollback') or {}).get('reason')}): "
                         f"{(st.get('rollback') or {}).get('message', '')[:160]}", injected=1)
    assert st["decision"]["action"] == "PromoteRegimeAware", st["decision"]["reason"]
    assert st["phase"] == "RolledBack" and st["rollback"]["reason"] == "RolloutFailed", st.get("message")
    assert f"{ns_b}/chat-b" in st["rollback"]["message"] and "progress" in st["rollback"]["message"].lower()
    assert sorted(st["rollback"]["restored"]) == [f"{ns_a}/chat-a", f"{ns_b}/chat-b"]
    # well inside the rollout deadline: the Deployment's own verdict was enough
    since = datetime.fromisoformat(st["decision"]["decidedAt"].replace("Z", "+00:00"))
    at = datetime.fromisoformat(st["rollback"]["at"].replace("Z", "+00:00"))
    assert (at - since).total_seconds() < 120
    for ns, name in ((ns_a, "chat-a"), (ns_b, "chat-b")):
        d = sanitized(apps, ns, name)
        assert d["spec"]["template"] == originals[ns]["spec"]["template"], "restored exactly"
        assert not {b.ANNOTATION_OWNER, b.ANNOTATION_ORIGINAL_TEMPLATE, b.ANNOTATION_PROMOTED} & set(
            d["metadata"].get("annotations") or {})
    assert "WaveReady" not in conditions(st)
    wait_for(lambda: no_leftovers(apps, batch, ns_a, "chat"), timeout=60, what="canary/control/Jobs removed")


@scenarios.add
def prometheus_down_past_the_deadline_ends_inconclusive_with_the_fleet_untouched(apis, operator_process,
                                                                                 prometheus, reliability) -> None:
    reliability.expect("Prometheus unreachable from the operator for longer than the analysis deadline, "
                       "while measuring", "Inconclusive exactly at the deadline (2 m), MetricsAvailable=False "
                       "meanwhile, the fleet never touched")
    apps, core, custom, batch = apis
    ns = "fault-prom-long"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    before = sanitized(apps, ns, "chat-a")
    outage = Outage(prometheus.url)
    outage.down()
    body = policy("chat", ns, "chat", outage.url, [1], "full", ["100%"])
    body["spec"]["analysis"]["deadline"] = "2m"
    apply_policy(custom, body)

    def measuring_without_metrics():
        st = get_policy(custom, ns, "chat").get("status") or {}
        c = conditions(st).get("MetricsAvailable")
        return st if st.get("phase") == "Measuring" and c and c["status"] == "False" else None

    st = wait_for(measuring_without_metrics, timeout=120, interval=1.0, what="measuring with Prometheus down")
    assert "connect" in conditions(st)["MetricsAvailable"]["message"].lower()
    st = wait_phase(custom, ns, "chat", TERMINAL, 300, operator_process)
    reliability.observed(f"{st['phase']} ({st['decision']['action']}) decided "
                         f"{(datetime.fromisoformat(st['decision']['decidedAt'].replace('Z', '+00:00')) - datetime.fromisoformat(st['progress']['measuringSince'].replace('Z', '+00:00'))).total_seconds():.0f} s "
                         f"after measuring began", injected=1)
    assert st["phase"] == "Failed" and st["decision"]["action"] == "Inconclusive", st.get("message")
    measuring_since = datetime.fromisoformat(st["progress"]["measuringSince"].replace("Z", "+00:00"))
    decided = datetime.fromisoformat(st["decision"]["decidedAt"].replace("Z", "+00:00"))
    assert 120 <= (decided - measuring_since).total_seconds() < 150, "ended at the deadline, not before or long after"
    assert not any(e.reason == "Promoted" for e in events_of(core, ns, "chat"))
    d = sanitized(apps, ns, "chat-a")
    assert d["spec"] == before["spec"], "the fleet was never touched"
    assert b.ANNOTATION_OWNER not in (d["metadata"].get("annotations") or {})
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


@scenarios.add
def prometheus_down_briefly_then_the_policy_decides(apis, operator_process, prometheus, reliability) -> None:
    reliability.expect("Prometheus unreachable briefly while measuring",
                       "MetricsAvailable=False during the outage; the policy resumes and decides as without it "
                       "(a win at batch 1)")
    apps, core, custom, batch = apis
    ns = "fault-prom-brief"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    outage = Outage(prometheus.url)
    apply_policy(custom, policy("chat", ns, "chat", outage.url, [1], "analysisOnly", ["100%"]))
    wait_for(lambda: (get_policy(custom, ns, "chat").get("status") or {}).get("phase") == "Measuring",
             timeout=120, interval=0.5, what="measuring")
    outage.down()

    def metrics_unavailable():
        st = get_policy(custom, ns, "chat").get("status") or {}
        c = conditions(st).get("MetricsAvailable")
        return st if c and c["status"] == "False" else None

    st = wait_for(metrics_unavailable, timeout=60, interval=0.5, what="the outage seen")
    assert st["phase"] == "Measuring"
    outage.up()
    st = wait_phase(custom, ns, "chat", TERMINAL, 300, operator_process)
    reliability.observed(f"outage seen (MetricsAvailable=False); then {st['phase']} ({st['decision']['action']}), "
                         f"batch 1 {st['batches'][0]['verdict']}", injected=1)
    # (measured at batch 1 only: a win there enables lookahead up to batch 1, no further)
    assert st["phase"] == "Succeeded" and st["decision"]["action"] == "PromoteRegimeAware", st.get("message")
    assert st["batches"][0]["verdict"] == "Wins"
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


@scenarios.add
def pause_and_resume_mid_step_freeze_clocks_and_never_double_the_load(apis, operator_process,
                                                                      prometheus, reliability) -> None:
    reliability.expect("Paused mid-step for longer than a step, then resumed",
                       "load stopped and status frozen while paused; the deadline clock shifted by exactly the "
                       "pause; never more than one load Job per role; Succeeded")
    apps, core, custom, batch = apis
    ns = "fault-pause"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1, 16], "analysisOnly", ["100%"]))
    sel = f"{b.LABEL_POLICY}=chat,{b.LABEL_ROLE}=loadgen"
    most = {"n": 0}
    stop = threading.Event()

    def watch_jobs():
        while not stop.is_set():
            live = [j for j in batch.list_namespaced_job(ns, label_selector=sel).items if not j.metadata.deletion_timestamp]
            per_role: dict[str, int] = {}
            for j in live:
                role = j.metadata.labels.get(b.LABEL_DRIVES)
                per_role[role] = per_role.get(role, 0) + 1
            most["n"] = max([most["n"], *per_role.values()])
            stop.wait(0.3)

    watcher = threading.Thread(target=watch_jobs, daemon=True)
    watcher.start()
    try:
        def loaded():
            st = get_policy(custom, ns, "chat").get("status") or {}
            jobs = batch.list_namespaced_job(ns, label_selector=sel).items
            return st if st.get("phase") == "Measuring" and jobs else None

        st = wait_for(loaded, timeout=120, interval=0.5, what="measuring under load")
        before = st["progress"]
        subprocess_run(["pause", "chat", "-n", ns], operator_process.kubeconfig)

        def paused():
            st = get_policy(custom, ns, "chat").get("status") or {}
            c = conditions(st).get("Paused")
            live = [j for j in batch.list_namespaced_job(ns, label_selector=sel).items if not j.metadata.deletion_timestamp]
            return st if c and c["status"] == "True" and not live else None

        st = wait_for(paused, timeout=60, interval=0.5, what="paused with the load stopped")
        paused_at = datetime.fromisoformat(st["progress"]["pausedAt"].replace("Z", "+00:00"))
        # Paused past the step's whole duration: nothing moves.
        held = st["progress"]
        wait_for(lambda: (datetime.now().astimezone() - paused_at).total_seconds() > 65, timeout=90, interval=1.0,
                 what="a pause longer than the step")
        st = get_policy(custom, ns, "chat")["status"]
        assert st["phase"] == "Measuring" and st["progress"] == held, "paused means frozen"
        assert not [j for j in batch.list_namespaced_job(ns, label_selector=sel).items if not j.metadata.deletion_timestamp]
        subprocess_run(["resume", "chat", "-n", ns], operator_process.kubeconfig)

        def resumed():
            st = get_policy(custom, ns, "chat").get("status") or {}
            return st if st.get("progress", {}).get("pausedAt") is None and conditions(st).get("Paused", {}).get(
                "status") == "False" else None

        st = wait_for(resumed, timeout=60, interval=0.5, what="resumed")
        after = st["progress"]
        resumed_at = datetime.fromisoformat(after["stepStartedAt"].replace("Z", "+00:00"))
        gap = (resumed_at - paused_at).total_seconds()
        shift = (datetime.fromisoformat(after["measuringSince"].replace("Z", "+00:00"))
                 - datetime.fromisoformat(before["measuringSince"].replace("Z", "+00:00"))).total_seconds()
        assert abs(shift - gap) <= 1, "the deadline clock skipped exactly the pause"
        assert after["loadRun"] > before["loadRun"], "the step's load starts afresh after the pause"
        if after["step"] != before["step"]:
            # the windows measured before the pause were already conclusive: the resumed step settled at
            # once (anytime-valid: it may stop early), and only with a verdict
            rows = {r["batchSize"]: r for r in st.get("batches") or []}
            assert rows.get(1, {}).get("verdict") in ("Wins", "NoGain", "Regresses"), st.get("batches")
        st = wait_phase(custom, ns, "chat", TERMINAL, 420, operator_process)
        reliability.observed(f"frozen while paused; clock shift {shift:.0f} s for a {gap:.0f} s pause; "
                             f"{st['phase']}; most load Jobs per role {most['n']}", injected=1)
        assert st["phase"] == "Succeeded", st.get("message")
    finally:
        stop.set()
        watcher.join(5)
    assert most["n"] == 1, "never more than one load Job per role"
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


def subprocess_run(args: list[str], kubeconfig: str) -> None:
    """The user's own command: `kubectl lookahead pause|resume`."""
    import os
    import subprocess
    import sys

    from .conftest import REPO

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    out = subprocess.run([sys.executable, "-m", "lookahead_operator.cli.main", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# An engine image whose entrypoint predates lookahead: it exits at start-up when given the flags
# (as an engine does on an unknown argument). The script is mounted from a ConfigMap and run in
# exec form, so the operator appends its flags to the container's args, which reach it as "$@".
OLD_ENTRYPOINT = """#!/bin/sh
for a in "$@"; do
  case "$a" in --speculative-config*) echo "engine: error: unrecognized arguments: $a" >&2; exit 2;; esac
done
exec python3 -m lookahead_canary.server "$@"
"""


@scenarios.add
def promoted_pods_that_crashloop_on_the_kubelet_are_rolled_back_exactly(apis, operator_process,
                                                                        prometheus, reliability) -> None:
    reliability.expect("The promoted template's pods crash on the kubelet (part of the fleet runs an engine that "
                       "exits on the lookahead flags)", "RolledBack with RolloutFailed; both targets restored "
                       "exactly; the old pod serves throughout")
    apps, core, custom, batch = apis
    ns = "fault-crashloop"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    old = engine_deployment(ns, "chat-b", GOOD_GPU, "chat")
    old["spec"]["progressDeadlineSeconds"] = 15
    core.create_namespaced_config_map(ns, {"metadata": {"name": "old-entrypoint"},
                                           "data": {"entrypoint.sh": OLD_ENTRYPOINT}})
    pod = old["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "entrypoint", "configMap": {"name": "old-entrypoint"}}]
    c = pod["containers"][0]
    c["command"] = ["/bin/sh", "/entrypoint/entrypoint.sh"]
    c["volumeMounts"] = [{"name": "entrypoint", "mountPath": "/entrypoint", "readOnly": True}]
    apps.create_namespaced_deployment(ns, old)
    for name in ("chat-a", "chat-b"):
        wait_for(lambda n=name: (apps.read_namespaced_deployment(n, ns).status.ready_replicas or 0) == 1,
                 timeout=90, what=f"{name} ready")
    originals = saved_templates(apps, ns, FLEET)
    serving = {p.metadata.name for p in core.list_namespaced_pod(ns, label_selector="fleet=chat-b").items}
    # chat-a is the first target: the canary is cloned from it and measures a win; the second wave
    # promotes chat-b, whose new pods exit on the flags.
    apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1], "regimeAware", ["50%", "100%"]))
    crashed = []

    def crashlooping():
        for p in core.list_namespaced_pod(ns, label_selector="fleet=chat-b").items:
            for cs in p.status.container_statuses or []:
                if cs.restart_count >= 1 or (cs.state.waiting and cs.state.waiting.reason == "CrashLoopBackOff"):
                    crashed.append((p.metadata.name, cs.restart_count, cs.state.waiting and cs.state.waiting.reason))
                    return True
        return (get_policy(custom, ns, "chat").get("status") or {}).get("phase") in TERMINAL

    wait_for(crashlooping, timeout=420, interval=1.0, what="chat-b's promoted pods crashing")
    st = wait_phase(custom, ns, "chat", TERMINAL, 240, operator_process)
    reliability.observed(f"pods crashed ({crashed[:1]}); {st['phase']} "
                         f"({(st.get('rollback') or {}).get('reason')}), restored "
                         f"{(st.get('rollback') or {}).get('restored')}", injected=1)
    assert crashed, "the promoted pods were seen restarting on the kubelet"
    assert st["decision"]["action"] == "PromoteRegimeAware", st["decision"]["reason"]
    assert st["phase"] == "RolledBack" and st["rollback"]["reason"] == "RolloutFailed", (st.get("message"),
                                                                                         st.get("rollback"))
    assert f"{ns}/chat-b" in st["rollback"]["message"]
    assert sorted(st["rollback"]["restored"]) == [f"{ns}/chat-a", f"{ns}/chat-b"]
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        assert d["spec"]["template"] == originals[name], "restored exactly"
        assert not {b.ANNOTATION_OWNER, b.ANNOTATION_ORIGINAL_TEMPLATE, b.ANNOTATION_PROMOTED} & set(
            d["metadata"].get("annotations") or {})
    # the old pod kept serving through the failed rollout (maxUnavailable of a 1-replica Deployment is 0)
    still = {p.metadata.name for p in core.list_namespaced_pod(ns, label_selector="fleet=chat-b").items
             if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])}
    assert serving & still, (serving, still)
    wait_for(lambda: (apps.read_namespaced_deployment("chat-b", ns).status.ready_replicas or 0) == 1
             and not [p for p in core.list_namespaced_pod(ns, label_selector="fleet=chat-b").items
                      if any((cs.restart_count or 0) > 0 for cs in p.status.container_statuses or [])],
             timeout=120, what="the crashing pods gone after the restore")
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="canary/control/Jobs removed")


# the tests: each waits for its scenario, all started together by ``running``

def test_promoted_template_that_cannot_roll_out_is_restored_exactly(running, request, reliability):
    running.result(request)


def test_prometheus_down_past_the_deadline_ends_inconclusive_with_the_fleet_untouched(running, request, reliability):
    running.result(request)


def test_prometheus_down_briefly_then_the_policy_decides(running, request, reliability):
    running.result(request)


def test_pause_and_resume_mid_step_freeze_clocks_and_never_double_the_load(running, request, reliability):
    running.result(request)


def test_promoted_pods_that_crashloop_on_the_kubelet_are_rolled_back_exactly(running, request, reliability):
    running.result(request)
