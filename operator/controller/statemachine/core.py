"""One reconcile pass: what every pass checks before its phase's handler (a spec that cannot be
acted on, a changed spec, targets that start matching mid-rollout, abort, pause, read errors,
targets their users edited), then the handler of the current phase (``_PHASES``)."""

from __future__ import annotations

from dataclasses import replace

from lookahead_operator.controller.statemachine.cleanup import _clean_up, _restore, _roll_back, _stop
from lookahead_operator.controller.statemachine.clocks import _paused
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.deciding import _deciding
from lookahead_operator.controller.statemachine.guarding import _guarding
from lookahead_operator.controller.statemachine.leaving import _note_user_edits
from lookahead_operator.controller.statemachine.live import _measuring_live, _watch_paused, watches_live_arms
from lookahead_operator.controller.statemachine.measuring import _launching, _measuring
from lookahead_operator.controller.statemachine.pending import _pending, _preflight
from lookahead_operator.controller.statemachine.promoting import _promoting
from lookahead_operator.controller.statemachine.user_edits import in_play
from lookahead_operator.controller.world import ActionKind, Need, Observed, Plan
from lookahead_operator.api.spec import LoadMode, LookaheadPolicySpec
from lookahead_operator.api.status import TERMINAL_PHASES, LookaheadPolicyStatus, Phase


#: Which measurement each phase needs (phases not listed need none).
NEEDS: dict[Phase, Need] = {
    Phase.Preflight: Need.PREFLIGHT,
    Phase.Measuring: Need.STEP,
    Phase.Deciding: Need.DECISION,
    Phase.Promoting: Need.GUARD,
    Phase.Guarding: Need.GUARD,
}


def need(phase: Phase, spec: LookaheadPolicySpec | None) -> Need | None:
    """What ``phase`` needs measured (``NEEDS``), live mode's Measuring reading live traffic."""
    if phase == Phase.Measuring and spec is not None and spec.load.mode == LoadMode.live:
        return Need.LIVE
    return NEEDS.get(phase)


def reads_prometheus(phase: Phase, spec: LookaheadPolicySpec | None) -> bool:
    """Whether a pass in ``phase`` queries Prometheus: every phase that measures, and the passes
    where the live safety abort watches the arms (``watches_live_arms``). ``observe`` builds the
    Prometheus access by it; ``MetricsAvailable`` clears on a pass that read it without error."""
    return need(phase, spec) in (Need.PREFLIGHT, Need.STEP, Need.GUARD, Need.LIVE) or watches_live_arms(phase, spec)


def reconcile(world: Observed) -> Plan:
    ctx = PassContext(world)
    if world.spec is None or world.spec_error:
        return _refuse(ctx, "InvalidSpec", world.spec_error or "the spec could not be parsed")
    spec = world.spec
    if world.support_problems and ctx.phase in (Phase.Pending, Phase.Preflight):
        return _refuse(ctx, "EngineUnsupported", "; ".join(world.support_problems))
    waiting = ctx.phase == Phase.Pending and (
        ("NamespaceNotAllowed", world.namespace_refusal) if world.namespace_refusal  # controller.tenancy
        else ("WaitingForReadyPod", world.version_wait) if world.version_wait else None)
    if waiting:  # before anything is claimed: nothing is read or touched in a refused namespace
        ctx.fact(C.Accepted, True, "Valid", "the spec is valid")
        ctx.fact(C.TargetsFound, False, *waiting)
        ctx.wait(world.poll_s)
        return ctx.plan()
    ctx.fact(C.Accepted, True, "Valid", "the spec is valid")
    if ctx.phase not in (Phase.Pending, *TERMINAL_PHASES) and ctx.status.targets:
        _leave_new_targets_alone(ctx)

    # A changed spec restarts measurement: nothing measured under the old spec is mixed in.
    # (The fingerprint leaves out `paused`: pausing and resuming does not restart anything.)
    measured = ctx.progress.fingerprint
    if measured is not None and ctx.phase != Phase.Pending:
        if measured == world.fingerprint:
            ctx.progress.fingerprint_generation = world.generation
        elif ctx.progress.fingerprint_generation == world.generation:
            # No write to the spec since it last hashed the same (the apiserver bumps the
            # generation on every spec write): the new hash comes from a default this CRD or
            # operator version adds, not from the user. Adopt it; restart nothing.
            ctx.progress.fingerprint = world.fingerprint
            ctx.events.append(("Normal", "SpecDefaulted", "the spec reads with a new default (a CRD or operator "
                                                          "upgrade) and no change of its own: measurement goes on"))
        else:
            return _restart(ctx)

    if world.abort_requested and ctx.phase not in TERMINAL_PHASES:
        _roll_back(ctx, "Aborted", "aborted by `kubectl lookahead abort`")
        return ctx.plan()

    if ctx.phase not in TERMINAL_PHASES and _paused(ctx):
        _watch_paused(ctx)  # live: the arms still serve users, so the safety abort goes on
        return ctx.plan()

    if world.read_errors:
        ctx.progress.read_errors = (ctx.progress.read_errors or 0) + 1
        ctx.fact(C.MetricsAvailable, False, "ReadFailed",
                 "; ".join(f"{e.source}: {e.message}" for e in world.read_errors)
                 + f" ({ctx.progress.read_errors} pass(es) in a row; deadlines still apply, nothing is promoted "
                   "without data)")
    elif reads_prometheus(ctx.phase, spec):
        ctx.progress.read_errors = None
        ctx.fact(C.MetricsAvailable, True, "Read", "Prometheus answered")

    if ctx.phase not in TERMINAL_PHASES and ctx.phase != Phase.Pending and ctx.left_to_users:
        _note_user_edits(ctx)
        if not in_play(world):
            _stop(ctx, Phase.Failed, "UserEdited",
                  f"every target was edited by its user mid-rollout and is left to them "
                  f"({', '.join(f'{ns}/{n}' for ns, n in sorted(ctx.left_to_users))}); nothing is left to roll out")
            return ctx.plan()

    handler = _PHASES.get(ctx.phase)
    if handler is not None:
        handler(ctx)
    return ctx.plan()


def _leave_new_targets_alone(ctx: PassContext) -> None:
    """A rollout acts on the Deployments it claimed (``status.targets``) and on no other. One that
    starts matching ``spec.targets`` mid-rollout was not part of the preflight or of the plan the
    waves were cut from: it is left alone (never claimed, promoted or restored) and named in
    TargetsFound; a change to the spec restarts the rollout, which then includes it. (A claimed
    target that stops matching stays ours to put back: observe keeps it.)"""
    claimed = {(t.namespace, t.name) for t in ctx.status.targets or []}
    new = [t for t in ctx.world.targets if t.key not in claimed and t.owner != ctx.world.key]
    if not new:
        return
    ctx.world = replace(ctx.world, targets=[t for t in ctx.world.targets if t not in new])
    names = ", ".join(f"{t.namespace}/{t.name}" for t in new[:10]) + (" ..." if len(new) > 10 else "")
    ctx.fact(C.TargetsFound, True, "NewTargetsLeftAlone",
             f"{names} matched spec.targets after this rollout claimed its targets: left alone (not measured, "
           f"not promoted); change the spec to restart the rollout with them")


def _refuse(ctx: PassContext, reason: str, message: str) -> Plan:
    """The spec cannot be acted on: say so, and leave the cluster exact (restore anything promoted)."""
    ctx.fact(C.Accepted, False, reason, message)
    started = ctx.phase not in TERMINAL_PHASES and ctx.phase != Phase.Pending
    if started or any(t.promoted for t in ctx.world.targets if t.owner == ctx.world.key):
        _clean_up(ctx)
    ctx.transition(Phase.Failed, reason, message, warning=True)
    return ctx.plan()


def _restart(ctx: PassContext) -> Plan:
    world = ctx.world
    # (a target its user edited is not restored: the new rollout's claim saves its template as it is)
    promoted = [t.key for t in world.targets
                if t.promoted and t.owner == world.key and t.key not in ctx.left_to_users]
    ctx.restore_route()  # gatewayAPI: the route the old spec split (status.live.route), before anything else
    _restore(ctx, promoted)
    ctx.act(ActionKind.DELETE_LOAD)
    ctx.delete_roles()
    ctx.events.append(("Normal", "SpecChanged", f"spec changed (generation {world.generation}): measurement restarts"))
    kept = [c for c in ctx.status.conditions or [] if c.type != C.TargetsEdited] or None
    ctx.status = LookaheadPolicyStatus(phase=Phase.Pending, message="spec changed: measurement restarts",
                                       conditions=kept, observed_generation=world.generation)
    ctx.wait(0)
    return ctx.plan()


_PHASES = {
    Phase.Pending: _pending,
    Phase.Preflight: _preflight,
    Phase.Launching: _launching,
    Phase.Measuring: lambda ctx: (_measuring_live if ctx.spec.load.mode == LoadMode.live else _measuring)(ctx),
    Phase.Deciding: _deciding,
    Phase.Promoting: _promoting,
    Phase.Guarding: _guarding,
}
