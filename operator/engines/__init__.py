"""Engine adapters: recognise the serving engine in a pod template, read its version, render its
lookahead flags (or refuse what that version cannot do), and name its metrics.

One module per engine (``vllm``, ``sglang``, ``trtllm``, ``reference``), each filling in the
:class:`~lookahead_operator.engines.base.EngineAdapter` record; ``registry`` lists them and
dispatches; ``versions``, ``argv`` and ``shell`` are what the adapters share. What each engine
version supports, and what we refuse: ``docs/engines.md``. Callers write
``from lookahead_operator import engines`` and ``engines.render_lookahead(...)``.
"""

from lookahead_operator.engines.base import METHODS, EngineError, lookahead_params, regime_max_batch
from lookahead_operator.engines.reference import reference_speculative_config
from lookahead_operator.engines.registry import (
    ADAPTERS,
    ENGINES,
    adapter,
    container_flag,
    detect_container_engine,
    detect_engine,
    is_engine_container,
    metric_names,
    regime_config,
    render_lookahead,
    render_off,
    support_problems,
)
from lookahead_operator.engines.sglang import SGLANG_NGRAM_MAX_RUNNING_REQUESTS
from lookahead_operator.engines.trtllm import (
    TRTLLM_MOUNT_DIR,
    TRTLLM_OPTIONS_KEY,
    TRTLLM_VOLUME,
    trtllm_options_source,
    trtllm_role_config,
)
from lookahead_operator.engines.versions import engine_version, image_version
from lookahead_operator.engines.vllm import VLLM_DEFAULT_MAX_BATCH, vllm_existing_speculation

__all__ = [
    "ADAPTERS", "ENGINES", "METHODS", "SGLANG_NGRAM_MAX_RUNNING_REQUESTS", "TRTLLM_MOUNT_DIR", "TRTLLM_OPTIONS_KEY",
    "TRTLLM_VOLUME", "VLLM_DEFAULT_MAX_BATCH", "EngineError", "adapter", "container_flag", "detect_container_engine",
    "detect_engine", "engine_version", "image_version", "is_engine_container", "lookahead_params", "metric_names",
    "regime_config", "regime_max_batch", "reference_speculative_config", "render_lookahead", "render_off",
    "support_problems", "trtllm_options_source", "trtllm_role_config", "vllm_existing_speculation",
]
