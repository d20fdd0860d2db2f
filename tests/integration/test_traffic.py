"""The production-traffic generator (``python -m lookahead_dev.traffic``) as a real process against
a real reference engine (``python -m lookahead_canary.server --backend simulate``) on a free
loopback port: the record of a ramp, an engine killed under traffic, a test process killed
outright, and bad arguments. Every wait is on a condition, with a deadline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lookahead_canary import process
from lookahead_dev.traffic import (ProductionTraffic, arrival_times, expected_count, format_failures,
                                   parse_schedule)

from .helpers import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    """A simulated reference engine in its own session (so SIGKILL takes the whole group)."""

    def __init__(self, log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = process.start([sys.executable, "-m", "lookahead_canary.server", "--backend", "simulate",
                                   "--host", "127.0.0.1", "--port", str(self.port)], log,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO)

    def wait_ready(self) -> "Engine":
        def healthy() -> bool:
            assert self.proc.poll() is None, f"engine exited:\n{self.log.read_text()}"
            try:
                return httpx.get(f"{self.url}/health", timeout=2, trust_env=False).status_code == 200
            except httpx.TransportError:
                return False
        wait_until(healthy, 30, "the engine's /health", interval=0.1)
        return self

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        process.stop(self.proc, timeout=10)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(tmp_path / "engine.log")
    try:
        yield e.wait_ready()
    finally:
        e.stop()


def test_a_ramp_is_served_and_recorded(engine: Engine, tmp_path: Path):
    schedule, duration, seed = "0:1,8:4", 8.0, 7
    traffic = ProductionTraffic(engine.url, schedule=schedule, duration=duration, seed=seed, stream_share=0.5,
                                timeout=20, out=tmp_path / "traffic.jsonl")
    try:
        traffic.start()
        assert traffic.wait(duration + 30) == 0, traffic.log.read_text()
    finally:
        traffic.stop()
    reqs = traffic.record.requests()
    s = traffic.record.summary()
    assert (s.failed, s.not_sent) == (0, 0), traffic.log.read_text()

    # the arrivals are the schedule's, for the seed: the same ids and times, each sent on time
    expected = arrival_times(parse_schedule(schedule), duration, seed)
    assert abs(len(expected) - expected_count(parse_schedule(schedule), duration)) < 3 * 20 ** 0.5
    assert sorted(r["id"] for r in reqs) == list(range(len(expected)))
    assert [r["scheduled_s"] for r in sorted(reqs, key=lambda r: r["id"])] == [round(t, 6) for t in expected]
    starts = [r["started_at"] - r["scheduled_s"] for r in reqs]    # the run's start, as each request saw it
    assert max(starts) - min(starts) < 0.5, "requests not sent at their scheduled times (open loop)"

    assert all(r["ok"] and r["status"] == 200 and r["error"] is None for r in reqs)
    assert all(r["completion_tokens"] > 0 and r["e2e_s"] > 0 for r in reqs)
    streamed = [r for r in reqs if r["stream"]]
    plain = [r for r in reqs if not r["stream"]]
    assert streamed and plain
    assert all(r["ttft_s"] is not None and 0 < r["ttft_s"] < r["e2e_s"] and r["per_token_s"] > 0 for r in streamed)
    assert all(r["ttft_s"] is None for r in plain)
    assert {r["set"] for r in reqs} == {"chat", "code", "summarize"}
    assert f"sent {len(reqs)}, ok {len(reqs)}, failed 0, not sent 0; median TTFT" in traffic.log.read_text()


def test_an_engine_killed_under_traffic_shows_as_failures(engine: Engine, tmp_path: Path):
    traffic = ProductionTraffic(engine.url, schedule="0:5", seed=1, timeout=5, out=tmp_path / "traffic.jsonl")
    try:
        traffic.start()
        traffic.wait_requests(3, timeout=30, ok=True)
        killed_at = time.time()
        engine.kill()
        traffic.wait_requests(3, timeout=15, started_after=killed_at)
        t0 = time.monotonic()
        rc = traffic.stop()
        stop_s = time.monotonic() - t0
    finally:
        traffic.stop()
    assert rc == 0, traffic.log.read_text()
    assert stop_s < 5, f"the generator took {stop_s:.1f} s to stop"
    after = traffic.record.summary(since=killed_at)
    assert after.failed >= 3 and after.not_sent == 0
    assert all(r["error"] and not r["ok"] for r in after.failures)
    # in flight at the kill: a stream cut after its 200, or no response; sent after it: refused
    later = [r for r in traffic.record.requests() if r["started_at"] > killed_at]
    assert later and all(not r["ok"] and r["status"] is None and "ConnectError" in r["error"] for r in later)
    assert f"failed {traffic.record.summary().failed}," in traffic.log.read_text()


def test_the_generator_stops_when_its_test_process_is_killed(engine: Engine, tmp_path: Path):
    # a stand-in for a pytest process killed outright: it starts the traffic and is SIGKILLed
    out = tmp_path / "traffic.jsonl"
    code = (f"import sys, time\nfrom lookahead_dev.traffic import ProductionTraffic\n"
            f"t = ProductionTraffic({engine.url!r}, schedule='0:5', out={str(out)!r}).start()\n"
            f"print(t.popen.pid, flush=True)\nsys.stdin.read()\n")
    pid = None
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        traffic_log = out.with_suffix(".log")
        wait_until(lambda: out.exists() and out.read_text().count("\n") >= 1, 30, "a first request", interval=0.1)
        parent.kill()
        parent.wait(10)
        wait_until(lambda: not process.pid_alive(pid), 10, "the orphaned generator to exit", interval=0.1)
        assert "the parent process" in traffic_log.read_text()
    finally:
        parent.kill()
        parent.wait(10)
        if pid is not None:
            process.kill_process_group(pid, timeout=5)


def test_arrivals_over_the_cap_are_recorded_as_not_sent(engine: Engine, tmp_path: Path):
    traffic = ProductionTraffic(engine.url, schedule="0:10", duration=1.5, max_in_flight=1, seed=2,
                                out=tmp_path / "traffic.jsonl")
    try:
        assert traffic.start().wait(30) == 0, traffic.log.read_text()
    finally:
        traffic.stop()
    s = traffic.record.summary()
    assert s.ok >= 1 and s.failed == 0 and s.not_sent >= 3
    assert all(r["status"] is None and r["e2e_s"] is None and "--max-in-flight" in r["error"] for r in s.unsent)
    assert f"not sent {s.not_sent};" in format_failures(s)


def test_a_stop_right_after_the_start_exits_0(tmp_path: Path):
    # nothing listens on the port: the generator is still looking for the model when stopped
    traffic = ProductionTraffic(f"http://127.0.0.1:{_free_port()}", out=tmp_path / "traffic.jsonl").start()
    try:
        assert traffic.stop() == 0, traffic.log.read_text()
    finally:
        traffic.stop()
    assert traffic.record.requests() == []


def test_a_started_generator_is_not_started_twice(tmp_path: Path):
    # started, then kept for a ``with`` block (the e2e tests' pattern): one child, one record;
    # a second start() while it runs is refused, not a second stream of requests
    traffic = ProductionTraffic(f"http://127.0.0.1:{_free_port()}", out=tmp_path / "traffic.jsonl").start()
    try:
        first = traffic.popen
        with traffic:
            assert traffic.popen is first and traffic.running
            with pytest.raises(RuntimeError, match="already runs"):
                traffic.start()
            assert traffic.popen is first
        assert not traffic.running and first.returncode == 0
    finally:
        traffic.stop()


@pytest.mark.parametrize("args, says", [
    (["--schedule", "0:1,5x"], "--schedule: bad point '5x'"),
    (["--mix", "chat=1,nope=1"], "--mix: prompt set 'nope'"),
    (["--stream-share", "2"], "--stream-share: bad share '2'"),
])
def test_bad_arguments_print_one_line_and_exit_2(args, says, tmp_path: Path):
    p = subprocess.run([sys.executable, "-m", "lookahead_dev.traffic", "--url", "http://127.0.0.1:9",
                        "--out", str(tmp_path / "t.jsonl"), *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and says in p.stderr and "Traceback" not in p.stderr
