"""Our PodMonitors under the real Prometheus Operator, as kube-prometheus-stack configures it
(issue 24, item 3).

The Prometheus Operator built from its Go module (``hack/build-prometheus-operator.sh``, `make
prometheus-operator`) runs as a host process against the session's apiserver, scoped to one test
namespace (``--namespaces``). A ``Prometheus`` there selects PodMonitors as kube-prometheus-stack's
does by default (``podMonitorSelector: {matchLabels: {release: <its release>}}``,
``podMonitorNamespaceSelector: {}``: its template with
``prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues: true``). The PodMonitors are what
the operator creates (``builders.build_pod_monitor``) with the chart's default ``podMonitor.labels``;
the scrape config the Prometheus Operator generates from them (the Secret ``prometheus-<name>``,
``prometheus.yaml.gz``) must hold a job for the labelled one, with our relabelling and the engine
container's port as the pod names it, and none for one without the label.

The Prometheus StatefulSet it creates never runs here (no node): the config is the contract. The
scrape itself, on the real node, is an e2e.
"""

from __future__ import annotations

import gzip
import json
import time
from base64 import b64decode
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_dev import prometheus_operator as po
from lookahead_dev.devcluster import DevClusterError
from lookahead_dev.prometheus_operator import RELEASE
from lookahead_operator.controller import builders as b

from .helpers import namespace_while_used, unique_name, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART_VALUES = REPO / "charts" / "lookahead-operator" / "values.yaml"
PROMETHEUS = f"{RELEASE}-prometheus"
#: the policies the PodMonitors are for live in another namespace than their targets (no owner
#: reference then: the garbage collector has no LookaheadPolicy to look for)
POLICY_NAMESPACE = "team-a"


@pytest.fixture(scope="module")
def po_crds(kube_api):
    """The Prometheus Operator's CRDs, from the module it was built from, for this module's tests
    (``lookahead_dev.prometheus_operator.crds_installed``: removed at the end when installed here;
    the rest of the session's tests assume a cluster without them: tests/integration/test_chart.py)."""
    try:
        po.binary()
        po.crd_files()
    except DevClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    with po.crds_installed(kube_api) as names:
        yield names


@pytest.fixture(scope="module")
def namespace(kube_api, po_crds):
    yield from namespace_while_used(kube_api, "promop")


@pytest.fixture(scope="module")
def prometheus_operator(devcluster, namespace, tmp_path_factory):
    """The real operator, a host process on the admin kubeconfig, scoped to ``namespace``; stopped
    at teardown whatever happened. Yields a function returning its log's last lines."""
    op = po.PrometheusOperator(devcluster.kubeconfig, [namespace], po.image_references()["prometheus-config-reloader"],
                               tmp_path_factory.mktemp("prometheus-operator") / "operator.log").start()
    try:
        yield op.tail
    finally:
        op.stop()


def chart_default_labels() -> dict[str, str]:
    """The chart's default podMonitor.labels, as the operator reads them (LOOKAHEAD_POD_MONITOR_LABELS)."""
    labels = yaml.safe_load(CHART_VALUES.read_text())["podMonitor"]["labels"]
    return b.chart_pod_monitor_labels(json.dumps(labels))


def policy(name: str) -> dict:
    return {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
            "metadata": {"name": name, "namespace": POLICY_NAMESPACE, "uid": f"uid-{name}"}}


def generated_config(kube_api, namespace: str, prometheus: str = PROMETHEUS) -> dict | None:
    """The scrape config the Prometheus Operator generated: Secret prometheus-<name>, prometheus.yaml.gz."""
    try:
        secret = client.CoreV1Api(kube_api).read_namespaced_secret(f"prometheus-{prometheus}", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    raw = (secret.data or {}).get("prometheus.yaml.gz")
    return yaml.safe_load(gzip.decompress(b64decode(raw))) if raw else None


def jobs(config: dict | None) -> dict[str, dict]:
    return {j["job_name"]: j for j in (config or {}).get("scrape_configs") or []}


def test_the_operators_pod_monitor_is_selected_by_a_kube_prometheus_stack_prometheus(
        kube_api, namespace, prometheus_operator):
    custom = client.CustomObjectsApi(kube_api)
    labels = chart_default_labels()
    assert labels == {"release": RELEASE}, "the chart's default is kube-prometheus-stack's (docs/operator.md)"

    # the engine container's port as the pod declares it: by name, else by number
    named = b.build_pod_monitor(policy("chat"), namespace, b.metrics_port_ref({"ports": [{"name": "serve",
                                                                                           "containerPort": 8080}]}),
                                labels=labels)
    numbered = b.build_pod_monitor(policy("code"), namespace, b.metrics_port_ref({"ports": [{"containerPort": 9000}]}),
                                   labels=b.pod_monitor_labels(labels, {"team": "ml"}))
    unlabelled = b.build_pod_monitor(policy("other"), namespace, "http")  # what the operator made before the labels
    for mon in (named, numbered, unlabelled):
        custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "podmonitors", mon)
    custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "prometheuses",
                                           po.kube_prometheus_stack_prometheus(namespace))

    def job_name(mon: dict) -> str:
        return f"podMonitor/{namespace}/{mon['metadata']['name']}/0"

    try:
        config = wait_until(
            lambda: (lambda c: c if {job_name(named), job_name(numbered)} <= set(jobs(c)) else None)(
                generated_config(kube_api, namespace)),
            90, "the Prometheus Operator's generated config with both labelled PodMonitors' jobs", 1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nconfig: {jobs(generated_config(kube_api, namespace)).keys()}\n"
                             f"Prometheus Operator log:\n{prometheus_operator()}") from None
    by_name = jobs(config)

    # a PodMonitor without the label kube-prometheus-stack selects on is not scraped
    assert job_name(unlabelled) not in by_name, sorted(by_name)
    assert all(not j.startswith(f"podMonitor/{namespace}/{unlabelled['metadata']['name']}/") for j in by_name)

    for mon in (named, numbered):
        job = by_name[job_name(mon)]
        assert job["scrape_interval"] == "5s" and job["metrics_path"] == "/metrics", job
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "pod" and sd["namespaces"]["names"] == [namespace], sd
        relabel = job["relabel_configs"]
        keeps = {tuple(r["source_labels"]): r["regex"] for r in relabel
                 if r.get("action") == "keep" and r.get("source_labels")}
        # its selector: the policy's pods (name and namespace), canary and control only
        policy_name = mon["metadata"]["labels"]["lookahead.dev/policy"]
        assert any(src[0] == "__meta_kubernetes_pod_label_lookahead_dev_policy" and regex.startswith(f"({policy_name})")
                   for src, regex in keeps.items()), keeps
        assert any(src[0] == "__meta_kubernetes_pod_label_lookahead_dev_policy_namespace"
                   and regex.startswith(f"({POLICY_NAMESPACE})") for src, regex in keeps.items()), keeps
        assert any(src[0] == "__meta_kubernetes_pod_label_lookahead_dev_role" and "canary|control" in regex
                   for src, regex in keeps.items()), keeps
        # our relabelling: the pod labels the queries rely on, and the pod's name
        for k in ("role", "policy", "policy_namespace", "target"):
            assert {"source_labels": [f"__meta_kubernetes_pod_label_lookahead_dev_{k}"],
                    "target_label": f"lookahead_dev_{k}"}.items() <= _first(relabel, f"lookahead_dev_{k}").items()
        assert _first(relabel, "pod")["source_labels"] == ["__meta_kubernetes_pod_name"]

    # the port: by name (the engine container's port name as it is) ...
    named_keeps = _keeps(by_name[job_name(named)])
    assert named_keeps.get(("__meta_kubernetes_pod_container_port_name",)) == "serve", named_keeps
    # ... or, for a port without a name, by number (portNumber, and our relabelling keeping it)
    numbered_keeps = _keeps(by_name[job_name(numbered)])
    assert numbered_keeps.get(("__meta_kubernetes_pod_container_port_number",)) == "9000", numbered_keeps
    assert ("__meta_kubernetes_pod_container_port_name",) not in numbered_keeps

    # the policy's labels over the chart's reached the PodMonitor the Prometheus picked
    stored = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "podmonitors",
                                                 numbered["metadata"]["name"])
    assert stored["metadata"]["labels"]["release"] == RELEASE and stored["metadata"]["labels"]["team"] == "ml"


def _first(relabel: list[dict], target_label: str) -> dict:
    found = [r for r in relabel if r.get("target_label") == target_label]
    assert found, f"no relabelling to {target_label} in {relabel}"
    return found[-1]  # ours come after the Prometheus Operator's own


def _keeps(job: dict) -> dict[tuple, str]:
    return {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"]
            if r.get("action") == "keep" and r.get("source_labels")}


def test_the_same_pod_monitor_under_another_release_is_picked_when_the_policy_names_it(
        kube_api, namespace, prometheus_operator):
    """A policy scraped by another kube-prometheus-stack release (or the chart installed with
    another podMonitor.labels.release) sets its own value over the chart's: a Prometheus selecting
    that release picks it, kube-prometheus-stack's default one does not."""
    custom = client.CustomObjectsApi(kube_api)
    name = unique_name("monitoring")
    prom = po.kube_prometheus_stack_prometheus(namespace)
    prom["metadata"]["name"] = name
    for key in ("podMonitorSelector", "serviceMonitorSelector", "probeSelector", "ruleSelector"):
        prom["spec"][key] = {"matchLabels": {"release": name}}
    mon = b.build_pod_monitor(policy("summarize"), namespace, "http",
                              labels=b.pod_monitor_labels(chart_default_labels(), {"release": name}))
    custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "podmonitors", mon)
    custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", namespace, "prometheuses", prom)
    job = f"podMonitor/{namespace}/{mon['metadata']['name']}/0"

    def config_of(prometheus: str) -> dict | None:
        return generated_config(kube_api, namespace, prometheus)

    try:
        wait_until(lambda: job in jobs(config_of(name)), 90, f"{job} in prometheus-{name}", 1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nPrometheus Operator log:\n{prometheus_operator()}") from None
    # the default release's Prometheus (the first test's, regenerated on the PodMonitor's creation) does not pick it
    time.sleep(3)
    assert job not in jobs(config_of(PROMETHEUS))
