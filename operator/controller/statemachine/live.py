"""Live mode (``load.mode: live``): canary and control serve a share of the fleet's real traffic
instead of our load. Preflight fixes the split (``_live_split``): with ``split: service`` replicas per
arm from ``load.livePercent`` (the arm pods join the fleet's Service); with ``split: gatewayAPI``
(``_gateway_split``) the weights of one rule of the user's HTTPRoute, exact, and the arms' own
backends. Launching writes the route once both arms are ready (``_route_split``); Measuring
(``_measuring_live``) reads every window since both serve, checks the safety abort every
``analysis.abort.checkInterval``, keeps ``status.live`` (the per-stratum table) and goes to Deciding
once every visited stratum is settled (after ``load.stepDuration`` at least) or at
``analysis.deadline``; Deciding decides from that table (``measurement.live.decision``). The route
stays split through a promotion's waves and guard (the guard's control serves its share beside the
promoted pods); every exit, and the guard's end, restores it first (``PassContext.restore_route``,
``cleanup``)."""

from __future__ import annotations

import math

from lookahead_operator.api.spec import LoadMode, LoadSplit, LookaheadPolicySpec
from lookahead_operator.api.status import LiveStatus, LiveStratum, Phase
from lookahead_operator.controller import livesplit
from lookahead_operator.controller.statemachine.cleanup import _roll_back, _stop
from lookahead_operator.controller.statemachine.clocks import _seconds, launch_deadline, spell
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
    if spec.load.split == LoadSplit.gateway_api:
        return _gateway_split(ctx)
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


def _policy(ctx: PassContext) -> dict:
    """The policy as the pure builders name its objects by (its name and namespace; no uid: what the
    state machine builds with it is checked, never written: the actions build from the real object)."""
    return {"metadata": {"name": ctx.world.name, "namespace": ctx.world.namespace, "uid": ""}}


def _gateway(ctx: PassContext) -> bool:
    return ctx.spec.load.split == LoadSplit.gateway_api and ctx.spec.load.gateway_api is not None


def _refuse_split(ctx: PassContext, exc: livesplit.LiveSplitError) -> bool:
    ctx.act(ActionKind.RELEASE, targets=[t.key for t in ctx.world.targets])
    ctx.fact(C.Accepted, False, "LiveSplitRefused", str(exc))
    ctx.transition(Phase.Failed, "LiveSplitRefused", f"{exc}; nothing was created", warning=True)
    return False


def _gateway_split(ctx: PassContext) -> bool:
    """Preflight, ``split: gatewayAPI``: the route's rule and the fleet's backend as read now must
    give the split (``livesplit.gateway_split``: exact integer weights; ``arm_backends``: a backend
    per arm); the share, the route and the arm replicas (``livesplit.gateway_arm_replicas``) are
    fixed in ``status.live``. A route or backend that is missing or unreadable, a rule without the
    fleet's backendRef, a backend that selects on our labels: Failed (Accepted=False, the field
    named), nothing created, the route untouched."""
    world, spec = ctx.world, ctx.spec
    gw = spec.load.gateway_api
    source = role_source(world)
    percent = spec.load.live_percent or 0.0
    try:
        if world.live_gateway_refusal is not None:
            raise livesplit.LiveSplitError(*world.live_gateway_refusal)
        if source is None:
            raise livesplit.LiveSplitError("spec.targets", "no target to clone canary and control from")
        if world.live_route is None or world.live_backend is None:
            raise livesplit.LiveSplitError("spec.load.gatewayAPI.httpRouteRef", "the HTTPRoute was not read")
        split = livesplit.gateway_split(world.live_route, _policy(ctx), gw, source.namespace, percent,
                                        world.live_backend)
        livesplit.arm_backends(_policy(ctx), gw, source.namespace, world.live_backend)
        replicas = livesplit.gateway_arm_replicas(source.replicas + source.carved, percent, spec.canary.capacity)
    except livesplit.LiveSplitError as exc:
        return _refuse_split(ctx, exc)
    w = split.weights
    ns, name = livesplit.route_ref(gw, world.namespace)
    rule = f"rule {split.saved.rule_name!r}" if split.saved.rule_name else f"rule {split.rule_index}"
    ctx.status.live = LiveStatus(
        split="gatewayAPI", share=round(w.share, 6), arm_replicas=replicas, route=f"{ns}/{name}",
        message=f"through HTTPRoute {ns}/{name} {rule}: the fleet's backendRef weight {w.fleet}, canary and control "
                f"{w.arm} each ({w.share * 100:.4g}% of the fleet's traffic each), {gw.arm_kind.value} arms of "
                f"{replicas} replica{'s' if replicas != 1 else ''}")
    return True


def _ensure_arms(ctx: PassContext) -> None:
    """Canary and control exist; with ``split: gatewayAPI`` their own backends first (while an arm
    is being made: not asked again on every pass once both are there)."""
    if _gateway(ctx) and (ctx.phase in (Phase.Preflight, Phase.Launching)
                          or not all(ctx.world.roles_present.get(r) for r in ("canary", "control"))):
        ctx.act(ActionKind.ENSURE_ARM_BACKENDS)
    ctx.act(ActionKind.ENSURE_ROLES)


def _wanted_split(ctx: PassContext, namespace: str) -> livesplit.RouteSplit:
    """The split Preflight fixed, of the route as read this pass (raises ``LiveSplitError`` when the
    route can no longer give it): what Launching writes and what Measuring checks is still there."""
    world = ctx.world
    return livesplit.gateway_split(world.live_route, _policy(ctx), ctx.spec.load.gateway_api, namespace,
                                   ctx.spec.load.live_percent or 0.0, world.live_backend)


def _route_split(ctx: PassContext) -> bool:
    """Launching, ``split: gatewayAPI``, both arms ready: is the route's rule split as Preflight
    fixed it (read this pass)? If not, write it (``SPLIT_ROUTE``: saved, then re-weighted, one
    update carrying the resourceVersion read) and look again. A route that can no longer be split
    (its rule or the fleet's backendRef gone) ends Failed, arms deleted; one that cannot be read or
    written is waited for up to the launch deadline, then Failed the same way: the route restored."""
    world, gw = ctx.world, ctx.spec.load.gateway_api
    route = livesplit.route_ref(gw, world.namespace)
    source = role_source(world)
    if world.live_route is not None and source is not None:
        try:
            want = _wanted_split(ctx, source.namespace)
        except livesplit.LiveSplitError as exc:
            ctx.fact(C.Accepted, False, "LiveSplitRefused", str(exc))
            _stop(ctx, Phase.Failed, "LiveSplitRefused", f"{exc}; canary and control were deleted and the route "
                                                         "restored")
            return False
        if livesplit.route_split_in_place(world.live_route, want):
            return True
    limit, limit_from = launch_deadline(ctx)
    why = ": ".join(world.live_gateway_refusal) if world.live_gateway_refusal else "not written yet"
    if ctx.since(ctx.progress.phase_since) >= limit:
        _stop(ctx, Phase.Failed, "RouteNotSplit", f"HTTPRoute {route[0]}/{route[1]} was not split within "
                                                  f"{spell(limit)} ({limit_from}): {why}; canary and control were "
                                                  "deleted and the route restored")
        return False
    ctx.act(ActionKind.SPLIT_ROUTE, route=route)
    ctx.fact(C.RolesReady, True, "Ready", f"canary and control are ready; HTTPRoute {route[0]}/{route[1]}: {why}")
    ctx.wait(1.0)
    return False


def _measuring_live(ctx: PassContext) -> None:
    world, spec, progress = ctx.world, ctx.spec, ctx.progress
    _ensure_arms(ctx)
    ready = all(world.roles_ready.get(r) for r in ("canary", "control"))
    ctx.fact(C.RolesReady, ready, "Ready" if ready else "NotReady", "canary and control are ready" if ready
             else "a canary or control pod is not ready: it serves no one until it is")
    live = world.live
    if live is not None and live.edges is not None and progress.live_edges is None:
        progress.live_edges = list(live.edges)  # fixed before any window is compared
    if _aborted(ctx):
        return
    if _gateway(ctx) and _route_changed(ctx):
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


def _route_changed(ctx: PassContext) -> bool:
    """Measuring, ``split: gatewayAPI``: the route as read this pass must still be the split
    Launching wrote. Someone else changed it (a user; a GitOps tool putting back what is in git; the
    route deleted): the arms no longer get the share the windows are read as, so the measurement
    ends, Failed (RouteChanged): canary and control deleted, the route restored from its annotation
    where it still has one (a route put back whole has none, and is left as it is). Not rewritten:
    the operator does not fight whoever owns the route. A route that could not be read this pass
    is read again on the next one (the deadline bounds it)."""
    world, gw = ctx.world, ctx.spec.load.gateway_api
    ns, name = livesplit.route_ref(gw, world.namespace)
    source = role_source(world)
    if world.live_route_gone:
        why = "it was deleted"
    elif world.live_route is None or source is None:
        return False
    else:
        try:
            want = _wanted_split(ctx, source.namespace)
        except livesplit.LiveSplitError as exc:
            why = str(exc)
        else:
            if livesplit.route_split_in_place(world.live_route, want):
                return False
            why = "its rule is no longer the split the operator wrote"
    _stop(ctx, Phase.Failed, "RouteChanged",
          f"live: HTTPRoute {ns}/{name} changed while measuring ({why}): the arms no longer get "
          f"{(ctx.spec.load.live_percent or 0.0) * 100:g}% each, so their windows mean nothing; canary and control "
          "were deleted and the route restored from its annotation where it still had one; lookahead stays off")
    return True


def _settled(results: LiveResults) -> bool:
    """Every stratum the traffic visited has an answer (Wins, NoGain or Regresses), and one did."""
    visited = [s for s in results.strata if s.visited]
    return bool(visited) and all(s.outcome.settled for s in visited)


def _aborted(ctx: PassContext) -> bool:
    """The safety abort (``livesplit.abort_reason`` on the last ``analysis.abort.window`` of each
    arm, and ``livesplit.blind_reason``: no reading of both arms for ``analysis.abort.maxBlind``
    while they serve): the canary's share goes at once (``split: gatewayAPI``: the route restored
    first, in the same pass; canary and control deleted: their pods leave the Service),
    CanaryHealthy=False and a Warning Event say why, and the policy ends RolledBack with the fleet
    untouched (``status.rollback`` holds the reason, the sentence and when)."""
    live, progress, abort = ctx.world.live, ctx.progress, ctx.spec.analysis.abort
    judged = live is not None and live.canary_recent is not None and live.control_recent is not None
    if judged and live.seen_until is not None and (progress.abort_seen_until is None
                                                   or live.seen_until > progress.abort_seen_until):
        progress.abort_seen_until = live.seen_until
    reason = (livesplit.blind_reason(progress.abort_seen_until, progress.measuring_since, ctx.world.now, abort,
                                     _unseen(ctx))
              or (livesplit.abort_reason(live.canary_recent, live.control_recent, abort) if judged else None))
    if reason is None:
        if judged:
            ctx.fact(C.CanaryHealthy, True, "WithinAbortThresholds",
                     f"the canary's errors, time to first token and per-token latency over the last "
                     f"{_seconds(abort.window):.0f}s are within analysis.abort")
        return False
    message = f"live: {reason.message}: the canary's share of traffic was removed"
    ctx.fact(C.CanaryHealthy, False, reason.reason, message)
    ctx.events.append(("Warning", reason.reason, message))
    _roll_back(ctx, reason.reason, message)
    return True


def _unseen(ctx: PassContext) -> str:
    """What kept the abort from seeing both arms this pass, in words (for ``blind_reason``)."""
    world = ctx.world
    if world.read_errors:
        return "; ".join(f"{e.source}: {e.message}" for e in world.read_errors)
    if world.live is None:
        return "the arms' metrics were not read"
    if world.live.seen_until is None:
        return "Prometheus has no live series of an arm's pods (not scraped, or their targets are down)"
    return f"Prometheus has scraped both arms only up to {world.live.seen_until.isoformat()}"


def watches_live_arms(phase: Phase, spec: LookaheadPolicySpec | None) -> bool:
    """Live mode's canary and control serve their share of the users in ``phase`` (Measuring, and
    Deciding: a decision waiting for approval, or paused there), so the safety abort reads them on
    every pass. The one rule for it: ``observe`` reads the abort's windows by it, the pause keeps the
    abort by it, and ``core.reads_prometheus`` counts those passes as reading Prometheus."""
    return spec is not None and spec.load.mode == LoadMode.live and phase in (Phase.Measuring, Phase.Deciding)


def _watch_paused(ctx: PassContext) -> None:
    """Paused while canary and control serve users (``watches_live_arms``): the pause freezes the
    measurement's clocks, never the safety abort, which goes on every ``analysis.abort.checkInterval``
    (blind included)."""
    if not watches_live_arms(ctx.phase, ctx.spec):
        return
    if not _aborted(ctx):
        ctx.wait(_seconds(ctx.spec.analysis.abort.check_interval))


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


__all__ = ["_ensure_arms", "_gateway", "_live_split", "_measuring_live", "_route_split", "_watch_paused",
           "watches_live_arms"]
