"""The generated LookaheadPolicy CRD against the real kube-apiserver.

The apiserver itself must enforce the API: defaults, ranges, enums and the CEL cross-field rules.
Every invalid policy is refused with a 422 that names the field, and nothing is stored.
"""

from __future__ import annotations

import copy
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_operator.api.names import API_VERSION, CATEGORIES, GROUP, KIND, PLURAL, VERSION
from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import LookaheadPolicyStatus

from .helpers import namespace_while_used, unique_name

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "lookaheadpolicies.yaml"
EXAMPLE = REPO / "examples" / "chat-fleet.yaml"
G, V, P = GROUP, VERSION, PLURAL


def install_crd(api: client.ApiClient, timeout: float = 30.0) -> client.V1CustomResourceDefinition:
    """Create (or replace) the CRD from crds/ and wait until it is Established."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD_FILE.read_text())
    name = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, body)
    deadline = time.monotonic() + timeout
    while True:
        crd = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
        if conds.get("Established") == "True" and conds.get("NamesAccepted") == "True":
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"CRD not Established after {timeout}s: {conds}")
        time.sleep(0.2)
    # The group/version is served once discovery has it.
    while True:
        try:
            client.CustomObjectsApi(api).list_cluster_custom_object(G, V, P, limit=1)
            return crd
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def crd(kube_api):
    return install_crd(kube_api)


@pytest.fixture(scope="module")
def namespace(kube_api, crd):
    yield from namespace_while_used(kube_api, "crd")


@pytest.fixture()
def objects(kube_api):
    return client.CustomObjectsApi(kube_api)


def example_body(name: str, namespace: str) -> dict:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    return body


def minimal_body(name: str, namespace: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"targets": {"selector": {"matchLabels": {"app": "llm-chat"}}}}}


# ------------------------------------------------------------------------------------------

def test_crd_installs_and_is_established(kube_api, crd):
    assert crd.spec.names.short_names == ["lap"]
    assert crd.spec.scope == "Namespaced"
    # Discovery serves the resource with its short name and the status subresource.
    resources = client.CustomObjectsApi(kube_api).get_api_resources(G, V).resources
    by_name = {r.name: r for r in resources}
    assert by_name[P].short_names == ["lap"] and by_name[P].namespaced
    assert f"{P}/status" in by_name
    assert CATEGORIES[0] in (by_name[P].categories or [])


def test_example_policy_is_accepted_with_defaults(objects, namespace):
    name = unique_name("chat-fleet")
    created = objects.create_namespaced_custom_object(G, V, namespace, P, example_body(name, namespace))
    stored = objects.get_namespaced_custom_object(G, V, namespace, P, name)
    assert stored["metadata"]["uid"] == created["metadata"]["uid"]
    spec = stored["spec"]
    # Fields the example leaves out were filled in by the apiserver from the CRD's defaults.
    assert spec["lookahead"]["numSpeculativeTokens"] == 4
    assert spec["lookahead"]["promptLookupMin"] == 2 and spec["lookahead"]["promptLookupMax"] == 5
    assert spec["load"]["warmup"] == "30s" and spec["load"]["minSamplesPerStep"] == 10
    assert spec["analysis"]["sampleInterval"] == "5s" and "rolloutDeadline" not in spec["promotion"], \
        "unset: the deadlines follow the fleet's readiness (no schema default)"
    assert spec["promotion"]["waveDuration"] == "5m" and spec["promotion"]["requireApproval"] is False
    # The operator reads exactly what the apiserver stores, and the two agree on every default.
    model = LookaheadPolicySpec.model_validate(spec)
    assert model.to_dict() == spec
    assert LookaheadPolicySpec.model_validate(example_body(name, namespace)["spec"]).to_dict() == spec


def test_minimal_policy_gets_every_default(objects, namespace):
    name = unique_name("minimal")
    objects.create_namespaced_custom_object(G, V, namespace, P, minimal_body(name, namespace))
    spec = objects.get_namespaced_custom_object(G, V, namespace, P, name)["spec"]
    assert spec == LookaheadPolicySpec.model_validate(minimal_body(name, namespace)["spec"]).to_dict()
    assert spec["engine"] == "auto" and spec["paused"] is False
    assert spec["lookahead"] == {"method": "jacobi", "window": 7, "ngram": 5, "guessSet": 7,
                                 "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5,
                                 "promptLookupTokens": 0, "replaceExisting": False}
    assert spec["load"]["prompts"] == {"builtin": "chat"} and "batchSizes" not in spec["load"]
    assert spec["analysis"]["maxThroughputRegression"] == "2%" and spec["analysis"]["confidence"] == 0.99
    assert spec["promotion"]["waves"] == ["10%", "50%", "100%"]
    assert spec["promotion"]["guard"] == {"duration": "10m", "minDetectableRegression": "20%", "maxTtftRegression": "50%",
                                          "maxErrorRateIncrease": "1%"}


def _set(spec: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        spec = spec.setdefault(p, {})
    if value is _DELETE:
        del spec[leaf]
    else:
        spec[leaf] = value


_DELETE = object()

# Valid variants: the schema must not refuse what the API promises.
VALID = {
    "ngram-on-vllm": {"engine": "vllm", "lookahead.method": "ngram", "lookahead.numSpeculativeTokens": 6},
    "ngram-replacing-the-fleets-method": {"engine": "vllm", "lookahead.method": "ngram",
                                          "lookahead.replaceExisting": True},
    "explicit-batch-sizes": {"load.batchSizes": [1, 2, 4, 8, 16, 64]},
    "live-mode": {"load.mode": "live", "load.livePercent": "5%"},
    # live mode's split and abort (issue 26): the API is in place, the run time still refuses live
    "live-service-split-fractional": {"load.mode": "live", "load.livePercent": "2.5%", "load.split": "service"},
    "live-gateway-api-service-backend": {"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI",
                                         "load.gatewayAPI": {"httpRouteRef": {"name": "chat"}, "ruleIndex": 15,
                                                             "backendRef": {"name": "chat", "port": 80}}},
    "live-gateway-api-inference-pools": {"load.mode": "live", "load.livePercent": "10%", "load.split": "gatewayAPI",
                                         "load.gatewayAPI": {
                                             "httpRouteRef": {"name": "chat", "namespace": "gateway"},
                                             "ruleName": "chat",
                                             "backendRef": {"kind": "InferencePool", "name": "chat-pool"},
                                             "endpointPickers": {"canary": {"name": "epp-canary"},
                                                                 "control": {"name": "epp-control", "port": 9003,
                                                                             "failureMode": "FailOpen"}}}},
    "abort-at-its-bounds": {"analysis.abort": {"checkInterval": "1m", "window": "10m", "maxErrorRateIncrease": "100%",
                                               "minRequests": 1, "minErrors": 1, "maxTtftRegression": "10%",
                                               "maxTokenLatencyRegression": 1000, "maxBlind": "30m"}},
    "abort-blind-at-its-floor": {"analysis.abort": {"maxBlind": "30s"}},
    "live-step-beyond-30m-within-its-1h-deadline": {"load.mode": "live", "load.livePercent": "10%",
                                                     "load.stepDuration": "45m", "analysis.deadline": _DELETE},
    "integer-percents-and-waves": {"analysis.maxThroughputRegression": 3, "promotion.waves": [25, "50%", 100]},
    "fractional-percent-string": {"analysis.minLatencyImprovement": "7.5%"},
    "guard-power-above-guard-tolerance": {"promotion.guard.maxThroughputRegression": 3,
                                          "promotion.guard.minDetectableRegression": "7.5%"},
    "configmap-prompts": {"load.prompts": {"configMapRef": {"name": "team-prompts", "key": "prompts.jsonl"}}},
    "match-expressions-only": {"targets.selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["llm-chat", "llm-code"]},
        {"key": "canary", "operator": "DoesNotExist"}]}},
    "all-namespaces": {"targets.namespaceSelector": {}, "targets.namespaces": ["a", "b"]},
    "analysis-only-one-wave": {"promotion.mode": "analysisOnly", "promotion.waves": ["100%"]},
    "reference-engine-jacobi": {"engine": "reference", "lookahead.window": 15, "lookahead.guessSet": 15},
    "small-load-resources": {"load.resources": {"requests": {"cpu": "20m", "memory": "64Mi"},
                                                "limits": {"memory": 268435456, "cpu": 1}}},
    "durations-at-the-24h-limit": {"promotion.rolloutDeadline": "24h", "promotion.guard.duration": "1440m",
                                   "promotion.waveDuration": "86400s", "analysis.deadline": "86400000ms"},
    "loadgen-image": {"load.loadgenImage": "registry.example/lookahead/loadgen:0.1.0"},
    "load-pods-placed-and-pulled": {"load.nodeSelector": {"pool": "cpu", "kubernetes.io/arch": "amd64"},
                                    "load.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                          "effect": "NoSchedule"}, {"operator": "Exists"}],
                                    "load.priorityClassName": "batch-low",
                                    "load.imagePullSecrets": [{"name": "regcred"}]},
    "configmap-key-with-dots": {"load.prompts": {"configMapRef": {"name": "team-prompts", "key": ".team..prompts."}}},
    # the labels a Prometheus' podMonitorSelector picks (kube-prometheus-stack: release: <its release>)
    "pod-monitor-labels": {"analysis.prometheus.podMonitorLabels": {
        "release": "kube-prometheus-stack", "example.com/team": "ml-platform", "n" * 63: "v" * 63,
        "a" * 253 + "/x": "", "app.kubernetes.io/part-of": "lookahead"}},
}


@pytest.mark.parametrize("case", list(VALID))
def test_valid_variants_are_accepted(objects, namespace, case):
    body = example_body(unique_name(case), namespace)
    for dotted, value in VALID[case].items():
        _set(body["spec"], dotted, value)
    objects.create_namespaced_custom_object(G, V, namespace, P, body)
    stored = objects.get_namespaced_custom_object(G, V, namespace, P, body["metadata"]["name"])
    LookaheadPolicySpec.model_validate(stored["spec"])  # and the operator can read it


# (overrides on the example, the field the apiserver's message must name)
INVALID = {
    "missing-targets": ({"targets": _DELETE}, "spec.targets"),
    "empty-selector": ({"targets.selector": {}}, "spec.targets.selector"),
    "in-without-values": ({"targets.selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
                          "spec.targets.selector.matchExpressions[0].values"),
    "unknown-engine": ({"engine": "tensorrt"}, "spec.engine"),
    "tensorrt-llm-not-supported": ({"engine": "trtllm"}, "spec.engine"),
    "replace-existing-not-a-bool": ({"lookahead.replaceExisting": "maybe"}, "spec.lookahead.replaceExisting"),
    "guard-power-within-tolerance": ({"promotion.guard.minDetectableRegression": "2%"},
                                     "spec.promotion.guard.minDetectableRegression"),
    "guard-power-within-guard-tolerance": ({"promotion.guard.maxThroughputRegression": "30%"},
                                           "spec.promotion.guard.minDetectableRegression"),
    "unknown-method": ({"lookahead.method": "medusa"}, "spec.lookahead.method"),
    "negative-window": ({"lookahead.window": -1}, "spec.lookahead.window"),
    "ngram-below-2": ({"lookahead.ngram": 1}, "spec.lookahead.ngram"),
    "negative-guess-set": ({"lookahead.guessSet": -3}, "spec.lookahead.guessSet"),
    "prompt-lookup-min-above-max": ({"lookahead.promptLookupMin": 6, "lookahead.promptLookupMax": 3},
                                    "spec.lookahead.promptLookupMin"),
    "jacobi-on-vllm": ({"engine": "vllm"}, "spec.lookahead.method"),
    "jacobi-token-budget": ({"engine": "reference", "lookahead.window": 64, "lookahead.guessSet": 64,
                             "lookahead.ngram": 16}, "spec.lookahead.window"),
    "canary-replicas-0": ({"canary.replicas": 0}, "spec.canary.replicas"),
    "unknown-load-mode": ({"load.mode": "burst"}, "spec.load.mode"),
    "load-toleration-exists-with-a-value": ({"load.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
                                            "spec.load.tolerations[0].value"),
    "load-toleration-unknown-effect": ({"load.tolerations": [{"key": "k", "effect": "NoRun"}]},
                                       "spec.load.tolerations[0].effect"),
    "load-node-selector-bad-key": ({"load.nodeSelector": {"no spaces": "x"}}, "spec.load.nodeSelector"),
    "load-pull-secret-without-name": ({"load.imagePullSecrets": [{}]}, "spec.load.imagePullSecrets[0].name"),
    "load-priority-class-upper-case": ({"load.priorityClassName": "Batch"}, "spec.load.priorityClassName"),
    "batch-sizes-not-increasing": ({"load.batchSizes": [1, 8, 4]}, "spec.load.batchSizes"),
    "batch-sizes-repeated": ({"load.batchSizes": [1, 4, 4]}, "spec.load.batchSizes"),
    "batch-size-zero": ({"load.batchSizes": [0, 4]}, "spec.load.batchSizes[0]"),
    "bad-duration": ({"load.stepDuration": "2 minutes"}, "spec.load.stepDuration"),
    "warmup-not-shorter-than-step": ({"load.warmup": "2m"}, "spec.load.warmup"),
    "live-without-percent": ({"load.mode": "live"}, "spec.load.livePercent"),
    # live mode's split and abort (issue 26)
    "live-percent-zero": ({"load.mode": "live", "load.livePercent": "0%"}, "spec.load.livePercent"),
    "live-percent-fifty": ({"load.mode": "live", "load.livePercent": 50}, "spec.load.livePercent"),
    "live-split-unknown": ({"load.mode": "live", "load.livePercent": 5, "load.split": "istio"}, "spec.load.split"),
    "live-gateway-api-missing": ({"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI"},
                                 "spec.load.gatewayAPI"),
    "live-gateway-api-with-service-split": ({"load.mode": "live", "load.livePercent": 5, "load.gatewayAPI": {
        "httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat"}}}, "spec.load.gatewayAPI"),
    "live-gateway-api-rule-name-and-index": ({"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI",
                                              "load.gatewayAPI": {"httpRouteRef": {"name": "chat"}, "ruleName": "a",
                                                                  "ruleIndex": 0, "backendRef": {"name": "chat"}}},
                                             "spec.load.gatewayAPI.ruleIndex"),
    "live-gateway-api-pools-without-pickers": ({"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI",
                                                "load.gatewayAPI": {"httpRouteRef": {"name": "chat"}, "backendRef": {
                                                    "kind": "InferencePool", "name": "chat-pool"}}},
                                               "spec.load.gatewayAPI.endpointPickers"),
    "live-gateway-api-one-picker-for-both": ({"load.mode": "live", "load.livePercent": 5, "load.split": "gatewayAPI",
                                              "load.gatewayAPI": {"httpRouteRef": {"name": "chat"}, "backendRef": {
                                                  "kind": "InferencePool", "name": "chat-pool"}, "endpointPickers": {
                                                  "canary": {"name": "epp"}, "control": {"name": "epp"}}}},
                                             "spec.load.gatewayAPI.endpointPickers.control.name"),
    "abort-check-interval-above-1m": ({"analysis.abort": {"checkInterval": "2m", "window": "5m"}},
                                      "spec.analysis.abort.checkInterval"),
    "abort-window-below-check-interval": ({"analysis.abort": {"checkInterval": "30s", "window": "20s"}},
                                          "spec.analysis.abort.window"),
    "abort-window-below-sample-interval": ({"analysis.abort": {"checkInterval": "2s", "window": "3s"}},
                                           "spec.analysis.abort.window"),
    "abort-error-rate-zero": ({"analysis.abort": {"maxErrorRateIncrease": "0%"}},
                              "spec.analysis.abort.maxErrorRateIncrease"),
    "abort-ttft-below-10pct": ({"analysis.abort": {"maxTtftRegression": "5%"}}, "spec.analysis.abort.maxTtftRegression"),
    "abort-min-errors-zero": ({"analysis.abort": {"minErrors": 0}}, "spec.analysis.abort.minErrors"),
    "abort-blind-below-30s": ({"analysis.abort": {"maxBlind": "20s"}}, "spec.analysis.abort.maxBlind"),
    "abort-blind-below-check-interval": ({"analysis.abort": {"checkInterval": "45s", "maxBlind": "40s"}},
                                         "spec.analysis.abort.maxBlind"),
    "prompts-both-sources": ({"load.prompts": {"builtin": "chat", "configMapRef": {"name": "p"}}},
                             "spec.load.prompts"),
    "throughput-regression-150pct": ({"analysis.maxThroughputRegression": "150%"},
                                     "spec.analysis.maxThroughputRegression"),
    "latency-improvement-101": ({"analysis.minLatencyImprovement": 101}, "spec.analysis.minLatencyImprovement"),
    "percent-as-fraction-number": ({"analysis.maxThroughputRegression": 2.5}, "spec.analysis.maxThroughputRegression"),
    "confidence-1.5": ({"analysis.confidence": 1.5}, "spec.analysis.confidence"),
    "confidence-0.5": ({"analysis.confidence": 0.5}, "spec.analysis.confidence"),
    "deadline-shorter-than-step": ({"analysis.deadline": "1m"}, "spec.analysis.deadline"),
    "bad-prometheus-url": ({"analysis.prometheus": {"url": "prometheus:9090"}}, "spec.analysis.prometheus.url"),
    "waves-not-increasing": ({"promotion.waves": ["50%", "10%", "100%"]}, "spec.promotion.waves"),
    "waves-not-ending-at-100": ({"promotion.waves": ["10%", "50%"]}, "spec.promotion.waves"),
    "wave-above-100": ({"promotion.waves": ["10%", "150%"]}, "spec.promotion.waves[1]"),
    "unknown-promotion-mode": ({"promotion.mode": "yolo"}, "spec.promotion.mode"),
    "bad-guard-duration": ({"promotion.guard": {"duration": "forever"}}, "spec.promotion.guard.duration"),
    # refused at apply, naming the field (they were accepted, then left the policy Pending)
    "loadgen-image-empty": ({"load.loadgenImage": ""}, "spec.load.loadgenImage"),
    "loadgen-image-blank": ({"load.loadgenImage": "   "}, "spec.load.loadgenImage"),
    "configmap-key-dot": ({"load.prompts": {"configMapRef": {"name": "p", "key": "."}}},
                          "spec.load.prompts.configMapRef.key"),
    "configmap-key-dot-dot": ({"load.prompts": {"configMapRef": {"name": "p", "key": ".."}}},
                              "spec.load.prompts.configMapRef.key"),
    "configmap-key-with-slash": ({"load.prompts": {"configMapRef": {"name": "p", "key": "../prompts.jsonl"}}},
                                 "spec.load.prompts.configMapRef.key"),
    # Kubernetes refuses a key starting with '..' (validation.IsConfigMapKey): a mounted key is a file name
    "configmap-key-starting-with-dot-dot": ({"load.prompts": {"configMapRef": {"name": "p", "key": "..prompts"}}},
                                            "spec.load.prompts.configMapRef.key"),
    # physics: a spec that can never reach a verdict
    "step-too-short-for-samples": ({"load.stepDuration": "1m", "load.warmup": "30s", "load.minSamplesPerStep": 10},
                                   "spec.load.minSamplesPerStep"),
    "sample-interval-too-long": ({"analysis.sampleInterval": "30s"}, "spec.load.minSamplesPerStep"),
    "sample-interval-below-1s": ({"analysis.sampleInterval": "500ms"}, "spec.analysis.sampleInterval"),
    "deadline-too-short-for-sweep": ({"load.batchSizes": [1, 2, 4, 8], "analysis.deadline": "6m"},
                                     "spec.analysis.deadline"),
    # no deadline written: the rules compare the mode's default (30m; 1h live), as the model does
    "default-deadline-shorter-than-step": ({"load.stepDuration": "40m", "load.batchSizes": [1],
                                            "analysis.deadline": _DELETE},
                                           "spec.analysis.deadline"),
    "default-deadline-too-short-for-sweep": ({"load.stepDuration": "10m", "load.batchSizes": [1, 2, 4, 8],
                                              "analysis.deadline": _DELETE},
                                             "spec.analysis.deadline"),
    "default-live-deadline-shorter-than-step": ({"load.mode": "live", "load.livePercent": "10%",
                                                 "load.stepDuration": "70m", "analysis.deadline": _DELETE},
                                                "spec.analysis.deadline"),
    "latency-improvement-100pct": ({"analysis.minLatencyImprovement": "100%"}, "spec.analysis.minLatencyImprovement"),
    # the load generator's resources, as Kubernetes would refuse them on the Job
    "load-resources-bad-quantity": ({"load.resources": {"requests": {"cpu": "lots"}}},
                                    "spec.load.resources.requests.cpu"),
    "load-resources-not-a-quantity": ({"load.resources": {"requests": {"cpu": "1.2.3"}}},
                                      "spec.load.resources.requests"),
    "load-resources-negative": ({"load.resources": {"limits": {"memory": "-1Gi"}}}, "spec.load.resources.limits"),
    "load-resources-bad-name": ({"load.resources": {"requests": {"bad name": "1"}}}, "spec.load.resources.requests"),
    "load-request-above-limit": ({"load.resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}},
                                 "spec.load.resources.requests"),
    # label selectors validated as Kubernetes validates them
    "selector-bad-label-value": ({"targets.selector": {"matchLabels": {"app": "llm chat!"}}},
                                 "spec.targets.selector.matchLabels.app"),
    "selector-bad-label-key": ({"targets.selector": {"matchLabels": {"bad key": "x"}}},
                               "spec.targets.selector.matchLabels"),
    "selector-bad-expression-value": ({"targets.selector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["ok", "not ok"]}]}},
        "spec.targets.selector.matchExpressions[0].values[1]"),
    # PodMonitor labels (issue 24, item 3): Kubernetes label syntax, and never the operator's own
    "pod-monitor-label-ours": ({"analysis.prometheus.podMonitorLabels": {"lookahead.dev/policy": "other"}},
                               "spec.analysis.prometheus.podMonitorLabels"),
    "pod-monitor-label-managed-by": ({"analysis.prometheus.podMonitorLabels": {"app.kubernetes.io/managed-by": "Helm"}},
                                     "spec.analysis.prometheus.podMonitorLabels"),
    "pod-monitor-label-bad-key": ({"analysis.prometheus.podMonitorLabels": {"bad key": "x"}},
                                  "spec.analysis.prometheus.podMonitorLabels"),
    "pod-monitor-label-name-too-long": ({"analysis.prometheus.podMonitorLabels": {"n" * 64: "x"}},
                                        "spec.analysis.prometheus.podMonitorLabels"),
    "pod-monitor-label-prefix-too-long": ({"analysis.prometheus.podMonitorLabels": {"a" * 254 + "/x": "x"}},
                                          "spec.analysis.prometheus.podMonitorLabels"),
    "pod-monitor-label-bad-value": ({"analysis.prometheus.podMonitorLabels": {"release": "kube prometheus"}},
                                    "spec.analysis.prometheus.podMonitorLabels.release"),
    "pod-monitor-label-value-too-long": ({"analysis.prometheus.podMonitorLabels": {"release": "v" * 64}},
                                         "spec.analysis.prometheus.podMonitorLabels.release"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_policy_is_rejected_by_the_apiserver(objects, namespace, case):
    overrides, field = INVALID[case]
    name = unique_name(case)[:63]
    body = example_body(name, namespace)
    for dotted, value in overrides.items():
        _set(body["spec"], dotted, value)
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(G, V, namespace, P, body)
    assert err.value.status == 422, err.value.body
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid"
    fields = [c.get("field", "") for c in status["details"]["causes"]]
    assert any(f == field for f in fields), f"{case}: no cause for {field!r} in {fields}: {status['message']}"
    assert field in status["message"]
    # Nothing was stored.
    with pytest.raises(ApiException) as missing:
        objects.get_namespaced_custom_object(G, V, namespace, P, name)
    assert missing.value.status == 404
    # And the Python model refuses the same body (the two validators agree).
    with pytest.raises(ValueError):
        LookaheadPolicySpec.model_validate(body["spec"])


@pytest.mark.parametrize("length", [64, 253])
def test_a_name_too_long_for_a_label_value_is_refused_at_apply(objects, namespace, length):
    """Kubernetes allows 253-character names; the policy's name is a label value (63 at most) on
    everything it creates, so longer names are refused before anything can half-work."""
    name = ("p" + "-x" * 200)[:length]
    body = example_body(name, namespace)
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(G, V, namespace, P, body)
    assert err.value.status == 422 and "metadata.name must be at most 63" in err.value.body
    with pytest.raises(ValueError, match="at most 63"):
        LookaheadPolicy.from_body(body)
    ok = example_body(f"{name[:59].rstrip('-')}-{length}", namespace)  # a name that fits is accepted
    objects.create_namespaced_custom_object(G, V, namespace, P, ok)


# every Duration of the spec, each beyond the 24h bound: once far enough to overflow CEL's duration()
DURATIONS = ["load.stepDuration", "load.warmup", "analysis.deadline", "analysis.sampleInterval",
             "analysis.abort.checkInterval", "analysis.abort.window",
             "promotion.waveDuration", "promotion.guard.duration", "promotion.rolloutDeadline"]


@pytest.mark.parametrize("value", ["9999999h", "25h"])
@pytest.mark.parametrize("field", DURATIONS)
def test_a_duration_beyond_the_limit_is_refused_naming_the_field_and_the_limit(objects, namespace, field, value):
    """Refused on the field itself, with the limit; no rule on `spec` fails converting it (the
    cross-field rules skip a value out of range)."""
    name = unique_name("dur")[:63]
    body = example_body(name, namespace)
    _set(body["spec"], field, value)
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(G, V, namespace, P, body)
    assert err.value.status == 422, err.value.body
    causes = json.loads(err.value.body)["details"]["causes"]
    assert [c.get("field") for c in causes] == [f"spec.{field}"], causes
    assert causes[0]["message"].endswith(": must be at most 24h"), causes
    assert "conversion" not in err.value.body
    with pytest.raises(ValueError, match="must be at most 24h"):
        LookaheadPolicySpec.model_validate(body["spec"])


@pytest.mark.parametrize("engine", ["auto", "vllm", "sglang", "reference"])
@pytest.mark.parametrize("method", ["jacobi", "ngram", "ngram_gpu", "suffix"])
def test_method_on_engine_the_apiserver_and_the_model_agree(objects, namespace, method, engine):
    """One rule per (method, engine): accepted where the engine runs the method (and on auto),
    else refused on spec.lookahead.method with the model's own message."""
    from lookahead_operator.api.spec import method_engine_error

    name = unique_name(f"{method}-{engine}".replace("_", "-"))[:63]
    body = example_body(name, namespace)
    _set(body["spec"], "engine", engine)
    _set(body["spec"], "lookahead.method", method)
    message = method_engine_error(method, engine)
    runs = engine == "auto" or (method, engine) in {
        ("jacobi", "reference"), ("ngram", "vllm"), ("ngram", "sglang"), ("ngram", "reference"),
        ("ngram_gpu", "vllm"), ("suffix", "vllm")}
    if runs:
        assert message is None
        objects.create_namespaced_custom_object(G, V, namespace, P, body)
        stored = objects.get_namespaced_custom_object(G, V, namespace, P, name)["spec"]
        assert LookaheadPolicySpec.model_validate(stored).lookahead.method == method
        return
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(G, V, namespace, P, body)
    assert err.value.status == 422, err.value.body
    causes = json.loads(err.value.body)["details"]["causes"]
    assert [c.get("field") for c in causes] == ["spec.lookahead.method"], causes
    assert causes[0]["message"].endswith(f": {message}"), causes
    with pytest.raises(ValueError) as refused:
        LookaheadPolicySpec.model_validate(body["spec"])
    assert message in str(refused.value)


def test_the_operators_own_pod_monitor_label_is_refused_with_the_rule_in_words(objects, namespace):
    body = example_body(unique_name("pm-ours"), namespace)
    _set(body["spec"], "analysis.prometheus.podMonitorLabels", {"release": "kps", "lookahead.dev/role": "canary"})
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(G, V, namespace, P, body)
    assert err.value.status == 422, err.value.body
    message = json.loads(err.value.body)["message"]
    assert "analysis.prometheus.podMonitorLabels: label keys are Kubernetes label keys" in message
    assert "not the operator's own (lookahead.dev/*, app.kubernetes.io/managed-by)" in message
    with pytest.raises(ValueError, match="'lookahead.dev/role' is the operator's own"):
        LookaheadPolicySpec.model_validate(body["spec"])


def test_enough_invalid_cases():
    assert len(INVALID) >= 12


def _status() -> dict:
    now = datetime(2026, 11, 30, 3, 0, tzinfo=timezone.utc)
    return LookaheadPolicyStatus.model_validate({
        "phase": "Promoting",
        "message": "wave 1 of 3",
        "observedGeneration": 1,
        "specFingerprint": "0123456789abcdef",
        "phaseSince": now,
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Valid", "message": "spec is valid",
                        "lastTransitionTime": now, "observedGeneration": 1},
                       {"type": "Candidate", "status": "True", "reason": "DecodeBoundIdleCompute", "message": "",
                        "lastTransitionTime": now, "observedGeneration": 1}],
        "preflight": {"candidate": True, "verdict": "DecodeBoundIdleCompute", "reasons": ["decode 92% of request time"],
                      "missing": ["DCGM_FI_PROF_SM_ACTIVE"], "batchSizes": [1, 4, 16], "checkedAt": now},
        "targets": [{"namespace": "inference", "name": "chat-reference", "engine": "reference", "promoted": True,
                     "wave": 1, "savedTemplate": {"metadata": {"labels": {"app": "llm-chat"}},
                                                  "spec": {"containers": [{"name": "engine", "image": "x:1",
                                                                           "args": ["--port=8000"]}]}}}],
        "workloads": [{"kind": "Deployment", "namespace": "inference", "name": "lap-chat-fleet-canary",
                       "role": "canary", "target": "chat-reference"}],
        "batchSizes": [1, 4, 16],
        "batches": [
            {"batchSize": 1, "controlTpotMs": 21.0, "canaryTpotMs": 13.1, "tpotChange": -0.376,
             "tpotInterval": [-0.41, -0.33], "controlTokensPerSecond": 47.6, "canaryTokensPerSecond": 76.3,
             "throughputChange": 0.6, "throughputInterval": [0.5, 0.7], "acceptanceRate": 0.42, "samples": {"control": 120, "canary": 118},
             "verdict": "Wins"},
            {"batchSize": 16, "controlTpotMs": 30.0, "canaryTpotMs": 36.0, "tpotChange": 0.2,
             "tpotInterval": [0.15, 0.25], "throughputChange": -0.17, "throughputInterval": [-0.2, -0.14],
             "samples": {"control": 400, "canary": 390}, "confidence": 0.99, "latencyVerdict": "Worse",
             "throughputVerdict": "Worse", "verdict": "Regresses"}],
        "crossoverBatchSize": 16,
        "decision": {"id": "g1-a1b2", "action": "PromoteRegimeAware", "reason": "wins at 1 and 4, regresses at 16",
                     "decidedAt": now, "crossoverBatchSize": 16,
                     "regime": [{"start": 1, "end": 15, "enabled": True}, {"start": 16, "end": 256, "enabled": False}],
                     "outcomes": {"1": "Wins", "4": "Wins", "16": "Regresses"},
                     "config": {"speculativeConfig": {"method": "jacobi", "window": 7}, "lookaheadMaxBatchSize": 15},
                     "evidence": {"thresholds": {"maxThroughputRegression": 2.0}}},
        "currentWave": 1,
        "waves": [{"index": 1, "percent": 10, "state": "Guarding", "targets": ["inference/chat-reference"],
                   "startedAt": now, "throughputChange": -0.004},
                  {"index": 2, "percent": 50}, {"index": 3, "percent": 100}],
        "gates": {"paused": False, "awaitingApproval": False, "approved": True, "approvedGeneration": 1,
                  "approvedAt": now},
        "report": "configmap/lap-chat-fleet-report",
    }).to_dict()


def _get_table(api: client.ApiClient, path: str) -> dict:
    """GET ``path`` as a meta.k8s.io Table (what ``kubectl get`` shows)."""
    method, url, headers, body, post = api.param_serialize(
        "GET", path, header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"])
    resp = api.call_api(method, url, headers, body, post)
    resp.read()
    assert resp.status == 200, resp.data
    return json.loads(resp.data)


def test_status_subresource_stores_the_whole_status(kube_api, objects, namespace):
    name = unique_name("status")
    body = minimal_body(name, namespace)
    body["status"] = {"phase": "Succeeded"}
    objects.create_namespaced_custom_object(G, V, namespace, P, body)
    fresh = objects.get_namespaced_custom_object(G, V, namespace, P, name)
    assert "status" not in fresh  # status is ignored on create: it belongs to the subresource

    status = _status()
    objects.patch_namespaced_custom_object_status(G, V, namespace, P, name, {"status": status})
    stored = objects.get_namespaced_custom_object(G, V, namespace, P, name)
    assert stored["status"] == status  # nothing pruned, nothing rejected
    assert LookaheadPolicyStatus.model_validate(stored["status"]).to_dict() == status
    assert stored["metadata"]["generation"] == fresh["metadata"]["generation"]

    # An invalid status is refused too.
    with pytest.raises(ApiException) as err:
        objects.patch_namespaced_custom_object_status(G, V, namespace, P, name, {"status": {"phase": "Dancing"}})
    assert err.value.status == 422 and "status.phase" in err.value.body

    # Printer columns read the status.
    resp = _get_table(kube_api, f"/apis/{G}/{V}/namespaces/{namespace}/{P}/{name}")
    columns = [c["name"] for c in resp["columnDefinitions"]]
    assert columns == ["Name", "Phase", "Decision", "Crossover", "Wave", "Age"]
    cells = resp["rows"][0]["cells"]
    assert cells[:5] == [name, "Promoting", "PromoteRegimeAware", 16, 1]


def test_spec_edit_bumps_generation_status_patch_does_not(objects, namespace):
    name = unique_name("gen")
    objects.create_namespaced_custom_object(G, V, namespace, P, minimal_body(name, namespace))
    g1 = objects.get_namespaced_custom_object(G, V, namespace, P, name)["metadata"]["generation"]
    objects.patch_namespaced_custom_object_status(G, V, namespace, P, name, {"status": {"phase": "Preflight"}})
    assert objects.get_namespaced_custom_object(G, V, namespace, P, name)["metadata"]["generation"] == g1
    objects.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": {"lookahead": {"window": 5}}})
    after = objects.get_namespaced_custom_object(G, V, namespace, P, name)
    assert after["metadata"]["generation"] == g1 + 1 and after["spec"]["lookahead"]["window"] == 5
    # An edit that breaks a cross-field rule is refused on update too.
    with pytest.raises(ApiException) as err:
        objects.patch_namespaced_custom_object(G, V, namespace, P, name, {"spec": {"promotion": {"waves": ["60%", "50%", "100%"]}}})
    assert err.value.status == 422 and "spec.promotion.waves" in err.value.body


def test_example_fleet_applies_and_the_example_policy_selects_its_reference_deployment(kube_api, namespace):
    """examples/fleet-deployment.yaml is valid for the apiserver (server-side dry run; the
    Deployments into this test's namespace, since the dry-run Namespace is not created), and the
    example policy's selectors pick exactly the reference-engine Deployment in it."""
    from kubernetes.dynamic import DynamicClient

    from lookahead_operator.engines import detect_engine

    docs = [d for d in yaml.safe_load_all((REPO / "examples" / "fleet-deployment.yaml").read_text()) if d]
    dyn = DynamicClient(kube_api)
    for doc in docs:
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = namespace if resource.namespaced else None
        body = copy.deepcopy(doc)
        if ns:
            body["metadata"]["namespace"] = ns
        out = dyn.server_side_apply(resource, body=body, name=doc["metadata"]["name"], namespace=ns,
                                    field_manager="lookahead-example-test", dry_run="All")
        assert out.metadata.name == doc["metadata"]["name"]
    policy = LookaheadPolicy.from_body(yaml.safe_load(EXAMPLE.read_text()))
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    # its own namespace, the fleet's (a policy reaches others only where the cluster admin allows it)
    assert policy.spec.targets.namespaces is None and policy.spec.targets.namespace_selector is None
    assert yaml.safe_load(EXAMPLE.read_text())["metadata"]["namespace"] == namespace["metadata"]["name"]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert {name: detect_engine(d["spec"]["template"]) for name, d in deployments.items()} == {
        "chat-vllm": "vllm", "chat-reference": "reference"}
    selected = [n for n, d in deployments.items() if policy.spec.targets.selector.matches(d["metadata"]["labels"])]
    assert selected == ["chat-reference"]


def _strip_none(x):
    if isinstance(x, dict):
        return {k: _strip_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_strip_none(v) for v in x]
    return x


def test_status_written_by_the_decision_code_is_stored_unpruned(objects, namespace):
    """The rows and the decision the analysis code produces fit the CRD's status schema exactly:
    nothing is refused and nothing silently pruned (a schema drift would lose evidence)."""
    from lookahead_operator.measurement.decision import BatchComparison, decide
    from lookahead_operator.measurement.stats import ComparisonResult, Direction, Thresholds, Verdict

    th = Thresholds(min_latency_improvement=0.05, max_throughput_regression=0.02, confidence=0.99)

    def res(direction, est, lo, hi, n=400):
        return ComparisonResult(metric="m", direction=direction, threshold=0.05, confidence=0.99, n_control=n,
                                n_canary=n + 3, control_mean=0.02, canary_mean=0.02 * (1 + est), estimate=est,
                                interval=(lo, hi), verdict=Verdict.BETTER if est < 0 else Verdict.WORSE)

    verdicts = [
        BatchComparison(1, res(Direction.LOWER_IS_BETTER, -0.31, -0.35, -0.27),
                     res(Direction.HIGHER_IS_BETTER, 0.40, 0.33, 0.47), 0.42),
        BatchComparison(16, res(Direction.LOWER_IS_BETTER, 0.05, 0.03, 0.07),
                     res(Direction.HIGHER_IS_BETTER, -0.06, -0.08, -0.04)),
    ]
    rows = [v.to_status(th) for v in verdicts]
    decision = decide(verdicts, th, deadline_passed=False, max_batch_size=64).to_dict()
    decision.update(id="g1-test", decidedAt="2026-11-30T03:00:00Z")
    status = _strip_none({"phase": "Deciding", "batches": rows, "decision": decision,
                          "crossoverBatchSize": decision.get("crossoverBatchSize")})

    name = unique_name("decided")
    objects.create_namespaced_custom_object(G, V, namespace, P, minimal_body(name, namespace))
    objects.patch_namespaced_custom_object_status(G, V, namespace, P, name, {"status": status})
    stored = objects.get_namespaced_custom_object(G, V, namespace, P, name)["status"]
    assert stored == status
    parsed = LookaheadPolicyStatus.model_validate(stored)
    assert parsed.batches[0].samples.control == 400 and parsed.batches[1].verdict == "Regresses"
    assert parsed.decision.action == "PromoteRegimeAware" and parsed.decision.regime[0].enabled
