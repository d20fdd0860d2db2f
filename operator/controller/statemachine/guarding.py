"""The guard: a promoted pod and the control driven at each guard batch size in turn until the
comparison has enough data, after each wave and once more at the end (Guarding); a regression, or
no data by the analysis deadline, rolls back."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from lookahead_operator.controller.statemachine.cleanup import _roll_back
from lookahead_operator.controller.statemachine.clocks import _load_started, _new_load_run
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.measurement.results import GUARD_PRODUCTION, GuardCheck, guard_batch_sizes
from lookahead_operator.api.status import GuardLeg, GuardStatus, Phase


def _guarding(ctx: PassContext) -> None:
    spec = ctx.spec
    if _guard_legs(ctx, ctx.progress.wave or 0, None, ctx.progress.guard_started_at, spec.promotion.guard.duration,
                   "the guard"):
        return
    reason = ctx.status.decision.reason if ctx.status.decision else ""
    ctx.delete_roles()
    ctx.act(ActionKind.DELETE_LOAD)
    ctx.transition(Phase.Succeeded, "GuardPassed", f"guard passed; lookahead stays on. {reason}".strip())


def _guard_legs(ctx: PassContext, wave: int, status_wave: int | None, since: datetime | None, duration: timedelta,
                what: str) -> bool:
    """Guard a wave (or, ``status_wave`` None, the final guard): the promoted pod and the control are
    driven at each of ``guard_batch_sizes`` in turn, each for its share of ``duration`` and until its
    comparison has enough data; a regression at any of them rolls back, naming the batch size.
    Returns True while the pass is over (guarding, moved to the next batch size, or rolled back),
    False once every batch size has passed."""
    world, progress = ctx.world, ctx.progress
    if progress.guard_mode is None and _choose_mode(ctx, since, what):
        return True
    if progress.guard_mode == GUARD_PRODUCTION:
        return _production_guard(ctx, status_wave, what)
    legs = guard_batch_sizes(ctx.status)
    i = min(progress.guard_leg or 0, len(legs) - 1)
    size, lookahead = legs[i]
    where = f"batch size {size}" + ("" if len(legs) == 1 else
                                    f" ({'inside' if lookahead else 'above'} the lookahead range)")
    check = replace(world.guard, message=f"{where}: {world.guard.message}") \
        if world.guard is not None and not ctx.ignore_guard else None
    if check is not None and check.regressed:
        _roll_back(ctx, "GuardRegression", (f"{what}, " if status_wave is not None else "") + check.message)
        return True
    label = _label_of(what, where, legs)
    guarded = {"promoted", "control"}
    gone = world.load_pods_gone & guarded
    ended = set() if check is not None and check.enough_data else world.load_finished & guarded
    if (gone or ended) and not ctx.ignore_guard:
        # The pod a guard Job drives was deleted or replaced (a promoted pod's Deployment made a new
        # one, a node was drained), or its Job ended before the comparison had its data (an outage
        # of Prometheus outlasted the load): that role gets no load any more, and waiting would end
        # in a rollback for want of data. The guard's load starts again on fresh Jobs, aimed at the
        # pods there are now, and compares from when they run; the analysis deadline still bounds it.
        why = ", ".join(f"the {r} pod it drove is gone" for r in sorted(gone)) or \
            f"the {' and '.join(sorted(ended))} load ended before enough data"
        ctx.act(ActionKind.DELETE_LOAD)
        _new_load_run(progress)
        ctx.events.append(("Warning", "LoadRestarted", f"{label}: {why}; the guard's load starts again"))
        ctx.status.message = f"{label}: {why}; the guard's load restarts"
        ctx.wait(world.poll_s)
        return True
    ctx.act(ActionKind.ENSURE_GUARD_LOAD, wave=wave, batch_size=size, run=progress.load_run or 0)
    _load_started(ctx, ("promoted", "control"))   # measure.guard compares from then on
    ctx.status.guard = _guard_status(ctx, check, status_wave, legs, i)
    if _must_keep_guarding(ctx, check, progress.guard_leg_started_at or since, duration / len(legs), label):
        return True
    if i + 1 < len(legs):
        ctx.events.append(("Normal", "GuardBatchPassed",
                           f"{label}: passed; guarding batch size {legs[i + 1][0]} next"))
        ctx.act(ActionKind.DELETE_LOAD)
        progress.guard_leg, progress.guard_leg_started_at = i + 1, world.now
        _new_load_run(progress)
        ctx.status.guard = _guard_status(ctx, None, status_wave, legs, i + 1)
        ctx.wait(0)
        return True
    return False


def _choose_mode(ctx: PassContext, since: datetime | None, what: str) -> bool:
    """Before the first guard of the rollout: how it guards, for the rest of the rollout
    (``measure.guard_mode``, from the fleet's recent requests). A fleet that serves users is
    guarded on their traffic, and no load of ours ever reaches its pods; an idle one by the guard's
    load Jobs. Until Prometheus answers, nothing is driven; the analysis deadline bounds the wait.
    Returns True while the pass is over (waiting, or rolled back), False once the mode is chosen
    (the guard starts in this same pass)."""
    world, progress = ctx.world, ctx.progress
    check = world.guard if not ctx.ignore_guard else None
    if check is None:
        ctx.fact(C.GuardData, False, "WaitingForData", f"{what}: reading whether the fleet serves production traffic")
        if ctx.since(since) >= ctx.spec.analysis.deadline:
            _roll_back(ctx, "GuardNoData", f"{what}: the fleet's traffic could not be read by the analysis deadline; "
                                           "not promoting blind")
            return True
        ctx.wait(world.poll_s)
        return True
    progress.guard_mode = check.mode
    progress.guard_leg, progress.guard_leg_started_at = None, None
    ctx.events.append(("Warning" if check.warning else "Normal", "GuardMode", check.message.removeprefix("guard: ")))
    return False


def _production_guard(ctx: PassContext, status_wave: int | None, what: str) -> bool:
    """Guard a wave (or, ``status_wave`` None, the final guard) on production traffic: the control
    serves beside the fleet (its pods join the fleet's Service), no load Job runs, and the
    comparison (``measure.production_guard``) starts when this wave's guard does. Returns True
    while the pass is over (guarding, or rolled back), False once it passed."""
    world, progress = ctx.world, ctx.progress
    ctx.act(ActionKind.SERVE_CONTROL)
    if progress.guard_leg_started_at is None:
        progress.guard_leg_started_at = world.now
        ctx.status.guard = GuardStatus(wave=status_wave, mode=GUARD_PRODUCTION,
                                       message=f"{what}: comparing on production traffic from now")
        ctx.wait(world.poll_s)
        return True
    check = world.guard if world.guard is not None and not ctx.ignore_guard \
        and world.guard.mode == GUARD_PRODUCTION else None
    if check is not None and check.regressed:
        _roll_back(ctx, "GuardRegression", f"{what}: {check.message}")
        return True
    if check is not None:
        ctx.status.guard = GuardStatus.model_validate(
            {"wave": status_wave, "mode": GUARD_PRODUCTION, "message": check.message,
             "enoughData": check.enough_data, **(check.numbers or {})})
    return _must_keep_guarding(ctx, check, progress.guard_leg_started_at, ctx.spec.promotion.wave_duration
                               if status_wave is not None else ctx.spec.promotion.guard.duration, what)


def _must_keep_guarding(ctx: PassContext, check: GuardCheck | None, since: datetime | None, duration: timedelta,
                        what: str) -> bool:
    """Whether a wave (or the final guard) must keep watching at one batch size: until its duration
    has passed AND the comparison has enough data. No data never counts as a pass: without data by
    the analysis deadline the rollout is rolled back. Returns True when the pass is over (waiting or
    rolled back)."""
    enough = check is not None and check.enough_data
    ctx.fact(C.GuardData, enough, "Enough" if enough else "WaitingForData",
             check.message if check is not None else f"{what}: no guard comparison yet")
    if ctx.since(since) < duration:
        if ctx.phase == Phase.Promoting:
            ctx.fact(C.WaveReady, True, "Guarding", f"{what} rolled out; guarding it")
        ctx.wait(ctx.world.poll_s)
        return True
    if enough:
        return False
    if ctx.since(since) >= ctx.spec.analysis.deadline:
        _roll_back(ctx, "GuardNoData", f"{what} lacked the evidence to pass by the analysis deadline "
                                       f"({check.message if check else 'no guard data'}); not promoting blind")
        return True
    ctx.wait(ctx.world.poll_s)
    return True


def _label_of(what: str, where: str, legs: list[tuple[int, bool]]) -> str:
    """How a guard names itself in messages: ``wave 2`` or ``wave 2 at batch size 1 (...)``."""
    return what if len(legs) == 1 else f"{what} at {where}"


def _guard_status(ctx: PassContext, check: GuardCheck | None, status_wave: int | None, legs: list[tuple[int, bool]],
                  i: int) -> GuardStatus:
    """status.guard: the comparison at the batch size being driven (``legs[i]``), and what each batch
    size of this guard showed so far (those before ``i`` passed)."""
    old = ctx.status.guard
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
