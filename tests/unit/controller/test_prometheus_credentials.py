"""A Secret that analysis.prometheus names but that cannot be read is data, not a crash: the pass
reads it through the kube layer (``Kube.data_key``), the measurement raises it as a read error
naming the field, and the state machine shows it in ``MetricsAvailable`` while the deadlines run
(issue 24). The mapping itself is tests/unit/measurement/test_prometheus_access.py."""

from __future__ import annotations

import base64
from datetime import datetime, timezone

import pytest
from kubernetes.client.rest import ApiException

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase
from lookahead_operator.controller import observe
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.kube import cache
from lookahead_operator.kube import client as kube

from ..kube.test_cache import FakeKube, target

NOW = datetime(2026, 12, 5, 9, tzinfo=timezone.utc)
BASIC = {"username": {"name": "prom", "key": "user"}, "password": {"name": "prom", "key": "password"}}
POLICY = {"targets": {"selector": {"matchLabels": {"app": "llm"}}}, "engine": "reference",
          "load": {"batchSizes": [1]},
          "analysis": {"prometheus": {"url": "https://mimir.example/prometheus", "basicAuth": BASIC,
                                      "headers": {"X-Scope-OrgID": "tenant-a"}}}}


class Objects(kube.Kube):
    """The kube layer over canned apiserver answers (``request`` is its one transport)."""

    def __init__(self, objects: dict[str, dict | ApiException]):
        self.objects = objects
        self.paths: list[str] = []

    def request(self, method, path, *, query=None, body=None, content_type="application/json", ignore=()):
        self.paths.append(path)
        got = self.objects.get(path)
        if isinstance(got, ApiException):
            raise got
        if got is None and 404 in ignore:
            return None
        return got


def secret(**data: str) -> dict:
    return {"kind": "Secret", "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


SECRET_PATH = "/api/v1/namespaces/team-a/secrets/prom"


def test_data_key_reads_a_secret_by_name_and_says_what_is_missing_never_a_value():
    k = Objects({SECRET_PATH: secret(user="alice", password="s3cret\n"),
                 "/api/v1/namespaces/team-a/configmaps/ca": {"data": {"ca.crt": "PEM"}},
                 "/api/v1/namespaces/team-a/secrets/locked": ApiException(status=403, reason="Forbidden"),
                 "/api/v1/namespaces/team-a/secrets/binary": {"data": {"k": base64.b64encode(b"\xff").decode()}}})
    assert k.data_key("Secret", "team-a", "prom", "password") == "s3cret\n"
    assert k.data_key("ConfigMap", "team-a", "ca", "ca.crt") == "PEM"
    assert k.paths == [SECRET_PATH, "/api/v1/namespaces/team-a/configmaps/ca"]   # by name: no list, no watch
    for name, key, says in (("gone", "x", "Secret team-a/gone not found"),
                            ("prom", "token", "Secret team-a/prom has no key 'token' (its keys: password, user)"),
                            ("locked", "x", "Secret team-a/locked could not be read (HTTP 403 Forbidden"),
                            ("binary", "k", "Secret team-a/binary key 'k' is not UTF-8 text")):
        with pytest.raises(kube.DataKeyError) as err:
            k.data_key("Secret", "team-a", name, key)
        assert str(err.value).startswith(says) and "s3cret" not in str(err.value)


def test_the_pass_resolves_the_secrets_of_the_policys_namespace():
    spec = LookaheadPolicySpec.model_validate(POLICY)
    k = Objects({SECRET_PATH: secret(user="alice", password="s3cret")})
    access = observe.prometheus_access(k, "team-a", spec)
    assert access.basic_auth == ("alice", "s3cret") and access.error is None
    assert access.http_headers() == {"X-Scope-OrgID": "tenant-a"} and access.url == "https://mimir.example/prometheus"
    k.objects[SECRET_PATH] = secret(user="alice", password="rotated")    # read each pass: a rotation is picked up
    assert observe.prometheus_access(k, "team-a", spec).basic_auth == ("alice", "rotated")
    del k.objects[SECRET_PATH]
    assert observe.prometheus_access(k, "team-a", spec).error == \
        "analysis.prometheus.basicAuth.username: Secret team-a/prom not found"


class Reads(FakeKube):
    """A cached view's reads besides the caches: no fleet pod; Secrets through the kube layer."""

    def __init__(self, objects: dict):
        super().__init__()
        self.kube = Objects(objects)

    def pods(self, namespace, selector):
        return []

    def data_key(self, kind, namespace, name, key):
        return self.kube.data_key(kind, namespace, name, key)


def test_a_missing_secret_is_a_metrics_condition_naming_the_field_and_measuring_waits():
    spec = LookaheadPolicySpec.model_validate(POLICY)
    status = LookaheadPolicyStatus.model_validate({
        "phase": "Measuring",
        "progress": {"fingerprint": spec.fingerprint(), "fingerprintGeneration": 1, "batchSizes": [1], "step": 0,
                     "loadStartedAt": "2026-12-05T08:58:00Z", "stepStartedAt": "2026-12-05T08:58:00Z",
                     "measuringStartedAt": "2026-12-05T08:58:00Z"}})
    snap = cache.Snapshot(namespaces={"team-a": {}})
    snap.deployments["team-a"] = [cache.slim_deployment(target("team-a"))]
    body = {"metadata": {"name": "bench", "namespace": "team-a", "generation": 1}}
    reads = Reads({})
    world = observe.observe(cache.CachedView(reads, snap), body, spec, None, status, NOW)
    assert reads.kube.paths == [SECRET_PATH]
    (err,) = world.read_errors
    assert err.source == "prometheus" and world.step is None
    assert "CredentialsError: analysis.prometheus.basicAuth.username: Secret team-a/prom not found" in err.message
    plan = sm.reconcile(world)
    metrics = next(c for c in plan.status.conditions if c.type == ConditionType.MetricsAvailable)
    assert (metrics.status, metrics.reason) == ("False", "ReadFailed")
    assert "Secret team-a/prom not found" in metrics.message and plan.status.phase == Phase.Measuring
    assert plan.status.progress.read_errors == 1
