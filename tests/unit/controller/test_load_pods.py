"""Load generator Pods placed and pulled as the cluster needs (issue 24, item 5): nodeSelector,
tolerations, priorityClassName and imagePullSecrets from the policy's ``load``, each left out
taken from the operator's defaults (the chart's operator.loadJobs)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.controller import loadjobs

from ..kube.test_cache import POLICY, pod

T = datetime(2026, 12, 5, tzinfo=timezone.utc)
DEFAULTS = loadjobs.pod_defaults('{"nodeSelector": {"pool": "general"}, "tolerations": [], '
                                 '"priorityClassName": "batch-low", "imagePullSecrets": [{"name": "regcred"}]}')


def spec(**load) -> LookaheadPolicySpec:
    return LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "llm"}}},
                                               "engine": "reference", "load": {"batchSizes": [1], **load}})


def pod_specs(s: LookaheadPolicySpec, monkeypatch, defaults: dict) -> list[dict]:
    monkeypatch.setattr(loadjobs, "POD_DEFAULTS", defaults)
    jobs = loadjobs.step_jobs(s, POLICY, "team-a", 0, 1, 4, {"canary": [pod("canary")], "control": [pod("control")]},
                              T, T)
    assert len(jobs) == 2
    return [j["spec"]["template"]["spec"] for j in jobs]


def test_the_policy_s_fields_win_and_the_operator_s_fill_the_rest(monkeypatch):
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for ps in pod_specs(spec(nodeSelector={"pool": "cpu"}, tolerations=gpu), monkeypatch, DEFAULTS):
        assert ps["nodeSelector"] == {"pool": "cpu"} and ps["tolerations"] == gpu
        assert ps["priorityClassName"] == "batch-low" and ps["imagePullSecrets"] == [{"name": "regcred"}]
        assert ps["containers"][0]["name"] == "loadgen"            # the rest of the pod as before
    # neither sets them: the pod spec has none of the four (the cluster's own defaults apply)
    for ps in pod_specs(spec(), monkeypatch, {}):
        assert not {"nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"} & set(ps)


def test_bad_fields_are_refused_naming_them():
    with pytest.raises(ValidationError, match="a toleration with operator Exists has no value"):
        spec(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])
    with pytest.raises(ValidationError, match="nodeSelector key 'no spaces' is not a valid"):
        spec(nodeSelector={"no spaces": "x"})
    with pytest.raises(ValidationError, match="priority_class_name|priorityClassName"):
        spec(priorityClassName="Batch")


def test_the_operator_s_defaults_are_checked_alike_and_named():
    assert loadjobs.pod_defaults(None) == {} and loadjobs.pod_defaults("") == {}
    # the chart's empty values render as empty fields: none set
    assert loadjobs.pod_defaults('{"nodeSelector": {}, "tolerations": [], "priorityClassName": "", '
                                 '"imagePullSecrets": []}') == {}
    for raw, says in (('{"nodeSelectr": {}}', "expected an object with only nodeSelector"),
                      ('{"tolerations": [{"operator": "Exists", "value": "x"}]}', "tolerations.0: "),
                      ("{", "Expecting property name")):
        with pytest.raises(ValueError, match=says) as err:
            loadjobs.pod_defaults(raw)
        assert str(err.value).startswith("LOOKAHEAD_LOAD_POD_DEFAULTS (the chart's operator.loadJobs): ")
