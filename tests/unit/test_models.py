"""load_model on the tiny random model and the chat template helper (no SmolLM2 weights needed
beyond its tokenizer, which is read from the GGUF once and cached)."""
from __future__ import annotations

import pytest
import torch

from lookahead_canary.models import chat_prompt, eos_ids, load_model, smollm2_gguf_path


def test_tiny_is_a_deterministic_llama_with_smollm2_tokenizer():
    m1, tok = load_model("tiny")
    m2, _ = load_model("tiny")
    assert type(m1).__name__ == "LlamaForCausalLM"
    assert m1.config.vocab_size == len(tok) == 49152
    assert not m1.training
    assert all(not p.requires_grad for p in m1.parameters())
    for (n1, p1), (n2, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    ids = chat_prompt(tok, "hello")
    with torch.inference_mode():
        logits = m1(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))
    assert torch.isfinite(logits).all()


def test_chat_prompt_uses_template():
    _, tok = load_model("tiny")
    ids = chat_prompt(tok, "What is 2+2?")
    text = tok.decode(ids)
    assert "What is 2+2?" in text
    assert text.rstrip().endswith("assistant")
    assert 2 in eos_ids(*load_model("tiny"))


def test_gguf_file_is_found():
    p = smollm2_gguf_path()
    assert p.name.endswith(".gguf") and p.stat().st_size > 50_000_000


def test_unknown_spec_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        load_model(str(tmp_path / "nope"))


def test_tiny_dtype():
    m, _ = load_model("tiny", dtype=torch.bfloat16)
    assert next(m.parameters()).dtype == torch.bfloat16
