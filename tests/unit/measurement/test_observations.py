"""The window arithmetic of lookahead_operator.measurement.prometheus, on in-memory series.

``SeriesStore`` answers the two query shapes the module sends (``metric{sel}[Ns]`` at a time, and
``min(timestamp(metric{sel}))``) from Python lists, so the reset / baseline / not-yet-scraped rules
can be pinned down exactly. The real Prometheus is in tests/integration/test_observations.py.
"""

from __future__ import annotations

import math
import re

import pytest

from lookahead_operator.measurement import prometheus as obs
from lookahead_operator.engines import metric_names
from lookahead_operator.measurement.prometheus import Measured, State

V = metric_names("vllm")
SEL = {"lookahead_dev_role": "canary", "lookahead_dev_policy": "p"}


class SeriesStore:
    def __init__(self) -> None:
        self.series: list[tuple[str, dict, list[tuple[float, float]]]] = []

    def add(self, name: str, points, **labels):
        self.series.append((name, {**SEL, **labels}, list(points)))

    def _match(self, sel: str, labels: dict) -> bool:
        for k, op, v in re.findall(r'(\w+)(=~|=)"([^"]*)"', sel):
            if op == "=" and labels.get(k) != v:
                return False
            if op == "=~" and not re.fullmatch(v, labels.get(k, "")):
                return False
        return True

    def custom_query(self, query: str, params: dict | None = None):
        m = re.fullmatch(r"([\w:]+)(\{.*\})\[(\d+)s\]", query)
        if m:
            name, sel, rng = m.group(1), m.group(2), int(m.group(3))
            t = float(params["time"])
            out = []
            for n, labels, pts in self.series:
                if n == name and self._match(sel, labels):
                    vals = [[ts, str(v)] for ts, v in pts if t - rng < ts <= t]
                    if vals:
                        out.append({"metric": {"__name__": n, **labels}, "values": vals})
            return out
        m = re.fullmatch(r"min\(timestamp\(([\w:]+)(\{.*\})\)\)", query)
        if m:
            ts = [pts[-1][0] for n, labels, pts in self.series if n == m.group(1) and self._match(m.group(2), labels)]
            return [{"metric": {}, "value": [0, str(min(ts))]}] if ts else []
        raise AssertionError(f"unexpected query {query}")


def scrape_times(a, b, step=1.0):
    t = a
    while t <= b + 1e-9:
        yield t
        t += step


def engine_series(store, start=100.0, end=120.0, tokens_per_s=50.0, per_token=0.02, req_every=2.0, pod="a",
                  spec=True):
    """Counters that are flat before `start`, grow during [start, end], flat after."""
    gen, s_ptl, c_ptl, s_e2e, c_e2e, running, draft, acc = ([] for _ in range(8))
    for t in scrape_times(start - 10, end + 10):
        dt = min(max(t - start, 0.0), end - start)
        n_req = int(dt // req_every)
        gen.append((t, 1000 + tokens_per_s * dt))
        s_ptl.append((t, 5 + per_token * n_req))
        c_ptl.append((t, 10 + n_req))
        s_e2e.append((t, 50 + 1.0 * n_req))
        c_e2e.append((t, 10 + n_req))
        running.append((t, 4.0 if start <= t <= end else 0.0))
        draft.append((t, 400 + 10 * dt))
        acc.append((t, 100 + 4 * dt))
    store.add(V.generation_tokens, gen, pod=pod)
    store.add(V.per_token_latency + "_sum", s_ptl, pod=pod)
    store.add(V.per_token_latency + "_count", c_ptl, pod=pod)
    store.add(V.e2e + "_sum", s_e2e, pod=pod)
    store.add(V.e2e + "_count", c_e2e, pod=pod)
    store.add(V.running, running, pod=pod)
    if spec:
        store.add(V.draft_tokens, draft, pod=pod)
        store.add(V.accepted_tokens, acc, pod=pod)


def test_window_values_are_exact_increases():
    store = SeriesStore()
    engine_series(store)
    o = obs.read_window(store, V, SEL, 100.0, 120.0, interval_s=5.0, now=200.0)
    assert o.output_tokens.ok and o.output_tokens.value == pytest.approx(50 * 20)
    assert o.output_tokens_per_s.value == pytest.approx(50.0)
    assert o.requests.value == 10
    assert o.per_token_latency_s.value == pytest.approx(0.02)
    assert o.per_token_latency_source == "per_token_histogram"
    assert o.e2e_s.value == pytest.approx(1.0)
    assert o.acceptance_rate.value == pytest.approx(0.4)
    assert o.mean_running.value == pytest.approx(4.0)
    # a histogram the store lacks is missing, with a reason, not zero
    assert o.ttft_s.state is State.MISSING and "no series" in o.ttft_s.reason
    assert o.ttft_s.value is None
    # intervals: 4 intervals of 5 s at 50 tokens/s
    assert o.intervals.output_tokens_per_s == pytest.approx([50.0] * 4)
    assert sum(o.intervals.output_tokens) == pytest.approx(1000)
    assert all(x == pytest.approx(0.02) for x in o.intervals.per_token_latency_s if x is not None)
    assert o.complete()
    d = o.to_dict()
    assert d["role"] == "canary" and d["per_token_latency_s"]["state"] == "ok"


def test_two_pods_sum_and_running_is_per_pod():
    store = SeriesStore()
    engine_series(store, pod="a")
    engine_series(store, pod="b", tokens_per_s=30.0)
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert o.output_tokens_per_s.value == pytest.approx(80.0)
    assert o.mean_running.value == pytest.approx(4.0)   # per engine, not summed


def test_counter_reset_inside_window_is_added_not_negative():
    pts = [(98.0, 500.0), (100.0, 510.0), (105.0, 560.0), (106.0, 5.0), (110.0, 45.0), (121.0, 45.0)]
    inc, base, end, born = obs._counter_increase(pts, 100.0, 120.0)
    assert inc == pytest.approx(50 + 5 + 40)
    assert base == (100.0, 510.0) and end == (121.0, 45.0) and not born


def test_series_born_inside_window_counts_from_zero():
    store = SeriesStore()
    store.add(V.generation_tokens, [(t, 10.0 * (t - 105)) for t in scrape_times(105, 125)])
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert o.output_tokens.value == pytest.approx(150.0)
    assert any("started inside the window" in n for n in o.notes)


def test_empty_window_is_missing_not_zero():
    store = SeriesStore()
    engine_series(store)
    o = obs.read_window(store, V, SEL, 123.0, 128.0, now=300.0)   # counters flat: nothing happened
    for v in (o.output_tokens_per_s, o.per_token_latency_s, o.requests, o.e2e_s, o.acceptance_rate):
        assert v.state is State.MISSING and v.value is None, v
    assert "no tokens generated" in o.output_tokens_per_s.reason
    assert "no requests finished" in o.per_token_latency_s.reason
    with pytest.raises(obs.NotMeasured):
        float(o.per_token_latency_s)
    assert not o.complete()


def test_no_series_at_all_is_missing():
    o = obs.read_window(SeriesStore(), V, SEL, 100.0, 120.0, now=200.0)
    assert o.output_tokens_per_s.state is State.MISSING and "no series" in o.output_tokens_per_s.reason
    assert o.intervals.t == []


def test_not_scraped_after_end_is_missing_until_it_is():
    store = SeriesStore()
    engine_series(store, end=120.0)
    # drop every sample after t = 119
    store.series = [(n, l, [p for p in pts if p[0] <= 119.0]) for n, l, pts in store.series]
    o = obs.read_window(store, V, SEL, 100.0, 119.5, now=119.6)
    assert o.output_tokens_per_s.state is State.MISSING
    assert "not scraped since the window end" in o.output_tokens_per_s.reason


def test_few_requests_are_sparse_with_estimate():
    store = SeriesStore()
    engine_series(store, start=100.0, end=104.5, req_every=2.0)   # 2 requests
    o = obs.read_window(store, V, SEL, 100.0, 104.5, now=200.0)
    assert o.per_token_latency_s.state is State.SPARSE
    assert o.per_token_latency_s.value == pytest.approx(0.02)
    assert o.per_token_latency_s.get() is None          # not usable as ok
    assert "only 2 request(s)" in o.per_token_latency_s.reason


def test_speculation_off_gives_missing_acceptance():
    store = SeriesStore()
    engine_series(store, spec=False)
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert o.acceptance_rate.state is State.MISSING
    store = SeriesStore()
    engine_series(store)
    # draft counters exist but are flat (speculation off at this batch size)
    store.series = [(n, l, [(t, 400.0) for t, _ in pts]) if n in (V.draft_tokens, V.accepted_tokens) else (n, l, pts)
                    for n, l, pts in store.series]
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert o.acceptance_rate.state is State.MISSING and "no draft tokens" in o.acceptance_rate.reason


def test_decode_time_fallback_for_per_token_latency():
    store = SeriesStore()
    # no per-token histogram; decode time and a request counter
    gen, dsum, dcnt, ecnt, esum = [], [], [], [], []
    for t in scrape_times(90, 130):
        dt = min(max(t - 100, 0.0), 20.0)
        n = int(dt // 2)
        gen.append((t, 11.0 * n))        # 11 tokens a request
        dsum.append((t, 0.5 * n))        # 10 tokens after the first in 0.5 s
        dcnt.append((t, float(n)))
        ecnt.append((t, float(n)))
        esum.append((t, 0.6 * n))
    store.add(V.generation_tokens, gen)
    store.add(V.decode_time + "_sum", dsum)
    store.add(V.decode_time + "_count", dcnt)
    store.add(V.e2e + "_count", ecnt)
    store.add(V.e2e + "_sum", esum)
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert o.per_token_latency_source == "decode_time/generated_tokens"
    assert o.per_token_latency_s.value == pytest.approx(0.05)


def test_sglang_acceptance_from_gauge_is_labelled():
    store = SeriesStore()
    S = metric_names("sglang")
    store.add(S.generation_tokens, [(t, 10.0 * t) for t in scrape_times(90, 130)])
    store.add(S.acceptance_rate_gauge, [(t, 0.3) for t in scrape_times(90, 130)])
    o = obs.read_window(store, S, SEL, 100.0, 120.0, now=200.0)
    assert o.acceptance_rate.value == pytest.approx(0.3)
    assert "gauge" in o.acceptance_rate.reason
    assert o.prefill_time_s.state is State.MISSING and "exports no prefill" in o.prefill_time_s.reason


def test_wait_scraped():
    store = SeriesStore()
    engine_series(store, end=120.0)
    assert obs.wait_scraped(store, V, SEL, after=125.0, timeout=1) >= 125.0
    with pytest.raises(TimeoutError):
        obs.wait_scraped(store, V, SEL, after=1e9, timeout=0.3, poll_s=0.05)


def test_fleet_signals_with_and_without_dcgm():
    store = SeriesStore()
    engine_series(store)
    store.add(V.prefill_time + "_sum", [(t, 0.1 * t) for t in scrape_times(90, 130)])
    store.add(V.prefill_time + "_count", [(t, 1.0 * t) for t in scrape_times(90, 130)])
    store.add(V.decode_time + "_sum", [(t, 2.0 * t) for t in scrape_times(90, 130)])
    store.add(V.decode_time + "_count", [(t, 1.0 * t) for t in scrape_times(90, 130)])
    f = obs.fleet_signals(store, V, SEL, 100.0, 120.0, now=200.0)
    assert f.prefill_time_s.value == pytest.approx(0.1) and f.decode_time_s.value == pytest.approx(2.0)
    assert f.running_max.value == 4.0
    assert f.sm_active.state is State.MISSING and "commented out in both counter CSVs" in f.sm_active.reason
    assert f.gr_engine_active.state is State.MISSING and "on by default" in f.gr_engine_active.reason
    sig = f.preflight_signals()
    assert sig["prefill_seconds"] == pytest.approx(0.1) and sig["sm_active"] is None
    assert sig["running_batch_quantiles"][0.5] == pytest.approx(4.0)

    # DCGM series by namespace/pod
    for name, val in (("DCGM_FI_PROF_DRAM_ACTIVE", 0.8), ("DCGM_FI_PROF_SM_ACTIVE", 0.2),
                      ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.1), ("DCGM_FI_DEV_GPU_UTIL", 97.0),
                      ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.95), ("DCGM_FI_PROF_SM_OCCUPANCY", 0.3)):
        store.series.append((name, {"namespace": "inference", "pod": "chat-1", "gpu": "0"},
                             [(t, val) for t in scrape_times(90, 130)]))
        store.series.append((name, {"namespace": "other", "pod": "x", "gpu": "0"},
                             [(t, 0.0) for t in scrape_times(90, 130)]))
    f = obs.fleet_signals(store, V, SEL, 100.0, 120.0, namespace="inference", pods=["chat-1"], now=200.0)
    assert f.dram_active.value == pytest.approx(0.8) and f.sm_active.value == pytest.approx(0.2)
    assert f.gpu_util.value == pytest.approx(97.0)
    assert f.gr_engine_active.value == pytest.approx(0.95) and f.sm_occupancy.value == pytest.approx(0.3)
    assert f.by_pod["inference/chat-1"]["tensor_active"].value == pytest.approx(0.1)
    assert set(f.by_pod) == {"inference/chat-1"}
    assert f.preflight_signals()["gr_engine_active"] == pytest.approx(0.95)
    assert any("kernel residency" in n for n in f.notes)

    from lookahead_operator.measurement.preflight import screen
    p = screen(f.preflight_signals())
    assert p.candidate


def test_measured_str_and_dict():
    assert str(Measured.of(0.5, 3, "s")) == "0.5 s"
    assert "missing" in str(Measured.missing("x"))
    assert Measured.sparse(1.0, "few", 1).to_dict()["state"] == "sparse"


def test_fleet_signals_match_dcgm_series_scraped_with_honor_labels_false():
    """dcgm-exporter's Helm chart scrapes with honorLabels: false: the workload's namespace and pod
    arrive as exported_namespace / exported_pod, while namespace / pod name the exporter itself."""
    store = SeriesStore()
    exporter = {"namespace": "gpu-operator", "pod": "dcgm-exporter-x7k2p", "gpu": "0"}
    for name, val in (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.9), ("DCGM_FI_PROF_DRAM_ACTIVE", 0.72),
                      ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.05)):
        store.series.append((name, {**exporter, "exported_namespace": "inference", "exported_pod": "chat-1"},
                             [(t, val) for t in scrape_times(90, 130)]))
        # another workload's GPU on the same exporter: not ours
        store.series.append((name, {**exporter, "gpu": "1", "exported_namespace": "inference",
                                    "exported_pod": "batch-9"}, [(t, 0.0) for t in scrape_times(90, 130)]))
        # a GPU series labelled the honorLabels: true way, in the same fleet
        store.series.append((name, {"namespace": "inference", "pod": "chat-2", "gpu": "0"},
                             [(t, val / 2) for t in scrape_times(90, 130)]))
    f = obs.fleet_signals(store, V, SEL, 100.0, 120.0, namespace="inference", pods=["chat-1", "chat-2"],
                          now=200.0)
    assert set(f.by_pod) == {"inference/chat-1", "inference/chat-2"}
    assert f.by_pod["inference/chat-1"]["dram_active"].value == pytest.approx(0.72)
    assert f.dram_active.value == pytest.approx((0.72 + 0.36) / 2)
    assert f.gr_engine_active.value == pytest.approx((0.9 + 0.45) / 2)
    assert f.sm_active.state is State.MISSING and f.sm_occupancy.state is State.MISSING
    from lookahead_operator.measurement.preflight import PreflightVerdict, screen
    p = screen(f.preflight_signals())
    assert p.verdict is PreflightVerdict.DECODE_BOUND_IDLE_COMPUTE


def per_pos_series(store, drafts_per_s=2.0, accepted=(1.6, 1.0, 0.4), start=100.0, end=120.0, pod="a"):
    """A vLLM-shaped speculating engine: per second, ``drafts_per_s`` drafts and ``accepted[k]``
    drafts with position k accepted."""
    d, a, per = [], [], {k: [] for k in range(len(accepted))}
    for t in scrape_times(start - 10, end + 10):
        dt = min(max(t - start, 0.0), end - start)
        d.append((t, 50 + drafts_per_s * dt))
        a.append((t, 30 + sum(accepted) * dt))
        for k, x in enumerate(accepted):
            per[k].append((t, 10 + x * dt))
    store.add(V.drafts, d, pod=pod)
    store.add(V.accepted_tokens, a, pod=pod)
    for k, pts in per.items():
        store.add(V.accepted_per_position, pts, pod=pod, position=str(k))


def test_mean_acceptance_length_and_per_position_are_exact_window_increases():
    store = SeriesStore()
    engine_series(store, spec=False)
    per_pos_series(store)
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert o.drafts.value == pytest.approx(40.0)
    # 1 + accepted / drafts = 1 + 3.0 / 2.0
    assert o.mean_acceptance_length.ok and o.mean_acceptance_length.value == pytest.approx(2.5)
    assert [m.value for m in o.acceptance_by_position] == pytest.approx([0.8, 0.5, 0.2])
    assert o.acceptance_by_position_reason == ""
    d = o.to_dict()
    assert d["mean_acceptance_length"]["value"] == pytest.approx(2.5)
    assert [x["value"] for x in d["acceptance_by_position"]] == pytest.approx([0.8, 0.5, 0.2])
    # two pods: counters add up per position
    per_pos_series(store, pod="b", accepted=(2.0, 2.0, 2.0))
    o = obs.read_window(store, V, SEL, 100.0, 120.0, now=200.0)
    assert [m.value for m in o.acceptance_by_position] == pytest.approx([0.9, 0.75, 0.6])
    assert o.mean_acceptance_length.value == pytest.approx(1 + (3.0 + 6.0) / 4.0)


def test_acceptance_detail_missing_never_zero():
    store = SeriesStore()
    engine_series(store, spec=False)
    per_pos_series(store)
    o = obs.read_window(store, V, SEL, 123.0, 128.0, now=300.0)   # counters flat: no drafts
    assert o.mean_acceptance_length.state is State.MISSING and o.mean_acceptance_length.value is None
    assert "no drafts" in o.mean_acceptance_length.reason
    assert o.acceptance_by_position == [] and "no drafts" in o.acceptance_by_position_reason
    # not scraped past the end yet
    store.series = [(n, l, [p for p in pts if p[0] <= 119.0]) for n, l, pts in store.series]
    o = obs.read_window(store, V, SEL, 100.0, 119.5, now=119.6)
    assert o.mean_acceptance_length.state is State.MISSING and "not scraped" in o.mean_acceptance_length.reason
    # the reference engine's names before engines.py declares its per-position counter
    import dataclasses
    o = obs.read_window(store, dataclasses.replace(V, accepted_per_position=None), SEL, 100.0, 120.0, now=200.0)
    assert "exports no per-position" in o.acceptance_by_position_reason


def test_sglang_mean_acceptance_length_from_verify_calls():
    store = SeriesStore()
    S = metric_names("sglang")
    store.add(S.generation_tokens, [(t, 12.0 * t) for t in scrape_times(90, 130)])
    store.add(S.drafts, [(t, 4.0 * t) for t in scrape_times(90, 130)])
    store.add(S.acceptance_length_gauge, [(t, 9.0) for t in scrape_times(90, 130)])
    o = obs.read_window(store, S, SEL, 100.0, 120.0, now=200.0)
    assert o.mean_acceptance_length.value == pytest.approx(3.0)     # the counters, not the gauge
    assert "verify" in o.mean_acceptance_length.reason
    assert "exports no per-position" in o.acceptance_by_position_reason
    # an SGLang older than 0.5.13 (no verify-call counter): the gauge, labelled as one
    store.series = [x for x in store.series if x[0] != S.drafts]
    o = obs.read_window(store, S, SEL, 100.0, 120.0, now=200.0)
    assert o.mean_acceptance_length.value == pytest.approx(9.0) and "gauge" in o.mean_acceptance_length.reason


def test_intervals_say_which_window_each_entry_is_across_a_scrape_gap_and_a_stall():
    """No scrape after 105 up to 110 (Prometheus missed five): window 1 [105, 110] has no entry and
    its tokens go to window 2, which spans both; ``interval`` keeps the window index so two roles
    still pair by window. A window scraped with no new token (idle after 120) is an entry: 0 tok/s."""
    store = SeriesStore()
    rate = {0: 10.0, 1: 20.0, 2: 0.0, 3: 40.0}      # tok/s per 5 s window from 100

    def gen(t):
        return 1000.0 + sum(r * min(max(t - (100 + 5 * w), 0.0), 5.0) for w, r in rate.items())

    store.add(V.generation_tokens, [(t, gen(t)) for t in scrape_times(90, 130) if not 105 < t <= 110])
    iv = obs.read_window(store, V, SEL, 100.0, 120.0, interval_s=5.0, now=200.0).intervals
    assert iv.interval == [0, 2, 3]
    assert iv.t == [105.0, 115.0, 120.0]
    assert iv.output_tokens_per_s == pytest.approx([10.0, 10.0, 40.0])   # window 2: 100 tokens over 10 s
    stalled = obs.read_window(store, V, SEL, 115.0, 125.0, interval_s=5.0, now=200.0).intervals
    assert stalled.interval == [0, 1] and stalled.output_tokens_per_s == pytest.approx([40.0, 0.0])
# --- the direct source: an engine's own /metrics -------------------------------------------------

R = metric_names("reference")


def test_parse_exposition_reads_the_reference_engines_counters_and_per_token_buckets():
    from lookahead_canary.metrics import EngineMetrics

    em = EngineMetrics("m", info={"method": "jacobi", "ngram": "3"})
    em.observe_generated(5)
    em.observe_tokens(0.03, 2)      # two tokens, 15 ms each
    em.observe_tokens(0.2, 1)       # one token after 200 ms
    em.observe_spec(6, 2)
    values, buckets = obs.parse_exposition(em.render()[0].decode(), R.per_token_latency)
    assert values[R.generation_tokens] == 5
    assert values[f"{R.per_token_latency}_count"] == 3
    assert values[f"{R.per_token_latency}_sum"] == pytest.approx(0.23)
    assert values[R.draft_tokens] == 6 and values[R.accepted_tokens] == 2 and values[R.drafts] == 1
    assert not any(k.endswith("_bucket") for k in values)
    assert buckets[0.015] == 2 and buckets[0.2] == 3 and buckets[math.inf] == 3 and buckets[0.01] == 0
    from lookahead_operator.measurement.acceptance import position_key
    assert [values[position_key(R.accepted_per_position, k)] for k in (0, 1)] == [1, 1]


def test_increments_between_two_reads_and_a_restart_in_between():
    a = obs.EngineScrape(10.0, {R.generation_tokens: 100.0, "x": 5.0}, {0.1: 4.0, math.inf: 6.0})
    b = obs.EngineScrape(12.5, {R.generation_tokens: 130.0, "x": 2.0}, {0.1: 9.0, math.inf: 12.0})
    inc = obs.increments_between(a, b)
    assert inc.seconds == 2.5 and inc.counters[R.generation_tokens] == 30.0
    assert inc.counters["x"] == 2.0, "a counter that went down restarted: its new value is all new"
    assert inc.buckets == {0.1: 5.0, math.inf: 6.0}
    assert obs.role_sample(inc, R).tokens_per_s == pytest.approx(12.0)
    with pytest.raises(ValueError):
        obs.increments_between(b, a)


def test_role_sample_never_reads_missing_as_zero():
    idle = obs.Increments(0.0, 2.0, {R.generation_tokens: 0.0, f"{R.per_token_latency}_sum": 0.0,
                                     f"{R.per_token_latency}_count": 0.0})
    s = obs.role_sample(idle, R)
    assert s.tokens_per_s == 0.0, "read and nothing generated: a stall"
    assert s.per_token_latency_s is None, "no token observed: no latency, not 0"
    unread = obs.role_sample(obs.Increments(0.0, 2.0, {}), R)
    assert unread.tokens_per_s is None and unread.per_token_latency_s is None
