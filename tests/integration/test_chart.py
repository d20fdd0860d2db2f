"""The Helm chart: lint, render, server-side dry-run on the real apiserver, and the real RBAC.

The operator's ServiceAccount is checked against the RBAC authorizer twice: with
SubjectAccessReviews (what `kubectl auth can-i --as` does) and with real requests made with a
token issued for that ServiceAccount.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from lookahead_dev import crdgen
from lookahead_dev.devcluster import control_plane_binary

from .helpers import namespace_while_used

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lookahead-operator"
ALL_OPTIONS = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
               "--set", "peering.enabled=true", "--set", "replicaCount=2",
               "--set", "networkPolicy.metricsFromNamespaceSelector.matchLabels.name=monitoring",
               "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true"]
FIELD_MANAGER = "lookahead-chart-test"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(control_plane_binary("helm"))


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120,
                          env={"HOME": "/tmp", "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": "/tmp/helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/helm-config", "HELM_DATA_HOME": "/tmp/helm-data"})
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def render(helm: str, release: str, namespace: str, *extra: str) -> list[dict]:
    out = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *extra).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


@pytest.fixture()
def namespace(kube_api):
    yield from namespace_while_used(kube_api, "chart")


# ------------------------------------------------------------------------------------------
# lint and render

def test_helm_lint(helm):
    run_helm(helm, "lint", "--strict", str(CHART))
    run_helm(helm, "lint", "--strict", str(CHART), *ALL_OPTIONS)


def test_chart_carries_the_generated_crd():
    chart_copy = CHART / "templates" / "crd-lookaheadpolicies.yaml"
    assert chart_copy.read_text() == crdgen.render_chart()


@pytest.mark.parametrize("args, message", [
    (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    (["--set", "replicaCount=-1"], "replicaCount"),
    (["--set", "metrics.port=70000"], "port"),
    (["--set", "unknownKey=1"], "unknownKey"),
    (["--set", "replicaCount=2"], "peering.enabled"),
    # a blank load-generator image would leave every load Job unable to start
    (["--set", "operator.loadgenImage="], "loadgenImage"),
    (["--set-string", "operator.loadgenImage=   "], "loadgenImage"),
])
def test_bad_values_are_refused(helm, args, message):
    proc = run_helm(helm, "template", "r", str(CHART), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_the_load_generator_image_is_the_operators_unless_given(helm):
    def loadgen_image(*extra: str) -> str:
        (dep,) = by_kind(render(helm, "lookahead", "lookahead-system", *extra))["Deployment"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        return env["LOOKAHEAD_LOADGEN_IMAGE"], c["image"]

    loadgen, operator_image = loadgen_image()
    assert loadgen == operator_image and operator_image.strip()
    assert loadgen_image("--set", "operator.loadgenImage=registry.example/loadgen:1")[0] == "registry.example/loadgen:1"


def test_pod_monitor_labels_reach_the_operator_checked_by_its_own_rule(helm):
    """Issue 24, item 3: the chart's podMonitor.labels reach the operator as
    LOOKAHEAD_POD_MONITOR_LABELS (JSON), kube-prometheus-stack's `release` label by default; the
    operator reads the rendered value with the rule it applies at start (builders.chart_pod_monitor_labels)."""
    from lookahead_operator.controller import builders

    def labels(*extra: str) -> dict:
        (dep,) = by_kind(render(helm, "lookahead", "lookahead-system", *extra))["Deployment"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        return builders.chart_pod_monitor_labels(env[builders.POD_MONITOR_LABELS_ENV])

    assert labels() == {"release": "kube-prometheus-stack"}
    assert labels("--set", "podMonitor.labels.release=monitoring") == {"release": "monitoring"}
    assert labels("--set", "podMonitor.labels.release=null") == {}
    assert labels("--set", "podMonitor.labels=null") == {}
    assert labels("--set", "podMonitor.labels.example\\.com/team=ml") == {
        "release": "kube-prometheus-stack", "example.com/team": "ml"}


@pytest.mark.parametrize("args, message", [
    # the operator's own labels: refused naming the value and the rule
    (["--set", "podMonitor.labels.lookahead\\.dev/policy=x"],
     "podMonitor.labels: label key lookahead.dev/policy is the operator's own"),
    (["--set", "podMonitor.labels.app\\.kubernetes\\.io/managed-by=Helm"],
     "podMonitor.labels: label key app.kubernetes.io/managed-by is the operator's own"),
    # Kubernetes label syntax (the schema)
    (["--set", "podMonitor.labels.bad!key=x"], "invalid propertyName 'bad!key'"),
    (["--set", f"podMonitor.labels.{'k' * 64}=x"], f"invalid propertyName '{'k' * 64}'"),
    (["--set-string", "podMonitor.labels.release=not_ok-"], "/podMonitor/labels/release"),
    (["--set", "podMonitor.label.release=x"], "/podMonitor"),
])
def test_bad_pod_monitor_labels_are_refused(helm, args, message):
    proc = run_helm(helm, "template", "r", str(CHART), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_rendered_objects(helm):
    docs = by_kind(render(helm, "lookahead", "lookahead-system"))
    assert set(docs) == {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                         "Deployment", "Service", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    # least privilege at apply (tests/integration/test_admission_policy.py): bound to its policy, denying
    (vap,), (binding,) = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    dep = docs["Deployment"][0]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:5] == ["kopf", "run", "-m", "lookahead_operator.runtime.handlers", "--all-namespaces"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["command"] and "--standalone" in c["command"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8080, "metrics": 9100}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"][0]["metadata"]["name"]
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    svc = docs["Service"][0]
    assert svc["spec"]["ports"][0]["port"] == 9100 and svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]

    all_docs = by_kind(render(helm, "lookahead", "lookahead-system", *ALL_OPTIONS))
    (sm,) = all_docs["ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert all(svc["metadata"]["labels"][k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert all_docs["NetworkPolicy"][0]["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    cmd = all_docs["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--peering=lookahead-operator" in cmd and "--standalone" not in cmd
    assert all_docs["ClusterKopfPeering"][0]["metadata"]["name"] == "lookahead-operator"


def test_cluster_role_is_least_privilege(helm):
    (role,) = by_kind(render(helm, "lookahead", "lookahead-system"))["ClusterRole"]
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        assert "secrets" not in rule["resources"] or rule["verbs"] == ["get"], rule  # by name only
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                grants.setdefault((g, r), set()).update(rule["verbs"])
    read = {"get", "list", "watch"}
    assert grants == {
        ("lookahead.dev", "lookaheadpolicies"): read | {"patch", "update"},
        ("lookahead.dev", "lookaheadpolicies/status"): {"get", "patch", "update"},
        ("lookahead.dev", "lookaheadpolicies/finalizers"): {"get", "patch", "update"},
        ("apps", "deployments"): read | {"create", "patch", "update", "delete"},
        ("apps", "replicasets"): read,
        ("", "pods"): read | {"patch"},       # the control's pods only, joining the fleet's Service
        ("", "nodes"): {"get", "list"},       # preflight: the pool's allocatable accelerators (read only)
        ("batch", "jobs"): read | {"create", "delete"},
        # live mode: split service lists which Service selects the fleet (never writes it); split
        # gatewayAPI reads the fleet's backend by name and creates/deletes each arm's own Service
        ("", "services"): {"get", "list", "create", "delete"},
        ("gateway.networking.k8s.io", "httproutes"): {"get", "update"},  # the route, re-weighted and restored
        ("inference.networking.k8s.io", "inferencepools"): {"get", "create", "delete"},  # InferencePool arms
        ("", "configmaps"): read,
        ("", "secrets"): {"get"},             # analysis.prometheus credentials, by name; never list/watch
        ("", "events"): {"create", "patch"},
        ("events.k8s.io", "events"): {"create", "patch"},
        ("", "namespaces"): read,
        ("monitoring.coreos.com", "podmonitors"): read | {"create", "patch", "delete"},
        ("kopf.dev", "clusterkopfpeerings"): read | {"patch"},
        ("kopf.dev", "kopfpeerings"): read | {"patch"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): read,
    }


# ------------------------------------------------------------------------------------------
# the real apiserver

def _apply(dyn: DynamicClient, doc: dict, dry_run: bool):
    resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    namespace = doc["metadata"].get("namespace") if resource.namespaced else None
    kwargs = {"dry_run": "All"} if dry_run else {}
    return dyn.server_side_apply(resource, body=doc, name=doc["metadata"]["name"], namespace=namespace,
                                 field_manager=FIELD_MANAGER, force_conflicts=True, **kwargs)


def test_template_applies_with_server_side_dry_run(kube_api, helm, namespace):
    dyn = DynamicClient(kube_api)
    release = f"dry-{uuid.uuid4().hex[:5]}"
    docs = render(helm, release, namespace)
    results = {}
    for doc in docs:
        out = _apply(dyn, doc, dry_run=True)
        assert out.metadata.name == doc["metadata"]["name"]
        results[(doc["kind"], doc["metadata"]["name"])] = out
    assert len(results) == 8
    # The apiserver accepted the Deployment with its hardening intact (admission did not strip it).
    dep = results[("Deployment", f"{release}-lookahead-operator")].to_dict()
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # A dry run stores nothing.
    apps = client.AppsV1Api(kube_api)
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_deployment(f"{release}-lookahead-operator", namespace)
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        client.RbacAuthorizationV1Api(kube_api).read_cluster_role(f"{release}-lookahead-operator")
    assert err.value.status == 404


def test_all_options_apply_with_server_side_dry_run(kube_api, helm, namespace):
    """Peering, NetworkPolicy, two replicas and the dashboard's ConfigMap. Kopf's peering CRD is
    installed for real first, from the chart's crds/ directory, as `helm install` does before it
    builds the release's objects (tests/e2e/test_peering.py runs the real `helm install`). The
    ServiceMonitor and the PrometheusRule need the Prometheus Operator's CRDs, which this test does
    not install: installing and deleting them here, beside the tests that run operators, made
    their PodMonitor creates meet a terminating CRD in CI; they are rendered
    (test_rendered_objects) and the rules run by promtool (test_chart_alerts.py)."""
    dyn = DynamicClient(kube_api)
    release = f"all-{uuid.uuid4().hex[:5]}"
    docs = render(helm, release, namespace, *ALL_OPTIONS)
    assert not [d for d in docs if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"].endswith("kopf.dev")], \
        "a CRD in templates/ cannot serve a ClusterKopfPeering object of the same release"
    peering_crd = [d for d in yaml.safe_load_all((CHART / "crds" / "clusterkopfpeerings.yaml").read_text()) if d]
    assert len(peering_crd) == 1
    _apply(dyn, peering_crd[0], dry_run=False)
    ext = client.ApiextensionsV1Api(kube_api)
    deadline = time.monotonic() + 30
    while True:
        crd = ext.read_custom_resource_definition("clusterkopfpeerings.kopf.dev")
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            break
        assert time.monotonic() < deadline, "kopf peering CRD not Established"
        time.sleep(0.2)
    dyn = DynamicClient(kube_api)  # fresh discovery, now with kopf.dev
    applied = []
    for doc in docs:
        if doc["kind"] in ("ServiceMonitor", "PrometheusRule"):
            continue
        _apply(dyn, doc, dry_run=True)
        applied.append(doc["kind"])
    assert {"NetworkPolicy", "ClusterKopfPeering", "Deployment", "ClusterRole", "ConfigMap"} <= set(applied), applied


# ------------------------------------------------------------------------------------------
# RBAC, really applied

@pytest.fixture()
def operator_rbac(kube_api, helm, namespace):
    """The chart's ServiceAccount, ClusterRole and ClusterRoleBinding, applied for real."""
    dyn = DynamicClient(kube_api)
    release = f"rbac-{uuid.uuid4().hex[:5]}"
    rendered = render(helm, release, namespace)
    docs = [d for d in rendered if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    assert len(docs) == 3
    for doc in docs:
        _apply(dyn, doc, dry_run=False)
    # The chart's CRD too, so that requests for policies reach the authorizer rather than a 404.
    (crd,) = [d for d in rendered if d["kind"] == "CustomResourceDefinition"]
    _apply(dyn, crd, dry_run=False)
    _wait_served(kube_api)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    yield namespace, sa
    rbac = client.RbacAuthorizationV1Api(kube_api)
    rbac.delete_cluster_role_binding(f"{release}-lookahead-operator")
    rbac.delete_cluster_role(f"{release}-lookahead-operator")


def _wait_served(kube_api, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.CustomObjectsApi(kube_api).list_cluster_custom_object("lookahead.dev", "v1alpha1",
                                                                       "lookaheadpolicies", limit=1)
            return
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _can(kube_api, ns: str, sa: str, verb: str, resource: str, group: str = "", subresource: str = "",
         namespace: str | None = "default") -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{ns}:{sa}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, subresource=subresource or None, namespace=namespace)))
    out = client.AuthorizationV1Api(kube_api).create_subject_access_review(review)
    return bool(out.status.allowed)


ALLOWED = [
    ("patch", "lookaheadpolicies", "lookahead.dev", "status"),
    ("update", "lookaheadpolicies", "lookahead.dev", "status"),
    ("update", "lookaheadpolicies", "lookahead.dev", "finalizers"),
    ("watch", "lookaheadpolicies", "lookahead.dev", ""),
    ("patch", "lookaheadpolicies", "lookahead.dev", ""),
    ("create", "deployments", "apps", ""),
    ("patch", "deployments", "apps", ""),
    ("delete", "deployments", "apps", ""),
    ("create", "jobs", "batch", ""),
    ("list", "pods", "", ""),
    ("create", "events", "", ""),
    ("create", "events", "events.k8s.io", ""),
    ("create", "podmonitors", "monitoring.coreos.com", ""),
    ("get", "configmaps", "", ""),
    ("get", "secrets", "", ""),         # analysis.prometheus credentials, read by name
    ("update", "httproutes", "gateway.networking.k8s.io", ""),      # live split gatewayAPI: the route
    ("create", "services", "", ""),                                 # ... each arm's own Service
    ("create", "inferencepools", "inference.networking.k8s.io", ""),  # ... or InferencePool
]
DENIED = [
    ("patch", "services", "", ""),      # an arm's Service is created and deleted, never a user's written
    ("delete", "httproutes", "gateway.networking.k8s.io", ""),
    ("list", "httproutes", "gateway.networking.k8s.io", ""),        # read by name only
    ("list", "secrets", "", ""),
    ("watch", "secrets", "", ""),
    ("create", "lookaheadpolicies", "lookahead.dev", ""),
    ("delete", "lookaheadpolicies", "lookahead.dev", ""),
    ("delete", "pods", "", ""),
    ("create", "pods", "", "exec"),
    ("create", "configmaps", "", ""),
    ("update", "jobs", "batch", ""),
    ("create", "serviceaccounts", "", "token"),
    ("create", "rolebindings", "rbac.authorization.k8s.io", ""),
]


def test_service_account_rbac(kube_api, operator_rbac):
    ns, sa = operator_rbac
    for verb, resource, group, sub in ALLOWED:
        assert _can(kube_api, ns, sa, verb, resource, group, sub), f"should be allowed: {verb} {group}/{resource}/{sub}"
    for verb, resource, group, sub in DENIED:
        assert not _can(kube_api, ns, sa, verb, resource, group, sub), f"should be denied: {verb} {group}/{resource}/{sub}"
    # Cluster-wide too (policies and fleets live in any namespace; secrets are read by name only).
    assert _can(kube_api, ns, sa, "list", "deployments", "apps", namespace=None)
    assert not _can(kube_api, ns, sa, "list", "secrets", namespace=None)
    assert not _can(kube_api, ns, sa, "watch", "secrets", namespace=ns)


def test_service_account_token_really_denied_secrets(kube_api, devcluster, operator_rbac):
    """Real requests as the ServiceAccount, with a token the apiserver issued for it."""
    ns, sa = operator_rbac
    core = client.CoreV1Api(kube_api)
    token = core.create_namespaced_service_account_token(
        sa, ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=600))).status.token
    cfg = client.Configuration()
    cfg.host = devcluster.server
    cfg.ssl_ca_cert = str(devcluster.ca_file)
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(cfg) as as_sa:
        sa_core = client.CoreV1Api(as_sa)
        for call in (lambda: sa_core.list_secret_for_all_namespaces(),
                     lambda: sa_core.list_namespaced_secret(ns)):
            with pytest.raises(ApiException) as err:
                call()
            assert err.value.status == 403, err.value.body
        # A Secret by name (what analysis.prometheus names) is readable: not found, not forbidden.
        with pytest.raises(ApiException) as err:
            sa_core.read_namespaced_secret("no-such-secret", ns)
        assert err.value.status == 404, err.value.body
        # What it needs works.
        client.AppsV1Api(as_sa).list_deployment_for_all_namespaces(limit=1)
        sa_core.list_namespace(limit=1)
        client.CustomObjectsApi(as_sa).list_cluster_custom_object("lookahead.dev", "v1alpha1", "lookaheadpolicies", limit=1)
