"""Per-batch-size verdicts -> one Decision, with the reason in words.

Pure: no Kubernetes, no Prometheus. The operator feeds `BatchVerdict`s built from
`lookahead_operator.measurement.statistics` and writes the returned `Decision` into the policy's status.

Rules, in order:
1. The preflight says the workload is not a candidate            -> NotACandidate.
2. Sort the planned batch sizes (``planned``; default: the measured ones). A measured batch size
   *wins* when per-token latency fell by more than minLatencyImprovement and throughput is, with
   confidence, not worse than maxThroughputRegression. It *loses* when throughput fell by more than
   maxThroughputRegression, or its tail per-token latency (p95/p99, when measured) rose by more
   than maxTailLatencyRegression (Regresses), or when per-token latency, with confidence, did not
   fall by minLatencyImprovement (NoGain). Anything else is Pending: not enough data yet. A planned
   batch size without a verdict is Unmeasured: never a win.
3. If the smallest planned batch size loses, no regime can be enabled   -> Rollback, at once.
   If it is Pending or Unmeasured: Wait, or Inconclusive once the deadline has passed.
4. Lookahead is enabled for the run of wins from the smallest batch size, and never beyond the
   largest batch size *measured* as a win (W):
   - every planned size wins and W reaches the top of the range (the engine's max batch size,
     `max_batch_size`)                                              -> Promote (on everywhere);
   - every planned size wins but W is below the top                  -> PromoteRegimeAware, on for
     1..W, off above (no crossover was measured: `crossover_batch_size` is None and the reason says
     the crossover lies above W, unmeasured);
   - the run ends at a measured loss at c                            -> PromoteRegimeAware, on for
     1..W, off from W+1; `crossover_batch_size` = c (planned sizes between W and c were not
     measured and stay off);
   - the run ends at a Pending/Unmeasured size u: before the deadline Wait (u may still extend
     the run); after it PromoteRegimeAware on for 1..W with `crossover_batch_size` None (the
     crossover lies somewhere above W; the reason names u).
   `Decision.lookahead_max_batch_size` is W for a regime-aware promotion (read from `regime`).
Missing data never promotes a batch size; a certified win below it is not thrown away for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping

from lookahead_operator.measurement.statistics import ComparisonResult, Direction, TailComparison, Thresholds, Verdict

if TYPE_CHECKING:  # pragma: no cover
    from lookahead_operator.measurement.preflight import Preflight

__all__ = ["Action", "BatchOutcome", "BatchVerdict", "Decision", "decide", "DEFAULT_MAX_BATCH_SIZE"]

# Upper end of the "off" range when the engine's max_num_seqs is not known.
DEFAULT_MAX_BATCH_SIZE = 1024


class Action(str, Enum):
    PROMOTE = "Promote"
    PROMOTE_REGIME_AWARE = "PromoteRegimeAware"
    ROLLBACK = "Rollback"
    NOT_A_CANDIDATE = "NotACandidate"
    INCONCLUSIVE = "Inconclusive"
    WAIT = "Wait"


class BatchOutcome(str, Enum):
    WINS = "Wins"
    REGRESSES = "Regresses"  # throughput fell, or tail latency rose, by more than its tolerance
    NO_GAIN = "NoGain"  # latency did not fall by the minimum improvement (throughput fine or unknown)
    PENDING = "Pending"
    UNMEASURED = "Unmeasured"  # planned, but no verdict at all (decide() only; never in a status row)


@dataclass(frozen=True)
class BatchVerdict:
    """Canary vs control at one batch size (one load step)."""

    batch_size: int
    latency: ComparisonResult  # per-token latency, LOWER_IS_BETTER
    throughput: ComparisonResult  # output tokens/s, HIGHER_IS_BETTER
    acceptance_rate: float | None = None  # canary's accepted / drafted tokens, informational
    tail: TailComparison | None = None  # p95/p99 per-token latency from histogram buckets (a veto)

    def tail_regresses(self) -> bool:
        return self.tail is not None and self.tail.regresses

    def outcome(self, thresholds: Thresholds) -> BatchOutcome:
        lat, tp = self.latency, self.throughput
        if tp.worse_by_more_than(thresholds.max_throughput_regression):
            return BatchOutcome.REGRESSES
        if self.tail_regresses() and min(lat.n_control, lat.n_canary) >= thresholds.min_samples:
            # a canary faster on average but with a tail beyond maxTailLatencyRegression is not
            # promoted; it is reported as Regresses with the tail named in the reason. Like every
            # verdict, not before the step has minSamplesPerStep samples per arm.
            return BatchOutcome.REGRESSES
        if lat.better_by_at_least(thresholds.min_latency_improvement) and tp.not_worse_by_more_than(
            thresholds.max_throughput_regression
        ):
            return BatchOutcome.WINS
        if lat.not_better_by(thresholds.min_latency_improvement):
            return BatchOutcome.NO_GAIN
        return BatchOutcome.PENDING

    def settled(self, thresholds: Thresholds) -> bool:
        """The step can stop sampling: its outcome is known. (The tail is a veto judged on what the
        step collected; a tail without enough observations does not hold a step open.)"""
        return self.outcome(thresholds) is not BatchOutcome.PENDING

    def to_status(self, thresholds: Thresholds) -> dict[str, Any]:
        """One row of the policy's `status.batches` (assumes latency samples in seconds).

        Numbers are stored at full precision: the decision is rebuilt from these rows after a
        restart (`from_status`, or ``measure.verdict_from_row``) and must come out the same as the
        live one. Round only for display. Keys beyond the original row appear only when they carry
        something: ``paired``/``stallIntervals``/``droppedIntervals`` for paired comparisons, the
        ``tail*`` keys when a tail comparison was made."""
        lat, tp = self.latency, self.throughput

        def ms(x: float | None) -> float | None:
            return None if x is None else x * 1e3

        row: dict[str, Any] = {
            "batchSize": self.batch_size,
            "controlTpotMs": ms(lat.control_mean),
            "canaryTpotMs": ms(lat.canary_mean),
            "tpotChange": lat.estimate,
            "tpotInterval": list(lat.interval) if lat.interval else None,
            "controlTokensPerSecond": tp.control_mean,
            "canaryTokensPerSecond": tp.canary_mean,
            "throughputChange": tp.estimate,
            "throughputInterval": list(tp.interval) if tp.interval else None,
            "samples": {"control": min(lat.n_control, tp.n_control), "canary": min(lat.n_canary, tp.n_canary)},
            "confidence": lat.confidence,
            "acceptanceRate": self.acceptance_rate,
            "latencyVerdict": lat.verdict.value,
            "throughputVerdict": tp.verdict.value,
            "verdict": self.outcome(thresholds).value,
        }
        if lat.paired or tp.paired:
            row["paired"] = True
            # throughput windows with no output in one arm only (counted against that arm)
            row["stallIntervals"] = {"control": tp.stalls_control, "canary": tp.stalls_canary}
            row["droppedIntervals"] = {"latency": lat.dropped, "throughput": tp.dropped}
            row["latencySamples"] = lat.n_control
            row["throughputSamples"] = tp.n_control
        elif tp.stalls_control or tp.stalls_canary:
            row["stallIntervals"] = {"control": tp.stalls_control, "canary": tp.stalls_canary}
        if self.tail is not None:
            t = self.tail
            row["tailVerdict"] = t.verdict.value
            row["tailThreshold"] = t.threshold
            for q, key in ((0.95, "P95"), (0.99, "P99")):
                x = t.q(q)
                if x is not None:
                    row[f"control{key}Ms"] = ms(x.control)
                    row[f"canary{key}Ms"] = ms(x.canary)
            row["tail"] = t.to_dict()
        return row

    @classmethod
    def from_status(cls, row: Mapping[str, Any], thresholds: Thresholds) -> "BatchVerdict":
        """Rebuild a verdict from a `to_status` row (camelCase keys, as stored): the same outcome, and
        ``from_status(row).to_status(th) == row``. Verdict strings are taken as stored."""
        samples = row.get("samples") or {}
        n_c, n_k = int(samples.get("control") or 0), int(samples.get("canary") or 0)
        conf = float(row.get("confidence") or thresholds.confidence)
        paired = bool(row.get("paired"))
        stalls = row.get("stallIntervals") or {}
        dropped = row.get("droppedIntervals") or {}

        def seconds(x: float | None) -> float | None:
            return None if x is None else x / 1e3

        def comp(metric: str, direction: Direction, threshold: float, c_mean: Any, k_mean: Any, change: Any,
                 interval: Any, verdict: Any, n: int | None, extra: dict[str, Any]) -> ComparisonResult:
            nc = n if n is not None else n_c
            nk = n if n is not None else n_k
            return ComparisonResult(metric, direction, threshold, conf, nc, nk, c_mean, k_mean, change,
                                    tuple(interval) if interval else None,
                                    Verdict(verdict or Verdict.NOT_ENOUGH_DATA.value), **extra)

        lat_n = row.get("latencySamples") if paired else None
        tp_n = row.get("throughputSamples") if paired else None
        lat = comp("per_token_latency_seconds", Direction.LOWER_IS_BETTER, thresholds.min_latency_improvement,
                   seconds(row.get("controlTpotMs")), seconds(row.get("canaryTpotMs")), row.get("tpotChange"),
                   row.get("tpotInterval"), row.get("latencyVerdict"),
                   None if lat_n is None else int(lat_n),
                   dict(paired=paired, dropped=int(dropped.get("latency") or 0)))
        tp = comp("output_tokens_per_second", Direction.HIGHER_IS_BETTER, thresholds.max_throughput_regression,
                  row.get("controlTokensPerSecond"), row.get("canaryTokensPerSecond"), row.get("throughputChange"),
                  row.get("throughputInterval"), row.get("throughputVerdict"),
                  None if tp_n is None else int(tp_n),
                  dict(paired=paired, dropped=int(dropped.get("throughput") or 0),
                       stalls_control=int(stalls.get("control") or 0), stalls_canary=int(stalls.get("canary") or 0)))
        tail = TailComparison.from_dict(row["tail"]) if row.get("tail") else None
        return cls(int(row["batchSize"]), lat, tp, row.get("acceptanceRate"), tail)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    crossover_batch_size: int | None = None
    # (start, end, enabled), inclusive, covering 1..max_batch_size; empty unless promoting
    regime: list[tuple[int, int, bool]] = field(default_factory=list)
    outcomes: dict[int, BatchOutcome] = field(default_factory=dict)

    @property
    def lookahead_max_batch_size(self) -> int | None:
        """Our engine's `--lookahead-max-batch-size`: the end of the enabled range of a regime-aware
        promotion (the largest batch size measured as a win); None = no cap (full promotion or no
        promotion)."""
        if self.action is Action.PROMOTE_REGIME_AWARE:
            on = [e for (_, e, enabled) in self.regime if enabled]
            return max(on) if on else None
        return None

    def vllm_num_speculative_tokens_per_batch_size(self, k: int) -> list[list[int]]:
        """vLLM's `num_speculative_tokens_per_batch_size` ranges: [[start, end, K], ...], K=0 = off."""
        return [[s, e, k if on else 0] for (s, e, on) in self.regime]

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "reason": self.reason,
            "crossoverBatchSize": self.crossover_batch_size,
            "regime": [{"start": s, "end": e, "enabled": on} for (s, e, on) in self.regime],
            "outcomes": {str(b): o.value for b, o in sorted(self.outcomes.items())},
        }


# --- words -----------------------------------------------------------------------------------

def _pct(x: float) -> str:
    return f"{abs(x) * 100:.0f}%"


def _cs(r: ComparisonResult) -> str:
    if r.paired:
        return f"{r.confidence * 100:g}% CS, {r.n_canary} paired windows"
    return f"{r.confidence * 100:g}% CS, n={r.n_canary}/{r.n_control}"


def _change_words(r: ComparisonResult, noun: str) -> str:
    """'per-token latency fell 31% [27%, 35%]' / 'rose ...' / 'changed -2% [-6%, +2%]'."""
    est, (lo, hi) = r.estimate, r.interval
    if hi < 0:
        return f"{noun} fell {_pct(est)} [{_pct(hi)}, {_pct(lo)}]"
    if lo > 0:
        return f"{noun} rose {_pct(est)} [{_pct(lo)}, {_pct(hi)}]"
    return f"{noun} changed {est * 100:+.0f}% [{lo * 100:+.0f}%, {hi * 100:+.0f}%]"


def _metric_words(bv: BatchVerdict, r: ComparisonResult, noun: str, prefix: str) -> str:
    if r.interval is None or r.estimate is None:
        return f"{prefix} {bv.batch_size} {noun} has too little data ({r.note or 'no samples'})"
    stalls = ""
    if r.stalls_canary:
        stalls = f", {r.stalls_canary} canary window(s) with no output counted"
    return f"{prefix} {bv.batch_size} {_change_words(r, noun)} ({_cs(r)}{stalls})"


def _latency_words(bv: BatchVerdict, prefix: str = "at batch") -> str:
    return _metric_words(bv, bv.latency, "per-token latency", prefix)


def _throughput_words(bv: BatchVerdict, prefix: str = "at batch") -> str:
    return _metric_words(bv, bv.throughput, "throughput", prefix)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3g} ms"


def _tail_words(bv: BatchVerdict, prefix: str = "at batch") -> str:
    t = bv.tail
    x = t.worst() if t is not None else None
    if x is None:
        return f"{prefix} {bv.batch_size} tail latency was not measured"
    name = f"p{x.quantile * 100:g}"
    ch = f" ({x.change * 100:+.0f}%)" if x.change is not None else ""
    return (f"{prefix} {bv.batch_size} {name} per-token latency {_ms(x.control)} -> {_ms(x.canary)}{ch}: the canary's "
            f"is above {_ms(x.canary_bounds[0])}, the control's at most {_ms(x.control_bounds[1])} "
            f"({t.confidence * 100:g}% CS)")


def _loss_words(bv: BatchVerdict, outcome: BatchOutcome, th: Thresholds, prefix: str = "at batch") -> str:
    if outcome is BatchOutcome.REGRESSES:
        if not bv.throughput.worse_by_more_than(th.max_throughput_regression) and bv.tail_regresses():
            return _tail_words(bv, prefix) + f", beyond the {_pct(bv.tail.threshold)} tail tolerance"
        return _throughput_words(bv, prefix) + f", beyond the {_pct(th.max_throughput_regression)} tolerance"
    return _latency_words(bv, prefix) + f", short of the required {_pct(th.min_latency_improvement)} improvement"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _regime(last_on: int | None, max_batch: int) -> list[tuple[int, int, bool]]:
    """Lookahead on for 1..last_on, off above (None: on everywhere)."""
    if last_on is None or last_on >= max_batch:
        return [(1, max_batch, True)]
    return [(1, last_on, True), (last_on + 1, max_batch, False)]


def _sizes(xs: list[int]) -> str:
    return ", ".join(str(x) for x in xs)


def _batches(lo: int, hi: int) -> str:
    return f"batch {lo}" if lo == hi else f"batches {lo}-{hi}"


def decide(
    batches: list[BatchVerdict],
    thresholds: Thresholds,
    deadline_passed: bool,
    preflight: "Preflight | None" = None,
    max_batch_size: int | None = None,
    planned: list[int] | None = None,
) -> Decision:
    """One decision from the per-batch verdicts.

    ``planned``: the batch sizes the sweep set out to measure (default: those in ``batches``); a
    planned size without a verdict is Unmeasured and never counts as a win. ``max_batch_size``: the
    engine's max_num_seqs, the top of the regime ranges (default: DEFAULT_MAX_BATCH_SIZE, or the
    largest planned size if larger); lookahead is on everywhere (Promote) only when the largest
    measured win reaches it."""
    if preflight is not None and not preflight.candidate:
        why = "; ".join(preflight.reasons[:2]) if preflight.reasons else ""
        return Decision(Action.NOT_A_CANDIDATE,
                        f"Preflight: the workload is {preflight.verdict.value}, not a lookahead candidate"
                        + (f": {why}" if why else "."))

    measured = {b.batch_size: b for b in batches}
    if len(measured) != len(batches):
        raise ValueError("one BatchVerdict per batch size")
    if planned is not None and any(int(p) < 1 for p in planned):
        raise ValueError("planned batch sizes must be >= 1")
    sizes = sorted(set(measured) | {int(p) for p in (planned or [])})
    th = thresholds
    outcomes = {s: (measured[s].outcome(th) if s in measured else BatchOutcome.UNMEASURED) for s in sizes}
    if not measured:
        if deadline_passed:
            return Decision(Action.INCONCLUSIVE, "The deadline passed without a single batch size measured.",
                            outcomes=outcomes)
        return Decision(Action.WAIT, "No batch size measured yet.", outcomes=outcomes)
    top = max(max_batch_size or DEFAULT_MAX_BATCH_SIZE, sizes[-1])
    unmeasured = [s for s in sizes if s not in measured]

    def undecided_words(s: int) -> str:
        if s not in measured:
            return f"batch size {s} was planned but not measured"
        b = measured[s]
        return _latency_words(b) + "; " + _throughput_words(b)

    first = sizes[0]
    o1 = outcomes[first]
    if o1 in (BatchOutcome.REGRESSES, BatchOutcome.NO_GAIN):
        bv1 = measured[first]
        worst = next((measured[s] for s in sizes if outcomes[s] is BatchOutcome.REGRESSES), None)
        reason = _cap(_loss_words(bv1, o1, th)) + "."
        if worst is not None and worst is not bv1:
            reason += " " + _cap(_loss_words(worst, BatchOutcome.REGRESSES, th)) + "."
        reason += " Lookahead pays at no measured batch size: rolled back."
        return Decision(Action.ROLLBACK, reason, crossover_batch_size=first, outcomes=outcomes)
    if o1 in (BatchOutcome.PENDING, BatchOutcome.UNMEASURED):
        detail = undecided_words(first)
        if deadline_passed:
            return Decision(Action.INCONCLUSIVE,
                            f"The deadline passed before batch size {first} was settled ({detail}); "
                            "lookahead stays off.", outcomes=outcomes)
        return Decision(Action.WAIT, f"Waiting for data at batch size {first} ({detail}).", outcomes=outcomes)

    # the run of wins from the smallest planned batch size
    wins: list[int] = []
    for s in sizes:
        if outcomes[s] is BatchOutcome.WINS:
            wins.append(s)
        else:
            break
    w = wins[-1]
    lead = _cap(_latency_words(measured[wins[0]]))
    rest = sizes[len(wins):]
    if not rest:
        tps = [measured[s].throughput for s in wins if measured[s].throughput.improvement_interval is not None]
        worst_tp = min(tps, key=lambda r: r.improvement_interval[0]) if tps else None
        tail = ""
        if worst_tp is not None:
            lo = worst_tp.improvement_interval[0]
            tail = (f"; throughput at every batch size stayed within the {_pct(th.max_throughput_regression)} "
                    f"tolerance (worst lower bound {lo * 100:+.0f}%)")
        if w >= top:
            return Decision(Action.PROMOTE,
                            lead + f"; lookahead wins at every measured batch size ({_sizes(wins)})" + tail + ".",
                            crossover_batch_size=None, regime=_regime(None, top), outcomes=outcomes)
        return Decision(
            Action.PROMOTE_REGIME_AWARE,
            lead + f"; lookahead wins at every measured batch size ({_sizes(wins)})" + tail
            + f". No crossover was measured: it lies above batch {w}, the largest batch size measured, so "
              f"lookahead is enabled for {_batches(1, w)} only and stays off above (up to {top}) until measured.",
            crossover_batch_size=None, regime=_regime(w, top), outcomes=outcomes)

    nxt = rest[0]
    o = outcomes[nxt]
    if o in (BatchOutcome.REGRESSES, BatchOutcome.NO_GAIN):
        many = nxt - 1 > w + 1
        gap = (f" ({_batches(w + 1, nxt - 1)} {'were' if many else 'was'} not measured and "
               f"stay{'' if many else 's'} off)") if nxt - 1 > w else ""
        reason = (lead + "; " + _loss_words(measured[nxt], o, th, prefix="from batch")
                  + f": lookahead enabled for {_batches(1, w)} only{gap}.")
        return Decision(Action.PROMOTE_REGIME_AWARE, reason, crossover_batch_size=nxt,
                        regime=_regime(w, top), outcomes=outcomes)

    # the run of wins ends at a batch size not settled yet (Pending) or not measured at all
    open_sizes = [s for s in rest if outcomes[s] in (BatchOutcome.PENDING, BatchOutcome.UNMEASURED)]
    if not deadline_passed:
        waits = ", ".join(map(str, open_sizes))
        return Decision(Action.WAIT, f"Waiting for data at batch sizes {waits} ({undecided_words(nxt)}).",
                        outcomes=outcomes)
    loss = next((s for s in rest if outcomes[s] in (BatchOutcome.REGRESSES, BatchOutcome.NO_GAIN)), None)
    bracket = f"between {w + 1} and {loss}" if loss is not None else f"above {w}"
    won = f"batch size {wins[0]}" if len(wins) == 1 else f"batch sizes {_sizes(wins)}"
    reason = (lead + f"; lookahead wins at {won}, but the deadline passed before batch size "
              f"{nxt} was settled ({undecided_words(nxt)}). The crossover lies {bracket}, unmeasured: lookahead "
              f"is enabled for {_batches(1, w)} only, up to the largest batch size measured as a win.")
    if unmeasured:
        reason += f" Not measured: {_sizes(unmeasured)}."
    return Decision(Action.PROMOTE_REGIME_AWARE, reason, crossover_batch_size=None,
                    regime=_regime(w, top), outcomes=outcomes)
