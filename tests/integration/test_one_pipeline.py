"""One measurement pipeline (issue 11, item 5): `kubectl lookahead analyze` and the operator turn
the same engine run into the same verdicts; only the source of the counters differs.

Two reference engines on the roofline simulator (a memory-bound GPU: Jacobi lookahead wins at
batch 1 and loses at batch 16) run as processes, both scraped every second by the session's
Prometheus under the labels the operator's queries select on (`measure.role_labels`). At each
batch size both engines are driven at once by the project's load generator (`loadgen.send_request`
workers in a closed loop) -- the operator's way of measuring. While the load runs, the test reads
each engine's own `/metrics` at interval bounds every INTERVAL_S seconds: the direct source
(`observations.scrape_engine` + `increments_between`, what `analyze` does around its rounds).
For the same bounds it asks Prometheus (`observations.prometheus_increments`, what the operator's
`measure.batch_verdict` does through `observe`). Both go through `observations.paired_sample` and
`measure.paired_verdict`; the verdicts must be the same per batch size and metric, and the
paired samples must agree within the tolerance below.

Why the two sources differ at all, and the tolerance: Prometheus only knows the counters at its
scrape times. For an inner bound t it takes the last sample at or before t, up to one scrape
interval (1 s) before the direct read, and for the last bound the first sample after it; its
interval runs between those sample times (and its seconds are theirs), so each Prometheus
interval is the direct one shifted by less than a scrape interval (the last one also stretched
by up to one). Not PromQL's ``increase()``, which would add its extrapolation to the window edges
on top; the counts are exact for what they cover (test_observations.py checks them against the
engines). What is left is the load's own variation between two windows that share at least 5/6
of their time (INTERVAL_S = 6 s, a multiple of the 1 s scrape interval, so the shift is the same
for every inner bound; with 3 s windows, sharing 2/3, batch 16's throughput at its first window
strayed past the bound below in about 1 run of 4): the simulated engines' per-token latency is steady (3% noise), their
throughput dips at request boundaries (prefill, the closed loop refilling). Measured on two
cores: per-token latency within ~4% and throughput within ~15% per interval and role, the
canary/control ratio of a pair (what the statistics read) within ~10%. The bounds below are
2-3x that. The verdicts rest on effects of about -52% (latency at batch 1) and -47% (throughput
at batch 16), far beyond both the thresholds and that disagreement.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import pytest

from lookahead_canary import loadgen
from lookahead_canary.loadgen import Prompt
from lookahead_operator.measurement import measure
from lookahead_operator.measurement import prometheus as observations
from lookahead_operator.cli.analyze import EngineProcess
from lookahead_operator.engines import metric_names
from lookahead_operator.measurement.stats import Thresholds

pytestmark = pytest.mark.integration

M = metric_names("reference")
POLICY = ("pipeline-it", "one-pipeline")
SOURCE = "one-pipeline"
# A100 + Llama-3-8B roofline, as tests/e2e/helpers.py: lookahead cuts per-token latency at
# batch 1 (memory-bound) and costs throughput at batch 16 (compute-bound)
GOOD_GPU = {"gpu": "a100-80gb", "model": "llama-3-8b", "acceptance": 0.6, "noise_sigma": 0.03, "time_scale": 3}
JACOBI = {"method": "jacobi", "window": 7, "ngram": 5, "guess_set": 7}
BATCH_SIZES = (1, 16)
EXPECTED = {1: "Wins", 16: "Regresses"}
INTERVAL_S = 6.0
INTERVALS = 6
TH = measure.family_split(Thresholds(min_latency_improvement=0.05, max_throughput_regression=0.02,
                                     confidence=0.95, min_samples=INTERVALS), len(BATCH_SIZES))
# per interval and role, |log(prometheus / direct)|; per pair, of the canary/control ratio (docstring)
LATENCY_TOL = math.log(1.15)
THROUGHPUT_TOL = math.log(1.40)
RATIO_TOL = math.log(1.40)
# different lengths, so that the c sequences of a batch do not all start and end in lockstep
PROMPTS = [
    Prompt(prompt="def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", max_tokens=24),
    Prompt(prompt="# reverse a list in Python\ndef reverse(xs):\n", max_tokens=17),
    Prompt(prompt="class Stack:\n    def __init__(self):\n", max_tokens=31),
    Prompt(prompt="import json\n\ndef load(path):\n", max_tokens=20),
    Prompt(prompt="def is_prime(n: int) -> bool:\n", max_tokens=27),
]


def labels(role: str) -> dict[str, str]:
    return measure.role_labels(POLICY, role)


def wait_until(check, timeout: float, what: str, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def engines(prometheus, tmp_path_factory):
    d = tmp_path_factory.mktemp("one-pipeline")
    common = dict(backend="simulate", sim_config=json.dumps(GOOD_GPU), max_num_seqs=32)
    procs = {"control": EngineProcess("control", log_path=d / "control.log", **common),
             "canary": EngineProcess("canary", speculative_config=json.dumps(JACOBI), log_path=d / "canary.log",
                                     **common)}
    try:
        for p in procs.values():
            p.start()
        for p in procs.values():
            p.wait_ready(60)
        prometheus.set_targets([{"address": f"127.0.0.1:{p.port}", "labels": labels(role)}
                                for role, p in procs.items()], source=SOURCE)
        now = time.time()
        for role, p in procs.items():
            prometheus.wait_target_up(f"127.0.0.1:{p.port}", timeout=30)
            observations.wait_scraped(prometheus.url, M, labels(role), after=now, timeout=30)
        yield procs
    finally:
        for p in procs.values():
            p.stop()
        prometheus.set_targets([], source=SOURCE)


async def _drive(urls: dict[str, str], c: int, prom_url: str) -> dict[str, list[observations.EngineScrape]]:
    """Both engines under a closed loop of ``c`` requests at once; the engines' /metrics read at
    INTERVALS + 1 bounds while it runs, and the load kept on until Prometheus has scraped both past
    the last bound (so that its end sample is taken under the same load)."""
    stop = asyncio.Event()
    errors: list[str] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=10.0),
                                 limits=httpx.Limits(max_connections=4 * c + 4)) as client:
        models = {role: await loadgen.discover_model(client, url) for role, url in urls.items()}

        async def worker(role: str, w: int) -> None:
            n = 0
            while not stop.is_set():
                r = await loadgen.send_request(client, urls[role], models[role], PROMPTS[(w + n) % len(PROMPTS)], c, n)
                if not r.ok:
                    errors.append(f"{role}: {r.error}")
                n += 1

        tasks = [asyncio.ensure_future(worker(role, w)) for role in urls for w in range(c)]
        try:
            # the closed loop is full on both engines (a condition, read from their own gauges)
            def full() -> bool:
                return all(observations.scrape_engine(u, M).values.get(M.running, 0) >= c for u in urls.values())
            await asyncio.to_thread(wait_until, full, 30, f"both engines running {c} requests")
            snaps: dict[str, list[observations.EngineScrape]] = {role: [] for role in urls}
            t_next = time.time()
            for _ in range(INTERVALS + 1):
                await asyncio.sleep(max(0.0, t_next - time.time()))   # the sampling cadence itself
                read = await asyncio.gather(*(asyncio.to_thread(observations.scrape_engine, u, M)
                                              for u in urls.values()))
                for role, snap in zip(urls, read):
                    snaps[role].append(snap)
                t_next += INTERVAL_S
            for role in urls:
                await asyncio.to_thread(observations.wait_scraped, prom_url, M, labels(role), snaps[role][-1].t, 30.0)
        finally:
            stop.set()
            done, pending = await asyncio.wait(tasks, timeout=30)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert not errors, errors[:3]
    return snaps


@pytest.fixture(scope="module")
def run(engines, prometheus):
    """Per batch size: each role's increments from both sources over the same bounds."""
    urls = {role: p.url for role, p in engines.items()}
    out = {}
    for c in BATCH_SIZES:
        snaps = asyncio.run(_drive(urls, c, prometheus.url))
        out[c] = {
            "bounds": {role: [x.t for x in s] for role, s in snaps.items()},
            "direct": {role: [observations.increments_between(a, b) for a, b in zip(s, s[1:])]
                       for role, s in snaps.items()},
            "prometheus": {role: observations.prometheus_increments(prometheus.url, M, labels(role),
                                                                    [x.t for x in s], buckets=True)
                           for role, s in snaps.items()},
        }
    out["prometheus_url"] = prometheus.url
    return out


def run_prom_url(run) -> str:
    return run["prometheus_url"]


def _pairs(incs: dict[str, list]) -> list[observations.PairedSample]:
    return [observations.paired_sample(c, k, M) for c, k in zip(incs["control"], incs["canary"])]


def test_both_sources_give_the_same_verdicts(run):
    for c in BATCH_SIZES:
        verdicts = {src: measure.paired_verdict(c, _pairs(incs), TH, "reference") for src, incs in run[c].items()
                    if src in ("direct", "prometheus")}
        d, p = verdicts["direct"], verdicts["prometheus"]
        where = f"batch {c}"
        assert d.latency.verdict == p.latency.verdict, (where, d.latency, p.latency)
        assert d.throughput.verdict == p.throughput.verdict, (where, d.throughput, p.throughput)
        assert (d.tail is None) == (p.tail is None) and (d.tail is None or d.tail.verdict == p.tail.verdict), \
            (where, d.tail, p.tail)
        assert d.outcome(TH) == p.outcome(TH), where
        # and they are the simulated hardware's answer, not an agreement on nothing
        assert d.outcome(TH).value == EXPECTED[c], (where, d.latency, d.throughput)
        assert d.latency.n_control == p.latency.n_control == INTERVALS, where
        assert d.acceptance_rate == pytest.approx(p.acceptance_rate, rel=0.1) and 0 < d.acceptance_rate < 1


def test_the_paired_samples_agree_within_the_scrape_offset(run):
    for c in BATCH_SIZES:
        direct, prom = _pairs(run[c]["direct"]), _pairs(run[c]["prometheus"])
        assert all(inc is not None for incs in run[c]["prometheus"].values() for inc in incs), \
            "every interval is longer than the scrape interval: none merged"
        for i, (a, b) in enumerate(zip(direct, prom)):
            where = f"batch {c} interval {i}"
            for role in ("control", "canary"):
                x, y = getattr(a, role), getattr(b, role)
                assert abs(math.log(y.per_token_latency_s / x.per_token_latency_s)) < LATENCY_TOL, (where, role, x, y)
                assert abs(math.log(y.tokens_per_s / x.tokens_per_s)) < THROUGHPUT_TOL, (where, role, x, y)
                # Prometheus' interval is the direct one shifted by at most a scrape interval at each end
                assert abs(y.seconds - x.seconds) <= 2.0 + 0.2, (where, role, x.seconds, y.seconds)
            for metric in ("per_token_latency_s", "tokens_per_s"):
                ra = getattr(a.canary, metric) / getattr(a.control, metric)
                rb = getattr(b.canary, metric) / getattr(b.control, metric)
                assert abs(math.log(rb / ra)) < RATIO_TOL, (where, metric, ra, rb)



def test_live_modes_reads_agree_with_the_engines_own(run):
    """What live mode reads besides the counters (measurement/live.py): each window's mean running
    requests from the gauge (``gauge_series_means``, one per engine: a closed loop of c keeps about c
    in flight), the windows' counters summed into one (``merged``, the abort's window),
    the request rate over a span (``counter_rate``, the strata's anchor) and each window's mean
    time to first token (the TTFT histogram's _sum over _count), against the engines' own reads."""
    for c in BATCH_SIZES:
        for role in ("control", "canary"):
            bounds = run[c]["bounds"][role]
            where = f"batch {c} {role}"
            means = observations.gauge_series_means(run_prom_url(run), M.running, labels(role), bounds)
            # (a closed loop is briefly short of c while a finished request is replaced: a scrape at
            # that moment reads c - 1, so at batch 1 one window of 1 s scrapes read 0.67)
            assert len(means) == INTERVALS and all(len(m) == 1 and 0.5 * c <= m[0] <= c + 1e-9 for m in means), \
                (where, means)
            assert sum(m[0] for m in means) / INTERVALS >= 0.8 * c, (where, means)
            whole = observations.merged(run[c]["prometheus"][role])
            assert whole.start == run[c]["prometheus"][role][0].start and whole.end == run[c]["prometheus"][role][-1].end
            assert whole.get(M.generation_tokens) == pytest.approx(
                sum(i.get(M.generation_tokens) for i in run[c]["prometheus"][role]))
            direct = run[c]["direct"][role]
            started = sum(inc.get(f"{M.ttft}_count") for inc in direct)
            rate = observations.counter_rate(run_prom_url(run), f"{M.ttft}_count", labels(role), bounds[0], bounds[-1])
            assert rate == pytest.approx(started / (bounds[-1] - bounds[0]), rel=0.35), (where, rate, started)
            for a, b in zip(direct, run[c]["prometheus"][role]):
                x, y = observations.role_sample(a, M).ttft_s, observations.role_sample(b, M).ttft_s
                if x is not None and y is not None:
                    assert abs(math.log(y / x)) < 0.5, (where, x, y)
