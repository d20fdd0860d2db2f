"""The preflight diagnostic table and batchSizes: auto."""

import math

import pytest

from lookahead_operator.measurement.preflight import (
    PreflightThresholds,
    PreflightVerdict as V,
    screen,
    production_batch_sizes,
)

DECODE_BOUND = {
    "prefill_seconds": 0.08, "decode_seconds": 2.4, "running_batch_quantiles": {0.5: 2, 0.9: 5, 0.99: 9},
    "ttft_share": 0.05, "dram_active": 0.78, "sm_active": 0.35, "tensor_active": 0.08, "gpu_util": 0.97,
    "sm_occupancy": 0.2,
}
# what dcgm-exporter 4.0+ exports out of the box: GR_ENGINE, PIPE_TENSOR and DRAM (SM_* commented out)
DEFAULT_EXPORTER = {
    "prefill_seconds": 0.08, "decode_seconds": 2.4, "running_batch_quantiles": {0.5: 2, 0.9: 5},
    "ttft_share": 0.05, "gr_engine_active": 0.9, "tensor_active": 0.06, "dram_active": 0.7, "gpu_util": 0.98,
}


def test_decode_bound_with_idle_compute_is_a_candidate_and_gpu_util_is_ignored():
    p = screen(DECODE_BOUND)
    assert p.candidate and p.verdict is V.DECODE_BOUND_IDLE_COMPUTE
    assert p.missing == ["gr_engine_active"]
    assert any("DCGM_FI_PROF_GR_ENGINE_ACTIVE" in r and "by default" in r for r in p.reasons)
    text = " ".join(p.reasons)
    assert "DRAM_ACTIVE 78%" in text and "PIPE_TENSOR_ACTIVE 8%" in text
    assert "GPU_UTIL reads 97% but is ignored" in text


def test_gpu_util_high_alone_never_means_compute_saturated():
    # only GPU_UTIL at 99% plus a decode-heavy, small-batch workload: still a candidate
    p = screen({"gpu_util": 99, "prefill_seconds": 0.1, "decode_seconds": 3.0,
                   "running_batch_quantiles": {0.5: 1}})
    assert p.verdict is V.DECODE_BOUND_IDLE_COMPUTE and p.candidate
    assert any("GPU_UTIL reads 99%" in r for r in p.reasons)


def test_prefill_dominated():
    p = screen({**DECODE_BOUND, "prefill_seconds": 3.0, "decode_seconds": 1.0})
    assert not p.candidate and p.verdict is V.PREFILL_DOMINATED
    assert "75%" in p.reasons[0]


def test_ttft_limited():
    p = screen({**DECODE_BOUND, "ttft_share": 0.6})
    assert not p.candidate and p.verdict is V.TTFT_LIMITED


@pytest.mark.parametrize("over", [{"tensor_active": 0.7}, {"sm_active": 0.9}])
def test_compute_saturated_from_dcgm(over):
    p = screen({**DECODE_BOUND, **over, "running_batch_quantiles": {0.5: 48}})
    assert not p.candidate and p.verdict is V.COMPUTE_SATURATED
    assert "median running batch 48" in p.reasons[0]


def test_dcgm_exporter_defaults_are_enough_and_sm_counters_are_named_as_opt_in():
    p = screen(DEFAULT_EXPORTER)
    # tensor pipe idle while DRAM busy: a confident decode-bound verdict without SM_ACTIVE
    assert p.verdict is V.DECODE_BOUND_IDLE_COMPUTE and p.candidate
    assert p.missing == ["sm_active", "sm_occupancy"]
    opt_in = [r for r in p.reasons if "DCGM_FI_PROF_SM_ACTIVE" in r]
    assert len(opt_in) == 1 and "DCGM_FI_PROF_SM_OCCUPANCY" in opt_in[0]
    assert "commented out in both counter CSVs" in opt_in[0] and "uncomment" in opt_in[0]
    # the default-on counters are not reported missing
    assert not any("by default" in r for r in p.reasons)
    assert any(r.startswith("GR_ENGINE_ACTIVE 90%") for r in p.reasons)


def test_missing_default_counters_say_profiling_is_off_or_labels_do_not_match():
    p = screen({"prefill_seconds": 0.05, "decode_seconds": 1.5, "running_batch_quantiles": {0.5: 3}})
    text = [r for r in p.reasons if "by default" in r]
    assert len(text) == 1
    for name in ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        assert name in text[0]
    assert "DCGM_FI_PROF_SM_ACTIVE" not in text[0]
    assert "exported_namespace/exported_pod" in text[0] and "profiling" in text[0]


def test_counters_are_read_as_a_share_of_busy_time():
    # half-loaded GPU: DRAM 40% of the window is 80% of the time it runs kernels
    light = {"gr_engine_active": 0.5, "dram_active": 0.4, "tensor_active": 0.1, "running_batch_quantiles": {0.5: 2}}
    p = screen(light)
    assert p.verdict is V.DECODE_BOUND_IDLE_COMPUTE
    assert "DRAM_ACTIVE 80% while busy (40% of the window)" in p.reasons[0]
    assert "PIPE_TENSOR_ACTIVE 20% while busy" in p.reasons[0]
    # without GR_ENGINE_ACTIVE the same raw numbers do not show memory pressure
    raw = screen({k: v for k, v in light.items() if k != "gr_engine_active"})
    assert raw.verdict is V.UNKNOWN
    # tensor pipe 30% of a 50%-busy window is 60% while busy: saturated
    sat = screen({**light, "tensor_active": 0.3})
    assert sat.verdict is V.COMPUTE_SATURATED and "PIPE_TENSOR_ACTIVE 60% while busy" in sat.reasons[0]
    # an almost idle GPU: nothing is scaled up from noise
    idle = screen({**light, "gr_engine_active": 0.02})
    assert idle.verdict is V.UNKNOWN
    assert any("almost idle" in r for r in idle.reasons)


def test_gr_engine_active_alone_is_never_saturation():
    p = screen({"gr_engine_active": 1.0, "gpu_util": 100, "prefill_seconds": 0.1, "decode_seconds": 3.0,
                   "running_batch_quantiles": {0.5: 1}})
    assert p.candidate and p.verdict is V.DECODE_BOUND_IDLE_COMPUTE


def test_sm_occupancy_counts_only_when_low():
    base = {"dram_active": 0.8, "running_batch_quantiles": {0.5: 16}}
    low = screen({**base, "sm_occupancy": 0.2})
    assert low.verdict is V.DECODE_BOUND_IDLE_COMPUTE and "SM_OCCUPANCY 20%" in low.reasons[0]
    high = screen({**base, "sm_occupancy": 0.9})
    # memory-bound kernels can keep warps resident: not saturation, not idle compute either
    assert high.verdict is V.UNKNOWN and high.candidate


def test_no_dcgm_at_all_degrades_to_timing_and_batch():
    sig = {"prefill_seconds": 0.05, "decode_seconds": 1.5, "running_batch_quantiles": {0.5: 3, 0.9: 6}}
    p = screen(sig)
    assert p.candidate and p.verdict is V.DECODE_BOUND_IDLE_COMPUTE
    assert set(p.missing) == {"ttft_share", "dram_active", "gr_engine_active", "sm_active", "sm_occupancy",
                              "tensor_active", "gpu_util"}
    assert any("inferred without DCGM" in r for r in p.reasons)
    assert any("DCGM_FI_PROF_DRAM_ACTIVE" in r for r in p.reasons)
    big = screen({**sig, "running_batch_quantiles": {0.5: 96}})
    assert not big.candidate and big.verdict is V.COMPUTE_SATURATED


def test_dram_active_without_compute_counters_is_unknown_but_still_measured():
    p = screen({"dram_active": 0.8, "running_batch_quantiles": {0.5: 16}})
    assert p.verdict is V.UNKNOWN and p.candidate
    assert any("no SM_ACTIVE / PIPE_TENSOR_ACTIVE" in r for r in p.reasons)


def test_nothing_known_is_unknown_candidate_with_everything_missing():
    p = screen({"prefill_seconds": math.nan, "ttft_share": None, "running_batch_quantiles": {}})
    assert p.verdict is V.UNKNOWN and p.candidate
    assert len(p.missing) == 10


def test_thresholds_are_configurable():
    p = screen({**DECODE_BOUND, "tensor_active": 0.3}, PreflightThresholds(tensor_active_max=0.25))
    assert p.verdict is V.COMPUTE_SATURATED


def test_production_batch_sizes():
    assert production_batch_sizes({0.5: 3.4, 0.9: 7.5, 0.99: 12.2}, 64) == [1, 3, 8, 12]
    assert production_batch_sizes({0.5: 0.2, 0.9: 200.0}, 32) == [1, 32]
    assert production_batch_sizes({0.5: 4.0, 0.75: 4.4, 0.9: math.nan}, 64) == [1, 4]
    assert production_batch_sizes({}, 8) == [1]
    with pytest.raises(ValueError):
        production_batch_sizes({0.5: 1}, 0)
