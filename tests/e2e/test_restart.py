"""The operator is SIGKILLed as soon as the rollout enters each phase, and restarted at once.
The rollout must still end as an uninterrupted one does, with no duplicate or orphaned objects
and the exact original templates saved."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from lookahead_operator import builders as b
from lookahead_dev.devcluster import wait_for

from .test_lifecycle import GOOD_GPU, GROUP, PLURAL, VERSION, engine_deployment, no_leftovers, policy, sanitized

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
TERMINAL = {"Succeeded", "RolledBack", "Failed", "NotACandidate"}


def test_killed_in_every_phase_still_completes(kube_api, operator_process, prometheus):
    apps, core, custom, batch = (client.AppsV1Api(kube_api), client.CoreV1Api(kube_api),
                                 client.CustomObjectsApi(kube_api), client.BatchV1Api(kube_api))
    ns = "e2e-restart"
    core.create_namespace({"metadata": {"name": ns}})
    for name in ("chat-a", "chat-b"):
        apps.create_namespaced_deployment(ns, engine_deployment(ns, name, GOOD_GPU, "chat"))
    originals = {n: sanitized(apps, ns, n)["spec"]["template"] for n in ("chat-a", "chat-b")}
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                           policy("chat", ns, "chat", prometheus.url, [1, 16], "regimeAware",
                                                  ["50%", "100%"]))
    killed_in: list[str] = []
    max_roles = max_jobs_per_step_role = 0
    deadline = time.monotonic() + 600
    phase = None
    while time.monotonic() < deadline:
        st = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat").get("status") or {}
        phase = st.get("phase")
        roles = apps.list_namespaced_deployment(ns, label_selector=f"{b.LABEL_POLICY}=chat,{b.LABEL_ROLE} in (canary,control)").items
        max_roles = max(max_roles, len(roles))
        jobs = [j for j in batch.list_namespaced_job(ns, label_selector=f"{b.LABEL_POLICY}=chat").items
                if not j.metadata.deletion_timestamp]
        per_key: dict[tuple, int] = {}
        for j in jobs:
            key = (j.metadata.labels.get(b.LABEL_STEP), j.metadata.labels.get(f"{b.GROUP}/drives"))
            per_key[key] = per_key.get(key, 0) + 1
        max_jobs_per_step_role = max([max_jobs_per_step_role, *per_key.values()])
        if phase in TERMINAL:
            break
        if phase and phase not in killed_in:
            operator_process.kill()
            killed_in.append(phase)
            operator_process.start()
        time.sleep(0.5)
    assert phase == "Succeeded", (phase, st.get("message"), operator_process.log()[-3000:])
    assert st["decision"]["action"] == "PromoteRegimeAware"
    # every phase of the rollout saw a kill (the short ones may pass within one tick of a restart)
    assert {"Launching", "Measuring", "Promoting", "Guarding"} <= set(killed_in), killed_in
    assert max_roles <= 2, "never more than one canary and one control"
    assert max_jobs_per_step_role <= 1, "never a duplicate load Job"
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        assert b.original_template(d) == originals[name], "the saved original is the first one, exactly"
        assert "--lookahead-max-batch-size" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="no orphaned canary/control/Jobs")
