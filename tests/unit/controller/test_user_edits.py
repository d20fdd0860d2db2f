"""A user edits a target Deployment mid-rollout (issue 12): the user's change wins.

The rule (docs/operator.md, "When a user edits a target mid-rollout"): a claimed target whose pod
template is neither the saved original (not marked promoted) nor exactly the template the operator
promoted (marked promoted: its digest) was edited by its user. From then on the operator never
promotes it, never restores it, releases it (its own annotations only, the template untouched),
records it in ``status.targets[].userEdited`` and the ``TargetsEdited`` condition, and goes on with
the other targets. Replicas, the Deployment's own labels and annotations are not template edits.

Three layers: the pure definition (``builders.user_edited`` and the writes that keep it decidable),
the pure decisions (``statemachine``), and the actions against a fake API server that enforces
resourceVersion preconditions and applies defaults the way the apiserver does.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from kubernetes.client.rest import ApiException

from lookahead_dev.invariants import apiserver_defaults
from lookahead_operator.controller import actions
from lookahead_operator.controller import observe
from lookahead_operator.controller import builders as b
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase, TargetStatus
from lookahead_operator.controller.world import ActionKind as K
from lookahead_operator.controller.world import Action, Target

from .test_statemachine import SPEC, at, cond, kinds, promoting, run, to_measuring, world

ME = "inference/chat-fleet"


# --- a target as the apiserver returns it -------------------------------------------------------------

def stored(template: dict) -> dict:
    """What the apiserver stores for a template it is sent (its defaults filled in)."""
    t = apiserver_defaults(template)
    t["metadata"]["creationTimestamp"] = None
    return t


def deployment(name="a", ns="serving") -> dict:
    template = {"metadata": {"labels": {"app": "llm"}},
                "spec": {"containers": [
                    {"name": "engine", "image": "ghcr.io/lookahead-rollout/lookahead-rollout:0.1.0",
                     "command": ["python3", "-m", "lookahead_canary.server"],
                     "args": ["--model", "tiny", "--port", "8000"],
                     "ports": [{"name": "http", "containerPort": 8000}],
                     "env": [{"name": "A", "value": "1"}]}]}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": "10",
                         "generation": 1, "labels": {"app": "llm"}, "annotations": {"team": "x"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}}, "template": stored(template)},
            "status": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "observedGeneration": 1}}


def is_engine(c):
    return c["name"] == "engine"


def lookahead_on(c):
    c["args"] = c["args"] + ["--speculative-config", '{"method":"jacobi"}']
    return c


def claim(d: dict, owner: str = ME) -> dict:
    out = copy.deepcopy(d)
    out["metadata"].setdefault("annotations", {}).update(b.claim_patch(d, owner)["metadata"]["annotations"])
    out["metadata"]["annotations"] = {k: v for k, v in out["metadata"]["annotations"].items() if v is not None}
    return out


def promote(d: dict, decision="d1") -> dict:
    """What the apiserver holds after ``actions._promote``'s PUT: the body, its template defaulted."""
    body = b.promote_body(d, lookahead_on, is_engine, decision)
    body["spec"]["template"] = stored(body["spec"]["template"])
    return body


def engine(d: dict) -> dict:
    return d["spec"]["template"]["spec"]["containers"][0]


# --- the definition: what is a user's edit ------------------------------------------------------------

def test_a_claimed_target_as_saved_is_not_edited_and_an_unclaimed_one_never_is():
    d = deployment()
    assert not b.user_edited(d), "not claimed: nothing to compare with"
    c = claim(d)
    assert json.loads(c["metadata"]["annotations"][b.ANNOTATION_ORIGINAL_TEMPLATE]) == d["spec"]["template"]
    assert not b.user_edited(c)


@pytest.mark.parametrize("change", ["replicas", "deployment labels", "deployment annotation", "status", "strategy"])
def test_changes_outside_the_pod_template_are_not_edits(change):
    for d in (claim(deployment()), promote(claim(deployment()))):
        if change == "replicas":
            d["spec"]["replicas"] = 7                         # kubectl scale, an HPA
        elif change == "deployment labels":
            d["metadata"]["labels"]["owner"] = "team-b"
        elif change == "deployment annotation":
            d["metadata"]["annotations"]["note"] = "hello"
        elif change == "status":
            d["status"] = {"replicas": 7}
        else:
            d["spec"]["strategy"] = {"type": "Recreate"}
        assert not b.user_edited(d), change


@pytest.mark.parametrize("edit", ["image", "env", "flag", "restart", "label"])
def test_any_change_of_the_pod_template_is_an_edit_before_and_after_promotion(edit):
    for d in (claim(deployment()), promote(claim(deployment()))):
        c = engine(d)
        if edit == "image":
            c["image"] = "ghcr.io/lookahead-rollout/lookahead-rollout:0.2.0"
        elif edit == "env":
            c["env"] = c["env"] + [{"name": "UNRELATED", "value": "1"}]
        elif edit == "flag":
            c["args"] = c["args"] + ["--max-num-seqs", "8"]
        elif edit == "restart":                               # kubectl rollout restart
            d["spec"]["template"]["metadata"].setdefault("annotations", {})[
                "kubectl.kubernetes.io/restartedAt"] = "2026-11-30T12:00:00Z"
        else:
            d["spec"]["template"]["metadata"]["labels"]["canary"] = "no"
        assert b.user_edited(d), edit


def test_the_exact_promoted_template_is_ours_even_after_apiserver_defaulting():
    c = claim(deployment())
    p = b.promote_body(c, lookahead_on, is_engine, "d1")
    assert not b.user_edited(p), "as sent"
    # an engine change that adds a port: the apiserver fills in its protocol; still ours
    p2 = b.promote_body(c, lambda ct: lookahead_on({**ct, "ports": ct["ports"] + [
        {"name": "metrics", "containerPort": 9000}]}), is_engine, "d1")
    p2["spec"]["template"] = stored(p2["spec"]["template"])
    assert engine(p2)["ports"][1]["protocol"] == "TCP"
    assert not b.user_edited(p2), "defaults the apiserver added to what the operator sent are not an edit"


def test_undoing_a_promotion_by_hand_is_an_edit_and_a_promotion_without_a_digest_is_trusted():
    c = claim(deployment())
    p = promote(c)
    undone = copy.deepcopy(p)
    undone["spec"]["template"] = copy.deepcopy(c["spec"]["template"])     # kubectl rollout undo
    assert b.user_edited(undone)
    legacy = copy.deepcopy(p)                                  # promoted by an operator that recorded no digest
    del legacy["metadata"]["annotations"][b.ANNOTATION_PROMOTED_TEMPLATE]
    engine(legacy)["image"] = "other:1"
    assert not b.user_edited(legacy), "cannot be told apart: the old behaviour"


def test_a_gitops_self_heal_mid_rollout_is_an_edit_left_to_the_user_and_its_replica_count_stands():
    """Argo CD's selfHeal (or Flux) applies Git's manifest over a promoted, carved-out target: its
    template is the saved original again and its replicas Git's. Seen as the user's edit (left to
    them: neither promoted again nor restored), and letting go adds no carved replica on top of
    Git's count."""
    c = claim(deployment())
    c["spec"]["replicas"] = 4
    c["metadata"]["annotations"][b.ANNOTATION_CARVED_OUT] = "2/4"
    c["spec"]["replicas"] = 2
    p = promote(c)
    healed = copy.deepcopy(p)
    healed["spec"]["template"] = copy.deepcopy(c["spec"]["template"])   # Git's template
    healed["spec"]["replicas"] = 4                                       # Git's replicas
    assert b.user_edited(healed)
    let_go = b.let_go_patch(healed)
    assert let_go["spec"] == {"replicas": 4}
    assert all(v is None for v in let_go["metadata"]["annotations"].values())
    # (without the self-heal, letting go gives the two back)
    assert b.let_go_patch(p)["spec"] == {"replicas": 4}


def test_promote_body_replaces_the_template_wholesale_keeps_the_rest_and_is_idempotent():
    c = claim(deployment())
    c["spec"]["replicas"] = 5
    body = b.promote_body(c, lookahead_on, is_engine, "d1")
    saved = b.original_template(c)
    expected = b.promote_patch(c, lookahead_on, is_engine, "d1")["spec"]["template"]
    assert body["spec"]["template"] == expected and expected != saved
    assert body["metadata"]["resourceVersion"] == "10", "a PUT with the version read: a change since answers 409"
    assert body["spec"]["replicas"] == 5 and body["metadata"]["labels"] == {"app": "llm"}
    ann = body["metadata"]["annotations"]
    assert ann[b.ANNOTATION_PROMOTED] == "d1" and ann["team"] == "x" and ann[b.ANNOTATION_OWNER] == ME
    assert ann[b.ANNOTATION_PROMOTED_TEMPLATE] == b.template_digest(expected)
    again = b.promote_body(body, lookahead_on, is_engine, "d1")
    assert again == body, "a re-run after success writes the same object"
    edited = copy.deepcopy(c)
    engine(edited)["image"] = "other:1"
    with pytest.raises(ValueError, match="edited by its user"):
        b.promote_body(edited, lookahead_on, is_engine, "d1")


def test_a_claim_keeps_the_first_save_but_not_one_its_user_edited_since():
    c = claim(deployment())
    p = promote(c)
    assert b.ANNOTATION_ORIGINAL_TEMPLATE not in b.claim_patch(p, ME)["metadata"]["annotations"]
    engine(p)["image"] = "other:1"
    ann = b.claim_patch(p, ME)["metadata"]["annotations"]
    assert json.loads(ann[b.ANNOTATION_ORIGINAL_TEMPLATE]) == p["spec"]["template"]
    assert ann[b.ANNOTATION_PROMOTED] is None and ann[b.ANNOTATION_PROMOTED_TEMPLATE] is None
    assert "spec" not in b.claim_patch(p, ME)


def test_release_drops_every_mark_and_nothing_else_and_restore_drops_the_digest():
    patch = b.release_patch()
    assert set(patch) == {"metadata"} and set(patch["metadata"]) == {"annotations"}
    assert patch["metadata"]["annotations"] == {k: None for k in b.TARGET_ANNOTATIONS}
    c = claim(deployment())
    restored = b.restore_body(promote(c))
    assert restored["spec"]["template"] == c["spec"]["template"]
    assert restored["metadata"]["annotations"] == {"team": "x"}


def test_observe_exposes_the_edit_on_the_target():
    c = claim(deployment())
    assert observe.target_of(c, "reference").user_edited is False
    engine(c)["image"] = "other:1"
    c["metadata"]["resourceVersion"] = "11"
    t = observe.target_of(c, "reference")
    assert t.user_edited is True and t.owner == ME and t.key == ("serving", "a")


# --- the decisions (pure) -----------------------------------------------------------------------------

def tgt(name, promoted=None, edited=False, owner=ME, **kw):
    return Target("serving", name, "reference", owner=owner, saved=owner is not None, promoted=promoted,
                  user_edited=edited, **kw)


def test_who_is_left_to_the_user_is_the_recorded_rows_and_our_targets_edited_now():
    """``left_to_user`` (outside Pending) and ``deletion_plan`` both read the same two sets: the
    rows recorded ``userEdited`` and the targets this policy owns that its users edited now."""
    status = LookaheadPolicyStatus(phase=Phase.Measuring,
                                   targets=[TargetStatus(namespace="serving", name="c", user_edited=True),
                                            TargetStatus(namespace="serving", name="a")])
    targets = [tgt("a"), tgt("b", edited=True), tgt("x", edited=True, owner="other/policy"), tgt("c")]
    assert sm.recorded_user_edits(status) == {("serving", "c")}
    assert sm.edited_now(targets, ME) == [("serving", "b")]
    assert sm.left_to_user(world(status=status, targets=targets)) == {("serving", "b"), ("serving", "c")}
    leave = [a.targets for a in sm.deletion_plan(status, targets, ME) if a.kind == K.LEAVE]
    assert leave == [(("serving", "b"), ("serving", "c"))]


def test_nothing_is_left_to_the_user_in_pending_the_claim_saves_what_runs():
    w = world(targets=[tgt("a", edited=True), tgt("b")])
    assert sm.left_to_user(w) == frozenset()
    plan = sm.reconcile(w)
    assert plan.status.phase == Phase.Preflight and kinds(plan) == [K.CLAIM]
    assert plan.actions[0].targets == (("serving", "a"), ("serving", "b"))


def test_canary_and_control_are_never_cloned_from_a_target_left_to_its_user():
    _, w = run(world())                                      # Preflight, a and b claimed
    assert sm.role_source(w).name == "a"
    w = replace(w, targets=[tgt("a", edited=True), tgt("b")])
    assert sm.role_source(w).name == "b" and [t.name for t in sm.in_play(w)] == ["b"]
    assert sm.role_source(replace(w, status=LookaheadPolicyStatus())).name == "a", "Pending: nothing is left"


def test_an_edit_while_measuring_is_left_to_the_user_and_measurement_goes_on():
    w = to_measuring(world())
    plan, w = run(replace(w, targets=[tgt("a"), tgt("b", edited=True)]))
    assert w.status.phase == Phase.Measuring and K.ENSURE_LOAD in kinds(plan)
    leave = [a for a in plan.actions if a.kind == K.LEAVE]
    assert leave and leave[0].targets == (("serving", "b"),)
    assert K.RESTORE not in kinds(plan) and K.PROMOTE not in kinds(plan)
    rows = {r.name: r for r in w.status.targets}
    assert rows["b"].user_edited is True and rows["b"].promoted is False and not rows["a"].user_edited
    c = cond(w.status, ConditionType.TargetsEdited)
    assert c.status == "True" and c.reason == "UserEdited" and "serving/b" in c.message and "serving/a" not in c.message
    assert any(e[1] == "UserEdited" and "serving/b" in e[2] for e in plan.events)
    assert w.status.to_dict()["targets"][1]["userEdited"] is True
    # released: no longer ours, no longer flagged; the status remembers it
    plan, w = run(replace(w, targets=[tgt("a"), tgt("b", owner=None)]))
    assert K.LEAVE not in kinds(plan) and not any(e[1] == "UserEdited" for e in plan.events)
    assert sm.left_to_user(w) == {("serving", "b")} and [t.name for t in sm.in_play(w)] == ["a"]
    assert cond(w.status, ConditionType.TargetsEdited).status == "True"


def test_promotion_skips_the_edited_target_in_its_wave_and_goes_on_with_the_rest():
    w = promoting(world())                                   # waves 10%, 50%, 100% of a, b
    did = w.status.decision.id
    plan, w = run(replace(w, targets=[tgt("a", edited=True), tgt("b")]))
    assert K.PROMOTE not in kinds(plan) and w.status.progress.wave == 1, "wave 1 was only a: skipped"
    assert any(e[1] == "WaveSkipped" for e in plan.events)
    targets = [tgt("a", owner=None), tgt("b")]
    plan, w = run(replace(w, targets=targets))               # wave 2 (50%) is still only a: skipped
    assert w.status.progress.wave == 2
    plan, w = run(replace(w, targets=targets))
    promote = [a for a in plan.actions if a.kind == K.PROMOTE]
    assert promote and promote[0].targets == (("serving", "b"),)
    targets = [tgt("a", owner=None), tgt("b", promoted=did)]
    plan, w = run(replace(w, targets=targets, guard=sm.GuardCheck(False, "ok")))
    assert K.ENSURE_GUARD_LOAD in kinds(plan)
    wave = SPEC.promotion.wave_duration.total_seconds()
    plan, w = run(replace(at(w, wave + 1), targets=targets, guard=sm.GuardCheck(False, "ok")))
    assert w.status.phase == Phase.Guarding
    plan, w = run(replace(at(w, wave + 2 + SPEC.promotion.guard.duration.total_seconds()), targets=targets,
                          guard=sm.GuardCheck(False, "ok")))
    assert w.status.phase == Phase.Succeeded
    rows = {r.name: r for r in w.status.targets}
    assert rows["a"].user_edited and not rows["a"].promoted and rows["b"].promoted
    assert cond(w.status, ConditionType.TargetsEdited).status == "True", "the record outlives the rollout"


def test_an_edit_of_the_guarded_target_restarts_the_guard_and_ignores_its_stale_check():
    w = promoting(world())
    did = w.status.decision.id
    status = w.status.model_copy(deep=True)
    status.progress.wave = 2                                 # the last wave (100%): a and b
    both = [tgt("a", promoted=did), tgt("b", promoted=did)]  # the guard drives b (the newest promoted)
    _, w = run(replace(at(w, 30), status=status, targets=both, guard=sm.GuardCheck(False, "ok")))
    assert w.status.phase == Phase.Promoting and w.status.progress.wave == 2
    run_before = w.status.progress.load_run
    edited = [tgt("a", promoted=did), tgt("b", promoted=did, edited=True)]
    plan, w2 = run(replace(at(w, 60), targets=edited, guard=sm.GuardCheck(True, "throughput -30%")))
    assert w2.status.phase == Phase.Promoting, "a regression measured on the user's pods is not ours to judge"
    assert K.DELETE_LOAD in kinds(plan) and K.LEAVE in kinds(plan) and K.ENSURE_GUARD_LOAD in kinds(plan)
    assert w2.status.progress.load_run == run_before + 1, "fresh guard Jobs, on a"
    assert w2.status.progress.wave_started_at == at(w, 60).now, "the wave's guard starts over"
    assert w2.status.progress.load_started_at is None, "the old run's running Jobs do not start the new run"
    _, w2b = run(replace(at(w2, 70), targets=edited, guard=sm.GuardCheck(False, "ok")))
    assert w2b.status.progress.load_started_at == at(w2, 70).now, "the new run's Jobs, seen running, do"
    # an edit of a promoted target the guard does not drive changes nothing of the guard
    plan, w3 = run(replace(at(w, 30), targets=[tgt("a", promoted=did, edited=True), tgt("b", promoted=did)],
                           guard=sm.GuardCheck(False, "ok")))
    assert w3.status.progress.load_run == run_before and K.LEAVE in kinds(plan)


def test_abort_and_rollback_restore_only_targets_not_edited():
    w = promoting(world())
    did = w.status.decision.id
    _, w = run(w)
    both = [tgt("a", promoted=did, edited=True), tgt("b", promoted=did)]
    plan = sm.reconcile(replace(w, targets=both, abort_requested=True))
    assert plan.status.phase == Phase.RolledBack
    by = {a.kind: a.targets for a in plan.actions}
    assert by[K.RESTORE] == (("serving", "b"),) and by[K.LEAVE] == (("serving", "a"),)
    assert by[K.RELEASE] == (("serving", "b"),)
    assert plan.status.rollback.restored == ["serving/b"]
    assert cond(plan.status, ConditionType.TargetsEdited).status == "True"
    # recorded as edited before (its release failed, so still ours and marked promoted): a guard
    # regression on the other restores only that other
    _, w = run(replace(w, targets=[tgt("a", promoted=did), tgt("b", promoted=did, edited=True)]))
    assert {r.name for r in w.status.targets if r.user_edited} == {"b"}
    plan = sm.reconcile(replace(w, targets=[tgt("a", promoted=did), tgt("b", promoted=did, edited=True)],
                                guard=sm.GuardCheck(True, "throughput -7%")))
    assert plan.status.phase == Phase.RolledBack and plan.status.rollback.reason == "GuardRegression"
    assert [a.targets for a in plan.actions if a.kind == K.RESTORE] == [(("serving", "a"),)]
    assert [a.targets for a in plan.actions if a.kind == K.LEAVE] == [(("serving", "b"),)]


def test_when_every_target_is_edited_the_rollout_ends_and_restores_nothing():
    w = to_measuring(world())
    plan = sm.reconcile(replace(w, targets=[tgt("a", edited=True), tgt("b", edited=True)]))
    assert plan.status.phase == Phase.Failed and "nothing is left to roll out" in plan.status.message
    assert K.DELETE_ROLES in kinds(plan) and K.DELETE_LOAD in kinds(plan)
    assert K.RESTORE not in kinds(plan) and K.RELEASE not in kinds(plan) and K.ENSURE_LOAD not in kinds(plan)
    assert [a.targets for a in plan.actions if a.kind == K.LEAVE] == [(("serving", "a"), ("serving", "b"))]


def test_paused_means_frozen_even_for_edits_but_abort_still_spares_them():
    spec = SPEC.model_copy(update={"paused": True})
    w = promoting(world())
    did = w.status.decision.id
    _, w = run(w)
    edited = [tgt("a", promoted=did, edited=True), tgt("b")]
    plan, w2 = run(replace(w, spec=spec, targets=edited))
    assert K.LEAVE not in kinds(plan) and cond(w2.status, ConditionType.TargetsEdited) is None
    plan = sm.reconcile(replace(w2, spec=spec, targets=edited, abort_requested=True))
    assert K.RESTORE not in kinds(plan) and K.LEAVE in kinds(plan)


def test_a_spec_change_does_not_restore_an_edited_target_and_starts_afresh():
    w = promoting(world())
    did = w.status.decision.id
    _, w = run(w)
    _, w = run(replace(w, targets=[tgt("a", promoted=did, edited=True), tgt("b")]))
    assert cond(w.status, ConditionType.TargetsEdited) is not None
    plan = sm.reconcile(replace(w, targets=[tgt("a", owner=None), tgt("b", promoted=did)], fingerprint="changed",
                                generation=w.generation + 1))  # a write to the spec: a new generation
    assert plan.status.phase == Phase.Pending
    assert [a.targets for a in plan.actions if a.kind == K.RESTORE] == [(("serving", "b"),)]
    assert cond(plan.status, ConditionType.TargetsEdited) is None, "a new rollout claims every target afresh"


@pytest.mark.parametrize("phase", [Phase.Promoting, Phase.Succeeded])
def test_deleting_the_policy_never_restores_an_edited_target(phase):
    status = LookaheadPolicyStatus(phase=phase, targets=[
        TargetStatus(namespace="serving", name=n, user_edited=True if n == "c" else None) for n in "abcd"])
    targets = [tgt("a", promoted="d1", edited=True), tgt("b", promoted="d1"),
               tgt("c", owner=None),                        # left to its user earlier: released already
               tgt("d", promoted="d1")]
    plan = {a.kind: a.targets for a in sm.deletion_plan(status, targets, ME)}
    assert plan[K.LEAVE] == (("serving", "a"),)
    kept = K.RESTORE if phase == Phase.Promoting else K.DISOWN
    assert plan[kept] == (("serving", "b"), ("serving", "d"))
    assert K.RELEASE not in plan
    # recorded in the status but still ours (its release failed): still only released
    again = {a.kind: a.targets for a in sm.deletion_plan(status, [tgt("c", promoted="d1")], ME)}
    assert again == {K.DELETE_LOAD: (), K.DELETE_ROLES: (), K.LEAVE: (("serving", "c"),), K.DELETE_WAVES: ()}


# --- the actions, against a fake API server -------------------------------------------------------------

class FakeApi:
    """Deployments by key; PUT enforces the resourceVersion and stores the template as the apiserver
    would (defaults filled in); PATCH may only touch metadata.annotations here (null deletes)."""

    def __init__(self, *deployments):
        self.objects = {(d["metadata"]["namespace"], d["metadata"]["name"]): copy.deepcopy(d) for d in deployments}
        self.writes: list[tuple[str, tuple, dict]] = []
        self.before_put = None                               # a user's edit racing our write

    def event(self, *args, **kw):
        pass

    def _bump(self, d):
        d["metadata"]["resourceVersion"] = str(int(d["metadata"]["resourceVersion"]) + 1)

    def fresh_deployment(self, ns, name):
        d = self.objects.get((ns, name))
        return copy.deepcopy(d) if d is not None else None

    get_deployment = fresh_deployment

    def patch_deployment(self, ns, name, patch):
        assert set(patch) == {"metadata"} and set(patch["metadata"]) == {"annotations"}, patch
        d = self.objects[(ns, name)]
        ann = d["metadata"].setdefault("annotations", {})
        for k, v in patch["metadata"]["annotations"].items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        self._bump(d)
        self.writes.append(("PATCH", (ns, name), patch))

    def replace_deployment(self, body):
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if self.before_put is not None:
            hook, self.before_put = self.before_put, None
            hook(self)
        current = self.objects[key]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        new = copy.deepcopy(body)
        new["spec"]["template"] = stored(new["spec"]["template"])
        new["status"] = current.get("status")
        self.objects[key] = new
        self._bump(new)
        self.writes.append(("PUT", key, body))

    def user_edits(self, key, image="ghcr.io/lookahead-rollout/lookahead-rollout:0.2.0"):
        engine(self.objects[key])["image"] = image
        self._bump(self.objects[key])


@pytest.fixture
def events(monkeypatch):
    out = []
    monkeypatch.setattr(actions, "post_event", lambda k, body, type_, reason, message: out.append((reason, message)))
    return out


def ctx(api, phase=Phase.Promoting):
    body = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
            "metadata": {"name": "chat-fleet", "namespace": "inference", "uid": "p-1"}}
    w = world(status=LookaheadPolicyStatus(phase=phase))
    return actions.Ctx(api, body, SPEC, w)


def act(c, kind, *names, decision="d1"):
    actions.ACTIONS[kind](c, Action(kind, targets=tuple(("serving", n) for n in names), decision_id=decision))


def test_promote_writes_the_whole_template_once_and_a_rerun_writes_nothing(events):
    api = FakeApi(claim(deployment()))
    c = ctx(api)
    act(c, K.PROMOTE, "a")
    (verb, _, body), = api.writes
    live = api.objects[("serving", "a")]
    assert verb == "PUT" and body["metadata"]["resourceVersion"] == "10"
    assert "--speculative-config" in engine(live)["args"] and live["spec"]["replicas"] == 2
    assert not b.user_edited(live) and live["metadata"]["annotations"][b.ANNOTATION_PROMOTED] == "d1"
    act(c, K.PROMOTE, "a")
    assert len(api.writes) == 1, "already promoted with this decision: idempotent"
    assert [e[0] for e in events] == ["Promoted"]


def test_promote_never_writes_over_a_users_edit_even_one_that_races_the_write(events):
    api = FakeApi(claim(deployment()))
    api.user_edits(("serving", "a"))
    act(ctx(api), K.PROMOTE, "a")
    assert api.writes == [] and events == []
    api = FakeApi(claim(deployment()))
    api.before_put = lambda a: a.user_edits(("serving", "a"))  # lands between our read and our PUT
    act(ctx(api), K.PROMOTE, "a")
    live = api.objects[("serving", "a")]
    assert api.writes == [] and engine(live)["image"].endswith(":0.2.0")
    assert "--speculative-config" not in engine(live)["args"], "the 409 was re-read, and the edit left alone"


def test_promote_retries_a_conflict_that_was_not_an_edit(events):
    api = FakeApi(claim(deployment()))
    api.before_put = lambda a: (a.objects[("serving", "a")]["spec"].update(replicas=9),
                                a._bump(a.objects[("serving", "a")]))
    act(ctx(api), K.PROMOTE, "a")
    live = api.objects[("serving", "a")]
    assert [w[0] for w in api.writes] == ["PUT"] and live["spec"]["replicas"] == 9, "the user's scale is kept"
    assert "--speculative-config" in engine(live)["args"]


def test_restore_puts_back_the_original_unless_the_user_edited_it(events):
    original = claim(deployment())
    api = FakeApi(original, claim(deployment("b")))
    c = ctx(api)
    act(c, K.PROMOTE, "a", "b")
    api.user_edits(("serving", "a"))
    edited_template = copy.deepcopy(api.objects[("serving", "a")]["spec"]["template"])
    del events[:]
    act(c, K.RESTORE, "a", "b")
    a, b_ = api.objects[("serving", "a")], api.objects[("serving", "b")]
    assert a["spec"]["template"] == edited_template, "the user's template stays, exactly"
    assert a["metadata"]["annotations"] == {"team": "x"}, "and every mark of ours is gone"
    assert b_["spec"]["template"] == original["spec"]["template"] and b_["metadata"]["annotations"] == {"team": "x"}
    assert sorted(e[0] for e in events) == ["LeftToUser", "Restored"]


def test_leave_releases_only_what_this_policy_owns_and_never_touches_the_template(events):
    mine, other = claim(deployment("a")), claim(deployment("b"), owner="other/policy")
    api = FakeApi(mine, other)
    api.user_edits(("serving", "a"))
    api.user_edits(("serving", "b"))
    act(ctx(api), K.LEAVE, "a", "b")
    assert [(w[0], w[1]) for w in api.writes] == [("PATCH", ("serving", "a"))]
    assert api.objects[("serving", "a")]["metadata"]["annotations"] == {"team": "x"}
    assert api.objects[("serving", "b")]["metadata"]["annotations"][b.ANNOTATION_OWNER] == "other/policy"
    act(ctx(api), K.LEAVE, "a")
    assert len(api.writes) == 1 and [e[0] for e in events] == ["LeftToUser"], "idempotent"


def test_guard_load_never_drives_a_target_left_to_its_user(monkeypatch):
    c = ctx(FakeApi())
    c.world.targets = [tgt("a", promoted="d1"), tgt("b", promoted="d1", edited=True)]
    seen = []
    monkeypatch.setattr(actions.fleet, "newest_promoted", lambda ts: seen.append([t.name for t in ts]) or None)
    act(c, K.ENSURE_GUARD_LOAD)
    assert seen == [["a"]]


class GoneApi(FakeApi):
    """The target's namespace is being deleted: reads still find it (a lagging cache), writes 404."""

    def patch_deployment(self, ns, name, patch):
        raise ApiException(status=404, reason="Not Found")

    def replace_deployment(self, body):
        raise ApiException(status=404, reason="Not Found")


def test_a_target_deleted_under_promote_restore_or_leave_is_done_not_a_failed_pass(events):
    promoted = promote(claim(deployment("a")))
    edited = claim(deployment("b"))
    api = GoneApi(claim(deployment("c")), promoted, edited)
    api.user_edits(("serving", "b"))
    c = ctx(api)
    act(c, K.PROMOTE, "c")                                   # (main's _unless_gone, through _replace_checked)
    act(c, K.RESTORE, "a", "b")                              # b: the user's, only let go: that 404s too
    act(c, K.LEAVE, "b")
    assert api.writes == [] and events == [], "nothing written, no event claims otherwise"


def test_the_control_joins_the_fleets_service_by_the_selector_labels_of_its_source_once():
    """``SERVE_CONTROL``: the control's pods get the matchLabels of the target they were cloned from
    (so the fleet's Service sends them users); a pod that has them, or is going, is not written."""
    class Api:
        def __init__(self):
            self.labelled = []

        def get_deployment(self, ns, name):
            return {"spec": {"selector": {"matchLabels": {"app": "chat", "fleet": name}}}}

        def role_pods(self, ns, policy_ns, policy_name, role):
            assert role == "control"
            return [{"metadata": {"namespace": ns, "name": "ctl-new", "labels": {b.LABEL_ROLE: "control"}}},
                    {"metadata": {"namespace": ns, "name": "ctl-in", "labels": {"app": "chat", "fleet": "a"}}},
                    {"metadata": {"namespace": ns, "name": "ctl-old", "labels": {},
                                  "deletionTimestamp": "2026-12-03T10:00:00Z"}}]

        def label_pod(self, ns, name, labels):
            self.labelled.append((ns, name, labels))

    api = Api()
    c = ctx(api)
    c.world.targets = [tgt("b", promoted="d1"), tgt("a", promoted="d1")]
    act(c, K.SERVE_CONTROL)
    assert api.labelled == [("serving", "ctl-new", {"app": "chat", "fleet": "a"})], "a is the role source"
