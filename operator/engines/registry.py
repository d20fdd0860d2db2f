"""The registered engine adapters, and everything the operator asks of "the engine" without
knowing which: detection, rendering, support problems, the regime setting. Every function here
asks the adapter; none knows an engine by name. Adding an engine: one line in ``ADAPTERS``.
"""

from __future__ import annotations

from typing import Any, Mapping

from lookahead_operator.api.metric_names import MetricNames
from lookahead_operator.engines import reference, sglang, trtllm, vllm
from lookahead_operator.engines.argv import container_argv, flag_value
from lookahead_operator.engines.base import (
    EngineAdapter,
    EngineError,
    EngineSetup,
    lookahead_params,
    pod_spec,
)
from lookahead_operator.engines.versions import engine_version

#: Every engine, by name, in the order messages list them.
ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (
    vllm.ADAPTER,
    sglang.ADAPTER,
    trtllm.ADAPTER,
    reference.ADAPTER,
)}
ENGINES: tuple[str, ...] = tuple(ADAPTERS)
_BY_DETECTION_ORDER = sorted(ADAPTERS.values(), key=lambda a: a.detection.order)
_ALL_LAUNCHERS = tuple(a.detection.launcher for a in ADAPTERS.values())
_SET_ENGINE = "set spec.engine to " + ", ".join(ENGINES[:-1]) + " or " + ENGINES[-1]


def adapter(engine: str) -> EngineAdapter:
    """The adapter of ``engine``; :class:`EngineError` for an unknown name."""
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise EngineError(f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})") from None


def metric_names(engine: str) -> MetricNames:
    """The Prometheus names ``engine`` exports."""
    return adapter(engine).metrics


# ---------------------------------------------------------------------------------------------
# detection


def _container_text(container: Mapping) -> str:
    parts = [str(container.get("image") or "")]
    parts += [str(x) for x in (container.get("command") or [])]
    parts += [str(x) for x in (container.get("args") or [])]
    return " ".join(parts).lower()


def detect_container_engine(container: Mapping) -> str | None:
    """Which engine a container runs, from its image, command and args; ``None`` if unknown."""
    text = _container_text(container)
    for a in _BY_DETECTION_ORDER:
        if a.detection.pattern.search(text):
            return a.name
    return None


def is_engine_container(container: Mapping) -> bool:
    return detect_container_engine(container) is not None


def detect_engine(pod_template: Mapping) -> str | None:
    """The engine's name (``"vllm"``, ``"sglang"``, ...) or ``None`` for a pod template (or
    Deployment / pod spec): the first container whose image, command or args name an engine."""
    for c in pod_spec(pod_template).get("containers") or []:
        engine = detect_container_engine(c)
        if engine:
            return engine
    return None


def engine_container(pod_template_or_container: Mapping) -> Mapping | None:
    """The engine container of a pod template / Deployment / pod spec, or the container itself."""
    obj = pod_template_or_container
    if not any(k in obj for k in ("spec", "template", "containers")):
        return obj
    for c in pod_spec(obj).get("containers") or []:
        if is_engine_container(c):
            return c
    return None


def container_flag(container: Mapping, flag: str) -> str | None:
    """The value of ``flag`` in a container's engine arguments (``None`` if absent)."""
    return flag_value(container_argv(container, _ALL_LAUNCHERS), flag)


# ---------------------------------------------------------------------------------------------
# rendering and checks


def _resolve(container: Mapping, engine: str | None) -> EngineAdapter:
    if engine in (None, "auto"):
        engine = detect_container_engine(container)
        if engine is None:
            raise EngineError(f"cannot tell the engine from the container's image, command or args; {_SET_ENGINE}")
    return adapter(engine)


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None, engine: str | None = None) -> dict:
    """A NEW container with lookahead on (``regime``: speculate only up to that batch size)."""
    return _resolve(container, engine).render_on(container, lookahead_spec, regime)


def render_off(container: Mapping, engine: str | None = None) -> dict:
    """A NEW container with every lookahead flag removed (the control)."""
    return _resolve(container, engine).render_off(container)


def _render_problems(a: EngineAdapter, container: Mapping, spec: Any, regime_aware: bool) -> list[str]:
    """The errors rendering the canary, the control and (if ``regime_aware``) a promotion raise."""
    problems: list[str] = []
    for regime in ([None, 1] if regime_aware else [None]):
        for render in (lambda: a.render_on(container, spec, regime), lambda: a.render_off(container)):
            try:
                render()
            except EngineError as exc:
                if str(exc) not in problems:
                    problems.append(str(exc))
    return problems


def _setup(a: EngineAdapter, container: Mapping, around: Mapping, lookahead_config: Any) -> EngineSetup:
    p = lookahead_params(lookahead_config)
    version = engine_version(container, a.name, p, from_image_tag=a.version_from_image_tag)
    argv = container_argv(container, (a.detection.launcher,))
    return EngineSetup(container, around if around is not container else None, p, version, argv)


def support_problems(pod_template_or_container: Mapping, engine: str | None, lookahead_config: Any,
                     regime_aware: bool) -> list[str]:
    """Human messages naming what this engine version (image tag, or ``spec.lookahead.engineVersion``)
    cannot do for this lookahead config; empty when the canary, the control and (if
    ``regime_aware``) a regime-aware promotion can all be rendered. An unknown version is assumed
    current. Meant for an ``Accepted=False`` condition."""
    container = engine_container(pod_template_or_container)
    if container is None:
        return [f"no container in the pod template names an engine ({', '.join(ENGINES[:-1])} or the "
                f"{ENGINES[-1]} engine); set spec.engine"]
    if engine in (None, "auto"):
        engine = detect_container_engine(container)
        if engine is None:
            return [f"cannot tell the engine of container {container.get('name') or '?'!r} from its image, command "
                    f"or args; {_SET_ENGINE}"]
    try:
        a = adapter(engine)
        setup = _setup(a, container, pod_template_or_container, lookahead_config)
    except EngineError as exc:
        return [str(exc)]
    problems = a.problems(setup, regime_aware)
    if not problems and a.edits_command_line:
        problems = _render_problems(a, container, setup.lookahead, regime_aware)
    return problems


def regime_config(engine: str, lookahead_spec: Any, max_batch_size: int, engine_max_batch: int | None = None) -> dict:
    """The engine-specific regime-aware setting, for a Decision's message and the report."""
    return adapter(engine).regime_config(lookahead_params(lookahead_spec), max_batch_size, engine_max_batch)
