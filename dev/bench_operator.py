"""`make bench-operator`: one operator process, many concurrent LookaheadPolicies, on the real
local control plane.

Measures, side by side in one run:
- apply-to-canary-created latency: from the policy's create call returning to the canary
  Deployment appearing in a watch (median, p95);
- API requests per policy per minute in steady state, counted from the kube-apiserver's own
  audit log (every request whose user agent is the operator's: Kopf's or our client's);
- the operator's resident memory (psutil).

Targets are Deployments with zero replicas (nothing needs to run): each active policy claims its
target, runs its preflight against a real (empty) Prometheus, which finds no fleet metrics and
degrades to Unknown (measurement would go ahead), creates its canary and control, and then waits
in Launching for pods that never come: the steady state of a policy holding a canary.
Beside them, as many *finished* policies (refused at once: ``load.mode: live`` is not
implemented, so they end Failed) show what a policy costs once it has nothing left to do; the
target is 0 requests. Requests are attributed to a policy by the namespace they touch (each
policy has its own) or, for cluster-wide list calls, by the policy namespace in their label
selector. Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


_POLICY_NS = re.compile(r"lookahead\.dev%2Fpolicy-namespace%3D([a-z0-9-]+)")


def _operator_requests(audit_log: Path, since: float, until: float) -> dict[str, dict[str, int]]:
    """Operator requests in [since, until), by the namespace they concern ("" when none), by verb."""
    from datetime import datetime
    out: dict[str, dict[str, int]] = {}
    with open(audit_log) as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ua = ev.get("userAgent", "")
            if not (ua.startswith("kopf/") or ua.startswith("lookahead-operator/")):
                continue
            if ev.get("stage") != "ResponseComplete":
                continue
            t = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if since <= t < until:
                ns = (ev.get("objectRef") or {}).get("namespace") or ""
                m = _POLICY_NS.search(ev.get("requestURI", ""))
                if m:
                    ns = m.group(1)
                verbs = out.setdefault(ns, {})
                verbs[ev.get("verb", "?")] = verbs.get(ev.get("verb", "?"), 0) + 1
    return out


def _sum(counts: dict[str, dict[str, int]], namespaces) -> tuple[int, dict[str, int]]:
    total, verbs = 0, {}
    for ns in namespaces:
        for verb, n in counts.get(ns, {}).items():
            total += n
            verbs[verb] = verbs.get(verb, 0) + n
    return total, verbs


def run(policies: int, steady_s: float, poll_s: float, finished: int) -> dict:
    from kubernetes import client, watch

    from .devcluster import DevCluster, DevPrometheus, free_port, wait_for

    state = Path(tempfile.mkdtemp(prefix="lookahead-bench-operator-"))
    (state / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit_log = state / "audit.log"
    cluster = DevCluster(state / "cluster", apiserver_args=[
        f"--audit-policy-file={state / 'audit-policy.yaml'}", f"--audit-log-path={audit_log}",
        "--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s"])
    cluster.start()
    prometheus = DevPrometheus(state / "prometheus").start()
    op = None
    try:
        api = cluster.api_client()
        core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        ext = client.ApiextensionsV1Api(api)
        ext.create_custom_resource_definition(yaml.safe_load((REPO / "crds" / "lookaheadpolicies.yaml").read_text()))
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status.conditions or []),
                 30, "CRD established")
        namespaces = [f"bench-{i:03d}" for i in range(policies)]
        done_namespaces = [f"done-{i:03d}" for i in range(finished)]
        for ns in namespaces + done_namespaces:
            core.create_namespace({"metadata": {"name": ns}})
            apps.create_namespaced_deployment(ns, _deployment(ns))
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "LOOKAHEAD_POLL_SECONDS": str(poll_s),
               "LOOKAHEAD_METRICS_PORT": str(free_port()), "LOOKAHEAD_METRICS_ADDR": "127.0.0.1"}
        log = open(state / "operator.log", "wb")
        op = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces", "-m",
                               "lookahead_operator.handlers"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
        proc = psutil.Process(op.pid)
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        done = threading.Event()

        def watch_canaries():
            w = watch.Watch()
            for ev in w.stream(apps.list_deployment_for_all_namespaces, label_selector="lookahead.dev/role=canary",
                               timeout_seconds=int(steady_s + 600)):
                ns = ev["object"].metadata.namespace
                seen.setdefault(ns, time.time())
                if len(seen) >= policies or done.is_set():
                    w.stop()

        watcher = threading.Thread(target=watch_canaries, daemon=True)
        watcher.start()
        time.sleep(0)  # let the watch open before the first policy (it lists first, so nothing is missed anyway)
        # wait until the operator is up (its metrics answer) before applying
        import urllib.request
        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{env['LOOKAHEAD_METRICS_PORT']}/metrics", timeout=2),
                 60, "operator metrics endpoint")
        try:
            from rich.progress import track
        except ImportError:  # pragma: no cover
            def track(x, **_):
                return x
        for ns in track(namespaces, description="applying policies"):
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _policy(ns, prometheus.url))
            created[ns] = time.time()
        for ns in track(done_namespaces, description="applying finished policies"):
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _policy(ns, prometheus.url, True))
        wait_for(lambda: len(seen) >= policies, 600, "every canary created", interval=0.5)
        latencies = [seen[ns] - created[ns] for ns in namespaces]

        def all_finished():
            return all((custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "bench").get("status") or {})
                       .get("phase") == "Failed" for ns in done_namespaces)

        wait_for(all_finished, 600, "every finished policy Failed", interval=1.0)
        t0 = time.time()
        rss_samples = []
        while time.time() - t0 < steady_s:
            rss_samples.append(proc.memory_info().rss / 2**20)
            time.sleep(1)
        t1 = time.time()
        done.set()
        time.sleep(2.5)  # the audit log is written in 1 s batches: let the window's last batch land
        counts = _operator_requests(audit_log, t0, t1)
        minutes = (t1 - t0) / 60
        requests, verbs = _sum(counts, set(counts) - set(done_namespaces))
        done_requests, done_verbs = _sum(counts, done_namespaces)
        return {
            "policies": policies,
            "finished_policies": finished,
            "poll_seconds": poll_s,
            "steady_seconds": round(t1 - t0, 1),
            "apply_to_canary_median_s": round(statistics.median(latencies), 3),
            "apply_to_canary_p95_s": round(_percentile(latencies, 0.95), 3),
            "apply_to_canary_max_s": round(max(latencies), 3),
            "api_requests_total": requests,
            "api_requests_per_policy_per_min": round(requests / policies / minutes, 2),
            "api_requests_by_verb": verbs,
            "finished_api_requests_total": done_requests,
            "finished_api_requests_per_policy_per_min": round(done_requests / max(1, finished) / minutes, 3),
            "finished_api_requests_by_verb": done_verbs,
            "rss_mb": round(statistics.median(rss_samples), 1),
            "rss_max_mb": round(max(rss_samples), 1),
        }
    finally:
        if op is not None:
            from .devcluster import kill_process_group
            kill_process_group(op.pid)
        prometheus.stop()
        cluster.stop()


ROWS = [("apply_to_canary_median_s", "apply -> canary, median (s)"), ("apply_to_canary_p95_s", "apply -> canary, p95 (s)"),
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
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in str(args.policies).split(",") if x.strip()]
    except ValueError:
        ap.error(f"--policies: expected numbers like 50,500, got {args.policies!r}")
    results = []
    for n in sizes:
        print(f"--- {n} active + {n if args.finished is None else args.finished} finished policies", flush=True)
        results.append(run(n, args.steady, args.poll, n if args.finished is None else args.finished))
    from rich.console import Console
    from rich.table import Table

    t = Table("figure", *[f"{r['policies']} policies" for r in results],
              title="one operator process, real apiserver (audit log), steady state in Launching")
    for key, label in ROWS:
        t.add_row(label, *[str(r[key]) for r in results])
    t.add_row("requests by verb (active)", *[json.dumps(r["api_requests_by_verb"]) for r in results])
    Console(stderr=False, width=100).print(t)
    largest = max(results, key=lambda r: r["policies"])
    print(json.dumps({k: largest[k] for k in ("policies", "apply_to_canary_p95_s", "api_requests_per_policy_per_min",
                                              "finished_api_requests_per_policy_per_min", "rss_mb")}
                     | {"runs": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
