"""Deciding: the measured decision becomes an outcome: promote (after approval, if required),
stop without touching the fleet, or roll back."""

from __future__ import annotations

from lookahead_operator.controller.statemachine.cleanup import _stop
from lookahead_operator.controller.statemachine.clocks import _new_load_run, _reset_guard_legs, _seconds
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.statemachine.live import _aborted
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.api.spec import LoadMode
from lookahead_operator.api.status import DecisionAction, Phase


def _deciding(ctx: PassContext) -> None:
    world, spec = ctx.world, ctx.spec
    # (split gatewayAPI: a decision that ends the rollout restores the route in _stop/_roll_back; a
    # promotion keeps it split, the control serving its share for the guard, until the guard ends)
    if world.decision is None:
        ctx.wait(world.poll_s)
        return
    decision_id = f"{world.fingerprint[:8] or 'g' + str(world.generation)}-{world.decision.action}"
    d = world.decision.model_copy(update={"decided_at": world.now, "id": decision_id})
    ctx.status.decision = d
    ctx.status.crossover_batch_size = d.crossover_batch_size
    ctx.act(ActionKind.DELETE_LOAD)
    action, mode = d.action, spec.promotion.mode
    if action in (DecisionAction.Promote, DecisionAction.PromoteRegimeAware):
        if mode == "analysisOnly":
            _stop(ctx, Phase.Succeeded, str(action),
                  f"{d.reason} (promotion.mode analysisOnly: the fleet is not touched)", warning=False)
            return
        if mode == "full" and action == DecisionAction.PromoteRegimeAware:
            _stop(ctx, Phase.RolledBack, "NotPromoted",
                  f"{d.reason} promotion.mode is full, so a regime-aware win is not promoted")
            return
        approved = world.approved_decision == d.id
        if spec.promotion.require_approval and not approved:
            live = spec.load.mode == LoadMode.live
            # live mode: canary and control still serve their share of the users while the decision
            # waits, so the safety abort goes on, every abort.checkInterval (observe reads the arms)
            if live and _aborted(ctx):
                return
            ctx.fact(C.Approved, False, "AwaitingApproval",
                     f"decision {action}: run `kubectl lookahead approve {world.name} -n {world.namespace}` to promote")
            ctx.wait(_seconds(spec.analysis.abort.check_interval) if live else None)
            return
        ctx.fact(C.Approved, True, "Approved" if approved else "NotRequired", "promotion may go on")
        ctx.progress.wave, ctx.progress.wave_started_at = 0, world.now
        _new_load_run(ctx.progress)
        _reset_guard_legs(ctx)
        ctx.status.current_wave = 1
        ctx.transition(Phase.Promoting, str(action), d.reason)
        ctx.wait(0)
        return
    # Rollback, Inconclusive, NotACandidate: never promote; the fleet is untouched.
    if action == DecisionAction.Inconclusive:
        _stop(ctx, Phase.Failed, "Inconclusive", d.reason)
    elif action == DecisionAction.NotACandidate:
        _stop(ctx, Phase.NotACandidate, "NotACandidate", d.reason, warning=False)
    else:
        _stop(ctx, Phase.RolledBack, "CanaryRegressed", d.reason)
