"""Live mode (``load.mode: live``, ``split: service``): canary and control serve a share of the
fleet's real traffic through its Service instead of our load. Preflight fixes the split
(``_live_split``: replicas per arm from ``load.livePercent``); Measuring (``_measuring_live``) reads
every window since both serve, checks the safety abort every ``analysis.abort.checkInterval``, keeps
``status.live`` (the per-stratum table) and goes to Deciding once every visited stratum is settled
(after ``load.stepDuration`` at least) or at ``analysis.deadline``; Deciding decides from that table
(``measurement.live.decision``)."""

from __future__ import annotations

import math

from lookahead_operator.api.status import LiveStatus, LiveStratum, Phase
from lookahead_operator.controller import livesplit
from lookahead_operator.controller.statemachine.cleanup import _roll_back
from lookahead_operator.controller.statemachine.clocks import _seconds
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.user_edits import role_source
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.measurement.stats.live import LiveResults


def _live_split(ctx: PassContext) -> bool:
    """Preflight, live mode: how many replicas each arm gets so that it serves ``livePercent`` of
    the fleet's Service (``livesplit.service_split``), fixed in ``status.live`` (``armReplicas``,
    the share, the split in words). A split that cannot be made (no Service selects the fleet, a share
    below what one replica gives) ends Failed, naming the field, with nothing created. Returns
    whether the rollout goes on."""
    world, spec = ctx.world, ctx.spec
    source = role_source(world)
    try:
        if world.live_service_refusal:
            raise livesplit.LiveSplitError("spec.load.split", world.live_service_refusal)
        if source is None or world.live_service is None:
            raise livesplit.LiveSplitError("spec.targets", "no target to clone canary and control from")
        split = livesplit.service_split(source.replicas + source.carved, spec.load.live_percent or 0.0,
                                        spec.canary.capacity)
    except livesplit.LiveSplitError as exc:
        ctx.act(ActionKind.RELEASE, targets=[t.key for t in world.targets])
        ctx.fact(C.Accepted, False, "LiveSplitRefused", str(exc))
        ctx.transition(Phase.Failed, "LiveSplitRefused", f"{exc}; nothing was created", warning=True)
        return False
    meta = world.live_service.get("metadata") or {}
    ctx.status.live = LiveStatus(split="service", share=round(split.share, 6), arm_replicas=split.arm_replicas,
                                 message=f"through Service {meta.get('namespace')}/{meta.get('name')}: "
                                         f"{split.describe()}")
    return True


def _measuring_live(ctx: PassContext) -> None:
    world, spec, progress = ctx.world, ctx.spec, ctx.progress
    ctx.act(ActionKind.ENSURE_ROLES)
    ready = all(world.roles_ready.get(r) for r in ("canary", "control"))
    ctx.fact(C.RolesReady, ready, "Ready" if ready else "NotReady", "canary and control are ready" if ready
             else "a canary or control pod is not ready: it serves no one until it is")
    live = world.live
    if live is not None and live.edges is not None and progress.live_edges is None:
        progress.live_edges = list(live.edges)  # fixed before any window is compared
    if live is not None and _aborted(ctx):
        return
    if live is not None and live.results is not None:
        _table(ctx, live.results, live.windows)
    elapsed = ctx.since(progress.measuring_since)
    settled = live is not None and live.results is not None and _settled(live.results)
    if settled and elapsed >= spec.load.step_duration:
        ctx.transition(Phase.Deciding, "Measured", "every offered-load stratum the traffic visited has an answer")
        ctx.wait(0)
        return
    if elapsed >= spec.analysis.deadline:
        ctx.transition(Phase.Deciding, "Deadline", "analysis deadline reached: strata without an answer are Pending")
        ctx.wait(0)
        return
    windows = live.windows if live is not None else 0
    ctx.status.message = (f"live: {windows} window(s) of the fleet's traffic compared"
                          + (f" ({live.note})" if live is not None and live.note else ""))
    # the abort is checked every checkInterval, and a window closes every sampleInterval
    left = spec.analysis.deadline - elapsed
    ctx.wait(max(0.5, min(_seconds(spec.analysis.abort.check_interval), _seconds(left))))


def _settled(results: LiveResults) -> bool:
    """Every stratum the traffic visited has an answer (Wins, NoGain or Regresses), and one did."""
    visited = [s for s in results.strata if s.visited]
    return bool(visited) and all(s.outcome.settled for s in visited)


def _aborted(ctx: PassContext) -> bool:
    """The safety abort (``livesplit.abort_reason`` on the last ``analysis.abort.window`` of each
    arm): the canary's share goes at once (canary and control deleted: their pods leave the
    Service), CanaryHealthy=False and a Warning Event say why, and the policy ends RolledBack with
    the fleet untouched (``status.rollback`` holds the reason, the sentence and when)."""
    live = ctx.world.live
    if live is None or live.canary_recent is None or live.control_recent is None:
        return False
    reason = livesplit.abort_reason(live.canary_recent, live.control_recent, ctx.spec.analysis.abort)
    if reason is None:
        ctx.fact(C.CanaryHealthy, True, "WithinAbortThresholds",
                 f"the canary's errors, time to first token and per-token latency over the last "
                 f"{_seconds(ctx.spec.analysis.abort.window):.0f}s are within analysis.abort")
        return False
    message = f"live: {reason.message}: the canary's share of traffic was removed"
    ctx.fact(C.CanaryHealthy, False, reason.reason, message)
    ctx.events.append(("Warning", reason.reason, message))
    _roll_back(ctx, reason.reason, message)
    return True


def _table(ctx: PassContext, results: LiveResults, windows: int) -> None:
    """status.live's per-stratum table, the enabled run and the crossover, as of this pass."""
    live = ctx.status.live or LiveStatus()
    rows = []
    for s in results.strata:
        lat, rate, ttft = s.latency, s.token_rate, s.ttft
        rows.append(LiveStratum(
            index=s.index, offered_low=round(s.low, 6), offered_high=None if math.isinf(s.high) else round(s.high, 6),
            windows=s.windows, pairs=s.pairs, outcome=s.outcome.value,
            latency_change=_r(lat.estimate), latency_interval=[_r(x) for x in lat.interval] if lat.interval else None,
            token_rate_change=_r(rate.estimate), ttft_change=_r(ttft.estimate),
            control_running=_r(s.control_running), canary_running=_r(s.canary_running),
            requests_control=s.requests[0], requests_canary=s.requests[1]))
    c = results.crossover
    ctx.status.live = live.model_copy(update={
        "windows": windows, "strata": rows,
        "enabled_below": None if results.enabled_below is None or math.isinf(results.enabled_below)
        else round(results.enabled_below, 6),
        "crossover_offered": round(c.offered_load, 6) if c is not None else None,
        "crossover_batch": _r(c.control_running) if c is not None else None})


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 6)


__all__ = ["_live_split", "_measuring_live"]
