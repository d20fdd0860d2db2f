"""The registered engine adapters, and everything the operator asks of "the engine" without
knowing which: detection, rendering, support problems, the regime setting, the speculation a
fleet already runs. Every function here asks the adapter; none knows an engine by name. Adding an
engine: one line in ``ADAPTERS``. Engines recognised but not supported (``UNSUPPORTED``) are
detected only to be refused by name.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from lookahead_operator.api.metric_names import MetricNames
from lookahead_operator.engines import reference, sglang, vllm
from lookahead_operator.engines.argv import container_argv, flag_value
from lookahead_operator.engines.base import (
    EngineAdapter,
    EngineError,
    EngineSetup,
    Speculation,
    lookahead_params,
    pod_spec,
)
from lookahead_operator.engines.versions import RunningVersion, checked_version, version_answer

#: Every engine, by name, in the order messages list them.
ADAPTERS: dict[str, EngineAdapter] = {a.name: a for a in (
    vllm.ADAPTER,
    sglang.ADAPTER,
    reference.ADAPTER,
)}
#: Engines recognised (in a container's image, command or args) only to be refused, with why.
UNSUPPORTED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"trtllm-serve|tensorrt[-_]llm"),
     "TensorRT-LLM is not supported yet: it reads speculative decoding from an options file "
     "(--extra_llm_api_options / --config) that the operator does not create; this operator edits the "
     "command lines of vLLM, SGLang and the reference engine"),
)
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


def unsupported_engine(container: Mapping) -> str | None:
    """Why a container's engine is not supported (one of ``UNSUPPORTED``), or ``None``."""
    text = _container_text(container)
    return next((why for pattern, why in UNSUPPORTED if pattern.search(text)), None)


def detect_container_engine(container: Mapping) -> str | None:
    """Which engine a container runs, from its image, command and args; ``None`` if unknown or
    one this operator does not support (:func:`unsupported_engine`)."""
    if unsupported_engine(container):
        return None
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


def listen_port(container: Mapping, engine: str | None = None) -> int:
    """The port the engine in ``container`` listens on by its command line: its ``--port``, else
    the engine's default (``EngineAdapter.default_port``; 8000 for an engine not recognised).
    (A declared containerPort, when there is one, says it better: ``builders.container_port``.)"""
    try:
        value = container_flag(container, "--port")
        if value is not None and 0 < int(value) < 65536:
            return int(value)
    except (EngineError, ValueError):
        pass
    name = engine if engine not in (None, "auto") else detect_container_engine(container)
    return adapter(name).default_port if name in ENGINES else 8000


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


def render_control(container: Mapping, engine: str | None = None) -> dict:
    """A NEW container: the control, the fleet's container as it runs (its speculation kept)."""
    return _resolve(container, engine).render_control(container)


def existing_method(container: Mapping, engine: str | None = None) -> Speculation | None:
    """The speculative method the fleet's engine container already runs, read from its flags
    (``None``: none)."""
    return _resolve(container, engine).existing(container)


def _render_problems(a: EngineAdapter, container: Mapping, spec: Any, regime_aware: bool) -> list[str]:
    """The errors rendering the canary, the control and (if ``regime_aware``) a promotion raise."""
    problems: list[str] = []
    for regime in ([None, 1] if regime_aware else [None]):
        for render in (lambda: a.render_on(container, spec, regime), lambda: a.render_control(container)):
            try:
                render()
            except EngineError as exc:
                if str(exc) not in problems:
                    problems.append(str(exc))
    return problems


def _setup(a: EngineAdapter, container: Mapping, around: Mapping, lookahead_config: Any,
           running: RunningVersion | None) -> EngineSetup:
    p = lookahead_params(lookahead_config)
    version = checked_version(container, a.name, p, running, from_image_tag=a.version_from_image_tag)
    argv = container_argv(container, (a.detection.launcher,))
    return EngineSetup(container, around if around is not container else None, p, version, argv)


def support_problems(pod_template_or_container: Mapping, engine: str | None, lookahead_config: Any,
                     regime_aware: bool, running: RunningVersion | None = None) -> list[str]:
    """Human messages naming what this engine version cannot do for this lookahead config; empty
    when the canary, the control and (if ``regime_aware``) a regime-aware promotion can all be
    rendered. The version is ``versions.checked_version``'s: ``running`` (what a ready fleet pod's
    version endpoint said; ``None``: none read) is the truth, a tag or ``spec.lookahead.engineVersion``
    contradicting it, or no version but a tag, refuses every version-gated feature (never a guess).
    Meant for an ``Accepted=False`` condition."""
    container = engine_container(pod_template_or_container)
    if container is None or unsupported_engine(container):
        obj = pod_template_or_container
        containers = [obj] if container is not None else pod_spec(obj).get("containers") or []
        why = next((w for w in map(unsupported_engine, containers) if w), None)
        if why:
            return [why]
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
        setup = _setup(a, container, pod_template_or_container, lookahead_config, running)
    except EngineError as exc:
        return [str(exc)]
    problems = a.problems(setup, regime_aware)
    if not problems:
        problems = _render_problems(a, container, setup.lookahead, regime_aware)
    return problems


def version_paths(engine: str) -> tuple[str, ...]:
    """The running engine's version endpoints, in the order to try them (the next after a 404)."""
    return adapter(engine).version_paths


def version_from_answer(engine: str, path: str, body: Any) -> str:
    """The version text ``engine``'s endpoint ``path`` answered with (JSON ``body``);
    :class:`EngineError` when the answer states none."""
    read = adapter(engine).version_answer
    return read(path, body) if read is not None else version_answer(body)


def regime_config(engine: str, lookahead_spec: Any, max_batch_size: int, engine_max_batch: int | None = None) -> dict:
    """The engine-specific regime-aware setting, for a Decision's message and the report."""
    return adapter(engine).regime_config(lookahead_params(lookahead_spec), max_batch_size, engine_max_batch)
