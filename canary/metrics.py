"""Engine metrics with vLLM's names and labels, so the same PromQL reads vLLM and us.

Every series carries ``model_name`` and ``engine`` (``engine="0"``: one engine core per
process, as vLLM labels its single-engine case). Names, types and label sets follow vLLM's
``vllm/v1/metrics/loggers.py``; ``vllm:time_per_output_token_seconds`` is deliberately absent
(vLLM removed it in 2026).

Two places where we differ from vLLM on purpose:

* ``vllm:inter_token_latency_seconds`` is observed **once per token**. vLLM observes it once
  per streamed chunk, and with speculation a chunk carries several tokens, so its per-chunk
  ITL makes a speculating canary look slower per step than it is per token (the ITL trap in
  DESIGN.md). When one decode step hands a sequence ``k`` tokens after a gap of ``dt`` since
  its previous tokens, we observe ``dt / k`` ``k`` times. ``_sum`` still adds up to the wall
  time the client waited, and ``_count`` equals the generated tokens after each request's
  first, so ``rate(_sum) / rate(_count)`` is a true mean per-token latency.
* ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`` follows vLLM's definition
  (a draft that had ``a`` tokens accepted adds one at positions ``0..a-1``; per-position
  acceptance is its increase over the drafts counter's). vLLM creates positions
  ``0..num_speculative_tokens-1`` at start; we create the positions the configuration can accept
  (Jacobi: ``ngram - 1``; ngram: ``num_speculative_tokens``; at least position 0, so the family
  is there, at 0, on a greedy engine as our other spec-decode counters are), and add a position
  when a longer draft (prompt-lookup seeding) is accepted.
* ``vllm:kv_cache_usage_perc`` is a stand-in: the reference engine keeps one dense KV cache
  per running sequence rather than a paged block pool, so "usage" is
  ``running sequences / --max-num-seqs`` (0..1, where 1 means the batch is full). It answers
  the question dashboards ask of it (is the engine saturated?), not the byte count.

Latency buckets: vLLM's per-token pair (ITL and request_time_per_output_token) has 19
boundaries starting at 10 ms, which is too coarse for a CPU or small-model engine whose
per-token latency sits between 1 and 100 ms. Ours are a superset of vLLM's: every vLLM
boundary is present (so ``le="0.05"`` style queries and SLO thresholds mean the same thing),
with finer steps added below 100 ms. The request-level histograms use vLLM's boundaries with
a few finer ones under 0.3 s, where short test requests land.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# vLLM's boundaries, transcribed from vllm/v1/metrics/loggers.py.
VLLM_PER_TOKEN_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]
VLLM_TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]
VLLM_REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]

# Ours: supersets of the above (asserted in the unit tests).
PER_TOKEN_BUCKETS = sorted(set(VLLM_PER_TOKEN_BUCKETS) | {
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009,
    0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.03, 0.035, 0.04, 0.045,
    0.055, 0.06, 0.065, 0.07, 0.08, 0.085, 0.09, 0.095, 0.125, 0.175, 0.25,
})
TTFT_BUCKETS = sorted(set(VLLM_TTFT_BUCKETS) | {0.002, 0.03, 0.05, 0.15, 0.2, 0.3, 0.4})
REQUEST_LATENCY_BUCKETS = sorted(set(VLLM_REQUEST_LATENCY_BUCKETS) | {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2,
})

LABELS = ("model_name", "engine")

#: The vLLM series this module exposes (base names, as in PromQL).
VLLM_HISTOGRAMS = (
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_queue_time_seconds",
)
VLLM_COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:request_success_total",
)
#: The per-position counter's extra label (vLLM: ``position``, "0", "1", ...).
POSITION_LABEL = "position"
VLLM_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
)
INFO_METRIC = "lookahead_engine_info"

#: vLLM's finished_reason values (FinishReason: stop, length, abort).
FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class FinishedRequest:
    """Timestamps (time.monotonic seconds) and counts of one finished request."""

    arrival: float
    scheduled: float
    first_token: float
    last_token: float
    finished: float
    prompt_tokens: int
    generation_tokens: int
    finish_reason: str


def spec_positions(info: dict[str, str] | None) -> int:
    """Draft positions the engine's speculative configuration can accept (from the
    ``lookahead_engine_info`` labels): Jacobi ``ngram - 1``, ngram ``num_speculative_tokens``;
    at least 1."""
    info = info or {}

    def num(key: str) -> int:
        try:
            return int(str(info.get(key, "")).strip())
        except ValueError:
            return 0

    method = info.get("method")
    if method == "jacobi":
        return max(1, num("ngram") - 1)
    if method == "ngram":
        return max(1, num("num_speculative_tokens"))
    return 1


# The engine's plain series: (attribute, vLLM's name, help[, buckets]). Counters are declared
# without ``_total``, which prometheus_client appends in the exposition.
_HISTOGRAMS: tuple[tuple[str, str, str, list[float]], ...] = (
    ("itl", "vllm:inter_token_latency_seconds", "Inter-token latency in seconds, one observation per "
     "token (a step that yields k tokens after dt observes dt/k k times).", PER_TOKEN_BUCKETS),
    ("tpot", "vllm:request_time_per_output_token_seconds",
     "Per request: decode time / (generated tokens - 1), in seconds.", PER_TOKEN_BUCKETS),
    ("ttft", "vllm:time_to_first_token_seconds",
     "Time from arrival to the first generated token, in seconds.", TTFT_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("prefill", "vllm:request_prefill_time_seconds",
     "Time from scheduling to the first token (PREFILL phase), seconds.", REQUEST_LATENCY_BUCKETS),
    ("decode", "vllm:request_decode_time_seconds",
     "Time from the first to the last token (DECODE phase), seconds.", REQUEST_LATENCY_BUCKETS),
    ("queue", "vllm:request_queue_time_seconds", "Time spent WAITING for a batch slot, seconds.",
     REQUEST_LATENCY_BUCKETS),
)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("generation_tokens", "vllm:generation_tokens", "Number of generation tokens processed."),
    ("prompt_tokens", "vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("spec_drafts", "vllm:spec_decode_num_drafts",
     "Number of spec decoding drafts (one per sequence per speculative step)."),
    ("spec_draft_tokens", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens verified."),
    ("spec_accepted_tokens", "vllm:spec_decode_num_accepted_tokens", "Number of draft tokens accepted."),
)
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("running", "vllm:num_requests_running", "Number of requests in model execution batches."),
    ("waiting", "vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("kv_usage", "vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent. Stand-in: running "
     "sequences / max-num-seqs (one dense cache per sequence)."),
)


class EngineMetrics:
    """The engine's Prometheus metrics in their own registry.

    prometheus_client appends ``_total`` to a counter's name in the exposition, so counters
    are declared without it; the exposed names are exactly vLLM's.
    """

    # the series of _HISTOGRAMS, _COUNTERS and _GAUGES, as the scheduler and server use them
    itl: Histogram
    tpot: Histogram
    ttft: Histogram
    e2e: Histogram
    prefill: Histogram
    decode: Histogram
    queue: Histogram
    generation_tokens: Counter
    prompt_tokens: Counter
    spec_drafts: Counter
    spec_draft_tokens: Counter
    spec_accepted_tokens: Counter
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge

    def __init__(self, model_name: str, engine: str = "0", max_num_seqs: int = 1,
                 info: dict[str, str] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.engine = engine
        self.max_num_seqs = max(1, int(max_num_seqs))
        lv = (model_name, engine)
        r = self.registry

        for attr, name, doc, buckets in _HISTOGRAMS:
            setattr(self, attr, Histogram(name, doc, LABELS, buckets=buckets, registry=r).labels(*lv))
        for attr, name, doc in _COUNTERS:
            setattr(self, attr, Counter(name, doc, LABELS, registry=r).labels(*lv))
        for attr, name, doc in _GAUGES:
            setattr(self, attr, Gauge(name, doc, LABELS, registry=r).labels(*lv))
        self._per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                "Accepted tokens per draft position.", LABELS + (POSITION_LABEL,),
                                registry=r)
        self.spec_accepted_per_pos: list = []
        self._ensure_positions(spec_positions(info))
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          LABELS + ("finished_reason",), registry=r)
        self.request_success = {reason: success.labels(model_name, engine, reason)
                                for reason in FINISH_REASONS}

        info = dict(info or {})
        info_labels = ("model_name", "engine") + tuple(k for k in info if k not in LABELS)
        Gauge(INFO_METRIC, "Reference engine configuration (always 1).", info_labels,
              registry=r).labels(model_name, engine,
                                 *(str(info[k]) for k in info_labels[2:])).set(1)

    # -- per step / per request ---------------------------------------------------------
    def observe_tokens(self, gap_seconds: float, k: int) -> None:
        """``k`` tokens reached a client ``gap_seconds`` after its previous ones."""
        if k <= 0:
            return
        per_token = max(0.0, gap_seconds) / k
        for _ in range(k):
            self.itl.observe(per_token)

    def observe_generated(self, n: int) -> None:
        if n > 0:
            self.generation_tokens.inc(n)

    def observe_prompt(self, n: int) -> None:
        if n > 0:
            self.prompt_tokens.inc(n)

    def _ensure_positions(self, n: int) -> None:
        while len(self.spec_accepted_per_pos) < n:
            pos = str(len(self.spec_accepted_per_pos))
            self.spec_accepted_per_pos.append(self._per_pos.labels(self.model_name, self.engine, pos))

    def observe_spec(self, draft_tokens: int, accepted_tokens: int) -> None:
        """One sequence's share of one speculative step (one draft, as vLLM counts it): the
        accepted tokens are the draft's first ``accepted_tokens``, so positions ``0..a-1`` count."""
        if draft_tokens <= 0:
            return
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(draft_tokens)
        if accepted_tokens > 0:
            self.spec_accepted_tokens.inc(accepted_tokens)
            self._ensure_positions(accepted_tokens)
            for pos in range(accepted_tokens):
                self.spec_accepted_per_pos[pos].inc()

    def observe_first_token(self, arrival: float, first_token: float) -> None:
        self.ttft.observe(max(0.0, first_token - arrival))

    def observe_finished(self, req: FinishedRequest) -> None:
        """Request-level histograms, vLLM's definitions (e2e = queue + prefill + decode)."""
        reason = req.finish_reason if req.finish_reason in self.request_success else "abort"
        self.request_success[reason].inc()
        self.e2e.observe(max(0.0, req.finished - req.arrival))
        self.queue.observe(max(0.0, req.scheduled - req.arrival))
        if req.generation_tokens > 0:
            self.prefill.observe(max(0.0, req.first_token - req.scheduled))
            decode = max(0.0, req.last_token - req.first_token)
            self.decode.observe(decode)
            if req.generation_tokens > 1:
                self.tpot.observe(decode / (req.generation_tokens - 1))

    def set_load(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(min(1.0, running / self.max_num_seqs))

    # -- exposition -------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """Text exposition, without prometheus_client's ``*_created`` samples.

        They are extra ``*_created`` gauge families that no vLLM query reads; dropping them
        here (rather than with ``disable_created_metrics()``, which is process-wide) keeps
        the exposed families to vLLM's names plus ``lookahead_engine_info``.
        """
        return generate_latest(_WithoutCreated(self.registry)), CONTENT_TYPE_LATEST


class _WithoutCreated:
    """A read-only view of a registry whose families carry no ``*_created`` samples."""

    def __init__(self, registry: CollectorRegistry):
        self._registry = registry

    def collect(self):
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
