"""The rollout's clocks: until when a step measures (``step_deadline``), when a load run starts
counting (fresh load Jobs, their pods running), a guard starting afresh from its first batch size,
pause and resume (every clock frozen, then shifted by the pause), and how long pods may take to
become ready (``launch_deadline``, ``rollout_deadline``: the policy's, else the fleet's own)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta

from lookahead_canary import units
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.user_edits import in_play, role_source
from lookahead_operator.controller.world import ActionKind, Target
from lookahead_operator.api.spec import DEFAULT_ROLLOUT_DEADLINE, LookaheadPolicySpec
from lookahead_operator.api.status import Phase, Progress


def _seconds(td: timedelta) -> float:
    return max(0.0, td.total_seconds())


def step_deadline(spec: LookaheadPolicySpec, planned: int, step: int, measuring_since: datetime) -> datetime:
    """Until when step ``step`` (0-based, of ``planned``) measures on while its answer is unclear:
    the end of its equal share of the analysis deadline counted from when measuring began, so the
    time the steps before it left by settling early goes to it, and it never takes from the steps
    after it: each may measure to the end of its share (deadline / planned sizes) on that one
    clock. Time lost between steps (load pods starting) comes off the step that follows, where the
    analysis deadline used to take it off the last one. A step always measures its own
    stepDuration, even past this (a step before it waited on pods)."""
    return measuring_since + spec.analysis.deadline * (min(step, planned - 1) + 1) / max(1, planned)


#: The margin on a measured load time: a new pod may load slower than the fleet's did (a cold
#: node pulls the image, a busy one reads the weights slower).
LOAD_MARGIN = 1.5


def spell(td: timedelta) -> str:
    """A duration as the spec writes it ("15m", "1h2m30s")."""
    return units.format_duration(_seconds(td))


def fleet_deadline(policy: timedelta | None, targets: Iterable[Target],
                   default: timedelta = DEFAULT_ROLLOUT_DEADLINE) -> tuple[timedelta, str]:
    """How long pods of ``targets``' templates may take to become ready, and where that came from
    (a phrase for the messages): ``promotion.rolloutDeadline`` (``policy``) when the policy sets
    it; else the largest of ``default`` (10m, or the operator's LOOKAHEAD_DEFAULT_ROLLOUT_DEADLINE:
    ``Observed.default_deadline``) and what each target's own Deployment says
    (``world.LoadBudget``): its engine container's probe budget, its progressDeadlineSeconds, and
    ``LOAD_MARGIN`` times the measured load time of its current pods."""
    if policy is not None:
        return policy, "promotion.rolloutDeadline"
    targets = list(targets)
    best, why = default.total_seconds(), ""
    for t in targets:
        whose = "the fleet's" if len(targets) == 1 else f"{t.namespace}/{t.name}'s"
        lb = t.load_budget
        said = [(lb.probe_s, f"{whose} {lb.probe} allows {{}}"),
                (lb.progress_deadline_s, f"{whose} progressDeadlineSeconds is {{}}")]
        if lb.measured_s is not None:
            took = spell(timedelta(seconds=round(lb.measured_s)))
            said.append((lb.measured_s * LOAD_MARGIN, f"{whose} pods took {took} to become ready, "
                                                      f"{LOAD_MARGIN:g}x is {{}}"))
        for seconds, words in said:
            if seconds is not None and seconds > best:
                best, why = seconds, words
    limit = timedelta(seconds=math.ceil(best))
    if not why:
        return limit, (f"the default, {spell(default)}; promotion.rolloutDeadline unset, and the fleet's readiness "
                       "asks no longer")
    return limit, f"{why.format(spell(limit))}; promotion.rolloutDeadline unset"


def launch_deadline(ctx: PassContext) -> tuple[timedelta, str]:
    """How long canary and control may take to become ready (Launching), and where that came from:
    ``fleet_deadline`` of the target they are cloned from (``role_source``)."""
    source = role_source(ctx.world)
    return fleet_deadline(ctx.spec.promotion.rollout_deadline, [source] if source is not None else [],
                          ctx.world.default_deadline)


def rollout_deadline(ctx: PassContext) -> tuple[timedelta, str]:
    """How long a wave's promoted pods may take to become available (Promoting), and where that
    came from: ``fleet_deadline`` over the targets in play."""
    return fleet_deadline(ctx.spec.promotion.rollout_deadline, in_play(ctx.world), ctx.world.default_deadline)


def _new_load_run(progress: Progress) -> None:
    """Fresh load Jobs (a new run number in their names); what they measure starts once they run."""
    progress.load_run = (progress.load_run or 0) + 1
    progress.load_started_at = None


def _load_started(ctx: PassContext, roles: tuple[str, ...]) -> bool:
    """Whether the current run's load Jobs, one per role in ``roles``, all have a running pod; the
    first pass that sees it records when (``status.progress.loadStartedAt``): measurement counts
    from there, so a load pod that is pending (unschedulable, pulling its image) never shows as a
    role that stalled. ``Observed.load_running`` is of the run this pass began with: after a new
    run in this same pass (a user's edit of the guarded target restarts its load) it says nothing
    of the new run's Jobs, which do not exist yet."""
    progress = ctx.progress
    observed_run = ctx.world.status.progress.load_run
    if progress.load_started_at is None and progress.load_run == observed_run and set(roles) <= ctx.world.load_running:
        progress.load_started_at = ctx.world.now
    return progress.load_started_at is not None


def _reset_guard_legs(ctx: PassContext) -> None:
    """A wave (or the final guard) starts its guard from the first batch size."""
    ctx.progress.guard_leg, ctx.progress.guard_leg_started_at = None, None


def _paused(ctx: PassContext) -> bool:
    """Pause and resume. Returns True while paused (nothing else happens in this pass)."""
    world, progress = ctx.world, ctx.progress
    if world.spec.paused:
        if progress.paused_at is None:
            progress.paused_at = world.now
            ctx.act(ActionKind.DELETE_LOAD)
            ctx.events.append(("Normal", "Paused", f"paused in {ctx.phase}: load stopped, clocks frozen"))
        ctx.fact(C.Paused, True, "Paused", "spec.paused is true: no action, clocks frozen, until it is false")
        ctx.wait(None)
        return True
    if progress.paused_at is not None:
        gap = world.now - progress.paused_at
        for name in ("phase_since", "step_started_at", "measuring_since", "wave_started_at", "guard_started_at",
                     "guard_leg_started_at"):
            if getattr(progress, name) is not None:
                setattr(progress, name, getattr(progress, name) + gap)
        if ctx.phase == Phase.Measuring:
            progress.step_started_at = world.now  # the interrupted step is measured afresh
        _new_load_run(progress)                 # fresh load Jobs, never beside the old ones
        progress.paused_at = None
        ctx.events.append(("Normal", "Resumed", f"resumed after {_seconds(gap):.0f}s; clocks shifted by the pause"))
    ctx.fact(C.Paused, False, "Running", "not paused")
    return False
