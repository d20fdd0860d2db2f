"""A user edits a target Deployment's pod template mid-rollout: the user's change wins.

The rule (docs/operator.md, "When a user edits a target mid-rollout"): once a target is claimed,
a change of its ``spec.template`` by anyone but the operator means the operator stops touching it
-- it records it (``status.targets[].userEdited``, condition ``TargetsEdited=True`` reason
``UserEdited``, a ``UserEdited`` Warning event), releases it (every ``lookahead.dev/*`` annotation
of ours removed, a ``LeftToUser`` event, the template untouched), and neither promotes nor
restores it; the rest of the rollout goes on with the other targets. Only the pod template
counts: scaling a target is not an edit.

Expected outcome, written down before running it (issue 12):

* fleet ``chat-a`` and ``chat-b`` (the simulator where lookahead wins), a regime-aware policy
  measured at batch 1, waves 50% then 100%;
* while Measuring (both targets claimed), the user adds env ``USER_NOTE=1`` to chat-b's engine
  container and scales chat-a to 2 replicas;
* within 60 s: chat-b's ``status.targets`` row says ``userEdited: true``; ``TargetsEdited`` is True,
  reason ``UserEdited``, naming ``e2e-user-edit/chat-b`` and not chat-a; ``UserEdited`` and
  ``LeftToUser`` events on the policy; chat-b carries none of the operator's annotations and its
  template is exactly the user's;
* the rollout still ends ``Succeeded`` with ``PromoteRegimeAware``: only chat-a is promoted (its 2
  replicas kept, its saved original exact, the lookahead flags in its args); chat-b keeps the
  user's template exactly; nothing is restored;
* deleting the policy leaves chat-b's template the user's, and no canary, control or load Job.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from lookahead_operator.controller import builders as b
from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import wait_for

from .helpers import (FLEET, GOOD_GPU, GROUP, PLURAL, VERSION, apply_policy, conditions, deploy_fleet, events_of,
                      get_policy, no_leftovers, policy, sanitized, saved_templates, wait_phase)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
NS, POLICY = "e2e-user-edit", "chat"
EDITED, SCALED = f"{NS}/chat-b", f"{NS}/chat-a"


def target_annotations() -> tuple[str, ...]:
    """Every annotation the operator puts on a target (from the user-edit rule's builders)."""
    names = getattr(b, "TARGET_ANNOTATIONS", None)
    assert names, ("lookahead_operator.controller.builders.TARGET_ANNOTATIONS is missing: the user-edit rule "
                   "(parked patch D: builders.user_edited, ANNOTATION_PROMOTED_TEMPLATE) is not applied")
    return tuple(names)


def rows(st: dict) -> dict:
    return {f"{r.get('namespace')}/{r.get('name')}": r for r in st.get("targets") or []}


def ours(d: dict, names: tuple[str, ...]) -> list[str]:
    """The operator's annotations still on a Deployment (the named ones, and any lookahead.dev/ key)."""
    ann = d["metadata"].get("annotations") or {}
    return sorted(k for k in ann if k in names or k.startswith(f"{GROUP}/"))


def diagnostics(custom, core, operator) -> str:
    try:
        st = get_policy(custom, NS, POLICY).get("status")
    except client.ApiException as exc:
        st = f"<policy unreadable: {exc.status}>"
    evs = [(e.type, e.reason, e.message) for e in events_of(core, NS, POLICY)]
    return (f"\nstatus: {json.dumps(st, indent=1, default=str)[:3000]}\nevents: {evs}\n"
            f"operator log tail:\n{operator.log()[-3000:]}")


def test_user_edit_mid_rollout_wins(apis, operator_process, prometheus, invariants, reliability):
    reliability.expect("A user edits a target's pod template mid-measurement (an env var) and scales another",
                       "the edited target is left to its user (userEdited, TargetsEdited, UserEdited and LeftToUser "
                       "events, our annotations removed, its template exactly the user's, never restored, also not "
                       "on deletion); the scale is not an edit; the rollout goes on with the other target: "
                       "Succeeded, PromoteRegimeAware, its 2 replicas kept")
    apps, core, custom, batch = apis
    marks = target_annotations()  # fail at once, not after minutes, without the rule's implementation
    deploy_fleet(apps, core, NS, {"chat-a": GOOD_GPU, "chat-b": GOOD_GPU})
    originals = saved_templates(apps, NS, FLEET)
    apply_policy(custom, policy(POLICY, NS, "chat", prometheus.url, [1], "regimeAware", ["50%", "100%"]))

    # --- Measuring, both targets claimed: the user edits chat-b and scales chat-a -----------------
    def measuring_and_claimed():
        st = get_policy(custom, NS, POLICY).get("status") or {}
        claimed = all(b.ANNOTATION_ORIGINAL_TEMPLATE in (sanitized(apps, NS, n)["metadata"].get("annotations") or {})
                      for n in ("chat-a", "chat-b"))
        return st if st.get("phase") == "Measuring" and claimed else None

    try:
        wait_for(measuring_and_claimed, timeout=180, interval=1.0, what="measuring with both targets claimed")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}{diagnostics(custom, core, operator_process)}") from exc

    d = sanitized(apps, NS, "chat-b")
    engine = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    env = list(engine.get("env") or [])
    assert any(e["name"] == "POD_IP" for e in env), env
    resp = apps.patch_namespaced_deployment(
        "chat-b", NS, {"spec": {"template": {"spec": {"containers": [
            {"name": "engine", "env": [*env, {"name": "USER_NOTE", "value": "1"}]}]}}}},
        _content_type="application/strategic-merge-patch+json")
    invariants.user_edited(NS, "chat-b", resp.metadata.resource_version)
    user_b = sanitized(apps, NS, "chat-b")["spec"]["template"]
    user_env = next(c for c in user_b["spec"]["containers"] if c["name"] == "engine")["env"]
    assert [e["name"] for e in user_env] == ["POD_IP", "USER_NOTE"], user_env
    assert user_b != originals["chat-b"]

    apps.patch_namespaced_deployment("chat-a", NS, {"spec": {"replicas": 2}})
    assert sanitized(apps, NS, "chat-a")["spec"]["template"] == originals["chat-a"], "a scale is not a template change"

    # --- within 60 s: chat-b left to its user, chat-a still in the rollout ------------------------
    def left_to_user():
        st = get_policy(custom, NS, POLICY).get("status") or {}
        cond = conditions(st).get("TargetsEdited") or {}
        reasons = {e.reason for e in events_of(core, NS, POLICY)}
        return (rows(st).get(EDITED, {}).get("userEdited") is True and cond.get("status") == "True"
                and {"UserEdited", "LeftToUser"} <= reasons and not ours(sanitized(apps, NS, "chat-b"), marks))

    try:
        wait_for(left_to_user, timeout=60, interval=1.0, what="chat-b left to its user")
    except TimeoutError:
        pass  # each part is asserted below, with what was seen
    st = get_policy(custom, NS, POLICY).get("status") or {}
    diag = diagnostics(custom, core, operator_process)
    row = rows(st).get(EDITED)
    assert row and row.get("userEdited") is True, f"status.targets row of {EDITED}: {row}{diag}"
    assert rows(st).get(SCALED, {}).get("userEdited") is not True, f"a scale is not an edit{diag}"
    cond = conditions(st).get("TargetsEdited")
    assert cond and cond["status"] == "True" and cond["reason"] == "UserEdited", f"TargetsEdited: {cond}{diag}"
    assert EDITED in cond["message"] and "chat-a" not in cond["message"], f"TargetsEdited: {cond}{diag}"
    evs = events_of(core, NS, POLICY)
    edited_evs = [e.message for e in evs if e.reason == "UserEdited"]
    left_evs = [e.message for e in evs if e.reason == "LeftToUser"]
    assert edited_evs and all(EDITED in m and "chat-a" not in m for m in edited_evs), f"UserEdited: {edited_evs}{diag}"
    assert left_evs and all(m.startswith(f"{EDITED}:") for m in left_evs), f"LeftToUser: {left_evs}{diag}"
    d = sanitized(apps, NS, "chat-b")
    assert not ours(d, marks), f"chat-b still carries {ours(d, marks)}{diag}"
    assert d["spec"]["template"] == user_b, f"chat-b's template is not the user's{diag}"
    a = sanitized(apps, NS, "chat-a")
    assert (a["metadata"].get("annotations") or {}).get(b.ANNOTATION_OWNER), f"chat-a is still claimed{diag}"

    # --- the rollout goes on with chat-a only ------------------------------------------------------
    st = wait_phase(custom, NS, POLICY, TERMINAL, 420, operator_process)
    diag = diagnostics(custom, core, operator_process)
    assert st["phase"] == "Succeeded", f"{st.get('message')}{diag}"
    assert st["decision"]["action"] == "PromoteRegimeAware", f"{st['decision'].get('reason')}{diag}"
    assert rows(st).get(EDITED, {}).get("userEdited") is True and not rows(st)[EDITED].get("promoted"), \
        f"chat-b is recorded as left to its user, not promoted{diag}"
    assert conditions(st).get("TargetsEdited", {}).get("status") == "True", f"the record stays after the end{diag}"
    try:
        promoted = wait_for(lambda: [e.message for e in events_of(core, NS, POLICY) if e.reason == "Promoted"],
                            timeout=30, what="Promoted events")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}{diag}") from exc
    assert all(m.split()[-1] == SCALED for m in promoted), f"Promoted: {promoted}{diag}"
    a = sanitized(apps, NS, "chat-a")
    assert a["spec"]["replicas"] == 2, f"the promotion kept the user's scale: {a['spec']['replicas']}{diag}"
    assert b.original_template(a) == originals["chat-a"], f"chat-a's saved original is exact{diag}"
    args = next(c for c in a["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")["args"]
    assert "--speculative-config" in args, f"chat-a not promoted: {args}{diag}"
    d = sanitized(apps, NS, "chat-b")
    assert d["spec"]["template"] == user_b, f"chat-b's template is not exactly the user's{diag}"
    assert not ours(d, marks), f"chat-b carries {ours(d, marks)} again{diag}"
    assert not [e.message for e in events_of(core, NS, POLICY) if e.reason == "Restored"], f"nothing restored{diag}"

    reliability.observed(f"{EDITED}: userEdited, TargetsEdited ({cond['reason']}), events UserEdited/LeftToUser, "
                         f"template the user's; {st['phase']} ({st['decision']['action']}), promoted: "
                         f"{[m.split()[-1] for m in promoted]}, chat-a replicas {a['spec']['replicas']}", injected=2)

    # --- deleting the policy: chat-b stays the user's ----------------------------------------------
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, POLICY)

    def gone():
        try:
            get_policy(custom, NS, POLICY)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    try:
        wait_for(gone, timeout=60, interval=1.0, what="the policy deleted")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}{diagnostics(custom, core, operator_process)}") from exc
    log = f"\noperator log tail:\n{operator_process.log()[-3000:]}"
    d = sanitized(apps, NS, "chat-b")
    assert d["spec"]["template"] == user_b, f"deleting the policy put a template back over the user's{log}"
    assert not ours(d, marks), f"chat-b carries {ours(d, marks)} after the deletion{log}"
    try:
        wait_for(lambda: no_leftovers(apps, batch, NS, POLICY), timeout=60, what="canary/control/Jobs removed")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}{log}") from exc
