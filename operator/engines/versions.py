"""Engine versions. Three sources: the running engine (what a ready fleet pod's version endpoint
answers: vLLM ``GET /version``, SGLang ``/server_info``, ours ``GET /version``), the image tag
(``vllm/vllm-openai:v0.11.0``, ``lmsysorg/sglang:v0.5.23-cu126``) and
``spec.lookahead.engineVersion`` (the user's statement).

The gate (:func:`checked_version`, what ``registry.support_problems`` checks at Pending and
Preflight) never guesses: the running version is the truth, and a tag or engineVersion that says
otherwise is a contradiction; with no running version read, only engineVersion is taken (a tag
alone is not proof: ``latest``, a retag, a private build). A version that is not proof carries a
``doubt`` and :meth:`EngineVersion.at_least` is False for it, so every version-gated feature is
refused with the reason. A renderer's version (:func:`engine_version`: engineVersion, else the tag)
comes after that gate and only chooses flags; an unknown one there renders for the current release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from lookahead_operator.engines.base import EngineError, LookaheadParams, lookahead_params

Version = tuple[int, int, int]

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.\-+_]?(?:post|rc|dev|a|b)?\d*)?(?:[-_.].*)?$")
#: a pre-release of the triple before it (PEP 440: ``0.24.0rc1``, ``0.24.0.dev5+g1234``, ``0.24.0a1``)
_PRE_RE = re.compile(r"^v?\d+\.\d+(?:\.\d+)?[.\-_]?(?:rc|dev|a|b|alpha|beta)\d*", re.IGNORECASE)


def parse_version(text: str | None) -> Version | None:
    """``"v0.5.23-cu126"`` -> ``(0, 5, 23)``; ``None`` for ``latest``, ``nightly``, digests."""
    if not text:
        return None
    m = _VERSION_RE.match(str(text).strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def is_prerelease(text: str | None) -> bool:
    """``"0.24.0rc1"``, ``"0.24.0.dev5+g1a2b"``: a build before 0.24.0 (its features may be missing)."""
    return bool(text) and bool(_PRE_RE.match(str(text).strip()))


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
    source: str                     # "image tag", "spec.lookahead.engineVersion", "/version of pod ns/x" or "unknown"
    doubt: str | None = None        # why this version proves nothing (a gate refuses); None: it is proof
    remedy: str | None = None       # what the user can do about the doubt
    prerelease: bool = False        # a build before ``version`` (rc, dev): not yet that release

    def at_least(self, v: Version) -> bool:
        """True when this version proves ``>= v``: never while in doubt (a gate's unknown or
        contradicted version); a pre-release of ``v`` is not ``v``. A renderer's unknown version
        (:func:`engine_version`, after the gate) passes."""
        if self.doubt is not None:
            return False
        if self.version is None:
            return True
        return self.version > v if self.prerelease else self.version >= v

    def unproven(self, needs: str) -> str:
        """A gate's refusal of a feature (``needs``: "regime-aware promotion needs vLLM 0.24.0+ (...)")
        for a version in doubt: the facts, what needs proof, what to do."""
        return f"{self.doubt}: {needs}" + (f"; {self.remedy}" if self.remedy else "")

    def describe(self) -> str:
        if self.version is None:
            return f"{self.engine} (version unknown)"
        pre = " (a pre-release)" if self.prerelease else ""
        return f"{self.engine} {format_version(self.version)}{pre} (from the {self.source})"


@dataclass(frozen=True)
class RunningVersion:
    """What a running fleet pod's version endpoint answered: ``text`` (the version as the engine
    says it) when read, else ``error`` (why not). ``pod``: ``namespace/name`` (None when no ready
    pod was found); ``path``: the endpoint that answered (or was tried last)."""
    text: str | None
    pod: str | None = None
    path: str | None = None
    error: str | None = None

    @property
    def version(self) -> Version | None:
        return parse_version(self.text)

    def where(self, engine: str) -> str:
        return f"{engine} {self.path or 'version endpoint'} of pod {self.pod or '?'}"


def version_answer(body: Any) -> str:
    """The version in a version endpoint's JSON answer: its ``"version"`` string (vLLM's
    ``/version``, SGLang's ``/server_info`` and ``/get_server_info``, the reference engine's
    ``/version``). :class:`EngineError` when the answer has none."""
    value = body.get("version") if isinstance(body, Mapping) else None
    if not isinstance(value, str) or not value.strip():
        raise EngineError(f"the answer has no \"version\" string ({str(body)[:120]!r})")
    if parse_version(value) is None:
        raise EngineError(f"the answer's version {value!r} is not a release number")
    return value.strip()


def engine_version(container: Mapping, engine: str, lookahead_spec: Any = None, *,
                   from_image_tag: bool = True) -> EngineVersion:
    """A renderer's version: ``spec.lookahead.engineVersion`` when set, else the image tag (unless
    ``from_image_tag`` is False: an engine whose image tag is not its version). It only chooses
    flags, after the gate (:func:`checked_version`, with the running engine's version) passed;
    never proof of a feature."""
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


def _declared(p: LookaheadParams) -> Version | None:
    if not p.engine_version:
        return None
    v = parse_version(p.engine_version)
    if v is None:
        raise EngineError(f"cannot read a version from spec.lookahead.engineVersion {p.engine_version!r}")
    return v


def checked_version(container: Mapping, engine: str, lookahead_spec: Any, running: RunningVersion | None, *,
                    from_image_tag: bool = True) -> EngineVersion:
    """The version a gate may rely on, and the doubt when there is none (never a guess):

    - the running version read (``running.text``) is the truth; an image tag or
      ``spec.lookahead.engineVersion`` stating another release is a contradiction (a doubt naming all three);
    - none read: ``spec.lookahead.engineVersion`` when set (the user's statement); else a doubt
      saying why none was read and that the tag alone is not proof.

    ``from_image_tag`` False: the image tag says nothing about the engine's version."""
    p = lookahead_params(lookahead_spec) if lookahead_spec is not None else LookaheadParams()
    stated = _declared(p)
    image = str(container.get("image") or "")
    tag = image_version(image) if from_image_tag else None
    ran = running.version if running is not None else None
    if running is not None and ran is not None:
        where = running.where(engine)
        others = [("the image tag says", tag), ("spec.lookahead.engineVersion says", stated)]
        if any(v is not None and v != ran for _, v in others):
            said = "; ".join(f"{text} {format_version(v)}" for text, v in others if v is not None)
            if stated is None:
                said += "; spec.lookahead.engineVersion is not set"
            return EngineVersion(engine, ran, where, prerelease=is_prerelease(running.text),
                                 doubt=f"{where} says {running.text}; {said}",
                                 remedy="the pod runs another release than the template states (an older ReplicaSet, "
                                        "a retagged image?): make them agree before rolling out")
        return EngineVersion(engine, ran, where, prerelease=is_prerelease(running.text))
    if stated is not None:
        return EngineVersion(engine, stated, "spec.lookahead.engineVersion", prerelease=is_prerelease(p.engine_version))
    why = running.error if running is not None and running.error else "no running pod was read"
    if running is not None and running.text is not None:
        why = f"{running.where(engine)} answered {running.text!r}, not a release number"
    tag_note = (f"the image tag says {format_version(tag)}, but a tag alone is not proof (latest, a retag, a private "
                "build)") if tag is not None else "the image tag states no version"
    return EngineVersion(engine, None, "unknown",
                         doubt=f"the {engine} version could not be read from the running engine ({why}); {tag_note}",
                         remedy="set spec.lookahead.engineVersion to the release the fleet runs, or use promotion mode "
                                "full or analysisOnly")
