"""The batching loop: per-token finishing, stop strings, queueing, the regime-aware switch,
cancellation, metrics bookkeeping, and the simulated decoder.

``ScriptedDecoder`` is a small deterministic BatchDecoder (every sequence's continuation is a
fixed script; ``k`` tokens per step) so the loop's bookkeeping can be checked exactly; the real
decoders are exercised through the server in tests/integration/test_engine_server.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from lookahead_canary.decoding import StepOutput
from lookahead_canary.metrics import EngineMetrics
from lookahead_canary.scheduler import (
    FinishEvent,
    GenerationRequest,
    IncrementalDetokenizer,
    Scheduler,
    SimTokenizer,
    SimulatedDecoder,
    StopMatcher,
    TokenEvent,
)
from lookahead_canary.simulator import RooflineSimulator, SimConfig

WORDS = ["<eos>", "a", "b", "c", "STOP", "d", "e", "\u00e9"]
EOS = 0


class WordTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(WORDS[i] for i in ids if not (skip_special_tokens and i == EOS))


class ScriptedDecoder:
    """Every sequence continues with ``script``; ``k`` tokens a step while speculating."""

    def __init__(self, script, k=1, step_seconds=0.0):
        self.script, self.k, self.step_seconds = list(script), k, step_seconds
        self.seqs: dict[str, list] = {}
        self.speculate_calls: list[tuple[int, bool]] = []
        self.lock = threading.Lock()

    @property
    def active(self):
        return len(self.seqs)

    def add(self, seq_id, prompt_ids, max_new_tokens):
        self.seqs[seq_id] = [0, max_new_tokens]
        return 0.0

    def remove(self, seq_id):
        self.seqs.pop(seq_id, None)

    def step(self, speculate=True):
        self.speculate_calls.append((len(self.seqs), speculate))
        if self.step_seconds:
            time.sleep(self.step_seconds)
        out = {}
        for sid, st in list(self.seqs.items()):
            k = self.k if speculate else 1
            k = min(k, st[1] - st[0], len(self.script) - st[0])
            toks = self.script[st[0]:st[0] + k]
            st[0] += k
            done = st[0] >= st[1] or EOS in toks
            out[sid] = StepOutput(toks, (self.k - 1) if speculate else 0,
                                  (k - 1) if speculate else 0, done)
            if done:
                self.seqs.pop(sid)
        return out


class Collector:
    def __init__(self):
        self.events = []
        self.done = threading.Event()

    def __call__(self, ev):
        self.events.append(ev)
        if isinstance(ev, FinishEvent):
            self.done.set()

    @property
    def text(self):
        return "".join(e.text for e in self.events if isinstance(e, (TokenEvent, FinishEvent)))

    @property
    def finish(self) -> FinishEvent:
        return [e for e in self.events if isinstance(e, FinishEvent)][0]

    @property
    def chunks(self):
        return [e for e in self.events if isinstance(e, TokenEvent)]


def run(decoder, requests, **kw):
    metrics = EngineMetrics("m", max_num_seqs=kw.get("max_num_seqs", 8))
    sched = Scheduler(decoder, WordTokenizer(), metrics, eos_token_ids=[EOS], **kw)
    sched.start()
    cols = []
    for i, (max_tokens, stop) in enumerate(requests):
        c = Collector()
        sched.submit(GenerationRequest(f"r{i}", [1, 2], max_tokens, c, stop=stop))
        cols.append(c)
    for c in cols:
        assert c.done.wait(10), "request did not finish"
    sched.stop()
    return cols, metrics


def counter(metrics, name, **labels):
    from prometheus_client.parser import text_string_to_metric_families

    want = {"model_name": "m", "engine": "0", **labels}
    for fam in text_string_to_metric_families(metrics.render()[0].decode()):
        for s in fam.samples:
            if s.name == name and s.labels == want:
                return s.value
    raise KeyError(name)


SCRIPT = [1, 2, 3, 5, 1, 4, 6, 2, 3, 0, 5, 5]  # a b c d a STOP e b c <eos> d d


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_output_is_the_same_whatever_the_tokens_per_step(k):
    cols, metrics = run(ScriptedDecoder(SCRIPT, k=k),
                        [(20, []), (3, []), (20, ["STOP"]), (20, ["cd"])])
    eos, length, stop, stop2 = cols
    assert (eos.text, eos.finish.finish_reason, eos.finish.completion_tokens) == \
        ("abcdaSTOPebc", "stop", 10)  # EOS is counted, not shown
    assert (length.text, length.finish.finish_reason, length.finish.completion_tokens) == \
        ("abc", "length", 3)
    assert (stop.text, stop.finish.finish_reason, stop.finish.completion_tokens) == \
        ("abcda", "stop", 6)
    assert (stop2.text, stop2.finish.finish_reason, stop2.finish.completion_tokens) == \
        ("ab", "stop", 4)  # the stop string spans two tokens ("c", "d")
    gen = sum(c.finish.completion_tokens for c in cols)
    assert counter(metrics, "vllm:generation_tokens_total") == gen
    assert counter(metrics, "vllm:prompt_tokens_total") == 2 * len(cols)
    # per-token ITL: one observation per token after each request's first
    assert counter(metrics, "vllm:inter_token_latency_seconds_count") == gen - len(cols)
    assert counter(metrics, "vllm:request_success_total", finished_reason="stop") == 3
    assert counter(metrics, "vllm:request_success_total", finished_reason="length") == 1


def test_speculative_steps_stream_several_tokens_per_chunk_and_count_drafts():
    cols, metrics = run(ScriptedDecoder(SCRIPT, k=3), [(9, [])])
    assert [len(c.token_ids) for c in cols[0].chunks] == [3, 3, 3]
    assert counter(metrics, "vllm:spec_decode_num_drafts_total") == 3
    assert counter(metrics, "vllm:spec_decode_num_draft_tokens_total") == 6
    assert counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") == 6


def test_stop_string_prefix_is_held_back_until_decided():
    cols, _ = run(ScriptedDecoder([1, 2, 3, 1, 2, 3, 1, 2, 5]), [(9, ["abd"])])
    c = cols[0]
    # "ab" looks like the start of "abd" until "c" comes; the third "ab" is followed by "d"
    assert [e.text for e in c.chunks] == ["", "", "abc", "", "", "abc", "", "", ""]
    assert (c.text, c.finish.finish_reason, c.finish.completion_tokens) == ("abcabc", "stop", 9)


def test_requests_beyond_max_num_seqs_wait_and_speculation_follows_batch_size():
    dec = ScriptedDecoder([1] * 50, k=2, step_seconds=0.002)
    metrics = EngineMetrics("m", max_num_seqs=2)
    sched = Scheduler(dec, WordTokenizer(), metrics, max_num_seqs=2,
                      lookahead_max_batch_size=1, eos_token_ids=[EOS])
    cols = [Collector() for _ in range(4)]
    for i, c in enumerate(cols):  # queue all four before the loop starts
        sched.submit(GenerationRequest(f"r{i}", [1], 10 + 10 * i, c))
    assert sched.num_waiting == 4
    assert counter(metrics, "vllm:num_requests_waiting") == 4
    sched.start()
    for c in cols:
        assert c.done.wait(10)
    sched.stop()
    assert max(n for n, _ in dec.speculate_calls) == 2
    assert all(spec == (n <= 1) for n, spec in dec.speculate_calls)
    assert any(spec for _, spec in dec.speculate_calls)  # the last request ran alone
    assert [c.finish.completion_tokens for c in cols] == [10, 20, 30, 40]
    assert counter(metrics, "vllm:num_requests_waiting") == 0
    assert counter(metrics, "vllm:num_requests_running") == 0
    assert counter(metrics, "vllm:request_queue_time_seconds_count") == 4


def test_cancel_frees_the_slot_and_counts_abort():
    dec = ScriptedDecoder([1] * 10_000, step_seconds=0.001)
    metrics = EngineMetrics("m", max_num_seqs=1)
    sched = Scheduler(dec, WordTokenizer(), metrics, max_num_seqs=1, eos_token_ids=[EOS])
    sched.start()
    a, b, w = Collector(), Collector(), Collector()
    ra = GenerationRequest("a", [1], 10_000, a)
    sched.submit(ra)
    rw = GenerationRequest("w", [1], 5, w)
    sched.submit(rw)
    sched.cancel(rw)  # cancelled while waiting
    deadline = time.monotonic() + 5
    while not a.chunks and time.monotonic() < deadline:
        time.sleep(0.001)
    sched.cancel(ra)  # cancelled while running
    assert a.done.wait(5) and a.finish.finish_reason == "abort"
    sched.submit(GenerationRequest("b", [1], 3, b))
    assert b.done.wait(5) and b.finish.completion_tokens == 3
    sched.stop()
    assert dec.active == 0
    assert counter(metrics, "vllm:request_success_total", finished_reason="abort") == 2


def test_decoder_failure_fails_the_requests_but_not_the_loop():
    class Flaky(ScriptedDecoder):
        fail = True

        def step(self, speculate=True):
            if self.fail:
                self.fail = False
                raise RuntimeError("boom")
            return super().step(speculate)

    dec = Flaky([1, 2, 3])
    sched = Scheduler(dec, WordTokenizer(), EngineMetrics("m"), eos_token_ids=[EOS])
    sched.start()
    bad, good = Collector(), Collector()
    sched.submit(GenerationRequest("bad", [1], 3, bad))
    deadline = time.monotonic() + 5
    while not bad.events and time.monotonic() < deadline:
        time.sleep(0.001)
    assert "boom" in bad.events[0].message
    sched.submit(GenerationRequest("good", [1], 3, good))
    assert good.done.wait(5) and good.text == "abc"
    sched.stop()


def test_stop_matcher_and_incremental_detokenizer():
    m = StopMatcher(["###", "\n\n"])
    assert m.feed("ab#") == ("ab", False)
    assert m.feed("#") == ("", False)
    assert m.feed("x\n") == ("##x", False)
    assert m.feed("\nrest") == ("", True)

    class Bytes:  # a byte-level tokenizer: "é" is two tokens
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    d = IncrementalDetokenizer(Bytes())
    out = [d.push(b) for b in "aé!".encode()]
    assert out == ["a", "", "é", "!"]


def test_simulated_decoder_follows_the_simulator():
    sim = RooflineSimulator(SimConfig(method="jacobi", acceptance=0.6, noise_sigma=0.0,
                                      time_scale=0.01), seed=1)
    slept = []
    dec = SimulatedDecoder(sim, sleep=lambda s: (slept.append(s), time.sleep(s)))
    tok = SimTokenizer()
    assert dec.add("x", tok.encode("the quick brown fox"), 12) > 0
    dec.add("y", tok.encode("hello"), 3)
    total = {"x": [], "y": []}
    spec_steps = 0
    while dec.active:
        t0 = time.monotonic()
        out = dec.step(speculate=True)
        assert time.monotonic() - t0 >= sim.expected_step_seconds(2, True) * 0.5 or len(out) < 2
        for sid, o in out.items():
            assert 1 <= len(o.new_tokens) <= 1 + sim.config.max_draft_accepted(True)
            assert o.draft_tokens == sim.config.draft_tokens(True)
            total[sid] += o.new_tokens
            spec_steps += 1
            if o.finished:
                dec.remove(sid)
    assert len(total["x"]) == 12 and len(total["y"]) == 3
    assert tok.decode(total["x"]).count(" ") == 11
    out = {}
    dec.add("z", [1, 2], 4)
    out = dec.step(speculate=False)
    assert len(out["z"].new_tokens) == 1 and out["z"].draft_tokens == 0


def test_held_back_text_is_released_when_the_request_ends_otherwise():
    cols, _ = run(ScriptedDecoder([1, 2, 3, 0]), [(2, ["abd"]), (9, ["cx"])])
    at_length, at_eos = cols
    assert (at_length.text, at_length.finish.finish_reason) == ("ab", "length")
    assert (at_eos.text, at_eos.finish.finish_reason) == ("abc", "stop")


def test_sim_step_output_mirrors_the_decoder_interface():
    import dataclasses

    from lookahead_canary.scheduler import SimStepOutput

    assert [f.name for f in dataclasses.fields(SimStepOutput)] == \
        [f.name for f in dataclasses.fields(StepOutput)]


def test_simulated_backend_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from lookahead_canary import server; "
            "a = server.parse_args(['--backend', 'simulate']); "
            "d = server.SimulatedDecoder(server.simulator_from_args(a)); "
            "d.add('x', [1, 2], 2); d.step(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
