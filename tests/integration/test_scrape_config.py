"""The plain-Prometheus scrape job documented in docs/analyze.md, run for real.

Real parts: the kube-apiserver of the test cluster (``devcluster``), Debian's Prometheus started
here with the job **read from docs/analyze.md** (its relabel rules untouched, the scrape interval
set to 1 s), and two reference-engine processes (``python3 -m lookahead_canary.server --backend simulate``): a
control and a Jacobi canary. Each engine stands behind a Pod object labelled and annotated as the
operator labels its canary and control pods (``builders.role_labels``, the
``prometheus.io/*`` annotations of ``build_role_deployment``). Nothing runs the Pods (there is no
kubelet here): the test writes their status (``Running``, ``podIP`` 127.0.0.1) as a kubelet would,
and the engines listen on 127.0.0.1 at the annotated ports. A ``loadgen`` Pod and an unlabelled
fleet Pod point at the same engine: the job must drop them.

Discovery: Debian's Prometheus is built without Kubernetes service discovery ("field
kubernetes_sd_configs not found in type config.ScrapeConfig"), so the job's
``kubernetes_sd_configs: [{role: pod}]`` is replaced by a ``file_sd_configs`` file whose targets
carry the ``__meta_kubernetes_*`` labels that Prometheus' pod discovery
(``discovery/kubernetes/pod.go``) builds -- one target per declared container port,
``__address__`` = pod IP:port, pod labels and annotations sanitised the same way -- computed from
the Pod objects as read back from the apiserver. The relabel rules then act on the same meta
labels as in a cluster.

Values are then read back through the operator's own code (``measure.role_labels``,
``observations.read_window``) and compared with what the engines themselves counted.

The second test checks the DCGM selection of ``measure.read_preflight`` against the same real
Prometheus: a static exporter page in dcgm-exporter's format, scraped with ``honor_labels: false``
as dcgm-exporter's Helm chart does, so the workload's labels arrive as ``exported_namespace`` /
``exported_pod``.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from lookahead_dev.devcluster import documented_scrape_job, free_port, prometheus_binary
from lookahead_operator.controller import builders
from lookahead_operator.measurement import measure
from lookahead_operator.measurement import prometheus as observations
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.cli.analyze import metrics_delta
from lookahead_operator.engines import metric_names
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.measurement.prometheus import State

from .helpers import terminate, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JACOBI = '{"method":"jacobi","window":4,"ngram":4,"guess_set":4}'
SIM = '{"seed": 11, "noise_sigma": 0.0, "acceptance": 0.6}'
POLICY, POLICY_NS = "chat-fleet", "policies"
TARGET = "chat"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# The reference engine exports vLLM's per-position counter (canary/metrics.py); until
# engines.REFERENCE_METRICS declares it, read it under vLLM's name explicitly.
M = dataclasses.replace(metric_names("reference"), accepted_per_position=PER_POS)


def engine_metrics(port: int) -> dict[str, float]:
    """The engine's own /metrics: sample name (with the position label for the per-position
    counter) -> value, summed over the other labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            key = f'{s.name}{{position="{s.labels["position"]}"}}' if "position" in s.labels else s.name
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


class PromProcess:
    """Debian's Prometheus with a given config, on a free loopback port (stopped by its pid)."""

    def __init__(self, config: dict, workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [str(prometheus_binary()), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--log.level=warn"], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            assert self.proc.poll() is None, (workdir / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(ready, 60, "prometheus /-/ready", interval=0.2)

    def client(self):
        from prometheus_api_client import PrometheusConnect

        return PrometheusConnect(url=self.url, disable_ssl=True)

    def stop(self) -> None:
        terminate(self.proc, 15)
        self.log.close()


class EngineProc:
    def __init__(self, port: int, *flags: str, log: Path):
        self.port = port
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lookahead_canary.server", "--host", "127.0.0.1", "--port", str(port),
             "--backend", "simulate", "--model", "llama-3-8b", "--max-num-seqs", "4", "--sim-config", SIM, *flags],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def ready(self) -> bool:
        assert self.proc.poll() is None, Path(self.log.name).read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        terminate(self.proc, 20)
        self.log.close()


def pod_body(name: str, labels: dict, port: int, node: str, annotate: bool = True) -> dict:
    meta = {"name": name, "labels": labels}
    if annotate:
        meta["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                               "prometheus.io/port": str(port)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "engine", "image": "engine:test",
                                     # a second declared port: the job must still make one target per pod
                                     "ports": [{"name": "http", "containerPort": port},
                                               {"name": "debug", "containerPort": 9}]}]}}


def _sanitize(name: str) -> str:
    """Prometheus' strutil.SanitizeLabelName: every character outside [a-zA-Z0-9_] becomes _."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_sd_groups(pod) -> list[dict]:
    """What Prometheus' Kubernetes pod discovery makes of a Pod (discovery/kubernetes/pod.go,
    ``buildPod``): no targets without a pod IP; else one target per declared container port, with
    the pod-level and container-level ``__meta_kubernetes_*`` labels."""
    ip = pod.status.pod_ip if pod.status else None
    if not ip:
        return []
    meta = pod.metadata
    pod_labels = {
        "__meta_kubernetes_namespace": meta.namespace,
        "__meta_kubernetes_pod_name": meta.name,
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_ready": "true" if any(c.type == "Ready" and c.status == "True"
                                                     for c in pod.status.conditions or []) else "false",
        "__meta_kubernetes_pod_phase": pod.status.phase or "",
        "__meta_kubernetes_pod_node_name": pod.spec.node_name or "",
        "__meta_kubernetes_pod_host_ip": pod.status.host_ip or "",
        "__meta_kubernetes_pod_uid": meta.uid,
    }
    for k, v in (meta.labels or {}).items():
        pod_labels[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
        pod_labels[f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}"] = "true"
    for k, v in (meta.annotations or {}).items():
        pod_labels[f"__meta_kubernetes_pod_annotation_{_sanitize(k)}"] = v
        pod_labels[f"__meta_kubernetes_pod_annotationpresent_{_sanitize(k)}"] = "true"
    groups = []
    for c in pod.spec.containers:
        for port in c.ports or []:
            groups.append({"targets": [f"{ip}:{port.container_port}"], "labels": {
                **pod_labels, "__meta_kubernetes_pod_container_name": c.name,
                "__meta_kubernetes_pod_container_image": c.image,
                "__meta_kubernetes_pod_container_port_name": port.name or "",
                "__meta_kubernetes_pod_container_port_number": str(port.container_port),
                "__meta_kubernetes_pod_container_port_protocol": port.protocol or "TCP",
                "__meta_kubernetes_pod_container_init": "false"}})
    return groups


def running_status() -> dict:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"status": {"phase": "Running", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                       "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": now,
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}}


@pytest.fixture(scope="module")
def setup(devcluster, kube_api, tmp_path_factory):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    work = tmp_path_factory.mktemp("scrape-config")
    core = client.CoreV1Api(kube_api)
    ns = f"scrape-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    # the Pods' Node, so the pod garbage collector does not take them for orphans (no kubelet runs it)
    node = f"scrape-config-{ns}"
    core.create_node({"metadata": {"name": node}})
    ports = {"control": free_port(), "canary": free_port()}
    dcgm = DcgmPage()
    engines = {"control": EngineProc(ports["control"], log=work / "control.log"),
               "canary": EngineProc(ports["canary"], "--speculative-config", JACOBI, log=work / "canary.log")}
    prom = None
    try:
        policy = {"metadata": {"name": POLICY, "namespace": POLICY_NS}}
        pods = {f"{TARGET}-{role}-0": (builders.role_labels(policy, role, TARGET, 1), ports[role])
                for role in ("control", "canary")}
        pods["loadgen-0"] = (builders.role_labels(policy, "loadgen", TARGET, 1), ports["canary"])
        pods["chat-fleet-0"] = ({"app": "chat"}, ports["canary"])
        for name, (labels, port) in pods.items():
            core.create_namespaced_pod(ns, pod_body(name, labels, port, node))
            core.patch_namespaced_pod_status(name, ns, running_status())

        job = documented_scrape_job()
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        sd_file = work / "pods.json"
        groups = [g for pod in core.list_namespaced_pod(ns, _request_timeout=10).items for g in pod_sd_groups(pod)]
        assert len(groups) == 2 * len(pods)     # two declared ports each
        sd_file.write_text(json.dumps(groups))
        job["file_sd_configs"] = [{"files": [str(sd_file)], "refresh_interval": "1s"}]
        job["scrape_interval"] = "1s"
        job["scrape_timeout"] = "1s"
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [job, {
                      "job_name": "dcgm-exporter", "honor_labels": False,
                      "static_configs": [{"targets": [f"127.0.0.1:{dcgm.port}"],
                                          "labels": {"namespace": "gpu-operator", "pod": "dcgm-exporter-7xk2p"}}]}]}
        prom = PromProcess(config, work)
        wait_until(lambda: all(e.ready() for e in engines.values()), 90, "engines healthy", interval=0.2)
        yield {"ns": ns, "prom": prom, "engines": engines, "dcgm": dcgm}
    finally:
        if prom is not None:
            prom.stop()
        for e in engines.values():
            e.stop()
        dcgm.server.shutdown()
        for delete, args in ((core.delete_namespace, (ns,)), (core.delete_node, (node,))):
            try:
                delete(*args, _request_timeout=10)
            except ApiException:
                pass


class DcgmPage:
    """dcgm-exporter's exposition for two GPUs on one node, served from a thread: one GPU runs a pod of
    the fleet (``chat-...``), the other someone else's pod."""

    TEXT = "".join(
        f'# TYPE {m} gauge\n'
        f'{m}{{gpu="0",UUID="GPU-a",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",'
        f'container="engine",namespace="{{ns}}",pod="chat-7d9f-x2",DCGM_FI_DRIVER_VERSION="570.1"}} {v}\n'
        f'{m}{{gpu="1",UUID="GPU-b",modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",'
        f'container="train",namespace="{{ns}}",pod="trainer-0",DCGM_FI_DRIVER_VERSION="570.1"}} 0.99\n'
        for m, v in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.05),
                     ("DCGM_FI_PROF_DRAM_ACTIVE", 0.4), ("DCGM_FI_DEV_GPU_UTIL", 98)))

    def __init__(self):
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = page.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.text = ""
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve_for(self, namespace: str) -> None:
        self.text = self.TEXT.replace("{ns}", namespace)


def test_documented_job_scrapes_operator_pods_with_every_label_the_queries_use(setup):
    ns, prom, engines = setup["ns"], setup["prom"], setup["engines"]
    client = prom.client()
    names = {"control": f"{TARGET}-control-0", "canary": f"{TARGET}-canary-0"}

    def targets():
        res = client.custom_query(query='up{job="lookahead"} == 1')
        return res if len(res) >= 2 else None
    up = wait_until(targets, 60, "the operator's pods to be discovered and scraped", interval=0.2)
    by_pod = {r["metric"]["pod"]: r["metric"] for r in up}
    # exactly the canary and control pods: one target each, loadgen and the fleet pod dropped
    assert set(by_pod) == set(names.values()), by_pod
    for role, pod in names.items():
        labels = by_pod[pod]
        assert labels["lookahead_dev_policy"] == POLICY
        assert labels["lookahead_dev_policy_namespace"] == POLICY_NS
        assert labels["lookahead_dev_role"] == role
        assert labels["lookahead_dev_target"] == TARGET
        assert labels["namespace"] == ns
        assert labels["instance"] == f"127.0.0.1:{engines[role].port}"

    # load: a few sequential requests to each engine, its own counters read around them
    before = {role: engine_metrics(e.port) for role, e in engines.items()}
    start = time.time()
    time.sleep(1.2)    # one scrape inside the quiet gap before the window
    usage = {}
    with httpx.Client(timeout=60, trust_env=False) as http:
        for role, e in engines.items():
            usage[role] = 0
            for i in range(4):
                r = http.post(f"http://127.0.0.1:{e.port}/v1/completions",
                              json={"model": "llama-3-8b", "prompt": f"count to {i + 3}:", "max_tokens": 24,
                                    "temperature": 0})
                assert r.status_code == 200, r.text
                usage[role] += r.json()["usage"]["completion_tokens"]
    time.sleep(1.2)
    end = time.time()
    after = {role: engine_metrics(e.port) for role, e in engines.items()}

    for role in engines:
        labels = measure.role_labels((POLICY_NS, POLICY), role)
        observations.wait_scraped(prom.url, M, labels, after=end + 0.5, timeout=30)
        o = observations.read_window(prom.url, M, labels, start, end)
        d = metrics_delta(before[role], after[role])
        assert d[M.generation_tokens] == usage[role] > 0
        assert o.output_tokens.ok and o.output_tokens.value == d[M.generation_tokens], (role, o.output_tokens)
        assert o.requests.value == 4
        assert o.per_token_latency_s.ok and o.per_token_latency_s.value > 0
        if role == "canary":
            assert d[M.drafts] > 0
            assert o.acceptance_rate.value == pytest.approx(d[M.accepted_tokens] / d[M.draft_tokens], rel=1e-9)
            assert o.drafts.value == d[M.drafts]
            assert o.mean_acceptance_length.value == pytest.approx(1 + d[M.accepted_tokens] / d[M.drafts], rel=1e-9)
            assert o.mean_acceptance_length.value > 1.0     # the simulator accepts 60% of draft tokens
            by_pos = [d[k] / d[M.drafts] for k in sorted(k for k in d if k.startswith(PER_POS))]
            assert len(by_pos) == 3                          # ngram 4: positions 0..2
            assert [m.value for m in o.acceptance_by_position] == pytest.approx(by_pos, rel=1e-9)
            assert by_pos[0] >= by_pos[1] >= by_pos[2]       # a later position needs the earlier ones
            # measure.step's path: interval_samples carries the same numbers into the status row
            from datetime import datetime, timezone
            got = measure.interval_samples(prom.client(), M, labels, datetime.fromtimestamp(start, timezone.utc),
                                           datetime.fromtimestamp(end, timezone.utc), 1.0)
            assert got["meanAcceptanceLength"] == pytest.approx(o.mean_acceptance_length.value)
            assert got["acceptanceByPosition"] == pytest.approx(by_pos, rel=1e-9)
        else:
            assert o.acceptance_rate.state is State.MISSING and o.mean_acceptance_length.state is State.MISSING
            assert o.acceptance_by_position == [] and o.acceptance_by_position_reason

    # a policy of the same name in another namespace selects nothing
    other = observations.read_window(prom.url, M, measure.role_labels(("elsewhere", POLICY), "canary"), start, end)
    assert other.output_tokens.state is State.MISSING and "no series" in other.output_tokens.reason


def test_preflight_reads_dcgm_scraped_with_honor_labels_false(setup):
    ns, prom = setup["ns"], setup["prom"]
    setup["dcgm"].serve_for(ns)
    client = prom.client()

    def exported():
        res = client.custom_query(query='DCGM_FI_PROF_DRAM_ACTIVE{job="dcgm-exporter"}')
        return res if len(res) == 2 and all("exported_pod" in r["metric"] for r in res) else None
    series = wait_until(exported, 30, "the DCGM page scraped", interval=0.2)
    for r in series:
        # honor_labels: false -- the exporter's pod labels won, the workload's were renamed
        assert r["metric"]["namespace"] == "gpu-operator" and r["metric"]["exported_namespace"] == ns

    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "chat"}}},
                                               "analysis": {"prometheus": {"url": prom.url}}})
    result = measure.read_preflight(spec, [sm.Target(namespace=ns, name="chat")])
    st = result.status
    assert st.signals["grEngineActive"] == pytest.approx(0.5)
    assert st.signals["dramActive"] == pytest.approx(0.4)
    assert st.signals["tensorActive"] == pytest.approx(0.05)
    assert st.signals["gpuUtil"] == pytest.approx(0.98)       # the trainer's GPU (0.99) is not ours
    assert "smActive" not in st.signals and "sm_active" in st.missing and "sm_occupancy" in st.missing
    # DRAM 40% of a 50%-busy GPU is 80% while busy, tensor pipe 10%: decode-bound, idle compute
    assert st.verdict == "DecodeBoundIdleCompute" and st.candidate
    assert any("commented out in both counter CSVs" in r for r in st.reasons)
