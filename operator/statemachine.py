"""The LookaheadPolicy lifecycle as a pure function: what the world looks like -> what to do next.

    Pending -> Preflight -> Launching -> Measuring -> Deciding -> Promoting (wave by wave)
            -> Guarding -> Succeeded
    or RolledBack / NotACandidate / Failed

``reconcile(world)`` reads an ``Observed`` snapshot (the policy, its status, the fleet, the
canary/control pair, and whatever the handler measured for the current step) and returns a
``Plan``: the new status, the actions to carry out, events to post, and when to look again.
Every piece of progress lives in the policy's status (``status.progress``) or in labelled
objects in the cluster, so an operator killed at any instant resumes from the next snapshot:
each action is idempotent (create-if-absent, patch-to-a-value, delete-if-present).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from .conditions import now_rfc3339, set_condition

PENDING, PREFLIGHT, LAUNCHING, MEASURING, DECIDING = "Pending", "Preflight", "Launching", "Measuring", "Deciding"
PROMOTING, GUARDING, SUCCEEDED, ROLLED_BACK = "Promoting", "Guarding", "Succeeded", "RolledBack"
NOT_A_CANDIDATE, FAILED = "NotACandidate", "Failed"
TERMINAL = {SUCCEEDED, ROLLED_BACK, NOT_A_CANDIDATE, FAILED}
# Phases in which the canary and control exist.
WITH_ROLES = {LAUNCHING, MEASURING, DECIDING, PROMOTING, GUARDING}

PROMOTE, PROMOTE_REGIME_AWARE, ROLLBACK, INCONCLUSIVE, NOT_CANDIDATE_ACTION, WAIT = (
    "Promote", "PromoteRegimeAware", "Rollback", "Inconclusive", "NotACandidate", "Wait")


# --- what the handler observed ----------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    namespace: str
    name: str
    engine: str | None = None
    owner: str | None = None          # the policy that claimed it (annotation), if any
    saved: bool = False               # its original template is saved on it
    promoted: str | None = None       # the decision id it was promoted with, if any
    rolled_out: bool = True           # its latest template is fully rolled out and ready

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class StepMeasurement:
    """The statistics of the current measurement step, computed by the handler from Prometheus."""
    row: dict                          # the status.batches row (numbers, intervals, samples, verdict)
    conclusive: bool                   # the sequential test has an answer at the policy's confidence


@dataclass(frozen=True)
class GuardCheck:
    """Promoted pods vs the baseline (control or not-yet-promoted pods) during a wave or the guard."""
    regressed: bool
    message: str
    enough_data: bool = True


@dataclass
class Observed:
    now: datetime
    name: str
    namespace: str
    generation: int
    spec: Any                          # lookahead_operator.models.LookaheadPolicySpec
    status: dict
    spec_error: str | None = None      # validation failure of the stored spec, in words
    targets: list[Target] = field(default_factory=list)
    roles_present: dict[str, bool] = field(default_factory=dict)
    roles_ready: dict[str, bool] = field(default_factory=dict)
    load_jobs_present: set[str] = field(default_factory=set)     # "<step>/<role>"
    preflight: dict | None = None      # preflight result when phase is Preflight
    auto_batch_sizes: list[int] | None = None
    step: StepMeasurement | None = None
    decision: dict | None = None       # the decision computed from status.batches when Deciding
    guard: GuardCheck | None = None
    fingerprint: str = ""              # LookaheadPolicySpec.fingerprint(): what is measured (not `paused`)
    approved_decision: str | None = None     # `kubectl lookahead approve` writes the decision id it approves
    abort_requested: bool = False


# --- what to do ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Action:
    kind: str                          # one of the ACTION_* names below
    args: dict = field(default_factory=dict)


CLAIM, RELEASE, ENSURE_ROLES, DELETE_ROLES = "ClaimTargets", "ReleaseTargets", "EnsureRoles", "DeleteRoles"
ENSURE_LOAD, DELETE_LOAD, PATCH, RESTORE = "EnsureLoadJobs", "DeleteLoadJobs", "PromoteTargets", "RestoreTargets"
ENSURE_GUARD_LOAD = "EnsureGuardLoad"


@dataclass
class Plan:
    status: dict
    actions: list[Action] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)   # (type, reason, message)
    requeue_after: float = 5.0


# --- helpers --------------------------------------------------------------------------------------

def _ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def policy_key(world: Observed) -> str:
    return f"{world.namespace}/{world.name}"


def batch_sizes(world: Observed) -> list[int]:
    configured = world.spec.load.batch_sizes
    if isinstance(configured, list):
        return list(configured)
    return list(world.status.get("progress", {}).get("batchSizes") or world.auto_batch_sizes or [1])


class _Builder:
    """Accumulates the plan for one reconcile pass."""

    def __init__(self, world: Observed):
        self.w = world
        self.status = {k: v for k, v in world.status.items()}
        self.status.setdefault("progress", {})
        self.status["progress"] = dict(self.status["progress"])
        self.actions: list[Action] = []
        self.events: list[tuple[str, str, str]] = []
        self.requeue = 5.0

    @property
    def phase(self) -> str:
        return self.status.get("phase") or PENDING

    @property
    def progress(self) -> dict:
        return self.status["progress"]

    def cond(self, type_: str, ok: bool | str, reason: str, message: str) -> None:
        self.status["conditions"] = set_condition(self.status.get("conditions"), type_, ok, reason, message,
                                                  self.w.generation, self.w.now)

    def go(self, phase: str, reason: str, message: str, warning: bool = False) -> None:
        if phase == self.phase:
            return
        self.events.append(("Warning" if warning else "Normal", reason, f"{self.phase} -> {phase}: {message}"))
        self.status["phase"] = phase
        self.status["message"] = message
        self.progress["phaseSince"] = now_rfc3339(self.w.now)
        ready = phase in TERMINAL
        self.cond("Ready", ready and phase == SUCCEEDED, reason, message)

    def act(self, kind: str, **args: Any) -> None:
        self.actions.append(Action(kind, args))

    def plan(self) -> Plan:
        self.status["observedGeneration"] = self.w.generation if self.phase != PENDING or self.status.get(
            "observedGeneration") is None else self.status["observedGeneration"]
        return Plan(self.status, self.actions, self.events, self.requeue)

    def elapsed(self, key: str) -> float:
        t = _ts(self.progress.get(key))
        return (self.w.now - t).total_seconds() if t else 0.0


def _seconds(value: Any) -> float:
    """A duration from the spec ("2m", a number of seconds, or a timedelta) in seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        from .models import parse_duration
        return parse_duration(value)
    return float(value)


def _percent(value: Any) -> float:
    if isinstance(value, str):
        from .models import parse_percent
        return parse_percent(value)
    return float(value)


# --- the state machine --------------------------------------------------------------------------

def reconcile(world: Observed) -> Plan:
    b = _Builder(world)
    spec = world.spec

    if world.spec_error:
        b.go(FAILED, "InvalidSpec", world.spec_error, warning=True)
        b.cond("Accepted", False, "InvalidSpec", world.spec_error)
        return b.plan()
    if getattr(getattr(spec.load, "mode", None), "value", spec.load.mode) == "live":
        message = ("spec.load.mode: live (canary and control taking a share of the fleet's real traffic) is not "
                   "implemented in this version; use mode: sweep")
        b.cond("Accepted", False, "Unsupported", message)
        b.go(FAILED, "Unsupported", message, warning=True)
        return b.plan()
    b.cond("Accepted", True, "Valid", "the spec is valid")

    # A changed spec restarts measurement: nothing measured under the old spec is mixed in.
    # (The fingerprint leaves out `paused`: pausing and resuming does not restart anything.)
    measured = b.progress.get("fingerprint")
    if measured is not None and measured != world.fingerprint and b.phase not in (PENDING,):
        promoted = [t for t in world.targets if t.promoted]
        if promoted:
            b.act(RESTORE, targets=[t.key for t in promoted])
        b.act(DELETE_LOAD)
        b.act(DELETE_ROLES)
        b.events.append(("Normal", "SpecChanged",
                         f"spec changed (generation {world.generation}): measurement restarts"))
        b.status.update({"batches": [], "crossoverBatchSize": None, "decision": None, "currentWave": None})
        b.status["progress"] = {}
        b.status["phase"] = PENDING
        b.requeue = 1.0
        return b.plan()

    if world.abort_requested and b.phase not in TERMINAL:
        return _roll_back(b, "Aborted", "aborted by `kubectl lookahead abort`")

    if spec.paused and b.phase not in TERMINAL:
        b.cond("Paused", True, "Paused", "spec.paused is true: no action until it is false")
        b.requeue = 30.0
        return b.plan()
    b.cond("Paused", False, "Running", "not paused")

    handler = _PHASES.get(b.phase)
    if handler is None:
        b.requeue = 300.0
        return b.plan()
    handler(b)
    return b.plan()


def _pending(b: _Builder) -> None:
    w = b.w
    me = policy_key(w)
    if not w.targets:
        b.cond("TargetsFound", False, "NoTargets", "no Deployment matches spec.targets yet")
        b.requeue = 15.0
        return
    taken = [t for t in w.targets if t.owner and t.owner != me]
    if taken:
        names = ", ".join(f"{t.namespace}/{t.name} (owned by {t.owner})" for t in taken)
        b.cond("TargetsFound", False, "Conflict",
               f"refused: another LookaheadPolicy owns {names}; a Deployment can be owned by one policy only")
        b.requeue = 30.0
        return
    engines = sorted({t.engine or "unknown" for t in w.targets})
    b.cond("TargetsFound", True, "Found", f"{len(w.targets)} Deployment(s), engine {', '.join(engines)}")
    b.act(CLAIM, targets=[t.key for t in w.targets], owner=me)
    b.progress.update({"fingerprint": w.fingerprint, "startedAt": now_rfc3339(w.now)})
    b.status["targets"] = [{"namespace": t.namespace, "name": t.name, "engine": t.engine, "promoted": False}
                           for t in sorted(w.targets, key=lambda t: t.key)]
    b.go(PREFLIGHT, "TargetsClaimed", f"claimed {len(w.targets)} Deployment(s); checking the workload")
    b.requeue = 0.5


def _preflight(b: _Builder) -> None:
    w = b.w
    if w.preflight is None:
        b.requeue = 2.0
        return
    b.status["preflight"] = w.preflight
    if not w.preflight.get("candidate", True):
        b.act(RELEASE, targets=[t.key for t in w.targets])
        reasons = "; ".join(w.preflight.get("reasons") or [])
        b.status["decision"] = {"action": NOT_CANDIDATE_ACTION, "reason": reasons, "decidedAt": now_rfc3339(w.now)}
        b.go(NOT_A_CANDIDATE, w.preflight.get("verdict", "NotACandidate"), reasons)
        return
    sizes = batch_sizes(b.w) if isinstance(w.spec.load.batch_sizes, list) else (w.auto_batch_sizes or [1])
    b.progress["batchSizes"] = sizes
    b.act(ENSURE_ROLES)
    b.go(LAUNCHING, "CandidateConfirmed",
         f"preflight {w.preflight.get('verdict', 'Unknown')}; launching canary and control; batch sizes {sizes}")
    b.requeue = 1.0


def _launching(b: _Builder) -> None:
    w = b.w
    b.act(ENSURE_ROLES)
    if not all(w.roles_ready.get(r) for r in ("canary", "control")):
        b.cond("RolesReady", False, "Waiting", "waiting for canary and control to be ready")
        b.requeue = 2.0
        return
    b.cond("RolesReady", True, "Ready", "canary and control are ready")
    b.progress.update({"step": 0, "stepStartedAt": now_rfc3339(w.now), "measuringSince": now_rfc3339(w.now)})
    b.status["batches"] = []
    b.go(MEASURING, "Measuring", f"measuring batch size {batch_sizes(w)[0]}")
    b.requeue = 1.0


def _deadline_passed(b: _Builder) -> bool:
    return b.elapsed("measuringSince") >= _seconds(b.w.spec.analysis.deadline)


def _measuring(b: _Builder) -> None:
    w = b.w
    sizes = batch_sizes(w)
    step = int(b.progress.get("step", 0))
    if step >= len(sizes):
        b.go(DECIDING, "Measured", "all batch sizes measured")
        b.requeue = 0.2
        return
    b.act(ENSURE_ROLES)
    if w.spec.load.mode == "sweep":
        b.act(ENSURE_LOAD, step=step, batch_size=sizes[step])
    rows = [r for r in (b.status.get("batches") or []) if r.get("batchSize") != sizes[step]]
    if w.step is not None:
        rows.append(dict(w.step.row))
    b.status["batches"] = sorted(rows, key=lambda r: r["batchSize"])
    if not (w.step is not None and w.step.conclusive) and _deadline_passed(b):
        b.act(DELETE_LOAD)
        b.go(DECIDING, "Deadline", "analysis deadline reached before every batch size had an answer")
        b.requeue = 0.2
        return
    step_done = w.step is not None and w.step.conclusive
    timed_out = b.elapsed("stepStartedAt") >= _seconds(w.spec.load.step_duration)
    if step_done or timed_out:
        b.act(DELETE_LOAD, step=step)
        why = "answer is clear" if step_done else "step duration reached"
        b.events.append(("Normal", "StepDone", f"batch size {sizes[step]}: {why}"))
        b.progress.update({"step": step + 1, "stepStartedAt": now_rfc3339(w.now)})
        if step + 1 >= len(sizes):
            b.go(DECIDING, "Measured", "all batch sizes measured")
        else:
            b.status["message"] = f"measuring batch size {sizes[step + 1]}"
        b.requeue = 0.2
        return
    b.requeue = 2.0


def _deciding(b: _Builder) -> None:
    w = b.w
    if w.decision is None:
        b.requeue = 1.0
        return
    decision = dict(w.decision)
    decision.setdefault("decidedAt", now_rfc3339(w.now))
    decision["id"] = f"{w.fingerprint[:8] or 'g' + str(w.generation)}-{decision['action']}"
    b.status["decision"] = decision
    b.status["crossoverBatchSize"] = decision.get("crossoverBatchSize")
    action = decision["action"]
    b.act(DELETE_LOAD)
    if action == WAIT:
        # Not enough data and the deadline has not passed: measure the unanswered steps again.
        b.progress.update({"step": 0, "stepStartedAt": now_rfc3339(w.now)})
        b.go(MEASURING, "NeedMoreData", decision.get("reason", "not enough data"))
        return
    mode = w.spec.promotion.mode
    if action in (PROMOTE, PROMOTE_REGIME_AWARE) and mode == "analysisOnly":
        b.act(DELETE_ROLES)
        b.act(RELEASE, targets=[t.key for t in w.targets])
        b.go(SUCCEEDED, action, f"{decision['reason']} (promotion.mode analysisOnly: the fleet is not touched)")
        return
    if action in (PROMOTE, PROMOTE_REGIME_AWARE):
        if mode == "full" and action == PROMOTE_REGIME_AWARE:
            b.act(DELETE_ROLES)
            b.act(RELEASE, targets=[t.key for t in w.targets])
            b.go(ROLLED_BACK, "NotPromoted",
                 f"{decision['reason']} promotion.mode is full, so a regime-aware win is not promoted", warning=True)
            return
        approved = w.approved_decision == decision["id"]
        if getattr(w.spec.promotion, "require_approval", False) and not approved:
            b.cond("Approved", False, "AwaitingApproval",
                   f"decision {action}: run `kubectl lookahead approve {w.name} -n {w.namespace}` to promote")
            b.requeue = 10.0
            return
        b.cond("Approved", True, "Approved" if approved else "NotRequired", "promotion may go on")
        b.progress.update({"wave": 0, "waveStartedAt": now_rfc3339(w.now)})
        b.status["currentWave"] = 1
        b.go(PROMOTING, action, decision["reason"])
        b.requeue = 0.2
        return
    # Rollback, Inconclusive, NotACandidate: never promote; the fleet is untouched.
    b.act(DELETE_ROLES)
    b.act(RELEASE, targets=[t.key for t in w.targets])
    if action == INCONCLUSIVE:
        b.go(FAILED, "Inconclusive", decision["reason"], warning=True)
    elif action == NOT_CANDIDATE_ACTION:
        b.go(NOT_A_CANDIDATE, "NotACandidate", decision["reason"])
    else:
        b.go(ROLLED_BACK, "CanaryRegressed", decision["reason"], warning=True)


def _promoting(b: _Builder) -> None:
    from .builders import wave_members

    w = b.w
    waves = [_percent(x) for x in w.spec.promotion.waves]
    wave = int(b.progress.get("wave", 0))
    members = wave_members([t.key for t in w.targets], waves, wave)
    decision_id = (b.status.get("decision") or {}).get("id", "")
    b.status["currentWave"] = wave + 1
    pending = [k for k in members if not any(t.key == k and t.promoted == decision_id for t in w.targets)]
    if pending:
        b.act(PATCH, targets=pending, decision_id=decision_id)
        b.progress["waveStartedAt"] = now_rfc3339(w.now)
        b.events.append(("Normal", "WaveStarted", f"wave {wave + 1}/{len(waves)} ({waves[wave]:g}%): "
                         f"promoting {', '.join(f'{ns}/{n}' for ns, n in pending)}"))
        b.requeue = 1.0
        _mark_promoted(b, members)
        return
    _mark_promoted(b, members)
    if not all(t.rolled_out for t in w.targets if t.key in members):
        b.cond("WaveReady", False, "RollingOut", f"wave {wave + 1}: waiting for the rollout")
        b.requeue = 2.0
        return
    if w.guard is not None and w.guard.regressed:
        _roll_back(b, "GuardRegression", f"wave {wave + 1}: {w.guard.message}")
        return
    _guard_load(b, wave)
    if w.guard is not None:
        b.status["guard"] = {"wave": wave + 1, "message": w.guard.message, "enoughData": w.guard.enough_data}
    wave_guard = _seconds(getattr(w.spec.promotion, "wave_duration", None) or 0)
    if _guard_holds(b, "waveStartedAt", wave_guard, f"wave {wave + 1}"):
        b.cond("WaveReady", True, "Guarding", f"wave {wave + 1} rolled out; guarding it before the next wave")
        return
    if wave + 1 < len(waves):
        b.act(DELETE_LOAD)
        b.progress.update({"wave": wave + 1, "waveStartedAt": now_rfc3339(w.now)})
        b.requeue = 0.2
        return
    b.progress["guardStartedAt"] = now_rfc3339(w.now)
    b.go(GUARDING, "AllWavesPromoted", f"all {len(waves)} waves promoted; guarding for "
         f"{_seconds(w.spec.promotion.guard.duration):g}s")


def _mark_promoted(b: _Builder, members: list[tuple[str, str]]) -> None:
    rows = []
    for row in b.status.get("targets") or []:
        rows.append({**row, "promoted": (row["namespace"], row["name"]) in members})
    b.status["targets"] = rows


def _guard_holds(b: _Builder, since_key: str, duration: float, what: str) -> bool:
    """Whether a wave (or the final guard) must keep watching: until its duration has passed AND
    the comparison has enough data. No data never counts as a pass: past the analysis deadline
    without data the rollout is rolled back (in `_no_guard_data`)."""
    w = b.w
    b.requeue = 2.0
    enough = w.guard is not None and w.guard.enough_data
    if b.elapsed(since_key) < duration:
        return True
    if enough:
        return False
    if b.elapsed(since_key) >= _seconds(w.spec.analysis.deadline):
        _roll_back(b, "GuardNoData", f"{what} had no usable comparison by the analysis deadline "
                                     f"({(w.guard.message if w.guard else 'no guard data')}); not promoting blind")
        return True
    b.cond("GuardData", False, "WaitingForData", f"{what}: waiting for enough guard data before going on")
    return True


def _guard_load(b: _Builder, wave: int) -> None:
    """In sweep mode the guard drives a promoted pod and the control at the largest measured
    batch size, where a throughput regression would show."""
    if b.w.spec.load.mode == "sweep":
        b.act(ENSURE_GUARD_LOAD, wave=wave, batch_size=max(batch_sizes(b.w)))


def _guarding(b: _Builder) -> None:
    w = b.w
    if w.guard is not None and w.guard.regressed:
        _roll_back(b, "GuardRegression", w.guard.message)
        return
    _guard_load(b, int(b.progress.get("wave", 0)))
    if w.guard is not None:
        b.status["guard"] = {"wave": None, "message": w.guard.message, "enoughData": w.guard.enough_data}
    if _guard_holds(b, "guardStartedAt", _seconds(w.spec.promotion.guard.duration), "the guard"):
        return
    b.act(DELETE_ROLES)
    b.act(DELETE_LOAD)
    reason = (b.status.get("decision") or {}).get("reason", "")
    b.go(SUCCEEDED, "GuardPassed", f"guard passed; lookahead stays on. {reason}".strip())


def _roll_back(b: _Builder, reason: str, message: str) -> Plan:
    w = b.w
    b.actions = [a for a in b.actions if a.kind not in (ENSURE_ROLES, ENSURE_LOAD, ENSURE_GUARD_LOAD)]
    promoted = [t.key for t in w.targets if t.promoted]
    if promoted:
        b.act(RESTORE, targets=promoted)
    b.act(DELETE_LOAD)
    b.act(DELETE_ROLES)
    b.act(RELEASE, targets=[t.key for t in w.targets])
    b.status["rollback"] = {"reason": reason, "message": message, "at": now_rfc3339(w.now),
                            "restored": [f"{ns}/{n}" for ns, n in promoted]}
    _mark_promoted(b, [])
    b.go(ROLLED_BACK, reason, message + (f"; restored {len(promoted)} Deployment(s) to their saved templates"
                                          if promoted else "; the fleet was not touched"), warning=True)
    return b.plan()


_PHASES = {
    PENDING: _pending,
    PREFLIGHT: _preflight,
    LAUNCHING: _launching,
    MEASURING: _measuring,
    DECIDING: _deciding,
    PROMOTING: _promoting,
    GUARDING: _guarding,
}
