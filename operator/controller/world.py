"""The world the state machine reads and the plan it returns: plain data, no logic.

``observe`` fills an ``Observed`` (with ``Target``s and ``ReadError``s); ``statemachine.reconcile``
returns a ``Plan`` of ``Action``s; ``actions`` carries them out. Importing these types brings in
none of the controller's logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from lookahead_operator.api.spec import DEFAULT_ROLLOUT_DEADLINE, LookaheadPolicySpec
from lookahead_operator.api.status import Decision, LookaheadPolicyStatus, Phase
from lookahead_operator.measurement.results import (
    GuardCheck,
    GuardPods,
    LiveMeasurement,
    PreflightResult,
    StepMeasurement,
)

#: The phases in which canary and control exist.
WITH_ROLES = frozenset({Phase.Launching, Phase.Measuring, Phase.Deciding, Phase.Promoting, Phase.Guarding})
#: The phases in which targets may be promoted (waves, then the guard).
MID_ROLLOUT = frozenset({Phase.Promoting, Phase.Guarding})


class Need(StrEnum):
    """What the handler must measure before the state machine runs."""

    PREFLIGHT = "Preflight"   # the fleet's own metrics: is it a candidate, which batch sizes
    STEP = "Step"             # canary vs control at the current batch size
    DECISION = "Decision"     # the decision from status.batches (pure)
    GUARD = "Guard"           # a promoted pod vs the control
    LIVE = "Live"             # live mode: canary vs control on the fleet's traffic, per stratum, and the abort


# --- what the handler observed ----------------------------------------------------------------

@dataclass(frozen=True)
class LoadBudget:
    """How long a target's pods may take to become ready, as its own Deployment says
    (``fleet.load_budget_of``, ``fleet.with_load_time``): what the launch and rollout deadlines
    follow when ``promotion.rolloutDeadline`` is unset (``statemachine.clocks``)."""

    probe_s: float | None = None      # the engine container's probe budget (None: it has none)
    probe: str = ""                   # which: "startupProbe", "readinessProbe" or "livenessProbe"
    progress_deadline_s: float = 600.0  # the Deployment's spec.progressDeadlineSeconds (Kubernetes' default)
    measured_s: float | None = None   # the longest load of its current ready pods (None: not read)


@dataclass(frozen=True)
class Target:
    """A target Deployment as the state machine sees it (``fleet.target_of`` reads it)."""

    namespace: str
    name: str
    engine: str | None = None
    owner: str | None = None          # the policy that claimed it (annotation), if any
    owned_by: str | None = None       # its controller in Kubernetes (ownerReferences): "Kind/name (apiVersion)"
    saved: bool = False               # its original template is saved on it
    promoted: str | None = None       # the decision id it was promoted with, if any
    rolled_out: bool = True           # its latest template is fully rolled out and available
    rollout_failed: str | None = None  # the Deployment's own ProgressDeadlineExceeded message, if any
    user_edited: bool = False         # its pod template is not the one our last write left (builders.user_edited)
    replicas: int = 1                 # its fleet replicas: its own plus those lent to its wave Deployment
    lent: int = 0                     # promoted in part: how many replicas run in its wave Deployment (0: none)
    wave_replicas: int | None = None  # its wave Deployment's spec.replicas (None: there is none)
    wave_ready: bool = False          # its wave Deployment is rolled out and available
    load_budget: LoadBudget = field(default_factory=LoadBudget)  # how long its pods may take to load (fleet.py)
    carved: int = 0                   # replicas taken out of it for canary and control (canary.capacity carveOut)
    # its rollout strategy as written (fleet.rollout_unavailable resolves it): Recreate, or the rolling update's bounds
    recreate: bool = False
    max_surge: str = "25%"
    max_unavailable: str = "25%"

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def whole(self) -> bool:
        """Promoted whole: its template is the promoted one (not in part, through a wave Deployment)."""
        return bool(self.promoted) and not self.lent

    @property
    def promoted_pods(self) -> int:
        """How many of its pods run lookahead: all when promoted whole, else those it lent."""
        return self.replicas if self.whole else self.lent if self.promoted else 0


@dataclass(frozen=True)
class ReadError:
    """Something the observer could not read this pass (it is data: no verdict, deadlines still run)."""

    source: str                       # "prometheus"
    message: str


@dataclass
class Observed:
    """One policy's world as one pass sees it: the spec and status, the fleet, canary and control,
    the load Jobs, and what was measured for the current phase."""

    now: datetime
    name: str
    namespace: str
    generation: int
    spec: LookaheadPolicySpec | None
    status: LookaheadPolicyStatus
    spec_error: str | None = None      # why the stored spec cannot be acted on, naming the field
    targets: list[Target] = field(default_factory=list)
    roles_ready: dict[str, bool] = field(default_factory=dict)
    # roles with a pod the scheduler cannot place, with its reason ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu")
    roles_unschedulable: dict[str, str] = field(default_factory=dict)
    roles_scheduled: set[str] = field(default_factory=set)  # roles whose every pod the scheduler placed
    # in Preflight: what one fleet pod takes of each accelerator (nvidia.com/gpu: 2), and the pool's
    # (free, allocatable) of each over the nodes it could run on; or why the pool could not be read
    accelerators: dict[str, int] = field(default_factory=dict)
    pool: dict[str, tuple[int, int]] | None = None
    pool_error: str | None = None
    preflight: PreflightResult | None = None
    step: StepMeasurement | None = None
    decision: Decision | None = None   # computed from status.batches when Deciding
    guard: GuardCheck | None = None
    live: LiveMeasurement | None = None  # live mode, Measuring: this pass's reading
    # live mode, split service: the Service in the fleet's namespace that selects its pods (what the
    # arm pods join), and its selector; or why there is none (a refusal, naming the Service or field)
    live_service: dict | None = None
    live_service_refusal: str | None = None
    # live mode, split gatewayAPI (read in Preflight, Launching, and when an arm is (re)created): the
    # user's HTTPRoute and the fleet's backend (Service or InferencePool) as read now; or why one
    # could not be read: (the spec field it names, the message): missing, or the API's error
    live_route: dict | None = None
    live_backend: dict | None = None
    live_gateway_refusal: tuple[str, str] | None = None
    live_route_gone: bool = False      # the route was read and is not there (a 404, not an error)
    read_errors: list[ReadError] = field(default_factory=list)
    fingerprint: str = ""              # LookaheadPolicySpec.fingerprint(): what is measured (not `paused`)
    approved_decision: str | None = None     # `kubectl lookahead approve` writes the decision id it approves
    abort_requested: bool = False
    support_problems: list[str] = field(default_factory=list)  # what the engine version cannot do
    namespace_refusal: str | None = None  # spec.targets reach namespaces the policy may not touch (why)
    version_wait: str | None = None    # no ready fleet pod yet to read the engine version from (why)
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
    # in Promoting and Guarding: promoted, not-yet-promoted and control pods as the guard compares them
    guard_sides: GuardPods = field(default_factory=GuardPods)
    poll_s: float = 5.0                # how often to look at what only a poll shows (rollouts, guard data)
    # the launch and rollout deadline when neither the policy nor the fleet asks for longer (the
    # operator's LOOKAHEAD_DEFAULT_ROLLOUT_DEADLINE, the chart's operator.defaultRolloutDeadline)
    default_deadline: timedelta = DEFAULT_ROLLOUT_DEADLINE

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --- what to do ---------------------------------------------------------------------------------

class ActionKind(StrEnum):
    """What an action does (``actions.ACTIONS`` carries out each kind)."""

    CLAIM = "ClaimTargets"             # save each target's template and mark it ours
    RELEASE = "ReleaseTargets"         # drop our marks from never-promoted targets
    DISOWN = "DisownTargets"           # drop ownership, keep the saved template (lookahead stays on)
    ENSURE_ROLES = "EnsureRoles"       # canary and control exist
    DELETE_ROLES = "DeleteRoles"      # canary and control; the replicas carved out of ``targets`` for them back
    ENSURE_LOAD = "EnsureLoadJobs"     # the step's load Jobs exist (run-numbered names)
    ENSURE_GUARD_LOAD = "EnsureGuardLoad"
    SERVE_CONTROL = "ServeControl"     # the control's pods join the fleet's Service (production-traffic guard)
    DELETE_LOAD = "DeleteLoadJobs"     # every load Job of the policy
    PROMOTE = "PromoteTargets"         # each target's pods of this wave: whole (template) or in part (wave Deployment)
    DELETE_WAVES = "DeleteWaveDeployments"  # the wave Deployments of the given targets (all: none given)
    RESTORE = "RestoreTargets"         # saved template back, exactly
    LEAVE = "LeaveToUser"              # a target its user edited: drop all our marks, never touch its template
    ENSURE_ARM_BACKENDS = "EnsureArmBackends"  # gatewayAPI: each arm's own Service or InferencePool exists
    SPLIT_ROUTE = "SplitRoute"         # gatewayAPI: the route's rule re-weighted, its backendRefs saved on it
    RESTORE_ROUTE = "RestoreRoute"     # gatewayAPI: the route's rule as saved, the annotation gone (if split)
    DELETE_ARM_BACKENDS = "DeleteArmBackends"  # gatewayAPI: the arms' own Services and InferencePools


@dataclass(frozen=True)
class Action:
    """One idempotent step of a plan, with the arguments its kind reads."""

    kind: ActionKind
    targets: tuple[tuple[str, str], ...] = ()
    step: int | None = None
    batch_size: int | None = None
    run: int | None = None
    wave: int | None = None
    decision_id: str | None = None
    pods: tuple[int, ...] = ()   # PROMOTE: the pods of each of ``targets`` to run lookahead (its replicas: whole)
    until: datetime | None = None  # ENSURE_LOAD: how long the step may measure (step_deadline)
    replicas: int | None = None    # ENSURE_ROLES: replicas per arm (canary.replicas, or live mode's split)
    route: tuple[str, str] | None = None  # SPLIT_ROUTE, RESTORE_ROUTE: the HTTPRoute (namespace, name)


@dataclass
class Plan:
    """What one pass returns: the whole next status, the actions, the events, and when to look again."""

    status: LookaheadPolicyStatus
    actions: list[Action] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)   # (type, reason, message)
    requeue_after: float | None = 5.0  # seconds; None: only when the policy or its objects change
