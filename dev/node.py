"""A real Kubernetes node for the local cluster: containerd + runc + CNI + kubelet + kube-scheduler.

``DevNode(cluster).start()`` joins a running :class:`lookahead_dev.devcluster.DevCluster` with one
real node, so Pods run as real containers from real (locally built) images: probes, restarts,
CrashLoopBackOff, ``kubectl logs``/``exec``, pod IPs. Binaries come from ``bash hack/build-node.sh``
(``$LOOKAHEAD_CACHE/node-<version>/``), images from ``bash hack/build-images.sh``
(``$LOOKAHEAD_CACHE/images/*.oci.tar``), pushed to the node's own registry
(``lookahead_dev.registry``, ``bash hack/build-registry.sh``) and pulled from there by the kubelet.
See docs/node.md for every setting and why.

The cluster's kube-apiserver needs :meth:`DevNode.apiserver_args` (the kubelet's address type,
and the client certificate it presents to the kubelet for logs/exec)::

    state = Path(tempfile.mkdtemp())
    cluster = DevCluster(state / "cluster", apiserver_args=DevNode.apiserver_args(state / "cluster")).start()
    node = DevNode(cluster, images=[engine_archive]).start()   # Node Ready, images in its registry
    ...
    node.stop(); cluster.stop()                                 # stop() leaves nothing behind

What it runs (each in its own process group, output in ``<state>/logs``):

* containerd (Debian's 1.6) with its root, state, socket, CNI config and IPAM data under the
  state dir, and the CRI settings this machine needs (``restrict_oom_score_adj``: no
  CAP_SYS_RESOURCE here);
* a Linux bridge of its own on a private /24 (no default route in Pods: Pods reach the host's
  bridge address, each other and Services' ClusterIPs, routed through the host, nothing else);
* kube-proxy (iptables mode, every rule removed by ``stop()`` with ``kube-proxy --cleanup``) and
  CoreDNS (``cluster.local`` on the bridge's host address, the kubelet's ``clusterDNS``): a
  ClusterIP Service answers from Pods and from the host, and Pods resolve ``SERVICE.NAMESPACE``;
* kube-scheduler (admin kubeconfig) and a kubelet (its own ``system:node:<name>`` certificate,
  x509 + webhook authentication and authorization, ``cgroupRoot`` ``/<name>`` so its cgroups are
  its own, ``failCgroupV1: false``, ``failSwapOn: false``, ``cgroupDriver: cgroupfs``).

Global paths the kubelet and containerd write whatever their configuration (``/var/log/containers``,
``/run/containerd/s``, ``/var/lib/cni``, ``/run/netns``, ``/var/lib/kubelet``) are cleaned by
``stop()`` when this node created them; kernel settings the kubelet changes
(``vm.overcommit_memory``, ``kernel.panic``, ``kernel.panic_on_oops``) and the two the node sets for
Services (``net.ipv4.ip_forward``, ``net.bridge.bridge-nf-call-iptables``) are restored. One DevNode
per machine at a time (those global paths are shared).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterable, Sequence

from lookahead_canary import process
from lookahead_dev.registry import IMAGE_PATH, REGISTRY_ADDRESS, DevRegistry
from lookahead_dev.devcluster import (
    K8S_VERSION, SERVICE_CLUSTER_IP_RANGE, DevCluster, DevClusterError, _first_dead, _Proc, cache_dir, free_port, wait_for, write_kubeconfig,
)

BUILD_HINT = "run `bash hack/build-node.sh` first"
IMAGES_HINT = "run `bash hack/build-images.sh` first"
#: The chart's default ``image.repository`` (what hack/build-images.sh names its archives); the
#: node pulls the same images from its own registry (``image_name``).
IMAGE_REPOSITORY = "ghcr.io/lookahead-rollout/lookahead-rollout"
PAUSE_IMAGE = "localhost/lookahead-rollout/pause:3.10"  # keep in step with hack/build-node.sh
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy", "coredns", "containerd", "containerd-shim-runc-v2",
                 "ctr", "runc")
# Paths the kubelet, containerd and the CNI library use whatever they are configured with.
GLOBAL_DIRS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd", "/run/netns",
               "/var/lib/cni")
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward",
           "net/bridge/bridge-nf-call-iptables")
CLUSTER_DOMAIN = "cluster.local"
IPTABLES_HINT = "kube-proxy needs iptables: `apt-get install iptables` (`make deps` does it)"
CGROUP_FS = Path("/sys/fs/cgroup")
#: The accelerators the node advertises, as a GPU node's device plugin would: extended resources
#: the scheduler counts (Kubernetes' "Advertise Extended Resources for a Node": a capacity patch on
#: the Node's status, which the kubelet keeps). One eight-GPU machine: a fleet that requests them
#: all leaves no room, as a production pool has none.
EXTENDED_RESOURCES = {"nvidia.com/gpu": 8}


class DevNodeError(DevClusterError):
    """A node component is missing, did not start, or the node did not become Ready."""


# --------------------------------------------------------------------------------------------
# where things are


def node_dir() -> Path:
    """What ``hack/build-node.sh`` builds (``$LOOKAHEAD_NODE_DIR`` overrides)."""
    override = os.environ.get("LOOKAHEAD_NODE_DIR")
    return Path(override) if override else cache_dir() / f"node-{K8S_VERSION}"


def node_binary(name: str) -> Path:
    path = node_dir() / ("cni" if name in CNI_PLUGINS else "bin") / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise DevNodeError(f"{name} not found at {path}: {BUILD_HINT}")
    return path


def images_dir() -> Path:
    """What ``hack/build-images.sh`` builds: ``operator``, ``engine``, ``loadgen`` ``.oci.tar``."""
    return cache_dir() / "images"


def image_archive(kind: str) -> Path:
    """The OCI archive of ``kind`` (``operator`` | ``engine`` | ``loadgen``)."""
    path = images_dir() / f"{kind}.oci.tar"
    if not path.is_file():
        raise DevNodeError(f"image archive {path} not found: {IMAGES_HINT}")
    return path


def _project_version() -> str:
    try:
        from importlib.metadata import version

        return version("lookahead-rollout")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0.1.0"


def image_name(kind: str, version: str | None = None, registry: str = REGISTRY_ADDRESS) -> str:
    """The reference the node pulls a locally built image by: in the node's registry
    (``lookahead_dev.registry``), at the chart's path and tag (the operator image is the chart's
    ``image.repository:appVersion`` with ``image.repository`` = ``registry_repository()``)."""
    suffix = {"operator": "", "engine": "-engine", "loadgen": "-loadgen"}[kind]
    return f"{registry}/{IMAGE_PATH}{suffix}:{version or _project_version()}"


def registry_repository(registry: str = REGISTRY_ADDRESS) -> str:
    """The chart's ``image.repository`` for images pushed to ``registry``."""
    return f"{registry}/{IMAGE_PATH}"


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise DevNodeError(f"{' '.join(map(str, argv))} failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
    return res


def _mounts() -> list[str]:
    """Mount points now, as /proc/self/mountinfo lists them (octal escapes decoded)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            out.append(mp.encode().decode("unicode_escape"))
    return out


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids_with(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (a path unique to this node)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid() and text in _cmdline(int(d.name)):
            found.append(int(d.name))
    return found


def _kube_proxy_rules() -> list[str]:
    """kube-proxy's iptables and ip6tables lines (chains and rules named KUBE-...) on the machine."""
    found = []
    for cmd in ("iptables-save", "ip6tables-save"):
        if shutil.which(cmd):
            res = _run([cmd], check=False)
            found += [f"{cmd}: {line}" for line in res.stdout.splitlines() if "KUBE-" in line]
    return found


def _remove_kube_chains() -> None:
    """Delete every KUBE-... chain and every rule that jumps to one, in every table, IPv4 and IPv6
    (one DevNode per machine: those are this node's)."""
    import shlex

    for cmd in ("iptables", "ip6tables"):
        if not shutil.which(f"{cmd}-save"):
            continue
        table = ""
        rules: list[tuple[str, list[str]]] = []
        chains: list[tuple[str, str]] = []
        for line in _run([f"{cmd}-save"], check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                chains.append((table, line[1:].split()[0]))
            elif line.startswith("-A ") and "KUBE-" in line and not line.split()[1].startswith("KUBE-"):
                rules.append((table, shlex.split(line)[1:]))
        for table, rule in rules:
            _run([cmd, "-w", "5", "-t", table, "-D", *rule], check=False)
        for flag in ("-F", "-X"):
            for table, chain in chains:
                _run([cmd, "-w", "5", "-t", table, flag, chain], check=False)


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, the unified one)."""
    roots = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split()[0] in ("cgroup", "cgroup2"):
                roots.append(Path(pre.split()[4]))
    return roots


def _pick_subnet(seed: str) -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no route or address on this machine overlaps."""
    used = []
    res = _run(["ip", "-4", "-o", "route", "show", "table", "all"], check=False)
    for line in res.stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("local", "broadcast", "unreachable", "prohibit", "blackhole"):
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            if word != "default":
                used.append(ipaddress.ip_network(word, strict=False))
    start = int(hashlib.sha256(seed.encode()).hexdigest(), 16) % 2048
    base = ipaddress.ip_network("10.200.0.0/13")
    subnets = list(base.subnets(new_prefix=24))
    for i in range(len(subnets)):
        net = subnets[(start + i) % len(subnets)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise DevNodeError("no free /24 in 10.200.0.0/13 for the pod network")


# --------------------------------------------------------------------------------------------
# the node


class DevNode:
    """One real node (containerd + CNI bridge + kubelet) and a kube-scheduler, joined to ``cluster``.

    ``name`` is the Node's name (and the CNI network's, and the kubelet's cgroup root);
    ``bridge`` the Linux bridge (at most 15 characters); ``subnet`` the pod /24 (default: a free
    one in 10.200.0.0/13); ``images`` OCI archives pushed, before the kubelet starts, to the
    node's own registry (``lookahead_dev.registry.DevRegistry`` on ``REGISTRY_ADDRESS``), which its
    containerd pulls from over plain HTTP, as a kubelet pulls from any registry (only the sandbox
    image is imported, as a node image carries it); ``charts`` chart directories pushed there as OCI
    charts (``charts``: their ``oci://`` references, for ``helm install --plain-http``). ``state_dir`` holds every file of the node (default: a temporary
    dir, removed by ``stop()``).
    """

    def __init__(self, cluster: DevCluster, *, name: str | None = None, state_dir: str | os.PathLike[str] | None = None,
                 subnet: str | None = None, bridge: str | None = None, images: Sequence[str | os.PathLike[str]] = (),
                 charts: Sequence[str | os.PathLike[str]] = (),
                 start_timeout: float = 120.0, scheduler: bool = True,
                 extended_resources: dict[str, int] | None = None):
        suffix = uuid.uuid4().hex[:6]
        self.cluster = cluster
        self.name = name or f"lookahead-node-{suffix}"
        self.bridge = bridge or f"lkn{suffix}"
        if len(self.bridge) > 15:
            raise ValueError(f"bridge name {self.bridge!r} is longer than 15 characters")
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="lookahead-node-"))
        self.state_dir = self.state_dir.absolute()
        self.subnet = ipaddress.ip_network(subnet) if subnet else None
        self.images = [Path(p) for p in images]
        self.registry = DevRegistry(self.state_dir / "registry")
        #: the references the pushed ``images`` have in the registry
        self.pushed: list[str] = []
        self.chart_dirs = [Path(p) for p in charts]
        #: chart name -> its ``oci://`` reference in the registry
        self.charts: dict[str, str] = {}
        self.start_timeout = start_timeout
        self.run_scheduler = scheduler
        self.extended_resources = dict(EXTENDED_RESOURCES if extended_resources is None else extended_resources)
        self.logs = self.state_dir / "logs"
        self.containerd_sock = self.state_dir / "containerd" / "containerd.sock"
        self.kubelet_root = self.state_dir / "kubelet"
        self.pod_logs = self.state_dir / "pod-logs"
        self.cgroup_root = f"/{self.name}"
        self.kubelet_port = 0
        self.healthz_port = 0
        self.timings: dict[str, float] = {}
        self._procs: list[_Proc] = []
        self._preexisting: dict[str, bool] = {}
        self._sysctls: dict[str, str] = {}
        self._netns: set[str] = set()
        self._netns_before: set[str] = set()
        self._bridge_made = False
        self._started = False
        self._kube_proxy: Path | None = None
        self._kube_proxy_cfg: Path | None = None
        self.kube_proxy_healthz = 0
        self.coredns_ready_port = 0

    # accessors ------------------------------------------------------------------------------
    @property
    def gateway(self) -> str:
        """The host's address on the pod bridge (also the Node's InternalIP)."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @property
    def pids(self) -> dict[str, int]:
        own = {"registry": self.registry.proc.pid} if self.registry.proc else {}
        return {**{p.name: p.pid for p in self._procs}, **own}

    @staticmethod
    def apiserver_args(cluster_state_dir: str | os.PathLike[str]) -> list[str]:
        """kube-apiserver flags a DevCluster in ``cluster_state_dir`` needs for a real node: reach
        kubelets by their InternalIP (there is no DNS for node names), and present the admin client
        certificate (which DevCluster generates there) to them for logs, exec and port-forward."""
        pki = Path(cluster_state_dir).absolute() / "pki"
        return ["--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}"]

    @staticmethod
    def cluster_args(cluster_state_dir: str | os.PathLike[str], subnet: str | ipaddress.IPv4Network) -> dict:
        """``DevCluster`` keyword arguments for a cluster whose Pods, on a DevNode with pod ``subnet``,
        talk to the apiserver (an operator installed by ``helm install``): :meth:`apiserver_args`,
        the apiserver bound on every address (the pod bridge does not exist yet when it starts, and
        kube-apiserver binds one address), the bridge's host address in its certificate and as its
        advertised address: the ``kubernetes`` Service's endpoint, so that in-cluster clients reach
        it as on any cluster (kube-proxy routes 10.0.0.1:443 there)."""
        gateway = str(ipaddress.ip_network(subnet).network_address + 1)
        return {"apiserver_args": DevNode.apiserver_args(cluster_state_dir), "bind_address": "0.0.0.0",
                "extra_sans": [f"IP:{gateway}"], "advertise_address": gateway}

    @staticmethod
    def pick_subnet(seed: str | None = None) -> ipaddress.IPv4Network:
        """A free pod /24 (10.200.0.0/13), chosen before the cluster starts (see :meth:`cluster_args`)."""
        return _pick_subnet(seed or uuid.uuid4().hex)

    def ctr(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        """``ctr`` against this node's containerd, namespace ``k8s.io`` (the CRI's)."""
        return _run([str(node_binary("ctr")), "--address", str(self.containerd_sock), "--namespace", "k8s.io", *args],
                    timeout=timeout, check=check)

    # lifecycle ------------------------------------------------------------------------------
    def start(self) -> "DevNode":
        t0 = time.monotonic()
        bins = {n: node_binary(n) for n in NODE_BINARIES}
        for plugin in CNI_PLUGINS:
            node_binary(plugin)
        pause = node_dir() / "images" / "pause.oci.tar"
        for archive in [pause, *self.images]:
            if not archive.is_file():
                raise DevNodeError(f"image archive {archive} not found: {BUILD_HINT if archive == pause else IMAGES_HINT}")
        if os.geteuid() != 0:
            raise DevNodeError("a real node needs root (containers, mounts, a bridge, cgroups)")
        if not (shutil.which("iptables-restore") and shutil.which("ip6tables-restore")):
            raise DevNodeError(IPTABLES_HINT)
        if not self.cluster.ready():
            raise DevNodeError(f"the cluster at {self.cluster.server} is not ready")
        self._started = True
        atexit.register(self.stop)
        try:
            self._record_host()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.logs.mkdir(parents=True, exist_ok=True)
            self._make_bridge()
            self._make_cgroup_root()
            self._write_cni_config()
            self._start_registry()
            self._start_containerd(bins)
            self._import_images([pause])
            self._write_kubelet_credentials()
            if self.run_scheduler:
                self._start_scheduler(bins["kube-scheduler"])
            self._start_services(bins["kube-proxy"], bins["coredns"])
            self._start_kubelet(bins["kubelet"])
            self._advertise(self.extended_resources)
            self._wait_services()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        (self.state_dir / "node.json").write_text(json.dumps({
            "name": self.name, "bridge": self.bridge, "subnet": str(self.subnet), "gateway": self.gateway,
            "cgroup_root": self.cgroup_root, "containerd": str(self.containerd_sock),
            "registry": self.registry.address, "registry_ca": str(self.registry.ca_file), "pushed": self.pushed,
            "charts": self.charts,
            "pids": self.pids,
            "timings": self.timings}, indent=2) + "\n")
        return self

    def _record_host(self) -> None:
        for d in GLOBAL_DIRS:
            self._preexisting[d] = os.path.lexists(d)
        self._netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        for key in SYSCTLS:
            with contextlib.suppress(OSError):
                self._sysctls[key] = Path("/proc/sys", key).read_text().strip()

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> _Proc:
        proc = _Proc(name, argv, self.logs / f"{name}.log", env=env)
        self._procs.append(proc)
        return proc

    # network -------------------------------------------------------------------------------
    def _make_bridge(self) -> None:
        if self.subnet is None:
            self.subnet = _pick_subnet(self.name)
        if Path(f"/sys/class/net/{self.bridge}").exists():
            raise DevNodeError(f"network interface {self.bridge} already exists")
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._bridge_made = True
        _run(["ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])

    def _write_cni_config(self) -> None:
        conf_dir = self.state_dir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        hosts = list(self.subnet.hosts())
        conf = {
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                # The bridge already has the gateway address (set above). No gateway role means no
                # default route in Pods and no ip_forward; no masquerade: the pod network stays here.
                "isGateway": False,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(self.subnet), "rangeStart": str(hosts[9]), "rangeEnd": str(hosts[-1]),
                                 "gateway": self.gateway}]],
                    # Services only: their ClusterIPs through the host, where kube-proxy's rules are.
                    "routes": [{"dst": SERVICE_CLUSTER_IP_RANGE, "gw": self.gateway}],
                    "dataDir": str(self.state_dir / "cni" / "ipam"),
                },
            }],
        }
        (conf_dir / "10-lookahead.conflist").write_text(json.dumps(conf, indent=2) + "\n")

    # cgroups -------------------------------------------------------------------------------
    def _make_cgroup_root(self) -> None:
        """``/<name>`` in every hierarchy: the kubelet's ``cgroupRoot`` (it puts ``kubepods`` below
        it). cpuset needs its cpus and mems copied from the parent before anything can join."""
        for h in _cgroup_hierarchies():
            d = h / self.cgroup_root.lstrip("/")
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (d / f).exists() and not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())

    def _remove_cgroups(self) -> list[str]:
        left = []
        for h in _cgroup_hierarchies():
            top = h / self.cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            dirs = sorted((Path(p) for p, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
            for d in dirs:
                for _ in range(50):  # a just-killed task can take a moment to leave its cgroup
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
                else:
                    left.append(str(d))
        return left

    # containerd ----------------------------------------------------------------------------
    def _containerd_config(self) -> str:
        bin_dir = node_dir() / "bin"
        cni_bin = node_dir() / "cni"
        st = self.state_dir / "containerd"
        q = json.dumps  # TOML basic strings are JSON strings
        return f"""version = 2
root = {q(str(st / 'root'))}
state = {q(str(st / 'state'))}
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {q(str(self.containerd_sock))}

[ttrpc]
  address = {q(str(self.containerd_sock) + '.ttrpc')}

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(st / 'opt'))}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {q(PAUSE_IMAGE)}
  # Processes here lack CAP_SYS_RESOURCE: without this every sandbox fails with
  # "can't get final child's PID from pipe" (runc cannot lower oom_score_adj).
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = {q(str(bin_dir / 'runc'))}
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {q(str(st / 'certs.d'))}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {q(str(cni_bin))}
    conf_dir = {q(str(self.state_dir / 'cni' / 'net.d'))}
    max_conf_num = 1
"""

    def _start_containerd(self, bins: dict[str, Path]) -> None:
        t0 = time.monotonic()
        cfg = self.state_dir / "containerd" / "config.toml"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(self._containerd_config())
        # containerd finds its shim (containerd-shim-runc-v2) on PATH.
        env = dict(os.environ)
        env["PATH"] = f"{node_dir() / 'bin'}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        proc = self._spawn("containerd", [str(bins["containerd"]), "--config", str(cfg)], env=env)

        def serving() -> bool:
            return self.ctr("version", timeout=5, check=False).returncode == 0

        wait_for(serving, self.start_timeout, "containerd to serve", interval=0.1, alive=proc.dead)
        self.timings["containerd"] = time.monotonic() - t0

    def _start_registry(self) -> None:
        """The node's registry, with ``images`` pushed into it; and containerd's host configuration
        for it (``certs.d/<address>/hosts.toml``: plain HTTP, pull and resolve)."""
        t0 = time.monotonic()
        self.registry.start()
        self.pushed = [self.registry.push_archive(a) for a in self.images]
        self.charts = {d.name: self.registry.push_chart(d) for d in self.chart_dirs}
        hosts = self.state_dir / "containerd" / "certs.d" / self.registry.address / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(self.registry.hosts_toml())
        self.timings["registry_push"] = time.monotonic() - t0

    def _import_images(self, archives: Sequence[Path]) -> None:
        t0 = time.monotonic()
        for archive in archives:
            self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=600)
        self.timings["images_import"] = time.monotonic() - t0

    def image_names(self) -> list[str]:
        return [line for line in self.ctr("images", "list", "-q").stdout.splitlines() if not line.startswith("sha256:")]

    # control plane pieces ------------------------------------------------------------------
    def _write_kubelet_credentials(self) -> None:
        """A client certificate for ``system:node:<name>`` (group ``system:nodes``) signed by the
        cluster's CA, so the Node authorizer, not system:masters, governs what the kubelet does."""
        pki = self.state_dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca_crt, ca_key = self.cluster.pki / "ca.crt", self.cluster.pki / "ca.key"
        key, csr, crt = pki / "kubelet.key", pki / "kubelet.csr", pki / "kubelet.crt"
        ext = pki / "kubelet.ext"
        _run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)])
        _run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/O=system:nodes/CN=system:node:{self.name}",
              "-out", str(csr)])
        ext.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                       "extendedKeyUsage=clientAuth\n")
        _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
              "-CAserial", str(pki / "ca.srl"), "-CAcreateserial", "-days", "30", "-sha256", "-extfile", str(ext),
              "-out", str(crt)])
        key.chmod(0o600)
        write_kubeconfig(self.state_dir / "kubelet.kubeconfig", self.cluster.server, ca_crt, crt, key,
                         f"system:node:{self.name}")

    def _start_scheduler(self, binary: Path) -> None:
        kc = str(self.cluster.kubeconfig)
        self._spawn("kube-scheduler", [
            str(binary),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={self.state_dir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=0",
        ])

    def _kubelet_config(self) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.gateway,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cluster.pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            # This machine: cgroup v1 (hybrid), swap allowed, no systemd.
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,  # kubepods goes below /<name>, not at each hierarchy's root
            "podLogsDir": str(self.pod_logs),
            "volumePluginDir": str(self.state_dir / "volume-plugins"),
            "resolvConf": "/etc/resolv.conf",
            # CoreDNS on the host's bridge address (_start_coredns): Pods resolve Service names.
            "clusterDNS": [self.gateway],
            "clusterDomain": CLUSTER_DOMAIN,
            # Images are imported, never pulled: never garbage-collect them, and do not evict Pods
            # because a shared development disk is fuller than a node's would be.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False,
            "registerNode": True,
            "maxPods": 110,
            "protectKernelDefaults": False,
            "staticPodPath": "",
            "shutdownGracePeriod": "0s",
            # The kubelet's own iptables chains (KUBE-IPTABLES-HINT, KUBE-FIREWALL) are hints for
            # other components; kube-proxy makes the rules Services need.
            "makeIPTablesUtilChains": False,
        }

    def _start_kubelet(self, binary: Path) -> None:
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        cfg = self.state_dir / "kubelet-config.json"
        cfg.write_text(json.dumps(self._kubelet_config(), indent=2) + "\n")
        t0 = time.monotonic()
        self._spawn("kubelet", [
            str(binary),
            f"--config={cfg}",
            f"--kubeconfig={self.state_dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={self.state_dir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.gateway}",
            "--v=1",
        ])
        from kubernetes import client

        api = self.cluster.api_client()
        try:
            def ready() -> bool:
                node = client.CoreV1Api(api).read_node(self.name)
                return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

            wait_for(ready, self.start_timeout, f"Node {self.name} to be Ready", interval=0.1,
                     alive=_first_dead(self._procs))
        finally:
            api.close()
        self.timings["kubelet_ready"] = time.monotonic() - t0

    def _advertise(self, resources: dict[str, int]) -> None:
        """Add ``resources`` to the Node's capacity (a JSON patch of its status; ``/`` in a name is
        ``~1``) and wait until its allocatable shows them: what the scheduler counts."""
        if not resources:
            return
        from kubernetes import client

        api = self.cluster.api_client()
        try:
            core = client.CoreV1Api(api)
            core.patch_node_status(self.name, [
                {"op": "add", "path": "/status/capacity/" + name.replace("~", "~0").replace("/", "~1"),
                 "value": str(count)} for name, count in resources.items()])

            def shown() -> bool:
                allocatable = core.read_node(self.name).status.allocatable or {}
                return all(allocatable.get(name) == str(count) for name, count in resources.items())

            wait_for(shown, 30, f"Node {self.name} to advertise {resources}", interval=0.2)
        finally:
            api.close()

    # Services and DNS ----------------------------------------------------------------------
    def _start_services(self, kube_proxy: Path, coredns: Path) -> None:
        """kube-proxy (iptables mode) and CoreDNS, started before the kubelet and waited for after
        it (:meth:`_wait_services`): kube-proxy finds its Node's address once the kubelet has
        registered it.

        kube-proxy: ``masqueradeAll``, because the pod bridge has no ``br_netfilter`` guarantee
        for hairpin traffic (a Pod reaching a Service whose endpoint is on the same bridge) and
        masquerading makes the reply come back through the host, where conntrack reverses the
        DNAT; ``localhostNodePorts: false`` leaves ``route_localnet`` alone; the ``conntrack``
        settings left at 0 leave the machine's conntrack table as it is. IPv4 forwarding is on
        while the node runs (restored by :meth:`stop`): a Service's packets from a Pod come in on
        the bridge and go out on it again to the endpoint.

        CoreDNS (hack/coredns: bind, errors, health, ready, log, cache, kubernetes) answers
        ``cluster.local`` from the apiserver on the bridge's host address, port 53, which the
        kubelet writes into every ClusterFirst Pod's resolv.conf (``clusterDNS``). Other names get
        REFUSED: this node has no upstream to forward to."""
        for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")):
            with contextlib.suppress(OSError):
                Path("/proc/sys", key).write_text(value + "\n")
        self.kube_proxy_healthz = free_port()
        kp_cfg = self.state_dir / "kube-proxy-config.json"
        kp_cfg.write_text(json.dumps(self._kube_proxy_config(), indent=2) + "\n")
        self._kube_proxy = kube_proxy
        self._kube_proxy_cfg = kp_cfg
        self._spawn("kube-proxy", [str(kube_proxy), f"--config={kp_cfg}", "--v=1"])
        self.coredns_ready_port = free_port()
        corefile = self.state_dir / "Corefile"
        corefile.write_text(self._corefile())
        self._spawn("coredns", [str(coredns), "-conf", str(corefile)])

    def _kube_proxy_config(self) -> dict:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
            "hostnameOverride": self.name,
            "bindAddress": self.gateway,
            "healthzBindAddress": f"127.0.0.1:{self.kube_proxy_healthz}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "mode": "iptables",
            "clusterCIDR": str(self.subnet),
            "detectLocalMode": "ClusterCIDR",
            "nodePortAddresses": [f"{self.gateway}/32"],
            "oomScoreAdj": 0,
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "30s",
                         "minSyncPeriod": "0s"},
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                          "udpTimeout": "0s", "udpStreamTimeout": "0s"},
        }

    def _corefile(self) -> str:
        return (
            ".:53 {\n"
            f"    bind {self.gateway}\n"
            f"    ready 127.0.0.1:{self.coredns_ready_port}\n"
            "    errors\n"
            f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
            f"        kubeconfig {self.cluster.kubeconfig}\n"
            "        pods insecure\n"
            "        ttl 5\n"
            "        fallthrough in-addr.arpa ip6.arpa\n"
            "    }\n"
            "}\n"
        )

    def _wait_services(self) -> None:
        import urllib.request

        def answers(url: str) -> bool:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        t0 = time.monotonic()
        alive = _first_dead(self._procs)
        wait_for(lambda: answers(f"http://127.0.0.1:{self.coredns_ready_port}/ready"), self.start_timeout,
                 "CoreDNS ready", interval=0.1, alive=alive)
        wait_for(lambda: answers(f"http://127.0.0.1:{self.kube_proxy_healthz}/healthz"), self.start_timeout,
                 "kube-proxy healthy", interval=0.1, alive=alive)
        # A rule for the `kubernetes` Service is in place (a REJECT while it has no endpoints, a
        # DNAT once it has): kube-proxy has synced once.
        kubernetes_ip = str(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).network_address + 1)
        wait_for(lambda: f"-d {kubernetes_ip}/32" in _run(["iptables-save"]).stdout,
                 self.start_timeout, "kube-proxy's rules for the kubernetes Service", interval=0.2, alive=alive)
        self.timings["services_ready"] = time.monotonic() - t0

    def _stop_services(self) -> None:
        """Stop kube-proxy and CoreDNS, then remove every rule kube-proxy made (``--cleanup``)."""
        for p in [p for p in self._procs if p.name in ("kube-proxy", "coredns")]:
            p.stop()
            self._procs.remove(p)
        if self._kube_proxy is not None and self._kube_proxy_cfg is not None:
            res = _run([str(self._kube_proxy), f"--config={self._kube_proxy_cfg}", "--cleanup"], check=False,
                       timeout=60)
            if res.returncode != 0:
                raise DevNodeError(f"kube-proxy --cleanup failed: {res.stderr.strip()[-2000:]}")
            self._kube_proxy_cfg = None
            # What --cleanup keeps on purpose (the KUBE-FIREWALL chain it shares with a kubelet
            # that makes its own): this node made it, this node removes it.
            _remove_kube_chains()

    # stop ----------------------------------------------------------------------------------
    def _drain(self, timeout: float) -> None:
        """Stop the scheduler, delete this node's Pods (grace 0) and wait until the kubelet has
        stopped their containers and sandboxes (which removes their network namespaces)."""
        from kubernetes import client

        sched = next((p for p in self._procs if p.name == "kube-scheduler"), None)
        if sched is not None:
            sched.stop()
            self._procs.remove(sched)
        kubelet = next((p for p in self._procs if p.name == "kubelet"), None)
        if kubelet is None or kubelet.dead() or not self.cluster.ready():
            return
        api = self.cluster.api_client()
        try:
            core = client.CoreV1Api(api)
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}", _request_timeout=10)
            for pod in pods.items:
                with contextlib.suppress(Exception):
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0,
                                               _request_timeout=10)
        except Exception:  # noqa: BLE001 - the forced cleanup below still runs
            return
        finally:
            api.close()

        def no_tasks() -> bool:
            return not self.ctr("tasks", "list", "-q", timeout=10, check=False).stdout.strip()

        with contextlib.suppress(TimeoutError, DevClusterError):
            wait_for(no_tasks, timeout, "the kubelet to stop every container", interval=0.2)

    def _force_containers(self) -> None:
        """Whatever the kubelet left: remember each sandbox's netns, kill and delete tasks."""
        if not self.containerd_sock.exists():
            return
        res = self.ctr("containers", "list", "-q", timeout=10, check=False)
        for cid in res.stdout.split():
            info = self.ctr("containers", "info", cid, timeout=10, check=False)
            with contextlib.suppress(ValueError, KeyError, TypeError):
                for ns in json.loads(info.stdout)["Spec"]["linux"]["namespaces"]:
                    if ns.get("type") == "network" and ns.get("path", "").startswith(("/var/run/netns/", "/run/netns/")):
                        self._netns.add(os.path.basename(ns["path"]))
            self.ctr("tasks", "kill", "--signal", "SIGKILL", cid, timeout=10, check=False)
        for cid in res.stdout.split():
            self.ctr("tasks", "delete", "--force", cid, timeout=10, check=False)
            self.ctr("containers", "delete", cid, timeout=10, check=False)

    def stop(self) -> None:
        """Stop everything and remove every trace: Pods' containers, processes (by PID), mounts,
        network namespaces, the bridge, cgroups, the global directories this node created, the
        kernel settings the kubelet changed, and (for a temporary state dir) the state dir."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        errors: list[str] = []

        def step(fn, *a):
            try:
                fn(*a)
            except Exception as exc:  # noqa: BLE001 - keep cleaning, report at the end
                errors.append(f"{getattr(fn, '__name__', fn)}: {exc}")

        step(self._drain, 30.0)
        for name in ("kube-scheduler", "kubelet"):
            for p in [p for p in self._procs if p.name == name]:
                step(p.stop)
                self._procs.remove(p)
        step(self._stop_services)
        step(self._force_containers)
        for p in list(self._procs):  # containerd
            step(p.stop)
            self._procs.remove(p)
        # Shims outlive containerd (they are re-parented); ours name our socket on their command line.
        for pid in _pids_with(str(self.containerd_sock)):
            step(process.kill_process_group, pid, 5.0)
            if process.pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        # Last resort: anything still in this node's cgroups (a container whose shim died first).
        for pid in self._pod_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        step(self._unmount_all)
        step(self._remove_netns)
        if self._bridge_made:
            if Path(f"/sys/class/net/{self.bridge}").exists():
                step(_run, ["ip", "link", "delete", self.bridge])
            self._bridge_made = False
        left = self._remove_cgroups()
        if left:
            errors.append(f"cgroups left: {left}")
        step(self._remove_global_dirs)
        step(self._restore_sysctls)
        step(self.registry.stop)
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if errors:
            raise DevNodeError("DevNode.stop() could not clean up everything: " + "; ".join(errors))

    def _unmount_all(self) -> None:
        roots = [str(self.state_dir), *(d for d in ("/var/lib/kubelet",) if not self._preexisting.get(d))]
        for mp in sorted((m for m in _mounts() if _under(m, roots)), key=len, reverse=True):
            if _run(["umount", mp], check=False).returncode != 0:
                _run(["umount", "-l", mp], check=False)
        left = [m for m in _mounts() if _under(m, roots)]
        if left:
            raise DevNodeError(f"still mounted: {left}")

    def _remove_netns(self) -> None:
        ours = set(self._netns)
        if os.path.isdir("/run/netns"):
            # Sandboxes' namespaces the kubelet did not get to remove (their names are random:
            # anything new since start() is ours, one DevNode per machine at a time).
            ours |= set(os.listdir("/run/netns")) - self._netns_before
        for name in ours:
            path = f"/run/netns/{name}"
            if path in _mounts():
                _run(["umount", path], check=False)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _remove_global_dirs(self) -> None:
        # The CNI library's result cache (libcni's default dir; containerd 1.6 cannot move it).
        # One file per attachment, named <network>-<sandbox id>-<ifname>; the loopback network's
        # are cni-loopback-<sandbox id>-lo.
        results = Path("/var/lib/cni/results")
        if results.is_dir():
            for f in results.glob(f"{self.name}-*"):
                sandbox = f.name[len(self.name) + 1:].rsplit("-", 1)[0]
                with contextlib.suppress(FileNotFoundError):
                    (results / f"cni-loopback-{sandbox}-lo").unlink()
                f.unlink()
        # /var/log/containers: symlinks into this node's pod log dir.
        logs = Path("/var/log/containers")
        if logs.is_dir():
            for f in logs.iterdir():
                with contextlib.suppress(OSError):
                    if f.is_symlink() and os.readlink(f).startswith(str(self.pod_logs)):
                        f.unlink()
        for d in GLOBAL_DIRS:
            if self._preexisting.get(d, True) or not os.path.lexists(d):
                continue
            if d in ("/run/netns",):
                with contextlib.suppress(OSError):
                    os.rmdir(d)  # only when empty
            else:
                shutil.rmtree(d, ignore_errors=True)

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            path = Path("/proc/sys", key)
            with contextlib.suppress(OSError):
                if path.read_text().strip() != value:
                    path.write_text(value + "\n")

    # checks --------------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """What of this node is still on the machine (empty lists after a complete ``stop()``)."""
        procs = [f"{pid} {_cmdline(pid)[:120]}" for pid in _pids_with(str(self.state_dir))]
        procs += [f"{pid} {_cmdline(pid)[:120]} (in a Pod's cgroup)" for pid in self._pod_pids()]
        roots = [str(self.state_dir), "/var/lib/kubelet", "/run/containerd"]
        mounts = [m for m in _mounts() if _under(m, roots) or m.startswith("/run/netns/")
                  and os.path.basename(m) not in self._netns_before]
        cgroups = [str(h / self.cgroup_root.lstrip("/")) for h in _cgroup_hierarchies()
                   if (h / self.cgroup_root.lstrip("/")).exists()]
        cgroups += [str(h / "kubepods") for h in _cgroup_hierarchies() if (h / "kubepods").exists()]
        dirs = [d for d in GLOBAL_DIRS if os.path.lexists(d) and not self._preexisting.get(d, False)]
        if self._own_dir and self.state_dir.exists():
            dirs.append(str(self.state_dir))
        netns = sorted(set(os.listdir("/run/netns")) - self._netns_before) if os.path.isdir("/run/netns") else []
        return {
            "processes": procs,
            "mounts": mounts,
            "interfaces": [self.bridge] if Path(f"/sys/class/net/{self.bridge}").exists() else [],
            "cgroups": cgroups,
            "directories": dirs,
            "netns": netns,
            "iptables": _kube_proxy_rules(),
        }

    def _pod_pids(self) -> list[int]:
        """Processes in this node's cgroups (containers and sandboxes)."""
        found = []
        marker = f":{self.cgroup_root}/"
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                text = (d / "cgroup").read_text()
            except OSError:
                continue
            if marker in text and process.pid_alive(int(d.name)):
                found.append(int(d.name))
        return found

    def __enter__(self) -> "DevNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# a host process behind a Service name


PROMETHEUS_SERVICE = ("monitoring", "prometheus", 9090)  # the shipped example's http://prometheus.monitoring:9090


def publish_host_service(api, namespace: str, name: str, port: int, host: str, host_port: int) -> str:
    """A ClusterIP Service ``name.namespace:port`` (no selector) whose one endpoint is
    ``host:host_port``, a process on the node's host (the dev Prometheus), as a Service in front
    of an external or host-network server is in a real cluster. Creates the namespace when it is
    missing; replaces a Service and EndpointSlice of the same name. Returns the Service's URL."""
    from kubernetes import client

    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    with contextlib.suppress(client.ApiException):
        core.create_namespace({"metadata": {"name": namespace}})
    for delete in (lambda: core.delete_namespaced_service(name, namespace),
                   lambda: discovery.delete_namespaced_endpoint_slice(name, namespace)):
        with contextlib.suppress(client.ApiException):
            delete()
    core.create_namespaced_service(namespace, {
        "metadata": {"name": name},
        "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": port, "targetPort": host_port}]}})
    discovery.create_namespaced_endpoint_slice(namespace, {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name,
                                              "endpointslice.kubernetes.io/managed-by": "lookahead-dev"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": host_port, "protocol": "TCP"}]})
    return f"http://{name}.{namespace}:{port}"


# --------------------------------------------------------------------------------------------
# CLI: a detached node for `make cluster-up`


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lookahead_dev.node --cluster-dir D --state-dir S [--subnet N]``: join the
    cluster started (detached) in ``D`` with a real node and keep it until SIGTERM/SIGINT, then
    stop it completely and write what is left (``leftovers()``, all empty after a clean stop) to
    ``S/leftovers.json``. ``make cluster-up`` runs it; ``make cluster-down`` sends SIGTERM."""
    import argparse
    import signal
    import sys

    ap = argparse.ArgumentParser(prog="python -m lookahead_dev.node", description=main.__doc__.split("\n")[0])
    ap.add_argument("--cluster-dir", type=Path, required=True)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--subnet", default=None)
    ap.add_argument("--images", default="operator,engine,loadgen", help="comma-separated: operator,engine,loadgen")
    args = ap.parse_args(argv)
    stop_now = {"signal": None}

    def on_signal(signum, _frame):
        stop_now["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = DevCluster.attach(args.cluster_dir)
    try:
        images = [image_archive(k) for k in args.images.split(",") if k]
        chart = Path(__file__).resolve().parents[1] / "charts" / "lookahead-operator"
        node = DevNode(cluster, state_dir=args.state_dir, subnet=args.subnet, images=images,
                       charts=[chart] if chart.is_dir() else [])
        node.start()
    except (DevClusterError, TimeoutError, OSError) as exc:
        print(f"node: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"ready": node.name, "gateway": node.gateway, "timings": node.timings}), flush=True)
    while stop_now["signal"] is None:
        time.sleep(0.2)
    node.stop()
    left = node.leftovers()
    (args.state_dir.parent / "node-leftovers.json").write_text(json.dumps(left, indent=1) + "\n")
    return 0 if not any(left.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["DevNode", "DevNodeError", "node_dir", "node_binary", "images_dir", "image_archive", "image_name",
           "registry_repository",
           "PAUSE_IMAGE", "GLOBAL_DIRS", "PROMETHEUS_SERVICE", "publish_host_service"]
