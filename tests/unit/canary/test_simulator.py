"""Properties of the roofline simulator: the known LLM effect and the engine-facing interface."""

import json

import numpy as np
import pytest

from lookahead_canary.simulator import (
    GPU_PRESETS,
    MODEL_PRESETS,
    RooflineSimulator,
    SimConfig,
    SimStep,
    crossover_batch_size,
)

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.mark.parametrize("method", ["jacobi", "ngram"])
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm", "h200", "l4"])
def test_lookahead_faster_at_batch_1_and_gain_shrinks_with_batch(method, gpu):
    sim = RooflineSimulator(SimConfig(gpu=gpu, model="llama-3-8b", method=method, noise_sigma=0))
    ratios = [sim.expected_per_token_seconds(b, True) / sim.expected_per_token_seconds(b, False) for b in BATCHES]
    assert ratios[0] < 0.8, "at batch 1 lookahead must cut per-token latency clearly"
    # in the memory-bound regime the fixed speculation overhead is diluted by KV reads, so the
    # ratio may improve by a hair; it must never improve materially
    assert all(b >= a * 0.98 for a, b in zip(ratios, ratios[1:])), f"gain must shrink with batch: {ratios}"
    assert ratios[-1] > ratios[0] * 1.2


def test_jacobi_loses_throughput_at_high_batch_once_compute_bound():
    sim = RooflineSimulator(SimConfig(gpu="a100-80gb", model="llama-3-8b", method="jacobi", noise_sigma=0))
    assert not sim.is_compute_bound(1, True)
    assert sim.expected_throughput(1, True) > sim.expected_throughput(1, False)
    assert sim.is_compute_bound(64, True)
    assert sim.expected_throughput(64, True) < 0.9 * sim.expected_throughput(64, False)
    c = crossover_batch_size(sim)
    assert c is not None and 2 <= c <= 64
    # below the crossover speculation pays, from it on it does not
    assert sim.expected_throughput(c - 1, True) > sim.expected_throughput(c - 1, False)
    assert sim.expected_throughput(c, True) <= sim.expected_throughput(c, False)


def test_ngram_crossover_later_than_jacobi():
    j = RooflineSimulator(SimConfig(method="jacobi", noise_sigma=0))
    n = RooflineSimulator(SimConfig(method="ngram", noise_sigma=0))
    cj, cn = crossover_batch_size(j, 512), crossover_batch_size(n, 512)
    assert cj is not None and cn is not None and cn > cj  # fewer extra tokens per step: pays longer


def test_greedy_step_is_one_token_no_drafts():
    sim = RooflineSimulator(SimConfig(method="jacobi"), seed=1)
    for speculate in (False, True):
        s = RooflineSimulator(SimConfig(method="greedy"), seed=1).decode_step(4, speculate)
        assert s.accepted_tokens == [1, 1, 1, 1] and s.draft_tokens == [0, 0, 0, 0]
    s = sim.decode_step(3, speculate=False)
    assert isinstance(s, SimStep)
    assert s.accepted_tokens == [1, 1, 1] and s.draft_tokens == [0, 0, 0] and s.seconds > 0


def test_speculative_step_accepts_between_1_and_cap_with_geometric_mean():
    cfg = SimConfig(method="jacobi", ngram=5, guess_set=7, acceptance=0.6)
    sim = RooflineSimulator(cfg, seed=2)
    acc = np.concatenate([sim.decode_step(64, True).accepted_tokens for _ in range(300)])
    assert acc.min() >= 1 and acc.max() <= 1 + (cfg.ngram - 1)
    assert acc.max() == 5  # the cap is reachable
    assert abs(acc.mean() - sim.expected_tokens_per_step(True)) < 0.05
    assert sim.decode_step(2, True).draft_tokens == [cfg.guess_set * (cfg.ngram - 1)] * 2
    ng = RooflineSimulator(SimConfig(method="ngram", num_speculative_tokens=3), seed=0)
    assert ng.decode_step(2, True).draft_tokens == [3, 3]
    assert max(max(ng.decode_step(16, True).accepted_tokens) for _ in range(200)) == 4


def test_tokens_processed_formula():
    assert SimConfig(method="jacobi", window=7, ngram=5, guess_set=7).tokens_processed(True) == 1 + 14 * 4
    assert SimConfig(method="ngram", num_speculative_tokens=4).tokens_processed(True) == 5
    assert SimConfig(method="jacobi").tokens_processed(False) == 1


def test_noise_is_lognormal_around_the_roofline_and_time_scale_multiplies():
    cfg = SimConfig(noise_sigma=0.1)
    sim = RooflineSimulator(cfg, seed=3)
    xs = np.array([sim.decode_step(8, False).seconds for _ in range(4000)])
    expected = sim.expected_step_seconds(8, False)
    assert abs(np.median(xs) / expected - 1) < 0.01
    assert abs(np.std(np.log(xs)) - 0.1) < 0.01
    fast = RooflineSimulator(SimConfig(noise_sigma=0.1, time_scale=0.01), seed=3)
    assert fast.decode_step(8, False).seconds == pytest.approx(xs[0] * 0.01)
    assert fast.prefill_seconds(100) < sim.prefill_seconds(100)


def test_seed_makes_runs_reproducible():
    a = RooflineSimulator(SimConfig(), seed=7)
    b = RooflineSimulator(SimConfig(), seed=7)
    for _ in range(5):
        sa, sb = a.decode_step(4, True), b.decode_step(4, True)
        assert sa == sb


def test_prefill_grows_with_prompt_and_is_compute_bound_for_long_prompts():
    sim = RooflineSimulator(SimConfig(noise_sigma=0), seed=0)
    assert sim.prefill_seconds(4096) > 5 * sim.prefill_seconds(16)
    with pytest.raises(ValueError):
        sim.prefill_seconds(-1)


def test_from_json_presets_overrides_and_speculative_config():
    sim = RooflineSimulator.from_json(
        json.dumps({"gpu": "cpu-2core", "model": "smollm2-135m", "time_scale": 0.5,
                    "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}),
        seed=0,
    )
    assert sim.config.method == "ngram" and sim.config.num_speculative_tokens == 3
    assert sim.config.gpu_spec == GPU_PRESETS["cpu-2core"]
    assert sim.config.model_spec == MODEL_PRESETS["smollm2-135m"]
    cfg = SimConfig.from_json(json.dumps({"gpu": "custom", "hbm_bandwidth": 1e12, "flops": 1e14,
                                          "step_overhead_s": 0.001}))
    assert cfg.gpu_spec.hbm_bandwidth == 1e12
    assert SimConfig.from_json(cfg.to_json()) == cfg
    assert SimConfig.from_json("") == SimConfig()
    with pytest.raises(ValueError):
        SimConfig.from_json('{"gpu": "tpu-v9"}')
    with pytest.raises(ValueError):
        SimConfig.from_json('{"bogus": 1}')
    with pytest.raises(ValueError):
        SimConfig(method="medusa")
    with pytest.raises(ValueError):
        RooflineSimulator(SimConfig()).decode_step(0, True)


def test_vectorised_samples_match_expected_per_token_latency():
    sim = RooflineSimulator(SimConfig(noise_sigma=0.05), seed=4)
    for spec in (False, True):
        xs = sim.per_token_seconds_samples(1, spec, n=3000, steps_per_sample=16)
        # per-token mean ~ E[time]/E[tokens] for long averages (ratio estimator)
        target = sim.expected_step_seconds(1, spec) * np.exp(0.05**2 / 2) / sim.expected_tokens_per_step(spec)
        assert abs(xs.mean() / target - 1) < 0.03


def test_drift_is_one_draw_per_period_of_wall_time():
    sim = RooflineSimulator(SimConfig(gpu="cpu-2core", model="smollm2-135m", drift_sigma=0.1, drift_period_s=3.0),
                            seed=1)
    a, b = sim.drift(now=30.0), sim.drift(now=32.9)
    assert a == b != 1.0                      # the same period: the same factor
    c = sim.drift(now=33.0)
    assert c != a                             # the next period: a new draw
    factors = [sim.drift(now=3.0 * i) for i in range(2000)]
    assert abs(np.std(np.log(factors)) - 0.1) < 0.01
    # without drift the machine keeps its speed
    assert RooflineSimulator(SimConfig()).drift(now=5.0) == 1.0


def test_drift_settings_are_checked():
    with pytest.raises(ValueError, match="drift"):
        SimConfig(drift_sigma=-0.1)
    with pytest.raises(ValueError, match="drift"):
        SimConfig(drift_period_s=0)


def _e2e_presets():
    """The e2e fleets' simulator configurations (tests/e2e/helpers.py), loaded by path."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "e2e" / "helpers.py"
    spec = importlib.util.spec_from_file_location("e2e_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_e2e_mild_preset_costs_20_percent_throughput_at_every_batch_size_and_nothing_when_off():
    """MILD_GPU, the guard test's chat-b: lookahead on costs 20% (+-1%) of throughput at every
    batch size up to 16 (the fleet runs a few at a time); lookahead off it is GOOD_GPU's machine,
    so the control cloned from chat-a is a fair baseline for it."""
    h = _e2e_presets()
    # the tests' usual lookahead (window and guess set 7) and the guard test's (3)
    for lookahead in ({"window": 7, "guess_set": 7}, {"window": 3, "guess_set": 3}):
        mild = RooflineSimulator(SimConfig.from_dict({**h.MILD_GPU, **lookahead}))
        good = RooflineSimulator(SimConfig.from_dict({**h.GOOD_GPU, **lookahead}))
        for batch in (1, 2, 3, 4, 8, 16):
            loss = 1 - mild.expected_throughput(batch, True) / mild.expected_throughput(batch, False)
            assert 0.19 <= loss <= 0.21, (lookahead, batch, loss)
            assert mild.expected_per_token_seconds(batch, False) == pytest.approx(
                good.expected_per_token_seconds(batch, False), rel=1e-9)
