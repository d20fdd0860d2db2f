"""The main job's paired rounds: pure functions on synthetic rounds. Each round of each role is a
load-generator record plus what the engine counted over it (`observations.Increments`, as two reads
of its /metrics give them); the verdict comes from the operator's own functions
(`observations.paired_sample`, `measure.paired_verdict`). The real engines and the whole job run in
tests/integration/test_analyze.py; both sources side by side in tests/integration/test_one_pipeline.py."""

from __future__ import annotations

import math

import pytest

from lookahead_canary.loadgen import ClientHealth, RequestResult, StepResult
from lookahead_canary.metrics import PER_TOKEN_BUCKETS
from lookahead_operator.cli import analyze
from lookahead_operator.measurement import measure
from lookahead_operator.measurement import prometheus as observations
from lookahead_operator.engines import metric_names
from lookahead_operator.measurement.stats import Verdict

M = metric_names("reference")


def _health() -> ClientHealth:
    return ClientHealth(cpu_fraction=0.1, loop_lag_p50_s=0.0, loop_lag_p99_s=0.0, loop_lag_max_s=0.0,
                        achieved_concurrency=1.0, target_concurrency=1, bottleneck=False)


def _step(start: float, per_token_s: float, tokens: int = 32, ttft_s: float = 0.2, ok: bool = True,
          error: str | None = None) -> StepResult:
    """One round of one role at batch 1, as the client saw it: one request of ``tokens`` tokens,
    each after the first ``per_token_s`` apart."""
    first = start + ttft_s
    last = first + per_token_s * (tokens - 1)
    req = RequestResult(concurrency=1, index=0, started_at=start, ended_at=last, ok=ok, error=error,
                        ttft_s=ttft_s, per_token_s=per_token_s, e2e_s=last - start,
                        completion_tokens=tokens if ok else None, first_token_at=first if ok else None,
                        last_token_at=last if ok else None)
    return StepResult(concurrency=1, start=start, end=last, requests=[req], client=_health(), interval_s=2.0,
                      interval_output_tokens_per_s=[])


def _buckets(latencies: list[float]) -> dict[float, float]:
    return {le: float(sum(x <= le for x in latencies)) for le in list(PER_TOKEN_BUCKETS) + [math.inf]}


def _engine_round(start: float, per_token_s: float, tokens: int = 32, ttft_s: float = 0.2,
                  slow_tokens: int = 0, slow_s: float = 0.0, drafts: int = 0, accepted: int = 0
                  ) -> tuple[StepResult, observations.Increments]:
    """The same round and what the engine counted over it: ``tokens`` generated, the per-token
    histogram observing each token after the first (``slow_tokens`` of them at ``slow_s``)."""
    step = _step(start, per_token_s, tokens, ttft_s)
    lats = [slow_s] * slow_tokens + [per_token_s] * (tokens - 1 - slow_tokens)
    counters = {M.generation_tokens: float(tokens), f"{M.per_token_latency}_sum": sum(lats),
                f"{M.per_token_latency}_count": float(len(lats)), f"{M.e2e}_count": 1.0,
                M.drafts: float(drafts), M.draft_tokens: float(drafts * 3), M.accepted_tokens: float(accepted)}
    return step, observations.Increments(start=step.start - 0.01, end=step.end + 0.01, counters=counters,
                                         buckets=_buckets(lats))


def _batch(control_s: list[float], canary_s: list[float], tokens: int = 32, **canary_kw) -> analyze.BatchResult:
    res = analyze.BatchResult(1, analyze.RoleMeasurement("control", 1), analyze.RoleMeasurement("canary", 1))
    t = 1000.0
    for c, k in zip(control_s, canary_s):
        for meas, per_token, kw in ((res.control, c, {"tokens": tokens}), (res.canary, k, {"tokens": tokens,
                                                                                          **canary_kw})):
            step, inc = _engine_round(t, per_token, **kw)
            meas.add_round(step, inc)
            t = inc.end
        res.rounds += 1
    return res


TH = analyze.family_split(analyze.policy_thresholds(0.05, 0.02, 0.95, 6), 4)


def test_the_client_view_pools_decode_time_over_tokens_after_the_first():
    st = _step(0.0, 0.05, tokens=11)
    assert math.isclose(analyze.round_per_token_s(st), 0.05)
    # throughput counts every output token over the round's wall time, prefill included
    assert math.isclose(analyze.round_tokens_per_s(st), 11 / (0.2 + 0.5))
    assert analyze.round_per_token_s(_step(0.0, 0.05, tokens=1)) is None
    failed = _step(0.0, 0.05, ok=False, error="cancelled at the time limit")
    assert analyze.round_per_token_s(failed) is None and analyze.round_tokens_per_s(failed) is None


def test_a_rounds_sample_is_what_the_engine_counted_between_the_reads():
    step, inc = _engine_round(0.0, 0.05, tokens=11)
    s = observations.role_sample(inc, M)
    assert s.per_token_latency_s == pytest.approx(0.05)           # histogram sum / count
    assert s.tokens_per_s == pytest.approx(11 / (0.2 + 0.5 + 0.02))  # generated tokens / time between the reads
    meas = analyze.RoleMeasurement("control", 1)
    meas.add_round(step, inc)
    assert meas.server[M.generation_tokens] == 11 and meas.windows == [(inc.start, inc.end)]
    summary = meas.summary(M)
    assert summary["perTokenMs"] == pytest.approx(50) and summary["clientPerTokenMs"] == pytest.approx(50)


def test_drift_common_to_both_roles_cancels_in_the_pairs():
    # the machine slows down 3x and back, round by round (another process comes and goes); the
    # canary is 30% faster than the control in every round. Unpaired, the spread of the drift
    # (0.05 .. 0.15 s/token) swamps the effect; paired, every round says -30%.
    drift = [1.0, 3.0, 1.5, 2.5, 1.0, 3.0, 2.0, 1.2, 2.8, 1.0, 3.0, 1.5]
    res = _batch([0.05 * d for d in drift], [0.035 * d for d in drift])
    res.judge(M, TH, "reference")
    lat = res.latency
    assert lat.paired and lat.verdict is Verdict.BETTER, lat
    assert lat.n_control == lat.n_canary == len(drift)
    assert math.isclose(lat.estimate, -0.30, abs_tol=0.01)
    assert res.outcome == "Wins"
    # the operator's function on the same pairs gives the same verdict object
    assert measure.paired_verdict(1, res.pairs(M), TH, "reference") == res.verdict


def test_a_canary_slower_in_every_pair_is_not_a_win_whatever_the_drift():
    drift = [1.0, 3.0, 1.5, 2.5, 1.0, 3.0, 2.0, 1.2, 2.8, 1.0]
    res = _batch([0.05 * d for d in drift], [0.08 * d for d in drift])
    res.judge(M, TH, "reference")
    assert res.latency.verdict is Verdict.WORSE and res.outcome != "Wins"


def test_a_round_whose_metrics_could_not_be_read_is_left_out_never_zero():
    res = _batch([0.05] * 8, [0.035] * 8)
    step, _ = _engine_round(5000.0, 0.05)
    res.control.add_round(step, None)
    step, inc = _engine_round(5010.0, 0.035)
    res.canary.add_round(step, inc)
    res.judge(M, TH, "reference")
    assert res.latency.n_control == 8 and res.throughput.n_control == 8
    assert res.throughput.dropped == 1 and res.throughput.stalls_control == 0


def test_a_canary_round_that_generated_nothing_is_a_stall_not_a_dropped_round():
    res = _batch([0.05] * 8, [0.035] * 8)
    step, inc = _engine_round(5000.0, 0.05)
    res.control.add_round(step, inc)
    stall = observations.Increments(start=5010.0, end=5012.0, counters={M.generation_tokens: 0.0,
                                    f"{M.per_token_latency}_sum": 0.0, f"{M.per_token_latency}_count": 0.0})
    res.canary.add_round(_step(5010.0, 0.035, ok=False, error="timeout"), stall)
    res.judge(M, TH, "reference")
    assert res.throughput.stalls_canary == 1 and res.throughput.n_canary == 9
    assert res.latency.n_canary == 8, "no token after a first: no latency sample, not a zero"


def test_the_tail_veto_reaches_analyze():
    """A canary ~35% faster on the mean whose every round has a few tokens (4%) that wait 6x the
    control's: the operator's tail comparison (p99 from the summed histogram buckets) vetoes the win."""
    res = _batch([0.05] * 12, [0.02] * 12, tokens=200, slow_tokens=8, slow_s=0.3)
    res.judge(M, TH, "reference")
    assert res.latency.verdict is Verdict.BETTER
    assert res.verdict.tail is not None and res.verdict.tail.regresses
    assert res.outcome == "Regresses"
    loose = analyze.family_split(analyze.policy_thresholds(0.05, 0.02, 0.95, 6, 20.0), 4)
    res.judge(M, loose, "reference")
    assert res.outcome == "Wins"


def test_acceptance_is_the_canarys_counters_over_the_rounds():
    res = _batch([0.05] * 6, [0.035] * 6, drafts=10, accepted=12)
    res.judge(M, TH, "reference")
    assert res.verdict.acceptance_rate == pytest.approx(12 / 30)
    assert observations.mean_acceptance_length([p.canary for p in res.pairs(M)]) == pytest.approx(1 + 12 / 10)


def test_the_split_confidence_is_the_operators():
    th = analyze.family_split(analyze.policy_thresholds(0.05, 0.02, 0.95, 6), 4)
    assert th == measure.family_split(analyze.policy_thresholds(0.05, 0.02, 0.95, 6), 4)
    assert math.isclose(th.confidence, 1 - 0.05 / (4 * 3))   # latency, throughput and tail at 4 batch sizes
    assert th.win_confidence is not None and th.win_confidence < th.confidence


def test_an_engine_without_readable_metrics_stops_analyze_with_the_reason():
    """No client-side fallback: analyze decides on the engine's counters or not at all."""
    from lookahead_operator.cli.analyze import free_port

    url = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    with pytest.raises(analyze.AnalyzeError, match="cannot read the canary engine's metrics"):
        analyze.check_metrics("canary", url, M)
