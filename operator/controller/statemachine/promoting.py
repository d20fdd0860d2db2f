"""Promoting: wave by wave, each wave's targets promoted, rolled out within the rollout deadline and
guarded, then on to the next wave or to Guarding."""

from __future__ import annotations

from lookahead_operator.controller.statemachine.cleanup import _roll_back
from lookahead_operator.controller.statemachine.clocks import (
    _new_load_run,
    _reset_guard_legs,
    _seconds,
    rollout_deadline,
    spell,
)
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.guarding import _guard_legs
from lookahead_operator.controller.builders import wave_pods
from lookahead_operator.controller.world import ActionKind, Target
from lookahead_operator.api.status import Phase


def _promoting(ctx: PassContext) -> None:
    world, spec, progress = ctx.world, ctx.spec, ctx.progress
    waves = spec.promotion.waves
    wave = progress.wave or 0
    # A wave is a share of the fleet's serving pods, across its targets; waves keep their positions
    # over the whole fleet: a target left to its user is skipped in its wave.
    plan = {k: n for k, n in wave_pods([(t.key, t.replicas) for t in world.targets], waves, wave).items()
            if k not in ctx.left_to_users}
    members = list(plan)
    decision_id = ctx.status.decision.id if ctx.status.decision else ""
    ctx.status.current_wave = wave + 1
    if not members and wave + 1 < len(waves):
        # (waves are cumulative: nothing of ours changed in this wave, so there is nothing to guard;
        # a wave that adds no pod to the one before (a fleet too small to split finer) still soaks
        # under its guard)
        ctx.events.append(("Normal", "WaveSkipped", f"wave {wave + 1}/{len(waves)}: every target of it is left "
                                                    "to its user"))
        _next_wave(ctx, wave)
        return
    broken = [t for t in world.targets if t.key in members and t.promoted and t.rollout_failed]
    if broken:
        t = broken[0]
        _roll_back(ctx, "RolloutFailed", f"wave {wave + 1}: {t.namespace}/{t.name} did not roll out "
                                         f"({t.rollout_failed})")
        return
    by_key = {t.key: t for t in world.targets}
    pending = [k for k in members if not _done(by_key[k], plan[k], decision_id)]
    _mark_promoted(ctx, plan, wave)
    if pending:
        ctx.act(ActionKind.PROMOTE, targets=pending, decision_id=decision_id, pods=tuple(plan[k] for k in pending))
        # a target promoted in part lends its replicas only once its wave Deployment's pods serve:
        # until then it stays pending, on the wave's clock (started when the wave's PROMOTE was new)
        starting = [k for k in pending if _in_part(by_key[k], plan[k]) and by_key[k].wave_replicas == plan[k]]
        if len(starting) < len(pending):
            progress.wave_started_at = world.now
            ctx.events.append(("Normal", "WaveStarted", f"wave {wave + 1}/{len(waves)} ({waves[wave]}%): "
                               f"promoting {_pods_words(plan, by_key, pending)}"))
        elif _late(ctx, wave, [f"{ns}/{n}'s wave Deployment" for ns, n in starting]):
            return
        else:
            ctx.fact(C.WaveReady, False, "RollingOut", f"wave {wave + 1}: waiting for the pods of "
                     + ", ".join(f"{ns}/{n}'s wave Deployment" for ns, n in starting))
        ctx.wait(world.poll_s)
        return
    if _rolling_out(ctx, wave, members):
        return
    # a target promoted whole no longer needs the wave Deployment it had in an earlier wave
    folded = [t.key for t in world.targets if t.key in members and t.whole and t.wave_replicas is not None]
    if folded:
        ctx.act(ActionKind.DELETE_WAVES, targets=folded)
    if _guard_legs(ctx, wave, wave + 1, progress.wave_started_at, spec.promotion.wave_duration, f"wave {wave + 1}"):
        return
    ctx.fact(C.WaveReady, True, "Passed", f"wave {wave + 1} rolled out and passed its guard")
    if wave + 1 < len(waves):
        _next_wave(ctx, wave)
        return
    progress.guard_started_at = world.now
    _new_load_run(progress)
    _reset_guard_legs(ctx)
    ctx.act(ActionKind.DELETE_LOAD)
    ctx.transition(Phase.Guarding, "AllWavesPromoted", f"all {len(waves)} waves promoted; guarding for "
                   f"{_seconds(spec.promotion.guard.duration):g}s")
    ctx.wait(0)


def _next_wave(ctx: PassContext, wave: int) -> None:
    """Go on to the wave after ``wave``: the load Jobs go, its clock starts now, and its guard starts
    afresh from the first batch size."""
    progress = ctx.progress
    ctx.act(ActionKind.DELETE_LOAD)
    progress.wave, progress.wave_started_at = wave + 1, ctx.world.now
    _new_load_run(progress)
    _reset_guard_legs(ctx)
    ctx.wait(0)


def _in_part(t: Target, pods: int) -> bool:
    """Whether ``pods`` of target ``t`` (a count from ``wave_pods``) promote it in part, through its
    wave Deployment, rather than whole."""
    return pods < t.replicas


def _done(t: Target, pods: int, decision_id: str) -> bool:
    """Whether target ``t`` already runs ``pods`` pods of this decision (promoted whole when that is
    all of its replicas)."""
    if t.promoted != decision_id:
        return False
    if not _in_part(t, pods):
        return t.whole
    # in part: lent, and its wave Deployment there to run them (one deleted under us is made again)
    return not t.whole and t.lent == pods and t.wave_replicas == pods


def _pods_words(plan: dict[tuple[str, str], int], by_key: dict[tuple[str, str], Target],
                keys: list[tuple[str, str]]) -> str:
    return ", ".join(f"{k[0]}/{k[1]}" + (f" ({plan[k]} of {by_key[k].replicas} pods)"
                                         if _in_part(by_key[k], plan[k]) else "") for k in keys)


def _rolled_out(t: Target) -> bool:
    """The target's own pods are rolled out and, promoted in part, so are its wave Deployment's,
    as many as it lent."""
    if not t.rolled_out:
        return False
    if t.promoted and not t.whole:
        return t.wave_ready and t.wave_replicas == t.promoted_pods
    return True


def _late(ctx: PassContext, wave: int, late: list[str]) -> bool:
    """Past the rollout deadline (``clocks.rollout_deadline``: ``promotion.rolloutDeadline``, else
    the fleet's own) since the wave started: rolled back, naming what is late and the deadline."""
    limit, limit_from = rollout_deadline(ctx)
    if ctx.since(ctx.progress.wave_started_at) < limit:
        return False
    _roll_back(ctx, "RolloutTimeout", f"wave {wave + 1}: {', '.join(late)} not available within "
                                      f"{spell(limit)} ({limit_from})")
    return True


def _rolling_out(ctx: PassContext, wave: int, members: list[tuple[str, str]]) -> bool:
    """Whether the wave's targets are still rolling out (the pass waits), or failed to within
    the rollout deadline (``clocks.rollout_deadline``; rolled back); False once all are rolled out."""
    world = ctx.world
    if all(_rolled_out(t) for t in world.targets if t.key in members):
        return False
    if _late(ctx, wave, [f"{t.namespace}/{t.name}" for t in world.targets if t.key in members and not _rolled_out(t)]):
        return True
    ctx.fact(C.WaveReady, False, "RollingOut", f"wave {wave + 1}: waiting for the rollout")
    ctx.wait(world.poll_s)
    return True


def _mark_promoted(ctx: PassContext, plan: dict[tuple[str, str], int], wave: int) -> None:
    rows = []
    sizes = {t.key: t.replicas for t in ctx.world.targets}
    for row in ctx.status.targets or []:
        if row.user_edited:
            rows.append(row)
            continue
        key = (row.namespace, row.name)
        on = key in plan
        rows.append(row.model_copy(update={"promoted": on, "wave": (row.wave or wave + 1) if on else None,
                                           "replicas": sizes.get(key, row.replicas),
                                           "promoted_pods": plan.get(key, 0)}))
    ctx.status.targets = rows
