"""Promoting: wave by wave, each wave's targets promoted, rolled out within the rollout deadline and
guarded, then on to the next wave or to Guarding."""

from __future__ import annotations

from lookahead_operator.controller.statemachine.cleanup import _roll_back
from lookahead_operator.controller.statemachine.clocks import _new_load_run, _reset_guard_legs, _seconds
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.guarding import _guard_legs
from lookahead_operator.controller.builders import wave_members
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.api.status import Phase


def _promoting(ctx: PassContext) -> None:
    world, spec, progress = ctx.world, ctx.spec, ctx.progress
    waves = spec.promotion.waves
    wave = progress.wave or 0
    # Waves keep their positions over the whole fleet; a target left to its user is skipped in its wave.
    members = [k for k in wave_members([t.key for t in world.targets], waves, wave) if k not in ctx.left_to_users]
    decision_id = ctx.status.decision.id if ctx.status.decision else ""
    ctx.status.current_wave = wave + 1
    if not members and wave + 1 < len(waves):
        # (waves are cumulative: nothing of ours changed in this wave, so there is nothing to guard)
        ctx.events.append(("Normal", "WaveSkipped", f"wave {wave + 1}/{len(waves)}: every target of it is left to "
                                                    "its user"))
        _next_wave(ctx, wave)
        return
    broken = [t for t in world.targets if t.key in members and t.promoted and t.rollout_failed]
    if broken:
        t = broken[0]
        _roll_back(ctx, "RolloutFailed", f"wave {wave + 1}: {t.namespace}/{t.name} did not roll out "
                                         f"({t.rollout_failed})")
        return
    pending = [k for k in members if not any(t.key == k and t.promoted == decision_id for t in world.targets)]
    _mark_promoted(ctx, members, wave)
    if pending:
        ctx.act(ActionKind.PROMOTE, targets=pending, decision_id=decision_id)
        progress.wave_started_at = world.now
        ctx.events.append(("Normal", "WaveStarted", f"wave {wave + 1}/{len(waves)} ({waves[wave]}%): "
                           f"promoting {', '.join(f'{ns}/{n}' for ns, n in pending)}"))
        ctx.wait(world.poll_s)
        return
    if _rolling_out(ctx, wave, members):
        return
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


def _rolling_out(ctx: PassContext, wave: int, members: list[tuple[str, str]]) -> bool:
    """Whether the wave's targets are still rolling out (the pass waits), or failed to within
    ``promotion.rolloutDeadline`` (rolled back); False once all are rolled out."""
    world = ctx.world
    if all(t.rolled_out for t in world.targets if t.key in members):
        return False
    limit = ctx.spec.promotion.rollout_deadline
    if ctx.since(ctx.progress.wave_started_at) >= limit:
        late = [f"{t.namespace}/{t.name}" for t in world.targets if t.key in members and not t.rolled_out]
        _roll_back(ctx, "RolloutTimeout", f"wave {wave + 1}: {', '.join(late)} not available within "
                                          f"promotion.rolloutDeadline ({_seconds(limit):g}s)")
        return True
    ctx.fact(C.WaveReady, False, "RollingOut", f"wave {wave + 1}: waiting for the rollout")
    ctx.wait(world.poll_s)
    return True


def _mark_promoted(ctx: PassContext, members: list[tuple[str, str]], wave: int) -> None:
    rows = []
    for row in ctx.status.targets or []:
        if row.user_edited:
            rows.append(row)
            continue
        on = (row.namespace, row.name) in members
        rows.append(row.model_copy(update={"promoted": on, "wave": (row.wave or wave + 1) if on else None}))
    ctx.status.targets = rows
