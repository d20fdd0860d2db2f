"""The invariant watcher against a real kube-apiserver: a target Deployment whose pod template is
changed in a way no promotion would (a new image) while a LookaheadPolicy targets it is reported,
within a bounded wait, and the watcher stops promptly."""

from __future__ import annotations

import copy
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_dev.devcluster import wait_for
from lookahead_dev.invariants import InvariantWatcher
from lookahead_operator.api import names as api

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def install_crd(kube_api) -> None:
    ext = client.ApiextensionsV1Api(kube_api)
    body = yaml.safe_load((REPO / "crds" / "lookaheadpolicies.yaml").read_text())
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def served():
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        if not any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
            return False
        client.CustomObjectsApi(kube_api).list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL, limit=1)
        return True

    wait_for(served, 30, "the LookaheadPolicy CRD to be served")


def fleet_deployment(namespace: str) -> dict:
    docs = list(yaml.safe_load_all((REPO / "examples" / "fleet-deployment.yaml").read_text()))
    d = copy.deepcopy(next(x for x in docs if x and x["metadata"].get("name") == "chat-reference"))
    d["metadata"]["namespace"] = namespace
    d["spec"]["replicas"] = 1
    return d


def policy(namespace: str) -> dict:
    body = yaml.safe_load((REPO / "examples" / "chat-fleet.yaml").read_text())
    body["metadata"] = {"name": "chat-fleet", "namespace": namespace}
    body["spec"]["load"]["batchSizes"] = [1, 8]
    return body


def test_watcher_reports_a_target_template_changed_under_a_policy(kube_api):
    install_crd(kube_api)
    ns = f"inv-{uuid.uuid4().hex[:6]}"
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    watcher = InvariantWatcher(kube_api, namespace=ns, grace_s=0.5)
    started = time.monotonic()
    try:
        watcher.start()
        assert watcher.wait_synced(10), f"watcher did not list everything: {watcher.events()}"
        fleet = fleet_deployment(ns)
        apps.create_namespaced_deployment(ns, fleet)
        original = wait_for(lambda: watcher.original(ns, "chat-reference"), 10, "the watcher to record the target")
        assert original["spec"]["containers"][0]["image"] == fleet["spec"]["template"]["spec"]["containers"][0]["image"]
        custom.create_namespaced_custom_object(api.GROUP, api.VERSION, ns, api.PLURAL, policy(ns))
        wait_for(lambda: watcher.seen("policies", ns, "chat-fleet"), 10, "the watcher to see the policy")
        assert watcher.phase_history(ns, "chat-fleet")[-1][1] == "Pending"
        watcher.assert_clean()

        # No promotion changes the image: a violation, named, within a bounded wait.
        apps.patch_namespaced_deployment("chat-reference", ns, {"spec": {"template": {"spec": {"containers": [
            {"name": "engine", "image": "ghcr.io/someone/else:9"}]}}}})
        found = wait_for(lambda: [v for v in watcher.violations() if v.check == "template"], 10,
                         "the watcher to report the changed template")
        assert len(found) == 1, found
        msg = found[0].message
        assert f"Deployment {ns}/chat-reference" in msg and f"policy {ns}/chat-fleet" in msg
        assert "image" in msg and "ghcr.io/someone/else:9" in msg
        with pytest.raises(AssertionError, match="chat-reference"):
            watcher.assert_clean()
        assert not [v for v in watcher.violations() if v.check != "template"], watcher.violations()
    finally:
        t = time.monotonic()
        watcher.stop()
        stopped_in = time.monotonic() - t
        core.delete_namespace(ns)
    assert not watcher.is_alive() and stopped_in < 2.5, f"stop took {stopped_in:.1f}s"
    assert time.monotonic() - started < 20
