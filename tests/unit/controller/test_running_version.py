"""The engine version read from a running fleet pod (``observe.running_version``) and the gate it
feeds (``observe._support_problems`` -> ``engines.support_problems`` -> ``EngineUnsupported``).
Each engine endpoint here is a real HTTP server on 127.0.0.1 (``http.server``) answering as the
engine would: a real exchange through the operator's reader, nothing mocked."""

from __future__ import annotations

import json
import socket
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from lookahead_operator.api.policy import LookaheadPolicy
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase
from lookahead_operator.controller import observe
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import Observed, Target

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class Endpoint:
    """A local HTTP server answering ``routes`` (path -> (status, JSON body)); 404 elsewhere.
    ``hits``: the paths asked, in order."""

    def __init__(self, routes: dict[str, tuple[int, object]]):
        self.routes, self.hits = routes, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                outer.hits.append(self.path)
                status, body = outer.routes.get(self.path, (404, {"detail": "Not Found"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    made = []

    def make(routes):
        made.append(Endpoint(routes))
        return made[-1]

    yield make
    for e in made:
        e.close()
    observe._VERSIONS.clear()


def fleet(engine: str, image: str, port: int) -> dict:
    command = {"vllm": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", str(port)],
               "sglang": ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--port",
                          str(port)]}[engine]
    container = {"name": engine, "image": image, "command": command,
                 "ports": [{"name": "http", "containerPort": port}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "chat-a", "namespace": "serving", "uid": "u1", "generation": 1},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "chat-a"}},
                     "template": {"metadata": {"labels": {"app": "chat-a"}},
                                  "spec": {"containers": [{"name": "proxy", "image": "envoyproxy/envoy:v1.30"},
                                                          container]}}}}


def pod(d: dict, name: str = "chat-a-xyz", ready: bool = True, image: str | None = None) -> dict:
    containers = [dict(c) for c in d["spec"]["template"]["spec"]["containers"]]
    if image:
        containers[-1]["image"] = image
    return {"metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}"},
            "spec": {"containers": containers},
            "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": str(ready)}]}}


class Cluster:
    """What observe reads here: one Deployment and its pods (the API's list)."""

    def __init__(self, d: dict, pods: list[dict]):
        self.d, self.listed = d, pods

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        return self.d if (namespace, name) == ("serving", "chat-a") else None

    def pods(self, namespace: str, selector: dict | None) -> list[dict]:
        return self.listed


def policy(engine: str, mode: str = "regimeAware", **lookahead):
    body = yaml.safe_load((REPO / "examples" / "chat-fleet.yaml").read_text())
    body["spec"]["engine"] = engine
    body["spec"]["promotion"]["mode"] = mode
    body["spec"]["lookahead"] = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2,
                                 "promptLookupMax": 5, **lookahead}
    return LookaheadPolicy.from_body(body).spec


def world(spec, engine: str, problems=()) -> Observed:
    return Observed(now=T0, name="chat-fleet", namespace="inference", generation=1, spec=spec,
                    status=LookaheadPolicyStatus(), fingerprint=spec.fingerprint(),
                    targets=[Target("serving", "chat-a", engine)], support_problems=list(problems))


def test_a_vllm_whose_version_endpoint_says_older_than_its_tag_is_refused_regime_aware(endpoint):
    e = endpoint({"/version": (200, {"version": "0.20.1"})})
    d = fleet("vllm", "vllm/vllm-openai:v0.33.0", e.port)
    spec = policy("vllm")                                   # promotion.mode: regimeAware
    problems = observe._support_problems(Cluster(d, [pod(d)]), spec, world(spec, "vllm"), Phase.Pending)
    assert e.hits == ["/version"]
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        "vllm /version of pod serving/chat-a-xyz says 0.20.1; the image tag says 0.33.0; spec.lookahead.engineVersion "
        "is not set: regime-aware promotion needs vLLM 0.24.0+ (num_speculative_tokens_per_batch_size"), problems
    plan = sm.reconcile(world(spec, "vllm", problems))
    accepted = next(c for c in plan.status.conditions if c.type == ConditionType.Accepted)
    assert plan.status.phase == Phase.Failed and accepted.reason == "EngineUnsupported"
    assert "says 0.20.1" in accepted.message and "0.33.0" in accepted.message and plan.actions == []
    # the same fleet measured and promoted in full needs no version proof: accepted
    full = policy("vllm", mode="full")
    assert observe._support_problems(Cluster(d, [pod(d)]), full, world(full, "vllm"), Phase.Pending) == []


def test_a_running_version_that_agrees_is_the_proof_and_is_read_once(endpoint):
    e = endpoint({"/version": (200, {"version": "0.33.0"})})
    d = fleet("vllm", "vllm/vllm-openai:v0.33.0", e.port)
    spec = policy("vllm")
    k = Cluster(d, [pod(d)])
    assert observe._support_problems(k, spec, world(spec, "vllm"), Phase.Pending) == []
    assert observe._support_problems(k, spec, world(spec, "vllm"), Phase.Preflight) == []
    assert e.hits == ["/version"]                          # remembered per pod and image once read
    # ... and a `latest` image is proven by its running engine alone
    d = fleet("vllm", "vllm/vllm-openai:latest", e.port)
    observe._VERSIONS.clear()
    assert observe._support_problems(Cluster(d, [pod(d)]), spec, world(spec, "vllm"), Phase.Pending) == []


def test_an_unreadable_version_refuses_regime_aware_unless_the_spec_states_it(endpoint):
    e = endpoint({"/version": (500, {"error": "boom"})})
    d = fleet("vllm", "vllm/vllm-openai:v0.33.0", e.port)
    spec = policy("vllm")
    problems = observe._support_problems(Cluster(d, [pod(d)]), spec, world(spec, "vllm"), Phase.Pending)
    assert len(problems) == 1 and problems[0].startswith(
        "the vllm version could not be read from the running engine (could not read the version from pod "
        f"serving/chat-a-xyz: GET http://127.0.0.1:{e.port}/version: HTTP 500); the image tag says 0.33.0, but a tag "
        "alone is not proof"), problems
    assert "regime-aware promotion needs vLLM 0.24.0+" in problems[0]
    assert "set spec.lookahead.engineVersion" in problems[0]
    stated = policy("vllm", engineVersion="0.33.0")
    assert observe._support_problems(Cluster(d, [pod(d)]), stated, world(stated, "vllm"), Phase.Pending) == []
    # no ready pod at all (a fleet still loading its model): nothing refused yet, Pending waits for one
    loading = world(spec, "vllm")
    assert observe._support_problems(Cluster(d, [pod(d, ready=False)]), spec, loading, Phase.Pending) == []
    assert loading.version_wait.startswith("no ready pod of serving/chat-a to read it from: waiting for one")
    plan = sm.reconcile(loading)
    assert plan.status.phase == Phase.Pending and not plan.actions, plan.actions
    found = next(c for c in plan.status.conditions if c.type == ConditionType.TargetsFound)
    assert (found.status, found.reason) == ("False", "WaitingForReadyPod")
    # ... unless no ready pod could prove it: a template that states an older release is refused at once
    old = fleet("vllm", "vllm/vllm-openai:v0.20.0", e.port)
    problems = observe._support_problems(Cluster(old, [pod(old, ready=False)]), spec, world(spec, "vllm"),
                                         Phase.Pending)
    assert problems and "regime-aware promotion needs vLLM 0.24.0+" in problems[0], problems
    # a running version contradicting the user's statement is no proof either
    e.routes["/version"] = (200, {"version": "0.20.1"})
    problems = observe._support_problems(Cluster(d, [pod(d)]), stated, world(stated, "vllm"), Phase.Pending)
    assert "says 0.20.1; the image tag says 0.33.0; spec.lookahead.engineVersion says 0.33.0" in problems[0]


def test_a_closed_port_is_a_reason_not_a_wait():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                            # nothing listens here once closed
    d = fleet("vllm", "vllm/vllm-openai:v0.33.0", port)
    ran = observe.running_version(Cluster(d, [pod(d)]), d, "vllm")
    assert ran.text is None and ran.error.startswith(
        f"could not read the version from pod serving/chat-a-xyz: GET http://127.0.0.1:{port}/version: ConnectError")


def test_sglang_server_info_then_the_older_get_server_info(endpoint):
    info = {"model_path": "Qwen/Qwen3-8B", "tp_size": 1, "version": "0.5.23"}
    old = endpoint({"/get_server_info": (200, info)})       # 0.5.x: /server_info is not there yet
    d = fleet("sglang", "lmsysorg/sglang:v0.5.23-cu126", old.port)
    ran = observe.running_version(Cluster(d, [pod(d)]), d, "sglang")
    assert (ran.text, ran.path, ran.error) == ("0.5.23", "/get_server_info", None)
    assert old.hits == ["/server_info", "/get_server_info"]
    new = endpoint({"/server_info": (200, info), "/get_server_info": (200, info)})
    d = fleet("sglang", "lmsysorg/sglang:v0.5.23-cu126", new.port)
    ran = observe.running_version(Cluster(d, [pod(d, name="chat-a-new")]), d, "sglang")
    assert (ran.text, ran.path) == ("0.5.23", "/server_info") and new.hits == ["/server_info"]


def test_the_pod_running_the_templates_image_is_read_first(endpoint):
    e = endpoint({"/version": (200, {"version": "0.33.0"})})
    d = fleet("vllm", "vllm/vllm-openai:v0.33.0", e.port)
    pods = [pod(d, name="chat-a-old", image="vllm/vllm-openai:v0.20.1"), pod(d, name="chat-a-new")]
    ran = observe.running_version(Cluster(d, pods), d, "vllm")
    assert ran.pod == "serving/chat-a-new"
