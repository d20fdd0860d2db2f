"""End-to-end fixtures: the CRD installed in the real apiserver and the operator running as a
real `kopf run` process against it, with the pod harness standing in for kubelets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from lookahead_canary import process
from lookahead_dev.devcluster import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crd_installed(kube_api):
    ext = client.ApiextensionsV1Api(kube_api)
    body = yaml.safe_load((REPO / "crds" / "lookaheadpolicies.yaml").read_text())
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise

    def established():
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, timeout=30, what="CRD established")
    return body


class OperatorProcess:
    def __init__(self, kubeconfig: str, log_dir: Path):
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.metrics_port = free_port()
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "LOOKAHEAD_POLL_SECONDS": "1",
               "LOOKAHEAD_METRICS_PORT": str(self.metrics_port), "LOOKAHEAD_METRICS_ADDR": "127.0.0.1",
               "PYTHONUNBUFFERED": "1"}
        self.proc = process.start([sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces", "-m",
                                   "lookahead_operator.handlers"], self.log_dir / f"operator-{self.starts}.log",
                                  env=env, cwd=REPO)

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        process.stop(self.proc)
        self.proc = None

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.log_dir.glob("operator-*.log")))


@pytest.fixture(scope="module")
def operator_process(devcluster, crd_installed, pod_harness, tmp_path_factory):
    """One operator per test module, stopped at its end: a live operator must not reconcile the
    policies that later (integration) tests write by hand into the same cluster."""
    op = OperatorProcess(devcluster.kubeconfig, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
