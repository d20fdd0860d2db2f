"""The LookaheadPolicy lifecycle as a pure function: what the world looks like -> what to do next.

    Pending -> Preflight -> Launching -> Measuring -> Deciding -> Promoting (wave by wave)
            -> Guarding -> Succeeded
    or RolledBack / NotACandidate / Failed

``reconcile(world)`` reads an ``Observed`` snapshot (the parsed spec, the current status model,
the fleet, the canary/control pair, what was measured for the current phase, and what could not
be read) and returns a ``Plan``: the whole next ``LookaheadPolicyStatus``, the actions to carry
out, events to post, and when to look again (``None``: only when something changes).

Rules that hold in every phase:

* Every piece of progress is in the status (``status.progress``) or in labelled objects, so an
  operator killed at any instant resumes from the next snapshot; every action is idempotent.
* Every wait is bounded: Launching and each wave's rollout by ``promotion.rolloutDeadline``,
  Measuring by ``analysis.deadline``, a wave's or the guard's data by ``analysis.deadline``.
  Each deadline ends in an exact state: nothing promoted, or every promoted Deployment restored.
* What could not be read (``Observed.read_errors``) is data: it shows in the ``MetricsAvailable``
  condition, gives no verdict and no guard pass, and the deadlines above still fire. Missing
  data never promotes.
* Paused means frozen: the load stops, nothing else is done, every clock stops; on resume the
  clocks are shifted by the pause and the interrupted step or guard load starts afresh.
* Which measurement each phase needs is declared here (``NEEDS``); the handler reads it.
* A target whose pod template its user edited after the claim (``Target.user_edited``) is left to
  them: recorded in ``status.targets`` (``userEdited``) and the ``TargetsEdited`` condition,
  released (our annotations only), and never promoted or restored again by this rollout; the rest
  of the rollout goes on with the other targets (``left_to_user``, docs/operator.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from lookahead_operator.controller import conditions
from lookahead_operator.controller.conditions import Fact
from lookahead_operator.api.models import (
    TERMINAL_PHASES,
    BatchResult,
    ConditionType,
    Decision,
    DecisionAction,
    GuardLeg,
    GuardStatus,
    LookaheadPolicySpec,
    LookaheadPolicyStatus,
    Phase,
    PreflightStatus,
    Progress,
    RollbackStatus,
    TargetStatus,
)

C = ConditionType
WITH_ROLES = frozenset({Phase.Launching, Phase.Measuring, Phase.Deciding, Phase.Promoting, Phase.Guarding})
MID_ROLLOUT = frozenset({Phase.Promoting, Phase.Guarding})


class Need(StrEnum):
    """What the handler must measure before the state machine runs."""

    PREFLIGHT = "Preflight"   # the fleet's own metrics: is it a candidate, which batch sizes
    STEP = "Step"             # canary vs control at the current batch size
    DECISION = "Decision"     # the decision from status.batches (pure)
    GUARD = "Guard"           # a promoted pod vs the control


#: Which measurement each phase needs (phases not listed need none).
NEEDS: dict[Phase, Need] = {
    Phase.Preflight: Need.PREFLIGHT,
    Phase.Measuring: Need.STEP,
    Phase.Deciding: Need.DECISION,
    Phase.Promoting: Need.GUARD,
    Phase.Guarding: Need.GUARD,
}


# --- what the handler observed ----------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    namespace: str
    name: str
    engine: str | None = None
    owner: str | None = None          # the policy that claimed it (annotation), if any
    saved: bool = False               # its original template is saved on it
    promoted: str | None = None       # the decision id it was promoted with, if any
    rolled_out: bool = True           # its latest template is fully rolled out and available
    rollout_failed: str | None = None  # the Deployment's own ProgressDeadlineExceeded message, if any
    user_edited: bool = False         # its pod template is not the one our last write left (builders.user_edited)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class StepMeasurement:
    """The statistics of the current measurement step, computed from Prometheus."""
    row: BatchResult                  # the status.batches row (numbers, intervals, samples, verdict)
    conclusive: bool                  # the sequential test has an answer at the policy's confidence


@dataclass(frozen=True)
class GuardCheck:
    """Promoted pods vs the control during a wave or the guard."""
    regressed: bool
    message: str
    enough_data: bool = True


@dataclass(frozen=True)
class PreflightResult:
    status: PreflightStatus           # candidate, verdict, reasons
    batch_sizes: list[int]            # the sweep to measure (the spec's, or auto from the fleet)


@dataclass(frozen=True)
class ReadError:
    source: str                       # "prometheus"
    message: str


@dataclass
class Observed:
    now: datetime
    name: str
    namespace: str
    generation: int
    spec: LookaheadPolicySpec | None
    status: LookaheadPolicyStatus
    spec_error: str | None = None      # why the stored spec cannot be acted on, naming the field
    targets: list[Target] = field(default_factory=list)
    roles_ready: dict[str, bool] = field(default_factory=dict)
    preflight: PreflightResult | None = None
    step: StepMeasurement | None = None
    decision: Decision | None = None   # computed from status.batches when Deciding
    guard: GuardCheck | None = None
    read_errors: list[ReadError] = field(default_factory=list)
    fingerprint: str = ""              # LookaheadPolicySpec.fingerprint(): what is measured (not `paused`)
    approved_decision: str | None = None     # `kubectl lookahead approve` writes the decision id it approves
    abort_requested: bool = False
    support_problems: list[str] = field(default_factory=list)  # what the engine version cannot do
    roles_present: dict[str, bool] = field(default_factory=dict)
    roles_namespace: str | None = None  # where canary and control are (or are to be created)
    # load Jobs of status.progress.loadRun that have a running (ready) pod, by the role each drives
    load_running: set[str] = field(default_factory=set)
    # roles whose current load Job drives a pod that is gone (its load reaches nothing)
    load_pods_gone: set[str] = field(default_factory=set)
    # roles whose current load Job has ended (its pod exited)
    load_finished: set[str] = field(default_factory=set)
    # in Promoting and Guarding: the pods of the target promoted last, which the guard drives
    guard_pods: list[dict] = field(default_factory=list)
    poll_s: float = 5.0                # how often to look at what only a poll shows (rollouts, guard data)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --- what to do ---------------------------------------------------------------------------------

class ActionKind(StrEnum):
    CLAIM = "ClaimTargets"             # save each target's template and mark it ours
    RELEASE = "ReleaseTargets"         # drop our marks from never-promoted targets
    DISOWN = "DisownTargets"           # drop ownership, keep the saved template (lookahead stays on)
    ENSURE_ROLES = "EnsureRoles"       # canary and control exist
    DELETE_ROLES = "DeleteRoles"
    ENSURE_LOAD = "EnsureLoadJobs"     # the step's load Jobs exist (run-numbered names)
    ENSURE_GUARD_LOAD = "EnsureGuardLoad"
    DELETE_LOAD = "DeleteLoadJobs"     # every load Job of the policy
    PROMOTE = "PromoteTargets"
    RESTORE = "RestoreTargets"         # saved template back, exactly
    LEAVE = "LeaveToUser"              # a target its user edited: drop all our marks, never touch its template


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    targets: tuple[tuple[str, str], ...] = ()
    step: int | None = None
    batch_size: int | None = None
    run: int | None = None
    wave: int | None = None
    decision_id: str | None = None
    until: datetime | None = None  # ENSURE_LOAD: how long the step may measure (step_deadline)


@dataclass
class Plan:
    status: LookaheadPolicyStatus
    actions: list[Action] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)   # (type, reason, message)
    requeue_after: float | None = 5.0  # seconds; None: only when the policy or its objects change


def transition_message(old: Phase, new: Phase, message: str) -> str:
    """A phase change's Event message: ``Pending -> Preflight: <why>`` (``kubectl describe``
    shows Events without the status they moved)."""
    return f"{old} -> {new}: {message}"


_TRANSITION = re.compile(rf"^(?:{'|'.join(Phase)}) -> (?:{'|'.join(Phase)}): ")


def without_transition(message: str) -> str:
    """An Event message without the phase change ``transition_message`` put before it (the
    operator's log states that change on a line of its own)."""
    return _TRANSITION.sub("", message, count=1)


# --- one pass -----------------------------------------------------------------------------------

class _Pass:
    """Accumulates the plan of one reconcile pass."""

    def __init__(self, world: Observed):
        self.w = world
        self.s = world.status.model_copy(deep=True)
        self.facts: dict[ConditionType, Fact] = {}
        self.actions: list[Action] = []
        self.events: list[tuple[str, str, str]] = []
        self.requeue: float | None = 5.0
        self.left = left_to_user(world)   # targets left to their users: never promoted or restored
        self.noted = False                # _note_user_edits ran in this pass
        self.ignore_guard = False         # the guard's load restarted in this pass: its check is stale

    @property
    def p(self):
        return self.s.progress

    @property
    def phase(self) -> Phase:
        return self.s.phase

    @property
    def spec(self) -> LookaheadPolicySpec:
        assert self.w.spec is not None
        return self.w.spec

    def fact(self, type_: ConditionType, ok: bool, reason: str, message: str) -> None:
        self.facts[type_] = Fact(ok, reason, message)

    def go(self, phase: Phase, reason: str, message: str, warning: bool = False) -> None:
        if phase == self.phase:
            return
        self.events.append(("Warning" if warning else "Normal", reason, transition_message(self.phase, phase, message)))
        self.s.phase = phase
        self.s.message = message
        self.p.phase_since = self.w.now

    def act(self, kind: ActionKind, **kw) -> None:
        if "targets" in kw:
            kw["targets"] = tuple(sorted(kw["targets"]))
        self.actions.append(Action(kind, **kw))

    def since(self, t: datetime | None) -> timedelta:
        return self.w.now - t if t is not None else timedelta(0)

    def wait(self, seconds: float | None) -> None:
        self.requeue = seconds

    def plan(self) -> Plan:
        if self.phase in TERMINAL_PHASES:
            self.requeue = None
        if self.phase != Phase.Pending or self.s.observed_generation is None:
            self.s.observed_generation = self.w.generation
        self.s.conditions = conditions.derive(self.s.conditions, self.facts, self.phase, self.s.message or "",
                                              self.w.generation, self.w.now)
        return Plan(self.s, self.actions, self.events, self.requeue)


def _seconds(td: timedelta) -> float:
    return max(0.0, td.total_seconds())


# --- the state machine --------------------------------------------------------------------------

def reconcile(world: Observed) -> Plan:
    b = _Pass(world)
    if world.spec is None or world.spec_error:
        return _refuse(b, "InvalidSpec", world.spec_error or "the spec could not be parsed")
    spec = world.spec
    if spec.load.mode == "live":
        return _refuse(b, "Unsupported", "spec.load.mode: live (canary and control taking a share of the fleet's "
                                         "real traffic) is not implemented in this version; use mode: sweep")
    if world.support_problems and b.phase in (Phase.Pending, Phase.Preflight):
        return _refuse(b, "EngineUnsupported", "; ".join(world.support_problems))
    b.fact(C.Accepted, True, "Valid", "the spec is valid")
    if b.phase not in (Phase.Pending, *TERMINAL_PHASES) and b.s.targets:
        _leave_new_targets_alone(b)

    # A changed spec restarts measurement: nothing measured under the old spec is mixed in.
    # (The fingerprint leaves out `paused`: pausing and resuming does not restart anything.)
    measured = b.p.fingerprint
    if measured is not None and b.phase != Phase.Pending:
        if measured == world.fingerprint:
            b.p.fingerprint_generation = world.generation
        elif b.p.fingerprint_generation is not None and b.p.fingerprint_generation == world.generation:
            # No write to the spec since it last hashed the same (the apiserver bumps the
            # generation on every spec write): the new hash comes from a default this CRD or
            # operator version adds, not from the user. Adopt it; restart nothing.
            b.p.fingerprint = world.fingerprint
            b.events.append(("Normal", "SpecDefaulted", "the spec reads with a new default (a CRD or operator "
                                                        "upgrade) and no change of its own: measurement goes on"))
        else:
            return _restart(b)

    if world.abort_requested and b.phase not in TERMINAL_PHASES:
        _roll_back(b, "Aborted", "aborted by `kubectl lookahead abort`")
        return b.plan()

    if b.phase not in TERMINAL_PHASES and _paused(b):
        return b.plan()

    if world.read_errors:
        b.p.read_errors = (b.p.read_errors or 0) + 1
        b.fact(C.MetricsAvailable, False, "ReadFailed",
               "; ".join(f"{e.source}: {e.message}" for e in world.read_errors)
               + f" ({b.p.read_errors} pass(es) in a row; deadlines still apply, nothing is promoted without data)")
    elif b.phase in NEEDS and NEEDS[b.phase] is not Need.DECISION:
        b.p.read_errors = None
        b.fact(C.MetricsAvailable, True, "Read", "Prometheus answered")

    if b.phase not in TERMINAL_PHASES and b.phase != Phase.Pending and b.left:
        _note_user_edits(b)
        if not in_play(world):
            _stop(b, Phase.Failed, "UserEdited",
                  f"every target was edited by its user mid-rollout and is left to them "
                  f"({', '.join(f'{ns}/{n}' for ns, n in sorted(b.left))}); nothing is left to roll out")
            return b.plan()

    handler = _PHASES.get(b.phase)
    if handler is not None:
        handler(b)
    return b.plan()


def _leave_new_targets_alone(b: _Pass) -> None:
    """A rollout acts on the Deployments it claimed (``status.targets``) and on no other. One that
    starts matching ``spec.targets`` mid-rollout was not part of the preflight or of the plan the
    waves were cut from: it is left alone (never claimed, promoted or restored) and named in
    TargetsFound; a change to the spec restarts the rollout, which then includes it. (A claimed
    target that stops matching stays ours to put back: observe keeps it.)"""
    claimed = {(t.namespace, t.name) for t in b.s.targets or []}
    new = [t for t in b.w.targets if t.key not in claimed and t.owner != b.w.key]
    if not new:
        return
    b.w = replace(b.w, targets=[t for t in b.w.targets if t not in new])
    names = ", ".join(f"{t.namespace}/{t.name}" for t in new[:10]) + (" ..." if len(new) > 10 else "")
    b.fact(C.TargetsFound, True, "NewTargetsLeftAlone",
           f"{names} matched spec.targets after this rollout claimed its targets: left alone (not measured, "
           f"not promoted); change the spec to restart the rollout with them")


def _refuse(b: _Pass, reason: str, message: str) -> Plan:
    """The spec cannot be acted on: say so, and leave the cluster exact (restore anything promoted)."""
    b.fact(C.Accepted, False, reason, message)
    started = b.phase not in TERMINAL_PHASES and b.phase != Phase.Pending
    if started or any(t.promoted for t in b.w.targets if t.owner == b.w.key):
        _clean_up(b)
    b.go(Phase.Failed, reason, message, warning=True)
    return b.plan()


def _restart(b: _Pass) -> Plan:
    w = b.w
    # (a target its user edited is not restored: the new rollout's claim saves its template as it is)
    promoted = [t.key for t in w.targets if t.promoted and t.owner == w.key and t.key not in b.left]
    if promoted:
        b.act(ActionKind.RESTORE, targets=promoted)
    b.act(ActionKind.DELETE_LOAD)
    b.act(ActionKind.DELETE_ROLES)
    b.events.append(("Normal", "SpecChanged", f"spec changed (generation {w.generation}): measurement restarts"))
    b.s = LookaheadPolicyStatus(phase=Phase.Pending, message="spec changed: measurement restarts",
                                conditions=[c for c in b.s.conditions or [] if c.type != C.TargetsEdited] or None,
                                observed_generation=w.generation)
    b.wait(0)
    return b.plan()


def _paused(b: _Pass) -> bool:
    """Pause and resume. Returns True while paused (nothing else happens in this pass)."""
    w, p = b.w, b.p
    if w.spec.paused:
        if p.paused_at is None:
            p.paused_at = w.now
            b.act(ActionKind.DELETE_LOAD)
            b.events.append(("Normal", "Paused", f"paused in {b.phase}: load stopped, clocks frozen"))
        b.fact(C.Paused, True, "Paused", "spec.paused is true: no action, clocks frozen, until it is false")
        b.wait(None)
        return True
    if p.paused_at is not None:
        gap = w.now - p.paused_at
        for name in ("phase_since", "step_started_at", "measuring_since", "wave_started_at", "guard_started_at",
                     "guard_leg_started_at"):
            if getattr(p, name) is not None:
                setattr(p, name, getattr(p, name) + gap)
        if b.phase == Phase.Measuring:
            p.step_started_at = w.now       # the interrupted step is measured afresh
        _new_load_run(p)                    # fresh load Jobs, never beside the old ones
        p.paused_at = None
        b.events.append(("Normal", "Resumed", f"resumed after {_seconds(gap):.0f}s; clocks shifted by the pause"))
    b.fact(C.Paused, False, "Running", "not paused")
    return False


# --- targets their users edited ------------------------------------------------------------------

def recorded_user_edits(status: LookaheadPolicyStatus) -> frozenset[tuple[str, str]]:
    """The targets whose ``status.targets`` row says ``userEdited``: left to their users earlier."""
    return frozenset((r.namespace, r.name) for r in status.targets or [] if r.user_edited)


def edited_now(targets: list[Target], me: str) -> list[tuple[str, str]]:
    """The targets owned by policy ``me`` whose pod template their user edited since our last
    write (``Target.user_edited``), in the order given."""
    return [t.key for t in targets if t.owner == me and t.user_edited]


def left_to_user(world: Observed) -> frozenset[tuple[str, str]]:
    """The targets left to their users in this rollout: recorded in ``status.targets`` as
    ``userEdited`` (``recorded_user_edits``), or seen now owned by this policy with a pod template
    its user edited (``edited_now``). None in Pending: nothing was rolled out yet, and the claim
    saves the template as it is then (an edit before the claim is simply part of the original)."""
    if world.status.phase == Phase.Pending:
        return frozenset()
    return recorded_user_edits(world.status) | frozenset(edited_now(world.targets, world.key))


def in_play(world: Observed) -> list[Target]:
    """The targets the rollout still acts on (every target but those ``left_to_user``)."""
    left = left_to_user(world)
    return [t for t in world.targets if t.key not in left]


def role_source(world: Observed) -> Target | None:
    """The target whose pod template canary and control are cloned from: the first, in a stable
    order, of the targets still in play (so never one whose template its user replaced), else of
    all targets."""
    pool = in_play(world) or world.targets
    return min(pool, key=lambda t: t.key) if pool else None


def _note_user_edits(b: _Pass) -> None:
    """Leave the targets their users edited to them (once per pass): each one still carrying our
    marks is released (``LEAVE``: annotations only), its ``status.targets`` row says ``userEdited``
    (and no longer promoted: it is not in our care), and ``TargetsEdited`` names them all. When the
    promoted target the guard drives is among the new ones, the guard's load and clock start afresh
    (on the newest promoted target still in play): its pods are being replaced by the user's."""
    if b.noted or not b.left:
        return
    b.noted = True
    w, p = b.w, b.p
    recorded = recorded_user_edits(w.status)
    ours = edited_now(w.targets, w.key)
    if ours:
        b.act(ActionKind.LEAVE, targets=ours)
    engines = {t.key: t.engine for t in w.targets}
    rows = {(r.namespace, r.name): r for r in b.s.targets or []}
    for key in b.left:
        row = rows.get(key) or TargetStatus(namespace=key[0], name=key[1], engine=engines.get(key))
        rows[key] = row.model_copy(update={"user_edited": True, "promoted": False, "wave": None})
    b.s.targets = [rows[k] for k in sorted(rows)]
    names = ", ".join(f"{ns}/{n}" for ns, n in sorted(b.left))
    b.fact(C.TargetsEdited, True, "UserEdited",
           f"left to their users, whose edits of the pod template win (not promoted, not restored, released): "
           f"{names}")
    new = b.left - recorded
    if not new:
        return
    b.events.append(("Warning", "UserEdited", "pod template edited by its user mid-rollout; left to them: "
                     + ", ".join(f"{ns}/{n}" for ns, n in sorted(new))))
    driven = max((t.key for t in w.targets if t.promoted and t.key not in recorded), default=None)
    if b.phase in MID_ROLLOUT and driven in new:
        b.act(ActionKind.DELETE_LOAD)
        _new_load_run(p)
        _reset_guard_legs(b)
        if b.phase == Phase.Promoting:
            p.wave_started_at = w.now
        else:
            p.guard_started_at = w.now
        b.ignore_guard = True


def _pending(b: _Pass) -> None:
    w = b.w
    if not w.targets:
        b.fact(C.TargetsFound, False, "NoTargets", "no Deployment matches spec.targets yet")
        b.wait(b.w.poll_s)
        return
    taken = [t for t in w.targets if t.owner and t.owner != w.key]
    if taken:
        names = ", ".join(f"{t.namespace}/{t.name} (owned by {t.owner})" for t in taken)
        b.fact(C.TargetsFound, False, "Conflict",
               f"refused: another LookaheadPolicy owns {names}; a Deployment can be owned by one policy only")
        b.wait(b.w.poll_s)
        return
    engines = sorted({t.engine or "unknown" for t in w.targets})
    b.fact(C.TargetsFound, True, "Found", f"{len(w.targets)} Deployment(s), engine {', '.join(engines)}")
    b.act(ActionKind.CLAIM, targets=[t.key for t in w.targets])
    b.p.fingerprint, b.p.fingerprint_generation = w.fingerprint, w.generation
    b.p.started_at = w.now
    b.s.targets = [TargetStatus(namespace=t.namespace, name=t.name, engine=t.engine, promoted=False)
                   for t in sorted(w.targets, key=lambda t: t.key)]
    b.go(Phase.Preflight, "TargetsClaimed", f"claimed {len(w.targets)} Deployment(s); checking the workload")
    b.wait(0)


def _preflight(b: _Pass) -> None:
    w, spec = b.w, b.spec
    if w.preflight is None:
        b.wait(b.w.poll_s)
        return
    b.s.preflight = w.preflight.status
    if not w.preflight.status.candidate:
        b.act(ActionKind.RELEASE, targets=[t.key for t in w.targets])
        reasons = "; ".join(w.preflight.status.reasons or []) or "preflight said no"
        b.s.decision = Decision(action=DecisionAction.NotACandidate, reason=reasons, decided_at=w.now)
        b.go(Phase.NotACandidate, w.preflight.status.verdict or "NotACandidate", reasons)
        return
    sizes = list(spec.load.batch_sizes or w.preflight.batch_sizes or [1])
    fit = max(1, int(spec.analysis.deadline / spec.load.step_duration))
    note = ""
    if len(sizes) > fit:  # auto sizes: measure what the deadline leaves room for, smallest first
        note = f" (auto batch sizes {sizes} cut to {sizes[:fit]}: analysis.deadline fits {fit} steps)"
        sizes = sizes[:fit]
    b.p.batch_sizes = sizes
    b.act(ActionKind.ENSURE_ROLES)
    b.go(Phase.Launching, "CandidateConfirmed",
         f"preflight {w.preflight.status.verdict or 'Unknown'}; launching canary and control; batch sizes "
         f"{sizes}{note}")
    b.wait(b.w.poll_s)


def _launching(b: _Pass) -> None:
    w, spec = b.w, b.spec
    b.act(ActionKind.ENSURE_ROLES)
    if not all(w.roles_ready.get(r) for r in ("canary", "control")):
        limit = spec.promotion.rollout_deadline
        if b.since(b.p.phase_since) >= limit:
            _stop(b, Phase.Failed, "CanaryNotReady",
                  f"canary and control were not ready within promotion.rolloutDeadline ({_seconds(limit):g}s); "
                  "they were deleted and the fleet was not touched")
            return
        b.fact(C.RolesReady, False, "Waiting", "waiting for canary and control to be ready")
        b.wait(b.w.poll_s)
        return
    b.fact(C.RolesReady, True, "Ready", "canary and control are ready")
    b.p.step, b.p.step_started_at, b.p.measuring_since = 0, w.now, w.now
    _new_load_run(b.p)
    b.s.batches = []
    b.go(Phase.Measuring, "Measuring", f"measuring batch size {b.p.batch_sizes[0]}")
    b.wait(0)


def _measuring(b: _Pass) -> None:
    w, spec, p = b.w, b.spec, b.p
    sizes = p.batch_sizes or [1]
    step = p.step or 0
    if step >= len(sizes):
        b.go(Phase.Deciding, "Measured", "all batch sizes measured")
        b.wait(0)
        return
    b.act(ActionKind.ENSURE_ROLES)
    b.fact(C.RolesReady, all(w.roles_ready.get(r) for r in ("canary", "control")),
           "Ready" if all(w.roles_ready.get(r) for r in ("canary", "control")) else "NotReady",
           "canary and control are ready" if all(w.roles_ready.get(r) for r in ("canary", "control"))
           else "a canary or control pod is not ready: its samples are missing")
    until = step_deadline(spec, len(sizes), step, p.measuring_since or w.now)
    b.act(ActionKind.ENSURE_LOAD, step=step, batch_size=sizes[step], run=p.load_run or 0, until=until)
    if w.step is not None:
        rows = [r for r in b.s.batches or [] if r.batch_size != sizes[step]] + [w.step.row]
        b.s.batches = sorted(rows, key=lambda r: r.batch_size)
    conclusive = w.step is not None and w.step.conclusive
    if not conclusive and b.since(p.measuring_since) >= spec.analysis.deadline:
        b.act(ActionKind.DELETE_LOAD)
        b.go(Phase.Deciding, "Deadline", "analysis deadline reached before every batch size had an answer")
        b.wait(0)
        return
    if w.load_pods_gone & {"canary", "control"}:
        # The pod a load Job drives (by IP) was deleted or replaced: that role's new pod gets no
        # load, and its windows would read as stalls. The step starts again on fresh load Jobs,
        # aimed at the pods there are now; what was measured of it is not used (the step measures
        # from the new loadStartedAt). The analysis deadline still bounds it.
        gone = ", ".join(sorted(w.load_pods_gone & {"canary", "control"}))
        b.act(ActionKind.DELETE_LOAD)
        _new_load_run(p)
        b.events.append(("Warning", "LoadRestarted", f"batch size {sizes[step]}: the {gone} pod the load drove is "
                                                     f"gone; the step starts again on fresh load"))
        b.s.message = f"batch size {sizes[step]}: the {gone} pod was replaced; the step's load restarts"
        b.wait(b.w.poll_s)
        return
    if not _load_started(b, ("canary", "control")):
        # A load pod still pending (unschedulable, pulling): its role is not driven yet, and windows
        # without load are no evidence (they would read as stalls). Nothing is measured, and the
        # step's clock does not run, until both run; the analysis deadline still bounds the wait.
        b.s.message = (f"batch size {sizes[step]}: waiting for the load Jobs' pods (canary and control) "
                       f"to run")
        b.wait(b.w.poll_s)
        return
    elapsed = b.since(p.load_started_at)
    timed_out = elapsed >= spec.load.step_duration
    if timed_out and not conclusive and _starved(w.step, spec):
        # No usable data yet (Prometheus down, pods not serving): the step waits for data rather
        # than ending empty; the analysis deadline still bounds it.
        b.s.message = (f"batch size {sizes[step]}: step duration reached without enough samples "
                       f"(need {spec.load.min_samples_per_step} per role); waiting for data until the deadline")
        timed_out = False
    elif timed_out and not conclusive and w.now < until:
        # Data, but no answer yet: the (anytime-valid) test keeps sampling, on its share of the
        # deadline and the time the steps before left, time the deadline allows anyway
        # (docs/statistics.md).
        b.s.message = (f"batch size {sizes[step]}: no clear answer at stepDuration; measuring on for up to "
                       f"{_seconds(until - w.now):.0f}s more (its share of analysis.deadline and what the "
                       f"batch sizes before it left)")
        timed_out = False
    if conclusive or timed_out:
        b.act(ActionKind.DELETE_LOAD)
        why = "answer is clear" if conclusive else "step duration reached"
        b.events.append(("Normal", "StepDone", f"batch size {sizes[step]}: {why}"))
        p.step, p.step_started_at = step + 1, w.now
        _new_load_run(p)
        if step + 1 >= len(sizes):
            b.go(Phase.Deciding, "Measured", "all batch sizes measured")
        else:
            b.s.message = f"measuring batch size {sizes[step + 1]}"
        b.wait(0)
        return
    # Look again when the next sample window closes (or a clock runs out, if sooner).
    left = min(spec.analysis.deadline - b.since(p.measuring_since), spec.analysis.sample_interval)
    b.wait(max(0.5, _seconds(left)))


def _new_load_run(p: Progress) -> None:
    """Fresh load Jobs (a new run number in their names); what they measure starts once they run."""
    p.load_run = (p.load_run or 0) + 1
    p.load_started_at = None


def _load_started(b: _Pass, roles: tuple[str, ...]) -> bool:
    """Whether the current run's load Jobs, one per role in ``roles``, all have a running pod; the
    first pass that sees it records when (``status.progress.loadStartedAt``): measurement counts
    from there, so a load pod that is pending (unschedulable, pulling its image) never shows as a
    role that stalled. ``Observed.load_running`` is of the run this pass began with: after a new
    run in this same pass (a user's edit of the guarded target restarts its load) it says nothing
    of the new run's Jobs, which do not exist yet."""
    p = b.p
    observed_run = b.w.status.progress.load_run
    if p.load_started_at is None and p.load_run == observed_run and set(roles) <= b.w.load_running:
        p.load_started_at = b.w.now
    return p.load_started_at is not None


def step_deadline(spec: LookaheadPolicySpec, planned: int, step: int, measuring_since: datetime) -> datetime:
    """Until when step ``step`` (0-based, of ``planned``) measures on while its answer is unclear:
    the end of its equal share of the analysis deadline counted from when measuring began, so the
    time the steps before it left by settling early goes to it, and it never takes from the steps
    after it: each may measure to the end of its share (deadline / planned sizes) on that one
    clock. Time lost between steps (load pods starting) comes off the step that follows, where the
    analysis deadline used to take it off the last one. A step always measures its own
    stepDuration, even past this (a step before it waited on pods)."""
    return measuring_since + spec.analysis.deadline * (min(step, planned - 1) + 1) / max(1, planned)


def _starved(step: StepMeasurement | None, spec: LookaheadPolicySpec) -> bool:
    samples = step.row.samples if step is not None else None
    if samples is None:
        return True
    return min(samples.control or 0, samples.canary or 0) < spec.load.min_samples_per_step


def _deciding(b: _Pass) -> None:
    w, spec = b.w, b.spec
    if w.decision is None:
        b.wait(b.w.poll_s)
        return
    d = w.decision.model_copy(update={"decided_at": w.now,
                                      "id": f"{w.fingerprint[:8] or 'g' + str(w.generation)}-{w.decision.action}"})
    b.s.decision = d
    b.s.crossover_batch_size = d.crossover_batch_size
    b.act(ActionKind.DELETE_LOAD)
    action, mode = d.action, spec.promotion.mode
    if action in (DecisionAction.Promote, DecisionAction.PromoteRegimeAware):
        if mode == "analysisOnly":
            _stop(b, Phase.Succeeded, str(action),
                  f"{d.reason} (promotion.mode analysisOnly: the fleet is not touched)", warning=False)
            return
        if mode == "full" and action == DecisionAction.PromoteRegimeAware:
            _stop(b, Phase.RolledBack, "NotPromoted",
                  f"{d.reason} promotion.mode is full, so a regime-aware win is not promoted")
            return
        approved = w.approved_decision == d.id
        if spec.promotion.require_approval and not approved:
            b.fact(C.Approved, False, "AwaitingApproval",
                   f"decision {action}: run `kubectl lookahead approve {w.name} -n {w.namespace}` to promote")
            b.wait(None)
            return
        b.fact(C.Approved, True, "Approved" if approved else "NotRequired", "promotion may go on")
        b.p.wave, b.p.wave_started_at = 0, w.now
        _new_load_run(b.p)
        _reset_guard_legs(b)
        b.s.current_wave = 1
        b.go(Phase.Promoting, str(action), d.reason)
        b.wait(0)
        return
    # Rollback, Inconclusive, NotACandidate: never promote; the fleet is untouched.
    if action == DecisionAction.Inconclusive:
        _stop(b, Phase.Failed, "Inconclusive", d.reason)
    elif action == DecisionAction.NotACandidate:
        _stop(b, Phase.NotACandidate, "NotACandidate", d.reason, warning=False)
    else:
        _stop(b, Phase.RolledBack, "CanaryRegressed", d.reason)


def _promoting(b: _Pass) -> None:
    from lookahead_operator.controller.builders import wave_members

    w, spec, p = b.w, b.spec, b.p
    waves = spec.promotion.waves
    wave = p.wave or 0
    # Waves keep their positions over the whole fleet; a target left to its user is skipped in its wave.
    members = [k for k in wave_members([t.key for t in w.targets], waves, wave) if k not in b.left]
    decision_id = b.s.decision.id if b.s.decision else ""
    b.s.current_wave = wave + 1
    if not members and wave + 1 < len(waves):
        # (waves are cumulative: nothing of ours changed in this wave, so there is nothing to guard)
        b.events.append(("Normal", "WaveSkipped", f"wave {wave + 1}/{len(waves)}: every target of it is left to "
                                                  "its user"))
        b.act(ActionKind.DELETE_LOAD)
        p.wave, p.wave_started_at = wave + 1, w.now
        _new_load_run(p)
        _reset_guard_legs(b)
        b.wait(0)
        return
    broken = [t for t in w.targets if t.key in members and t.promoted and t.rollout_failed]
    if broken:
        t = broken[0]
        _roll_back(b, "RolloutFailed", f"wave {wave + 1}: {t.namespace}/{t.name} did not roll out "
                                       f"({t.rollout_failed})")
        return
    pending = [k for k in members if not any(t.key == k and t.promoted == decision_id for t in w.targets)]
    _mark_promoted(b, members, wave)
    if pending:
        b.act(ActionKind.PROMOTE, targets=pending, decision_id=decision_id)
        p.wave_started_at = w.now
        b.events.append(("Normal", "WaveStarted", f"wave {wave + 1}/{len(waves)} ({waves[wave]}%): "
                         f"promoting {', '.join(f'{ns}/{n}' for ns, n in pending)}"))
        b.wait(b.w.poll_s)
        return
    if not all(t.rolled_out for t in w.targets if t.key in members):
        limit = spec.promotion.rollout_deadline
        if b.since(p.wave_started_at) >= limit:
            late = [f"{t.namespace}/{t.name}" for t in w.targets if t.key in members and not t.rolled_out]
            _roll_back(b, "RolloutTimeout", f"wave {wave + 1}: {', '.join(late)} not available within "
                                            f"promotion.rolloutDeadline ({_seconds(limit):g}s)")
            return
        b.fact(C.WaveReady, False, "RollingOut", f"wave {wave + 1}: waiting for the rollout")
        b.wait(b.w.poll_s)
        return
    if _guard_legs(b, wave, wave + 1, p.wave_started_at, spec.promotion.wave_duration, f"wave {wave + 1}"):
        return
    b.fact(C.WaveReady, True, "Passed", f"wave {wave + 1} rolled out and passed its guard")
    if wave + 1 < len(waves):
        b.act(ActionKind.DELETE_LOAD)
        p.wave, p.wave_started_at = wave + 1, w.now
        _new_load_run(p)
        _reset_guard_legs(b)
        b.wait(0)
        return
    p.guard_started_at = w.now
    _new_load_run(p)
    _reset_guard_legs(b)
    b.act(ActionKind.DELETE_LOAD)
    b.go(Phase.Guarding, "AllWavesPromoted", f"all {len(waves)} waves promoted; guarding for "
         f"{_seconds(spec.promotion.guard.duration):g}s")
    b.wait(0)


def _mark_promoted(b: _Pass, members: list[tuple[str, str]], wave: int) -> None:
    rows = []
    for row in b.s.targets or []:
        if row.user_edited:
            rows.append(row)
            continue
        on = (row.namespace, row.name) in members
        rows.append(row.model_copy(update={"promoted": on, "wave": (row.wave or wave + 1) if on else None}))
    b.s.targets = rows


def _must_keep_guarding(b: _Pass, check: GuardCheck | None, since: datetime | None, duration: timedelta,
                        what: str) -> bool:
    """Whether a wave (or the final guard) must keep watching at one batch size: until its duration
    has passed AND the comparison has enough data. No data never counts as a pass: without data by
    the analysis deadline the rollout is rolled back. Returns True when the pass is over (waiting or
    rolled back)."""
    enough = check is not None and check.enough_data
    b.fact(C.GuardData, enough, "Enough" if enough else "WaitingForData",
           check.message if check is not None else f"{what}: no guard comparison yet")
    if b.since(since) < duration:
        if b.phase == Phase.Promoting:
            b.fact(C.WaveReady, True, "Guarding", f"{what} rolled out; guarding it")
        b.wait(b.w.poll_s)
        return True
    if enough:
        return False
    if b.since(since) >= b.spec.analysis.deadline:
        _roll_back(b, "GuardNoData", f"{what} had no usable comparison by the analysis deadline "
                                     f"({check.message if check else 'no guard data'}); not promoting blind")
        return True
    b.wait(b.w.poll_s)
    return True


def _measured(row: BatchResult) -> bool:
    s = row.samples
    return s is not None and (s.control or 0) > 0 and (s.canary or 0) > 0


def guard_batch_sizes(status: LookaheadPolicyStatus) -> list[tuple[int, bool]]:
    """The batch sizes the guard drives, one after the other, each with whether the promoted config
    has lookahead on there (pure; ``measure.guard`` reads the same list).

    * A full promotion (lookahead on everywhere): the largest planned batch size, where a throughput
      regression would show.
    * A regime-aware promotion (lookahead on for 1..W, off above): the largest batch size measured
      as a win at or below W -- inside the regime that changed -- and the smallest measured batch size
      above W (the crossover, where the pods must have switched lookahead off), if one was measured.
      The largest planned size alone would sit where a regime-aware pod runs exactly as before.
    """
    planned = status.progress.batch_sizes or [r.batch_size for r in status.batches or []] or [1]
    d = status.decision
    on = [r.end for r in (d.regime or []) if r.enabled] if d is not None else []
    if d is None or d.action != DecisionAction.PromoteRegimeAware or not on:
        return [(max(planned), True)]
    last_on = max(on)
    rows = [r for r in status.batches or [] if _measured(r)]
    wins = [r.batch_size for r in rows if r.batch_size <= last_on and r.verdict == "Wins"]
    above = [r.batch_size for r in rows if r.batch_size > last_on]
    legs = [(max(wins) if wins else last_on, True)]
    if above:
        legs.append((min(above), False))
    return legs


def _reset_guard_legs(b: _Pass) -> None:
    """A wave (or the final guard) starts its guard from the first batch size."""
    b.p.guard_leg, b.p.guard_leg_started_at = None, None


def _guard_legs(b: _Pass, wave: int, status_wave: int | None, since: datetime | None, duration: timedelta,
                what: str) -> bool:
    """Guard a wave (or, ``status_wave`` None, the final guard): the promoted pod and the control are
    driven at each of ``guard_batch_sizes`` in turn, each for its share of ``duration`` and until its
    comparison has enough data; a regression at any of them rolls back, naming the batch size.
    Returns True while the pass is over (guarding, moved to the next batch size, or rolled back),
    False once every batch size has passed."""
    w, p = b.w, b.p
    legs = guard_batch_sizes(b.s)
    i = min(p.guard_leg or 0, len(legs) - 1)
    size, lookahead = legs[i]
    where = f"batch size {size}" + ("" if len(legs) == 1 else
                                    f" ({'inside' if lookahead else 'above'} the lookahead range)")
    check = replace(w.guard, message=f"{where}: {w.guard.message}") \
        if w.guard is not None and not b.ignore_guard else None
    if check is not None and check.regressed:
        _roll_back(b, "GuardRegression", (f"{what}, " if status_wave is not None else "") + check.message)
        return True
    label = _label_of(what, where, legs)
    guarded = {"promoted", "control"}
    gone = w.load_pods_gone & guarded
    ended = set() if check is not None and check.enough_data else w.load_finished & guarded
    if (gone or ended) and not b.ignore_guard:
        # The pod a guard Job drives was deleted or replaced (a promoted pod's Deployment made a new
        # one, a node was drained), or its Job ended before the comparison had its data (an outage
        # of Prometheus outlasted the load): that role gets no load any more, and waiting would end
        # in a rollback for want of data. The guard's load starts again on fresh Jobs, aimed at the
        # pods there are now, and compares from when they run; the analysis deadline still bounds it.
        why = ", ".join(f"the {r} pod it drove is gone" for r in sorted(gone)) or \
            f"the {' and '.join(sorted(ended))} load ended before enough data"
        b.act(ActionKind.DELETE_LOAD)
        _new_load_run(p)
        b.events.append(("Warning", "LoadRestarted", f"{label}: {why}; the guard's load starts again"))
        b.s.message = f"{label}: {why}; the guard's load restarts"
        b.wait(b.w.poll_s)
        return True
    b.act(ActionKind.ENSURE_GUARD_LOAD, wave=wave, batch_size=size, run=p.load_run or 0)
    _load_started(b, ("promoted", "control"))   # measure.guard compares from then on
    b.s.guard = _guard_status(b, check, status_wave, legs, i)
    if _must_keep_guarding(b, check, p.guard_leg_started_at or since, duration / len(legs), label):
        return True
    if i + 1 < len(legs):
        b.events.append(("Normal", "GuardBatchPassed",
                         f"{label}: passed; guarding batch size {legs[i + 1][0]} next"))
        b.act(ActionKind.DELETE_LOAD)
        p.guard_leg, p.guard_leg_started_at = i + 1, w.now
        _new_load_run(p)
        b.s.guard = _guard_status(b, None, status_wave, legs, i + 1)
        b.wait(0)
        return True
    return False


def _label_of(what: str, where: str, legs: list[tuple[int, bool]]) -> str:
    """How a guard names itself in messages: ``wave 2`` or ``wave 2 at batch size 1 (...)``."""
    return what if len(legs) == 1 else f"{what} at {where}"


def _guard_status(b: _Pass, check: GuardCheck | None, status_wave: int | None, legs: list[tuple[int, bool]],
                  i: int) -> GuardStatus:
    """status.guard: the comparison at the batch size being driven (``legs[i]``), and what each batch
    size of this guard showed so far (those before ``i`` passed)."""
    old = b.s.guard
    same = old is not None and old.wave == status_wave
    before = {leg.batch_size: leg for leg in (old.legs or [])} if same else {}
    rows = []
    for j, (size, on) in enumerate(legs):
        prev = before.get(size)
        message = check.message if j == i and check is not None else prev.message if prev is not None else ""
        state = "Passed" if j < i else "Guarding" if j == i else "Pending"
        rows.append(GuardLeg(batch_size=size, lookahead=on, state=state, message=message))
    if check is None and same and old.batch_size == legs[i][0]:
        return old.model_copy(update={"legs": rows})
    return GuardStatus(wave=status_wave, message=check.message if check else "",
                       enough_data=bool(check and check.enough_data), batch_size=legs[i][0], legs=rows)


def _guarding(b: _Pass) -> None:
    spec = b.spec
    if _guard_legs(b, b.p.wave or 0, None, b.p.guard_started_at, spec.promotion.guard.duration, "the guard"):
        return
    reason = b.s.decision.reason if b.s.decision else ""
    b.act(ActionKind.DELETE_ROLES)
    b.act(ActionKind.DELETE_LOAD)
    b.go(Phase.Succeeded, "GuardPassed", f"guard passed; lookahead stays on. {reason}".strip())


def _clean_up(b: _Pass) -> list[tuple[str, str]]:
    """Put the cluster back exactly: promoted targets restored, our objects deleted, targets released.
    Targets left to their users are not restored (their user's template stays) but released.
    Returns what was restored."""
    w = b.w
    b.actions = [a for a in b.actions if a.kind not in (ActionKind.ENSURE_ROLES, ActionKind.ENSURE_LOAD,
                                                         ActionKind.ENSURE_GUARD_LOAD, ActionKind.PROMOTE)]
    _note_user_edits(b)
    promoted = [t.key for t in w.targets if t.owner == w.key and t.promoted and t.key not in b.left]
    if promoted:
        b.act(ActionKind.RESTORE, targets=promoted)
    b.act(ActionKind.DELETE_LOAD)
    b.act(ActionKind.DELETE_ROLES)
    # (the handler releases only what this policy owns and never drops a promoted one's saved template)
    rest = [t.key for t in w.targets if t.key not in b.left]
    if rest:
        b.act(ActionKind.RELEASE, targets=rest)
    b.s.targets = [r.model_copy(update={"promoted": False}) for r in b.s.targets or []] or None
    return promoted


def _stop(b: _Pass, phase: Phase, reason: str, message: str, warning: bool = True) -> None:
    """End in ``phase`` with the fleet as it was (nothing promoted may remain)."""
    restored = _clean_up(b)
    if restored:
        message += f"; restored {len(restored)} Deployment(s) to their saved templates"
    b.go(phase, reason, message, warning=warning)


def _roll_back(b: _Pass, reason: str, message: str) -> None:
    restored = _clean_up(b)
    b.s.rollback = RollbackStatus(reason=reason, message=message, at=b.w.now,
                                  restored=[f"{ns}/{n}" for ns, n in restored] or None)
    b.go(Phase.RolledBack, reason, message + (f"; restored {len(restored)} Deployment(s) to their saved templates"
                                               if restored else "; the fleet was not touched"), warning=True)


_PHASES = {
    Phase.Pending: _pending,
    Phase.Preflight: _preflight,
    Phase.Launching: _launching,
    Phase.Measuring: _measuring,
    Phase.Deciding: _deciding,
    Phase.Promoting: _promoting,
    Phase.Guarding: _guarding,
}


# --- deletion -------------------------------------------------------------------------------------

def deletion_plan(status: LookaheadPolicyStatus, targets: list[Target], me: str) -> list[Action]:
    """What deleting a policy does (pure): its canary, control and load Jobs go. Mid-rollout
    (Promoting or Guarding) promoted Deployments are restored to their saved templates, since no
    guard will watch them any more; after Succeeded lookahead stays on and only our ownership mark
    goes (the saved template stays, to put back by hand); never-promoted targets are released.
    A target whose pod template its user edited (now, or recorded in ``status.targets``) is never
    restored: all our marks go and its template stays the user's."""
    left = recorded_user_edits(status) | frozenset(edited_now(targets, me))
    ours = [t for t in targets if t.owner == me]
    edited = [t.key for t in ours if t.key in left]
    ours = [t for t in ours if t.key not in edited]
    promoted = [t.key for t in ours if t.promoted]
    plan = [Action(ActionKind.DELETE_LOAD), Action(ActionKind.DELETE_ROLES)]
    if edited:
        plan.append(Action(ActionKind.LEAVE, targets=tuple(sorted(edited))))
    if promoted and status.phase in MID_ROLLOUT | {Phase.Pending, Phase.Preflight, Phase.Launching,
                                                   Phase.Measuring, Phase.Deciding}:
        plan.append(Action(ActionKind.RESTORE, targets=tuple(sorted(promoted))))
    elif promoted:
        plan.append(Action(ActionKind.DISOWN, targets=tuple(sorted(promoted))))
    rest = [t.key for t in ours if not t.promoted]
    if rest:
        plan.append(Action(ActionKind.RELEASE, targets=tuple(sorted(rest))))
    return plan
