"""What the measurement hands the state machine, one type per need: the preflight's
``PreflightResult``, a step's ``StepMeasurement``, the guard's ``GuardCheck``, live mode's
``LiveMeasurement``; and the batch sizes
the guard drives (``guard_batch_sizes``, pure on the status: the state machine and the guard read
the same list)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from lookahead_operator.api.status import BatchResult, DecisionAction, LookaheadPolicyStatus, PreflightStatus
from lookahead_operator.measurement.stats.live import ArmWindow, LiveResults


@dataclass(frozen=True)
class StepMeasurement:
    """The statistics of the current measurement step, computed from Prometheus."""
    row: BatchResult                  # the status.batches row (numbers, intervals, samples, verdict)
    conclusive: bool                  # the sequential test has an answer at the policy's confidence


#: How a guard compares (``GuardCheck.mode``, ``status.guard.mode``): ``production`` on the
#: production traffic the fleet's pods serve (no load of ours on them), ``synthetic`` by driving a
#: promoted pod and the control with the guard's load Jobs (a fleet that serves no one).
GUARD_PRODUCTION, GUARD_SYNTHETIC = "production", "synthetic"


@dataclass(frozen=True)
class GuardPods:
    """The pods a guard compares, as ``observe`` classifies them this pass (each ``(namespace,
    pod)``): ``promoted`` the ready pods of the target promoted last that run this decision's
    template; ``baseline`` the fleet's ready pods that do not (not promoted yet, in any target)
    and, in production mode, the control's, which serve beside them; ``targets`` the in-play
    target Deployments ``(namespace, name)``, whose pods' recent requests tell whether the fleet
    serves production traffic."""
    promoted: tuple[tuple[str, str], ...] = ()
    baseline: tuple[tuple[str, str], ...] = ()
    control: tuple[tuple[str, str], ...] = ()
    targets: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class GuardCheck:
    """Promoted pods against their baseline during a wave or the guard (``measure.guard``).

    ``mode``: how it compared (``GUARD_PRODUCTION`` or ``GUARD_SYNTHETIC``); the state machine
    keeps the first one it sees for the rest of the rollout. ``numbers``: what ``status.guard``
    shows of it (pods, windows, offered load per pod), camelCase keys of ``GuardStatus``."""
    regressed: bool
    message: str
    enough_data: bool = True
    mode: str = GUARD_SYNTHETIC
    numbers: dict | None = None
    warning: bool = False             # the mode was chosen for want of data (said as a Warning Event)


@dataclass(frozen=True)
class PreflightResult:
    status: PreflightStatus           # candidate, verdict, reasons
    batch_sizes: list[int]            # the sweep to measure (the spec's, or auto from the fleet)


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


@dataclass(frozen=True)
class LiveMeasurement:
    """Live mode's reading this pass (``measurement.live.measure``): the per-stratum comparison over
    every window since canary and control serve, and the last ``analysis.abort.window`` of each arm
    for the safety abort (which the controller judges: ``controller.livesplit.abort_reason``)."""

    windows: int                                  # whole windows read so far
    results: Optional[LiveResults] = None       # None until the strata's edges are fixed
    canary_recent: Optional[ArmWindow] = None   # the last abort window, canary
    control_recent: Optional[ArmWindow] = None  # ... and control
    edges: Optional[tuple[float, ...]] = None     # the strata's edges read from the pre-period (first pass only)
    note: str = ""                                # why nothing could be read yet, in words
    seen_until: Optional[datetime] = None         # Prometheus has scraped both arms up to here (None: not both)
