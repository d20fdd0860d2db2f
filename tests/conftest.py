"""Shared fixtures for the real local control plane, a real node, and Prometheus.

All three are session-scoped: started once when a test first asks for them, stopped at the end.
They never skip: when a binary is missing they fail with the command that builds or installs it.

One real node per machine at a time: every test that starts one is put in the xdist group
``node`` (``pytest -n 2 --dist loadgroup`` runs that group in one worker, one test after another,
and everything else beside it in the other worker).
"""

from __future__ import annotations

import pytest

from pathlib import Path

from lookahead_dev.devcluster import DevCluster, DevClusterError, DevPrometheus

REPO = Path(__file__).resolve().parents[1]


def _start(component) -> str | None:
    """Start a DevCluster/DevPrometheus; on failure clean it up and return the reason."""
    try:
        component.start()
    except (DevClusterError, TimeoutError) as exc:
        component.stop()
        return str(exc)
    return None


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory):
    """A running DevCluster (etcd + kube-apiserver + kube-controller-manager), ready for a real
    node (``real_node``): its apiserver also answers Pods on the pod bridge's host address.

    Has ``.kubeconfig`` (path), ``.server`` (URL), ``.api_client()``, and ``.pod_subnet``.
    """
    from lookahead_dev.node import DevNode

    state = tmp_path_factory.mktemp("devcluster") / "cluster"
    subnet = DevNode.pick_subnet()
    cluster = DevCluster(state, **DevNode.cluster_args(state, subnet))
    cluster.pod_subnet = subnet
    failure = _start(cluster)
    if failure:
        pytest.fail(f"could not start the local control plane: {failure}", pytrace=False)
    yield cluster
    cluster.stop()


class RealNode:
    """The session's real node (``lookahead_dev.node.DevNode``: containerd, CNI, kubelet,
    kube-scheduler) on ``devcluster``, with the operator, engine and load-generator images and
    the chart in its registry (``node.registry``, ``node.charts``). Started by the first ``get()``; ``stop()`` (test_node's cleanup check does) stops
    it, and a later ``get()`` starts a fresh one. One node per machine at a time."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.node = None

    def get(self):
        from lookahead_dev.node import DevNode, DevNodeError, image_archive

        if self.node is None:
            try:
                images = [image_archive(k) for k in ("operator", "engine", "loadgen")]
                # the images and the chart go to the node's registry; the kubelet and Helm pull them
                node = DevNode(self.cluster, subnet=str(self.cluster.pod_subnet), images=images,
                               charts=[REPO / "charts" / "lookahead-operator"])
                node.start()
            except (DevNodeError, DevClusterError, TimeoutError) as exc:
                pytest.fail(f"could not start the real node: {exc}; `make deps` builds it "
                            "(hack/build-node.sh, hack/build-images.sh)", pytrace=False)
            self.node = node
        return self.node

    def stop(self):
        if self.node is not None:
            node, self.node = self.node, None
            node.stop()


@pytest.fixture(scope="session")
def real_node_holder(devcluster):
    holder = RealNode(devcluster)
    yield holder
    holder.stop()


@pytest.fixture(scope="module")
def real_node(real_node_holder):
    """The running real node (started on first use; a module that stops it gets a fresh one)."""
    return real_node_holder.get()


@pytest.fixture(scope="session")
def kube_api(devcluster):
    """A ``kubernetes.client.ApiClient`` logged in as the cluster admin (system:masters)."""
    api = devcluster.api_client()
    yield api
    api.close()


@pytest.fixture(scope="session")
def prometheus():
    """A running DevPrometheus; tests point it at targets with ``set_targets``."""
    prom = DevPrometheus()
    failure = _start(prom)
    if failure:
        pytest.fail(f"could not start Prometheus: {failure}", pytrace=False)
    yield prom
    prom.stop()


@pytest.fixture(scope="session")
def pod_prometheus(devcluster, real_node_holder, tmp_path_factory):
    """Prometheus as a user runs it for pods: Kubernetes pod discovery against the apiserver and
    the scrape jobs of docs/analyze.md (``kubernetes_pod_jobs``), built with Kubernetes service
    discovery by hack/build-prometheus.sh. It listens on every address so that an operator Pod
    reaches it at the pod bridge's host address, which ``.url`` names, and through the Service
    ``prometheus.monitoring:9090`` (``.service_url``, the shipped example's default)."""
    from lookahead_dev.devcluster import kubernetes_pod_jobs, prometheus_sd_binary

    node = real_node_holder.get()
    try:
        binary = prometheus_sd_binary()
    except DevClusterError as exc:
        pytest.fail(str(exc), pytrace=False)
    prom = DevPrometheus(tmp_path_factory.mktemp("pod-prometheus"), binary=binary, listen_host="0.0.0.0",
                         advertise_host=node.gateway, scrape_configs=kubernetes_pod_jobs(devcluster.kubeconfig))
    failure = _start(prom)
    if failure:
        pytest.fail(f"could not start Prometheus with pod discovery: {failure}", pytrace=False)
    # and behind a Service, as users run it: the shipped example's URL resolves (CoreDNS) and
    # routes (kube-proxy) to it from Pods
    from lookahead_dev.node import PROMETHEUS_SERVICE, publish_host_service

    api = devcluster.api_client()
    try:
        prom.service_url = publish_host_service(api, *PROMETHEUS_SERVICE, node.gateway, prom.port)
    finally:
        api.close()
    yield prom
    prom.stop()


# Every test that starts or stops a real node asks for ``real_node_holder``: the session's node
# (behind ``real_node``, the end-to-end operator and ``pod_prometheus``), and the two that stop it to
# start their own (test_node.py's module fixture ``env``, `devcluster up` in test_controlplane.py).
@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every test that uses the real node in the xdist group ``node``."""
    for item in items:
        if "real_node_holder" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("node"))
