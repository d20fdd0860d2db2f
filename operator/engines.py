"""Engine adapters: recognise the serving engine in a pod template, render its lookahead flags,
and name its metrics.

Three engines:

* ``vllm`` -- no Jacobi lookahead; its lookahead-style method is n-gram prompt lookup,
  ``--speculative-config '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_min":a,
  "prompt_lookup_max":b}'``. Regime-aware promotion uses
  ``"num_speculative_tokens_per_batch_size": [[1, C, K], [C+1, MAX, 0]]`` (K = 0: off above C).
* ``sglang`` -- ``--speculative-algorithm NGRAM`` (trie-based n-gram lookahead, CUDA only) with
  ``--speculative-num-draft-tokens``; regime-aware via ``--speculative-ngram-max-batch-size``.
* ``reference`` -- our engine (``python3 -m lookahead_canary.server``): true Jacobi lookahead,
  ``--speculative-config '{"method":"jacobi","window":W,"ngram":N,"guess_set":G}'``, or ``ngram``
  like vLLM; regime-aware via ``--lookahead-max-batch-size C``.

All renderers are pure: they take a container dict and return a NEW one; the input is untouched.
A present flag is replaced in place (both ``--flag value`` and ``--flag=value`` forms), never
duplicated. Flags may live in ``command`` or ``args``; a shell form (``sh -c "..."``) is edited
inside the script string.

Metric names: :class:`MetricNames` per engine, so one PromQL builder
(``lookahead_operator.observations``) reads every engine. Per-token latency is always a
per-*token* histogram (vLLM: ``request_time_per_output_token``; never vLLM's per-chunk ITL).
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

Engine = Literal["vllm", "sglang", "reference"]
ENGINES: tuple[str, ...] = ("vllm", "sglang", "reference")

#: Upper end of the last ``num_speculative_tokens_per_batch_size`` range when the container does
#: not set ``--max-num-seqs`` (the range must cover every batch size the engine can run).
VLLM_DEFAULT_MAX_BATCH = 1024


class EngineError(ValueError):
    """A lookahead spec that an engine cannot run, or a container we cannot edit."""


# ---------------------------------------------------------------------------------------------
# the lookahead spec (accepts the pydantic model or a plain dict, camelCase or snake_case)


@dataclass(frozen=True)
class LookaheadParams:
    method: str = "jacobi"             # jacobi | ngram
    window: int = 7                    # W
    ngram: int = 5                     # N
    guess_set: int = 7                 # G
    num_speculative_tokens: int = 4    # ngram methods: K
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    prompt_lookup_tokens: int = 0      # jacobi: prompt-lookup draft verified alongside (0: off)


_ALIASES = {
    "method": ("method",),
    "window": ("window", "W"),
    "ngram": ("ngram", "N"),
    "guess_set": ("guess_set", "guessSet", "G"),
    "num_speculative_tokens": ("num_speculative_tokens", "numSpeculativeTokens"),
    "prompt_lookup_min": ("prompt_lookup_min", "promptLookupMin"),
    "prompt_lookup_max": ("prompt_lookup_max", "promptLookupMax"),
    "prompt_lookup_tokens": ("prompt_lookup_tokens", "promptLookupTokens"),
}


def lookahead_params(spec: Any) -> LookaheadParams:
    """Normalise a lookahead spec (``LookaheadParams``, a pydantic model, or a dict)."""
    if spec is None:
        return LookaheadParams()
    if isinstance(spec, LookaheadParams):
        return spec
    if hasattr(spec, "model_dump"):
        data = spec.model_dump(by_alias=False)
        data.update(spec.model_dump(by_alias=True))
    elif isinstance(spec, Mapping):
        data = dict(spec)
    else:
        data = {k: getattr(spec, k) for k in dir(spec) if not k.startswith("_")}
    kw: dict[str, Any] = {}
    for name, keys in _ALIASES.items():
        for k in keys:
            if data.get(k) is not None:
                kw[name] = data[k]
                break
    method = getattr(kw.get("method"), "value", kw.get("method", "jacobi"))
    kw["method"] = str(method).lower()
    if kw["method"] not in ("jacobi", "ngram"):
        raise EngineError(f"unknown lookahead method {kw['method']!r} (expected jacobi or ngram)")
    for k, v in list(kw.items()):
        if k != "method":
            kw[k] = int(v)
            if kw[k] < (0 if k == "prompt_lookup_tokens" else 1):
                raise EngineError(f"lookahead {k} must be >= 1, got {v}")
    return LookaheadParams(**kw)


def regime_max_batch(regime: Any) -> int | None:
    """The largest batch size at which speculation stays on, from ``regime``: an int, a mapping
    with ``maxBatchSize``/``max_batch_size``/``crossover``, or an object with such an attribute.
    ``None`` means speculate at every batch size."""
    if regime is None:
        return None
    if isinstance(regime, bool):
        raise EngineError("regime must be a batch size, not a bool")
    if isinstance(regime, int):
        value = regime
    else:
        value = None
        for k in ("max_batch_size", "maxBatchSize", "speculate_up_to", "crossover_batch_size"):
            v = regime.get(k) if isinstance(regime, Mapping) else getattr(regime, k, None)
            if v is not None:
                value = int(v)
                break
        if value is None:
            raise EngineError(f"cannot read a max batch size from regime {regime!r}")
    if value < 1:
        raise EngineError(f"regime max batch size must be >= 1, got {value}")
    return value


# ---------------------------------------------------------------------------------------------
# metric names


@dataclass(frozen=True)
class MetricNames:
    """Prometheus names for one engine. ``None``: the engine does not export that signal.

    Histograms are base names (``_sum``/``_count``/``_bucket`` appended by the query builder).
    ``per_token_latency`` is a per-token histogram; ``decode_time`` is per request, to be divided by
    generated tokens when ``per_token_latency`` is missing. Acceptance: counters
    (``accepted_tokens / draft_tokens``), or for SGLang only the gauge ``acceptance_rate_gauge``.
    """

    engine: str
    per_token_latency: str | None
    ttft: str | None
    e2e: str | None
    prefill_time: str | None
    decode_time: str | None
    queue_time: str | None
    generation_tokens: str
    prompt_tokens: str | None
    drafts: str | None
    draft_tokens: str | None
    accepted_tokens: str | None
    running: str | None
    waiting: str | None
    acceptance_rate_gauge: str | None = None
    acceptance_length_gauge: str | None = None
    chunk_itl: str | None = None     # per-chunk ITL: recorded for reference, never compared
    labels: tuple[str, ...] = field(default=("model_name",))

    def histograms(self) -> dict[str, str]:
        return {k: v for k, v in (("per_token_latency", self.per_token_latency), ("ttft", self.ttft),
                                  ("e2e", self.e2e), ("prefill_time", self.prefill_time),
                                  ("decode_time", self.decode_time), ("queue_time", self.queue_time)) if v}


VLLM_METRICS = MetricNames(
    engine="vllm",
    per_token_latency="vllm:request_time_per_output_token_seconds",
    ttft="vllm:time_to_first_token_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    prefill_time="vllm:request_prefill_time_seconds",
    decode_time="vllm:request_decode_time_seconds",
    queue_time="vllm:request_queue_time_seconds",
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    drafts="vllm:spec_decode_num_drafts_total",
    draft_tokens="vllm:spec_decode_num_draft_tokens_total",
    accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    chunk_itl="vllm:inter_token_latency_seconds",
    labels=("model_name", "engine"),
)

#: Our engine exports vLLM's names and labels (lookahead_canary.metrics).
#: Our reference engine: vLLM's names, but its inter-token latency histogram is observed once per
#: token (a step yielding k tokens after dt records dt/k k times), so unlike vLLM's per-chunk ITL
#: it is unbiased under speculation, and it gives a sample every token rather than every request:
#: the per-token latency series of choice, dense enough for short measurement windows.
REFERENCE_METRICS = MetricNames(**{**VLLM_METRICS.__dict__, "engine": "reference",
                                   "per_token_latency": "vllm:inter_token_latency_seconds", "chunk_itl": None})

#: SGLang (python/sglang/srt/metrics/collector.py). Its ITL histogram is per token (an interval
#: carrying k tokens is observed k times at interval/k). No per-request prefill/decode split;
#: speculative acceptance only as gauges (``spec_accept_rate``, ``spec_accept_length``).
SGLANG_METRICS = MetricNames(
    engine="sglang",
    per_token_latency="sglang:inter_token_latency_seconds",
    ttft="sglang:time_to_first_token_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    prefill_time=None,
    decode_time=None,
    queue_time="sglang:queue_time_seconds",
    generation_tokens="sglang:generation_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    drafts=None,
    draft_tokens=None,
    accepted_tokens=None,
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    acceptance_rate_gauge="sglang:spec_accept_rate",
    acceptance_length_gauge="sglang:spec_accept_length",
    labels=("model_name",),
)

_METRICS = {"vllm": VLLM_METRICS, "sglang": SGLANG_METRICS, "reference": REFERENCE_METRICS}


def metric_names(engine: str) -> MetricNames:
    try:
        return _METRICS[engine]
    except KeyError:
        raise EngineError(f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})") from None


# ---------------------------------------------------------------------------------------------
# detection


_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    # order matters: the reference engine mentions no vllm/sglang; check it first
    ("reference", re.compile(r"lookahead[_-]canary\.server|lookahead-engine|lookahead-rollout[^\s]*engine")),
    ("sglang", re.compile(r"sglang")),
    ("vllm", re.compile(r"vllm")),
)


def _container_text(container: Mapping) -> str:
    parts = [str(container.get("image") or "")]
    parts += [str(x) for x in (container.get("command") or [])]
    parts += [str(x) for x in (container.get("args") or [])]
    return " ".join(parts).lower()


def detect_container_engine(container: Mapping) -> str | None:
    """Which engine a container runs, from its image, command and args; ``None`` if unknown."""
    text = _container_text(container)
    for engine, pattern in _PATTERNS:
        if pattern.search(text):
            return engine
    return None


def is_engine_container(container: Mapping) -> bool:
    return detect_container_engine(container) is not None


def _pod_spec(pod_template: Mapping) -> Mapping:
    if "template" in pod_template and isinstance(pod_template["template"], Mapping):  # a Deployment spec
        pod_template = pod_template["template"]
    if "spec" in pod_template and isinstance(pod_template["spec"], Mapping):
        spec = pod_template["spec"]
        if "template" in spec:                                                       # a whole Deployment
            return _pod_spec(spec)
        return spec
    return pod_template                                                                # already a pod spec


def detect_engine(pod_template: Mapping) -> str | None:
    """``"vllm" | "sglang" | "reference" | None`` for a pod template (or Deployment / pod spec):
    the first container whose image, command or args name an engine."""
    for c in _pod_spec(pod_template).get("containers") or []:
        engine = detect_container_engine(c)
        if engine:
            return engine
    return None


# ---------------------------------------------------------------------------------------------
# flag editing


def _shell_script_index(argv: list[str]) -> int | None:
    """``sh -c SCRIPT`` / ``bash -lc SCRIPT``: the index of SCRIPT, else None."""
    if not argv or not re.search(r"(^|/)(ba|da|z)?sh$", argv[0]):
        return None
    for i in range(1, len(argv) - 1):
        if re.fullmatch(r"-[a-z]*c[a-z]*", argv[i]):
            return i + 1
    return None


def _remove_flag(argv: list[str], flag: str, takes_value: bool = True) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def _set_flag(argv: list[str], flag: str, value: str | None) -> list[str]:
    """Set ``flag`` (to ``value``; ``None`` = a bare switch) replacing the first occurrence in
    place and dropping any others."""
    out: list[str] = []
    placed = False
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag or a.startswith(flag + "="):
            if a == flag and value is not None:
                skip = True
            if not placed:
                out += [flag] + ([value] if value is not None else [])
                placed = True
            continue
        out.append(a)
    if not placed:
        out += [flag] + ([value] if value is not None else [])
    return out


class _Argv:
    """Edit flags wherever they live: ``args`` (preferred), ``command``, or inside ``sh -c``."""

    def __init__(self, container: dict):
        self.c = container
        self.script_of: str | None = None
        cmd = list(container.get("command") or [])
        args = list(container.get("args") or [])
        idx = _shell_script_index(cmd + args)
        if idx is not None:
            self.script_of = "command" if idx < len(cmd) else "args"
            self._script_idx = idx if idx < len(cmd) else idx - len(cmd)
            self.argv = shlex.split((cmd + args)[idx])
            self.where = self.script_of
        elif args or not cmd:
            self.where = "args"
            self.argv = args
        else:
            self.where = "command"
            self.argv = cmd

    def done(self) -> dict:
        if self.script_of:
            argv = list(self.c.get(self.script_of) or [])
            argv[self._script_idx] = shlex.join(self.argv)
            self.c[self.script_of] = argv
        else:
            self.c[self.where] = self.argv
        return self.c


def _edit(container: Mapping, fn) -> dict:
    c = copy.deepcopy(dict(container))
    a = _Argv(c)
    a.argv = fn(a.argv)
    return a.done()


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def container_flag(container: Mapping, flag: str) -> str | None:
    """The value of ``flag`` in a container's argv (``None`` if absent)."""
    return _flag_value(_Argv(copy.deepcopy(dict(container))).argv, flag)


# ---------------------------------------------------------------------------------------------
# vLLM

_SPEC = "--speculative-config"


def _vllm_spec_json(p: LookaheadParams, max_batch: int | None, engine_max: int) -> str:
    cfg: dict[str, Any] = {
        "method": "ngram",
        "num_speculative_tokens": p.num_speculative_tokens,
        "prompt_lookup_min": p.prompt_lookup_min,
        "prompt_lookup_max": p.prompt_lookup_max,
    }
    if max_batch is not None:
        ranges = [[1, min(max_batch, engine_max), p.num_speculative_tokens]]
        if max_batch < engine_max:
            ranges.append([max_batch + 1, engine_max, 0])
        cfg["num_speculative_tokens_per_batch_size"] = ranges
    return json.dumps(cfg, separators=(",", ":"))


def vllm_render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    p = lookahead_params(lookahead_spec)
    if p.method == "jacobi":
        raise EngineError(
            "vLLM has no Jacobi lookahead decoding (its lookahead-style method is n-gram prompt lookup). "
            "Set spec.lookahead.method: ngram to measure vLLM's ngram speculation, or run the reference "
            "engine for Jacobi (W, N, G).")
    max_batch = regime_max_batch(regime)

    def fn(argv: list[str]) -> list[str]:
        mns = _flag_value(argv, "--max-num-seqs")
        engine_max = int(mns) if mns and mns.isdigit() else VLLM_DEFAULT_MAX_BATCH
        return _set_flag(argv, _SPEC, _vllm_spec_json(p, max_batch, engine_max))

    return _edit(container, fn)


def vllm_render_off(container: Mapping) -> dict:
    return _edit(container, lambda argv: _remove_flag(argv, _SPEC))


# ---------------------------------------------------------------------------------------------
# SGLang

_SGLANG_VALUED = (
    "--speculative-algorithm", "--speculative-num-draft-tokens", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-draft-model-path",
    "--speculative-ngram-min-match-window-size", "--speculative-ngram-max-match-window-size",
    "--speculative-ngram-min-bfs-breadth", "--speculative-ngram-max-bfs-breadth",
    "--speculative-ngram-match-type", "--speculative-ngram-branch-length",
    "--speculative-ngram-capacity", "--speculative-ngram-max-batch-size",
)


def sglang_render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    p = lookahead_params(lookahead_spec)
    if p.method == "jacobi":
        raise EngineError(
            "SGLang has no Jacobi lookahead decoding; its lookahead is the trie-based n-gram method "
            "(--speculative-algorithm NGRAM). Set spec.lookahead.method: ngram, or run the reference "
            "engine for Jacobi (W, N, G).")
    max_batch = regime_max_batch(regime)

    def fn(argv: list[str]) -> list[str]:
        argv = _set_flag(argv, "--speculative-algorithm", "NGRAM")
        argv = _set_flag(argv, "--speculative-num-draft-tokens", str(p.num_speculative_tokens))
        argv = _set_flag(argv, "--speculative-ngram-min-match-window-size", str(p.prompt_lookup_min))
        argv = _set_flag(argv, "--speculative-ngram-max-match-window-size", str(p.prompt_lookup_max))
        if max_batch is not None:
            argv = _set_flag(argv, "--speculative-ngram-max-batch-size", str(max_batch))
        else:
            argv = _remove_flag(argv, "--speculative-ngram-max-batch-size")
        return argv

    return _edit(container, fn)


def sglang_render_off(container: Mapping) -> dict:
    def fn(argv: list[str]) -> list[str]:
        for f in _SGLANG_VALUED:
            argv = _remove_flag(argv, f)
        return argv

    return _edit(container, fn)


# ---------------------------------------------------------------------------------------------
# reference engine

_MAX_BATCH = "--lookahead-max-batch-size"


def reference_speculative_config(lookahead_spec: Any) -> str:
    p = lookahead_params(lookahead_spec)
    if p.method == "jacobi":
        cfg: dict[str, Any] = {"method": "jacobi", "window": p.window, "ngram": p.ngram, "guess_set": p.guess_set}
        if p.prompt_lookup_tokens:
            # The original implementation seeds candidates from the prompt too; on steps with such a
            # draft the Jacobi window is skipped (fewer query tokens: see docs/benchmarks/engine-cpu.md).
            cfg.update(prompt_lookup_tokens=p.prompt_lookup_tokens, window_with_draft=False)
    else:
        cfg = {"method": "ngram", "num_speculative_tokens": p.num_speculative_tokens,
               "prompt_lookup_min": p.prompt_lookup_min, "prompt_lookup_max": p.prompt_lookup_max}
    return json.dumps(cfg, separators=(",", ":"))


def reference_render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    spec_json = reference_speculative_config(lookahead_spec)
    max_batch = regime_max_batch(regime)

    def fn(argv: list[str]) -> list[str]:
        argv = _set_flag(argv, _SPEC, spec_json)
        if max_batch is not None:
            argv = _set_flag(argv, _MAX_BATCH, str(max_batch))
        else:
            argv = _remove_flag(argv, _MAX_BATCH)
        return argv

    return _edit(container, fn)


def reference_render_off(container: Mapping) -> dict:
    return _edit(container, lambda argv: _remove_flag(_remove_flag(argv, _SPEC), _MAX_BATCH))


# ---------------------------------------------------------------------------------------------
# dispatch


@dataclass(frozen=True)
class EngineAdapter:
    name: str
    metrics: MetricNames
    render_lookahead: Any
    render_off: Any


ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": EngineAdapter("vllm", VLLM_METRICS, vllm_render_lookahead, vllm_render_off),
    "sglang": EngineAdapter("sglang", SGLANG_METRICS, sglang_render_lookahead, sglang_render_off),
    "reference": EngineAdapter("reference", REFERENCE_METRICS, reference_render_lookahead, reference_render_off),
}


def adapter(engine: str) -> EngineAdapter:
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise EngineError(f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})") from None


def _resolve(container: Mapping, engine: str | None) -> EngineAdapter:
    if engine in (None, "auto"):
        engine = detect_container_engine(container)
        if engine is None:
            raise EngineError("cannot tell the engine from the container's image, command or args; "
                              "set spec.engine to vllm, sglang or reference")
    return adapter(engine)


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None, engine: str | None = None) -> dict:
    """A NEW container with lookahead on (``regime``: speculate only up to that batch size)."""
    return _resolve(container, engine).render_lookahead(container, lookahead_spec, regime)


def render_off(container: Mapping, engine: str | None = None) -> dict:
    """A NEW container with every lookahead flag removed (the control)."""
    return _resolve(container, engine).render_off(container)


def regime_config(engine: str, lookahead_spec: Any, max_batch_size: int, engine_max_batch: int | None = None) -> dict:
    """The engine-specific regime-aware setting, for a Decision's message and the report."""
    p = lookahead_params(lookahead_spec)
    if engine == "vllm":
        if p.method == "jacobi":
            raise EngineError("vLLM has no Jacobi lookahead; a vLLM regime config needs method ngram")
        return {"--speculative-config": json.loads(_vllm_spec_json(p, max_batch_size,
                                                                   engine_max_batch or VLLM_DEFAULT_MAX_BATCH))}
    if engine == "sglang":
        return {"--speculative-algorithm": "NGRAM", "--speculative-ngram-max-batch-size": max_batch_size}
    if engine == "reference":
        return {"--speculative-config": json.loads(reference_speculative_config(p)), _MAX_BATCH: max_batch_size}
    raise EngineError(f"unknown engine {engine!r}")


def strip_flags(argv: Iterable[str], flags: Iterable[str]) -> list[str]:
    out = list(argv)
    for f in flags:
        out = _remove_flag(out, f)
    return out
