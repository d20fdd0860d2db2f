"""Engine metrics: vLLM's names and labels, per-token inter-token latency, bucket choice."""

from __future__ import annotations

import re

import pytest

from prometheus_client.parser import text_string_to_metric_families

from lookahead_canary.metrics import (
    PER_TOKEN_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    VLLM_COUNTERS,
    VLLM_GAUGES,
    VLLM_HISTOGRAMS,
    VLLM_PER_TOKEN_BUCKETS,
    VLLM_REQUEST_LATENCY_BUCKETS,
    VLLM_TTFT_BUCKETS,
    EngineMetrics,
    FinishedRequest,
)


def samples(m: EngineMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render()[0].decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: EngineMetrics, name: str, **labels) -> float:
    want = {"model_name": "m", "engine": "0", **labels}
    for (n, lbl), v in samples(m).items():
        if n == name and dict(lbl) == want:
            return v
    raise KeyError(name)


def exposed_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_exposed_names_are_exactly_vllms_plus_info():
    m = EngineMetrics("m", info={"method": "jacobi", "window": "7"})
    names = exposed_names(m.render()[0].decode())
    expected = set(VLLM_COUNTERS) | set(VLLM_GAUGES) | {"lookahead_engine_info"}
    for h in VLLM_HISTOGRAMS:
        expected |= {h + "_bucket", h + "_sum", h + "_count"}
    assert names == expected
    assert "vllm:time_per_output_token_seconds_count" not in names  # removed upstream in 2026
    assert not any(n.endswith("_created") for n in names)


def test_every_series_has_model_name_and_engine_labels():
    m = EngineMetrics("m")
    for (name, labels), _ in samples(m).items():
        d = dict(labels)
        assert d.get("model_name") == "m" and d.get("engine") == "0", name


def test_info_metric_carries_config():
    m = EngineMetrics("m", info={"method": "jacobi", "window": "7", "ngram": "5",
                                 "guess_set": "7", "max_batch_size": "4"})
    assert value(m, "lookahead_engine_info", method="jacobi", window="7", ngram="5",
                 guess_set="7", max_batch_size="4") == 1.0


def test_buckets_are_supersets_of_vllms_and_fine_below_100ms():
    assert set(VLLM_PER_TOKEN_BUCKETS) <= set(PER_TOKEN_BUCKETS)
    assert set(VLLM_TTFT_BUCKETS) <= set(TTFT_BUCKETS)
    assert set(VLLM_REQUEST_LATENCY_BUCKETS) <= set(REQUEST_LATENCY_BUCKETS)
    fine = [b for b in PER_TOKEN_BUCKETS if 0.001 <= b <= 0.1]
    assert len(fine) >= 25
    # relative gaps: at most 50% of the upper bound below 10 ms, 25% from 10 to 100 ms
    for lo, hi in zip(fine, fine[1:]):
        assert (hi - lo) / hi <= 0.5, (lo, hi)
    for lo, hi in zip([b for b in fine if b >= 0.01], [b for b in fine if b >= 0.01][1:]):
        assert (hi - lo) / hi <= 0.25, (lo, hi)


def test_inter_token_latency_is_per_token():
    m = EngineMetrics("m")
    m.observe_tokens(0.030, 3)   # one step, three tokens, after 30 ms: 3 x 10 ms
    m.observe_tokens(0.020, 1)
    assert value(m, "vllm:inter_token_latency_seconds_count") == 4
    assert abs(value(m, "vllm:inter_token_latency_seconds_sum") - 0.050) < 1e-12
    assert value(m, "vllm:inter_token_latency_seconds_bucket", le="0.01") == 3
    assert value(m, "vllm:inter_token_latency_seconds_bucket", le="0.02") == 4


def test_spec_counters_follow_vllm_semantics():
    m = EngineMetrics("m")
    m.observe_spec(8, 3)
    m.observe_spec(8, 0)
    m.observe_spec(0, 0)  # a plain step is not a draft
    assert value(m, "vllm:spec_decode_num_drafts_total") == 2
    assert value(m, "vllm:spec_decode_num_draft_tokens_total") == 16
    assert value(m, "vllm:spec_decode_num_accepted_tokens_total") == 3


def test_finished_request_histograms_use_vllm_phase_definitions():
    m = EngineMetrics("m")
    m.observe_finished(FinishedRequest(arrival=10.0, scheduled=10.5, first_token=11.0,
                                       last_token=13.0, finished=13.0, prompt_tokens=7,
                                       generation_tokens=5, finish_reason="length"))
    assert value(m, "vllm:request_queue_time_seconds_sum") == 0.5
    assert value(m, "vllm:request_prefill_time_seconds_sum") == 0.5
    assert value(m, "vllm:request_decode_time_seconds_sum") == 2.0
    assert value(m, "vllm:e2e_request_latency_seconds_sum") == 3.0
    assert value(m, "vllm:request_time_per_output_token_seconds_sum") == 0.5  # 2 s / 4
    assert value(m, "vllm:request_success_total", finished_reason="length") == 1
    assert value(m, "vllm:request_success_total", finished_reason="stop") == 0


def test_load_gauges_and_kv_stand_in():
    m = EngineMetrics("m", max_num_seqs=4)
    m.set_load(running=3, waiting=2)
    assert value(m, "vllm:num_requests_running") == 3
    assert value(m, "vllm:num_requests_waiting") == 2
    assert value(m, "vllm:kv_cache_usage_perc") == 0.75


def test_accepted_per_position_follows_vllm():
    """vLLM's SpecDecodingStats.observe_draft: a draft with a tokens accepted adds one at positions
    0..a-1; the positions a configuration can accept exist (at 0) from the start."""
    m = EngineMetrics("m", info={"method": "jacobi", "window": "4", "ngram": "4", "guess_set": "2"})
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [value(m, name, position=str(k)) for k in range(3)] == [0, 0, 0]   # ngram 4: 3 positions
    with pytest.raises(KeyError):
        value(m, name, position="3")
    m.observe_spec(6, 2)
    m.observe_spec(6, 0)
    m.observe_spec(6, 3)
    m.observe_spec(0, 0)          # a plain step: not a draft
    assert [value(m, name, position=str(k)) for k in range(3)] == [2, 2, 1]
    # sum over positions = accepted tokens; per position / drafts = per-position acceptance
    assert sum(value(m, name, position=str(k)) for k in range(3)) == value(
        m, "vllm:spec_decode_num_accepted_tokens_total")
    assert value(m, "vllm:spec_decode_num_drafts_total") == 3
    # a longer accepted draft than the configuration suggests (prompt-lookup seeding) adds positions
    m.observe_spec(24, 5)
    assert value(m, name, position="4") == 1 and value(m, name, position="0") == 3


def test_per_position_count_from_the_engine_config():
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    ngram = EngineMetrics("m", info={"method": "ngram", "num_speculative_tokens": "5"})
    assert value(ngram, name, position="4") == 0
    greedy = EngineMetrics("m", info={"method": "greedy"})
    assert value(greedy, name, position="0") == 0    # the family is there, as the other spec counters are
    with pytest.raises(KeyError):
        value(greedy, name, position="1")


def test_every_series_of_the_tables_is_a_typed_attribute():
    """EngineMetrics creates its plain series from the _HISTOGRAMS, _COUNTERS and _GAUGES tables;
    its class annotations name each with its type, so a series added to a table without one (or
    the other way round) is caught here."""
    import typing

    from prometheus_client import Counter, Gauge, Histogram

    from lookahead_canary import metrics

    declared = {**{a: Histogram for a, *_ in metrics._HISTOGRAMS}, **{a: Counter for a, *_ in metrics._COUNTERS},
                **{a: Gauge for a, *_ in metrics._GAUGES}}
    assert typing.get_type_hints(metrics.EngineMetrics) == declared
    em = metrics.EngineMetrics("m")
    assert all(hasattr(em, a) for a in declared)
