"""The preflight diagnostic table and batchSizes: auto."""

import math

import pytest

from lookahead_operator.preflight import (
    PreflightThresholds,
    PreflightVerdict as V,
    preflight,
    production_batch_sizes,
)

DECODE_BOUND = {
    "prefill_seconds": 0.08, "decode_seconds": 2.4, "running_batch_quantiles": {0.5: 2, 0.9: 5, 0.99: 9},
    "ttft_share": 0.05, "dram_active": 0.78, "sm_active": 0.35, "tensor_active": 0.08, "gpu_util": 0.97,
}


def test_decode_bound_with_idle_compute_is_a_candidate_and_gpu_util_is_ignored():
    p = preflight(DECODE_BOUND)
    assert p.candidate and p.verdict is V.DECODE_BOUND_IDLE_COMPUTE
    assert p.missing == []
    text = " ".join(p.reasons)
    assert "DRAM_ACTIVE 78%" in text and "PIPE_TENSOR_ACTIVE 8%" in text
    assert "GPU_UTIL reads 97% but is ignored" in text


def test_gpu_util_high_alone_never_means_compute_saturated():
    # only GPU_UTIL at 99% plus a decode-heavy, small-batch workload: still a candidate
    p = preflight({"gpu_util": 99, "prefill_seconds": 0.1, "decode_seconds": 3.0,
                   "running_batch_quantiles": {0.5: 1}})
    assert p.verdict is V.DECODE_BOUND_IDLE_COMPUTE and p.candidate
    assert any("GPU_UTIL reads 99%" in r for r in p.reasons)


def test_prefill_dominated():
    p = preflight({**DECODE_BOUND, "prefill_seconds": 3.0, "decode_seconds": 1.0})
    assert not p.candidate and p.verdict is V.PREFILL_DOMINATED
    assert "75%" in p.reasons[0]


def test_ttft_limited():
    p = preflight({**DECODE_BOUND, "ttft_share": 0.6})
    assert not p.candidate and p.verdict is V.TTFT_LIMITED


@pytest.mark.parametrize("over", [{"tensor_active": 0.7}, {"sm_active": 0.9}])
def test_compute_saturated_from_dcgm(over):
    p = preflight({**DECODE_BOUND, **over, "running_batch_quantiles": {0.5: 48}})
    assert not p.candidate and p.verdict is V.COMPUTE_SATURATED
    assert "median running batch 48" in p.reasons[0]


def test_missing_sm_active_is_named_with_the_default_collector_note_and_degrades():
    sig = {k: v for k, v in DECODE_BOUND.items() if k != "sm_active"}
    p = preflight(sig)
    # tensor pipe is still there: still a confident decode-bound verdict
    assert p.verdict is V.DECODE_BOUND_IDLE_COMPUTE
    assert p.missing == ["sm_active"]
    assert any("DCGM_FI_PROF_SM_ACTIVE" in r and "default collector" in r for r in p.reasons)


def test_no_dcgm_at_all_degrades_to_timing_and_batch():
    sig = {"prefill_seconds": 0.05, "decode_seconds": 1.5, "running_batch_quantiles": {0.5: 3, 0.9: 6}}
    p = preflight(sig)
    assert p.candidate and p.verdict is V.DECODE_BOUND_IDLE_COMPUTE
    assert set(p.missing) == {"ttft_share", "dram_active", "sm_active", "tensor_active", "gpu_util"}
    assert any("inferred without DCGM" in r for r in p.reasons)
    assert any("DCGM_FI_PROF_DRAM_ACTIVE" in r for r in p.reasons)
    big = preflight({**sig, "running_batch_quantiles": {0.5: 96}})
    assert not big.candidate and big.verdict is V.COMPUTE_SATURATED


def test_dram_active_without_compute_counters_is_unknown_but_still_measured():
    p = preflight({"dram_active": 0.8, "running_batch_quantiles": {0.5: 16}})
    assert p.verdict is V.UNKNOWN and p.candidate
    assert any("no SM_ACTIVE / PIPE_TENSOR_ACTIVE" in r for r in p.reasons)


def test_nothing_known_is_unknown_candidate_with_everything_missing():
    p = preflight({"prefill_seconds": math.nan, "ttft_share": None, "running_batch_quantiles": {}})
    assert p.verdict is V.UNKNOWN and p.candidate
    assert len(p.missing) == 8


def test_thresholds_are_configurable():
    p = preflight({**DECODE_BOUND, "tensor_active": 0.3}, PreflightThresholds(tensor_active_max=0.25))
    assert p.verdict is V.COMPUTE_SATURATED


def test_production_batch_sizes():
    assert production_batch_sizes({0.5: 3.4, 0.9: 7.5, 0.99: 12.2}, 64) == [1, 3, 8, 12]
    assert production_batch_sizes({0.5: 0.2, 0.9: 200.0}, 32) == [1, 32]
    assert production_batch_sizes({0.5: 4.0, 0.75: 4.4, 0.9: math.nan}, 64) == [1, 4]
    assert production_batch_sizes({}, 8) == [1]
    with pytest.raises(ValueError):
        production_batch_sizes({0.5: 1}, 0)
