"""The decision's rules (module ``decision`` states them), as facts: ``find`` says which rule fires
and what it found (``Findings``); no words (``wording``) and no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from lookahead_operator.measurement.stats import Thresholds
from lookahead_operator.measurement.verdict import BatchComparison, BatchOutcome

if TYPE_CHECKING:  # pragma: no cover
    from lookahead_operator.measurement.preflight import Preflight

# Upper end of the "off" range when the engine's max_num_seqs is not known.
DEFAULT_MAX_BATCH_SIZE = 1024

LOSSES = (BatchOutcome.REGRESSES, BatchOutcome.NO_GAIN)
OPEN = (BatchOutcome.PENDING, BatchOutcome.UNMEASURED)


class Move(str, Enum):
    """What the decision rules for (the values of ``api.status.DecisionAction``)."""

    PROMOTE = "Promote"
    PROMOTE_REGIME_AWARE = "PromoteRegimeAware"
    ROLLBACK = "Rollback"
    NOT_A_CANDIDATE = "NotACandidate"
    INCONCLUSIVE = "Inconclusive"
    WAIT = "Wait"


class Case(str, Enum):
    """Which rule of the module docstring fired."""

    NOT_A_CANDIDATE = "NotACandidate"        # rule 1
    NOTHING_MEASURED = "NothingMeasured"
    FIRST_LOSES = "FirstLoses"               # rule 3: the smallest planned size loses
    FIRST_OPEN = "FirstOpen"                 # rule 3: ... is Pending or Unmeasured
    ALL_WIN = "AllWin"                       # rule 4: every planned size wins
    RUN_ENDS_AT_LOSS = "RunEndsAtLoss"       # rule 4: the run of wins ends at a measured loss
    RUN_ENDS_OPEN = "RunEndsOpen"            # rule 4: ... at a Pending / Unmeasured size


@dataclass(frozen=True)
class Findings:
    """What the rules found, before any words: the rule that fired, the move, and the facts the
    reason names."""

    case: Case
    move: Move
    deadline_passed: bool = False
    sizes: list[int] = field(default_factory=list)               # planned and measured, sorted
    measured: dict[int, BatchComparison] = field(default_factory=dict)
    outcomes: dict[int, BatchOutcome] = field(default_factory=dict)
    wins: list[int] = field(default_factory=list)                # the run of wins from the smallest size
    top: int = DEFAULT_MAX_BATCH_SIZE                            # the top of the regime ranges
    crossover_batch_size: int | None = None
    preflight: "Preflight | None" = None

    @property
    def rest(self) -> list[int]:
        """The planned sizes after the run of wins."""
        return self.sizes[len(self.wins):]

    @property
    def regime(self) -> list[tuple[int, int, bool]]:
        """Lookahead on for 1..W (the last win), off above; empty unless promoting."""
        if self.move not in (Move.PROMOTE, Move.PROMOTE_REGIME_AWARE):
            return []
        return _regime(self.wins[-1], self.top)


def _regime(last_on: int | None, max_batch: int) -> list[tuple[int, int, bool]]:
    """Lookahead on for 1..last_on, off above (None: on everywhere)."""
    if last_on is None or last_on >= max_batch:
        return [(1, max_batch, True)]
    return [(1, last_on, True), (last_on + 1, max_batch, False)]


def _sizes_and_outcomes(batches: list[BatchComparison], thresholds: Thresholds,
                        planned: list[int] | None) -> tuple[dict[int, BatchComparison], list[int],
                                                            dict[int, BatchOutcome]]:
    measured = {b.batch_size: b for b in batches}
    if len(measured) != len(batches):
        raise ValueError("one BatchComparison per batch size")
    if planned is not None and any(int(p) < 1 for p in planned):
        raise ValueError("planned batch sizes must be >= 1")
    sizes = sorted(set(measured) | {int(p) for p in (planned or [])})
    outcomes = {s: (measured[s].outcome(thresholds) if s in measured else BatchOutcome.UNMEASURED) for s in sizes}
    return measured, sizes, outcomes


def _run_of_wins(sizes: list[int], outcomes: dict[int, BatchOutcome]) -> list[int]:
    wins: list[int] = []
    for s in sizes:
        if outcomes[s] is not BatchOutcome.WINS:
            break
        wins.append(s)
    return wins


def find(batches: list[BatchComparison], thresholds: Thresholds, deadline_passed: bool,
         preflight: "Preflight | None" = None, max_batch_size: int | None = None,
         planned: list[int] | None = None) -> Findings:
    """The rules of the module docstring, in order: which one fires, and what it found."""
    if preflight is not None and not preflight.candidate:
        return Findings(Case.NOT_A_CANDIDATE, Move.NOT_A_CANDIDATE, deadline_passed, preflight=preflight)
    measured, sizes, outcomes = _sizes_and_outcomes(batches, thresholds, planned)
    facts: dict[str, Any] = dict(deadline_passed=deadline_passed, sizes=sizes, measured=measured, outcomes=outcomes)
    undecided = Move.INCONCLUSIVE if deadline_passed else Move.WAIT
    if not measured:
        return Findings(Case.NOTHING_MEASURED, undecided, **facts)
    facts["top"] = max(max_batch_size or DEFAULT_MAX_BATCH_SIZE, sizes[-1])
    first = outcomes[sizes[0]]
    if first in LOSSES:
        return Findings(Case.FIRST_LOSES, Move.ROLLBACK, crossover_batch_size=sizes[0], **facts)
    if first in OPEN:
        return Findings(Case.FIRST_OPEN, undecided, **facts)
    wins = _run_of_wins(sizes, outcomes)
    rest = sizes[len(wins):]
    if not rest:
        move = Move.PROMOTE if wins[-1] >= facts["top"] else Move.PROMOTE_REGIME_AWARE
        return Findings(Case.ALL_WIN, move, wins=wins, **facts)
    if outcomes[rest[0]] in LOSSES:
        return Findings(Case.RUN_ENDS_AT_LOSS, Move.PROMOTE_REGIME_AWARE, wins=wins, crossover_batch_size=rest[0],
                        **facts)
    move = Move.PROMOTE_REGIME_AWARE if deadline_passed else Move.WAIT
    return Findings(Case.RUN_ENDS_OPEN, move, wins=wins, **facts)
