"""The kubelet stand-in runs a Deployment's Pod as a local process that Prometheus scrapes."""

from __future__ import annotations

import sys
import uuid

import pytest
from kubernetes import client

from lookahead_dev.devcluster import wait_for
from lookahead_dev.podharness import alive, expand, prometheus_label_name

pytestmark = pytest.mark.integration

# A tiny HTTP server: /healthz answers 200 once it listens, /metrics serves one gauge that
# carries the value of --value, so the test can tell this process's metrics apart.
SERVER = r"""
import argparse, http.server
ap = argparse.ArgumentParser(); ap.add_argument("--host"); ap.add_argument("--port", type=int); ap.add_argument("--value")
a = ap.parse_args()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/healthz":
            body = b"ok"
        elif self.path == "/custom-metrics":
            body = ("# TYPE harness_test_value gauge\nharness_test_value %s\n" % a.value).encode()
        else:
            self.send_response(404); self.end_headers(); return
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((a.host, a.port), H).serve_forever()
"""


def test_label_names_and_variable_expansion():
    assert prometheus_label_name("lookahead.dev/role") == "lookahead_dev_role"
    assert prometheus_label_name("app.kubernetes.io/name") == "app_kubernetes_io_name"
    assert prometheus_label_name("9lives") == "_9lives"
    assert prometheus_label_name("__meta") == "label__meta"
    assert expand("--port=$(PORT) $$(PORT) $(NOPE)", {"PORT": "8080"}) == "--port=8080 $(PORT) $(NOPE)"


def test_deployment_pod_runs_is_ready_is_scraped_and_is_killed_on_delete(kube_api, pod_harness, prometheus):
    ns = f"harness-{uuid.uuid4().hex[:6]}"
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    labels = {"app": "engine", "lookahead.dev/role": "canary"}
    apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "engine"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/path": "/custom-metrics"}},
                "spec": {"containers": [{
                    "name": "engine", "image": "local/python",
                    "command": [sys.executable, "-c", SERVER],
                    "args": ["--host", "$(POD_IP)", "--port", "$(PORT)", "--value", "$(VALUE)"],
                    "env": [{"name": "VALUE", "value": "7.25"}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
                }]},
            },
        },
    })

    def ready_pod():
        pods = core.list_namespaced_pod(ns).items
        ok = [p for p in pods if p.status.phase == "Running"
              and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return ok[0] if ok else None

    pod = wait_for(ready_pod, 60, "the harness to run the Pod and report it Ready")
    assert pod.spec.node_name == pod_harness.node_name
    assert pod.status.pod_ip.startswith("127.0.") and pod.status.pod_ip != "127.0.0.1"
    wait_for(lambda: apps.read_namespaced_deployment_status("engine", ns).status.ready_replicas == 1,
             30, "the Deployment to count the Pod ready")

    running = pod_harness.find(ns, pod.metadata.name)
    assert running is not None and running.ready
    assert running.address == f"{pod.status.pod_ip}:{running.port}"
    pids = running.pids
    assert alive(pids) == pids

    # Prometheus scrapes it, with namespace, pod and the sanitised Pod labels.
    up = prometheus.wait_target_up(running.address, timeout=30)
    metric = up[0]["metric"]
    assert metric["namespace"] == ns and metric["pod"] == pod.metadata.name
    assert metric["app"] == "engine" and metric["lookahead_dev_role"] == "canary"
    res = wait_for(lambda: prometheus.query(
        f'harness_test_value{{namespace="{ns}", lookahead_dev_role="canary"}}'), 30, "the gauge")
    assert float(res[0]["value"][1]) == 7.25

    # Deleting the Deployment kills the process and removes the Pod and the scrape target.
    apps.delete_namespaced_deployment("engine", ns, propagation_policy="Foreground")
    wait_for(lambda: not alive(pids), 60, "the Pod's process to be killed")
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 60, "the Pod object to be deleted")
    assert all(t["address"] != running.address for t in prometheus.targets)
    core.delete_namespace(ns)


def test_a_pod_whose_process_exits_is_marked_failed(kube_api, pod_harness):
    ns = f"harness-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crash"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "crash", "image": "local/python",
            "command": [sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"]}]},
    })

    def failed():
        p = core.read_namespaced_pod("crash", ns)
        return p if p.status.phase == "Failed" else None

    pod = wait_for(failed, 60, "the Pod to be marked Failed")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert "bye" in pod_harness.logs(ns, "crash")
    core.delete_namespace(ns)


def test_a_crashing_container_is_restarted_with_back_off_like_a_kubelet(kube_api, pod_harness):
    ns = f"harness-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(kube_api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crashloop"},
        "spec": {"restartPolicy": "Always", "containers": [{
            "name": "crash", "image": "local/python",
            "command": [sys.executable, "-c", "print('starting'); raise SystemExit(2)"]}]},
    })

    def restarted_twice():
        p = core.read_namespaced_pod("crashloop", ns)
        cs = (p.status.container_statuses or [None])[0]
        return p if cs is not None and cs.restart_count >= 2 else None

    pod = wait_for(restarted_twice, 60, "the container to be restarted twice")
    cs = pod.status.container_statuses[0]
    assert pod.status.phase == "Running" and not cs.ready
    assert cs.last_state.terminated.exit_code == 2
    assert pod_harness.logs(ns, "crashloop").count("starting") >= 2
    core.delete_namespace(ns)
