"""The injected fault ``SimConfig.speculative_error_rate``: a canary whose speculative decoding
path fails requests.

A request fails (an engine error: HTTP 500, or an SSE error event, counted as
``vllm:request_success_total{finished_reason="abort"}``) with that probability, decided once at
its first step that really speculates, with the simulator's seeded RNG; an engine without
``--speculative-config`` (or a step with speculate=False) never fails one. The server is run in
process on aiohttp's test server, with the simulated backend and its own ``load_engine``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from lookahead_canary.metrics import EngineMetrics
from lookahead_canary.scheduler import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    Scheduler,
    SequenceError,
    SimStepOutput,
    SimTokenizer,
    SimulatedDecoder,
    TokenEvent,
)
from lookahead_canary.server import EngineServer, load_engine, parse_args
from lookahead_canary.simulator import RooflineSimulator, SimConfig

JACOBI = '{"method":"jacobi","window":4,"ngram":3,"guess_set":4}'
# fast and draw-free apart from the fault: no noise, no drift, one token a step (acceptance 0)
FAST = {"time_scale": 0.01, "noise_sigma": 0.0, "drift_sigma": 0.0, "acceptance": 0.0}


def sim_config(rate: float, seed: int = 0) -> str:
    return json.dumps({**FAST, "speculative_error_rate": rate, "seed": seed})


# ---------------------------------------------------------------------------------------------
# SimConfig
@pytest.mark.parametrize("rate", [1.5, -0.1, float("nan")])
def test_rate_out_of_range_is_rejected_naming_the_field(rate):
    with pytest.raises(ValueError, match="speculative_error_rate"):
        SimConfig(speculative_error_rate=rate)
    with pytest.raises(ValueError, match="speculative_error_rate"):
        SimConfig.from_json(json.dumps({"speculative_error_rate": rate}))


def test_rate_defaults_to_zero_and_round_trips():
    assert SimConfig().speculative_error_rate == 0.0
    c = SimConfig.from_json('{"speculative_error_rate": 0.25}')
    assert c.speculative_error_rate == 0.25
    assert SimConfig.from_json(c.to_json()) == c
    for ok in (0.0, 1.0):
        SimConfig(speculative_error_rate=ok)


def test_rate_zero_draws_nothing():
    """The default leaves the seeded RNG stream exactly as it was."""
    a, b = RooflineSimulator(SimConfig(), seed=3), RooflineSimulator(SimConfig(), seed=3)
    assert not any(a.sample_speculative_error() for _ in range(100))
    assert a.decode_step(4, True) == b.decode_step(4, True)


# ---------------------------------------------------------------------------------------------
# the simulated decoder
def decoder(rate: float, method: str = "jacobi", seed: int = 0) -> SimulatedDecoder:
    return SimulatedDecoder(RooflineSimulator(SimConfig(method=method, speculative_error_rate=rate,
                                                        **FAST), seed=seed))


def test_only_a_speculating_step_fails_a_sequence():
    dec = decoder(1.0)
    dec.add("a", [1, 2], 10)
    dec.add("b", [3], 10)
    for _ in range(3):  # --lookahead-max-batch-size turned speculation off: plain steps never fail
        out = dec.step(speculate=False)
        assert all(isinstance(o, SimStepOutput) and len(o.new_tokens) == 1 for o in out.values())
    out = dec.step(speculate=True)
    assert set(out) == {"a", "b"} and all(isinstance(o, SequenceError) for o in out.values())
    assert "speculative" in out["a"].message
    assert dec.active == 0  # the failed sequences left the batch

    greedy = decoder(1.0, method="greedy")  # an engine that never speculates never fails
    greedy.add("c", [1], 5)
    while greedy.active:
        for sid, o in greedy.step(speculate=True).items():
            assert isinstance(o, SimStepOutput)
            if o.finished:
                greedy.remove(sid)


def test_the_decision_is_made_once_per_sequence():
    dec = decoder(0.5, seed=11)
    for i in range(30):
        dec.add(f"s{i}", [i], 6)
    first = dec.step(speculate=True)
    failed = {sid for sid, o in first.items() if isinstance(o, SequenceError)}
    assert 0 < len(failed) < 30
    dec.add("late", [1], 6)  # joins later: decided at its own first speculating step
    late_decided = False
    while dec.active:
        for sid, o in dec.step(speculate=True).items():
            if sid == "late" and not late_decided:
                late_decided = True
                if isinstance(o, SequenceError):
                    continue
            assert isinstance(o, SimStepOutput), f"{sid} failed after its first speculating step"
            if o.finished:
                dec.remove(sid)
    assert late_decided


# ---------------------------------------------------------------------------------------------
# the scheduler
class Events:
    def __init__(self):
        self.events: list = []
        self.done = threading.Event()

    def __call__(self, ev):
        self.events.append(ev)
        if isinstance(ev, (FinishEvent, ErrorEvent)):
            self.done.set()


def metric(metrics_text: str, name: str, **labels) -> float:
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def test_a_failing_request_counts_as_abort_and_ttft_only_after_its_first_token():
    class PlainFirstStep(SimulatedDecoder):
        """Speculation off for the first step (as --lookahead-max-batch-size would do)."""
        steps = 0

        def step(self, speculate=True):
            self.steps += 1
            return super().step(speculate and self.steps > 1)

    for dec, tokens_before in ((decoder(1.0), 0),
                               (PlainFirstStep(RooflineSimulator(SimConfig(speculative_error_rate=1.0,
                                                                           **FAST))), 1)):
        metrics = EngineMetrics("m", max_num_seqs=4)
        sched = Scheduler(dec, SimTokenizer(), metrics, max_num_seqs=4)
        sched.start()
        ev = Events()
        sched.submit(GenerationRequest("r", [1, 2, 3], 20, ev))
        assert ev.done.wait(10)
        sched.stop()
        assert [type(e) for e in ev.events] == [TokenEvent] * tokens_before + [ErrorEvent]
        text = metrics.render()[0].decode()
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert metric(text, "vllm:request_success_total", finished_reason="length") == 0
        assert metric(text, "vllm:time_to_first_token_seconds_count") == tokens_before
        assert metric(text, "vllm:generation_tokens_total") == tokens_before
        assert metric(text, "vllm:e2e_request_latency_seconds_count") == 1
        assert metric(text, "vllm:num_requests_running") == 0 and dec.active == 0


# ---------------------------------------------------------------------------------------------
# the server, in process
class Engine:
    def __init__(self, argv: list[str]):
        self.server = EngineServer(parse_args(["--backend", "simulate", "--model", "sim", *argv]))
        self.server.set_engine(load_engine(self.server.args, self.server.metrics))
        self.client = TestClient(TestServer(self.server.app))

    async def __aenter__(self) -> "Engine":
        await self.client.start_server()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()
        self.server.engine.scheduler.stop()

    async def complete(self, stream: bool = False, chat: bool = False, max_tokens: int = 6):
        """(status, body): the JSON body, or the list of SSE data payloads of a stream."""
        if chat:
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "the time"}]}
        else:
            path, body = "/v1/completions", {"prompt": "the time of day"}
        body.update(max_tokens=max_tokens, stream=stream)
        async with self.client.post(path, json=body) as resp:
            if not stream or resp.status != 200:
                return resp.status, await resp.json()
            text = await resp.text()
        return resp.status, [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]

    async def metrics(self) -> str:
        async with self.client.get("/metrics") as resp:
            return await resp.text()


def stream_error(payloads: list[str]) -> dict | None:
    for p in payloads:
        if p != "[DONE]" and "error" in json.loads(p):
            return json.loads(p)["error"]
    return None


async def test_with_rate_one_every_speculated_request_fails_and_the_engine_keeps_serving():
    async with Engine(["--speculative-config", JACOBI, "--sim-config", sim_config(1.0)]) as e:
        status, body = await e.complete()
        assert status == 500
        assert body["error"]["type"] == "internal_server_error"
        assert "speculative" in body["error"]["message"]
        status, body = await e.complete(chat=True)
        assert status == 500 and body["error"]["type"] == "internal_server_error"

        for chat in (False, True):
            status, payloads = await e.complete(stream=True, chat=chat)
            assert status == 200  # the stream had begun: the error comes as an event
            err = stream_error(payloads)
            assert err is not None and err["type"] == "internal_server_error", payloads
            assert not any(json.loads(p).get("choices", [{}])[0].get("finish_reason")
                           for p in payloads if p != "[DONE]")

        text = await e.metrics()
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 4
        assert metric(text, "vllm:request_success_total", finished_reason="length") == 0
        assert metric(text, "vllm:time_to_first_token_seconds_count") == 0  # no token came first
        assert metric(text, "vllm:num_requests_running") == 0
        # the engine is still up and still takes requests (which fail again, as configured)
        async with e.client.get("/health") as resp:
            assert resp.status == 200
        assert e.server.engine.scheduler.alive
        statuses = await asyncio.gather(*(e.complete() for _ in range(5)))
        assert [s for s, _ in statuses] == [500] * 5


async def test_without_a_speculative_config_no_request_fails():
    async with Engine(["--sim-config", sim_config(1.0)]) as e:
        for chat in (False, True):
            status, body = await e.complete(chat=chat)
            assert status == 200 and body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 6
            status, payloads = await e.complete(stream=True, chat=chat)
            assert status == 200 and stream_error(payloads) is None and payloads[-1] == "[DONE]"
        text = await e.metrics()
        assert metric(text, "vllm:request_success_total", finished_reason="length") == 4
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 0


async def test_a_partial_rate_fails_some_requests_with_a_fixed_seed():
    seed, n = 5, 40
    async with Engine(["--speculative-config", JACOBI, "--max-num-seqs", "8",
                       "--sim-config", sim_config(0.3, seed=seed)]) as e:
        results = await asyncio.gather(*(e.complete(max_tokens=4) for _ in range(n)))
        text = await e.metrics()
    failed = [b for s, b in results if s == 500]
    served = [b for s, b in results if s == 200]
    assert len(failed) + len(served) == n
    assert 0 < len(failed) < n
    # with no other draws configured, the RNG's only draws are one per request, in order
    assert len(failed) == int((np.random.default_rng(seed).random(n) < 0.3).sum())
    assert all(b["error"]["type"] == "internal_server_error" for b in failed)
    assert all(b["usage"]["completion_tokens"] == 4 for b in served)
    assert metric(text, "vllm:request_success_total", finished_reason="abort") == len(failed)
    assert metric(text, "vllm:request_success_total", finished_reason="length") == len(served)
