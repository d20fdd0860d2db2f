"""The production-traffic generator's pure parts: schedule and mix parsing, the rate, the arrivals
(thinning), weighted choice, and the record reader. The generator against a real engine is in
tests/integration/test_traffic.py."""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from pathlib import Path

import pytest

from lookahead_dev.traffic import (TrafficArgumentError, TrafficRecord, arrival_times, choose, expected_count,
                                   format_failures, iter_arrivals, load_mix, parse_mix, parse_schedule,
                                   parse_share, rate_at)


# -- schedule ----------------------------------------------------------------------------------
def test_parse_schedule_points_and_steps():
    assert parse_schedule("0:0.5,60:2,60:4") == [(0.0, 0.5), (60.0, 2.0), (60.0, 4.0)]
    assert parse_schedule(" 0 : 1 , 10:3 ") == [(0.0, 1.0), (10.0, 3.0)]
    assert parse_schedule("5:2") == [(5.0, 2.0)]


@pytest.mark.parametrize("text, piece", [
    ("0:1,5x", "'5x'"),            # no colon
    ("0:1,10:a", "'a'"),           # rate not a number
    ("0:-1", "'-1'"),              # negative rate
    ("-5:1", "'-5'"),              # negative time
    ("0:nan", "'nan'"),
    ("0:inf", "'inf'"),
    ("10:1,5:2", "'5:2'"),         # goes back in time
    ("0:1,,5:2", "''"),            # empty piece
])
def test_parse_schedule_rejects_bad_pieces_naming_them(text, piece):
    with pytest.raises(TrafficArgumentError) as err:
        parse_schedule(text)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert msg.startswith("--schedule: ") and piece in msg and "\n" not in msg


def test_parse_schedule_rejects_empty():
    with pytest.raises(ValueError, match="^--schedule: empty"):
        parse_schedule("  ")


# -- rate ---------------------------------------------------------------------------------------
def test_rate_ramps_linearly_between_points():
    s = parse_schedule("0:0,10:10,20:0")
    assert [rate_at(s, t) for t in (0, 2.5, 5, 10, 15, 20)] == pytest.approx([0, 2.5, 5, 10, 5, 0])


def test_rate_steps_at_two_points_with_the_same_time():
    s = parse_schedule("0:1,5:1,5:3")
    assert rate_at(s, 4.999) == pytest.approx(1)
    assert rate_at(s, 5) == 3          # right-continuous: the step has happened at t=5
    assert rate_at(s, 7) == 3


def test_rate_holds_before_the_first_and_after_the_last_point():
    s = parse_schedule("5:2,10:4")
    assert rate_at(s, 0) == 2 and rate_at(s, 7.5) == pytest.approx(3)
    assert rate_at(s, 10) == 4 and rate_at(s, 1e6) == 4


def test_expected_count_is_the_integral_of_the_rate():
    assert expected_count(parse_schedule("0:0,100:10"), 100) == pytest.approx(500)
    assert expected_count(parse_schedule("0:0,100:10"), 150) == pytest.approx(1000)      # holds 10/s
    assert expected_count(parse_schedule("0:1,50:1,50:9"), 100) == pytest.approx(500)
    assert expected_count(parse_schedule("10:2"), 20) == pytest.approx(40)


# -- arrivals -----------------------------------------------------------------------------------
def test_same_seed_same_arrivals_and_another_seed_others():
    s = parse_schedule("0:0.5,30:4,30:1")
    a = arrival_times(s, 60, seed=11)
    assert a == arrival_times(s, 60, seed=11) == arrival_times(s, 60, random.Random(11))
    assert a != arrival_times(s, 60, seed=12)
    assert a == sorted(a) and all(0 <= t < 60 for t in a)


@pytest.mark.parametrize("schedule", ["0:0,100:10", "0:1,50:1,50:9", "0:10,100:0"])
def test_mean_count_matches_the_integral(schedule):
    # 40 runs of ~500 arrivals: the mean's standard error is ~3.5, the tolerance 15 (~4 sigma).
    # Accepting every candidate (no thinning) gives ~1000; the rate at a segment's start, 0 or 1000.
    s = parse_schedule(schedule)
    counts = [len(arrival_times(s, 100, seed)) for seed in range(40)]
    assert statistics.fmean(counts) == pytest.approx(expected_count(s, 100), abs=15)


def test_counts_are_poisson_not_evenly_spaced():
    # variance = mean for a Poisson count; a fixed spacing (or a lattice) would give ~0
    counts = [len(arrival_times([(0.0, 5.0)], 10, seed)) for seed in range(300)]
    assert statistics.fmean(counts) == pytest.approx(50, abs=2)
    assert 35 < statistics.variance(counts) < 68


def test_a_step_changes_the_local_rate():
    s = parse_schedule("0:1,20:1,20:10")
    before = after = just_after = 0
    runs = 30
    for seed in range(runs):
        ts = arrival_times(s, 40, seed)
        before += sum(t < 20 for t in ts)
        after += sum(t >= 20 for t in ts)
        just_after += sum(20 <= t < 22 for t in ts)
    assert before / runs == pytest.approx(20, abs=3)
    assert after / runs == pytest.approx(200, abs=12)
    assert just_after / runs == pytest.approx(20, abs=3)   # the new rate from the step on, not ramped to


def test_arrivals_end_when_the_last_rate_is_zero():
    ts = list(iter_arrivals(parse_schedule("0:2,5:2,5:0"), random.Random(1)))
    assert ts and max(ts) < 5


# -- mix ----------------------------------------------------------------------------------------
def test_parse_mix():
    assert parse_mix("chat=2,code=1,summarize=1") == {"chat": 2.0, "code": 1.0, "summarize": 1.0}
    assert parse_mix("chat=1, code=0") == {"chat": 1.0, "code": 0.0}


@pytest.mark.parametrize("text, piece", [("chat", "'chat'"), ("chat=x", "'x'"), ("=1", "'=1'"),
                                         ("chat=1,chat=2", "'chat'"), ("chat=0,code=0", "every weight is 0"),
                                         ("chat=-1", "'-1'")])
def test_parse_mix_rejects_bad_entries_naming_them(text, piece):
    with pytest.raises(TrafficArgumentError) as err:
        parse_mix(text)
    assert str(err.value).startswith("--mix: ") and piece in str(err.value) and "\n" not in str(err.value)


def test_load_mix_names_the_parameter_for_an_unknown_set():
    assert set(load_mix({"chat": 1, "code": 1})) == {"chat", "code"}
    with pytest.raises(TrafficArgumentError, match=r"^--mix: prompt set 'nope'"):
        load_mix({"nope": 1})


def test_choose_follows_the_weights():
    rng = random.Random(5)
    n = 20000
    got = Counter(choose({"chat": 2, "code": 1, "summarize": 1, "never": 0}, rng) for _ in range(n))
    assert got["never"] == 0
    assert got["chat"] / n == pytest.approx(0.5, abs=0.02)
    assert got["code"] / n == pytest.approx(0.25, abs=0.02)
    assert got["summarize"] / n == pytest.approx(0.25, abs=0.02)


def test_parse_share():
    assert parse_share("0.5") == 0.5 and parse_share("0") == 0 and parse_share("1") == 1
    for bad in ("1.5", "x", "-0.1"):
        with pytest.raises(TrafficArgumentError, match="^--stream-share: "):
            parse_share(bad)


# -- the record ---------------------------------------------------------------------------------
def _line(id_: int, start: float, end: float, outcome: str, **kw) -> dict:
    ok = outcome == "ok"
    return {"id": id_, "scheduled_s": start - 1000, "set": "chat", "prompt": 0, "stream": kw.get("stream", True),
            "started_at": start, "ended_at": end, "outcome": outcome, "status": kw.get("status", 200 if ok else None),
            "ok": ok, "error": kw.get("error"), "ttft_s": kw.get("ttft_s"), "per_token_s": None,
            "completion_tokens": 10 if ok else None, "e2e_s": end - start}


def test_record_summary_over_a_window(tmp_path: Path):
    lines = [
        _line(0, 1000.0, 1002.0, "ok", ttft_s=0.1),
        _line(1, 1001.0, 1009.5, "failed", status=None, error="RemoteProtocolError: peer closed connection"),
        _line(2, 1010.0, 1011.0, "ok", ttft_s=0.3),
        _line(3, 1012.0, 1012.0, "not_sent", error="not sent: 128 requests in flight (--max-in-flight)"),
        _line(4, 1013.0, 1013.2, "failed", status=503, error="HTTP 503: draining", stream=False),
        _line(5, 1020.0, 1021.0, "ok", ttft_s=0.2),
    ]
    path = tmp_path / "traffic.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in lines)
    path.write_text(text + json.dumps(_line(6, 1030.0, 1031.0, "failed"))[:40])   # a line still being written
    rec = TrafficRecord(path)
    assert [r["id"] for r in rec.requests()] == [0, 1, 2, 3, 4, 5]

    whole = rec.summary()
    assert (whole.sent, whole.ok, whole.failed, whole.not_sent) == (5, 3, 2, 1)
    assert whole.ttft_median_s == pytest.approx(0.2)

    # [1005, 1012.5]: #1 was in flight (started before, failed inside), #2 inside, #3 not sent inside
    w = rec.summary(since=1005.0, until=1012.5)
    assert (w.sent, w.ok, w.failed, w.not_sent) == (2, 1, 1, 1)
    assert [r["id"] for r in w.failures] == [1] and [r["id"] for r in w.unsent] == [3]
    assert [r["id"] for r in rec.requests(since=1013.1)] == [4, 5]
    assert [r["id"] for r in rec.requests(until=1000.5)] == [0]

    msg = format_failures(rec.summary(since=1005.0, until=1015.0))
    assert msg.splitlines()[0] == "production traffic: sent 3, ok 1, failed 2, not sent 1; median TTFT 300 ms"
    assert "#1 " in msg and "RemoteProtocolError: peer closed connection" in msg
    assert "#4 " in msg and "status=503: HTTP 503: draining" in msg and "#3 " in msg and "--max-in-flight" in msg
    assert len(format_failures(whole, limit=1).splitlines()) == 3          # counts, one, "... and 2 more"


def test_record_of_a_generator_not_started_yet_is_empty(tmp_path: Path):
    s = TrafficRecord(tmp_path / "missing.jsonl").summary()
    assert (s.sent, s.ok, s.failed, s.not_sent, s.ttft_median_s) == (0, 0, 0, 0, None)
