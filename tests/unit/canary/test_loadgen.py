"""The load generator against a small in-process streaming endpoint.

The endpoint sends several tokens per chunk (as a speculative engine does) and reports the true
token count in ``usage``: per-token latency must come from usage, not from chunk counts. It also
counts requests in flight, so the closed loop can be checked to hold exactly C.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from aiohttp import web

from lookahead_canary import loadgen
from lookahead_canary.loadgen import Prompt

TOKENS_PER_CHUNK = 3
TOKEN_GAP_S = 0.01   # per token


class FakeEngine:
    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict] = []

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = int(body["max_tokens"])
            await asyncio.sleep(0.02)  # "prefill"
            sent = 0
            while sent < n:
                k = min(TOKENS_PER_CHUNK, n - sent)
                if sent:
                    await asyncio.sleep(TOKEN_GAP_S * k)
                sent += k
                chunk = {"choices": [{"index": 0, "text": "x" * k, "finish_reason": "length" if sent == n else None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}}
            await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.in_flight -= 1


@pytest.fixture
async def engine():
    fake = FakeEngine()
    app = web.Application()
    app.router.add_get("/v1/models", fake.models)
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_post("/v1/chat/completions", fake.completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    await runner.cleanup()


async def test_closed_loop_holds_concurrency_and_counts_usage_tokens(engine):
    prompts = [Prompt(prompt="def f():", max_tokens=10), Prompt(prompt="class A:", max_tokens=7)]
    steps = await loadgen.sweep(engine.url, [1, 3], prompts, requests_per_step=6)
    assert [s.concurrency for s in steps] == [1, 3]
    assert engine.max_in_flight == 3
    for s in steps:
        assert len(s.requests) == 6 and s.errors == 0
        assert s.start < s.end
        assert all(s.start <= r.started_at and r.ended_at <= s.end + 1e-6 for r in s.requests)
        assert s.output_tokens == 3 * 10 + 3 * 7
        for r in s.requests:
            assert r.completion_tokens in (10, 7)
            assert r.chunks < r.completion_tokens  # several tokens a chunk
            # per-token latency from usage: span / (tokens - 1); chunks would give ~3x this
            assert r.per_token_s == pytest.approx((r.last_token_at - r.first_token_at) / (r.completion_tokens - 1),
                                                  rel=1e-4)
            assert 0.5 * TOKEN_GAP_S < r.per_token_s < 3 * TOKEN_GAP_S
            assert r.ttft_s > 0 and r.tokens_per_s > 0
    # the request body: greedy, streaming with usage, never ignore_eos
    for b in engine.bodies:
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
        assert b["temperature"] == 0.0 and "ignore_eos" not in b
        assert b["model"] == "fake-model"
    # closed loop at C=3: achieved concurrency near target, client not flagged on this tiny load
    assert steps[1].client.achieved_concurrency > 2.5
    assert steps[1].output_tokens_per_s > steps[0].output_tokens_per_s


async def test_step_duration_bounds_issue_and_drains(engine):
    prompts = [Prompt(prompt="p", max_tokens=12)]
    step_s = 0.6
    steps = await loadgen.sweep(engine.url, [2], prompts, step_duration=step_s, interval_s=0.1)
    s = steps[0]
    assert s.requests and s.errors == 0
    assert all(r.started_at <= s.start + step_s + 0.05 for r in s.requests)
    assert s.end >= max(r.ended_at for r in s.requests) - 1e-6
    # per-interval throughput samples: spreads the tokens, roughly the step's rate
    assert s.interval_output_tokens_per_s
    assert all(x >= 0 for x in s.interval_output_tokens_per_s)


async def test_chat_prompts_use_chat_endpoint(engine):
    prompts = [Prompt(messages=({"role": "user", "content": "hi"},), max_tokens=4)]
    steps = await loadgen.sweep(engine.url, [1], prompts, requests_per_step=2)
    assert steps[0].errors == 0
    assert engine.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]


async def test_missing_usage_is_an_error_not_a_chunk_count():
    async def completions(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "abc"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        steps = await loadgen.sweep(f"http://127.0.0.1:{port}", [1], [Prompt(prompt="x", max_tokens=3)],
                                    requests_per_step=1, model="m")
    finally:
        await runner.cleanup()
    r = steps[0].requests[0]
    assert not r.ok and "usage" in r.error
    assert steps[0].output_tokens == 0 and steps[0].output_tokens_per_s is None


def test_interval_rates_spread_tokens():
    r = loadgen.RequestResult(concurrency=1, index=0, started_at=0.0, ended_at=4.0, ok=True,
                              completion_tokens=5, first_token_at=0.5, last_token_at=2.5)
    rates = loadgen._interval_rates([r], 0.0, 3.0, 1.0)
    assert sum(rates) == pytest.approx(5.0)
    assert rates == pytest.approx([1 + 1.0, 2.0, 1.0])


def test_parse_helpers(tmp_path):
    assert loadgen.parse_duration("90") == 90
    assert loadgen.parse_duration("2m") == 120
    assert loadgen.parse_duration("1m30s") == 90
    assert loadgen.parse_duration("500ms") == 0.5
    with pytest.raises(ValueError):
        loadgen.parse_duration("abc")
    assert loadgen.parse_concurrencies("1,2, 4") == [1, 2, 4]
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "max_tokens": 50}\n\n{"messages": [{"role": "user", "content": "b"}]}\n')
    ps = loadgen.load_prompts(f, max_tokens=20)
    assert ps[0] == Prompt(prompt="a", max_tokens=20) and ps[1].is_chat and ps[1].max_tokens == 20
    f.write_text('{"prompt": "a", "ignore_eos": true}\n')
    with pytest.raises(loadgen.LoadgenError, match="ignore_eos"):
        loadgen.load_prompts(f)
    with pytest.raises(loadgen.LoadgenError):
        loadgen.load_prompts(tmp_path / "nope.jsonl")


async def test_cli_prints_json_lines(engine, tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "max_tokens": 6}\n')
    # the CLI runs its own event loop: give it a thread, the engine lives on this test's loop
    rc = await asyncio.to_thread(loadgen.main, ["--url", engine.url, "--concurrency", "1,2",
                                                "--requests-per-step", "3", "--prompts", str(f), "--json"])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["type"] for x in lines].count("request") == 6
    steps = [x for x in lines if x["type"] == "step"]
    assert [x["concurrency"] for x in steps] == [1, 2]
    assert all(x["output_tokens"] == 18 for x in steps)
    assert lines[-1]["type"] == "summary"


async def test_max_duration_cancels_requests_in_flight(engine):
    # 200 tokens at 10 ms a token: far longer than the 0.3 s hard limit
    prompts = [Prompt(prompt="p", max_tokens=200)]
    steps = await loadgen.sweep(engine.url, [2], prompts, step_duration=0.1)
    assert steps[0].cancelled == 0
    async with httpx.AsyncClient() as client:
        step = await loadgen.run_step(client, engine.url, "fake-model", prompts, 2, step_duration=0.1,
                                      max_duration=0.3)
    assert step.duration_s < 1.0
    assert step.cancelled == 2 and not step.completed
    assert all(r.error.startswith("cancelled") for r in step.requests)
    assert step.summary()["cancelled"] == 2


def test_interval_rates_follow_chunk_arrivals():
    # 10 tokens: a chunk of 2 chars at 0.5 s and one of 8 chars at 2.5 s -> 2 tokens then 8 tokens
    r = loadgen.RequestResult(concurrency=1, index=0, started_at=0.0, ended_at=3.0, ok=True,
                              completion_tokens=10, first_token_at=0.5, last_token_at=2.5,
                              chunk_times=[0.5, 2.5], chunk_chars=[2, 8])
    assert loadgen._interval_rates([r], 0.0, 3.0, 1.0) == pytest.approx([2.0, 0.0, 8.0])
    assert "chunk_times" not in r.to_dict()
