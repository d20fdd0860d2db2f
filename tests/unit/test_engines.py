from __future__ import annotations

import copy
import json
import shlex

import pytest

from lookahead_operator import engines
from lookahead_operator.engines import (
    EngineError,
    detect_engine,
    metric_names,
    render_lookahead,
    render_off,
)

JACOBI = {"method": "jacobi", "window": 7, "ngram": 5, "guessSet": 7}
NGRAM = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}


def vllm_container(**kw):
    c = {"name": "vllm", "image": "vllm/vllm-openai:v0.12.0",
         "args": ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "64"]}
    c.update(kw)
    return c


def ref_container():
    return {"name": "engine", "image": "python:3.11",
            "command": ["python3", "-m", "lookahead_canary.server", "--host", "0.0.0.0", "--port", "8000",
                        "--model", "smollm2"]}


def sglang_container():
    return {"name": "sglang", "image": "lmsysorg/sglang:v0.5.4",
            "command": ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--port", "30000"]}


def template(*containers):
    return {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": list(containers)}}


def spec_of(argv):
    vals = [argv[i + 1] for i, a in enumerate(argv) if a == "--speculative-config"]
    vals += [a.split("=", 1)[1] for a in argv if a.startswith("--speculative-config=")]
    assert len(vals) == 1, argv
    return json.loads(vals[0])


# --- detection ---------------------------------------------------------------------------------

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


# --- vLLM --------------------------------------------------------------------------------------

def test_vllm_ngram_renders_and_does_not_mutate():
    c = vllm_container()
    before = copy.deepcopy(c)
    out = render_lookahead(c, NGRAM)
    assert c == before and out is not c
    assert spec_of(out["args"]) == {"method": "ngram", "num_speculative_tokens": 4,
                                    "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    assert out["args"][:4] == c["args"][:4]


@pytest.mark.parametrize("existing", [
    ["--speculative-config", '{"method":"eagle","num_speculative_tokens":3}'],
    ['--speculative-config={"method":"eagle"}'],
])
def test_vllm_replaces_present_speculative_config_never_duplicates(existing):
    c = vllm_container(args=["--model", "m"] + existing + ["--port", "8000"])
    out = render_lookahead(c, NGRAM)
    assert spec_of(out["args"])["method"] == "ngram"
    assert out["args"][-2:] == ["--port", "8000"]
    # rendering twice is idempotent
    again = render_lookahead(out, NGRAM)
    assert again == out


def test_vllm_regime_aware_ranges():
    out = render_lookahead(vllm_container(), NGRAM, regime=8)
    cfg = spec_of(out["args"])
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]
    # without --max-num-seqs the last range reaches the default ceiling
    out = render_lookahead(vllm_container(args=["--model", "m"]), NGRAM, regime={"maxBatchSize": 4})
    assert spec_of(out["args"])["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 4], [5, engines.VLLM_DEFAULT_MAX_BATCH, 0]]


def test_vllm_rejects_jacobi_clearly():
    with pytest.raises(EngineError, match="vLLM has no Jacobi"):
        render_lookahead(vllm_container(), JACOBI)


def test_vllm_off_strips_both_forms():
    c = vllm_container(args=["--model", "m", "--speculative-config", "{}", "--speculative-config={}", "--port", "1"])
    assert render_off(c)["args"] == ["--model", "m", "--port", "1"]


def test_vllm_in_shell_script():
    c = {"name": "v", "image": "vllm/vllm-openai", "command": ["sh", "-c"],
         "args": ["exec vllm serve m --max-num-seqs 16 --speculative-config '{\"method\":\"eagle\"}'"]}
    out = render_lookahead(c, NGRAM, regime=2)
    argv = shlex.split(out["args"][0])
    assert argv[:3] == ["exec", "vllm", "serve"]
    assert spec_of(argv)["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 16, 0]]
    assert "--speculative-config" not in shlex.split(render_off(out)["args"][0])


# --- SGLang ------------------------------------------------------------------------------------

def test_sglang_ngram_and_off():
    out = render_lookahead(sglang_container(), NGRAM, regime=4)
    argv = out["command"]
    i = argv.index("--speculative-algorithm")
    assert argv[i + 1] == "NGRAM"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert argv[argv.index("--speculative-ngram-max-batch-size") + 1] == "4"
    assert argv.count("--speculative-algorithm") == 1
    off = render_off(out)
    assert off["command"] == sglang_container()["command"]
    with pytest.raises(EngineError, match="SGLang has no Jacobi"):
        render_lookahead(sglang_container(), JACOBI)


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
    assert render_off(out)["command"] == ref_container()["command"]


def test_reference_ngram():
    out = render_lookahead(ref_container(), NGRAM)
    assert spec_of(out["command"])["method"] == "ngram"


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


def test_unknown_engine_needs_explicit_setting():
    with pytest.raises(EngineError, match="set spec.engine"):
        render_lookahead({"name": "c", "image": "acme/server"}, NGRAM)
    out = render_lookahead({"name": "c", "image": "acme/server", "args": []}, NGRAM, engine="vllm")
    assert spec_of(out["args"])["method"] == "ngram"


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
    r = metric_names("reference")
    # ours records its ITL per token (not per chunk), so it is the per-token series for the reference engine
    assert r.per_token_latency == "vllm:inter_token_latency_seconds" and r.engine == "reference"
    assert r.generation_tokens == v.generation_tokens and r.chunk_itl is None
    s = metric_names("sglang")
    assert s.per_token_latency == "sglang:inter_token_latency_seconds"
    assert s.running == "sglang:num_running_reqs" and s.waiting == "sglang:num_queue_reqs"
    assert s.accepted_tokens is None and s.acceptance_rate_gauge == "sglang:spec_accept_rate"
    assert all(not x.startswith("vllm:time_per_output_token") for x in v.histograms().values())
    with pytest.raises(EngineError):
        metric_names("trtllm")


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
    import json as _json
    from lookahead_operator.engines import reference_speculative_config
    cfg = _json.loads(reference_speculative_config({"method": "jacobi", "window": 3, "ngram": 4, "guessSet": 2,
                                                    "promptLookupTokens": 24}))
    assert cfg == {"method": "jacobi", "window": 3, "ngram": 4, "guess_set": 2, "prompt_lookup_tokens": 24,
                   "window_with_draft": False}
    plain = _json.loads(reference_speculative_config({"method": "jacobi", "promptLookupTokens": 0}))
    assert "prompt_lookup_tokens" not in plain and plain["window"] == 7
