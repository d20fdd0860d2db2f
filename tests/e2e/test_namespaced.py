"""A namespaced install end to end (issue 24, item 4: "a Role, one watched namespace"; must show:
"a namespaced install works end to end"): `helm install` of the chart with ``watchNamespace`` (a
Role and RoleBinding there, nothing cluster-wide but the CRD and the admission policy; Kopf's
namespaced peering), the operator as a Pod on the real node, and a whole rollout in that namespace
-- measured, decided, promoted, guarded, Succeeded -- with no request of the operator's refused
(no 403 in its log); a policy in another namespace is never touched.

The Role alone against the real apiserver (no node) is tests/integration/test_namespaced_install.py."""

from __future__ import annotations

import pytest
from kubernetes import client

from lookahead_dev.devcluster import wait_for
from lookahead_operator.api.names import FINALIZER, GROUP, PLURAL, VERSION

from .conftest import OperatorPod
from .helpers import GOOD_GPU, apply_policy, engine_deployment, get_policy, make_namespace, policy, wait_phase

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
WATCHED, OTHER = "e2e-namespaced", "e2e-namespaced-other"


def test_a_namespaced_install_rolls_out_in_its_namespace_with_its_role_alone(devcluster, crd_installed, real_node,
                                                                              prometheus, kube_api):
    core, apps, custom = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.CustomObjectsApi(kube_api)
    rbac = client.RbacAuthorizationV1Api(kube_api)
    for ns in (WATCHED, OTHER):   # (the Role goes into WATCHED: it exists before the install)
        make_namespace(core, ns)
        apps.create_namespaced_deployment(ns, engine_deployment(ns, "chat-a", GOOD_GPU, "chat"))
    op = OperatorPod(devcluster, real_node)
    op.install("--set", f"watchNamespace={WATCHED}", "--set", "peering.enabled=true")
    try:
        name = f"{op.RELEASE}-lookahead-operator"
        role = rbac.read_namespaced_role(name, WATCHED)
        assert not [r for r in role.rules if "nodes" in r.resources or "namespaces" in r.resources]
        for read in (rbac.read_cluster_role, rbac.read_cluster_role_binding):
            with pytest.raises(client.ApiException) as err:
                read(name)
            assert err.value.status == 404, "a namespaced install grants nothing cluster-wide"

        apply_policy(custom, policy("elsewhere", OTHER, "chat", prometheus.url, [1], "regimeAware", ["100%"]))
        apply_policy(custom, policy("chat", WATCHED, "chat", prometheus.url, [1], "regimeAware", ["100%"]))
        st = wait_phase(custom, WATCHED, "chat", ("Succeeded", "RolledBack", "Failed", "NotACandidate"), timeout=600,
                        operator=op)
        assert st["phase"] == "Succeeded", st.get("message")
        assert st["decision"]["action"] == "PromoteRegimeAware", st["decision"]

        log = op.log()
        for word in ("403", "Forbidden", "forbidden"):
            assert word not in log, f"{word!r} in the operator's log:\n{log[-4000:]}"
        assert f"namespaced install: watching and acting in namespace {WATCHED} only" in log
        assert f"{OTHER}/" not in log
        other = get_policy(custom, OTHER, "elsewhere")
        assert not other.get("status") and FINALIZER not in (other["metadata"].get("finalizers") or [])
        assert not [k for k in (apps.read_namespaced_deployment("chat-a", OTHER).metadata.annotations or {})
                    if k.startswith(GROUP)]
    finally:
        # the policy's finalizer needs the operator: delete it first, then uninstall (the test's
        # namespaces are deleted after it by tests/e2e/conftest.py's fresh_namespaces)
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, WATCHED, PLURAL, "chat")
        except client.ApiException as exc:
            if exc.status != 404:
                raise

        def gone():
            try:
                get_policy(custom, WATCHED, "chat")
            except client.ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, timeout=120, what="the policy deleted (its finalizer done)", interval=1.0)
        op.uninstall()
