"""Roofline simulator of batched LLM decoding, with and without lookahead / n-gram speculation.

Ground truth for testing the statistics and a backend of the engine server
(`--backend simulate --sim-config JSON`).

Model of one decode step for a batch of B sequences (each at `context_tokens` of context):

    tokens processed per sequence  T = 1                        (greedy, or speculate=False)
                                      1 + (W + G) * (N - 1)      (Jacobi lookahead, Fu et al. 2024)
                                      1 + k                      (n-gram prompt lookup, vLLM `ngram`)
    memory seconds   = (model bytes + B * context * KV bytes per token) / HBM bandwidth
    compute seconds  = 2 * params * B * T / achievable FLOP rate
    step seconds     = (max(memory, compute) + overhead [+ speculation overhead]) * noise * drift * time_scale

    noise ~ lognormal(0, noise_sigma)   (multiplicative, median 1), drawn every step
    drift ~ lognormal(0, drift_sigma)   drawn anew every drift_period_s of wall time: the machine's
                                        speed wandering (other processes, frequency), which a
                                        measurement round cannot average away as it does per-step noise

Accepted tokens per sequence per step: 1 bonus token plus the number of leading draft tokens
accepted, each accepted with probability `acceptance` until the first rejection, capped at the
longest verifiable draft (N - 1 for Jacobi, k for n-gram): a truncated geometric distribution.
Its mean is (1 - a^(cap+1)) / (1 - a).

This reproduces the known LLM effect: at batch 1 decode is memory-bound, the extra tokens are
almost free and lookahead cuts per-token latency; as the batch grows the step becomes
compute-bound, the extra FLOPs cost real time, the gain shrinks and finally reverses into a
throughput loss.

An injected fault for tests of a rollout's safety abort: with `speculative_error_rate` > 0, a
request fails (an engine error) with that probability on its first step that really speculates,
decided once per request with the simulator's seeded RNG (`sample_speculative_error`); a request
whose steps never speculate (method "greedy", or speculate=False) never fails. The decision is the
decoder's to apply (scheduler.SimulatedDecoder); at the default 0 nothing is drawn.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "GpuSpec",
    "ModelSpec",
    "SimConfig",
    "SimStep",
    "RooflineSimulator",
]


@dataclass(frozen=True)
class GpuSpec:
    hbm_bandwidth: float  # bytes/s achievable on decode (already derated from the datasheet)
    flops: float  # FLOP/s achievable on dense bf16 matmuls (derated)
    step_overhead_s: float  # per-step fixed cost: kernel launches, scheduler, sampling


@dataclass(frozen=True)
class ModelSpec:
    params: float  # parameter count
    bytes_per_param: float  # 2 for bf16/fp16
    kv_bytes_per_token: float  # 2 (K,V) * layers * kv_heads * head_dim * bytes

    @property
    def model_bytes(self) -> float:
        return self.params * self.bytes_per_param


def _overridden(preset, **values):
    """The preset with each value the config sets (not None) in place of the preset's."""
    return dataclasses.replace(preset, **{k: v for k, v in values.items() if v is not None})


# Datasheet numbers derated to what decode kernels reach in practice (~80% of HBM bandwidth,
# ~60% of dense bf16 FLOPs). Approximate by design: the point is the shape, not the digits.
GPU_PRESETS: dict[str, GpuSpec] = {
    "a100-80gb": GpuSpec(hbm_bandwidth=0.8 * 2.039e12, flops=0.6 * 312e12, step_overhead_s=4e-3),
    "h100-sxm": GpuSpec(hbm_bandwidth=0.8 * 3.35e12, flops=0.6 * 989e12, step_overhead_s=3e-3),
    "h200": GpuSpec(hbm_bandwidth=0.8 * 4.8e12, flops=0.6 * 989e12, step_overhead_s=3e-3),
    "l4": GpuSpec(hbm_bandwidth=0.8 * 300e9, flops=0.6 * 121e12, step_overhead_s=4e-3),
    # Two CPU cores running the reference engine (torch, fp32): ~12 greedy tokens/s on SmolLM2.
    "cpu-2core": GpuSpec(hbm_bandwidth=15e9, flops=150e9, step_overhead_s=30e-3),
}

MODEL_PRESETS: dict[str, ModelSpec] = {
    # 32 layers, 8 KV heads, head dim 128, bf16
    "llama-3-8b": ModelSpec(params=8.03e9, bytes_per_param=2, kv_bytes_per_token=2 * 32 * 8 * 128 * 2),
    # 80 layers, 8 KV heads, head dim 128
    "llama-3-70b": ModelSpec(params=70.6e9, bytes_per_param=2, kv_bytes_per_token=2 * 80 * 8 * 128 * 2),
    # 32 layers, 32 KV heads (MHA), head dim 128
    "llama-2-7b": ModelSpec(params=6.74e9, bytes_per_param=2, kv_bytes_per_token=2 * 32 * 32 * 128 * 2),
    # 28 layers, 4 KV heads, head dim 128
    "qwen2.5-7b": ModelSpec(params=7.62e9, bytes_per_param=2, kv_bytes_per_token=2 * 28 * 4 * 128 * 2),
    # 30 layers, 3 KV heads, head dim 64, fp32 on CPU
    "smollm2-135m": ModelSpec(params=134.5e6, bytes_per_param=4, kv_bytes_per_token=2 * 30 * 3 * 64 * 4),
    # 32 layers, 32 KV heads (MHA), head dim 64, fp32 on CPU
    "smollm2-1.7b": ModelSpec(params=1.71e9, bytes_per_param=4, kv_bytes_per_token=2 * 24 * 32 * 64 * 4),
}

_METHODS = ("greedy", "jacobi", "ngram")


@dataclass
class SimConfig:
    """What is simulated. Presets fill hardware and model; any explicit field overrides them.

    `method` is what a speculating step does ("greedy" never speculates). `acceptance` is the
    per-draft-token acceptance probability of the truncated geometric distribution.

    `speculative_error_rate` (an injected fault, default 0: none) is the probability that a request
    fails at its first step that really speculates, decided once per request with the seeded RNG.
    The engine ends such a request as an error (HTTP 500, or an SSE error event mid-stream), counts
    it in `vllm:request_success_total{finished_reason="abort"}`, and has observed its time to first
    token only if a token reached it before (from steps taken with speculate=False).
    """

    gpu: str = "a100-80gb"
    model: str = "llama-3-8b"
    method: str = "jacobi"
    window: int = 7  # W
    ngram: int = 5  # N
    guess_set: int = 7  # G
    num_speculative_tokens: int = 4  # k, n-gram
    acceptance: float = 0.45
    context_tokens: int = 1024
    noise_sigma: float = 0.05
    drift_sigma: float = 0.0
    drift_period_s: float = 5.0
    time_scale: float = 1.0
    spec_overhead_s: float = 0.5e-3  # extra fixed cost of a speculating step (pool lookup, masks)
    # injected fault: probability that a request fails at its first speculating step (0: never)
    speculative_error_rate: float = 0.0
    # explicit overrides of the presets (None: use the preset)
    hbm_bandwidth: float | None = None
    flops: float | None = None
    step_overhead_s: float | None = None
    params: float | None = None
    bytes_per_param: float | None = None
    kv_bytes_per_token: float | None = None

    def __post_init__(self) -> None:
        if self.method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {self.method!r}")
        if self.gpu not in GPU_PRESETS and None in (self.hbm_bandwidth, self.flops):
            raise ValueError(
                f"unknown gpu preset {self.gpu!r} (known: {sorted(GPU_PRESETS)}); "
                "or give hbm_bandwidth and flops explicitly"
            )
        if self.model not in MODEL_PRESETS and None in (self.params, self.kv_bytes_per_token):
            raise ValueError(
                f"unknown model preset {self.model!r} (known: {sorted(MODEL_PRESETS)}); "
                "or give params and kv_bytes_per_token explicitly"
            )
        if not 0.0 <= self.acceptance < 1.0:
            raise ValueError("acceptance must be in [0, 1)")
        if self.window < 1 or self.ngram < 2 or self.guess_set < 0 or self.num_speculative_tokens < 1:
            raise ValueError("window >= 1, ngram >= 2, guess_set >= 0, num_speculative_tokens >= 1")
        if self.noise_sigma < 0 or self.time_scale <= 0 or self.context_tokens < 0:
            raise ValueError("noise_sigma >= 0, time_scale > 0, context_tokens >= 0")
        if self.drift_sigma < 0 or self.drift_period_s <= 0:
            raise ValueError("drift_sigma >= 0, drift_period_s > 0")
        if not 0.0 <= self.speculative_error_rate <= 1.0:
            raise ValueError(
                f"speculative_error_rate must be in [0, 1], got {self.speculative_error_rate!r}")

    # -- resolved hardware / model ---------------------------------------------------------
    @property
    def gpu_spec(self) -> GpuSpec:
        return _overridden(GPU_PRESETS.get(self.gpu, GpuSpec(0.0, 0.0, 0.0)), hbm_bandwidth=self.hbm_bandwidth,
                           flops=self.flops, step_overhead_s=self.step_overhead_s)

    @property
    def model_spec(self) -> ModelSpec:
        return _overridden(MODEL_PRESETS.get(self.model, ModelSpec(0.0, 2.0, 0.0)), params=self.params,
                           bytes_per_param=self.bytes_per_param, kv_bytes_per_token=self.kv_bytes_per_token)

    def tokens_processed(self, speculate: bool) -> int:
        """Tokens each sequence feeds through the model in one step."""
        if not speculate or self.method == "greedy":
            return 1
        if self.method == "jacobi":
            return 1 + (self.window + self.guess_set) * (self.ngram - 1)
        return 1 + self.num_speculative_tokens

    def max_draft_accepted(self, speculate: bool) -> int:
        """Longest draft that can be accepted in one step (the cap of the distribution)."""
        if not speculate or self.method == "greedy":
            return 0
        if self.method == "jacobi":
            return self.ngram - 1
        return self.num_speculative_tokens

    def draft_tokens(self, speculate: bool) -> int:
        """Speculative tokens verified per sequence per step (what the spec-decode counters count)."""
        if not speculate or self.method == "greedy":
            return 0
        if self.method == "jacobi":
            return self.guess_set * (self.ngram - 1)
        return self.num_speculative_tokens

    # -- (de)serialisation -----------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SimConfig":
        data = dict(data)
        spec = data.pop("speculative_config", None)
        if spec is not None:
            if isinstance(spec, str):
                spec = json.loads(spec)
            data.update(_from_speculative_config(spec))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown SimConfig keys: {sorted(unknown)} (known: {sorted(known)})")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str | None) -> "SimConfig":
        if text is None or not text.strip():
            return cls()
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _from_speculative_config(spec: dict[str, Any]) -> dict[str, Any]:
    """Map the engine's `--speculative-config` JSON (vLLM shape) onto SimConfig fields."""
    method = spec.get("method", "jacobi")
    out: dict[str, Any] = {"method": method}
    if method == "jacobi":
        for src, dst in (("window", "window"), ("ngram", "ngram"), ("guess_set", "guess_set")):
            if src in spec:
                out[dst] = int(spec[src])
    elif method == "ngram":
        if "num_speculative_tokens" in spec:
            out["num_speculative_tokens"] = int(spec["num_speculative_tokens"])
    return out


@dataclass
class SimStep:
    seconds: float  # wall time of this decode step for the whole batch
    accepted_tokens: list[int]  # per sequence, tokens produced this step (>= 1)
    draft_tokens: list[int]  # per sequence, speculative tokens verified this step (0 when not speculating)


@dataclass
class RooflineSimulator:
    config: SimConfig = field(default_factory=SimConfig)
    seed: int | None = None

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._drift_period = -1      # the drift's current period of wall time, and its factor
        self._drift = 1.0

    @classmethod
    def from_json(cls, text: str | None, seed: int | None = None) -> "RooflineSimulator":
        return cls(SimConfig.from_json(text), seed=seed)

    # -- deterministic roofline (no noise) ---------------------------------------------------
    def memory_seconds(self, batch_size: int) -> float:
        m, g, c = self.config.model_spec, self.config.gpu_spec, self.config
        return (m.model_bytes + batch_size * c.context_tokens * m.kv_bytes_per_token) / g.hbm_bandwidth

    def compute_seconds(self, batch_size: int, speculate: bool) -> float:
        m, g = self.config.model_spec, self.config.gpu_spec
        return 2.0 * m.params * batch_size * self.config.tokens_processed(speculate) / g.flops

    def speculates(self, speculate: bool) -> bool:
        """Whether a step asked to speculate really does (never with method "greedy")."""
        return speculate and self.config.method != "greedy"

    def expected_step_seconds(self, batch_size: int, speculate: bool) -> float:
        """Median step time (noise has median 1), scaled by time_scale."""
        _check_batch(batch_size)
        spec = self.speculates(speculate)
        g = self.config.gpu_spec
        t = max(self.memory_seconds(batch_size), self.compute_seconds(batch_size, spec)) + g.step_overhead_s
        if spec:
            t += self.config.spec_overhead_s
        return t * self.config.time_scale

    def expected_tokens_per_step(self, speculate: bool) -> float:
        """Mean tokens produced per sequence per step."""
        cap = self.config.max_draft_accepted(self.speculates(speculate))
        a = self.config.acceptance
        if cap == 0:
            return 1.0
        return (1.0 - a ** (cap + 1)) / (1.0 - a)

    def expected_per_token_seconds(self, batch_size: int, speculate: bool) -> float:
        """Median-time per generated token, as a client of one sequence sees it (TPOT)."""
        return self.expected_step_seconds(batch_size, speculate) / self.expected_tokens_per_step(speculate)

    def expected_throughput(self, batch_size: int, speculate: bool) -> float:
        """Generated tokens per second over the whole batch."""
        return batch_size / self.expected_per_token_seconds(batch_size, speculate)

    def is_compute_bound(self, batch_size: int, speculate: bool) -> bool:
        spec = self.speculates(speculate)
        return self.compute_seconds(batch_size, spec) > self.memory_seconds(batch_size)

    # -- stochastic steps --------------------------------------------------------------------
    def _noise(self, size: int | None = None) -> Any:
        s = self.config.noise_sigma
        if s == 0:
            return 1.0 if size is None else np.ones(size)
        return np.exp(self._rng.normal(0.0, s, size))

    def sample_accepted(self, batch_size: int, speculate: bool) -> np.ndarray:
        """Tokens produced per sequence this step: 1 + truncated-geometric accepted drafts."""
        cap = self.config.max_draft_accepted(self.speculates(speculate))
        if cap == 0:
            return np.ones(batch_size, dtype=np.int64)
        a = self.config.acceptance
        if a <= 0.0:
            return np.ones(batch_size, dtype=np.int64)
        # number of successes before the first failure: geometric(1 - a) - 1
        accepted = self._rng.geometric(1.0 - a, size=batch_size) - 1
        return 1 + np.minimum(accepted, cap)

    def drift(self, now: float | None = None) -> float:
        """The machine's speed factor at wall time ``now`` (time.monotonic() by default): one
        lognormal draw per ``drift_period_s``; 1 without drift."""
        if self.config.drift_sigma == 0:
            return 1.0
        period = int((time.monotonic() if now is None else now) // self.config.drift_period_s)
        if period != self._drift_period:
            self._drift_period, self._drift = period, float(np.exp(self._rng.normal(0.0, self.config.drift_sigma)))
        return self._drift

    def decode_step(self, batch_size: int, speculate: bool) -> SimStep:
        spec = self.speculates(speculate)
        seconds = float(self.expected_step_seconds(batch_size, spec) * self._noise() * self.drift())
        accepted = self.sample_accepted(batch_size, spec)
        drafts = self.config.draft_tokens(spec)
        return SimStep(
            seconds=seconds,
            accepted_tokens=[int(x) for x in accepted],
            draft_tokens=[drafts] * batch_size,
        )

    def sample_speculative_error(self) -> bool:
        """Whether a request fails at its first speculating step: True with probability
        `speculative_error_rate`, one draw of the seeded RNG (none at rate 0, so the default leaves
        every other draw as it was)."""
        rate = self.config.speculative_error_rate
        if rate <= 0.0:
            return False
        return bool(self._rng.random() < rate)

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """One prefill of `prompt_tokens`: compute-bound for long prompts, weight reads for short."""
        if prompt_tokens < 0:
            raise ValueError("prompt_tokens must be >= 0")
        m, g = self.config.model_spec, self.config.gpu_spec
        mem = (m.model_bytes + prompt_tokens * m.kv_bytes_per_token) / g.hbm_bandwidth
        comp = 2.0 * m.params * max(prompt_tokens, 1) / g.flops
        t = (max(mem, comp) + g.step_overhead_s) * self.config.time_scale
        return float(t * self._noise())

    # -- vectorised draws for benchmarks -------------------------------------------------------
    def per_token_seconds_samples(
        self, batch_size: int, speculate: bool, n: int, steps_per_sample: int = 1
    ) -> np.ndarray:
        """`n` observations of per-token latency, each averaged over `steps_per_sample` steps of one
        sequence (time of those steps / tokens that sequence produced in them)."""
        spec = self.speculates(speculate)
        base = self.expected_step_seconds(batch_size, spec)
        times = base * self._noise(n * steps_per_sample).reshape(n, steps_per_sample).sum(axis=1)
        cap = self.config.max_draft_accepted(spec)
        if cap == 0 or self.config.acceptance <= 0:
            toks = np.full(n, float(steps_per_sample))
        else:
            acc = self._rng.geometric(1.0 - self.config.acceptance, size=(n, steps_per_sample)) - 1
            toks = (1 + np.minimum(acc, cap)).sum(axis=1).astype(float)
        return times / toks


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")


def crossover_batch_size(sim: RooflineSimulator, max_batch: int = 256) -> int | None:
    """Smallest batch size at which speculation no longer raises expected throughput (None: never)."""
    for b in range(1, max_batch + 1):
        if sim.expected_throughput(b, True) <= sim.expected_throughput(b, False):
            return b
    return None


if __name__ == "__main__":  # pragma: no cover - a quick look at the curve
    import sys

    sim = RooflineSimulator.from_json(sys.argv[1] if len(sys.argv) > 1 else None, seed=0)
    print(f"{'batch':>5} {'greedy ms/tok':>14} {'spec ms/tok':>12} {'tput change':>12} bound")
    for b in (1, 2, 4, 8, 16, 32, 64):
        g = sim.expected_per_token_seconds(b, False) * 1e3
        s = sim.expected_per_token_seconds(b, True) * 1e3
        ch = sim.expected_throughput(b, True) / sim.expected_throughput(b, False) - 1
        print(f"{b:5d} {g:14.2f} {s:12.2f} {ch:+12.1%} {'compute' if sim.is_compute_bound(b, True) else 'memory'}")
    print("crossover:", crossover_batch_size(sim))
