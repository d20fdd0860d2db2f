"""The CRD upgraded while a policy runs (issue 12): a new field with a default appears in every
stored policy the moment the new CRD is served (the apiserver defaults on read), before -- or
without -- a new operator. Expected, written down first: the running operator, which does not
know the field, ignores it (a log line names it) instead of refusing the spec; nothing restarts
(the spec's generation did not change: no SpecChanged, measuringSince and loadRun as before); the
rollout ends as it would have (Succeeded, PromoteRegimeAware at batch 1).

Before: the spec model forbids unknown keys, so the first read after the upgrade refused the
spec (Failed, everything restored), and a newer operator knowing the default would have seen a
new fingerprint and restarted every rollout in flight."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client

from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import wait_for

from .helpers import (GOOD_GPU, apply_policy, deploy_fleet, events_of, get_policy, measuring_under_load, policy,
                      wait_phase)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def _replace_crd(ext, body):
    current = ext.read_custom_resource_definition(body["metadata"]["name"])
    new = copy.deepcopy(body)
    new["metadata"]["resourceVersion"] = current.metadata.resource_version
    ext.replace_custom_resource_definition(body["metadata"]["name"], new)


def test_a_crd_upgrade_with_a_new_defaulted_field_restarts_nothing(kube_api, crd_installed, operator_process,
                                                                    prometheus, reliability):
    reliability.expect("The CRD upgraded mid-measurement: a new field (spec.analysis.futureKnob) with a default",
                       "the running operator ignores the field it does not know (logged), restarts nothing "
                       "(no SpecChanged; measuringSince, loadRun unchanged) and the rollout ends as it would have "
                       "(Succeeded, PromoteRegimeAware)")
    apps, core, custom = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api)
    ext = client.ApiextensionsV1Api(kube_api)
    ns = "e2e-crd-upgrade"
    deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU})
    apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1], "analysisOnly", ["100%"]))
    before = wait_for(lambda: measuring_under_load(custom, ns, "chat"), timeout=240, what="measuring under load",
                      interval=1.0)["progress"]
    generation = get_policy(custom, ns, "chat")["metadata"]["generation"]
    upgraded = copy.deepcopy(crd_installed)
    for v in upgraded["spec"]["versions"]:
        analysis = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["analysis"]
        analysis["properties"]["futureKnob"] = {"type": "string", "default": "on",
                                                "description": "a field a later version adds"}
    try:
        _replace_crd(ext, upgraded)
        wait_for(lambda: get_policy(custom, ns, "chat")["spec"]["analysis"].get("futureKnob") == "on", timeout=60,
                 what="the stored policy read with the new default", interval=0.5)
        st = wait_phase(custom, ns, "chat", TERMINAL, 420, operator_process)
        after = st["progress"]
        reasons = [e.reason for e in events_of(core, ns, "chat")]
        ignored = "ignoring spec.analysis.futureKnob" in operator_process.log()
        reliability.observed(f"{st['phase']} ({st['decision']['action']}); generation {generation} -> "
                             f"{get_policy(custom, ns, 'chat')['metadata']['generation']}; SpecChanged events "
                             f"{reasons.count('SpecChanged')}; measuringSince kept: "
                             f"{after.get('measuringSince') == before.get('measuringSince')}; unknown field logged: "
                             f"{ignored}", injected=1)
        assert st["phase"] == "Succeeded" and st["decision"]["action"] == "PromoteRegimeAware", st.get("message")
        assert "SpecChanged" not in reasons, reasons
        assert after["measuringSince"] == before["measuringSince"], (before, after)
        assert get_policy(custom, ns, "chat")["metadata"]["generation"] == generation
        assert ignored, operator_process.log()[-2000:]
    finally:
        _replace_crd(ext, crd_installed)
