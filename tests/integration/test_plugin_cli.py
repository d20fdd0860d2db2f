"""`kubectl-lookahead approve|abort|pause|resume|status|report` against the real local apiserver,
run as a new user runs it: a subprocess with a kubeconfig we write. Every failure is exactly one
line on stderr, no traceback, the documented exit status, and the line names the cause."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_operator.cli import plugin
from lookahead_dev.devcluster import free_port

from .helpers import namespace_while_used
from .test_crd import install_crd

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def crd(kube_api):
    """The LookaheadPolicy CRD, installed and established."""
    return install_crd(kube_api)


@pytest.fixture(scope="module")
def namespace(kube_api):
    yield from namespace_while_used(kube_api, "plugin-cli")


@pytest.fixture(scope="module")
def policy(kube_api, crd, namespace):
    """A minimal valid LookaheadPolicy (only spec.targets.selector), with a status row written the
    way the operator writes it."""
    api = client.CustomObjectsApi(kube_api)
    name = "chat-fleet"
    api.create_namespaced_custom_object(plugin.GROUP, plugin.VERSION, namespace, plugin.PLURAL, {
        "apiVersion": f"{plugin.GROUP}/{plugin.VERSION}", "kind": "LookaheadPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"targets": {"selector": {"matchLabels": {"app": "llm-chat"}}}}})
    api.patch_namespaced_custom_object_status(plugin.GROUP, plugin.VERSION, namespace, plugin.PLURAL, name, {
        "status": {"phase": "Measuring", "message": "measuring batch size 8", "batches": [
            {"batchSize": 1, "controlTpotMs": 1234.5678, "canaryTpotMs": 987.6543, "tpotChange": -0.2,
             "tpotInterval": [-0.2512, -0.1487], "controlTokensPerSecond": 123456.78,
             "canaryTokensPerSecond": 234567.89, "throughputChange": 0.9001, "throughputInterval": [0.8512, 0.9543],
             "acceptanceRate": 0.4242, "samples": {"control": 12345, "canary": 23456}, "verdict": "Wins"},
            {"batchSize": 8, "verdict": "Pending"}]}})
    return name


def _kubeconfig(devcluster) -> dict:
    return yaml.safe_load(Path(devcluster.kubeconfig).read_text())


def _write(tmp_path: Path, cfg: dict | str, name: str = "kubeconfig") -> Path:
    path = tmp_path / name
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return path


def _token_kubeconfig(devcluster, token: str) -> dict:
    ca = base64.b64encode(Path(devcluster.ca_file).read_bytes()).decode()
    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "dev", "cluster": {"server": devcluster.server, "certificate-authority-data": ca}}],
            "users": [{"name": "someone", "user": {"token": token}}],
            "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "someone"}}],
            "current-context": "dev"}


def cli(tmp_path: Path, *args: str, kubeconfig: Path | str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """``kubectl-lookahead ARGS`` with a clean environment: HOME is an empty directory, so nothing
    but the kubeconfig we name is read."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if k not in ("KUBECONFIG", "COLUMNS", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    base["HOME"] = str(home)
    if kubeconfig is not None:
        base["KUBECONFIG"] = str(kubeconfig)
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "lookahead_operator.cli.main", *args], cwd=tmp_path, env=base,
                          capture_output=True, text=True, timeout=60)


def one_line_failure(res: subprocess.CompletedProcess, code: int, *names: str) -> str:
    assert res.returncode == code, (res.returncode, res.stderr, res.stdout)
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), res.stderr
    line = lines[0]
    assert line.startswith("kubectl-lookahead: "), line
    for name in names:
        assert name in line, (name, line)
    assert res.stdout == ""
    return line


# ------------------------------------------------------------------------------ the failures

def test_closed_port(tmp_path, devcluster):
    port = free_port()
    cfg = _kubeconfig(devcluster)
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    res = cli(tmp_path, "status", "chat-fleet", kubeconfig=_write(tmp_path, cfg))
    one_line_failure(res, plugin.EXIT_CLUSTER, f"https://127.0.0.1:{port}", "connection refused")


@pytest.mark.parametrize("kubeconfig_env", ["missing-file", None])
def test_no_kubeconfig(tmp_path, kubeconfig_env):
    path = tmp_path / "nowhere" / "config" if kubeconfig_env else None
    res = cli(tmp_path, "pause", "chat-fleet", kubeconfig=path)
    one_line_failure(res, plugin.EXIT_CLUSTER, "no kubeconfig", str(path) if path else "~/.kube/config",
                     "--kubeconfig")


def test_kubeconfig_given_by_flag_that_does_not_exist(tmp_path, devcluster):
    # --kubeconfig wins over $KUBECONFIG, which here is a working one
    res = cli(tmp_path, "status", "chat-fleet", "--kubeconfig", str(tmp_path / "nope.yaml"),
              kubeconfig=devcluster.kubeconfig)
    one_line_failure(res, plugin.EXIT_CLUSTER, "no kubeconfig", "--kubeconfig", "nope.yaml")


@pytest.mark.parametrize("text,cause", [("clusters: [\n  {name: x, cluster: {server: ]\n", "is not valid YAML"),
                                        ("{{{ this is not : yaml", "is not valid YAML"),
                                        ("just a sentence, not a config\n", "is not a kubeconfig")])
def test_kubeconfig_that_does_not_parse(tmp_path, text, cause):
    path = _write(tmp_path, text)
    res = cli(tmp_path, "abort", "chat-fleet", kubeconfig=path)
    one_line_failure(res, plugin.EXIT_CLUSTER, str(path), cause)


def test_unknown_context(tmp_path, devcluster):
    res = cli(tmp_path, "status", "chat-fleet", "--context", "prod", kubeconfig=devcluster.kubeconfig)
    one_line_failure(res, plugin.EXIT_CLUSTER, "'prod'", "contexts: lookahead-dev")


def test_wrong_ca(tmp_path, devcluster):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tmp_path / "other.key"), "-out", str(tmp_path / "other.crt"), "-days", "1",
                    "-subj", "/CN=some-other-ca"], check=True, capture_output=True)
    cfg = _kubeconfig(devcluster)
    cfg["clusters"][0]["cluster"]["certificate-authority-data"] = \
        base64.b64encode((tmp_path / "other.crt").read_bytes()).decode()
    res = cli(tmp_path, "status", "chat-fleet", kubeconfig=_write(tmp_path, cfg))
    one_line_failure(res, plugin.EXIT_CLUSTER, "cannot trust", devcluster.server, "certificate")


def test_user_without_rbac_is_forbidden(tmp_path, devcluster, kube_api, crd, namespace, policy):
    core = client.CoreV1Api(kube_api)
    sa = f"nobody-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa)))
    token = core.create_namespaced_service_account_token(
        sa, namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=600))).status.token
    path = _write(tmp_path, _token_kubeconfig(devcluster, token))
    for verb in ("status", "pause"):
        res = cli(tmp_path, verb, policy, "-n", namespace, kubeconfig=path)
        one_line_failure(res, plugin.EXIT_FORBIDDEN, "forbidden (403)", f"system:serviceaccount:{namespace}:{sa}",
                         f"in namespace {namespace}")
    # and nothing was changed
    got = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        plugin.GROUP, plugin.VERSION, namespace, plugin.PLURAL, policy)
    assert not got["spec"].get("paused")


def test_rejected_credentials(tmp_path, devcluster, crd, namespace):
    path = _write(tmp_path, _token_kubeconfig(devcluster, "not-a-token-this-apiserver-issued"))
    res = cli(tmp_path, "status", "chat-fleet", "-n", namespace, kubeconfig=path)
    one_line_failure(res, plugin.EXIT_FORBIDDEN, "401 Unauthorized", devcluster.server)


def test_timeout(tmp_path, devcluster):
    """A server that accepts the connection and never answers: bounded by --request-timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        server = f"https://127.0.0.1:{silent.getsockname()[1]}"
        cfg = _kubeconfig(devcluster)
        cfg["clusters"][0]["cluster"]["server"] = server
        res = cli(tmp_path, "status", "chat-fleet", "--request-timeout", "1", kubeconfig=_write(tmp_path, cfg))
    one_line_failure(res, plugin.EXIT_CLUSTER, server, "no answer within 1s")


@pytest.mark.parametrize("args,names", [
    (["status", "chat-fleet", "-n", "Bad_NS!"], ["invalid namespace 'Bad_NS!'", "-n/--namespace"]),
    (["pause", "chat-fleet", "-n", "a" * 64], ["invalid namespace", "-n/--namespace"]),
    (["resume", "Chat_Fleet"], ["invalid policy name 'Chat_Fleet'", "POLICY"]),
])
def test_bad_names_are_refused_before_any_api_call(tmp_path, devcluster, args, names):
    # a working cluster ...
    res = cli(tmp_path, *args, kubeconfig=devcluster.kubeconfig)
    one_line_failure(res, plugin.EXIT_BAD_INPUT, *names)
    # ... and a closed port give the same answer: nothing was asked of the API
    cfg = _kubeconfig(devcluster)
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    res = cli(tmp_path, *args, kubeconfig=_write(tmp_path, cfg, "closed"))
    one_line_failure(res, plugin.EXIT_BAD_INPUT, *names)


def test_bad_namespace_from_the_context_is_refused(tmp_path, devcluster):
    cfg = _kubeconfig(devcluster)
    cfg["contexts"][0]["context"]["namespace"] = "Team_A"
    res = cli(tmp_path, "status", "chat-fleet", kubeconfig=_write(tmp_path, cfg))
    one_line_failure(res, plugin.EXIT_BAD_INPUT, "invalid namespace 'Team_A'", "kubeconfig context")


@pytest.mark.parametrize("verb", ["status", "approve", "pause"])
def test_policy_not_found(tmp_path, devcluster, crd, namespace, verb):
    res = cli(tmp_path, verb, "no-such-policy", "-n", namespace, kubeconfig=devcluster.kubeconfig)
    one_line_failure(res, plugin.EXIT_NOT_FOUND, "'no-such-policy'", f"namespace {namespace}")


def test_missing_resource_type_reads_as_crd_not_installed(kube_api, devcluster, namespace):
    """What the real apiserver answers for a resource type it does not serve (as for our CRD
    before it is installed) is classified as 'the CRD is not installed', not 'policy not found'."""
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            "not-installed.example.com", "v1", namespace, "widgets", "w", _request_timeout=10)
    e = err.value
    msg = plugin.api_error(e.status, e.reason, e.body, action="get", namespace=namespace, name="w",
                           server=devcluster.server)
    assert msg.code == plugin.EXIT_NOT_FOUND and "CRD is not installed" in msg.message and "crds/" in msg.message


def test_gate_refusal_is_one_line(tmp_path, devcluster, namespace, policy):
    res = cli(tmp_path, "approve", policy, "-n", namespace, kubeconfig=devcluster.kubeconfig)
    one_line_failure(res, plugin.EXIT_NOT_FOUND, "nothing to approve")


# ------------------------------------------------------------------------------ the happy path

def test_status_pause_resume_report(tmp_path, devcluster, kube_api, namespace, policy):
    api = client.CustomObjectsApi(kube_api)

    def paused():
        return api.get_namespaced_custom_object(plugin.GROUP, plugin.VERSION, namespace, plugin.PLURAL,
                                                policy)["spec"].get("paused")

    res = cli(tmp_path, "status", policy, "-n", namespace, kubeconfig=devcluster.kubeconfig)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"{namespace}/{policy}  phase Measuring")
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]  # a pipe: 80
    for number in ("1234.57", "987.65", "-20.0%", "[-25.1, -14.9]", "123456.8", "234567.9", "+90.0%",
                   "[+85.1, +95.4]", "0.42", "12345/23456", "Wins", "Pending"):
        assert number in res.stdout, number
    wide = cli(tmp_path, "status", policy, "-n", namespace, kubeconfig=devcluster.kubeconfig,
               env={"COLUMNS": "200"})
    assert wide.returncode == 0 and wide.stdout.count("canary vs control") == 1
    assert max(len(line) for line in wide.stdout.splitlines()) > 80

    # the namespace from the context, and --kubeconfig/--context in place of $KUBECONFIG
    cfg = _kubeconfig(devcluster)
    cfg["contexts"][0]["context"]["namespace"] = namespace
    path = _write(tmp_path, cfg, "with-namespace")
    res = cli(tmp_path, "pause", policy, "--kubeconfig", str(path), "--context", cfg["contexts"][0]["name"])
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout == f"lookaheadpolicy.lookahead.dev/{policy} paused\n"
    assert paused() is True
    res = cli(tmp_path, "resume", policy, "-n", namespace, kubeconfig=devcluster.kubeconfig)
    assert res.returncode == 0 and res.stdout == f"lookaheadpolicy.lookahead.dev/{policy} resumed\n"
    assert paused() is False

    res = cli(tmp_path, "report", policy, "-n", namespace, kubeconfig=devcluster.kubeconfig)
    assert res.returncode == 0
    report = json.loads(res.stdout)
    assert report["policy"] == f"{namespace}/{policy}" and report["batches"][0]["controlTpotMs"] == 1234.5678
