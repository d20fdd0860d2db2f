"""The first phases: Pending (find and claim the targets) and Preflight (is the workload a
candidate, and which batch sizes to measure)."""

from __future__ import annotations

from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.api.status import Decision, DecisionAction, Phase, TargetStatus


def _pending(ctx: PassContext) -> None:
    world = ctx.world
    if not world.targets:
        ctx.fact(C.TargetsFound, False, "NoTargets", "no Deployment matches spec.targets yet")
        ctx.wait(world.poll_s)
        return
    taken = [t for t in world.targets if t.owner and t.owner != world.key]
    if taken:
        names = ", ".join(f"{t.namespace}/{t.name} (owned by {t.owner})" for t in taken)
        ctx.fact(C.TargetsFound, False, "Conflict",
                 f"refused: another LookaheadPolicy owns {names}; a Deployment can be owned by one policy only")
        ctx.wait(world.poll_s)
        return
    engines = sorted({t.engine or "unknown" for t in world.targets})
    ctx.fact(C.TargetsFound, True, "Found", f"{len(world.targets)} Deployment(s), engine {', '.join(engines)}")
    ctx.act(ActionKind.CLAIM, targets=[t.key for t in world.targets])
    ctx.progress.fingerprint, ctx.progress.fingerprint_generation = world.fingerprint, world.generation
    ctx.progress.started_at = world.now
    ctx.status.targets = [TargetStatus(namespace=t.namespace, name=t.name, engine=t.engine, promoted=False,
                                        replicas=t.replicas)
                          for t in sorted(world.targets, key=lambda t: t.key)]
    ctx.transition(Phase.Preflight, "TargetsClaimed",
                   f"claimed {len(world.targets)} Deployment(s); checking the workload")
    ctx.wait(0)


def _preflight(ctx: PassContext) -> None:
    world, spec = ctx.world, ctx.spec
    if world.preflight is None:
        ctx.wait(world.poll_s)
        return
    ctx.status.preflight = world.preflight.status
    if not world.preflight.status.candidate:
        ctx.act(ActionKind.RELEASE, targets=[t.key for t in world.targets])
        reasons = "; ".join(world.preflight.status.reasons or []) or "preflight said no"
        ctx.status.decision = Decision(action=DecisionAction.NotACandidate, reason=reasons, decided_at=world.now)
        ctx.transition(Phase.NotACandidate, world.preflight.status.verdict or "NotACandidate", reasons)
        return
    sizes = list(spec.load.batch_sizes or world.preflight.batch_sizes or [1])
    fit = max(1, int(spec.analysis.deadline / spec.load.step_duration))
    note = ""
    if len(sizes) > fit:  # auto sizes: measure what the deadline leaves room for, smallest first
        note = f" (auto batch sizes {sizes} cut to {sizes[:fit]}: analysis.deadline fits {fit} steps)"
        sizes = sizes[:fit]
    ctx.progress.batch_sizes = sizes
    ctx.act(ActionKind.ENSURE_ROLES)
    ctx.transition(Phase.Launching, "CandidateConfirmed",
                   f"preflight {world.preflight.status.verdict or 'Unknown'}; launching canary and control; "
                   f"batch sizes {sizes}{note}")
    ctx.wait(world.poll_s)
