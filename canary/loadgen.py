"""Closed-loop load generator for OpenAI-compatible LLM endpoints.

Holds exactly C requests in flight (closed loop: a request starts as soon as one finishes) against
``/v1/completions`` (or ``/v1/chat/completions`` for prompts given as chat messages), for a sweep
of concurrency levels C (the batch sizes under test). Requests stream, so the client can time them:

* TTFT: request sent -> first chunk carrying text;
* per-token latency: (last token time - first token time) / (completion_tokens - 1), where
  ``completion_tokens`` is the server's ``usage`` count (``stream_options.include_usage``), never
  the number of chunks: a speculative engine may put several tokens in one chunk, and counting
  chunks would bias the comparison against it (the ITL trap, see DESIGN.md);
* tokens/s per request: completion_tokens / end-to-end seconds.

Per step it records the aggregate output tokens/s, the wall-clock start and end (for Prometheus
windows), per-interval throughput samples, and whether the *client* was the bottleneck (its own
event-loop lag, its CPU use, or an achieved concurrency below the target) -- a load generator
that cannot keep up measures itself, not the server.

Requests are sent greedily (temperature 0) and never with ``ignore_eos``: synthetic replays that
force the length past EOS make acceptance-rate measurements meaningless.

Library::

    steps = run_sweep("http://127.0.0.1:8000", [1, 2, 4], load_prompts("code"), requests_per_step=8)

Command line (also the Kubernetes Job entry point; every flag has a ``LOADGEN_*`` environment
variable, and with ``--json`` or a non-tty stdout it prints one JSON object a line)::

    lookahead-loadgen --url URL --concurrency 1,2,4,8 (--step-duration 60s | --requests-per-step N)
                      --prompts code|chat|summarize|PATH.jsonl [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import statistics
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Sequence

import httpx

from . import units

BUILTIN_PROMPT_SETS = ("chat", "code", "summarize")

# Thresholds for "the client is the bottleneck".
CPU_BOUND_FRACTION = 0.90        # of one core: the event loop is single-threaded
LOOP_LAG_P99_LIMIT_S = 0.050     # event-loop wake-up lag
CONCURRENCY_SHORTFALL = 0.90     # achieved / target concurrency below this
LAG_PROBE_INTERVAL_S = 0.020


class LoadgenError(RuntimeError):
    """Bad input (prompts, arguments) or an endpoint that cannot be used."""


# ---------------------------------------------------------------------------------------------
# prompts


@dataclass(frozen=True)
class Prompt:
    """One request: a completion prompt or chat messages, and its ``max_tokens``."""

    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    max_tokens: int = 128

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def _parse_prompt(obj: Any, where: str, default_max_tokens: int) -> Prompt:
    if not isinstance(obj, dict):
        raise LoadgenError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    max_tokens = int(obj.get("max_tokens", default_max_tokens))
    if max_tokens < 1:
        raise LoadgenError(f"{where}: max_tokens must be >= 1")
    if "ignore_eos" in obj:
        raise LoadgenError(f"{where}: ignore_eos is not allowed (it makes acceptance rates meaningless)")
    if isinstance(obj.get("messages"), list):
        return Prompt(messages=tuple(dict(m) for m in obj["messages"]), max_tokens=max_tokens)
    if isinstance(obj.get("prompt"), str):
        return Prompt(prompt=obj["prompt"], max_tokens=max_tokens)
    raise LoadgenError(f"{where}: needs a string 'prompt' or a list 'messages'")


def load_prompts(spec: str | os.PathLike[str], max_tokens: int | None = None,
                 default_max_tokens: int = 128) -> list[Prompt]:
    """Load a prompt set: a bundled name (``chat``, ``code``, ``summarize``) or a JSONL file path.

    Each line is ``{"prompt": ..., "max_tokens": ...}`` or ``{"messages": [...], "max_tokens": ...}``.
    ``max_tokens`` (when given) caps every prompt's own ``max_tokens``.
    """
    spec = str(spec)
    if spec in BUILTIN_PROMPT_SETS:
        try:
            text = resources.files("lookahead_canary").joinpath("prompts", f"{spec}.jsonl").read_text()
        except (FileNotFoundError, OSError) as exc:
            raise LoadgenError(f"bundled prompt set {spec!r} is missing from lookahead_canary/prompts/") from exc
        where = f"prompts/{spec}.jsonl"
    else:
        path = Path(spec)
        if not path.is_file():
            raise LoadgenError(f"prompt set {spec!r}: not a bundled set ({', '.join(BUILTIN_PROMPT_SETS)}) "
                               "and not a file")
        text = path.read_text()
        where = str(path)
    prompts = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise LoadgenError(f"{where}:{i}: not JSON ({exc})") from exc
        p = _parse_prompt(obj, f"{where}:{i}", default_max_tokens)
        if max_tokens is not None:
            p = dataclasses.replace(p, max_tokens=min(p.max_tokens, max_tokens))
        prompts.append(p)
    if not prompts:
        raise LoadgenError(f"{where}: no prompts")
    return prompts


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class RequestResult:
    """One request as the client saw it. Times are seconds; ``*_at`` are Unix wall-clock times."""

    concurrency: int
    index: int                        # order of issue within the step
    started_at: float
    ended_at: float
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    per_token_s: float | None = None  # (last token - first token) / (completion_tokens - 1)
    e2e_s: float | None = None
    completion_tokens: int | None = None   # from the server's usage, never a chunk count
    prompt_tokens: int | None = None
    tokens_per_s: float | None = None      # completion_tokens / e2e_s
    chunks: int = 0                        # streamed chunks with text (diagnostic only)
    finish_reason: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    # arrival time (Unix) and text length of each chunk with text: where the tokens landed in time
    chunk_times: list[float] = field(default_factory=list, repr=False)
    chunk_chars: list[int] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("chunk_times")
        d.pop("chunk_chars")
        return d


@dataclass
class ClientHealth:
    """How busy the load generator itself was during a step."""

    cpu_fraction: float               # process CPU seconds / wall seconds (1.0 = one core)
    loop_lag_p50_s: float
    loop_lag_p99_s: float
    loop_lag_max_s: float
    achieved_concurrency: float       # time-weighted mean requests in flight before the drain
    target_concurrency: int
    bottleneck: bool
    reasons: list[str] = field(default_factory=list)


@dataclass
class StepResult:
    """One concurrency step. ``start``/``end`` are Unix times bounding every request of the step."""

    concurrency: int
    start: float
    end: float
    requests: list[RequestResult]
    client: ClientHealth
    interval_s: float
    interval_output_tokens_per_s: list[float]   # per interval of the steady phase (see interval_rates)
    steady_end: float | None = None             # Unix time the first worker stopped issuing (drain began)

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens or 0 for r in self.completed)

    @property
    def output_tokens_per_s(self) -> float | None:
        d = self.duration_s
        return self.output_tokens / d if d > 0 and self.completed else None

    def per_token_latencies_s(self) -> list[float]:
        return [r.per_token_s for r in self.completed if r.per_token_s is not None]

    def ttfts_s(self) -> list[float]:
        return [r.ttft_s for r in self.completed if r.ttft_s is not None]

    @property
    def cancelled(self) -> int:
        return sum(1 for r in self.requests if not r.ok and (r.error or "").startswith("cancelled"))

    def summary(self) -> dict:
        ptl = self.per_token_latencies_s()
        ttft = self.ttfts_s()
        return {
            "concurrency": self.concurrency,
            "start": self.start,
            "end": self.end,
            "duration_s": round(self.duration_s, 4),
            "requests": len(self.requests),
            "completed": len(self.completed),
            "errors": self.errors,
            "cancelled": self.cancelled,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens_per_s,
            "per_token_ms_mean": 1e3 * statistics.fmean(ptl) if ptl else None,
            "per_token_ms_p50": 1e3 * _quantile(ptl, 0.5) if ptl else None,
            "per_token_ms_p90": 1e3 * _quantile(ptl, 0.9) if ptl else None,
            "ttft_ms_mean": 1e3 * statistics.fmean(ttft) if ttft else None,
            "ttft_ms_p90": 1e3 * _quantile(ttft, 0.9) if ttft else None,
            "interval_s": self.interval_s,
            "interval_output_tokens_per_s": self.interval_output_tokens_per_s,
            "client": dataclasses.asdict(self.client),
        }

    def to_dict(self) -> dict:
        d = self.summary()
        d["request_results"] = [r.to_dict() for r in self.requests]
        return d


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def interval_rates(requests: Sequence[RequestResult], start: float, end: float,
                    interval_s: float) -> list[float]:
    """Output tokens/s per interval of ``[start, end]``.

    Streaming gives the client token *times* only per chunk and the token *count* only per request
    (usage), so each request's usage count is shared among its chunks in proportion to their text
    length and placed at the chunks' arrival times (without chunk data: one token at the first
    token, the rest spread evenly to the last). Only whole intervals are returned.
    """
    n = int((end - start) // interval_s) if interval_s > 0 else 0
    if n <= 0:
        return []
    bins = [0.0] * n

    def add(a: float, b: float, tokens: float) -> None:
        # spread `tokens` uniformly over [a, b]
        if tokens <= 0:
            return
        if b <= a:
            k = int((a - start) // interval_s)
            if 0 <= k < n:
                bins[k] += tokens
            return
        rate = tokens / (b - a)
        k0 = max(0, int((a - start) // interval_s))
        k1 = min(n - 1, int((b - start) // interval_s))
        for k in range(k0, k1 + 1):
            lo = max(a, start + k * interval_s)
            hi = min(b, start + (k + 1) * interval_s)
            if hi > lo:
                bins[k] += rate * (hi - lo)

    for r in requests:
        if not r.ok or not r.completion_tokens or r.first_token_at is None:
            continue
        if r.chunk_times and len(r.chunk_times) == len(r.chunk_chars):
            total = sum(r.chunk_chars)
            n_chunks = len(r.chunk_times)
            for t, c in zip(r.chunk_times, r.chunk_chars):
                share = c / total if total > 0 else 1.0 / n_chunks
                add(t, t, r.completion_tokens * share)
            continue
        add(r.first_token_at, r.first_token_at, 1)
        if r.completion_tokens > 1 and r.last_token_at is not None:
            add(r.first_token_at, r.last_token_at, r.completion_tokens - 1)
    return [b / interval_s for b in bins]


_interval_rates = interval_rates


def chunk_gaps(requests: Iterable[RequestResult]) -> list[float]:
    """Seconds between consecutive text chunks within each request."""
    out: list[float] = []
    for r in requests:
        ts = r.chunk_times
        out += [b - a for a, b in zip(ts, ts[1:])]
    return out


# ---------------------------------------------------------------------------------------------
# the client


async def discover_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model id that ``GET /v1/models`` lists."""
    try:
        r = await client.get(f"{url}/v1/models")
        r.raise_for_status()
        data = r.json().get("data") or []
        if data and data[0].get("id"):
            return str(data[0]["id"])
    except (httpx.HTTPError, ValueError) as exc:
        raise LoadgenError(f"cannot list models at {url}/v1/models: {exc}; pass --model") from exc
    raise LoadgenError(f"{url}/v1/models lists no model; pass --model")


async def send_request(client: httpx.AsyncClient, url: str, model: str, prompt: Prompt,
                       concurrency: int, index: int, temperature: float = 0.0) -> RequestResult:
    """Send one streaming request and time it."""
    if prompt.is_chat:
        path = "/v1/chat/completions"
        body: dict[str, Any] = {"model": model, "messages": list(prompt.messages or ())}
    else:
        path = "/v1/completions"
        body = {"model": model, "prompt": prompt.prompt}
    body.update({"max_tokens": prompt.max_tokens, "temperature": temperature, "stream": True,
                 "stream_options": {"include_usage": True}})
    started_at = time.time()
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    chunk_times: list[float] = []
    chunk_chars: list[int] = []
    usage: dict | None = None
    finish_reason = None
    try:
        async with client.stream("POST", f"{url}{path}", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                raise LoadgenError(f"HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    continue
                if obj.get("error"):
                    raise LoadgenError(f"server error: {obj['error']}")
                if obj.get("usage"):
                    usage = obj["usage"]
                for ch in obj.get("choices") or ():
                    text = ch.get("text")
                    if text is None:
                        text = (ch.get("delta") or {}).get("content")
                    if text:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        last = now
                        chunks += 1
                        chunk_times.append(started_at + (now - t0))
                        chunk_chars.append(len(text))
                    if ch.get("finish_reason"):
                        finish_reason = ch["finish_reason"]
    except (httpx.HTTPError, LoadgenError) as exc:
        t1 = time.perf_counter()
        return RequestResult(concurrency=concurrency, index=index, started_at=started_at,
                             ended_at=started_at + (t1 - t0), ok=False,
                             error=f"{type(exc).__name__}: {exc}")
    t1 = time.perf_counter()
    ended_at = started_at + (t1 - t0)
    res = RequestResult(concurrency=concurrency, index=index, started_at=started_at, ended_at=ended_at,
                        ok=True, e2e_s=t1 - t0, chunks=chunks, finish_reason=finish_reason,
                        chunk_times=chunk_times, chunk_chars=chunk_chars)
    if usage is None or usage.get("completion_tokens") is None:
        res.ok = False
        res.error = ("the server sent no usage in its stream (stream_options.include_usage); "
                     "tokens cannot be counted without it")
        return res
    res.completion_tokens = int(usage["completion_tokens"])
    res.prompt_tokens = int(usage["prompt_tokens"]) if usage.get("prompt_tokens") is not None else None
    if first is not None:
        res.ttft_s = first - t0
        res.first_token_at = started_at + (first - t0)
        res.last_token_at = started_at + (last - t0)
        if res.completion_tokens >= 2:
            res.per_token_s = (last - first) / (res.completion_tokens - 1)
    if res.completion_tokens and res.e2e_s:
        res.tokens_per_s = res.completion_tokens / res.e2e_s
    return res


class _LagProbe:
    """Measures event-loop wake-up lag: how late a periodic sleep wakes up."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            self.lags.append(max(0.0, time.perf_counter() - t - LAG_PROBE_INTERVAL_S))

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


ProgressCallback = Callable[[int, RequestResult], None]


async def run_step(client: httpx.AsyncClient, url: str, model: str, prompts: Sequence[Prompt],
                   concurrency: int, *, step_duration: float | None = None,
                   requests_per_step: int | None = None, prompt_offset: int = 0,
                   interval_s: float = 1.0, temperature: float = 0.0,
                   on_request: ProgressCallback | None = None,
                   max_duration: float | None = None) -> StepResult:
    """One closed-loop step: ``concurrency`` workers, each sending back to back.

    Stops issuing when ``requests_per_step`` requests have been issued or ``step_duration``
    seconds have passed (whichever first; at least one must be given), then waits for the
    requests in flight (the drain). ``end`` is when the last one finished. ``max_duration``
    (seconds from the step's start) is a hard limit: requests still in flight then are cancelled
    (the connection is closed) and recorded as failed with ``error`` starting "cancelled".
    """
    if concurrency < 1:
        raise LoadgenError("concurrency must be >= 1")
    if step_duration is None and requests_per_step is None:
        raise LoadgenError("give step_duration or requests_per_step")
    if not prompts:
        raise LoadgenError("no prompts")
    results: list[RequestResult] = []
    issued = 0
    in_flight = 0
    # time-weighted in-flight integral over the steady phase (until the first worker stops)
    area = 0.0
    last_change = time.perf_counter()
    steady_end: float | None = None

    def account(delta: int) -> None:
        nonlocal in_flight, area, last_change
        now = time.perf_counter()
        if steady_end is None:
            area += in_flight * (now - last_change)
        last_change = now
        in_flight += delta

    probe = _LagProbe()
    probe.start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    start = time.time()
    deadline = t0 + step_duration if step_duration is not None else math.inf

    async def worker() -> None:
        nonlocal issued, steady_end
        while True:
            if (requests_per_step is not None and issued >= requests_per_step) or time.perf_counter() >= deadline:
                if steady_end is None:
                    account(0)
                    steady_end = time.perf_counter()
                return
            idx = issued
            issued += 1
            prompt = prompts[(prompt_offset + idx) % len(prompts)]
            account(+1)
            sent_at = time.time()
            try:
                res = await send_request(client, url, model, prompt, concurrency, idx, temperature)
            except asyncio.CancelledError:
                account(-1)
                results.append(RequestResult(concurrency=concurrency, index=idx, started_at=sent_at,
                                             ended_at=time.time(), ok=False,
                                             error=f"cancelled at the step's time limit ({max_duration:g} s)"))
                raise
            account(-1)
            results.append(res)
            if on_request:
                on_request(concurrency, res)

    tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    try:
        _, pending = await asyncio.wait(tasks, timeout=max_duration)
        if pending:
            if steady_end is None:
                account(0)
                steady_end = time.perf_counter()
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()
    finally:
        for t in tasks:
            t.cancel()
        await probe.stop()
    t1 = time.perf_counter()
    cpu = time.process_time() - cpu0
    end = start + (t1 - t0)
    steady = (steady_end or t1) - t0
    achieved = area / steady if steady > 0 else float(concurrency)
    lags = probe.lags or [0.0]
    health = ClientHealth(
        cpu_fraction=cpu / (t1 - t0) if t1 > t0 else 0.0,
        loop_lag_p50_s=_quantile(lags, 0.5),
        loop_lag_p99_s=_quantile(lags, 0.99),
        loop_lag_max_s=max(lags),
        achieved_concurrency=achieved,
        target_concurrency=concurrency,
        bottleneck=False,
    )
    if health.cpu_fraction > CPU_BOUND_FRACTION:
        health.reasons.append(f"client CPU at {100 * health.cpu_fraction:.0f}% of a core")
    if health.loop_lag_p99_s > LOOP_LAG_P99_LIMIT_S:
        health.reasons.append(f"client event-loop lag p99 {1e3 * health.loop_lag_p99_s:.0f} ms")
    if achieved < CONCURRENCY_SHORTFALL * concurrency:
        health.reasons.append(f"achieved concurrency {achieved:.2f} < target {concurrency}")
    health.bottleneck = bool(health.reasons)
    results.sort(key=lambda r: r.index)
    steady_end_unix = start + steady
    rates = interval_rates(results, start, steady_end_unix, interval_s)
    return StepResult(concurrency=concurrency, start=start, end=end, requests=results, client=health,
                      interval_s=interval_s, interval_output_tokens_per_s=rates, steady_end=steady_end_unix)


StepHook = Callable[[StepResult], "Awaitable[None] | None"]


async def sweep(url: str, concurrencies: Iterable[int], prompts: Sequence[Prompt], *,
                step_duration: float | None = None, requests_per_step: int | None = None,
                model: str | None = None, timeout: float = 600.0, interval_s: float = 1.0,
                temperature: float = 0.0, on_request: ProgressCallback | None = None,
                before_step: Callable[[int], "Awaitable[None] | None"] | None = None,
                after_step: StepHook | None = None) -> list[StepResult]:
    """Async form of :func:`run_sweep`. ``before_step(c)`` / ``after_step(step)`` run between
    steps (e.g. wait until Prometheus has scraped the engine, so step windows do not bleed)."""
    url = url.rstrip("/")
    concurrencies = [int(c) for c in concurrencies]
    limits = httpx.Limits(max_connections=max(concurrencies) + 4, max_keepalive_connections=max(concurrencies) + 4)
    out: list[StepResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits) as client:
        if model is None:
            model = await discover_model(client, url)
        offset = 0
        for c in concurrencies:
            if before_step:
                r = before_step(c)
                if asyncio.iscoroutine(r):
                    await r
            step = await run_step(client, url, model, prompts, c, step_duration=step_duration,
                                  requests_per_step=requests_per_step, prompt_offset=offset,
                                  interval_s=interval_s, temperature=temperature, on_request=on_request)
            offset += len(step.requests)
            out.append(step)
            if after_step:
                r = after_step(step)
                if asyncio.iscoroutine(r):
                    await r
    return out


def run_sweep(url: str, concurrencies: Iterable[int], prompts: Sequence[Prompt] | str, **kwargs: Any) -> list[StepResult]:
    """Run a closed-loop sweep; ``prompts`` is a list of :class:`Prompt` or a prompt-set spec.

    Keyword arguments are those of :func:`sweep` (``step_duration``, ``requests_per_step``,
    ``model``, ``timeout``, ``interval_s``, ``on_request``, ``before_step``, ``after_step``).
    """
    if isinstance(prompts, (str, os.PathLike)):
        prompts = load_prompts(prompts)
    return asyncio.run(sweep(url, concurrencies, prompts, **kwargs))


# ---------------------------------------------------------------------------------------------
# command line


class BadArgument(argparse.ArgumentTypeError, ValueError):
    """A command-line value that does not parse (argparse prints its message)."""


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``2m``, ``1m30s``, ``500ms`` -> seconds (``lookahead_canary.units``)."""
    try:
        return units.parse_duration(text)
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def parse_concurrencies(text: str) -> list[int]:
    try:
        out = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad concurrency list {text!r}") from exc
    if not out or any(c < 1 for c in out):
        raise argparse.ArgumentTypeError(f"bad concurrency list {text!r}")
    return out


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(f"LOADGEN_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lookahead-loadgen",
        description="Closed-loop load generator: holds exactly C streaming requests in flight against an "
                    "OpenAI-compatible endpoint for each concurrency C. Every flag can also come from an "
                    "environment variable LOADGEN_<FLAG> (e.g. LOADGEN_URL, LOADGEN_CONCURRENCY).")
    p.add_argument("--url", default=_env("URL"), help="engine base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=parse_concurrencies, default=_env("CONCURRENCY", "1,2,4,8"),
                   help="comma-separated concurrency steps (default 1,2,4,8)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--step-duration", type=parse_duration, default=_env("STEP_DURATION"),
                   help="seconds (or 60s, 2m) to keep issuing per step; in-flight requests then drain")
    g.add_argument("--requests-per-step", type=int, default=_env("REQUESTS_PER_STEP"),
                   help="requests to issue per step")
    p.add_argument("--prompts", default=_env("PROMPTS", "code"),
                   help="bundled set (chat, code, summarize) or a JSONL file")
    p.add_argument("--max-tokens", type=int, default=_env("MAX_TOKENS"), help="cap every prompt's max_tokens")
    p.add_argument("--model", default=_env("MODEL"), help="model name (default: first of /v1/models)")
    p.add_argument("--interval", type=parse_duration, default=_env("INTERVAL", "1s"),
                   help="interval of the per-interval throughput samples (default 1s)")
    p.add_argument("--timeout", type=parse_duration, default=_env("TIMEOUT", "600s"), help="per-request timeout")
    p.add_argument("--json", action="store_true", default=str(_env("JSON", "")).lower() in ("1", "true", "yes"),
                   help="print JSON lines (one per request, per step, and a final summary); "
                        "the default when stdout is not a terminal")
    p.add_argument("--no-requests", action="store_true", help="with --json, omit the per-request lines")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM stops the load at once, as Ctrl-C does. In a container this process is PID 1, and the
    # kernel ignores a signal PID 1 has no handler for: without this, a deleted load Job's pod kept
    # driving its engine until the kubelet's SIGKILL after the grace period, on top of the next
    # step's load (found on the real node: the guard's control read 3x the guard's own load).
    if threading.current_thread() is threading.main_thread():  # (tests call main() from worker threads)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    args = build_parser().parse_args(argv)
    if not args.url:
        print("lookahead-loadgen: --url (or LOADGEN_URL) is required", file=sys.stderr)
        return 2
    if isinstance(args.concurrency, str):
        args.concurrency = parse_concurrencies(args.concurrency)
    for name in ("step_duration", "interval", "timeout"):
        v = getattr(args, name)
        if isinstance(v, str):
            setattr(args, name, parse_duration(v))
    if args.requests_per_step is not None:
        args.requests_per_step = int(args.requests_per_step)
    if args.step_duration is None and args.requests_per_step is None:
        args.step_duration = 60.0
    json_mode = args.json or not sys.stdout.isatty()
    try:
        prompts = load_prompts(args.prompts, max_tokens=int(args.max_tokens) if args.max_tokens else None)
    except LoadgenError as exc:
        print(f"lookahead-loadgen: {exc}", file=sys.stderr)
        return 2

    def emit(obj: dict) -> None:
        print(json.dumps(obj, default=float), flush=True)

    progress = None
    task_id = None
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from rich.console import Console

        progress = Progress(TextColumn("[bold]C={task.fields[c]}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[tok]} tok"), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=False)
        progress.start()
    tokens = {"n": 0}

    def before(c: int) -> None:
        nonlocal task_id
        tokens["n"] = 0
        if progress is not None:
            total = args.requests_per_step if args.requests_per_step else None
            task_id = progress.add_task("step", total=total, c=c, tok=0)

    def on_request(c: int, r: RequestResult) -> None:
        tokens["n"] += r.completion_tokens or 0
        if progress is not None and task_id is not None:
            progress.update(task_id, advance=1, tok=tokens["n"])
        if json_mode and not args.no_requests:
            emit({"type": "request", **r.to_dict()})

    def after(step: StepResult) -> None:
        if json_mode:
            emit({"type": "step", **step.summary()})
        if step.client.bottleneck:
            print(f"lookahead-loadgen: WARNING at C={step.concurrency} the client may be the bottleneck: "
                  + "; ".join(step.client.reasons), file=sys.stderr)

    try:
        steps = run_sweep(args.url, args.concurrency, prompts, step_duration=args.step_duration,
                          requests_per_step=args.requests_per_step, model=args.model, timeout=args.timeout,
                          interval_s=args.interval, on_request=on_request, before_step=before, after_step=after)
    except LoadgenError as exc:
        print(f"lookahead-loadgen: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lookahead-loadgen: stopped by a signal", file=sys.stderr)
        return 130
    finally:
        if progress is not None:
            progress.stop()
    if json_mode:
        emit({"type": "summary", "url": args.url, "steps": [s.summary() for s in steps]})
    else:
        _print_table(steps)
    return 0 if all(s.completed for s in steps) else 1


def _print_table(steps: Sequence[StepResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="lookahead-loadgen")
    for col in ("C", "requests", "errors", "tok/s", "per-token ms (mean)", "p90", "TTFT ms", "client"):
        t.add_column(col, justify="right")

    def f(x: float | None, nd: int = 1) -> str:
        return "-" if x is None else f"{x:.{nd}f}"

    for s in steps:
        m = s.summary()
        t.add_row(str(s.concurrency), str(m["completed"]), str(m["errors"]), f(m["output_tokens_per_s"]),
                  f(m["per_token_ms_mean"]), f(m["per_token_ms_p90"]), f(m["ttft_ms_mean"], 0),
                  "[red]BOTTLENECK: " + "; ".join(s.client.reasons) if s.client.bottleneck else "ok")
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main())
