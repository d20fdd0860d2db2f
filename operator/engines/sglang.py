"""The SGLang adapter: ``--speculative-algorithm NGRAM`` (0.5.3+) with ``--speculative-num-draft-tokens
K+1`` (the count includes the root token). No per-batch switch: regime-aware is refused. The
control is the fleet's container as it runs (its ``--speculative-algorithm`` included: EAGLE,
EAGLE3, NEXTN, STANDALONE, NGRAM), with ``--enable-metrics`` added (no ``/metrics`` without it).
The canary also states what NGRAM changes besides speculation: ``--max-running-requests`` (NGRAM
caps an unset value at 48), no ``--enable-mixed-chunk`` (NGRAM turns it off) and, where NGRAM
forces it, ``--disable-overlap-schedule``. What each version supports: ``docs/engines.md``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from lookahead_operator.api.metric_names import SGLANG_METRICS
from lookahead_operator.engines.argv import (
    container_argv,
    edit_container,
    flag_value,
    has_flag,
    int_or_none,
    remove_flag,
)
from lookahead_operator.engines.base import (Detection, EngineAdapter, EngineError, EngineSetup, Launcher,
    LookaheadParams, Speculation, lookahead_params, regime_max_batch, replacement_problems)
from lookahead_operator.engines.versions import EngineVersion, engine_version, format_version, version_answer

NAME = "sglang"
LAUNCHER = Launcher(executable="sglang", subcommand="serve", modules=("sglang.launch_server",))
_LAUNCHERS = (LAUNCHER,)

#: SGLang's NGRAM setup sets an unset ``max_running_requests`` to this; the control gets the same.
SGLANG_NGRAM_MAX_RUNNING_REQUESTS = 48

SGLANG_NGRAM_SINCE = (0, 5, 3)
SGLANG_MATCH_WINDOW_UNTIL = (0, 5, 9)          # --speculative-ngram-min/max-match-window-size: 0.5.3-0.5.9
SGLANG_OVERLAP_FORCED_UNTIL = (0, 5, 12)       # NGRAM forces --disable-overlap-schedule up to 0.5.12
SGLANG_CPU_SINCE = (0, 5, 16)
SGLANG_XPU_SINCE = (0, 5, 21)
_SGLANG_SPEC_BOOL = {"--speculative-use-rejection-sampling", "--speculative-use-block-verification",
                     "--speculative-adaptive", "--speculative-dspark-align-verify-tokens-to-graph-tier",
                     "--speculative-enable-w4a4-mxfp4-megamoe", "--no-speculative-enable-w4a4-mxfp4-megamoe",
                     "--enable-multi-layer-eagle"}


def _strip_spec(argv: list[str]) -> list[str]:
    """Drop every speculative flag (``--speculative-*``, with its value)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if name.startswith(("--speculative-", "--no-speculative-")) or name in ("--enable-multi-layer-eagle", "--uno-lora-path"):
            if "=" in a or name in _SGLANG_SPEC_BOOL:
                i += 1
            else:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                i += 2 if nxt is not None and not nxt.startswith("--") else 1
            continue
        out.append(a)
        i += 1
    return out


#: the flags the canary sets; a fleet already on NGRAM keeps its other ``--speculative-*`` flags
_OURS = ("--speculative-algorithm", "--speculative-num-draft-tokens", "--speculative-ngram-min-match-window-size",
         "--speculative-ngram-max-match-window-size")


def _strip_ours(argv: list[str]) -> list[str]:
    for flag in _OURS:
        argv = remove_flag(argv, flag)
    return argv


def existing_from_argv(argv: list[str]) -> Speculation | None:
    """The speculation an SGLang argv already runs (``--speculative-algorithm``)."""
    algorithm = flag_value(argv, "--speculative-algorithm")
    if algorithm is None:
        return None
    if "\x00" in algorithm:
        return Speculation(None, "sglang --speculative-algorithm set from a shell expansion")
    return Speculation(algorithm.lower(), f"sglang --speculative-algorithm {algorithm}")


def existing_method(container: Mapping) -> Speculation | None:
    """The speculative method the fleet's SGLang container runs (``None``: no speculation)."""
    return existing_from_argv(container_argv(container, _LAUNCHERS))


def _device(argv: list[str]) -> str:
    return (flag_value(argv, "--device") or "cuda").split(":", 1)[0].lower()


def _metrics(argv: list[str]) -> list[str]:
    return argv if has_flag(argv, "--enable-metrics") else argv + ["--enable-metrics"]


def _common(argv: list[str], ver: EngineVersion) -> list[str]:
    """What NGRAM changes besides speculation, stated on the canary's command line."""
    argv = _metrics(argv)
    if flag_value(argv, "--max-running-requests") is None:
        argv = argv + ["--max-running-requests", str(SGLANG_NGRAM_MAX_RUNNING_REQUESTS)]
    argv = remove_flag(argv, "--enable-mixed-chunk", takes_value=False)
    forced = (ver.version is not None and ver.version <= SGLANG_OVERLAP_FORCED_UNTIL) or _device(argv) == "cpu"
    if forced and not has_flag(argv, "--disable-overlap-schedule"):
        argv = argv + ["--disable-overlap-schedule"]
    return argv


def _method_problems(p: LookaheadParams) -> list[str]:
    if p.method == "ngram":
        return []
    if p.method == "jacobi":
        return ["SGLang has no Jacobi lookahead decoding; its lookahead is the trie-based n-gram method "
                "(--speculative-algorithm NGRAM). Set spec.lookahead.method: ngram, or run the reference "
                "engine for Jacobi (W, N, G)."]
    return [f"SGLang has no {p.method!r} method; its n-gram speculation is method ngram "
            f"(--speculative-algorithm NGRAM)"]


def _device_problems(argv: list[str], ver: EngineVersion) -> list[str]:
    where = ver.describe()
    dev = _device(argv)
    for device, since in (("cpu", SGLANG_CPU_SINCE), ("xpu", SGLANG_XPU_SINCE)):
        if dev == device and not ver.at_least(since) and ver.doubt:
            return [ver.unproven(f"NGRAM on --device {device} needs SGLang {format_version(since)}+")]
    if dev == "cpu" and not ver.at_least(SGLANG_CPU_SINCE):
        return [f"{where}: NGRAM runs on CUDA only before SGLang {format_version(SGLANG_CPU_SINCE)} (here --device cpu)"]
    if dev == "xpu" and not ver.at_least(SGLANG_XPU_SINCE):
        return [f"{where}: NGRAM runs on XPU only from SGLang {format_version(SGLANG_XPU_SINCE)}"]
    if dev not in ("cuda", "cpu", "xpu"):
        return [f"SGLang's NGRAM speculation does not run on --device {dev}"]
    return []


def _render_version_problems(setup: EngineSetup) -> list[str]:
    """The canary's flags depend on the version up to 0.5.12 (the match-window flags, the forced
    ``--disable-overlap-schedule``); they are rendered from engineVersion or the image tag. A
    running version that neither states is one the canary would not be rendered for."""
    running, rendered = setup.version.version, engine_version(setup.container, NAME, setup.lookahead).version
    if running is None or rendered == running or running > SGLANG_OVERLAP_FORCED_UNTIL:
        return []
    return [f"{setup.version.describe()}: the canary's NGRAM flags differ up to SGLang "
            f"{format_version(SGLANG_OVERLAP_FORCED_UNTIL)} and are rendered from spec.lookahead.engineVersion or the "
            f"image tag, which state no version here: set spec.lookahead.engineVersion: {format_version(running)}"]


def version_from_answer(path: str, body: Any) -> str:
    """SGLang's ``/server_info`` (newer releases; ``/get_server_info`` kept, deprecated) and
    ``/get_server_info`` (0.5.x): the server args merged with ``"version": sglang.__version__``."""
    return version_answer(body)


def problems(setup: EngineSetup, regime_aware: bool) -> list[str]:
    """What this SGLang version and container cannot do for the lookahead (and a regime)."""
    argv, ver = setup.argv, setup.version
    out = _method_problems(setup.lookahead)
    if not ver.at_least(SGLANG_NGRAM_SINCE) and ver.doubt:
        out.append(ver.unproven(f"the NGRAM speculative algorithm needs SGLang {format_version(SGLANG_NGRAM_SINCE)}+"))
    elif not ver.at_least(SGLANG_NGRAM_SINCE):
        out.append(f"{ver.describe()} has no NGRAM speculative algorithm (added in SGLang "
                   f"{format_version(SGLANG_NGRAM_SINCE)})")
    if regime_aware:
        out.append("SGLang has no per-batch-size speculation switch, so speculation cannot be limited to small "
                   "batches; use promotion mode full or analysisOnly")
    out += _device_problems(argv, ver) + _render_version_problems(setup)
    attn_dp = int_or_none(flag_value(argv, "--attn-dp-size"))
    if has_flag(argv, "--enable-dp-attention") or (attn_dp or 1) > 1:
        out.append("SGLang's NGRAM speculation does not support data-parallel attention "
                   "(--enable-dp-attention / --attn-dp-size > 1)")
    return out + replacement_problems(setup.lookahead, existing_from_argv(argv))


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    """The canary: NGRAM with K+1 draft tokens and what NGRAM changes besides speculation; a fleet
    already on NGRAM keeps its other NGRAM flags, another method's flags are dropped."""
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    ver = engine_version(container, NAME, p)
    refused = problems(EngineSetup(container, None, p, ver, container_argv(container, _LAUNCHERS)),
                       max_batch is not None)
    if refused:
        raise EngineError("; ".join(refused))

    def fn(argv: list[str]) -> list[str]:
        existing = existing_from_argv(argv)
        same = existing is not None and existing.method == "ngram"
        argv = _common(_strip_ours(argv) if same else _strip_spec(argv), ver)
        argv = argv + ["--speculative-algorithm", "NGRAM",
                       "--speculative-num-draft-tokens", str(p.num_speculative_tokens + 1)]
        if ver.version is not None and ver.version <= SGLANG_MATCH_WINDOW_UNTIL:
            argv += ["--speculative-ngram-min-match-window-size", str(p.prompt_lookup_min),
                     "--speculative-ngram-max-match-window-size", str(p.prompt_lookup_max)]
        return argv

    return edit_container(container, fn, _LAUNCHERS)


def render_control(container: Mapping) -> dict:
    """The control: the fleet's container as it runs, with ``--enable-metrics`` (to be measured)."""
    return edit_container(container, _metrics, _LAUNCHERS)


def regime_config(p: LookaheadParams, max_batch_size: int, engine_max_batch: int | None) -> dict:
    raise EngineError("SGLang has no per-batch-size speculation switch; regime-aware promotion is not possible")


ADAPTER = EngineAdapter(NAME, Detection(re.compile(r"sglang"), order=2, launcher=LAUNCHER), checked_version="0.5.23",
                        metrics=SGLANG_METRICS, problems=problems, render_on=render_lookahead,
                        render_control=render_control, existing=existing_method,
                        regime_config=regime_config, default_port=30000,
                        version_paths=("/server_info", "/get_server_info"), version_answer=version_from_answer)
