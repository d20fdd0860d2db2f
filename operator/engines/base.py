"""What every engine adapter is: the :class:`EngineAdapter` record each engine module fills in (its
name, how it is detected and launched, its checked version, its metric names, what it refuses,
its two renderers and its regime setting), plus the types all adapters share: the lookahead spec
(:class:`LookaheadParams`), :class:`EngineError` and the regime's batch size.

Renderers are pure: they take a container dict and return a NEW one; the input is untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from lookahead_operator.api.metric_names import MetricNames

if TYPE_CHECKING:
    from lookahead_operator.engines.versions import EngineVersion

METHODS: tuple[str, ...] = ("jacobi", "ngram", "ngram_gpu", "suffix")


class EngineError(ValueError):
    """A lookahead spec that an engine cannot run, or a container we cannot edit."""


# ---------------------------------------------------------------------------------------------
# the lookahead spec (accepts the pydantic model or a plain dict, camelCase or snake_case)


@dataclass(frozen=True)
class LookaheadParams:
    method: str = "jacobi"             # jacobi | ngram | ngram_gpu | suffix
    window: int = 7                    # W
    ngram: int = 5                     # N
    guess_set: int = 7                 # G
    num_speculative_tokens: int = 4    # ngram methods: K
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    prompt_lookup_tokens: int = 0      # jacobi: prompt-lookup draft verified alongside (0: off)
    engine_version: str | None = None  # the user statement of the version (engines.versions.checked_version)
    replace_existing: bool = False     # the candidate may replace a different method the fleet runs


_ALIASES = {
    "method": ("method",),
    "window": ("window", "W"),
    "ngram": ("ngram", "N"),
    "guess_set": ("guess_set", "guessSet", "G"),
    "num_speculative_tokens": ("num_speculative_tokens", "numSpeculativeTokens"),
    "prompt_lookup_min": ("prompt_lookup_min", "promptLookupMin"),
    "prompt_lookup_max": ("prompt_lookup_max", "promptLookupMax"),
    "prompt_lookup_tokens": ("prompt_lookup_tokens", "promptLookupTokens"),
    "engine_version": ("engine_version", "engineVersion"),
    "replace_existing": ("replace_existing", "replaceExisting"),
}


def _spec_fields(spec: Any) -> dict[str, Any]:
    """Every field of a spec given as a pydantic model (both spellings), a mapping or an object."""
    if hasattr(spec, "model_dump"):
        data = spec.model_dump(by_alias=False)
        data.update(spec.model_dump(by_alias=True))
        return data
    if isinstance(spec, Mapping):
        return dict(spec)
    return {k: getattr(spec, k) for k in dir(spec) if not k.startswith("_")}


def lookahead_params(spec: Any) -> LookaheadParams:
    """Normalise a lookahead spec (``LookaheadParams``, a pydantic model, or a dict)."""
    if spec is None:
        return LookaheadParams()
    if isinstance(spec, LookaheadParams):
        return spec
    data = _spec_fields(spec)
    kw: dict[str, Any] = {}
    for name, keys in _ALIASES.items():
        for k in keys:
            if data.get(k) is not None:
                kw[name] = data[k]
                break
    method = getattr(kw.get("method"), "value", kw.get("method", "jacobi"))
    kw["method"] = str(method).lower()
    if kw["method"] not in METHODS:
        raise EngineError(f"unknown lookahead method {kw['method']!r} (expected one of {', '.join(METHODS)})")
    for k, v in list(kw.items()):
        if k == "engine_version":
            kw[k] = str(v)
        elif k == "replace_existing":
            if not isinstance(v, bool):
                raise EngineError(f"lookahead replaceExisting must be true or false, got {v!r}")
        elif k != "method":
            kw[k] = int(v)
            if kw[k] < (0 if k == "prompt_lookup_tokens" else 1):
                raise EngineError(f"lookahead {k} must be >= 1, got {v}")
    return LookaheadParams(**kw)


def regime_max_batch(regime: Any) -> int | None:
    """The largest batch size at which speculation stays on, from ``regime``: an int, a mapping
    with ``maxBatchSize``/``max_batch_size``/``crossover``, or an object with such an attribute.
    ``None`` means speculate at every batch size."""
    if regime is None:
        return None
    if isinstance(regime, bool):
        raise EngineError("regime must be a batch size, not a bool")
    if isinstance(regime, int):
        value = regime
    else:
        value = None
        for k in ("max_batch_size", "maxBatchSize", "speculate_up_to", "crossover_batch_size"):
            v = regime.get(k) if isinstance(regime, Mapping) else getattr(regime, k, None)
            if v is not None:
                value = int(v)
                break
        if value is None:
            raise EngineError(f"cannot read a max batch size from regime {regime!r}")
    if value < 1:
        raise EngineError(f"regime max batch size must be >= 1, got {value}")
    return value


#: How messages name a speculative method (the engines' own method names, lower-cased).
METHOD_LABELS: dict[str, str] = {
    "jacobi": "Jacobi lookahead", "ngram": "n-gram", "ngram_gpu": "n-gram (GPU)", "suffix": "suffix decoding",
    "eagle": "EAGLE", "eagle3": "EAGLE-3", "mtp": "MTP", "nextn": "MTP (NEXTN)", "draft_model": "a draft model",
    "standalone": "a draft model (STANDALONE)", "dflash": "DFlash", "dspark": "DSpark",
}


@dataclass(frozen=True)
class Speculation:
    """The speculative method a fleet's engine container already runs, as its flags say.
    ``method``: the engine's own name, lower-cased (``eagle3``, ``ngram``, ``nextn``); ``None``
    when speculation is set but its method cannot be read (a shell expansion). ``source``: where
    it was read, in words (``vllm --speculative-config method eagle3``)."""
    method: str | None
    source: str

    @property
    def label(self) -> str:
        if self.method is None:
            return "a speculative method this operator cannot read"
        return METHOD_LABELS.get(self.method, self.method)


def replacement_problems(lookahead: LookaheadParams, existing: Speculation | None) -> list[str]:
    """The candidate would replace a different method the fleet runs, and the spec does not say
    it may (``spec.lookahead.replaceExisting``): one message naming the fleet's method."""
    if existing is None or existing.method == lookahead.method or lookahead.replace_existing:
        return []
    return [f"the fleet runs {existing.label} ({existing.source}); the candidate {lookahead.method} would replace "
            f"it: set spec.lookahead.replaceExisting: true to compare them (the control keeps {existing.label}, "
            f"the canary runs {lookahead.method}), or leave this fleet out of spec.targets"]


def pod_spec(pod_template: Mapping) -> Mapping:
    """The pod spec of a pod template, a Deployment or a Deployment spec (or a pod spec itself)."""
    if "template" in pod_template and isinstance(pod_template["template"], Mapping):  # a Deployment spec
        pod_template = pod_template["template"]
    if "spec" in pod_template and isinstance(pod_template["spec"], Mapping):
        spec = pod_template["spec"]
        if "template" in spec:                                                       # a whole Deployment
            return pod_spec(spec)
        return spec
    return pod_template                                                                # already a pod spec


# ---------------------------------------------------------------------------------------------
# the adapter record


@dataclass(frozen=True)
class Launcher:
    """How a command line starts the engine: ``EXECUTABLE [SUBCOMMAND] ARGS`` or
    ``python[3] [-u ...] -m MODULE ARGS``. The engine's arguments follow these words."""
    executable: str | None = None      # the basename: vllm, sglang, lookahead-engine
    subcommand: str | None = None      # a word after the executable that is part of the launch: serve
    subcommand_required: bool = False  # True: the executable without the subcommand is not the server
    modules: tuple[str, ...] = ()      # python -m MODULE


@dataclass(frozen=True)
class Detection:
    """How a container is recognised as this engine: ``pattern`` searched in its lower-cased
    image, command and args. Adapters are tried by ``order`` (lowest first), so a pattern that
    could also match another engine's container (``vllm``) comes after the narrower ones."""
    pattern: re.Pattern[str]
    order: int
    launcher: Launcher


@dataclass(frozen=True)
class EngineSetup:
    """One engine container as an adapter's ``problems`` reads it."""
    container: Mapping
    pod_template: Mapping | None       # the template around it; None when only the container was given
    lookahead: LookaheadParams
    version: "EngineVersion"
    argv: list[str]                    # the engine's arguments (see engines.argv.container_argv)


#: ``render_on(container, lookahead_spec, regime=None) -> new container``
RenderOn = Callable[[Mapping, Any, Any], dict]
#: ``render_control(container) -> new container``: the fleet's container as it runs
RenderControl = Callable[[Mapping], dict]
#: ``existing(container) -> the speculation the fleet's container runs``, ``None`` for none
Existing = Callable[[Mapping], "Speculation | None"]
#: ``problems(setup, regime_aware) -> messages``: empty when the engine can run it
Problems = Callable[[EngineSetup, bool], "list[str]"]
#: ``version_answer(path, json) -> the version text`` a version endpoint's answer states
VersionAnswer = Callable[[str, Any], str]
#: ``regime_config(lookahead, max_batch_size, engine_max_batch) -> the engine's regime setting``
RegimeConfig = Callable[[LookaheadParams, int, "int | None"], dict]


@dataclass(frozen=True)
class EngineAdapter:
    """Everything the operator needs from one engine; one instance per engine module, listed in
    ``engines.registry``.

    ``problems`` lists what this version and config cannot do (the messages of an
    ``Accepted=False`` condition). ``render_on`` returns the canary container (lookahead on;
    ``regime``: speculate only up to that batch size) and raises :class:`EngineError` with the
    same messages ``problems`` gives, among them :func:`replacement_problems`: the fleet's
    candidate on top of the fleet's own flags (a method the fleet already runs keeps its other
    settings; a different one replaces it only with ``replaceExisting``). ``render_control``
    returns the control: the fleet's container as it runs, its speculation included (plus only
    what measuring needs, such as SGLang's ``--enable-metrics``). ``existing`` reads the method the
    fleet's container already runs from its flags.
    ``version_from_image_tag`` False: the image tag says nothing about the engine's version.
    ``version_paths``: the running engine's version endpoints, tried in order (the next only when
    one answers 404: an older release without it); ``version_answer(path, json) -> version text``
    reads one's answer (:class:`EngineError` when it has none).
    ``checked_version``: the newest release whose parser and sources we checked (``None``: ours).
    ``default_port``: where the engine listens when its command line has no ``--port``.
    """
    name: str
    detection: Detection
    checked_version: str | None
    metrics: MetricNames
    problems: Problems
    render_on: RenderOn
    render_control: RenderControl
    existing: Existing
    regime_config: RegimeConfig
    version_from_image_tag: bool = True
    version_paths: tuple[str, ...] = ("/version",)
    version_answer: "VersionAnswer | None" = None
    default_port: int = 8000
