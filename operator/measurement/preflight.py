"""Preflight: is this workload a lookahead candidate at all? And which batch sizes to measure.

The diagnostic table, as code. Lookahead trades spare compute for fewer sequential decode steps,
so it can only pay where decode dominates the request, where time-to-first-token is not what
users wait on, and where the GPU has idle arithmetic during decode:

| signal                                   | reading                          | verdict                  |
|------------------------------------------|----------------------------------|--------------------------|
| prefill seconds / (prefill + decode)     | >= prefill_share_max (0.5)       | PrefillDominated         |
| TTFT / e2e latency                       | >= ttft_share_max (0.5)          | TTFTLimited              |
| DCGM SM_ACTIVE or PIPE_TENSOR_ACTIVE     | high (>= 0.8 / >= 0.5)           | ComputeSaturated         |
| DCGM DRAM_ACTIVE high, compute idle      | >= 0.5, and SM_ACTIVE < 0.8 /    | DecodeBoundIdleCompute   |
|                                          | PIPE_TENSOR < 0.5 / SM_OCCUPANCY |                          |
|                                          | < 0.5 (whichever are exported)   |                          |
| no DCGM: decode share high, batch small  | >= 0.7 and p50 running <= 8      | DecodeBoundIdleCompute   |
| no DCGM: median running batch large      | p50 running >= 64                | ComputeSaturated         |
| anything else                            |                                  | Unknown (measure anyway) |

DCGM counters are window means, so a lightly loaded GPU reads low on every one of them. With
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` (the share of time any kernel runs) the others are read **while
busy** (counter / GR_ENGINE_ACTIVE, at most 1) before the thresholds apply; GR_ENGINE_ACTIVE
itself, like `DCGM_FI_DEV_GPU_UTIL`, is residency, not arithmetic, and is never evidence of
saturation. `DCGM_FI_DEV_GPU_UTIL` reads 90%+ on a memory-bound decode and is never taken as "no
spare compute". SM_OCCUPANCY (warps resident) only ever counts as evidence of idle compute when
low: memory-bound kernels can keep many warps resident. Unknown stays a candidate: the canary
measurement is what decides; the preflight only stops clear non-candidates.

dcgm-exporter (4.0 and later) enables GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE and DRAM_ACTIVE in the
counter CSVs it ships; SM_ACTIVE and SM_OCCUPANCY are commented out in both. A missing counter
is named with a hint that says which case it is (``DCGM_MISSING_HINTS``).

Signals (keys of the input dict; every one may be missing or None):
    prefill_seconds, decode_seconds       mean per request (vllm:request_prefill_time_seconds,
                                          vllm:request_decode_time_seconds)
    running_batch_quantiles               {0.5: 3.0, 0.9: 7.2, ...} of vllm:num_requests_running
    ttft_share                            TTFT / e2e request latency, 0..1
    dram_active, sm_active, tensor_active DCGM_FI_PROF_DRAM_ACTIVE / SM_ACTIVE / PIPE_TENSOR_ACTIVE, 0..1
    gr_engine_active, sm_occupancy        DCGM_FI_PROF_GR_ENGINE_ACTIVE / SM_OCCUPANCY, 0..1
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
    "DCGM_DEFAULT_ON",
    "DCGM_MISSING_HINTS",
    "screen",
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
    "gr_engine_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "gpu_util",
)
#: The DCGM fields the preflight reads (signal key -> dcgm-exporter metric name).
DCGM_SIGNALS = {
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "sm_occupancy": "DCGM_FI_PROF_SM_OCCUPANCY",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL",
}
#: On in the counter CSVs dcgm-exporter ships (4.0 and later: etc/default-counters.csv and
#: etc/dcp-metrics-included.csv); SM_ACTIVE and SM_OCCUPANCY are commented out in both.
DCGM_DEFAULT_ON = frozenset({"dram_active", "gr_engine_active", "tensor_active", "gpu_util"})

_PROF_OFF = ("profiling (DCP) metrics are not being collected: the GPU has none (DCP needs a datacenter GPU, "
             "Volta or newer), DCGM's profiling module is not loaded, or another profiler holds the counters")
_LABELS = ("or the series are not labelled with the pod's namespace and pod (dcgm-exporter's Kubernetes "
           "mapping; matched as namespace/pod or, scraped with honorLabels: false, exported_namespace/exported_pod)")
_OPT_IN = ("is commented out in both counter CSVs dcgm-exporter ships (default-counters.csv, "
           "dcp-metrics-included.csv); uncomment it in the CSV the exporter runs with (-f FILE, or a ConfigMap "
           "given with -m NAMESPACE:NAME)")
#: Why each DCGM signal may be missing, in words (printed in status reasons and observations).
DCGM_MISSING_HINTS = {
    "dram_active": f"DCGM_FI_PROF_DRAM_ACTIVE is on by default in dcgm-exporter 4.0+; missing means {_PROF_OFF}, "
                   f"{_LABELS}",
    "gr_engine_active": f"DCGM_FI_PROF_GR_ENGINE_ACTIVE is on by default in dcgm-exporter 4.0+; missing means "
                        f"{_PROF_OFF}, {_LABELS}",
    "tensor_active": f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE is on by default in dcgm-exporter 4.0+; missing means "
                     f"{_PROF_OFF}, {_LABELS}",
    "sm_active": f"DCGM_FI_PROF_SM_ACTIVE {_OPT_IN} (optional: PIPE_TENSOR_ACTIVE already shows idle tensor cores)",
    "sm_occupancy": f"DCGM_FI_PROF_SM_OCCUPANCY {_OPT_IN} (optional)",
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL not exported (it is kernel residency, not arithmetic load, and is never used "
                f"to judge spare compute), {_LABELS}",
}


@dataclass(frozen=True)
class PreflightThresholds:
    prefill_share_max: float = 0.5  # prefill / (prefill + decode) at or above: prefill-dominated
    decode_share_min: float = 0.7  # without DCGM, decode share needed to call it decode-bound
    ttft_share_max: float = 0.5
    dram_active_min: float = 0.5
    sm_active_max: float = 0.8
    tensor_active_max: float = 0.5
    sm_occupancy_max: float = 0.5  # below: warps are not resident, compute idles (never saturation evidence)
    gr_engine_active_min: float = 0.05  # below: the GPU is idle; counters are not scaled to busy time
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


def screen(signals: Mapping[str, Any], thresholds: PreflightThresholds | None = None) -> Preflight:
    th = thresholds or PreflightThresholds()
    prefill, decode = _num(signals.get("prefill_seconds")), _num(signals.get("decode_seconds"))
    quant = _quantiles(signals.get("running_batch_quantiles"))
    ttft = _frac(signals.get("ttft_share"))
    dram, gr, sm, occ, tensor = (_frac(signals.get(k)) for k in ("dram_active", "gr_engine_active", "sm_active",
                                                                   "sm_occupancy", "tensor_active"))
    gpu_util = _frac(signals.get("gpu_util"))

    values = {"prefill_seconds": prefill, "decode_seconds": decode, "running_batch_quantiles": quant,
              "ttft_share": ttft, "dram_active": dram, "gr_engine_active": gr, "sm_active": sm,
              "sm_occupancy": occ, "tensor_active": tensor, "gpu_util": gpu_util}
    missing = [k for k in SIGNALS if values[k] is None]
    reasons: list[str] = []

    if gpu_util is not None:
        reasons.append(
            f"GPU_UTIL reads {gpu_util:.0%} but is ignored: it measures kernel residency, not arithmetic, "
            "and reads 90%+ on a memory-bound decode"
        )
    missing_default = [DCGM_SIGNALS[k] for k in DCGM_SIGNALS if k != "gpu_util" and values[k] is None
                       and k in DCGM_DEFAULT_ON]
    missing_opt_in = [DCGM_SIGNALS[k] for k in DCGM_SIGNALS if values[k] is None and k not in DCGM_DEFAULT_ON]
    if missing_default:
        reasons.append(f"missing DCGM profiling counters that dcgm-exporter 4.0+ exports by default: "
                       f"{', '.join(missing_default)} ({_PROF_OFF}, {_LABELS})")
    if missing_opt_in:
        reasons.append(f"not exported: {', '.join(missing_opt_in)}; each is commented out in both counter CSVs "
                       "dcgm-exporter ships (default-counters.csv, dcp-metrics-included.csv): uncomment it in the "
                       "CSV the exporter runs with (-f FILE, or a ConfigMap given with -m NAMESPACE:NAME) to use it")

    # DCGM counters are window means: scale them to the time the GPU was busy (GR_ENGINE_ACTIVE)
    busy = gr is not None and gr >= th.gr_engine_active_min

    def scaled(x: float | None) -> float | None:
        return None if x is None else (min(1.0, x / gr) if busy else x)

    def words(name: str, raw: float) -> str:
        return f"{name} {scaled(raw):.0%} while busy ({raw:.0%} of the window)" if busy else f"{name} {raw:.0%}"

    if gr is not None:
        reasons.append(
            (f"GR_ENGINE_ACTIVE {gr:.0%}: the GPU runs kernels {gr:.0%} of the time; the other DCGM counters are "
             "read as a share of that busy time (GR_ENGINE_ACTIVE is residency, never evidence of saturation)")
            if busy else
            (f"GR_ENGINE_ACTIVE {gr:.0%}: the GPU is almost idle over the window (light load), so the DCGM "
             "counters say little"))
    dram_b, sm_b, occ_b, tensor_b = scaled(dram), scaled(sm), scaled(occ), scaled(tensor)

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
    if tensor_b is not None and tensor_b >= th.tensor_active_max:
        saturated.append(words("PIPE_TENSOR_ACTIVE", tensor))
    if sm_b is not None and sm_b >= th.sm_active_max:
        saturated.append(words("SM_ACTIVE", sm))
    if saturated:
        return result(False, PreflightVerdict.COMPUTE_SATURATED, [
            f"compute is already busy at the production batch ({', '.join(saturated)}, {batch_words}); "
            "lookahead's extra tokens would compete with real work"])
    # none is saturated here: SM_ACTIVE and PIPE_TENSOR_ACTIVE, when present, are low; SM_OCCUPANCY
    # counts only when it is low itself
    compute_signals = [(n, raw) for n, raw, b in (("SM_ACTIVE", sm, sm_b), ("PIPE_TENSOR_ACTIVE", tensor, tensor_b),
                                                  ("SM_OCCUPANCY", occ, occ_b))
                       if b is not None and (n != "SM_OCCUPANCY" or b < th.sm_occupancy_max)]
    if dram_b is not None and dram_b >= th.dram_active_min and compute_signals:
        idle = ", ".join(words(n, v) for n, v in compute_signals)
        why = [f"decode-bound with idle compute: {words('DRAM_ACTIVE', dram)} while {idle} ({batch_words})"]
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
        why.append(f"{words('DRAM_ACTIVE', dram)} but no SM_ACTIVE / PIPE_TENSOR_ACTIVE (or a low SM_OCCUPANCY) to "
                   "tell whether compute is idle")
    elif dram_b is not None and dram_b < th.dram_active_min:
        why.append(f"{words('DRAM_ACTIVE', dram)}: memory is not the bottleneck either")
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
