"""bench_live's safety abort is the operator's: `abort_checks` (the rule over seeds and checks at
once) answers as `controller.livesplit.abort_reason` does on random inputs, `abort_windows` folds
each check's window as a plain loop does, and `apply_abort` stops a run at the first check that
`abort_reason` answers, with AbortSpec's defaults unless a test says otherwise."""

import math

import numpy as np
import pytest

from lookahead_dev import bench_live as bl
from lookahead_operator.api.spec import AbortSpec
from lookahead_operator.controller.livesplit import abort_reason
from lookahead_operator.measurement.stats import ArmWindow

#: every knob away from its default, so the gates and limits the defaults hide are reached too
TIGHT = AbortSpec.model_validate({"maxErrorRateIncrease": "20%", "minRequests": 4, "minErrors": 1,
                                  "maxTtftRegression": "10%", "maxTokenLatencyRegression": "10%",
                                  "window": "30s", "checkInterval": "5s"})


def _random_arms(rng: np.random.Generator, shape: tuple[int, int], control: bl.ArmWindows | None = None):
    """ArmWindows with the edges `abort_reason` cares about: no requests, fewer than minRequests,
    more errors than requests, None (NaN) and zero latencies, and, against ``control``, ratios
    at exactly the limits."""
    pick = rng.integers(0, 4, shape)
    requests = np.select([pick == 0, pick == 1, pick == 2], [rng.integers(0, 3, shape), rng.integers(15, 25, shape),
                                                            rng.integers(0, 400, shape)], rng.integers(0, 60, shape))
    errors = np.where(rng.random(shape) < 0.5, 0, rng.integers(0, 6, shape))
    share = rng.choice([0.04, 0.05, 0.06, 0.2, 0.25], shape)  # error rates around maxErrorRateIncrease
    errors = np.where(rng.random(shape) < 0.3, (requests * share).astype(int), errors)
    errors = np.where(rng.random(shape) < 0.03, requests + rng.integers(1, 4, shape), errors)

    def latency(scale: float, rise_choices) -> np.ndarray:
        x = scale * np.exp(rng.normal(0.0, 0.8, shape))
        if control is not None:  # ratios around, and at, the limits
            ref = control.ttft if scale > 0.1 else control.per_token_latency
            at = rng.random(shape) < 0.3
            x = np.where(at, ref * rng.choice(rise_choices, shape), x)
        x = np.where(rng.random(shape) < 0.08, np.nan, x)
        x = np.where(rng.random(shape) < 0.03, 0.0, x)
        return x

    return bl.ArmWindows(per_token_latency=latency(0.03, [1.0, 1.1, 2.0, 2.0000001, 1.9999999, 3.0]),
                         token_rate=rng.uniform(0.0, 50.0, shape),
                         ttft=latency(0.5, [1.0, 1.1, 3.0, 3.0000001, 2.9999999]),
                         requests=requests.astype(np.int64), errors=errors.astype(np.int64),
                         running=rng.uniform(0.0, 64.0, shape))


@pytest.mark.parametrize("abort", [AbortSpec(), TIGHT], ids=["defaults", "tight"])
def test_vectorised_abort_is_abort_reason_on_random_inputs(abort):
    rng = np.random.default_rng(11)
    shape = (120, 60)
    seen = set()
    for _ in range(3):
        control = _random_arms(rng, shape)
        canary = _random_arms(rng, shape, control)
        codes = bl.abort_checks(canary, control, abort)
        for s in range(shape[0]):
            for j in range(shape[1]):
                r = abort_reason(canary.at(s, j), control.at(s, j), abort)
                assert bl.ABORT_SIGNALS[codes[s, j]] == (r.signal if r else None), (s, j, canary.at(s, j),
                                                                                 control.at(s, j))
        seen |= set(np.unique(codes).tolist())
    assert seen == {0, 1, 2, 3}  # every answer reached: none, errors, ttft, per-token latency


def test_the_bench_reads_the_operators_defaults():
    assert bl.ABORT == AbortSpec()
    assert bl.abort_check_ends(bl.LIVE_WINDOWS)[0] * bl.WINDOW_S == AbortSpec().check_interval.total_seconds()


def _plain_window(a: bl.Arm, s: int, lo: int, hi: int) -> ArmWindow:
    """One arm, seed s, windows [lo, hi), folded one window at a time (abort_windows' docstring)."""
    busy = tokens = ttft_sum = ttft_n = rate_sum = rate_busy = requests = errors = 0.0
    for w in range(lo, hi):
        in_flight = bl.ARM_PODS * float(a.running[s, w]) * bl.WINDOW_S
        n = round(float(a.requests[s, w]) * bl.ARM_PODS)
        requests += n
        errors += round(float(a.errors[s, w]))
        lat = float(a.lat[s, w])
        if math.isfinite(lat) and lat > 0:
            busy += in_flight
            tokens += in_flight / lat
        if math.isfinite(float(a.ttft[s, w])):
            ttft_sum += float(a.ttft[s, w]) * n
            ttft_n += n
        if math.isfinite(float(a.rate[s, w])):
            rate_sum += float(a.rate[s, w]) * in_flight
            rate_busy += in_flight
    return ArmWindow(per_token_latency=busy / tokens if tokens > 0 else None,
                     token_rate=rate_sum / rate_busy if rate_busy > 0 else None,
                     ttft=ttft_sum / ttft_n if ttft_n > 0 else None, requests=int(requests), errors=int(errors),
                     running=float(a.running[s, lo:hi].mean()))


def _streams(seeds: int, rng: np.random.Generator, **noise) -> bl.LiveStreams:
    """Streams where the canary often hurts users: heavy-tailed slowdowns and stalls."""
    from dataclasses import replace

    from lookahead_canary.simulator import SimConfig
    from lookahead_dev import bench_decision as bd

    cfg = SimConfig(gpu="a100-80gb", model="llama-3-70b", method="jacobi", acceptance=0.6)
    nz = replace(bd.PROFILES[2], **noise)
    sc = bl.LiveScenario("abort", cfg, "bursts", "service", nz)
    return bl.make_live_streams(sc, bl.Curves(cfg), seeds, rng)


@pytest.mark.parametrize("abort", [AbortSpec(), TIGHT], ids=["defaults", "tight"])
def test_abort_windows_fold_each_checks_window_as_a_plain_loop(abort):
    st = _streams(4, np.random.default_rng(5), stall_arm=0.05, stall_common=0.05)
    n = st.offered.shape[1]
    ends = bl.abort_check_ends(n, abort)
    win = round(abort.window.total_seconds() / bl.WINDOW_S)
    assert ends[-1] == n and (np.diff(ends) * bl.WINDOW_S == abort.check_interval.total_seconds()).all()
    for a in (st.canary, st.control):
        folded = bl.abort_windows(a, abort)
        for s in range(4):
            for j, e in enumerate(ends):
                want, got = _plain_window(a, s, max(0, e - win), e), folded.at(s, j)
                assert (got.requests, got.errors) == (want.requests, want.errors)
                for f in ("per_token_latency", "token_rate", "ttft", "running"):
                    if getattr(want, f) is None:
                        assert getattr(got, f) is None, (f, s, j)
                    else:
                        assert getattr(got, f) == pytest.approx(getattr(want, f), rel=1e-12), (f, s, j)


@pytest.mark.parametrize("abort", [AbortSpec(), TIGHT], ids=["defaults", "tight"])
def test_apply_abort_stops_at_the_first_check_abort_reason_answers(abort):
    seeds = 24
    st = _streams(seeds, np.random.default_rng(9))
    n = st.offered.shape[1]
    win = round(abort.window.total_seconds() / bl.WINDOW_S)
    want = []
    for s in range(seeds):  # the operator's loop: at every check, the last window of each arm
        first = None
        for e in bl.abort_check_ends(n, abort):
            r = abort_reason(_plain_window(st.canary, s, max(0, e - win), e),
                             _plain_window(st.control, s, max(0, e - win), e), abort)
            if r is not None:
                first = (int(e), bl.ABORT_SIGNALS.index(r.signal))
                break
        want.append(first)
    before = {f: getattr(st.canary, f).copy() for f in ("lat", "rate", "ttft")}
    codes = bl.apply_abort(st, abort)
    assert any(w is not None for w in want)
    assert abort == TIGHT or any(w is None for w in want)  # at the defaults, both kinds of run here
    for s, w in enumerate(want):
        assert codes[s] == (0 if w is None else w[1])
        cut = n if w is None else w[0]
        for f, x in before.items():  # values kept before the abort, blank from it on
            np.testing.assert_array_equal(getattr(st.canary, f)[s, :cut], x[s, :cut])
            assert np.isnan(getattr(st.canary, f)[s, cut:]).all()
            assert np.isnan(getattr(st.control, f)[s, cut:]).all()


def test_check_abort_against_operator_passes_on_streams():
    bl.check_abort_against_operator(_streams(6, np.random.default_rng(3), stall_arm=0.05, stall_common=0.05))
