"""Per-batch-size verdicts -> one Decision, with the reason in words.

Pure: no Kubernetes, no Prometheus. The operator feeds `BatchVerdict`s built from
`lookahead_operator.statistics` and writes the returned `Decision` into the policy's status.

Rules, in order:
1. The preflight says the workload is not a candidate            -> NotACandidate.
2. Sort by batch size. A batch size *wins* when per-token latency fell by more than
   minLatencyImprovement and throughput is, with confidence, not worse than
   maxThroughputRegression. It *loses* when throughput fell by more than maxThroughputRegression
   (Regresses) or when per-token latency, with confidence, did not fall by minLatencyImprovement
   (NoGain). Anything else is Pending: not enough data yet.
3. If the smallest batch size loses, no regime can be enabled (a regime is [1, c-1])  -> Rollback,
   at once, whatever the larger batch sizes still say.
4. A run of wins from the smallest batch size followed by a loss at batch size c
   -> PromoteRegimeAware with crossover c (lookahead for 1..c-1, off from c on). Batch sizes above c
   may still be Pending: they get lookahead off either way.
5. Wins at every batch size                                    -> Promote.
6. Otherwise something in the enabled range is Pending: Wait, or Inconclusive once the deadline
   has passed. Missing data never promotes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from .statistics import ComparisonResult, Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from .preflight import Preflight

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
    REGRESSES = "Regresses"  # throughput fell by more than the tolerance
    NO_GAIN = "NoGain"  # latency did not fall by the minimum improvement (throughput fine or unknown)
    PENDING = "Pending"


@dataclass(frozen=True)
class BatchVerdict:
    """Canary vs control at one batch size (one load step)."""

    batch_size: int
    latency: ComparisonResult  # per-token latency, LOWER_IS_BETTER
    throughput: ComparisonResult  # output tokens/s, HIGHER_IS_BETTER
    acceptance_rate: float | None = None  # canary's accepted / drafted tokens, informational

    def outcome(self, thresholds: Thresholds) -> BatchOutcome:
        lat, tp = self.latency, self.throughput
        if tp.worse_by_more_than(thresholds.max_throughput_regression):
            return BatchOutcome.REGRESSES
        if lat.better_by_at_least(thresholds.min_latency_improvement) and tp.not_worse_by_more_than(
            thresholds.max_throughput_regression
        ):
            return BatchOutcome.WINS
        if lat.not_better_by(thresholds.min_latency_improvement):
            return BatchOutcome.NO_GAIN
        return BatchOutcome.PENDING

    def settled(self, thresholds: Thresholds) -> bool:
        """The step can stop sampling: its outcome is known."""
        return self.outcome(thresholds) is not BatchOutcome.PENDING

    def to_status(self, thresholds: Thresholds) -> dict[str, Any]:
        """One row of the policy's `status.batches` (assumes latency samples in seconds).

        Numbers are stored at full precision: the decision is rebuilt from these rows after a
        restart (``measure.verdict_from_row``) and must come out the same as the live one. Round
        only for display."""
        lat, tp = self.latency, self.throughput

        def ms(x: float | None) -> float | None:
            return None if x is None else x * 1e3

        return {
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
        """Our engine's `--lookahead-max-batch-size`: None = no cap (full promotion or no promotion)."""
        if self.action is Action.PROMOTE_REGIME_AWARE and self.crossover_batch_size is not None:
            return self.crossover_batch_size - 1
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
    return f"{prefix} {bv.batch_size} {_change_words(r, noun)} ({_cs(r)})"


def _latency_words(bv: BatchVerdict, prefix: str = "at batch") -> str:
    return _metric_words(bv, bv.latency, "per-token latency", prefix)


def _throughput_words(bv: BatchVerdict, prefix: str = "at batch") -> str:
    return _metric_words(bv, bv.throughput, "throughput", prefix)


def _loss_words(bv: BatchVerdict, outcome: BatchOutcome, th: Thresholds, prefix: str = "at batch") -> str:
    if outcome is BatchOutcome.REGRESSES:
        return _throughput_words(bv, prefix) + f", beyond the {_pct(th.max_throughput_regression)} tolerance"
    return _latency_words(bv, prefix) + f", short of the required {_pct(th.min_latency_improvement)} improvement"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _regime(crossover: int | None, max_batch: int) -> list[tuple[int, int, bool]]:
    if crossover is None:
        return [(1, max_batch, True)]
    return [(1, crossover - 1, True), (crossover, max_batch, False)]


def decide(
    batches: list[BatchVerdict],
    thresholds: Thresholds,
    deadline_passed: bool,
    preflight: "Preflight | None" = None,
    max_batch_size: int | None = None,
) -> Decision:
    """One decision from the per-batch verdicts. `max_batch_size`: the engine's max_num_seqs, the
    upper end of the regime ranges (default: DEFAULT_MAX_BATCH_SIZE or the largest batch measured)."""
    if preflight is not None and not preflight.candidate:
        why = "; ".join(preflight.reasons[:2]) if preflight.reasons else ""
        return Decision(Action.NOT_A_CANDIDATE,
                        f"Preflight: the workload is {preflight.verdict.value}, not a lookahead candidate"
                        + (f": {why}" if why else "."))

    if not batches:
        if deadline_passed:
            return Decision(Action.INCONCLUSIVE, "The deadline passed without a single batch size measured.")
        return Decision(Action.WAIT, "No batch size measured yet.")

    bs = sorted(batches, key=lambda b: b.batch_size)
    if len({b.batch_size for b in bs}) != len(bs):
        raise ValueError("one BatchVerdict per batch size")
    th = thresholds
    outcomes = {b.batch_size: b.outcome(th) for b in bs}
    top = max(max_batch_size or DEFAULT_MAX_BATCH_SIZE, bs[-1].batch_size)

    first = bs[0]
    o1 = outcomes[first.batch_size]
    if o1 in (BatchOutcome.REGRESSES, BatchOutcome.NO_GAIN):
        worst = next((b for b in bs if outcomes[b.batch_size] is BatchOutcome.REGRESSES), None)
        reason = _cap(_loss_words(first, o1, th)) + "."
        if worst is not None and worst is not first:
            reason += " " + _cap(_throughput_words(worst)) + "."
        reason += " Lookahead pays at no measured batch size: rolled back."
        return Decision(Action.ROLLBACK, reason, crossover_batch_size=first.batch_size, outcomes=outcomes)

    # the run of wins from the smallest batch size
    wins: list[BatchVerdict] = []
    for b in bs:
        if outcomes[b.batch_size] is BatchOutcome.WINS:
            wins.append(b)
        else:
            break
    rest = bs[len(wins):]
    if not rest:
        lat = _latency_words(bs[0])
        tps = [b.throughput for b in bs if b.throughput.improvement_interval is not None]
        worst_tp = min(tps, key=lambda r: r.improvement_interval[0]) if tps else None
        tail = ""
        if worst_tp is not None:
            lo = worst_tp.improvement_interval[0]
            tail = f"; throughput at every batch size stayed within the {_pct(th.max_throughput_regression)} tolerance (worst lower bound {lo * 100:+.0f}%)"
        sizes = ", ".join(str(b.batch_size) for b in bs)
        return Decision(
            Action.PROMOTE,
            _cap(lat) + f"; lookahead wins at every measured batch size ({sizes})" + tail + ".",
            crossover_batch_size=None,
            regime=_regime(None, top),
            outcomes=outcomes,
        )

    nxt = rest[0]
    o = outcomes[nxt.batch_size]
    if wins and o in (BatchOutcome.REGRESSES, BatchOutcome.NO_GAIN):
        c = nxt.batch_size
        last_win = wins[-1].batch_size
        gap = f" (batches {last_win + 1}-{c - 1} were not measured)" if c - 1 > last_win else ""
        reason = (
            _cap(_latency_words(wins[0])) + "; " + _loss_words(nxt, o, th, prefix="from batch")
            + f": lookahead enabled for batches 1-{c - 1} only{gap}."
        )
        return Decision(Action.PROMOTE_REGIME_AWARE, reason, crossover_batch_size=c,
                        regime=_regime(c, top), outcomes=outcomes)

    # something in the would-be enabled range is still pending
    pending = [b.batch_size for b in rest if outcomes[b.batch_size] is BatchOutcome.PENDING]
    detail = _latency_words(nxt) + "; " + _throughput_words(nxt)
    if deadline_passed:
        return Decision(
            Action.INCONCLUSIVE,
            f"The deadline passed before batch size {nxt.batch_size} was settled ({detail}); "
            "lookahead stays off.",
            outcomes=outcomes,
        )
    return Decision(
        Action.WAIT,
        f"Waiting for data at batch sizes {', '.join(map(str, pending))} ({detail}).",
        outcomes=outcomes,
    )
