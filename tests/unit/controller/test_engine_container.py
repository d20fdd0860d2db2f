"""The engine container is found by what it is, never by its position (issue 23, item 6): a pod whose
first container is a mesh proxy (Linkerd injects ``linkerd-proxy`` first, ports 4143 and 4191) gets
its load, its scrape and its clone's flags on the engine container, at the engine's own port."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from lookahead_operator import engines
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import LookaheadPolicyStatus, Phase
from lookahead_operator.controller import actions, loadjobs
from lookahead_operator.controller import builders as b
from lookahead_operator.controller.world import Action, ActionKind, Observed, Target

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
POLICY = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
          "metadata": {"name": "p", "namespace": "serving", "uid": "u"}}
SPEC = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "chat"}}},
                                           "lookahead": {"method": "ngram"}, "load": {"batchSizes": [1]}})
PROXY = {"name": "linkerd-proxy", "image": "cr.l5d.io/linkerd/proxy:edge-24.11.8",
         "ports": [{"name": "linkerd-proxy", "containerPort": 4143}, {"name": "linkerd-admin", "containerPort": 4191}]}


def engine(ports=None, args=None) -> dict:
    c = {"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
         "args": ["--model", "m", *(args or [])]}
    if ports is not None:
        c["ports"] = ports
    return c


SERVE = [{"name": "serve", "containerPort": 8080}]


def template(*containers) -> dict:
    return {"metadata": {"labels": {"app": "chat"}}, "spec": {"containers": [dict(c) for c in containers]}}


def pod(name: str, role: str, *containers, ip="10.0.0.7") -> dict:
    """A pod as the cache keeps it: each container's name and ports only (``kube.cache.slim_pod``)."""
    return {"metadata": {"name": name, "namespace": "serving", "labels": {b.LABEL_ROLE: role},
                         "annotations": {b.ANNOTATION_PROMOTED: "d1"}},
            "spec": {"containers": [{k: c[k] for k in ("name", "ports") if k in c} for c in containers]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def urls(jobs) -> dict[str, str]:
    out = {}
    for j in jobs:
        args = j["spec"]["template"]["spec"]["containers"][0]["args"]
        out[j["metadata"]["labels"][b.LABEL_DRIVES]] = args[args.index("--url") + 1]
    return out


# --- pure: the port, the load Jobs, the PodMonitor ---------------------------------------------------

def test_step_load_with_a_mesh_proxy_first_is_aimed_at_the_engines_named_port():
    tmpl = template(PROXY, engine(SERVE))
    pods = {r: [pod(f"{r}-0", r, PROXY, engine(SERVE), ip=f"10.0.0.{i}")] for i, r in enumerate(b.ROLES, 1)}
    jobs = loadjobs.step_jobs(SPEC, POLICY, "serving", 0, 1, 1, pods, T0, T0, tmpl)
    assert urls(jobs) == {"canary": "http://10.0.0.1:8080", "control": "http://10.0.0.2:8080"}


def test_guard_load_with_a_mesh_proxy_first_is_aimed_at_the_engines_port_on_both_sides():
    tmpl = template(PROXY, engine(SERVE))
    newest = Target("serving", "a", "vllm", promoted="d1")
    jobs = loadjobs.guard_jobs(SPEC, POLICY, 0, 1, 1, newest, [pod("a-0", "fleet", PROXY, engine(SERVE))],
                               [pod("control-0", "control", PROXY, engine(SERVE), ip="10.0.0.8")], tmpl, tmpl)
    assert urls(jobs) == {"promoted": "http://10.0.0.7:8080", "control": "http://10.0.0.8:8080"}


@pytest.mark.parametrize("ports, args, image, want", [
    ([{"name": "metrics", "containerPort": 9400}, {"name": "http", "containerPort": 8001}], [], None, 8001),
    ([{"containerPort": 8002}], [], None, 8002),                 # unnamed: the first declared
    (None, ["--port", "8003"], None, 8003),                      # none declared: its --port
    (None, [], None, 8000),                                      # vLLM's default
    (None, [], "lmsysorg/sglang:v0.5.4", 30000),                 # SGLang's default
])
def test_the_engine_port_is_its_http_port_else_its_first_else_its_command_lines_else_the_engines_default(
        ports, args, image, want):
    eng = engine(ports, args)
    if image:
        eng = {**eng, "image": image, "command": ["python3", "-m", "sglang.launch_server"]}
    assert loadjobs.engine_port(pod("x", "canary", PROXY, eng), template(PROXY, eng)) == want


def test_without_a_template_the_first_container_that_is_not_a_mesh_proxy_serves():
    assert loadjobs.engine_port(pod("x", "canary", PROXY, engine(SERVE))) == 8080
    istio = {"name": "istio-proxy", "ports": [{"name": "http-envoy-prom", "containerPort": 15090}]}
    assert loadjobs.engine_port(pod("x", "canary", istio, engine(SERVE))) == 8080


def test_the_pod_monitor_scrapes_the_engines_own_port_by_name_else_by_number():
    named = b.engine_container(template(PROXY, engine(SERVE)), engines.is_engine_container)
    endpoint, = b.build_pod_monitor(POLICY, "serving", b.metrics_port_ref(named))["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "serve" and "portNumber" not in endpoint

    unnamed = b.engine_container(template(PROXY, engine([{"containerPort": 8080}])), engines.is_engine_container)
    endpoint, = b.build_pod_monitor(POLICY, "serving", b.metrics_port_ref(unnamed))["spec"]["podMetricsEndpoints"]
    assert endpoint["portNumber"] == 8080 and "port" not in endpoint
    # an operator older than portNumber (0.79) drops it: the relabelling keeps that port alone
    assert {"sourceLabels": ["__meta_kubernetes_pod_container_port_number"], "regex": "8080",
            "action": "keep"} in endpoint["relabelings"]


def test_the_clone_edits_and_annotates_the_engine_container_not_the_proxy():
    target = {"metadata": {"name": "a", "namespace": "serving"},
              "spec": {"selector": {"matchLabels": {"app": "chat"}}, "template": template(PROXY, engine(SERVE))}}
    d = b.build_role_deployment(target, POLICY, "canary", 1, lambda c: {**c, "args": [*c["args"], "--on"]},
                                engines.is_engine_container)
    proxy, eng = d["spec"]["template"]["spec"]["containers"]
    assert proxy == PROXY and eng["args"][-1] == "--on"
    assert d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "8080"


# --- the actions wire the target's template in --------------------------------------------------------

class FakeKube:
    """Reads from fixed objects; records what is created."""

    def __init__(self, deployment: dict, pods: dict[str, list[dict]]):
        self.deployment, self.pods, self.created = deployment, pods, []

    def get_deployment(self, ns, name):
        return self.deployment if (ns, name) == ("serving", "a") else None

    fresh_deployment = get_deployment

    def role_pods(self, namespace, policy_ns, policy_name, role):
        return self.pods.get(role, [])

    def has_pod_monitor_crd(self):
        return True

    def create_if_absent(self, body):
        self.created.append(body)
        return False


def test_the_actions_aim_step_load_and_the_pod_monitor_at_the_engine_behind_a_proxy():
    target = {"metadata": {"name": "a", "namespace": "serving", "resourceVersion": "1"},
              "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "chat"}},
                       "template": template(PROXY, engine(SERVE))}}
    k = FakeKube(target, {r: [pod(f"{r}-0", r, PROXY, engine(SERVE))] for r in b.ROLES})
    w = Observed(now=T0, name="p", namespace="serving", generation=1, spec=SPEC,
                 status=LookaheadPolicyStatus(phase=Phase.Launching), targets=[Target("serving", "a", "vllm")])
    c = actions.Ctx(k, POLICY, SPEC, w)
    actions.ACTIONS[ActionKind.ENSURE_ROLES](c, Action(ActionKind.ENSURE_ROLES))
    monitor, = (o for o in k.created if o["kind"] == "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "serve"
    actions.ACTIONS[ActionKind.ENSURE_LOAD](c, Action(ActionKind.ENSURE_LOAD, step=0, run=1, batch_size=1))
    assert set(urls(o for o in k.created if o["kind"] == "Job").values()) == {"http://10.0.0.7:8080"}
