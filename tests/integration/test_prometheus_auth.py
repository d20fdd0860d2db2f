"""analysis.prometheus against a real Prometheus run as Thanos, Mimir and managed Prometheus are
(issue 24): basic auth and TLS through Prometheus' own ``--web.config.file`` (Debian's
/usr/bin/prometheus, ``DevPrometheus(web_config=...)``), with a CA made here.

Prometheus' web config knows basic auth and TLS only. For the bearer token and the tenant header,
a minimal header-recording reverse proxy stands in front of the real Prometheus, as an auth
gateway would (Mimir's, a managed Prometheus' front door): it records what it is sent, answers 401
to a request without the right bearer token, and forwards the rest to the real, TLS and basic-auth
Prometheus.

Every query goes the operator's way: the spec's ``analysis.prometheus`` and its Secrets' values ->
``prometheus.access_from_spec`` -> ``measure.prom_client`` (``prometheus.connect``) -> the query functions
the measurement uses (``prometheus.raw_samples``, which raises ``ObservationError``, a read error).
Reading the Secrets through the kube layer and the condition a missing one gives are unit-tested
(tests/unit/controller/test_prometheus_credentials.py).
"""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import threading
import time

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lookahead_dev.devcluster import DevPrometheus
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.measurement import measure, prometheus

pytestmark = pytest.mark.integration

USER, PASSWORD, TOKEN = "lookahead", "s3cret-pw", "t0ken-abc"
# bcrypt of PASSWORD at cost 4 (cheap for Prometheus to check per request), made with
# crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)); no bcrypt module here
PASSWORD_BCRYPT = "$2b$04$g6DTI8tlrK4/0j9qZZoVoOS5MHfpZ0uHlVF0nTD1fpglpYhyPsDEK"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def pem(cert) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A CA, the server certificate it signs for 127.0.0.1, and another CA that signed nothing here."""
    d = tmp_path_factory.mktemp("prometheus-tls")
    ca_key, ca = make_ca("lookahead test CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name("prometheus")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / "server.crt").write_text(pem(cert))
    (d / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    _, wrong = make_ca("another CA")
    return {"ca": pem(ca), "wrong_ca": pem(wrong), "dir": d}


@pytest.fixture(scope="module")
def secure_prometheus(tls, tmp_path_factory):
    """A real Prometheus that serves only https (our CA's certificate) and only with basic auth."""
    web = {"tls_server_config": {"cert_file": str(tls["dir"] / "server.crt"), "key_file": str(tls["dir"] / "server.key")},
           "basic_auth_users": {USER: PASSWORD_BCRYPT}}
    prom = DevPrometheus(tmp_path_factory.mktemp("secure-prometheus"), web_config=web)
    prom.start()
    assert prom.url.startswith("https://127.0.0.1:")
    yield prom
    prom.stop()


class Store:
    """The Secrets and ConfigMaps of the policy's namespace, as ``Kube.data_key`` answers them."""

    def __init__(self, **values: str):
        self.values = {("Secret", "prom", k): v for k, v in values.items()}

    def read(self, kind: str, name: str, key: str) -> str:
        try:
            return self.values[(kind, name, key)]
        except KeyError:
            raise LookupError(f"{kind} team-a/{name} has no key {key!r}") from None


def spec_for(url: str, **prom) -> LookaheadPolicySpec:
    return LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "llm"}}},
                                               "analysis": {"prometheus": {"url": url, **prom}}})


BASIC = {"username": {"name": "prom", "key": "user"}, "password": {"name": "prom", "key": "password"}}
CA = {"ca": {"secret": {"name": "prom", "key": "ca.crt"}}}


def query(spec: LookaheadPolicySpec, store: Store) -> dict:
    """One query the operator's way; raises ``prometheus.ObservationError`` (a read error)."""
    access = prometheus.access_from_spec(spec.analysis.prometheus, store.read)
    client = measure.prom_client(spec, access)
    now = time.time()
    # what every measurement reads with: raw samples of a series (Prometheus' own, scraped by none:
    # an empty answer is an answer), then a constant to see a value come back
    assert prometheus.raw_samples(client, "up", prometheus.selector({"job": "none"}), now - 60, now) == {}
    try:
        (row,) = client.custom_query(query="vector(7)")
    except Exception as exc:  # noqa: BLE001 - as raw_samples words it
        raise prometheus.ObservationError(str(exc)) from exc
    return row


def test_basic_auth_and_a_ca_bundle_reach_the_https_prometheus(secure_prometheus, tls):
    store = Store(user=f"{USER}\n", password=f"{PASSWORD}\n", **{"ca.crt": tls["ca"]})
    row = query(spec_for(secure_prometheus.url, basicAuth=BASIC, tlsConfig=CA), store)
    assert row["value"][1] == "7"


def test_wrong_or_missing_credentials_are_a_clear_read_error_and_a_fixed_secret_is_picked_up(secure_prometheus, tls):
    spec = spec_for(secure_prometheus.url, basicAuth=BASIC, tlsConfig=CA)
    store = Store(user=USER, password="wrong", **{"ca.crt": tls["ca"]})
    with pytest.raises(prometheus.ObservationError, match="HTTP Status Code 401") as err:
        query(spec, store)
    assert isinstance(err.value, measure.READ_ERRORS) and "wrong" not in str(err.value)
    with pytest.raises(prometheus.ObservationError, match="HTTP Status Code 401"):
        query(spec_for(secure_prometheus.url, tlsConfig=CA), store)             # no credentials at all
    store.values[("Secret", "prom", "password")] = PASSWORD                    # the Secret is fixed: next pass works
    assert query(spec, store)["value"][1] == "7"


def test_a_wrong_ca_or_the_system_cas_are_refused_skipping_verification_is_not(secure_prometheus, tls):
    store = Store(user=USER, password=PASSWORD, **{"ca.crt": tls["wrong_ca"]})
    for spec in (spec_for(secure_prometheus.url, basicAuth=BASIC, tlsConfig=CA),   # another CA's bundle
                 spec_for(secure_prometheus.url, basicAuth=BASIC)):                 # the system's CAs
        with pytest.raises(prometheus.ObservationError, match="CERTIFICATE_VERIFY_FAILED"):
            query(spec, store)
    insecure = spec_for(secure_prometheus.url, basicAuth=BASIC, tlsConfig={"insecureSkipVerify": True})
    assert query(insecure, store)["value"][1] == "7"


class Gateway(http.server.ThreadingHTTPServer):
    """A minimal auth gateway in front of the real Prometheus: records each request's headers,
    answers 401 without ``Authorization: Bearer <token>``, forwards the rest (GET) upstream over
    TLS with basic auth. Prometheus' web config has no bearer tokens or tenant headers of its own."""

    daemon_threads = True

    def __init__(self, upstream: str, ca_file: str, token: str):
        self.upstream, self.ca_file, self.token = upstream, ca_file, token
        self.seen: list[dict[str, str]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), GatewayHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class GatewayHandler(http.server.BaseHTTPRequestHandler):
    server: Gateway

    def do_GET(self):  # noqa: N802 - http.server's name
        with self.server.lock:
            self.server.seen.append(dict(self.headers.items()))
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._answer(401, b"unauthorized\n", "text/plain")
            return
        r = requests.get(self.server.upstream + self.path, auth=(USER, PASSWORD), verify=self.server.ca_file,
                         timeout=10)
        self._answer(r.status_code, r.content, r.headers.get("Content-Type", "application/json"))

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def gateway(secure_prometheus, tls):
    ca_file = tls["dir"] / "ca.crt"
    ca_file.write_text(tls["ca"])
    gw = Gateway(secure_prometheus.url, str(ca_file), TOKEN)
    thread = threading.Thread(target=gw.serve_forever, daemon=True)
    thread.start()
    yield gw
    gw.shutdown()
    gw.server_close()


def test_a_bearer_token_and_a_tenant_header_reach_the_server(gateway):
    spec = spec_for(gateway.url, bearerTokenSecret={"name": "prom", "key": "token"},
                    headers={"X-Scope-OrgID": "tenant-a"})
    assert query(spec, Store(token=f"{TOKEN}\n"))["value"][1] == "7"
    assert gateway.seen and all(h.get("X-Scope-OrgID") == "tenant-a" and h.get("Authorization") == f"Bearer {TOKEN}"
                                for h in gateway.seen)
    gateway.seen.clear()
    with pytest.raises(prometheus.ObservationError, match="HTTP Status Code 401"):
        query(spec, Store(token="expired"))
    assert [h.get("Authorization") for h in gateway.seen] == ["Bearer expired"]


# ------------------------------------------------------------------------------------------
# the real apiserver: the CRD's rules, and Secrets read through the operator's kube layer


@pytest.fixture(scope="module")
def policy_namespace(kube_api):
    from .helpers import namespace_while_used
    from .test_crd import install_crd

    install_crd(kube_api)
    yield from namespace_while_used(kube_api, "prom-auth")


def _policy(namespace: str, name: str, prom: dict) -> dict:
    from lookahead_operator.api.names import API_VERSION, KIND

    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"targets": {"selector": {"matchLabels": {"app": "llm"}}},
                     "analysis": {"prometheus": {"url": "https://mimir.example/prometheus", **prom}}}}


@pytest.mark.parametrize("prom, says", [
    ({"bearerTokenSecret": {"name": "prom", "key": "token"}, "basicAuth": BASIC},
     "analysis.prometheus: set at most one of bearerTokenSecret and basicAuth"),
    ({"headers": {"Authorization": "Bearer x"}}, "analysis.prometheus.headers: header names are HTTP tokens"),
    ({"headers": {"X Scope": "a"}}, "analysis.prometheus.headers: header names are HTTP tokens"),
    ({"tlsConfig": {"ca": {}}}, "analysis.prometheus.tlsConfig.ca: set exactly one of secret or configMap"),
    ({"tlsConfig": {**CA, "insecureSkipVerify": True}}, "set ca or insecureSkipVerify, not both"),
    ({"bearerTokenSecret": {"name": "prom", "key": ".."}}, "spec.analysis.prometheus.bearerTokenSecret.key"),
])
def test_the_apiserver_refuses_what_the_model_refuses_with_its_message(kube_api, policy_namespace, prom, says):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from lookahead_operator.api.names import GROUP, PLURAL, VERSION

    objects = client.CustomObjectsApi(kube_api)
    body = _policy(policy_namespace, f"bad-{time.monotonic_ns() % 10**8}", prom)
    with pytest.raises(ApiException) as err:
        objects.create_namespaced_custom_object(GROUP, VERSION, policy_namespace, PLURAL, body)
    assert err.value.status == 422 and says in err.value.body, err.value.body
    with pytest.raises(ValueError):
        LookaheadPolicySpec.model_validate(body["spec"])


def test_a_policy_with_every_field_is_stored_as_written(kube_api, policy_namespace):
    from kubernetes import client

    from lookahead_operator.api.names import GROUP, PLURAL, VERSION

    prom = {"basicAuth": BASIC, "tlsConfig": {"ca": {"configMap": {"name": "prom-ca", "key": "ca.crt"}}},
            "headers": {"X-Scope-OrgID": "tenant-a", "THANOS-TENANT": "a"}}
    body = _policy(policy_namespace, f"ok-{time.monotonic_ns() % 10**8}", prom)
    got = client.CustomObjectsApi(kube_api).create_namespaced_custom_object(GROUP, VERSION, policy_namespace,
                                                                             PLURAL, body)
    stored = got["spec"]["analysis"]["prometheus"]
    assert stored == {"url": "https://mimir.example/prometheus", **prom,
                      "tlsConfig": {**prom["tlsConfig"], "insecureSkipVerify": False}}
    assert LookaheadPolicySpec.model_validate(got["spec"]).analysis.prometheus.to_dict() == stored


def test_secrets_read_through_the_kube_layer_reach_the_https_prometheus(kube_api, devcluster, policy_namespace,
                                                                        secure_prometheus, tls):
    """What a pass does: ``observe.prometheus_access`` reads the Secret (``Kube.data_key``, by name,
    in the policy's namespace) and the measurement queries with it."""
    from kubernetes import client

    from lookahead_operator.controller import observe
    from lookahead_operator.kube.client import Kube

    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(policy_namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="prom"), string_data={"user": USER, "password": PASSWORD}))
    core.create_namespaced_config_map(policy_namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="prom-ca"), data={"ca.crt": tls["ca"]}))
    spec = spec_for(secure_prometheus.url, basicAuth=BASIC,
                    tlsConfig={"ca": {"configMap": {"name": "prom-ca", "key": "ca.crt"}}})
    k = Kube(devcluster.api_client())                                   # the operator's own client layer
    access = observe.prometheus_access(k, policy_namespace, spec)
    assert access.error is None and access.basic_auth == (USER, PASSWORD)
    (row,) = measure.prom_client(spec, access).custom_query(query="vector(7)")
    assert row["value"][1] == "7"
    core.patch_namespaced_secret("prom", policy_namespace, {"stringData": {"password": "rotated"}})
    rotated = observe.prometheus_access(k, policy_namespace, spec)
    assert rotated.basic_auth == (USER, "rotated")                       # picked up on the next pass
    with pytest.raises(Exception, match="HTTP Status Code 401"):
        measure.prom_client(spec, rotated).custom_query(query="vector(7)")
    core.delete_namespaced_secret("prom", policy_namespace)
    gone = observe.prometheus_access(k, policy_namespace, spec)
    assert gone.error == f"analysis.prometheus.basicAuth.username: Secret {policy_namespace}/prom not found"
    with pytest.raises(prometheus.CredentialsError):
        measure.prom_client(spec, gone)
