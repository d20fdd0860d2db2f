"""The main job's paired rounds (`analyze.compare`): pure functions on synthetic load-generator
results; the real engines and the whole job run in tests/integration/test_analyze.py."""

from __future__ import annotations

import math

from lookahead_canary.loadgen import ClientHealth, RequestResult, StepResult
from lookahead_operator import analyze
from lookahead_operator.statistics import Verdict


def _health() -> ClientHealth:
    return ClientHealth(cpu_fraction=0.1, loop_lag_p50_s=0.0, loop_lag_p99_s=0.0, loop_lag_max_s=0.0,
                        achieved_concurrency=1.0, target_concurrency=1, bottleneck=False)


def _step(start: float, per_token_s: float, tokens: int = 32, ttft_s: float = 0.2, ok: bool = True,
          error: str | None = None) -> StepResult:
    """One round of one role at batch 1: one request of ``tokens`` tokens, each after the first
    ``per_token_s`` apart."""
    first = start + ttft_s
    last = first + per_token_s * (tokens - 1)
    req = RequestResult(concurrency=1, index=0, started_at=start, ended_at=last, ok=ok, error=error,
                        ttft_s=ttft_s, per_token_s=per_token_s, e2e_s=last - start,
                        completion_tokens=tokens if ok else None, first_token_at=first if ok else None,
                        last_token_at=last if ok else None)
    return StepResult(concurrency=1, start=start, end=last, requests=[req], client=_health(), interval_s=2.0,
                      interval_output_tokens_per_s=[])


def _rounds(control_s: list[float], canary_s: list[float]) -> tuple[analyze.RoleMeasurement, analyze.RoleMeasurement]:
    control, canary = analyze.RoleMeasurement("control", 1), analyze.RoleMeasurement("canary", 1)
    t = 1000.0
    for c, k in zip(control_s, canary_s):
        for meas, per_token in ((control, c), (canary, k)):
            st = _step(t, per_token)
            meas.add_step(st, {})
            t = st.end
    return control, canary


def test_a_round_pools_decode_time_over_tokens_after_the_first():
    st = _step(0.0, 0.05, tokens=11)
    assert math.isclose(analyze.round_per_token_s(st), 0.05)
    # throughput counts every output token over the round's wall time, prefill included
    assert math.isclose(analyze.round_tokens_per_s(st), 11 / (0.2 + 0.5))


def test_a_round_without_two_tokens_has_no_latency_and_a_cut_round_no_throughput():
    assert analyze.round_per_token_s(_step(0.0, 0.05, tokens=1)) is None
    failed = _step(0.0, 0.05, ok=False, error="cancelled at the time limit")
    assert analyze.round_per_token_s(failed) is None
    assert analyze.round_tokens_per_s(failed) is None


def test_drift_common_to_both_roles_cancels_in_the_pairs():
    # the machine slows down 3x and back, round by round (another process comes and goes); the
    # canary is 30% faster than the control in every round. Unpaired, the spread of the drift
    # (0.05 .. 0.15 s/token) swamps the effect; paired, every round says -30%.
    drift = [1.0, 3.0, 1.5, 2.5, 1.0, 3.0, 2.0, 1.2, 2.8, 1.0, 3.0, 1.5]
    control, canary = _rounds([0.05 * d for d in drift], [0.035 * d for d in drift])
    th = analyze.family_thresholds(analyze.make_thresholds(0.05, 0.02, 0.95, 6), 4)
    lat, tp = analyze.compare(control, canary, th)
    assert lat.paired and lat.verdict is Verdict.BETTER, lat
    assert lat.n_control == lat.n_canary == len(drift)
    assert math.isclose(lat.estimate, -0.30, abs_tol=0.01)
    verdict = analyze.batch_verdict(1, lat, tp, None)
    assert verdict.outcome(th).value == "Wins"


def test_a_canary_slower_in_every_pair_is_not_a_win_whatever_the_drift():
    drift = [1.0, 3.0, 1.5, 2.5, 1.0, 3.0, 2.0, 1.2, 2.8, 1.0]
    control, canary = _rounds([0.05 * d for d in drift], [0.08 * d for d in drift])
    th = analyze.family_thresholds(analyze.make_thresholds(0.05, 0.02, 0.95, 6), 4)
    lat, tp = analyze.compare(control, canary, th)
    assert lat.verdict is Verdict.WORSE
    assert analyze.batch_verdict(1, lat, tp, None).outcome(th).value != "Wins"


def test_the_split_confidence_is_the_operators():
    th = analyze.family_thresholds(analyze.make_thresholds(0.05, 0.02, 0.95, 6), 4)
    assert math.isclose(th.confidence, 1 - 0.05 / 8)
    assert th.win_confidence is not None and th.win_confidence < th.confidence
