"""The reference engine server as a real process: OpenAI API, errors, metrics, drain.

Every server here is ``python3 -m lookahead_canary.server`` started as a subprocess on a free
loopback port and awaited on ``/health`` (polled, with a deadline). Model servers use the tiny
random Llama (SmolLM2's tokenizer); the simulated ones use the roofline simulator with a
fixed seed. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lookahead_canary.metrics import VLLM_COUNTERS, VLLM_GAUGES, VLLM_HISTOGRAMS
from lookahead_dev.devcluster import free_port

from .helpers import terminate, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
JACOBI = '{"method":"jacobi","window":5,"ngram":3,"guess_set":5}'
# Llama-3-8B on an A100 (the simulator's defaults): ~8 ms a step at batch 1.
SIM = '{"seed": 7, "noise_sigma": 0.0, "acceptance": 0.6}'
PROMPTS = [
    "def fib(n):\n    return fib(n - 1) + fib(n - 2)\n\ndef fib(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8,",
]


class Engine:
    """One engine server process."""

    def __init__(self, *flags: str, launcher: tuple[str, ...] = ("-m", "lookahead_canary.server")):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="engine-", suffix=".log", delete=False)
        self.argv = [sys.executable, *launcher, "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**os.environ,
                                                                    "PYTHONUNBUFFERED": "1"})
        self.client = httpx.Client(base_url=self.url, timeout=60, trust_env=False)
        self.health_seen: list[tuple[int, str]] = []

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def health(self) -> int | None:
        try:
            r = self.client.get("/health", timeout=2)
        except httpx.TransportError:
            return None
        self.health_seen.append((r.status_code, r.json().get("status")))
        return r.status_code

    def wait_ready(self, timeout: float = 90) -> "Engine":
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"engine exited {self.proc.returncode}:\n{self.output()}")
            return self.health() == 200
        wait_until(ready, timeout, f"{self.argv} to be healthy", interval=0.1)
        return self

    def stop(self) -> None:
        terminate(self.proc, 20)
        self.client.close()
        self.log.close()
        os.unlink(self.log.name)

    # -- API helpers --------------------------------------------------------------------
    def complete(self, path: str = "/v1/completions", **body) -> dict:
        r = self.client.post(path, json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def stream(self, path: str = "/v1/completions", **body) -> tuple[list[dict], list[str]]:
        """The parsed ``data:`` objects and the raw data lines (ending in ``[DONE]``)."""
        objs, raw = [], []
        with self.client.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if not line:
                    continue
                assert line.startswith("data: "), line
                data = line[len("data: "):]
                raw.append(data)
                if data != "[DONE]":
                    objs.append(json.loads(data))
        return objs, raw

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        text = self.client.get("/metrics").text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def metric(self, name: str, **labels) -> float:
        return sum(v for (n, lbl), v in self.metrics().items()
                   if n == name and set(labels.items()) <= lbl)


def streamed_text(objs: list[dict], chat: bool) -> str:
    parts = []
    for o in objs:
        for ch in o.get("choices", []):
            parts.append((ch["delta"].get("content") or "") if chat else ch["text"])
    return "".join(parts)


@pytest.fixture(scope="module")
def engines():
    """Greedy and Jacobi lookahead on the tiny model, and a simulated lookahead engine; all
    started at once (model loading dominates), then awaited."""
    started = {
        "greedy": Engine("--model", "tiny", "--max-num-seqs", "8"),
        "jacobi": Engine("--model", "tiny", "--max-num-seqs", "8",
                         "--speculative-config", JACOBI),
        "sim": Engine("--backend", "simulate", "--model", "llama-3-8b", "--max-num-seqs", "2",
                      "--speculative-config", JACOBI, "--sim-config", SIM),
    }
    try:
        for e in started.values():
            e.wait_ready()
        yield started
    finally:
        for e in started.values():
            e.stop()


# ---------------------------------------------------------------------------------------------
def test_health_models_and_startup_log(engines):
    g = engines["greedy"]
    assert g.client.get("/health").json() == {"status": "ok"}
    models = g.client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    assert engines["sim"].client.get("/v1/models").json()["data"][0]["id"] == "llama-3-8b"
    # readiness: /health said 503 "loading" while the model loaded, and 200 only after
    assert (503, "loading") in g.health_seen and g.health_seen[-1] == (200, "ok")
    assert g.health_seen.index((200, "ok")) > g.health_seen.index((503, "loading"))
    starting = [line for line in g.output().splitlines() if "engine starting:" in line]
    assert len(starting) == 1
    config = json.loads(starting[0].split("engine starting: ", 1)[1])
    assert config["model"] == "tiny" and config["port"] == g.port


def test_completion_and_chat_streaming_and_not(engines):
    g = engines["greedy"]
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
    full = g.complete(**body)
    assert full["object"] == "text_completion" and full["model"] == "tiny"
    choice = full["choices"][0]
    assert choice["finish_reason"] in ("length", "stop")
    assert full["usage"]["completion_tokens"] == 12 or choice["finish_reason"] == "stop"
    assert full["usage"]["total_tokens"] == (full["usage"]["prompt_tokens"]
                                             + full["usage"]["completion_tokens"])

    objs, raw = g.stream(**body, stream_options={"include_usage": True})
    assert raw[-1] == "[DONE]"
    assert streamed_text(objs, chat=False) == choice["text"]
    assert objs[-1]["choices"] == [] and objs[-1]["usage"] == full["usage"]
    assert objs[-2]["choices"][0]["finish_reason"] == choice["finish_reason"]

    objs, raw = g.stream(**body)  # without include_usage: no usage chunk
    assert raw[-1] == "[DONE]" and all("usage" not in o for o in objs)

    chat = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 10}
    full = g.complete("/v1/chat/completions", **chat)
    assert full["object"] == "chat.completion"
    msg = full["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    objs, raw = g.stream("/v1/chat/completions", **chat,
                         stream_options={"include_usage": True})
    assert raw[-1] == "[DONE]"
    assert objs[0]["object"] == "chat.completion.chunk"
    assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed_text(objs, chat=True) == msg["content"]
    assert objs[-1]["usage"] == full["usage"]


def test_stop_strings_cut_the_text(engines):
    g = engines["greedy"]
    text = g.complete(prompt=PROMPTS[1], max_tokens=24)["choices"][0]["text"]
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    cut = g.complete(prompt=PROMPTS[1], max_tokens=24, stop=[stop])
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[:text.index(stop)]
    objs, _ = g.stream(prompt=PROMPTS[1], max_tokens=24, stop=stop)
    assert streamed_text(objs, chat=False) == cut["choices"][0]["text"]


def test_lookahead_produces_the_greedy_tokens(engines):
    g, j = engines["greedy"], engines["jacobi"]
    want = []
    for p in PROMPTS:
        r = g.complete(prompt=p, max_tokens=24)
        want.append((r["choices"][0]["text"], r["usage"]))
    for p, (text, usage) in zip(PROMPTS, want):
        r = j.complete(prompt=p, max_tokens=24)
        assert (r["choices"][0]["text"], r["usage"]) == (text, usage)
    objs, _ = j.stream(prompt=PROMPTS[0], max_tokens=24, stream_options={"include_usage": True})
    assert (streamed_text(objs, chat=False), objs[-1]["usage"]) == want[0]
    # batched: all prompts at once through the lookahead engine
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: j.complete(prompt=p, max_tokens=24), PROMPTS))
    assert [(r["choices"][0]["text"], r["usage"]) for r in got] == want


BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", [1, 2], 400, None),
    ("/v1/completions", {"max_tokens": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "stop": 7}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "temperature": 0.8}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "ignore_eos": True}, 400, "ignore_eos"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_tokens": -1}, 400, "max_tokens"),
]


@pytest.mark.parametrize("which", ["greedy", "jacobi"])
def test_bad_requests_get_4xx_naming_the_param_and_the_server_keeps_serving(engines, which):
    e = engines[which]
    for path, body, status, param in BAD_REQUESTS:
        if isinstance(body, bytes):
            r = e.client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = e.client.post(path, json=body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
        assert err["message"]
    r = e.client.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = e.client.post("/v1/nothing", json={})
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = e.client.post("/v1/completions", json={"prompt": "hi", "temperature": 0.8})
    if which == "jacobi":
        assert "lookahead" in r.json()["error"]["message"]
    assert e.complete(prompt="still serving", max_tokens=3)["usage"]["completion_tokens"] >= 1
    assert e.health() == 200


def exposed_names(e: Engine) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0]
            for line in e.client.get("/metrics").text.splitlines()
            if line and not line.startswith("#")}


def test_metrics_are_vllms_and_count_what_clients_received(engines):
    expected = set(VLLM_COUNTERS) | set(VLLM_GAUGES) | {"lookahead_engine_info"}
    for h in VLLM_HISTOGRAMS:
        expected |= {f"{h}_bucket", f"{h}_sum", f"{h}_count"}
    for name, e in engines.items():
        assert exposed_names(e) == expected, name
        for (metric, labels), _ in e.metrics().items():
            d = dict(labels)
            assert d["engine"] == "0" and d["model_name"] == e.client.get(
                "/v1/models").json()["data"][0]["id"], metric

    for name in ("greedy", "jacobi"):
        e = engines[name]
        before = e.metrics()

        def delta(metric: str, **labels) -> float:
            now = e.metrics()
            return sum(v - before.get((n, lbl), 0.0) for (n, lbl), v in now.items()
                       if n == metric and set(labels.items()) <= lbl)

        usages = []
        for p in PROMPTS[:2]:
            usages.append(e.complete(prompt=p, max_tokens=16)["usage"])
            objs, _ = e.stream(prompt=p, max_tokens=12, stream_options={"include_usage": True})
            usages.append(objs[-1]["usage"])
        gen = sum(u["completion_tokens"] for u in usages)
        assert delta("vllm:generation_tokens_total") == gen
        assert delta("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
        assert delta("vllm:request_success_total") == len(usages)
        assert delta("vllm:e2e_request_latency_seconds_count") == len(usages)
        # per-token ITL: one observation per token after each request's first
        assert delta("vllm:inter_token_latency_seconds_count") == gen - len(usages)
        assert delta("vllm:time_to_first_token_seconds_count") == len(usages)
        drafts = delta("vllm:spec_decode_num_drafts_total")
        draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total")
        accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
        if name == "greedy":
            assert drafts == draft_tokens == accepted == 0
        else:
            assert drafts > 0 and draft_tokens > 0 and accepted > 0, (drafts, accepted)
            assert accepted <= draft_tokens
        assert e.metric("vllm:num_requests_running") == 0
        assert e.metric("vllm:num_requests_waiting") == 0

    info = engines["jacobi"].metrics()
    assert any(n == "lookahead_engine_info" and {("method", "jacobi"), ("window", "5"),
                                                  ("ngram", "3"), ("guess_set", "5")} <= lbl
               for (n, lbl) in info)
    assert engines["greedy"].metric("lookahead_engine_info", method="greedy") == 1


def test_simulated_backend_queues_beyond_max_num_seqs_and_speculates(engines):
    s = engines["sim"]
    assert s.metric("lookahead_engine_info", backend="simulate", method="jacobi") == 1
    waiting_seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            waiting_seen.append(s.metric("vllm:num_requests_waiting"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(5) as pool:
            got = list(pool.map(
                lambda i: s.complete(prompt=f"the time of day {i}", max_tokens=60), range(5)))
    finally:
        stop.set()
        watcher.join()
    assert all(r["usage"]["completion_tokens"] == 60 for r in got)
    assert all(len(r["choices"][0]["text"].split()) == 60 for r in got)
    assert max(waiting_seen) >= 1  # 5 requests, 2 slots
    assert s.metric("vllm:spec_decode_num_accepted_tokens_total") > 0
    assert s.metric("vllm:generation_tokens_total") >= 300
    # Per-token latency as observed matches the simulator's step time per token, not per step.
    itl = s.metric("vllm:inter_token_latency_seconds_sum") / s.metric(
        "vllm:inter_token_latency_seconds_count")
    assert 0.001 < itl < 0.05, itl


def test_sigterm_drains_an_in_flight_stream_then_exits_0():
    # ~8 ms a step at time_scale 1; 250 greedy tokens keep the stream busy for ~2 s.
    e = Engine("--backend", "simulate", "--model", "llama-3-8b", "--sim-config", SIM)
    try:
        e.wait_ready()
        chunks: list[dict] = []
        raw: list[str] = []
        first = threading.Event()

        def consume():
            with e.client.stream("POST", "/v1/completions",
                                 json={"prompt": "a long answer", "max_tokens": 250,
                                       "stream": True,
                                       "stream_options": {"include_usage": True}}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        raw.append(line[6:])
                        if line[6:] != "[DONE]":
                            chunks.append(json.loads(line[6:]))
                            first.set()

        t = threading.Thread(target=consume)
        t.start()
        assert first.wait(30), e.output()
        e.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: e.health() == 503, 10, "/health to turn 503 while draining", interval=0.05)
        r = e.client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["message"]
        assert e.proc.poll() is None, "exited before the in-flight stream finished"
        t.join(60)
        assert raw[-1] == "[DONE]"
        assert chunks[-1]["usage"]["completion_tokens"] == 250
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert e.proc.wait(20) == 0, e.output()
        assert "draining" in e.output()
    finally:
        e.stop()


def test_a_client_that_goes_away_frees_its_batch_slot(engines):
    s = engines["sim"]
    aborted = s.metric("vllm:request_success_total", finished_reason="abort")
    with s.client.stream("POST", "/v1/completions",
                         json={"prompt": "go on", "max_tokens": 2000, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one chunk, then hang up
    wait_until(lambda: s.metric("vllm:request_success_total", finished_reason="abort") > aborted,
               10, "the abandoned request to be aborted", interval=0.05)
    wait_until(lambda: s.metric("vllm:num_requests_running") == 0, 10, "the slot to be freed", interval=0.05)
    assert s.complete(prompt="next", max_tokens=3)["usage"]["completion_tokens"] == 3


def test_sigterm_while_the_model_loads_exits_0_at_once():
    e = Engine("--model", "tiny")
    try:
        wait_until(lambda: e.health() == 503, 30, "the server to listen while loading", interval=0.05)
        assert e.health_seen[-1] == (503, "loading")
        r = e.client.post("/v1/completions", json={"prompt": "early", "max_tokens": 2})
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        e.proc.send_signal(signal.SIGTERM)
        assert e.proc.wait(15) == 0, e.output()
    finally:
        e.stop()


def test_the_load_generator_stops_at_once_on_sigterm(engines):
    """A deleted load Job's pod gets SIGTERM; its load must stop then, not at the kubelet's SIGKILL
    after the grace period (in a container the load generator is PID 1, which ignores signals it
    has no handler for), or it would drive the engine on top of the next step's load."""
    e = engines["sim"]
    proc = subprocess.Popen([sys.executable, "-m", "lookahead_canary.loadgen", "--url", e.url, "--concurrency", "2",
                             "--step-duration", "120s", "--prompts", "chat", "--json"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # one finished request: the load is running
        assert '"type": "request"' in first, (first, proc.stderr.read() if proc.poll() is not None else "")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
        assert time.monotonic() - t0 < 5 and code != 0, code
        assert "stopped by a signal" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _FleetPods:
    """What ``observe.running_version`` reads from the cluster, for a fleet whose one pod is the
    engine process here (pod IP 127.0.0.1): the pods of a Deployment, ready."""

    def __init__(self, port: int):
        self.port = port

    def pods(self, namespace: str, selector: dict | None) -> list[dict]:
        return [{"metadata": {"name": "chat-a-xyz", "namespace": namespace, "uid": f"pod-{self.port}"},
                 "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": self.port}]}]},
                 "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}]


def _fleet(port: int, image: str, *flags: str) -> dict:
    container = {"name": "engine", "image": image,
                 "command": ["python3", "-m", "lookahead_canary.server", "--port", str(port), *flags],
                 "ports": [{"name": "http", "containerPort": port}]}
    return {"metadata": {"name": "chat", "namespace": "serving"},
            "spec": {"selector": {"matchLabels": {"app": "chat"}},
                     "template": {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": [container]}}}}


def test_version_answers_like_vllm_and_the_operator_reads_it_from_the_pod():
    """``GET /version`` answers ``{"version": <the package's>}`` (vLLM's shape), before the model
    is loaded too; ``--report-version`` answers another release. The operator's reader
    (``observe.running_version``) gets it over HTTP from the engine's port; a fleet presenting
    vLLM whose image tag says v0.33.0 but whose engine says 0.20.1 is refused regime-aware."""
    from importlib.metadata import version as package_version

    from lookahead_operator import engines as adapters
    from lookahead_operator.controller import observe

    own = Engine("--backend", "simulate", "--model", "llama-3-8b")
    old = Engine("--backend", "simulate", "--model", "llama-3-8b", "--report-version", "0.20.1")
    try:
        for e in (own, old):
            e.wait_ready()
        r = own.client.get("/version")
        assert r.status_code == 200 and r.json() == {"version": package_version("lookahead-rollout")}
        assert old.client.get("/version").json() == {"version": "0.20.1"}

        d = _fleet(own.port, "ghcr.io/lookahead-rollout/lookahead-rollout:0.1.0")
        ran = observe.running_version(_FleetPods(own.port), d, "reference")
        assert (ran.text, ran.pod, ran.path, ran.error) == (package_version("lookahead-rollout"), "serving/chat-a-xyz",
                                                            "/version", None)
        ngram = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}
        assert adapters.support_problems(d["spec"]["template"], "reference", ngram, True, ran) == []

        d = _fleet(old.port, "vllm/vllm-openai:v0.33.0", "--report-version", "0.20.1")
        ran = observe.running_version(_FleetPods(old.port), d, "vllm")
        assert ran.text == "0.20.1" and ran.error is None
        problems = adapters.support_problems(d["spec"]["template"], "vllm", ngram, True, ran)
        assert problems and problems[0].startswith(
            "vllm /version of pod serving/chat-a-xyz says 0.20.1; the image tag says 0.33.0; "
            "spec.lookahead.engineVersion is not set: regime-aware promotion needs vLLM 0.24.0+"), problems
    finally:
        own.stop()
        old.stop()


NO_TORCH = ("import runpy, sys\n"
            "sys.modules['torch'] = sys.modules['transformers'] = None   # unimportable, as in the engine image\n"
            "sys.argv[0] = 'lookahead_canary.server'\n"
            "runpy.run_module('lookahead_canary.server', run_name='__main__', alter_sys=True)\n")


def test_the_engine_image_runtime_serves_smollm2_without_torch_as_torch_does():
    """``--runtime numpy`` (what the engine image runs: no torch, no transformers) answers the
    same chat request with the same greedy text, token counts and lookahead result as the torch
    runtime on the same converted SmolLM2 weights."""
    # the same server, started through a shim that makes torch and transformers unimportable
    numpy_engine = Engine("--model", "smollm2", "--runtime", "numpy", "--max-num-seqs", "4",
                          "--speculative-config", JACOBI, launcher=("-c", NO_TORCH))
    torch_engine = Engine("--model", "smollm2", "--runtime", "torch", "--max-num-seqs", "4")
    try:
        numpy_engine.wait_ready(180)
        torch_engine.wait_ready(180)
        messages = [{"role": "user", "content": "Write a Python function that returns the square of x."}]
        got = numpy_engine.complete("/v1/chat/completions", messages=messages, max_tokens=32)
        want = torch_engine.complete("/v1/chat/completions", messages=messages, max_tokens=32)
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert got["usage"] == want["usage"] and want["usage"]["completion_tokens"] > 0
        assert "Traceback" not in numpy_engine.output()
    finally:
        numpy_engine.stop()
        torch_engine.stop()
