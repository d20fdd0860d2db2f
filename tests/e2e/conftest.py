"""End-to-end fixtures: the CRD installed in the real apiserver, the real node that runs every
Pod (engines, canaries, controls, load Jobs) from the locally built images, Prometheus discovering
those Pods as a user's does, and the operator either installed by `helm install` of the chart as a
Pod on that node (``operator_pod``: the user's path) or run as a `kopf run` process on the host
(``operator_process``: what the kill/restart tests need, with the better diagnostics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from lookahead_canary import process
from lookahead_dev.devcluster import control_plane_binary, free_port, wait_for
from lookahead_dev.node import image_name, registry_repository

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
    def __init__(self, kubeconfig: str, log_dir: Path, namespace: str | None = None):
        """``namespace``: watch that one only, as a namespaced install does (``--namespace`` and
        ``LOOKAHEAD_WATCH_NAMESPACE``); None: every namespace."""
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.namespace = namespace
        self.proc: subprocess.Popen | None = None
        self.metrics_port = free_port()
        self.starts = 0

    def start(self, extra_env: dict[str, str] | None = None, chaos: bool = False) -> None:
        """``chaos``: through tests/e2e/chaos_operator.py, which adds a test-side fault point
        (``LOOKAHEAD_TEST_DIE_MID_WAVE`` in ``extra_env``); the operator is otherwise the same."""
        self.starts += 1
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "LOOKAHEAD_POLL_SECONDS": "1",
               "LOOKAHEAD_LOADGEN_IMAGE": image_name("loadgen"),
               "LOOKAHEAD_METRICS_PORT": str(self.metrics_port), "LOOKAHEAD_METRICS_ADDR": "127.0.0.1",
               "PYTHONUNBUFFERED": "1",
               # as a cluster admin would list it: test_faults' two-namespace policy (fault-rollout-a
               # reaching fault-rollout-b); every other policy targets its own namespace. (A
               # namespaced operator reaches no other namespace: the two settings exclude each other.)
               **({"LOOKAHEAD_WATCH_NAMESPACE": self.namespace} if self.namespace else
                  {"LOOKAHEAD_CROSS_NAMESPACE_TARGETS": json.dumps({"fault-rollout-a": ["fault-rollout-b"]})}),
               **(extra_env or {})}
        entry = [str(Path(__file__).with_name("chaos_operator.py"))] if chaos else ["-m", "kopf"]
        scope = [f"--namespace={self.namespace}"] if self.namespace else ["--all-namespaces"]
        self.proc = process.start([sys.executable, *entry, "run", "--standalone", *scope, "-m",
                                   "lookahead_operator.runtime.handlers"], self.log_dir / f"operator-{self.starts}.log",
                                  env=env, cwd=REPO)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_up(self, timeout: float = 60) -> None:
        """Until its metrics endpoint answers (the operator's startup handlers ran)."""
        import urllib.request

        def up():
            if not self.alive():
                return True   # died (a fault point fired): nothing to wait for
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2):
                    return True
            except OSError:
                return False

        wait_for(up, timeout=timeout, what="operator up", interval=0.2)

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


@pytest.fixture
def apis(kube_api):
    """(apps, core, custom objects, batch) clients on the session's apiserver."""
    return (client.AppsV1Api(kube_api), client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api),
            client.BatchV1Api(kube_api))


@pytest.fixture(autouse=True)
def fresh_namespaces(request, kube_api):
    """Each test's namespaces are deleted when it ends (while its operator still runs, so that
    policies' finalizers restore their targets): on the real node, a finished test's engines
    would otherwise keep their CPU requests and leave the next test's load Jobs unschedulable on
    this 2-core machine. Deleting a namespace under a live policy is also a fault users make: its
    Deployments go first, and the policy's finalizer must still finish (it once wedged on their
    404s, and the namespace with it). A namespace still there after 120 s fails the test. (In a
    module whose scenarios run together, tests/e2e/together.py, its ``running`` fixture does this
    for all of them at once.)"""
    if "running" in request.fixturenames:
        yield
        return
    from .helpers import delete_namespaces, namespace_names

    core = client.CoreV1Api(kube_api)
    before = namespace_names(core)
    yield
    delete_namespaces(core, namespace_names(core) - before, timeout=120)


@pytest.fixture(autouse=True)
def invariants(request, kube_api, crd_installed):
    """The invariants of lookahead_dev.invariants, checked on every watch event throughout each
    end-to-end test (targets' templates exact or exactly promoted, one canary and one control,
    no orphans, load within its concurrency, decisions backed by wins, allowed phase moves).

    ``strict_decisions=False``: a regime-aware promotion at the deadline may leave a planned batch
    size above the measured wins unsettled (lookahead stays off there, by design: issue 11); the
    check is then that every batch size where lookahead is switched on has a settled Wins row.
    (In a module whose scenarios run together, one watcher sees them all: ``running.watcher``.)"""
    from lookahead_dev.invariants import InvariantWatcher

    if "running" in request.fixturenames:
        yield request.getfixturevalue("running").watcher
        return

    watcher = InvariantWatcher(kube_api, strict_decisions=False)
    watcher.start()
    assert watcher.wait_synced(30), watcher.events()[-5:]
    yield watcher
    watcher.stop()
    watcher.assert_clean()


@pytest.fixture(scope="session")
def prometheus(pod_prometheus):
    """In end-to-end tests, the Prometheus that discovers Pods through the apiserver (its ``url``
    is reachable from Pods)."""
    return pod_prometheus


@pytest.fixture(scope="module")
def operator_process(devcluster, crd_installed, real_node, prometheus, tmp_path_factory):
    """One operator per test module, stopped at its end: a live operator must not reconcile the
    policies that later (integration) tests write by hand into the same cluster."""
    op = OperatorProcess(devcluster.kubeconfig, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


class OperatorPod:
    """The operator as a user installs it: `helm install oci://...` of the chart from the node's
    registry, its image pulled from there too (README, "Install on a cluster"), running as a Pod
    on the real node."""

    RELEASE, NAMESPACE = "lookahead", "lookahead-system"

    def __init__(self, cluster, node):
        self.cluster, self.node = cluster, node
        self.installed_in: float | None = None

    def _tool(self, name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        # the node's registry serves HTTPS with a CA of its own, which Helm trusts as a cluster
        # admin's machine trusts a private registry's (SSL_CERT_FILE)
        return subprocess.run([str(control_plane_binary(name)), f"--kubeconfig={self.cluster.kubeconfig}", *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.node.registry.client_env()})

    def install(self, *extra: str) -> None:
        """``extra``: more `helm install` arguments (``--set replicaCount=2`` ...)."""
        t0 = time.monotonic()
        extra_env = [{"name": "LOOKAHEAD_POLL_SECONDS", "value": "1"}]
        chart = yaml.safe_load((REPO / "charts" / "lookahead-operator" / "Chart.yaml").read_text())
        res = self._tool(
            "helm", "install", self.RELEASE, self.node.charts["lookahead-operator"], "--version", chart["version"],
            "--namespace", self.NAMESPACE, "--create-namespace",
            # the user's own registry (README): the operator image, and with it the default
            # load-generator image, are pulled from there
            "--set", f"image.repository={registry_repository(self.node.registry.address)}",
            # The session's CRD is already installed (crd_installed) for the tests that run the
            # operator on the host; Helm refuses to adopt an object it did not create.
            "--set", "crds.install=false",
            # 1 s polls keep the shortened policies short (the tests' steps last seconds, not minutes)
            "--set-json", f"operator.extraEnv={json.dumps(extra_env)}",
            *extra, "--wait", "--timeout", "150s")
        if res.returncode != 0:
            raise AssertionError(f"helm install failed:\n{res.stdout}\n{res.stderr}\n{self.describe()}")
        self.installed_in = time.monotonic() - t0

    def uninstall(self) -> None:
        self._tool("helm", "uninstall", self.RELEASE, "--namespace", self.NAMESPACE, "--wait", "--timeout", "60s")

    def describe(self) -> str:
        return self._tool("kubectl", "-n", self.NAMESPACE, "describe", "pods").stdout[-3000:] + self.log()

    def pods(self) -> list[str]:
        res = self._tool("kubectl", "-n", self.NAMESPACE, "get", "pods", "-o", "name", "-l",
                         f"app.kubernetes.io/instance={self.RELEASE}", "--field-selector=status.phase=Running",
                         timeout=30)
        return sorted(line.split("/", 1)[1] for line in res.stdout.split() if line.startswith("pod/"))

    def pod_log(self, pod: str) -> str:
        res = self._tool("kubectl", "-n", self.NAMESPACE, "logs", pod, timeout=30)
        return res.stdout + res.stderr

    def log(self) -> str:
        """`kubectl logs` of the operator's Deployment (what a user reads)."""
        res = self._tool("kubectl", "-n", self.NAMESPACE, "logs", f"deployment/{self.RELEASE}-lookahead-operator",
                         "--tail=400", timeout=30)
        return res.stdout + res.stderr


@pytest.fixture(scope="module")
def operator_pod(devcluster, crd_installed, real_node, prometheus):
    """The operator installed by `helm install` for one test module, uninstalled at its end."""
    op = OperatorPod(devcluster, real_node)
    op.install()
    yield op
    op.uninstall()


@pytest.fixture
def reliability(request):
    """A fault test's row of docs/reliability.md: ``expect()`` before the fault, ``observed()``
    after; the row is written when the test ends, passed or failed."""
    from . import reliability as rel
    from .together import recorder_of

    rec = recorder_of(request) or rel.Recorder(request.node.nodeid)
    yield rec
    if rec.row is None:
        return
    report = getattr(request.node, "rep_call", None)
    rec.row.passed = bool(report is not None and report.passed)
    rows = rel.load()
    rows[rec.row.test] = rec.row
    e2e = rel.REPO / "tests" / "e2e"
    rel.save(rows, existing_tests={str(p.relative_to(rel.REPO)) for p in [*e2e.glob("test_*.py"), e2e / "soak.py"]})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item (the ``reliability`` fixture reads whether the test passed)."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
