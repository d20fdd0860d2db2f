"""One reconcile pass in the making (``PassContext``: the world it reads, the status it builds, the
actions, events and condition facts it decides), and the phase-change Event messages."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from lookahead_operator.controller import livesplit
from lookahead_operator.controller import conditions
from lookahead_operator.controller.conditions import Fact
from lookahead_operator.controller.statemachine.user_edits import left_to_user
from lookahead_operator.controller.world import Action, ActionKind, Observed, Plan
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import TERMINAL_PHASES, ConditionType, Phase, Progress

C = ConditionType


def transition_message(old: Phase, new: Phase, message: str) -> str:
    """A phase change's Event message: ``Pending -> Preflight: <why>`` (``kubectl describe``
    shows Events without the status they moved)."""
    return f"{old} -> {new}: {message}"


_TRANSITION = re.compile(rf"^(?:{'|'.join(Phase)}) -> (?:{'|'.join(Phase)}): ")

def without_transition(message: str) -> str:
    """An Event message without the phase change ``transition_message`` put before it (the
    operator's log states that change on a line of its own)."""
    return _TRANSITION.sub("", message, count=1)


class PassContext:
    """One reconcile pass in the making: the world it reads (``world``), the next status it builds
    (``status``, a copy of the observed one; ``progress`` is its ``status.progress``), and what it
    has decided so far: condition facts, actions (``act``), events, a phase change (``transition``)
    and when to look again (``wait``). ``plan()`` turns it into the pass's ``Plan``."""

    def __init__(self, world: Observed):
        self.world = world
        self.status = world.status.model_copy(deep=True)
        self.facts: dict[ConditionType, Fact] = {}
        self.actions: list[Action] = []
        self.events: list[tuple[str, str, str]] = []
        self.requeue: float | None = 5.0
        self.left_to_users = left_to_user(world)  # targets left to their users: never promoted or restored
        self.user_edits_noted = False             # _note_user_edits ran in this pass
        self.ignore_guard = False                 # the guard's load restarted in this pass: its check is stale

    @property
    def progress(self) -> Progress:
        return self.status.progress

    @property
    def phase(self) -> Phase:
        return self.status.phase

    @property
    def spec(self) -> LookaheadPolicySpec:
        assert self.world.spec is not None
        return self.world.spec

    def fact(self, type_: ConditionType, ok: bool, reason: str, message: str) -> None:
        self.facts[type_] = Fact(ok, reason, message)

    def transition(self, phase: Phase, reason: str, message: str, warning: bool = False) -> None:
        """Move to ``phase`` (no-op if already there), with an Event that names the change."""
        if phase == self.phase:
            return
        self.events.append(("Warning" if warning else "Normal", reason, transition_message(self.phase, phase, message)))
        self.status.phase = phase
        self.status.message = message
        self.progress.phase_since = self.world.now

    def delete_roles(self) -> None:
        """Canary and control go; the replicas carved out of a target for them
        (``canary.capacity: carveOut``) go back to it in the same action. With ``split: gatewayAPI``
        the route is restored first (the arms' share back to the fleet before their pods go), and
        the arms' own backends go after them."""
        world = self.world
        self.restore_route()
        self.act(ActionKind.DELETE_ROLES, targets=[t.key for t in world.targets
                                                   if t.carved and t.owner in (world.key, None)])
        if self.status.live is not None and self.status.live.route:
            self.act(ActionKind.DELETE_ARM_BACKENDS)

    def restore_route(self) -> None:
        """``split: gatewayAPI``: the HTTPRoute fixed at Preflight (``status.live.route``, so a
        changed spec still restores the route it split) back as it was, from the annotation the
        split saved on it (the action reads it fresh: after an operator restart too). Once per pass."""
        live = self.status.live
        if live is None or not live.route or any(a.kind == ActionKind.RESTORE_ROUTE for a in self.actions):
            return
        ns, _, name = live.route.partition("/")
        # first of the pass's actions, whatever was planned before it: the arms' share goes before
        # anything else of the rollout does
        self.actions.insert(0, Action(ActionKind.RESTORE_ROUTE, route=(ns, name)))

    def act(self, kind: ActionKind, **kw) -> None:
        if kind == ActionKind.ENSURE_ROLES and "replicas" not in kw and self.world.spec is not None:
            kw["replicas"] = livesplit.arm_replicas(self.world.spec, self.status)
        if "targets" in kw:
            kw["targets"] = tuple(sorted(kw["targets"]))
        self.actions.append(Action(kind, **kw))

    def since(self, t: datetime | None) -> timedelta:
        return self.world.now - t if t is not None else timedelta(0)

    def wait(self, seconds: float | None) -> None:
        self.requeue = seconds

    def plan(self) -> Plan:
        if self.phase in TERMINAL_PHASES:
            self.requeue = None
        if self.phase != Phase.Pending or self.status.observed_generation is None:
            self.status.observed_generation = self.world.generation
        status = self.status
        status.conditions = conditions.derive(status.conditions, self.facts, self.phase, status.message or "",
                                              self.world.generation, self.world.now)
        return Plan(self.status, self.actions, self.events, self.requeue)
