"""A real OCI registry for the local cluster, so that the node pulls the project's images and Helm
installs the chart from a registry, as on any cluster (issue 24).

``DevRegistry(state_dir).start()`` runs CNCF distribution's ``registry serve`` (built from its Go
module by ``hack/build-registry.sh``) on ``REGISTRY_ADDRESS``, on loopback (what the node's
containerd, crane and Helm reach; nothing else can), over HTTPS with a certificate of its own CA,
as a real registry serves: clients trust that CA as a cluster trusts a private registry's
(``client_env()``: ``SSL_CERT_FILE`` for crane and Helm, Go programs; ``hosts_toml()`` for the
node's containerd), so they run with no ``--insecure`` or ``--plain-http``. It stores in
``state_dir`` and is stopped, storage and all, by ``stop()``. Images go in with ``crane push`` (go-containerregistry's
client, built by the same script), the chart with ``helm push``: the clients a user runs against
their own registry (README, "Install on a cluster")::

    reg = DevRegistry(tmp).start()
    ref = reg.push_archive(images_dir() / "engine.oci.tar")   # 127.0.0.1:5100/lookahead-rollout/...
    chart = reg.push_chart(REPO / "charts" / "lookahead-operator")  # oci://127.0.0.1:5100/charts/...
    subprocess.run(["helm", "install", "x", chart, ...], env={**os.environ, **reg.client_env()})
    reg.stop()

The address is fixed (``$LOOKAHEAD_DEV_REGISTRY`` overrides) so that image references can be
written before anything starts (``lookahead_dev.node.image_name``); one registry per machine at a
time, as one node.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

from lookahead_dev.devcluster import (DevClusterError, _ec_key, _openssl, _Proc, _sign, cache_dir, control_plane_binary,
                                      wait_for)

#: distribution's release, the version hack/build-registry.sh builds (keep in step).
REGISTRY_VERSION = "v3.1.2"
#: Where the node pulls from: loopback only (the node's containerd runs on this host), a port
#: outside Linux's ephemeral range so that no client's socket takes it.
REGISTRY_ADDRESS = os.environ.get("LOOKAHEAD_DEV_REGISTRY", "127.0.0.1:5100")
#: The repository path of the project's images in any registry: the chart's ``image.repository``
#: is ``<registry>/lookahead-rollout/lookahead-rollout`` (README, "Install on a cluster").
IMAGE_PATH = "lookahead-rollout/lookahead-rollout"
CHART_PATH = "charts"
BUILD_HINT = "run `bash hack/build-registry.sh` first (make deps does)"


class DevRegistryError(DevClusterError):
    """The registry or a client is missing, did not start, or a push failed."""


def registry_bin_dir() -> Path:
    return cache_dir() / f"registry-{REGISTRY_VERSION}" / "bin"


def registry_binary(name: str) -> Path:
    """``registry`` (distribution) or ``crane`` (go-containerregistry)."""
    path = registry_bin_dir() / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise DevRegistryError(f"{name} not found at {path}: {BUILD_HINT}")
    return path


def local_reference(archive_ref: str, registry: str = REGISTRY_ADDRESS) -> str:
    """The reference an image named ``archive_ref`` (``ghcr.io/lookahead-rollout/x:1``) has in
    ``registry``: the same path and tag, another registry host."""
    first, _, rest = archive_ref.partition("/")
    path = rest if ("." in first or ":" in first or first == "localhost") and rest else archive_ref
    return f"{registry}/{path}"


def archive_reference(archive: Path) -> str:
    """The full reference an OCI archive made by images/ocipack.py names itself by."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise DevRegistryError(f"{archive} has no index.json: not an OCI image archive")
        index = json.load(member)
    for manifest in index.get("manifests", []):
        name = (manifest.get("annotations") or {}).get("io.containerd.image.name")
        if name:
            return name
    raise DevRegistryError(f"{archive} names no image (annotation io.containerd.image.name)")


def _run(argv: list[str], timeout: float, what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``argv`` with ``env`` added to this process's environment; a failure or no answer within
    ``timeout`` s: ``DevRegistryError`` saying ``what`` and the client's last words."""
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired as exc:
        raise DevRegistryError(f"{what}: no answer after {timeout:.0f} s") from exc
    if res.returncode != 0:
        raise DevRegistryError(f"{what} failed ({res.returncode}): {(res.stderr or res.stdout).strip()[-2000:]}")
    return res


def crane_push(archive: Path, ref: str, *, env: dict[str, str] | None = None, timeout: float = 300.0) -> str:
    """Push an OCI image archive (an image layout, tarred) to ``ref`` with ``crane push`` (its
    credentials: ``crane auth login``'s, the Docker config's); returns the digest reference crane
    prints. ``env``: added to crane's environment (``DevRegistry.client_env``)."""
    with tempfile.TemporaryDirectory(prefix="lookahead-push-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        argv = [str(registry_binary("crane")), "push", tmp, ref]
        return _run(argv, timeout, f"crane push {archive.name} {ref}", env).stdout.strip()


class DevRegistry:
    """One distribution registry on ``address`` storing under ``state_dir`` (see the module doc)."""

    def __init__(self, state_dir: str | os.PathLike[str], address: str = REGISTRY_ADDRESS, start_timeout: float = 30.0):
        self.state_dir = Path(state_dir).absolute()
        self.address = address
        self.start_timeout = start_timeout
        self.proc: _Proc | None = None
        self.timings: dict[str, float] = {}

    @property
    def url(self) -> str:
        return f"https://{self.address}"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the registry's certificate: what its clients trust."""
        return self.pki / "ca.crt"

    def client_env(self) -> dict[str, str]:
        """What a Go client (crane, Helm) needs in its environment to trust this registry."""
        return {"SSL_CERT_FILE": str(self.ca_file)}

    def _make_certificates(self) -> None:
        """A CA of the registry's own, and a serving certificate for its address signed by it."""
        self.pki.mkdir(parents=True, exist_ok=True)
        _ec_key(self.pki / "ca.key")
        _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=lookahead-dev-registry-ca", "-days", "30",
                 "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt", cwd=self.pki)
        host = self.address.rsplit(":", 1)[0]
        san = f"IP:{host}" if host.replace(".", "").isdigit() else f"DNS:{host}"
        _sign(self.pki, "registry", f"/CN={host}", "serverAuth", [san])

    def config(self) -> str:
        return json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.state_dir / "storage")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.address, "secret": "lookahead-dev-registry",
                     "tls": {"certificate": str(self.pki / "registry.crt"), "key": str(self.pki / "registry.key")}},
        }, indent=2) + "\n"

    def _get(self, path: str, timeout: float):
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file.is_file() else None
        if ctx is None:  # before our CA exists: is anything at all serving there?
            ctx = ssl._create_unverified_context()  # noqa: S323 - only to detect another server
        return urllib.request.urlopen(f"{self.url}{path}", timeout=timeout, context=ctx)

    def answers(self) -> bool:
        try:
            with self._get("/v2/", 2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def start(self) -> "DevRegistry":
        binary = registry_binary("registry")
        registry_binary("crane")
        if self.answers():
            raise DevRegistryError(f"something already answers at {self.url}/v2/: another node's registry? "
                                   "(one per machine; `make cluster-down` stops a dev cluster's)")
        t0 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._make_certificates()
        cfg = self.state_dir / "config.yml"
        cfg.write_text(self.config())
        # distribution v3 exports traces by OpenTelemetry unless told not to (no network here)
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"}
        self.proc = _Proc("registry", [str(binary), "serve", str(cfg)], self.state_dir / "registry.log", env=env)
        try:
            wait_for(self.answers, self.start_timeout, f"the registry at {self.url}", interval=0.1,
                     alive=self.proc.dead)
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def push_archive(self, archive: str | os.PathLike[str]) -> str:
        """Push one OCI archive under its own path and tag; returns its reference here."""
        archive = Path(archive)
        ref = local_reference(archive_reference(archive), self.address)
        t0 = time.monotonic()
        crane_push(archive, ref, env=self.client_env())
        self.timings[f"push {archive.name}"] = time.monotonic() - t0
        return ref

    def push_chart(self, chart_dir: str | os.PathLike[str], timeout: float = 120.0) -> str:
        """``helm package`` the chart and ``helm push`` it; returns ``oci://<address>/charts/<name>``
        (``helm install`` it with ``--version`` the chart's version and ``client_env()``)."""
        helm = str(control_plane_binary("helm"))
        with tempfile.TemporaryDirectory(prefix="lookahead-chart-") as tmp:
            # Helm's registry config and cache in the temporary dir, never the user's
            env = {"HELM_CONFIG_HOME": f"{tmp}/config", "HELM_CACHE_HOME": f"{tmp}/cache",
                   "HELM_DATA_HOME": f"{tmp}/data", **self.client_env()}
            out = _run([helm, "package", str(chart_dir), "--destination", tmp], timeout, "helm package", env)
            package = out.stdout.strip().rsplit(":", 1)[-1].strip()
            _run([helm, "push", package, f"oci://{self.address}/{CHART_PATH}"], timeout, "helm push", env)
        return f"oci://{self.address}/{CHART_PATH}/{Path(chart_dir).name}"

    def copy(self, src: str, dst: str, timeout: float = 120.0) -> str:
        """``crane copy`` an image already in this registry to another reference here (another
        repository or tag, as a user re-tags and pushes); returns ``dst``."""
        _run([str(registry_binary("crane")), "copy", src, dst], timeout, f"crane copy {src} {dst}", self.client_env())
        return dst

    def catalog(self) -> list[str]:
        with self._get("/v2/_catalog", 5) as resp:
            return list(json.load(resp).get("repositories") or [])

    def hosts_toml(self) -> str:
        """containerd's registry host configuration (``certs.d/<address>/hosts.toml``): pull from
        this registry, trusting its CA."""
        return (f'server = "{self.url}"\n\n[host."{self.url}"]\n  capabilities = ["pull", "resolve"]\n'
                f'  ca = {json.dumps(str(self.ca_file))}\n')

    def stop(self) -> None:
        if self.proc is not None:
            proc, self.proc = self.proc, None
            proc.stop()
        shutil.rmtree(self.state_dir / "storage", ignore_errors=True)
        shutil.rmtree(self.pki, ignore_errors=True)
