"""How canary and control differ from the fleet they are cloned from: the change each role makes to
the engine container (lookahead on in the canary, off in the control). Read by ``observe`` (to
refuse early what an engine cannot render) and by ``actions`` (to build the roles)."""

from __future__ import annotations

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.controller.builders import ContainerTransform
from lookahead_operator import engines


def role_transform(spec: LookaheadPolicySpec, role: str, engine: str) -> ContainerTransform:
    """The engine container's change for ``role``: the spec's lookahead for the canary, lookahead
    off for the control."""
    if role == "canary":
        return lambda container: engines.render_lookahead(container, spec.lookahead, None, engine)
    return lambda container: engines.render_off(container, engine)
