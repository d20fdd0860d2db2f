"""`make bench-operator`: one operator process, many concurrent LookaheadPolicies, on the real
local control plane.

For each size N, in a fresh cluster, in this order:
1. start: the operator starts on a cluster holding N + N + probes namespaces with a target
   Deployment each; one *warm-up* policy carried to its canary says it is up (Kopf lists every
   watched kind before any handler runs): "operator start -> first canary";
2. burst: N active policies applied back to back as fast as this process can create them,
   then N finished ones; apply -> canary per active policy ("burst", with first apply -> last
   canary), the CPU seconds each process spent, and the operator's requests by kind;
3. steady window (``--steady`` s): API requests per policy per minute, active and finished,
   counted from the kube-apiserver's own audit log (every request whose user agent is the
   operator's: Kopf's or our client's); the operator's resident memory (psutil, median);
4. probes: ``--probes`` more policies applied one at a time to the operator holding all the
   above, each waiting for its canary: apply -> canary (median, p95) of one policy on an operator
   at N policies. This is the headline latency (issue 13's "apply-to-canary p95 at 500 policies"):
   the burst's figure measures how fast N policies at once drain through the API server and the
   operator on this machine (queueing), not how fast the operator reacts to one.

Apply -> canary is from the policy's create call returning to the canary Deployment appearing
in this process's watch.

Targets are Deployments with zero replicas (nothing needs to run): each active policy claims its
target, runs its preflight against a real (empty) Prometheus, which finds no fleet metrics and
degrades to Unknown (measurement would go ahead), creates its canary and control, and then waits
in Launching for pods that never come: the steady state of a policy holding a canary.
Beside them, as many *finished* policies (refused at once: ``load.mode: live`` is not
implemented, so they end Failed) show what a policy costs once it has nothing left to do; the
target is 0 requests. Requests are attributed to a policy by the namespace they touch (each
policy has its own) or, for cluster-wide list calls, by the policy namespace in their label
selector; cluster-wide requests without one (Kopf's watch reconnections) count with the active
ones. Prints a table, then one JSON object as the last line.

``--profile DIR`` records the operator with py-spy during the burst (GIL-holding samples, raw
collapsed stacks: where its CPU goes); with ``--tracemalloc``, the operator also runs under
tracemalloc and writes its largest allocation sites after the probes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "lookahead.dev", "v1alpha1", "lookaheadpolicies"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


def _deployment(ns: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": ns, "labels": {"app": "llm"}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "llm"}},
                     "template": {"metadata": {"labels": {"app": "llm"}},
                                  "spec": {"containers": [{"name": "engine", "image": "local/reference-engine",
                                                           "command": ["python3", "-m", "lookahead_canary.server"],
                                                           "args": ["--port", "8000"]}]}}}}


def _policy(ns: str, prometheus_url: str, finished: bool = False) -> dict:
    load = {"batchSizes": [1, 8]}
    if finished:
        load.update({"mode": "live", "livePercent": "5%"})  # refused at once: ends Failed
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LookaheadPolicy", "metadata": {"name": "bench", "namespace": ns},
            "spec": {"targets": {"selector": {"matchLabels": {"app": "llm"}}}, "engine": "reference",
                     "load": load, "promotion": {"mode": "analysisOnly", "waves": ["100%"]},
                     "analysis": {"prometheus": {"url": prometheus_url}}}}


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


_POLICY_NS = re.compile(r"lookahead\.dev(?:/|%2F)policy-namespace(?:=|%3D)([a-z0-9-]+)")


def _operator_events(audit_log: Path, since: float, until: float):
    """The operator's completed requests in [since, until) from the apiserver's audit log."""
    from datetime import datetime
    with open(audit_log) as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ua = ev.get("userAgent", "")
            if ev.get("stage") != "ResponseComplete" or not (ua.startswith("kopf/") or ua.startswith("lookahead-operator/")):
                continue
            t = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if since <= t < until:
                yield ua, ev


def _operator_requests(audit_log: Path, since: float, until: float) -> dict[str, dict[str, int]]:
    """Operator requests in [since, until), by the namespace they concern ("" when none), by verb."""
    out: dict[str, dict[str, int]] = {}
    for _, ev in _operator_events(audit_log, since, until):
        ns = (ev.get("objectRef") or {}).get("namespace") or ""
        m = _POLICY_NS.search(ev.get("requestURI", ""))
        if m:
            ns = m.group(1)
        verbs = out.setdefault(ns, {})
        verbs[ev.get("verb", "?")] = verbs.get(ev.get("verb", "?"), 0) + 1
    return out


def _requests_by_kind(audit_log: Path, since: float, until: float) -> dict[str, int]:
    """Operator requests in [since, until) by "client verb resource[/subresource] code"."""
    out: dict[str, int] = {}
    for ua, ev in _operator_events(audit_log, since, until):
        ref = ev.get("objectRef") or {}
        what = "/".join(x for x in (ref.get("resource"), ref.get("subresource")) if x)
        key = f"{ua.split('/')[0]} {ev.get('verb')} {what} {(ev.get('responseStatus') or {}).get('code')}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _sum(counts: dict[str, dict[str, int]], namespaces) -> tuple[int, dict[str, int]]:
    total, verbs = 0, {}
    for ns in namespaces:
        for verb, n in counts.get(ns, {}).items():
            total += n
            verbs[verb] = verbs.get(verb, 0) + n
    return total, verbs


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            out[name] = 0.0
    return out


def _stop_spy(spy: subprocess.Popen) -> None:
    """py-spy writes its output on SIGINT."""
    import signal
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=60)
    except subprocess.TimeoutExpired:
        from .devcluster import kill_process_group
        kill_process_group(spy.pid)


def _stats(latencies: list[float]) -> dict:
    return {"median_s": round(statistics.median(latencies), 3), "p95_s": round(_percentile(latencies, 0.95), 3),
            "max_s": round(max(latencies), 3), "n": len(latencies)}


#: ``--profile DIR --tracemalloc``: the operator under tracemalloc; SIGUSR1 writes the largest allocation
#: sites (by line and by file) to the path given as the first argument.
_TRACEMALLOC = """
import signal, sys, runpy, tracemalloc, threading
out = sys.argv.pop(1)
tracemalloc.start(int(__import__("os").environ.get("BENCH_TRACEMALLOC_FRAMES", "1")))
def dump():
    snap = tracemalloc.take_snapshot()
    total = sum(s.size for s in snap.statistics("filename"))
    with open(out + ".tmp", "w") as f:
        f.write(f"traced {total / 2**20:.1f} MiB\\n")
        for kind in ("filename", "lineno", "traceback"):
            f.write(f"--- by {kind}\\n")
            for s in snap.statistics(kind)[:60]:
                where = " <- ".join(str(fr) for fr in reversed(s.traceback)) if kind == "traceback" else s.traceback
                f.write(f"{s.size / 2**20:8.2f} MiB {s.count:9d} {where}\\n")
    import os
    os.replace(out + ".tmp", out)
signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=dump).start())
sys.argv = ["kopf", *sys.argv[1:]]
runpy.run_module("kopf", run_name="__main__", alter_sys=True)
"""


def run(policies: int, steady_s: float, poll_s: float, finished: int, probes: int = 40, probe_gap_s: float = 1.0,
        profile: Path | None = None, trace_memory: bool = False) -> dict:
    from kubernetes import client, watch

    from .devcluster import DevCluster, DevPrometheus, free_port, kill_process_group, wait_for

    state = Path(tempfile.mkdtemp(prefix="lookahead-bench-operator-"))
    (state / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit_log = state / "audit.log"
    cluster = DevCluster(state / "cluster", apiserver_args=[
        f"--audit-policy-file={state / 'audit-policy.yaml'}", f"--audit-log-path={audit_log}",
        "--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s"])
    op = spy = prometheus = None
    import contextlib
    stack = contextlib.ExitStack()
    try:
        cluster.start()
        prometheus = DevPrometheus(state / "prometheus").start()
        api = cluster.api_client()
        core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        ext = client.ApiextensionsV1Api(api)
        ext.create_custom_resource_definition(yaml.safe_load((REPO / "crds" / "lookaheadpolicies.yaml").read_text()))
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status.conditions or []),
                 30, "CRD established")
        namespaces = [f"bench-{i:03d}" for i in range(policies)]
        done_namespaces = [f"done-{i:03d}" for i in range(finished)]
        probe_namespaces = [f"probe-{i:03d}" for i in range(probes)]
        for ns in ["warmup"] + namespaces + done_namespaces + probe_namespaces:
            core.create_namespace({"metadata": {"name": ns}})
            apps.create_namespaced_deployment(ns, _deployment(ns))
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "LOOKAHEAD_POLL_SECONDS": str(poll_s),
               "LOOKAHEAD_METRICS_PORT": str(free_port()), "LOOKAHEAD_METRICS_ADDR": "127.0.0.1"}
        log = stack.enter_context(open(state / "operator.log", "wb"))
        kopf_args = ["run", "--standalone", "--all-namespaces", "-m", "lookahead_operator.runtime.handlers"]
        if profile is not None and trace_memory:
            argv = [sys.executable, "-c", _TRACEMALLOC, str(profile / f"memory-{policies}.txt"), *kopf_args]
        else:
            argv = [sys.executable, "-m", "kopf", *kopf_args]
        op = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        op_started = time.time()
        proc = psutil.Process(op.pid)
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        done = threading.Event()
        cond = threading.Condition()

        def watch_canaries():
            w = watch.Watch()
            try:
                for ev in w.stream(apps.list_deployment_for_all_namespaces, label_selector="lookahead.dev/role=canary",
                                   timeout_seconds=int(steady_s + 1800)):
                    ns = ev["object"].metadata.namespace
                    with cond:
                        seen.setdefault(ns, time.time())
                        cond.notify_all()
                    if done.is_set():
                        w.stop()
            except Exception:  # noqa: BLE001 - the cluster stopping under it at the end
                if not done.is_set():
                    raise

        watcher = threading.Thread(target=watch_canaries, daemon=True)
        watcher.start()
        # wait until the operator is up (its metrics answer) before applying
        import urllib.request
        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{env['LOOKAHEAD_METRICS_PORT']}/metrics", timeout=2),
                 60, "operator metrics endpoint")
        # The operator acts only once its caches hold the whole cluster (Kopf lists every watched
        # kind first): one policy carried to its canary says it is up, and how long that took.
        custom.create_namespaced_custom_object(GROUP, VERSION, "warmup", PLURAL, _policy("warmup", prometheus.url))
        with cond:
            cond.wait_for(lambda: "warmup" in seen, timeout=600)
        if "warmup" not in seen:
            raise TimeoutError("the operator did not carry a first policy to its canary within 600 s")
        t_ready = seen["warmup"] - op_started
        time.sleep(1)
        pids = {"operator": op.pid, **{n: pid for n, pid in cluster.pids.items()}}
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(op.pid), "--format", "raw", "--rate", "50",
                                    "--nonblocking", "--gil", "--output", str(profile / f"operator-{policies}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            time.sleep(1)
        try:
            from rich.progress import track
        except ImportError:  # pragma: no cover
            def track(x, **_):
                return x
        # 1. the burst: every active policy, then every finished one, applied back to back
        cpu0, t_burst = _cpu_seconds(pids), time.time()
        for ns in track(namespaces, description="applying policies"):
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _policy(ns, prometheus.url))
            created[ns] = time.time()
        t_applied = time.time()
        for ns in track(done_namespaces, description="applying finished policies"):
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _policy(ns, prometheus.url, True))
        wait_for(lambda: all(ns in seen for ns in namespaces), 1800, "every canary created", interval=0.2)
        t_canaries = max(seen[ns] for ns in namespaces)
        burst = [seen[ns] - created[ns] for ns in namespaces]

        def all_finished():
            return all((custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "bench").get("status") or {})
                       .get("phase") == "Failed" for ns in done_namespaces)

        wait_for(all_finished, 900, "every finished policy Failed", interval=1.0)
        cpu1 = _cpu_seconds(pids)
        if spy is not None:
            _stop_spy(spy)
            spy = None
        time.sleep(5)  # the last Events of the burst
        # 2. the steady window: requests and memory
        t0 = time.time()
        rss_samples = []
        while time.time() - t0 < steady_s:
            rss_samples.append(proc.memory_info().rss / 2**20)
            time.sleep(1)
        t1 = time.time()
        cpu2 = _cpu_seconds(pids)
        # 3. the probes: one policy at a time applied to the operator holding all of the above
        probe = []
        for ns in probe_namespaces:
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _policy(ns, prometheus.url))
            created[ns] = time.time()
            with cond:
                cond.wait_for(lambda: ns in seen, timeout=120)
            if ns not in seen:
                raise TimeoutError(f"no canary for probe policy {ns} within 120 s")
            probe.append(seen[ns] - created[ns])
            time.sleep(probe_gap_s)
        rss_samples.append(proc.memory_info().rss / 2**20)
        if profile is not None and trace_memory:
            import signal
            os.kill(op.pid, signal.SIGUSR1)
            wait_for(lambda: (profile / f"memory-{policies}.txt").exists(), 300, "the tracemalloc dump", interval=1)
        done.set()
        time.sleep(2.5)  # the audit log is written in 1 s batches: let the window's last batch land
        counts = _operator_requests(audit_log, t0, t1)
        burst_requests = _requests_by_kind(audit_log, t_burst, t0)
        minutes = (t1 - t0) / 60
        requests, verbs = _sum(counts, set(counts) - set(done_namespaces) - {"warmup"})
        done_requests, done_verbs = _sum(counts, done_namespaces)
        probe_stats = _stats(probe) if probe else None
        burst_stats = _stats(burst)
        main_stats = probe_stats or burst_stats
        return {
            "policies": policies,
            "finished_policies": finished,
            "poll_seconds": poll_s,
            "steady_seconds": round(t1 - t0, 1),
            "apply_to_canary_median_s": main_stats["median_s"],
            "apply_to_canary_p95_s": main_stats["p95_s"],
            "apply_to_canary_max_s": main_stats["max_s"],
            "apply_to_canary_probes": len(probe),
            "operator_ready_s": round(t_ready, 1),
            "burst_apply_to_canary_median_s": burst_stats["median_s"],
            "burst_apply_to_canary_p95_s": burst_stats["p95_s"],
            "burst_apply_s": round(t_applied - t_burst, 1),
            "burst_all_canaries_s": round(t_canaries - t_burst, 1),
            "burst_cpu_s": {k: round(cpu1[k] - cpu0[k], 1) for k in cpu0},
            "burst_requests": burst_requests,
            "steady_cpu_pct": {k: round(100 * (cpu2[k] - cpu1[k]) / (t1 - t0 + 5), 1) for k in cpu1},
            "api_requests_total": requests,
            "api_requests_per_policy_per_min": round(requests / policies / minutes, 2),
            "api_requests_by_verb": verbs,
            "finished_api_requests_total": done_requests,
            "finished_api_requests_per_policy_per_min": round(done_requests / max(1, finished) / minutes, 3),
            "finished_api_requests_by_verb": done_verbs,
            "rss_mb": round(statistics.median(rss_samples), 1),
            "rss_max_mb": round(max(rss_samples), 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
    finally:
        if spy is not None:
            _stop_spy(spy)
        if op is not None:
            kill_process_group(op.pid)
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()
        stack.close()
        if profile is not None and (state / "operator.log").exists():
            shutil.copy(state / "operator.log", profile / f"operator-{policies}.log")
        shutil.rmtree(state, ignore_errors=True)


ROWS = [("apply_to_canary_median_s", "apply -> canary, median (s)"), ("apply_to_canary_p95_s", "apply -> canary, p95 (s)"),
        ("operator_ready_s", "operator start -> first canary (s)"),
        ("burst_apply_to_canary_median_s", "burst: apply -> canary, median (s)"),
        ("burst_apply_to_canary_p95_s", "burst: apply -> canary, p95 (s)"),
        ("burst_all_canaries_s", "burst: first apply -> last canary (s)"),
        ("api_requests_per_policy_per_min", "API requests / active policy / min"),
        ("finished_api_requests_per_policy_per_min", "API requests / finished policy / min"),
        ("rss_mb", "operator RSS (MB)")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="50,500",
                    help="comma-separated numbers of active policies, each measured in its own fresh cluster "
                         "(default 50,500)")
    ap.add_argument("--steady", type=float, default=120, help="seconds of steady state to count requests over")
    ap.add_argument("--finished", type=int, default=None,
                    help="finished policies beside the active ones (default: as many as the active ones)")
    ap.add_argument("--poll", type=float, default=30,
                    help="the operator's safety-net poll (LOOKAHEAD_POLL_SECONDS; changes wake a policy at once)")
    ap.add_argument("--probes", type=int, default=40,
                    help="policies applied one at a time, after the steady window, to the operator holding all the "
                         "others: their apply -> canary latency is the headline figure (default 40)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="record the operator with py-spy (raw collapsed stacks) during the burst into this folder")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="with --profile: run the operator under tracemalloc and write its largest allocation sites "
                         "after the probes (slows the operator down: not for the figures)")
    args = ap.parse_args(argv)
    # Killed (TERM, HUP, Ctrl-C): unwind, so that every run's `finally` stops what it started
    # (operator, py-spy, Prometheus, apiserver, etcd, controller-manager: each in its own session).
    import signal
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        sizes = [int(x) for x in str(args.policies).split(",") if x.strip()]
    except ValueError:
        ap.error(f"--policies: expected numbers like 50,500, got {args.policies!r}")
    results = []
    for n in sizes:
        print(f"--- {n} active + {n if args.finished is None else args.finished} finished policies", flush=True)
        results.append(run(n, args.steady, args.poll, n if args.finished is None else args.finished,
                           probes=args.probes, profile=args.profile, trace_memory=args.tracemalloc))
        print(json.dumps(results[-1]), flush=True)
    from rich.console import Console
    from rich.table import Table

    t = Table("figure", *[f"{r['policies']} policies" for r in results],
              title="one operator process, real apiserver (audit log), steady state in Launching")
    for key, label in ROWS:
        t.add_row(label, *[str(r[key]) for r in results])
    t.add_row("requests by verb (active)", *[json.dumps(r["api_requests_by_verb"]) for r in results])
    t.add_row("burst CPU s", *[json.dumps(r["burst_cpu_s"]) for r in results])
    t.add_row("load average", *[json.dumps(r["load_average"]) for r in results])
    Console(stderr=False, width=120).print(t)
    largest = max(results, key=lambda r: r["policies"])
    print(json.dumps({k: largest[k] for k in ("policies", "apply_to_canary_p95_s", "api_requests_per_policy_per_min",
                                              "finished_api_requests_per_policy_per_min", "rss_mb")}
                     | {"runs": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
