"""Shared fixtures for the real local control plane, Prometheus and the Pod harness.

All three are session-scoped: started once when a test first asks for them, stopped at the end.
They never skip: when a binary is missing they fail with the command that builds or installs it.
"""

from __future__ import annotations

import pytest

from lookahead_operator.devcluster import DevCluster, DevClusterError, DevPrometheus


@pytest.fixture(scope="session")
def devcluster():
    """A running DevCluster (etcd + kube-apiserver + kube-controller-manager).

    Has ``.kubeconfig`` (path), ``.server`` (URL), ``.api_client()``.
    """
    cluster = DevCluster()
    try:
        cluster.start()
    except (DevClusterError, TimeoutError) as exc:
        pytest.fail(f"could not start the local control plane: {exc}", pytrace=False)
    yield cluster
    cluster.stop()


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
    try:
        prom.start()
    except (DevClusterError, TimeoutError) as exc:
        pytest.fail(f"could not start Prometheus: {exc}", pytrace=False)
    yield prom
    prom.stop()


@pytest.fixture(scope="session")
def pod_harness(devcluster, prometheus):
    """The kubelet stand-in (``lookahead_operator.podharness.PodHarness``) on Node
    ``lookahead-harness``: runs the Pods of the dev cluster as local processes in the repository
    root, and registers annotated ones as Prometheus targets."""
    from pathlib import Path

    from lookahead_operator.podharness import PodHarness

    harness = PodHarness(kubeconfig=devcluster.kubeconfig, prometheus=prometheus,
                         workdir=Path(__file__).resolve().parents[1])
    harness.start()
    yield harness
    harness.stop()
