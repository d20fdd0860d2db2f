"""Open-loop production traffic for test fleets: the "users" an end-to-end test's fleet serves,
and a record from which a test asserts that no production request failed while the operator
created canaries, promoted or rolled back.

* **Open loop**: Poisson arrivals whatever the fleet does (a closed loop sends less to a slow or
  broken fleet and so hides an outage). The rate follows points ``(t_seconds, requests/s)``, linear
  between points; two points at one ``t`` make a step; the first rate holds before the first point,
  the last after the last. Arrivals come from thinning (Lewis-Shedler) with a seeded
  ``random.Random``: a seed gives the same arrival times, prompt sets, prompts and stream choices.
* **A new TCP connection per request** (``max_keepalive_connections=0``, ``Connection: close``):
  a Kubernetes Service (kube-proxy, iptables) balances per *connection*, and real users are many
  clients; kept-alive connections would pin the traffic to the pods reached first, never reaching
  a new canary nor noticing a pod gone.
* **Bounded**: every request has a total timeout; at most ``--max-in-flight`` are in flight, and
  an arrival over the cap is recorded as ``not_sent`` (the generator's limit, not a server failure).

The record is JSON Lines, one line per finished request, flushed as each finishes; ``outcome`` is
``ok``, ``failed`` (HTTP error, transport error, timeout, bad body) or ``not_sent``::

    {"id": 3, "scheduled_s": 1.92, "set": "chat", "prompt": 5, "stream": true, "started_at": 1796236211.3,
     "ended_at": 1796236212.9, "outcome": "ok", "status": 200, "ok": true, "error": null,
     "ttft_s": 0.031, "per_token_s": 0.012, "completion_tokens": 128, "e2e_s": 1.6}

Command line: runs until ``--duration`` or SIGTERM/SIGINT, then stops issuing, waits (at most the
request timeout) for what is in flight, records it, prints a summary line on stderr, exits 0. Bad
arguments: one line on stderr, exit 2. No model on ``/v1/models`` within ``--model-wait``: exit 1::

    python -m lookahead_dev.traffic --url http://HOST:PORT --out FILE [--schedule 0:0.5,60:2,60:4]
        [--mix chat=2,code=1,summarize=1] [--stream-share 0.5] [--seed N] [--duration S]
        [--timeout S] [--max-in-flight N] [--model NAME] [--model-wait S] [--parent-pid PID]

From a test::

    with ProductionTraffic(url, schedule="0:1,8:4", out=tmp_path / "traffic.jsonl") as traffic:
        traffic.wait_requests(1, timeout=30, ok=True)
        t0 = time.time()
        ...                                    # what the operator does
    s = traffic.record.summary(since=t0)
    assert s.failed == 0 and s.not_sent == 0, format_failures(s)
"""

from __future__ import annotations

import signal

_SIGNALLED: list[int] = []   # SIGTERM/SIGINT before the event loop ran: they stop the run, as later ones do


def _remember_signal(signum: int, _frame: object) -> None:
    _SIGNALLED.append(signum)


if __name__ == "__main__":   # before the imports below (~0.1 s): a stop right after a start still exits 0
    for _sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_sig, _remember_signal)

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import httpx

from lookahead_canary import process, units
from lookahead_canary.loadgen import LoadgenError, Prompt, discover_model, load_prompts

PROG = "lookahead-traffic"
DEFAULT_MIX = "chat=1,code=1,summarize=1"
Schedule = list[tuple[float, float]]


class TrafficArgumentError(ValueError):
    """A parameter value that does not parse; the message is one line naming the parameter and the
    bad piece, fit for a command line's error and for a test's ``pytest.raises(match=...)``."""


# ---------------------------------------------------------------------------------------------
# pure pieces: schedule, arrivals, mix


def _number(text: str, param: str, what: str, piece: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TrafficArgumentError(f"{param}: bad {what} {text.strip()!r} in {piece!r}: expected a number >= 0")
    return value


def parse_schedule(text: str, param: str = "--schedule") -> Schedule:
    """``"0:0.5,60:2,60:4"`` -> ``[(0, 0.5), (60, 2), (60, 4)]``: seconds and requests/s, times
    never going back (equal times make a step)."""
    if not str(text).strip():
        raise TrafficArgumentError(f"{param}: empty; expected points T:RATE, e.g. 0:0.5,60:2")
    points: Schedule = []
    for piece in str(text).split(","):
        t, sep, r = piece.strip().partition(":")
        if not sep:
            raise TrafficArgumentError(f"{param}: bad point {piece.strip()!r}: expected T:RATE (seconds:requests/s)")
        point = (_number(t, param, "time", piece.strip()), _number(r, param, "rate", piece.strip()))
        if points and point[0] < points[-1][0]:
            raise TrafficArgumentError(f"{param}: point {piece.strip()!r} goes back in time "
                                       f"(after t={points[-1][0]:g})")
        points.append(point)
    return points


def rate_at(schedule: Sequence[tuple[float, float]], t: float) -> float:
    """The rate (requests/s) at ``t`` seconds: linear between points, right-continuous at a step."""
    times = [p[0] for p in schedule]
    i = bisect.bisect_right(times, t)          # points at or before t
    if i == 0:
        return schedule[0][1]
    if i == len(schedule):
        return schedule[-1][1]
    (t0, r0), (t1, r1) = schedule[i - 1], schedule[i]
    return r0 + (r1 - r0) * (t - t0) / (t1 - t0)


def _segments(schedule: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """``(start, end, max rate)`` pieces on which the rate is linear (the last one ends at inf)."""
    segs = [(0.0, schedule[0][0], schedule[0][1])] if schedule[0][0] > 0 else []
    segs += [(t0, t1, max(r0, r1)) for (t0, r0), (t1, r1) in zip(schedule, schedule[1:]) if t1 > t0]
    return segs + [(schedule[-1][0], math.inf, schedule[-1][1])]


def iter_arrivals(schedule: Sequence[tuple[float, float]], rng: random.Random) -> Iterator[float]:
    """Arrival times (seconds from 0, increasing) of a Poisson process with rate ``rate_at(t)``.

    Lewis-Shedler thinning per segment: candidates from a homogeneous process at the segment's
    peak rate, each kept with probability rate(t)/peak. Bounding per segment rather than by the
    global peak keeps the rejections few when the rate spans orders of magnitude; restarting at a
    segment boundary is exact (the exponential has no memory). Endless unless the last rate is 0.
    """
    for start, end, peak in _segments(schedule):
        if peak <= 0:
            continue
        t = start
        while True:
            t += rng.expovariate(peak)
            if t >= end:
                break
            if rng.random() * peak < rate_at(schedule, t):
                yield t


def arrival_times(schedule: Sequence[tuple[float, float]], horizon: float,
                  seed: int | random.Random = 0) -> list[float]:
    """Every arrival before ``horizon`` seconds, for a seed (or a ``random.Random``)."""
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)
    out = []
    for t in iter_arrivals(schedule, rng):
        if t >= horizon:
            break
        out.append(t)
    return out


def expected_count(schedule: Sequence[tuple[float, float]], horizon: float) -> float:
    """The integral of the rate over ``[0, horizon]``: the mean number of arrivals."""
    total = 0.0
    for start, end, _ in _segments(schedule):
        a, b = start, min(end, horizon)
        if b > a:  # linear on (a, b): the midpoint rule is exact
            total += rate_at(schedule, (a + b) / 2) * (b - a)
    return total


def parse_mix(text: str, param: str = "--mix") -> dict[str, float]:
    """``"chat=2,code=1,summarize=1"`` -> weights by prompt set (a bundled name or a JSONL path)."""
    mix: dict[str, float] = {}
    for piece in str(text).split(","):
        name, sep, w = piece.strip().rpartition("=")
        if not sep or not name.strip():
            raise TrafficArgumentError(f"{param}: bad entry {piece.strip()!r}: expected SET=WEIGHT, e.g. chat=2")
        if name.strip() in mix:
            raise TrafficArgumentError(f"{param}: set {name.strip()!r} given twice")
        mix[name.strip()] = _number(w, param, "weight", piece.strip())
    if sum(mix.values()) <= 0:
        raise TrafficArgumentError(f"{param}: every weight is 0 in {text!r}")
    return mix


def choose(weights: Mapping[str, float], rng: random.Random) -> str:
    """One name, with probability proportional to its weight."""
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def load_mix(mix: Mapping[str, float], param: str = "--mix") -> dict[str, list[Prompt]]:
    """The prompts of every set in a mix (``lookahead_canary.loadgen.load_prompts``)."""
    try:
        return {name: load_prompts(name) for name in mix}
    except LoadgenError as exc:
        raise TrafficArgumentError(f"{param}: {exc}") from None


def parse_share(text: str, param: str = "--stream-share") -> float:
    value = _number(str(text), param, "share", str(text))
    if value > 1:
        raise TrafficArgumentError(f"{param}: bad share {text!r}: expected a fraction in [0, 1]")
    return value


def _duration(text: str, param: str) -> float:
    try:
        return units.parse_duration(text)
    except ValueError as exc:
        raise TrafficArgumentError(f"{param}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# the record


def _unix(t: float | datetime | None) -> float | None:
    return t.timestamp() if isinstance(t, datetime) else t


@dataclass
class TrafficSummary:
    """Counts over a window. ``sent`` = ``ok`` + ``failed``; ``not_sent`` is apart: over the cap."""

    sent: int
    ok: int
    failed: int
    not_sent: int
    failures: list[dict] = field(default_factory=list)
    unsent: list[dict] = field(default_factory=list)
    ttft_median_s: float | None = None

    def line(self) -> str:
        ttft = "-" if self.ttft_median_s is None else f"{1e3 * self.ttft_median_s:.0f} ms"
        return (f"sent {self.sent}, ok {self.ok}, failed {self.failed}, not sent {self.not_sent}; "
                f"median TTFT {ttft}")


class TrafficRecord:
    """Reads a generator's JSON Lines record, also while it is being written (a line without its
    newline yet is left for the next read)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def requests(self, since: float | datetime | None = None, until: float | datetime | None = None) -> list[dict]:
        """Requests in flight at some moment of ``[since, until]`` (Unix times or datetimes), by
        start: one that began before a window and failed inside it belongs to it."""
        since, until = _unix(since), _unix(until)
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        out = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n") and line.strip()]
        out = [r for r in out
               if (since is None or r["ended_at"] >= since) and (until is None or r["started_at"] <= until)]
        return sorted(out, key=lambda r: (r["started_at"], r["id"]))

    def summary(self, since: float | datetime | None = None, until: float | datetime | None = None) -> TrafficSummary:
        reqs = self.requests(since, until)
        outcome = {id(r): r.get("outcome") or ("ok" if r["ok"] else "failed") for r in reqs}
        failures = [r for r in reqs if outcome[id(r)] == "failed"]
        unsent = [r for r in reqs if outcome[id(r)] == "not_sent"]
        ttfts = [r["ttft_s"] for r in reqs if r["ok"] and r.get("ttft_s") is not None]
        ok = sum(1 for r in reqs if outcome[id(r)] == "ok")
        return TrafficSummary(sent=ok + len(failures), ok=ok, failed=len(failures), not_sent=len(unsent),
                              failures=failures, unsent=unsent,
                              ttft_median_s=statistics.median(ttfts) if ttfts else None)


def format_failures(summary: TrafficSummary, limit: int = 20) -> str:
    """An assertion message: the counts, then each failed (and not-sent) request with its error."""
    lines = [f"production traffic: {summary.line()}"]
    for r in (summary.failures + summary.unsent)[:limit]:
        at = datetime.fromtimestamp(r["started_at"], timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        kind = "stream" if r.get("stream") else "plain"
        lines.append(f"  #{r['id']} {at}Z {r.get('set')} {kind} {r.get('e2e_s') or 0:.2f}s "
                     f"status={r.get('status')}: {r.get('error')}")
    if len(summary.failures) + len(summary.unsent) > limit:
        lines.append(f"  ... and {len(summary.failures) + len(summary.unsent) - limit} more")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the generator


@dataclass
class TrafficConfig:
    """What one run of the generator does (the command line's flags, parsed)."""

    url: str
    out: Path
    schedule: Schedule
    mix: dict[str, float]
    stream_share: float = 0.5
    seed: int = 0
    duration: float | None = None
    timeout: float = 30.0
    max_in_flight: int = 128
    model: str | None = None
    model_wait: float = 60.0
    parent_pid: int | None = None   # stop once this process is no longer the parent


_NO_RESULT: dict[str, Any] = {"status": None, "ok": False, "error": None, "ttft_s": None, "per_token_s": None,
                              "completion_tokens": None, "e2e_s": None}


class _Failed(Exception):
    """A response that is not a usable completion (its message is the record's error)."""


async def send(client: httpx.AsyncClient, url: str, model: str, prompt: Prompt, stream: bool,
               timeout: float) -> dict[str, Any]:
    """One request, streaming or not, within ``timeout`` seconds in all; never raises (but for
    cancellation): the outcome fields of a record line. Tokens come from the server's ``usage``."""
    path, body = (("/v1/chat/completions", {"messages": list(prompt.messages or ())}) if prompt.is_chat
                  else ("/v1/completions", {"prompt": prompt.prompt}))
    body.update(model=model, max_tokens=prompt.max_tokens, temperature=0.0, stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    res: dict[str, Any] = dict(_NO_RESULT)
    t0 = time.perf_counter()
    first = last = None
    usage: dict | None = None
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", f"{url}{path}", json=body, headers={"Connection": "close"}) as resp:
                res["status"] = resp.status_code
                if resp.status_code != 200:
                    raise _Failed(f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}")
                if not stream:
                    usage = json.loads(await resp.aread()).get("usage")
                else:
                    done = False
                    async for line in resp.aiter_lines():
                        data = line[5:].strip() if line.startswith("data:") else ""
                        if data == "[DONE]":
                            done = True
                            break
                        obj = json.loads(data) if data else {}
                        if obj.get("error"):
                            raise _Failed(f"error in the stream: {obj['error']}")
                        usage = obj.get("usage") or usage
                        for ch in obj.get("choices") or ():
                            if ch.get("text") or (ch.get("delta") or {}).get("content"):
                                last = time.perf_counter()
                                first = first or last
                    if not done:
                        raise _Failed("the stream ended without [DONE]")
    except TimeoutError:
        res["error"] = f"timeout: no complete response within {timeout:g} s"
    except _Failed as exc:
        res["error"] = str(exc)
    except (httpx.HTTPError, ValueError, AttributeError) as exc:   # transport; JSON that is not an object
        res["error"] = f"{type(exc).__name__}: {exc}"
    res["e2e_s"] = time.perf_counter() - t0
    tokens = (usage or {}).get("completion_tokens")
    if res["error"] is None and not isinstance(tokens, int):
        res["error"] = "no usage.completion_tokens in the response"
    if res["error"] is None:
        res.update(ok=True, completion_tokens=tokens)
        if first is not None:
            res["ttft_s"] = first - t0
            if tokens >= 2:
                res["per_token_s"] = (last - first) / (tokens - 1)
    return res


async def _stopped(stop: asyncio.Event, timeout: float | None) -> bool:
    """Wait up to ``timeout`` s (None: for ever) for ``stop``; whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout)
    return stop.is_set()


async def _find_model(client: httpx.AsyncClient, cfg: TrafficConfig, stop: asyncio.Event) -> str | None:
    """The served model, from ``GET /v1/models``, retried for at most ``cfg.model_wait`` s (a fleet
    may still be starting); None if stopped meanwhile."""
    deadline = time.monotonic() + cfg.model_wait
    while True:
        try:
            return await discover_model(client, cfg.url)
        except LoadgenError as exc:
            if time.monotonic() >= deadline:
                raise LoadgenError(f"no model at {cfg.url}/v1/models within {cfg.model_wait:g} s: {exc}") from None
        if await _stopped(stop, 0.5):
            return None


async def run(cfg: TrafficConfig, prompts: Mapping[str, Sequence[Prompt]], stop: asyncio.Event) -> None:
    """Send the traffic until ``cfg.duration`` or ``stop``, then drain (bounded) and return."""
    loop = asyncio.get_running_loop()
    watcher = loop.create_task(_watch_parent(cfg.parent_pid, stop)) if cfg.parent_pid else None  # noqa: F841 (held)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    timeout = httpx.Timeout(cfg.timeout, connect=min(cfg.timeout, 10.0))
    arrivals_rng, choice_rng = random.Random(cfg.seed), random.Random(f"{cfg.seed}:requests")
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        model = cfg.model or await _find_model(client, cfg, stop)
        if model is None:
            return
        with open(cfg.out, "a") as f:
            def write(rec: dict) -> None:
                f.write(json.dumps(rec) + "\n")
                f.flush()

            async def one(base: dict, prompt: Prompt) -> None:
                started_at, t0 = time.time(), time.perf_counter()

                def record(res: dict) -> None:
                    write({**base, "started_at": started_at, "ended_at": started_at + time.perf_counter() - t0,
                           "outcome": "ok" if res["ok"] else "failed", **res})
                try:
                    res = await send(client, cfg.url, model, prompt, base["stream"], cfg.timeout)
                except asyncio.CancelledError:
                    record({**_NO_RESULT, "error": "cancelled: still in flight when the generator stopped",
                            "e2e_s": time.perf_counter() - t0})
                    raise
                record(res)

            in_flight: set[asyncio.Task] = set()
            t_start = loop.time()
            for i, t in enumerate(iter_arrivals(cfg.schedule, arrivals_rng)):
                if cfg.duration is not None and t >= cfg.duration:
                    break
                if await _stopped(stop, max(0.0, t_start + t - loop.time())):
                    break
                name = choose(cfg.mix, choice_rng)
                k = choice_rng.randrange(len(prompts[name]))
                base = {"id": i, "scheduled_s": round(t, 6), "set": name, "prompt": k,
                        "stream": choice_rng.random() < cfg.stream_share}
                if len(in_flight) >= cfg.max_in_flight:
                    now = time.time()
                    write({**base, "started_at": now, "ended_at": now, "outcome": "not_sent", **_NO_RESULT,
                           "error": f"not sent: {len(in_flight)} requests in flight (--max-in-flight)"})
                    continue
                task = loop.create_task(one(base, prompts[name][k]))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            else:  # the schedule ends at rate 0: idle until the duration or a signal
                await _stopped(stop, None if cfg.duration is None else max(0.0, t_start + cfg.duration - loop.time()))
            if in_flight:  # each has its own timeout; this bound only guards against a bug
                _, pending = await asyncio.wait(set(in_flight), timeout=cfg.timeout + 5)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)


async def _watch_parent(ppid: int, stop: asyncio.Event) -> None:
    """Stop when the parent process is gone (this process was re-parented): a test killed outright
    must not leave its traffic running (the child lives in its own session, out of its signals)."""
    while os.getppid() == ppid:
        if await _stopped(stop, 0.5):
            return
    print(f"{PROG}: the parent process {ppid} exited; stopping", file=sys.stderr)
    stop.set()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Open-loop Poisson production traffic against an OpenAI-compatible "
                                       "endpoint, one TCP connection per request; a JSON Lines record.")
    p.add_argument("--url", required=True, help="base URL, e.g. http://HOST:PORT (a Kubernetes Service)")
    p.add_argument("--out", required=True, type=Path, help="the record, JSON Lines (appended to)")
    p.add_argument("--schedule", default="0:1", help="rate points T:RATE (s:requests/s), linear between (default 0:1)")
    p.add_argument("--mix", default=DEFAULT_MIX, help=f"prompt sets and weights (default {DEFAULT_MIX})")
    p.add_argument("--stream-share", default="0.5", help="fraction of requests that stream (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and choices (default 0)")
    p.add_argument("--duration", default=None, help="stop issuing after this long (default: at SIGTERM/SIGINT)")
    p.add_argument("--timeout", default="30s", help="per-request timeout, in all (default 30s)")
    p.add_argument("--max-in-flight", type=int, default=128, help="cap; arrivals over it are not sent (default 128)")
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--model-wait", default="60s", help="how long to retry /v1/models at start (default 60s)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="stop (as on SIGTERM) once the process PID is no longer this one's parent")
    return p


def _config(args: argparse.Namespace) -> TrafficConfig:
    if not str(args.url).startswith(("http://", "https://")):
        raise TrafficArgumentError(f"--url: expected http://HOST:PORT, got {args.url!r}")
    if args.max_in_flight < 1:
        raise TrafficArgumentError(f"--max-in-flight: must be >= 1, got {args.max_in_flight}")
    timeout = _duration(args.timeout, "--timeout")
    if timeout <= 0:
        raise TrafficArgumentError(f"--timeout: must be > 0, got {args.timeout!r}")
    return TrafficConfig(url=args.url.rstrip("/"), out=args.out, schedule=parse_schedule(args.schedule),
                         mix=parse_mix(args.mix), stream_share=parse_share(args.stream_share), seed=args.seed,
                         duration=None if args.duration is None else _duration(args.duration, "--duration"),
                         timeout=timeout, max_in_flight=args.max_in_flight, model=args.model,
                         model_wait=_duration(args.model_wait, "--model-wait"), parent_pid=args.parent_pid)


def main(argv: Sequence[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):   # until the event loop takes them over
        signal.signal(sig, _remember_signal)
    args = build_parser().parse_args(argv)
    try:
        cfg = _config(args)
        prompts = load_mix(cfg.mix)
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.touch()
    except (TrafficArgumentError, LoadgenError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    started = time.time()

    async def _main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        if _SIGNALLED:
            stop.set()
        await run(cfg, prompts, stop)

    try:
        asyncio.run(_main())
    except LoadgenError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(f"{PROG}: {TrafficRecord(cfg.out).summary(since=started).line()}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# the handle for tests


class ProductionTraffic:
    """The generator as a child process (``lookahead_canary.process.start``: its own session, output
    to ``log``), started with ``--parent-pid`` (the test's process) so it stops within a second once the test
    process is gone, even killed. ``stop()`` is SIGTERM and a bounded wait for the drain."""

    def __init__(self, url: str, *, out: str | os.PathLike[str], schedule: str | Sequence[tuple[float, float]] = "0:1",
                 mix: str | Mapping[str, float] = DEFAULT_MIX, stream_share: float = 0.5, seed: int = 0,
                 duration: float | None = None, timeout: float = 30.0, max_in_flight: int = 128,
                 model: str | None = None, model_wait: float = 60.0, log: str | os.PathLike[str] | None = None):
        self.out = Path(out)
        self.log = Path(log) if log is not None else self.out.with_suffix(".log")
        self.timeout = timeout
        if not isinstance(schedule, str):
            schedule = ",".join(f"{t:g}:{r:g}" for t, r in schedule)
        if not isinstance(mix, str):
            mix = ",".join(f"{k}={w:g}" for k, w in mix.items())
        self.schedule = parse_schedule(schedule)   # bad values fail here, in the test, not in the child
        load_mix(parse_mix(mix))
        parse_share(str(stream_share))
        self.argv = [sys.executable, "-m", "lookahead_dev.traffic", "--url", url, "--out", str(self.out),
                     "--schedule", schedule, "--mix", mix, "--stream-share", str(stream_share), "--seed", str(seed),
                     "--timeout", str(timeout), "--max-in-flight", str(max_in_flight),
                     "--model-wait", str(model_wait), "--parent-pid", str(os.getpid())]
        self.argv += ["--duration", str(duration)] if duration is not None else []
        self.argv += ["--model", model] if model else []
        self.popen: subprocess.Popen | None = None

    def start(self) -> "ProductionTraffic":
        """Start the child (a fresh record: an old file at ``out`` is removed); returns at once.
        RuntimeError while it runs: a second child would send a second stream of requests whose
        outcomes go to a record nobody reads (the first one's file is replaced)."""
        if self.running:
            raise RuntimeError(f"the traffic generator already runs (pid {self.popen.pid}); stop() it first")
        self.out.unlink(missing_ok=True)
        self.popen = process.start(self.argv, self.log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    @property
    def record(self) -> TrafficRecord:
        return TrafficRecord(self.out)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_requests(self, n: int, timeout: float, *, ok: bool | None = None,
                      started_after: float | None = None) -> list[dict]:
        """Wait until the record holds ``n`` finished requests (only ok, or only not ok, if ``ok``
        is given; only those started after a Unix time); AssertionError after ``timeout`` s or if
        the generator exited. Returns them."""
        deadline = time.monotonic() + timeout
        while True:
            reqs = [r for r in self.record.requests() if (ok is None or r["ok"] == ok)
                    and (started_after is None or r["started_at"] > started_after)]
            if len(reqs) >= n:
                return reqs
            if not self.running or time.monotonic() > deadline:
                why = "exited" if not self.running else f"timed out after {timeout:g} s"
                raise AssertionError(f"traffic {why} with {len(reqs)} of {n} requests (ok={ok}); log:\n"
                                     + self.log.read_text(errors="replace")[-2000:])
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        """Wait (at most ``timeout`` s) for a ``duration`` run to end; its exit code."""
        assert self.popen is not None, "not started"
        return self.popen.wait(timeout)

    def stop(self) -> int | None:
        """SIGTERM; wait for the drain (request timeout + 15 s at most), then kill the group."""
        if self.popen is None:
            return None
        deadline = time.monotonic() + 10   # its handlers are in place once it has made the record file
        while self.popen.poll() is None and not self.out.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(self.timeout + 15)
            process.stop(self.popen, timeout=5)
        return self.popen.returncode

    def __enter__(self) -> "ProductionTraffic":
        """Start it, unless it already runs (``start()`` before, to wait for its first answers):
        either way it is stopped when the block ends."""
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
