"""The Prometheus Operator as kube-prometheus-stack runs it, for tests: its CRDs, the operator
itself (a host process on the admin kubeconfig) and the images of the Prometheus it manages.

Everything is built here from source by ``hack/build-prometheus-operator.sh`` (the operator, the
config reloader, the CRDs: Prometheus Operator v0.85.0) and ``hack/build-prometheus.sh`` (Prometheus
with Kubernetes service discovery); nothing is downloaded at run time.

* ``crds_installed(api)``: a context manager that installs the CRDs, waits for them to be
  Established, and removes those it created at its end. The CRDs are cluster-wide and two test
  processes (pytest-xdist workers) may want them at once, so it holds a machine-wide lock
  (``flock``) meanwhile: one user at a time, and no user sees them vanish under it.
* ``pack_images(dir)``: the ``prometheus`` and ``prometheus-config-reloader`` images (one layer:
  the static binary in ``/bin``, upstream's entrypoints, a non-root user), as OCI archives a
  ``DevRegistry`` pushes (their references name them as upstream does: ``quay.io/prometheus/...``).
* ``PrometheusOperator``: the operator process, watching the namespaces it is given.
* ``kube_prometheus_stack_prometheus(...)``: a ``Prometheus`` with kube-prometheus-stack's default
  selectors (``release: <release>`` from every namespace).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import yaml

from lookahead_dev.devcluster import DevClusterError, _Proc, cache_dir, free_port, prometheus_sd_binary, wait_for

#: the release hack/build-prometheus-operator.sh builds (keep in step)
PO_VERSION = "v0.85.0"
BUILD = "`bash hack/build-prometheus-operator.sh` (`make prometheus-operator`; `make deps` does it)"
#: kube-prometheus-stack's Helm release name in the tests; its Prometheus picks monitors labelled release=<this>
RELEASE = "kube-prometheus-stack"
LOCK = Path(tempfile.gettempdir()) / "lookahead-prometheus-operator-crds.lock"
REPO = Path(__file__).resolve().parents[1]


def root() -> Path:
    return cache_dir() / f"prometheus-operator-{PO_VERSION}"


def binary(name: str = "operator") -> Path:
    """``operator`` or ``prometheus-config-reloader``, as built; a clear error when it is not."""
    path = root() / "bin" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise DevClusterError(f"the Prometheus Operator is not built ({path} missing): run {BUILD}")
    return path


class _CRDLoader(yaml.SafeLoader):
    """PyYAML resolves a bare ``=`` (an enum value in the Prometheus Operator's CRDs: relabel
    actions) to the YAML 1.1 "value" tag it has no constructor for; it is the string "="."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def crd_docs(path: Path) -> list[dict]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_CRDLoader) if d]


def crd_files() -> list[Path]:
    files = sorted((root() / "crds").glob("monitoring.coreos.com_*.yaml"))
    if not files:
        raise DevClusterError(f"no Prometheus Operator CRDs under {root() / 'crds'}: run {BUILD}")
    return files


@contextlib.contextmanager
def crds_installed(api_client, lock_timeout: float = 600.0) -> Iterator[list[str]]:
    """The CRDs installed for the block (see the module doc); yields their names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    files = crd_files()
    LOCK.touch(exist_ok=True)
    with open(LOCK, "r+") as lock:
        def locked() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        wait_for(locked, lock_timeout, f"the Prometheus Operator CRDs' lock ({LOCK}): another test holds them",
                 interval=0.5)
        ext = client.ApiextensionsV1Api(api_client)
        docs = [d for f in files for d in crd_docs(f)]
        created: list[str] = []
        names = [d["metadata"]["name"] for d in docs]

        def gone(which: list[str]) -> bool:
            for name in which:
                try:
                    ext.read_custom_resource_definition(name)
                    return False
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return True

        def terminating() -> list[str]:
            out = []
            for name in names:
                try:
                    if ext.read_custom_resource_definition(name).metadata.deletion_timestamp:
                        out.append(name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return out

        try:
            # one still being deleted (by a holder killed before its own wait below) refuses every
            # object of its kind until it is gone: wait, then create afresh
            ending = terminating()
            if ending:
                wait_for(lambda: gone(ending), 120, f"CRDs {ending} deleted", interval=0.5)
            for crd in docs:
                try:
                    ext.create_custom_resource_definition(crd)
                    created.append(crd["metadata"]["name"])
                except ApiException as exc:
                    if exc.status != 409:
                        raise

            def established() -> bool:
                for name in names:
                    conds = ext.read_custom_resource_definition(name).status.conditions or []
                    if not any(c.type == "Established" and c.status == "True" for c in conds):
                        return False
                return True

            wait_for(established, 60, "the Prometheus Operator's CRDs Established", interval=0.5)
            yield names
        finally:
            try:
                for name in created:
                    try:
                        ext.delete_custom_resource_definition(name)
                    except ApiException as exc:
                        if exc.status != 404:
                            raise
                # gone before the next holder looks: a terminating CRD still reads Established but
                # refuses to create objects of its kind ("create not allowed while custom resource
                # definition is terminating")
                try:
                    wait_for(lambda: gone(created), 120, "the Prometheus Operator's CRDs deleted", interval=0.5)
                except TimeoutError as exc:  # say what holds them (the apiserver's condition)
                    stuck = []
                    for name in created:
                        try:
                            crd = ext.read_custom_resource_definition(name)
                        except ApiException:
                            continue
                        conds = [f"{c.type}={c.status} {c.reason}: {c.message}" for c in crd.status.conditions or []
                                 if c.type in ("Terminating", "NamesAccepted") or c.status != "True"]
                        stuck.append(f"{name}: {conds}")
                    raise TimeoutError(f"{exc}; still there: {stuck}") from None
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def image_references() -> dict[str, str]:
    """What the packed images call themselves (as upstream publishes them)."""
    prom_version = prometheus_sd_binary().parents[1].name.removeprefix("prometheus-")
    return {"prometheus": f"quay.io/prometheus/prometheus:{prom_version}",
            "prometheus-config-reloader": f"quay.io/prometheus-operator/prometheus-config-reloader:{PO_VERSION}"}


def pack_images(out_dir: Path) -> dict[str, Path]:
    """The two images as OCI archives under ``out_dir`` (a few seconds: one gzip of each binary)."""
    sys.path.insert(0, str(REPO / "images"))
    try:
        import ocipack
    finally:
        sys.path.pop(0)
    refs = image_references()
    sources = {"prometheus": prometheus_sd_binary(), "prometheus-config-reloader": binary("prometheus-config-reloader")}
    out: dict[str, Path] = {}
    for name, src in sources.items():
        rootfs = out_dir / f"{name}-rootfs"
        (rootfs / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, rootfs / "bin" / name)
        os.chmod(rootfs / "bin" / name, 0o755)
        archive = out_dir / f"{name}.oci.tar"
        # upstream's images: the binary as entrypoint, user nobody (the Prometheus Operator sets
        # only args for prometheus and the command for the reloader)
        ocipack.pack([rootfs], refs[name], archive, entrypoint=[f"/bin/{name}"], user="65534:65534")
        out[name] = archive
    return out


class PrometheusOperator:
    """The operator as a host process on ``kubeconfig``, watching ``namespaces`` only, making its
    Prometheus pods with ``reloader_image``. ``stop()`` ends it (the test's ``finally``)."""

    def __init__(self, kubeconfig: Path, namespaces: Sequence[str], reloader_image: str, log: Path):
        self.kubeconfig, self.namespaces, self.reloader_image, self.log = kubeconfig, list(namespaces), reloader_image, log
        self.proc: _Proc | None = None

    def start(self) -> "PrometheusOperator":
        env = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir(), "KUBECONFIG": str(self.kubeconfig)}
        self.proc = _Proc("prometheus-operator", [
            str(binary()), f"--namespaces={','.join(self.namespaces)}",
            f"--web.listen-address=127.0.0.1:{free_port()}", "--kubelet-endpoints=false",
            f"--prometheus-config-reloader={self.reloader_image}"], self.log, env=env)
        return self   # (a bad flag ends it at once: the callers' waits check ``dead``)

    def dead(self) -> str | None:
        return self.proc.dead() if self.proc else "not started"

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            proc, self.proc = self.proc, None
            proc.stop()


def kube_prometheus_stack_prometheus(namespace: str, name: str = f"{RELEASE}-prometheus", *, image: str | None = None,
                                     version: str | None = None, service_account: str | None = None,
                                     scrape_interval: str = "30s") -> dict:
    """A Prometheus with kube-prometheus-stack's default selectors (its prometheus.yaml template
    with the *SelectorNilUsesHelmValues: true defaults): release=<release>, from every namespace."""
    release = {"matchLabels": {"release": RELEASE}}
    spec: dict = {"replicas": 1, "scrapeInterval": scrape_interval,
                  "podMonitorSelector": release, "podMonitorNamespaceSelector": {},
                  "serviceMonitorSelector": release, "serviceMonitorNamespaceSelector": {},
                  "probeSelector": release, "probeNamespaceSelector": {},
                  "ruleSelector": release, "ruleNamespaceSelector": {}}
    if image:
        spec["image"] = image
    if version:
        spec["version"] = version
    if service_account:
        spec["serviceAccountName"] = service_account
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": name, "namespace": namespace, "labels": {"release": RELEASE}},
            "spec": spec}

