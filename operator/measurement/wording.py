"""The decision's reason in words: ``reason(findings, thresholds)`` turns what the rules found
(``rules.Findings``) into the sentence the status shows. Pure."""

from __future__ import annotations

from lookahead_operator.measurement.rules import LOSSES, OPEN, Case, Findings
from lookahead_operator.measurement.stats import ComparisonResult, Thresholds
from lookahead_operator.measurement.verdict import BatchComparison, BatchOutcome


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.0f}%"


def confidence_words(confidence: float) -> str:
    """A confidence level as people write it: 0.99 -> '99%', 0.991666... -> '99.2%' (a family
    split's share has many digits; one decimal is all a reader needs)."""
    return f"{round(confidence * 100, 1):g}%"


def _cs(r: ComparisonResult) -> str:
    if r.paired:
        return f"{confidence_words(r.confidence)} CS, {r.n_canary} paired windows"
    return f"{confidence_words(r.confidence)} CS, n={r.n_canary}/{r.n_control}"


def _change_words(r: ComparisonResult, noun: str) -> str:
    """'per-token latency fell 31% [27%, 35%]' / 'rose ...' / 'changed -2% [-6%, +2%]'."""
    est, (lo, hi) = r.estimate, r.interval
    if hi < 0:
        return f"{noun} fell {_pct(est)} [{_pct(hi)}, {_pct(lo)}]"
    if lo > 0:
        return f"{noun} rose {_pct(est)} [{_pct(lo)}, {_pct(hi)}]"
    return f"{noun} changed {est * 100:+.0f}% [{lo * 100:+.0f}%, {hi * 100:+.0f}%]"


def _metric_words(bv: BatchComparison, r: ComparisonResult, noun: str, prefix: str) -> str:
    if r.interval is None or r.estimate is None:
        return f"{prefix} {bv.batch_size} {noun} has too little data ({r.note or 'no samples'})"
    stalls = ""
    if r.stalls_canary:
        stalls = f", {r.stalls_canary} canary window(s) with no output counted"
    return f"{prefix} {bv.batch_size} {_change_words(r, noun)} ({_cs(r)}{stalls})"


def _latency_words(bv: BatchComparison, prefix: str = "at batch") -> str:
    return _metric_words(bv, bv.latency, "per-token latency", prefix)


def _throughput_words(bv: BatchComparison, prefix: str = "at batch") -> str:
    return _metric_words(bv, bv.throughput, "throughput", prefix)


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.3g} ms"


def _tail_words(bv: BatchComparison, prefix: str = "at batch") -> str:
    t = bv.tail
    x = t.worst() if t is not None else None
    if x is None:
        return f"{prefix} {bv.batch_size} tail latency was not measured"
    name = f"p{x.quantile * 100:g}"
    ch = f" ({x.change * 100:+.0f}%)" if x.change is not None else ""
    return (f"{prefix} {bv.batch_size} {name} per-token latency {_ms(x.control)} -> {_ms(x.canary)}{ch}: the canary's "
            f"is above {_ms(x.canary_bounds[0])}, the control's at most {_ms(x.control_bounds[1])} "
            f"({confidence_words(t.confidence)} CS)")


def _loss_words(bv: BatchComparison, outcome: BatchOutcome, th: Thresholds, prefix: str = "at batch") -> str:
    if outcome is BatchOutcome.REGRESSES:
        if not bv.throughput.worse_by_more_than(th.max_throughput_regression) and bv.tail_regresses():
            return _tail_words(bv, prefix) + f", beyond the {_pct(bv.tail.threshold)} tail tolerance"
        return _throughput_words(bv, prefix) + f", beyond the {_pct(th.max_throughput_regression)} tolerance"
    return _latency_words(bv, prefix) + f", short of the required {_pct(th.min_latency_improvement)} improvement"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _sizes(xs: list[int]) -> str:
    return ", ".join(str(x) for x in xs)


def _batches(lo: int, hi: int) -> str:
    return f"batch {lo}" if lo == hi else f"batches {lo}-{hi}"


def _undecided_words(f: Findings, s: int) -> str:
    if s not in f.measured:
        return f"batch size {s} was planned but not measured"
    b = f.measured[s]
    return _latency_words(b) + "; " + _throughput_words(b)


def _not_a_candidate(f: Findings) -> str:
    pf = f.preflight
    why = "; ".join(pf.reasons[:2]) if pf.reasons else ""
    return (f"Preflight: the workload is {pf.verdict.value}, not a lookahead candidate"
            + (f": {why}" if why else "."))


def _nothing_measured(f: Findings) -> str:
    if f.deadline_passed:
        return "The deadline passed without a single batch size measured."
    return "No batch size measured yet."


def _first_loses(f: Findings, th: Thresholds) -> str:
    first = f.sizes[0]
    bv1, o1 = f.measured[first], f.outcomes[first]
    worst = next((f.measured[s] for s in f.sizes if f.outcomes[s] is BatchOutcome.REGRESSES), None)
    reason = _cap(_loss_words(bv1, o1, th)) + "."
    if worst is not None and worst is not bv1:
        reason += " " + _cap(_loss_words(worst, BatchOutcome.REGRESSES, th)) + "."
    return reason + " Lookahead pays at no measured batch size: rolled back."


def _first_open(f: Findings) -> str:
    first = f.sizes[0]
    detail = _undecided_words(f, first)
    if f.deadline_passed:
        return f"The deadline passed before batch size {first} was settled ({detail}); lookahead stays off."
    return f"Waiting for data at batch size {first} ({detail})."


def _lead(f: Findings) -> str:
    return _cap(_latency_words(f.measured[f.wins[0]]))


def _all_win(f: Findings, th: Thresholds) -> str:
    wins, w, top = f.wins, f.wins[-1], f.top
    tps = [f.measured[s].throughput for s in wins if f.measured[s].throughput.improvement_interval is not None]
    worst_tp = min(tps, key=lambda r: r.improvement_interval[0]) if tps else None
    tail = ""
    if worst_tp is not None:
        lo = worst_tp.improvement_interval[0]
        tail = (f"; throughput at every batch size stayed within the {_pct(th.max_throughput_regression)} "
                f"tolerance (worst lower bound {lo * 100:+.0f}%)")
    said = _lead(f) + f"; lookahead wins at every measured batch size ({_sizes(wins)})" + tail
    if w >= top:
        return said + "."
    return (said + f". No crossover was measured: it lies above batch {w}, the largest batch size measured, so "
                   f"lookahead is enabled for {_batches(1, w)} only and stays off above (up to {top}) until measured.")


def _run_ends_at_loss(f: Findings, th: Thresholds) -> str:
    w, nxt = f.wins[-1], f.rest[0]
    many = nxt - 1 > w + 1
    gap = (f" ({_batches(w + 1, nxt - 1)} {'were' if many else 'was'} not measured and "
           f"stay{'' if many else 's'} off)") if nxt - 1 > w else ""
    return (_lead(f) + "; " + _loss_words(f.measured[nxt], f.outcomes[nxt], th, prefix="from batch")
            + f": lookahead enabled for {_batches(1, w)} only{gap}.")


def _run_ends_open(f: Findings) -> str:
    wins, w, rest = f.wins, f.wins[-1], f.rest
    nxt = rest[0]
    if not f.deadline_passed:
        waits = ", ".join(map(str, [s for s in rest if f.outcomes[s] in OPEN]))
        return f"Waiting for data at batch sizes {waits} ({_undecided_words(f, nxt)})."
    loss = next((s for s in rest if f.outcomes[s] in LOSSES), None)
    bracket = f"between {w + 1} and {loss}" if loss is not None else f"above {w}"
    won = f"batch size {wins[0]}" if len(wins) == 1 else f"batch sizes {_sizes(wins)}"
    reason = (_lead(f) + f"; lookahead wins at {won}, but the deadline passed before batch size "
              f"{nxt} was settled ({_undecided_words(f, nxt)}). The crossover lies {bracket}, unmeasured: lookahead "
              f"is enabled for {_batches(1, w)} only, up to the largest batch size measured as a win.")
    unmeasured = [s for s in f.sizes if s not in f.measured]
    if unmeasured:
        reason += f" Not measured: {_sizes(unmeasured)}."
    return reason


def reason(f: Findings, th: Thresholds) -> str:
    """The reason the status shows for what the rules found."""
    if f.case is Case.NOT_A_CANDIDATE:
        return _not_a_candidate(f)
    if f.case is Case.NOTHING_MEASURED:
        return _nothing_measured(f)
    if f.case is Case.FIRST_LOSES:
        return _first_loses(f, th)
    if f.case is Case.FIRST_OPEN:
        return _first_open(f)
    if f.case is Case.ALL_WIN:
        return _all_win(f, th)
    if f.case is Case.RUN_ENDS_AT_LOSS:
        return _run_ends_at_loss(f, th)
    return _run_ends_open(f)
