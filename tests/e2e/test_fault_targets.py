"""Faults around the targets and the policy itself (issue 12), on the real node, one rollout:

* mid-measurement, a new Deployment starts matching the policy's selector and one of the claimed
  targets is deleted -> the newcomer is left alone (the documented rule: a rollout acts only on
  what it claimed; TargetsFound names it), the rollout goes on with the target that is left;
* mid-wave, the operator is stopped and the policy deleted -> the finalizer holds the policy
  (nothing is lost while no operator runs); once the operator is back, the deletion completes:
  the promoted target restored to its saved original byte for byte, our objects gone, the
  newcomer still untouched.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from lookahead_operator.controller import builders as b
from lookahead_dev.devcluster import wait_for

from .helpers import (GOOD_GPU, GROUP, PLURAL, VERSION, conditions, engine_deployment, get_policy, no_leftovers,
                      sanitized, start_two_wave_rollout, wait_phase)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def _template(apps, ns, name):
    return sanitized(apps, ns, name)["spec"]["template"]


def test_new_and_deleted_targets_mid_rollout_then_the_policy_deleted_with_the_operator_stopped(
        apis, operator_process, prometheus, reliability):
    reliability.expect(
        "A Deployment starts matching the selector and a claimed target is deleted, mid-measurement; "
        "then, mid-wave, the operator is stopped and the policy deleted; the operator comes back",
        "the newcomer is never claimed, promoted or restored and TargetsFound names it; the rollout goes on "
        "with the remaining target; the finalizer holds the policy while no operator runs; once back, the "
        "deletion completes within 120 s with the promoted target restored exactly and no object of ours left")
    apps, core, custom, batch = apis
    ns = "e2e-targets"
    original_a = start_two_wave_rollout(apps, core, custom, ns, prometheus.url)["chat-a"]
    wait_phase(custom, ns, "chat", {"Measuring"}, 240, operator_process)

    apps.create_namespaced_deployment(ns, engine_deployment(ns, "chat-c", GOOD_GPU, "chat"))
    apps.delete_namespaced_deployment("chat-b", ns)
    original_c = _template(apps, ns, "chat-c")

    def newcomer_named():
        st = get_policy(custom, ns, "chat").get("status") or {}
        found = conditions(st).get("TargetsFound") or {}
        return found if found.get("reason") == "NewTargetsLeftAlone" else None

    found = wait_for(newcomer_named, timeout=60, what="TargetsFound naming the newcomer", interval=1.0)
    assert f"{ns}/chat-c" in found["message"], found

    def a_promoted():
        st = get_policy(custom, ns, "chat").get("status") or {}
        if st.get("phase") in {"RolledBack", "Failed", "NotACandidate", "Succeeded"}:
            return st     # ended before we could stop it mid-wave: the assertion below says how
        d = sanitized(apps, ns, "chat-a")
        return st if (d["metadata"].get("annotations") or {}).get(b.ANNOTATION_PROMOTED) else None

    st = wait_for(a_promoted, timeout=600, what="chat-a promoted", interval=1.0)
    assert st["phase"] in ("Promoting", "Guarding"), (st["phase"], st.get("message"))
    assert st["decision"]["action"] == "PromoteRegimeAware", st["decision"]
    c = sanitized(apps, ns, "chat-c")
    assert c["spec"]["template"] == original_c and b.original_template(c) is None, "the newcomer is untouched"
    assert (ns, "chat-c") not in [(t["namespace"], t["name"]) for t in st["targets"]]

    operator_process.kill()
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")
    held = get_policy(custom, ns, "chat")
    assert held["metadata"].get("deletionTimestamp") and held["metadata"].get("finalizers"), \
        "with no operator, the finalizer holds the policy"
    assert "--lookahead-max-batch-size" in str(_template(apps, ns, "chat-a")), "nothing restored yet"
    operator_process.start()

    def gone():
        try:
            get_policy(custom, ns, "chat")
            return False
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise

    wait_for(gone, timeout=120, what="the policy's deletion completes once the operator is back", interval=1.0)
    a = sanitized(apps, ns, "chat-a")
    assert a["spec"]["template"] == original_a, "restored to its saved original, byte for byte"
    assert b.original_template(a) is None and b.ANNOTATION_PROMOTED not in (a["metadata"].get("annotations") or {})
    c = sanitized(apps, ns, "chat-c")
    assert c["spec"]["template"] == original_c and b.original_template(c) is None
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="no canary/control/Jobs left")
    reliability.observed(
        f"TargetsFound: {found['message'][:120]}...; chat-a promoted in {st['phase']} "
        f"({st['decision']['action']}) with chat-b deleted; policy held by its finalizer while the operator "
        f"was stopped, deleted after its return; chat-a restored exactly; chat-c untouched; nothing left",
        injected=3)
