"""The rollout's clocks: until when a step measures (``step_deadline``), when a load run starts
counting (fresh load Jobs, their pods running), a guard starting afresh from its first batch size,
and pause and resume (every clock frozen, then shifted by the pause)."""

from __future__ import annotations

from datetime import datetime, timedelta

from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.api.spec import LookaheadPolicySpec
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
