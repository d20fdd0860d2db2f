"""The numpy Llama (``nplm.NumpyLlama``) against transformers' own: the same logits, and every
decoder of ``decoding.py`` produces transformers' greedy continuation on it, batched, joining
midway and speculating; and the decoders run it with no torch in the process."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from lookahead_canary.decoding import GreedyDecoder
from lookahead_canary.nplm import NumpyLlama

from .test_decoding import DECODERS, reference, repetitive_prompt, run, tiny, prompts  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def np_tiny(tiny):  # noqa: F811
    m, tok = tiny
    return NumpyLlama.from_torch(m), m, tok


def _logits_np(npm: NumpyLlama, ids: list[int]) -> np.ndarray:
    dec = GreedyDecoder(npm, eos_token_ids=[])
    n = len(ids)
    r = dec.runner
    r.store.ensure(1, n)
    pos = np.arange(n)[None]
    h = r._hidden(np.asarray([ids]), pos, np.tril(np.ones((n, n), dtype=bool))[None], np.array([[0]]), pos)
    return npm.logits(h)[0]


def test_logits_match_transformers(np_tiny, prompts):  # noqa: F811
    npm, m, _ = np_tiny
    for p in prompts[:3]:
        with torch.inference_mode():
            want = m(torch.tensor([p])).logits[0].float().numpy()
        got = _logits_np(npm, p)
        assert np.abs(got - want).max() < 1e-4
        assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_decoder_is_exact_on_numpy_batched_and_joining_midway(np_tiny, prompts, name):  # noqa: F811
    npm, m, _ = np_tiny
    n = 20
    refs = {str(i): reference(m, p, n) for i, p in enumerate(prompts)}
    outs, _ = run(DECODERS[name](npm), prompts, n, join_after=5)
    assert outs == refs


@pytest.mark.parametrize("name", ["lookahead+pl", "prompt_lookup"])
def test_speculation_accepts_drafts_on_numpy(np_tiny, name):
    npm, m, tok = np_tiny
    p = repetitive_prompt(m, tok)
    outs, stats = run(DECODERS[name](npm), [p], 40)
    assert outs["0"] == reference(m, p, 40)
    assert stats["accepted"] > 0 and stats["steps"] < 40, stats


def test_from_safetensors_reads_a_saved_model(np_tiny, prompts, tmp_path):  # noqa: F811
    npm, m, _ = np_tiny
    m.save_pretrained(str(tmp_path))
    loaded = NumpyLlama.from_safetensors(tmp_path)
    assert np.array_equal(_logits_np(loaded, prompts[1]), _logits_np(npm, prompts[1]))


def test_the_decoders_run_numpy_without_torch():
    code = textwrap.dedent("""
        import sys
        from types import SimpleNamespace
        import numpy as np
        from lookahead_canary.decoding import make_decoder
        from lookahead_canary.nplm import NumpyLlama
        cfg = SimpleNamespace(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                              intermediate_size=32, rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=50,
                              tie_word_embeddings=True, eos_token_id=None)
        rng = np.random.default_rng(0)
        t = {"model.embed_tokens.weight": rng.normal(size=(50, 16)), "model.norm.weight": np.ones(16)}
        for i in range(2):
            p = f"model.layers.{i}."
            for name, shape in (("self_attn.q_proj", (16, 16)), ("self_attn.k_proj", (8, 16)),
                                ("self_attn.v_proj", (8, 16)), ("self_attn.o_proj", (16, 16)),
                                ("mlp.gate_proj", (32, 16)), ("mlp.up_proj", (32, 16)), ("mlp.down_proj", (16, 32))):
                t[p + name + ".weight"] = rng.normal(size=shape) * 0.3
            t[p + "input_layernorm.weight"] = np.ones(16)
            t[p + "post_attention_layernorm.weight"] = np.ones(16)
        m = NumpyLlama.from_state_dict(cfg, t)
        outs = {}
        for spec in (None, {"method": "jacobi", "window": 3, "ngram": 3, "guess_set": 2}, {"method": "ngram"}):
            d = make_decoder(m, spec)
            d.add("a", [1, 2, 3, 4, 1, 2, 3], 12)
            toks = []
            while d.active:
                toks += d.step()["a"].new_tokens
            outs[str(spec)] = toks
        assert len(set(map(tuple, outs.values()))) == 1, outs
        assert "torch" not in sys.modules, "torch was imported"
        print("ok", len(toks))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("ok 12"), res.stdout + res.stderr
