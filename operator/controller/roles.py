"""How canary and control differ from the fleet they are cloned from: the change each role makes to
the engine container. The control is the fleet as it runs (its own speculation included); the
canary, and a promotion, is the fleet plus the candidate (``spec.lookahead``, and a promotion's
regime) as the engine adapter renders it. Read by ``observe`` (to refuse early what an engine
cannot render), by ``actions`` (to build the roles and promote) and by the CLI's checks."""

from __future__ import annotations

from typing import Any

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.controller.builders import ContainerTransform
from lookahead_operator import engines


def candidate_transform(spec: LookaheadPolicySpec, engine: str, regime: Any = None) -> ContainerTransform:
    """The fleet's engine container plus the candidate: the canary's (``regime`` None) and a
    promotion's (speculate only up to ``regime``)."""
    return lambda container: engines.render_lookahead(container, spec.lookahead, regime, engine)


def role_transform(spec: LookaheadPolicySpec, role: str, engine: str) -> ContainerTransform:
    """The engine container's change for ``role``: the candidate for the canary, none for the
    control beyond what measuring it needs (``engines.render_control``)."""
    if role == "canary":
        return candidate_transform(spec, engine)
    return lambda container: engines.render_control(container, engine)
