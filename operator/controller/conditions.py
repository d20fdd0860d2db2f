"""Status conditions, derived in one place from the phase and what one reconcile pass found.

The state machine records *facts* (``Fact``: a condition type's status, reason and message) as it
goes; :func:`derive` turns the previous conditions, the facts and the new phase into the next
list. Rules, all here:

* a fact sets its condition; ``lastTransitionTime`` moves only when the status changes (API
  conventions), reason, message and observedGeneration always follow;
* ``Ready`` is derived from the phase alone: True in Succeeded, False otherwise;
* conditions that only mean something in some phases (``SCOPE``) are dropped outside them, so a
  rolled-back policy never shows ``WaveReady=True``;
* every type is an ``api.status.ConditionType``: nothing else can be written;
* ``TargetsEdited`` (targets left to the users who edited them) is a record, not a phase state: it
  is kept to the end of the rollout (only a spec change, which starts a new one, drops it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lookahead_operator.api.status import Condition, ConditionStatus, ConditionType, Phase
from lookahead_operator.controller.world import WITH_ROLES

__all__ = ["Fact", "derive", "get", "SCOPE"]

#: Condition types that are dropped outside these phases.
SCOPE: dict[ConditionType, frozenset[Phase]] = {
    ConditionType.RolesReady: WITH_ROLES,
    ConditionType.CapacityAvailable: frozenset({Phase.Preflight, Phase.Launching}),
    ConditionType.WaveReady: frozenset({Phase.Promoting}),
    ConditionType.GuardData: frozenset({Phase.Promoting, Phase.Guarding}),
    ConditionType.MetricsAvailable: frozenset({Phase.Preflight, Phase.Measuring, Phase.Promoting, Phase.Guarding}),
}


@dataclass(frozen=True)
class Fact:
    status: bool
    reason: str
    message: str

    @property
    def condition_status(self) -> ConditionStatus:
        return ConditionStatus.true if self.status else ConditionStatus.false


def _set(conds: list[Condition], type_: ConditionType, fact: Fact, generation: int, now: datetime) -> None:
    for i, c in enumerate(conds):
        if c.type == type_:
            changed = c.status != fact.condition_status
            conds[i] = Condition(type=type_, status=fact.condition_status, reason=fact.reason, message=fact.message,
                                 last_transition_time=now if changed else c.last_transition_time,
                                 observed_generation=generation)
            return
    conds.append(Condition(type=type_, status=fact.condition_status, reason=fact.reason, message=fact.message,
                           last_transition_time=now, observed_generation=generation))


def derive(previous: list[Condition] | None, facts: dict[ConditionType, Fact], phase: Phase, phase_message: str,
           generation: int, now: datetime) -> list[Condition]:
    """The next conditions (see the module docstring for the rules)."""
    known = set(ConditionType)
    conds = [c for c in previous or [] if c.type in known and (c.type not in SCOPE or phase in SCOPE[c.type])]
    for type_, fact in facts.items():
        if type_ in SCOPE and phase not in SCOPE[type_]:
            continue
        _set(conds, type_, fact, generation, now)
    ready = Fact(phase == Phase.Succeeded, str(phase), phase_message or str(phase))
    _set(conds, ConditionType.Ready, ready, generation, now)
    order = {t: i for i, t in enumerate(ConditionType)}
    return sorted(conds, key=lambda c: order[ConditionType(c.type)])


def get(conditions: list[Condition] | None, type_: ConditionType) -> Condition | None:
    return next((c for c in conditions or [] if c.type == type_), None)
