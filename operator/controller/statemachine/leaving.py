"""What a pass does about targets their users edited mid-rollout (``user_edits``): they are left
to them (released, recorded in ``status.targets`` and ``TargetsEdited``), and a guard that drove
one starts afresh."""

from __future__ import annotations

from lookahead_operator.controller.statemachine.clocks import _new_load_run, _reset_guard_legs
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.user_edits import edited_now, recorded_user_edits
from lookahead_operator.controller.world import MID_ROLLOUT, ActionKind
from lookahead_operator.api.status import Phase, TargetStatus


def _note_user_edits(ctx: PassContext) -> None:
    """Leave the targets their users edited to them (once per pass): each one still carrying our
    marks is released (``LEAVE``: annotations only), its ``status.targets`` row says ``userEdited``
    (and no longer promoted: it is not in our care), and ``TargetsEdited`` names them all. When the
    promoted target the guard drives is among the new ones, the guard's load and clock start afresh
    (on the newest promoted target still in play): its pods are being replaced by the user's."""
    if ctx.user_edits_noted or not ctx.left_to_users:
        return
    ctx.user_edits_noted = True
    world, progress = ctx.world, ctx.progress
    recorded = recorded_user_edits(world.status)
    ours = edited_now(world.targets, world.key)
    if ours:
        ctx.act(ActionKind.LEAVE, targets=ours)  # (gives back what it lent to a wave Deployment)
    waves = [t.key for t in world.targets if t.key in ctx.left_to_users and t.wave_replicas is not None]
    if waves:  # its lookahead pods run a template that is no longer its user's
        ctx.act(ActionKind.DELETE_WAVES, targets=waves)
    engines = {t.key: t.engine for t in world.targets}
    rows = {(r.namespace, r.name): r for r in ctx.status.targets or []}
    for key in ctx.left_to_users:
        row = rows.get(key) or TargetStatus(namespace=key[0], name=key[1], engine=engines.get(key))
        rows[key] = row.model_copy(update={"user_edited": True, "promoted": False, "wave": None})
    ctx.status.targets = [rows[k] for k in sorted(rows)]
    names = ", ".join(f"{ns}/{n}" for ns, n in sorted(ctx.left_to_users))
    ctx.fact(C.TargetsEdited, True, "UserEdited",
             f"left to their users, whose edits of the pod template win (not promoted, not restored, released): "
           f"{names}")
    new = ctx.left_to_users - recorded
    if not new:
        return
    ctx.events.append(("Warning", "UserEdited", "pod template edited by its user mid-rollout; left to them: "
                       + ", ".join(f"{ns}/{n}" for ns, n in sorted(new))))
    driven = max((t.key for t in world.targets if t.promoted and t.key not in recorded), default=None)
    if ctx.phase in MID_ROLLOUT and driven in new:
        ctx.act(ActionKind.DELETE_LOAD)
        _new_load_run(progress)
        _reset_guard_legs(ctx)
        if ctx.phase == Phase.Promoting:
            progress.wave_started_at = world.now
        else:
            progress.guard_started_at = world.now
        ctx.ignore_guard = True
