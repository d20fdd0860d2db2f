"""A real node (lookahead_dev.node.DevNode): containerd + runc + CNI bridge + kubelet +
kube-scheduler + kube-proxy + CoreDNS, joined to a DevCluster of this module's own (its kube-apiserver needs
DevNode.apiserver_args), running Pods from the locally built images (hack/build-images.sh).

`make deps` builds the node and the images; without them (or without root) the module fails,
naming the command that builds them: it is never skipped. The last test stops the node and checks
that nothing is left on the machine.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from lookahead_dev.devcluster import DevCluster, DevClusterError, control_plane_binary, wait_for
from lookahead_dev.node import GLOBAL_DIRS, DevNode, DevNodeError, image_archive, image_name, node_binary

from .helpers import create_namespace

pytestmark = pytest.mark.integration

ENGINE_IMAGE = image_name("engine")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "a real node needs root"
    try:
        node_binary("kubelet")
        for kind in ("engine", "operator", "loadgen"):
            image_archive(kind)
    except DevNodeError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def env(real_node_holder):
    # One real node per machine (its global paths are shared): stop the session's, which the
    # end-to-end tests used, so that this module's cleanup check sees only its own node.
    real_node_holder.stop()
    missing = _missing()
    if missing:  # never a skip: say what builds it (make deps runs both scripts)
        pytest.fail(f"no real node here: {missing}; run `bash hack/build-node.sh && bash hack/build-images.sh` "
                    "(make deps does)", pytrace=False)
    state = Path(tempfile.mkdtemp(prefix="lookahead-test-node-"))
    ip_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    cluster = DevCluster(state / "cluster", apiserver_args=DevNode.apiserver_args(state / "cluster"))
    node = DevNode(cluster, state_dir=state / "node",
                   images=[image_archive("engine"), image_archive("operator"), image_archive("loadgen")])
    try:
        cluster.start()
        node.start()
    except (DevClusterError, TimeoutError) as exc:
        node.stop()
        cluster.stop()
        pytest.fail(f"could not start the cluster with a real node: {exc}", pytrace=False)
    print(f"\nreal node {node.name} on {node.bridge} {node.subnet}: timings {node.timings}")
    api = cluster.api_client()
    yield {"cluster": cluster, "node": node, "api": api, "state": state, "ip_forward": ip_forward}
    api.close()
    try:
        node.stop()
    finally:
        cluster.stop()
        import shutil

        shutil.rmtree(state, ignore_errors=True)


def _namespace(api, prefix: str) -> str:
    name = create_namespace(api, prefix)
    wait_for(lambda: client.CoreV1Api(api).read_namespaced_service_account("default", name), 30,
             f"the default ServiceAccount in {name}", interval=0.1)
    return name


def _kubectl(env, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(control_plane_binary("kubectl")), f"--kubeconfig={env['cluster'].kubeconfig}", *args],
                         capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}")
    return res


def _engine_deployment(name: str, *, command: list[str], readiness_path: str = "/health",
                       progress_deadline: int | None = None, env_vars: dict[str, str] | None = None) -> dict:
    labels = {"app": name}
    env_list = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env_list += [{"name": k, "value": v} for k, v in (env_vars or {}).items()]
    spec = {
        "replicas": 1,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "engine",
                    "image": ENGINE_IMAGE,  # pulled from the node's registry (IfNotPresent: a tag)
                    "command": command,
                    "env": env_list,
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": readiness_path, "port": "http"},
                                       "periodSeconds": 1, "failureThreshold": 1},
                    "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                        "capabilities": {"drop": ["ALL"]}},
                }],
            },
        },
    }
    if progress_deadline is not None:
        spec["progressDeadlineSeconds"] = progress_deadline
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels}, "spec": spec}


# The shell form: the kubelet expands $(POD_IP) from the container's env, then the shell expands
# $ENGINE_PORT and execs the engine (so it is PID 1 of the container and gets SIGTERM).
SHELL_FORM = ["/bin/sh", "-c",
              'exec python3 -m lookahead_canary.server --host $(POD_IP) --port "$ENGINE_PORT" '
              '--backend simulate --served-model-name chat --max-num-seqs 8']


def _condition(dep, kind: str):
    return next((c for c in (dep.status.conditions or []) if c.type == kind), None)


@pytest.fixture(scope="module")
def engine(env):
    """The engine Deployment (shell-form command, readiness probe), available on the real node."""
    api = env["api"]
    ns = _namespace(api, "node-engine")
    apps = client.AppsV1Api(api)
    t0 = time.monotonic()
    apps.create_namespaced_deployment(ns, _engine_deployment("engine", command=SHELL_FORM,
                                                             env_vars={"ENGINE_PORT": "8000"}))

    def available():
        dep = apps.read_namespaced_deployment("engine", ns)
        c = _condition(dep, "Available")
        return dep if c is not None and c.status == "True" and dep.status.ready_replicas == 1 else None

    dep = wait_for(available, 120, "the engine Deployment to become available", interval=0.2)
    took = time.monotonic() - t0
    print(f"\nengine Deployment available in {took:.1f} s")
    pod = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector="app=engine").items[0]
    return {"ns": ns, "deployment": dep, "pod": pod, "available_s": took}


def test_node_is_ready_with_containerd_and_its_registry_holding_the_images(env):
    node, api = env["node"], env["api"]
    n = client.CoreV1Api(api).read_node(node.name)
    assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    assert n.status.node_info.kubelet_version == "v1.36.3"
    assert n.status.node_info.container_runtime_version.startswith("containerd://")
    assert {"type": "InternalIP", "address": node.gateway} in [a.to_dict() for a in n.status.addresses]
    # pushed to the node's registry (the kubelet pulls them from there), not imported
    assert ENGINE_IMAGE in node.pushed
    assert {"lookahead-rollout/lookahead-rollout", "lookahead-rollout/lookahead-rollout-engine",
            "lookahead-rollout/lookahead-rollout-loadgen"} <= set(node.registry.catalog())
    assert node.timings["kubelet_ready"] < 30


def test_the_node_advertises_eight_gpus_and_the_scheduler_counts_them(env):
    """A GPU pool as the scheduler sees it (issue 23): ``nvidia.com/gpu`` in the node's allocatable
    (dev/node.py EXTENDED_RESOURCES); pods that request all eight run, one more waits Unschedulable
    with the scheduler's reason, and runs once a GPU is free."""
    api, node = env["api"], env["node"]
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    assert core.read_node(node.name).status.allocatable.get("nvidia.com/gpu") == "8"
    ns = _namespace(api, "node-gpus")

    def gpu_deployment(name: str, replicas: int, gpus: int) -> dict:
        dep = _engine_deployment(name, command=SHELL_FORM, env_vars={"ENGINE_PORT": "8000"})
        dep["spec"]["replicas"] = replicas
        dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "10m", "nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
        return dep

    def pods(app: str) -> list:
        return core.list_namespaced_pod(ns, label_selector=f"app={app}").items

    def scheduled(pod) -> bool:
        return any(c.type == "PodScheduled" and c.status == "True" for c in pod.status.conditions or [])

    apps.create_namespaced_deployment(ns, gpu_deployment("pool", 2, 4))
    wait_for(lambda: len(pods("pool")) == 2 and all(scheduled(p) for p in pods("pool")), 60,
             "two pods of four GPUs each scheduled", interval=0.5)
    apps.create_namespaced_deployment(ns, gpu_deployment("one-more", 1, 1))

    def unschedulable():
        for p in pods("one-more"):
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return c.message
        return None

    why = wait_for(unschedulable, 60, "the ninth GPU's pod to be Unschedulable", interval=0.5)
    assert "Insufficient nvidia.com/gpu" in why, why
    apps.patch_namespaced_deployment_scale("pool", ns, {"spec": {"replicas": 1}})
    wait_for(lambda: pods("one-more") and all(scheduled(p) for p in pods("one-more")), 90,
             "the pending pod scheduled once four GPUs are free", interval=0.5)
    # the kubelet's own status updates keep what was advertised
    assert core.read_node(node.name).status.capacity.get("nvidia.com/gpu") == "8"
    core.delete_namespace(ns)


def test_engine_deployment_from_the_local_image_becomes_available(engine):
    pod = engine["pod"]
    assert pod.status.phase == "Running"
    assert pod.spec.containers[0].image == ENGINE_IMAGE
    status = pod.status.container_statuses[0]
    assert status.ready and status.restart_count == 0
    assert status.image_id  # the runtime resolved the image it pulled from the node's registry


def test_shell_form_command_starts_the_engine_on_the_pod_ip_and_it_answers_from_the_host(env, engine):
    pod_ip = engine["pod"].status.pod_ip
    node = env["node"]
    assert ipaddress.ip_address(pod_ip) in node.subnet and pod_ip != node.gateway
    with urllib.request.urlopen(f"http://{pod_ip}:8000/health", timeout=5) as r:
        assert r.status == 200
    body = json.dumps({"model": "chat", "prompt": "hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://{pod_ip}:8000/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())
    assert out["choices"] and out["usage"]["completion_tokens"] >= 1
    with urllib.request.urlopen(f"http://{pod_ip}:8000/metrics", timeout=5) as r:
        assert "vllm:" in r.read().decode()
    # The shell exec'd the engine: it is the container's PID 1, as the image's non-root user.
    res = _kubectl(env, "exec", "-n", engine["ns"], engine["pod"].metadata.name, "--",
                   "/bin/sh", "-c", "id -u; tr '\\0' ' ' </proc/1/cmdline")
    uid, cmdline = res.stdout.splitlines()[:2]
    assert uid == "65532"
    assert cmdline.startswith("python3 -m lookahead_canary.server --host " + pod_ip + " --port 8000")


def test_a_service_answers_by_name_from_a_pod_and_by_cluster_ip_from_the_host(env, engine):
    """kube-proxy and CoreDNS on the node: a ClusterIP Service in front of the engine answers at its
    ClusterIP from the host, and from inside a Pod by ``NAME.NAMESPACE`` and by its full name
    (``getent hosts`` through the Pod's resolv.conf, then HTTP). The Pod asking is the engine
    itself, so the request goes out to the Service and back to the same Pod (hairpin)."""
    api, ns = env["api"], engine["ns"]
    core = client.CoreV1Api(api)
    svc = core.create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
        "spec": {"selector": {"app": "engine"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    ip = svc.spec.cluster_ip
    assert ipaddress.ip_address(ip) in ipaddress.ip_network("10.0.0.0/24")

    def answers_from_host():
        with urllib.request.urlopen(f"http://{ip}/health", timeout=2) as r:
            return r.status == 200

    wait_for(answers_from_host, 30, f"the Service's ClusterIP {ip} to answer from the host", interval=0.2)
    pod = engine["pod"].metadata.name
    script = (f"getent hosts chat.{ns} && getent hosts chat.{ns}.svc.cluster.local && "
              f"python3 -c \"import urllib.request as u; print(u.urlopen('http://chat.{ns}/health', timeout=5).status); "
              f"print(u.urlopen('http://chat.{ns}.svc.cluster.local/metrics', timeout=5).read().decode().count('vllm:'))\"")
    res = wait_for(lambda: _kubectl(env, "exec", "-n", ns, pod, "--", "/bin/sh", "-c", script),
                   30, "the Service to answer by name inside the Pod", interval=0.5)
    lines = res.stdout.split("\n")
    assert lines[0].split() == [ip, f"chat.{ns}.svc.cluster.local"], res.stdout
    assert lines[1].split()[0] == ip, res.stdout
    assert lines[2] == "200" and int(lines[3]) > 0, res.stdout
    # a name that does not exist is an answer too (NXDOMAIN), not a hang
    res = _kubectl(env, "exec", "-n", ns, pod, "--", "getent", "hosts", f"nothing.{ns}", check=False)
    assert res.returncode == 2 and not res.stdout, (res.returncode, res.stdout, res.stderr)


def test_a_fleet_behind_a_service_fails_no_user_request_through_a_rolling_update_and_a_scale_down(env, tmp_path):
    """What users of a serving fleet see while its Pods are replaced, as a promotion, a rollback or
    a restore replaces them: production traffic (open loop, a new connection per request, half of
    it streamed) through the fleet's Service while the Deployment rolls both Pods and then scales
    down. A terminating Pod leaves the Service's endpoints at once, but kube-proxy's rules follow
    a moment later: ``preStop: sleep`` keeps it serving meanwhile, then SIGTERM makes the engine
    refuse new requests and finish the streams it holds (its grace period is long enough).
    No request may fail, and requests must have been in flight at every Pod's termination."""
    from lookahead_dev.traffic import ProductionTraffic, format_failures

    api = env["api"]
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    ns = _namespace(api, "node-serving")
    dep = _engine_deployment("serving", command=["python3", "-m", "lookahead_canary.server", "--host", "0.0.0.0",
                                                 "--port", "8000", "--backend", "simulate",
                                                 "--served-model-name", "chat", "--max-num-seqs", "8"])
    dep["spec"]["replicas"] = 2
    dep["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod_spec = dep["spec"]["template"]["spec"]
    pod_spec["terminationGracePeriodSeconds"] = 30
    pod_spec["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 3}}}
    apps.create_namespaced_deployment(ns, dep)
    svc = core.create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "serving"},
        "spec": {"selector": {"app": "serving"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    url = f"http://{svc.spec.cluster_ip}"

    def rolled(replicas: int) -> bool:
        d = apps.read_namespaced_deployment("serving", ns)
        st = d.status
        pods = core.list_namespaced_pod(ns, label_selector="app=serving").items
        for pod in pods:  # every termination seen: when, and which Pod
            if pod.metadata.deletion_timestamp is not None:
                terminations.setdefault(pod.metadata.name, time.time())
        return (st.observed_generation == d.metadata.generation and st.updated_replicas == replicas
                and st.ready_replicas == replicas and st.replicas == replicas and len(pods) == replicas)

    terminations: dict[str, float] = {}
    wait_for(lambda: rolled(2), 120, "the serving Deployment available", interval=0.2)
    traffic = ProductionTraffic(url, out=tmp_path / "traffic.jsonl", schedule="0:4", seed=7, timeout=60,
                                log=tmp_path / "traffic.log")
    with traffic:
        traffic.wait_requests(5, timeout=60, ok=True)
        t0 = time.time()
        apps.patch_namespaced_deployment("serving", ns, {"spec": {"template": {"metadata": {
            "annotations": {"lookahead.test/restarted": str(t0)}}}}})
        wait_for(lambda: rolled(2), 180, "both Pods replaced", interval=0.2)
        apps.patch_namespaced_deployment_scale("serving", ns, {"spec": {"replicas": 1}})
        wait_for(lambda: rolled(1), 120, "scaled down to one Pod", interval=0.2)
        t1 = time.time()
        traffic.wait_requests(5, timeout=60, ok=True, started_after=t1)
    summary = traffic.record.summary(since=t0)
    print(f"\nproduction traffic through the rollout: {summary.line()}; terminations {len(terminations)}")
    assert summary.failed == 0 and summary.not_sent == 0, format_failures(summary)
    assert len(terminations) == 3, terminations  # two rolled, one scaled away
    reqs = traffic.record.requests(since=t0)
    for name, at in terminations.items():
        assert any(r["started_at"] < at < r["ended_at"] for r in reqs), f"nothing in flight when {name} terminated"


def test_the_operators_canary_of_a_shell_form_engine_starts_with_lookahead_in_a_real_container(env, engine):
    """The canary the operator renders from the shell-form fleet above (its flags edited into the
    `sh -c` script, the script then run by a real shell in a real container) serves, as PID 1, with
    the lookahead flags, and actually speculates; the control renders without them."""
    from lookahead_operator.controller import builders, roles
    from lookahead_operator import engines
    from lookahead_operator.api.policy import LookaheadPolicy

    api = env["api"]
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    ns = engine["ns"]
    body = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
            "metadata": {"name": "shell", "namespace": ns, "uid": str(uuid.uuid4())},
            "spec": {"targets": {"selector": {"matchLabels": {"app": "engine"}}}, "engine": "reference",
                     "lookahead": {"method": "jacobi", "window": 5, "ngram": 3, "guessSet": 5},
                     "analysis": {"prometheus": {"url": "http://127.0.0.1:9"}}}}
    spec = LookaheadPolicy.from_body(body).spec
    fleet = client.ApiClient().sanitize_for_serialization(apps.read_namespaced_deployment("engine", ns))
    made = {}
    for role in ("canary", "control"):
        obj = builders.build_role_deployment(fleet, body, role, 1, roles.role_transform(spec, role, "reference"),
                                             engines.is_engine_container)
        obj["metadata"].pop("ownerReferences", None)  # no policy object here to own it
        script = obj["spec"]["template"]["spec"]["containers"][0]["command"][2]
        assert ("--speculative-config" in script) == (role == "canary"), script
        apps.create_namespaced_deployment(ns, obj)
        made[role] = obj

    def ready(role):
        name = made[role]["metadata"]["name"]
        pods = core.list_namespaced_pod(ns, label_selector=f"{builders.LABEL_ROLE}={role}").items
        ok = [p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return ok[0] if ok and apps.read_namespaced_deployment(name, ns).status.ready_replicas == 1 else None

    for role in made:
        pod = wait_for(lambda r=role: ready(r), 90, f"the rendered {role} to serve on the node", interval=0.2)
        res = _kubectl(env, "exec", "-n", ns, pod.metadata.name, "--", "/bin/sh", "-c", "tr '\\0' ' ' </proc/1/cmdline")
        cmdline = res.stdout
        assert cmdline.startswith("python3 -m lookahead_canary.server --host " + pod.status.pod_ip), cmdline
        assert ("--speculative-config" in cmdline) == (role == "canary"), cmdline
        ip = pod.status.pod_ip
        req = urllib.request.Request(f"http://{ip}:8000/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "chat", "prompt": "x", "max_tokens": 32}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] >= 1
        with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5) as r:
            drafts = [ln for ln in r.read().decode().splitlines()
                      if ln.startswith("vllm:spec_decode_num_drafts_total") and float(ln.split()[-1]) > 0]
        assert bool(drafts) == (role == "canary"), (role, drafts)


def test_pods_have_no_route_off_the_node(env, engine):
    """No default route: a Pod reaches its bridge and, through the host, Services' ClusterIPs."""
    res = _kubectl(env, "exec", "-n", engine["ns"], engine["pod"].metadata.name, "--",
                   "python3", "-c", "print(open('/proc/net/route').read())")
    routes = [line.split() for line in res.stdout.splitlines()[1:] if line.strip()]
    assert routes and all(r[1] != "00000000" for r in routes), res.stdout  # no default route

    def net(r):  # /proc/net/route: destination and mask, little-endian hex
        to_ip = lambda h: str(ipaddress.ip_address(int(h, 16).to_bytes(4, "little")))  # noqa: E731
        return ipaddress.ip_network(f"{to_ip(r[1])}/{to_ip(r[7])}")

    nets = {net(r) for r in routes}
    assert nets == {env["node"].subnet, ipaddress.ip_network("10.0.0.0/24")}, nets


def test_kubectl_logs_reads_the_container_log(env, engine):
    res = _kubectl(env, "logs", "-n", engine["ns"], "deployment/engine")
    assert "engine starting" in res.stdout or "engine listening" in res.stdout, res.stdout[-2000:]


def test_crashloop_with_failing_readiness_reports_progress_deadline_exceeded(env):
    api = env["api"]
    ns = _namespace(api, "node-crash")
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    t0 = time.monotonic()
    apps.create_namespaced_deployment(ns, _engine_deployment(
        "crasher", command=["/bin/sh", "-c", "echo starting; exit 3"], progress_deadline=15))

    def deadline_exceeded():
        c = _condition(apps.read_namespaced_deployment("crasher", ns), "Progressing")
        return c if c is not None and c.status == "False" and c.reason == "ProgressDeadlineExceeded" else None

    cond = wait_for(deadline_exceeded, 90, "ProgressDeadlineExceeded on the crashlooping Deployment", interval=0.5)
    print(f"\nProgressDeadlineExceeded after {time.monotonic() - t0:.1f} s: {cond.message}")
    pod = core.list_namespaced_pod(ns, label_selector="app=crasher").items[0]
    status = pod.status.container_statuses[0]
    assert not status.ready
    assert status.restart_count >= 1
    terminated = status.last_state.terminated or (status.state and status.state.terminated)
    assert terminated is not None and terminated.exit_code == 3
    assert "starting" in _kubectl(env, "logs", "-n", ns, pod.metadata.name).stdout


def test_operator_and_loadgen_images_run_as_the_chart_runs_them(env):
    """The chart's image with the chart's security context (non-root, read-only root filesystem,
    no capabilities, /tmp an emptyDir): kopf and the operator's handlers import; the load
    generator image runs its command."""
    api = env["api"]
    ns = _namespace(api, "node-images")
    core = client.CoreV1Api(api)
    chart_security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                      "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    pods = {
        "operator": (image_name("operator"),
                     ["/bin/sh", "-c", "kopf --version && python3 -c 'import lookahead_operator.runtime.handlers, "
                      "lookahead_canary.loadgen; print(\"imports ok\")'"], "imports ok"),
        "loadgen": (image_name("loadgen"), ["lookahead-loadgen", "--help"], "usage"),
    }
    for name, (image, command, _) in pods.items():
        core.create_namespaced_pod(ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never",
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
                     "containers": [{"name": name, "image": image, "command": command,
                                     "securityContext": chart_security,
                                     "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
                     "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]}})
    for name, (_, _, expect) in pods.items():
        def done(name=name):
            phase = core.read_namespaced_pod(name, ns).status.phase
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(done, 90, f"Pod {name} to finish", interval=0.2)
        logs = _kubectl(env, "logs", "-n", ns, name).stdout
        assert phase == "Succeeded", logs[-2000:]
        assert expect in logs.lower(), logs[-2000:]


def _container_pids(node: DevNode) -> list[int]:
    out = node.ctr("tasks", "list").stdout.splitlines()[1:]
    return [int(line.split()[1]) for line in out if line.split() and line.split()[1].isdigit()]


def test_stop_leaves_no_process_mount_bridge_cgroup_or_runtime_directory(env, engine):
    node = env["node"]
    pids = list(node.pids.values()) + _container_pids(node)
    assert len(pids) >= 5  # containerd, kube-scheduler, kubelet, and at least one sandbox + container
    state = str(node.state_dir)
    cgroup_dirs = [h / node.name for h in map(Path, _cgroup_roots())]
    assert any(d.is_dir() for d in cgroup_dirs)

    node.stop()

    alive = [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"]
    assert not alive, f"processes still alive: {alive}"
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and state in _cmdline(p)]
    mounts = Path("/proc/self/mountinfo").read_text()
    assert state not in mounts
    assert "/var/lib/kubelet" not in mounts
    assert not Path(f"/sys/class/net/{node.bridge}").exists()
    assert not [d for d in cgroup_dirs if d.exists()]
    assert not [h for h in _cgroup_roots() if (Path(h) / "kubepods").exists()]
    for d in GLOBAL_DIRS:
        if not node._preexisting[d]:
            assert not os.path.lexists(d), f"{d} is left"
    assert node.leftovers() == {"processes": [], "mounts": [], "interfaces": [], "cgroups": [],
                                "directories": [], "netns": [], "iptables": []}
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == env["ip_forward"]
    for key, value in node._sysctls.items():
        assert Path("/proc/sys", key).read_text().strip() == value


def _cgroup_roots() -> list[str]:
    roots = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] in ("cgroup", "cgroup2"):
            roots.append(pre.split()[4])
    return roots


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
