"""Exactness and interface tests of the batch decoders on the tiny random Llama (a real model)."""
from __future__ import annotations

import pytest
import torch

from lookahead_canary.decoding import (
    BatchDecoder,
    GreedyDecoder,
    JacobiLookaheadDecoder,
    PromptLookupDecoder,
    StepOutput,
    make_decoder,
)
from lookahead_canary.models import chat_prompt, load_model

TEXTS = [
    "hello there",
    "write a python function to add two numbers and print the result twice",
    "What is the capital of France? Answer in one word.",
    "def add(a, b):\n    return a + b\n\nAdd type hints to this function.",
    "Summarize: the cat sat on the mat. The cat sat on the mat again.",
    "x",
    "Tell me a long story about a robot who learns to paint, with three chapters.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("tiny")


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [chat_prompt(tok, t) for t in TEXTS]


_REF: dict = {}


def reference(model, prompt, n):
    """Greedy continuation by transformers' own generate (no EOS stop); memoised per prompt."""
    key = (id(model), tuple(prompt))
    have = _REF.get(key)
    if have is not None and len(have) >= n:
        return have[:n]
    _REF[key] = _generate(model, prompt, max(n, 40))
    return _REF[key][:n]


def _generate(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n, min_new_tokens=n, do_sample=False,
        )
    return out[0, len(prompt):].tolist()


def run(dec, prompts, n, join_after=None, speculate=True):
    """Decode all prompts; with join_after=k, the second half joins after k steps."""
    outs = {str(i): [] for i in range(len(prompts))}
    stats = {"steps": 0, "draft": 0, "accepted": 0}
    first = prompts if join_after is None else prompts[: len(prompts) // 2]
    for i, p in enumerate(first):
        assert dec.add(str(i), p, n) >= 0.0
    joined = join_after is None
    while dec.active or not joined:
        if not joined and stats["steps"] >= join_after:
            for i in range(len(prompts) // 2, len(prompts)):
                dec.add(str(i), prompts[i], n)
            joined = True
        res = dec.step(speculate=speculate)
        stats["steps"] += 1
        for k, o in res.items():
            assert isinstance(o, StepOutput)
            if not o.finished:
                assert len(o.new_tokens) == o.accepted_draft_tokens + 1
            assert 0 <= o.accepted_draft_tokens <= o.draft_tokens
            assert len(o.new_tokens) >= 1
            outs[k] += o.new_tokens
            stats["draft"] += o.draft_tokens
            stats["accepted"] += o.accepted_draft_tokens
    return outs, stats


DECODERS = {
    "greedy": lambda m: GreedyDecoder(m, eos_token_ids=[]),
    "lookahead": lambda m: JacobiLookaheadDecoder(m, window=4, ngram=4, guess_set=4, eos_token_ids=[]),
    "lookahead+pl": lambda m: JacobiLookaheadDecoder(
        m, window=3, ngram=3, guess_set=3, prompt_lookup_tokens=6, eos_token_ids=[]),
    "lookahead+pl-adaptive": lambda m: JacobiLookaheadDecoder(
        m, window=3, ngram=4, guess_set=2, prompt_lookup_tokens=12, window_with_draft=False,
        adaptive_draft=True, eos_token_ids=[]),
    "lookahead-noseed": lambda m: JacobiLookaheadDecoder(
        m, window=5, ngram=5, guess_set=2, pool_from_prompt=False, eos_token_ids=[]),
    "prompt_lookup": lambda m: PromptLookupDecoder(m, 4, 2, 5, eos_token_ids=[]),
    "prompt_lookup_k8": lambda m: PromptLookupDecoder(m, 8, 1, 3, eos_token_ids=[]),
}


def test_interface(tiny):
    m, _ = tiny
    for make in DECODERS.values():
        assert isinstance(make(m), BatchDecoder)


def test_greedy_matches_transformers_generate(tiny, prompts):
    m, _ = tiny
    n = 24
    outs, _ = run(GreedyDecoder(m, eos_token_ids=[]), prompts[:3], n)
    for i in range(3):
        assert outs[str(i)] == reference(m, prompts[i], n)


@pytest.mark.parametrize("name", list(DECODERS))
def test_batch1_exact(tiny, prompts, name):
    m, _ = tiny
    n = 30
    for i in (1, 3):
        outs, _ = run(DECODERS[name](m), [prompts[i]], n)
        assert outs["0"] == reference(m, prompts[i], n), name


@pytest.mark.parametrize("name", list(DECODERS))
def test_batch8_mixed_lengths_joining_midway(tiny, prompts, name):
    m, _ = tiny
    n = 20
    ref, _ = run(GreedyDecoder(m, eos_token_ids=[]), [prompts[0]], n)  # sanity of the harness
    assert ref["0"] == reference(m, prompts[0], n)
    refs = {str(i): reference(m, p, n) for i, p in enumerate(prompts)}
    outs, _ = run(DECODERS[name](m), prompts, n, join_after=5)
    assert outs == refs


def repetitive_prompt(m, tok):
    """prompt + its own greedy continuation + prompt again: n-gram drafts have something to match."""
    p = chat_prompt(tok, TEXTS[1])
    cont = reference(m, p, 30)
    return p + cont + p


@pytest.mark.parametrize("name", ["lookahead", "lookahead+pl", "lookahead+pl-adaptive", "prompt_lookup",
                                  "prompt_lookup_k8"])
def test_speculation_accepts_drafts_and_stays_exact(tiny, name):
    m, tok = tiny
    p = repetitive_prompt(m, tok)
    n = 40
    dec = DECODERS[name](m)
    outs, stats = run(dec, [p], n)
    assert outs["0"] == reference(m, p, n)
    assert stats["draft"] > 0
    assert stats["accepted"] > 0, stats  # the verification/compaction path really ran
    assert stats["steps"] < n


def test_speculate_false_takes_plain_greedy_steps(tiny, prompts):
    m, _ = tiny
    n = 12
    dec = JacobiLookaheadDecoder(m, eos_token_ids=[])
    outs, stats = run(dec, prompts[:4], n, speculate=False)
    assert stats["draft"] == 0 and stats["accepted"] == 0
    assert stats["steps"] == n
    assert outs == {str(i): reference(m, prompts[i], n) for i in range(4)}


def test_switching_speculation_on_and_off_stays_exact(tiny, prompts):
    m, tok = tiny
    n = 30
    ps = [repetitive_prompt(m, tok), prompts[2], prompts[4]]
    for dec in (JacobiLookaheadDecoder(m, eos_token_ids=[], prompt_lookup_tokens=5),
                PromptLookupDecoder(m, eos_token_ids=[])):
        outs = {str(i): [] for i in range(len(ps))}
        for i, p in enumerate(ps):
            dec.add(str(i), p, n)
        k = 0
        while dec.active:
            for sid, o in dec.step(speculate=(k % 3 != 1)).items():
                outs[sid] += o.new_tokens
            k += 1
        assert outs == {str(i): reference(m, p, n) for i, p in enumerate(ps)}


def test_remove_midway_leaves_others_exact(tiny, prompts):
    m, _ = tiny
    n = 16
    for make in (DECODERS["greedy"], DECODERS["lookahead"], DECODERS["prompt_lookup"]):
        dec = make(m)
        outs = {str(i): [] for i in range(5)}
        for i in range(5):
            dec.add(str(i), prompts[i], n)
        for k in range(40):
            if k == 3:
                dec.remove("1")  # a cancelled request in the middle of the batch
                dec.remove("nope")  # unknown ids are ignored
            if not dec.active:
                break
            for sid, o in dec.step().items():
                outs[sid] += o.new_tokens
        assert dec.active == 0
        for i in (0, 2, 3, 4):
            assert outs[str(i)] == reference(m, prompts[i], n)


def test_max_new_tokens_and_eos(tiny, prompts):
    m, _ = tiny
    ref = reference(m, prompts[3], 20)
    eos = ref[7]
    stop = ref.index(eos)
    for make in (GreedyDecoder, JacobiLookaheadDecoder, PromptLookupDecoder):
        dec = make(m, eos_token_ids=[eos])
        dec.add("a", prompts[3], 20)
        dec.add("b", prompts[3], 3)
        got = {"a": [], "b": []}
        finished = set()
        while dec.active:
            for sid, o in dec.step().items():
                assert sid not in finished
                got[sid] += o.new_tokens
                if o.finished:
                    finished.add(sid)
        assert got["a"] == ref[: stop + 1]
        assert got["b"] == ref[: min(3, stop + 1)]
        assert finished == {"a", "b"}
        assert dec.step() == {}


def test_errors(tiny, prompts):
    m, _ = tiny
    with pytest.raises(ValueError, match="temperature"):
        JacobiLookaheadDecoder(m, temperature=0.7)
    with pytest.raises(ValueError, match="temperature"):
        PromptLookupDecoder(m, temperature=1.0)
    dec = GreedyDecoder(m, max_batch_size=2)
    dec.add("a", prompts[0], 4)
    with pytest.raises(ValueError):
        dec.add("a", prompts[0], 4)
    with pytest.raises(ValueError):
        dec.add("b", [], 4)
    with pytest.raises(ValueError):
        dec.add("b", prompts[0], 0)
    dec.add("b", prompts[0], 4)
    with pytest.raises(RuntimeError):
        dec.add("c", prompts[0], 4)
    with pytest.raises(ValueError):
        make_decoder(m, {"method": "medusa"})
    with pytest.raises(ValueError, match="bad speculative config"):
        make_decoder(m, {"method": "jacobi", "windw": 3})


def test_make_decoder(tiny):
    m, _ = tiny
    assert isinstance(make_decoder(m, None), GreedyDecoder)
    d = make_decoder(m, {"method": "jacobi", "window": 7, "ngram": 5, "guess_set": 7})
    assert isinstance(d, JacobiLookaheadDecoder) and (d.W, d.N, d.G) == (7, 5, 7)
    d = make_decoder(m, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                         "prompt_lookup_max": 4})
    assert isinstance(d, PromptLookupDecoder) and (d.k, d.nmin, d.nmax) == (3, 1, 4)


def test_batch_of_32(tiny, prompts):
    m, _ = tiny
    n = 6
    ps = [prompts[i % len(prompts)] + [100 + i] for i in range(32)]
    dec = JacobiLookaheadDecoder(m, window=3, ngram=3, guess_set=2, prompt_lookup_tokens=3, eos_token_ids=[])
    outs, _ = run(dec, ps, n)
    for i in (0, 13, 31):
        assert outs[str(i)] == reference(m, ps[i], n)
