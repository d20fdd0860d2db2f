"""Decision benchmark: our paired sequential test against Kayenta and Flagger, on identical streams.

    python3 -m lookahead_dev.bench_decision [--seeds N] [--quick] [--seed S]

Everything runs at the CRD's defaults: minLatencyImprovement 5%, maxThroughputRegression 2%,
confidence 0.99, minSamplesPerStep 10, sampleInterval 5s, stepDuration 2m with a 30s warm-up (so a
step has at most 18 sample windows per arm), deadline 30m. The planned sweep is 6 batch sizes
(1, 2, 4, 8, 16, 32), so our tests run at the family-wise split of 0.99 over 6 batch sizes x 3
metrics (`Thresholds.for_family`, with the operator's `stats.DEFAULT_METRICS_PER_BATCH`): every loss
bound (the canary-worse side of each interval) one-sided at 0.01 / 36, the win bounds (the
canary-better side, read by `decide()` only along the run of wins from the smallest size) at
0.01 / 3 (docs/statistics.md, section 4).

One *scenario* is one load step (one batch size) with a known true effect: the canary's mean
per-token latency is `lat_ratio` times the control's and its mean throughput `tp_ratio` times
(ratios of means, stalls included). One *sample* is one 5 s window, the same wall-clock window for
both arms: a per-token latency (NaN when the window finished no token) and a throughput (0 in a
stall) per arm. Every method reads the same streams, from the start, as many windows as it wants:

- ``ours``: `stats.PairedComparison` (paired confidence sequences: mean log-ratio for latency,
  ratio of sums for throughput) and the outcome rule of `decision.BatchComparison` (Regresses / Wins /
  NoGain), looked at after every window from 10 pairs on; a step still unsettled at its 18th window
  measures on, as the operator does, to the end of its equal share of the deadline counted from the
  start of measuring (`statemachine.step_deadline`), so it also gets the time the steps before it
  left. A policy's steps therefore run in order, smallest size first, each on the clock the ones
  before left (54 windows for the first; a stress scenario is a policy's first step); unsettled
  then = Inconclusive. Checked against the operator's own
  classes on every run (`check_against_operator_code`). Variants for context: ``ours_bonferroni``
  (every interval two-sided at the Bonferroni share, as before the win bound's fixed-sequence
  split), ``ours_one_step`` (every step stops at 18 windows), ``ours_unpaired`` (the
  independent-arms `SequentialComparison`, one step).
- ``fixed_mwu``: what this benchmark called "Kayenta-style" before: a fixed horizon of 50 windows
  per arm, two-sided Mann-Whitney U per metric at 98%, the effect as the Hodges-Lehmann shift over
  the control's median; promote when latency is significantly better by at least 5% and
  throughput not significantly worse by more than 2%, roll back otherwise.
- ``kayenta``: stock Kayenta as its sources read (NetflixACAJudge + MannWhitneyClassifier): NaN
  windows replaced by 0 (nanStrategy default), outliers removed per arm (IQRDetector factor 3 with
  reduceSensitivity: fences at least as wide as the 1st/99th percentiles), a 98% Mann-Whitney
  confidence interval of the shift (R's wilcox.test asymptotic interval, continuity corrected);
  a metric is High (Low) when the interval clears the tolerance band +-0.25 x |Hodges-Lehmann
  estimate| and its mean-ratio effect size passes allowedIncrease (allowedDecrease). Latency is
  configured direction=increase with allowedIncrease 1.0, throughput direction=decrease with
  allowedDecrease 0.98 (our 2%). Kayenta cannot require an improvement: it promotes when no metric
  is High/Low in its failing direction (score 100 >= pass). Cumulative looks at 60/120/180 windows,
  stopping at the first failing score.
- ``flagger``: Flagger as its scheduler runs (blue/green, `iterations`): every analysis interval
  (30 s = 6 windows) each metric is queried over the last 1 m (12 windows) and checked against an
  absolute threshold (latency <= 0.95 x baseline, throughput >= 0.98 x baseline); a failing check
  increments failedChecks and returns before the iteration advances; rollback on the tick after
  failedChecks reaches `threshold`; promotion after `iterations` (10) passing checks plus the
  routing and promotion ticks (12 passing checks). Flagger has no baseline arm: the baseline is a
  number a person pinned from a past measurement of the control, off by a lognormal 3%.
  `threshold` is swept over 1, 2 and 5 (``flagger`` = 2, ``flagger@1``, ``flagger@5``).
- ``flagger_ratio``: the same scheduler with ratio-to-primary metrics (``{{ target }}-primary`` in
  the metric template): canary / control over the same 1 m window, <= 0.95 (latency) and >= 0.98
  (throughput).

Ground truth: a scenario *deserves promotion* when latency fell by >= 5% and throughput fell by
<= 2%; promoting anything else is a *wrong promotion*. A *5% regression* is a throughput drop of
>= 5%; it is *missed* unless the method rolls back (an Inconclusive counts as missed).

Streams ("realistic": the simulator's GPU profiles under three machine conditions):
- effects from `lookahead_canary.simulator` (Jacobi and n-gram lookahead, A100 / H100 / H200 /
  L4, Llama-3-8B and Llama-3-70B, acceptance 0.3 / 0.45 / 0.6, batch 1-32), with per-window noise
  from the simulated step-time noise and acceptance variance;
- machine conditions (`PROFILES`): per-window measurement noise, heavy-tailed per-arm slowdowns
  (GC pauses, preemption: x(1 + Pareto) with a tail index 2.5, capped at 10x), stalls per arm (a
  window with no output) and stalls common to both arms, shared-machine drift common to both arms
  (AR(1) in log space) and, on the noisy machine, a smaller per-arm drift that pairing cannot
  cancel.
A *stress grid* (decoupled latency/throughput effects sitting on and around the thresholds, and
canaries that stall on their own) is reported separately: it is where methods differ most and
where ours is least conclusive within one 18-window step.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
from scipy import signal, special

from lookahead_canary.simulator import RooflineSimulator, SimConfig

from lookahead_operator.measurement.verdict import BatchComparison, BatchOutcome
from lookahead_operator.measurement.stats import DEFAULT_METRICS_PER_BATCH as OPERATOR_METRICS_PER_BATCH
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.controller.statemachine import step_deadline
from lookahead_operator.measurement.stats import (PairedComparison, Thresholds, log_ratio_confidence_sequence,
                         paired_log_confidence_sequence, paired_ratio_confidence_sequence)

# the CRD's defaults
# the CRD's defaults, read from the model the operator parses (one source of truth)
_DEFAULTS = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "x"}}}})
SAMPLE_S = _DEFAULTS.analysis.sample_interval.total_seconds()
STEP_WINDOWS = _DEFAULTS.samples_per_step()  # 18 windows per arm in a 2m step after a 30s warm-up
PLANNED = (1, 2, 4, 8, 16, 32)
METRICS_PER_BATCH = OPERATOR_METRICS_PER_BATCH  # as the operator splits its budget (latency, throughput)

FIXED_HORIZON = 50
MWU_ALPHA = 0.02  # Kayenta's 98%
KAYENTA_LOOKS = (60, 120, 180)
KAYENTA_TOLERANCE = 0.25
FLAGGER_TICK = 6  # analysis interval 30 s
FLAGGER_WINDOW = 12  # metric query interval 1 m
FLAGGER_ITERATIONS = 10
FLAGGER_THRESHOLDS = (1, 2, 5)
FLAGGER_DEFAULT_THRESHOLD = 2
FLAGGER_BASELINE_SIGMA = 0.03
HORIZON = max(KAYENTA_LOOKS[-1], FLAGGER_TICK * (FLAGGER_ITERATIONS + 2 + max(FLAGGER_THRESHOLDS) + 1))

# ours, as the operator runs it: a step still Pending at stepDuration measures on to the end of its
# equal share of the deadline counted from the start of measuring (statemachine.step_deadline: its
# share and what the steps before it left), and never less than its own stepDuration; the analysis
# deadline ends everything. ours_one_step stops every step at stepDuration (18 windows), for
# comparison.
_EPOCH = datetime(2026, 1, 1)  # the clocks below are seconds since measuring began
DEADLINE_S = _DEFAULTS.analysis.deadline.total_seconds()
WARMUP_S = _DEFAULTS.load.warmup.total_seconds()


def step_windows(position: int, used_s: np.ndarray) -> np.ndarray:
    """Windows a step at ``position`` (0-based in PLANNED) may read, per seed, when the steps before
    it used ``used_s`` seconds since measuring began (each: the warm-up, then its windows)."""
    until = (step_deadline(_DEFAULTS, len(PLANNED), position, _EPOCH) - _EPOCH).total_seconds()
    on = np.floor((until - used_s - WARMUP_S) / SAMPLE_S)
    cap = np.floor((DEADLINE_S - used_s - WARMUP_S) / SAMPLE_S)  # the analysis deadline
    return np.clip(np.minimum(np.maximum(on, STEP_WINDOWS), cap), 0, None).astype(int)


FIRST_STEP_WINDOWS = int(step_windows(0, np.zeros(1))[0])  # the first step: its share, 54
# the most any step may read: every step before it settled at the fewest windows (the last: 274)
MAX_STEP_WINDOWS = max(int(step_windows(i, np.full(1, i * (WARMUP_S + _DEFAULTS.load.min_samples_per_step * SAMPLE_S)))[0])
                       for i in range(len(PLANNED)))
HORIZON = max(HORIZON, MAX_STEP_WINDOWS)

PROMOTE, ROLLBACK, INCONCLUSIVE = 0, 1, 2
HEADLINE = ("ours", "fixed_mwu", "kayenta", "flagger", "flagger_ratio")
VARIANTS = ("ours_bonferroni", "ours_one_step", "ours_unpaired")
METHODS = HEADLINE + VARIANTS + tuple(f"{m}@{t}" for m in ("flagger", "flagger_ratio") for t in FLAGGER_THRESHOLDS
                                      if t != FLAGGER_DEFAULT_THRESHOLD)
PEERS = ("kayenta", "flagger", "flagger_ratio") + tuple(m for m in METHODS if "@" in m)


@dataclass(frozen=True)
class Noise:
    """Machine conditions: per-window noise and disturbances, identical in law for both arms."""

    name: str
    speed: float  # per-arm per-window speed jitter (latency x g, throughput / g), lognormal sigma
    lat_meas: float  # per-window latency measurement noise (request mix in the histogram), sigma
    tp_meas: float  # per-window throughput measurement noise (scrape timing), sigma
    drift: float = 0.0  # common drift, AR(1) log-space stationary sigma
    drift_rho: float = 0.9
    arm_drift: float = 0.0  # per-arm drift (e.g. different neighbours), AR(1) sigma
    arm_drift_rho: float = 0.8
    tail_p: float = 0.0  # share of windows of one arm slowed by 1 + Pareto(2.5), capped at 10x
    stall_arm: float = 0.0  # share of windows in which one arm produced nothing
    stall_common: float = 0.0  # share of windows in which both did (load generator, node)


PROFILES = (
    Noise("gpu-quiet", speed=0.01, lat_meas=0.02, tp_meas=0.005, tail_p=0.005, stall_arm=0.001),
    Noise("gpu-shared", speed=0.02, lat_meas=0.03, tp_meas=0.01, drift=0.10, drift_rho=0.9, tail_p=0.02,
          stall_arm=0.005, stall_common=0.01),
    Noise("noisy", speed=0.04, lat_meas=0.05, tp_meas=0.02, drift=0.25, drift_rho=0.95, arm_drift=0.02,
          arm_drift_rho=0.8, tail_p=0.03, stall_arm=0.01, stall_common=0.02),
)


@dataclass(frozen=True)
class Scenario:
    source: str  # "sim" | "grid"
    label: str
    policy: str  # scenarios of one policy (a simulator configuration under one profile) share it
    batch_size: int
    lat_ratio: float  # canary / control mean per-token latency (windows with output)
    tp_ratio: float  # canary / control mean throughput, stalls included
    noise: Noise
    sim_cv: tuple[float, float] = (0.0, 0.0)  # extra per-window speed sigma (control, canary) from the simulator
    canary_stall: float = 0.0  # extra windows in which only the canary produced nothing

    @property
    def tp_ratio_eff(self) -> float:
        return self.tp_ratio * (1.0 - self.canary_stall)

    def deserves_promotion(self, th: Thresholds) -> bool:
        eps = 1e-9
        return (1 - self.lat_ratio) >= th.min_latency_improvement - eps and (
            1 - self.tp_ratio_eff) <= th.max_throughput_regression + eps

    @property
    def regression_5pct(self) -> bool:
        return 1 - self.tp_ratio_eff >= 0.05 - 1e-9


# --- scenarios ------------------------------------------------------------------------------

SIM_METHODS = ("jacobi", "ngram")
SIM_GPUS = ("a100-80gb", "h100-sxm", "h200", "l4")
SIM_MODELS = ("llama-3-8b", "llama-3-70b")
SIM_ACCEPTANCE = (0.3, 0.45, 0.6)


def _acceptance_moments(cfg: SimConfig, speculate: bool) -> tuple[float, float]:
    """Mean and variance of tokens per sequence per step (1 + truncated geometric)."""
    cap = cfg.max_draft_accepted(speculate)
    if cap == 0 or cfg.acceptance <= 0:
        return 1.0, 0.0
    a = cfg.acceptance
    k = np.arange(cap + 1)
    p = (1 - a) * a**k
    p[-1] = a**cap
    m = float((p * (1 + k)).sum())
    v = float((p * (1 + k) ** 2).sum() - m * m)
    return m, v


def sim_scenarios(profiles=PROFILES) -> list[Scenario]:
    out = []
    for model in SIM_MODELS:
        for method in SIM_METHODS:
            for gpu in SIM_GPUS:
                for acc in SIM_ACCEPTANCE:
                    cfg = SimConfig(gpu=gpu, model=model, method=method, acceptance=acc, noise_sigma=0.05)
                    sim = RooflineSimulator(cfg, seed=0)
                    mc, vc = _acceptance_moments(cfg, False)
                    mk, vk = _acceptance_moments(cfg, True)
                    for b in PLANNED:
                        step_c = sim.expected_step_seconds(b, False)
                        step_k = sim.expected_step_seconds(b, True)
                        lat_ratio = (step_k / mk) / (step_c / mc)

                        def cv(step, m, v):
                            steps = max(SAMPLE_S / step, 1.0)
                            return math.hypot(cfg.noise_sigma / math.sqrt(steps), math.sqrt(v / (steps * b)) / m)

                        for nz in profiles:
                            out.append(Scenario(
                                "sim", f"{model} {method} {gpu} acc{acc} b{b}",
                                f"{model} {method} {gpu} acc{acc} {nz.name}", b, lat_ratio, 1.0 / lat_ratio, nz,
                                sim_cv=(cv(step_c, mc, vc), cv(step_k, mk, vk)),
                            ))
    return out


GRID_IMPROVEMENTS = (-0.05, 0.0, 0.03, 0.05, 0.08, 0.15, 0.30)
GRID_REGRESSIONS = (0.0, 0.02, 0.03, 0.05, 0.10)
GRID_STALLS = ((0.15, 0.10), (0.15, 0.20), (0.30, 0.50))  # (latency improvement, canary stall share)


def grid_scenarios(profiles=PROFILES) -> list[Scenario]:
    """Decoupled effects on and around the thresholds, and canaries that stall on their own."""
    out = []
    for nz in profiles:
        for imp in GRID_IMPROVEMENTS:
            for reg in GRID_REGRESSIONS:
                out.append(Scenario("grid", f"lat{-imp:+.0%} tp{-reg:+.0%}", f"grid {nz.name}", 1, 1 - imp, 1 - reg,
                                    nz))
        for imp, stall in GRID_STALLS:
            # throughput when not stalled follows latency (closed loop); the stalls take it back down
            out.append(Scenario("grid", f"lat{-imp:+.0%} canary stalls {stall:.0%}", f"grid {nz.name}", 1,
                                1 - imp, 1 / (1 - imp), nz, canary_stall=stall))
    return out


# --- streams --------------------------------------------------------------------------------

def _ar1(rng: np.random.Generator, sigma: float, rho: float, shape: tuple[int, int]) -> np.ndarray:
    """Stationary AR(1) in log space with marginal sigma, along axis 1."""
    if sigma <= 0:
        return np.zeros(shape)
    burn = 60
    e = rng.normal(0.0, sigma * math.sqrt(1 - rho * rho), (shape[0], shape[1] + burn))
    return signal.lfilter([1.0], [1.0, -rho], e, axis=1)[:, burn:]


def make_streams(sc: Scenario, seeds: int, horizon: int, rng: np.random.Generator):
    """(lat_control, lat_canary, tp_control, tp_canary), each (seeds, horizon). Control means ~1.
    Latency is NaN in windows without output; throughput is 0 there."""
    shape = (seeds, horizon)
    nz = sc.noise
    common = np.exp(_ar1(rng, nz.drift, nz.drift_rho, shape))
    common_stall = rng.random(shape) < nz.stall_common
    arms = []
    for i, (lr, tr, extra_cv, own_stall) in enumerate(((1.0, 1.0, sc.sim_cv[0], 0.0),
                                                       (sc.lat_ratio, sc.tp_ratio, sc.sim_cv[1], sc.canary_stall))):
        s = math.hypot(nz.speed, extra_cv)
        g = np.exp(rng.normal(0.0, s, shape))
        drift = np.exp(_ar1(rng, nz.arm_drift, nz.arm_drift_rho, shape))
        slow = np.where(rng.random(shape) < nz.tail_p, np.minimum(1.0 + rng.pareto(2.5, shape), 10.0), 1.0)
        f = g * drift * common * slow  # the arm runs f times slower than its mean in this window
        # normalise so that E[latency] = lr and E[throughput] = tr (the same law for both arms, so
        # the ratios hold exactly; the speed sigma differs slightly per arm, hence per-arm constants)
        lognormal = math.exp((s * s + nz.arm_drift**2 + nz.drift**2) / 2)  # E[g] E[drift] E[common] = E[1/...]
        e_f = lognormal * _mean_slow(nz.tail_p)
        e_inv = lognormal * _mean_inv_slow(nz.tail_p)
        lat = lr * f / e_f * np.exp(rng.normal(-nz.lat_meas**2 / 2, nz.lat_meas, shape))
        tp = tr / f / e_inv * np.exp(rng.normal(-nz.tp_meas**2 / 2, nz.tp_meas, shape))
        stall = common_stall | (rng.random(shape) < nz.stall_arm)
        if own_stall:
            stall |= rng.random(shape) < own_stall
        lat = np.where(stall, np.nan, lat)
        tp = np.where(stall, 0.0, tp)
        arms.append((lat, tp))
    (lat_c, tp_c), (lat_k, tp_k) = arms
    return lat_c, lat_k, tp_c, tp_k


_SLOW_CACHE: dict = {}


def _slow_moments() -> tuple[float, float]:
    """E[s] and E[1/s] for s = min(1 + Pareto(2.5), 10) (numerically, once)."""
    if "m" not in _SLOW_CACHE:
        x = np.linspace(0, 9, 400001)
        pdf = 2.5 / (1 + x) ** 3.5
        s = 1 + x
        tail = (1 + 9.0) ** -2.5  # P(s > 10): mass at the cap
        dx = x[1] - x[0]
        es = float(np.sum(pdf * s) * dx + tail * 10.0)
        einv = float(np.sum(pdf / s) * dx + tail / 10.0)
        _SLOW_CACHE["m"] = (es, einv)
    return _SLOW_CACHE["m"]


def _mean_slow(p: float) -> float:
    return 1 - p + p * _slow_moments()[0]


def _mean_inv_slow(p: float) -> float:
    return 1 - p + p * _slow_moments()[1]


# --- ours -----------------------------------------------------------------------------------

def log_ratios(c: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the pairs PairedComparison keeps for a latency: both finite and positive, log(k / c) there
    and 0 elsewhere)."""
    keep = np.isfinite(c) & np.isfinite(k) & (c > 0) & (k > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(keep, np.log(np.where(keep, k, 1.0)) - np.log(np.where(keep, c, 1.0)), 0.0)
    return keep, d


def _paired_goodness(c: np.ndarray, k: np.ndarray, cmp: PairedComparison, lower_is_better: bool,
                     zero_is_stall: bool):
    """Cumulative paired confidence sequences over windows: (n, good_lo, good_hi) per window, with
    PairedComparison's estimators (latency: mean log-ratio; throughput: ratio of sums) and its
    levels (`cmp`, built by the operator's own `for_latency` / `for_throughput`: two-sided at its
    confidence, or one-sided bounds under a family split)."""
    cs = lambda x: np.cumsum(x, axis=1)  # noqa: E731
    sides = cmp.side_alphas()
    level = dict(alpha=1.0 - cmp.confidence) if sides is None else dict(alpha_lower=sides[0], alpha_upper=sides[1])
    prior = cmp.effect_prior
    if zero_is_stall:
        keep = np.isfinite(c) & np.isfinite(k) & ~((c == 0) & (k == 0))
        c0, k0 = np.where(keep, c, 0.0), np.where(keep, k, 0.0)
        n = cs(keep).astype(float)
        _, lo, hi = paired_ratio_confidence_sequence(n, cs(c0), cs(k0), cs(c0 * c0), cs(k0 * k0), cs(c0 * k0),
                                                     prior=prior, **level)
    else:
        keep, d = log_ratios(c, k)
        n = cs(keep).astype(float)
        _, lo, hi = paired_log_confidence_sequence(n, cs(d), cs(d * d), prior=prior, **level)
    with np.errstate(over="ignore", invalid="ignore"):
        lo = np.expm1(np.clip(lo, -50, 50))
        hi = np.expm1(np.clip(hi, -50, 50))
    g_lo, g_hi = (-hi, -lo) if lower_is_better else (lo, hi)
    return n, g_lo, g_hi


def _unpaired_goodness(c: np.ndarray, k: np.ndarray, alpha: float, tau: float, lower_is_better: bool,
                       zero_is_stall: bool):
    """The independent-arms `SequentialComparison` (each arm's own running mean and variance)."""
    def arm(x):
        keep = np.isfinite(x) & ((x >= 0) if zero_is_stall else (x > 0))
        x0 = np.where(keep, x, 0.0)
        n = np.cumsum(keep, axis=1).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.cumsum(x0, axis=1) / n
            v = np.maximum(np.cumsum(x0 * x0, axis=1) - n * m * m, 0.0) / np.maximum(n - 1, 1)
        return n, m, v
    n_c, m_c, v_c = arm(c)
    n_k, m_k, v_k = arm(k)
    _, lo, hi = log_ratio_confidence_sequence(n_c, m_c, v_c, n_k, m_k, v_k, alpha, tau)
    with np.errstate(over="ignore", invalid="ignore"):
        lo = np.expm1(np.clip(lo, -50, 50))
        hi = np.expm1(np.clip(hi, -50, 50))
    g_lo, g_hi = (-hi, -lo) if lower_is_better else (lo, hi)
    return np.minimum(n_c, n_k), np.nan_to_num(g_lo, nan=-np.inf), np.nan_to_num(g_hi, nan=np.inf)


def run_ours(streams, th: Thresholds, horizon: int | np.ndarray = STEP_WINDOWS, paired: bool = True):
    """Vectorised `PairedComparison` + `BatchComparison.outcome`, looked at after every window
    (``paired=False``: the independent-arms `SequentialComparison` on the same windows).
    ``horizon``: the windows the step may read, one number or one per seed."""
    h = np.broadcast_to(np.asarray(horizon, dtype=int), (streams[0].shape[0],))
    top = max(int(h.max()), 1)
    lat_c, lat_k, tp_c, tp_k = (s[:, :top] for s in streams)
    alpha = 1 - th.confidence
    if paired:
        n_l, l_lo, l_hi = _paired_goodness(lat_c, lat_k, PairedComparison.for_latency(th), True, False)
        n_t, t_lo, t_hi = _paired_goodness(tp_c, tp_k, PairedComparison.for_throughput(th), False, True)
    else:
        n_l, l_lo, l_hi = _unpaired_goodness(lat_c, lat_k, alpha, max(th.min_latency_improvement, 0.01), True, False)
        n_t, t_lo, t_hi = _unpaired_goodness(tp_c, tp_k, alpha, max(th.max_throughput_regression, 0.01), False, True)
    lat_ok = n_l >= th.min_samples
    tp_ok = n_t >= th.min_samples
    regress = tp_ok & (t_hi < -th.max_throughput_regression)
    wins = lat_ok & tp_ok & (l_lo > th.min_latency_improvement) & (t_lo > -th.max_throughput_regression)
    nogain = lat_ok & (l_hi < th.min_latency_improvement)
    settled = (regress | wins | nogain) & (np.arange(top)[None, :] < h[:, None])
    seeds = lat_c.shape[0]
    any_settled = settled.any(axis=1)
    idx = np.where(any_settled, settled.argmax(axis=1), np.maximum(h, 1) - 1)
    rows = np.arange(seeds)
    outcome = np.full(seeds, INCONCLUSIVE)
    at_reg, at_win, at_nog = regress[rows, idx], wins[rows, idx], nogain[rows, idx]
    outcome[any_settled & at_nog] = ROLLBACK
    outcome[any_settled & at_win & ~at_reg] = PROMOTE
    outcome[any_settled & at_reg] = ROLLBACK
    return outcome, idx + 1


# --- rank statistics over ragged rows ----------------------------------------------------------

class _Pairs:
    """Two-sample counting, vectorised over rows: x (canary) and y (control), NaN = absent.

    `greater(mu)` = #{(i, j): x_i - mu > y_j} per row, by a searchsorted over the rows' sorted y
    laid end to end with a per-row offset (O(n log n) per row instead of the n^2 differences)."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.s, self.n = x.shape
        self.m = y.shape[1]
        vx, vy = np.isfinite(x), np.isfinite(y)
        self.nx, self.ny = vx.sum(1).astype(float), vy.sum(1).astype(float)
        big = float(np.nanmax(np.abs(np.concatenate([np.where(vx, x, 0).ravel(), np.where(vy, y, 0).ravel()])))) + 1.0
        self.r = big
        self.off = 20.0 * big + 10.0
        rows = np.arange(self.s, dtype=float)[:, None]
        ys = np.sort(np.where(vy, y, 3.0 * big), axis=1)
        self.yflat = (ys + rows * self.off).ravel()
        self.x = np.where(vx, x, -10.0 * big) + rows * self.off
        self.vx = vx
        self.base = (np.arange(self.s) * self.m)[:, None]

    def greater(self, mu: np.ndarray) -> np.ndarray:
        q = self.x - np.clip(mu, -2 * self.r, 2 * self.r)[:, None]
        pos = np.searchsorted(self.yflat, q.ravel(), side="left").reshape(self.s, self.n) - self.base
        return np.where(self.vx, pos, 0).sum(axis=1).astype(float)

    def hodges_lehmann(self, iters: int = 32) -> np.ndarray:
        """The shift mu with greater(mu) = n m / 2 (the median of the pairwise differences)."""
        lo = np.full(self.s, -2 * self.r)
        hi = np.full(self.s, 2 * self.r)
        half = self.nx * self.ny / 2
        for _ in range(iters):
            mid = (lo + hi) / 2
            g = self.greater(mid)
            lo = np.where(g > half, mid, lo)
            hi = np.where(g > half, hi, mid)
        return (lo + hi) / 2

    def z(self, mu: np.ndarray) -> np.ndarray:
        """Kayenta's (R's) standardised rank statistic at shift mu, continuity corrected, no ties."""
        dz = self.greater(mu) - self.nx * self.ny / 2
        sigma = np.sqrt(self.nx * self.ny * (self.nx + self.ny + 1) / 12)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (dz - np.sign(dz) * 0.5) / sigma


def _z_two_sided(alpha: float) -> float:
    return float(-special.ndtri(alpha / 2))


# --- fixed_mwu (this benchmark's former "Kayenta-style") ----------------------------------------

def run_fixed_mwu(streams, th: Thresholds, n: int = FIXED_HORIZON):
    lat_c, lat_k, tp_c, tp_k = (s[:, :n] for s in streams)
    zc = _z_two_sided(MWU_ALPHA)

    def judge(c, k):
        p = _Pairs(k, c)
        z0 = p.z(np.zeros(p.s))
        sig = np.abs(z0) > zc
        rel = p.hodges_lehmann() / np.nanmedian(c, axis=1)
        return sig, rel

    sig_l, rel_l = judge(lat_c, lat_k)
    sig_t, rel_t = judge(tp_c, tp_k)
    lat_better = sig_l & (rel_l <= -th.min_latency_improvement)
    tp_worse = sig_t & (rel_t < -th.max_throughput_regression)
    outcome = np.where(lat_better & ~tp_worse, PROMOTE, ROLLBACK)
    return outcome, np.full(outcome.shape, n)


# --- kayenta (stock) -------------------------------------------------------------------------------

def _kayenta_transform(x: np.ndarray) -> np.ndarray:
    """replaceNaNs (NaN -> 0), then IQRDetector(factor=3, reduceSensitivity=true): outliers -> NaN."""
    x = np.where(np.isfinite(x), x, 0.0)
    p01, p25, p75, p99 = np.percentile(x, [1, 25, 75, 99], axis=1)
    iqr = p75 - p25
    lower = np.minimum(p01, p25 - 3 * iqr)[:, None]
    upper = np.maximum(p99, p75 + 3 * iqr)[:, None]
    return np.where((x < lower) | (x > upper), np.nan, x)


def _kayenta_classify(control: np.ndarray, canary: np.ndarray, direction: str, allowed: float) -> np.ndarray:
    """True where the metric fails: High for direction 'increase', Low for 'decrease'."""
    c, k = _kayenta_transform(control), _kayenta_transform(canary)
    p = _Pairs(k, c)
    hl = p.hodges_lehmann()
    tol = KAYENTA_TOLERANCE * np.abs(hl)
    zc = _z_two_sided(MWU_ALPHA)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.nanmean(k, axis=1) / np.nanmean(c, axis=1)
    if direction == "increase":
        # the interval's lower end above +tol: the statistic at mu = tol still significantly > 0
        return (p.z(tol) > zc) & (ratio > allowed)
    return (p.z(-tol) < -zc) & (ratio < allowed)


def run_kayenta(streams, th: Thresholds, looks=KAYENTA_LOOKS):
    lat_c, lat_k, tp_c, tp_k = streams
    seeds = lat_c.shape[0]
    outcome = np.full(seeds, PROMOTE)
    samples = np.full(seeds, looks[-1])
    active = np.ones(seeds, dtype=bool)
    for n in looks:
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        fail = _kayenta_classify(lat_c[idx, :n], lat_k[idx, :n], "increase", 1.0) | _kayenta_classify(
            tp_c[idx, :n], tp_k[idx, :n], "decrease", 1.0 - th.max_throughput_regression)
        outcome[idx[fail]] = ROLLBACK
        samples[idx[fail]] = n
        active[idx[fail]] = False
    return outcome, samples


# --- flagger ---------------------------------------------------------------------------------------

def _windows(x: np.ndarray, w: np.ndarray | None = None):
    """Sum over the last FLAGGER_WINDOW windows at every tick (x weighted by w if given)."""
    v = np.where(np.isfinite(x), x, 0.0) if w is None else np.where(np.isfinite(x), x * w, 0.0)
    cs = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(v, axis=1)], axis=1)
    ticks = np.arange(FLAGGER_TICK, x.shape[1] + 1, FLAGGER_TICK)
    start = np.maximum(ticks - FLAGGER_WINDOW, 0)
    return cs[:, ticks] - cs[:, start], ticks


def _flagger_schedule(fail: np.ndarray, ticks: np.ndarray, threshold: int):
    """Flagger's blue/green scheduler over per-tick check results (True = failed)."""
    seeds, n_ticks = fail.shape
    need = FLAGGER_ITERATIONS + 2  # iterations passing checks, then the routing and the promotion tick
    passed = np.cumsum(~fail, axis=1)
    failed = np.cumsum(fail, axis=1)
    promote_at = np.where((passed >= need).any(1), (passed >= need).argmax(1), n_ticks)
    # the rollback happens on the tick after failedChecks reached the threshold (checked first)
    reach = failed >= threshold
    roll_at = np.where(reach.any(1), reach.argmax(1) + 1, n_ticks + 1)
    outcome = np.where(roll_at <= promote_at, ROLLBACK, PROMOTE)
    outcome = np.where((promote_at >= n_ticks) & (roll_at > n_ticks), INCONCLUSIVE, outcome)
    t = np.minimum(np.where(outcome == ROLLBACK, roll_at, promote_at), n_ticks - 1)
    return outcome, ticks[t]


def run_flagger(streams, th: Thresholds, baseline_lat, baseline_tp, threshold: int):
    """Absolute thresholds pinned from `baseline_*` (per-seed arrays)."""
    lat_c, lat_k, tp_c, tp_k = streams
    tok_k, ticks = _windows(tp_k)
    lat_sum, _ = _windows(lat_k, tp_k)
    with np.errstate(divide="ignore", invalid="ignore"):
        lat = lat_sum / tok_k  # token-weighted per-token latency over the query window
    tp = tok_k / np.minimum(np.maximum(ticks, 1), FLAGGER_WINDOW)
    fail = ~(lat <= (1 - th.min_latency_improvement) * baseline_lat[:, None]) | ~(
        tp >= (1 - th.max_throughput_regression) * baseline_tp[:, None])  # NaN (no data) fails
    return _flagger_schedule(fail, ticks, threshold)


def run_flagger_ratio(streams, th: Thresholds, threshold: int):
    lat_c, lat_k, tp_c, tp_k = streams
    tok_k, ticks = _windows(tp_k)
    tok_c, _ = _windows(tp_c)
    lk, _ = _windows(lat_k, tp_k)
    lc, _ = _windows(lat_c, tp_c)
    with np.errstate(divide="ignore", invalid="ignore"):
        lat_ratio = (lk / tok_k) / (lc / tok_c)
        tp_ratio = tok_k / tok_c
    fail = ~(lat_ratio <= 1 - th.min_latency_improvement) | ~(tp_ratio >= 1 - th.max_throughput_regression)
    return _flagger_schedule(fail, ticks, threshold)


# --- consistency with the operator's own code path -----------------------------------------

def check_against_operator_code(th: Thresholds, rng: np.random.Generator, seeds: int = 6) -> None:
    """The vectorised 'ours' must agree with PairedComparison + BatchComparison.outcome, stalls and
    missing windows included."""
    for lat_ratio, tp_ratio, nz in ((0.9, 1.1, PROFILES[1]), (1.0, 1.0, PROFILES[2]), (0.7, 0.9, PROFILES[1])):
        sc = Scenario("grid", "check", "check", 1, lat_ratio, tp_ratio, replace(nz, stall_arm=0.05, stall_common=0.05))
        streams = make_streams(sc, seeds, STEP_WINDOWS, rng)
        outcome, samples = run_ours(streams, th)
        for s in range(seeds):
            n = int(samples[s])
            lat, tp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
            lat.add_pairs(streams[0][s, :n], streams[1][s, :n])
            tp.add_pairs(streams[2][s, :n], streams[3][s, :n])
            o = BatchComparison(1, lat.result(), tp.result()).outcome(th)
            expect = {BatchOutcome.WINS: PROMOTE, BatchOutcome.REGRESSES: ROLLBACK, BatchOutcome.NO_GAIN: ROLLBACK,
                      BatchOutcome.PENDING: INCONCLUSIVE}[o]
            if expect != outcome[s]:
                raise AssertionError(f"vectorised benchmark disagrees with the operator code at seed {s}: {o}")


# --- driver ---------------------------------------------------------------------------------

def family(th: Thresholds) -> Thresholds:
    return th.for_family(len(PLANNED), METRICS_PER_BATCH)


def run(seeds: int, th: Thresholds, seed: int = 0, scenarios: list[Scenario] | None = None,
        horizon: int = STEP_WINDOWS):
    """`th`: the policy's thresholds; ours runs at their family-wise split."""
    rng = np.random.default_rng(seed)
    fth = family(th)
    check_against_operator_code(fth, rng)
    scenarios = scenarios if scenarios is not None else sim_scenarios() + grid_scenarios()
    rows = []
    # ours' clock per policy (seconds each seed's earlier steps used): a sim policy's scenarios come
    # in planned order; a stress scenario is a policy of its own, at its first step
    clocks: dict[tuple[str, str], np.ndarray] = {}
    last: dict[str, int] = {}
    for sc in scenarios:
        position = PLANNED.index(sc.batch_size) if sc.source == "sim" else 0
        key = sc.policy if sc.source == "sim" else f"{sc.policy} {sc.label}"
        assert position > last.get(key, -1), "a policy's steps run smallest batch size first"
        last[key] = position
        streams = make_streams(sc, seeds, HORIZON, rng)
        base_lat = np.exp(rng.normal(0, FLAGGER_BASELINE_SIGMA, seeds))
        base_tp = np.exp(rng.normal(0, FLAGGER_BASELINE_SIGMA, seeds))
        res = {}
        # ours_bonferroni: before the fixed-sequence win bound, every interval two-sided at the
        # Bonferroni share; on its own clock
        for name, t in (("ours", fth), ("ours_bonferroni", replace(fth, win_confidence=None))):
            used = clocks.setdefault((name, key), np.zeros(seeds))
            windows = step_windows(position, used)
            res[name] = run_ours(streams, t, windows)
            clocks[(name, key)] = used + WARMUP_S + res[name][1] * SAMPLE_S
            if name == "ours":
                res["ours_windows"] = windows
        res.update({
            "ours_one_step": run_ours(streams, fth, horizon),
            "ours_unpaired": run_ours(streams, fth, horizon, paired=False),
            "fixed_mwu": run_fixed_mwu(streams, th),
            "kayenta": run_kayenta(streams, th),
        })
        for t in FLAGGER_THRESHOLDS:
            sfx = "" if t == FLAGGER_DEFAULT_THRESHOLD else f"@{t}"
            res["flagger" + sfx] = run_flagger(streams, th, base_lat, base_tp, t)
            res["flagger_ratio" + sfx] = run_flagger_ratio(streams, th, t)
        res["oracle_power"] = oracle_power(sc, streams, th, int(np.median(res["ours_windows"])))
        rows.append((sc, res))
    return rows


def oracle_power(sc: Scenario, streams, th: Thresholds, n: int) -> float:
    """A yardstick, not a method: the probability that a FIXED-horizon one-sided z-test on the
    mean per-window log-ratio, with the policy's whole error budget (1 - confidence), n windows
    and the per-window standard deviation KNOWN (measured on this scenario's streams), certifies
    "latency fell by at least minLatencyImprovement" -- the latency half of a correct promotion,
    under a Gaussian approximation. No valid test that reads n windows and must hold its error
    at the threshold can do much better; anytime validity and an estimated variance cost more.
    NaN for a scenario that does not deserve promotion."""
    if not sc.deserves_promotion(th):
        return math.nan
    lat_c, lat_k = streams[0][:, :n], streams[1][:, :n]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(lat_k) - np.log(lat_c)
    sd = float(np.nanstd(d))
    margin = math.log(sc.lat_ratio) - math.log(1 - th.min_latency_improvement)  # <= 0: the gain beyond it
    if sd <= 0:
        return 1.0 if margin < 0 else 0.0
    return float(special.ndtr(-margin * math.sqrt(n) / sd + special.ndtri(1 - th.confidence)))


EFFECT_BANDS = ((0.05, 0.06), (0.06, 0.10), (0.10, 0.15), (0.15, 0.30), (0.30, 1.0))


def by_effect(rows, th: Thresholds, methods=("ours", "ours_bonferroni", "fixed_mwu")) -> dict:
    """Deserving realistic scenarios by their true latency improvement: correct promotions per
    method, and the fixed-horizon oracle's bound (`oracle_power`)."""
    out = {}
    for lo, hi in EFFECT_BANDS:
        sel = [(sc, res) for sc, res in rows if sc.deserves_promotion(th) and lo - 1e-9 <= 1 - sc.lat_ratio < hi]
        if not sel:
            continue
        runs = sum(res["ours"][0].size for _, res in sel)
        band = {"scenarios": len(sel), "runs": runs, "share_of_deserving_runs": 0.0}
        for m in methods:
            band[m] = sum(int((res[m][0] == PROMOTE).sum()) for _, res in sel) / runs
        band["oracle_bound"] = sum(res["oracle_power"] * res["ours"][0].size for _, res in sel) / runs
        out[f"{lo:.0%}-{hi:.0%}"] = band
    total = sum(b["runs"] for b in out.values())
    for b in out.values():
        b["share_of_deserving_runs"] = b["runs"] / max(total, 1)
    allsel = [(sc, res) for sc, res in rows if sc.deserves_promotion(th)]
    n_all = sum(res["ours"][0].size for _, res in allsel)
    out["all"] = {"scenarios": len(allsel), "runs": n_all, "share_of_deserving_runs": 1.0,
                  **{m: sum(int((res[m][0] == PROMOTE).sum()) for _, res in allsel) / max(n_all, 1) for m in methods},
                  "oracle_bound": sum(res["oracle_power"] * res["ours"][0].size for _, res in allsel) / max(n_all, 1)}
    return out


def summarise(rows, th: Thresholds) -> dict:
    out = {}
    for m in METHODS:
        promos_wrong = n_wrong_den = missed = let_through = n_reg = promos_right = n_right_den = 0
        inconclusive = total = 0
        samples = []
        for sc, res in rows:
            outcome, smp = res[m]
            samples.append(smp)
            total += outcome.size
            inconclusive += int((outcome == INCONCLUSIVE).sum())
            if not sc.deserves_promotion(th):
                n_wrong_den += outcome.size
                promos_wrong += int((outcome == PROMOTE).sum())
            else:
                n_right_den += outcome.size
                promos_right += int((outcome == PROMOTE).sum())
            if sc.regression_5pct:
                n_reg += outcome.size
                missed += int((outcome != ROLLBACK).sum())
                let_through += int((outcome == PROMOTE).sum())
        all_samples = np.concatenate(samples) if samples else np.zeros(1)
        out[m] = {
            "wrong_promotion_rate": promos_wrong / max(n_wrong_den, 1),
            "missed_regression_rate": missed / max(n_reg, 1),  # not rolled back (Inconclusive counts)
            "inconclusive_rate": inconclusive / max(total, 1),
            "correct_promotion_rate": promos_right / max(n_right_den, 1),
            "mean_samples_to_decision": float(np.mean(all_samples)),
            "promoted_regression_rate": let_through / max(n_reg, 1),
            "median_samples_to_decision": float(np.median(all_samples)),
            "runs": total,
        }
    return out


def policy_eval(rows, th: Thresholds) -> dict:
    """Per policy (one simulator configuration under one machine profile, the planned sweep),
    per seed: lookahead is enabled for the run of promoted batch sizes from the smallest (ours:
    `decide()` after the deadline, so a Pending size ends the run and enables nothing itself).
    Wrong: some enabled batch size does not deserve it. Exact: the enabled run equals the run of
    deserving sizes. Inconclusive: nothing enabled because the smallest size is unsettled."""
    groups: dict = {}
    for sc, res in rows:
        if sc.source == "sim":
            groups.setdefault(sc.policy, []).append((sc, res))
    out = {}
    for m in METHODS:
        wrong = exact = total = inconclusive = 0
        for items in groups.values():
            items.sort(key=lambda x: x[0].batch_size)
            truth = np.array([sc.deserves_promotion(th) for sc, _ in items])
            true_run = int(np.argmin(truth)) if not truth.all() else len(truth)
            outcomes = np.stack([res[m][0] for _, res in items], axis=1)  # (seeds, batches)
            not_promo = outcomes != PROMOTE
            run_len = np.where(not_promo.any(axis=1), not_promo.argmax(axis=1), outcomes.shape[1])
            first_inconc = outcomes[:, 0] == INCONCLUSIVE
            for k in range(outcomes.shape[1] + 1):
                sel = run_len == k
                if sel.any() and (~truth[:k]).any():
                    wrong += int(sel.sum())
            exact += int((run_len == true_run).sum())
            inconclusive += int(first_inconc.sum())
            total += outcomes.shape[0]
        out[m] = {"wrong_enablement_rate": wrong / max(total, 1), "exact_regime_rate": exact / max(total, 1),
                  "inconclusive_rate": inconclusive / max(total, 1), "policies": total}
    return out


def breakdown(rows, th: Thresholds, key) -> dict:
    groups: dict = {}
    for sc, res in rows:
        groups.setdefault(key(sc), []).append((sc, res))
    return {g: summarise(r, th) for g, r in sorted(groups.items())}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs visible, Python {platform.python_version()}, numpy {np.__version__}"


def _row(s: dict) -> list[str]:
    return [f"{s['wrong_promotion_rate']:.2%}", f"{s['missed_regression_rate']:.2%}", f"{s['inconclusive_rate']:.1%}",
            f"{s['correct_promotion_rate']:.1%}", f"{s['mean_samples_to_decision']:.1f}",
            f"{s['promoted_regression_rate']:.2%}"]


def render(realistic: dict, stress: dict, by_noise: dict, policy: dict, meta: dict,
           effects: dict | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    cols = ("method", "wrong promotions", "missed 5% regressions", "inconclusive", "correct promotions",
            "mean samples/arm", "5% regressions promoted")
    for title, summary in ((f"Realistic streams ({meta['realistic_runs']} runs per method)", realistic),
                           (f"Stress grid ({meta['stress_runs']} runs per method)", stress)):
        t = Table(title=title)
        for col in cols:
            t.add_column(col, justify="left" if col == "method" else "right")
        for m in METHODS:
            t.add_row(m, *_row(summary[m]))
        con.print(t)
    bt = Table(title="Realistic streams by machine profile: wrong promotions / missed 5% regressions / inconclusive")
    bt.add_column("method")
    for g in by_noise:
        bt.add_column(g, justify="right")
    for m in METHODS:
        bt.add_row(m, *(f"{s[m]['wrong_promotion_rate']:.2%} / {s[m]['missed_regression_rate']:.1%} / "
                        f"{s[m]['inconclusive_rate']:.1%}" for s in by_noise.values()))
    con.print(bt)
    pt = Table(title=f"Per policy (sweep {list(PLANNED)}): the enabled regime")
    for col in ("method", "wrong enablement", "exact regime", "inconclusive"):
        pt.add_column(col, justify="left" if col == "method" else "right")
    for m in METHODS:
        r = policy[m]
        pt.add_row(m, f"{r['wrong_enablement_rate']:.2%}", f"{r['exact_regime_rate']:.1%}",
                   f"{r['inconclusive_rate']:.1%}")
    con.print(pt)
    if effects:
        et = Table(title="Realistic scenarios that deserve promotion, by true latency improvement: correct promotions")
        methods = [k for k in next(iter(effects.values())) if k not in ("scenarios", "runs", "share_of_deserving_runs")]
        for col in ("latency improvement", "scenarios", "share of runs", *methods):
            et.add_column(col, justify="left" if col == "latency improvement" else "right")
        for band, b in effects.items():
            et.add_row(band, str(b["scenarios"]), f"{b['share_of_deserving_runs']:.1%}",
                       *(f"{b[m]:.1%}" for m in methods))
        con.print(et)


def goals(summary: dict, method: str = "ours") -> dict:
    o, f = summary[method], summary["fixed_mwu"]
    dominated_by = [p for p in PEERS
                    if summary[p]["wrong_promotion_rate"] < o["wrong_promotion_rate"]
                    and summary[p]["missed_regression_rate"] < o["missed_regression_rate"]]
    return {
        "wrong_promotions_le_1pct": o["wrong_promotion_rate"] <= 0.01,
        "missed_5pct_regressions_le_2pct": o["missed_regression_rate"] <= 0.02,
        "inconclusive_le_5pct": o["inconclusive_rate"] <= 0.05,
        "correct_promotions_ge_fixed_mwu": o["correct_promotion_rate"] >= f["correct_promotion_rate"],
        "mean_samples_le_25": o["mean_samples_to_decision"] <= 0.5 * FIXED_HORIZON,
        "no_peer_better_on_both": not dominated_by,
        "peers_better_on_both": dominated_by,
    }


def _rounded(d: dict) -> dict:
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in d.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=None, help="seeds per scenario (default 200, --quick 20)")
    ap.add_argument("--quick", action="store_true", help="fewer seeds, for a smoke run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (20 if args.quick else 200)
    th = Thresholds()  # the CRD's defaults: 5%, 2%, 0.99, 10 samples
    t0 = time.time()
    load_before = os.getloadavg()
    rows = run(seeds, th, seed=args.seed)
    realistic_rows = [r for r in rows if r[0].source == "sim"]
    stress_rows = [r for r in rows if r[0].source == "grid"]
    realistic = summarise(realistic_rows, th)
    stress = summarise(stress_rows, th)
    by_noise = breakdown(realistic_rows, th, lambda sc: sc.noise.name)
    policy = policy_eval(rows, th)
    effects = by_effect(realistic_rows, th)
    fth = family(th)
    worse_side = PairedComparison.for_throughput(fth).side_alphas()[1]
    meta = {"seeds": seeds, "scenarios": {"realistic": len(realistic_rows), "stress": len(stress_rows)},
            "realistic_runs": realistic["ours"]["runs"], "stress_runs": stress["ours"]["runs"],
            "step_windows": STEP_WINDOWS, "first_step_windows": FIRST_STEP_WINDOWS, "max_step_windows": MAX_STEP_WINDOWS, "planned": list(PLANNED),
            "per_test_confidence": fth.confidence, "win_bound_confidence": fth.win_confidence,
            "worse_bound_confidence": 1 - worse_side,
            "seconds": round(time.time() - t0, 1), "machine": machine(),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]},
            "thresholds": {"min_latency_improvement": th.min_latency_improvement,
                           "max_throughput_regression": th.max_throughput_regression,
                           "confidence": th.confidence, "min_samples": th.min_samples}}
    render(realistic, stress, by_noise, policy, meta, effects)
    print(f"{len(rows)} scenarios x {seeds} seeds in {meta['seconds']} s on {meta['machine']}")
    from lookahead_dev import bench_live  # live streams (issue 26): their own module
    t1 = time.time()
    live = bench_live.main_live(seeds, th, args.seed, quick=args.quick)
    bench_live.render_live(live)
    print(f"live: {live['scenarios']} scenarios x {live['seeds']} seeds in {time.time() - t1:.1f} s")
    out = {m: _rounded(realistic[m]) for m in METHODS}
    out["goal"] = goals(realistic)
    out["goal_one_step"] = goals(realistic, "ours_one_step")
    out["stress_grid"] = {m: _rounded(stress[m]) for m in METHODS}
    out["stress_goal"] = goals(stress)
    out["by_profile"] = {g: {m: {k: round(s[m][k], 5) for k in ("wrong_promotion_rate", "missed_regression_rate",
                                                                   "inconclusive_rate", "correct_promotion_rate")}
                             for m in METHODS} for g, s in by_noise.items()}
    out["policy"] = {m: _rounded(r) for m, r in policy.items()}
    out["by_effect"] = {band: _rounded(b) for band, b in effects.items()}
    out["live"] = live
    meta["load_average"]["after"] = [round(x, 2) for x in os.getloadavg()]
    out["meta"] = meta
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
