"""``load.resources``: the load generator Pods' requests and limits, refused as Kubernetes would
refuse them, and rendered on every load Job (the soak runs ten policies on one 2-core node with
small requests: the default 250m per generator would leave most of them Pending)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from lookahead_operator.controller import builders as b
from lookahead_operator.controller import loadjobs
from lookahead_operator.api.spec import LoadResources, LoadSpec, LookaheadPolicySpec

T_JOBS = datetime(2026, 12, 1, tzinfo=timezone.utc)  # when a step's load Jobs are built (their duration is tested in test_statemachine)


def test_defaults_are_the_documented_ones_and_what_a_job_gets_without_a_spec():
    assert LoadSpec().resources.as_container() == {"requests": {"cpu": "250m", "memory": "256Mi"},
                                                  "limits": {"memory": "512Mi"}}
    job = b.build_load_job({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "ns", "canary", 0, 1, 1,
                           "http://10.0.0.1:8000", 60, "img", "chat")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == LoadResources().as_container()


def test_a_given_map_replaces_the_default_map_whole_and_integers_are_kept_as_quantities():
    r = LoadSpec.model_validate({"resources": {"requests": {"cpu": "20m"}, "limits": {"cpu": 1}}}).resources
    assert r.as_container() == {"requests": {"cpu": "20m"}, "limits": {"cpu": "1"}}
    assert LoadResources(requests={}, limits={}).as_container() == {}


@pytest.mark.parametrize("resources, field, words", [
    ({"requests": {"cpu": "lots"}}, "requests.cpu", "expected a quantity"),
    ({"requests": {"cpu": "1.2.3"}}, "requests.cpu", "expected a quantity"),
    ({"limits": {"memory": "-1Gi"}}, "limits.memory", "cannot be negative"),
    ({"requests": {"cpu": True}}, "requests.cpu", "expected a quantity"),
    ({"requests": {"bad name": "1"}}, "requests", "not a resource name"),
    ({"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}}, "resources", "above limits.memory"),
])
def test_bad_resources_name_the_field(resources, field, words):
    with pytest.raises(ValidationError) as err:
        LoadSpec.model_validate({"resources": resources})
    text = str(err.value)
    assert f"resources.{field}" in text or field == "resources", text
    assert words in text


def test_step_jobs_carry_the_policys_resources():
    spec = LookaheadPolicySpec.model_validate({
        "targets": {"selector": {"matchLabels": {"app": "chat"}}},
        "load": {"batchSizes": [1], "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}}})
    policy = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}

    def pod(name, role):
        return {"metadata": {"name": name, "namespace": "ns", "labels": {b.LABEL_ROLE: role}},
                "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
                "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}}

    jobs = loadjobs.step_jobs(spec, policy, "ns", 0, 1, 1, {r: [pod(f"{r}-0", r)] for r in b.ROLES}, T_JOBS, T_JOBS)
    assert len(jobs) == 2
    for j in jobs:
        assert j["spec"]["template"]["spec"]["containers"][0]["resources"] == {
            "requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
