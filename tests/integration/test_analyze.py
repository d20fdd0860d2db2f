"""`kubectl-lookahead analyze` end to end: real engine processes (simulator backend, so the effect
is known and the run is fast), the real load generator, statistics and decision, and the report
files on disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROMPTS = [
    {"prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "max_tokens": 24},
    {"prompt": "# reverse a list in Python\ndef reverse(xs):\n", "max_tokens": 24},
    {"prompt": "class Stack:\n    def __init__(self):\n", "max_tokens": 24},
]


def test_analyze_end_to_end_on_the_simulator(tmp_path: Path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "report"
    t0 = time.monotonic()
    # Not the defaults: those (SmolLM2, batch sizes 1 and 8, a 285 s limit) are `make demo`, which
    # takes about 3 minutes on 2 cores and is run as a new user would, not in `make test` (its
    # settings on a simulated engine: test_the_demo_settings_decide_...). Here the
    # simulator backend, two batch sizes and a 40 s budget with 3 s rounds run the same pipeline
    # (rounds, pairs, decision, report) in under 90 s; --interval only sets the load generator's
    # own records.
    proc = subprocess.run(
        [sys.executable, "-m", "lookahead_operator.cli.main", "analyze", "--backend", "simulate",
         "--prompts", str(prompts), "--batch-sizes", "1,16", "--budget", "40s", "--round", "3s",
         "--interval", "1s", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wall < 90, f"analyze took {wall:.0f} s"

    # --json: the report object is the last line of stdout
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["decision"] == data["decision"]

    for name in ("report.html", "report.json", "per_token_latency.png", "throughput.png"):
        f = out / name
        assert f.is_file() and f.stat().st_size > 1000, name
    assert (out / "per_token_latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "Decision:" in html

    rows = data["batches"]
    measured = [r["batchSize"] for r in rows]
    # batch 16 is skipped only when batch 1 already decided (Rollback)
    assert measured == [1, 16] or (measured == [1] and data["decision"]["action"] == "Rollback"), measured
    assert sorted(measured + data["notMeasured"]) == [1, 16]
    for r in rows:
        assert r["verdict"] in ("Wins", "Regresses", "NoGain", "Pending")
        for role in ("control", "canary"):
            s = r[role]
            assert s["requests"] > 0 and s["errors"] == 0
            assert s["perTokenMs"] > 0 and s["tokensPerSecond"] > 0
            # the engine's own count of generated tokens equals the client's usage count (requests
            # cancelled at the time budget count on the engine's side only)
            if s["cancelled"] == 0:
                assert s["serverGeneratedTokens"] == s["outputTokens"]
            else:
                assert s["serverGeneratedTokens"] >= s["outputTokens"]
        # one control/canary pair per round (rounds whose requests produced fewer than two tokens
        # have no latency and are left out)
        assert r["latency"]["paired"] and r["throughput"]["paired"]
        assert 0 < r["latency"]["n_control"] == r["latency"]["n_canary"] <= r["rounds"]
        assert 0.0 <= r["acceptanceRate"] <= 1.0          # the canary speculates
        assert r["control"]["acceptanceRate"] is None     # the control does not
    # the simulated GPU is memory-bound at batch 1: lookahead cuts per-token latency there
    assert rows[0]["canaryTpotMs"] < rows[0]["controlTpotMs"]

    d = data["decision"]
    assert d["action"] in ("Promote", "PromoteRegimeAware", "Rollback", "Inconclusive")
    assert d["reason"]
    assert set(d["outcomes"]) == {str(b) for b in measured}
    # the human-readable output carries the table and the decision too
    assert "decision:" in proc.stderr and "batch" in proc.stderr


def test_analyze_rejects_bad_input(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "lookahead_operator.cli.main", "analyze", "--backend", "simulate",
                           "--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "missing.jsonl" in proc.stdout + proc.stderr


# The demo's question on a known answer (issue 25): the simulated engine's per-token latency at
# batch 1 is about the reference engine's on 2 cores (95 ms), lookahead cuts it by about 15% there
# and loses throughput at batch 8, and the machine's speed drifts (a lognormal factor per 3 s per
# engine, independent in the two engines, so pairs do not cancel it as they cancel a shared
# drift): the per-round log-ratio's standard deviation this gives (0.054 in a run here) is at or
# above what the demo measured on the real engines (0.038-0.051 quiet, 0.028-0.030 beside a
# burner: docs/analyze.md, "Round-to-round variance"). Everything else is the demo's defaults:
# batch sizes, prompts, rounds, thresholds, confidence and the time limit.
DEMO_LIKE_SIM = {"gpu": "cpu-2core", "model": "smollm2-135m", "acceptance": 0.16, "context_tokens": 300,
                 "time_scale": 1.42, "drift_sigma": 0.07, "drift_period_s": 3.0, "seed": 7}


@pytest.mark.parametrize("machine", ["quiet", "burner"])
def test_the_demo_settings_decide_a_15_percent_effect_within_the_time_limit(tmp_path: Path, machine: str):
    from lookahead_operator.cli.analyze import DEFAULT_TIME_LIMIT_S

    burner = None
    if machine == "burner":
        # a process that keeps one core busy for the whole run, as a build or a test beside it would
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "lookahead_operator.cli.main", "analyze", "--backend", "simulate",
             "--sim-config", json.dumps(DEMO_LIKE_SIM), "--out", str(tmp_path), "--json"],
            capture_output=True, text=True, timeout=DEFAULT_TIME_LIMIT_S + 60)
        wall = time.monotonic() - t0
    finally:
        if burner is not None:
            burner.kill()
            burner.wait(10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = {r["batchSize"]: r for r in data["batches"]}
    print(json.dumps({c: {k: r[k] for k in ("verdict", "rounds", "tpotChange", "latencyLogRatioSd", "throughputChange")}
                      for c, r in rows.items()}), data["wallSeconds"], wall)
    assert data["wallSeconds"] <= DEFAULT_TIME_LIMIT_S and wall <= DEFAULT_TIME_LIMIT_S + 15, (wall, data["wallSeconds"])
    # the effect is the simulated one, and the noise at least what the real engines showed
    assert -0.22 < rows[1]["tpotChange"] < -0.08, rows[1]["tpotChange"]
    # (six rounds estimate a standard deviation only roughly, about +-30%: 0.032 was seen beside a
    # burner and the other pytest worker for a config measured at 0.054; this checks that the
    # noise is there and of the real engines' order, not its exact level)
    assert rows[1]["latencyLogRatioSd"] >= 0.015, rows[1]["latencyLogRatioSd"]
    # decided: lookahead wins at batch 1 and loses at batch 8, so it is kept below 8
    assert rows[1]["verdict"] == "Wins", proc.stderr[-3000:]
    assert rows[8]["verdict"] == "Regresses", proc.stderr[-3000:]
    assert data["decision"]["action"] == "PromoteRegimeAware" and data["crossoverBatchSize"] == 8
