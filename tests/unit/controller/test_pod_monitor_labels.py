"""The labels on the PodMonitors the operator creates (issue 24, item 3): what a Prometheus'
``podMonitorSelector`` picks. kube-prometheus-stack's Prometheus selects PodMonitors labelled
``release: <its Helm release>``; the chart's ``podMonitor.labels`` (the operator's
``LOOKAHEAD_POD_MONITOR_LABELS``) puts labels on every PodMonitor, a policy's
``analysis.prometheus.podMonitorLabels`` over them. Label syntax is Kubernetes'; the operator's own
labels are refused, naming the field (or the variable)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from lookahead_operator.api.names import LABEL_MANAGED_BY, LABEL_POLICY, LABEL_POLICY_NAMESPACE, MANAGED_BY
from lookahead_operator.api.spec import LookaheadPolicySpec, PrometheusSpec, spec_error
from lookahead_operator.api.status import LookaheadPolicyStatus, Phase
from lookahead_operator.controller import actions
from lookahead_operator.controller import builders as b
from lookahead_operator.controller.world import Action, ActionKind, Observed, Target

from .test_engine_container import POLICY, PROXY, SERVE, T0, FakeKube, engine, pod, template

KPS = {"release": "kube-prometheus-stack"}
BASE = {"targets": {"selector": {"matchLabels": {"app": "chat"}}}, "lookahead": {"method": "ngram"},
        "load": {"batchSizes": [1]}}


def spec(labels=None) -> LookaheadPolicySpec:
    prom = {} if labels is None else {"podMonitorLabels": labels}
    return LookaheadPolicySpec.model_validate({**BASE, "analysis": {"prometheus": prom}})


# --- the builder ------------------------------------------------------------------------------

def test_the_labels_go_on_the_pod_monitors_metadata_beside_the_operators_own():
    mon = b.build_pod_monitor(POLICY, "serving", "serve", labels={**KPS, "team": "ml"})
    assert mon["metadata"]["labels"] == {**KPS, "team": "ml", LABEL_POLICY: "p", LABEL_POLICY_NAMESPACE: "serving",
                                         LABEL_MANAGED_BY: MANAGED_BY}
    # the selector and the endpoints are what they were: the labels pick the PodMonitor, not the pods
    assert mon["spec"] == b.build_pod_monitor(POLICY, "serving", "serve")["spec"]
    assert b.build_pod_monitor(POLICY, "serving")["metadata"]["labels"] == {
        LABEL_POLICY: "p", LABEL_POLICY_NAMESPACE: "serving", LABEL_MANAGED_BY: MANAGED_BY}


def test_the_operators_own_labels_win_over_any_that_got_through():
    mon = b.build_pod_monitor(POLICY, "serving", labels={LABEL_POLICY: "other", LABEL_MANAGED_BY: "helm"})
    assert mon["metadata"]["labels"][LABEL_POLICY] == "p" and mon["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY


def test_the_policys_labels_are_merged_over_the_charts():
    assert b.pod_monitor_labels(KPS, None) == KPS
    assert b.pod_monitor_labels(KPS, {"release": "monitoring", "team": "ml"}) == {"release": "monitoring", "team": "ml"}
    assert b.pod_monitor_labels({}, {"team": "ml"}) == {"team": "ml"}


# --- the chart's value, as the operator reads it --------------------------------------------------

@pytest.mark.parametrize("raw", [None, "", "  ", "null", "{}"])
def test_no_chart_labels(raw):
    assert b.chart_pod_monitor_labels(raw) == {}


def test_the_charts_labels_are_read():
    assert b.chart_pod_monitor_labels(json.dumps(KPS)) == KPS
    assert b.chart_pod_monitor_labels('{"release": "kps", "example.com/team": "ml", "empty": ""}') == {
        "release": "kps", "example.com/team": "ml", "empty": ""}


@pytest.mark.parametrize("raw, says", [
    ("release=kps", "not JSON"),
    ('["release"]', "expected a JSON object"),
    ('{"lookahead.dev/policy": "x"}', "'lookahead.dev/policy' is the operator's own"),
    ('{"app.kubernetes.io/managed-by": "Helm"}', "'app.kubernetes.io/managed-by' is the operator's own"),
    ('{"bad key": "x"}', "'bad key' is not a valid Kubernetes label key"),
    ('{"release": "kube prometheus"}', "value 'kube prometheus' is not a valid Kubernetes label value"),
    ('{"release": 1}', "keys and values are strings"),
    (json.dumps({"x" * 64: "v"}), "is not a valid Kubernetes label key"),
    (json.dumps({"k": "v" * 64}), "is not a valid Kubernetes label value"),
    (json.dumps({f"k{i}": "v" for i in range(17)}), "at most 16 labels"),
])
def test_bad_chart_labels_are_refused_naming_the_variable_and_the_chart_value(raw, says):
    with pytest.raises(ValueError) as err:
        b.chart_pod_monitor_labels(raw)
    assert str(err.value).startswith("LOOKAHEAD_POD_MONITOR_LABELS (the chart's podMonitor.labels): ")
    assert says in str(err.value)


# --- the policy's field -------------------------------------------------------------------------

def test_the_policys_labels_are_read_and_written_back():
    s = spec({"release": "monitoring", "example.com/team": "ml"})
    assert s.analysis.prometheus.pod_monitor_labels == {"release": "monitoring", "example.com/team": "ml"}
    assert s.to_dict()["analysis"]["prometheus"]["podMonitorLabels"] == {"release": "monitoring",
                                                                         "example.com/team": "ml"}
    assert spec().analysis.prometheus.pod_monitor_labels is None
    assert "podMonitorLabels" not in spec().to_dict()["analysis"]["prometheus"]
    # an absent field leaves a running policy's fingerprint as it was
    assert spec().fingerprint() == LookaheadPolicySpec.model_validate(BASE).fingerprint()


@pytest.mark.parametrize("labels, says", [
    ({"lookahead.dev/role": "canary"}, "'lookahead.dev/role' is the operator's own"),
    ({"lookahead.dev/anything": "x"}, "is the operator's own"),
    ({"app.kubernetes.io/managed-by": "Helm"}, "is the operator's own"),
    ({"no spaces": "x"}, "is not a valid Kubernetes label key"),
    ({"Example.com/team": "x"}, "is not a valid Kubernetes label key"),
    ({"release": "-kps"}, "is not a valid Kubernetes label value"),
])
def test_a_bad_policy_label_is_refused_naming_the_field(labels, says):
    with pytest.raises(ValidationError) as err:
        spec(labels)
    message = spec_error(err.value)
    assert message.startswith("spec.analysis.prometheus.podMonitorLabels: ")
    assert "analysis.prometheus.podMonitorLabels: " in message and says in message


def test_at_most_16_policy_labels():
    with pytest.raises(ValidationError):
        PrometheusSpec.model_validate({"podMonitorLabels": {f"k{i}": "v" for i in range(17)}})
    assert len(PrometheusSpec.model_validate({"podMonitorLabels": {f"k{i}": "v" for i in range(16)}})
               .pod_monitor_labels) == 16


def test_the_crd_rule_names_the_field_and_the_rule():
    crd = LookaheadPolicySpec.model_json_schema(by_alias=True)
    text = json.dumps(crd)
    assert "analysis.prometheus.podMonitorLabels: label keys are Kubernetes label keys" in text
    assert "!k.startsWith('lookahead.dev/')" in text and "'app.kubernetes.io/managed-by'" in text


# --- the action: the chart's labels, the policy's over them -----------------------------------------

def _ensure_roles(s: LookaheadPolicySpec, monkeypatch, chart: dict) -> dict:
    monkeypatch.setattr(actions, "POD_MONITOR_LABELS", chart)
    target = {"metadata": {"name": "a", "namespace": "serving", "resourceVersion": "1"},
              "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "chat"}},
                       "template": template(PROXY, engine(SERVE))}}
    k = FakeKube(target, {r: [pod(f"{r}-0", r, PROXY, engine(SERVE))] for r in b.ROLES})
    w = Observed(now=T0, name="p", namespace="serving", generation=1, spec=s,
                 status=LookaheadPolicyStatus(phase=Phase.Launching), targets=[Target("serving", "a", "vllm")])
    actions.ACTIONS[ActionKind.ENSURE_ROLES](actions.Ctx(k, POLICY, s, w), Action(ActionKind.ENSURE_ROLES))
    monitor, = (o for o in k.created if o["kind"] == "PodMonitor")
    return monitor


def test_the_operator_creates_the_pod_monitor_with_the_charts_labels_and_the_policys_over_them(monkeypatch):
    labels = _ensure_roles(spec(), monkeypatch, KPS)["metadata"]["labels"]
    assert labels["release"] == "kube-prometheus-stack" and labels[LABEL_POLICY] == "p"
    labels = _ensure_roles(spec({"release": "monitoring", "team": "ml"}), monkeypatch, KPS)["metadata"]["labels"]
    assert labels["release"] == "monitoring" and labels["team"] == "ml" and labels[LABEL_MANAGED_BY] == MANAGED_BY
    labels = _ensure_roles(spec(), monkeypatch, {})["metadata"]["labels"]
    assert "release" not in labels
