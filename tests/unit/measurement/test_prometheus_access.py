"""analysis.prometheus as Thanos, Mimir and managed Prometheus need it (issue 24): a bearer token
or basic auth from Secrets, a CA bundle, extra headers. The spec's rules (pydantic and CEL, one
message), the one mapping of the spec and its Secrets' values to a ``prometheus.PrometheusAccess``
(``access_from_spec``), and the one client builder (``prometheus.connect``), cached per URL and
credentials. The real server's side (basic auth, TLS, a tenant header) is tests/integration/
test_prometheus_auth.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lookahead_operator.api.spec import LookaheadPolicySpec, PrometheusSpec, spec_error
from lookahead_operator.measurement import measure, prometheus
from lookahead_dev import crdgen

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SECRETS = {("Secret", "prom", "token"): "t0ken\n", ("Secret", "prom", "user"): "alice\n",
           ("Secret", "prom", "password"): "s3cret\n", ("ConfigMap", "prom-ca", "ca.crt"): PEM,
           ("Secret", "prom-ca", "ca.crt"): PEM, ("Secret", "prom", "not-pem"): "hello"}


def read(kind: str, name: str, key: str) -> str:
    try:
        return SECRETS[(kind, name, key)]
    except KeyError:
        raise LookupError(f"{kind} team-a/{name} has no key {key!r}") from None


def prom(**fields) -> PrometheusSpec:
    return PrometheusSpec.model_validate({"url": "https://prometheus.example:9090/", **fields})


BASIC = {"username": {"name": "prom", "key": "user"}, "password": {"name": "prom", "key": "password"}}


def _crd_prometheus_rules() -> dict[str, list[dict]]:
    """The CEL rules of analysis.prometheus and below, by path."""
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node = spec["properties"]["analysis"]["properties"]["prometheus"]
    out = {"": node.get("x-kubernetes-validations", [])}
    out["headers"] = node["properties"]["headers"].get("x-kubernetes-validations", [])
    out["tlsConfig"] = node["properties"]["tlsConfig"].get("x-kubernetes-validations", [])
    out["tlsConfig.ca"] = node["properties"]["tlsConfig"]["properties"]["ca"].get("x-kubernetes-validations", [])
    return out


def test_bearer_token_or_basic_auth_not_both_with_the_crds_message():
    both = {"bearerTokenSecret": {"name": "prom", "key": "token"}, "basicAuth": BASIC}
    with pytest.raises(ValidationError) as err:
        prom(**both)
    msg = "analysis.prometheus: set at most one of bearerTokenSecret and basicAuth"
    assert msg in str(err.value)
    spec = {"targets": {"selector": {"matchLabels": {"app": "llm"}}}, "analysis": {"prometheus": both}}
    with pytest.raises(ValidationError) as err:
        LookaheadPolicySpec.model_validate(spec)
    assert spec_error(err.value).startswith("spec.analysis.prometheus") and msg in spec_error(err.value)
    assert [r["message"] for r in _crd_prometheus_rules()[""]] == [msg]
    prom(bearerTokenSecret={"name": "prom", "key": "token"})   # either alone is fine
    prom(basicAuth=BASIC)


@pytest.mark.parametrize("headers, ok", [
    ({"X-Scope-OrgID": "tenant-a"}, True),
    ({"THANOS-TENANT": "a|b"}, True),
    ({"X Scope": "a"}, False),                  # not an HTTP token
    ({"X-Scope-OrgID": "a\r\nInjected: 1"}, False),
    ({"Authorization": "Bearer x"}, False),     # credentials belong in a Secret
    ({"cookie": "a=b"}, False),
    ({"Host": "elsewhere"}, False),
    ({f"X-H{i}": "v" for i in range(17)}, False),
    ({"X-Long": "v" * 1025}, False),
])
def test_header_names_are_tokens_values_one_line_and_few(headers, ok):
    if ok:
        assert prom(headers=headers).headers == headers
        return
    with pytest.raises(ValidationError):
        prom(headers=headers)
    (rule,) = _crd_prometheus_rules()["headers"]
    assert "lowerAscii()" in rule["rule"] and "'authorization'" in rule["rule"]


def test_the_ca_comes_from_exactly_one_of_a_secret_or_a_configmap_and_excludes_skipping_verification():
    rules = _crd_prometheus_rules()
    with pytest.raises(ValidationError, match="set exactly one of secret or configMap"):
        prom(tlsConfig={"ca": {}})
    with pytest.raises(ValidationError, match="set exactly one of secret or configMap"):
        prom(tlsConfig={"ca": {"secret": {"name": "a", "key": "b"}, "configMap": {"name": "a", "key": "b"}}})
    with pytest.raises(ValidationError, match="set ca or insecureSkipVerify, not both"):
        prom(tlsConfig={"ca": {"secret": {"name": "a", "key": "b"}}, "insecureSkipVerify": True})
    assert [r["message"] for r in rules["tlsConfig.ca"]] == [
        "analysis.prometheus.tlsConfig.ca: set exactly one of secret or configMap"]
    assert [r["message"] for r in rules["tlsConfig"]] == [
        "analysis.prometheus.tlsConfig: set ca or insecureSkipVerify, not both"]
    for key in ("..", ".", "..data", "a/b", ""):
        with pytest.raises(ValidationError):
            prom(bearerTokenSecret={"name": "prom", "key": key})
    prom(bearerTokenSecret={"name": "prom", "key": ".token"})


def test_the_default_spec_is_unchanged_and_needs_no_secret():
    spec = PrometheusSpec()
    assert spec.to_dict() == {"url": "http://prometheus.monitoring:9090"}
    access = prometheus.access_from_spec(spec)       # no reader: nothing to read
    assert access == prometheus.PrometheusAccess(url="http://prometheus.monitoring:9090")
    assert access.http_headers() == {}


def test_secrets_resolve_into_the_access_trimmed_and_never_shown():
    a = prometheus.access_from_spec(prom(bearerTokenSecret={"name": "prom", "key": "token"},
                                         headers={"X-Scope-OrgID": "tenant-a"},
                                         tlsConfig={"ca": {"configMap": {"name": "prom-ca", "key": "ca.crt"}}}), read)
    assert a.url == "https://prometheus.example:9090" and a.error is None and a.ca_pem == PEM
    assert a.http_headers() == {"X-Scope-OrgID": "tenant-a", "Authorization": "Bearer t0ken"}
    b = prometheus.access_from_spec(prom(basicAuth=BASIC), read)
    assert b.basic_auth == ("alice", "s3cret") and b.bearer_token is None
    for shown in (repr(a), repr(b), str(b)):
        assert "t0ken" not in shown and "s3cret" not in shown and "BEGIN" not in shown
    skip = prometheus.access_from_spec(prom(tlsConfig={"insecureSkipVerify": True}), read)
    assert skip.insecure_skip_verify and skip.ca_pem is None


@pytest.mark.parametrize("fields, says", [
    ({"basicAuth": {**BASIC, "password": {"name": "prom", "key": "pw"}}},
     "analysis.prometheus.basicAuth.password: Secret team-a/prom has no key 'pw'"),
    ({"bearerTokenSecret": {"name": "gone", "key": "token"}},
     "analysis.prometheus.bearerTokenSecret: Secret team-a/gone has no key 'token'"),
    ({"tlsConfig": {"ca": {"secret": {"name": "prom", "key": "not-pem"}}}},
     "analysis.prometheus.tlsConfig.ca.secret: Secret prom key 'not-pem' holds no PEM certificate"),
])
def test_what_cannot_be_read_is_the_access_error_naming_the_field(fields, says):
    a = prometheus.access_from_spec(prom(**fields), read)
    assert a.error == says
    with pytest.raises(prometheus.CredentialsError, match="analysis.prometheus.") as err:
        prometheus.connect(a)
    assert isinstance(err.value, measure.READ_ERRORS)     # a read error like an unreachable Prometheus
    # without a reader (a caller that has none), a spec naming Secrets is an error too, never anonymous
    assert "was not read" in prometheus.access_from_spec(prom(**fields)).error


def test_one_client_per_url_and_credentials_a_changed_secret_gets_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setattr(prometheus.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(prometheus, "_clients", type(prometheus._clients)())
    spec = prom(basicAuth=BASIC, headers={"X-Scope-OrgID": "tenant-a"},
                tlsConfig={"ca": {"secret": {"name": "prom-ca", "key": "ca.crt"}}})
    c1 = prometheus.connect(prometheus.access_from_spec(spec, read), timeout=10)
    assert prometheus.connect(prometheus.access_from_spec(spec, read), timeout=10) is c1
    assert c1.url == "https://prometheus.example:9090" and c1.auth == ("alice", "s3cret")
    assert c1.headers == {"X-Scope-OrgID": "tenant-a"} and c1._timeout == 10
    with open(c1._session.verify) as f:                  # verified against the CA bundle alone
        assert f.read() == PEM
    SECRETS[("Secret", "prom", "password")] = "rotated"
    try:
        c2 = prometheus.connect(prometheus.access_from_spec(spec, read), timeout=10)
    finally:
        SECRETS[("Secret", "prom", "password")] = "s3cret\n"
    assert c2 is not c1 and c2.auth == ("alice", "rotated")
    assert prometheus.connect(prometheus.PrometheusAccess("https://p:9090"))._session.verify is True
    insecure = prometheus.access_from_spec(prom(tlsConfig={"insecureSkipVerify": True}))
    assert prometheus.connect(insecure)._session.verify is False
    for i in range(prometheus.MAX_CLIENTS + 5):           # bounded
        prometheus.connect(prometheus.PrometheusAccess(f"http://p{i}:9090"))
    assert len(prometheus._clients) == prometheus.MAX_CLIENTS


def test_every_measurement_raises_the_credentials_error_and_the_preflight_says_it():
    from datetime import datetime, timezone

    from types import SimpleNamespace

    from lookahead_operator.api.status import LookaheadPolicyStatus
    from lookahead_operator.measurement.results import GuardPods

    spec = LookaheadPolicySpec.model_validate({
        "targets": {"selector": {"matchLabels": {"app": "llm"}}},
        "analysis": {"prometheus": {"url": "http://p:9090", "basicAuth": BASIC}}})
    bad = prometheus.PrometheusAccess("http://p:9090", error="analysis.prometheus.basicAuth.password: Secret "
                                                             "team-a/prom not found")
    with pytest.raises(prometheus.CredentialsError, match="Secret team-a/prom not found"):
        measure.prom_client(spec, bad)
    with pytest.raises(prometheus.CredentialsError, match="was not read"):
        measure.prom_client(spec)                                # never queried without its credentials
    now = datetime(2026, 12, 5, 9, tzinfo=timezone.utc)
    measuring = LookaheadPolicyStatus.model_validate({"phase": "Measuring", "progress": {
        "batchSizes": [1], "step": 0, "loadStartedAt": "2026-12-05T08:50:00Z"}})
    with pytest.raises(prometheus.CredentialsError, match="basicAuth.password"):
        measure.step(spec, ("team-a", "p"), measuring, now, access=bad)
    guarding = LookaheadPolicyStatus.model_validate({"phase": "Guarding", "progress": {}})
    with pytest.raises(prometheus.CredentialsError, match="basicAuth.password"):
        measure.guard(spec, ("team-a", "p"), guarding, now, [], GuardPods(targets=(("team-a", "llm"),)), access=bad)
    fleet = [SimpleNamespace(namespace="team-a", name="llm", engine="reference")]
    result = measure.read_preflight(spec, fleet, now=now.timestamp(), access=bad)   # degrades, says why
    assert "CredentialsError: analysis.prometheus.basicAuth.password: Secret team-a/prom not found" in \
        " ".join(result.status.reasons or [])
