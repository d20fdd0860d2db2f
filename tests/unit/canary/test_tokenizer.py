"""``tokenizer.ChatTokenizer`` (tokenizers + jinja2, what the torch-free engine image tokenizes
with) against transformers' own tokenizer of the same SmolLM2 directory: the same chat-template
ids for every builtin prompt, the same plain ids, the same decoded text, the same special ids."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lookahead_canary.loadgen import BUILTIN_PROMPT_SETS
from lookahead_canary.models import SMOLLM2_CACHE_NAME, TOKENIZER_CACHE_NAME, cache_root, chat_prompt, load_smollm2_tokenizer
from lookahead_canary.tokenizer import ChatTokenizer

PROMPTS = Path(__file__).resolve().parents[3] / "canary" / "prompts"


@pytest.fixture(scope="module")
def pair():
    theirs = load_smollm2_tokenizer()   # converts the GGUF's tokenizer into the cache once
    d = next(cache_root() / "models" / n for n in (SMOLLM2_CACHE_NAME, TOKENIZER_CACHE_NAME)
             if (cache_root() / "models" / n / "tokenizer.json").exists())
    return theirs, ChatTokenizer(d)


def _messages() -> list[tuple[str, list[dict]]]:
    out = []
    for name in BUILTIN_PROMPT_SETS:
        for i, line in enumerate((PROMPTS / f"{name}.jsonl").read_text().splitlines()):
            if line.strip():
                out.append((f"{name}[{i}]", json.loads(line)["messages"]))
    return out


def test_special_tokens_and_size_match(pair):
    theirs, ours = pair
    assert len(ours) == len(theirs)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == \
        (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id)
    assert ours.eos_token_id is not None


def test_every_builtin_prompt_tokenizes_as_transformers_does(pair):
    theirs, ours = pair
    cases = _messages()
    assert len(cases) >= 30, "the bundled prompt sets"
    for where, messages in cases:
        want = chat_prompt(theirs, messages)
        assert chat_prompt(ours, messages) == want, where
        assert ours.decode(want, skip_special_tokens=True) == theirs.decode(want, skip_special_tokens=True), where
        assert ours.decode(want) == theirs.decode(want), where
        text = messages[-1]["content"]
        assert ours.encode(text) == theirs.encode(text), where
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], where


def test_a_multi_turn_chat_with_a_system_turn(pair):
    theirs, ours = pair
    messages = [{"role": "system", "content": "You answer in one line."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"}]
    assert chat_prompt(ours, messages) == chat_prompt(theirs, messages)


def test_no_chat_template_falls_back_to_plain_text(tmp_path, pair):
    theirs, _ = pair
    d = next(cache_root() / "models" / n for n in (SMOLLM2_CACHE_NAME, TOKENIZER_CACHE_NAME)
             if (cache_root() / "models" / n / "tokenizer.json").exists())
    (tmp_path / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes())
    ours = ChatTokenizer(tmp_path)
    assert ours.chat_template is None and ours.eos_token_id is None
    assert chat_prompt(ours, "hi") == theirs("user: hi\nassistant:")["input_ids"]
