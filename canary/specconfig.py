"""The reference engine's ``--speculative-config``: one model, shared by the engine server (which
parses it) and the operator's engine adapter (which renders it), so the two cannot disagree on a
key, a default or a bound.

    parse('{"method":"jacobi","window":7,"ngram":5,"guess_set":7}')   # -> dict with every default
    render(JacobiConfig(window=3, ngram=4, guess_set=2))              # -> compact JSON, set keys only

The shape follows vLLM's (``method`` plus flat keys); ``ngram`` is vLLM's prompt-lookup method,
``jacobi`` is lookahead decoding (W = window, N = ngram, G = guess_set).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, TypeAdapter, ValidationError, model_validator

__all__ = ["JacobiConfig", "NgramConfig", "SpeculativeConfig", "parse", "render", "SpecConfigError"]


class SpecConfigError(ValueError):
    """A ``--speculative-config`` that does not parse, naming the key."""


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JacobiConfig(_Base):
    method: Literal["jacobi"] = "jacobi"
    window: StrictInt = Field(default=7, ge=1, description="W: future positions in the lookahead window")
    ngram: StrictInt = Field(default=5, ge=2, description="N: n-gram size (N-1 Jacobi iterations kept)")
    guess_set: StrictInt = Field(default=7, ge=0, description="G: pool n-grams verified per step")
    prompt_lookup_tokens: StrictInt = Field(default=0, ge=0, description="also verify a prompt-copied draft")
    window_with_draft: StrictBool = Field(default=True, description="advance the window on steps with a draft")


class NgramConfig(_Base):
    method: Literal["ngram"] = "ngram"
    num_speculative_tokens: StrictInt = Field(default=4, ge=1, description="K: draft tokens per step")
    prompt_lookup_min: StrictInt = Field(default=2, ge=1)
    prompt_lookup_max: StrictInt = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _window(self) -> "NgramConfig":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("need prompt_lookup_min <= prompt_lookup_max")
        return self


SpeculativeConfig = Annotated[Union[JacobiConfig, NgramConfig], Field(discriminator="method")]
_ADAPTER: TypeAdapter = TypeAdapter(SpeculativeConfig)


def parse(text: str) -> dict[str, Any]:
    """Validate a ``--speculative-config`` JSON text; every default filled in. Raises
    ``SpecConfigError`` naming the key."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecConfigError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecConfigError("must be a JSON object")
    if data.get("method") not in ("jacobi", "ngram"):
        raise SpecConfigError(f'method must be "jacobi" or "ngram", got {data.get("method")!r}')
    try:
        return _ADAPTER.validate_python(data).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "config"
        raise SpecConfigError(f"{where}: {first['msg']}") from None


def render(config: JacobiConfig | NgramConfig) -> str:
    """Compact JSON with the keys that were set (what the operator puts on a command line)."""
    return json.dumps({"method": config.method} | config.model_dump(exclude_unset=True), separators=(",", ":"))
