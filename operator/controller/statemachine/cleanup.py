"""Giving the fleet back: a rollout that stops or rolls back restores what it promoted, deletes its
objects and releases its targets (``_clean_up``, ``_stop``, ``_roll_back``), and what deleting a
policy does (``deletion_plan``, pure)."""

from __future__ import annotations

from lookahead_operator.controller.statemachine.context import PassContext
from lookahead_operator.controller.statemachine.leaving import _note_user_edits
from lookahead_operator.controller.statemachine.user_edits import edited_now, recorded_user_edits
from lookahead_operator.controller.world import MID_ROLLOUT, Action, ActionKind, Target
from lookahead_operator.api.status import LookaheadPolicyStatus, Phase, RollbackStatus


def _clean_up(ctx: PassContext) -> list[tuple[str, str]]:
    """Put the cluster back exactly: promoted targets restored, our objects deleted, targets released.
    Targets left to their users are not restored (their user's template stays) but released.
    Returns what was restored."""
    world = ctx.world
    ctx.actions = [a for a in ctx.actions if a.kind not in (ActionKind.ENSURE_ROLES, ActionKind.ENSURE_LOAD,
                                                         ActionKind.ENSURE_GUARD_LOAD, ActionKind.PROMOTE,
                                                         ActionKind.ENSURE_ARM_BACKENDS, ActionKind.SPLIT_ROUTE)]
    ctx.restore_route()  # gatewayAPI: the canary's share of traffic goes first
    _note_user_edits(ctx)
    promoted = [t.key for t in world.targets if t.owner == world.key and t.promoted and t.key not in ctx.left_to_users]
    _restore(ctx, promoted)
    ctx.act(ActionKind.DELETE_LOAD)
    ctx.delete_roles()
    # (the handler releases only what this policy owns and never drops a promoted one's saved template)
    rest = [t.key for t in world.targets if t.key not in ctx.left_to_users]
    if rest:
        ctx.act(ActionKind.RELEASE, targets=rest)
    ctx.status.targets = [r.model_copy(update={"promoted": False}) for r in ctx.status.targets or []] or None
    return promoted


def _restore(ctx: PassContext, promoted: list[tuple[str, str]]) -> None:
    """Restore the ``promoted`` targets (which gives back what each lent to its wave Deployment),
    then delete the policy's wave Deployments, if any is seen or any target was promoted."""
    if promoted:
        ctx.act(ActionKind.RESTORE, targets=promoted)
    if promoted or any(t.wave_replicas is not None for t in ctx.world.targets):
        ctx.act(ActionKind.DELETE_WAVES)


def _stop(ctx: PassContext, phase: Phase, reason: str, message: str, warning: bool = True) -> None:
    """End in ``phase`` with the fleet as it was (nothing promoted may remain)."""
    restored = _clean_up(ctx)
    if restored:
        message += f"; restored {len(restored)} Deployment(s) to their saved templates"
    ctx.transition(phase, reason, message, warning=warning)


def _roll_back(ctx: PassContext, reason: str, message: str) -> None:
    restored = _clean_up(ctx)
    ctx.status.rollback = RollbackStatus(reason=reason, message=message, at=ctx.world.now,
                                         restored=[f"{ns}/{n}" for ns, n in restored] or None)
    outcome = f"; restored {len(restored)} Deployment(s) to their saved templates" if restored \
        else "; the fleet was not touched"
    ctx.transition(Phase.RolledBack, reason, message + outcome, warning=True)


def deletion_plan(status: LookaheadPolicyStatus, targets: list[Target], me: str) -> list[Action]:
    """What deleting a policy does (pure): its canary, control and load Jobs go (with ``split:
    gatewayAPI`` the HTTPRoute restored before them, the arms' backends after). Mid-rollout
    (Promoting or Guarding) promoted Deployments are restored to their saved templates, since no
    guard will watch them any more; after Succeeded lookahead stays on and only our ownership mark
    goes (the saved template stays, to put back by hand); never-promoted targets are released.
    A target whose pod template its user edited (now, or recorded in ``status.targets``) is never
    restored: all our marks go and its template stays the user's."""
    left = recorded_user_edits(status) | frozenset(edited_now(targets, me))
    ours = [t for t in targets if t.owner == me]
    edited = [t.key for t in ours if t.key in left]
    ours = [t for t in ours if t.key not in edited]
    promoted = [t.key for t in ours if t.promoted]
    carved = tuple(sorted(t.key for t in targets if t.carved and t.owner in (me, None)))
    plan = [Action(ActionKind.DELETE_LOAD), Action(ActionKind.DELETE_ROLES, targets=carved)]
    route = status.live.route if status.live is not None else None
    if route:  # gatewayAPI: the route as it was first (from its annotation), the arms' backends after the arms
        ns, _, name = route.partition("/")
        plan = [Action(ActionKind.RESTORE_ROUTE, route=(ns, name)), *plan, Action(ActionKind.DELETE_ARM_BACKENDS)]
    if edited:
        plan.append(Action(ActionKind.LEAVE, targets=tuple(sorted(edited))))
    if promoted and status.phase in MID_ROLLOUT | {Phase.Pending, Phase.Preflight, Phase.Launching,
                                                   Phase.Measuring, Phase.Deciding}:
        plan.append(Action(ActionKind.RESTORE, targets=tuple(sorted(promoted))))
    elif promoted:
        plan.append(Action(ActionKind.DISOWN, targets=tuple(sorted(promoted))))
    # after the restore that gave their replicas back (a target promoted whole has none; a wave
    # Deployment in another namespace than the policy's has no owner reference to collect it)
    plan.append(Action(ActionKind.DELETE_WAVES))
    rest = [t.key for t in ours if not t.promoted]
    if rest:
        plan.append(Action(ActionKind.RELEASE, targets=tuple(sorted(rest))))
    return plan
