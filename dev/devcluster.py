"""A real local Kubernetes control plane and Prometheus, for tests and for use by hand.

``DevCluster`` runs real ``etcd``, ``kube-apiserver`` and ``kube-controller-manager`` processes
(built from the Go module proxy by ``bash hack/build-control-plane.sh`` into
``${LOOKAHEAD_CACHE:-~/.cache/lookahead-rollout}/controlplane-<version>/bin``) on free loopback
ports, with RBAC authorization, service-account tokens, and an admin kubeconfig. A real node
(kubelet, containerd, CNI, kube-scheduler) joins it with ``lookahead_dev.node.DevNode``.

``DevPrometheus`` runs Debian's ``/usr/bin/prometheus`` on a free loopback port, scraping every
second the targets written by ``set_targets`` (file-based service discovery); or, with
``binary=prometheus_sd_binary()`` and ``scrape_configs=kubernetes_pod_jobs(kubeconfig)``, the
Prometheus of ``hack/build-prometheus.sh`` discovering Pods through the apiserver as a user's does.

By hand::

    python -m lookahead_dev.devcluster up       # prints `export KUBECONFIG=...` and the Prometheus URL
    export PATH=$LOOKAHEAD_CACHE/controlplane-<version>/bin:$PATH   # kubectl, helm
    python -m lookahead_dev.devcluster status
    python -m lookahead_dev.devcluster down

``up`` also starts a real node (``python -m lookahead_dev.node``, detached) with the operator,
engine and load-generator images imported, and a Prometheus that discovers Pods with the scrape
jobs of docs/analyze.md; ``--no-node`` skips both (control plane and a file-SD Prometheus only).
``down`` stops the node first, which deletes its Pods and leaves nothing on the machine. The state directory (certificates, etcd data, logs, kubeconfig, PIDs) is ``--state-dir``, else
``$LOOKAHEAD_DEVCLUSTER_DIR``, else ``./.cluster``.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

from lookahead_canary import process

# Keep in step with K8S_VERSION in hack/build-control-plane.sh (a test checks it).
K8S_VERSION = "v1.36.3"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
BUILD_HINT = "run `bash hack/build-control-plane.sh` (or `make control-plane`) first"

T = TypeVar("T")


class DevClusterError(RuntimeError):
    """A component of the local control plane is missing or did not start."""


# --------------------------------------------------------------------------------------------
# small helpers


def cache_dir() -> Path:
    return Path(os.environ.get("LOOKAHEAD_CACHE") or Path.home() / ".cache" / "lookahead-rollout")


def control_plane_bin_dir() -> Path:
    """Where the built binaries live (``$LOOKAHEAD_CONTROLPLANE_BIN`` overrides)."""
    override = os.environ.get("LOOKAHEAD_CONTROLPLANE_BIN")
    if override:
        return Path(override)
    return cache_dir() / f"controlplane-{K8S_VERSION}" / "bin"


def control_plane_binary(name: str) -> Path:
    """Path of one built binary (etcd, kube-apiserver, kube-controller-manager, helm, kubectl).

    Raises ``DevClusterError`` saying how to build it when it is missing.
    """
    path = control_plane_bin_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise DevClusterError(f"{name} not found at {path}: {BUILD_HINT}")
    return path


def prometheus_binary() -> Path:
    found = os.environ.get("LOOKAHEAD_PROMETHEUS_BIN") or shutil.which("prometheus") or "/usr/bin/prometheus"
    path = Path(found)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise DevClusterError(
            f"prometheus not found at {path}: run `bash hack/install-system-deps.sh` "
            "(installs Debian's prometheus package)"
        )
    return path


def _version_key(path: Path) -> tuple[int, ...]:
    """(3, 16, 0) for .../prometheus-v3.16.0/bin/prometheus: v3.9 sorts before v3.16, unlike as text."""
    return tuple(int(n) for n in re.findall(r"\d+", path.parents[1].name.split("-", 1)[-1]))


def prometheus_sd_binary() -> Path:
    """The Prometheus built with Kubernetes service discovery by ``hack/build-prometheus.sh``."""
    found = os.environ.get("LOOKAHEAD_PROMETHEUS_SD_BIN")
    candidates = [Path(found)] if found else sorted(cache_dir().glob("prometheus-*/bin/prometheus"),
                                                    key=_version_key, reverse=True)  # the newest build first
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise DevClusterError("no Prometheus with Kubernetes service discovery: run `bash hack/build-prometheus.sh` "
                          "(make deps does; Debian's prometheus is built without it)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.1,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy; raise ``TimeoutError`` after ``timeout``.

    Exceptions from ``condition`` count as "not yet". ``alive`` returns an error message when
    something we wait on has died, to fail at once instead of at the timeout.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last_exc = exc
        if alive is not None:
            dead = alive()
            if dead:
                raise DevClusterError(f"while waiting for {what}: {dead}")
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


_pid_alive = process.pid_alive
kill_process_group = process.kill_process_group


class _Proc:
    """A child process in its own session, with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.popen = process.start(self.argv, log, env=env)
        self.pid = self.popen.pid

    def dead(self) -> str | None:
        code = self.popen.poll()
        if code is None:
            return None
        return f"{self.name} exited with code {code}; last lines of {self.log}:\n{_tail(self.log)}"

    def stop(self, timeout: float = 10.0) -> None:
        process.stop(self.popen, timeout)


def _first_dead(procs: Iterable[_Proc]) -> Callable[[], str | None]:
    def check() -> str | None:
        for p in procs:
            msg = p.dead()
            if msg:
                return msg
        return None

    return check


# --------------------------------------------------------------------------------------------
# certificates (openssl CLI; EC P-256 keys are quick to make)


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        raise DevClusterError(f"openssl {' '.join(args)} failed: {res.stderr.strip()}")


def _ec_key(path: Path) -> None:
    # genpkey writes PKCS#8, which every consumer (apiserver, controller-manager, Python ssl) reads.
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path),
             cwd=path.parent)


def _sign(pki: Path, name: str, subject: str, usage: str, sans: Sequence[str] = ()) -> None:
    _ec_key(pki / f"{name}.key")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "825", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=pki,
    )


def generate_pki(pki: Path, extra_sans: Sequence[str] = ()) -> None:
    """CA, apiserver serving cert, admin (system:masters) and controller-manager client certs,
    and the service-account signing key pair. ``extra_sans`` (``IP:...``/``DNS:...``) are added to
    the apiserver's certificate (a real node's Pods reach it at the pod bridge's host address)."""
    pki.mkdir(parents=True, exist_ok=True)
    _ec_key(pki / "ca.key")
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=lookahead-dev-ca", "-days", "3650",
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt",
        cwd=pki,
    )
    _sign(
        pki, "apiserver", "/CN=kube-apiserver", "serverAuth",
        ["IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
         "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local", *extra_sans],
    )
    _sign(pki, "admin", "/O=system:masters/CN=lookahead-dev-admin", "clientAuth")
    _sign(pki, "controller-manager", "/CN=system:kube-controller-manager", "clientAuth")
    _ec_key(pki / "sa.key")
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for p in pki.glob("*.key"):
        p.chmod(0o600)


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lookahead-dev", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
        "contexts": [{"name": "lookahead-dev", "context": {"cluster": "lookahead-dev", "user": user}}],
        "current-context": "lookahead-dev",
    }
    # JSON is valid YAML; kubectl and the Python client both read it.
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)


# --------------------------------------------------------------------------------------------
# the control plane


class DevCluster:
    """etcd + kube-apiserver + kube-controller-manager on loopback.

    ``DevCluster(state_dir=None).start()`` generates certificates, starts the three processes,
    waits until ``/readyz`` answers and the controller-manager has created the ``default``
    ServiceAccount, and writes an admin kubeconfig. ``stop()`` kills them and, for a temporary
    state dir, removes it. Also a context manager.

    Unless ``detached=True`` (used by the CLI), the processes are also stopped when this Python
    process exits. ``DevCluster.attach(state_dir)`` finds detached ones again from
    ``cluster.json``.
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, *, detached: bool = False,
                 start_timeout: float = 90.0, apiserver_args: Sequence[str] = (), bind_address: str = "127.0.0.1",
                 extra_sans: Sequence[str] = (), advertise_address: str = "127.0.0.1"):
        self.apiserver_args = list(apiserver_args)  # extra kube-apiserver flags (e.g. an audit log)
        # 127.0.0.1 unless Pods of a real node must reach the apiserver (lookahead_dev.node.DevNode.cluster_args)
        self.bind_address = bind_address
        # the address the ``kubernetes`` Service's endpoint names (what in-cluster clients reach)
        self.advertise_address = advertise_address
        self.extra_sans = list(extra_sans)
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="lookahead-devcluster-"))
        self.detached = detached
        self.start_timeout = start_timeout
        self.pki = self.state_dir / "pki"
        self.logs = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.etcd_port = 0
        self.apiserver_port = 0
        self._procs: list[_Proc] = []
        self._pids: dict[str, int] = {}
        self.started_in: float | None = None

    # accessors ------------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig_path(self) -> str:
        return str(self.kubeconfig)

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def pids(self) -> dict[str, int]:
        return dict(self._pids)

    def api_client(self):
        """A ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    # lifecycle ------------------------------------------------------------------------------
    def start(self) -> "DevCluster":
        t0 = time.monotonic()
        bins = {n: control_plane_binary(n) for n in ("etcd", "kube-apiserver", "kube-controller-manager")}
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        generate_pki(self.pki, self.extra_sans)
        try:
            self._start_etcd(bins["etcd"])
            self._start_apiserver(bins["kube-apiserver"])
            self._start_controller_manager(bins["kube-controller-manager"])
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        self._write_state()
        if not self.detached:
            atexit.register(self.stop)
        return self

    def _spawn(self, name: str, argv: Sequence[str]) -> _Proc:
        proc = _Proc(name, argv, self.logs / f"{name}.log")
        self._procs.append(proc)
        self._pids[name] = proc.pid
        return proc

    def _start_etcd(self, binary: Path) -> None:
        self.etcd_port, peer = free_port(), free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            str(binary),
            "--name=dev",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=dev={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # test data only; makes writes much faster
            "--log-level=warn",
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"

        wait_for(healthy, self.start_timeout, "etcd /health", alive=_first_dead(self._procs))

    def restart_apiserver(self) -> float:
        """Stop the kube-apiserver (SIGTERM, as a control-plane upgrade or a crash-restart does) and
        start it again on the same address; returns the seconds it was unreachable. What talks to
        it (the operator, the kubelet, Prometheus' discovery, watchers) must reconnect by itself."""
        old = next(p for p in self._procs if p.name == "kube-apiserver")
        t0 = time.monotonic()
        old.stop()
        self._procs.remove(old)
        self._start_apiserver(control_plane_binary("kube-apiserver"), port=self.apiserver_port)
        return time.monotonic() - t0

    def _start_apiserver(self, binary: Path, port: int | None = None) -> None:
        self.apiserver_port = port or free_port()
        pki = self.pki
        self._spawn("kube-apiserver", [
            str(binary),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.bind_address}",
            f"--advertise-address={self.advertise_address}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # The `kubernetes` Service's endpoint: the advertised address, which Pods on a real node
            # reach (the pod bridge's host address, DevNode.cluster_args); 127.0.0.1 may not be an
            # Endpoints address, so then the Service is left without one.
            f"--endpoint-reconciler-type={'none' if self.advertise_address == '127.0.0.1' else 'lease'}",
            "--profiling=false",
            "--v=0",
            *self.apiserver_args,
        ])
        self.write_admin_kubeconfig()
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=5, context=ctx) as r:
                return r.status == 200

        wait_for(ready, self.start_timeout, "kube-apiserver /readyz", interval=0.2, alive=_first_dead(self._procs))

    def write_admin_kubeconfig(self) -> None:
        write_kubeconfig(self.kubeconfig, self.server, self.pki / "ca.crt", self.pki / "admin.crt",
                         self.pki / "admin.key", "lookahead-dev-admin")

    def _start_controller_manager(self, binary: Path) -> None:
        pki = self.pki
        kcm_kubeconfig = self.state_dir / "controller-manager.kubeconfig"
        write_kubeconfig(kcm_kubeconfig, self.server, pki / "ca.crt", pki / "controller-manager.crt",
                         pki / "controller-manager.key", "system:kube-controller-manager")
        self._spawn("kube-controller-manager", [
            str(binary),
            f"--kubeconfig={kcm_kubeconfig}",
            f"--authentication-kubeconfig={kcm_kubeconfig}",
            f"--authorization-kubeconfig={kcm_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.state_dir / 'controller-manager-certs'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            "--controllers=*",
            "--leader-elect=false",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allocate-node-cidrs=false",
            "--profiling=false",
            "--v=0",
        ])
        # The controller-manager is working once its serviceaccount controller has made the
        # `default` ServiceAccount (Pods cannot be admitted before that).
        from kubernetes import client

        api = self.api_client()
        core = client.CoreV1Api(api)

        def default_sa() -> bool:
            core.read_namespaced_service_account("default", "default")
            return True

        try:
            wait_for(default_sa, self.start_timeout, "kube-controller-manager to create the default ServiceAccount",
                     interval=0.2, alive=_first_dead(self._procs))
        finally:
            api.close()

    def _write_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "etcd_port": self.etcd_port,
            "apiserver_port": self.apiserver_port,
            "pids": self._pids,
        }
        (self.state_dir / "cluster.json").write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str]) -> "DevCluster":
        """A handle on a cluster started detached into ``state_dir`` (by the CLI)."""
        d = Path(state_dir)
        state = json.loads((d / "cluster.json").read_text())
        c = cls(d, detached=True)
        c.etcd_port = state["etcd_port"]
        c.apiserver_port = state["apiserver_port"]
        c._pids = {k: int(v) for k, v in state["pids"].items()}
        return c

    def running(self) -> dict[str, bool]:
        return {name: _pid_alive(pid) for name, pid in self._pids.items()}

    def ready(self) -> bool:
        try:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=5, context=ctx) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def stop(self) -> None:
        # Reverse start order: controller-manager, apiserver, etcd.
        if self._procs:
            for proc in reversed(self._procs):
                proc.stop()
        else:
            for pid in reversed(list(self._pids.values())):
                kill_process_group(pid)
        self._procs.clear()
        self._pids.clear()
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "DevCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# Prometheus


REPO = Path(__file__).resolve().parents[1]


def documented_scrape_job(doc: Path = REPO / "docs" / "analyze.md") -> dict:
    """The ``lookahead`` job of the first YAML block of docs/analyze.md that defines it: the plain
    Prometheus configuration users are told to run, read from the page so that tests cannot drift
    from it."""
    import re

    import yaml

    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S) if "job_name: lookahead" in b]
    if not blocks:
        raise DevClusterError(f"{doc} has no scrape config with job_name: lookahead")
    jobs = [j for j in yaml.safe_load(blocks[0])["scrape_configs"] if j["job_name"] == "lookahead"]
    if len(jobs) != 1:
        raise DevClusterError(f"{doc}: expected one job named lookahead, found {len(jobs)}")
    return jobs[0]


def kubernetes_pod_jobs(kubeconfig: str | os.PathLike[str], interval: str = "1s") -> list[dict]:
    """What a user's Prometheus runs, through real Kubernetes pod discovery:

    * ``lookahead-pods``: the documented job (canary and control pods), relabel rules as on the page;
    * ``kubernetes-pods``: the common annotation-driven job for every other pod annotated
      ``prometheus.io/scrape: "true"`` (the fleet: the preflight and the guard read it by
      ``namespace`` and ``pod``, as docs/analyze.md says such a job must label them).

    ``interval`` replaces the scrape interval (1 s in tests; the page says at most the policy's
    sampleInterval)."""
    sd = [{"role": "pod", "kubeconfig_file": str(kubeconfig)}]
    ours = {**documented_scrape_job(), "job_name": "lookahead-pods", "scrape_interval": interval,
            "scrape_timeout": interval}
    if ours.pop("kubernetes_sd_configs") != [{"role": "pod"}]:
        raise DevClusterError("docs/analyze.md's job no longer discovers pods with kubernetes_sd_configs: [{role: pod}]")
    ours["kubernetes_sd_configs"] = sd
    fleet = {
        "job_name": "kubernetes-pods", "scrape_interval": interval, "scrape_timeout": interval,
        "kubernetes_sd_configs": sd,
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "regex": "true",
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_label_lookahead_dev_role"], "regex": ".+", "action": "drop"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"], "regex": "(.+)",
             "target_label": "__metrics_path__"},
            {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
             "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2", "target_label": "__address__"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }
    return [ours, fleet]


class DevPrometheus:
    """Debian's Prometheus on a free loopback port, scraping the targets given to ``set_targets``.

    Each target is a mapping ``{"address": "127.0.0.1:PORT", "labels": {...}, "path": "/metrics"}``
    (``labels`` and ``path`` optional); they are written atomically to a file-SD JSON file that
    Prometheus re-reads within about a second. Scrape and evaluation interval: 1 s. Job name:
    ``lookahead`` unless a target's labels set ``job``.
    """

    JOB = "lookahead"

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, *, scrape_interval: str = "1s",
                 start_timeout: float = 60.0, detached: bool = False, listen_host: str = "127.0.0.1",
                 scrape_configs: Sequence[Mapping] = (), binary: str | os.PathLike[str] | None = None,
                 advertise_host: str = "127.0.0.1", web_config: Mapping | None = None):
        # ``scrape_configs``: more jobs beside the file-SD one (e.g. Kubernetes pod discovery, which
        # needs ``binary`` = the Prometheus of hack/build-prometheus.sh: Debian's lacks it).
        # ``web_config``: Prometheus' --web.config.file (``basic_auth_users`` with bcrypt hashes,
        # ``tls_server_config`` with absolute cert_file/key_file paths); with TLS the URL is https.
        # ``listen_host`` 0.0.0.0 lets Pods of a real node reach it at the pod bridge's host address.
        self.scrape_configs = [dict(c) for c in scrape_configs]
        self.web_config = dict(web_config) if web_config else None
        self.binary = Path(binary) if binary else None
        self.listen_host = listen_host
        self.advertise_host = advertise_host  # the host in ``url`` (the pod bridge's address for Pods)
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="lookahead-prometheus-"))
        self.scrape_interval = scrape_interval
        self.detached = detached
        self.start_timeout = start_timeout
        self.config_file = self.state_dir / "prometheus.yml"
        self.targets_file = self.state_dir / "targets.json"
        self.port = 0
        self._proc: _Proc | None = None
        self.pid: int | None = None
        self._targets: dict[str, list[dict]] = {}
        self._targets_lock = threading.Lock()

    @property
    def url(self) -> str:
        scheme = "https" if self.web_config and self.web_config.get("tls_server_config") else "http"
        return f"{scheme}://{self.advertise_host}:{self.port}"

    def start(self, *, same_port: bool = False) -> "DevPrometheus":
        """``same_port``: come back where a ``kill``ed one listened, on its data, so that the URLs
        handed out (policies name it) stay valid; its file-SD targets are kept."""
        binary = self.binary or prometheus_binary()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not same_port:
            self._write_targets([])
        i = self.scrape_interval
        config = {
            "global": {"scrape_interval": i, "scrape_timeout": i, "evaluation_interval": i},
            "scrape_configs": [
                {"job_name": self.JOB,
                 "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}]},
                *self.scrape_configs,
            ],
        }
        self.config_file.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
        web_args = []
        if self.web_config:
            web_file = self.state_dir / "web.yml"
            web_file.write_text(json.dumps(self.web_config, indent=1) + "\n")
            web_args = [f"--web.config.file={web_file}"]
        if not (same_port and self.port):
            self.port = free_port()
        self._proc = _Proc("prometheus", [
            str(binary),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.state_dir / 'data'}",
            f"--web.listen-address={self.listen_host}:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
            *web_args,
            # pod discovery hands new targets to the scrapers after this (default 5 s)
            *(["--scrape.discovery-reload-interval=1s"] if self.scrape_configs else []),
        ], self.state_dir / "prometheus.log")
        self.pid = self._proc.pid

        # behind a web config, readiness is only "it answers": a 401 to a request without credentials,
        # over TLS not verified here (the callers verify with their CA)
        tls = ssl._create_unverified_context() if self.url.startswith("https:") else None

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2, context=tls) as r:
                    return r.status == 200
            except urllib.error.HTTPError as exc:
                if self.web_config and exc.code == 401:
                    return True
                raise

        try:
            wait_for(ready, self.start_timeout, "prometheus /-/ready", interval=0.1, alive=self._proc.dead)
        except BaseException:
            self.stop()
            raise
        (self.state_dir / "prometheus.json").write_text(json.dumps({"port": self.port, "pid": self.pid}) + "\n")
        if not self.detached:
            atexit.register(self.stop)
        return self

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str]) -> "DevPrometheus":
        """A handle on a Prometheus started (by the CLI) into ``state_dir``. Its ``set_targets``
        rewrites the whole targets file, so one process at a time should own the targets."""
        d = Path(state_dir)
        state = json.loads((d / "prometheus.json").read_text())
        p = cls(d, detached=True)
        p._own_dir = False
        p.port, p.pid = int(state["port"]), int(state["pid"])
        return p

    def _write_targets(self, groups: list[dict]) -> None:
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1) + "\n")
        os.replace(tmp, self.targets_file)

    def set_targets(self, targets: Sequence[Mapping], source: str = "default") -> None:
        """Replace the scrape targets of ``source`` (see the class docstring for a target's shape).

        Several writers (tests) can share one Prometheus: each owns the targets
        under its own ``source`` name, and the file holds the union.
        """
        with self._targets_lock:
            self._targets[source] = [dict(t) for t in targets]
            groups = []
            for t in (t for ts in self._targets.values() for t in ts):
                labels = {str(k): str(v) for k, v in (t.get("labels") or {}).items()}
                if t.get("path"):
                    labels["__metrics_path__"] = str(t["path"])
                groups.append({"targets": [str(t["address"])], "labels": labels})
            self._write_targets(groups)

    @property
    def targets(self) -> list[dict]:
        """Every current target, all sources together."""
        return [dict(t) for ts in self._targets.values() for t in ts]

    def client(self):
        """A ``prometheus_api_client.PrometheusConnect`` for this server."""
        from prometheus_api_client import PrometheusConnect

        return PrometheusConnect(url=self.url, disable_ssl=True)

    def query(self, promql: str) -> list[dict]:
        return self.client().custom_query(query=promql)

    def wait_target_up(self, address: str, timeout: float = 30.0) -> list[dict]:
        """Wait until ``up{instance=address}`` is 1; returns the query result (with its labels)."""
        prom = self.client()

        def up() -> list[dict] | None:
            res = prom.custom_query(query=f'up{{instance="{address}"}}')
            return res if res and all(r["value"][1] == "1" for r in res) else None

        return wait_for(up, timeout, f"prometheus to scrape {address}", interval=0.25,
                        alive=self._proc.dead if self._proc else None)

    def kill(self) -> None:
        """SIGKILL, as when its node dies: no clean shutdown (the next ``start(same_port=True)``
        replays the TSDB's write-ahead log). The state directory is kept."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.popen.wait(10)
            self._proc = None
        self.pid = None

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        elif self.pid:
            kill_process_group(self.pid)
        self.pid = None
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "DevPrometheus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# CLI


def default_state_dir() -> Path:
    return Path(os.environ.get("LOOKAHEAD_DEVCLUSTER_DIR") or ".cluster").absolute()


def _load_state(d: Path) -> dict | None:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _ours(pid: int, d: Path) -> bool:
    """Is ``pid`` still one of the processes started into state dir ``d`` (and not a reused PID)?
    Every one of them has a path under ``d`` on its command line."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return (str(d).rstrip("/") + "/") in cmdline and _pid_alive(pid)


def _alive(state: dict, d: Path) -> dict[str, bool]:
    return {name: _ours(int(pid), d) for name, pid in state.get("pids", {}).items()}


def _exports(state: dict) -> str:
    return (
        f"export KUBECONFIG={state['kubeconfig']}\n"
        f"export LOOKAHEAD_PROMETHEUS_URL={state['prometheus_url']}\n"
        f"# apiserver: {state['server']}   prometheus: {state['prometheus_url']} (reachable from Pods)\n"
        f"# binaries (kubectl, helm): {state['bin_dir']}"
        + (f"\n# real node {state['node']} (pod network {state['pod_subnet']}); Pods reach the apiserver through "
           f"the kubernetes Service (its endpoint {state['pod_gateway']}:{state['apiserver_port']})"
           f"\n# and Prometheus by its Service name, {state.get('prometheus_service_url')} (kube-proxy, CoreDNS)"
           f"\n# images and chart in the node's registry {state.get('registry')} (HTTPS; clients trust "
           f"SSL_CERT_FILE={state.get('registry_ca')}): helm install lookahead "
           f"oci://{state.get('registry')}/charts/lookahead-operator --version <chart version> "
           f"--set image.repository={state.get('registry')}/lookahead-rollout/lookahead-rollout"
           if state.get("node") else "")
    )


def cmd_up(d: Path, node: bool = True) -> int:
    """Start (detached) the control plane, a real node (``python -m lookahead_dev.node``) and a
    Prometheus that discovers Pods as docs/analyze.md's configuration does; idempotent."""
    state = _load_state(d)
    if state and all(_alive(state, d).values()) and DevCluster.attach(d / "cluster").ready():
        print("# dev cluster already running", file=sys.stderr)
        print(_exports(state))
        return 0
    if state:
        _stop_state(state, d)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t0 = time.monotonic()
    pids: dict[str, int] = {}
    extra: dict = {}
    try:
        if node:
            from lookahead_dev.node import DevNode, image_archive, node_binary

            for name in ("kubelet", "containerd"):
                node_binary(name)
            for kind in ("operator", "engine", "loadgen"):
                image_archive(kind)
            sd_binary = prometheus_sd_binary()
            subnet = DevNode.pick_subnet(str(d))
            cluster = DevCluster(d / "cluster", detached=True, **DevNode.cluster_args(d / "cluster", subnet))
        else:
            cluster = DevCluster(d / "cluster", detached=True)
        cluster.start()
        pids.update(cluster.pids)
        if node:
            gateway = str(subnet.network_address + 1)
            pids["node"] = _start_node(d, subnet)
            prom = DevPrometheus(d / "prometheus", detached=True, binary=sd_binary, listen_host="0.0.0.0",
                                 advertise_host=gateway, scrape_configs=kubernetes_pod_jobs(cluster.kubeconfig, "5s"))
            node_info = json.loads((d / "node" / "node.json").read_text())
            extra = {"node": node_info["name"], "registry": node_info["registry"],
                     "registry_ca": node_info["registry_ca"], "pod_subnet": str(subnet),
                     "pod_gateway": gateway, "apiserver_port": cluster.apiserver_port}
        else:
            prom = DevPrometheus(d / "prometheus", detached=True)
        prom.start()
        pids["prometheus"] = prom.pid
        if node:
            from lookahead_dev.node import PROMETHEUS_SERVICE, publish_host_service

            api = cluster.api_client()
            try:
                extra["prometheus_service_url"] = publish_host_service(api, *PROMETHEUS_SERVICE, gateway, prom.port)
            finally:
                api.close()
    except BaseException:
        _stop_state({"pids": pids}, d)
        raise
    state = {
        "server": cluster.server,
        "kubeconfig": str(cluster.kubeconfig),
        "prometheus_url": prom.url,
        "prometheus_targets_file": str(prom.targets_file),
        "bin_dir": str(control_plane_bin_dir()),
        "pids": pids,
        **extra,
    }
    (d / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    print(f"# dev cluster up in {time.monotonic() - t0:.1f} s (state: {d})", file=sys.stderr)
    print(_exports(state))
    return 0


def _start_node(d: Path, subnet) -> int:
    """Run ``python -m lookahead_dev.node`` detached; wait until it says its Node is Ready."""
    proc = _Proc("node", [sys.executable, "-m", "lookahead_dev.node", "--cluster-dir", str(d / "cluster"),
                          "--state-dir", str(d / "node"), "--subnet", str(subnet)], d / "node.log")

    def ready() -> bool:
        return '"ready"' in (d / "node.log").read_text(errors="replace")

    try:
        wait_for(ready, 240, "the real node to be Ready (images pushed to its registry)", interval=0.2,
                 alive=proc.dead)
    except BaseException:
        proc.stop(timeout=120)
        raise
    return proc.pid


def _stop_state(state: dict, d: Path) -> None:
    order = ["prometheus", "node", "kube-controller-manager", "kube-apiserver", "etcd"]
    pids = state.get("pids", {})
    for name in sorted(pids, key=lambda n: order.index(n) if n in order else -1):
        if _ours(int(pids[name]), d):
            # The node deletes its Pods and cleans the machine on SIGTERM; give it time to.
            kill_process_group(int(pids[name]), timeout=120 if name == "node" else 10)


def cmd_down(d: Path) -> int:
    state = _load_state(d)
    if not state:
        print(f"# no dev cluster state in {d}", file=sys.stderr)
        return 0
    _stop_state(state, d)
    left = {}
    if state.get("node"):
        try:
            left = {k: v for k, v in json.loads((d / "node-leftovers.json").read_text()).items() if v}
        except (OSError, ValueError):
            left = {"report": [f"the node did not report its cleanup ({d / 'node.log'})"]}
    if left:
        print(f"devcluster: the node left things on this machine: {json.dumps(left)}", file=sys.stderr)
        return 1
    shutil.rmtree(d, ignore_errors=True)
    print(f"# dev cluster stopped and {d} removed", file=sys.stderr)
    return 0


def cmd_status(d: Path) -> int:
    state = _load_state(d)
    if not state:
        print(f"not running (no state in {d})")
        return 1
    alive = _alive(state, d)
    ready = DevCluster.attach(d / "cluster").ready()
    for name, ok in alive.items():
        print(f"{name:26s} pid {state['pids'][name]:>7}  {'running' if ok else 'DEAD'}")
    print(f"{'apiserver /readyz':26s} {'ok' if ready else 'NOT READY'}")
    print(_exports(state))
    return 0 if ready and all(alive.values()) else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lookahead_dev.devcluster", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="default: $LOOKAHEAD_DEVCLUSTER_DIR or ./.cluster")
    ap.add_argument("--no-node", action="store_true",
                    help="up: the control plane and a file-SD Prometheus only, no real node (nothing runs Pods)")
    args = ap.parse_args(argv)
    d = (args.state_dir or default_state_dir()).absolute()
    try:
        if args.command == "up":
            return cmd_up(d, node=not args.no_node)
        return {"down": cmd_down, "status": cmd_status}[args.command](d)
    except (DevClusterError, TimeoutError) as exc:
        print(f"devcluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
