"""The SGLang adapter: ``--speculative-algorithm NGRAM`` (0.5.3+) with ``--speculative-num-draft-tokens
K+1`` (the count includes the root token). No per-batch switch: regime-aware is refused. Both
roles get ``--enable-metrics``, the same ``--max-running-requests`` (NGRAM caps an unset value
at 48), no ``--enable-mixed-chunk`` (NGRAM turns it off) and, where NGRAM forces it, the same
``--disable-overlap-schedule``. What each version supports: ``docs/engines.md``.
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
    LookaheadParams, lookahead_params, regime_max_batch)
from lookahead_operator.engines.versions import EngineVersion, engine_version, format_version

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


def _device(argv: list[str]) -> str:
    return (flag_value(argv, "--device") or "cuda").split(":", 1)[0].lower()


def _common(argv: list[str], ver: EngineVersion) -> list[str]:
    """What NGRAM changes besides speculation, set the same on both roles."""
    if not has_flag(argv, "--enable-metrics"):
        argv = argv + ["--enable-metrics"]
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
    if dev == "cpu" and not ver.at_least(SGLANG_CPU_SINCE):
        return [f"{where}: NGRAM runs on CUDA only before SGLang {format_version(SGLANG_CPU_SINCE)} (here --device cpu)"]
    if dev == "xpu" and not ver.at_least(SGLANG_XPU_SINCE):
        return [f"{where}: NGRAM runs on XPU only from SGLang {format_version(SGLANG_XPU_SINCE)}"]
    if dev not in ("cuda", "cpu", "xpu"):
        return [f"SGLang's NGRAM speculation does not run on --device {dev}"]
    return []


def problems(setup: EngineSetup, regime_aware: bool) -> list[str]:
    """What this SGLang version and container cannot do for the lookahead (and a regime)."""
    argv, ver = setup.argv, setup.version
    out = _method_problems(setup.lookahead)
    if not ver.at_least(SGLANG_NGRAM_SINCE):
        out.append(f"{ver.describe()} has no NGRAM speculative algorithm (added in SGLang "
                   f"{format_version(SGLANG_NGRAM_SINCE)})")
    if regime_aware:
        out.append("SGLang has no per-batch-size speculation switch, so speculation cannot be limited to small "
                   "batches; use promotion mode full or analysisOnly")
    out += _device_problems(argv, ver)
    attn_dp = int_or_none(flag_value(argv, "--attn-dp-size"))
    if has_flag(argv, "--enable-dp-attention") or (attn_dp or 1) > 1:
        out.append("SGLang's NGRAM speculation does not support data-parallel attention "
                   "(--enable-dp-attention / --attn-dp-size > 1)")
    return out


def render_lookahead(container: Mapping, lookahead_spec: Any, regime: Any = None) -> dict:
    """The canary: NGRAM with K+1 draft tokens, on top of what both roles share."""
    p = lookahead_params(lookahead_spec)
    max_batch = regime_max_batch(regime)
    ver = engine_version(container, NAME, p)
    refused = problems(EngineSetup(container, None, p, ver, container_argv(container, _LAUNCHERS)),
                       max_batch is not None)
    if refused:
        raise EngineError("; ".join(refused))

    def fn(argv: list[str]) -> list[str]:
        argv = _common(_strip_spec(argv), ver)
        argv = argv + ["--speculative-algorithm", "NGRAM",
                       "--speculative-num-draft-tokens", str(p.num_speculative_tokens + 1)]
        if ver.version is not None and ver.version <= SGLANG_MATCH_WINDOW_UNTIL:
            argv += ["--speculative-ngram-min-match-window-size", str(p.prompt_lookup_min),
                     "--speculative-ngram-max-match-window-size", str(p.prompt_lookup_max)]
        return argv

    return edit_container(container, fn, _LAUNCHERS)


def render_off(container: Mapping) -> dict:
    """The control: no speculative flag, and what NGRAM changes besides speculation."""
    ver = engine_version(container, NAME)
    return edit_container(container, lambda argv: _common(_strip_spec(argv), ver), _LAUNCHERS)


def regime_config(p: LookaheadParams, max_batch_size: int, engine_max_batch: int | None) -> dict:
    raise EngineError("SGLang has no per-batch-size speculation switch; regime-aware promotion is not possible")


ADAPTER = EngineAdapter(NAME, Detection(re.compile(r"sglang"), order=2, launcher=LAUNCHER), checked_version="0.5.23",
                        metrics=SGLANG_METRICS, problems=problems, render_on=render_lookahead,
                        render_off=render_off, regime_config=regime_config)
