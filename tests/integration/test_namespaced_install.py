"""A namespaced install (issue 24, item 4: "a Role, one watched namespace"; must show: "a
namespaced install works end to end"): the chart with ``watchNamespace`` renders a Role and a
RoleBinding in that namespace and nothing cluster-wide beyond the CRD and the admission policy, and
the operator -- a real `kopf run` process with the namespaced ServiceAccount's own token, on the
real kube-apiserver -- works with that Role alone: a policy in the watched namespace gets its status
(its target claimed, a cross-namespace reach refused with a condition, deletion carried out through
the finalizer), a policy in another namespace is never touched, and its log has no 403.

No node is needed: the target Deployment's pods stay Pending (no scheduler), which is what a
policy reads up to Preflight. tests/e2e/test_namespaced.py runs a whole rollout this way on the
real node (the chart's `helm install` with watchNamespace).
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from lookahead_canary import process
from lookahead_dev.devcluster import free_port
from lookahead_operator.api.names import FINALIZER, GROUP, LABEL_POLICY, LABEL_POLICY_NAMESPACE, PLURAL, VERSION

from .helpers import create_namespace, wait_until
from .test_admission_policy import AdmissionPolicy, create, refusal
from .test_chart import CHART, _apply, by_kind, helm, render, run_helm  # noqa: F401  (helm: the fixture)
from .test_crd import install_crd

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PEERING = "lookahead-operator"


# ------------------------------------------------------------------------------------------
# rendering

def test_a_namespaced_install_renders_a_role_in_the_watched_namespace_and_nothing_cluster_wide(helm):
    docs = by_kind(render(helm, "lookahead", "lookahead-system", "--set", "watchNamespace=team-a"))
    assert set(docs) == {"CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "Deployment",
                         "Service", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    (role,), (binding,), (sa,) = docs["Role"], docs["RoleBinding"], docs["ServiceAccount"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "lookahead-system"}]   # the operator's Pod runs in the release's
    # the Role: the ClusterRole's rules less the cluster-scoped ones, none of them a wildcard
    (cluster_role,) = by_kind(render(helm, "lookahead", "lookahead-system"))["ClusterRole"]

    def grants(r):
        out = {}
        for rule in r["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            for g in rule["apiGroups"]:
                for res in rule["resources"]:
                    out.setdefault((g, res), set()).update(rule["verbs"])
        return out

    cluster_only = {("", "nodes"), ("", "namespaces"), ("kopf.dev", "clusterkopfpeerings"),
                    ("apiextensions.k8s.io", "customresourcedefinitions")}
    wide = grants(cluster_role)
    assert grants(role) == {k: v for k, v in wide.items() if k not in cluster_only}
    assert grants(role)[("", "secrets")] == {"get"}
    # Kopf and the operator told the namespace
    (c,) = docs["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert "--namespace=team-a" in c["command"] and "--all-namespaces" not in c["command"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["LOOKAHEAD_WATCH_NAMESPACE"] == "team-a" and env["LOOKAHEAD_CROSS_NAMESPACE_TARGETS"] == "{}"
    # the admission policy checks that namespace's policies only, and allows no other namespace
    (vap_binding,) = docs["ValidatingAdmissionPolicyBinding"]
    assert vap_binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}}
    messages = " ".join(v["messageExpression"] for v in docs["ValidatingAdmissionPolicy"][0]["spec"]["validations"])
    assert "watchNamespace" in messages and "crossNamespaceTargets" not in messages
    # cluster-wide (the default) is unchanged: no Role, --all-namespaces, no watch namespace
    wide_docs = by_kind(render(helm, "lookahead", "lookahead-system"))
    assert "Role" not in wide_docs and "RoleBinding" not in wide_docs
    (c,) = wide_docs["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert "--all-namespaces" in c["command"] and "LOOKAHEAD_WATCH_NAMESPACE" not in {e["name"] for e in c["env"]}
    assert "matchResources" not in wide_docs["ValidatingAdmissionPolicyBinding"][0]["spec"]


def test_a_namespaced_install_peers_in_a_kopf_peering_of_its_namespace(helm):
    docs = by_kind(render(helm, "lookahead", "lookahead-system", "--set", "watchNamespace=team-a",
                          "--set", "peering.enabled=true", "--set", "replicaCount=2"))
    assert "ClusterKopfPeering" not in docs and "ClusterRole" not in docs and "ClusterRoleBinding" not in docs
    (peering,) = docs["KopfPeering"]
    assert peering["metadata"] == {**peering["metadata"], "name": PEERING, "namespace": "team-a"}
    (c,) = docs["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert f"--peering={PEERING}" in c["command"] and "--namespace=team-a" in c["command"]
    (role,) = docs["Role"]
    assert any(r["apiGroups"] == ["kopf.dev"] and r["resources"] == ["kopfpeerings"] for r in role["rules"])
    crd = yaml.safe_load((CHART / "crds" / "kopfpeerings.yaml").read_text())
    assert crd["spec"]["scope"] == "Namespaced" and crd["spec"]["names"]["kind"] == "KopfPeering"
    run_helm(helm, "lint", "--strict", str(CHART), "--set", "watchNamespace=team-a", "--set", "peering.enabled=true",
             "--set", "replicaCount=2")


@pytest.mark.parametrize("args, message", [
    (["--set", "watchNamespace=Team_A"], "watchNamespace"),
    (["--set", "watchNamespace=team-a", "--set", "crossNamespaceTargets.team-a[0]=inference"],
     "watchNamespace=team-a and crossNamespaceTargets are both set"),
])
def test_a_namespaced_install_refuses_what_cannot_work(helm, args, message):
    proc = run_helm(helm, "template", "r", str(CHART), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------
# the real apiserver, the operator with the Role alone

def engine_deployment(ns: str, name: str, app: str) -> dict:
    labels = {"app": app, "fleet": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns,
                                                                        "labels": {"app": app}},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "engine", "image": "lookahead-rollout/engine:test",
                                         "command": ["python3", "-m", "lookahead_canary.server"],
                                         "args": ["--port", "8000", "--backend", "simulate"],
                                         "ports": [{"name": "http", "containerPort": 8000}]}]}}}}


def policy(ns: str, name: str, app: str, **targets) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LookaheadPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"targets": {"selector": {"matchLabels": {"app": app}}, **targets}, "engine": "reference",
                     "load": {"batchSizes": [1]},
                     "analysis": {"prometheus": {"url": "http://127.0.0.1:9"}}}}


class Install:
    """The chart rendered with watchNamespace, its ServiceAccount, Role, RoleBinding (and Kopf's
    namespaced peering) applied for real, and the operator run as that ServiceAccount."""

    def __init__(self, kube_api, devcluster, helm_bin: str, log_dir: Path):
        self.api, self.cluster, self.helm, self.log_dir = kube_api, devcluster, helm_bin, log_dir
        self.release = f"ns-{uuid.uuid4().hex[:5]}"
        self.ops = create_namespace(kube_api, "ns-ops")          # the release's (the operator Pod's) namespace
        self.watched = create_namespace(kube_api, "ns-watched")
        self.other = create_namespace(kube_api, "ns-other")
        self.proc = None
        self.docs = render(helm_bin, self.release, self.ops, "--set", f"watchNamespace={self.watched}",
                           "--set", "peering.enabled=true")

    def apply_rbac(self) -> str:
        dyn = DynamicClient(self.api)
        kinds = by_kind(self.docs)
        assert not {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"} & set(kinds)
        for doc in (*kinds["ServiceAccount"], *kinds["Role"], *kinds["RoleBinding"]):
            _apply(dyn, doc, dry_run=False)
        # Kopf's namespaced peering: its CRD from the chart's crds/ (as `helm install` does), its object
        _apply(dyn, yaml.safe_load((CHART / "crds" / "kopfpeerings.yaml").read_text()), dry_run=False)
        wait_until(lambda: self._established("kopfpeerings.kopf.dev"), timeout=30, what="KopfPeering CRD", interval=0.2)
        (peering,) = kinds["KopfPeering"]
        _apply(DynamicClient(self.api), peering, dry_run=False)
        return kinds["ServiceAccount"][0]["metadata"]["name"]

    def _established(self, name: str) -> bool:
        crd = client.ApiextensionsV1Api(self.api).read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    def kubeconfig_for(self, sa: str) -> Path:
        """A kubeconfig with a token the apiserver issued for the ServiceAccount (as in a Pod)."""
        token = client.CoreV1Api(self.api).create_namespaced_service_account_token(
            sa, self.ops, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                audiences=[], expiration_seconds=3600))).status.token
        path = self.log_dir / "sa.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "c", "cluster": {"server": self.cluster.server,
                                                   "certificate-authority": str(self.cluster.ca_file)}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": self.watched}}]}))
        return path

    def start(self, kubeconfig: Path) -> None:
        (dep,) = by_kind(self.docs)["Deployment"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        flags = [f for f in c["command"][4:] if not f.startswith("--liveness")]   # as the chart runs it
        assert f"--namespace={self.watched}" in flags and f"--peering={PEERING}" in flags
        chart_env = {e["name"]: e["value"] for e in c["env"] if "value" in e and e["name"].startswith("LOOKAHEAD_")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOKAHEAD_") and k != "KUBECONFIG"}
        env |= {**chart_env, "KUBECONFIG": str(kubeconfig), "LOOKAHEAD_POLL_SECONDS": "1",
                "LOOKAHEAD_METRICS_PORT": str(free_port()), "LOOKAHEAD_METRICS_ADDR": "127.0.0.1",
                "POD_NAME": f"{self.release}-0", "PYTHONUNBUFFERED": "1"}
        assert env["LOOKAHEAD_WATCH_NAMESPACE"] == self.watched
        self.proc = process.start([sys.executable, "-m", "kopf", "run", "-m", "lookahead_operator.runtime.handlers",
                                   *flags], self.log_dir / "operator.log", env=env, cwd=REPO)

    def log(self) -> str:
        path = self.log_dir / "operator.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        process.stop(self.proc)
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        custom = client.CustomObjectsApi(self.api)
        for ns in (self.watched, self.other):   # the operator is gone: nothing removes its finalizer now
            for p in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
                try:
                    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, p["metadata"]["name"],
                                                          {"metadata": {"finalizers": None}})
                except ApiException as exc:
                    assert exc.status == 404, exc.body
        for ns in (self.watched, self.other, self.ops):
            client.CoreV1Api(self.api).delete_namespace(ns)


@pytest.fixture(scope="module")
def install(kube_api, devcluster, helm, tmp_path_factory):  # noqa: F811
    install_crd(kube_api)
    inst = Install(kube_api, devcluster, helm, tmp_path_factory.mktemp("namespaced"))
    try:
        sa = inst.apply_rbac()
        inst.start(inst.kubeconfig_for(sa))
        yield inst
    finally:
        inst.cleanup()


def status_of(custom, ns: str, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}


def conditions(st: dict) -> dict[str, dict]:
    return {c["type"]: c for c in st.get("conditions") or []}


def test_the_operator_acts_in_its_namespace_with_the_role_alone_and_never_elsewhere(kube_api, install):
    custom, apps = client.CustomObjectsApi(kube_api), client.AppsV1Api(kube_api)
    w, other = install.watched, install.other
    for ns in (w, other):
        apps.create_namespaced_deployment(ns, engine_deployment(ns, "chat-a", "chat"))
    # a policy elsewhere, applied first: the operator must never see it
    custom.create_namespaced_custom_object(GROUP, VERSION, other, PLURAL, policy(other, "elsewhere", "chat"))
    custom.create_namespaced_custom_object(GROUP, VERSION, w, PLURAL, policy(w, "mine", "chat"))
    custom.create_namespaced_custom_object(GROUP, VERSION, w, PLURAL, policy(w, "lonely", "nothing-has-this"))
    # before the admission policy is applied (below): the operator's own refusal
    custom.create_namespaced_custom_object(GROUP, VERSION, w, PLURAL, policy(
        w, "reach", "chat", namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": other}}))

    def claimed():
        st = status_of(custom, w, "mine")
        found = conditions(st).get("TargetsFound", {})
        return st if found.get("status") == "True" and st.get("targets") else None

    try:
        st = wait_until(claimed, timeout=90, what="the policy in the watched namespace claimed its target",
                        interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- operator log ---\n{install.log()[-6000:]}") from None
    assert [(t["namespace"], t["name"]) for t in st["targets"]] == [(w, "chat-a")]
    assert conditions(st)["Accepted"]["status"] == "True" and st["phase"] != "Pending", st
    lonely = wait_until(lambda: conditions(status_of(custom, w, "lonely")).get("TargetsFound"), timeout=30,
                        what="the policy without targets said so", interval=0.5)
    assert lonely["status"] == "False", lonely
    reach = wait_until(lambda: conditions(status_of(custom, w, "reach")).get("TargetsFound"), timeout=30,
                       what="the namespace selector refused", interval=0.5)
    assert (reach["status"], reach["reason"]) == ("False", "NamespaceNotAllowed"), reach
    assert f"installed for namespace {w} only" in reach["message"] and "watchNamespace" in reach["message"]

    # it goes on to create canary and control beside its target (pods never scheduled: no node)
    sel = f"{LABEL_POLICY}=mine,{LABEL_POLICY_NAMESPACE}={w}"
    wait_until(lambda: len(apps.list_namespaced_deployment(w, label_selector=sel).items) == 2, timeout=60,
               what="canary and control created", interval=0.5)
    template = apps.read_namespaced_deployment("chat-a", w).spec.template.to_dict()

    # deleting a policy carries out its cleanup (the finalizer's lists are in the namespace too):
    # canary and control deleted, the target's own template as it was
    custom.delete_namespaced_custom_object(GROUP, VERSION, w, PLURAL, "mine")

    def gone():
        try:
            custom.get_namespaced_custom_object(GROUP, VERSION, w, PLURAL, "mine")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout=60, what="the deleted policy's finalizer removed", interval=0.5)
    assert not [d.metadata.name for d in apps.list_namespaced_deployment(w, label_selector=sel).items
                if not d.metadata.deletion_timestamp]
    assert apps.read_namespaced_deployment("chat-a", w).spec.template.to_dict() == template

    # the other namespace's policy and Deployment: never touched
    body = custom.get_namespaced_custom_object(GROUP, VERSION, other, PLURAL, "elsewhere")
    assert not body.get("status") and FINALIZER not in (body["metadata"].get("finalizers") or []), body
    annotations = apps.read_namespaced_deployment("chat-a", other).metadata.annotations or {}
    assert not [k for k in annotations if k.startswith(GROUP)], annotations
    log = install.log()
    assert install.proc is not None and install.proc.poll() is None, log[-4000:]
    # a 403 as a status code (not three digits inside a generated namespace's name), or the word
    for refused in (r"\b403\b", r"[Ff]orbidden"):
        assert not re.search(refused, log), f"{refused!r} in the operator's log:\n{log[-6000:]}"
    assert f"namespaced install: watching and acting in namespace {w} only" in log


def test_the_admission_policy_of_a_namespaced_install_guards_its_namespace_only(kube_api, install):
    vap = AdmissionPolicy(kube_api, install.helm)
    try:
        out = run_helm(install.helm, "template", vap.release, str(CHART), "--namespace", install.ops,
                       "--set", f"watchNamespace={install.watched}",
                       "--show-only", "templates/admissionpolicy.yaml").stdout
        dyn = DynamicClient(kube_api)
        for doc in (d for d in yaml.safe_load_all(out) if d):
            _apply(dyn, doc, dry_run=False)
            vap.names.append(doc["metadata"]["name"])
        custom = client.CustomObjectsApi(kube_api)
        w, other = install.watched, install.other
        err = refusal(custom, policy(w, "named", "chat", namespaces=[w, other]))
        assert err is not None and err.status == 403, "the admission policy never refused it"
        assert f"may not target namespace(s) {other}" in err.body and "watchNamespace" in err.body, err.body
        err = create(custom, policy(w, "selects", "chat", namespaceSelector={"matchLabels": {"a": "b"}}), dry_run=True)
        assert err is not None and "spec.targets.namespaceSelector" in err.body, err
        assert create(custom, policy(w, "own", "chat", namespaces=[w]), dry_run=True) is None
        # another namespace is another install's business: not this admission policy's
        assert create(custom, policy(other, "far", "chat", namespaces=[other, w]), dry_run=True) is None
    finally:
        vap.remove()
