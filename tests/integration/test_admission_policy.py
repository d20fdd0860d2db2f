"""Least privilege at apply time (issue 24, item 4): the chart's ValidatingAdmissionPolicy on the
real kube-apiserver, with a user who may create LookaheadPolicies in their own namespace only.

A policy in namespace A that names namespace B, or selects namespaces by label, is refused with a
message naming the field and the namespace, until the cluster admin lists B for A in the chart's
``crossNamespaceTargets``; a policy created while it was allowed can still be changed (not its
targets) and deleted after the list shrinks. The operator's own refusal (where this admission
policy is absent or bypassed) is tested in tests/e2e/test_operator_status.py and
tests/unit/controller/test_tenancy.py.
"""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_operator.api.names import GROUP, PLURAL, VERSION

from .helpers import create_namespace, unique_name, wait_until
from .test_chart import CHART, helm, run_helm  # noqa: F401  (helm: the fixture)
from .test_crd import install_crd

pytestmark = pytest.mark.integration
USER = "alice"


@pytest.fixture(scope="module")
def tenants(kube_api):
    """Namespaces a (alice's own) and b, and alice's Role: LookaheadPolicies in a, nothing else."""
    install_crd(kube_api)
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    a, b = create_namespace(kube_api, "tenant-a"), create_namespace(kube_api, "tenant-b")
    rbac.create_namespaced_role(a, {"metadata": {"name": "policy-author"}, "rules": [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "create", "update", "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(a, {
        "metadata": {"name": "policy-author"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "policy-author"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]})
    yield a, b
    for ns in (a, b):
        core.delete_namespace(ns)


@pytest.fixture()
def as_alice(devcluster):
    api = devcluster.api_client()
    api.set_default_header("Impersonate-User", USER)   # the cluster admin may impersonate
    yield client.CustomObjectsApi(api)
    api.close()


class AdmissionPolicy:
    """The chart's ValidatingAdmissionPolicy and binding, rendered by `helm template` with the
    given crossNamespaceTargets and applied (or replaced), removed at the end."""

    def __init__(self, kube_api, helm_bin: str):
        self.api = client.AdmissionregistrationV1Api(kube_api)
        self.helm = helm_bin
        self.release = unique_name("vap")
        self.names: list[str] = []

    def apply(self, allow: dict[str, list[str]]) -> None:
        args = [a for ns, targets in allow.items() for i, t in enumerate(targets)
                for a in ("--set", f"crossNamespaceTargets.{ns}[{i}]={t}")]
        out = run_helm(self.helm, "template", self.release, str(CHART), "--namespace", "lookahead-system",
                       "--show-only", "templates/admissionpolicy.yaml", *args).stdout
        for doc in (d for d in yaml.safe_load_all(out) if d):
            name = doc["metadata"]["name"]
            create, read, replace = ((self.api.create_validating_admission_policy,
                                      self.api.read_validating_admission_policy,
                                      self.api.replace_validating_admission_policy)
                                     if doc["kind"] == "ValidatingAdmissionPolicy" else
                                     (self.api.create_validating_admission_policy_binding,
                                      self.api.read_validating_admission_policy_binding,
                                      self.api.replace_validating_admission_policy_binding))
            try:
                create(doc)
            except ApiException as exc:
                assert exc.status == 409, exc.body
                doc["metadata"]["resourceVersion"] = read(name).metadata.resource_version
                replace(name, doc)
            self.names.append(name)

    def remove(self) -> None:
        for name in set(self.names):
            for delete in (self.api.delete_validating_admission_policy_binding,
                           self.api.delete_validating_admission_policy):
                try:
                    delete(name)
                except ApiException as exc:
                    assert exc.status == 404, exc.body


@pytest.fixture()
def admission(kube_api, helm):  # noqa: F811
    vap = AdmissionPolicy(kube_api, helm)
    yield vap
    vap.remove()


def policy(name: str, ns: str, **targets) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LookaheadPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"targets": {"selector": {"matchLabels": {"app": "chat"}}, **targets}}}


def create(custom: client.CustomObjectsApi, body: dict, dry_run: bool = False) -> ApiException | None:
    """None when the apiserver stores (or would store) it, else its refusal."""
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body,
                                               dry_run="All" if dry_run else None)
    except ApiException as exc:
        return exc
    return None


def refusal(custom, body) -> ApiException | None:
    """Wait for the admission plugin to have loaded the (new) policy: a refusal, or None after 30 s
    of being let through (the apiserver loads a changed policy within a second or two)."""
    try:
        return wait_until(lambda: create(custom, body, dry_run=True), timeout=30, what="a refusal", interval=0.3)
    except AssertionError:
        return None


def test_another_namespace_is_refused_at_apply_until_the_admin_lists_it(tenants, as_alice, admission):
    a, b = tenants
    admission.apply({})
    reach = policy("reach", a, namespaces=[a, b])
    err = refusal(as_alice, reach)
    assert err is not None and err.status == 403, "the admission policy never refused it"
    assert (f"spec.targets.namespaces: a policy in namespace {a} may not target namespace(s) {b}"
            in err.body), err.body
    assert "crossNamespaceTargets" in err.body
    by_label = policy("by-label", a, namespaceSelector={"matchLabels": {"tier": "serving"}})
    err = create(as_alice, by_label)
    assert err is not None and err.status == 403 and "spec.targets.namespaceSelector: a policy in namespace" in err.body
    # her own namespace needs no entry; and she may not write policies anywhere else at all (RBAC)
    assert create(as_alice, policy("own", a)) is None
    assert create(as_alice, policy("own-named", a, namespaces=[a])) is None
    err = create(as_alice, policy("elsewhere", b))
    assert err is not None and err.status == 403 and "cannot create resource" in err.body
    for name in ("reach", "by-label"):
        with pytest.raises(ApiException) as gone:
            as_alice.get_namespaced_custom_object(GROUP, VERSION, a, PLURAL, name)
        assert gone.value.status == 404, "a refused policy is not stored"

    # the cluster admin lists b for a: the same policy is accepted (and a selector with it)
    admission.apply({a: [b]})
    assert wait_until(lambda: create(as_alice, reach, dry_run=True) is None, timeout=30, what="the listed namespace "
                      "accepted", interval=0.3)
    assert create(as_alice, reach) is None and create(as_alice, by_label) is None
    third = policy("third", a, namespaces=[a, b, "kube-system"])
    err = create(as_alice, third)
    assert err is not None and "may not target namespace(s) kube-system:" in err.body   # only what is listed

    # the list shrinks again: what was stored can still be edited (not its targets) and deleted
    admission.apply({})
    assert refusal(as_alice, policy("again", a, namespaces=[a, b])) is not None
    stored = as_alice.get_namespaced_custom_object(GROUP, VERSION, a, PLURAL, "reach")
    stored["metadata"].setdefault("annotations", {})["lookahead.dev/note"] = "still editable"
    as_alice.replace_namespaced_custom_object(GROUP, VERSION, a, PLURAL, "reach", stored)
    stored = as_alice.get_namespaced_custom_object(GROUP, VERSION, a, PLURAL, "reach")
    stored["spec"]["targets"]["namespaces"] = [a, b, "kube-system"]
    with pytest.raises(ApiException) as changed:
        as_alice.replace_namespaced_custom_object(GROUP, VERSION, a, PLURAL, "reach", stored)
    assert changed.value.status == 403 and "may not target namespace(s)" in changed.value.body
    as_alice.delete_namespaced_custom_object(GROUP, VERSION, a, PLURAL, "reach")
