"""The operator's invariants, checked continuously while end-to-end and fault tests run (issue 12).

Two layers:

* **Pure checks** over plain dicts as the Kubernetes API returns them (raw JSON, camelCase). No
  I/O; each returns a list of violations in words, each naming the object and what is wrong:

  - ``check_target_template``: a target Deployment's pod template is either its original (as it
    was before the operator touched it) or the original plus exactly the promoted engine change,
    computed with the operator's own builders (``builders.promote_patch`` with the transform
    ``actions._promote`` uses: ``engines.render_lookahead`` for the policy's ``spec.lookahead``,
    the engine ``fleet.target_of`` detects, and ``measure.promotion_regime`` of the decision).
    After the policy rolled back, failed or was found no candidate, and after it is gone (unless it
    had Succeeded, whose promotion stays by design: ``statemachine.deletion_plan`` disowns), the
    template must equal the original **byte for byte**.
  - ``check_saved_original``: the template saved in ``builders.ANNOTATION_ORIGINAL_TEMPLATE`` is
    the template as it was before the operator touched it.
  - ``check_role_deployments``: at most one canary and one control Deployment per policy and target.
  - ``check_orphans``: every Deployment and Job labelled as ours belongs to a policy that exists
    (being deleted counts), by an owner reference to it when they share a namespace.
  - ``check_load_jobs``: a load Job never drives more than the configured concurrency: its
    ``--concurrency`` is the step's planned batch size (never above the largest planned one), its
    parallelism is 1, and no two active load Jobs drive the same role of a policy at once.
  - ``check_decision``: ``status.decision`` is never Promote/PromoteRegimeAware unless the status
    has, for every planned batch size, a settled verdict (strict: the issue's wording) and, where
    lookahead is turned on, a ``Wins`` verdict over at least ``load.minSamplesPerStep`` samples per
    arm (no promotion without data).
  - ``check_phase_transition``: a status phase change is one the state machine can make
    (``ALLOWED_TRANSITIONS``).

* **``InvariantWatcher``**: a thread that lists and watches Deployments, load Jobs and
  LookaheadPolicies, keeps the last seen objects, each target's original template and each
  policy's phase history, runs the checks on every event (and on a short tick), and records
  violations with a timestamp. Checks that combine two kinds of object (a target and its policy,
  a Job and its policy) read two watch streams that may lag one another by a moment; their
  violations are recorded once they have held for ``grace_s`` (orphans: ``orphan_grace_s``, the
  garbage collector's time), with the time they were first seen. Checks on one stream (role
  counts, decisions, phase transitions, the saved annotation) are recorded at once.

What "exact" means for templates
---------------------------------
The original is the target's ``spec.template`` as the watcher first saw it before the operator
touched it (no ``lookahead.dev/*`` annotation on the Deployment), as raw API JSON. Once a policy
targets the Deployment that original is frozen; only ``InvariantWatcher.user_edited`` (a test
that edits a target on purpose) replaces it. Templates are compared as canonical JSON
(``canonical``: sorted keys, no whitespace, what ``builders.claim_patch`` writes):

* "the original" (and everything after a rollback, abort, failure or deletion): canonical JSON of
  the current template == canonical JSON of the original. Nothing is ignored.
* "the original plus exactly the promoted change": the expected template is the builders' promote
  output from the original. The operator writes it (a PUT of the Deployment) and the apiserver fills in defaults
  for what the engine transform added (a port's protocol, a probe's timeouts, ...); so both sides
  go through ``apiserver_defaults`` (the pod-template defaults the apiserver applies, idempotent on
  a template the apiserver returned) and must then be equal as canonical JSON. Any other field that
  differs -- an image, an env var, an extra flag, a missing annotation -- is a violation.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from lookahead_operator.controller import builders
from lookahead_operator import engines
from lookahead_operator.controller import fleet
from lookahead_operator.api.names import (
    ANNOTATION_ORIGINAL_TEMPLATE,
    ANNOTATION_OWNER,
    ANNOTATION_PROMOTED,
    ANNOTATION_SOURCE,
    GROUP,
    LABEL_DRIVES,
    LABEL_MANAGED_BY,
    LABEL_POLICY,
    LABEL_POLICY_NAMESPACE,
    LABEL_ROLE,
    LABEL_STEP,
    LABEL_TARGET,
    MANAGED_BY,
    PLURAL,
    ROLES,
    VERSION,
)
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import (
    TERMINAL_PHASES,
    BatchVerdict,
    Decision,
    DecisionAction,
    LookaheadPolicyStatus,
    Phase,
)

log = logging.getLogger("lookahead_dev.invariants")

__all__ = [
    "ALLOWED_TRANSITIONS", "SETTLED_VERDICTS", "InvariantWatcher", "Violation", "apiserver_defaults", "canonical",
    "check_decision", "check_load_jobs", "check_orphans", "check_phase_transition", "check_role_deployments",
    "check_saved_original", "check_target_template", "expected_promoted_template", "load_job_concurrency",
    "policy_targets",
]

# --- the allowed phase transitions ------------------------------------------------------------------

P = Phase
_NON_TERMINAL = frozenset(p for p in Phase if p not in TERMINAL_PHASES)

#: Every phase change ``statemachine.reconcile`` can make (it has no table of its own; built from
#: its code, every ``ctx.transition(...)``):
#:  * the phase handlers ``statemachine.core._PHASES``: ``_pending`` (-> Preflight), ``_preflight``
#:    (-> Launching | NotACandidate), ``_launching`` (-> Measuring | Failed via ``_stop``),
#:    ``_measuring`` (-> Deciding), ``_deciding`` (-> Promoting | Succeeded | RolledBack | Failed |
#:    NotACandidate via ``_stop``), ``_promoting`` (-> Guarding | RolledBack via ``_roll_back``),
#:    ``_guarding`` (-> Succeeded | RolledBack);
#:  * ``reconcile`` before the handlers: ``_refuse`` (an invalid or unsupported spec) -> Failed from
#:    any phase; ``_restart`` (the spec's fingerprint changed) -> Pending from any phase but Pending;
#:    ``kubectl lookahead abort`` -> RolledBack via ``_roll_back`` from any non-terminal phase.
ALLOWED_TRANSITIONS: frozenset[tuple[Phase, Phase]] = frozenset(
    {
        (P.Pending, P.Preflight),
        (P.Preflight, P.Launching), (P.Preflight, P.NotACandidate),
        (P.Launching, P.Measuring), (P.Launching, P.Failed),
        (P.Measuring, P.Deciding),
        (P.Deciding, P.Promoting), (P.Deciding, P.Succeeded), (P.Deciding, P.RolledBack), (P.Deciding, P.Failed),
        (P.Deciding, P.NotACandidate),
        (P.Promoting, P.Guarding), (P.Promoting, P.RolledBack),
        (P.Guarding, P.Succeeded), (P.Guarding, P.RolledBack),
    }
    | {(p, P.Failed) for p in Phase if p != P.Failed}
    | {(p, P.Pending) for p in Phase if p != P.Pending}
    | {(p, P.RolledBack) for p in _NON_TERMINAL}
)

#: A batch size's verdict is settled when it is an outcome (``decision.BatchOutcome`` other than
#: Pending/Unmeasured); ``Inconclusive`` and ``Pending`` are not.
SETTLED_VERDICTS = frozenset({BatchVerdict.Wins.value, BatchVerdict.NoGain.value, BatchVerdict.Regresses.value})
PROMOTING_ACTIONS = frozenset({DecisionAction.Promote.value, DecisionAction.PromoteRegimeAware.value})
#: Phases in which every target must be exactly its original (nothing promoted may remain).
EXACT_PHASES = frozenset({P.RolledBack.value, P.Failed.value, P.NotACandidate.value})


# --- small helpers ----------------------------------------------------------------------------------

#: Canonical JSON: sorted keys, no whitespace (what ``builders.claim_patch`` saves).
canonical = builders.canonical


def _meta(obj: Mapping) -> Mapping:
    return obj.get("metadata") or {}


def _labels(obj: Mapping) -> Mapping:
    return _meta(obj).get("labels") or {}


def _annotations(obj: Mapping) -> Mapping:
    return _meta(obj).get("annotations") or {}


def _key(obj: Mapping) -> tuple[str, str]:
    m = _meta(obj)
    return (m.get("namespace") or "", m.get("name") or "")


def _ref(obj: Mapping, kind: str | None = None) -> str:
    ns, name = _key(obj)
    return f"{kind or obj.get('kind') or 'object'} {ns}/{name}"


def policy_key(policy: Mapping) -> str:
    ns, name = _key(policy)
    return f"{ns}/{name}"


def _phase(policy: Mapping | None) -> str:
    return ((policy or {}).get("status") or {}).get("phase") or P.Pending.value


def diff_paths(a: Any, b: Any, limit: int = 4, path: str = "") -> list[str]:
    """Where two JSON values differ, as paths (at most ``limit``), for messages."""
    out: list[str] = []

    def walk(x: Any, y: Any, p: str) -> None:
        if len(out) >= limit or x == y:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if k not in x:
                    out.append(f"{p}.{k} (added)")
                elif k not in y:
                    out.append(f"{p}.{k} (removed)")
                else:
                    walk(x[k], y[k], f"{p}.{k}")
                if len(out) >= limit:
                    return
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (xi, yi) in enumerate(zip(x, y)):
                walk(xi, yi, f"{p}[{i}]")
        else:
            out.append(f"{p or '.'}: {json.dumps(x)[:120]} -> {json.dumps(y)[:120]}")

    walk(a, b, path)
    return out or ["(no difference)"]


@functools.lru_cache(maxsize=512)
def _parse_spec(spec_json: str) -> LookaheadPolicySpec | None:
    try:
        return LookaheadPolicySpec.parse_stored(json.loads(spec_json))[0]
    except Exception:  # noqa: BLE001 - an invalid spec promotes nothing; callers say so
        return None


def parse_spec(policy_or_spec: Mapping | None) -> LookaheadPolicySpec | None:
    """The policy's spec as the operator parses it (``LookaheadPolicySpec.parse_stored``, which
    ``handlers.parse_spec`` calls), or None if invalid."""
    if policy_or_spec is None:
        return None
    spec = policy_or_spec.get("spec", policy_or_spec) if "metadata" in policy_or_spec else policy_or_spec
    return _parse_spec(canonical(spec or {}))


def planned_batch_sizes(policy: Mapping | None) -> list[int]:
    """The planned sweep: ``status.progress.batchSizes`` (fixed at Launching), else the spec's."""
    if not policy:
        return []
    status = policy.get("status") or {}
    sizes = (status.get("progress") or {}).get("batchSizes") or status.get("batchSizes")
    if not sizes:
        sizes = ((policy.get("spec") or {}).get("load") or {}).get("batchSizes")
    return [int(s) for s in sizes or []]


# --- apiserver defaulting ---------------------------------------------------------------------------

def apiserver_defaults(template: Mapping) -> dict:
    """A pod template with the defaults the apiserver fills in (``SetDefaults_PodSpec``,
    ``SetDefaults_Container``, probes, ports, volumes) and without ``null`` metadata values
    (``creationTimestamp: null``). Idempotent, and the identity on a template the apiserver returned:
    used on both sides of the promoted-template comparison only. One implementation with the
    operator's own comparison (``builders.comparable_template``, which ``builders.user_edited`` uses)."""
    return builders.comparable_template(dict(template))


# --- (a) the target's pod template ------------------------------------------------------------------

@functools.lru_cache(maxsize=1024)
def _expected_promoted(original_json: str, spec_json: str, decision_json: str, namespace: str, name: str) -> str:
    spec = _parse_spec(spec_json)
    if spec is None:
        raise ValueError("the policy's spec does not parse")
    original = json.loads(original_json)
    decision = json.loads(decision_json)
    regime = _promotion_regime(decision)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"namespace": namespace, "name": name,
                               "annotations": {ANNOTATION_ORIGINAL_TEMPLATE: original_json}},
                  "spec": {"template": original}}
    # (as actions._promote does it)
    engine = fleet.target_of(deployment, spec.engine).engine or "reference"
    patch = builders.promote_patch(deployment,
                                   lambda ct: engines.render_lookahead(ct, spec.lookahead, regime, engine),
                                   engines.is_engine_container, decision.get("id") or "")
    return canonical(patch["spec"]["template"])


def _promotion_regime(decision: Mapping) -> int | None:
    from lookahead_operator.measurement.measure import promotion_regime  # the operator's own reading of the decision

    return promotion_regime(LookaheadPolicyStatus(decision=Decision.model_validate(dict(decision))))


def expected_promoted_template(original: Mapping, spec: Mapping | LookaheadPolicySpec, decision: Mapping,
                               namespace: str = "default", name: str = "target") -> dict:
    """The pod template ``actions._promote`` writes for ``decision`` (a ``status.decision`` dict with
    its ``id``) under ``spec`` (the policy's spec, a dict or the model), from ``original``. Raises
    ``ValueError``/``engines.EngineError`` when the operator could not have promoted at all."""
    spec_json = canonical(spec.to_dict(exclude_none=True) if isinstance(spec, LookaheadPolicySpec) else spec)
    return json.loads(_expected_promoted(canonical(original), spec_json, canonical(decision), namespace, name))


def _promotable(spec: LookaheadPolicySpec | None, decision: Mapping | None) -> str | None:
    """Why this (spec, decision) could not have promoted anything, or None if it could."""
    if not decision or decision.get("action") not in PROMOTING_ACTIONS:
        return f"decision {(decision or {}).get('action') or 'none'} promotes nothing"
    if spec is None:
        return "the spec does not parse"
    mode = getattr(spec.promotion.mode, "value", spec.promotion.mode)
    if mode == "analysisOnly":
        return "promotion.mode analysisOnly never touches the fleet"
    if mode == "full" and decision.get("action") == DecisionAction.PromoteRegimeAware.value:
        return "promotion.mode full does not promote a regime-aware win"
    return None


def check_target_template(deployment: Mapping, original: Mapping | None, policy: Mapping | None = None, *,
                          gone: bool = False, history: Iterable[tuple[Mapping, Mapping]] = (),
                          user_template: Mapping | None = None) -> list[str]:
    """Invariant (a) for one target Deployment.

    ``original``: its pod template before the operator touched it (None: take the saved annotation).
    ``policy``: the policy that owns or targets it (when ``gone``, its last seen object).
    ``history``: earlier ``(spec, status.decision)`` pairs of that policy, so that a promotion made
    under a spec since changed (and not yet restored) is recognised.
    ``user_template``: a template a user (test) put there on purpose: from then on it must stay
    exactly that (the user's change wins; nothing may restore or promote over it)."""
    ref = _ref(deployment, "Deployment")
    current = (deployment.get("spec") or {}).get("template") or {}
    if user_template is not None:
        if canonical(current) != canonical(user_template):
            return [f"{ref}: the pod template was changed after the user's edit, which must win: "
                    f"differs at {', '.join(diff_paths(user_template, current))}"]
        return []
    if original is None:
        try:
            original = builders.original_template(dict(deployment))
        except ValueError:
            return [f"{ref}: annotation {ANNOTATION_ORIGINAL_TEMPLATE} is not JSON"]
        if original is None:
            return []
    marked = _annotations(deployment).get(ANNOTATION_PROMOTED)
    lent = _annotations(deployment).get(builders.ANNOTATION_PROMOTED_PODS)
    if lent and policy is not None and (_phase(policy) in EXACT_PHASES or (gone and _phase(policy) != P.Succeeded.value)):
        # (a rollback gives the replicas back in the same write that drops the mark)
        return [f"{ref}: it still lends {lent} replica(s) to a wave Deployment ({builders.ANNOTATION_PROMOTED_PODS}) "
                f"though policy {policy_key(policy)} is {_phase(policy)}"]
    if canonical(current) == canonical(original):
        if marked and not lent:  # (promoted in part: its template stays the original, its wave Deployment runs it)
            return [f"{ref}: annotation {ANNOTATION_PROMOTED}={marked} says promoted, but its pod template is the "
                    "original"]
        return []
    if policy is None:
        return [f"{ref}: the pod template differs from the original (at "
                f"{', '.join(diff_paths(original, current))}) and no known LookaheadPolicy owns it"]
    pkey, phase = policy_key(policy), _phase(policy)
    if phase in EXACT_PHASES or (gone and phase != P.Succeeded.value):
        state = f"deleted (last phase {phase})" if gone else phase
        return [f"{ref}: policy {pkey} is {state}, so the pod template must equal the original byte for byte; "
                f"it differs at {', '.join(diff_paths(original, current))}"]
    pod_id = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PROMOTED)
    candidates = [((policy.get("spec") or {}), (policy.get("status") or {}).get("decision"))] + list(history)
    nearest: dict | None = None
    reasons: list[str] = []
    got = canonical(apiserver_defaults(current))
    for spec_dict, decision in candidates:
        why = _promotable(parse_spec(spec_dict), decision)
        if why is None and decision.get("id") != pod_id:
            why = f"decision {decision.get('id')} is not the one on the pod template ({pod_id})"
        if why is not None:
            reasons.append(why)
            continue
        try:
            expected = expected_promoted_template(original, spec_dict, decision, *_key(deployment))
        except (ValueError, engines.EngineError) as exc:
            reasons.append(f"decision {decision.get('id')}: the operator could not render it ({exc})")
            continue
        if canonical(apiserver_defaults(expected)) == got:
            return []
        nearest = nearest or expected
    if nearest is not None:
        where = "the original plus the promoted change (expected), at " + ", ".join(
            diff_paths(apiserver_defaults(nearest), apiserver_defaults(current)))
    else:
        where = ("the original at " + ", ".join(diff_paths(original, current))
                 + ("; no promotion was possible: " + "; ".join(dict.fromkeys(reasons)) if reasons else ""))
    return [f"{ref}: the pod template is neither the original nor the original plus exactly the promoted engine "
            f"change (policy {pkey}, {phase}{', deleted' if gone else ''}); it differs from {where}"]


def check_saved_original(deployment: Mapping, original: Mapping | None) -> list[str]:
    """The template saved in ``ANNOTATION_ORIGINAL_TEMPLATE`` (``builders.claim_patch``) is the
    template the Deployment had before the operator touched it (``original``), exactly."""
    raw = _annotations(deployment).get(ANNOTATION_ORIGINAL_TEMPLATE)
    if not raw or original is None:
        return []
    ref = _ref(deployment, "Deployment")
    try:
        saved = json.loads(raw)
    except ValueError:
        return [f"{ref}: annotation {ANNOTATION_ORIGINAL_TEMPLATE} is not JSON"]
    if canonical(saved) != canonical(original):
        return [f"{ref}: annotation {ANNOTATION_ORIGINAL_TEMPLATE} is not the template before the operator touched "
                f"it: differs at {', '.join(diff_paths(original, saved))}"]
    return []


def policy_targets(policy: Mapping, deployment: Mapping) -> bool:
    """Whether ``policy``'s ``spec.targets`` selects ``deployment`` (as ``observe`` would; a
    namespaceSelector is taken to match every namespace: the watcher does not watch namespaces)."""
    labels = _labels(deployment)
    if labels.get(LABEL_MANAGED_BY) == MANAGED_BY:
        return False
    spec = parse_spec(policy)
    if spec is None:
        return False
    ns, t = _key(deployment)[0], spec.targets
    if t.namespaces:                       # (as cache.CachedView.select_namespaces)
        in_scope = ns in t.namespaces
    elif t.namespace_selector is not None:
        in_scope = True
    else:
        in_scope = ns == _key(policy)[0]
    return in_scope and t.selector.matches(dict(labels))


# --- (b) our objects: role Deployments, orphans, load ------------------------------------------------

def _ours(obj: Mapping) -> bool:
    return _labels(obj).get(LABEL_MANAGED_BY) == MANAGED_BY


def _deleting(obj: Mapping) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def check_role_deployments(deployments: Iterable[Mapping]) -> list[str]:
    """At most one canary, one control and one wave Deployment per policy and target
    (``builders.role_labels``; the target is ``ANNOTATION_SOURCE``, else the target label).
    Deployments being deleted are gone."""
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for d in deployments:
        labels = _labels(d)
        if not _ours(d) or labels.get(LABEL_ROLE) not in (*ROLES, builders.ROLE_WAVE) or _deleting(d):
            continue
        pkey = f"{labels.get(LABEL_POLICY_NAMESPACE)}/{labels.get(LABEL_POLICY)}"
        target = _annotations(d).get(ANNOTATION_SOURCE) or f"{_key(d)[0]}/{labels.get(LABEL_TARGET)}"
        groups[(pkey, labels[LABEL_ROLE], target)].append("/".join(_key(d)))
    return [f"policy {pkey}: {len(names)} {role} Deployments for target {target} ({', '.join(sorted(names))}); "
            "at most one may exist" for (pkey, role, target), names in sorted(groups.items()) if len(names) > 1]


def check_orphans(objects: Iterable[Mapping], policies: Mapping[str, Mapping]) -> list[str]:
    """No orphans: every Deployment or Job labelled as ours (``app.kubernetes.io/managed-by``) names
    a policy that exists (one being deleted counts), and when it is in the policy's namespace it has
    an owner reference to that policy (its uid). Clones in other namespaces carry no owner
    reference by design (``builders.build_role_deployment``): the finalizer deletes them by label.
    ``policies``: the live policies by ``namespace/name``."""
    out = []
    for obj in objects:
        if not _ours(obj) or _deleting(obj):
            continue
        labels, ref = _labels(obj), _ref(obj)
        if not labels.get(LABEL_POLICY) or not labels.get(LABEL_POLICY_NAMESPACE):
            out.append(f"{ref}: labelled {LABEL_MANAGED_BY}={MANAGED_BY} but names no policy")
            continue
        pkey = f"{labels[LABEL_POLICY_NAMESPACE]}/{labels[LABEL_POLICY]}"
        policy = policies.get(pkey)
        refs = [r for r in _meta(obj).get("ownerReferences") or [] if r.get("kind") == "LookaheadPolicy"]
        if policy is None:
            out.append(f"{ref}: orphan: its policy {pkey} does not exist")
            continue
        uid = _meta(policy).get("uid")
        if refs and not any(r.get("uid") == uid for r in refs):
            out.append(f"{ref}: orphan: owned by LookaheadPolicy uid {refs[0].get('uid')}, not by the live {pkey} "
                       f"(uid {uid})")
        elif not refs and _key(obj)[0] == labels[LABEL_POLICY_NAMESPACE]:
            out.append(f"{ref}: no owner reference to its policy {pkey} in the same namespace (garbage collection "
                       "would not remove it)")
    return out


def load_job_concurrency(job: Mapping) -> int | None:
    """The ``--concurrency`` a load Job's generator holds in flight (``builders.build_load_job``)."""
    spec = (((job.get("spec") or {}).get("template") or {}).get("spec") or {})
    for c in spec.get("containers") or []:
        argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        for i, a in enumerate(argv):
            if a == "--concurrency" and i + 1 < len(argv):
                return int(argv[i + 1])
            if a.startswith("--concurrency="):
                return int(a.split("=", 1)[1])
    return None


def _job_finished(job: Mapping) -> bool:
    status = job.get("status") or {}
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in status.get("conditions") or [])


def check_load_jobs(jobs: Iterable[Mapping], policies: Mapping[str, Mapping]) -> list[str]:
    """Load never above the configured concurrency per role. For each active load Job (not finished,
    not being deleted): ``parallelism`` is 1 (more would multiply the load); ``--concurrency`` is
    the planned batch size of its step (``lookahead.dev/step`` indexes ``status.progress.batchSizes``)
    and never above the largest planned one (the guard drives planned sizes too); and one active
    Job at most drives each role of a policy (step and guard Jobs alike), so the load on a role is
    one Job's concurrency. ``policies``: the live policies by ``namespace/name``."""
    out = []
    by_role: dict[tuple[str, str, str], list[tuple[str, int]]] = defaultdict(list)
    for job in jobs:
        labels = _labels(job)
        if labels.get(LABEL_ROLE) != "loadgen" or not _ours(job) or _deleting(job) or _job_finished(job):
            continue
        ref = _ref(job, "Job")
        try:
            conc = load_job_concurrency(job)
        except ValueError:
            conc = None
        if conc is None:
            out.append(f"{ref}: a load Job without a numeric --concurrency")
            continue
        par = (job.get("spec") or {}).get("parallelism")
        par = 1 if par is None else int(par)
        load = conc * par
        if par != 1:
            out.append(f"{ref}: parallelism {par}: {par} generators of concurrency {conc} drive "
                       f"{labels.get(LABEL_DRIVES)} at {load} requests")
        pkey = f"{labels.get(LABEL_POLICY_NAMESPACE)}/{labels.get(LABEL_POLICY)}"
        planned = planned_batch_sizes(policies.get(pkey))
        if planned:
            if load > max(planned):
                out.append(f"{ref}: drives {labels.get(LABEL_DRIVES)} at concurrency {load}, above the largest "
                           f"planned batch size {max(planned)} of policy {pkey} ({planned})")
            step = str(labels.get(LABEL_STEP) or "")
            if step.isdigit() and int(step) < len(planned) and conc != planned[int(step)]:
                out.append(f"{ref}: step {step} is batch size {planned[int(step)]} of policy {pkey}, but the Job runs "
                           f"at concurrency {conc}")
        by_role[(pkey, str(labels.get(LABEL_DRIVES)))].append((_key(job)[1], load))
    for (pkey, drives), jobs_ in sorted(by_role.items()):
        if len(jobs_) > 1:
            total = sum(n for _, n in jobs_)
            out.append(f"policy {pkey}: {len(jobs_)} active load Jobs drive {drives} at once "
                       f"({', '.join(sorted(n for n, _ in jobs_))}): {total} requests in flight, above the "
                       f"configured {max(n for _, n in jobs_)}")
    return out


# --- (c) decisions ------------------------------------------------------------------------------------

def check_decision(policy: Mapping, strict: bool = True) -> list[str]:
    """A Promote/PromoteRegimeAware ``status.decision`` needs, at every planned batch size where it
    turns lookahead on (Promote: all; regime-aware: up to the end of its enabled range), a ``Wins``
    row over at least ``load.minSamplesPerStep`` samples per arm (no promotion without Prometheus
    data for the step); and, ``strict`` (the issue's wording), a settled verdict (Wins, NoGain or
    Regresses) at every planned batch size, even those it leaves off."""
    status = policy.get("status") or {}
    decision = status.get("decision") or {}
    action = decision.get("action")
    if action not in PROMOTING_ACTIONS:
        return []
    pkey = policy_key(policy)
    what = f"policy {pkey}: decision {action} ({decision.get('id') or 'no id'})"
    spec = parse_spec(policy)
    if spec is not None and spec.load.mode == "live":
        return check_live_decision(policy, spec, what)
    planned = planned_batch_sizes(policy)
    rows = {int(r.get("batchSize")): r for r in status.get("batches") or [] if r.get("batchSize") is not None}
    if not planned:
        planned = sorted(rows)
    if not planned:
        return [f"{what} without a single planned or measured batch size"]
    need = spec.load.min_samples_per_step if spec is not None else 1
    if action == DecisionAction.Promote.value:
        last_on = max(planned)
    else:
        on = [int(r.get("end")) for r in decision.get("regime") or [] if r.get("enabled")]
        if not on:
            return [f"{what} has no enabled regime range"]
        last_on = max(on)
    out = []
    for size in sorted(planned):
        row = rows.get(size)
        verdict = (row or {}).get("verdict") or "no row"
        if size <= last_on:
            samples = (row or {}).get("samples") or {}
            have = min(int(samples.get("control") or 0), int(samples.get("canary") or 0))
            if verdict != BatchVerdict.Wins.value:
                out.append(f"{what} turns lookahead on at batch size {size} without a Wins verdict there "
                           f"({verdict})")
            elif have < need:
                out.append(f"{what} turns lookahead on at batch size {size} on {have} sample(s) per arm, fewer than "
                           f"load.minSamplesPerStep {need} (no promotion without data)")
        elif strict and verdict not in SETTLED_VERDICTS:
            out.append(f"{what} without a settled verdict at planned batch size {size} ({verdict})")
    return out


def _leans(stratum: Mapping) -> bool:
    """A live stratum still Pending whose latency change favours the canary."""
    change = stratum.get("latencyChange")
    return stratum.get("outcome") == "Pending" and change is not None and float(change) < 0


def check_live_decision(policy: Mapping, spec, what: str) -> list[str]:
    """Live mode's promotion needs, in ``status.live``, a run of ``Wins`` strata (each over at least
    ``load.minSamplesPerStep`` windows, as many paired) from the lowest stratum the traffic visited, and lookahead on
    no further than the control's mean running batch (rounded up) in the busiest of them: a
    promotion is never backed by a Pending stratum or by load it was not measured at. A Pending
    stratum below the run is passed over only where its latency estimate favours the canary (a lower
    load than a measured Win, as one the traffic never reached is)."""
    status = policy.get("status") or {}
    decision = status.get("decision") or {}
    need = spec.load.min_samples_per_step
    strata = [s for s in (status.get("live") or {}).get("strata") or []
              if int(s.get("windows") or 0) >= need and int(s.get("pairs") or 0) >= need]
    if not strata:
        return [f"{what} without a live stratum of {need} windows or more"]
    strata.sort(key=lambda s: float(s.get("offeredLow") or 0))
    lowest = strata[0]
    run = list(itertools.takewhile(lambda s: s.get("outcome") == "Wins", itertools.dropwhile(_leans, strata)))
    if not run:
        return [f"{what} though the lowest live stratum visited is {lowest.get('outcome')} and no run of Wins "
                f"follows it"]
    busiest = max(float(s.get("controlRunning") or 0) for s in run)
    on = [int(r.get("end")) for r in decision.get("regime") or [] if r.get("enabled")]
    if not on:
        return [f"{what} has no enabled regime range"]
    if max(on) > max(1, math.ceil(busiest - 1e-9)):
        return [f"{what} turns lookahead on up to batch size {max(on)}, beyond the control's running batch "
                f"{busiest:.2f} at the busiest winning load"]
    return []


# --- (d) phase transitions --------------------------------------------------------------------------

def check_phase_transition(policy: str, old: str, new: str) -> list[str]:
    """A change of ``status.phase`` from ``old`` to ``new`` is one the state machine can make."""
    if old == new:
        return []
    try:
        edge = (Phase(old), Phase(new))
    except ValueError:
        return [f"policy {policy}: phase {old} -> {new}: not a phase of the state machine"]
    if edge not in ALLOWED_TRANSITIONS:
        return [f"policy {policy}: phase {old} -> {new} is not a transition the state machine makes"]
    return []


# --- the watcher ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Violation:
    at: float          # wall-clock time (time.time()) the violation was first observed
    check: str         # template | saved | roles | orphans | load | decision | transition
    message: str

    def __str__(self) -> str:
        when = datetime.fromtimestamp(self.at, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        return f"{when} [{self.check}] {self.message}"


class _Gone(Exception):
    """A watch answered 410 Gone: list again."""


_KINDS = ("policies", "deployments", "jobs")


class InvariantWatcher(threading.Thread):
    """Watches Deployments, load Jobs and LookaheadPolicies (in ``namespace``, or everywhere) and
    checks the invariants on every event; ``start()``, then ``stop()``, ``violations()``,
    ``assert_clean()``.

    Every request is bounded: lists (connect 1 s, read 2 s), watches (``timeout_seconds`` on the
    server, a read timeout 5 s longer); a watch that ends resumes from the last resourceVersion
    seen, and a 410 Gone lists again (changes in between are unseen: the next phase change of each
    policy is then not checked, and ``events()`` says so). An apiserver that is down (restarted by
    a fault test) is an entry in ``events()``, not a violation: each watch retries with backoff
    (0.2 s doubling to 2 s) until it answers. ``stop()`` shuts the watches' sockets and returns once
    the threads ended, within 2 s.

    ``user_edited(namespace, name, resource_version)`` tells it a test changed a target on purpose
    (the user's change wins: from that version on the template must stay what the user left).
    """

    def __init__(self, api_client, namespace: str | None = None, *, grace_s: float = 3.0,
                 orphan_grace_s: float = 15.0, strict_decisions: bool = True, watch_timeout_s: int = 15,
                 tick_s: float = 0.25):
        super().__init__(name="invariant-watcher", daemon=True)
        from kubernetes import client

        self.api_client = api_client
        self.namespace = namespace
        self.grace_s = grace_s
        self.orphan_grace_s = orphan_grace_s
        self.strict_decisions = strict_decisions
        self.watch_timeout_s = int(watch_timeout_s)
        self.tick_s = tick_s
        self._apps = client.AppsV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._synced = {k: threading.Event() for k in _KINDS}
        self._watches: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self._objects: dict[str, dict[tuple[str, str], dict]] = {k: {} for k in _KINDS}
        # targets: the template before the operator touched them, where it came from, who owns them
        self._originals: dict[tuple[str, str], dict] = {}
        self._original_from: dict[tuple[str, str], str] = {}
        self._owner: dict[tuple[str, str], str] = {}
        self._recent: dict[tuple[str, str], list[tuple[int, dict]]] = defaultdict(list)
        self._user: dict[tuple[str, str], dict] = {}
        self._user_pending: dict[tuple[str, str], int] = {}
        # policies: deleted ones (last body), phase history, (spec, decision) pairs seen, gaps
        self._gone: dict[str, dict] = {}
        self._uids: dict[str, str | None] = {}
        self._phases: dict[str, list[tuple[float, str]]] = {}
        self._decisions: dict[str, dict[str, tuple[dict, dict]]] = defaultdict(dict)
        self._gap: set[str] = set()
        # violations
        self._pending: dict[str, tuple[float, float, str]] = {}   # message -> (monotonic, wall, check)
        self._open: set[str] = set()
        self._violations: list[Violation] = []
        self._events: list[tuple[float, str]] = []
        self.evaluations = 0

    # --- public ---------------------------------------------------------------------------------
    def violations(self) -> list[Violation]:
        with self._lock:
            return list(self._violations)

    def events(self) -> list[tuple[float, str]]:
        """Watch errors, restarts and gaps (wall time, words): never violations."""
        with self._lock:
            return list(self._events)

    def phase_history(self, namespace: str, name: str) -> list[tuple[float, str]]:
        with self._lock:
            return list(self._phases.get(f"{namespace}/{name}", []))

    def original(self, namespace: str, name: str) -> dict | None:
        """The template recorded for a target before the operator touched it."""
        with self._lock:
            t = self._originals.get((namespace, name))
            return copy.deepcopy(t) if t is not None else None

    def seen(self, kind: str, namespace: str, name: str) -> dict | None:
        """The last seen object (``kind``: policies, deployments or jobs), or None."""
        with self._lock:
            obj = self._objects[kind].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def wait_synced(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._synced.values())

    def wait_until(self, condition: Callable[["InvariantWatcher"], Any], timeout: float) -> Any:
        """Poll ``condition(self)`` until truthy (returned) or ``timeout`` (then None)."""
        deadline = time.monotonic() + timeout
        while True:
            got = condition(self)
            if got or time.monotonic() >= deadline:
                return got or None
            time.sleep(0.05)

    def assert_clean(self) -> None:
        found = self.violations()
        if found:
            raise AssertionError(f"{len(found)} invariant violation(s):\n" + "\n".join(f"  {v}" for v in found))

    def user_edited(self, namespace: str, name: str, resource_version: str | int) -> None:
        """A test edited target ``namespace/name`` on purpose; its template as of
        ``resource_version`` (the edit's answer) is what must stay from then on."""
        key, rv = (namespace, name), int(resource_version)
        with self._lock:
            self._user_pending[key] = rv
            self._adopt_user_template(key)
            self._evaluate()

    def stop(self) -> None:
        """Stop watching; returns once every thread ended, or after 2 s."""
        self._stopping.set()
        deadline = time.monotonic() + 2.0
        threads = self._threads + ([self] if self.is_alive() and threading.current_thread() is not self else [])
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            with self._lock:
                watches = list(self._watches.values())
            for w in watches:   # (again and again: a watch may have been between its request and its stream)
                w.stop()
            for t in threads:
                t.join(min(0.1, max(0.0, deadline - time.monotonic())))

    # --- the threads ------------------------------------------------------------------------------
    def run(self) -> None:
        for kind in _KINDS:
            t = threading.Thread(target=self._watch_loop, args=(kind,), name=f"invariant-watch-{kind}", daemon=True)
            self._threads.append(t)
            t.start()
        while not self._stopping.wait(self.tick_s):
            with self._lock:
                self._evaluate()

    def _list_call(self, kind: str) -> Callable[..., Any]:
        ns = self.namespace
        if kind == "deployments":
            return (functools.partial(self._apps.list_namespaced_deployment, ns) if ns
                    else self._apps.list_deployment_for_all_namespaces)
        if kind == "jobs":
            return (functools.partial(self._batch.list_namespaced_job, ns) if ns
                    else self._batch.list_job_for_all_namespaces)
        return (functools.partial(self._custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL) if ns
                else functools.partial(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL))

    def _selector(self, kind: str) -> str | None:
        return f"{LABEL_MANAGED_BY}={MANAGED_BY}" if kind == "jobs" else None

    def _note(self, message: str) -> None:
        with self._lock:
            self._events.append((time.time(), message))
        log.info("%s", message)

    def _watch_loop(self, kind: str) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        rv: str | None = None
        backoff = 0.2
        listed_before = False
        while not self._stopping.is_set():
            try:
                if rv is None:
                    rv = self._relist(kind, gap=listed_before)
                    listed_before, backoff = True, 0.2
                w = watch.Watch()
                with self._lock:
                    self._watches[kind] = w
                if self._stopping.is_set():
                    break
                kwargs = dict(resource_version=rv, timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True,
                              deserialize=False, _request_timeout=(1, self.watch_timeout_s + 5))
                if self._selector(kind):
                    kwargs["label_selector"] = self._selector(kind)
                for event in w.stream(self._list_call(kind), **kwargs):
                    if self._stopping.is_set():
                        break
                    typ, obj = event.get("type"), event.get("object") or {}
                    if typ == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone()
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    backoff = 0.2           # (the apiserver answers again)
                    new_rv = _meta(obj).get("resourceVersion")
                    if new_rv:
                        rv = new_rv
                    if typ == "BOOKMARK":
                        continue
                    self._apply(kind, typ, obj)
                backoff = 0.2
            except _Gone:
                self._note(f"{kind}: watch expired (410 Gone); listing again")
                rv = None
            except ApiException as exc:
                if self._stopping.is_set():
                    break
                if exc.status == 410:
                    self._note(f"{kind}: watch expired (410 Gone); listing again")
                    rv = None
                    continue
                self._note(f"{kind}: watch failed: HTTP {exc.status} {exc.reason}; retrying in {backoff:.1f}s")
                self._stopping.wait(backoff)
                backoff = min(2.0, backoff * 2)
            except Exception as exc:  # noqa: BLE001 - apiserver down or restarting: an event, never a crash
                if self._stopping.is_set():
                    break
                self._note(f"{kind}: watch failed: {type(exc).__name__}: {str(exc)[:200]}; "
                           f"retrying in {backoff:.1f}s")
                self._stopping.wait(backoff)
                backoff = min(2.0, backoff * 2)
            finally:
                with self._lock:
                    self._watches.pop(kind, None)

    def _relist(self, kind: str, gap: bool) -> str:
        kwargs: dict[str, Any] = dict(_preload_content=False, _request_timeout=(1, 2))
        if self._selector(kind):
            kwargs["label_selector"] = self._selector(kind)
        resp = self._list_call(kind)(**kwargs)
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        items = body.get("items") or []
        listed = {_key(o) for o in items}
        with self._lock:
            if gap:
                self._events.append((time.time(), f"{kind}: listed again; changes in between were not seen"))
                if kind == "policies":
                    self._gap |= set(self._objects["policies"]) | {f"{ns}/{n}" for ns, n in listed}
            for key in [k for k in self._objects[kind] if k not in listed]:
                self._apply(kind, "DELETED", self._objects[kind][key])
            for obj in items:
                self._apply(kind, "ADDED" if _key(obj) not in self._objects[kind] else "MODIFIED", obj)
        self._synced[kind].set()
        return (body.get("metadata") or {}).get("resourceVersion") or "0"

    # --- state ------------------------------------------------------------------------------------
    def _apply(self, kind: str, typ: str, obj: dict) -> None:
        with self._lock:
            key = _key(obj)
            if kind == "policies":
                self._on_policy(typ, obj)
            elif kind == "deployments":
                self._on_deployment(typ, obj)
            if typ == "DELETED":
                self._objects[kind].pop(key, None)
            else:
                self._objects[kind][key] = obj
            self._evaluate()

    def _on_policy(self, typ: str, obj: dict) -> None:
        pkey = policy_key(obj)
        uid = _meta(obj).get("uid")
        if typ == "DELETED":
            self._gone[pkey] = obj
            return
        if self._uids.get(pkey) != uid:    # a new policy (or one recreated under the same name)
            self._uids[pkey] = uid
            self._gone.pop(pkey, None)
            self._phases[pkey] = []
            self._decisions.pop(pkey, None)
        history = self._phases.setdefault(pkey, [])
        phase = _phase(obj)
        now = time.time()
        if history and history[-1][1] != phase:
            if pkey in self._gap:
                self._events.append((now, f"policy {pkey}: {history[-1][1]} -> {phase} across a watch gap "
                                          "(not checked)"))
            else:
                for msg in check_phase_transition(pkey, history[-1][1], phase):
                    self._record("transition", msg, now)
        self._gap.discard(pkey)
        if not history or history[-1][1] != phase:
            history.append((now, phase))
        decision = (obj.get("status") or {}).get("decision")
        if decision and decision.get("id"):
            self._decisions[pkey].setdefault(decision["id"], (copy.deepcopy(obj.get("spec") or {}), decision))

    def _on_deployment(self, typ: str, obj: dict) -> None:
        key = _key(obj)
        if typ == "DELETED":
            for d in (self._originals, self._original_from, self._owner, self._recent, self._user, self._user_pending):
                d.pop(key, None)
            return
        if _ours(obj):
            return
        template = (obj.get("spec") or {}).get("template") or {}
        ann = _annotations(obj)
        touched = any(ann.get(a) for a in (ANNOTATION_OWNER, ANNOTATION_ORIGINAL_TEMPLATE, ANNOTATION_PROMOTED))
        if ann.get(ANNOTATION_OWNER):
            self._owner[key] = ann[ANNOTATION_OWNER]
        rv = _meta(obj).get("resourceVersion")
        if rv and str(rv).isdigit():
            recent = self._recent[key]
            recent.append((int(rv), template))
            del recent[:-20]
        if key not in self._originals or (not touched and self._original_from.get(key) == "unclaimed"
                                          and self._associated(key, obj) is None):
            if not touched:
                self._originals[key], self._original_from[key] = copy.deepcopy(template), "unclaimed"
            else:
                saved = builders.original_template(obj) if ann.get(ANNOTATION_ORIGINAL_TEMPLATE) else None
                if saved is not None and key not in self._originals:
                    self._originals[key], self._original_from[key] = saved, "annotation"
                    self._events.append((time.time(), f"Deployment {key[0]}/{key[1]}: first seen already claimed; "
                                                      "its original is taken from the saved annotation"))
        self._adopt_user_template(key)

    def _adopt_user_template(self, key: tuple[str, str]) -> None:
        rv = self._user_pending.get(key)
        if rv is None:
            return
        recent = self._recent.get(key, [])
        exact = [t for r, t in recent if r == rv]
        later = sorted(((r, t) for r, t in recent if r > rv), key=lambda x: x[0])
        if exact or later:
            if not exact:
                self._events.append((time.time(), f"Deployment {key[0]}/{key[1]}: the user's edit (resourceVersion "
                                                  f"{rv}) was not seen; taking version {later[0][0]} as the user's"))
            self._user[key] = copy.deepcopy(exact[0] if exact else later[0][1])
            self._user_pending.pop(key, None)

    def _associated(self, key: tuple[str, str], deployment: Mapping) -> tuple[dict, bool] | None:
        """The policy responsible for a target: its owner (annotation, or the last owner seen), else a
        live policy listing it in status.targets, else one whose selector matches it."""
        live = {policy_key(p): p for p in self._objects["policies"].values()}
        owner = _annotations(deployment).get(ANNOTATION_OWNER) or self._owner.get(key)
        if owner:
            if owner in live:
                return live[owner], False
            if owner in self._gone:
                return self._gone[owner], True
        ns, name = key
        for pkey, p in sorted(live.items()):
            if any(t.get("namespace") == ns and t.get("name") == name
                   for t in (p.get("status") or {}).get("targets") or []):
                return p, False
        for pkey, p in sorted(live.items()):
            if policy_targets(p, deployment):
                self._owner.setdefault(key, pkey)
                return p, False
        return None

    # --- checks -----------------------------------------------------------------------------------
    def _record(self, check: str, message: str, wall: float) -> None:
        self._violations.append(Violation(wall, check, message))
        log.warning("invariant violated: [%s] %s", check, message)

    def _evaluate(self) -> None:
        """All checks over the current state; records what has held for its grace."""
        self.evaluations += 1
        found: dict[str, tuple[str, float]] = {}

        def add(check: str, grace: float, messages: Iterable[str]) -> None:
            for m in messages:
                found.setdefault(m, (check, grace))

        deployments = list(self._objects["deployments"].values())
        jobs = list(self._objects["jobs"].values())
        live = {policy_key(p): p for p in self._objects["policies"].values()}
        add("roles", 0.0, check_role_deployments(deployments))
        add("orphans", self.orphan_grace_s, check_orphans(deployments + jobs, live))
        add("load", self.grace_s, check_load_jobs(jobs, live))
        for p in live.values():
            add("decision", 0.0, check_decision(p, strict=self.strict_decisions))
        for d in deployments:
            key = _key(d)
            if _ours(d) or key in self._user_pending:
                continue
            original = self._originals.get(key)
            if key not in self._user:
                add("saved", 0.0, check_saved_original(d, original))
            found_policy = self._associated(key, d)
            touched = any(_annotations(d).get(a) for a in (ANNOTATION_OWNER, ANNOTATION_ORIGINAL_TEMPLATE,
                                                           ANNOTATION_PROMOTED))
            if found_policy is None and not touched and key not in self._user:
                continue   # not a target of any policy: the user may change it freely
            policy, gone = found_policy if found_policy is not None else (None, False)
            history = list(self._decisions.get(policy_key(policy), {}).values()) if policy is not None else []
            add("template", self.grace_s, check_target_template(d, original, policy, gone=gone, history=history,
                                                                user_template=self._user.get(key)))
        mono, wall = time.monotonic(), time.time()
        for message, (check, grace) in found.items():
            first = self._pending.setdefault(message, (mono, wall, check))
            if message not in self._open and mono - first[0] >= grace:
                self._open.add(message)
                self._record(check, message, first[1])
        for message in [m for m in self._pending if m not in found]:
            del self._pending[message]
            self._open.discard(message)
