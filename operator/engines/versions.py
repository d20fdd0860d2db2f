"""Engine versions: read from the image tag (``vllm/vllm-openai:v0.11.0``,
``lmsysorg/sglang:v0.5.23-cu126``, ``nvcr.io/nvidia/tensorrt-llm/release:1.0.0``) or from
``spec.lookahead.engineVersion``, which overrides the tag. An unknown version is assumed current.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from lookahead_operator.engines.base import EngineError, LookaheadParams, lookahead_params

Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.\-+_]?(?:post|rc|dev|a|b)?\d*)?(?:[-_.].*)?$")


def parse_version(text: str | None) -> Version | None:
    """``"v0.5.23-cu126"`` -> ``(0, 5, 23)``; ``None`` for ``latest``, ``nightly``, digests."""
    if not text:
        return None
    m = _VERSION_RE.match(str(text).strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def image_version(image: str | None) -> Version | None:
    """The version in an image reference's tag, if it has one."""
    if not image:
        return None
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    return parse_version(last.rsplit(":", 1)[1])


def format_version(v: Version) -> str:
    """``(0, 24, 0)`` -> ``"0.24.0"``."""
    return ".".join(map(str, v))


@dataclass(frozen=True)
class EngineVersion:
    engine: str
    version: Version | None
    source: str                     # "image tag", "spec.lookahead.engineVersion" or "unknown"

    def at_least(self, v: Version) -> bool:
        """True when unknown (assumed current) or >= v."""
        return self.version is None or self.version >= v

    def describe(self) -> str:
        if self.version is None:
            return f"{self.engine} (version unknown, assumed current)"
        return f"{self.engine} {format_version(self.version)} (from the {self.source})"


def engine_version(container: Mapping, engine: str, lookahead_spec: Any = None, *,
                   from_image_tag: bool = True) -> EngineVersion:
    """The engine's version: ``spec.lookahead.engineVersion`` when set, else the image tag (unless
    ``from_image_tag`` is False: an engine whose image tag is not its version)."""
    p = lookahead_params(lookahead_spec) if lookahead_spec is not None else LookaheadParams()
    if p.engine_version:
        v = parse_version(p.engine_version)
        if v is None:
            raise EngineError(f"cannot read a version from spec.lookahead.engineVersion {p.engine_version!r}")
        return EngineVersion(engine, v, "spec.lookahead.engineVersion")
    if not from_image_tag:
        return EngineVersion(engine, None, "unknown")
    v = image_version(str(container.get("image") or ""))
    return EngineVersion(engine, v, "image tag" if v else "unknown")
