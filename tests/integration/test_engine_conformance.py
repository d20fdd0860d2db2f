"""Conformance with the real engines: every canary and control command line the adapters render
is fed to vLLM's and SGLang's own argument parsers, and every metric name we query is looked up in
their installed sources. The control is the fleet as it runs: its speculation (EAGLE-3 included)
parses exactly as the fleet's does.

The engines live in an isolated virtual environment made by ``hack/install-engine-venv.sh``
(``make deps``); without it these tests fail, naming the command that makes it (never skip).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lookahead_operator import engines

VENV = Path(os.environ.get("LOOKAHEAD_ENGINES_VENV")
            or Path(os.environ.get("LOOKAHEAD_CACHE", Path.home() / ".cache/lookahead-rollout")) / "engines-venv")
VPY = VENV / "bin" / "python"

if not VPY.exists():
    pytest.fail(f"no engines venv at {VENV}: run `bash hack/install-engine-venv.sh` (make deps does)", pytrace=False)

K = 4
METHODS = {m: {"method": m, "numSpeculativeTokens": K, "promptLookupMin": 2, "promptLookupMax": 5}
           for m in ("ngram", "ngram_gpu", "suffix")}
# the fleets below run other methods too: the canary may replace them
REPLACING = {m: {**spec, "replaceExisting": True} for m, spec in METHODS.items()}
EAGLE3 = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}

# --- harnesses run inside the engines venv ---------------------------------------------------

VLLM_HARNESS = r'''
import json, os, sys, logging
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
logging.disable(logging.WARNING)
import vllm
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.config import SpeculativeConfig
cases = json.load(sys.stdin)
out = {"version": vllm.__version__, "results": []}
for argv in cases:
    try:
        a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        if getattr(a, "model_tag", None):
            a.model = a.model_tag
        e = AsyncEngineArgs.from_cli_args(a)
        spec = e.speculative_config
        r = {"ok": True, "speculative_config": spec, "spec_method": e.spec_method, "spec_tokens": e.spec_tokens,
             "spec_model": e.spec_model, "max_num_seqs": e.max_num_seqs, "data_parallel_size": e.data_parallel_size}
        if spec and spec.get("method") in ("ngram", "ngram_gpu"):   # suffix needs arctic-inference to build
            sc = SpeculativeConfig(**spec)
            sched = sc.num_speculative_tokens_per_batch_size
            r["built"] = {"method": sc.method, "num_speculative_tokens": sc.num_speculative_tokens,
                          "prompt_lookup_min": sc.prompt_lookup_min, "prompt_lookup_max": sc.prompt_lookup_max,
                          "schedule": [list(x) for x in sched] if sched else None}
    except SystemExit as x:
        r = {"ok": False, "error": f"argparse exit {x.code}"}
    except Exception as x:
        r = {"ok": False, "error": f"{type(x).__name__}: {x}"}
    out["results"].append(r)
print("@@RESULT@@" + json.dumps(out, default=str))
'''

SGLANG_HARNESS = r'''
import json, sys, logging, contextlib, io
logging.disable(logging.WARNING)
import sglang
from sglang.srt.server_args import prepare_server_args
cases = json.load(sys.stdin)
out = {"version": sglang.__version__, "results": []}
for argv in cases:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(argv)
        r = {"ok": True}
        for k in ("speculative_algorithm", "speculative_num_draft_tokens", "enable_metrics", "max_running_requests",
                  "enable_mixed_chunk", "disable_overlap_schedule", "speculative_draft_model_path",
                  "speculative_num_steps", "speculative_eagle_topk", "speculative_ngram_max_bfs_breadth"):
            r[k] = getattr(sa, k, None)
    except SystemExit as x:
        r = {"ok": False, "error": f"argparse exit {x.code}: {err.getvalue()[-300:]}"}
    except Exception as x:
        r = {"ok": False, "error": f"{type(x).__name__}: {x}"}
    out["results"].append(r)
print("@@RESULT@@" + json.dumps(out, default=str))
'''


def run_harness(harness: str, cases: list[list[str]]) -> dict:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    # lookahead_canary sets HF_HUB_OFFLINE=1 in this process when imported (it never downloads);
    # under it vLLM's EngineArgs resolve a hub id to a local snapshot and fail for the example ids.
    # The parsers themselves read nothing from the hub (checked: without it they make no request).
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(key, None)
    res = subprocess.run([str(VPY), "-c", harness], input=json.dumps(cases), capture_output=True, text=True,
                         timeout=600, env=env, cwd="/")
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("@@RESULT@@")), None)
    assert line, f"harness failed (rc {res.returncode}):\n{res.stderr[-3000:]}"
    out = json.loads(line[len("@@RESULT@@"):])
    assert len(out["results"]) == len(cases)
    return out


# --- vLLM --------------------------------------------------------------------------------------

VLLM_FLEETS = {
    "plain": ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64"],
    "eagle3": ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64", "--speculative-config",
               json.dumps(EAGLE3, separators=(",", ":"))],
    "model-flag+json": ["--model", "m", "--max-num-seqs", "64", "--speculative-config",
                        '{"method":"eagle","model":"yuhuili/EAGLE3","num_speculative_tokens":3}'],
    "sc-ngram": ["m", "-sc", '{"method":"ngram","num_speculative_tokens":8,"prompt_lookup_max":3}'],
    "sc=": ["m", '-sc={"method":"ngram","num_speculative_tokens":2}', "--max_num_seqs=32"],
    "underscore": ["m", "--speculative_config", '{"method":"eagle","model":"d"}'],
    "dotted": ["m", "--speculative-config.method=ngram", "--speculative-config.num_speculative_tokens", "3",
               "--speculative_config.prompt_lookup_max=4"],
    "shorthands": ["m", "--spec-method", "ngram", "--spec-tokens", "3", "--max-num-seqs", "16"],
    "shorthands=": ["m", "--spec_method=ngram", "--spec-tokens=3"],
    "schedule": ["m", "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "3",
                 "--speculative-config.num_speculative_tokens_per_batch_size", "[[1,2,3]]"],
}


def _vllm_container(argv):
    return {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "command": ["vllm", "serve"], "args": list(argv)}


def _vllm_cases():
    cases = []   # (label, argv, expectation)
    for fleet, argv in VLLM_FLEETS.items():
        c = _vllm_container(argv)
        cases.append((f"{fleet}/fleet", argv, {"fleet": True}))
        cases.append((f"{fleet}/control", engines.render_control(c)["args"], {"control_of": f"{fleet}/fleet"}))
        for m, spec in REPLACING.items():
            for regime in (None, 8):
                out = engines.render_lookahead(c, spec, regime)["args"]
                cases.append((f"{fleet}/canary/{m}/regime={regime}", out, {"method": m, "regime": regime}))
    return cases


SHELL_SCRIPTS = [
    "vllm serve $MODEL --max-num-seqs 32 --port 8000 2>&1 | tee /dev/null",
    "set -e; exec vllm serve \"$MODEL\" \\\n  -sc '{\"method\":\"eagle\",\"model\":\"d\"}' \\\n"
    "  --spec-tokens 3 --port 8000 > /dev/null 2>&1 || true",
    "echo hi && VLLM_X=1 vllm serve ${MODEL} --speculative-config.method=ngram --speculative-config.num_speculative_tokens=2 "
    "--max_num_seqs=16 ; echo done",
]


def _standin(tmp: Path) -> Path:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("vllm",):
        p = bindir / name
        p.write_text(textwrap.dedent(f"""\
            #!{sys.executable}
            import json, os, sys
            open(os.environ["ARGV_LOG"], "a").write(json.dumps(sys.argv[1:]) + "\\n")
            """))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bindir


def _run_sh(script: str, tmp: Path) -> list[str]:
    log = tmp / "argv.log"
    if log.exists():
        log.unlink()
    env = {"PATH": f"{_standin(tmp)}:/usr/bin:/bin", "ARGV_LOG": str(log), "MODEL": "Qwen/Qwen3-8B"}
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True, timeout=60, capture_output=True)
    (argv,) = [json.loads(x) for x in log.read_text().splitlines()]
    assert argv[0] == "serve"
    return argv[1:]


def _check_vllm(label, r, exp, fleet_result=None):
    assert r["ok"], f"{label}: vLLM's parser refused it: {r['error']}"
    if exp.get("fleet"):
        return
    if exp.get("control_of"):      # the fleet as it runs: the same speculation, as vLLM parses it
        keys = ("speculative_config", "spec_method", "spec_tokens", "spec_model", "max_num_seqs")
        assert {k: r[k] for k in keys} == {k: fleet_result[k] for k in keys}, (label, r, fleet_result)
        return
    spec = r["speculative_config"]
    m = exp["method"]
    assert spec["method"] == m and spec["num_speculative_tokens"] == K, (label, spec)
    assert r["spec_method"] is None and r["spec_tokens"] is None and "model" not in spec, (label, r)
    if m != "suffix":
        assert (spec["prompt_lookup_min"], spec["prompt_lookup_max"]) == (2, 5), (label, spec)
        b = r["built"]
        assert (b["method"], b["num_speculative_tokens"], b["prompt_lookup_min"], b["prompt_lookup_max"]) == (m, K, 2, 5)
    maxseqs = r["max_num_seqs"] or engines.VLLM_DEFAULT_MAX_BATCH
    want_sched = [[1, 8, K], [9, maxseqs, 0]] if exp["regime"] else None
    assert spec.get("num_speculative_tokens_per_batch_size") == want_sched, (label, spec)
    if m != "suffix":
        assert r["built"]["schedule"] == want_sched, (label, r["built"])


def test_vllm_parser_accepts_every_rendered_command_line(tmp_path):
    cases = _vllm_cases()
    for n, script in enumerate(SHELL_SCRIPTS):
        c = {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "command": ["/bin/sh", "-c", script]}
        cases.append((f"shell{n}/fleet", _run_sh(script, tmp_path), {"fleet": True}))
        cases.append((f"shell{n}/control", _run_sh(engines.render_control(c)["command"][2], tmp_path),
                      {"control_of": f"shell{n}/fleet"}))
        for regime in (None, 8):
            s = engines.render_lookahead(c, REPLACING["ngram"], regime)["command"][2]
            cases.append((f"shell{n}/canary/regime={regime}", _run_sh(s, tmp_path), {"method": "ngram", "regime": regime}))
    # negative controls: the real parser and config do refuse what the issue says they refuse
    neg = [["m", "--speculative-config", '{"method":"ngram","num_speculative_tokens":4,"disable_by_batch_size":4}'],
           ["m", "--no-such-flag", "1"]]
    out = run_harness(VLLM_HARNESS, [argv for _, argv, _ in cases] + neg)
    assert out["version"] == "0.33.0"
    results = out["results"]
    by_label = {label: r for (label, _, _), r in zip(cases, results)}
    for (label, _, exp), r in zip(cases, results):
        _check_vllm(label, r, exp, by_label.get(exp.get("control_of")))
    # the case: a fleet on EAGLE-3 keeps EAGLE-3 in its control, as vLLM parses it; the
    # canary (replaceExisting) is n-gram alone, and vLLM builds its SpeculativeConfig
    assert by_label["eagle3/control"]["speculative_config"] == EAGLE3
    eagle_canary = by_label["eagle3/canary/ngram/regime=None"]
    assert eagle_canary["speculative_config"] == {"method": "ngram", "num_speculative_tokens": K,
                                                  "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert eagle_canary["built"]["method"] == "ngram"
    assert not results[-2].get("built") and ("disable_by_batch_size" in results[-2].get("error", "")
                                             or not results[-2]["ok"]), results[-2]
    assert not results[-1]["ok"]
    print(f"vLLM {out['version']}: {len(cases)} rendered command lines parsed")


# --- SGLang ------------------------------------------------------------------------------------

SGLANG_FLEETS = {
    "plain": ["--model-path", "Qwen/Qwen3-8B", "--port", "30000"],
    "mrr+mixed": ["--model-path", "Q", "--max-running-requests", "128", "--enable-mixed-chunk"],
    "eagle": ["--model-path", "Q", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d",
              "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
    "cpu": ["--model-path", "Q", "--device", "cpu", "--enable-metrics"],
    "ngram=": ["--model-path", "Q", "--speculative-algorithm=NGRAM", "--speculative-ngram-max-bfs-breadth", "4",
               "--speculative-num-draft-tokens=9"],
}


def test_sglang_parser_accepts_every_rendered_command_line():
    cases = []
    for fleet, argv in SGLANG_FLEETS.items():
        c = {"name": "sglang", "image": "lmsysorg/sglang:v0.5.23-cu126",
             "command": ["python3", "-m", "sglang.launch_server"], "args": list(argv)}
        cases += [(fleet, "fleet", argv), (fleet, "control", engines.render_control(c)["args"]),
                  (fleet, "canary", engines.render_lookahead(c, REPLACING["ngram"])["args"])]
    removed = [["--model-path", "Q", "--speculative-algorithm", "NGRAM", "--speculative-ngram-max-match-window-size", "4"],
               ["--model-path", "Q", "--speculative-ngram-max-batch-size", "4"]]
    out = run_harness(SGLANG_HARNESS, [a for _, _, a in cases] + removed)
    assert out["version"] == "0.5.23"
    res = out["results"]
    by = {(f, role): r for (f, role, _), r in zip(cases, res)}
    for (f, role, argv), r in zip(cases, res):
        assert r["ok"], f"{f}/{role}: SGLang's parser refused {argv}: {r['error']}"
    for f in SGLANG_FLEETS:
        can, ctl, flt = by[(f, "canary")], by[(f, "control")], by[(f, "fleet")]
        assert can["speculative_algorithm"] == "NGRAM" and can["speculative_num_draft_tokens"] == K + 1, can
        # the control is the fleet as it runs (EAGLE's draft model and steps included), metrics on
        assert {**flt, "enable_metrics": True} == ctl, (f, flt, ctl)
        assert can["enable_metrics"] is True and can["enable_mixed_chunk"] is False
        assert can["max_running_requests"] == (128 if f == "mrr+mixed" else engines.SGLANG_NGRAM_MAX_RUNNING_REQUESTS)
        if f == "cpu":
            assert can["disable_overlap_schedule"] is True
    assert by[("eagle", "control")]["speculative_algorithm"] == "EAGLE"
    assert by[("eagle", "control")]["speculative_draft_model_path"] == "d"
    # the flags the old adapter rendered are gone from SGLang 0.5.23: argparse exits 2
    assert [r["ok"] for r in res[-2:]] == [False, False] and all("exit 2" in r["error"] for r in res[-2:])
    print(f"SGLang {out['version']}: {len(cases)} command lines parsed")


# --- metric names against the installed sources ------------------------------------------------

def _site_packages() -> Path:
    (sp,) = (VENV / "lib").glob("python3*/site-packages")
    return sp


def _defined(pkg_dir: Path, files: list[str]) -> str:
    return "\n".join((pkg_dir / f).read_text() for f in files)


def _metric_type(src: str, name: str) -> str | None:
    """The prometheus type a source defines ``name`` with (the constructor just before it)."""
    i = src.find(f'"{name}"')
    if i < 0:
        return None
    before = src[max(0, i - 250):i].lower()
    found = [(before.rfind(t), t) for t in ("counter", "histogram", "gauge")]
    pos, kind = max(found)
    return kind if pos >= 0 else None


def test_vllm_metric_names_exist_in_the_installed_sources():
    sp = _site_packages()
    src = _defined(sp / "vllm", ["v1/metrics/loggers.py", "v1/spec_decode/metrics.py"])
    m = engines.metric_names("vllm")
    for name in m.histograms().values():
        assert _metric_type(src, name) == "histogram", name
    for name in list(m.counters().values()):
        base = name[:-len("_total")]          # prometheus_client appends _total to counters
        assert _metric_type(src, base) == "counter", name
    for name in m.gauges().values():
        assert _metric_type(src, name) == "gauge", name
    assert '"vllm:time_per_output_token_seconds"' not in src     # removed in 2026
    assert re.search(r'"model_name"', src) and re.search(r'"engine"', src)
    assert '"position"' in src                                     # the per-position acceptance label


def test_sglang_metric_names_exist_in_the_installed_sources():
    sp = _site_packages()
    src = _defined(sp / "sglang", ["srt/observability/metrics_collector.py"])
    m = engines.metric_names("sglang")
    for name in m.histograms().values():
        assert _metric_type(src, name) == "histogram", name
    for name in m.counters().values():
        assert _metric_type(src, name) == "counter", name
    for name in m.gauges().values():
        assert _metric_type(src, name) == "gauge", name
    assert '"model_name"' in src
    # live decode tokens carry a mode label with the value we match on
    assert re.search(r'realtime_tokens_total.*?"mode"', src, re.S) and '("decode", decode_tokens)' in src
    # --enable-metrics exists and defaults to off (so the adapter must add it)
    obs = (sp / "sglang/srt/arg_groups/fields/observability.py").read_text()
    assert re.search(r"enable_metrics: A\[bool.*\] = False", obs)
