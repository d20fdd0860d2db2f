"""The first phases: Pending (find and claim the targets) and Preflight (is the workload a
candidate, and which batch sizes to measure)."""

from __future__ import annotations

from lookahead_operator.api.spec import LoadMode
from lookahead_operator.controller import livesplit
from lookahead_operator.controller.statemachine.live import _ensure_arms, _live_split
from lookahead_operator.controller.statemachine.context import C, PassContext
from lookahead_operator.controller import fleet
from lookahead_operator.controller.statemachine.user_edits import role_source
from lookahead_operator.controller.world import ActionKind
from lookahead_operator.api.spec import CanaryCapacity
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
    owned = [t for t in world.targets if t.owned_by]
    if owned:  # its owner would put its own template back over every write of ours: claim nothing
        names = "; ".join(f"{t.namespace}/{t.name} is managed by {t.owned_by}" for t in owned)
        ctx.fact(C.TargetsFound, False, "OwnedByController",
                 f"refused: {names}; the operator's changes would be reverted by it: targeting the owner's workload "
                 "is not supported yet (leave it out of spec.targets)")
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
    live = spec.load.mode == LoadMode.live
    if live and not _live_split(ctx):
        return
    short = _carve_out_short(ctx)
    if short:
        ctx.act(ActionKind.RELEASE, targets=[t.key for t in world.targets])
        ctx.fact(C.Accepted, False, "CapacityUnavailable", short)
        ctx.transition(Phase.Failed, "CapacityUnavailable", short, warning=True)
        return
    _pool(ctx)
    _ensure_arms(ctx)
    ctx.transition(Phase.Launching, "CandidateConfirmed",
                   f"preflight {world.preflight.status.verdict or 'Unknown'}; launching canary and control; "
                   + (f"live: {ctx.status.live.message}" if live and ctx.status.live else f"batch sizes {sizes}{note}"))
    ctx.wait(world.poll_s)


def _carve_out_short(ctx: PassContext) -> str | None:
    """With ``canary.capacity: carveOut``, why the fleet cannot give canary and control their
    replicas (the target they are cloned from must keep one serving), else None."""
    spec = ctx.spec
    if spec.canary.capacity != CanaryCapacity.carve_out:
        return None
    source = role_source(ctx.world)
    if source is None:
        return None
    each = livesplit.arm_replicas(spec, ctx.status)
    need = 2 * each
    have = source.replicas + source.carved
    if have <= need:
        return (f"canary.capacity carveOut takes {need} replica(s) (canary and control, {each} each) "
                f"out of {source.namespace}/{source.name}, which has {have}: it must keep one serving. Scale it to "
                f"{need + 1} or more, lower spec.canary.replicas, or use canary.capacity: surge; nothing was created")
    # promoted whole, a target rolls out by its own strategy, while canary and control still hold
    # what was carved out: on a full pool that rollout must not need a spare pod
    for t in sorted(ctx.world.targets, key=lambda t: t.key):
        if t.key in ctx.left_to_users:
            continue
        replicas = have - need if t.key == source.key else t.replicas
        if fleet.rollout_unavailable(t, replicas) == 0:
            return (f"canary.capacity carveOut (a full pool: no spare accelerator): {t.namespace}/{t.name}'s "
                    f"rollout strategy (maxSurge {t.max_surge}, maxUnavailable {t.max_unavailable} of {replicas} "
                    "replicas) takes no pod down before its successor is up, so its promotion would wait for a "
                    "spare GPU forever. Set its spec.strategy.rollingUpdate.maxUnavailable to 1 (and maxSurge to "
                    "0), or use canary.capacity: surge on a pool with room; nothing was created")
    return None


def _pool(ctx: PassContext) -> None:
    """Before canary and control are created: does the pool have what the capacity mode needs?
    ``surge`` needs 2 x canary.replicas fleet pods' worth of each accelerator free; ``carveOut``
    none. Said as the CapacityAvailable condition (and a Warning Event when short); a short pool
    does not stop the launch (an autoscaler may add nodes): the scheduler's verdict on the pods
    follows within a pass of it."""
    world, spec = ctx.world, ctx.spec
    if not world.accelerators:
        return
    pods = 2 * livesplit.arm_replicas(spec, ctx.status)
    if spec.canary.capacity == CanaryCapacity.carve_out:
        ctx.fact(C.CapacityAvailable, True, "CarveOut", f"canary.capacity carveOut: canary and control take {pods} "
                                                         "of the fleet's pods' room; no spare accelerator needed")
        return
    if world.pool is None:
        ctx.fact(C.CapacityAvailable, False, "PoolUnknown", "could not read the pool's free accelerators "
                 f"({world.pool_error or 'no answer'}); canary and control are created and the scheduler will say")
        return
    short = [f"{free} of {total} {name} free, surge needs {pods * each} ({pods} pods x {each})"
             for name, each in sorted(world.accelerators.items())
             for free, total in [world.pool.get(name, (0, 0))] if free < pods * each]
    if not short:
        have = ", ".join(f"{world.pool[n][0]} of {world.pool[n][1]} {n} free" for n in sorted(world.accelerators))
        ctx.fact(C.CapacityAvailable, True, "PoolHasRoom", f"the pool has room for canary and control ({have})")
        return
    message = (f"the pool has {'; '.join(short)}: canary and control will wait for room (an autoscaler may add "
               "it) until the launch deadline; set spec.canary.capacity: carveOut to take their replicas out of "
               "the fleet instead")
    ctx.fact(C.CapacityAvailable, False, "CapacityUnavailable", message)
    ctx.events.append(("Warning", "CapacityUnavailable", message))
