"""A kubelet stand-in for tests: runs Pods of a real apiserver as local processes.

Nothing in this project runs containers, so ``PodHarness`` plays kubelet and scheduler for one
Node object against a real ``kube-apiserver`` (see ``lookahead_dev.devcluster``):

* It registers a Node (default name ``lookahead-harness``) that is ``Ready``, with address
  127.0.0.1, and keeps it alive (renews its Lease in ``kube-node-lease``).
* It watches Pods (all namespaces, or ``namespaces=[...]``, optionally ``label_selector``). A Pod
  that is unscheduled (no ``spec.nodeName``) and whose containers all have a ``command`` is bound
  to the Node (a ``Binding``, as the scheduler does). Pods without a ``command`` (an image-only
  container) are left alone: there is no image to run.
* For each Pod bound to the Node it starts every container as a local process, in its own
  process group: argv is ``command + args``, the working directory is ``workingDir`` if it
  exists, else the harness ``workdir`` (the repository root by default). Environment: the
  harness's own environment, then the container's ``env`` entries that have a literal
  ``value`` (``valueFrom`` is not supported and is skipped), then ``PORT``, ``POD_NAME``,
  ``POD_NAMESPACE``, ``POD_IP`` (127.0.0.1) and ``NODE_NAME``.

  **Addresses and ports, as in a cluster.** Each Pod gets its own loopback address
  (127.0.1.1, 127.0.1.2, ...: Linux routes all of 127.0.0.0/8 to loopback) as its ``podIP`` and
  ``POD_IP``, and one port shared by its containers: the first declared ``containerPort`` if any,
  else a free port. So ``http://<podIP>:<containerPort>`` reaches a Pod as it would in a cluster,
  and two Pods may both declare port 8000. The port is passed as the environment variable
  ``PORT``, and ``$(PORT)``/``$(POD_IP)`` in ``command`` and ``args`` are replaced, e.g.
  ``python3 -m lookahead_canary.server --host $(POD_IP) --port $(PORT)``: a process must listen on
  ``POD_IP:PORT`` (binding 0.0.0.0 would clash between Pods).
  Like Kubernetes, ``$(NAME)`` is expanded for every variable of the container's environment
  listed above (not the inherited host environment); ``$$(NAME)`` gives a literal ``$(NAME)``;
  unknown names are left as they are. Probe ports are ignored: probes go to ``POD_IP:PORT``.
* Status: once started, the Pod is ``Running`` with its ``podIP`` (``hostIP`` 127.0.0.1). It becomes
  ``Ready`` when every container's ``readinessProbe.httpGet.path`` answers HTTP 200 on
  ``POD_IP:PORT`` (probed every 0.2 s), or at once for containers without an HTTP readiness
  probe. When a process exits, the Pod's ``restartPolicy`` decides, as with a kubelet: with
  ``Always`` (every Deployment Pod), or ``OnFailure`` and a non-zero exit, the container is
  restarted in place after a doubling back-off of 1 s up to 30 s (state ``waiting``
  ``CrashLoopBackOff``, ``restartCount`` and ``lastState.terminated`` as a kubelet reports them;
  the Pod stays ``Running`` but not Ready). Otherwise the container stays terminated, and once
  all are, the Pod is ``Succeeded`` (all exited 0) or ``Failed``. ``PodHarness(...,
  restart_containers=False)`` never restarts: the first exit kills the Pod's other processes and
  marks it ``Failed`` (``Succeeded`` if all exited 0 and ``restartPolicy`` is not ``Always``), so a
  ReplicaSet replaces it.
* Deletion: when a Pod gets a ``deletionTimestamp`` (or disappears), its process groups are
  killed (SIGTERM, then SIGKILL after the grace period, at most 10 s) and the Pod object is
  removed (delete with grace period 0, as a kubelet does).
* Prometheus: when given a ``DevPrometheus``, every Pod whose (template) annotations say
  ``prometheus.io/scrape: "true"`` is a scrape target while its processes run: address
  ``POD_IP:PORT``, path ``prometheus.io/path`` (default ``/metrics``; ``prometheus.io/port``
  is ignored). Target labels: each Pod label, with its key sanitised to a Prometheus label name
  by ``prometheus_label_name`` (every character outside ``[a-zA-Z0-9_]`` becomes ``_``, a leading
  digit gets a ``_`` prefix, a leading ``__`` becomes ``label__``; so ``lookahead.dev/role`` is
  ``lookahead_dev_role`` and ``app.kubernetes.io/name`` is ``app_kubernetes_io_name``), then
  ``namespace`` and ``pod`` (the Pod's namespace and name), which win over a Pod label of the
  same sanitised name. The job label is ``lookahead``.

Process output goes to ``<log_dir>/<namespace>_<pod>_<container>.log`` (``logs()`` reads it).
``start()`` runs the work in background threads; ``stop()`` kills every process it started.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from .devcluster import DevPrometheus, K8S_VERSION, free_port, kill_process_group

log = logging.getLogger(__name__)

POD_IP = "127.0.0.1"
SCRAPE_ANNOTATION = "prometheus.io/scrape"
PATH_ANNOTATION = "prometheus.io/path"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def prometheus_label_name(key: str) -> str:
    """Sanitise a Kubernetes label key into a Prometheus label name (see the module docstring)."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    if not name or name[0].isdigit():
        name = "_" + name
    if name.startswith("__"):
        name = "label" + name
    return name


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` is a literal ``$``."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(sub, text)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def _iso(t: _dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Container:
    name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    probe_path: str | None
    log_path: Path
    popen: subprocess.Popen | None = None
    ready: bool = False
    exit_code: int | None = None  # set once the container is terminated for good
    started_at: _dt.datetime | None = None
    finished_at: _dt.datetime | None = None
    restart_count: int = 0
    restart_at: float | None = None  # time.monotonic() of the next start while in CrashLoopBackOff
    last_state: dict | None = None  # the previous run's "terminated" state, after a restart

    def spawn(self) -> None:
        self.restart_at = None
        self.started_at = _now()
        self.ready = self.probe_path is None
        try:
            with open(self.log_path, "ab") as out:
                self.popen = subprocess.Popen(self.argv, cwd=self.cwd, env={**os.environ, **self.env},
                                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
        except OSError as exc:
            self.popen = None
            self.ready = False
            with open(self.log_path, "a") as out:
                out.write(f"podharness: cannot start {self.argv!r}: {exc}\n")
            raise

    def terminated_state(self, code: int) -> dict:
        return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                               "startedAt": _iso(self.started_at or _now()),
                               "finishedAt": _iso(self.finished_at or _now())}}

    def state(self) -> dict:
        if self.exit_code is not None:
            return self.terminated_state(self.exit_code)
        if self.restart_at is not None:
            return {"waiting": {"reason": "CrashLoopBackOff",
                                "message": f"back-off restarting container {self.name} (restart {self.restart_count})"}}
        return {"running": {"startedAt": _iso(self.started_at or _now())}}


@dataclass
class RunningPod:
    """What the harness knows about one Pod it runs."""

    uid: str
    namespace: str
    name: str
    port: int
    ip: str
    labels: dict[str, str]
    annotations: dict[str, str]
    restart_policy: str
    containers: list[_Container] = field(default_factory=list)
    started_at: _dt.datetime = field(default_factory=_now)
    phase: str = "Pending"
    reported: tuple | None = None  # the last status we wrote, to avoid rewriting it
    deleting: bool = False

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ready(self) -> bool:
        return self.phase == "Running" and all(c.ready for c in self.containers)

    @property
    def pids(self) -> list[int]:
        return [c.popen.pid for c in self.containers if c.popen is not None]

    @property
    def restart_count(self) -> int:
        return sum(c.restart_count for c in self.containers)

    def scrape_target(self) -> dict | None:
        if self.annotations.get(SCRAPE_ANNOTATION, "").lower() != "true":
            return None
        labels = {prometheus_label_name(k): v for k, v in self.labels.items()}
        labels.update(namespace=self.namespace, pod=self.name)
        return {"address": self.address, "path": self.annotations.get(PATH_ANNOTATION) or "/metrics",
                "labels": labels}


class PodHarness:
    """Kubelet + scheduler stand-in for one Node. See the module docstring."""

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        prometheus: DevPrometheus | None = None,
        node_name: str = "lookahead-harness",
        namespaces: Sequence[str] | None = None,
        label_selector: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        lease_seconds: int = 40,
        restart_containers: bool = True,
    ):
        if api_client is None:
            if kubeconfig is None:
                raise ValueError("PodHarness needs api_client or kubeconfig")
            from kubernetes import config

            api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.prometheus = prometheus
        self.node_name = node_name
        self.namespaces = list(namespaces) if namespaces else None
        self.label_selector = label_selector
        self.workdir = Path(workdir) if workdir else Path.cwd()
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="lookahead-podharness-"))
        self.lease_seconds = lease_seconds
        self.restart_containers = restart_containers
        self._pods: dict[str, RunningPod] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch: watch.Watch | None = None
        self.errors: list[str] = []  # problems worth a look (shown by tests on failure)

    # public ---------------------------------------------------------------------------------
    def start(self) -> "PodHarness":
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._register_node()
        self._stop.clear()
        for target, name in ((self._watch_loop, "watch"), (self._tick_loop, "tick")):
            t = threading.Thread(target=target, name=f"podharness-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, delete_node: bool = True) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        for t in self._threads:
            t.join(timeout=15)
        self._threads.clear()
        with self._lock:
            pods = list(self._pods.values())
            self._pods.clear()
        for rp in pods:
            self._kill(rp)
        self._publish_targets()
        if delete_node:
            try:
                self.core.delete_node(self.node_name)
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("deleting node %s: %s", self.node_name, exc)
            except Exception as exc:  # noqa: BLE001 - the apiserver may already be gone
                log.warning("deleting node %s: %s", self.node_name, exc)
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "PodHarness":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pods(self) -> list[RunningPod]:
        with self._lock:
            return list(self._pods.values())

    def find(self, namespace: str, name: str) -> RunningPod | None:
        with self._lock:
            for rp in self._pods.values():
                if rp.namespace == namespace and rp.name == name:
                    return rp
        return None

    def logs(self, namespace: str, name: str, container: str | None = None) -> str:
        out = []
        for p in sorted(self.log_dir.glob(f"{namespace}_{name}_{container or '*'}.log")):
            out.append(p.read_text(errors="replace"))
        return "\n".join(out)

    # node -----------------------------------------------------------------------------------
    def _node_status(self) -> dict:
        now = _iso(_now())
        cond = {"lastHeartbeatTime": now, "lastTransitionTime": now}
        return {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "lookahead pod harness is running", **cond},
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", **cond},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", **cond},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", **cond},
            ],
            "addresses": [{"type": "InternalIP", "address": POD_IP}, {"type": "Hostname", "address": self.node_name}],
            "capacity": {"cpu": str(os.cpu_count() or 1), "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": str(os.cpu_count() or 1), "memory": "16Gi", "pods": "110"},
            "nodeInfo": {
                "kubeletVersion": K8S_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64", "containerRuntimeVersion": "lookahead-podharness://1",
                "osImage": "local processes", "kernelVersion": os.uname().release,
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        }

    def _register_node(self) -> None:
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {
                "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                "lookahead.dev/pod-harness": "true"}},
        }
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.core.patch_node_status(self.node_name, {"status": self._node_status()}, _content_type=STRATEGIC_PATCH)
        self._renew_lease()

    def _renew_lease(self) -> None:
        coord = client.CoordinationV1Api(self.api)
        now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": self.lease_seconds,
                         "renewTime": now}}
        try:
            coord.patch_namespaced_lease(self.node_name, "kube-node-lease", {"spec": body["spec"]},
                                         _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                raise
            coord.create_namespaced_lease("kube-node-lease", body)

    # loops ----------------------------------------------------------------------------------
    def _list_pods(self) -> tuple[list[Any], str]:
        kw = {"label_selector": self.label_selector} if self.label_selector else {}
        if self.namespaces:
            items, rv = [], ""
            for ns in self.namespaces:
                lst = self.core.list_namespaced_pod(ns, **kw)
                items.extend(lst.items)
                rv = lst.metadata.resource_version
            return items, rv
        lst = self.core.list_pod_for_all_namespaces(**kw)
        return list(lst.items), lst.metadata.resource_version

    def _watch_loop(self) -> None:
        """List, handle every Pod, then watch from that resourceVersion; relist on any error."""
        while not self._stop.is_set():
            try:
                items, rv = self._list_pods()
                seen = set()
                for pod in items:
                    seen.add(pod.metadata.uid)
                    self._handle(pod)
                with self._lock:
                    gone = [rp for uid, rp in self._pods.items() if uid not in seen]
                for rp in gone:
                    self._forget(rp)
                if self.namespaces and len(self.namespaces) > 1:
                    # Several namespaces: poll by relisting (each watch covers one namespace).
                    self._stop.wait(0.5)
                    continue
                self._watch = w = watch.Watch()
                kw: dict[str, Any] = {"resource_version": rv, "timeout_seconds": 5,
                                      "allow_watch_bookmarks": True}
                if self.label_selector:
                    kw["label_selector"] = self.label_selector
                if self.namespaces:
                    stream = w.stream(self.core.list_namespaced_pod, self.namespaces[0], **kw)
                else:
                    stream = w.stream(self.core.list_pod_for_all_namespaces, **kw)
                for event in stream:
                    if self._stop.is_set():
                        break
                    kind, pod = event["type"], event["object"]
                    if kind == "DELETED":
                        with self._lock:
                            rp = self._pods.get(pod.metadata.uid)
                        if rp is not None:
                            self._forget(rp)
                    elif kind in ("ADDED", "MODIFIED"):
                        self._handle(pod)
            except Exception as exc:  # noqa: BLE001 - keep the harness alive; relist
                if self._stop.is_set():
                    break
                self._note(f"watch: {exc!r}")
                self._stop.wait(0.5)

    def _tick_loop(self) -> None:
        """Readiness probes, process exits, status writes, Node heartbeat."""
        last_beat = time.monotonic()
        while not self._stop.wait(0.2):
            try:
                if time.monotonic() - last_beat >= 5:
                    self._renew_lease()
                    self.core.patch_node_status(self.node_name, {"status": self._node_status()},
                                                _content_type=STRATEGIC_PATCH)
                    last_beat = time.monotonic()
                for rp in self.pods():
                    self._check(rp)
            except Exception as exc:  # noqa: BLE001
                if self._stop.is_set():
                    break
                self._note(f"tick: {exc!r}")

    def _note(self, msg: str) -> None:
        log.warning("podharness: %s", msg)
        self.errors.append(msg)
        del self.errors[:-50]

    # pods -----------------------------------------------------------------------------------
    def _handle(self, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        with self._lock:
            rp = self._pods.get(meta.uid)
        if meta.deletion_timestamp is not None:
            if rp is not None:
                self._delete(rp)
            elif spec.node_name == self.node_name:
                self._finalise_delete(meta.namespace, meta.name, meta.uid)
            return
        if rp is not None:
            return
        if spec.node_name is None:
            if all(c.command for c in spec.containers):
                self._bind(pod)
            return
        if spec.node_name != self.node_name:
            return
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            return
        self._run(pod)

    def _bind(self, pod: Any) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace,
                             "uid": pod.metadata.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}}
        try:
            self.core.create_namespaced_pod_binding(pod.metadata.name, pod.metadata.namespace, body,
                                                    _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or bound meanwhile
                self._note(f"bind {pod.metadata.namespace}/{pod.metadata.name}: {exc.status} {exc.reason}")
        # The MODIFIED event with spec.nodeName set starts it.

    def _allocate_ip(self) -> str:
        """The next loopback address no running Pod holds (127.0.1.1 .. 127.0.254.254)."""
        with self._lock:
            taken = {rp.ip for rp in self._pods.values()}
            for _ in range(254 * 254):
                self._next_ip = getattr(self, "_next_ip", 0) % (254 * 254) + 1
                ip = f"127.0.{(self._next_ip - 1) // 254 + 1}.{(self._next_ip - 1) % 254 + 1}"
                if ip not in taken:
                    return ip
        raise RuntimeError("no free loopback address for a Pod")

    def _run(self, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        declared = [p.container_port for c in spec.containers for p in (c.ports or []) if p.container_port]
        port = declared[0] if declared else free_port()
        ip = self._allocate_ip()
        rp = RunningPod(uid=meta.uid, namespace=meta.namespace, name=meta.name, port=port, ip=ip,
                        labels=dict(meta.labels or {}), annotations=dict(meta.annotations or {}),
                        restart_policy=spec.restart_policy or "Always")
        with self._lock:
            if meta.uid in self._pods:
                return
            self._pods[meta.uid] = rp
        for c in spec.containers:
            env = {}
            for e in c.env or []:
                if e.value is not None:
                    env[e.name] = expand(e.value, env)
                elif e.value_from is None:
                    env[e.name] = ""
                else:
                    self._note(f"{meta.namespace}/{meta.name}/{c.name}: env {e.name} valueFrom is not supported")
            env.update(PORT=str(port), POD_NAME=meta.name, POD_NAMESPACE=meta.namespace, POD_IP=ip,
                       NODE_NAME=self.node_name)
            argv = [expand(a, env) for a in [*(c.command or []), *(c.args or [])]]
            probe = c.readiness_probe.http_get if c.readiness_probe and c.readiness_probe.http_get else None
            cwd = Path(c.working_dir) if c.working_dir and Path(c.working_dir).is_dir() else self.workdir
            cont = _Container(name=c.name, image=c.image or "", argv=argv, env=env, cwd=cwd,
                              probe_path=(probe.path or "/") if probe else None,
                              log_path=self.log_dir / f"{meta.namespace}_{meta.name}_{c.name}.log")
            rp.containers.append(cont)
            try:
                cont.spawn()
            except OSError:
                cont.exit_code, cont.finished_at = 127, _now()
        rp.phase = "Running"
        self._check(rp)
        self._publish_targets()

    def _probe(self, rp: RunningPod, cont: _Container) -> bool:
        try:
            with urllib.request.urlopen(f"http://{rp.address}{cont.probe_path}", timeout=1) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def _check(self, rp: RunningPod) -> None:
        if rp.deleting:
            return
        changed = False
        if rp.phase != "Running":
            self._report(rp)
            return
        for cont in rp.containers:
            if cont.exit_code is not None:
                continue
            if cont.restart_at is not None:
                if time.monotonic() >= cont.restart_at:
                    try:
                        cont.spawn()
                    except OSError:
                        cont.exit_code, cont.finished_at = 127, _now()
                    changed = True
                continue
            code = cont.popen.poll() if cont.popen is not None else None
            if code is not None:
                cont.finished_at, cont.ready, cont.popen = _now(), False, None
                restart = self.restart_containers and (
                    rp.restart_policy == "Always" or (rp.restart_policy == "OnFailure" and code != 0))
                if restart:
                    # Like the kubelet: restart in place after a doubling back-off (here 1 s .. 30 s).
                    cont.last_state = cont.terminated_state(code)
                    cont.restart_count += 1
                    cont.restart_at = time.monotonic() + min(2 ** (cont.restart_count - 1), 30)
                else:
                    cont.exit_code = code
                changed = True
            elif not cont.ready and cont.probe_path is not None:
                cont.ready = self._probe(rp, cont)
        done = [c for c in rp.containers if c.exit_code is not None]
        if done and (len(done) == len(rp.containers) or not self.restart_containers):
            ok = all(c.exit_code == 0 for c in done) and len(done) == len(rp.containers)
            rp.phase = "Succeeded" if ok and rp.restart_policy != "Always" else "Failed"
            self._kill(rp)  # without restarts a Pod is one unit: stop its other containers too
            changed = True
        self._report(rp)
        if changed:
            self._publish_targets()

    def _report(self, rp: RunningPod) -> None:
        key = (rp.phase, tuple((c.ready, c.exit_code, c.restart_count, c.restart_at is None) for c in rp.containers))
        if key == rp.reported:
            return
        now = _iso(_now())
        ready = "True" if rp.ready else "False"
        statuses = []
        for c in rp.containers:
            st = {"name": c.name, "image": c.image, "imageID": "", "ready": c.ready,
                  "started": c.popen is not None, "restartCount": c.restart_count, "state": c.state(),
                  "lastState": c.last_state or {},
                  "containerID": f"podharness://{c.popen.pid if c.popen else 0}"}
            statuses.append(st)
        status = {
            "phase": rp.phase,
            "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}],
            "podIP": rp.ip, "podIPs": [{"ip": rp.ip}],
            "startTime": _iso(rp.started_at),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _iso(rp.started_at)},
                {"type": "Initialized", "status": "True", "lastTransitionTime": _iso(rp.started_at)},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
            ],
            "containerStatuses": statuses,
        }
        try:
            self.core.patch_namespaced_pod_status(rp.name, rp.namespace, {"status": status},
                                                  _content_type=MERGE_PATCH)
            rp.reported = key
        except ApiException as exc:
            if exc.status == 404:
                self._forget(rp)
            else:
                self._note(f"status {rp.namespace}/{rp.name}: {exc.status} {exc.reason}")

    def _kill(self, rp: RunningPod, timeout: float = 10.0) -> None:
        for cont in rp.containers:
            if cont.popen is not None and cont.popen.poll() is None:
                kill_process_group(cont.popen.pid, timeout)
            if cont.popen is not None:
                try:
                    cont.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
                if cont.exit_code is None:
                    cont.exit_code, cont.finished_at = cont.popen.returncode, _now()
            elif cont.exit_code is None:  # waiting to restart
                cont.exit_code, cont.finished_at, cont.restart_at = 137, _now(), None

    def _delete(self, rp: RunningPod) -> None:
        with self._lock:
            if rp.deleting:
                return
            rp.deleting = True
        self._kill(rp)
        with self._lock:
            self._pods.pop(rp.uid, None)
        self._publish_targets()
        self._finalise_delete(rp.namespace, rp.name, rp.uid)

    def _finalise_delete(self, namespace: str, name: str, uid: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0,
                                            body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                  "gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
        except ApiException as exc:
            if exc.status not in (404, 409):
                self._note(f"delete {namespace}/{name}: {exc.status} {exc.reason}")

    def _forget(self, rp: RunningPod) -> None:
        """The Pod object is gone: stop its processes."""
        with self._lock:
            rp.deleting = True
            self._pods.pop(rp.uid, None)
        self._kill(rp)
        self._publish_targets()

    def _publish_targets(self) -> None:
        if self.prometheus is None:
            return
        with self._lock:
            targets = [t for rp in self._pods.values()
                       if rp.phase == "Running" and not rp.deleting and (t := rp.scrape_target())]
        self.prometheus.set_targets(targets, source=f"podharness:{self.node_name}")


def alive(pids: Iterable[int]) -> list[int]:
    """The PIDs among ``pids`` that still run, zombies excluded (a helper for tests; reaps nothing)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lookahead_dev.podharness --kubeconfig FILE [--prometheus-dir DIR]``: run the
    harness in the foreground until SIGTERM/SIGINT (``devcluster up`` starts it this way)."""
    import argparse
    import signal

    from .devcluster import DevPrometheus

    ap = argparse.ArgumentParser(prog="python -m lookahead_dev.podharness", description=main.__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--prometheus-dir", help="state dir of a DevPrometheus started by `devcluster up`")
    ap.add_argument("--node-name", default="lookahead-harness")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    prom = DevPrometheus.attach(args.prometheus_dir) if args.prometheus_dir else None
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    harness = PodHarness(kubeconfig=args.kubeconfig, prometheus=prom, node_name=args.node_name,
                         workdir=args.workdir, log_dir=args.log_dir).start()
    log.info("pod harness running as node %s", args.node_name)
    try:
        done.wait()
    finally:
        harness.stop(delete_node=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
