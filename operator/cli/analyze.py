"""The embedded main job: ``kubectl lookahead analyze``.

Starts a control (lookahead off) and a canary (lookahead on) reference engine as local processes
on the same model -- or uses two engines already running (``--engine-url CONTROL CANARY``) --
then drives both with the closed-loop load generator in short rounds, one pair of rounds per
batch size in turn: each round runs the control and the canary at the same time (``--arms
together``; ``alternate``: one after the other, the order alternating), C workers sending one
request each, and at least one request per prompt of the round's block: the same
``prompts_per_round`` prompts of the set (``round_block``) in both roles and in every round, so
that what differs from round to round is the machine, not the prompt mix.

It measures through the operator's own pipeline; only the source differs. Each engine's
``/metrics`` is read just before and just after each of its rounds (``prometheus.scrape_engine``,
``prometheus.increments_between``): what the engine counted in the round -- generated tokens,
the per-token-latency histogram's sum, count and buckets, the spec-decode counters -- is the same
``prometheus.Increments`` the operator reads from Prometheus for one sample window. Round i of
both roles is one pair (``prometheus.paired_sample``): per-token latency (histogram sum / count)
and throughput (generated tokens / the time between the reads) for each role. The pairs go to the
operator's ``measure.paired_verdict`` (the paired anytime-valid tests, ``stats.PairedComparison``,
and the tail veto from the summed buckets), so machine drift slower than a round (another
process starting, thermal or frequency changes) lands on both roles and cancels in their ratio.
A batch size stops as soon as its verdict is settled (wins, regresses, no gain), or when the
time left would not hold another of its pairs, which leaves it Pending. ``confidence`` is that of the whole
decision: each test runs at its share (``stats.family_split``, the operator's split). The
per-batch verdicts go to ``lookahead_operator.measurement.decision.decide``; the table, the crossover and the
decision are printed and a report (HTML with PNG plots, JSON) is written.

The load generator's own per-token latency and tokens/s (usage-counted, client-side) are kept per
role as a cross-check of the engine's numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from lookahead_canary import loadgen, process, units
from lookahead_canary.loadgen import Prompt, RequestResult, StepResult

from lookahead_operator import engines
from lookahead_operator.measurement import measure
from lookahead_operator.measurement import prometheus
from lookahead_operator.measurement.stats import family_split, policy_thresholds
from lookahead_operator.api.metric_names import MetricNames

# both regimes on a 2-core CPU within the time limit: lookahead wins at 1 and loses at 8
# (docs/benchmarks/engine-cpu.md); a size near the crossover (4) would not settle in time
DEFAULT_BATCH_SIZES = (1, 8)
# prompts in every round, the same ones in both roles and in every round (`round_block`):
# lookahead's gain differs from prompt to prompt (a prompt whose answer copies code from it gains
# 3-8x, prose none), so rounds that each take the next prompts of the set vary with the prompt mix;
# a fixed block leaves only the machine's noise between rounds (docs/analyze.md, "Round-to-round
# variance"). Three prompts make a batch-1 pair 10 s on 2 cores (15-17 s beside a busy process),
# and on the code set their gain (-24%) is closer to the whole set's (-27%) than four's (-15%).
DEFAULT_PROMPTS_PER_ROUND = 3
# how a round's two roles share the machine: "together" runs the control's and the canary's round at
# the same time, a core's worth each, so the machine's noise over those seconds lands on both and
# cancels in their ratio (measured at batch 1, 4-prompt rounds: the per-round log-ratio's standard
# deviation 0.040 in 14.5 s pairs, against 0.056 in 25 s pairs taking turns: about three times the
# information per second); "alternate" runs them one after the other
DEFAULT_ARMS = "together"
# torch threads per local engine: a second thread buys little on 2 cores (a greedy step: 65 ms
# either way) and makes every step erratic when another process competes for the cores
DEFAULT_ENGINE_THREADS = 1
# the whole run, engine start included, so that `make demo` ends within 5 minutes on 2 cores with
# its own start and report (about 8 s). The minimum sample (6 pairs) of both batch sizes takes
# about 165 s there when quiet and about 220 s beside a process that keeps one core busy; the rest
# is the engines' start (8 s; 40 s the first time, when SmolLM2 is converted) and measuring on
# while an interval still spans a threshold (docs/analyze.md, "Time on two CPU cores").
DEFAULT_TIME_LIMIT_S = 285.0
RESERVE_S = 12.0                    # kept for the report and stopping the engines (about 3 s)
DEFAULT_MAX_TOKENS = 32
DEFAULT_INTERVAL_S = 2.0
# The CPU-tuned setting from docs/benchmarks/engine-cpu.md: a small Jacobi window plus prompt-seeded
# drafts (each extra query token costs real time on a CPU, so the paper's W=7, N=5, G=7 cannot pay).
DEFAULT_LOOKAHEAD = {"method": "jacobi", "window": 3, "ngram": 4, "guess_set": 2, "prompt_lookup_tokens": 24}


class AnalyzeError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# the machine


def machine() -> dict[str, Any]:
    """This machine's CPU: model name, the instruction sets that decide what a forward over more
    query tokens costs (AVX-512, bf16, AMX), and the core count (/proc/cpuinfo; Linux)."""
    name, flags = "unknown CPU", []
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    return {"cpu": name, "cpu_flags": [f for f in wanted if f in flags], "cores": os.cpu_count()}


def machine_words() -> str:
    m = machine()
    return f"{m['cpu']} ({', '.join(m['cpu_flags']) or 'no AVX'}), {m['cores']} cores"


# ---------------------------------------------------------------------------------------------
# engine processes


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineProcess:
    """A reference engine (``python3 -m lookahead_canary.server``) as a child process."""

    role: str
    model: str = "smollm2"
    speculative_config: str | None = None
    lookahead_max_batch_size: int | None = None
    backend: str = "model"
    sim_config: str | None = None
    max_num_seqs: int = 32
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None       # extra environment (e.g. OMP_NUM_THREADS), over os.environ
    port: int = 0
    log_path: Path | None = None
    popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "lookahead_canary.server", "--host", "127.0.0.1", "--port", str(self.port),
                "--model", self.model, "--max-num-seqs", str(self.max_num_seqs), "--backend", self.backend]
        if self.speculative_config:
            argv += ["--speculative-config", self.speculative_config]
        if self.lookahead_max_batch_size:
            argv += ["--lookahead-max-batch-size", str(self.lookahead_max_batch_size)]
        if self.sim_config:
            argv += ["--sim-config", self.sim_config]
        return argv + list(self.extra_args)

    def start(self) -> "EngineProcess":
        if not self.port:
            self.port = free_port()
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix=f"lookahead-{self.role}-")) / "engine.log"
        env = {**os.environ, **self.env} if self.env else None
        self.popen = process.start(self.argv(), self.log_path, env=env)
        return self

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])  # type: ignore[union-attr]
        except OSError:
            return ""

    def dead(self) -> str | None:
        if self.popen is None:
            return f"{self.role} engine was never started"
        code = self.popen.poll()
        if code is None:
            return None
        return f"{self.role} engine exited with code {code}; last lines of {self.log_path}:\n{self.log_tail()}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 300.0, poll_s: float = 0.25) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            dead = self.dead()
            if dead:
                raise AnalyzeError(dead)
            if time.monotonic() > deadline:
                raise AnalyzeError(f"{self.role} engine not ready after {timeout:.0f} s; last lines of its log:\n"
                                   f"{self.log_tail()}")
            time.sleep(poll_s)

    def stop(self, timeout: float = 20.0) -> None:
        process.stop(self.popen, timeout)

    def __enter__(self) -> "EngineProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# engine /metrics snapshots (the direct source of the one pipeline, prometheus.Increments)


def scrape_metrics(url: str, timeout: float = 10.0) -> dict[str, float]:
    """``/metrics`` of an engine: sample name -> value summed over label sets (``_bucket`` dropped;
    the per-position acceptance counter also per position, ``acceptance.position_key``)."""
    return dict(prometheus.scrape_engine(url, None, timeout).values)


def metrics_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    if before is None or after is None:
        return {}
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


SCRAPE_ATTEMPTS = 3


def _snapshot(url: str, m: MetricNames) -> prometheus.EngineScrape:
    """One read of an engine's ``/metrics`` (per-token-latency buckets included), retried twice
    (an engine busy finishing a cancelled round can be slow to answer); raises ``OSError``."""
    for attempt in range(SCRAPE_ATTEMPTS):
        try:
            return prometheus.scrape_engine(url, m)
        except (OSError, ValueError):
            if attempt == SCRAPE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def check_metrics(role: str, url: str, m: MetricNames) -> None:
    """The engine exports what the statistics read (generated tokens, the per-token-latency
    histogram), else an ``AnalyzeError`` that says what is missing: analyze has no client-side
    fallback -- it measures what the operator measures."""
    try:
        snap = _snapshot(url, m)
    except (OSError, ValueError) as exc:
        raise AnalyzeError(f"cannot read the {role} engine's metrics at {url}/metrics ({exc}): analyze reads the "
                           "engine's own counters, as the operator does (SGLang: start it with --enable-metrics)") \
            from None
    need = [m.generation_tokens] + ([f"{m.per_token_latency}_count"] if m.per_token_latency else
                                    [f"{m.decode_time}_sum"] if m.decode_time else [])
    missing = [n for n in need if n not in snap.values]
    if missing:
        raise AnalyzeError(f"the {role} engine at {url} exports no {', '.join(missing)} (engine {m.engine!r}: "
                           "pass the right --engine)")


# ---------------------------------------------------------------------------------------------
# results


def _mean_ci(xs: Sequence[float], z: float = 1.96) -> tuple[float | None, float | None]:
    """Mean and the half-width of a normal 95% interval of the mean (for error bars)."""
    if not xs:
        return None, None
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    return m, z * statistics.stdev(xs) / math.sqrt(len(xs))


@dataclass
class RoleMeasurement:
    """One role at one batch size, accumulated over rounds: the load generator's records (the
    client's view, kept as a cross-check) and, per round, what the engine counted between reads of
    its ``/metrics`` just before and just after the round (``increments``: what the statistics
    read, through ``prometheus.paired_sample`` as the operator's Prometheus readings do)."""

    role: str
    batch_size: int
    requests: list[RequestResult] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    increments: list[prometheus.Increments | None] = field(default_factory=list)
    output_tokens: int = 0
    seconds: float = 0.0
    server: dict[str, float] = field(default_factory=dict)
    client_warnings: list[str] = field(default_factory=list)

    def add_round(self, step: StepResult, inc: prometheus.Increments | None) -> None:
        """One round: the load generator's record and the engine's increments over it (None when
        its ``/metrics`` could not be read: the round's pair is then left out, never read as 0)."""
        self.requests += step.requests
        self.steps.append(step)
        self.increments.append(inc)
        self.windows.append((inc.start, inc.end) if inc is not None else (step.start, step.end))
        self.output_tokens += step.output_tokens
        self.seconds += step.duration_s
        for k, v in (inc.counters.items() if inc is not None else ()):
            self.server[k] = self.server.get(k, 0.0) + v
        if step.client.bottleneck:
            self.client_warnings.append(f"round {len(self.windows)}: " + "; ".join(step.client.reasons))

    def samples(self, m: MetricNames) -> list[prometheus.RoleSample]:
        """One sample per round (``prometheus.role_sample`` of its increments)."""
        return [prometheus.role_sample(inc, m) for inc in self.increments]

    def per_token_s(self, m: MetricNames) -> list[float]:
        return [s.per_token_latency_s for s in self.samples(m) if s.per_token_latency_s is not None]

    def interval_tokens_per_s(self, m: MetricNames) -> list[float]:
        return [s.tokens_per_s for s in self.samples(m) if s.tokens_per_s is not None]

    @property
    def client_per_token_s(self) -> list[float]:
        """The client's per-token latency per round (`round_per_token_s`; a cross-check only)."""
        return [x for x in (round_per_token_s(st) for st in self.steps) if x is not None]

    @property
    def errors(self) -> list[str]:
        return [r.error or "?" for r in self.requests if not r.ok and not (r.error or "").startswith("cancelled")]

    @property
    def cancelled(self) -> int:
        return sum(1 for r in self.requests if not r.ok and (r.error or "").startswith("cancelled"))

    def server_ratio(self, num: str, den: str) -> float | None:
        d = self.server.get(den, 0.0)
        return self.server.get(num, 0.0) / d if d > 0 else None

    def summary(self, m: MetricNames) -> dict:
        ptl_mean, ptl_ci = _mean_ci(self.per_token_s(m))
        tps_mean, tps_ci = _mean_ci(self.interval_tokens_per_s(m))
        client_ptl, _ = _mean_ci(self.client_per_token_s)
        ttft = [r.ttft_s for r in self.requests if r.ok and r.ttft_s is not None]
        server_ptl = self.server_ratio(f"{m.per_token_latency}_sum", f"{m.per_token_latency}_count") \
            if m.per_token_latency else None
        acceptance = self.server_ratio(m.accepted_tokens, m.draft_tokens) if m.draft_tokens else None
        engine_seconds = sum(inc.seconds for inc in self.increments if inc is not None)
        generated = self.server.get(m.generation_tokens)
        return {
            "role": self.role,
            "batchSize": self.batch_size,
            "requests": len(self.requests),
            "errors": len(self.errors),
            "cancelled": self.cancelled,
            "outputTokens": self.output_tokens,
            "seconds": round(self.seconds, 3),
            # what the paired test reads: the engine's per-round numbers
            "perTokenMs": None if ptl_mean is None else 1e3 * ptl_mean,
            "perTokenMsCI95": None if ptl_ci is None else 1e3 * ptl_ci,
            "perTokenSamples": len(self.per_token_s(m)),
            "perTokenMsByRound": [None if s.per_token_latency_s is None else round(1e3 * s.per_token_latency_s, 3)
                                  for s in self.samples(m)],
            "tokensPerSecond": generated / engine_seconds if generated and engine_seconds > 0 else None,
            "intervalTokensPerSecondMean": tps_mean,
            "intervalTokensPerSecondCI95": tps_ci,
            "throughputSamples": len(self.interval_tokens_per_s(m)),
            # the client's view of the same rounds (usage-counted), a cross-check
            "clientPerTokenMs": None if client_ptl is None else 1e3 * client_ptl,
            "clientTokensPerSecond": self.output_tokens / self.seconds if self.seconds > 0 and self.output_tokens
            else None,
            "ttftMs": 1e3 * statistics.fmean(ttft) if ttft else None,
            "serverPerTokenMs": None if server_ptl is None else 1e3 * server_ptl,
            "serverGeneratedTokens": generated,
            "acceptanceRate": acceptance,
            "draftTokens": self.server.get(m.draft_tokens) if m.draft_tokens else None,
            "acceptedTokens": self.server.get(m.accepted_tokens) if m.accepted_tokens else None,
            "windows": [list(w) for w in self.windows],
            "clientWarnings": self.client_warnings,
            "errorSamples": self.errors[:3],
        }



def pooled_per_token_s(requests: Sequence[RequestResult]) -> float | None:
    """Per-token latency pooled over requests, as the client saw it: summed (last token - first
    token) over summed (completion tokens - 1) of the finished ones (vLLM's TPOT: the first token,
    which waits for the prefill, is left out); None when no request produced two tokens. A
    cross-check of the engine's numbers (the report's ``clientPerTokenMs``); the statistics read the
    engine's own counters."""
    rs = [r for r in requests if r.ok and r.completion_tokens and r.completion_tokens > 1
          and r.first_token_at is not None and r.last_token_at is not None]
    n = sum(r.completion_tokens - 1 for r in rs)
    return sum(r.last_token_at - r.first_token_at for r in rs) / n if n else None


def round_per_token_s(step: StepResult) -> float | None:
    """A round's per-token latency for one role as the client saw it (`pooled_per_token_s` over its
    requests); None when no request of the round produced two tokens."""
    return pooled_per_token_s(step.requests)


def round_tokens_per_s(step: StepResult) -> float | None:
    """A round's throughput for one role as the client counted it: output tokens / the round's wall
    time (0 in a stall); None for a round cut at the time limit (the client cannot count what the
    cancelled requests produced; the engine can)."""
    if step.cancelled or step.duration_s <= 0:
        return None
    return step.output_tokens / step.duration_s


@dataclass
class BatchResult:
    batch_size: int
    control: RoleMeasurement
    canary: RoleMeasurement
    latency: Any = None       # stats.ComparisonResult
    throughput: Any = None
    verdict: Any = None       # verdict.BatchComparison
    outcome: str = "Pending"
    rounds: int = 0
    stopped: str = ""
    seconds: float = 0.0

    def pairs(self, m: MetricNames) -> list[prometheus.PairedSample]:
        """Round i of the control and round i of the canary as one paired sample
        (``prometheus.paired_sample``, the operator's function): they ran on the same prompts at the
        same time (or back to back, in alternating order), so machine drift lands on both and
        cancels in their ratio."""
        return [prometheus.paired_sample(c, k, m) for c, k in zip(self.control.increments, self.canary.increments)]

    def latency_log_ratio_sd(self, m: MetricNames) -> float | None:
        """The standard deviation of the per-round log(canary / control) per-token latency: the
        round-to-round noise the paired test has to see through (None below two pairs)."""
        logs = [math.log(p.canary.per_token_latency_s / p.control.per_token_latency_s) for p in self.pairs(m)
                if p.canary.per_token_latency_s and p.control.per_token_latency_s]
        return statistics.stdev(logs) if len(logs) >= 2 else None

    def judge(self, m: MetricNames, thresholds, engine: str) -> None:
        """The verdict from the pairs so far, by the operator's function (``measure.paired_verdict``:
        the paired tests, the tail veto, acceptance)."""
        self.verdict = measure.paired_verdict(self.batch_size, self.pairs(m), thresholds, engine)
        self.latency, self.throughput = self.verdict.latency, self.verdict.throughput
        self.outcome = self.verdict.outcome(thresholds).value


# ---------------------------------------------------------------------------------------------
# the sweep


@dataclass
class AnalyzeConfig:
    model: str = "smollm2"
    prompts: str = "code"
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    engine_urls: tuple[str, str] | None = None          # (control, canary)
    engine: str = "reference"
    lookahead: dict = field(default_factory=lambda: dict(DEFAULT_LOOKAHEAD))
    backend: str = "model"
    sim_config: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    requests_per_worker: int | None = 1                 # per round: each of the C workers sends at most this many
    prompts_per_round: int = DEFAULT_PROMPTS_PER_ROUND  # the same block of the set in every round (0: all of it)
    arms: str = DEFAULT_ARMS                            # together: both roles in the same seconds; alternate
    round_s: float = 30.0                               # per round and role: stop issuing after this (then drain)
    max_rounds: int = 40
    budget_s: float | None = None                       # measurement budget; None: what the time limit leaves
    time_limit_s: float = DEFAULT_TIME_LIMIT_S          # the whole run, engine start and warm-up included
    interval_s: float = DEFAULT_INTERVAL_S
    min_latency_improvement: float = 0.05
    max_throughput_regression: float = 0.02
    max_tail_latency_regression: float = 1.0            # p95/p99 per-token latency at most 2x the control's
    confidence: float = 0.95
    min_samples: int = 6
    warmup_requests: int = 1
    out: Path = Path("reports")
    engine_start_timeout_s: float = 300.0
    max_num_seqs: int = 32
    engine_threads: int | None = DEFAULT_ENGINE_THREADS  # torch/OpenMP threads per local engine (None: torch's default)


@dataclass
class AnalyzeResult:
    config: AnalyzeConfig
    batches: list[BatchResult]
    decision: Any
    thresholds: Any
    metric_names: MetricNames
    engines: dict[str, dict]
    started_at: float
    wall_s: float
    load_s: float
    round_prompts: list[int] = field(default_factory=list)   # the block's lines in the prompt set, 1-based
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        m = self.metric_names
        rows = []
        for b in self.batches:
            c, k = b.control.summary(m), b.canary.summary(m)
            lat, tp = b.latency, b.throughput
            rows.append({
                "batchSize": b.batch_size,
                "verdict": b.outcome,
                "rounds": b.rounds,
                "stopped": b.stopped,
                "seconds": round(b.seconds, 2),
                "controlTpotMs": c["perTokenMs"],
                "canaryTpotMs": k["perTokenMs"],
                "tpotChange": lat.estimate if lat is not None else None,
                "tpotInterval": list(lat.interval) if lat is not None and lat.interval else None,
                "controlTokensPerSecond": c["tokensPerSecond"],
                "canaryTokensPerSecond": k["tokensPerSecond"],
                "throughputChange": tp.estimate if tp is not None else None,
                "throughputInterval": list(tp.interval) if tp is not None and tp.interval else None,
                "acceptanceRate": b.verdict.acceptance_rate if b.verdict is not None else k["acceptanceRate"],
                "latencyLogRatioSd": b.latency_log_ratio_sd(m),
                "latency": lat.to_dict() if lat is not None else None,
                "throughput": tp.to_dict() if tp is not None else None,
                "tail": b.verdict.tail.to_dict() if b.verdict is not None and b.verdict.tail is not None else None,
                "control": c,
                "canary": k,
            })
        d = self.decision
        regime_cfg = None
        if d is not None and getattr(d, "lookahead_max_batch_size", None):
            with contextlib.suppress(engines.EngineError):
                regime_cfg = engines.regime_config(self.config.engine, self.config.lookahead,
                                                   d.lookahead_max_batch_size)
        return {
            "kind": "LookaheadAnalysis",
            "version": 1,
            "startedAt": self.started_at,
            "wallSeconds": round(self.wall_s, 2),
            "engineStartSeconds": round(self.load_s, 2),
            "model": self.config.model,
            "backend": self.config.backend,
            # where the engines ran (local engines) or this client ran (--engine-url): the gain is a
            # property of the machine, so every result names it
            "cpu": machine_words(),
            "engine": self.config.engine,
            "prompts": self.config.prompts,
            "maxTokens": self.config.max_tokens,
            "arms": self.config.arms,
            # the prompts of the set that every round sent, in both roles (1-based lines of the set)
            "roundPrompts": self.round_prompts,
            "lookahead": self.config.lookahead,
            "batchSizes": list(self.config.batch_sizes),
            "notMeasured": [c for c in self.config.batch_sizes if c not in {b.batch_size for b in self.batches}],
            "thresholds": {
                "minLatencyImprovement": self.thresholds.min_latency_improvement,
                "maxThroughputRegression": self.thresholds.max_throughput_regression,
                "maxTailLatencyRegression": self.thresholds.max_tail_latency_regression,
                "confidence": self.config.confidence,           # of the whole decision
                "perTestConfidence": self.thresholds.confidence,  # each latency/throughput test's share
                "minSamples": self.thresholds.min_samples,
            },
            "method": {
                "latencySamples": (f"per round and role: the engine's own per-token latency histogram "
                                   f"({m.per_token_latency}), increase of _sum / increase of _count between reads "
                                   "of its /metrics just before and just after the round (the operator reads the "
                                   "same counters from Prometheus)"),
                "throughputSamples": (f"per round and role: increase of the engine's {m.generation_tokens} / the "
                                      "time between the two reads"),
                "tailLatency": ("p95/p99 per-token latency from the same histogram's buckets summed over the "
                                "rounds (stats.compare_tail_latency): a veto"),
                "statistics": ("paired: round i of the control and of the canary form one pair "
                               "(prometheus.paired_sample); anytime-valid confidence sequences on the pairs "
                               "(stats.PairedComparison) and the tail veto, by the operator's own "
                               "measure.paired_verdict, each test at its share of the decision's confidence"),
                "clientCheck": ("the load generator's own per-token latency (usage-counted) and tokens/s are "
                                "kept per role (clientPerTokenMs, clientTokensPerSecond) as a cross-check"),
            },
            "engines": self.engines,
            "batches": rows,
            "crossoverBatchSize": d.crossover_batch_size if d is not None else None,
            "decision": d.to_dict() if d is not None else None,
            "regimeConfig": regime_cfg,
            "files": self.files,
        }


ProgressFn = Callable[[str], None]


async def _measure_batch(client: httpx.AsyncClient, urls: dict[str, str], models: dict[str, str],
                         prompts: Sequence[Prompt], c: int, cfg: AnalyzeConfig, thresholds, m: MetricNames,
                         budget_s: float, log: ProgressFn, res: BatchResult | None = None,
                         rounds: int | None = None) -> BatchResult:
    """Measure batch size ``c`` in rounds of ``prompts`` (the round's block, the same every round)
    until its verdict is settled or ``budget_s`` is spent (or
    ``rounds`` more rounds are done, when given: the sweep's one pair per cycle); with ``res``, go on
    from that earlier measurement (the confidence sequences are valid at every sample count, so
    measuring on is as valid as having measured longer the first time)."""
    res = res or BatchResult(c, RoleMeasurement("control", c), RoleMeasurement("canary", c))
    t0 = time.monotonic()
    stop_at = res.rounds + rounds if rounds is not None else None
    cancelled_before = res.control.cancelled + res.canary.cancelled
    per_round = max(c * cfg.requests_per_worker, len(prompts)) if cfg.requests_per_worker else None
    last_round_s = 0.0
    while True:
        r0 = time.monotonic()

        async def role_round(role: str, hard: float) -> None:
            # the engine's own counters just before and just after the round: the direct source of
            # the operator's pipeline (prometheus.Increments -> paired_sample -> paired_verdict)
            before = await _read(role, urls[role], m, log)
            step = await loadgen.run_step(client, urls[role], models[role], prompts, c, requests_per_step=per_round,
                                          step_duration=min(cfg.round_s, hard), prompt_offset=0,
                                          interval_s=cfg.interval_s, max_duration=hard)
            after = await _read(role, urls[role], m, log)
            (res.control if role == "control" else res.canary).add_round(
                step, prometheus.increments_between(before, after) if before is not None and after is not None
                else None)
            if step.errors and not step.completed and not step.cancelled:
                raise AnalyzeError(f"every request to the {role} engine failed at batch {c}: "
                                   f"{step.requests[0].error}")

        # hard limit: a role may use its share of what is left of the batch size's budget; requests
        # still running then are cancelled (a slow canary cannot overrun the run)
        if cfg.arms == "together":
            # both at once, over the same seconds, a core's worth each: whatever the machine does
            # meanwhile lands on both (as the operator's windows do)
            hard = max(1.0, t0 + budget_s - time.monotonic())
            await asyncio.gather(role_round("control", hard), role_round("canary", hard))
        else:
            # one after the other; which goes first alternates, so a slow drift favours neither
            order = ("control", "canary") if res.rounds % 2 == 0 else ("canary", "control")
            for i, role in enumerate(order):
                await role_round(role, max(1.0, (t0 + budget_s - time.monotonic()) / (len(order) - i)))
        res.rounds += 1
        last_round_s = time.monotonic() - r0
        res.judge(m, thresholds, cfg.engine)
        elapsed = time.monotonic() - t0
        # within 80 columns after the time stamp: "b=8 #6 (15 s) Regresses: latency +29% [-11,+66], tput ..."
        log(f"b={c} #{res.rounds} ({last_round_s:.0f} s) {res.outcome}: latency {_change(res.latency)}, "
            f"tput {_change(res.throughput)}")
        if res.verdict.settled(thresholds):
            res.stopped = "settled"
            break
        if res.control.cancelled + res.canary.cancelled > cancelled_before:
            res.stopped = f"time budget ({budget_s:.0f} s; requests in flight cancelled)"
            break
        if res.rounds >= cfg.max_rounds:
            res.stopped = f"max rounds ({cfg.max_rounds})"
            break
        if elapsed + last_round_s > budget_s:
            res.stopped = f"time budget ({budget_s:.0f} s)"
            break
        if stop_at is not None and res.rounds >= stop_at:
            break
    res.seconds += time.monotonic() - t0
    return res


def _change(cmp) -> str:
    """A comparison so far, for the progress line: ``report.change_words`` (the table's form), its
    rich markup escaped (a bare ``[...]`` would be read as a style and vanish)."""
    from rich.markup import escape

    from lookahead_operator.cli.report import change_words

    if cmp is None or cmp.estimate is None:
        return "-"
    return escape(change_words(cmp.estimate, cmp.interval).removesuffix(" -"))


def round_block(n: int, k: int) -> list[int]:
    """Which prompts of a set of ``n`` every round sends, in both roles (0-based): ``k`` of them
    spread evenly over the set (its order is its author's, so neighbours tend to be alike), or all
    of them for ``k`` <= 0 or ``k`` >= ``n``."""
    if k <= 0 or k >= n:
        return list(range(n))
    return [(i * n) // k for i in range(k)]


async def _read(role: str, url: str, m: MetricNames, log: ProgressFn) -> prometheus.EngineScrape | None:
    """One read of an engine's ``/metrics``; None (said in the log) when it fails after retries:
    that round then has no sample for this role and its pair is left out."""
    try:
        return await asyncio.to_thread(_snapshot, url, m)
    except (OSError, ValueError) as exc:
        log(f"[yellow]could not read the {role} engine's /metrics ({exc}); this round's pair is left out")
        return None


WARMUP_TOKENS = 4
WARMUP_TIMEOUT_S = 45.0


async def _warmup(client: httpx.AsyncClient, urls: dict[str, str], models: dict[str, str],
                  prompts: Sequence[Prompt], n: int, log: ProgressFn) -> None:
    """A few short requests per engine, both engines at once, before measuring (first-call costs
    are not the workload). Bounded: after WARMUP_TIMEOUT_S the measurement starts anyway."""
    import dataclasses

    async def one(role: str, url: str) -> None:
        for i in range(n):
            p = dataclasses.replace(prompts[i % len(prompts)],
                                    max_tokens=min(WARMUP_TOKENS, prompts[i % len(prompts)].max_tokens))
            r = await loadgen.send_request(client, url, models[role], p, 1, i)
            if not r.ok:
                raise AnalyzeError(f"warm-up request to the {role} engine at {url} failed: {r.error}")

    tasks = [asyncio.ensure_future(one(role, url)) for role, url in urls.items()]
    done, pending = await asyncio.wait(tasks, timeout=WARMUP_TIMEOUT_S)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        if t.exception() is not None:
            raise t.exception()
    if pending:
        log(f"[yellow]warm-up did not finish within {WARMUP_TIMEOUT_S:.0f} s (a slow or busy machine); measuring anyway")


async def _sweep(cfg: AnalyzeConfig, urls: dict[str, str], prompts: Sequence[Prompt], thresholds,
                 m: MetricNames, log: ProgressFn, run_deadline: float) -> list[BatchResult]:
    batch_sizes = list(cfg.batch_sizes)
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=max(batch_sizes) * 2 + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        models = {role: await loadgen.discover_model(client, url) for role, url in urls.items()}
        await _warmup(client, urls, models, prompts, cfg.warmup_requests, log)
        for role, url in urls.items():
            await asyncio.to_thread(check_metrics, role, url, m)
        from lookahead_operator.measurement.decision import Move, decide

        t0 = time.monotonic()
        total = run_deadline - t0 - RESERVE_S
        if cfg.budget_s is not None:
            total = min(total, cfg.budget_s)
        log(f"measuring batch sizes {batch_sizes} within {total:.0f} s, a pair of each in turn")
        results = {c: BatchResult(c, RoleMeasurement("control", c), RoleMeasurement("canary", c)) for c in batch_sizes}
        active = list(batch_sizes)
        # one pair of each batch size in turn until each is settled or out of time: every size gets
        # the same share of the run and of whatever the machine does meanwhile, and a slow machine
        # ends with fewer pairs of each rather than with the last sizes never started
        while active:
            for c in list(active):
                res = results[c]
                remaining = total - (time.monotonic() - t0)
                per_pair_s = res.seconds / res.rounds if res.rounds else 0.0
                if remaining < max(per_pair_s, 1.0):
                    res.stopped = res.stopped or f"time budget ({total:.0f} s)"
                    active.remove(c)
                    continue
                await _measure_batch(client, urls, models, prompts, c, cfg, thresholds, m, remaining, log, res=res,
                                     rounds=1)
                if res.stopped:
                    active.remove(c)
            # stop early when the batch sizes still measuring cannot change the decision: over the
            # smallest sizes, all settled, the smallest already loses (Rollback) or a loss after a
            # run of wins fixed the crossover (PromoteRegimeAware)
            prefix = []
            for c in batch_sizes:
                if c in active or results[c].verdict is None or results[c].outcome == "Pending":
                    break
                prefix.append(results[c].verdict)
            d = decide(prefix, thresholds, deadline_passed=False, planned=batch_sizes)
            beyond = [c for c in active if c > max((v.batch_size for v in prefix), default=0)]
            if beyond and (d.action is Move.ROLLBACK or (d.action is Move.PROMOTE_REGIME_AWARE
                                                         and d.crossover_batch_size is not None)):
                log(f"{d.action.value} is settled: batch sizes {beyond} cannot change it, left out")
                for c in beyond:
                    active.remove(c)
                    del results[c]
        return [results[c] for c in batch_sizes if c in results and results[c].rounds > 0]


def _engine_processes(cfg: AnalyzeConfig, workdir: Path) -> dict[str, EngineProcess]:
    spec = engines.reference_speculative_config(cfg.lookahead)
    common = dict(model=cfg.model, backend=cfg.backend, sim_config=cfg.sim_config, max_num_seqs=cfg.max_num_seqs,
                  env={"OMP_NUM_THREADS": str(cfg.engine_threads)} if cfg.engine_threads else None)
    # not pinned to cores: beside another busy process a pinned pair is lopsided (that process
    # shares one engine's core only; docs/analyze.md, "Round-to-round variance"), while the
    # scheduler spreads the load over both
    return {
        "control": EngineProcess("control", log_path=workdir / "control-engine.log", **common),
        "canary": EngineProcess("canary", speculative_config=spec, log_path=workdir / "canary-engine.log", **common),
    }


def _smollm2_cached() -> bool:
    """Whether lookahead_canary.models has the converted SmolLM2 weights cached (same path rule,
    without importing torch here)."""
    root = Path(os.environ.get("LOOKAHEAD_CACHE") or Path.home() / ".cache" / "lookahead-rollout")
    d = root / "models" / "smollm2-135m-instruct"
    return (d / "config.json").exists() and any(d.glob("*.safetensors"))


def run_analysis(cfg: AnalyzeConfig, log: ProgressFn = lambda s: None) -> AnalyzeResult:
    """Start (or attach to) the engines, sweep, decide. Does not write the report."""
    from lookahead_operator.measurement.decision import decide

    started_at = time.time()
    t0 = time.monotonic()
    m = engines.metric_names(cfg.engine)
    thresholds = family_split(policy_thresholds(cfg.min_latency_improvement, cfg.max_throughput_regression,
                                                cfg.confidence, cfg.min_samples,
                                                cfg.max_tail_latency_regression), len(cfg.batch_sizes))
    prompts = loadgen.load_prompts(cfg.prompts, max_tokens=cfg.max_tokens)
    # every round sends this block, in both roles (the warm-up too)
    block_lines = round_block(len(prompts), cfg.prompts_per_round)
    prompts = [prompts[i] for i in block_lines]
    procs: dict[str, EngineProcess] = {}
    engines_info: dict[str, dict] = {}
    cfg.out.mkdir(parents=True, exist_ok=True)
    try:
        if cfg.engine_urls:
            urls = {"control": cfg.engine_urls[0].rstrip("/"), "canary": cfg.engine_urls[1].rstrip("/")}
            engines_info = {role: {"url": u, "started": False} for role, u in urls.items()}
        else:
            if cfg.engine != "reference":
                raise AnalyzeError("only the reference engine can be started locally; use --engine-url for "
                                   f"{cfg.engine}")
            procs = _engine_processes(cfg, cfg.out)
            log(f"starting control and canary engines (model {cfg.model}, backend {cfg.backend}) ...")
            if cfg.backend == "model" and cfg.model == "smollm2" and not _smollm2_cached():
                # first run: let one engine convert the GGUF and fill the cache, the other then reads it
                # (two conversions at once on two cores take about twice as long as one)
                log("first run: converting SmolLM2 once (about 35 s on two cores), then loading it twice")
                procs["control"].start().wait_ready(cfg.engine_start_timeout_s)
                procs["canary"].start().wait_ready(cfg.engine_start_timeout_s)
            else:
                for p in procs.values():
                    p.start()
                for p in procs.values():
                    p.wait_ready(cfg.engine_start_timeout_s)
            urls = {role: p.url for role, p in procs.items()}
            engines_info = {role: {"url": p.url, "started": True, "argv": p.argv()[1:], "log": str(p.log_path)}
                            for role, p in procs.items()}
        load_s = time.monotonic() - t0
        # one line each: both URLs on one line wrap inside the second at 80 columns
        ready = f"engines ready after {load_s:.1f} s:"
        log(f"{ready} control {urls['control']}")
        log(f"{' ' * len(ready)} canary  {urls['canary']}")
        batches = asyncio.run(_sweep(cfg, urls, prompts, thresholds, m, log, run_deadline=t0 + cfg.time_limit_s))
    finally:
        for p in procs.values():
            p.stop()
    decision = decide([b.verdict for b in batches], thresholds, deadline_passed=True,
                      max_batch_size=cfg.max_num_seqs if not cfg.engine_urls else None,
                      planned=list(cfg.batch_sizes))
    return AnalyzeResult(config=cfg, batches=batches, decision=decision, thresholds=thresholds, metric_names=m,
                         engines=engines_info, started_at=started_at, wall_s=time.monotonic() - t0, load_s=load_s,
                         round_prompts=[i + 1 for i in block_lines])


# ---------------------------------------------------------------------------------------------
# command line (wired into lookahead_operator.cli.main as `analyze`)


BadArgument = loadgen.BadArgument


def _fraction(text: str) -> float:
    from lookahead_canary.units import parse_fraction

    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _rise(text: str) -> float:
    """A rise over the control: '100%' -> 1.0 (up to 1000%, as the CRD's RisePercent), or a fraction."""
    from lookahead_canary.units import parse_percent

    try:
        return parse_percent(text, hi=1000.0) / 100.0 if text.strip().endswith("%") else _fraction(text)
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def add_arguments(p) -> None:
    p.add_argument("--model", default="smollm2", help="model for the local engines: smollm2 (default), tiny, or a path")
    p.add_argument("--prompts", default="code", help="bundled prompt set (chat, code, summarize) or a JSONL file")
    p.add_argument("--batch-sizes", type=loadgen.parse_concurrencies, default=list(DEFAULT_BATCH_SIZES),
                   help="comma-separated batch sizes (closed-loop concurrencies), default 1,2,4,8")
    p.add_argument("--engine-url", nargs=2, metavar=("CONTROL_URL", "CANARY_URL"),
                   help="use two running engines (control without lookahead, canary with) instead of starting them")
    p.add_argument("--engine", default="reference", choices=engines.ENGINES,
                   help="metric names of the engines behind --engine-url (default reference = vLLM names)")
    p.add_argument("--out", type=Path, default=Path("reports"), help="report directory (default reports/)")
    p.add_argument("--json", action="store_true", help="print the report JSON as the last line")
    p.add_argument("--backend", choices=("model", "simulate"), default="model",
                   help="engine backend: a real model (default) or the roofline simulator")
    p.add_argument("--sim-config", default=None, help="simulator config JSON (with --backend simulate)")
    p.add_argument("--method", choices=("jacobi", "ngram"), default=DEFAULT_LOOKAHEAD["method"])
    p.add_argument("--window", type=int, default=DEFAULT_LOOKAHEAD["window"], help="Jacobi window W")
    p.add_argument("--ngram", type=int, default=DEFAULT_LOOKAHEAD["ngram"], help="Jacobi n-gram size N")
    p.add_argument("--guess-set", type=int, default=DEFAULT_LOOKAHEAD["guess_set"], help="Jacobi guess set G")
    p.add_argument("--prompt-lookup-tokens", type=int, default=DEFAULT_LOOKAHEAD["prompt_lookup_tokens"],
                   help="Jacobi: also verify a prompt-copied draft of up to this many tokens (0: pure Jacobi)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="ngram method: K")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="cap on each prompt's max_tokens")
    p.add_argument("--requests-per-worker", type=int, default=1,
                   help="per round and role, requests each of the C closed-loop workers sends at most "
                        "(default 1: short rounds, so drift cancels within each control/canary pair; "
                        "0 = no cap)")
    p.add_argument("--prompts-per-round", type=int, default=DEFAULT_PROMPTS_PER_ROUND,
                   help=f"prompts of the set in every round, the same ones in both roles and every round "
                        f"(default {DEFAULT_PROMPTS_PER_ROUND}, spread over the set; 0: the whole set)")
    p.add_argument("--arms", choices=("together", "alternate"), default=DEFAULT_ARMS,
                   help="together (default): control and canary rounds run at the same time, each engine on "
                        "its own core; alternate: one after the other, the order alternating")
    p.add_argument("--round", dest="round_s", type=units.parse_duration, default=30.0,
                   help="per round and role, stop issuing requests after this long, then drain (default 30s)")
    p.add_argument("--engine-threads", type=int, default=DEFAULT_ENGINE_THREADS,
                   help=f"torch threads of each local engine (default {DEFAULT_ENGINE_THREADS}; 0: torch's default, "
                        "one per core)")
    p.add_argument("--max-rounds", type=int, default=40, help="rounds (control/canary pairs) per batch size at most")
    p.add_argument("--time-limit", type=units.parse_duration, default=DEFAULT_TIME_LIMIT_S,
                   help=f"the whole run, engine start included (default {DEFAULT_TIME_LIMIT_S:.0f}s); the "
                        "batch sizes share what is left after the engines are up")
    p.add_argument("--budget", type=units.parse_duration, default=None,
                   help="cap on the measurement time for all batch sizes (default: what --time-limit leaves)")
    p.add_argument("--interval", type=units.parse_duration, default=DEFAULT_INTERVAL_S,
                   help="the load generator's own rate interval (its per-step records only; the statistics "
                        "take one sample per round; default 2s)")
    p.add_argument("--min-latency-improvement", type=_fraction, default=0.05, help="e.g. 5%% (default)")
    p.add_argument("--max-throughput-regression", type=_fraction, default=0.02, help="e.g. 2%% (default)")
    p.add_argument("--max-tail-latency-regression", type=_rise, default=1.0,
                   help="largest rise of the canary's p95/p99 per-token latency over the control's, e.g. 100%% "
                        "(default: at most twice the control's, the CRD's analysis.maxTailLatencyRegression)")
    p.add_argument("--confidence", type=_fraction, default=0.95,
                   help="of the whole decision, split over the batch sizes and both metrics (default 0.95)")
    p.add_argument("--min-samples", type=int, default=6,
                   help="control/canary round pairs before any verdict (default 6)")


def config_from_args(args) -> AnalyzeConfig:
    if args.method == "jacobi":
        la = {"method": "jacobi", "window": args.window, "ngram": args.ngram, "guess_set": args.guess_set,
              "prompt_lookup_tokens": args.prompt_lookup_tokens}
    else:
        la = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
              "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    return AnalyzeConfig(
        model=args.model, prompts=args.prompts, batch_sizes=tuple(sorted(set(args.batch_sizes))),
        engine_urls=tuple(args.engine_url) if args.engine_url else None, engine=args.engine, lookahead=la,
        backend=args.backend, sim_config=args.sim_config, max_tokens=args.max_tokens,
        requests_per_worker=args.requests_per_worker, prompts_per_round=args.prompts_per_round,
        arms=args.arms, round_s=args.round_s, engine_threads=args.engine_threads,
        max_rounds=args.max_rounds, budget_s=args.budget,
        time_limit_s=args.time_limit,
        interval_s=args.interval, min_latency_improvement=args.min_latency_improvement,
        max_throughput_regression=args.max_throughput_regression,
        max_tail_latency_regression=args.max_tail_latency_regression, confidence=args.confidence,
        min_samples=args.min_samples, out=args.out,
    )


def main(args) -> int:
    """``kubectl lookahead analyze``: run, print the table and decision, write the report."""
    from rich.console import Console

    from lookahead_operator.cli import report

    stream = sys.stderr if args.json else sys.stdout
    # the table fits 80 columns; in logs and CI (not a terminal) rich wraps the prose at 80 too
    console = Console(stderr=args.json, width=None if stream.isatty() else 80)
    try:
        cfg = config_from_args(args)
        engines.lookahead_params(cfg.lookahead)
        if cfg.prompts_per_round < 0:
            raise ValueError(f"--prompts-per-round must be 0 (the whole set) or more, got {cfg.prompts_per_round}")
    except (ValueError, engines.EngineError) as exc:
        console.print(f"analyze: {exc}", style="red", soft_wrap=True, markup=False)   # one line, never wrapped
        return 2

    def log(msg: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")

    def on_signal(signum, frame):  # stop the engines we started (run_analysis' finally) on kill
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        result = run_analysis(cfg, log)
    except (AnalyzeError, loadgen.LoadgenError, OSError) as exc:
        console.print(f"analyze failed: {exc}", style="red", soft_wrap=True, markup=False)
        return 1
    data = report.write_report(result, cfg.out)
    report.print_summary(data, console)
    if args.json:
        print(json.dumps(data, default=str), flush=True)
    return 0
