"""Canary vs control at one batch size (``BatchComparison``): its outcome against the thresholds,
and the ``status.batches`` row it is stored as (and rebuilt from, so a restarted operator decides
from what is in the cluster). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from lookahead_operator.measurement.stats import ComparisonResult, Direction, TailComparison, Thresholds, Verdict


class BatchOutcome(str, Enum):
    WINS = "Wins"
    REGRESSES = "Regresses"  # throughput fell, or tail latency rose, by more than its tolerance
    NO_GAIN = "NoGain"  # latency did not fall by the minimum improvement (throughput fine or unknown)
    PENDING = "Pending"
    UNMEASURED = "Unmeasured"  # planned, but no verdict at all (decision.decide only; never in a status row)


@dataclass(frozen=True)
class BatchComparison:
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
    def from_status(cls, row: Mapping[str, Any], thresholds: Thresholds) -> "BatchComparison":
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
