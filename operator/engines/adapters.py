"""Engine adapters: recognise the serving engine in a pod template, read its version, render its
lookahead flags (or refuse what that version cannot do), and name its metrics.

Four engines (what each version supports, and what we refuse: ``docs/engines.md``):

* ``vllm`` -- no Jacobi lookahead; its lookahead-style methods are n-gram prompt lookup
  (``ngram``, ``ngram_gpu`` from 0.18.0) and ``suffix`` (0.11.1+, needs arctic-inference):
  ``--speculative-config '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_min":a,
  "prompt_lookup_max":b}'``. Regime-aware promotion uses ``"num_speculative_tokens_per_batch_size":
  [[1, C, K], [C+1, MAX, 0]]`` (0.24.0+; refused before, and with ``--data-parallel-size`` > 1,
  where vLLM silently switches the schedule off). Every spelling that sets speculation
  (``--speculative-config X``, ``--speculative-config=X``, ``-sc``, ``--speculative_config``,
  dotted ``--speculative-config.method=...``, ``--spec-method``/``--spec-model``/``--spec-tokens``)
  is stripped from the control and merged into one ``--speculative-config`` in the canary.
* ``sglang`` -- ``--speculative-algorithm NGRAM`` (0.5.3+) with ``--speculative-num-draft-tokens
  K+1`` (the count includes the root token). No per-batch switch: regime-aware is refused. Both
  roles get ``--enable-metrics``, the same ``--max-running-requests`` (NGRAM caps an unset value
  at 48), no ``--enable-mixed-chunk`` (NGRAM turns it off) and, where NGRAM forces it, the same
  ``--disable-overlap-schedule``.
* ``trtllm`` -- ``trtllm-serve``, configured by a YAML file (``--extra_llm_api_options`` /
  ``--config``). :func:`trtllm_role_config` returns the ConfigMap body and the container edit;
  ``speculative_config: {decoding_type: NGram, max_draft_len, max_matching_ngram_size}`` and, for
  regime-aware, ``max_concurrency``. The control's options equal the canary's but for speculation.
* ``reference`` -- our engine (``python3 -m lookahead_canary.server``): true Jacobi lookahead,
  ``--speculative-config '{"method":"jacobi","window":W,"ngram":N,"guess_set":G}'``, or ``ngram``
  like vLLM; regime-aware via ``--lookahead-max-batch-size C``.

Versions come from the image tag (``vllm/vllm-openai:v0.11.0``, ``lmsysorg/sglang:v0.5.23-cu126``,
``nvcr.io/nvidia/tensorrt-llm/release:1.0.0``) or ``spec.lookahead.engineVersion``; an unknown
version is assumed current. :func:`support_problems` lists what a version cannot do.

All renderers are pure: they take a container dict and return a NEW one; the input is untouched.
A present flag is replaced in place, never duplicated. Flags may live in ``command`` or ``args``;
a shell form (``sh -c "..."``) is edited inside the script with a shell tokenizer, so the flags
land on the engine command and everything else in the script (``$MODEL``, pipes, ``&&``,
redirections) survives byte for byte; a script too complex to edit safely raises
:class:`EngineError` naming the container.

Metric names: :class:`MetricNames` per engine, so one PromQL builder
(``lookahead_operator.measurement.prometheus``) reads every engine. Per-token latency is always a
per-*token* histogram (vLLM: ``request_time_per_output_token``; never vLLM's per-chunk ITL).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

from lookahead_canary import specconfig

Engine = Literal["vllm", "sglang", "trtllm", "reference"]
ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm", "reference")
METHODS: tuple[str, ...] = ("jacobi", "ngram", "ngram_gpu", "suffix")

#: Upper end of the last ``num_speculative_tokens_per_batch_size`` range when the container does
#: not set ``--max-num-seqs`` (the range must cover every batch size the engine can run).
VLLM_DEFAULT_MAX_BATCH = 1024

#: SGLang's NGRAM setup sets an unset ``max_running_requests`` to this; the control gets the same.
SGLANG_NGRAM_MAX_RUNNING_REQUESTS = 48

Version = tuple[int, int, int]

#: The newest release of each engine whose parser and sources we checked (``docs/engines.md``).
CHECKED_VERSIONS: dict[str, str] = {"vllm": "0.33.0", "sglang": "0.5.23", "trtllm": "1.2.1"}


class EngineError(ValueError):
    """A lookahead spec that an engine cannot run, or a container we cannot edit."""


# ---------------------------------------------------------------------------------------------
# the lookahead spec (accepts the pydantic model or a plain dict, camelCase or snake_case)


@dataclass(frozen=True)
class LookaheadParams:
    method: str = "jacobi"             # jacobi | ngram | ngram_gpu | suffix
    window: int = 7                    # W
    ngram: int = 5                     # N
    guess_set: int = 7                 # G
    num_speculative_tokens: int = 4    # ngram methods: K
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    prompt_lookup_tokens: int = 0      # jacobi: prompt-lookup draft verified alongside (0: off)
    engine_version: str | None = None  # overrides the image tag


_ALIASES = {
    "method": ("method",),
    "window": ("window", "W"),
    "ngram": ("ngram", "N"),
    "guess_set": ("guess_set", "guessSet", "G"),
    "num_speculative_tokens": ("num_speculative_tokens", "numSpeculativeTokens"),
    "prompt_lookup_min": ("prompt_lookup_min", "promptLookupMin"),
    "prompt_lookup_max": ("prompt_lookup_max", "promptLookupMax"),
    "prompt_lookup_tokens": ("prompt_lookup_tokens", "promptLookupTokens"),
    "engine_version": ("engine_version", "engineVersion"),
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
    if kw["method"] not in METHODS:
        raise EngineError(f"unknown lookahead method {kw['method']!r} (expected one of {', '.join(METHODS)})")
    for k, v in list(kw.items()):
        if k == "engine_version":
            kw[k] = str(v)
        elif k != "method":
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
    (``accepted_tokens / draft_tokens``); SGLang exports no draft/accepted counters, only
    ``drafts`` (= ``sglang:spec_verify_calls_total``, verify steps) beside generated tokens, so its
    mean acceptance length is ``increase(generation_tokens) / increase(drafts)`` (both move when
    a request finishes), and the windowed gauges ``acceptance_rate_gauge`` /
    ``acceptance_length_gauge``.

    ``generation_tokens_finish_only``: the generation counter moves only when a request finishes
    (SGLang), so over short windows use ``live_generation_tokens`` (a counter that moves every
    decode step) with the extra label matchers ``live_generation_tokens_match``.
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
    generation_tokens_finish_only: bool = False
    live_generation_tokens: str | None = None
    live_generation_tokens_match: tuple[tuple[str, str], ...] = ()
    accepted_per_position: str | None = None

    def histograms(self) -> dict[str, str]:
        return {k: v for k, v in (("per_token_latency", self.per_token_latency), ("ttft", self.ttft),
                                  ("e2e", self.e2e), ("prefill_time", self.prefill_time),
                                  ("decode_time", self.decode_time), ("queue_time", self.queue_time)) if v}

    def counters(self) -> dict[str, str]:
        return {k: v for k, v in (("generation_tokens", self.generation_tokens), ("prompt_tokens", self.prompt_tokens),
                                  ("drafts", self.drafts), ("draft_tokens", self.draft_tokens),
                                  ("accepted_tokens", self.accepted_tokens),
                                  ("live_generation_tokens", self.live_generation_tokens),
                                  ("accepted_per_position", self.accepted_per_position)) if v}

    def gauges(self) -> dict[str, str]:
        return {k: v for k, v in (("running", self.running), ("waiting", self.waiting),
                                  ("acceptance_rate_gauge", self.acceptance_rate_gauge),
                                  ("acceptance_length_gauge", self.acceptance_length_gauge)) if v}


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
    accepted_per_position="vllm:spec_decode_num_accepted_tokens_per_pos_total",
)

#: Our engine exports vLLM's names and labels (lookahead_canary.metrics).
#: Our reference engine: vLLM's names, but its inter-token latency histogram is observed once per
#: token (a step yielding k tokens after dt records dt/k k times), so unlike vLLM's per-chunk ITL
#: it is unbiased under speculation, and it gives a sample every token rather than every request:
#: the per-token latency series of choice, dense enough for short measurement windows.
REFERENCE_METRICS = MetricNames(**{**VLLM_METRICS.__dict__, "engine": "reference",
                                   "per_token_latency": "vllm:inter_token_latency_seconds", "chunk_itl": None})

#: SGLang (python/sglang/srt/observability/metrics_collector.py in 0.5.23; only with
#: ``--enable-metrics``). Its ITL histogram is per token (an interval carrying k tokens is observed
#: k times at interval/k). ``generation_tokens_total`` and ``spec_verify_calls_total`` (0.5.13+)
#: move when a request finishes; ``realtime_tokens_total{mode="decode"}`` (0.5.7+) every decode
#: step. ``spec_accept_rate`` / ``spec_accept_length`` are gauges of the last logged batch.
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
    drafts="sglang:spec_verify_calls_total",
    draft_tokens=None,
    accepted_tokens=None,
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    acceptance_rate_gauge="sglang:spec_accept_rate",
    acceptance_length_gauge="sglang:spec_accept_length",
    labels=("model_name",),
    generation_tokens_finish_only=True,
    live_generation_tokens="sglang:realtime_tokens_total",
    live_generation_tokens_match=(("mode", "decode"),),
)

#: TensorRT-LLM (tensorrt_llm/metrics/collector.py, read from its source; not installable here).
#: ``time_per_output_token`` is one observation per finished request.
TRTLLM_METRICS = MetricNames(
    engine="trtllm",
    per_token_latency="trtllm_time_per_output_token_seconds",
    ttft="trtllm_time_to_first_token_seconds",
    e2e="trtllm_e2e_request_latency_seconds",
    prefill_time="trtllm_request_prefill_time_seconds",
    decode_time="trtllm_request_decode_time_seconds",
    queue_time="trtllm_request_queue_time_seconds",
    generation_tokens="trtllm_generation_tokens_total",
    prompt_tokens="trtllm_prompt_tokens_total",
    drafts=None,
    draft_tokens="trtllm_spec_decode_num_draft_tokens_total",
    accepted_tokens="trtllm_spec_decode_num_accepted_tokens_total",
    running="trtllm_num_requests_running",
    waiting="trtllm_num_requests_waiting",
    acceptance_length_gauge="trtllm_spec_decode_acceptance_length",
    labels=("model_name", "engine_type"),
)

_METRICS = {"vllm": VLLM_METRICS, "sglang": SGLANG_METRICS, "trtllm": TRTLLM_METRICS, "reference": REFERENCE_METRICS}


def metric_names(engine: str) -> MetricNames:
    try:
        return _METRICS[engine]
    except KeyError:
        raise EngineError(f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})") from None


# ---------------------------------------------------------------------------------------------
# versions


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.\-+_]?(?:post|rc|dev|a|b)?\d*)?(?:[-_.].*)?$")


def parse_version(text: str | None) -> Version | None:
    """``"v0.5.23-cu126"`` -> ``(0, 5, 23)``; ``None`` for ``latest``, ``nightly``, digests."""
    if not text:
        return None
    m = _VERSION_RE.match(str(text).strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def image_version(image: str | None) -> Version | None:
    """The version in an image reference's tag, if it has one."""
    if not image:
        return None
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    return parse_version(last.rsplit(":", 1)[1])


def _fmt(v: Version) -> str:
    return ".".join(map(str, v))


@dataclass(frozen=True)
class EngineVersion:
    engine: str
    version: Version | None
    source: str                     # "image tag", "spec.lookahead.engineVersion" or "unknown"

    @property
    def known(self) -> bool:
        return self.version is not None

    def at_least(self, v: Version) -> bool:
        """True when unknown (assumed current) or >= v."""
        return self.version is None or self.version >= v

    def describe(self) -> str:
        if self.version is None:
            return f"{self.engine} (version unknown, assumed current)"
        return f"{self.engine} {_fmt(self.version)} (from the {self.source})"


def engine_version(container: Mapping, engine: str, lookahead_spec: Any = None) -> EngineVersion:
    """The engine's version: ``spec.lookahead.engineVersion`` when set, else the image tag."""
    p = lookahead_params(lookahead_spec) if lookahead_spec is not None else LookaheadParams()
    if p.engine_version:
        v = parse_version(p.engine_version)
        if v is None:
            raise EngineError(f"cannot read a version from spec.lookahead.engineVersion {p.engine_version!r}")
        return EngineVersion(engine, v, "spec.lookahead.engineVersion")
    if engine == "reference":
        return EngineVersion(engine, None, "unknown")
    v = image_version(str(container.get("image") or ""))
    return EngineVersion(engine, v, "image tag" if v else "unknown")


# ---------------------------------------------------------------------------------------------
# detection


_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    # order matters: the reference engine mentions no vllm/sglang; check it first
    ("reference", re.compile(r"lookahead[_-]canary\.server|lookahead-engine|lookahead-rollout[^\s]*engine")),
    ("trtllm", re.compile(r"trtllm-serve|tensorrt[-_]llm")),
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
    """``"vllm" | "sglang" | "trtllm" | "reference" | None`` for a pod template (or Deployment /
    pod spec): the first container whose image, command or args name an engine."""
    for c in _pod_spec(pod_template).get("containers") or []:
        engine = detect_container_engine(c)
        if engine:
            return engine
    return None


def engine_container(pod_template_or_container: Mapping) -> Mapping | None:
    """The engine container of a pod template / Deployment / pod spec, or the container itself."""
    obj = pod_template_or_container
    if not any(k in obj for k in ("spec", "template", "containers")):
        return obj
    for c in _pod_spec(obj).get("containers") or []:
        if is_engine_container(c):
            return c
    return None


# ---------------------------------------------------------------------------------------------
# shell scripts: a small POSIX-shell tokenizer that keeps every token's source span


class _ShellTooComplex(Exception):
    pass


@dataclass
class _Tok:
    kind: str           # "word" | "op" | "redir"
    text: str           # source text
    start: int
    end: int
    value: str = ""     # words: the value after quote removal (literal parts only)
    opaque: bool = False  # words: contains an expansion ($X, $(..), `..`, globs, ~)
    literal_prefix: str = ""  # words: the value up to the first expansion


_OPERATORS = ("&>>", "<<-", "<<<", "&&", "||", ";;", "|&", "&>", ">>", "<<", "<&", ">&", "<>", ">|",
              "|", "&", ";", "<", ">", "(", ")")


def _skip_parens(s: str, i: int) -> int:
    """``s[i]`` is ``(``: the index after its matching ``)``, skipping quoted text."""
    depth = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                raise _ShellTooComplex("an unterminated single quote")
            i = j + 1
            continue
        if c == '"':
            i = _skip_double(s, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _ShellTooComplex("an unterminated $( ... )")


def _skip_double(s: str, i: int) -> int:
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if c == "$" or c == "`":
            i = _skip_expansion(s, i)
            continue
        i += 1
    raise _ShellTooComplex("an unterminated double quote")


def _skip_expansion(s: str, i: int) -> int:
    """``s[i]`` is ``$`` or a backtick: the index after the expansion."""
    n = len(s)
    if s[i] == "`":
        j = i + 1
        while j < n and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= n:
            raise _ShellTooComplex("an unterminated backquote")
        return j + 1
    if i + 1 >= n:
        return i + 1
    c = s[i + 1]
    if c == "(":
        return _skip_parens(s, i + 1)
    if c == "{":
        j = s.find("}", i + 2)
        if j < 0:
            raise _ShellTooComplex("an unterminated ${ ... }")
        return j + 1
    if c == "'":
        raise _ShellTooComplex("ANSI-C quoting ($'...')")
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", s[i + 1:])
    return i + 1 + (len(m.group(0)) if m else 0)


def _shell_tokens(s: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t":
            i += 1
            continue
        if c == "\\" and s[i + 1:i + 2] == "\n":
            i += 2
            continue
        if c == "#":
            while i < n and s[i] != "\n":
                i += 1
            continue
        if c == "\n":
            toks.append(_Tok("op", "\n", i, i + 1))
            i += 1
            continue
        op = next((o for o in _OPERATORS if s.startswith(o, i)), None)
        if op:
            if op in ("<<", "<<-", "<<<"):
                raise _ShellTooComplex("a here-document")
            kind = "redir" if op[0] in "<>" or op.startswith("&>") or op in ("<&", ">&") else "op"
            toks.append(_Tok(kind, op, i, i + len(op)))
            i += len(op)
            continue
        start = i
        value: list[str] = []
        prefix: list[str] | None = None
        opaque = False
        while i < n:
            c = s[i]
            if c in " \t\n|&;<>()":
                break
            if c == "\\":
                if s[i + 1:i + 2] == "\n":
                    i += 2
                    continue
                value.append(s[i + 1:i + 2])
                i += 2
                continue
            if c == "'":
                j = s.find("'", i + 1)
                if j < 0:
                    raise _ShellTooComplex("an unterminated single quote")
                value.append(s[i + 1:j])
                i = j + 1
                continue
            if c == '"':
                i += 1
                while True:
                    if i >= n:
                        raise _ShellTooComplex("an unterminated double quote")
                    c = s[i]
                    if c == '"':
                        i += 1
                        break
                    if c == "\\" and i + 1 < n and s[i + 1] in '$`"\\\n':
                        if s[i + 1] != "\n":
                            value.append(s[i + 1])
                        i += 2
                        continue
                    if c in "$`":
                        if prefix is None:
                            prefix = list(value)
                        opaque = True
                        i = _skip_expansion(s, i)
                        continue
                    value.append(c)
                    i += 1
                continue
            if c in "$`" or c in "*?[" or (c == "~" and i == start) or (c == "{" and "}" in s[i:]):
                if c in "$`":
                    if prefix is None:
                        prefix = list(value)
                    opaque = True
                    i = _skip_expansion(s, i)
                    continue
                if prefix is None:
                    prefix = list(value)
                opaque = True
            value.append(c)
            i += 1
        text = s[start:i]
        if text.isdigit() and i < n and s[i] in "<>":         # an IO number: 2>&1, 1>/dev/null
            op = next(o for o in _OPERATORS if s.startswith(o, i))
            if op in ("<<", "<<-", "<<<"):
                raise _ShellTooComplex("a here-document")
            toks.append(_Tok("redir", s[start:i + len(op)], start, i + len(op)))
            i += len(op)
            continue
        toks.append(_Tok("word", text, start, i, "".join(value), opaque,
                         "".join(prefix if prefix is not None else value)))
    return toks


_PY = re.compile(r"(^|/)python[0-9.]*$")
_ENGINE_MODULES = {
    "vllm": ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
    "sglang": ("sglang.launch_server",),
    "reference": ("lookahead_canary.server",),
    "trtllm": (),
}
_ENGINE_EXECUTABLES = {"vllm": ("vllm", "serve"), "sglang": ("sglang", "serve"),
                       "trtllm": ("trtllm-serve", None), "reference": ("lookahead-engine", None)}


def _engine_words(words: list[_Tok], engine: str | None) -> tuple[int, int] | None:
    """In one simple command, ``(start, end)`` of the words that invoke the engine (``vllm
    serve``, ``python3 -u -m sglang.launch_server``, ...); the engine's arguments follow ``end``."""
    engines = [engine] if engine else list(ENGINES)
    for i, w in enumerate(words):
        if w.opaque:
            continue
        base = w.value.rsplit("/", 1)[-1]
        for e in engines:
            exe, sub = _ENGINE_EXECUTABLES[e]
            if base == exe:
                if sub and i + 1 < len(words) and words[i + 1].value == sub:
                    return i, i + 2
                if sub and e == "vllm":        # bare `vllm` without `serve` is not the server
                    continue
                if e == "trtllm" and i + 1 < len(words) and words[i + 1].value == "serve":
                    return i, i + 2
                return i, i + 1
            if _PY.search(w.value) and _ENGINE_MODULES[e]:
                j = i + 1
                while j < len(words) and words[j].value.startswith("-") and words[j].value != "-m":
                    j += 1
                if j + 1 < len(words) and words[j].value == "-m" and words[j + 1].value in _ENGINE_MODULES[e]:
                    return i, j + 2
    return None


@dataclass
class _ShellEdit:
    """The engine command inside ``sh -c SCRIPT``: its argument words and where they are."""
    script: str
    args: list[_Tok]                # the engine's argument words, in order
    seps: list[str]                 # the source text before each argument word
    insert_at: int                  # index in script where the argument region starts
    region_end: int                 # index in script where it ends
    placeholders: dict[str, _Tok]

    def argv(self) -> list[str]:
        return [self._val(t, k) for k, t in enumerate(self.args)]

    def _val(self, t: _Tok, k: int) -> str:
        if not t.opaque:
            return t.value
        return f"{t.literal_prefix}\x00{k}\x00"

    def render(self, new: list[str]) -> str:
        old = self.argv()
        out: list[str] = []
        sm = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        for tag, a0, a1, b0, b1 in sm.get_opcodes():
            if tag == "equal":
                for k in range(a0, a1):
                    out.append(self.seps[k] + self.args[k].text)
                continue
            if tag == "delete":
                continue
            for off, k in enumerate(range(b0, b1)):
                v = new[k]
                if "\x00" in v:
                    raise _ShellTooComplex(f"an argument built from an expansion would have to be rewritten ({v!r})")
                sep = self.seps[a0 + off] if tag == "replace" and a0 + off < a1 else " "
                out.append(sep + shlex.quote(v))
        return self.script[:self.insert_at] + "".join(out) + self.script[self.region_end:]


def _parse_shell(script: str, engine: str | None) -> _ShellEdit:
    toks = _shell_tokens(script)
    commands: list[list[_Tok]] = [[]]
    for t in toks:
        if t.kind == "op":
            commands.append([])
        else:
            commands[-1].append(t)
    found: list[tuple[list[_Tok], tuple[int, int]]] = []
    for cmd in commands:
        words = [t for t in cmd if t.kind == "word"]
        span = _engine_words(words, engine)
        if span:
            found.append((cmd, span))
    if not found:
        raise _ShellTooComplex("no engine command found in the script")
    if len(found) > 1:
        raise _ShellTooComplex("the engine is started more than once in the script")
    cmd, (w0, w1) = found[0]
    words = [t for t in cmd if t.kind == "word"]
    last_engine_word = words[w1 - 1]
    idx = cmd.index(last_engine_word)
    args: list[_Tok] = []
    seps: list[str] = []
    prev_end = last_engine_word.end
    k = idx + 1
    seen_redir = False
    while k < len(cmd):
        t = cmd[k]
        if t.kind == "redir":
            seen_redir = True
            k += 2                          # the operator and its target word
            continue
        if seen_redir:
            raise _ShellTooComplex("engine arguments after a redirection")
        args.append(t)
        seps.append(script[prev_end:t.start])
        prev_end = t.end
        k += 1
    for n, t in enumerate(args):
        if not t.opaque or t.literal_prefix.startswith("-"):
            continue
        prev = args[n - 1] if n else None
        if prev is not None and not prev.opaque and prev.value.startswith("-") and "=" not in prev.value:
            continue                        # the value of the flag before it
        if n == 0:
            continue                        # a positional model argument (vllm serve $MODEL)
        raise _ShellTooComplex(f"the argument {t.text} is an expansion that may hold engine flags")
    return _ShellEdit(script, args, seps, last_engine_word.end, prev_end, {})


def _shell_script_index(argv: list[str]) -> int | None:
    """``sh -c SCRIPT`` / ``bash -lc SCRIPT`` / ``bash -o pipefail -c SCRIPT``: the index of SCRIPT."""
    if not argv or not re.search(r"(^|/)(ba|da|z|k|a)?sh$", argv[0]):
        return None
    i = 1
    while i < len(argv) - 1:
        a = argv[i]
        if re.fullmatch(r"-[a-zA-Z]*c[a-zA-Z]*", a):
            return i + 1
        if a in ("-o", "+o"):
            i += 2
            continue
        if a.startswith(("-", "+")):
            i += 1
            continue
        return None
    return None


# ---------------------------------------------------------------------------------------------
# flag editing on argv lists


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


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _int_or_none(v: str | None) -> int | None:
    if v is None or "\x00" in v:
        return None
    try:
        return int(v)
    except ValueError:
        return None


class _Argv:
    """Edit flags wherever they live: ``args`` (preferred), ``command``, or inside ``sh -c``."""

    def __init__(self, container: dict, engine: str | None = None):
        self.c = container
        self.shell: _ShellEdit | None = None
        cmd = list(container.get("command") or [])
        args = list(container.get("args") or [])
        idx = _shell_script_index(cmd + args)
        if idx is not None:
            self.script_of = "command" if idx < len(cmd) else "args"
            self._script_idx = idx if idx < len(cmd) else idx - len(cmd)
            name = container.get("name") or "?"
            try:
                self.shell = _parse_shell(str((cmd + args)[idx]), engine)
            except _ShellTooComplex as exc:
                raise EngineError(
                    f"container {name!r}: cannot edit its shell command safely ({exc}); start the engine "
                    f"without a shell wrapper, or with the engine flags outside any expansion") from None
            self.argv = self.shell.argv()
            self.where = self.script_of
        elif args or not cmd:
            self.where = "args"
            self.argv = args
        else:
            self.where = "command"
            self.argv = cmd

    def done(self) -> dict:
        if self.shell is not None:
            argv = list(self.c.get(self.script_of) or [])
            try:
                argv[self._script_idx] = self.shell.render(self.argv)
            except _ShellTooComplex as exc:
                raise EngineError(f"container {self.c.get('name') or '?'!r}: cannot edit its shell command "
                                  f"safely ({exc})") from None
            self.c[self.script_of] = argv
        else:
            self.c[self.where] = self.argv
        return self.c


def _edit(container: Mapping, fn, engine: str | None = None) -> dict:
    c = copy.deepcopy(dict(container))
    a = _Argv(c, engine)
    a.argv = fn(a.argv)
    return a.done()


def container_argv(container: Mapping, engine: str | None = None) -> list[str]:
    """The engine's argument list as the adapters see it (inside ``sh -c`` too; an argument
    built from a shell expansion shows as its literal prefix plus ``\\x00N\\x00``)."""
    return list(_Argv(copy.deepcopy(dict(container)), engine).argv)


def container_flag(container: Mapping, flag: str) -> str | None:
    """The value of ``flag`` in a container's argv (``None`` if absent)."""
    return _flag_value(container_argv(container), flag)


def _env(container: Mapping, name: str) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == name:
            return e.get("value")
    return None


# ---------------------------------------------------------------------------------------------
# vLLM

_SPEC = "--speculative-config"
VLLM_MIN_CHECKED = (0, 10, 0)
VLLM_SUFFIX_SINCE = (0, 11, 1)
VLLM_NGRAM_GPU_SINCE = (0, 18, 0)
VLLM_SC_ALIAS_SINCE = (0, 19, 0)
VLLM_SPEC_FLAGS_SINCE = (0, 22, 0)
VLLM_PER_BATCH_SINCE = (0, 24, 0)
_VLLM_SPEC_SHORTHANDS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}


def _vkey(arg: str) -> str | None:
    """vLLM's normalised option name of ``arg`` (``--speculative_config.x=1`` ->
    ``--speculative-config.x``): FlexibleArgumentParser turns ``_`` into ``-`` before the first dot."""
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0]
        head, dot, rest = name.partition(".")
        return "--" + head.replace("_", "-") + dot + rest
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        return arg.split("=", 1)[0]
    return None


def _vllm_is_spec(key: str | None) -> bool:
    return key is not None and (key in (_SPEC, "-sc") or key.startswith(_SPEC + ".") or key in _VLLM_SPEC_SHORTHANDS)


def _vllm_split(argv: list[str]) -> tuple[list[str], list[tuple[str, str | None]], int | None]:
    """``(argv without any speculation spelling, [(key, value)], index of the first one)``."""
    out: list[str] = []
    found: list[tuple[str, str | None]] = []
    first: int | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        key = _vkey(a)
        if _vllm_is_spec(key):
            if first is None:
                first = len(out)
            if "=" in a and (a.startswith("--") or a.startswith("-sc=")):
                found.append((key, a.split("=", 1)[1]))
                i += 1
            else:
                found.append((key, argv[i + 1] if i + 1 < len(argv) else None))
                i += 2
            continue
        out.append(a)
        i += 1
    return out, found, first


def _vllm_value(argv: list[str], key: str, short: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        k = _vkey(a)
        if k == key or (short and k == short):
            if "=" in a:
                return a.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def _json_or_str(v: str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v


def vllm_existing_speculation(argv: list[str]) -> dict | None:
    """The speculative config a vLLM argv already sets, merged from every spelling; ``None`` if
    none. Values built from a shell expansion are skipped."""
    _, found, _ = _vllm_split(argv)
    if not found:
        return None
    cfg: dict[str, Any] = {}
    for key, value in found:
        if value is None or "\x00" in value:
            continue
        if key in (_SPEC, "-sc"):
            v = _json_or_str(value)
            if isinstance(v, dict):
                cfg.update(v)
        elif key in _VLLM_SPEC_SHORTHANDS:
            cfg[_VLLM_SPEC_SHORTHANDS[key]] = _json_or_str(value)
        else:
            path = key[len(_SPEC) + 1:].rstrip("+").split(".")
            d = cfg
            for p in path[:-1]:
                d = d.setdefault(p, {})
            d[path[-1]] = _json_or_str(value)
    return {k.replace("-", "_"): v for k, v in cfg.items()}


def _vllm_method_cfg(p: LookaheadParams) -> dict[str, Any]:
    if p.method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": p.num_speculative_tokens}
    return {"method": p.method, "num_speculative_tokens": p.num_speculative_tokens,
            "prompt_lookup_min": p.prompt_lookup_min, "prompt_lookup_max": p.prompt_lookup_max}


def _vllm_schedule(p: LookaheadParams, max_batch: int, engine_max: int) -> list[list[int]]:
    ranges = [[1, min(max_batch, engine_max), p.num_speculative_tokens]]
    if max_batch < engine_max:
        ranges.append([max_batch + 1, engine_max, 0])
    return ranges


def _vllm_spec_json(p: LookaheadParams, max_batch: int | None, engine_max: int) -> str:
    cfg = _vllm_method_cfg(p)
    if max_batch is not None:
        cfg["num_speculative_tokens_per_batch_size"] = _vllm_schedule(p, max_batch, engine_max)
    return json.dumps(cfg, separators=(",", ":"))


#: keys of an existing speculative config that belong to its method, dropped when we switch method
_VLLM_OURS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
              "num_speculative_tokens_per_batch_size", "disable_by_batch_size")


def _vllm_draft_model_key(key: str) -> bool:
    """A key that configures a draft model, meaningless for the draft-free methods we render."""
    return key in ("model", "quantization", "revision", "code_revision", "max_model_len", "speculative_token_tree",
                   "parallel_drafting", "tensor_parallel_size") or key.startswith("draft_")


def _vllm_problems(container: Mapping, argv: list[str], p: LookaheadParams, ver: EngineVersion,
                   regime_aware: bool) -> list[str]:
    out: list[str] = []
    where = ver.describe()
    if p.method == "jacobi":
        out.append("vLLM has no Jacobi lookahead decoding (its lookahead-style method is n-gram prompt lookup). "
                   "Set spec.lookahead.method: ngram to measure vLLM's ngram speculation, or run the reference "
                   "engine for Jacobi (W, N, G).")
    if ver.version is not None and ver.version < VLLM_MIN_CHECKED:
        out.append(f"{where} predates the oldest vLLM this operator was checked against "
                   f"({_fmt(VLLM_MIN_CHECKED)}); its speculative flags differ")
    if p.method == "suffix" and not ver.at_least(VLLM_SUFFIX_SINCE):
        out.append(f"{where} has no 'suffix' speculative method (added in vLLM {_fmt(VLLM_SUFFIX_SINCE)})")
    if p.method == "ngram_gpu" and not ver.at_least(VLLM_NGRAM_GPU_SINCE):
        out.append(f"{where} has no 'ngram_gpu' speculative method (added in vLLM {_fmt(VLLM_NGRAM_GPU_SINCE)})")
    if regime_aware:
        if not ver.at_least(VLLM_PER_BATCH_SINCE):
            out.append(f"{where} has no per-batch-size speculation schedule (num_speculative_tokens_per_batch_size "
                       f"arrived in vLLM {_fmt(VLLM_PER_BATCH_SINCE)}; older releases silently drop it and would "
                       f"speculate at every batch size); use promotion mode full or analysisOnly, or upgrade")
        dp = _vllm_value(argv, "--data-parallel-size", "-dp")
        if dp is not None and (_int_or_none(dp) is None or _int_or_none(dp) > 1):
            out.append(f"vLLM switches the per-batch-size speculation schedule off with --data-parallel-size > 1 "
                       f"(here {dp if _int_or_none(dp) is not None else 'set from a shell expansion'}); "
                       f"regime-aware promotion cannot be enforced; use promotion mode full or analysisOnly")
        if p.method in ("ngram_gpu", "suffix") and str(_env(container, "VLLM_USE_V2_MODEL_RUNNER")).lower() in ("0", "false"):
            out.append(f"vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0) drops the per-batch-size schedule for "
                       f"method {p.method}")
    return out


def vllm_render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    ver = engine_version(container, "vllm", p)
    probe = container_argv(container, "vllm")
    problems = _vllm_problems(container, probe, p, ver, max_batch is not None)
    if problems:
        raise EngineError("; ".join(problems))

    def fn(argv: list[str]) -> list[str]:
        existing = vllm_existing_speculation(argv) or {}
        rest, _, first = _vllm_split(argv)
        mns = _int_or_none(_vllm_value(rest, "--max-num-seqs"))
        engine_max = mns or VLLM_DEFAULT_MAX_BATCH
        base = {k: v for k, v in existing.items() if k not in _VLLM_OURS and not _vllm_draft_model_key(k)}
        if existing.get("method") not in (None, p.method):
            base = {}                      # another method's settings (a draft model, EAGLE heads) do not carry over
        cfg = {**base, **json.loads(_vllm_spec_json(p, max_batch, engine_max))}
        if first is None:
            first = len(rest)
        return rest[:first] + [_SPEC, json.dumps(cfg, separators=(",", ":"))] + rest[first:]

    return _edit(container, fn, "vllm")


def vllm_render_off(container: Mapping) -> dict:
    return _edit(container, lambda argv: _vllm_split(argv)[0], "vllm")


# ---------------------------------------------------------------------------------------------
# SGLang

SGLANG_NGRAM_SINCE = (0, 5, 3)
SGLANG_MATCH_WINDOW_UNTIL = (0, 5, 9)          # --speculative-ngram-min/max-match-window-size: 0.5.3-0.5.9
SGLANG_OVERLAP_FORCED_UNTIL = (0, 5, 12)       # NGRAM forces --disable-overlap-schedule up to 0.5.12
SGLANG_CPU_SINCE = (0, 5, 16)
SGLANG_XPU_SINCE = (0, 5, 21)
_SGLANG_SPEC_BOOL = {"--speculative-use-rejection-sampling", "--speculative-use-block-verification",
                     "--speculative-adaptive", "--speculative-dspark-align-verify-tokens-to-graph-tier",
                     "--speculative-enable-w4a4-mxfp4-megamoe", "--no-speculative-enable-w4a4-mxfp4-megamoe",
                     "--enable-multi-layer-eagle"}


def _sglang_strip_spec(argv: list[str]) -> list[str]:
    """Drop every speculative flag (``--speculative-*``, with its value)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if name.startswith(("--speculative-", "--no-speculative-")) or name in ("--enable-multi-layer-eagle", "--uno-lora-path"):
            if "=" in a or name in _SGLANG_SPEC_BOOL:
                i += 1
            else:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                i += 2 if nxt is not None and not nxt.startswith("--") else 1
            continue
        out.append(a)
        i += 1
    return out


def _sglang_device(argv: list[str]) -> str:
    return (_flag_value(argv, "--device") or "cuda").split(":", 1)[0].lower()


def _sglang_common(argv: list[str], ver: EngineVersion) -> list[str]:
    """What NGRAM changes besides speculation, set the same on both roles."""
    if not _has_flag(argv, "--enable-metrics"):
        argv = argv + ["--enable-metrics"]
    if _flag_value(argv, "--max-running-requests") is None:
        argv = argv + ["--max-running-requests", str(SGLANG_NGRAM_MAX_RUNNING_REQUESTS)]
    argv = _remove_flag(argv, "--enable-mixed-chunk", takes_value=False)
    forced = (ver.version is not None and ver.version <= SGLANG_OVERLAP_FORCED_UNTIL) or _sglang_device(argv) == "cpu"
    if forced and not _has_flag(argv, "--disable-overlap-schedule"):
        argv = argv + ["--disable-overlap-schedule"]
    return argv


def _sglang_problems(argv: list[str], p: LookaheadParams, ver: EngineVersion, regime_aware: bool) -> list[str]:
    out: list[str] = []
    where = ver.describe()
    if p.method != "ngram":
        if p.method == "jacobi":
            out.append("SGLang has no Jacobi lookahead decoding; its lookahead is the trie-based n-gram method "
                       "(--speculative-algorithm NGRAM). Set spec.lookahead.method: ngram, or run the reference "
                       "engine for Jacobi (W, N, G).")
        else:
            out.append(f"SGLang has no {p.method!r} method; its n-gram speculation is method ngram "
                       f"(--speculative-algorithm NGRAM)")
    if not ver.at_least(SGLANG_NGRAM_SINCE):
        out.append(f"{where} has no NGRAM speculative algorithm (added in SGLang {_fmt(SGLANG_NGRAM_SINCE)})")
    if regime_aware:
        out.append("SGLang has no per-batch-size speculation switch, so speculation cannot be limited to small "
                   "batches; use promotion mode full or analysisOnly")
    dev = _sglang_device(argv)
    if dev == "cpu" and not ver.at_least(SGLANG_CPU_SINCE):
        out.append(f"{where}: NGRAM runs on CUDA only before SGLang {_fmt(SGLANG_CPU_SINCE)} (here --device cpu)")
    elif dev == "xpu" and not ver.at_least(SGLANG_XPU_SINCE):
        out.append(f"{where}: NGRAM runs on XPU only from SGLang {_fmt(SGLANG_XPU_SINCE)}")
    elif dev not in ("cuda", "cpu", "xpu"):
        out.append(f"SGLang's NGRAM speculation does not run on --device {dev}")
    attn_dp = _int_or_none(_flag_value(argv, "--attn-dp-size"))
    if _has_flag(argv, "--enable-dp-attention") or (attn_dp or 1) > 1:
        out.append("SGLang's NGRAM speculation does not support data-parallel attention "
                   "(--enable-dp-attention / --attn-dp-size > 1)")
    return out


def sglang_render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    ver = engine_version(container, "sglang", p)
    problems = _sglang_problems(container_argv(container, "sglang"), p, ver, max_batch is not None)
    if problems:
        raise EngineError("; ".join(problems))

    def fn(argv: list[str]) -> list[str]:
        argv = _sglang_common(_sglang_strip_spec(argv), ver)
        argv = argv + ["--speculative-algorithm", "NGRAM",
                       "--speculative-num-draft-tokens", str(p.num_speculative_tokens + 1)]
        if ver.version is not None and ver.version <= SGLANG_MATCH_WINDOW_UNTIL:
            argv += ["--speculative-ngram-min-match-window-size", str(p.prompt_lookup_min),
                     "--speculative-ngram-max-match-window-size", str(p.prompt_lookup_max)]
        return argv

    return _edit(container, fn, "sglang")


def sglang_render_off(container: Mapping) -> dict:
    ver = engine_version(container, "sglang")
    return _edit(container, lambda argv: _sglang_common(_sglang_strip_spec(argv), ver), "sglang")


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM (trtllm-serve): options in a YAML file, carried in a ConfigMap

TRTLLM_MIN_CHECKED = (1, 0, 0)
TRTLLM_MAX_CONCURRENCY_CHECKED = (1, 2, 0)
TRTLLM_OPTIONS_FLAG = "--extra_llm_api_options"       # every trtllm-serve; newer ones also take --config
TRTLLM_OPTIONS_FLAGS = ("--extra_llm_api_options", "--config")
TRTLLM_MOUNT_DIR = "/etc/lookahead-rollout/trtllm"
TRTLLM_OPTIONS_KEY = "extra-llm-api-options.yaml"
TRTLLM_VOLUME = "lookahead-trtllm-options"


def trtllm_options_path(container: Mapping) -> str | None:
    """The options file a trtllm-serve container already passes (``--config`` /
    ``--extra_llm_api_options``), or ``None``."""
    argv = container_argv(container, "trtllm")
    for f in TRTLLM_OPTIONS_FLAGS:
        v = _flag_value(argv, f)
        if v is not None:
            return v
    return None


def trtllm_options_source(pod_template: Mapping, container: Mapping) -> tuple[str, str] | None:
    """``(configmap name, key)`` holding the container's existing options file when it is mounted
    from a ConfigMap (so the operator can read it and pass it as ``base_options``)."""
    path = trtllm_options_path(container)
    if not path:
        return None
    volumes = {v.get("name"): v for v in _pod_spec(pod_template).get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        mp = str(m.get("mountPath") or "").rstrip("/")
        vol = volumes.get(m.get("name")) or {}
        cm = vol.get("configMap")
        if not cm or not mp:
            continue
        if m.get("subPath") and path == mp:
            return cm["name"], m["subPath"]
        if path.startswith(mp + "/"):
            return cm["name"], path[len(mp) + 1:]
    return None


def _trtllm_problems(argv: list[str], p: LookaheadParams, ver: EngineVersion, regime_aware: bool) -> list[str]:
    out: list[str] = []
    where = ver.describe()
    backend = (_flag_value(argv, "--backend") or "pytorch").lower()
    if ver.version is not None and ver.version < TRTLLM_MIN_CHECKED:
        out.append(f"{where} predates the TensorRT-LLM releases this operator was checked against "
                   f"({_fmt(TRTLLM_MIN_CHECKED)}+; trtllm-serve options differ)")
    if p.method in ("ngram_gpu", "suffix"):
        out.append(f"TensorRT-LLM has no {p.method!r} method; use ngram (NGram) or jacobi (Lookahead)")
    if p.method == "jacobi" and backend not in ("tensorrt", "trt"):
        out.append("TensorRT-LLM's Lookahead decoding (W, N, G) runs on its TensorRT backend only "
                   f"(this container uses --backend {backend}); use method ngram, or --backend tensorrt")
    if regime_aware:
        if p.method == "jacobi":
            out.append("TensorRT-LLM's max_concurrency (speculation off above a batch size) is PyTorch-backend "
                       "only, so a Lookahead regime cannot be enforced; use promotion mode full or analysisOnly")
        elif backend not in ("pytorch",):
            out.append(f"TensorRT-LLM's max_concurrency is PyTorch-backend only (here --backend {backend})")
        elif not ver.at_least(TRTLLM_MAX_CONCURRENCY_CHECKED):
            out.append(f"{where}: speculative_config.max_concurrency was checked only from TensorRT-LLM "
                       f"{_fmt(TRTLLM_MAX_CONCURRENCY_CHECKED)}; use promotion mode full or analysisOnly, or set "
                       f"spec.lookahead.engineVersion if the image is newer")
    return out


def trtllm_speculative_config(lookahead_spec: Any, regime: Any = None) -> dict:
    """The ``speculative_config`` section of trtllm-serve's options for a lookahead spec."""
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    if p.method == "jacobi":
        cfg: dict[str, Any] = {"decoding_type": "Lookahead", "max_window_size": p.window,
                               "max_ngram_size": p.ngram, "max_verification_set_size": p.guess_set}
    elif p.method == "ngram":
        cfg = {"decoding_type": "NGram", "max_draft_len": p.num_speculative_tokens,
               "max_matching_ngram_size": p.prompt_lookup_max}
    else:
        raise EngineError(f"TensorRT-LLM has no {p.method!r} method; use ngram (NGram) or jacobi (Lookahead)")
    if max_batch is not None:
        cfg["max_concurrency"] = max_batch
    return cfg


def _yaml_dump(data: Mapping) -> str:
    import yaml  # pyyaml: a dependency of kopf and of the operator

    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)


def _base_options(base_options: Mapping | str | None) -> dict:
    if base_options is None:
        return {}
    if isinstance(base_options, str):
        import yaml

        data = yaml.safe_load(base_options) or {}
        if not isinstance(data, Mapping):
            raise EngineError("the fleet's trtllm-serve options file is not a YAML mapping")
        return dict(data)
    return copy.deepcopy(dict(base_options))


@dataclass(frozen=True)
class TrtllmRoleConfig:
    """What one role (canary or control) of a trtllm-serve fleet needs: a ConfigMap with the
    options YAML, the pod volume that mounts it, and the edited container."""
    options: dict
    config_map: dict
    volume: dict
    container: dict

    def apply_to_pod_spec(self, pod_spec: Mapping, container_name: str | None = None) -> dict:
        """A NEW pod spec with the container replaced and the volume added (replaced by name)."""
        spec = copy.deepcopy(dict(pod_spec))
        name = container_name or self.container.get("name")
        spec["containers"] = [self.container if c.get("name") == name else c for c in spec.get("containers") or []]
        vols = [v for v in spec.get("volumes") or [] if v.get("name") != self.volume["name"]]
        spec["volumes"] = vols + [self.volume]
        return spec


def trtllm_role_config(container: Mapping, lookahead_spec: Any, role: str, *, config_map_name: str,
                       namespace: str | None = None, regime: Any = None,
                       base_options: Mapping | str | None = None,
                       labels: Mapping[str, str] | None = None) -> TrtllmRoleConfig:
    """The ConfigMap body and container edit for a trtllm-serve ``role`` ("canary": speculation
    on, "control": off, "promote": on with ``regime``). ``base_options``: the fleet's own options
    (YAML text or a mapping) when the container already passes ``--config`` /
    ``--extra_llm_api_options`` (see :func:`trtllm_options_source`); both roles start from the
    same base, so the control's options equal the canary's but for ``speculative_config``."""
    if role not in ("canary", "control", "promote"):
        raise EngineError(f"unknown role {role!r} (expected canary, control or promote)")
    p = lookahead_params(lookahead_spec)
    ver = engine_version(container, "trtllm", p)
    argv = container_argv(container, "trtllm")
    existing = trtllm_options_path(container)
    if existing and base_options is None:
        raise EngineError(f"container {container.get('name') or '?'!r} passes its own trtllm-serve options file "
                          f"{existing}; the operator cannot read files inside the image: mount it from a ConfigMap "
                          f"(then its content is passed on) or drop the flag")
    if role != "control":
        problems = _trtllm_problems(argv, p, ver, regime is not None)
        if problems:
            raise EngineError("; ".join(problems))
    options = _base_options(base_options)
    options.pop("speculative_config", None)
    if role != "control":
        options["speculative_config"] = trtllm_speculative_config(p, regime)
    cm_meta: dict[str, Any] = {"name": config_map_name}
    if namespace:
        cm_meta["namespace"] = namespace
    if labels:
        cm_meta["labels"] = dict(labels)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": cm_meta,
                  "data": {TRTLLM_OPTIONS_KEY: _yaml_dump(options)}}
    volume = {"name": TRTLLM_VOLUME, "configMap": {"name": config_map_name}}
    path = f"{TRTLLM_MOUNT_DIR}/{TRTLLM_OPTIONS_KEY}"

    def fn(argv: list[str]) -> list[str]:
        for f in TRTLLM_OPTIONS_FLAGS:
            argv = _remove_flag(argv, f)
        return argv + [TRTLLM_OPTIONS_FLAG, path]

    c = _edit(container, fn, "trtllm")
    mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") != TRTLLM_VOLUME]
    c["volumeMounts"] = mounts + [{"name": TRTLLM_VOLUME, "mountPath": TRTLLM_MOUNT_DIR, "readOnly": True}]
    return TrtllmRoleConfig(options=options, config_map=config_map, volume=volume, container=c)


def trtllm_render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    raise EngineError("TensorRT-LLM takes its speculative options from a YAML file: the operator must create a "
                      "ConfigMap for it; use engines.trtllm_role_config(container, spec, role, config_map_name=...)")


def trtllm_render_off(container: Mapping) -> dict:
    raise EngineError("TensorRT-LLM takes its speculative options from a YAML file: the operator must create a "
                      "ConfigMap for it; use engines.trtllm_role_config(container, spec, 'control', "
                      "config_map_name=...)")


# ---------------------------------------------------------------------------------------------
# reference engine

_MAX_BATCH = "--lookahead-max-batch-size"


def reference_speculative_config(lookahead_spec: Any) -> str:
    """The reference engine's ``--speculative-config`` (``lookahead_canary.specconfig``: the same
    model the engine parses it with)."""
    p = lookahead_params(lookahead_spec)
    if p.method == "jacobi":
        if p.prompt_lookup_tokens:
            # The original implementation seeds candidates from the prompt too; on steps with such a
            # draft the Jacobi window is skipped (fewer query tokens: see docs/benchmarks/engine-cpu.md).
            cfg = specconfig.JacobiConfig(window=p.window, ngram=p.ngram, guess_set=p.guess_set,
                                          prompt_lookup_tokens=p.prompt_lookup_tokens, window_with_draft=False)
        else:
            cfg = specconfig.JacobiConfig(window=p.window, ngram=p.ngram, guess_set=p.guess_set)
    elif p.method == "ngram":
        cfg = specconfig.NgramConfig(num_speculative_tokens=p.num_speculative_tokens,
                                     prompt_lookup_min=p.prompt_lookup_min, prompt_lookup_max=p.prompt_lookup_max)
    else:
        raise EngineError(f"the reference engine has no {p.method!r} method (it runs jacobi and ngram)")
    return specconfig.render(cfg)


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

    return _edit(container, fn, "reference")


def reference_render_off(container: Mapping) -> dict:
    return _edit(container, lambda argv: _remove_flag(_remove_flag(argv, _SPEC), _MAX_BATCH), "reference")


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
    "trtllm": EngineAdapter("trtllm", TRTLLM_METRICS, trtllm_render_lookahead, trtllm_render_off),
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
                              "set spec.engine to vllm, sglang, trtllm or reference")
    return adapter(engine)


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None, engine: str | None = None) -> dict:
    """A NEW container with lookahead on (``regime``: speculate only up to that batch size)."""
    return _resolve(container, engine).render_lookahead(container, lookahead_spec, regime)


def render_off(container: Mapping, engine: str | None = None) -> dict:
    """A NEW container with every lookahead flag removed (the control)."""
    return _resolve(container, engine).render_off(container)


def support_problems(pod_template_or_container: Mapping, engine: str | None, lookahead_config: Any,
                     regime_aware: bool) -> list[str]:
    """Human messages naming what this engine version (image tag, or ``spec.lookahead.engineVersion``)
    cannot do for this lookahead config; empty when the canary, the control and (if
    ``regime_aware``) a regime-aware promotion can all be rendered. An unknown version is assumed
    current. Meant for an ``Accepted=False`` condition."""
    container = engine_container(pod_template_or_container)
    if container is None:
        return ["no container in the pod template names an engine (vllm, sglang, trtllm or the reference "
                "engine); set spec.engine"]
    if engine in (None, "auto"):
        engine = detect_container_engine(container)
        if engine is None:
            return [f"cannot tell the engine of container {container.get('name') or '?'!r} from its image, command "
                    f"or args; set spec.engine to vllm, sglang, trtllm or reference"]
    if engine not in ADAPTERS:
        return [f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})"]
    try:
        p = lookahead_params(lookahead_config)
        ver = engine_version(container, engine, p)
        argv = container_argv(container, engine)
    except EngineError as exc:
        return [str(exc)]
    problems: list[str] = []
    if engine == "vllm":
        problems += _vllm_problems(container, argv, p, ver, regime_aware)
    elif engine == "sglang":
        problems += _sglang_problems(argv, p, ver, regime_aware)
    elif engine == "trtllm":
        problems += _trtllm_problems(argv, p, ver, regime_aware)
        path = trtllm_options_path(container)
        if path and pod_template_or_container is not container and \
                trtllm_options_source(pod_template_or_container, container) is None:
            problems.append(f"container {container.get('name') or '?'!r} passes its own trtllm-serve options file "
                            f"{path}, not mounted from a ConfigMap, so the operator cannot carry it into the canary "
                            f"and control")
    else:
        try:
            reference_speculative_config(p)
        except EngineError as exc:
            problems.append(str(exc))
    if not problems and engine != "trtllm":
        regimes = [None, 1] if regime_aware else [None]
        for r in regimes:
            for fn in (lambda: render_lookahead(container, p, r, engine), lambda: render_off(container, engine)):
                try:
                    fn()
                except EngineError as exc:
                    if str(exc) not in problems:
                        problems.append(str(exc))
    return problems


def regime_config(engine: str, lookahead_spec: Any, max_batch_size: int, engine_max_batch: int | None = None) -> dict:
    """The engine-specific regime-aware setting, for a Decision's message and the report."""
    p = lookahead_params(lookahead_spec)
    if engine == "vllm":
        if p.method == "jacobi":
            raise EngineError("vLLM has no Jacobi lookahead; a vLLM regime config needs method ngram")
        return {"--speculative-config": json.loads(_vllm_spec_json(p, max_batch_size,
                                                                   engine_max_batch or VLLM_DEFAULT_MAX_BATCH))}
    if engine == "sglang":
        raise EngineError("SGLang has no per-batch-size speculation switch; regime-aware promotion is not possible")
    if engine == "trtllm":
        return {"speculative_config": trtllm_speculative_config(p, max_batch_size)}
    if engine == "reference":
        return {"--speculative-config": json.loads(reference_speculative_config(p)), _MAX_BATCH: max_batch_size}
    raise EngineError(f"unknown engine {engine!r}")


def strip_flags(argv: Iterable[str], flags: Iterable[str]) -> list[str]:
    out = list(argv)
    for f in flags:
        out = _remove_flag(out, f)
    return out
