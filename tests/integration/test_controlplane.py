"""The real local control plane and Prometheus that the other integration tests stand on."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from lookahead_dev.devcluster import K8S_VERSION, control_plane_binary, free_port, wait_for

from .helpers import create_namespace

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _as_token(devcluster, token: str) -> client.ApiClient:
    """An ApiClient that authenticates with a bearer token only (no client certificate)."""
    cfg = client.Configuration()
    cfg.host = devcluster.server
    cfg.ssl_ca_cert = str(devcluster.ca_file)
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def test_build_script_and_module_agree_on_the_version():
    script = (REPO / "hack" / "build-control-plane.sh").read_text()
    assert re.search(rf"^K8S_VERSION={re.escape(K8S_VERSION)}$", script, re.M)
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "helm"):
        assert control_plane_binary(name).is_file()


def test_apiserver_is_ready_and_reports_its_version(devcluster, kube_api):
    assert devcluster.ready()  # GET /readyz with the admin client certificate
    assert client.VersionApi(kube_api).get_code().git_version == K8S_VERSION
    assert Path(devcluster.kubeconfig).is_file()
    assert devcluster.server.startswith("https://127.0.0.1:")


def test_deployment_gets_a_replicaset_and_a_pod_and_is_garbage_collected(kube_api):
    ns = create_namespace(kube_api, "cp-deploy")
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(ns, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="example.invalid/web:1")]),
            ),
        ),
    ))
    deploy = apps.read_namespaced_deployment("web", ns)

    def replicaset():
        items = apps.list_namespaced_replica_set(ns).items
        return [rs for rs in items if any(o.uid == deploy.metadata.uid for o in rs.metadata.owner_references or [])]

    rs = wait_for(replicaset, 60, "the deployment controller to create a ReplicaSet")[0]

    def pods():
        items = core.list_namespaced_pod(ns).items
        owned = [p for p in items if any(o.uid == rs.metadata.uid for o in p.metadata.owner_references or [])]
        return owned if len(owned) == 2 else None

    created = wait_for(pods, 60, "the replicaset controller to create 2 Pods")
    assert all(p.status.phase == "Pending" for p in created)  # nothing runs them here
    # The ServiceAccount admission plugin mounted a projected token (the SA controller works).
    assert created[0].spec.service_account_name == "default"
    # The root CA publisher (--root-ca-file) put the cluster CA into the namespace.
    cm = wait_for(lambda: core.read_namespaced_config_map("kube-root-ca.crt", ns), 30, "kube-root-ca.crt")
    assert "BEGIN CERTIFICATE" in cm.data["ca.crt"]

    # Garbage collection: deleting the Deployment in the background removes its ReplicaSet and Pods.
    apps.delete_namespaced_deployment("web", ns, propagation_policy="Background")
    wait_for(lambda: not apps.list_namespaced_replica_set(ns).items and not core.list_namespaced_pod(ns).items,
             60, "the garbage collector to delete the ReplicaSet and Pods")
    core.delete_namespace(ns)


def test_service_account_tokens_and_rbac_are_real(devcluster, kube_api):
    ns = create_namespace(kube_api, "cp-rbac")
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody")))
    token = core.create_namespaced_service_account_token(
        "nobody", ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token
    user = f"system:serviceaccount:{ns}:nobody"

    review = client.AuthenticationV1Api(kube_api).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)))
    assert review.status.authenticated and review.status.user.username == user

    sar = client.AuthorizationV1Api(kube_api).create_subject_access_review(client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
            resource_attributes=client.V1ResourceAttributes(namespace=ns, verb="list", resource="secrets"),
        )))
    assert sar.status.allowed is False

    as_sa = _as_token(devcluster, token)
    try:
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(as_sa).list_namespaced_secret(ns)
        assert denied.value.status == 403
        with pytest.raises(ApiException) as denied_pods:
            client.CoreV1Api(as_sa).list_namespaced_pod(ns)
        assert denied_pods.value.status == 403

        # A Role + RoleBinding grants exactly listing pods, and nothing more.
        rbac.create_namespaced_role(ns, client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])]))
        rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="nobody", namespace=ns)]))

        def can_list_pods() -> bool:
            client.CoreV1Api(as_sa).list_namespaced_pod(ns)
            return True

        wait_for(can_list_pods, 30, "the RoleBinding to take effect")
        with pytest.raises(ApiException) as still_denied:
            client.CoreV1Api(as_sa).list_namespaced_secret(ns)
        assert still_denied.value.status == 403
    finally:
        as_sa.close()
    core.delete_namespace(ns)


def test_prometheus_scrapes_a_target_and_answers_queries(prometheus):
    registry = CollectorRegistry()
    gauge = Gauge("lookahead_test_value", "a value for the Prometheus test", registry=registry)
    gauge.set(42.5)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    address = f"127.0.0.1:{port}"
    try:
        prometheus.set_targets([{"address": address, "labels": {"role": "canary"}}], source="test_controlplane")
        up = prometheus.wait_target_up(address, timeout=30)
        assert up[0]["metric"]["role"] == "canary"

        def value():
            res = prometheus.client().custom_query(query=f'lookahead_test_value{{instance="{address}"}}')
            return res if res else None

        res = wait_for(value, 30, "the gauge to be scraped", interval=0.25)
        assert float(res[0]["value"][1]) == 42.5
        assert res[0]["metric"]["job"] == "lookahead" and res[0]["metric"]["role"] == "canary"
    finally:
        prometheus.set_targets([], source="test_controlplane")
        server.shutdown()
        thread.join(timeout=5)


def test_cli_up_status_down(real_node_holder):
    """`python -m lookahead_dev.devcluster up|status|down`, as `make cluster-up` and `make
    cluster-down` run it: the control plane, a real node running a Pod, Prometheus discovering it;
    and after `down`, nothing left on the machine (the node checks itself: processes, mounts,
    bridge, cgroups, directories, netns)."""
    import subprocess
    import sys

    from lookahead_dev.node import image_name

    real_node_holder.stop()  # one real node per machine at a time
    from kubernetes import config

    # A short state folder, not tmp_path: containerd's sockets live under it and a unix socket path
    # is at most 104 bytes (pytest-xdist's tmp_path adds a popen-gwN level and crosses it).
    short = Path(tempfile.mkdtemp(prefix="lr-cli-"))
    state = short / "cluster"
    cli = [sys.executable, "-m", "lookahead_dev.devcluster", "--state-dir", str(state)]
    up = subprocess.run([*cli[:3], "up", *cli[3:]], cwd=REPO, capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stderr
        up_out = up.stdout
        exports = dict(re.findall(r"^export (\w+)=(\S+)$", up.stdout, re.M))
        assert Path(exports["KUBECONFIG"]).is_file() and exports["LOOKAHEAD_PROMETHEUS_URL"].startswith("http://10.")
        status = subprocess.run([*cli[:3], "status", *cli[3:]], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        cluster_state = json.loads((state / "state.json").read_text())
        api = config.new_client_from_config(config_file=exports["KUBECONFIG"])
        core = client.CoreV1Api(api)
        try:
            node = core.read_node(cluster_state["node"])
            assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
            # a Pod annotated for scraping runs on the node and Prometheus finds it by pod discovery
            wait_for(lambda: core.read_namespaced_service_account("default", "default"), 30, "default SA")
            core.create_namespaced_pod("default", {
                "metadata": {"name": "engine", "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {"containers": [{"name": "engine", "image": image_name("engine"),  # from the node's registry
                                         "command": ["python3", "-m", "lookahead_canary.server", "--host", "0.0.0.0",
                                                     "--port", "8000", "--backend", "simulate"],
                                         "ports": [{"containerPort": 8000}]}]}})
            from prometheus_api_client import PrometheusConnect

            prom = PrometheusConnect(url=exports["LOOKAHEAD_PROMETHEUS_URL"], disable_ssl=True)
            up = wait_for(lambda: prom.custom_query('up{job="kubernetes-pods",pod="engine"} == 1'), 90,
                          "Prometheus to discover and scrape the Pod", interval=0.5)
            assert up[0]["metric"]["namespace"] == "default"
            # and that Pod reaches Prometheus by the Service name `up` printed (kube-proxy, CoreDNS)
            assert "http://prometheus.monitoring:9090" in up_out
            from lookahead_dev.devcluster import control_plane_binary

            probe = ("import urllib.request as u; "
                     "print(u.urlopen('http://prometheus.monitoring:9090/-/ready', timeout=5).status)")
            kubectl = [str(control_plane_binary("kubectl")), f"--kubeconfig={exports['KUBECONFIG']}"]
            res = wait_for(lambda: subprocess.run([*kubectl, "exec", "engine", "--", "python3", "-c", probe],
                                                  capture_output=True, text=True, timeout=30).stdout.strip() == "200",
                           60, "the Pod to reach Prometheus through its Service name", interval=0.5)
            assert res
        finally:
            api.close()
        pids = [int(p) for p in re.findall(r"pid\s+(\d+)\s+running", status.stdout)]
        assert len(pids) == 5
    finally:
        down = subprocess.run([*cli[:3], "down", *cli[3:]], cwd=REPO, capture_output=True, text=True, timeout=200)
        if not state.exists():   # down removed the state; its short parent folder goes too
            shutil.rmtree(short, ignore_errors=True)
    assert down.returncode == 0, down.stderr
    assert not state.exists()
    from lookahead_canary.process import pid_alive

    assert [p for p in pids if pid_alive(p)] == []
