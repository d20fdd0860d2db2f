"""Launching (canary and control come up) and Measuring (one step per batch size, each on its own
load Jobs, until its answer is clear or its time is up)."""

from __future__ import annotations

from datetime import datetime

from lookahead_operator.controller.statemachine.cleanup import _stop
from lookahead_operator.controller.statemachine.clocks import (
    _load_started,
    _new_load_run,
    _seconds,
    launch_deadline,
    spell,
    step_deadline,
)
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.live import _ensure_arms, _gateway, _route_split
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.measurement.results import StepMeasurement
from lookahead_operator.api.spec import CanaryCapacity, LoadMode, LookaheadPolicySpec
from lookahead_operator.controller import conditions
from lookahead_operator.api.status import Phase


def _launching(ctx: PassContext) -> None:
    world, spec = ctx.world, ctx.spec
    _ensure_arms(ctx)
    if not all(world.roles_ready.get(r) for r in ("canary", "control")):
        limit, limit_from = launch_deadline(ctx)
        unplaced = _capacity(ctx)
        if ctx.since(ctx.progress.phase_since) >= limit and unplaced:
            _stop(ctx, Phase.Failed, "CapacityUnavailable",
                  f"canary and control could not be scheduled within {spell(limit)} ({limit_from}): {unplaced}; "
                  "they were deleted and the fleet was not touched")
            return
        if ctx.since(ctx.progress.phase_since) >= limit:
            _stop(ctx, Phase.Failed, "CanaryNotReady",
                  f"canary and control were not ready within {spell(limit)} ({limit_from}); "
                  "they were deleted and the fleet was not touched")
            return
        ctx.fact(C.RolesReady, False, "Waiting", f"waiting for canary and control to be ready: up to "
                 f"{spell(limit)} ({limit_from})")
        ctx.wait(world.poll_s)
        return
    if _gateway(ctx) and not _route_split(ctx):  # their share of the route's traffic first
        return
    ctx.fact(C.RolesReady, True, "Ready", "canary and control are ready")
    ctx.progress.step, ctx.progress.step_started_at, ctx.progress.measuring_since = 0, world.now, world.now
    _new_load_run(ctx.progress)
    ctx.status.batches = []
    ctx.transition(Phase.Measuring, "Measuring",
                   "live: canary and control serve their share of the fleet's traffic"
                   if spec.load.mode == LoadMode.live else f"measuring batch size {ctx.progress.batch_sizes[0]}")
    ctx.wait(0)


def _capacity(ctx: PassContext) -> str | None:
    """Whether the scheduler can place canary and control: the CapacityAvailable condition, and a
    Warning Event the first pass it cannot (within a poll of the scheduler's verdict, not at the
    deadline). Returns the scheduler's reason, or None. The wait goes on to the deadline (a cluster
    autoscaler, or pods finishing elsewhere, may still make room)."""
    world = ctx.world
    unplaced = "; ".join(f"{role}: {why}" for role, why in sorted(world.roles_unschedulable.items()))
    if not unplaced:
        if {"canary", "control"} <= world.roles_scheduled:
            ctx.fact(C.CapacityAvailable, True, "Scheduled", "the scheduler placed canary and control")
        return None
    if ctx.spec.canary.capacity == CanaryCapacity.surge:
        hint = ("canary.capacity is surge (they need room beside the fleet): set spec.canary.capacity: carveOut "
                "to take their replicas out of the fleet instead")
    else:
        hint = "canary.capacity is carveOut: the pods taken out of the fleet have not freed enough yet"
    message = f"{unplaced}; {hint}"
    before = conditions.get(world.status.conditions, C.CapacityAvailable)
    if before is None or before.status != "False":
        ctx.events.append(("Warning", "CapacityUnavailable", message))
    ctx.fact(C.CapacityAvailable, False, "CapacityUnavailable", message)
    return unplaced


def _measuring(ctx: PassContext) -> None:
    world, spec, progress = ctx.world, ctx.spec, ctx.progress
    sizes = progress.batch_sizes or [1]
    step = progress.step or 0
    if step >= len(sizes):
        ctx.transition(Phase.Deciding, "Measured", "all batch sizes measured")
        ctx.wait(0)
        return
    until = _drive_step(ctx, sizes, step)
    conclusive = world.step is not None and world.step.conclusive
    if not conclusive and ctx.since(progress.measuring_since) >= spec.analysis.deadline:
        ctx.act(ActionKind.DELETE_LOAD)
        ctx.transition(Phase.Deciding, "Deadline", "analysis deadline reached before every batch size had an answer")
        ctx.wait(0)
        return
    if _step_load_lost(ctx, sizes[step]):
        return
    if not _load_started(ctx, ("canary", "control")):
        # A load pod still pending (unschedulable, pulling): its role is not driven yet, and windows
        # without load are no evidence (they would read as stalls). Nothing is measured, and the
        # step's clock does not run, until both run; the analysis deadline still bounds the wait.
        ctx.status.message = (f"batch size {sizes[step]}: waiting for the load Jobs' pods (canary and control) "
                              f"to run")
        ctx.wait(world.poll_s)
        return
    if conclusive or _step_time_is_up(ctx, sizes[step], until):
        _end_step(ctx, sizes, step, "answer is clear" if conclusive else "step duration reached")
        return
    # Look again when the next sample window closes (or a clock runs out, if sooner).
    left = min(spec.analysis.deadline - ctx.since(progress.measuring_since), spec.analysis.sample_interval)
    ctx.wait(max(0.5, _seconds(left)))


def _drive_step(ctx: PassContext, sizes: list[int], step: int) -> datetime:
    """The step's roles and load exist, its row of ``status.batches`` shows what was measured so
    far; returns until when the step may measure on (``step_deadline``)."""
    world, progress = ctx.world, ctx.progress
    ctx.act(ActionKind.ENSURE_ROLES)
    ready = all(world.roles_ready.get(r) for r in ("canary", "control"))
    ctx.fact(C.RolesReady, ready, "Ready" if ready else "NotReady", "canary and control are ready" if ready
             else "a canary or control pod is not ready: its samples are missing")
    until = step_deadline(ctx.spec, len(sizes), step, progress.measuring_since or world.now)
    ctx.act(ActionKind.ENSURE_LOAD, step=step, batch_size=sizes[step], run=progress.load_run or 0, until=until)
    if world.step is not None:
        rows = [r for r in ctx.status.batches or [] if r.batch_size != sizes[step]] + [world.step.row]
        ctx.status.batches = sorted(rows, key=lambda r: r.batch_size)
    return until


def _step_load_lost(ctx: PassContext, size: int) -> bool:
    """Whether the pod a load Job drives (by IP) was deleted or replaced: that role's new pod gets
    no load, and its windows would read as stalls. The step then starts again on fresh load Jobs,
    aimed at the pods there are now; what was measured of it is not used (the step measures from
    the new loadStartedAt). The analysis deadline still bounds it."""
    world = ctx.world
    lost = world.load_pods_gone & {"canary", "control"}
    if not lost:
        return False
    gone = ", ".join(sorted(lost))
    ctx.act(ActionKind.DELETE_LOAD)
    _new_load_run(ctx.progress)
    ctx.events.append(("Warning", "LoadRestarted", f"batch size {size}: the {gone} pod the load drove is "
                                                   f"gone; the step starts again on fresh load"))
    ctx.status.message = f"batch size {size}: the {gone} pod was replaced; the step's load restarts"
    ctx.wait(world.poll_s)
    return True


def _step_time_is_up(ctx: PassContext, size: int, until: datetime) -> bool:
    """Whether a step without a clear answer ends: its stepDuration has passed, it has enough
    samples, and its share of the deadline (``until``) is spent; else it says why it goes on."""
    world, spec = ctx.world, ctx.spec
    if ctx.since(ctx.progress.load_started_at) < spec.load.step_duration:
        return False
    if _starved(world.step, spec):
        # No usable data yet (Prometheus down, pods not serving): the step waits for data rather
        # than ending empty; the analysis deadline still bounds it.
        ctx.status.message = (f"batch size {size}: step duration reached without enough samples "
                              f"(need {spec.load.min_samples_per_step} per role); waiting for data until the deadline")
        return False
    if world.now < until:
        # Data, but no answer yet: the (anytime-valid) test keeps sampling, on its share of the
        # deadline and the time the steps before left, time the deadline allows anyway
        # (docs/statistics.md).
        ctx.status.message = (f"batch size {size}: no clear answer at stepDuration; measuring on for up to "
                              f"{_seconds(until - world.now):.0f}s more (its share of analysis.deadline and what "
                              f"the batch sizes before it left)")
        return False
    return True


def _end_step(ctx: PassContext, sizes: list[int], step: int, why: str) -> None:
    """The step is done: its load goes, and the next batch size (or the decision) comes next."""
    progress = ctx.progress
    ctx.act(ActionKind.DELETE_LOAD)
    ctx.events.append(("Normal", "StepDone", f"batch size {sizes[step]}: {why}"))
    progress.step, progress.step_started_at = step + 1, ctx.world.now
    _new_load_run(progress)
    if step + 1 >= len(sizes):
        ctx.transition(Phase.Deciding, "Measured", "all batch sizes measured")
    else:
        ctx.status.message = f"measuring batch size {sizes[step + 1]}"
    ctx.wait(0)


def _starved(step: StepMeasurement | None, spec: LookaheadPolicySpec) -> bool:
    samples = step.row.samples if step is not None else None
    if samples is None:
        return True
    return min(samples.control or 0, samples.canary or 0) < spec.load.min_samples_per_step
