"""The vLLM adapter. vLLM has no Jacobi lookahead; its lookahead-style methods are n-gram prompt
lookup (``ngram``, ``ngram_gpu`` from 0.18.0) and ``suffix`` (0.11.1+, needs arctic-inference):
``--speculative-config '{"method":"ngram","num_speculative_tokens":K,"prompt_lookup_min":a,
"prompt_lookup_max":b}'``. Regime-aware promotion uses ``"num_speculative_tokens_per_batch_size":
[[1, C, K], [C+1, MAX, 0]]`` (0.24.0+; refused before, and with ``--data-parallel-size`` > 1,
where vLLM silently switches the schedule off). The control is the fleet's container as it runs.
Every spelling that sets speculation (``--speculative-config X``, ``--speculative-config=X``,
``-sc``, ``--speculative_config``, dotted ``--speculative-config.method=...``,
``--spec-method``/``--spec-model``/``--spec-tokens``) is read as the fleet's method
(:func:`existing_method`: ngram, eagle, eagle3, mtp, draft_model, suffix, ...) and merged into one
``--speculative-config`` in the canary.
What each version supports: ``docs/engines.md``.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Mapping

from lookahead_operator.api.metric_names import VLLM_METRICS
from lookahead_operator.engines.argv import container_argv, edit_container, env_value, int_or_none
from lookahead_operator.engines.base import (Detection, EngineAdapter, EngineError, EngineSetup, Launcher,
    LookaheadParams, Speculation, lookahead_params, regime_max_batch, replacement_problems)
from lookahead_operator.engines.versions import engine_version, format_version, version_answer

NAME = "vllm"
LAUNCHER = Launcher(executable="vllm", subcommand="serve", subcommand_required=True,
                    modules=("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"))
_LAUNCHERS = (LAUNCHER,)

#: Upper end of the last ``num_speculative_tokens_per_batch_size`` range when the container does
#: not set ``--max-num-seqs`` (the range must cover every batch size the engine can run).
VLLM_DEFAULT_MAX_BATCH = 1024

_SPEC = "--speculative-config"
VLLM_MIN_CHECKED = (0, 10, 0)
VLLM_SUFFIX_SINCE = (0, 11, 1)
VLLM_NGRAM_GPU_SINCE = (0, 18, 0)
VLLM_PER_BATCH_SINCE = (0, 24, 0)
_VLLM_SPEC_SHORTHANDS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}


def _vkey(arg: str) -> str | None:
    """vLLM's normalised option name of ``arg`` (``--speculative_config.x=1`` ->
    ``--speculative-config.x``): FlexibleArgumentParser turns ``_`` into ``-`` before the first dot."""
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0]
        head, dot, rest = name.partition(".")
        return "--" + head.replace("_", "-") + dot + rest
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        return arg.split("=", 1)[0]
    return None


def _is_spec(key: str | None) -> bool:
    return key is not None and (key in (_SPEC, "-sc") or key.startswith(_SPEC + ".") or key in _VLLM_SPEC_SHORTHANDS)


def _split(argv: list[str]) -> tuple[list[str], list[tuple[str, str | None]], int | None]:
    """``(argv without any speculation spelling, [(key, value)], index of the first one)``."""
    out: list[str] = []
    found: list[tuple[str, str | None]] = []
    first: int | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        key = _vkey(a)
        if _is_spec(key):
            if first is None:
                first = len(out)
            if "=" in a and (a.startswith("--") or a.startswith("-sc=")):
                found.append((key, a.split("=", 1)[1]))
                i += 1
            else:
                found.append((key, argv[i + 1] if i + 1 < len(argv) else None))
                i += 2
            continue
        out.append(a)
        i += 1
    return out, found, first


def _value(argv: list[str], key: str, short: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        k = _vkey(a)
        if k == key or (short and k == short):
            if "=" in a:
                return a.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def _json_or_str(v: str) -> Any:
    try:
        return json.loads(v)
    except ValueError:
        return v


def vllm_existing_speculation(argv: list[str]) -> dict | None:
    """The speculative config a vLLM argv already sets, merged from every spelling; ``None`` if
    none. Values built from a shell expansion are skipped."""
    _, found, _ = _split(argv)
    if not found:
        return None
    cfg: dict[str, Any] = {}
    for key, value in found:
        if value is None or "\x00" in value:
            continue
        if key in (_SPEC, "-sc"):
            v = _json_or_str(value)
            if isinstance(v, dict):
                cfg.update(v)
        elif key in _VLLM_SPEC_SHORTHANDS:
            cfg[_VLLM_SPEC_SHORTHANDS[key]] = _json_or_str(value)
        else:
            path = key[len(_SPEC) + 1:].rstrip("+").split(".")
            d = cfg
            for p in path[:-1]:
                d = d.setdefault(p, {})
            d[path[-1]] = _json_or_str(value)
    return {k.replace("-", "_"): v for k, v in cfg.items()}


def _method_of(cfg: Mapping[str, Any]) -> str | None:
    """The method vLLM runs for a speculative config, as its ``SpeculativeConfig`` infers it: the
    ``method`` given (``[ngram]`` is ngram, every ``*_mtp`` is mtp), else from the draft ``model``
    (``ngram``; a name with ``eagle-``, else ``eagle3``, is EAGLE / EAGLE-3; otherwise a draft model)."""
    method, model = cfg.get("method"), cfg.get("model")
    if method is not None and not isinstance(method, str):
        return None
    if method in ("ngram", "[ngram]") or (method is None and model in ("ngram", "[ngram]")):
        return "ngram"
    if method is not None and method.endswith("_mtp"):
        return "mtp"
    if method not in (None, "draft_model"):
        return method
    if not isinstance(model, str):
        return None                                 # nothing vLLM could run (or a shell expansion)
    name = model.lower()
    return "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else "draft_model"


def existing_from_argv(argv: list[str]) -> Speculation | None:
    """The speculation a vLLM argv already runs; ``method`` ``None`` when it cannot be read."""
    _, found, _ = _split(argv)
    if not found:
        return None
    cfg = vllm_existing_speculation(argv) or {}
    readable = all(v is not None and "\x00" not in v for _, v in found)
    if readable and cfg.get("method") is None and cfg.get("model") is None:
        return None                                 # names no method nor draft: nothing vLLM would run
    method = _method_of(cfg)
    spelling = found[0][0]
    return Speculation(method, f"vllm {spelling} method {method}" if method else f"vllm {spelling}")


def existing_method(container: Mapping) -> Speculation | None:
    """The speculative method the fleet's vLLM container runs (``None``: no speculation)."""
    return existing_from_argv(container_argv(container, _LAUNCHERS))


def _method_cfg(p: LookaheadParams) -> dict[str, Any]:
    if p.method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": p.num_speculative_tokens}
    return {"method": p.method, "num_speculative_tokens": p.num_speculative_tokens,
            "prompt_lookup_min": p.prompt_lookup_min, "prompt_lookup_max": p.prompt_lookup_max}


def _schedule(k: int, max_batch: int, engine_max: int) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size``: K up to ``max_batch``, 0 (off) above; the same
    for every method vLLM runs (it is a key of the speculative config, not of a method)."""
    ranges = [[1, min(max_batch, engine_max), k]]
    if max_batch < engine_max:
        ranges.append([max_batch + 1, engine_max, 0])
    return ranges


def _spec_json(p: LookaheadParams, max_batch: int | None, engine_max: int) -> str:
    cfg = _method_cfg(p)
    if max_batch is not None:
        cfg["num_speculative_tokens_per_batch_size"] = _schedule(int(cfg["num_speculative_tokens"]), max_batch,
                                                                 engine_max)
    return json.dumps(cfg, separators=(",", ":"))


#: keys of an existing speculative config that belong to its method, dropped when we switch method
_VLLM_OURS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
              "num_speculative_tokens_per_batch_size", "disable_by_batch_size")


def _draft_model_key(key: str) -> bool:
    """A key that configures a draft model, meaningless for the draft-free methods we render."""
    return key in ("model", "quantization", "revision", "code_revision", "max_model_len", "speculative_token_tree",
                   "parallel_drafting", "tensor_parallel_size") or key.startswith("draft_")


def _regime_problems(setup: EngineSetup) -> list[str]:
    out: list[str] = []
    p, ver, where = setup.lookahead, setup.version, setup.version.describe()
    if not ver.at_least(VLLM_PER_BATCH_SINCE) and ver.doubt:
        out.append(ver.unproven(f"regime-aware promotion needs vLLM {format_version(VLLM_PER_BATCH_SINCE)}+ "
                                "(num_speculative_tokens_per_batch_size; older releases silently drop it and "
                                "would speculate at every batch size)"))
    elif not ver.at_least(VLLM_PER_BATCH_SINCE):
        out.append(f"{where} has no per-batch-size speculation schedule (num_speculative_tokens_per_batch_size "
                   f"arrived in vLLM {format_version(VLLM_PER_BATCH_SINCE)}; older releases silently drop it and "
                   f"would speculate at every batch size); use promotion mode full or analysisOnly, or upgrade")
    dp = _value(setup.argv, "--data-parallel-size", "-dp")
    if dp is not None and (int_or_none(dp) is None or int_or_none(dp) > 1):
        out.append(f"vLLM switches the per-batch-size speculation schedule off with --data-parallel-size > 1 "
                   f"(here {dp if int_or_none(dp) is not None else 'set from a shell expansion'}); "
                   f"regime-aware promotion cannot be enforced; use promotion mode full or analysisOnly")
    if p.method in ("ngram_gpu", "suffix") and \
            str(env_value(setup.container, "VLLM_USE_V2_MODEL_RUNNER")).lower() in ("0", "false"):
        out.append(f"vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0) drops the per-batch-size schedule for "
                   f"method {p.method}")
    return out


def problems(setup: EngineSetup, regime_aware: bool) -> list[str]:
    """What this vLLM version and container cannot do for the lookahead (and a regime)."""
    out: list[str] = []
    p, ver, where = setup.lookahead, setup.version, setup.version.describe()
    if p.method == "jacobi":
        out.append("vLLM has no Jacobi lookahead decoding (its lookahead-style method is n-gram prompt lookup). "
                   "Set spec.lookahead.method: ngram to measure vLLM's ngram speculation, or run the reference "
                   "engine for Jacobi (W, N, G).")
    if ver.version is not None and ver.version < VLLM_MIN_CHECKED:
        out.append(f"{where} predates the oldest vLLM this operator was checked against "
                   f"({format_version(VLLM_MIN_CHECKED)}); its speculative flags differ")
    for method, since in (("suffix", VLLM_SUFFIX_SINCE), ("ngram_gpu", VLLM_NGRAM_GPU_SINCE)):
        if p.method != method or ver.at_least(since):
            continue
        out.append(ver.unproven(f"method {method} needs vLLM {format_version(since)}+") if ver.doubt else
                   f"{where} has no {method!r} speculative method (added in vLLM {format_version(since)})")
    if regime_aware:
        out += _regime_problems(setup)
    return out + replacement_problems(p, existing_from_argv(setup.argv))


def version_from_answer(path: str, body: Any) -> str:
    """vLLM's ``GET /version``: ``{"version": "0.11.0"}`` (``vllm.entrypoints.openai.api_server``)."""
    return version_answer(body)


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    """The canary: one ``--speculative-config``, ours merged into the fleet's own when it runs the
    same method (its other keys kept); another method's settings are dropped (that needs
    ``replaceExisting``)."""
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    setup = EngineSetup(container, None, p, engine_version(container, NAME, p), container_argv(container, _LAUNCHERS))
    refused = problems(setup, max_batch is not None)
    if refused:
        raise EngineError("; ".join(refused))

    def fn(argv: list[str]) -> list[str]:
        existing = vllm_existing_speculation(argv) or {}
        rest, _, first = _split(argv)
        engine_max = int_or_none(_value(rest, "--max-num-seqs")) or VLLM_DEFAULT_MAX_BATCH
        base = {k: v for k, v in existing.items() if k not in _VLLM_OURS and not _draft_model_key(k)}
        if _method_of(existing) not in (None, p.method):
            base = {}                      # another method's settings (a draft model, EAGLE heads) do not carry over
        cfg = {**base, **json.loads(_spec_json(p, max_batch, engine_max))}
        if first is None:
            first = len(rest)
        return rest[:first] + [_SPEC, json.dumps(cfg, separators=(",", ":"))] + rest[first:]

    return edit_container(container, fn, _LAUNCHERS)


def render_control(container: Mapping) -> dict:
    """The control: the fleet's container as it runs, its speculation included."""
    return copy.deepcopy(dict(container))


def regime_config(p: LookaheadParams, max_batch_size: int, engine_max_batch: int | None) -> dict:
    """The ``--speculative-config`` a regime-aware promotion sets."""
    if p.method == "jacobi":
        raise EngineError("vLLM has no Jacobi lookahead; a vLLM regime config needs method ngram")
    return {_SPEC: json.loads(_spec_json(p, max_batch_size, engine_max_batch or VLLM_DEFAULT_MAX_BATCH))}


ADAPTER = EngineAdapter(NAME, Detection(re.compile(r"vllm"), order=3, launcher=LAUNCHER), checked_version="0.33.0",
                        metrics=VLLM_METRICS, problems=problems, render_on=render_lookahead,
                        render_control=render_control, existing=existing_method, regime_config=regime_config,
                        version_paths=("/version",), version_answer=version_from_answer)
