from __future__ import annotations

import copy
import json
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lookahead_operator import engines
from lookahead_operator.engines import shell
from lookahead_operator.engines import (
    EngineError,
    detect_engine,
    metric_names,
    render_control,
    render_lookahead,
)

JACOBI = {"method": "jacobi", "window": 7, "ngram": 5, "guessSet": 7}
NGRAM = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}
NGRAM_CFG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
REPLACE = {**NGRAM, "replaceExisting": True}   # the candidate may replace a different method the fleet runs
# what a ready fleet pod's version endpoint said (observe.running_version reads it)
RUN_VLLM = engines.RunningVersion("0.33.0", "serving/llama-0", "/version")
RUN_SGLANG = engines.RunningVersion("0.5.23", "serving/qwen-0", "/server_info")


def vllm_container(**kw):
    c = {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
         "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64"]}
    c.update(kw)
    return c


def ref_container():
    return {"name": "engine", "image": "python:3.11",
            "command": ["python3", "-m", "lookahead_canary.server", "--host", "0.0.0.0", "--port", "8000",
                        "--model", "smollm2"]}


def sglang_container(image="lmsysorg/sglang:v0.5.23-cu126", extra=()):
    return {"name": "sglang", "image": image,
            "command": ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--port", "30000",
                        *extra]}


def template(*containers, volumes=None):
    spec = {"containers": list(containers)}
    if volumes:
        spec["volumes"] = volumes
    return {"metadata": {"labels": {"app": "x"}}, "spec": spec}


def spec_of(argv):
    vals = [argv[i + 1] for i, a in enumerate(argv) if a == "--speculative-config"]
    vals += [a.split("=", 1)[1] for a in argv if a.startswith("--speculative-config=")]
    assert len(vals) == 1, argv
    return json.loads(vals[0])


def flag(argv, name):
    return argv[argv.index(name) + 1]


# --- detection and versions --------------------------------------------------------------------

def test_detect_engine_from_image_command_args():
    assert detect_engine(template(vllm_container())) == "vllm"
    assert detect_engine(template(sglang_container())) == "sglang"
    assert detect_engine(template(ref_container())) == "reference"
    # vLLM by command on a generic image
    assert detect_engine(template({"name": "c", "image": "ghcr.io/acme/serve:1",
                                   "command": ["vllm", "serve", "m"]})) == "vllm"
    # the engine is the second container (a sidecar first)
    sidecar = {"name": "proxy", "image": "envoyproxy/envoy:v1.30"}
    assert detect_engine(template(sidecar, sglang_container())) == "sglang"
    # a whole Deployment or its spec works too
    assert detect_engine({"spec": {"template": template(vllm_container())}}) == "vllm"
    assert detect_engine(template(sidecar)) is None
    assert engines.is_engine_container(vllm_container()) and not engines.is_engine_container(sidecar)


@pytest.mark.parametrize("image,version", [
    ("vllm/vllm-openai:v0.11.0", (0, 11, 0)),
    ("vllm/vllm-openai:v0.10.1.1", (0, 10, 1)),
    ("lmsysorg/sglang:v0.5.23-cu126", (0, 5, 23)),
    ("lmsysorg/sglang:v0.5.4.post1-cu126", (0, 5, 4)),
    ("nvcr.io/nvidia/tensorrt-llm/release:1.0.0", (1, 0, 0)),
    ("nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc1", (1, 2, 0)),
    ("registry.local:5000/vllm/vllm-openai:0.24.0", (0, 24, 0)),
    ("vllm/vllm-openai:v0.12.0@sha256:abcd", (0, 12, 0)),
    ("vllm/vllm-openai:latest", None),
    ("vllm/vllm-openai", None),
    ("registry.local:5000/vllm", None),
    ("lmsysorg/sglang:dev", None),
])
def test_image_version(image, version):
    assert engines.image_version(image) == version


def test_engine_version_sources():
    v = engines.engine_version(vllm_container(image="vllm/vllm-openai:v0.11.0"), "vllm")
    assert v.version == (0, 11, 0) and v.source == "image tag" and "0.11.0" in v.describe()
    # a renderer's version (after the gate read the running engine): an unknown one renders for the current release
    v = engines.engine_version(vllm_container(image="vllm/vllm-openai:latest"), "vllm")
    assert v.version is None and v.at_least((9, 0, 0)) and "version unknown" in v.describe()
    v = engines.engine_version(vllm_container(image="acme/x:latest"), "vllm", {**NGRAM, "engineVersion": "0.23.1"})
    assert v.version == (0, 23, 1) and v.source == "spec.lookahead.engineVersion"
    with pytest.raises(EngineError):
        engines.engine_version(vllm_container(), "vllm", {**NGRAM, "engineVersion": "banana"})


# --- vLLM --------------------------------------------------------------------------------------

def test_vllm_ngram_renders_and_does_not_mutate():
    c = vllm_container()
    before = copy.deepcopy(c)
    out = render_lookahead(c, NGRAM)
    assert c == before and out is not c
    assert spec_of(out["args"]) == NGRAM_CFG
    assert out["args"][:4] == c["args"][:4]


@pytest.mark.parametrize("existing", [
    ["--speculative-config", '{"method":"eagle","num_speculative_tokens":3}'],
    ['--speculative-config={"method":"eagle"}'],
    ["-sc", '{"method":"eagle","model":"yuhuili/EAGLE3"}'],
    ['-sc={"method":"eagle"}'],
    ["--speculative_config", '{"method":"eagle"}'],
    ["--speculative-config.method=eagle", "--speculative-config.model", "d"],
    ["--speculative_config.num_speculative_tokens=3"],
    ["--spec-method", "eagle", "--spec-tokens", "3"],
    ["--spec_method=ngram", "--spec-tokens=3", "--spec-model", "x"],
])
def test_vllm_every_spelling_is_replaced_in_canary_and_kept_in_control(existing):
    c = vllm_container(args=["--model", "m"] + existing + ["--port", "8000"])
    out = render_lookahead(c, REPLACE)
    argv = out["args"]
    assert spec_of(argv) == NGRAM_CFG                          # one spelling, ours, nothing of eagle's left
    assert engines.vllm_existing_speculation(argv) == NGRAM_CFG
    assert argv[:2] == ["--model", "m"] and argv[-2:] == ["--port", "8000"]
    assert render_lookahead(out, REPLACE) == out               # idempotent
    assert render_control(c) == c and render_control(c) is not c   # the fleet as it runs
    # read as the fleet's method; a config naming no method nor draft model runs nothing in vLLM
    assert (engines.existing_method(c) is None) == (existing == ["--speculative_config.num_speculative_tokens=3"])


def test_vllm_canary_merges_into_the_fleets_ngram_config():
    c = vllm_container(args=["m", "--speculative-config",
                             '{"method":"ngram","num_speculative_tokens":8,"prompt_lookup_max":3,'
                             '"disable_padded_drafter_batch":true}',
                             "--speculative-config.suffix_decoding_max_tree_depth", "12"])
    cfg = spec_of(render_lookahead(c, NGRAM)["args"])
    assert cfg == {**NGRAM_CFG, "disable_padded_drafter_batch": True, "suffix_decoding_max_tree_depth": 12}


def test_vllm_regime_aware_ranges():
    out = render_lookahead(vllm_container(), NGRAM, regime=8)
    cfg = spec_of(out["args"])
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]
    # without --max-num-seqs the last range reaches the default ceiling; underscores are vLLM spellings too
    out = render_lookahead(vllm_container(args=["--model", "m"]), NGRAM, regime={"maxBatchSize": 4})
    assert spec_of(out["args"])["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 4], [5, engines.VLLM_DEFAULT_MAX_BATCH, 0]]
    out = render_lookahead(vllm_container(args=["m", "--max_num_seqs=16"]), NGRAM, regime=2)
    assert spec_of(out["args"])["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 16, 0]]
    # a plain canary drops a schedule the fleet had
    sched = vllm_container(args=["m", "--speculative-config.num_speculative_tokens_per_batch_size", "[[1,2,3]]"])
    assert "num_speculative_tokens_per_batch_size" not in spec_of(render_lookahead(sched, NGRAM)["args"])


@pytest.mark.parametrize("dp", [["--data-parallel-size", "2"], ["-dp", "4"], ["--data_parallel_size=2"]])
def test_vllm_refuses_regime_with_data_parallel(dp):
    c = vllm_container(args=["m"] + dp)
    with pytest.raises(EngineError, match="data-parallel-size"):
        render_lookahead(c, NGRAM, regime=4)
    assert spec_of(render_lookahead(c, NGRAM)["args"]) == NGRAM_CFG      # plain canary is fine
    assert any("data-parallel" in m for m in engines.support_problems(c, "vllm", NGRAM, True))
    assert engines.support_problems(c, "vllm", NGRAM, False) == []
    assert render_lookahead(vllm_container(args=["m", "-dp", "1"]), NGRAM, regime=4)


@pytest.mark.parametrize("tag,ok", [("v0.11.0", False), ("v0.23.0", False), ("v0.24.0", True), ("v0.33.0", True),
                                    ("latest", True)])
def test_vllm_per_batch_schedule_needs_0_24(tag, ok):
    c = vllm_container(image=f"vllm/vllm-openai:{tag}")
    ran = engines.RunningVersion("0.33.0" if tag == "latest" else tag.lstrip("v"), "serving/llama-0", "/version")
    problems = engines.support_problems(template(c), None, NGRAM, True, ran)
    assert (problems == []) is ok, problems
    if not ok:
        assert "0.24.0" in problems[0] and tag.lstrip("v") in problems[0]
        with pytest.raises(EngineError, match="per-batch-size"):
            render_lookahead(c, NGRAM, regime=4)
        render_lookahead(c, NGRAM)                     # the canary itself is fine
    # an explicit engineVersion overrides the tag
    assert engines.support_problems(c, "vllm", {**NGRAM, "engineVersion": "0.23.0"}, True)


def test_vllm_methods_by_version():
    out = render_lookahead(vllm_container(), {**NGRAM, "method": "ngram_gpu"})
    assert spec_of(out["args"]) == {**NGRAM_CFG, "method": "ngram_gpu"}
    out = render_lookahead(vllm_container(), {**NGRAM, "method": "suffix"}, regime=8)
    assert spec_of(out["args"]) == {"method": "suffix", "num_speculative_tokens": 4,
                                    "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 0]]}
    with pytest.raises(EngineError, match="ngram_gpu"):
        render_lookahead(vllm_container(image="vllm/vllm-openai:v0.17.0"), {**NGRAM, "method": "ngram_gpu"})
    render_lookahead(vllm_container(image="vllm/vllm-openai:v0.18.0"), {**NGRAM, "method": "ngram_gpu"})
    with pytest.raises(EngineError, match="suffix"):
        render_lookahead(vllm_container(image="vllm/vllm-openai:v0.11.0"), {**NGRAM, "method": "suffix"})
    assert engines.support_problems(vllm_container(image="vllm/vllm-openai:v0.9.2"), "vllm", NGRAM, False)


def test_vllm_rejects_jacobi_clearly():
    with pytest.raises(EngineError, match="vLLM has no Jacobi"):
        render_lookahead(vllm_container(), JACOBI)


@pytest.mark.parametrize("args,method", [
    (["--speculative-config", '{"method":"eagle3","model":"x/EAGLE3-8B","num_speculative_tokens":3}'], "eagle3"),
    (["-sc", '{"method":"eagle","model":"d"}'], "eagle"),
    (["--speculative-config", '{"method":"qwen3_next_mtp","num_speculative_tokens":2}'], "mtp"),
    (["--speculative-config", '{"method":"mtp","num_speculative_tokens":1}'], "mtp"),
    (["--speculative-config", '{"model":"yuhuili/EAGLE-LLaMA3-Instruct-8B"}'], "eagle"),
    (["--speculative-config", '{"model":"AngelSlim/Qwen3-8B_eagle3"}'], "eagle3"),
    (["--speculative-config", '{"model":"Qwen/Qwen3-0.6B","num_speculative_tokens":4}'], "draft_model"),
    (["--speculative-config", '{"method":"draft_model","model":"Qwen/Qwen3-0.6B"}'], "draft_model"),
    (["--speculative-config", '{"model":"[ngram]","num_speculative_tokens":4}'], "ngram"),
    (["--speculative-config", '{"method":"suffix"}'], "suffix"),
    (["--spec-method", "eagle3", "--spec-model", "d"], "eagle3"),
    (["--speculative-config.method=ngram_gpu"], "ngram_gpu"),
    ([], "none"),
])
def test_vllm_reads_the_fleets_existing_method(args, method):
    got = engines.existing_method(vllm_container(args=["m", *args]))
    if method == "none":
        assert got is None
        return
    assert got is not None and got.method == method
    assert got.source.startswith("vllm -")


def test_a_method_set_from_a_shell_expansion_counts_as_another_method():
    c = {"name": "v", "image": "vllm/vllm-openai:v0.33.0",
         "command": ["sh", "-c", 'exec vllm serve m --speculative-config "$SPEC"']}
    got = engines.existing_method(c)
    assert got is not None and got.method is None
    assert any("cannot read" in m and "replaceExisting" in m for m in engines.support_problems(c, None, NGRAM, False))
    s = {"name": "s", "image": "lmsysorg/sglang:v0.5.23",
         "command": ["sh", "-c", "python3 -m sglang.launch_server --model-path m --speculative-algorithm $ALGO"]}
    assert engines.existing_method(s).method is None


def test_vllm_a_different_method_is_refused_without_replace_existing_naming_it():
    c = vllm_container(args=["m", "--speculative-config",
                             '{"method":"eagle3","model":"x/EAGLE3-8B","num_speculative_tokens":3}'])
    want = ("the fleet runs EAGLE-3 (vllm --speculative-config method eagle3); the candidate ngram would replace it: "
            "set spec.lookahead.replaceExisting: true")
    problems = engines.support_problems(template(c), None, NGRAM, False)
    assert len(problems) == 1 and problems[0].startswith(want), problems
    with pytest.raises(EngineError, match="replaceExisting"):
        render_lookahead(c, NGRAM)
    assert engines.support_problems(template(c), None, REPLACE, True, RUN_VLLM) == []
    # replaced: n-gram alone (no EAGLE key left), the regime's schedule on it
    cfg = spec_of(render_lookahead(c, REPLACE, regime=8)["args"])
    assert cfg == {**NGRAM_CFG, "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 1024, 0]]}
    assert render_control(c) == c


def test_vllm_same_method_is_the_spec_on_top_of_the_fleets_config():
    c = vllm_container(args=["m", "--max-num-seqs", "32", "--speculative-config",
                             '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3,'
                             '"disable_padded_drafter_batch":true}'])
    assert engines.support_problems(template(c), None, NGRAM, True, RUN_VLLM) == []   # no replaceExisting needed
    cfg = spec_of(render_lookahead(c, NGRAM, regime=4)["args"])
    assert cfg == {**NGRAM_CFG, "disable_padded_drafter_batch": True,
                   "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 32, 0]]}


def test_vllm_in_shell_script():
    c = {"name": "v", "image": "vllm/vllm-openai", "command": ["sh", "-c"],
         "args": ["exec vllm serve m --max-num-seqs 16 --speculative-config '{\"method\":\"eagle\"}'"]}
    out = render_lookahead(c, REPLACE, regime=2)
    argv = shlex.split(out["args"][0])
    assert argv[:3] == ["exec", "vllm", "serve"]
    assert spec_of(argv)["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 16, 0]]
    assert engines.existing_method(c).method == "eagle" and engines.existing_method(out).method == "ngram"


# --- SGLang ------------------------------------------------------------------------------------

def test_sglang_canary_replaces_eagle_and_the_control_keeps_it():
    c = sglang_container(extra=["--speculative-ngram-min-match-window-size", "1",
                                "--speculative-ngram-max-match-window-size", "12", "--enable-mixed-chunk",
                                "--speculative-algorithm=EAGLE", "--speculative-use-rejection-sampling"])
    assert engines.existing_method(c).method == "eagle"
    with pytest.raises(EngineError, match="the fleet runs EAGLE \\(sglang --speculative-algorithm EAGLE\\)"):
        render_lookahead(c, NGRAM)
    can = render_lookahead(c, REPLACE)["command"]
    ctl = render_control(c)["command"]
    assert flag(can, "--speculative-algorithm") == "NGRAM" and can.count("--speculative-algorithm") == 1
    assert flag(can, "--speculative-num-draft-tokens") == "5"           # K drafts + the root token
    assert not any("match-window" in a or "max-batch-size" in a for a in can)
    assert "--speculative-use-rejection-sampling" not in can
    assert "--enable-mixed-chunk" not in can and flag(can, "--max-running-requests") == "48"
    assert "--disable-overlap-schedule" not in can                       # CUDA on 0.5.23: not forced
    # the control is the fleet as it runs, measurable: only --enable-metrics added
    assert ctl == c["command"] + ["--enable-metrics"] and "--enable-metrics" in can
    assert render_lookahead(render_lookahead(c, REPLACE), REPLACE) == render_lookahead(c, REPLACE)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
def test_sglang_reads_the_fleets_algorithm(algorithm):
    got = engines.existing_method(sglang_container(extra=["--speculative-algorithm", algorithm]))
    assert got.method == algorithm.lower() and got.source == f"sglang --speculative-algorithm {algorithm}"
    assert engines.existing_method(sglang_container()) is None


def test_sglang_same_method_keeps_the_fleets_other_ngram_flags():
    c = sglang_container(extra=["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "9",
                                "--speculative-ngram-max-bfs-breadth", "4"])
    assert engines.support_problems(template(c), None, NGRAM, False, RUN_SGLANG) == []
    can = render_lookahead(c, NGRAM)["command"]
    assert flag(can, "--speculative-num-draft-tokens") == "5" and can.count("--speculative-num-draft-tokens") == 1
    assert flag(can, "--speculative-ngram-max-bfs-breadth") == "4" and can.count("--speculative-algorithm") == 1


def test_sglang_keeps_the_fleets_max_running_requests():
    c = sglang_container(extra=["--max-running-requests", "128", "--enable-metrics"])
    for argv in (render_lookahead(c, NGRAM)["command"], render_control(c)["command"]):
        assert flag(argv, "--max-running-requests") == "128" and argv.count("--enable-metrics") == 1
    assert render_control(c) == c


def test_sglang_older_versions():
    c = sglang_container(image="lmsysorg/sglang:v0.5.9-cu126")
    can, ctl = render_lookahead(c, NGRAM)["command"], render_control(c)["command"]
    assert flag(can, "--speculative-ngram-min-match-window-size") == "2"
    assert flag(can, "--speculative-ngram-max-match-window-size") == "5"
    assert "--disable-overlap-schedule" in can and "--disable-overlap-schedule" not in ctl   # NGRAM forces it to 0.5.12
    with pytest.raises(EngineError, match="NGRAM"):
        render_lookahead(sglang_container(image="lmsysorg/sglang:v0.5.2"), NGRAM)
    cpu = sglang_container(extra=["--device", "cpu"])
    assert "--disable-overlap-schedule" in render_lookahead(cpu, NGRAM)["command"]
    assert engines.support_problems(sglang_container("lmsysorg/sglang:v0.5.14", ["--device", "cpu"]), None, NGRAM, False)


def test_sglang_refusals():
    with pytest.raises(EngineError, match="no per-batch-size"):
        render_lookahead(sglang_container(), NGRAM, regime=4)
    with pytest.raises(EngineError, match="SGLang has no Jacobi"):
        render_lookahead(sglang_container(), JACOBI)
    with pytest.raises(EngineError, match="data-parallel attention"):
        render_lookahead(sglang_container(extra=["--attn-dp-size", "2"]), NGRAM)
    assert engines.support_problems(sglang_container(), None, {**NGRAM, "method": "suffix"}, False)
    with pytest.raises(EngineError):
        engines.regime_config("sglang", NGRAM, 4)


# --- TensorRT-LLM: recognised only to be refused ---------------------------------------------

@pytest.mark.parametrize("container", [
    {"name": "trt", "image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.1",
     "command": ["trtllm-serve", "serve", "Qwen/Qwen3-8B", "--port", "8000"]},
    {"name": "trt", "image": "acme/serve:1", "command": ["sh", "-c", "trtllm-serve $MODEL --port 8000"]},
])
def test_tensorrt_llm_is_refused_by_name(container):
    assert engines.detect_container_engine(container) is None and detect_engine(template(container)) is None
    assert "trtllm" not in engines.ENGINES
    # engine auto; and the "reference" the operator falls back to when nothing was detected
    for engine in (None, "auto", "reference", "vllm"):
        problems = engines.support_problems(template({"name": "proxy", "image": "envoy:1"}, container), engine,
                                            NGRAM, False)
        assert len(problems) == 1 and problems[0].startswith("TensorRT-LLM is not supported yet: "), problems
    assert engines.support_problems(container, "reference", NGRAM, False)[0].startswith("TensorRT-LLM")
    from lookahead_operator.api.spec import LookaheadPolicySpec
    with pytest.raises(ValueError, match="engine"):
        LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"a": "b"}}}, "engine": "trtllm"})


# --- reference ---------------------------------------------------------------------------------

def test_reference_jacobi_with_batch_cap_and_off():
    out = render_lookahead(ref_container(), JACOBI, regime=4)
    argv = out["command"]
    assert spec_of(argv) == {"method": "jacobi", "window": 7, "ngram": 5, "guess_set": 7}
    assert argv[argv.index("--lookahead-max-batch-size") + 1] == "4"
    # replace, never duplicate; dropping the regime drops the cap
    out2 = render_lookahead(out, {**JACOBI, "window": 5})
    assert spec_of(out2["command"])["window"] == 5
    assert "--lookahead-max-batch-size" not in out2["command"]
    assert render_control(out) == out                              # the control is the fleet as it runs


def test_reference_existing_method_and_replacement():
    jac = render_lookahead(ref_container(), JACOBI)
    assert engines.existing_method(jac).method == "jacobi"
    assert engines.existing_method(ref_container()) is None
    with pytest.raises(EngineError, match="the fleet runs Jacobi lookahead .*replaceExisting"):
        render_lookahead(jac, NGRAM)
    assert spec_of(render_lookahead(jac, REPLACE)["command"])["method"] == "ngram"


def test_reference_ngram():
    out = render_lookahead(ref_container(), NGRAM)
    assert spec_of(out["command"])["method"] == "ngram"
    with pytest.raises(EngineError):
        render_lookahead(ref_container(), {**NGRAM, "method": "suffix"})


def test_spec_accepts_snake_case_and_objects():
    class Spec:
        method = "jacobi"
        window = 3
        ngram = 2
        guess_set = 4
    p = engines.lookahead_params(Spec())
    assert (p.window, p.ngram, p.guess_set) == (3, 2, 4)
    with pytest.raises(EngineError):
        engines.lookahead_params({"method": "medusa"})
    with pytest.raises(EngineError):
        engines.regime_max_batch(0)


def test_spec_from_the_pydantic_model():
    from lookahead_operator.api.spec import LookaheadConfig

    cfg = LookaheadConfig.model_validate({"method": "ngram_gpu", "numSpeculativeTokens": 3, "engineVersion": "0.24.0"})
    p = engines.lookahead_params(cfg)
    assert p.method == "ngram_gpu" and p.num_speculative_tokens == 3 and p.engine_version == "0.24.0"


def test_unknown_engine_needs_explicit_setting():
    with pytest.raises(EngineError, match="set spec.engine"):
        render_lookahead({"name": "c", "image": "acme/server"}, NGRAM)
    out = render_lookahead({"name": "c", "image": "acme/server", "args": []}, NGRAM, engine="vllm")
    assert spec_of(out["args"])["method"] == "ngram"
    assert engines.support_problems(template({"name": "c", "image": "acme/server"}), None, NGRAM, False)


# --- metric names ------------------------------------------------------------------------------

def test_metric_names():
    v = metric_names("vllm")
    assert v.per_token_latency == "vllm:request_time_per_output_token_seconds"  # never the chunk ITL
    assert v.chunk_itl == "vllm:inter_token_latency_seconds" and v.per_token_latency != v.chunk_itl
    assert v.generation_tokens == "vllm:generation_tokens_total"
    assert v.accepted_tokens == "vllm:spec_decode_num_accepted_tokens_total"
    assert v.draft_tokens == "vllm:spec_decode_num_draft_tokens_total"
    assert v.running == "vllm:num_requests_running" and v.waiting == "vllm:num_requests_waiting"
    assert v.prefill_time == "vllm:request_prefill_time_seconds"
    assert v.decode_time == "vllm:request_decode_time_seconds"
    assert v.accepted_per_position == "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    r = metric_names("reference")
    # ours records its ITL per token (not per chunk), so it is the per-token series for the reference engine
    assert r.per_token_latency == "vllm:inter_token_latency_seconds" and r.engine == "reference"
    assert r.generation_tokens == v.generation_tokens and r.chunk_itl is None
    s = metric_names("sglang")
    assert s.per_token_latency == "sglang:inter_token_latency_seconds"
    assert s.running == "sglang:num_running_reqs" and s.waiting == "sglang:num_queue_reqs"
    assert s.accepted_tokens is None and s.acceptance_rate_gauge == "sglang:spec_accept_rate"
    assert s.drafts == "sglang:spec_verify_calls_total" and s.generation_tokens_finish_only
    assert s.live_generation_tokens == "sglang:realtime_tokens_total" and dict(s.live_generation_tokens_match) == {
        "mode": "decode"}
    assert all(not x.startswith("vllm:time_per_output_token") for x in v.histograms().values())
    with pytest.raises(EngineError):
        metric_names("tgi")


def test_reference_metric_names_match_the_engine():
    from lookahead_canary import metrics as engine_metrics

    r = metric_names("reference")
    for name in r.histograms().values():
        assert name in engine_metrics.VLLM_HISTOGRAMS
    for name in (r.generation_tokens, r.draft_tokens, r.accepted_tokens, r.drafts):
        assert name in engine_metrics.VLLM_COUNTERS


def test_regime_config():
    assert engines.regime_config("reference", JACOBI, 4)["--lookahead-max-batch-size"] == 4
    v = engines.regime_config("vllm", NGRAM, 8, engine_max_batch=32)
    assert v["--speculative-config"]["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 32, 0]]


def test_reference_jacobi_with_prompt_lookup_seeding():
    from lookahead_operator.engines import reference_speculative_config
    cfg = json.loads(reference_speculative_config({"method": "jacobi", "window": 3, "ngram": 4, "guessSet": 2,
                                                   "promptLookupTokens": 24}))
    assert cfg == {"method": "jacobi", "window": 3, "ngram": 4, "guess_set": 2, "prompt_lookup_tokens": 24,
                   "window_with_draft": False}
    plain = json.loads(reference_speculative_config({"method": "jacobi", "promptLookupTokens": 0}))
    assert "prompt_lookup_tokens" not in plain and plain["window"] == 7


# --- shell form, run with the real sh ----------------------------------------------------------

_STANDIN = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    with open(os.environ["ARGV_LOG"], "a") as f:
        f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
    print("engine output line")
    """)


@pytest.fixture
def standins(tmp_path):
    """A bin dir with stand-in ``vllm`` and ``lookahead-engine`` executables and a
    ``sglang.launch_server`` / ``lookahead_canary.server`` module that record their argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("vllm", "lookahead-engine"):
        p = bindir / name
        p.write_text(_STANDIN.format(python=sys.executable))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    mod = tmp_path / "mods"
    (mod / "sglang").mkdir(parents=True)
    (mod / "sglang" / "__init__.py").write_text("")
    (mod / "sglang" / "launch_server.py").write_text(_STANDIN.format(python=sys.executable))
    # a python3 on PATH that is the test's interpreter, so `python3 -m sglang.launch_server` finds the module
    (bindir / "python3").symlink_to(sys.executable)
    return tmp_path


def run_sh(container, root: Path, env_extra=None) -> tuple[list[list[str]], str]:
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    log = root / "argv.log"
    if log.exists():
        log.unlink()
    env = {"PATH": f"{root / 'bin'}:/usr/bin:/bin", "ARGV_LOG": str(log), "PYTHONPATH": str(root / "mods"),
           "MODEL": "org/my model", "OUT": str(root), **(env_extra or {})}
    argv[0] = "/bin/sh" if argv[0].endswith("sh") else argv[0]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=root)
    assert res.returncode == 0, (res.stdout, res.stderr)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls, res.stdout


SHELL_SCRIPTS = [
    # the issue's example: the flag must land on vllm, not after the pipe
    ("vllm", "vllm serve $MODEL --port 8000 2>&1 | tee $OUT/engine.log"),
    ("vllm", "set -e; export VLLM_LOGGING_LEVEL=INFO && exec vllm serve \"$MODEL\" \\\n"
             "    --max-num-seqs 32 \\\n    --speculative-config '{\"method\":\"eagle\",\"model\":\"d\"}' \\\n"
             "    -sc='{\"num_speculative_tokens\":2}' \\\n    --port 8000 > $OUT/out.log 2>&1 || echo failed"),
    ("vllm", "echo starting; VLLM_X=1 vllm serve ${MODEL} --spec-method ngram --spec-tokens 3 \\\n"
             "  --speculative-config.prompt_lookup_max=4 --gpu-memory-utilization 0.9 &\nwait"),
    ("sglang", "cd /tmp && python3 -u -m sglang.launch_server --model-path \"$MODEL\" --host 0.0.0.0 "
               "--speculative-ngram-max-match-window-size 12 --enable-mixed-chunk 2>&1 | cat"),
    ("reference", "exec python3 -m lookahead_canary.server --model \"$MODEL\" --port 8000 "
                  "--speculative-config '{\"method\":\"jacobi\"}' # comment here"),
]


def _ref_standin(root: Path):
    (root / "mods" / "lookahead_canary").mkdir(exist_ok=True)
    (root / "mods" / "lookahead_canary" / "__init__.py").write_text("")
    (root / "mods" / "lookahead_canary" / "server.py").write_text(_STANDIN.format(python=sys.executable))


@pytest.mark.parametrize("engine,script", SHELL_SCRIPTS)
def test_shell_form_edits_the_engine_command_under_real_sh(engine, script, standins):
    _ref_standin(standins)
    c = {"name": "engine", "image": {"vllm": "vllm/vllm-openai:v0.33.0", "sglang": "lmsysorg/sglang:v0.5.23",
                                     "reference": "python:3.11"}[engine],
         "command": ["/bin/sh", "-c", script]}
    spec = REPLACE if engine != "reference" else JACOBI
    canary = render_lookahead(c, spec)
    control = render_control(c)
    regime = render_lookahead(c, spec, 4) if engine != "sglang" else None
    orig_calls, orig_out = run_sh(c, standins)
    assert len(orig_calls) == 1
    orig = orig_calls[0]
    # the expected argv: the adapters' edit applied to what sh gave the engine for the original script
    expect_container = {"name": "engine", "image": c["image"], "args": orig}
    for rendered, want in ((canary, render_lookahead(expect_container, spec, engine=engine)),
                           (control, render_control(expect_container, engine=engine))) + \
            (((regime, render_lookahead(expect_container, spec, 4, engine=engine)),) if regime else ()):
        calls, out = run_sh(rendered, standins)
        assert calls == [want["args"]], (rendered["command"][2], calls, want["args"])
        assert out == orig_out                              # pipes, echo, redirections behave the same
    # everything outside the engine's arguments survives byte for byte
    prefix_end = script.index({"vllm": "vllm serve", "sglang": "sglang.launch_server",
                               "reference": "lookahead_canary.server"}[engine])
    assert canary["command"][2][:prefix_end] == script[:prefix_end]
    if "$MODEL" in script:
        assert "$MODEL" in canary["command"][2] or "${MODEL}" in canary["command"][2]
    if engine == "vllm":
        assert engines.vllm_existing_speculation(run_sh(control, standins)[0][0]) == \
            engines.vllm_existing_speculation(orig)              # the control keeps the fleet's speculation
        assert spec_of(run_sh(canary, standins)[0][0]) == NGRAM_CFG


def test_shell_form_the_issue_example_exactly(standins):
    c = {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
         "command": ["/bin/sh", "-c", "vllm serve $MODEL --port 8000 2>&1 | tee /tmp/lookahead-test-tee.log"]}
    out = render_lookahead(c, NGRAM)["command"][2]
    assert out == ("vllm serve $MODEL --port 8000 --speculative-config "
                   "'{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_min\":2,"
                   "\"prompt_lookup_max\":5}' 2>&1 | tee /tmp/lookahead-test-tee.log")
    calls, _ = run_sh({**c, "command": ["/bin/sh", "-c", out]}, standins)
    assert calls == [["vllm", "serve", "org/my", "model", "--port", "8000", "--speculative-config",
                      json.dumps(NGRAM_CFG, separators=(",", ":"))]]
    assert render_control(c) == c


@pytest.mark.parametrize("script,why", [
    ("vllm serve m $EXTRA_ARGS", "may hold engine flags"),
    ("vllm serve m \"$@\"", "may hold engine flags"),
    ("cat <<EOF > /tmp/x\nhi\nEOF\nvllm serve m", "here-document"),
    ("vllm serve a & vllm serve b", "more than once"),
    ("exec my-launcher --port 8000", "no engine command"),
    ("vllm serve m --port 8000 'unterminated", "unterminated"),
    ("vllm serve m > /log --port 8000", "after a redirection"),
])
def test_shell_form_too_complex_is_refused_naming_the_container(script, why):
    c = {"name": "engine-0", "image": "vllm/vllm-openai:v0.33.0", "command": ["sh", "-c", script]}
    for fn in (lambda: render_lookahead(c, NGRAM),):
        with pytest.raises(EngineError, match=why) as exc:
            fn()
        assert "'engine-0'" in str(exc.value)
    problems = engines.support_problems(template(c), "vllm", NGRAM, False)
    assert problems and "engine-0" in problems[0]


def test_shell_tokens_agree_with_shlex_on_plain_words():
    script = "exec vllm serve 'a b' \"c d\" e\\ f --x='{\"k\": 1}' --y \"$(echo hi)\" 2>&1 | tee log && echo ok"
    edit = shell.parse_script(script, [engines.adapter("vllm").detection.launcher])
    vals = [t.value for t in edit.args if not t.opaque]
    assert vals == ["a b", "c d", "e f", '--x={"k": 1}', "--y"]
    assert [t.text for t in edit.args if t.opaque] == ['"$(echo hi)"']
    assert shlex.split(script)[3:8] == vals


def test_shell_script_index():
    idx = shell.script_index
    assert idx(["sh", "-c", "x"]) == 2 and idx(["/bin/bash", "-lc", "x"]) == 2
    assert idx(["bash", "-o", "pipefail", "-c", "x"]) == 4 and idx(["bash", "-e", "-c", "x"]) == 3
    assert idx(["vllm", "serve"]) is None and idx(["sh", "script.sh"]) is None
