"""Models: the LookaheadPolicy API (lookahead_operator.api: defaults, parsing, errors that
name the field) and, in the second part, load_model (lookahead_canary.models)."""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from lookahead_canary.models import chat_prompt, eos_ids, load_model, smollm2_gguf_path

from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.spec import LabelSelector, LookaheadPolicySpec, spec_error
from lookahead_operator.api.status import Condition, LookaheadPolicyStatus, Phase
from lookahead_canary.units import format_duration, parse_duration, parse_fraction, parse_percent

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "chat-fleet.yaml"
MINIMAL = {"targets": {"selector": {"matchLabels": {"app": "llm-chat"}}}}


def spec_with(**paths):
    """MINIMAL plus dotted-path overrides: spec_with(**{"lookahead.window": 3})."""
    out = copy.deepcopy(MINIMAL)
    for dotted, value in paths.items():
        d = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = value
    return out


# ------------------------------------------------------------------------------------------
# parsing helpers

@pytest.mark.parametrize("text, want", [
    ("2%", 2.0), ("2.5%", 2.5), ("2", 2.0), (" 10 % ", 10.0), ("0%", 0.0), ("100%", 100.0), (5, 5.0), (7.5, 7.5),
])
def test_parse_percent(text, want):
    assert parse_percent(text) == want


@pytest.mark.parametrize("bad", ["150%", "-1%", "two percent", "", "2%%", True, None, [2], float("nan")])
def test_parse_percent_rejects(bad):
    with pytest.raises(ValueError):
        parse_percent(bad)


@pytest.mark.parametrize("text, seconds", [
    ("2m", 120.0), ("90s", 90.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5h", 5400.0), ("1h0m10s", 3610.0), (30, 30.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["2 minutes", "m", "1d", "-5m", "", "2M", None, True])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_duration_round_trips():
    for s in (5400, 120, 45, 3661, 0.5, 90.25):
        assert parse_duration(format_duration(s)) == s
    assert format_duration(0) == "0s" and format_duration(5400) == "1h30m" and format_duration(0.5) == "500ms"


def test_parse_fraction_is_the_command_line_spelling():
    assert parse_fraction("0.3") == 0.3 and parse_fraction("12.5%") == 0.125 and parse_fraction(0.02) == 0.02
    with pytest.raises(ValueError):
        parse_fraction("two")


def test_a_bare_number_of_seconds_is_not_a_crd_duration():
    with pytest.raises(ValidationError, match="stepDuration|step_duration"):
        LookaheadPolicySpec.model_validate(spec_with(**{"load.stepDuration": "120"}))


# ------------------------------------------------------------------------------------------
# defaults

def test_defaults_match_the_design_sketch():
    spec = LookaheadPolicySpec.model_validate(MINIMAL)
    assert spec.engine == "auto"
    la = spec.lookahead
    assert (la.method, la.window, la.ngram, la.guess_set, la.num_speculative_tokens) == ("jacobi", 7, 5, 7, 4)
    assert (la.prompt_lookup_min, la.prompt_lookup_max) == (2, 5)
    assert la.tokens_per_step == 1 + (7 + 7) * 4
    assert spec.canary.replicas == 1
    assert spec.load.mode == "sweep" and spec.load.auto_batch_sizes and spec.load.batch_sizes is None
    assert spec.load.prompts.builtin == "chat" and spec.load.prompts.config_map_ref is None
    assert spec.load.step_duration == timedelta(minutes=2) and spec.load.warmup == timedelta(seconds=30)
    assert spec.load.min_samples_per_step == 10
    an = spec.analysis
    assert an.prometheus.url == "http://prometheus.monitoring:9090"
    assert an.max_throughput_regression == pytest.approx(0.02) and an.min_latency_improvement == pytest.approx(0.05)
    assert an.confidence == 0.99 and an.deadline == timedelta(minutes=30)
    assert an.sample_interval == timedelta(seconds=5) and spec.samples_per_step() == 18
    pr = spec.promotion
    assert pr.mode == "regimeAware" and pr.waves == [10, 50, 100] and pr.rollout_deadline is None  # unset: the fleet's
    assert pr.guard.duration == timedelta(minutes=10) and pr.guard.max_throughput_regression is None
    assert pr.require_approval is False
    assert spec.paused is False


def test_example_policy_validates():
    body = yaml.safe_load(EXAMPLE.read_text())
    policy = LookaheadPolicy.from_body(body)
    assert policy.metadata["name"] == "chat-fleet"
    assert policy.spec.targets.namespace_selector is None   # its own namespace: least privilege
    assert policy.spec.promotion.waves == [10, 50, 100]
    assert policy.spec.to_dict()["promotion"]["waves"] == ["10%", "50%", "100%"]


def test_wire_form_is_camel_case_and_round_trips():
    spec = LookaheadPolicySpec.model_validate(spec_with(**{"load.batchSizes": [1, 4, 16]}))
    wire = spec.to_dict()
    assert wire["lookahead"]["guessSet"] == 7 and wire["load"]["batchSizes"] == [1, 4, 16]
    assert "guess_set" not in wire["lookahead"]
    assert LookaheadPolicySpec.model_validate(wire) == spec
    # snake_case names work too (populate_by_name)
    assert LookaheadPolicySpec.model_validate({"targets": {"selector": {"match_labels": {"a": "b"}}},
                                               "lookahead": {"guess_set": 3}}).lookahead.guess_set == 3


def test_what_the_apiserver_stores_validates():
    """A spec with every default filled in, exactly as the apiserver returns it."""
    stored = LookaheadPolicySpec.model_validate(MINIMAL).to_dict()
    assert LookaheadPolicySpec.model_validate(stored).to_dict() == stored


def test_batch_sizes_auto_string_is_accepted_in_python():
    assert LookaheadPolicySpec.model_validate(spec_with(**{"load.batchSizes": "auto"})).load.batch_sizes is None
    assert LookaheadPolicySpec.model_validate(spec_with(**{"load.batchSizes": []})).load.auto_batch_sizes


def test_fingerprint_ignores_paused_only():
    a = LookaheadPolicySpec.model_validate(MINIMAL)
    b = LookaheadPolicySpec.model_validate(spec_with(paused=True))
    c = LookaheadPolicySpec.model_validate(spec_with(**{"lookahead.window": 3}))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_percent_values_are_fractions_written_back_as_percent_strings():
    spec = LookaheadPolicySpec.model_validate(spec_with(**{"analysis.maxThroughputRegression": 3,
                                                           "analysis.minLatencyImprovement": "7.5%"}))
    assert spec.analysis.max_throughput_regression == pytest.approx(0.03)
    assert spec.analysis.min_latency_improvement == pytest.approx(0.075)
    wire = spec.to_dict()["analysis"]
    assert wire["maxThroughputRegression"] == "3%" and wire["minLatencyImprovement"] == "7.5%"
    assert LookaheadPolicySpec.model_validate(spec.to_dict()) == spec


def test_tail_latency_threshold_defaults_to_the_statistics_default_and_may_exceed_100_percent():
    from lookahead_operator.measurement.stats import DEFAULT_MAX_TAIL_LATENCY_REGRESSION

    default = LookaheadPolicySpec.model_validate(MINIMAL).analysis
    assert default.max_tail_latency_regression == DEFAULT_MAX_TAIL_LATENCY_REGRESSION == 1.0
    assert default.to_dict()["maxTailLatencyRegression"] == "100%"
    for given, fraction, wire in (("250%", 2.5, "250%"), (30, 0.3, "30%"), ("0%", 0.0, "0%"), ("1000", 10.0, "1000%")):
        a = LookaheadPolicySpec.model_validate(spec_with(**{"analysis.maxTailLatencyRegression": given})).analysis
        assert a.max_tail_latency_regression == pytest.approx(fraction)
        assert a.to_dict()["maxTailLatencyRegression"] == wire


def test_speculative_config_per_method():
    """The reference engine's --speculative-config for the spec's defaults, per method."""
    import json

    from lookahead_operator import engines

    def config(spec):
        return json.loads(engines.reference_speculative_config(LookaheadPolicySpec.model_validate(spec).lookahead))

    jac = config(MINIMAL)
    assert jac == {"method": "jacobi", "window": 7, "ngram": 5, "guess_set": 7}
    ng = config(spec_with(**{"lookahead.method": "ngram"}))
    assert ng == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def test_label_selector_helpers():
    sel = LabelSelector.model_validate({"matchLabels": {"app": "x"},
                                        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                                             {"key": "skip", "operator": "DoesNotExist"}]})
    assert sel.matches({"app": "x", "tier": "a"})
    assert not sel.matches({"app": "x", "tier": "c"})
    assert not sel.matches({"app": "x", "tier": "a", "skip": "1"})
    assert sel.to_label_selector_string() == "app=x,tier in (a,b),!skip"


def test_namespace_scope():
    t = LookaheadPolicySpec.model_validate(MINIMAL).targets
    assert t.namespace_scope("inference") == (["inference"], None)
    t2 = LookaheadPolicySpec.model_validate(spec_with(**{"targets.namespaces": ["a", "b"]})).targets
    assert t2.namespace_scope("inference") == (["a", "b"], None)


# ------------------------------------------------------------------------------------------
# invalid specs: each error names the field

INVALID = {
    "missing targets": ({"engine": "auto"}, "targets"),
    "empty selector": (spec_with(**{"targets.selector": {}}), "selector"),
    "In without values": (spec_with(**{"targets.selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
                          "values"),
    "unknown engine": (spec_with(engine="tensorrt"), "engine"),
    "TensorRT-LLM is not supported": (spec_with(engine="trtllm"), "engine"),
    "unknown method": (spec_with(**{"lookahead.method": "medusa"}), "method"),
    "negative window": (spec_with(**{"lookahead.window": -1}), "window"),
    "ngram < 2": (spec_with(**{"lookahead.ngram": 1}), "ngram"),
    "negative guessSet": (spec_with(**{"lookahead.guessSet": -1}), "guessSet"),
    "numSpeculativeTokens 0": (spec_with(**{"lookahead.method": "ngram", "lookahead.numSpeculativeTokens": 0}),
                               "numSpeculativeTokens"),
    "promptLookupMin > max": (spec_with(**{"lookahead.promptLookupMin": 6, "lookahead.promptLookupMax": 3}),
                              "promptLookupMin"),
    "jacobi too many tokens": (spec_with(**{"lookahead.window": 64, "lookahead.guessSet": 64, "lookahead.ngram": 16}),
                               "window"),
    "jacobi on vllm": (spec_with(engine="vllm"), "lookahead.method"),
    "canary replicas 0": (spec_with(**{"canary.replicas": 0}), "replicas"),
    "batchSizes not increasing": (spec_with(**{"load.batchSizes": [1, 4, 2]}), "batchSizes"),
    "batchSizes repeated": (spec_with(**{"load.batchSizes": [1, 4, 4]}), "batchSizes"),
    "batchSizes zero": (spec_with(**{"load.batchSizes": [0, 4]}), "batchSizes"),
    "batchSizes word": (spec_with(**{"load.batchSizes": "many"}), "batchSizes"),
    "bad duration": (spec_with(**{"load.stepDuration": "2 minutes"}), "stepDuration"),
    "warmup >= step": (spec_with(**{"load.warmup": "5m"}), "warmup"),
    "live without livePercent": (spec_with(**{"load.mode": "live"}), "livePercent"),
    "livePercent 0": (spec_with(**{"load.mode": "live", "load.livePercent": "0%"}), "livePercent"),
    "livePercent 50": (spec_with(**{"load.mode": "live", "load.livePercent": 50}), "livePercent"),
    "unknown split": (spec_with(**{"load.mode": "live", "load.livePercent": 5, "load.split": "istio"}), "split"),
    "gatewayAPI split without gatewayAPI": (spec_with(**{"load.mode": "live", "load.livePercent": 5,
                                                         "load.split": "gatewayAPI"}), "gatewayAPI"),
    "gatewayAPI without its split": (spec_with(**{"load.mode": "live", "load.livePercent": 5,
                                                  "load.gatewayAPI": {"httpRouteRef": {"name": "r"},
                                                                      "backendRef": {"name": "s"}}}), "gatewayAPI"),
    "gatewayAPI rule index 16": (spec_with(**{"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI",
                                              "load.gatewayAPI": {"httpRouteRef": {"name": "r"}, "ruleIndex": 16,
                                                                  "backendRef": {"name": "s"}}}), "ruleIndex"),
    "gatewayAPI backend kind": (spec_with(**{"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI",
                                             "load.gatewayAPI": {"httpRouteRef": {"name": "r"},
                                                                 "backendRef": {"kind": "Ingress", "name": "s"}}}),
                                "backendRef.kind"),
    "abort checkInterval 2m": (spec_with(**{"analysis.abort.checkInterval": "2m", "analysis.abort.window": "5m"}),
                               "checkInterval"),
    "abort window 11m": (spec_with(**{"analysis.abort.window": "11m"}), "window"),
    "abort minRequests 0": (spec_with(**{"analysis.abort.minRequests": 0}), "abort.minRequests"),
    "abort minErrors 0": (spec_with(**{"analysis.abort.minErrors": 0}), "abort.minErrors"),
    "abort error rate 0": (spec_with(**{"analysis.abort.maxErrorRateIncrease": "0%"}), "maxErrorRateIncrease"),
    "abort ttft 1500%": (spec_with(**{"analysis.abort.maxTtftRegression": "1500%"}), "maxTtftRegression"),
    "prompts both": (spec_with(**{"load.prompts": {"builtin": "chat", "configMapRef": {"name": "p"}}}), "configMapRef"),
    "prompts unknown builtin": (spec_with(**{"load.prompts": {"builtin": "poetry"}}), "builtin"),
    "throughput regression 150%": (spec_with(**{"analysis.maxThroughputRegression": "150%"}), "maxThroughputRegression"),
    "latency improvement -5": (spec_with(**{"analysis.minLatencyImprovement": -5}), "minLatencyImprovement"),
    "tail regression 1500%": (spec_with(**{"analysis.maxTailLatencyRegression": "1500%"}), "maxTailLatencyRegression"),
    "tail regression -10%": (spec_with(**{"analysis.maxTailLatencyRegression": "-10%"}), "maxTailLatencyRegression"),
    "tail regression fraction": (spec_with(**{"analysis.maxTailLatencyRegression": 1.5}), "maxTailLatencyRegression"),
    "fractional number percent": (spec_with(**{"analysis.maxThroughputRegression": 2.5}), "maxThroughputRegression"),
    "confidence 1.5": (spec_with(**{"analysis.confidence": 1.5}), "confidence"),
    "confidence 0.5": (spec_with(**{"analysis.confidence": 0.5}), "confidence"),
    "deadline < step": (spec_with(**{"analysis.deadline": "1m"}), "analysis.deadline"),
    "waves not increasing": (spec_with(**{"promotion.waves": ["50%", "10%", "100%"]}), "waves"),
    "waves not ending at 100": (spec_with(**{"promotion.waves": ["10%", "50%"]}), "100%"),
    "wave over 100": (spec_with(**{"promotion.waves": ["10%", "150%"]}), "waves"),
    "unknown promotion mode": (spec_with(**{"promotion.mode": "yolo"}), "mode"),
    "guard power within the tolerance": (spec_with(**{"promotion.guard.minDetectableRegression": "2%"}),
                                         "promotion.guard.minDetectableRegression"),
    "guard power within the guard's tolerance": (
        spec_with(**{"promotion.guard.maxThroughputRegression": "25%"}), "promotion.guard.maxThroughputRegression"),
    "unknown field": (spec_with(**{"lookahead.windw": 3}), "windw"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_spec_names_the_field(case):
    body, field = INVALID[case]
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(body)
    assert field in str(err.value), f"{case}: {field!r} not in {err.value}"


def test_an_unknown_spec_field_from_a_newer_crd_is_ignored_and_a_bad_value_still_refused():
    """A field the apiserver kept but this operator version does not know (its CRD is newer: the
    apiserver prunes fields no CRD declares) is ignored, not a Failed rollout; a bad value of a
    known field is still refused, naming it."""
    raw = {"targets": {"selector": {"matchLabels": {"app": "x"}}}, "analysis": {"futureKnob": "on"}}
    spec, ignored = LookaheadPolicySpec.parse_stored(raw)
    assert ignored == ["spec.analysis.futureKnob"] and spec.analysis.confidence == 0.99
    assert raw["analysis"] == {"futureKnob": "on"}, "the stored spec is not changed"
    assert spec.fingerprint() == LookaheadPolicySpec.parse_stored({"targets": raw["targets"]})[0].fingerprint()
    assert LookaheadPolicySpec.parse_stored({"targets": raw["targets"]})[1] == []
    raw["analysis"]["confidence"] = 7
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.parse_stored(raw)
    assert spec_error(err.value).startswith("spec.analysis.confidence")


# What each engine runs (docs/engines.md, "Methods, engines and versions"), written out here so
# that a change to the API's table shows up as a failing test.
RUNS_ON = {"jacobi": {"reference"}, "ngram": {"vllm", "sglang", "reference"}, "ngram_gpu": {"vllm"},
           "suffix": {"vllm"}}


@pytest.mark.parametrize("engine", ["auto", "vllm", "sglang", "reference"])
@pytest.mark.parametrize("method", ["jacobi", "ngram", "ngram_gpu", "suffix"])
def test_method_on_engine_one_rule_one_message(method, engine):
    """Each method is accepted on the engines that run it (and on auto), and refused on the others
    with one message naming the method, the engine, what each runs, and the fix; the CRD's rule for
    that pair carries the same message (tests/integration/test_crd.py checks the apiserver)."""
    from lookahead_dev import crdgen
    from lookahead_operator.api.spec import method_engine_error

    body = spec_with(engine=engine, **{"lookahead.method": method})
    rules = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    cel_messages = [r["message"] for r in rules if r.get("fieldPath") == ".lookahead.method"]
    if engine == "auto" or engine in RUNS_ON[method]:
        assert LookaheadPolicySpec.model_validate(body).lookahead.method == method
        assert method_engine_error(method, engine) is None
        assert not [m for m in cel_messages if f"method {method} does not run on engine {engine} " in m]
        return
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(body)
    message = method_engine_error(method, engine)
    assert spec_error(err.value) == f"spec: Value error, {message}"
    assert message.startswith(f"lookahead.method {method} does not run on engine {engine} (")
    offers = sorted(m for m, engines in RUNS_ON.items() if engine in engines)
    assert all(m in message for m in offers) and all(e in message for e in RUNS_ON[method])
    assert cel_messages.count(message) == 1, "one CEL rule for this pair, with the model's message"


def test_the_crd_has_a_method_engine_rule_exactly_for_each_refused_pair():
    from lookahead_dev import crdgen

    rules = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    refused = sum(len({"vllm", "sglang", "reference"} - engines) for engines in RUNS_ON.values())
    assert len([r for r in rules if r.get("fieldPath") == ".lookahead.method"]) == refused == 6


DURATION_FIELDS = ["load.stepDuration", "load.warmup", "analysis.deadline", "analysis.sampleInterval",
                   "analysis.abort.checkInterval", "analysis.abort.window",
                   "promotion.waveDuration", "promotion.guard.duration", "promotion.rolloutDeadline"]


@pytest.mark.parametrize("value", ["9999999h", "25h", "100000h", "1441m", "99999999999999999999ms"])
@pytest.mark.parametrize("field", DURATION_FIELDS)
def test_a_duration_beyond_24h_is_refused_naming_the_field_and_the_limit(field, value):
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(spec_with(**{field: value}))
    assert spec_error(err.value).startswith(f"spec.{field}: Value error, must be at most 24h"), spec_error(err.value)


def test_every_duration_field_is_bounded_in_the_crd():
    """Every Duration of the spec carries the bound on itself (so the apiserver names the field),
    and every field the test above covers is one."""
    from lookahead_dev import crdgen

    def durations(node, path=""):
        if node.get("type") == "string" and node.get("pattern") == r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$":
            yield path
        for key, sub in (node.get("properties") or {}).items():
            yield from durations(sub, f"{path}.{key}" if path else key)

    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found = list(durations(spec))
    assert set(DURATION_FIELDS) <= set(found)
    for path in found:
        node = spec
        for part in path.split("."):
            node = node["properties"][part]
        assert [r["message"] for r in node.get("x-kubernetes-validations", [])] == ["must be at most 24h"], path


@pytest.mark.parametrize("value", ["24h", "1440m", "86400s", "86400000ms", "23h59m59s", "1.5h"])
def test_durations_up_to_24h_are_accepted(value):
    spec = LookaheadPolicySpec.model_validate(spec_with(**{"promotion.rolloutDeadline": value,
                                                           "promotion.guard.duration": value}))
    assert spec.promotion.rollout_deadline <= timedelta(hours=24)


@pytest.mark.parametrize("value", ["", " ", "   ", "\t", "registry.example/loadgen: 1", " registry.example/loadgen:1"])
def test_a_blank_loadgen_image_is_refused_naming_the_field(value):
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(spec_with(**{"load.loadgenImage": value}))
    assert spec_error(err.value).startswith("spec.load.loadgenImage: "), spec_error(err.value)
    ok = LookaheadPolicySpec.model_validate(spec_with(**{"load.loadgenImage": "registry.example/loadgen:1"}))
    assert ok.load.loadgen_image == "registry.example/loadgen:1"


# (Kubernetes refuses a key starting with '..' too: validation.IsConfigMapKey, a mounted key is a file name)
@pytest.mark.parametrize("key", [".", "..", "a/b", "../prompts.jsonl", "", "a b", "...", "..prompts"])
def test_a_configmap_key_kubernetes_refuses_is_refused_naming_the_field(key):
    body = spec_with(**{"load.prompts": {"configMapRef": {"name": "team-prompts", "key": key}}})
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(body)
    assert spec_error(err.value).startswith("spec.load.prompts.configMapRef.key: "), spec_error(err.value)
    for ok in ("prompts.jsonl", ".hidden", "a..b", "x_y-z.jsonl", "prompts..v2."):
        body["load"]["prompts"]["configMapRef"]["key"] = ok
        assert LookaheadPolicySpec.model_validate(body).load.prompts.config_map_ref.key == ok


# ------------------------------------------------------------------------------------------
# live mode: the split and the safety abort (issue 26; refused at run time in this version)

LIVE = {"load.mode": "live", "load.livePercent": "5%"}
GATEWAY = {"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat", "port": 80}}
POOLS = {"httpRouteRef": {"name": "chat", "namespace": "gateway"}, "ruleName": "chat",
         "backendRef": {"kind": "InferencePool", "name": "chat-pool"},
         "endpointPickers": {"canary": {"name": "epp-canary"}, "control": {"name": "epp-control", "port": 9003,
                                                                           "failureMode": "FailOpen"}}}


@pytest.mark.parametrize("over,deadline", [
    ({}, timedelta(minutes=30)),
    ({"load.mode": "live", "load.livePercent": "10%"}, timedelta(hours=1)),   # live traffic visits loads when users do
    ({"load.mode": "live", "load.livePercent": "10%", "analysis.deadline": "20m"}, timedelta(minutes=20)),
    ({"analysis.deadline": "2h"}, timedelta(hours=2)),
])
def test_the_deadline_defaults_by_mode_and_stays_out_of_the_wire_form_unless_written(over, deadline):
    spec = LookaheadPolicySpec.model_validate(spec_with(**over))
    assert spec.analysis.deadline == deadline
    wire = spec.to_dict()["analysis"]
    assert ("deadline" in wire) == ("analysis.deadline" in over)  # as the apiserver stores it: no schema default
    again = LookaheadPolicySpec.model_validate(spec.to_dict())
    assert again == spec and again.fingerprint() == spec.fingerprint()


@pytest.mark.parametrize("over", [
    {"load.stepDuration": "40m", "load.batchSizes": [1]},                       # sweep: 30m < 40m
    {"load.mode": "live", "load.livePercent": "10%", "load.stepDuration": "70m"},  # live: 1h < 70m
])
def test_a_defaulted_deadline_is_checked_like_a_written_one(over):
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(spec_with(**over))
    assert "analysis.deadline" in spec_error(err.value)


def test_live_defaults():
    spec = LookaheadPolicySpec.model_validate(MINIMAL)
    assert spec.load.split == "service" and spec.load.gateway_api is None and spec.load.live_percent is None
    abort = spec.analysis.abort
    assert abort.check_interval == timedelta(seconds=10) and abort.window == timedelta(minutes=1)
    assert abort.max_error_rate_increase == pytest.approx(0.05) and (abort.min_requests, abort.min_errors) == (20, 3)
    assert abort.max_ttft_regression == pytest.approx(2.0) and abort.max_token_latency_regression == pytest.approx(1.0)
    assert abort.max_blind == timedelta(minutes=2)
    assert spec.to_dict()["analysis"]["abort"] == {
        "checkInterval": "10s", "window": "1m", "maxErrorRateIncrease": "5%", "minRequests": 20, "minErrors": 3,
        "maxTtftRegression": "200%", "maxTokenLatencyRegression": "100%", "maxBlind": "2m"}
    assert spec.to_dict()["load"]["split"] == "service"


@pytest.mark.parametrize("over", [
    LIVE,
    {**LIVE, "load.livePercent": "49.5%"},
    {**LIVE, "load.split": "gatewayAPI", "load.gatewayAPI": GATEWAY},
    {**LIVE, "load.split": "gatewayAPI", "load.gatewayAPI": {**GATEWAY, "ruleIndex": 15}},
    {**LIVE, "load.split": "gatewayAPI", "load.gatewayAPI": POOLS},
    {**LIVE, "load.split": "gatewayAPI", "load.gatewayAPI": {**GATEWAY, "backendRef": {"kind": "InferencePool",
                                                                                         "name": "p"},
                                                             "armBackend": "Service"}},
    {"analysis.abort": {"checkInterval": "1s", "window": "5s"}},
    {"analysis.abort": {"checkInterval": "1m", "window": "10m", "maxErrorRateIncrease": "100%", "minRequests": 1,
                        "minErrors": 1, "maxTtftRegression": "10%", "maxTokenLatencyRegression": 1000,
                        "maxBlind": "30m"}},
    {"analysis.abort": {"maxBlind": "30s"}},
])
def test_live_variants_are_accepted_and_round_trip(over):
    spec = LookaheadPolicySpec.model_validate(spec_with(**over))
    assert LookaheadPolicySpec.model_validate(spec.to_dict()) == spec
    if "load.gatewayAPI" in over:
        wire = spec.to_dict()["load"]["gatewayAPI"]
        assert wire["httpRouteRef"]["name"] == "chat" and "gateway_api" not in spec.to_dict()["load"]


def test_arm_backends_follow_the_fleets_unless_set():
    g = LookaheadPolicySpec.model_validate(spec_with(**LIVE, **{"load.split": "gatewayAPI",
                                                                "load.gatewayAPI": POOLS})).load.gateway_api
    assert g.arm_kind == "InferencePool" and g.endpoint_pickers.canary.port == 9002
    assert g.endpoint_pickers.control.failure_mode == "FailOpen" and g.endpoint_pickers.canary.failure_mode == "FailClose"
    g = LookaheadPolicySpec.model_validate(spec_with(**LIVE, **{"load.split": "gatewayAPI",
                                                                "load.gatewayAPI": GATEWAY})).load.gateway_api
    assert g.arm_kind == "Service" and g.backend_ref.kind == "Service" and g.http_route_ref.namespace is None


def _rules(*path: str) -> list[dict]:
    from lookahead_dev import crdgen

    node = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path:
        node = node["properties"][part]
    return node.get("x-kubernetes-validations", [])


# (case, the CRD node holding the rule, its fieldPath, the message both validators give)
def _live_rule_cases():
    from lookahead_operator.api import spec as s

    gw = {**LIVE, "load.split": "gatewayAPI"}
    return {
        "livePercent 0": (spec_with(**{**LIVE, "load.livePercent": 0}), ("load",), ".livePercent",
                          s.LIVE_PERCENT_RANGE),
        "livePercent 75 in sweep": (spec_with(**{"load.livePercent": "75%"}), ("load",), ".livePercent",
                                    s.LIVE_PERCENT_RANGE),
        "gatewayAPI required": (spec_with(**gw), ("load",), ".gatewayAPI", s.GATEWAY_REQUIRED),
        "gatewayAPI with split service": (spec_with(**LIVE, **{"load.gatewayAPI": GATEWAY}), ("load",), ".gatewayAPI",
                                          s.GATEWAY_UNUSED),
        "gatewayAPI in sweep": (spec_with(**{"load.split": "gatewayAPI", "load.gatewayAPI": GATEWAY}), ("load",),
                                ".gatewayAPI", s.GATEWAY_UNUSED),
        "ruleName and ruleIndex": (spec_with(**gw, **{"load.gatewayAPI": {**GATEWAY, "ruleName": "a", "ruleIndex": 0}}),
                                   ("load", "gatewayAPI"), ".ruleIndex", s.RULE_ONE_SELECTOR),
        "pools without pickers": (spec_with(**gw, **{"load.gatewayAPI": {**GATEWAY, "armBackend": "InferencePool"}}),
                                  ("load", "gatewayAPI"), ".endpointPickers", s.PICKERS_REQUIRED),
        "pool backend without pickers": (spec_with(**gw, **{"load.gatewayAPI": {
            **GATEWAY, "backendRef": {"kind": "InferencePool", "name": "p"}}}), ("load", "gatewayAPI"),
            ".endpointPickers", s.PICKERS_REQUIRED),
        "pickers for Service arms": (spec_with(**gw, **{"load.gatewayAPI": {
            **GATEWAY, "endpointPickers": POOLS["endpointPickers"]}}), ("load", "gatewayAPI"), ".endpointPickers",
            s.PICKERS_UNUSED),
        "one picker for both pools": (spec_with(**gw, **{"load.gatewayAPI": {
            **POOLS, "endpointPickers": {"canary": {"name": "epp"}, "control": {"name": "epp"}}}}),
            ("load", "gatewayAPI", "endpointPickers"), ".control.name", s.ENDPOINT_PICKERS_DISTINCT),
        "abort check 500ms": (spec_with(**{"analysis.abort.checkInterval": "500ms"}), ("analysis", "abort"),
                              ".checkInterval", s.ABORT_CHECK_RANGE),
        "abort check 90s": (spec_with(**{"analysis.abort.checkInterval": "90s", "analysis.abort.window": "2m"}),
                            ("analysis", "abort"), ".checkInterval", s.ABORT_CHECK_RANGE),
        "abort window below check": (spec_with(**{"analysis.abort.checkInterval": "30s",
                                                  "analysis.abort.window": "20s"}),
                                     ("analysis", "abort"), ".window", s.ABORT_WINDOW_RANGE),
        "abort window 11m": (spec_with(**{"analysis.abort.window": "11m"}), ("analysis", "abort"), ".window",
                             s.ABORT_WINDOW_RANGE),
        "abort window below sampleInterval": (spec_with(**{"analysis.abort.checkInterval": "2s",
                                                           "analysis.abort.window": "3s"}),
                                              ("analysis",), ".abort.window", s.ABORT_WINDOW_SAMPLES),
        "abort error rate 0": (spec_with(**{"analysis.abort.maxErrorRateIncrease": 0}), ("analysis", "abort"),
                               ".maxErrorRateIncrease", s.ABORT_ERRORS_ABOVE_ZERO),
        "abort ttft 5%": (spec_with(**{"analysis.abort.maxTtftRegression": "5%"}), ("analysis", "abort"),
                          ".maxTtftRegression", s.ABORT_TTFT_FLOOR),
        "abort token latency 9.9%": (spec_with(**{"analysis.abort.maxTokenLatencyRegression": "9.9%"}),
                                     ("analysis", "abort"), ".maxTokenLatencyRegression", s.ABORT_TOKEN_FLOOR),
        "abort blind 20s": (spec_with(**{"analysis.abort.maxBlind": "20s"}), ("analysis", "abort"), ".maxBlind",
                            s.ABORT_BLIND_RANGE),
        "abort blind below check": (spec_with(**{"analysis.abort.checkInterval": "45s", "analysis.abort.maxBlind": "40s"}),
                                    ("analysis", "abort"), ".maxBlind", s.ABORT_BLIND_RANGE),
        "abort blind 31m": (spec_with(**{"analysis.abort.maxBlind": "31m"}), ("analysis", "abort"), ".maxBlind",
                            s.ABORT_BLIND_RANGE),
    }


@pytest.mark.parametrize("case", list(_live_rule_cases()))
def test_live_rules_one_rule_one_message(case):
    """Each live-mode rule refuses its case with one message, the same in the model and in the
    CRD's CEL rule (which names the field through fieldPath). The CEL side is checked against a
    real apiserver by tests/integration/test_crd.py (cases live-* and abort-*)."""
    body, node, field_path, message = _live_rule_cases()[case]
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(body)
    assert spec_error(err.value).endswith(f"Value error, {message}"), spec_error(err.value)
    rules = [r for r in _rules(*node) if r["message"] == message]
    assert len(rules) == 1 and rules[0]["fieldPath"] == field_path, (node, rules)


# ------------------------------------------------------------------------------------------
# status

def test_status_round_trip_and_lenient():
    raw = {
        "phase": "Measuring",
        "observedGeneration": 2,
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Valid", "message": "ok",
                        "lastTransitionTime": "2026-11-30T03:00:00Z", "observedGeneration": 2}],
        "batches": [{"batchSize": 1, "controlTpotMs": 21.0, "canaryTpotMs": 13.1, "tpotChange": -0.376,
                     "tpotInterval": [-0.41, -0.33], "acceptanceRate": 0.42, "samples": {"control": 120, "canary": 118}, "verdict": "Wins"}],
        "crossoverBatchSize": 8,
        "decision": {"id": "g2-1", "action": "PromoteRegimeAware", "reason": "wins below 8",
                     "decidedAt": "2026-11-30T03:10:00Z", "crossoverBatchSize": 8,
                     "regime": [{"start": 1, "end": 7, "enabled": True}, {"start": 8, "end": 256, "enabled": False}],
                     "outcomes": {"1": "Wins", "8": "Regresses"}, "config": {"speculative_config": {"method": "jacobi"}}},
        "targets": [{"namespace": "inference", "name": "chat-vllm", "engine": "vllm", "promoted": False,
                     "savedTemplate": {"spec": {"containers": [{"name": "x"}]}}}],
        "gates": {"awaitingApproval": True},
        "someFutureField": 1,
    }
    st = LookaheadPolicyStatus.model_validate(raw)
    assert st.phase == Phase.Measuring and st.batches[0].verdict == "Wins"
    assert st.decision.regime[1].enabled is False
    out = st.to_dict()
    assert "someFutureField" not in out and out["batches"][0]["tpotInterval"] == [-0.41, -0.33]
    assert out["conditions"][0]["lastTransitionTime"] == "2026-11-30T03:00:00Z"
    assert LookaheadPolicyStatus.model_validate(out) == st


@pytest.mark.parametrize("bad, field", [
    ({"phase": "Dancing"}, "phase"),
    ({"conditions": [{"type": "Accepted", "status": "Maybe", "reason": "X", "lastTransitionTime": "2026-11-30T03:00:00Z"}]},
     "status"),
    ({"batches": [{"batchSize": 0}]}, "batchSize"),
    ({"decision": {"action": "Party", "reason": "x"}}, "action"),
])
def test_invalid_status_names_the_field(bad, field):
    with pytest.raises(ValidationError) as err:
        LookaheadPolicyStatus.model_validate(bad)
    assert field in str(err.value)


def test_condition_reason_is_camel_case():
    with pytest.raises(ValidationError):
        Condition.model_validate({"type": "Accepted", "status": "True", "reason": "not ok",
                                  "lastTransitionTime": "2026-11-30T03:00:00Z"})


def test_enum_fields_hold_members_whether_given_or_defaulted():
    given = LookaheadPolicySpec.model_validate(spec_with(engine="reference", **{"load.prompts": {"builtin": "code"}}))
    default = LookaheadPolicySpec.model_validate(MINIMAL)
    for spec, engine, prompts in ((given, "reference", "code"), (default, "auto", "chat")):
        assert spec.engine == engine and spec.engine.value == engine and f"{spec.engine}" == engine
        assert spec.load.prompts.builtin.value == prompts and spec.lookahead.method.value == "jacobi"
        assert spec.to_dict()["engine"] == engine


# ==========================================================================================
# lookahead_canary.models: load_model on the tiny random model and the chat template helper
# (no SmolLM2 weights needed beyond its tokenizer, which is read from the GGUF once and cached).


def test_tiny_is_a_deterministic_llama_with_smollm2_tokenizer():
    m1, tok = load_model("tiny")
    m2, _ = load_model("tiny")
    assert type(m1).__name__ == "LlamaForCausalLM"
    assert m1.config.vocab_size == len(tok) == 49152
    assert not m1.training
    assert all(not p.requires_grad for p in m1.parameters())
    for (n1, p1), (n2, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    ids = chat_prompt(tok, "hello")
    with torch.inference_mode():
        logits = m1(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok))
    assert torch.isfinite(logits).all()


def test_chat_prompt_uses_template():
    _, tok = load_model("tiny")
    ids = chat_prompt(tok, "What is 2+2?")
    text = tok.decode(ids)
    assert "What is 2+2?" in text
    assert text.rstrip().endswith("assistant")
    assert 2 in eos_ids(*load_model("tiny"))


def test_gguf_file_is_found():
    p = smollm2_gguf_path()
    assert p.name.endswith(".gguf") and p.stat().st_size > 50_000_000


def test_unknown_spec_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        load_model(str(tmp_path / "nope"))


def test_tiny_dtype():
    m, _ = load_model("tiny", dtype=torch.bfloat16)
    assert next(m.parameters()).dtype == torch.bfloat16
