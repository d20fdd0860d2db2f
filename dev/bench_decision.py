"""Decision benchmark: our sequential test vs a Kayenta-style and a Flagger-style canary judge.

    python3 -m lookahead_operator.bench_decision [--seeds N] [--quick] [--horizon N]

One *scenario* is one load step (one batch size) with a known true effect: the canary's
per-token latency is `lat_ratio` times the control's and its throughput `tp_ratio` times. One
*sample* is one measurement interval per arm (a scrape window): one per-token latency value and
one throughput value for the control and for the canary. For every scenario and seed the three
methods read the SAME sample streams:

- ours: the anytime-valid confidence sequence of `lookahead_operator.statistics` and the batch
  outcome rule of `lookahead_operator.decision` (Wins / Regresses / NoGain), looked at after every
  sample from `min_samples` on, stopping at the first settled outcome, up to `--horizon` samples
  per arm (the deadline; then Inconclusive);
- kayenta: fixed horizon of 50 samples per arm (Kayenta's rule of thumb), a two-sided
  Mann-Whitney U test per metric at 98% confidence (scipy.stats.mannwhitneyu), the effect taken
  from the Hodges-Lehmann shift relative to the control median; promote when latency is
  significantly better by at least the minimum improvement and throughput is not significantly
  worse by more than the tolerance, roll back otherwise;
- flagger: one canary scalar per interval checked against a fixed threshold (latency <=
  (1 - minImprovement) * baseline, throughput >= (1 - maxRegression) * baseline); a failing
  interval increments failedChecks, which only grows; rollback at failedChecks = 5, promote after
  10 intervals otherwise. Flagger has no baseline arm, so the baseline is a number a person pinned:
  `flagger` pins it from a past measurement off by a lognormal 3%, `flagger_oracle` is handed the
  control's true mean (a best case no real user has).

Ground truth: a scenario *deserves promotion* when latency fell by >= minLatencyImprovement and
throughput fell by <= maxThroughputRegression. A *wrong promotion* is promoting one that does not.
A *5% regression* is a scenario whose throughput fell >= 5%; it is *missed* unless the method ends
in a rollback (Regresses or NoGain for ours; an Inconclusive at the deadline counts as missed).

Scenarios come from two sources:
- grid: latency change +10% .. -30% (improvement -10%, 0, 3, 4, 5, 8, 15, 30%) x throughput
  regression (0, 1, 2, 3, 5, 10%) x
  noise (lognormal per-interval CV 2%, 5%, 10%, and 5% with 2% stalls that hit both metrics);
- sim: the roofline simulator (`lookahead_canary.simulator`): Jacobi and n-gram lookahead on
  A100 / H100 / L4 serving Llama-3-8B, acceptance 0.3 / 0.45 / 0.6, batch sizes 1 .. 64; true
  effects from the roofline, per-interval noise from step-time noise, per-sequence acceptance
  variance and a measurement floor of 1% or 3%.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import dataclass

import numpy as np
from scipy import stats

from lookahead_canary.simulator import RooflineSimulator, SimConfig

from .decision import BatchOutcome, BatchVerdict
from .statistics import SequentialComparison, Thresholds, log_ratio_confidence_sequence

FIXED_HORIZON = 50  # Kayenta's "about 50 points per metric"
KAYENTA_ALPHA = 0.02  # 98% confidence
FLAGGER_ITERATIONS = 10
FLAGGER_THRESHOLD = 5

PROMOTE, ROLLBACK, INCONCLUSIVE = 0, 1, 2
METHODS = ("ours", "kayenta", "flagger", "flagger_oracle")
# Flagger has no baseline: its thresholds are absolute numbers a person pinned from a dashboard.
# "flagger" pins them from a past measurement of the control that is off by a lognormal 3%
# (last week's traffic mix, another node); "flagger_oracle" is handed the control's true mean.
FLAGGER_BASELINE_SIGMA = 0.03


@dataclass(frozen=True)
class Scenario:
    source: str  # "grid" | "sim"
    label: str
    batch_size: int
    lat_ratio: float  # canary / control per-token latency (true, of means)
    tp_ratio: float  # canary / control throughput
    noise: str  # label of the noise level
    # stream generation
    sigma: float = 0.05  # per-interval lognormal CV of both metrics (grid)
    stall_rate: float = 0.0  # grid: share of intervals hit by a stall
    sim: tuple | None = None  # (steps, step_sigma, tok_mean_c, tok_var_c, tok_mean_k, tok_var_k, meas_sigma)

    def deserves_promotion(self, th: Thresholds) -> bool:
        eps = 1e-9
        return (1 - self.lat_ratio) >= th.min_latency_improvement - eps and (
            1 - self.tp_ratio
        ) <= th.max_throughput_regression + eps

    @property
    def regression_5pct(self) -> bool:
        return 1 - self.tp_ratio >= 0.05 - 1e-9


# --- scenarios ------------------------------------------------------------------------------

GRID_IMPROVEMENTS = (-0.10, 0.0, 0.03, 0.04, 0.05, 0.08, 0.15, 0.30)
GRID_REGRESSIONS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.10)
GRID_NOISE = (("cv2%", 0.02, 0.0), ("cv5%", 0.05, 0.0), ("cv10%", 0.10, 0.0), ("cv5%+stalls", 0.05, 0.02))
SIM_METHODS = ("jacobi", "ngram")
SIM_GPUS = ("a100-80gb", "h100-sxm", "l4")
SIM_ACCEPTANCE = (0.3, 0.45, 0.6)
SIM_BATCHES = (1, 2, 4, 8, 16, 32, 64)
SIM_MEAS = (0.01, 0.03)
SIM_STEPS_PER_INTERVAL = 100


def grid_scenarios() -> list[Scenario]:
    out = []
    for imp in GRID_IMPROVEMENTS:
        for reg in GRID_REGRESSIONS:
            for name, sigma, stalls in GRID_NOISE:
                out.append(Scenario("grid", f"lat{-imp:+.0%} tp{-reg:+.0%}", 0, 1 - imp, 1 - reg, name,
                                    sigma=sigma, stall_rate=stalls))
    return out


def _acceptance_moments(cfg: SimConfig, speculate: bool) -> tuple[float, float]:
    """Mean and variance of tokens per sequence per step (1 + truncated geometric)."""
    cap = cfg.max_draft_accepted(speculate)
    if cap == 0 or cfg.acceptance <= 0:
        return 1.0, 0.0
    a = cfg.acceptance
    k = np.arange(cap + 1)
    p = (1 - a) * a**k
    p[-1] = a**cap  # all remaining mass at the cap
    m = float((p * (1 + k)).sum())
    v = float((p * (1 + k) ** 2).sum() - m * m)
    return m, v


def sim_scenarios() -> list[Scenario]:
    out = []
    for method in SIM_METHODS:
        for gpu in SIM_GPUS:
            for acc in SIM_ACCEPTANCE:
                cfg = SimConfig(gpu=gpu, model="llama-3-8b", method=method, acceptance=acc, noise_sigma=0.05)
                sim = RooflineSimulator(cfg, seed=0)
                mc, vc = _acceptance_moments(cfg, False)
                mk, vk = _acceptance_moments(cfg, True)
                for b in SIM_BATCHES:
                    step_c = sim.expected_step_seconds(b, False)
                    step_k = sim.expected_step_seconds(b, True)
                    # true ratios of means: latency = step time / tokens per step
                    lat_ratio = (step_k / mk) / (step_c / mc)
                    tp_ratio = 1.0 / lat_ratio  # closed loop at a fixed concurrency
                    for meas in SIM_MEAS:
                        out.append(Scenario(
                            "sim", f"{method} {gpu} acc{acc} b{b}", b, lat_ratio, tp_ratio, f"sim+{meas:.0%}",
                            sim=(SIM_STEPS_PER_INTERVAL, cfg.noise_sigma, mc, vc, mk, vk, meas),
                        ))
    return out


# --- streams --------------------------------------------------------------------------------

def make_streams(sc: Scenario, seeds: int, horizon: int, rng: np.random.Generator):
    """(lat_control, lat_canary, tp_control, tp_canary), each (seeds, horizon); control means ~1."""
    shape = (seeds, horizon)
    if sc.sim is None:
        s = sc.sigma
        # lognormal with the given CV, scaled so the *mean* ratio is the true ratio
        def draw(ratio):  # mean-one lognormal with CV ~ s, times the true ratio
            return ratio * np.exp(rng.normal(-s * s / 2, s, shape))

        lat_c, tp_c = draw(1.0), draw(1.0)
        lat_k, tp_k = draw(sc.lat_ratio), draw(sc.tp_ratio)
        if sc.stall_rate > 0:
            for lat, tp in ((lat_c, tp_c), (lat_k, tp_k)):
                hit = rng.random(shape) < sc.stall_rate
                f = np.where(hit, rng.uniform(1.3, 2.0, shape), 1.0)
                lat *= f
                tp /= f
        return lat_c, lat_k, tp_c, tp_k
    steps, step_sigma, mc, vc, mk, vk, meas = sc.sim
    b = max(sc.batch_size, 1)

    def arm(step_ratio, m, v):
        # time of `steps` steps: sum of lognormals ~ lognormal with CV step_sigma / sqrt(steps)
        cv_t = step_sigma / math.sqrt(steps)
        t = steps * step_ratio * np.exp(rng.normal(-cv_t * cv_t / 2, cv_t, shape))
        # tokens per sequence over the interval, averaged over the batch (CLT)
        toks = steps * m + math.sqrt(steps * v / b) * rng.standard_normal(shape)
        toks = np.maximum(toks, steps)
        lat = t / toks * np.exp(rng.normal(-meas * meas / 2, meas, shape))
        tp = b * toks / t * np.exp(rng.normal(-meas * meas / 2, meas, shape))
        return lat, tp

    # normalise the control's expected latency to ~1: step ratio relative to the control step
    ctrl_lat, ctrl_tp = arm(mc, mc, vc)
    k_step = sc.lat_ratio * mk  # canary step time relative to the control step, so that lat ratio holds
    can_lat, can_tp = arm(k_step, mk, vk)
    # throughput normalised to the control's ~1
    norm = b
    return ctrl_lat, can_lat, ctrl_tp / norm, can_tp / norm


# --- methods --------------------------------------------------------------------------------

def _cum_stats(x: np.ndarray):
    n = np.arange(1, x.shape[1] + 1, dtype=float)
    s1 = np.cumsum(x, axis=1)
    s2 = np.cumsum(x * x, axis=1)
    m = s1 / n
    v = np.maximum(s2 - n * m * m, 0.0) / np.maximum(n - 1, 1)
    return n, m, v


def _goodness_cs(c: np.ndarray, k: np.ndarray, alpha: float, tau: float, lower_is_better: bool):
    n, mc, vc = _cum_stats(c)
    _, mk, vk = _cum_stats(k)
    _, lo, hi = log_ratio_confidence_sequence(n, mc, vc, n, mk, vk, alpha, tau)
    lo, hi = np.expm1(lo), np.expm1(hi)
    return (-hi, -lo) if lower_is_better else (lo, hi)


def run_ours(streams, th: Thresholds):
    lat_c, lat_k, tp_c, tp_k = streams
    alpha = 1 - th.confidence
    tau_l = max(th.min_latency_improvement, 0.01)  # as SequentialComparison's default
    tau_t = max(th.max_throughput_regression, 0.01)
    l_lo, l_hi = _goodness_cs(lat_c, lat_k, alpha, tau_l, True)
    t_lo, t_hi = _goodness_cs(tp_c, tp_k, alpha, tau_t, False)
    seeds, horizon = lat_c.shape
    valid = np.arange(1, horizon + 1) >= th.min_samples
    regress = (t_hi < -th.max_throughput_regression) & valid
    wins = (l_lo > th.min_latency_improvement) & (t_lo > -th.max_throughput_regression) & valid
    nogain = (l_hi < th.min_latency_improvement) & valid
    settled = regress | wins | nogain
    any_settled = settled.any(axis=1)
    idx = np.where(any_settled, settled.argmax(axis=1), horizon - 1)
    rows = np.arange(seeds)
    outcome = np.full(seeds, INCONCLUSIVE)
    # same precedence as BatchVerdict.outcome: Regresses, then Wins, then NoGain
    at_reg, at_win, at_nog = regress[rows, idx], wins[rows, idx], nogain[rows, idx]
    outcome[any_settled & at_nog] = ROLLBACK
    outcome[any_settled & at_win & ~at_reg] = PROMOTE
    outcome[any_settled & at_reg] = ROLLBACK
    return outcome, idx + 1


def run_kayenta(streams, th: Thresholds, n: int = FIXED_HORIZON):
    lat_c, lat_k, tp_c, tp_k = (s[:, :n] for s in streams)

    def judge(c, k):
        p = stats.mannwhitneyu(k, c, alternative="two-sided", axis=1).pvalue
        hl = np.median(k[:, :, None] - c[:, None, :], axis=(1, 2))  # Hodges-Lehmann shift
        rel = hl / np.median(c, axis=1)
        return p, rel

    p_l, rel_l = judge(lat_c, lat_k)
    p_t, rel_t = judge(tp_c, tp_k)
    lat_better = (p_l < KAYENTA_ALPHA) & (rel_l <= -th.min_latency_improvement)
    tp_worse = (p_t < KAYENTA_ALPHA) & (rel_t < -th.max_throughput_regression)
    outcome = np.where(lat_better & ~tp_worse, PROMOTE, ROLLBACK)
    return outcome, np.full(outcome.shape, n)


def run_flagger(streams, th: Thresholds, baseline_lat=1.0, baseline_tp=1.0):
    """`baseline_*`: scalars or per-seed arrays of the values the thresholds were pinned from."""
    _, lat_k, _, tp_k = streams
    baseline_lat = np.reshape(baseline_lat, (-1, 1)) if np.ndim(baseline_lat) else baseline_lat
    baseline_tp = np.reshape(baseline_tp, (-1, 1)) if np.ndim(baseline_tp) else baseline_tp
    lat_k, tp_k = lat_k[:, :FLAGGER_ITERATIONS], tp_k[:, :FLAGGER_ITERATIONS]
    fail = (lat_k > (1 - th.min_latency_improvement) * baseline_lat) | (
        tp_k < (1 - th.max_throughput_regression) * baseline_tp
    )
    failed = np.cumsum(fail, axis=1)  # failedChecks only grows
    hit = failed >= FLAGGER_THRESHOLD
    rolled = hit.any(axis=1)
    outcome = np.where(rolled, ROLLBACK, PROMOTE)
    samples = np.where(rolled, hit.argmax(axis=1) + 1, FLAGGER_ITERATIONS)
    return outcome, samples


# --- consistency with the operator's own code path -----------------------------------------

def check_against_operator_code(th: Thresholds, rng: np.random.Generator) -> None:
    """The vectorised 'ours' must agree with SequentialComparison + BatchVerdict.outcome."""
    sc = Scenario("grid", "check", 1, 0.9, 0.99, "cv5%", sigma=0.05)
    streams = make_streams(sc, 4, 80, rng)
    outcome, samples = run_ours(streams, th)
    for s in range(4):
        n = int(samples[s])
        lat, tp = SequentialComparison.for_latency(th), SequentialComparison.for_throughput(th)
        lat.add_control(streams[0][s, :n]); lat.add_canary(streams[1][s, :n])
        tp.add_control(streams[2][s, :n]); tp.add_canary(streams[3][s, :n])
        o = BatchVerdict(1, lat.result(), tp.result()).outcome(th)
        expect = {BatchOutcome.WINS: PROMOTE, BatchOutcome.REGRESSES: ROLLBACK, BatchOutcome.NO_GAIN: ROLLBACK,
                  BatchOutcome.PENDING: INCONCLUSIVE}[o]
        if expect != outcome[s]:
            raise AssertionError(f"vectorised benchmark disagrees with the operator code at seed {s}: {o}")


# --- driver ---------------------------------------------------------------------------------

def run(seeds: int, horizon: int, th: Thresholds, seed: int = 0, scenarios: list[Scenario] | None = None):
    rng = np.random.default_rng(seed)
    check_against_operator_code(th, rng)
    scenarios = scenarios if scenarios is not None else grid_scenarios() + sim_scenarios()
    rows = []
    for sc in scenarios:
        streams = make_streams(sc, seeds, max(horizon, FIXED_HORIZON), rng)
        res = {
            "ours": run_ours(tuple(s[:, :horizon] for s in streams), th),
            "kayenta": run_kayenta(streams, th),
            # control streams are normalised to mean ~1: the oracle pins exactly 1
            "flagger": run_flagger(streams, th, np.exp(rng.normal(0, FLAGGER_BASELINE_SIGMA, seeds)),
                                   np.exp(rng.normal(0, FLAGGER_BASELINE_SIGMA, seeds))),
            "flagger_oracle": run_flagger(streams, th),
        }
        rows.append((sc, res))
    return rows


def summarise(rows, th: Thresholds) -> dict:
    out = {}
    for m in METHODS:
        promos_wrong, n_wrong_den = 0, 0
        missed, let_through, n_reg = 0, 0, 0
        promos_right, n_right_den = 0, 0
        inconclusive, total = 0, 0
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
        all_samples = np.concatenate(samples)
        out[m] = {
            "wrong_promotion_rate": promos_wrong / max(n_wrong_den, 1),
            "missed_regression_rate": missed / max(n_reg, 1),  # not rolled back (Inconclusive counts)
            "promoted_regression_rate": let_through / max(n_reg, 1),  # rolled out to the fleet
            "median_samples_to_decision": float(np.median(all_samples)),
            "mean_samples_to_decision": float(np.mean(all_samples)),
            "samples_ratio_vs_fixed_horizon": float(np.median(all_samples)) / FIXED_HORIZON,
            "correct_promotion_rate": promos_right / max(n_right_den, 1),
            "inconclusive_rate": inconclusive / max(total, 1),
            "runs": total,
        }
    return out


def regime_eval(rows, th: Thresholds) -> dict:
    """Fleet level, simulator scenarios only: per configuration and seed, lookahead is enabled for
    the run of promoted batch sizes from the smallest, off from the first rollback (the rule of
    `decision.decide`); an Inconclusive inside that run enables nothing. Compared with the truth
    (the batch sizes that deserve promotion, a prefix on the roofline)."""
    groups: dict = {}
    for sc, res in rows:
        if sc.source == "sim":
            groups.setdefault((sc.label.rsplit(" b", 1)[0], sc.noise), []).append((sc, res))
    out = {}
    for m in METHODS:
        wrong = exact = total = inconclusive = 0
        for items in groups.values():
            items.sort(key=lambda x: x[0].batch_size)
            truth = np.array([sc.deserves_promotion(th) for sc, _ in items])
            true_prefix = int(np.argmin(truth)) if not truth.all() else len(truth)
            outcomes = np.stack([res[m][0] for _, res in items], axis=1)  # (seeds, batches)
            not_promo = outcomes != PROMOTE
            first = np.where(not_promo.any(axis=1), not_promo.argmax(axis=1), outcomes.shape[1])
            stopped_by = np.where(first < outcomes.shape[1],
                                  outcomes[np.arange(len(first)), np.minimum(first, outcomes.shape[1] - 1)], ROLLBACK)
            inconc = (first < outcomes.shape[1]) & (stopped_by == INCONCLUSIVE)
            enabled_upto = np.where(inconc, 0, first)  # number of batch sizes enabled
            # wrong: some enabled batch size does not deserve it
            wrong += int(sum(((~truth[:k]).any()) for k in enabled_upto))
            exact += int((enabled_upto == true_prefix).sum())
            inconclusive += int(inconc.sum())
            total += len(first)
        out[m] = {"wrong_enablement_rate": wrong / max(total, 1), "exact_regime_rate": exact / max(total, 1),
                  "inconclusive_rate": inconclusive / max(total, 1), "runs": total}
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


def render(summary: dict, by_noise: dict, by_source: dict, regime: dict, meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=170)
    t = Table(title=f"Decision benchmark ({meta['runs_per_method']} runs per method, {meta['seeds']} seeds per scenario)")
    for col in ("method", "wrong promotions", "missed 5% regressions", "5% regressions promoted",
                "correct promotions", "inconclusive",
                "median samples/arm", "mean samples/arm", "vs fixed horizon"):
        t.add_column(col, justify="right" if col != "method" else "left")
    for m in METHODS:
        s = summary[m]
        t.add_row(m, f"{s['wrong_promotion_rate']:.2%}", f"{s['missed_regression_rate']:.2%}",
                  f"{s['promoted_regression_rate']:.2%}",
                  f"{s['correct_promotion_rate']:.1%}", f"{s['inconclusive_rate']:.1%}",
                  f"{s['median_samples_to_decision']:.0f}", f"{s['mean_samples_to_decision']:.1f}",
                  f"{s['samples_ratio_vs_fixed_horizon']:.2f}")
    con.print(t)
    for title, groups in (("by noise", by_noise), ("by source", by_source)):
        bt = Table(title=f"Breakdown {title}")
        bt.add_column("group")
        for m in METHODS:
            bt.add_column(f"{m}: wrong / missed / median n", justify="right")
        for g, s in groups.items():
            bt.add_row(str(g), *(f"{s[m]['wrong_promotion_rate']:.2%} / {s[m]['missed_regression_rate']:.1%} / "
                                 f"{s[m]['median_samples_to_decision']:.0f}" for m in METHODS))
        con.print(bt)
    rt = Table(title="Fleet level (simulator configurations, batch sizes 1-64): the enabled regime")
    for col in ("method", "wrong enablement", "exact regime", "inconclusive"):
        rt.add_column(col, justify="right" if col != "method" else "left")
    for m in METHODS:
        r = regime[m]
        rt.add_row(m, f"{r['wrong_enablement_rate']:.2%}", f"{r['exact_regime_rate']:.1%}", f"{r['inconclusive_rate']:.1%}")
    con.print(rt)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=None, help="seeds per scenario (default 200, --quick 40)")
    ap.add_argument("--quick", action="store_true", help="fewer seeds, for a smoke run")
    ap.add_argument("--horizon", type=int, default=300,
                    help="ours: most samples per arm before the deadline makes it Inconclusive (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-latency-improvement", type=float, default=0.05)
    ap.add_argument("--max-throughput-regression", type=float, default=0.02)
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--min-samples", type=int, default=10)
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (40 if args.quick else 200)
    th = Thresholds(args.min_latency_improvement, args.max_throughput_regression, args.confidence, args.min_samples)
    t0 = time.time()
    rows = run(seeds, args.horizon, th, seed=args.seed)
    summary = summarise(rows, th)
    by_noise = breakdown(rows, th, lambda sc: sc.noise)
    by_source = breakdown(rows, th, lambda sc: sc.source)
    regime = regime_eval(rows, th)
    meta = {"seeds": seeds, "scenarios": len(rows), "runs_per_method": summary["ours"]["runs"],
            "horizon": args.horizon, "fixed_horizon": FIXED_HORIZON, "seconds": round(time.time() - t0, 1),
            "machine": machine(),
            "thresholds": {"min_latency_improvement": th.min_latency_improvement,
                           "max_throughput_regression": th.max_throughput_regression,
                           "confidence": th.confidence, "min_samples": th.min_samples}}
    render(summary, by_noise, by_source, regime, meta)
    goal = {
        "wrong_promotions_le_1pct": summary["ours"]["wrong_promotion_rate"] <= 0.01,
        "missed_5pct_regressions_le_5pct": summary["ours"]["missed_regression_rate"] <= 0.05,
        "samples_le_third_of_fixed_horizon": summary["ours"]["samples_ratio_vs_fixed_horizon"] <= 1 / 3,
        "error_le_kayenta": (summary["ours"]["wrong_promotion_rate"] <= summary["kayenta"]["wrong_promotion_rate"]
                             and summary["ours"]["missed_regression_rate"] <= summary["kayenta"]["missed_regression_rate"]),
    }
    print(f"{meta['scenarios']} scenarios x {seeds} seeds in {meta['seconds']} s on {meta['machine']}")
    print(json.dumps({**{m: {k: round(v, 4) if isinstance(v, float) else v for k, v in summary[m].items()}
                         for m in METHODS},
                      "goal": goal, "by_noise": {g: {m: {"wrong_promotion_rate": round(s[m]["wrong_promotion_rate"], 4),
                                                         "missed_regression_rate": round(s[m]["missed_regression_rate"], 4),
                                                         "median_samples_to_decision": s[m]["median_samples_to_decision"]}
                                                     for m in METHODS} for g, s in by_noise.items()},
                      "by_source": {g: {m: {"wrong_promotion_rate": round(s[m]["wrong_promotion_rate"], 4),
                                            "missed_regression_rate": round(s[m]["missed_regression_rate"], 4),
                                            "median_samples_to_decision": s[m]["median_samples_to_decision"]}
                                        for m in METHODS} for g, s in by_source.items()},
                      "fleet_regime": {m: {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                                       for m, r in regime.items()},
                      "meta": meta}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
