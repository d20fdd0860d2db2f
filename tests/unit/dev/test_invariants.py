"""The invariant checks of ``lookahead_dev.invariants`` on hand-built API objects: each check finds
the bad case and passes the good one. The "good" objects are built with the operator's own
builders (claim, promote, role Deployments, load Jobs), so these tests break when builders change
in a way the checks do not follow."""

import copy
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from lookahead_dev import invariants as inv
from lookahead_operator.controller import builders as b
from lookahead_operator import engines
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.measurement.measure import promotion_regime
from lookahead_operator.controller.world import Observed, Target
from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.status import TERMINAL_PHASES, Decision, LookaheadPolicyStatus, Phase, Progress

REPO = Path(__file__).resolve().parents[3]
NS = "serving"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def policy_body(phase="Promoting", decision=None, batches=None, **spec_edits) -> dict:
    """The shipped example policy in namespace ``serving``, explicit batch sizes [1, 8]."""
    body = yaml.safe_load((REPO / "examples" / "chat-fleet.yaml").read_text())
    body["metadata"] = {"name": "chat-fleet", "namespace": NS, "uid": "uid-1", "generation": 1}
    spec = body["spec"]
    spec["load"]["batchSizes"] = [1, 8]
    for path, value in spec_edits.items():
        node = spec
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    status = {"phase": phase, "progress": {"batchSizes": [1, 8]}}
    if decision is not None:
        status["decision"] = decision
    if batches is not None:
        status["batches"] = batches
    body["status"] = status
    return body


PROMOTE = {"id": "f00dcafe-Promote", "action": "Promote", "reason": "wins everywhere",
           "regime": [{"start": 0, "end": 32, "enabled": True}]}
REGIME = {"id": "f00dcafe-PromoteRegimeAware", "action": "PromoteRegimeAware", "reason": "wins up to 4",
          "crossoverBatchSize": 8,
          "regime": [{"start": 0, "end": 4, "enabled": True}, {"start": 5, "end": 32, "enabled": False}]}


def raw_target(name="chat-reference") -> dict:
    """The example's reference Deployment as the apiserver returns it (defaults filled in)."""
    docs = list(yaml.safe_load_all((REPO / "examples" / "fleet-deployment.yaml").read_text()))
    d = copy.deepcopy(next(x for x in docs if x and x["metadata"].get("name") == "chat-reference"))
    d["metadata"].update(name=name, namespace=NS, uid="d-1", resourceVersion="10", generation=1)
    template = inv.apiserver_defaults(d["spec"]["template"])
    template["metadata"]["creationTimestamp"] = None
    d["spec"]["template"] = template
    return d


def claimed(d, owner=f"{NS}/chat-fleet") -> dict:
    out = copy.deepcopy(d)
    out["metadata"].setdefault("annotations", {}).update(b.claim_patch(d, owner)["metadata"]["annotations"])
    return out


def promoted(d, policy, decision) -> dict:
    """What ``actions._promote`` leaves on a claimed target: the builders' promote patch applied."""
    spec = LookaheadPolicy.from_body(policy).spec
    regime = promotion_regime(LookaheadPolicyStatus(decision=Decision.model_validate(decision)))
    c = claimed(d)
    patch = b.promote_patch(c, lambda ct: engines.render_lookahead(ct, spec.lookahead, regime, "reference"),
                            engines.is_engine_container, decision["id"])
    out = copy.deepcopy(c)
    out["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    out["spec"]["template"] = patch["spec"]["template"]
    return out


def engine_args(d) -> list[str]:
    return d["spec"]["template"]["spec"]["containers"][0]["args"]


# --- (a) the target's pod template ----------------------------------------------------------------

def test_original_template_is_clean_and_the_exact_promotion_is_clean():
    d = raw_target()
    pol = policy_body("Promoting", PROMOTE)
    assert inv.check_target_template(claimed(d), d["spec"]["template"], pol) == []
    p = promoted(d, pol, PROMOTE)
    assert "--speculative-config" in engine_args(p)          # the builders really changed something
    assert inv.check_target_template(p, d["spec"]["template"], pol) == []
    # the saved annotation is the original, exactly
    assert inv.check_saved_original(p, d["spec"]["template"]) == []


def test_a_change_beyond_the_promotion_is_found():
    d = raw_target()
    pol = policy_body("Promoting", PROMOTE)
    p = promoted(d, pol, PROMOTE)
    p["spec"]["template"]["spec"]["containers"][0]["image"] = "ghcr.io/someone/else:9"
    found = inv.check_target_template(p, d["spec"]["template"], pol)
    assert len(found) == 1 and "chat-reference" in found[0] and "image" in found[0]
    # an extra env var on an otherwise exact promotion
    p = promoted(d, pol, PROMOTE)
    p["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "X", "value": "1"}]
    assert inv.check_target_template(p, d["spec"]["template"], pol)


def test_a_target_promoted_in_part_keeps_its_original_template_and_must_get_its_replicas_back():
    d = raw_target()
    lent = b.lend_body(claimed(d), 1, PROMOTE["id"])     # what actions._promote writes for a replica wave
    assert inv.check_target_template(lent, d["spec"]["template"], policy_body("Promoting", PROMOTE)) == []
    found = inv.check_target_template(lent, d["spec"]["template"], policy_body("RolledBack", PROMOTE))
    assert len(found) == 1 and "lends 1 replica" in found[0]
    gone = inv.check_target_template(lent, d["spec"]["template"], policy_body("Promoting", PROMOTE), gone=True)
    assert gone and "lends 1 replica" in gone[0]
    assert inv.check_target_template(b.restore_body(lent), d["spec"]["template"],
                                     policy_body("RolledBack", PROMOTE)) == []


def test_a_template_edited_without_any_promotion_is_found():
    d = raw_target()
    pol = policy_body("Measuring")
    edited = copy.deepcopy(d)
    edited["spec"]["template"]["spec"]["containers"][0]["args"].append("--max-num-seqs=8")
    found = inv.check_target_template(edited, d["spec"]["template"], pol)
    assert found and "neither the original" in found[0]


def test_regime_aware_promotion_must_carry_its_regime():
    d = raw_target()
    pol = policy_body("Promoting", REGIME)
    good = promoted(d, pol, REGIME)
    assert "--lookahead-max-batch-size" in engine_args(good)
    assert inv.check_target_template(good, d["spec"]["template"], pol) == []
    # lookahead on at every batch size under the regime-aware decision's id: not the promoted change
    wrong = promoted(d, pol, {**PROMOTE, "id": REGIME["id"]})
    assert "--lookahead-max-batch-size" not in engine_args(wrong)
    assert inv.check_target_template(wrong, d["spec"]["template"], pol)


def test_promoted_with_a_decision_the_policy_never_made_is_found():
    d = raw_target()
    pol = policy_body("Promoting", PROMOTE)
    other = promoted(d, pol, {**PROMOTE, "id": "deadbeef-Promote"})
    assert inv.check_target_template(other, d["spec"]["template"], pol)
    # ... but a decision seen earlier (under a spec since changed) is recognised through history
    old_spec = copy.deepcopy(pol["spec"])
    restarted = policy_body("Pending", **{"lookahead.window": 5})
    p = promoted(d, pol, PROMOTE)
    assert inv.check_target_template(p, d["spec"]["template"], restarted)
    assert inv.check_target_template(p, d["spec"]["template"], restarted, history=[(old_spec, PROMOTE)]) == []


def test_analysis_only_never_promotes():
    d = raw_target()
    pol = policy_body("Succeeded", PROMOTE, **{"promotion.mode": "analysisOnly"})
    p = promoted(d, pol, PROMOTE)
    found = inv.check_target_template(p, d["spec"]["template"], pol)
    assert found and "analysisOnly" in found[0]


@pytest.mark.parametrize("phase", ["RolledBack", "Failed", "NotACandidate"])
def test_after_rollback_the_template_is_the_original_byte_for_byte(phase):
    d = raw_target()
    pol = policy_body(phase, PROMOTE)
    restored = b.restore_body(promoted(d, pol, PROMOTE))
    assert inv.check_target_template(restored, d["spec"]["template"], pol) == []
    still = promoted(d, pol, PROMOTE)
    assert inv.check_target_template(still, d["spec"]["template"], pol)
    # byte for byte: even a field the apiserver would default again counts
    near = copy.deepcopy(restored)
    del near["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"]
    found = inv.check_target_template(near, d["spec"]["template"], pol)
    assert found and "byte for byte" in found[0] and "terminationMessagePath" in found[0]


def test_after_deletion_mid_rollout_the_original_but_after_success_the_promotion_stays():
    d = raw_target()
    mid = policy_body("Promoting", PROMOTE)
    p = promoted(d, mid, PROMOTE)
    found = inv.check_target_template(p, d["spec"]["template"], mid, gone=True)
    assert found and "deleted" in found[0]
    assert inv.check_target_template(b.restore_body(p), d["spec"]["template"], mid, gone=True) == []
    done = policy_body("Succeeded", PROMOTE)
    disowned = copy.deepcopy(p)
    del disowned["metadata"]["annotations"][b.ANNOTATION_OWNER]   # statemachine.deletion_plan: DISOWN
    assert inv.check_target_template(disowned, d["spec"]["template"], done, gone=True) == []


def test_marked_promoted_with_the_original_template_is_found():
    d = claimed(raw_target())
    d["metadata"]["annotations"][b.ANNOTATION_PROMOTED] = PROMOTE["id"]
    assert inv.check_target_template(d, d["spec"]["template"], policy_body("Promoting", PROMOTE))


def test_the_users_edit_must_stay():
    d = raw_target()
    user = copy.deepcopy(d["spec"]["template"])
    user["spec"]["containers"][0]["image"] = "ghcr.io/lookahead-rollout/lookahead-rollout:0.2.0"
    edited = copy.deepcopy(d)
    edited["spec"]["template"] = user
    pol = policy_body("Promoting", PROMOTE)
    assert inv.check_target_template(edited, d["spec"]["template"], pol, user_template=user) == []
    # the operator promoting (or restoring) over the user's edit is a violation
    assert inv.check_target_template(promoted(d, pol, PROMOTE), d["spec"]["template"], pol, user_template=user)
    assert inv.check_target_template(d, d["spec"]["template"], pol, user_template=user)


def test_saved_annotation_must_be_the_template_before_the_operator_touched_it():
    d = raw_target()
    c = claimed(d)
    assert inv.check_saved_original(c, d["spec"]["template"]) == []
    earlier = copy.deepcopy(d["spec"]["template"])
    earlier["spec"]["containers"][0]["args"] = ["--model=tiny"]
    found = inv.check_saved_original(c, earlier)
    assert found and b.ANNOTATION_ORIGINAL_TEMPLATE in found[0]


def test_apiserver_defaults_fill_only_what_is_missing():
    d = raw_target()
    t = d["spec"]["template"]
    assert inv.canonical(inv.apiserver_defaults(t)) == inv.canonical(
        {**t, "metadata": {k: v for k, v in t["metadata"].items() if v is not None}})
    bare = {"metadata": {}, "spec": {"containers": [{"name": "e", "image": "x:1", "ports": [{"containerPort": 1}]}]}}
    out = inv.apiserver_defaults(bare)
    assert out["spec"]["containers"][0]["ports"][0]["protocol"] == "TCP"
    assert out["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert bare["spec"]["containers"][0].get("imagePullPolicy") is None   # (not mutated)


def test_policy_targets_follows_selector_and_namespaces():
    pol = policy_body()
    d = raw_target()
    assert inv.policy_targets(pol, d)
    other_ns = copy.deepcopy(d)
    other_ns["metadata"]["namespace"] = "elsewhere"
    assert not inv.policy_targets(pol, other_ns)
    unlabelled = copy.deepcopy(d)
    unlabelled["metadata"]["labels"]["engine"] = "vllm"
    assert not inv.policy_targets(pol, unlabelled)


# --- (b) role Deployments, orphans, load -----------------------------------------------------------

def role(policy, role_, target=None, **meta):
    d = b.build_role_deployment(target or raw_target(), policy, role_, 1, lambda c: c, engines.is_engine_container)
    d["metadata"].update(meta)
    return d


def test_one_canary_and_one_control_per_policy_and_target():
    pol = policy_body()
    pair = [role(pol, "canary"), role(pol, "control")]
    assert inv.check_role_deployments(pair) == []
    dup = role(pol, "canary", name="lap-chat-fleet-canary-2")
    found = inv.check_role_deployments(pair + [dup])
    assert len(found) == 1 and "2 canary Deployments" in found[0] and "chat-fleet" in found[0]
    # one being deleted is gone already
    assert inv.check_role_deployments(pair + [{**dup, "metadata": {**dup["metadata"],
                                                                   "deletionTimestamp": "2026-01-01T00:00:00Z"}}]) == []
    # another target, or another policy, may have its own pair
    other = role(pol, "canary", target=raw_target("chat-2"), name="lap-chat-fleet-canary-x")
    assert inv.check_role_deployments(pair + [other]) == []


def test_no_orphans():
    pol = policy_body()
    live = {f"{NS}/chat-fleet": pol}
    canary = role(pol, "canary")
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert inv.check_orphans([canary], live) == []
    found = inv.check_orphans([canary], {})
    assert found and "orphan" in found[0] and "lap-chat-fleet-canary" in found[0]
    recreated = {f"{NS}/chat-fleet": {**pol, "metadata": {**pol["metadata"], "uid": "uid-2"}}}
    assert inv.check_orphans([canary], recreated)
    no_ref = copy.deepcopy(canary)
    del no_ref["metadata"]["ownerReferences"]
    assert inv.check_orphans([no_ref], live)
    # a clone in another namespace has no owner reference by design; the finalizer deletes it
    elsewhere = raw_target()
    elsewhere["metadata"]["namespace"] = "other"
    cross = role(pol, "control", target=elsewhere)
    assert "ownerReferences" not in cross["metadata"]
    assert inv.check_orphans([cross], live) == []
    assert inv.check_orphans([cross], {})
    # not ours: ignored
    assert inv.check_orphans([raw_target()], {}) == []


def job(policy, step, batch_size, drives="canary", run=1, **status):
    prompts = LookaheadPolicy.from_body(policy).spec.load.prompts
    j = b.build_load_job(policy, NS, drives, step, run, batch_size, "http://10.0.0.1:8000", 120, "img:1", prompts)
    if status:
        j["status"] = status
    return j


def test_load_never_above_the_configured_concurrency():
    pol = policy_body("Measuring")
    live = {f"{NS}/chat-fleet": pol}
    good = [job(pol, 1, 8, "canary"), job(pol, 1, 8, "control")]
    assert inv.load_job_concurrency(good[0]) == 8
    assert inv.check_load_jobs(good, live) == []
    # a step's Job at another batch size than the step's
    found = inv.check_load_jobs([job(pol, 0, 8)], live)
    assert found and "step 0 is batch size 1" in found[0]
    # above the largest planned batch size
    assert any("above the largest planned" in m for m in inv.check_load_jobs([job(pol, "w0", 16)], live))
    # parallelism multiplies the load
    par = job(pol, 1, 8)
    par["spec"]["parallelism"] = 2
    assert any("parallelism 2" in m for m in inv.check_load_jobs([par], live))
    # two active Jobs driving one role at once (an old run not deleted)
    two = [job(pol, 0, 1, run=1), job(pol, 1, 8, run=2)]
    found = inv.check_load_jobs(two, live)
    assert len(found) == 1 and "2 active load Jobs drive canary" in found[0]
    # ... but a finished one drives nothing
    done = job(pol, 0, 1, run=1, conditions=[{"type": "Complete", "status": "True"}])
    assert inv.check_load_jobs([done, job(pol, 1, 8, run=2)], live) == []


# --- (c) decisions -----------------------------------------------------------------------------------

def rows(*verdicts, n=50):
    return [{"batchSize": bs, "verdict": v, "samples": {"control": n, "canary": n}}
            for bs, v in zip((1, 8), verdicts)]


def test_promote_needs_settled_wins_with_data_everywhere():
    assert inv.check_decision(policy_body("Promoting", PROMOTE, rows("Wins", "Wins"))) == []
    found = inv.check_decision(policy_body("Promoting", PROMOTE, rows("Wins", "Pending")))
    assert found and "batch size 8" in found[0] and "Pending" in found[0]
    assert inv.check_decision(policy_body("Promoting", PROMOTE, rows("Wins")))          # 8 never measured
    starved = inv.check_decision(policy_body("Promoting", PROMOTE, rows("Wins", "Wins", n=3)))
    assert starved and "minSamplesPerStep" in starved[0]
    # other decisions are not checked
    assert inv.check_decision(policy_body("RolledBack", {**PROMOTE, "action": "Rollback"}, rows("NoGain"))) == []


def live_policy(strata, regime_end=2):
    body = policy_body("Promoting", {**REGIME, "regime": [{"start": 1, "end": regime_end, "enabled": True},
                                                          {"start": regime_end + 1, "end": 64, "enabled": False}]},
                       **{"load.mode": "live", "load.livePercent": "10%"})
    # rows: (offered low, windows, outcome, control's running batch[, paired windows: all by default
    # [, latency change: +10% by default]])
    body["status"]["live"] = {"strata": [{"offeredLow": row[0], "windows": row[1], "outcome": row[2],
                                          "controlRunning": row[3], "pairs": row[4] if len(row) > 4 else row[1],
                                          "latencyChange": row[5] if len(row) > 5 else 0.1}
                                         for row in strata]}
    return body


def test_a_live_promotion_needs_a_run_of_won_strata_from_the_bottom_and_no_more_batch_than_they_ran():
    # windows below minSamplesPerStep (10 in the example) do not count as visited
    ok = live_policy([(0.0, 3, "Pending", None), (1.0, 20, "Wins", 1.6), (2.0, 12, "Pending", 3.0)])
    assert inv.check_decision(ok) == []
    beyond = inv.check_decision(live_policy([(1.0, 20, "Wins", 1.6)], regime_end=4))
    assert beyond and "beyond the control's running batch 1.60" in beyond[0]
    bottom = inv.check_decision(live_policy([(0.0, 15, "NoGain", 0.5), (1.0, 20, "Wins", 1.6)]))
    assert bottom and "lowest live stratum visited is NoGain" in bottom[0]
    assert inv.check_decision(live_policy([(1.0, 4, "Wins", 1.6)]))   # no stratum with enough windows
    # a low load with the windows but too few paired ones could not be answered: not visited
    assert inv.check_decision(live_policy([(0.0, 15, "Pending", 0.5, 3), (1.0, 20, "Wins", 1.6)])) == []
    assert inv.check_decision(live_policy([(0.0, 15, "Pending", 0.5), (1.0, 20, "Wins", 1.6)]))
    # paired, Pending, leaning the canary's way below the run: passed over as unmeasured
    assert inv.check_decision(live_policy([(0.0, 15, "Pending", 0.5, 15, -0.4), (1.0, 20, "Wins", 1.6)])) == []
    assert inv.check_decision(live_policy([(0.0, 15, "Pending", 0.5, 15, -0.4), (1.0, 20, "NoGain", 1.6)]))


def test_regime_aware_needs_wins_inside_its_range_and_strictly_a_settled_verdict_above():
    assert inv.check_decision(policy_body("Promoting", REGIME, rows("Wins", "Regresses"))) == []
    # the deadline passed with batch size 8 unsettled: decision.decide still promotes 1..4 (by design)
    pending = policy_body("Promoting", {**REGIME, "crossoverBatchSize": None}, rows("Wins", "Pending"))
    found = inv.check_decision(pending)
    assert found and "settled" in found[0] and "8" in found[0]
    assert inv.check_decision(pending, strict=False) == []
    # a size inside the enabled range that did not win
    inside = policy_body("Promoting", {**REGIME, "regime": [{"start": 0, "end": 8, "enabled": True}]},
                         rows("Wins", "NoGain"))
    assert any("without a Wins verdict" in m for m in inv.check_decision(inside, strict=False))


# --- (d) phase transitions ------------------------------------------------------------------------

def test_transition_table():
    assert inv.check_phase_transition("ns/p", "Measuring", "Deciding") == []
    assert inv.check_phase_transition("ns/p", "Measuring", "Measuring") == []
    found = inv.check_phase_transition("ns/p", "Measuring", "Promoting")
    assert found and "ns/p" in found[0] and "Measuring -> Promoting" in found[0]
    assert inv.check_phase_transition("ns/p", "Succeeded", "Guarding")
    assert inv.check_phase_transition("ns/p", "RolledBack", "Promoting")
    assert inv.check_phase_transition("ns/p", "Measuring", "Exploded")
    # every phase is reachable from Pending and every non-terminal phase can move on
    reach, frontier = {Phase.Pending}, [Phase.Pending]
    while frontier:
        p = frontier.pop()
        for a, c in inv.ALLOWED_TRANSITIONS:
            if a == p and c not in reach:
                reach.add(c)
                frontier.append(c)
    assert reach == set(Phase)


# The state machine itself, driven for real: every transition it makes is in the table.

SPEC = LookaheadPolicy.from_body(policy_body()).spec


def world(status, **kw):
    base = dict(now=T0, load_running={"canary", "control", "promoted"},  # load pods run at once here
                name="chat-fleet", namespace=NS, generation=1, fingerprint=SPEC.fingerprint(), spec=SPEC,
                status=status, targets=[Target(NS, "a", "reference", owner=f"{NS}/chat-fleet")])
    base.update(kw)
    return Observed(**base)


def status_in(phase):
    return LookaheadPolicyStatus(phase=phase, progress=Progress(fingerprint=SPEC.fingerprint(), batch_sizes=[1, 8]))


@pytest.mark.parametrize("phase", list(Phase))
def test_real_reconcile_transitions_are_allowed(phase):
    made = []
    # an invalid spec, a changed spec, an abort, and a plain pass with nothing measured
    cases = [world(status_in(phase), spec=None, spec_error="spec.load: broken"),
             world(status_in(phase), fingerprint="changed"),
             world(status_in(phase), abort_requested=True),
             world(status_in(phase))]
    for w in cases:
        new = sm.reconcile(w).status.phase
        made.append((phase, new))
        assert inv.check_phase_transition("ns/p", phase.value, new.value) == [], (phase, new)
    # the invalid spec always fails; an abort rolls back what is not finished
    assert made[0][1] == Phase.Failed
    if phase not in TERMINAL_PHASES:
        assert made[2][1] == Phase.RolledBack


def test_happy_path_of_the_real_state_machine_is_allowed():
    from lookahead_operator.api.status import BatchResult, PreflightStatus

    w = world(LookaheadPolicyStatus(), targets=[Target(NS, "a", "reference")])
    phases = [w.status.phase]

    def step(w, **kw):
        plan = sm.reconcile(replace(w, **kw))
        phases.append(plan.status.phase)
        return replace(w, status=plan.status)

    w = step(w)
    w = step(w, preflight=sm.PreflightResult(PreflightStatus(candidate=True, verdict="X"), [1, 8]))
    w = step(w, roles_ready={"canary": True, "control": True})
    for bs in (1, 8):
        row = BatchResult(batch_size=bs, verdict="Wins", samples={"control": 50, "canary": 50})
        w = step(w, step=sm.StepMeasurement(row, True))
    w = step(w, decision=Decision(action="Promote", reason="r"))
    assert w.status.phase == Phase.Promoting
    seen = [p.value for p in phases]
    for old, new in zip(seen, seen[1:]):
        assert inv.check_phase_transition("ns/p", old, new) == [], (old, new)
    assert seen[0] == "Pending" and seen[-1] == "Promoting" and "Measuring" in seen and "Deciding" in seen


def test_violation_renders_time_check_and_message():
    v = inv.Violation(0.0, "template", "Deployment a/b: wrong")
    assert str(v).endswith("[template] Deployment a/b: wrong") and json.dumps(str(v))
