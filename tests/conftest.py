"""Shared fixtures for the real local control plane, Prometheus and the Pod harness.

All three are session-scoped: started once when a test first asks for them, stopped at the end.
They never skip: when a binary is missing they fail with the command that builds or installs it.
"""

from __future__ import annotations

import pytest

from lookahead_dev.devcluster import DevCluster, DevClusterError, DevPrometheus


def _start(component) -> str | None:
    """Start a DevCluster/DevPrometheus; on failure clean it up and return the reason."""
    try:
        component.start()
    except (DevClusterError, TimeoutError) as exc:
        component.stop()
        return str(exc)
    return None


@pytest.fixture(scope="session")
def devcluster():
    """A running DevCluster (etcd + kube-apiserver + kube-controller-manager).

    Has ``.kubeconfig`` (path), ``.server`` (URL), ``.api_client()``.
    """
    cluster = DevCluster()
    failure = _start(cluster)
    if failure:
        pytest.fail(f"could not start the local control plane: {failure}", pytrace=False)
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
    failure = _start(prom)
    if failure:
        pytest.fail(f"could not start Prometheus: {failure}", pytrace=False)
    yield prom
    prom.stop()


@pytest.fixture(scope="session")
def pod_harness(devcluster, prometheus):
    """The kubelet stand-in (``lookahead_dev.podharness.PodHarness``) on Node
    ``lookahead-harness``: runs the Pods of the dev cluster as local processes in the repository
    root, and registers annotated ones as Prometheus targets."""
    from pathlib import Path

    from lookahead_dev.podharness import PodHarness

    harness = PodHarness(kubeconfig=devcluster.kubeconfig, prometheus=prometheus,
                         workdir=Path(__file__).resolve().parents[1])
    harness.start()
    yield harness
    harness.stop()
