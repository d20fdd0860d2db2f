"""The version a gate relies on (``versions.checked_version``): the running engine's is the truth,
a tag or ``spec.lookahead.engineVersion`` contradicting it is a doubt, no running version and no
statement is a doubt (a tag alone proves nothing), and a version in doubt proves no feature."""

from __future__ import annotations

import pytest

from lookahead_operator import engines
from lookahead_operator.engines import EngineError, RunningVersion, checked_version
from lookahead_operator.engines.versions import EngineVersion, is_prerelease, version_answer

NGRAM = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}


def vllm(tag: str = "v0.33.0") -> dict:
    return {"name": "vllm", "image": f"vllm/vllm-openai:{tag}", "command": ["vllm", "serve", "m"]}


def sglang(tag: str = "v0.5.23-cu126", *extra: str) -> dict:
    return {"name": "sglang", "image": f"lmsysorg/sglang:{tag}",
            "command": ["python3", "-m", "sglang.launch_server", "--model-path", "m", *extra]}


def ran(text: str | None, error: str | None = None, path: str = "/version") -> RunningVersion:
    return RunningVersion(text, "serving/chat-a-xyz", path, error)


@pytest.mark.parametrize("answer,text", [
    ({"version": "0.11.0"}, "0.11.0"),                                     # vLLM /version
    ({"model_path": "m", "tp_size": 1, "version": "0.5.10.post1"}, "0.5.10.post1"),   # SGLang server info
    ({"version": " 0.24.0rc1 "}, "0.24.0rc1"),
])
def test_version_answer_reads_the_version_key(answer, text):
    assert version_answer(answer) == text


@pytest.mark.parametrize("answer", [{}, {"version": 11}, {"version": ""}, {"version": "dev"}, None, "0.11.0"])
def test_version_answer_without_a_release_is_an_error(answer):
    with pytest.raises(EngineError, match="version"):
        version_answer(answer)


@pytest.mark.parametrize("text,pre", [("0.24.0rc1", True), ("0.24.0.dev5+g1a2b3c", True), ("0.24.0a1", True),
                                      ("0.24.0", False), ("0.5.10.post1", False), ("v0.5.23-cu126", False),
                                      ("0.10.1.1", False)])
def test_prerelease(text, pre):
    assert is_prerelease(text) is pre


def test_a_prerelease_is_not_yet_its_release():
    v = checked_version(vllm("latest"), "vllm", NGRAM, ran("0.24.0rc1"))
    assert v.version == (0, 24, 0) and v.prerelease and v.doubt is None
    assert not v.at_least((0, 24, 0)) and v.at_least((0, 23, 9))
    assert "(a pre-release)" in v.describe()


def test_the_running_version_is_the_truth_when_the_others_agree_or_are_silent():
    for container, spec in ((vllm("v0.33.0"), NGRAM), (vllm("latest"), NGRAM),
                            (vllm("v0.33.0-cu126"), {**NGRAM, "engineVersion": "0.33.0"})):
        v = checked_version(container, "vllm", spec, ran("0.33.0"))
        assert v.version == (0, 33, 0) and v.doubt is None and v.at_least((0, 24, 0))
        assert v.source == "vllm /version of pod serving/chat-a-xyz"


def test_a_contradiction_names_all_three_and_proves_nothing():
    v = checked_version(vllm("v0.33.0"), "vllm", NGRAM, ran("0.25.0"))
    assert v.version == (0, 25, 0) and not v.at_least((0, 10, 0))           # newer than every gate, still refused
    assert v.doubt == ("vllm /version of pod serving/chat-a-xyz says 0.25.0; the image tag says 0.33.0; "
                       "spec.lookahead.engineVersion is not set")
    v = checked_version(vllm("latest"), "vllm", {**NGRAM, "engineVersion": "0.30.0"}, ran("0.25.0"))
    assert v.doubt.endswith("says 0.25.0; spec.lookahead.engineVersion says 0.30.0") and not v.at_least((0, 1, 0))
    assert "make them agree" in v.unproven("x needs vLLM 0.24.0+")


def test_without_a_running_version_only_the_users_statement_is_taken():
    v = checked_version(vllm("v0.33.0"), "vllm", NGRAM, ran(None, "could not read the version from pod p: HTTP 500"))
    assert v.version is None and not v.at_least((0, 1, 0))
    assert v.doubt == ("the vllm version could not be read from the running engine (could not read the version "
                       "from pod p: HTTP 500); the image tag says 0.33.0, but a tag alone is not proof (latest, a "
                       "retag, a private build)")
    assert "the image tag states no version" in checked_version(vllm("latest"), "vllm", NGRAM, None).doubt
    assert "(no running pod was read)" in checked_version(vllm("latest"), "vllm", NGRAM, None).doubt
    v = checked_version(vllm("latest"), "vllm", {**NGRAM, "engineVersion": "0.24.0"}, None)
    assert v.version == (0, 24, 0) and v.doubt is None and v.at_least((0, 24, 0))
    with pytest.raises(EngineError, match="engineVersion"):
        checked_version(vllm(), "vllm", {**NGRAM, "engineVersion": "banana"}, ran("0.33.0"))


def test_a_renderers_version_is_not_a_gate():
    """After the gate passed, rendering reads engineVersion or the tag only to choose flags."""
    assert EngineVersion("vllm", None, "unknown").at_least((9, 9, 9))
    assert not EngineVersion("vllm", None, "unknown", doubt="why").at_least((0, 0, 1))
    assert engines.render_lookahead(vllm("latest"), NGRAM, regime=4)       # no raise


def test_vllm_refusals_by_running_version():
    regime = "regime-aware promotion needs vLLM 0.24.0+ (num_speculative_tokens_per_batch_size"
    # older than its tag
    got = engines.support_problems(vllm("v0.33.0"), "vllm", NGRAM, True, ran("0.20.1"))
    assert len(got) == 1 and got[0].startswith(
        "vllm /version of pod serving/chat-a-xyz says 0.20.1; the image tag says 0.33.0; spec.lookahead.engineVersion "
        f"is not set: {regime}")
    # simply old, nothing contradicts it: refused as before, naming where the version came from
    got = engines.support_problems(vllm("latest"), "vllm", NGRAM, True, ran("0.20.1"))
    assert got[0].startswith("vllm 0.20.1 (from the vllm /version of pod serving/chat-a-xyz) has no per-batch-size")
    # not read: regime-aware and every version-gated method refused with the reason; plain ngram is not gated
    assert regime in engines.support_problems(vllm("v0.33.0"), "vllm", NGRAM, True)[0]
    assert engines.support_problems(vllm("v0.33.0"), "vllm", NGRAM, False) == []
    for method in ("suffix", "ngram_gpu"):
        got = engines.support_problems(vllm("v0.33.0"), "vllm", {**NGRAM, "method": method}, False)
        assert len(got) == 1 and f"method {method} needs vLLM" in got[0] and "a tag alone is not proof" in got[0]


def test_sglang_refusals_by_running_version():
    got = engines.support_problems(sglang(), "sglang", NGRAM, False)
    assert len(got) == 1 and "the NGRAM speculative algorithm needs SGLang 0.5.3+" in got[0]
    assert engines.support_problems(sglang(), "sglang", NGRAM, False, ran("0.5.23", path="/server_info")) == []
    got = engines.support_problems(sglang("v0.5.23-cu126", "--device", "cpu"), "sglang", NGRAM, False,
                                   ran("0.5.14", path="/get_server_info"))
    assert any("says 0.5.14; the image tag says 0.5.23" in m and "NGRAM on --device cpu needs SGLang 0.5.16+" in m
               for m in got), got
    # a running version the canary's flags depend on (<= 0.5.12) that neither the tag nor the spec states
    got = engines.support_problems(sglang("latest"), "sglang", NGRAM, False, ran("0.5.8", path="/get_server_info"))
    assert got == ["sglang 0.5.8 (from the sglang /get_server_info of pod serving/chat-a-xyz): the canary's NGRAM flags "
                   "differ up to SGLang 0.5.12 and are rendered from spec.lookahead.engineVersion or the image tag, "
                   "which state no version here: set spec.lookahead.engineVersion: 0.5.8"]
    assert engines.support_problems(sglang("latest"), "sglang", {**NGRAM, "engineVersion": "0.5.8"}, False,
                                    ran("0.5.8", path="/get_server_info")) == []


def test_the_reference_engine_gates_nothing_on_its_version():
    c = {"name": "engine", "image": "ghcr.io/lookahead-rollout/lookahead-rollout:0.1.0",
         "command": ["python3", "-m", "lookahead_canary.server", "--model", "tiny"]}
    for running in (None, ran("0.1.0"), ran(None, "could not read the version from pod p: HTTP 404")):
        assert engines.support_problems(c, "reference", NGRAM, True, running) == []
    # its tag is not its version: no contradiction with what /version says
    assert checked_version(c, "reference", NGRAM, ran("0.1.0"), from_image_tag=False).doubt is None
