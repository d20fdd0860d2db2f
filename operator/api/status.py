"""The status of a LookaheadPolicy: what the operator writes back, whole, on every pass.

The phase (``Phase``, ``TERMINAL_PHASES``) and the conditions, the preflight, the targets and the
objects created, the per-batch-size table (``BatchResult``, with its ``BatchVerdict``), the
``Decision``, the waves, the gates as seen, the guard and the rollback, and ``Progress``: the state
machine's bookkeeping, what a restarted operator resumes from. Status models ignore keys they do
not know (``StatusModel``): a newer operator may have written more.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Optional

from pydantic import Field

from lookahead_operator.api.schema import (
    CONDITION_REASON_PATTERN,
    CONDITION_TYPE_PATTERN,
    MAX_BATCH_SIZES,
    MAX_MESSAGE,
    MAX_SHORT,
    MAX_TARGETS,
    MAX_URL,
    FreeForm,
    StatusModel,
    Timestamp,
)


class Phase(StrEnum):
    Pending = "Pending"
    Preflight = "Preflight"
    Launching = "Launching"
    Measuring = "Measuring"
    Deciding = "Deciding"
    Promoting = "Promoting"
    Guarding = "Guarding"
    Succeeded = "Succeeded"
    RolledBack = "RolledBack"
    NotACandidate = "NotACandidate"
    Failed = "Failed"


TERMINAL_PHASES = frozenset({Phase.Succeeded, Phase.RolledBack, Phase.NotACandidate, Phase.Failed})


class ConditionStatus(StrEnum):
    true = "True"
    false = "False"
    unknown = "Unknown"


class ConditionType(StrEnum):
    """Every condition type the operator sets, and no other (``lookahead_operator.controller.conditions``
    derives them from the phase and what one reconcile pass found)."""

    Accepted = "Accepted"            # the spec is valid and can be acted on
    TargetsFound = "TargetsFound"    # Deployments match spec.targets and no other policy owns them
    TargetsEdited = "TargetsEdited"  # targets whose pod template their user changed mid-rollout: left to them
    RolesReady = "RolesReady"        # canary and control are up
    CapacityAvailable = "CapacityAvailable"  # the scheduler can place canary and control (False: CapacityUnavailable)
    MetricsAvailable = "MetricsAvailable"  # Prometheus answered the last read
    Approved = "Approved"            # promotion may go on (or no approval is required)
    WaveReady = "WaveReady"          # the current wave rolled out and is being guarded
    GuardData = "GuardData"          # the guard has enough data to judge
    Paused = "Paused"                # spec.paused
    Reconciled = "Reconciled"        # the last pass's actions were carried out
    Ready = "Ready"                  # Succeeded: lookahead is on where it pays
    CanaryHealthy = "CanaryHealthy"  # live mode: the canary serving users is within analysis.abort (False: aborted)


class Condition(StatusModel):
    """A condition in the Kubernetes API convention (metav1.Condition)."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN, description="CamelCase type, e.g. Accepted.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN,
                        description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="Human-readable details.")
    last_transition_time: Timestamp = Field(description="When status last changed.")
    observed_generation: Optional[int] = Field(default=None, ge=0,
                                               description="metadata.generation the condition was set for.")


class BatchVerdict(StrEnum):
    """Per batch size (the values of ``lookahead_operator.measurement.decision.BatchOutcome``, plus Inconclusive)."""

    Pending = "Pending"            # still measuring
    Wins = "Wins"                  # per-token latency better by >= minLatencyImprovement, throughput within bound
    NoGain = "NoGain"              # latency did not improve by minLatencyImprovement
    Regresses = "Regresses"        # batched throughput fell by more than maxThroughputRegression
    Inconclusive = "Inconclusive"  # not enough evidence by the deadline


class RoleSamples(StatusModel):
    control: Optional[int] = Field(default=None, ge=0)
    canary: Optional[int] = Field(default=None, ge=0)


class StallIntervals(StatusModel):
    control: int = Field(default=0, ge=0)
    canary: int = Field(default=0, ge=0)


class DroppedIntervals(StatusModel):
    latency: int = Field(default=0, ge=0)
    throughput: int = Field(default=0, ge=0)


class BatchResult(StatusModel):
    """One row of the per-batch-size table: control vs canary at one concurrency
    (what ``lookahead_operator.measurement.verdict.BatchComparison.to_status`` writes).

    Changes are relative, canary vs control, as fractions (``tpotChange: -0.37`` = per-token
    latency 37 % lower); intervals are ``[low, high]`` of that change at ``confidence``.
    """

    batch_size: int = Field(ge=1, description="Concurrent requests.")
    control_tpot_ms: Optional[float] = Field(default=None, description="Control per-token latency, ms.")
    canary_tpot_ms: Optional[float] = Field(default=None, description="Canary per-token latency, ms.")
    tpot_change: Optional[float] = Field(default=None, description="Canary vs control TPOT change, fraction (-0.37 = 37% lower).")
    tpot_interval: Optional[list[float]] = Field(default=None, min_length=2, max_length=2,
                                                 description="Confidence interval [low, high] of tpotChange.")
    control_tokens_per_second: Optional[float] = Field(default=None, description="Control generated tokens per second.")
    canary_tokens_per_second: Optional[float] = Field(default=None, description="Canary generated tokens per second.")
    throughput_change: Optional[float] = Field(default=None, description="Canary vs control throughput change, fraction.")
    throughput_interval: Optional[list[float]] = Field(default=None, min_length=2, max_length=2,
                                                       description="Confidence interval [low, high] of throughputChange.")
    acceptance_rate: Optional[float] = Field(default=None, ge=0, le=1,
                                             description="Accepted / proposed draft tokens on the canary.")
    mean_acceptance_length: Optional[float] = Field(
        default=None, ge=0,
        description="Canary tokens per verification step, bonus token included: 1 + accepted / drafts.")
    acceptance_by_position: Optional[list[float]] = Field(
        default=None, max_length=64,
        description="Canary per-position acceptance: index k is the share of drafts whose k-th token was accepted "
                    "(vllm:spec_decode_num_accepted_tokens_per_pos_total / drafts).")
    samples: Optional[RoleSamples] = Field(default=None, description="Samples per role behind this row.")
    confidence: Optional[float] = Field(default=None, ge=0, le=1, description="Confidence of the intervals.")
    latency_verdict: Optional[str] = Field(default=None, max_length=64,
                                           description="Better, Worse, Equivalent or NotEnoughData (measurement.stats.Verdict).")
    throughput_verdict: Optional[str] = Field(default=None, max_length=64,
                                              description="Better, Worse, Equivalent or NotEnoughData (measurement.stats.Verdict).")
    verdict: BatchVerdict = Field(default=BatchVerdict.Pending)
    paired: Optional[bool] = Field(default=None, description="Canary and control compared window by window.")
    stall_intervals: Optional[StallIntervals] = Field(
        default=None, description="Sample windows in which only one arm produced no tokens (counted against it).")
    dropped_intervals: Optional[DroppedIntervals] = Field(
        default=None, description="Sample windows without a value in either arm, per metric.")
    latency_samples: Optional[int] = Field(default=None, ge=0, description="Paired per-token latency windows.")
    throughput_samples: Optional[int] = Field(default=None, ge=0, description="Paired throughput windows.")
    tail_verdict: Optional[str] = Field(
        default=None, max_length=64,
        description="Tail per-token latency (p95/p99 from the histogram buckets), canary vs control: Worse (a veto: "
                    "the row Regresses), Equivalent, Better or NotEnoughData (measurement.stats.TailComparison).")
    tail_threshold: Optional[float] = Field(default=None, ge=0,
                                            description="analysis.maxTailLatencyRegression, fraction (1.0 = 100%).")
    control_p95_ms: Optional[float] = Field(default=None, description="Control p95 per-token latency, ms (histogram_quantile).")
    canary_p95_ms: Optional[float] = Field(default=None, description="Canary p95 per-token latency, ms (histogram_quantile).")
    control_p99_ms: Optional[float] = Field(default=None, description="Control p99 per-token latency, ms (histogram_quantile).")
    canary_p99_ms: Optional[float] = Field(default=None, description="Canary p99 per-token latency, ms (histogram_quantile).")
    tail: Optional[FreeForm] = Field(
        default=None, description="The whole tail comparison at full precision (measurement.stats.TailComparison.to_dict: "
                                  "per quantile the point estimates, the certified bucket bounds, the verdict), "
                                  "so a restarted operator rebuilds the same veto.")


class DecisionAction(StrEnum):
    """The values of ``lookahead_operator.measurement.rules.Move``."""

    Promote = "Promote"                        # lookahead on at every batch size
    PromoteRegimeAware = "PromoteRegimeAware"  # on below the crossover batch size
    Rollback = "Rollback"                      # lookahead pays nowhere (or the guard saw a regression)
    NotACandidate = "NotACandidate"            # preflight said no
    Inconclusive = "Inconclusive"              # deadline passed without a clear answer: do not promote
    Wait = "Wait"                              # not decided yet


class RegimeRange(StatusModel):
    """Lookahead on (``enabled``) or off for running batch sizes ``start..end`` (inclusive)."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    enabled: bool


class Decision(StatusModel):
    """``lookahead_operator.measurement.decision.Ruling.to_dict()`` plus when, an id and the promoted config."""

    id: Optional[str] = Field(default=None, max_length=64,
                              description="Identifies this decision (generation and action).")
    action: DecisionAction
    reason: str = Field(max_length=MAX_MESSAGE, description="The reason in words, with the numbers.")
    decided_at: Optional[Timestamp] = None
    crossover_batch_size: Optional[int] = Field(default=None, ge=0,
                                                description="Smallest measured batch size at which lookahead stops paying.")
    regime: Optional[list[RegimeRange]] = Field(default=None, description="Where lookahead stays on (regimeAware).")
    outcomes: Optional[dict[str, str]] = Field(default=None, description="Batch size -> outcome.")
    config: Optional[FreeForm] = Field(default=None, description="The engine config to promote (adapter-specific).")
    evidence: Optional[FreeForm] = Field(default=None, description="Every value behind the decision.")


class WaveState(StrEnum):
    Pending = "Pending"
    Promoting = "Promoting"
    Guarding = "Guarding"
    Passed = "Passed"
    Failed = "Failed"
    RolledBack = "RolledBack"


class WaveStatus(StatusModel):
    index: int = Field(ge=1, description="1-based wave number.")
    percent: int = Field(ge=1, le=100, description="Cumulative share of the fleet by the end of this wave.")
    state: WaveState = WaveState.Pending
    targets: Optional[list[str]] = Field(default=None, max_length=MAX_TARGETS, description="namespace/name promoted in this wave.")
    started_at: Optional[Timestamp] = None
    finished_at: Optional[Timestamp] = None
    throughput_change: Optional[float] = Field(default=None, description="Guard: promoted vs unpromoted, percent.")
    message: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)


class PreflightStatus(StatusModel):
    candidate: Optional[bool] = Field(default=None, description="Is the workload a lookahead candidate at all.")
    verdict: Optional[str] = Field(default=None, max_length=MAX_SHORT, description="The verdict in a word or two.")
    reasons: Optional[list[str]] = Field(default=None, description="Why, with the numbers.")
    missing: Optional[list[str]] = Field(default=None, description="Metrics that were not available (e.g. DCGM SM_ACTIVE).")
    signals: Optional[dict[str, float]] = Field(
        default=None, description="The numbers read, by signal (DCGM counters as fractions 0..1, seconds, running "
                                  "requests as runningP50/P90/P99).")
    batch_sizes: Optional[list[int]] = Field(default=None, description="Batch sizes to measure (auto: from running-request quantiles).")
    checked_at: Optional[Timestamp] = None


class TargetStatus(StatusModel):
    namespace: str
    name: str
    engine: Optional[str] = Field(default=None, description="The engine detected or given.")
    promoted: bool = False
    wave: Optional[int] = Field(default=None, ge=1, description="The wave that promoted it (the first of its pods).")
    replicas: Optional[int] = Field(default=None, ge=0, description="Its serving replicas: its own plus those "
                                    "lent to its wave Deployment.")
    promoted_pods: Optional[int] = Field(default=None, ge=0, description="How many of its replicas run lookahead "
                                         "(replica waves: fewer than replicas while promoted in part).")
    saved_template: Optional[FreeForm] = Field(default=None, description="The pod template before the first patch.")
    user_edited: Optional[bool] = Field(
        default=None, description="Its pod template was changed by someone else mid-rollout: the user's change wins; "
                                  "the operator released it and neither promotes nor restores it.")


class WorkloadRef(StatusModel):
    """An object the operator created (canary, control, load Job)."""

    kind: str
    namespace: str
    name: str
    role: str
    target: Optional[str] = None


class Gates(StatusModel):
    """What the operator saw of the gates (see the module docstring of lookahead_operator.api.policy)."""

    paused: Optional[bool] = None
    awaiting_approval: Optional[bool] = None
    approved: Optional[bool] = None
    approved_generation: Optional[int] = Field(default=None, ge=0, description="The generation the approval named.")
    approved_at: Optional[Timestamp] = None
    aborted: Optional[bool] = None
    abort_reason: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)


class Progress(StatusModel):
    """The state machine's bookkeeping: what a restarted operator resumes from. Every clock here
    is frozen while the policy is paused (shifted by the pause's length on resume)."""

    fingerprint: Optional[str] = Field(default=None, max_length=64,
                                       description="LookaheadPolicySpec.fingerprint() being acted on.")
    fingerprint_generation: Optional[int] = Field(
        default=None, ge=0, description="metadata.generation at which the spec last hashed to fingerprint: a new "
                                        "hash at the same generation is a default the user did not write (a CRD or "
                                        "operator upgrade), not a change, and restarts nothing.")
    started_at: Optional[Timestamp] = None
    phase_since: Optional[Timestamp] = None
    batch_sizes: Optional[list[int]] = Field(default=None, max_length=MAX_BATCH_SIZES,
                                             description="The planned sweep, fixed when measurement starts.")
    step: Optional[int] = Field(default=None, ge=0, description="Index into batchSizes being measured.")
    step_started_at: Optional[Timestamp] = None
    measuring_since: Optional[Timestamp] = None
    wave: Optional[int] = Field(default=None, ge=0, description="0-based wave in progress.")
    wave_started_at: Optional[Timestamp] = None
    guard_started_at: Optional[Timestamp] = None
    guard_leg: Optional[int] = Field(
        default=None, ge=0, description="0-based index into the guard's batch sizes (status.guard.legs) being "
                                        "driven in the current wave or final guard.")
    guard_leg_started_at: Optional[Timestamp] = Field(
        default=None, description="When the guard load at the current batch size started (production mode: when "
                                  "the guard's comparison of the current wave started).")
    guard_mode: Optional[Literal["production", "synthetic"]] = Field(
        default=None, description="How the guard compares for the rest of the rollout, chosen once at the first "
                                  "wave from the fleet's recent requests: production (on the traffic the fleet "
                                  "serves) or synthetic (a fleet that serves no one: load Jobs drive a promoted pod "
                                  "and the control).")
    paused_at: Optional[Timestamp] = Field(default=None, description="When spec.paused was first seen true.")
    load_run: Optional[int] = Field(default=None, ge=0,
                                    description="Bumped whenever load is (re)started; load Job names carry it.")
    load_started_at: Optional[Timestamp] = Field(
        default=None, description="When every load Job of the current loadRun was first seen with a running pod: "
                                  "a step or guard measures from here (plus the warm-up), never from before.")
    read_errors: Optional[int] = Field(default=None, ge=0, description="Consecutive passes Prometheus could not be read.")
    live_edges: Optional[list[float]] = Field(
        default=None, max_length=16, description="Live mode: the offered-load strata's interior edges (requests per "
                                                 "fleet pod per sampleInterval), fixed before any window is compared.")
    abort_seen_until: Optional[Timestamp] = Field(
        default=None, description="Live mode: the safety abort has seen both arms' metrics up to here (Prometheus "
                                  "had scraped them); past analysis.abort.maxBlind without a newer one the canary's "
                                  "share is removed (AbortBlind).")


class GuardLeg(StatusModel):
    """The guard at one batch size of the wave (or final guard) in progress."""

    batch_size: int = Field(ge=1, description="Concurrent requests driven on the promoted pod and on the control.")
    lookahead: Optional[bool] = Field(default=None, description="Whether the promoted config has lookahead on at "
                                                                "this batch size (regime-aware: off above its range).")
    state: Literal["Pending", "Guarding", "Passed"] = Field(
        default="Pending", description="Pending (not driven yet), Guarding (being driven now) or Passed.")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="The latest comparison at this batch size.")


class GuardStatus(StatusModel):
    """The latest guard comparison: promoted pods against their baseline (docs/operator.md, "The
    guard")."""

    wave: Optional[int] = Field(default=None, ge=1, description="The wave being guarded (none: the final guard).")
    message: str = Field(default="", max_length=MAX_MESSAGE)
    enough_data: bool = False
    regressed: bool = False
    mode: Optional[Literal["production", "synthetic"]] = Field(
        default=None, description="production: promoted pods against the fleet's not-yet-promoted pods and the "
                                  "control, on the production traffic they serve, window by window; synthetic: a "
                                  "promoted pod and the control both driven by the guard's load (an idle fleet).")
    promoted_pods: Optional[int] = Field(default=None, ge=0, description="Pods on the promoted side.")
    baseline_pods: Optional[int] = Field(default=None, ge=0, description="Pods on the baseline side.")
    windows: Optional[int] = Field(default=None, ge=0, description="Paired windows compared so far.")
    dropped_windows: Optional[int] = Field(default=None, ge=0,
                                           description="Windows left out (a side served no token in them).")
    promoted_offered: Optional[float] = Field(
        default=None, ge=0, description="Production mode: requests routed to each promoted pod per second (mean).")
    baseline_offered: Optional[float] = Field(
        default=None, ge=0, description="Production mode: requests routed to each baseline pod per second (mean).")
    change: Optional[float] = Field(default=None, description="The compared metric's relative change, promoted vs "
                                                              "baseline (production: per-token latency at equal "
                                                              "offered load; synthetic: throughput).")
    batch_size: Optional[int] = Field(default=None, ge=1, description="The batch size being driven now.")
    legs: Optional[list[GuardLeg]] = Field(
        default=None, max_length=MAX_BATCH_SIZES,
        description="Every batch size this guard drives, one after the other: after a regime-aware promotion one "
                    "inside the lookahead range and one above it; otherwise the largest measured.")


class RollbackStatus(StatusModel):
    reason: str = Field(max_length=MAX_SHORT)
    message: str = Field(default="", max_length=MAX_MESSAGE)
    at: Optional[Timestamp] = None
    restored: Optional[list[str]] = Field(default=None, max_length=MAX_TARGETS,
                                          description="namespace/name restored to their saved templates.")


class LiveStratum(StatusModel):
    """One offered-load stratum of a live comparison (``measurement.stats.live.StratumResult``)."""

    index: int = Field(ge=0)
    offered_low: float = Field(ge=0, description="Offered load per fleet pod per sampleInterval, inclusive.")
    offered_high: Optional[float] = Field(default=None, description="Exclusive upper edge; none for the top stratum.")
    windows: int = Field(default=0, ge=0, description="Windows whose offered load fell here.")
    pairs: int = Field(default=0, ge=0, description="Paired per-token-latency windows the outcome was read from.")
    outcome: str = Field(default="Pending", max_length=MAX_SHORT, description="Wins, NoGain, Regresses or Pending.")
    latency_change: Optional[float] = Field(default=None, description="Canary vs control per-token latency, relative.")
    latency_interval: Optional[list[float]] = Field(default=None, description="Its confidence interval [low, high].")
    token_rate_change: Optional[float] = Field(default=None, description="Tokens/s per running request, relative.")
    ttft_change: Optional[float] = Field(default=None, description="Time to first token, relative.")
    control_running: Optional[float] = Field(default=None, description="The control's mean running batch here.")
    canary_running: Optional[float] = Field(default=None, description="The canary's mean running batch here (an outcome).")
    requests_control: int = Field(default=0, ge=0, description="Requests the control served in these windows.")
    requests_canary: int = Field(default=0, ge=0, description="Requests the canary served in these windows.")


class LiveStatus(StatusModel):
    """Live mode: how canary and control share the fleet's traffic, and the comparison per stratum."""

    split: str = Field(default="service", max_length=MAX_SHORT)
    share: Optional[float] = Field(default=None, description="Each arm's share of the fleet's traffic (0..1).")
    arm_replicas: Optional[int] = Field(default=None, ge=0, description="Replicas per arm, fixed at Preflight (from "
                                                                        "the fleet's replicas and load.livePercent).")
    message: str = Field(default="", max_length=MAX_MESSAGE, description="The split, in words.")
    route: Optional[str] = Field(
        default=None, max_length=MAX_SHORT,
        description="split gatewayAPI: the HTTPRoute (namespace/name) whose rule is re-weighted, fixed at Preflight: "
                    "every exit restores it from its annotation.")
    windows: int = Field(default=0, ge=0, description="Windows read so far.")
    strata: Optional[list[LiveStratum]] = Field(default=None, max_length=17)
    enabled_below: Optional[float] = Field(
        default=None, description="Lookahead pays below this offered load per fleet pod per window (none: nowhere, "
                                  "or everywhere measured when strata won up to the top).")
    crossover_offered: Optional[float] = Field(
        default=None, description="The lowest offered load where lookahead stops paying (per fleet pod per window).")
    crossover_batch: Optional[float] = Field(
        default=None, description="The control's mean running batch at the crossover: the batch size it corresponds to.")


class LookaheadPolicyStatus(StatusModel):
    phase: Phase = Phase.Pending
    message: Optional[str] = Field(default=None, max_length=MAX_MESSAGE)
    observed_generation: Optional[int] = Field(default=None, ge=0)
    conditions: Optional[list[Condition]] = Field(
        default=None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    preflight: Optional[PreflightStatus] = None
    targets: Optional[list[TargetStatus]] = None
    workloads: Optional[list[WorkloadRef]] = None
    batch_sizes: Optional[list[int]] = Field(default=None, description="The batch sizes being measured.")
    batches: Optional[list[BatchResult]] = None
    crossover_batch_size: Optional[int] = Field(
        default=None, ge=0, description="Smallest measured batch size at which lookahead stops paying.")
    decision: Optional[Decision] = None
    current_wave: Optional[int] = Field(default=None, ge=0, description="1-based wave in progress (0: none yet).")
    waves: Optional[list[WaveStatus]] = None
    gates: Optional[Gates] = None
    report: Optional[str] = Field(default=None, max_length=MAX_URL, description="Where the report is (a ConfigMap or URL).")
    guard: Optional[GuardStatus] = Field(default=None, description="The latest guard comparison (promoted vs control).")
    live: Optional[LiveStatus] = Field(default=None, description="Live mode: the split and the per-stratum comparison.")
    rollback: Optional[RollbackStatus] = Field(default=None, description="Why and when the fleet was rolled back, and what was restored.")
    progress: Progress = Field(default_factory=Progress, description="The state machine's bookkeeping (step, wave, "
                               "clocks): what a restarted operator resumes from. See lookahead_operator.controller.statemachine.")
