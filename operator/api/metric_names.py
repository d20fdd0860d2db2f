"""Prometheus metric names per engine: one :class:`MetricNames` per engine, so one PromQL builder
(``lookahead_operator.measurement.prometheus``) reads every engine.

It lives in the api layer because both the engine adapters (``lookahead_operator.engines``, each
adapter names its entry here) and the measurement read it, and those two never import each other.
Per-token latency is always a per-*token* histogram (vLLM: ``request_time_per_output_token``;
never vLLM's per-chunk ITL). Adding an engine: one instance below and one entry in
``METRIC_NAMES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # finished requests by ``finished_reason`` (the label), and the reasons that are a failure a
    # user saw (the guard's error rate); None: the engine exports no such counter
    request_success: str | None = None
    error_reasons: tuple[str, ...] = ()

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
    # FinishReason stop | length | abort: abort is a request the engine did not finish (an error,
    # a preemption it gave up on, or a client that went away)
    request_success="vllm:request_success_total", error_reasons=("abort",),
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

#: Every engine's names, by engine name.
METRIC_NAMES: dict[str, MetricNames] = {m.engine: m for m in (VLLM_METRICS, SGLANG_METRICS, REFERENCE_METRICS)}


def metric_names(engine: str) -> MetricNames:
    """The names ``engine`` exports; ``ValueError`` for an engine with no entry."""
    try:
        return METRIC_NAMES[engine]
    except KeyError:
        raise ValueError(f"unknown engine {engine!r} (expected one of {', '.join(METRIC_NAMES)})") from None
