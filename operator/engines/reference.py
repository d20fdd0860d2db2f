"""The reference engine's adapter (ours: ``python3 -m lookahead_canary.server``): true Jacobi
lookahead, ``--speculative-config '{"method":"jacobi","window":W,"ngram":N,"guess_set":G}'``, or
``ngram`` like vLLM; regime-aware via ``--lookahead-max-batch-size C``. The control is the fleet's
container as it runs (its ``--speculative-config`` included). The config itself is
``lookahead_canary.specconfig``'s model, the one
the engine parses it with. Its image tag is not an engine version.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Mapping

from lookahead_canary import specconfig
from lookahead_operator.api.metric_names import REFERENCE_METRICS
from lookahead_operator.engines.argv import container_argv, edit_container, flag_value, remove_flag, set_flag
from lookahead_operator.engines.base import (Detection, EngineAdapter, EngineError, EngineSetup, Launcher,
    LookaheadParams, Speculation, lookahead_params, regime_max_batch, replacement_problems)
from lookahead_operator.engines.versions import version_answer

NAME = "reference"
LAUNCHER = Launcher(executable="lookahead-engine", modules=("lookahead_canary.server",))
_LAUNCHERS = (LAUNCHER,)

_SPEC = "--speculative-config"
_MAX_BATCH = "--lookahead-max-batch-size"


def _config(lookahead: LookaheadParams) -> specconfig.JacobiConfig | specconfig.NgramConfig | None:
    """The reference engine's speculative config for a lookahead (anything with
    :class:`LookaheadConfig`'s snake_case fields); ``None`` for a method it does not run."""
    if lookahead.method == "jacobi":
        if lookahead.prompt_lookup_tokens:
            # The original implementation seeds candidates from the prompt too; on steps with such a
            # draft the Jacobi window is skipped (fewer query tokens: see docs/benchmarks/engine-cpu.md).
            return specconfig.JacobiConfig(window=lookahead.window, ngram=lookahead.ngram,
                                           guess_set=lookahead.guess_set,
                                           prompt_lookup_tokens=lookahead.prompt_lookup_tokens,
                                           window_with_draft=False)
        return specconfig.JacobiConfig(window=lookahead.window, ngram=lookahead.ngram, guess_set=lookahead.guess_set)
    if lookahead.method == "ngram":
        return specconfig.NgramConfig(num_speculative_tokens=lookahead.num_speculative_tokens,
                                      prompt_lookup_min=lookahead.prompt_lookup_min,
                                      prompt_lookup_max=lookahead.prompt_lookup_max)
    return None


def reference_speculative_config(lookahead_spec: Any) -> str:
    """The reference engine's ``--speculative-config`` (``lookahead_canary.specconfig``: the same
    model the engine parses it with)."""
    p = lookahead_params(lookahead_spec)
    config = _config(p)
    if config is None:
        raise EngineError(f"the reference engine has no {p.method!r} method (it runs jacobi and ngram)")
    return specconfig.render(config)


def existing_from_argv(argv: list[str]) -> Speculation | None:
    """The speculation a reference-engine argv already runs (its ``--speculative-config`` method)."""
    text = flag_value(argv, _SPEC)
    if text is None:
        return None
    try:
        method = specconfig.parse(text)["method"]
    except specconfig.SpecConfigError:
        return Speculation(None, f"reference engine {_SPEC} that does not parse")
    return Speculation(method, f"reference engine {_SPEC} method {method}")


def existing_method(container: Mapping) -> Speculation | None:
    """The speculative method the fleet's reference-engine container runs (``None``: none)."""
    return existing_from_argv(container_argv(container, _LAUNCHERS))


def problems(setup: EngineSetup, regime_aware: bool) -> list[str]:
    """The methods the reference engine does not run (it has no version limits), and a different
    method the fleet runs that the candidate would replace."""
    try:
        reference_speculative_config(setup.lookahead)
    except EngineError as exc:
        return [str(exc)]
    return replacement_problems(setup.lookahead, existing_from_argv(setup.argv))


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    """The canary: our ``--speculative-config`` (the spec sets every parameter of its method), and
    the batch cap when a regime is given."""
    p = lookahead_params(lookahead_spec)
    spec_json = reference_speculative_config(p)
    refused = replacement_problems(p, existing_method(container))
    if refused:
        raise EngineError("; ".join(refused))
    max_batch = regime_max_batch(regime)

    def fn(argv: list[str]) -> list[str]:
        argv = set_flag(argv, _SPEC, spec_json)
        if max_batch is not None:
            argv = set_flag(argv, _MAX_BATCH, str(max_batch))
        else:
            argv = remove_flag(argv, _MAX_BATCH)
        return argv

    return edit_container(container, fn, _LAUNCHERS)


def render_control(container: Mapping) -> dict:
    """The control: the fleet's container as it runs."""
    return copy.deepcopy(dict(container))


def version_from_answer(path: str, body: Any) -> str:
    """The reference engine's ``GET /version``: ``{"version": <the lookahead-rollout package version>}``,
    vLLM's shape (``--report-version`` answers another, for tests)."""
    return version_answer(body)


def regime_config(p: LookaheadParams, max_batch_size: int, engine_max_batch: int | None) -> dict:
    """The flags a regime-aware promotion sets."""
    return {_SPEC: json.loads(reference_speculative_config(p)), _MAX_BATCH: max_batch_size}


# checked before every other engine: its command mentions no other engine's name
ADAPTER = EngineAdapter(
    NAME, Detection(re.compile(r"lookahead[_-]canary\.server|lookahead-engine|lookahead-rollout[^\s]*engine"),
                    order=0, launcher=LAUNCHER),
    checked_version=None, metrics=REFERENCE_METRICS, problems=problems, render_on=render_lookahead,
    render_control=render_control, existing=existing_method, regime_config=regime_config, version_from_image_tag=False,
    version_paths=("/version",), version_answer=version_from_answer)
