"""Live streams for the decision benchmark: canary and control serving a share of real traffic,
compared per offered-load stratum (ours: `stats.LiveComparison`) and per own running batch (the
naive comparison, the trap). Called by `bench_decision.main`; ``run_live`` returns the summary.

Everything runs at the CRD's defaults (5% / 2% / 0.99 / 10 windows, 5 s windows, live mode's 1 h
deadline after a 30 s warm-up: 714 windows; a sweep's 30 m, 354 windows, missed 7.9% of the 5%
regressions here: docs/benchmarks/decision.md). One *scenario* is a simulator configuration (the realistic
grid of `bench_decision.sim_scenarios`: Llama-3-8B/70B, Jacobi / n-gram, A100 / H100 / H200 / L4,
acceptance 0.3 / 0.45 / 0.6) x an offered-load schedule x a router x a machine profile
(`bench_decision.PROFILES`).

The fleet and its pods (per window w, per seed):
- *Offered load.* The schedule sets the fleet's arrival rate per pod, lambda_w, through the batch
  size the control (lookahead off, as the fleet runs today) would run at without noise, from 1 up
  to the scenario's peak (`peak_batch`: batch 32, or lower where the offered load would pass
  PEAK_UTILISATION = 80% of the slower arm's capacity at MAX_NUM_SEQS): ``ramp`` (log-linear up or
  down), ``diurnal`` (a log-sinusoid over the run, random phase), ``bursts`` (a low base with bursts
  to the top 40% of the range lasting 30 s to 2.5 min). The stratum key is the fleet's requests per
  pod in the window: Poisson over FLEET_PODS pods, so it is noisy near an edge, and it does not
  depend on either arm. Strata: the operator's own (`measurement.live.edges_from_rate`), per seed,
  from the fleet's requests per pod over the PRE_PERIOD_S before the arms serve (the schedule's
  load at the run's start, Poisson over FLEET_PODS pods): one per doubling, that load in the middle
  of one, two doublings either side and the open ends (`seed_strata`). A ramp or a burst that
  leaves that range lands in an open end, as it would on the operator.
- *Each arm* is ARM_PODS pods. Its decode batch B follows Little's law as a fixed point,
  B = lambda_arm x OUTPUT_TOKENS x tpot_arm(B) x f, with tpot_arm the simulator's roofline curve
  (`RooflineSimulator.expected_per_token_seconds`, vectorised here and checked against it) and f
  the arm's slowness in the window (the profile's per-window jitter, per-arm and common drift,
  heavy-tailed slowdowns): a slow window runs more requests at once. lambda_arm is lambda_w times
  a per-window arrival-noise factor (Poisson over the requests that overlap the window). Routers
  (``ROUTERS``): ``service`` (a plain Service, Poisson per pod), ``pools`` (one InferencePool per
  arm, exact route weights, a load-aware picker inside each arm: half the per-pod arrival noise),
  and ``shared-pool`` (both arms in one load-aware pool, what the issue forbids: lambda_arm also
  times (B_fleet / B)^ROUTER_GAMMA, so a busier arm is sent less; reported beside the headline,
  not in it). Beyond MAX_NUM_SEQS a pod queues (B capped, the wait added to TTFT, requests waiting
  over QUEUE_TIMEOUT_S dropped as errors).
- *Measured per window and arm*: per-token latency (tpot x f with per-window sampling noise from
  the tokens in the window and the simulator's step noise and acceptance variance, plus the
  profile's measurement noise; NaN when idle or stalled), the per-request token rate (1 / that, with
  the throughput measurement noise; 0 in a stall, NaN when idle), TTFT (prefill plus half a step,
  x f, plus any queue wait; NaN without arrivals), requests routed (Poisson), errors (0.1% of
  requests and the dropped ones) and the running batch B.
- *Safety abort* (`apply_abort`): the operator's rule, `controller.livesplit.abort_reason`, with
  `AbortSpec()`'s defaults (``analysis.abort``: read from the model, not copied). Every
  ``checkInterval`` of simulated time each arm's last ``window`` of windows is folded into one
  `ArmWindow` (`abort_windows`: the arm's requests and failed requests summed over its pods, the
  per-token latency weighted by tokens, as a histogram's ``_sum / _count`` over the window reads
  it, TTFT weighted by requests) and the first check that `abort_reason` answers ends the run
  RolledBack (every stratum). `abort_checks` is that rule over seeds and checks at once; it is
  checked against `abort_reason` check by check on every ABORT_CHECK_EVERY-th scenario of every run
  (`check_abort_against_operator`) and on random inputs in the unit tests.

Ground truth per stratum, from the known curves: at offered load lambda a fully promoted fleet has
every pod at lambda (no router imbalance), so the truth of window w is
r_w = tpot_canary(B_k*(lambda_w)) / tpot_control(B_c*(lambda_w)) with B* the noise-free Little's-law
fixed points (the canary's own batch moves with the treatment); a stratum's truth in a run is the
geometric mean of r_w over the windows that fell in it. As in `bench_decision`: it *deserves
promotion* when latency falls by >= 5% and throughput by <= 2% (the per-request token rate, 1 / r);
a *5% regression* is a throughput fall of >= 5% (r >= 1 / 0.95); promoting anything else is a wrong
promotion; a regression not rolled back (Regresses or NoGain) is missed (Pending counts as missed).
A unit is one (scenario, seed, stratum) with at least min_samples windows (*visited*; the count
depends on the offered load alone); strata the load never reached enough are left out and counted.

Methods, both on the same windows with the family split over 3 metrics:
- ``ours``: `LiveComparison` (vectorised here, checked against the class on every run): windows
  paired by time, strata by the fleet's offered load, the split over its strata.
- ``naive_running_batch``: each arm's windows binned by its OWN running batch (buckets [0, 2),
  [2, 4), ..., [32, inf), the planned sizes of a synthetic sweep); within a bucket the i-th canary
  window is paired with the i-th control window and compared with the same tests and rule (split
  over the buckets). Its outcome for an offered-load stratum is that of the bucket holding the
  control's noise-free batch at the stratum's load (the fleet's batch there today: a perfect map,
  given to it for free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from lookahead_canary.simulator import RooflineSimulator, SimConfig
from lookahead_operator.api.spec import AbortSpec, LookaheadPolicySpec
from lookahead_operator.controller.livesplit import AbortSignal, abort_reason
from lookahead_operator.measurement.live import PRE_PERIOD_S, edges_from_rate
from lookahead_operator.measurement.stats import (ArmWindow, LiveComparison, LiveWindow, PairedComparison, Strata,
                                                  StratumOutcome, Thresholds, live_thresholds, read_run)

from lookahead_dev import bench_decision as bd

WINDOW_S = bd.SAMPLE_S
#: a live policy at its defaults: its deadline is live mode's (1 h), not a sweep's
_LIVE_DEFAULTS = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "x"}}},
                                                     "load": {"mode": "live", "livePercent": "10%"}})
LIVE_DEADLINE_S = _LIVE_DEFAULTS.analysis.deadline.total_seconds()
LIVE_WINDOWS = int((LIVE_DEADLINE_S - bd.WARMUP_S) // WINDOW_S)  # 714 at the defaults
OUTPUT_TOKENS = 256  # mean output tokens per request
FLEET_PODS = 8  # pods whose requests make the stratum key
ARM_PODS = 2  # pods per arm (canary and control each serve a share: livePercent)
MAX_NUM_SEQS = 64
ROUTER_GAMMA = 0.5
POOL_ARRIVAL_NOISE = 0.5
FREEZE = False
ERROR_RATE = 0.001
PEAK_UTILISATION = 0.8  # the peak offered load, as a share of the slower arm's capacity
ABORT = AbortSpec()  # the safety abort at the CRD's defaults (analysis.abort)
ABORT_CHECK_EVERY = 100  # every 100th scenario's abort is checked against abort_reason check by check
QUEUE_TIMEOUT_S = 30.0  # a request waiting longer is dropped by its client (an error)
TTFT_NOISE = 0.10
BATCH_RANGE = (1.0, 32.0)  # the control's batch over the schedules (the planned sweep's range)
NAIVE_EDGES = (2.0, 4.0, 8.0, 16.0, 32.0)  # buckets of the arm's own running batch
SCHEDULES = ("ramp", "diurnal", "bursts")
#: service: a plain Service, every pod an equal share (per-pod Poisson arrivals); pools: one
#: InferencePool per arm with exact HTTPRoute weights, a load-aware picker inside each arm (each
#: pod's arrivals far steadier); shared-pool: both arms in ONE load-aware pool (what the issue
#: forbids: the picker routes by the treatment), reported beside, not in the headline
ROUTERS = ("service", "pools", "shared-pool")
HEADLINE_ROUTERS = ("service", "pools")
METHODS = ("ours", "naive_running_batch")

PROMOTE, ROLLBACK, INCONCLUSIVE = bd.PROMOTE, bd.ROLLBACK, bd.INCONCLUSIVE
_CODE = {StratumOutcome.WINS: PROMOTE, StratumOutcome.REGRESSES: ROLLBACK, StratumOutcome.NO_GAIN: ROLLBACK,
         StratumOutcome.PENDING: INCONCLUSIVE}


@dataclass(frozen=True)
class LiveScenario:
    label: str
    config: SimConfig
    schedule: str
    router: str
    noise: bd.Noise

    @property
    def gamma(self) -> float:
        return ROUTER_GAMMA if self.router == "shared-pool" else 0.0

    @property
    def arrival_noise(self) -> float:
        """Per-pod arrival noise relative to Poisson: a load-aware picker balances an arm's pods."""
        return 1.0 if self.router == "service" else POOL_ARRIVAL_NOISE


def live_scenarios(profiles=bd.PROFILES) -> list[LiveScenario]:
    out = []
    for model in bd.SIM_MODELS:
        for method in bd.SIM_METHODS:
            for gpu in bd.SIM_GPUS:
                for acc in bd.SIM_ACCEPTANCE:
                    cfg = SimConfig(gpu=gpu, model=model, method=method, acceptance=acc, noise_sigma=0.05)
                    for sched in SCHEDULES:
                        for router in ROUTERS:
                            for nz in profiles:
                                out.append(LiveScenario(f"{model} {method} {gpu} acc{acc}", cfg, sched, router, nz))
    return out


# --- the curves ------------------------------------------------------------------------------

class Curves:
    """The simulator's roofline, vectorised over batch sizes (floats; below 1 the pod runs one
    request at a time when busy, so the step of batch 1)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.sim = RooflineSimulator(replace(cfg, noise_sigma=0.0), seed=0)
        m, g = cfg.model_spec, cfg.gpu_spec
        self._mem0, self._mem1 = m.model_bytes / g.hbm_bandwidth, cfg.context_tokens * m.kv_bytes_per_token / g.hbm_bandwidth
        self._acc = {s: bd._acceptance_moments(cfg, s) for s in (False, True)}
        self.prefill = self.sim.prefill_seconds(cfg.context_tokens)
        self.peak = peak_batch(self)

    def step(self, b: np.ndarray, spec: bool) -> np.ndarray:
        b = np.maximum(np.asarray(b, dtype=float), 1.0)
        cfg, g, m = self.cfg, self.cfg.gpu_spec, self.cfg.model_spec
        comp = 2.0 * m.params * b * cfg.tokens_processed(spec) / g.flops
        t = np.maximum(self._mem0 + self._mem1 * b, comp) + g.step_overhead_s + (cfg.spec_overhead_s if spec else 0.0)
        return t * cfg.time_scale

    def tpot(self, b: np.ndarray, spec: bool) -> np.ndarray:
        return self.step(b, spec) / self._acc[spec][0]

    def token_cv(self, b: np.ndarray, spec: bool) -> np.ndarray:
        """Relative sampling noise of one window's mean per-token latency (step noise and the spread
        of tokens per step, over the steps and sequences of the window)."""
        b = np.maximum(b, 1.0)
        steps = np.maximum(WINDOW_S / self.step(b, spec), 1.0)
        m, v = self._acc[spec]
        return np.hypot(self.cfg.noise_sigma / np.sqrt(steps), np.sqrt(v / (steps * b)) / m)

    def solve(self, k: np.ndarray, spec: bool, gamma: float = 0.0, ref: np.ndarray | float = 1.0,
              iters: int = 40) -> tuple[np.ndarray, np.ndarray]:
        """Little's law with a load-aware router: B with B^(1+gamma) = k x ref^gamma x tpot(B), where
        k = arrival rate x output tokens x slowness. Returns (B capped at MAX_NUM_SEQS, overload:
        demanded / served, 1 when not saturated). log B^(1+gamma) - log tpot(B) increases in B (tpot
        is affine in B with a positive intercept), so bisection finds the one root."""
        k = np.asarray(k, dtype=float) * np.power(np.asarray(ref, dtype=float), gamma)
        lo = np.full(k.shape, math.log(1e-4))
        hi = np.full(k.shape, math.log(MAX_NUM_SEQS))
        lk = np.log(np.maximum(k, 1e-300))

        def h(x):
            return (1 + gamma) * x - lk - np.log(self.tpot(np.exp(x), spec))

        sat = h(hi) < 0
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            up = h(mid) < 0
            lo = np.where(up, mid, lo)
            hi = np.where(up, hi, mid)
        b = np.where(sat, float(MAX_NUM_SEQS), np.exp(0.5 * (lo + hi)))
        overload = np.where(sat, np.exp(-h(np.full(k.shape, math.log(MAX_NUM_SEQS)))), 1.0)
        return b, overload


# --- the streams -----------------------------------------------------------------------------

def peak_batch(curves: Curves) -> float:
    """The top of a scenario's load range, as the control's batch: BATCH_RANGE's top, or lower
    where the fleet's offered load would exceed PEAK_UTILISATION of either arm's capacity (the
    requests per second it serves at MAX_NUM_SEQS). Near capacity a pod's batch follows Little's law
    into a pole (a small slowdown doubles it, then it queues): a canary that saturates at the peak
    is the safety abort's case, not the statistics'."""
    grid = np.geomspace(BATCH_RANGE[0], BATCH_RANGE[1], 400)
    lam = grid / (OUTPUT_TOKENS * curves.tpot(grid, False))
    cap = min(MAX_NUM_SEQS / (OUTPUT_TOKENS * float(curves.tpot(np.array(float(MAX_NUM_SEQS)), s)))
              for s in (False, True))
    ok = lam <= PEAK_UTILISATION * cap
    return float(grid[ok].max()) if ok.any() else BATCH_RANGE[0] * 2


def schedule(kind: str, seeds: int, n: int, rng: np.random.Generator, top: float = BATCH_RANGE[1]) -> np.ndarray:
    """The control's noise-free batch per window, (seeds, n), from BATCH_RANGE's bottom to ``top``."""
    lo, hi = math.log(BATCH_RANGE[0]), math.log(top)
    t = np.arange(n)[None, :] / max(n - 1, 1)
    if kind == "ramp":
        up = rng.random((seeds, 1)) < 0.5
        u = np.where(up, lo + (hi - lo) * t, hi - (hi - lo) * t)
    elif kind == "diurnal":
        phase = rng.uniform(0, 2 * math.pi, (seeds, 1))
        u = 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.sin(2 * math.pi * t + phase)
    elif kind == "bursts":
        base = lo + 0.2 * (hi - lo) + bd._ar1(rng, 0.15, 0.95, (seeds, n))
        u = base.copy()
        start = rng.random((seeds, n)) < 1 / 40
        length = rng.integers(6, 31, (seeds, n))
        level = rng.uniform(lo + 0.6 * (hi - lo), hi, (seeds, n))
        for s, w in zip(*np.nonzero(start)):
            u[s, w:w + length[s, w]] = np.maximum(u[s, w:w + length[s, w]], level[s, w])
    else:
        raise ValueError(kind)
    return np.exp(np.clip(u, lo, hi))


@dataclass
class Arm:
    lat: np.ndarray
    rate: np.ndarray
    ttft: np.ndarray
    running: np.ndarray
    requests: np.ndarray
    errors: np.ndarray


@dataclass
class LiveStreams:
    offered: np.ndarray  # the fleet's requests per pod per window: the stratum key
    control: Arm
    canary: Arm
    truth: np.ndarray  # log of the true latency ratio at the window's offered load
    control_batch: np.ndarray  # the control's noise-free batch at the window's offered load
    pre_rate: np.ndarray  # per seed: the fleet's requests per pod per window before the arms served


def _slowness(nz: bd.Noise, common: np.ndarray, rng: np.random.Generator, shape) -> np.ndarray:
    g = np.exp(rng.normal(0.0, nz.speed, shape))
    drift = np.exp(bd._ar1(rng, nz.arm_drift, nz.arm_drift_rho, shape))
    slow = np.where(rng.random(shape) < nz.tail_p, np.minimum(1.0 + rng.pareto(2.5, shape), 10.0), 1.0)
    return g * drift * common * slow


def _backlog(b: np.ndarray, demand: np.ndarray, duration_at_cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A pod's queue across windows: beyond MAX_NUM_SEQS it serves MAX_NUM_SEQS / duration requests
    per second; what it cannot serve waits, and a pod with a queue runs full (B = MAX_NUM_SEQS) until
    the queue drains; a request that would wait beyond QUEUE_TIMEOUT_S is dropped (the client gives
    up: an error). Returns (B, each window's wait before admission in seconds, requests dropped per
    pod)."""
    capacity = MAX_NUM_SEQS / duration_at_cap
    q = np.zeros(b.shape[0])
    b = b.copy()
    wait = np.zeros(b.shape)
    dropped = np.zeros(b.shape)
    for w in range(b.shape[1]):
        q = np.maximum(q + (demand[:, w] - capacity[:, w]) * WINDOW_S, 0.0)
        limit = capacity[:, w] * QUEUE_TIMEOUT_S
        dropped[:, w] = np.maximum(q - limit, 0.0)
        q = np.minimum(q, limit)
        b[q > 0, w] = float(MAX_NUM_SEQS)
        wait[:, w] = q / capacity[:, w]
    return b, wait, dropped


def make_live_streams(sc: LiveScenario, curves: Curves, seeds: int, rng: np.random.Generator,
                      n: int = LIVE_WINDOWS) -> LiveStreams:
    shape = (seeds, n)
    nz = sc.noise
    b_ctl = schedule(sc.schedule, seeds, n, rng, curves.peak)
    lam = b_ctl / (OUTPUT_TOKENS * curves.tpot(b_ctl, False))  # the fleet's arrivals per pod per second
    offered = rng.poisson(lam * WINDOW_S * FLEET_PODS) / FLEET_PODS
    # the operator's pre-period: the load at the start held for PRE_PERIOD_S, counted over the fleet
    pre_rate = rng.poisson(lam[:, 0] * PRE_PERIOD_S * FLEET_PODS) / (FLEET_PODS * PRE_PERIOD_S) * WINDOW_S
    b_can, over_can = curves.solve(lam * OUTPUT_TOKENS, True)
    truth = np.log(curves.tpot(b_can, True) / curves.tpot(b_ctl, False))
    common = np.exp(bd._ar1(rng, nz.drift, nz.drift_rho, shape))
    common_stall = rng.random(shape) < nz.stall_common
    # the fleet's own batch this window (every fleet pod shares the common slowdown): the router's reference
    ref, _ = curves.solve(lam * OUTPUT_TOKENS * common, False)
    arms = []
    for spec in (False, True):
        f = _slowness(nz, common, rng, shape)
        dur = OUTPUT_TOKENS * curves.tpot(b_ctl, spec)
        # the arm's pods' own arrivals: Poisson over the requests overlapping the window, per arm
        arrival = np.exp(rng.normal(0.0, sc.arrival_noise / np.sqrt(ARM_PODS * (1.0 + lam * (WINDOW_S + dur)))))
        b, _ = curves.solve(lam * arrival * OUTPUT_TOKENS * f, spec, sc.gamma, ref)
        demand = lam * arrival * (ref / b) ** sc.gamma  # requests per second per pod sent to the arm
        b, wait, dropped = _backlog(b, demand, OUTPUT_TOKENS * curves.tpot(np.full(shape, float(MAX_NUM_SEQS)), spec) * f)
        lam_arm = lam * (ref / b) ** sc.gamma
        tpot = curves.tpot(b, spec) * f
        requests = rng.poisson(lam_arm * WINDOW_S * ARM_PODS) / ARM_PODS
        idle = (requests == 0) & (rng.random(shape) < np.exp(-lam_arm * ARM_PODS * OUTPUT_TOKENS * tpot))
        stall = (common_stall | (rng.random(shape) < nz.stall_arm)) & ~idle
        eps = rng.normal(0.0, curves.token_cv(b * ARM_PODS, spec))
        lat = tpot * np.exp(eps + rng.normal(-nz.lat_meas ** 2 / 2, nz.lat_meas, shape))
        rate = np.exp(-eps + rng.normal(-nz.tp_meas ** 2 / 2, nz.tp_meas, shape)) / tpot
        ttft = (curves.prefill + 0.5 * curves.step(b, spec) * f) * np.exp(rng.normal(0.0, TTFT_NOISE, shape)) + wait
        lat = np.where(idle | stall, np.nan, lat)
        rate = np.where(idle, np.nan, np.where(stall, 0.0, rate))
        ttft = np.where(requests == 0, np.nan, ttft)
        errors = rng.binomial(np.rint(requests * ARM_PODS).astype(int), ERROR_RATE) + np.rint(dropped * ARM_PODS)
        arms.append(Arm(lat, rate, ttft, b, requests, errors))
    return LiveStreams(offered, arms[0], arms[1], truth, b_ctl, pre_rate)


# --- the tests, vectorised --------------------------------------------------------------------

def _outcomes(c: Arm, k: Arm, th: Thresholds, max_ttft: float, valid: np.ndarray,
              freeze: bool = FREEZE) -> tuple[np.ndarray, np.ndarray]:
    """`stratum_outcome` at every window of one stratum's pairs (values outside it NaN), frozen at
    the first settled window; ``valid`` marks the windows where the stratum is looked at. Returns
    (outcome code, pairs read) per seed."""
    lat_cmp, tp_cmp = PairedComparison.for_latency(th), PairedComparison.for_throughput(th)
    n_l, l_lo, l_hi = bd._paired_goodness(c.lat, k.lat, lat_cmp, True, False)
    n_t, t_lo, t_hi = bd._paired_goodness(c.rate, k.rate, tp_cmp, False, True)
    n_f, f_lo, f_hi = bd._paired_goodness(c.ttft, k.ttft, lat_cmp, True, False)
    ms = th.min_samples
    ok = n_l >= ms
    regress = ok & (((n_t >= ms) & (t_hi < -th.max_throughput_regression)) | ((n_f >= ms) & (f_hi < -max_ttft)))
    wins = ok & ~regress & (l_lo > th.min_latency_improvement) & (n_t >= ms) & (t_lo > -th.max_throughput_regression)
    nogain = ok & ~regress & ~wins & (l_hi < th.min_latency_improvement)
    settled = (regress | wins | nogain) & valid
    seeds = settled.shape[0]
    rows = np.arange(seeds)
    if freeze:
        any_s = settled.any(axis=1)
        idx = np.where(any_s, settled.argmax(axis=1), settled.shape[1] - 1)
    else:  # read once, at the last window
        idx = np.full(seeds, settled.shape[1] - 1)
        any_s = (regress | wins | nogain)[rows, idx]
    out = np.full(seeds, INCONCLUSIVE)
    out[any_s & (regress[rows, idx] | nogain[rows, idx])] = ROLLBACK
    out[any_s & wins[rows, idx]] = PROMOTE
    return out, n_l[rows, idx]


def _masked(a: Arm, m: np.ndarray) -> Arm:
    nan = np.nan
    return Arm(np.where(m, a.lat, nan), np.where(m, a.rate, nan), np.where(m, a.ttft, nan), a.running, a.requests,
               a.errors)


def seed_strata(st: LiveStreams) -> list[Strata]:
    """Each seed's strata, as the operator fixes them before any window is compared."""
    return [Strata(edges_from_rate(float(r))) for r in st.pre_rate]


def stratum_keys(st: LiveStreams) -> tuple[np.ndarray, int]:
    """(each window's stratum under its seed's strata (seeds, n), the number of strata)."""
    strata = seed_strata(st)
    n_s = max(len(x) for x in strata)
    return np.stack([x.index(st.offered[s]) for s, x in enumerate(strata)]), n_s


def run_ours(st: LiveStreams, th: Thresholds, max_ttft: float = 0.5, keys: tuple[np.ndarray, int] | None = None):
    """Per stratum: (outcome, pairs read, windows in it), each (seeds, n_strata). ``keys``:
    ``stratum_keys(st)`` when the caller has them already."""
    key, n_s = keys if keys is not None else stratum_keys(st)
    fth = live_thresholds(th, n_s)
    outs, reads, windows = [], [], []
    for s in range(n_s):
        m = key == s
        o, r = _outcomes(_masked(st.control, m), _masked(st.canary, m), fth, max_ttft, m)
        outs.append(o)
        reads.append(r)
        windows.append(m.sum(axis=1))
    return np.stack(outs, 1), np.stack(reads, 1), np.stack(windows, 1)


def _compress(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per row, the values where m holds, moved to the front in time order; NaN after."""
    order = np.argsort(~m, axis=1, kind="stable")
    v = np.take_along_axis(np.where(m, x, np.nan), order, axis=1)
    return v


def run_naive(st: LiveStreams, th: Thresholds, max_ttft: float = 0.5):
    """Per own-running-batch bucket: (outcome, pairs read), each (seeds, n_buckets)."""
    edges = np.asarray(NAIVE_EDGES)
    fth = th.for_family(len(edges) + 1, 3)
    bc = np.searchsorted(edges, st.control.running, side="right")
    bk = np.searchsorted(edges, st.canary.running, side="right")
    outs, reads = [], []
    for b in range(len(edges) + 1):
        mc, mk = bc == b, bk == b
        npair = np.minimum(mc.sum(1), mk.sum(1))
        valid = np.arange(mc.shape[1])[None, :] < npair[:, None]
        c = Arm(*(_compress(getattr(st.control, f), mc) for f in ("lat", "rate", "ttft")), None, None, None)
        k = Arm(*(_compress(getattr(st.canary, f), mk) for f in ("lat", "rate", "ttft")), None, None, None)
        c = _masked(c, valid)
        k = _masked(k, valid)
        o, r = _outcomes(c, k, fth, max_ttft, valid)
        outs.append(o)
        reads.append(r)
    return np.stack(outs, 1), np.stack(reads, 1)


def check_against_live_code(th: Thresholds, rng: np.random.Generator, seeds: int = 3) -> None:
    """The vectorised ours must agree with `LiveComparison` window by window (idle, stalled and
    saturated windows included)."""
    cfgs = (SimConfig(gpu="a100-80gb", model="llama-3-8b", method="jacobi", acceptance=0.45),
            SimConfig(gpu="l4", model="llama-3-70b", method="ngram", acceptance=0.3))
    for cfg, sched, router in ((cfgs[0], "ramp", "shared-pool"), (cfgs[1], "bursts", "service")):
        nz = replace(bd.PROFILES[2], stall_arm=0.05, stall_common=0.05)
        sc = LiveScenario("check", cfg, sched, router, nz)
        curves = Curves(cfg)
        st = make_live_streams(sc, curves, seeds, rng)
        outcome, reads, _ = run_ours(st, th)
        lean = (outcome == INCONCLUSIVE) & latency_leans(st, *stratum_keys(st))
        for s, strata in enumerate(seed_strata(st)):
            live = LiveComparison(th, strata, freeze=FREEZE)

            def arm(a: Arm, w: int) -> ArmWindow:
                val = lambda x: None if not np.isfinite(x) else float(x)  # noqa: E731
                return ArmWindow(val(a.lat[s, w]), val(a.rate[s, w]), val(a.ttft[s, w]), int(a.requests[s, w]),
                                 int(a.errors[s, w]), float(a.running[s, w]))

            for w in range(st.offered.shape[1]):
                live.add(LiveWindow(float(st.offered[s, w]), arm(st.control, w), arm(st.canary, w)))
            res = live.results()
            for r in res.strata:
                if _CODE[r.outcome] != outcome[s, r.index] or r.pairs != reads[s, r.index]:
                    raise AssertionError(f"vectorised live benchmark disagrees with LiveComparison at seed {s}, "
                                         f"stratum {r.index}: {r.outcome} after {r.pairs} pairs, vectorised "
                                         f"{outcome[s, r.index]} after {reads[s, r.index]}")
                if r.leaning != bool(lean[s, r.index]):
                    raise AssertionError(f"vectorised live benchmark disagrees with LiveComparison at seed {s}, "
                                         f"stratum {r.index}: leaning {r.leaning}, vectorised {lean[s, r.index]}")


# --- the safety abort: the operator's rule ------------------------------------------------------

#: `abort_checks`' codes: 0 no abort, then the signals in `abort_reason`'s order
ABORT_SIGNALS = (None, AbortSignal.errors, AbortSignal.ttft, AbortSignal.token_latency)


@dataclass
class ArmWindows:
    """`ArmWindow`'s fields as arrays, one entry per (seed, check): an arm over the abort's window
    read at each check. NaN where `ArmWindow` has None; requests and errors are integers."""

    per_token_latency: np.ndarray
    token_rate: np.ndarray
    ttft: np.ndarray
    requests: np.ndarray
    errors: np.ndarray
    running: np.ndarray

    def at(self, s: int, j: int) -> ArmWindow:
        """Seed s, check j as the record `abort_reason` reads."""
        val = lambda x: float(x) if np.isfinite(x) else None  # noqa: E731
        return ArmWindow(val(self.per_token_latency[s, j]), val(self.token_rate[s, j]), val(self.ttft[s, j]),
                         int(self.requests[s, j]), int(self.errors[s, j]), val(self.running[s, j]))


def _steps(d, what: str) -> int:
    """A duration of the abort spec in bench windows (it must be a whole number of them)."""
    n = d.total_seconds() / WINDOW_S
    if n < 1 or abs(n - round(n)) > 1e-9:
        raise ValueError(f"analysis.abort.{what} {d} is not a whole number of {WINDOW_S:g} s windows")
    return int(round(n))


def abort_check_ends(n: int, abort: AbortSpec = ABORT) -> np.ndarray:
    """The checks' times in windows: one every ``abort.checkInterval`` of the stream, the check at
    end e reading windows [e - window, e) (fewer at the start: the stream so far)."""
    every = _steps(abort.check_interval, "checkInterval")
    return np.arange(every, n + 1, every)


def abort_windows(a: Arm, abort: AbortSpec = ABORT) -> ArmWindows:
    """The arm over the last ``abort.window`` of the stream at each check, (seeds, checks):

    * ``requests``, ``errors``: requests routed to the arm's pods and those that failed, summed over
      the pods and the windows (what the arm's counters' increase over the window reads);
    * ``per_token_latency``: weighted by tokens, as the histogram's ``_sum / _count`` increase over the
      window reads it: a window's tokens are its request-seconds in flight over its per-token
      latency (ARM_PODS x running x WINDOW_S / lat), so the mean is request-seconds over tokens;
      windows without a token (idle, stalled) add none; NaN when no window had one;
    * ``ttft``: weighted by the requests started in each window; NaN when none was;
    * ``token_rate``: tokens per request-second in flight (a stall's request-seconds count, with no
      tokens); ``running``: the mean running batch. `abort_reason` reads neither.
    """
    win = _steps(abort.window, "window")
    ends = abort_check_ends(a.lat.shape[1], abort)

    def fold(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        pad = np.concatenate([np.zeros((x.shape[0], win)), x], axis=1)
        return np.lib.stride_tricks.sliding_window_view(pad, win, axis=1)[:, ends, :].sum(axis=2)

    def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, fold(num) / np.where(den > 0, den, 1.0), np.nan)

    requests = np.rint(a.requests * ARM_PODS)
    in_flight = ARM_PODS * a.running * WINDOW_S  # request-seconds per window
    has_lat = np.isfinite(a.lat) & (a.lat > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tokens = np.where(has_lat, in_flight / np.where(has_lat, a.lat, 1.0), 0.0)
    has_ttft = np.isfinite(a.ttft)
    has_rate = np.isfinite(a.rate)
    seen = np.minimum(ends, win)
    return ArmWindows(
        per_token_latency=ratio(np.where(has_lat, in_flight, 0.0), fold(tokens)),
        token_rate=ratio(np.where(has_rate, a.rate * in_flight, 0.0), fold(np.where(has_rate, in_flight, 0.0))),
        ttft=ratio(np.where(has_ttft, a.ttft * requests, 0.0), fold(np.where(has_ttft, requests, 0.0))),
        requests=np.rint(fold(requests)).astype(np.int64),
        errors=np.rint(fold(np.rint(a.errors))).astype(np.int64),
        running=fold(a.running) / seen[None, :])


def abort_checks(canary: ArmWindows, control: ArmWindows, abort: AbortSpec = ABORT) -> np.ndarray:
    """`abort_reason` at every (seed, check) at once: the index in ABORT_SIGNALS of its answer's
    signal, 0 where it answers None. The same comparisons in the same order and float operations
    (checked against it on random inputs in the unit tests, and in every run on the streams of
    every ABORT_CHECK_EVERY-th scenario)."""

    def served(a: ArmWindows) -> np.ndarray:
        return np.maximum(np.maximum(a.requests, a.errors), 0)

    def error_rate(a: ArmWindows) -> np.ndarray:
        n = served(a)
        return np.where(n > 0, np.minimum(1.0, np.maximum(0, a.errors) / np.maximum(n, 1)), 0.0)

    sc, sk = served(canary), served(control)
    errors = (((sc >= abort.min_requests) | (canary.errors >= abort.min_errors))
              & (error_rate(canary) - error_rate(control) > abort.max_error_rate_increase + 1e-12))
    enough = (sc >= abort.min_requests) & (sk >= abort.min_requests)

    def above(c: np.ndarray, k: np.ndarray, rise: float) -> np.ndarray:
        ok = enough & np.isfinite(c) & np.isfinite(k) & (k > 0)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return ok & ~(np.where(ok, c, 1.0) / np.where(ok, k, 1.0) <= 1.0 + rise)

    ttft = above(canary.ttft, control.ttft, abort.max_ttft_regression)
    token = above(canary.per_token_latency, control.per_token_latency, abort.max_token_latency_regression)
    return np.select([errors, ttft, token], [1, 2, 3], 0)


def apply_abort(st: LiveStreams, abort: AbortSpec = ABORT) -> np.ndarray:
    """The safety abort, the operator's rule (`abort_reason`) at ``abort``: at every check the
    first that answers removes the canary's share at once and the run ends RolledBack. Blanks both
    arms' values from the check on (no more pairs; the offered load stays, so strata are still
    counted as the load visited them) and returns, per seed, the ABORT_SIGNALS index of the signal
    that aborted it (0: not aborted)."""
    codes = abort_checks(abort_windows(st.canary, abort), abort_windows(st.control, abort), abort)
    ends = abort_check_ends(st.offered.shape[1], abort)
    hit = codes > 0
    fired = hit.any(axis=1)
    j = hit.argmax(axis=1)
    first = np.where(fired, ends[j], st.offered.shape[1])
    after = np.arange(st.offered.shape[1])[None, :] >= first[:, None]
    for a in (st.control, st.canary):
        for f in ("lat", "rate", "ttft"):
            setattr(a, f, np.where(after, np.nan, getattr(a, f)))
    return np.where(fired, codes[np.arange(codes.shape[0]), j], 0)


def check_abort_against_operator(st: LiveStreams, abort: AbortSpec = ABORT) -> None:
    """`abort_checks` must answer as `abort_reason` does, check by check, on these streams."""
    canary, control = abort_windows(st.canary, abort), abort_windows(st.control, abort)
    codes = abort_checks(canary, control, abort)
    for s in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            r = abort_reason(canary.at(s, j), control.at(s, j), abort)
            if ABORT_SIGNALS[codes[s, j]] != (r.signal if r else None):
                raise AssertionError(f"vectorised abort disagrees with abort_reason at seed {s}, check {j}: "
                                     f"{ABORT_SIGNALS[codes[s, j]]} against {r}")


# --- driver -----------------------------------------------------------------------------------

@dataclass
class Units:
    """Per (scenario, seed, visited stratum): truth and each method's outcome and windows read."""

    log_ratio: list
    outcome: dict
    reads: dict
    scenario: list  # (schedule, router, profile) per unit
    policy: dict  # method -> [wrong enablement, exact regime] per (scenario, seed)
    unvisited: int = 0
    strata_total: int = 0
    aborted: int = 0
    runs: int = 0
    policy_router: list = field(default_factory=list)
    aborted_router: list = field(default_factory=list)  # (router, ABORT_SIGNALS index: 0 not aborted) per run
    unit_aborted: list = field(default_factory=list)  # per unit: its run ended at the safety abort


def deserves(log_ratio: np.ndarray, th: Thresholds) -> np.ndarray:
    r = np.exp(log_ratio)
    return ((1 - r) >= th.min_latency_improvement - 1e-9) & ((1 - 1 / r) <= th.max_throughput_regression + 1e-9)


def regression(log_ratio: np.ndarray) -> np.ndarray:
    return (1 - 1 / np.exp(log_ratio)) >= 0.05 - 1e-9


def run_live(seeds: int, th: Thresholds, seed: int = 0, scenarios: list[LiveScenario] | None = None) -> Units:
    rng = np.random.default_rng(seed + 1)
    check_against_live_code(th, rng)
    scenarios = scenarios if scenarios is not None else live_scenarios()
    u = Units([], {m: [] for m in METHODS}, {m: [] for m in METHODS}, [], {m: [] for m in METHODS})
    cache: dict = {}
    for i, sc in enumerate(scenarios):
        if sc.label not in cache:
            cache[sc.label] = Curves(sc.config)
        curves = cache[sc.label]
        st = make_live_streams(sc, curves, seeds, rng)
        if i % ABORT_CHECK_EVERY == 0:
            check_abort_against_operator(st)
        abort_codes = apply_abort(st)
        aborted = abort_codes > 0
        u.aborted += int(aborted.sum())
        u.runs += seeds
        key, n_s = stratum_keys(st)
        ours, ours_reads, windows = run_ours(st, th, keys=(key, n_s))
        naive, naive_reads = run_naive(st, th)
        ours[aborted] = ROLLBACK
        naive[aborted] = ROLLBACK
        truth = np.full((seeds, n_s), np.nan)
        bucket = np.zeros((seeds, n_s), dtype=int)
        for s in range(n_s):
            m = key == s
            cnt = np.maximum(m.sum(1), 1)
            truth[:, s] = np.where(m, st.truth, 0.0).sum(1) / cnt
            gm = np.exp(np.where(m, np.log(st.control_batch), 0.0).sum(1) / cnt)
            bucket[:, s] = np.searchsorted(np.asarray(NAIVE_EDGES), gm, side="right")
        naive_at = np.take_along_axis(naive, bucket, axis=1)
        naive_reads_at = np.take_along_axis(naive_reads, bucket, axis=1)
        visited = windows >= th.min_samples
        u.unvisited += int((~visited & (windows > 0)).sum())
        u.strata_total += int((windows > 0).sum())
        sel = visited
        u.log_ratio.append(truth[sel])
        u.scenario.extend([(sc.schedule, sc.router, sc.noise.name)] * int(sel.sum()))
        u.unit_aborted.append(np.broadcast_to(aborted[:, None], sel.shape)[sel])
        lean = (ours == INCONCLUSIVE) & latency_leans(st, key, n_s)
        for name, out, rd, ln in (("ours", ours, ours_reads, lean),
                                  ("naive_running_batch", naive_at, naive_reads_at, None)):
            u.outcome[name].append(out[sel])
            u.reads[name].append(rd[sel])
            u.policy[name].append(_policy(out, visited, truth, th, ln))
        u.policy_router.extend([sc.router] * seeds)
        u.aborted_router.extend([(sc.router, int(c)) for c in abort_codes])
    return u


def latency_leans(st: LiveStreams, key: np.ndarray, n_s: int) -> np.ndarray:
    """Per (seed, stratum): the canary's mean log per-token latency ratio over the stratum's paired
    windows is below 0 (the sign of the operator's latency estimate, ``leans_to_canary``)."""
    keep, d = bd.log_ratios(st.control.lat, st.canary.lat)
    out = np.zeros((key.shape[0], n_s), dtype=bool)
    for s in range(n_s):
        m = keep & (key == s)
        out[:, s] = (m.sum(1) > 0) & (np.where(m, d, 0.0).sum(1) < 0)
    return out


def _policy(out: np.ndarray, visited: np.ndarray, truth: np.ndarray, th: Thresholds,
            leaning: np.ndarray | None = None) -> np.ndarray:
    """Per seed: (a stratum lookahead is enabled at does not deserve it, the enabled region's top is
    the deserving run's). Enabled: every visited stratum up to the top of the run (lookahead is on
    from batch 1 up), those ``read_run`` passed over below it included. Strata the traffic did not
    visit have no truth (an empty one's is 0 here) and are not counted: the operator's cap comes
    from the control's running batch in visited strata only."""
    code = {PROMOTE: StratumOutcome.WINS, ROLLBACK: StratumOutcome.NO_GAIN, INCONCLUSIVE: StratumOutcome.PENDING}
    good = deserves(np.nan_to_num(truth), th)
    res = np.zeros((out.shape[0], 2), dtype=bool)
    for s in range(out.shape[0]):
        lean = None if leaning is None else list(leaning[s])
        run, _ = read_run([code[int(x)] for x in out[s]], list(visited[s]), lean)
        true_run, _ = read_run([StratumOutcome.WINS if g and v else StratumOutcome.NO_GAIN
                                for g, v in zip(good[s], visited[s])], list(visited[s]))
        on = [i for i in range(run[-1] + 1) if visited[s, i]] if run else []
        res[s] = (any(not good[s, i] for i in on), on[-1:] == list(true_run[-1:]))
    return res


def summarise_live(u: Units, th: Thresholds, select: np.ndarray | None = None) -> dict:
    lr = np.concatenate(u.log_ratio) if u.log_ratio else np.zeros(0)
    sel = np.ones(lr.shape, dtype=bool) if select is None else select
    good, reg = deserves(lr, th) & sel, regression(lr) & sel
    bad = ~deserves(lr, th) & sel
    out = {}
    for m in METHODS:
        o = np.concatenate(u.outcome[m])
        r = np.concatenate(u.reads[m])
        out[m] = {
            "wrong_promotion_rate": float((o[bad] == PROMOTE).mean()) if bad.any() else 0.0,
            "missed_regression_rate": float((o[reg] != ROLLBACK).mean()) if reg.any() else 0.0,
            "inconclusive_rate": float((o[sel] == INCONCLUSIVE).mean()) if sel.any() else 0.0,
            "correct_promotion_rate": float((o[good] == PROMOTE).mean()) if good.any() else 0.0,
            "mean_windows": float(r[sel].mean()) if sel.any() else 0.0,
            "promoted_regression_rate": float((o[reg] == PROMOTE).mean()) if reg.any() else 0.0,
            "units": int(sel.sum()),
        }
    out["units"] = {"all": int(sel.sum()), "deserving": int(good.sum()), "regressions": int(reg.sum()),
                    "not_deserving": int(bad.sum())}
    return out


def by_abort(u: Units, good: np.ndarray, reg: np.ndarray) -> dict:
    """Who caught the regressions: units in runs the safety abort ended (rolled back everywhere),
    and, of the rest, what ``ours``' test answered; and the deserving units the abort ended."""
    ab = np.concatenate(u.unit_aborted) if u.unit_aborted else np.zeros(good.shape, dtype=bool)
    o = np.concatenate(u.outcome["ours"])
    left = reg & ~ab
    return {"regressions_aborted": int((reg & ab).sum()),
            "regressions_rolled_back_by_test": int((left & (o == ROLLBACK)).sum()),
            "regressions_pending": int((left & (o == INCONCLUSIVE)).sum()),
            "regressions_promoted": int((left & (o == PROMOTE)).sum()),
            "deserving_aborted": int((good & ab).sum())}


def _rates(s: dict) -> dict:
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in s.items()}


def live_report(u: Units, th: Thresholds, seeds: int, n_scenarios: int) -> dict:
    """The ``live`` object of the benchmark's last line: the headline over the routers the issue
    allows (``service``, ``pools``), the forbidden ``shared_pool`` beside it."""
    routers = np.array([r for _, r, _ in u.scenario])
    head = np.isin(routers, HEADLINE_ROUTERS)
    summary = summarise_live(u, th, head)
    out = {m: _rates(summary[m]) for m in METHODS}
    out["scenarios"] = n_scenarios
    out["seeds"] = seeds
    out["units"] = summary["units"]
    lr = np.concatenate(u.log_ratio) if u.log_ratio else np.zeros(0)
    out["by_abort"] = by_abort(u, deserves(lr, th) & head, regression(lr) & head)
    out["strata_below_min_windows"] = round(u.unvisited / max(u.strata_total, 1), 5)
    ab = np.array([c for r, c in u.aborted_router if r in HEADLINE_ROUTERS], dtype=int)
    out["aborted_runs"] = round(float((ab > 0).mean()) if ab.size else 0.0, 5)
    out["aborted_by"] = {str(sig): round(float((ab == i).mean()) if ab.size else 0.0, 5)
                         for i, sig in enumerate(ABORT_SIGNALS) if sig is not None}
    keys = np.array([f"{a} {b}" for a, b, _ in u.scenario])
    out["by_schedule_router"] = {}
    for k in sorted(set(keys.tolist())):
        s = summarise_live(u, th, keys == k)
        out["by_schedule_router"][k] = {m: {x: round(s[m][x], 5) for x in ("wrong_promotion_rate",
                                                                          "missed_regression_rate",
                                                                          "inconclusive_rate",
                                                                          "correct_promotion_rate")}
                                        for m in METHODS}
    prouter = np.array(u.policy_router)
    pol = {m: np.concatenate(u.policy[m]) for m in METHODS}
    out["policy"] = {m: {"wrong_enablement_rate": round(float(p[np.isin(prouter, HEADLINE_ROUTERS), 0].mean()), 5),
                         "exact_regime_rate": round(float(p[np.isin(prouter, HEADLINE_ROUTERS), 1].mean()), 5)}
                     for m, p in pol.items()}
    out["goal"] = {"wrong_promotions_le_1pct": out["ours"]["wrong_promotion_rate"] <= 0.01,
                   "missed_5pct_regressions_le_2pct": out["ours"]["missed_regression_rate"] <= 0.02}
    if (~head).any():
        shared = summarise_live(u, th, ~head)
        out["shared_pool"] = {m: _rates(shared[m]) for m in METHODS}
        out["shared_pool"]["units"] = shared["units"]
    return out


def render_live(live: dict) -> None:
    """An 80-column table of the live part."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=80)
    t = Table(title=f"Live streams ({live['units']['all']} stratum runs per method; naive: strata by "
                    "own running batch; shared: both arms in one load-aware pool)")
    for col in ("method", "wrong promo", "missed 5% reg", "inconcl.", "correct promo", "mean windows"):
        t.add_column(col, justify="left" if col == "method" else "right")
    short = {"ours": "ours", "naive_running_batch": "naive"}
    rows = [(short[m], live[m]) for m in METHODS]
    if "shared_pool" in live:
        rows += [(f"{short[m]}, shared", live["shared_pool"][m]) for m in METHODS]
    for m, s in rows:
        t.add_row(m, f"{s['wrong_promotion_rate']:.2%}", f"{s['missed_regression_rate']:.2%}",
                  f"{s['inconclusive_rate']:.1%}", f"{s['correct_promotion_rate']:.1%}", f"{s['mean_windows']:.1f}")
    con.print(t)


def main_live(seeds: int, th: Thresholds, seed: int = 0, quick: bool = False) -> dict:
    """The live part of `bench_decision.main`: a quarter of the step benchmark's seeds (the streams
    are 714 windows long, not 18-274), every scenario (every 4th with ``quick``)."""
    scenarios = live_scenarios()
    if quick:
        scenarios = scenarios[::4]
    live_seeds = max(seeds // 4, 4)
    u = run_live(live_seeds, th, seed=seed, scenarios=scenarios)
    return live_report(u, th, live_seeds, len(scenarios))
