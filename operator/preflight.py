"""Preflight: is this workload a lookahead candidate at all? And which batch sizes to measure.

The diagnostic table, as code. Lookahead trades spare compute for fewer sequential decode steps,
so it can only pay where decode dominates the request, where time-to-first-token is not what
users wait on, and where the GPU has idle arithmetic during decode:

| signal                                   | reading                          | verdict                  |
|------------------------------------------|----------------------------------|--------------------------|
| prefill seconds / (prefill + decode)     | >= prefill_share_max (0.5)       | PrefillDominated         |
| TTFT / e2e latency                       | >= ttft_share_max (0.5)          | TTFTLimited              |
| DCGM SM_ACTIVE or PIPE_TENSOR_ACTIVE     | high (>= 0.8 / >= 0.5)           | ComputeSaturated         |
| DCGM DRAM_ACTIVE high, SM/TENSOR low     | >= 0.5 and < 0.8 / < 0.5         | DecodeBoundIdleCompute   |
| no DCGM: decode share high, batch small  | >= 0.7 and p50 running <= 8      | DecodeBoundIdleCompute   |
| no DCGM: median running batch large      | p50 running >= 64                | ComputeSaturated         |
| anything else                            |                                  | Unknown (measure anyway) |

`DCGM_FI_DEV_GPU_UTIL` is kernel residency, not arithmetic: it reads 90%+ on a memory-bound decode
and is never taken as "no spare compute". Unknown stays a candidate: the canary measurement is
what decides; the preflight only stops clear non-candidates.

Signals (keys of the input dict; every one may be missing or None):
    prefill_seconds, decode_seconds       mean per request (vllm:request_prefill_time_seconds,
                                          vllm:request_decode_time_seconds)
    running_batch_quantiles               {0.5: 3.0, 0.9: 7.2, ...} of vllm:num_requests_running
    ttft_share                            TTFT / e2e request latency, 0..1
    dram_active, sm_active, tensor_active DCGM_FI_PROF_DRAM_ACTIVE / SM_ACTIVE / PIPE_TENSOR_ACTIVE, 0..1
    gpu_util                              DCGM_FI_DEV_GPU_UTIL, 0..1 (or 0..100)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

__all__ = [
    "PreflightVerdict",
    "Preflight",
    "PreflightThresholds",
    "SIGNALS",
    "DCGM_SIGNALS",
    "preflight",
    "production_batch_sizes",
]


class PreflightVerdict(str, Enum):
    DECODE_BOUND_IDLE_COMPUTE = "DecodeBoundIdleCompute"
    PREFILL_DOMINATED = "PrefillDominated"
    COMPUTE_SATURATED = "ComputeSaturated"
    TTFT_LIMITED = "TTFTLimited"
    UNKNOWN = "Unknown"


SIGNALS = (
    "prefill_seconds",
    "decode_seconds",
    "running_batch_quantiles",
    "ttft_share",
    "dram_active",
    "sm_active",
    "tensor_active",
    "gpu_util",
)
DCGM_SIGNALS = {
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL",
}


@dataclass(frozen=True)
class PreflightThresholds:
    prefill_share_max: float = 0.5  # prefill / (prefill + decode) at or above: prefill-dominated
    decode_share_min: float = 0.7  # without DCGM, decode share needed to call it decode-bound
    ttft_share_max: float = 0.5
    dram_active_min: float = 0.5
    sm_active_max: float = 0.8
    tensor_active_max: float = 0.5
    small_batch_max: float = 8  # without DCGM: median running batch this small is memory-bound
    large_batch_min: float = 64  # without DCGM: median running batch this large is likely compute-bound


@dataclass(frozen=True)
class Preflight:
    candidate: bool
    verdict: PreflightVerdict
    reasons: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "verdict": self.verdict.value,
                "reasons": list(self.reasons), "missing": list(self.missing)}


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _frac(x: Any) -> float | None:
    """DCGM ratios are 0..1; accept 0..100 too (GPU_UTIL is a percentage)."""
    v = _num(x)
    if v is None or v < 0:
        return None
    return v / 100.0 if v > 1.0 else v


def _quantiles(x: Any) -> dict[float, float] | None:
    if not isinstance(x, Mapping) or not x:
        return None
    out = {}
    for q, v in x.items():
        qn, vn = _num(q), _num(v)
        if qn is not None and vn is not None and 0 <= qn <= 1 and vn >= 0:
            out[qn] = vn
    return out or None


def _median(q: dict[float, float]) -> float:
    """The quantile closest to 0.5."""
    return q[min(q, key=lambda k: abs(k - 0.5))]


def preflight(signals: Mapping[str, Any], thresholds: PreflightThresholds | None = None) -> Preflight:
    th = thresholds or PreflightThresholds()
    prefill, decode = _num(signals.get("prefill_seconds")), _num(signals.get("decode_seconds"))
    quant = _quantiles(signals.get("running_batch_quantiles"))
    ttft = _frac(signals.get("ttft_share"))
    dram, sm, tensor = (_frac(signals.get(k)) for k in ("dram_active", "sm_active", "tensor_active"))
    gpu_util = _frac(signals.get("gpu_util"))

    values = {"prefill_seconds": prefill, "decode_seconds": decode, "running_batch_quantiles": quant,
              "ttft_share": ttft, "dram_active": dram, "sm_active": sm, "tensor_active": tensor,
              "gpu_util": gpu_util}
    missing = [k for k in SIGNALS if values[k] is None]
    reasons: list[str] = []

    if gpu_util is not None:
        reasons.append(
            f"GPU_UTIL reads {gpu_util:.0%} but is ignored: it measures kernel residency, not arithmetic, "
            "and reads 90%+ on a memory-bound decode"
        )
    missing_dcgm = [DCGM_SIGNALS[k] for k in ("dram_active", "sm_active", "tensor_active") if values[k] is None]
    if missing_dcgm:
        note = f"missing DCGM profiling counters: {', '.join(missing_dcgm)}"
        if sm is None:
            note += " (SM_ACTIVE is off in dcgm-exporter's default collector set; enable the DCP metrics)"
        reasons.append(note)

    def result(candidate: bool, verdict: PreflightVerdict, why: list[str]) -> Preflight:
        return Preflight(candidate, verdict, why + reasons, missing)

    # 1. prefill-dominated: speeding up decode cannot move the request much
    decode_share = None
    if prefill is not None and decode is not None and prefill + decode > 0:
        decode_share = decode / (prefill + decode)
        if 1 - decode_share >= th.prefill_share_max:
            return result(False, PreflightVerdict.PREFILL_DOMINATED, [
                f"prefill takes {1 - decode_share:.0%} of request time ({prefill:.3g}s prefill vs "
                f"{decode:.3g}s decode); lookahead only speeds up decode"])

    # 2. TTFT-limited: what users wait on is the first token
    if ttft is not None and ttft >= th.ttft_share_max:
        return result(False, PreflightVerdict.TTFT_LIMITED, [
            f"time to first token is {ttft:.0%} of end-to-end latency; lookahead does not shorten it "
            "and its extra compute can lengthen it"])

    median_batch = _median(quant) if quant else None
    batch_words = f"median running batch {median_batch:g}" if median_batch is not None else "running batch unknown"

    # 3. DCGM: arithmetic pipes busy -> compute-saturated; DRAM busy, pipes idle -> decode-bound
    saturated = []
    if tensor is not None and tensor >= th.tensor_active_max:
        saturated.append(f"PIPE_TENSOR_ACTIVE {tensor:.0%}")
    if sm is not None and sm >= th.sm_active_max:
        saturated.append(f"SM_ACTIVE {sm:.0%}")
    if saturated:
        return result(False, PreflightVerdict.COMPUTE_SATURATED, [
            f"compute is already busy at the production batch ({', '.join(saturated)}, {batch_words}); "
            "lookahead's extra tokens would compete with real work"])
    compute_signals = [(n, v) for n, v in (("SM_ACTIVE", sm), ("PIPE_TENSOR_ACTIVE", tensor)) if v is not None]
    if dram is not None and dram >= th.dram_active_min and compute_signals:
        idle = ", ".join(f"{n} {v:.0%}" for n, v in compute_signals)
        why = [f"decode-bound with idle compute: DRAM_ACTIVE {dram:.0%} while {idle} ({batch_words})"]
        if decode_share is not None:
            why.append(f"decode is {decode_share:.0%} of request time")
        return result(True, PreflightVerdict.DECODE_BOUND_IDLE_COMPUTE, why)

    # 4. degraded: no usable DCGM picture, infer from request timing and batch size
    if median_batch is not None and median_batch >= th.large_batch_min:
        return result(False, PreflightVerdict.COMPUTE_SATURATED, [
            f"{batch_words}: at this batch decode is likely compute-bound (inferred without DCGM "
            "profiling counters; measure with them to be sure)"])
    if (decode_share is not None and decode_share >= th.decode_share_min
            and median_batch is not None and median_batch <= th.small_batch_max):
        return result(True, PreflightVerdict.DECODE_BOUND_IDLE_COMPUTE, [
            f"decode is {decode_share:.0%} of request time at a {batch_words}: decode-bound with spare "
            "compute, inferred without DCGM profiling counters"])

    why = ["not enough signal to classify the workload; the canary measurement will decide"]
    if decode_share is not None:
        why.append(f"decode is {decode_share:.0%} of request time")
    if dram is not None and not compute_signals:
        why.append(f"DRAM_ACTIVE {dram:.0%} but no SM_ACTIVE / PIPE_TENSOR_ACTIVE to tell whether compute is idle")
    return result(True, PreflightVerdict.UNKNOWN, why)


def production_batch_sizes(quantiles: Mapping[float, float], max_batch: int) -> list[int]:
    """`batchSizes: auto`: the running-request quantiles rounded to ints, clipped to 1..max_batch,
    plus batch 1 (the interactive case), sorted and unique."""
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    sizes = {1}
    for v in quantiles.values():
        x = _num(v)
        if x is None or x < 0:
            continue
        b = int(math.floor(x + 0.5))  # round half up
        sizes.add(min(max(b, 1), max_batch))
    return sorted(sizes)
