"""Which targets the rollout still acts on: a target whose pod template its user edited after the
claim (``Target.user_edited``) is left to them for the rest of the rollout. Pure functions of the
observed world, read by the pass, by ``observe`` (where canary and control are cloned from) and by
``deletion_plan``."""

from __future__ import annotations

from lookahead_operator.controller.world import Observed, Target
from lookahead_operator.api.status import LookaheadPolicyStatus, Phase


def recorded_user_edits(status: LookaheadPolicyStatus) -> frozenset[tuple[str, str]]:
    """The targets whose ``status.targets`` row says ``userEdited``: left to their users earlier."""
    return frozenset((r.namespace, r.name) for r in status.targets or [] if r.user_edited)


def edited_now(targets: list[Target], me: str) -> list[tuple[str, str]]:
    """The targets owned by policy ``me`` whose pod template their user edited since our last
    write (``Target.user_edited``), in the order given."""
    return [t.key for t in targets if t.owner == me and t.user_edited]


def left_to_user(world: Observed) -> frozenset[tuple[str, str]]:
    """The targets left to their users in this rollout: recorded in ``status.targets`` as
    ``userEdited`` (``recorded_user_edits``), or seen now owned by this policy with a pod template
    its user edited (``edited_now``). None in Pending: nothing was rolled out yet, and the claim
    saves the template as it is then (an edit before the claim is simply part of the original)."""
    if world.status.phase == Phase.Pending:
        return frozenset()
    return recorded_user_edits(world.status) | frozenset(edited_now(world.targets, world.key))


def in_play(world: Observed) -> list[Target]:
    """The targets the rollout still acts on (every target but those ``left_to_user``)."""
    left = left_to_user(world)
    return [t for t in world.targets if t.key not in left]


def role_source(world: Observed) -> Target | None:
    """The target whose pod template canary and control are cloned from: the first, in a stable
    order, of the targets still in play (so never one whose template its user replaced), else of
    all targets."""
    pool = in_play(world) or world.targets
    return min(pool, key=lambda t: t.key) if pool else None
