"""Observations read from a real Prometheus scraping real engine processes equal what the
engines recorded, per role and per step window.

Two reference engines on the tiny model run as subprocesses: a control (no lookahead) and a
canary (Jacobi lookahead), each registered with the session's Prometheus under
``lookahead_dev_role``. The load generator drives each at two concurrency steps; before and after
every step the test reads the engine's own ``/metrics`` and, after the step, waits until
Prometheus has scraped the engine past the step's end (a condition, not a sleep). Then
``observe()`` for that role and window must give exactly the engine's counter increases, the
client's token count, and the histogram means the engine recorded.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import pytest

from lookahead_canary import loadgen
from lookahead_canary.loadgen import Prompt
from lookahead_operator.measurement import prometheus as obs
from lookahead_operator.cli.analyze import EngineProcess, metrics_delta, scrape_metrics
from lookahead_operator.engines import metric_names
from lookahead_operator.measurement.prometheus import State

pytestmark = pytest.mark.integration

M = metric_names("reference")
POLICY = "obs-it"
JACOBI = json.dumps({"method": "jacobi", "window": 4, "ngram": 3, "guess_set": 4})
STEPS = (1, 3)
STEP_S = 3.0
PROMPTS = [
    Prompt(prompt="def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", max_tokens=16),
    Prompt(prompt="# reverse a list in Python\ndef reverse(xs):\n", max_tokens=12),
    Prompt(prompt="class Stack:\n    def __init__(self):\n", max_tokens=20),
]


def sel(role: str) -> dict:
    return {"lookahead_dev_policy": POLICY, "lookahead_dev_role": role}


@pytest.fixture(scope="module")
def engines_scraped(prometheus, tmp_path_factory):
    d = tmp_path_factory.mktemp("engines")
    procs = {
        "control": EngineProcess("control", model="tiny", max_num_seqs=8, log_path=d / "control.log"),
        "canary": EngineProcess("canary", model="tiny", max_num_seqs=8, speculative_config=JACOBI,
                                log_path=d / "canary.log"),
    }
    try:
        for p in procs.values():
            p.start()
        for p in procs.values():
            p.wait_ready(180)
        prometheus.set_targets([
            {"address": f"127.0.0.1:{p.port}",
             "labels": {"lookahead_dev_policy": POLICY, "lookahead_dev_role": role, "lookahead_dev_target": "tiny"}}
            for role, p in procs.items()
        ])
        now = time.time()
        for role, p in procs.items():
            prometheus.wait_target_up(f"127.0.0.1:{p.port}", timeout=60)
            obs.wait_scraped(prometheus.url, M, sel(role), after=now, timeout=60)
        yield procs
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture(scope="module")
def driven(engines_scraped, prometheus):
    """Drive each role at each step; record the engine's own counters around every step."""
    out: dict[str, list[tuple[loadgen.StepResult, dict, dict]]] = {}
    for role, p in engines_scraped.items():
        snaps: list[dict] = []
        records: list[tuple[loadgen.StepResult, dict, dict]] = []

        def before(c: int) -> None:
            snaps.append(scrape_metrics(p.url))

        async def after(step: loadgen.StepResult, role=role, p=p) -> None:
            after_snap = scrape_metrics(p.url)
            records.append((step, snaps[-1], after_snap))
            # a quiet gap with one scrape in it: the window's end sample is taken before the next step
            await asyncio.to_thread(obs.wait_scraped, prometheus.url, M, sel(role), step.end, 60.0)

        steps = loadgen.run_sweep(p.url, STEPS, PROMPTS, step_duration=STEP_S, interval_s=1.0,
                                  before_step=before, after_step=after)
        assert [s.concurrency for s in steps] == list(STEPS)
        out[role] = records
    return out


@pytest.mark.parametrize("role", ["control", "canary"])
def test_observations_equal_what_the_engines_recorded(driven, prometheus, role):
    for step, before, after in driven[role]:
        d = metrics_delta(before, after)
        assert step.errors == 0 and step.completed
        o = obs.read_window(prometheus.url, M, sel(role), step.start, step.end, interval_s=1.0, min_requests=1)
        where = f"{role} C={step.concurrency}"

        # tokens: Prometheus == the engine's counter == the client's usage count
        assert o.output_tokens.ok, (where, o.output_tokens)
        assert o.output_tokens.value == d[M.generation_tokens] == step.output_tokens, where
        assert o.output_tokens_per_s.value == pytest.approx(step.output_tokens / (step.end - step.start), rel=1e-9)
        assert sum(o.intervals.output_tokens) == pytest.approx(o.output_tokens.value, rel=1e-9)
        assert o.requests.value == d[f"{M.e2e}_count"] == len(step.completed), where

        # histogram means: exactly the engine's sum / count increase over the window
        for measured, base in ((o.per_token_latency_s, M.per_token_latency), (o.ttft_s, M.ttft), (o.e2e_s, M.e2e),
                               (o.prefill_time_s, M.prefill_time), (o.decode_time_s, M.decode_time),
                               (o.queue_time_s, M.queue_time)):
            expected = d[f"{base}_sum"] / d[f"{base}_count"]
            assert measured.value == pytest.approx(expected, rel=1e-9, abs=1e-12), (where, base, measured)
            assert measured.samples == d[f"{base}_count"], (where, base)
            if base != M.per_token_latency:   # request-level histograms: one observation a request
                assert measured.samples == len(step.completed), (where, base)
        assert o.per_token_latency_source == "per_token_histogram"
        # the reference engine's per-token series is its per-token ITL: one observation for every
        # token after each request's first
        if M.per_token_latency == "vllm:inter_token_latency_seconds":
            assert o.per_token_latency_s.samples == step.output_tokens - len(step.completed), where

        # the client's per-token latency (usage-counted) agrees with the engine's, within jitter
        client = statistics.fmean(step.per_token_latencies_s())
        assert o.per_token_latency_s.value == pytest.approx(client, rel=0.35, abs=0.005), where

        # acceptance: the canary's counters; the control has none (missing, never 0)
        if role == "canary":
            assert d[M.draft_tokens] > 0
            assert o.acceptance_rate.value == pytest.approx(d[M.accepted_tokens] / d[M.draft_tokens], rel=1e-9)
            assert 0.0 <= o.acceptance_rate.value <= 1.0
        else:
            assert o.acceptance_rate.state is State.MISSING and o.acceptance_rate.value is None

        # running batch: a time average of the gauge, at most the closed loop's concurrency
        assert o.mean_running.value is not None and 0.0 <= o.mean_running.value <= step.concurrency + 1e-9, where


def test_roles_are_kept_apart(driven, prometheus):
    """The control's window read with the canary's selector sees none of the control's tokens."""
    step, _, _ = driven["control"][0]
    o = obs.read_window(prometheus.url, M, sel("canary"), step.start, step.end)
    assert o.output_tokens.state is State.MISSING
    both = obs.read_windows(prometheus.url, M, {"lookahead_dev_policy": POLICY}, step.start, step.end)
    assert both["control"].output_tokens.value == step.output_tokens


def test_empty_window_is_missing_not_zero(driven, prometheus, engines_scraped):
    t0 = time.time()
    obs.wait_scraped(prometheus.url, M, sel("canary"), after=t0, timeout=60)
    t1 = time.time()
    obs.wait_scraped(prometheus.url, M, sel("canary"), after=t1, timeout=60)
    o = obs.read_window(prometheus.url, M, sel("canary"), t0, t1)
    for name in ("output_tokens", "output_tokens_per_s", "per_token_latency_s", "requests", "ttft_s",
                 "acceptance_rate"):
        v = getattr(o, name)
        assert v.state is State.MISSING and v.value is None, (name, v)
        assert v.reason
    assert not o.complete()


def test_window_not_yet_scraped_is_missing(driven, prometheus):
    """A window ending in the future has no end sample: missing, with the reason."""
    now = time.time()
    o = obs.read_window(prometheus.url, M, sel("control"), now - 5, now + 30)
    assert o.output_tokens.state is State.MISSING
    assert "not scraped since the window end" in o.output_tokens.reason


def test_the_abort_sees_both_arms_only_while_prometheus_scrapes_both(driven, prometheus):
    """``measure.last_scraped``, which the live safety abort's blind clock reads: how far a real
    Prometheus has scraped every arm (the older of the two), and None for an arm it has no live
    series of (never scraped, or its target gone: the abort cannot see it)."""
    from lookahead_operator.measurement.measure import last_scraped

    t0 = time.time()
    for role in ("control", "canary"):
        obs.wait_scraped(prometheus.url, M, sel(role), after=t0, timeout=60)
    seen = last_scraped(prometheus.url, M, [sel("control"), sel("canary")])
    assert seen is not None and t0 <= seen <= time.time() + 1
    later = [last_scraped(prometheus.url, M, [sel(r)]) for r in ("control", "canary")]
    assert min(later) >= seen  # the older arm's newest sample (a scrape may have come in since)
    assert last_scraped(prometheus.url, M, [sel("control"), sel("nobody-scrapes-this-arm")]) is None
