"""A transformers-compatible tokenizer for the engine image, from ``tokenizers`` and ``jinja2``.

The engine image runs ``nplm.NumpyLlama`` without torch; transformers would still be the obvious
way to tokenize, but it brings about 300 MB of packages (hub clients, kernels, CLIs) into the
image for two calls. Underneath, transformers' fast tokenizer *is* ``tokenizers.Tokenizer`` (the
model's ``tokenizer.json``) and its chat templates are rendered by ``jinja2`` in a sandbox with
``trim_blocks``/``lstrip_blocks``: ``ChatTokenizer`` does the same with those two libraries, for
the part of the tokenizer API the engine uses (``encode``, ``decode``, ``__call__``,
``apply_chat_template``, the special token ids). ``tests/unit/canary/test_tokenizer.py`` checks
it gives transformers' own ids and text on every builtin prompt.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ChatTokenizer"]


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    """``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``) of a model directory."""

    def __init__(self, directory: str | Path):
        from tokenizers import Tokenizer

        d = Path(directory)
        self._tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template = d / "chat_template.jinja"
        self.chat_template: str | None = template.read_text() if template.exists() else cfg.get("chat_template")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.pad_token = _token_text(cfg.get("pad_token"))
        self.bos_token_id = self._id(self.bos_token)
        self.eos_token_id = self._id(self.eos_token)
        self.pad_token_id = self._id(self.pad_token)
        self._template = None

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tokenize: bool = True) -> "list[int] | str":
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str):
                raise ValueError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                     pad_token=self.pad_token or "")
        # as transformers: the template writes the special tokens itself
        return self.encode(text, add_special_tokens=False) if tokenize else text
