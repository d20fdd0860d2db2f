"""Engine adapters: recognise the serving engine in a pod template, read its version, render its
lookahead flags (or refuse what that version cannot do), and name its metrics.

One module per engine (``vllm``, ``sglang``, ``reference``), each filling in the
:class:`~lookahead_operator.engines.base.EngineAdapter` record; ``registry`` lists them and
dispatches; ``versions``, ``argv`` and ``shell`` are what the adapters share. What each engine
version supports, and what we refuse: ``docs/engines.md``. Callers write
``from lookahead_operator import engines`` and ``engines.render_lookahead(...)``.
"""

from lookahead_operator.engines.base import METHODS, EngineError, Speculation, lookahead_params, regime_max_batch
from lookahead_operator.engines.reference import reference_speculative_config
from lookahead_operator.engines.registry import (
    ADAPTERS,
    ENGINES,
    adapter,
    container_flag,
    detect_container_engine,
    detect_engine,
    engine_container,
    existing_method,
    is_engine_container,
    listen_port,
    metric_names,
    regime_config,
    render_control,
    render_lookahead,
    support_problems,
    unsupported_engine,
    version_from_answer,
    version_paths,
)
from lookahead_operator.engines.sglang import SGLANG_NGRAM_MAX_RUNNING_REQUESTS
from lookahead_operator.engines.versions import RunningVersion, checked_version, engine_version, image_version
from lookahead_operator.engines.vllm import VLLM_DEFAULT_MAX_BATCH, vllm_existing_speculation

__all__ = [
    "ADAPTERS", "ENGINES", "METHODS", "SGLANG_NGRAM_MAX_RUNNING_REQUESTS", "VLLM_DEFAULT_MAX_BATCH", "EngineError",
    "Speculation", "existing_method", "adapter", "container_flag", "detect_container_engine",
    "detect_engine", "engine_container", "engine_version", "image_version", "is_engine_container", "listen_port",
    "lookahead_params", "metric_names",
    "regime_config", "regime_max_batch", "reference_speculative_config", "render_control", "render_lookahead",
    "support_problems", "unsupported_engine", "vllm_existing_speculation",
    "RunningVersion", "checked_version", "version_from_answer", "version_paths",
]
