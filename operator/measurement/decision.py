"""Per-batch-size comparisons -> one ``Ruling``: the rules, returning what they found (``Findings``);
``wording`` turns the findings into the reason in words.

Pure: no Kubernetes, no Prometheus. The operator feeds `BatchComparison`s (``verdict``) built with
`lookahead_operator.measurement.stats` and writes the returned `Ruling` into the policy's status
(``api.status.Decision``, with the evidence).

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
   `Ruling.lookahead_max_batch_size` is W for a regime-aware promotion (read from `regime`).
Missing data never promotes a batch size; a certified win below it is not thrown away for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lookahead_operator.measurement.rules import DEFAULT_MAX_BATCH_SIZE, Move, find
from lookahead_operator.measurement.stats import Thresholds
from lookahead_operator.measurement.verdict import BatchComparison, BatchOutcome
from lookahead_operator.measurement.wording import reason

if TYPE_CHECKING:  # pragma: no cover
    from lookahead_operator.measurement.preflight import Preflight

__all__ = ["Move", "BatchOutcome", "BatchComparison", "Ruling", "decide", "DEFAULT_MAX_BATCH_SIZE"]


@dataclass(frozen=True)
class Ruling:
    """What the rules decided, with the reason in words (the status's ``Decision`` adds when, an id,
    the promoted config and the evidence)."""

    action: Move
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
        if self.action is Move.PROMOTE_REGIME_AWARE:
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


def decide(
    batches: list[BatchComparison],
    thresholds: Thresholds,
    deadline_passed: bool,
    preflight: "Preflight | None" = None,
    max_batch_size: int | None = None,
    planned: list[int] | None = None,
) -> Ruling:
    """One ruling from the per-batch comparisons: the rules (``find``), then the words
    (``wording.reason``).

    ``planned``: the batch sizes the sweep set out to measure (default: those in ``batches``); a
    planned size without a verdict is Unmeasured and never counts as a win. ``max_batch_size``: the
    engine's max_num_seqs, the top of the regime ranges (default: DEFAULT_MAX_BATCH_SIZE, or the
    largest planned size if larger); lookahead is on everywhere (Promote) only when the largest
    measured win reaches it."""
    f = find(batches, thresholds, deadline_passed, preflight, max_batch_size, planned)
    return Ruling(f.move, reason(f, thresholds), crossover_batch_size=f.crossover_batch_size, regime=f.regime,
                  outcomes=f.outcomes)
