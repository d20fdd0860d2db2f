"""The main job's round design: every round sends the same block of prompts in both roles, so the
prompt mix does not vary between rounds (docs/analyze.md, "Round-to-round variance"); and the
progress line keeps its interval (a bare ``[...]`` is rich markup and would vanish)."""

from __future__ import annotations

from rich.console import Console

from lookahead_operator.cli import analyze
from lookahead_operator.measurement.stats import Direction, Verdict
from lookahead_operator.measurement.stats.verdicts import ComparisonResult


def test_the_block_is_spread_over_the_set_and_the_same_every_time():
    assert analyze.round_block(16, 4) == [0, 4, 8, 12]
    assert analyze.round_block(16, 4) == analyze.round_block(16, 4)
    assert analyze.round_block(10, 3) == [0, 3, 6]
    assert len(set(analyze.round_block(16, 5))) == 5


def test_zero_or_more_than_the_set_means_the_whole_set():
    assert analyze.round_block(3, 0) == [0, 1, 2]
    assert analyze.round_block(3, 3) == [0, 1, 2]
    assert analyze.round_block(3, 8) == [0, 1, 2]


def _cmp(estimate, interval, n=6) -> ComparisonResult:
    return ComparisonResult(metric="per_token_latency", direction=Direction.LOWER_IS_BETTER, threshold=0.05,
                            confidence=0.9875, n_control=n, n_canary=n, control_mean=0.06, canary_mean=0.05,
                            estimate=estimate, interval=interval, verdict=Verdict.NOT_ENOUGH_DATA, paired=True)


def test_the_progress_line_shows_the_interval_through_rich():
    console = Console(width=200, record=True)
    line = (f"15:19:09 b=8 #6 (15 s) Regresses: latency {analyze._change(_cmp(0.29, (-0.11, 0.66)))}, "
            f"tput {analyze._change(_cmp(-0.32, (-0.39, -0.21)))}")
    console.print(line)
    out = console.export_text()
    assert "latency +29% [-11,+66], tput -32% [-39,-21]" in out
    assert len(out.rstrip("\n")) <= 80
    assert analyze._change(None) == "-"
    assert analyze._change(_cmp(None, None, n=0)) == "-"
    assert analyze._change(_cmp(-0.1, None, n=2)) == "-10%"

