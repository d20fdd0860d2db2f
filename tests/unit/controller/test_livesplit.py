"""Live mode's pure pieces (controller.livesplit): the Service split's replica counts and the labels
that make arm pods join the fleet's Service, the HTTPRoute split and its exact restore, the per-arm
backends, and the safety abort rule."""

from __future__ import annotations

import copy
import json

import pytest

from lookahead_operator.api.names import ANNOTATION_ORIGINAL_BACKEND_REFS, LABEL_POLICY, LABEL_ROLE
from lookahead_operator.api.spec import AbortSpec, BackendKind, EndpointPickerRef, GatewayAPISplit
from lookahead_operator.controller import builders as b
from lookahead_operator.controller import livesplit as ls
from lookahead_operator.controller.livesplit import LiveSplitError
from lookahead_operator.measurement.stats.live import ArmWindow as _ArmWindow


def ArmWindow(requests, errors, ttft_s=None, token_latency_s=None):  # noqa: N802 (reads as the record it builds)
    """One arm's abort window: requests, failed, mean TTFT and mean per-token latency (seconds)."""
    return _ArmWindow(per_token_latency=token_latency_s, token_rate=None, ttft=ttft_s, requests=requests,
                      errors=errors)

POLICY = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
          "metadata": {"name": "chat-fleet", "namespace": "inference", "uid": "u-1", "generation": 3}}


def target(selector=None, labels=None):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm-chat", "namespace": "inference"},
        "spec": {
            "replicas": 4,
            "selector": selector or {"matchLabels": {"app": "llm-chat"}},
            "template": {
                "metadata": {"labels": labels or {"app": "llm-chat", "tier": "gpu", "serving": "yes"}},
                "spec": {"containers": [{"name": "engine", "image": "vllm", "ports": [
                    {"name": "http", "containerPort": 8000}]}]},
            },
        },
    }


def service(selector=None, ports=None):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": "inference"},
            "spec": {"selector": {"app": "llm-chat", "serving": "yes"} if selector is None else selector,
                     "ports": ports or [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP",
                                         "nodePort": 30080}]}}


def role(role_name="canary", t=None):
    return b.build_role_deployment(t or target(), POLICY, role_name, 1, lambda c: c, lambda c: c["name"] == "engine")


# ------------------------------------------------------------------------------------------
# split: service, replica counts


@pytest.mark.parametrize("n, pct, capacity, arm, fleet, share", [
    (10, 0.10, "surge", 1, 10, 1 / 12),        # 2 replicas each would be 2/14 = 14.3%: above 10%
    (18, 0.05, "surge", 1, 18, 0.05),          # exact: 1 / (18 + 2)
    (40, 0.10, "surge", 5, 40, 0.10),          # exact: 5 / 50
    (100, 0.05, "surge", 5, 100, 5 / 110),
    (20, 0.10, "carveOut", 2, 16, 0.10),       # exact: the fleet lends 4 of its 20
    (10, 0.25, "carveOut", 2, 6, 0.20),        # 3 each would leave the fleet 4 of 10 and be 30%
    (10, 0.49, "carveOut", 4, 2, 0.40),        # the fleet keeps at least one: here 2
])
def test_service_split_takes_the_largest_replica_count_at_or_below_live_percent(n, pct, capacity, arm, fleet, share):
    s = ls.service_split(n, pct, capacity)
    assert (s.arm_replicas, s.fleet_replicas) == (arm, fleet)
    assert s.share == pytest.approx(share) and s.share <= pct + 1e-12
    assert s.endpoints == fleet + 2 * arm
    assert s.exact == (abs(share - pct) < 1e-12)
    assert ("nearest a Service split offers" in s.describe()) == (not s.exact)


def test_service_split_is_capped_and_says_so():
    s = ls.service_split(10_000, 0.4, max_arm_replicas=64)
    assert s.arm_replicas == 64 and s.share < 0.4
    assert "the nearest a Service split offers at or below load.livePercent 40%" in s.describe()


def test_service_split_refuses_a_share_below_one_replica_naming_live_percent_and_the_fix():
    with pytest.raises(LiveSplitError) as err:
        ls.service_split(10, 0.05)
    assert err.value.field == "spec.load.livePercent"
    assert "one replica per arm is 8.33% each" in str(err.value) and "split gatewayAPI" in str(err.value)


def test_service_split_refuses_an_empty_fleet_and_a_carve_out_that_leaves_none():
    with pytest.raises(LiveSplitError, match="spec.load.split: the fleet has no serving replicas"):
        ls.service_split(0, 0.1)
    with pytest.raises(LiveSplitError, match="spec.canary.capacity: carveOut"):
        ls.service_split(2, 0.3, "carveOut")
    with pytest.raises(LiveSplitError, match="spec.load.livePercent"):
        ls.service_split(10, 0.5)


# ------------------------------------------------------------------------------------------
# split: service, the labels that join the Service


def test_live_template_puts_the_services_selector_back_and_keeps_the_role_label():
    sweep = role()
    assert "app" not in sweep["spec"]["template"]["metadata"]["labels"]  # the sweep path: never in the Service
    live = ls.live_service_template(sweep, service(), target())
    labels = live["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == "llm-chat" and labels["serving"] == "yes"
    assert labels[LABEL_ROLE] == "canary" and labels[LABEL_POLICY] == "chat-fleet"
    assert live["spec"]["selector"] == sweep["spec"]["selector"], "the arm Deployment's selector is unchanged"
    assert all(labels[k] == v for k, v in live["spec"]["selector"]["matchLabels"].items())
    assert sweep == role(), "the sweep Deployment passed in is not modified"
    assert ls.is_arm_pod({"metadata": {"labels": labels}})
    assert not ls.is_arm_pod({"metadata": {"labels": target()["spec"]["template"]["metadata"]["labels"]}})


@pytest.mark.parametrize("svc, tgt, where, words", [
    (service(selector={}), target(), "Service inference/chat", "has no selector"),
    (service(selector={"app": "llm-code"}), target(), "Service inference/chat", "does not select the pods"),
    (service(selector={"app": "llm-chat", LABEL_ROLE: "canary"}), target(), "Service inference/chat",
     "operator's own label"),
    (service(selector={"app": "llm-chat"}),
     target(selector={"matchLabels": {"app": "llm-chat"},
                      "matchExpressions": [{"key": LABEL_ROLE, "operator": "DoesNotExist"}]}),
     "Deployment inference/llm-chat", "its selector uses lookahead.dev/role"),
])
def test_a_service_that_cannot_be_shared_is_refused_naming_it(svc, tgt, where, words):
    with pytest.raises(LiveSplitError) as err:
        ls.live_service_template(role(t=tgt), svc, tgt)
    assert err.value.field == where and words in err.value.message


def test_live_template_refuses_a_deployment_that_is_not_an_arm():
    with pytest.raises(LiveSplitError, match="is not a canary or control Deployment"):
        ls.live_service_template(target(), service(), target())


# ------------------------------------------------------------------------------------------
# split: gatewayAPI, the arm backends


def test_gateway_arm_template_leaves_the_fleets_backend():
    pool = {"kind": "InferencePool", "metadata": {"name": "chat-pool", "namespace": "inference"},
            "spec": {"selector": {"matchLabels": {"serving": "yes"}}, "targetPorts": [{"number": 8000}]}}
    out = ls.gateway_arm_template(role(), pool)
    labels = out["spec"]["template"]["metadata"]["labels"]
    assert "serving" not in labels and labels["tier"] == "gpu" and labels[LABEL_ROLE] == "canary"
    assert ls.backend_selector(service()) == {"app": "llm-chat", "serving": "yes"}
    with pytest.raises(LiveSplitError, match="operator's own label"):
        ls.gateway_arm_template(role(), service(selector={LABEL_POLICY: "x"}))


def test_arm_service_selects_only_its_arm_and_mirrors_the_fleets_ports():
    ports = ls.arm_service_ports(service())
    assert ports == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]  # no nodePort
    svc = ls.build_arm_service(POLICY, "inference", "control", ports)
    assert svc["metadata"]["name"] == "lap-chat-fleet-control" == b.role_deployment_name("chat-fleet", "control")
    assert svc["spec"]["selector"] == role("control")["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["type"] == "ClusterIP" and svc["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    other_ns = ls.build_arm_service(POLICY, "serving", "canary", ports)
    assert "ownerReferences" not in other_ns["metadata"] and other_ns["metadata"]["name"].startswith("lap-chat-fleet-")
    with pytest.raises(LiveSplitError, match="exposes no port"):
        ls.build_arm_service(POLICY, "inference", "canary", [])


def test_arm_inference_pool_is_a_v1_pool_of_the_arm_with_its_own_picker():
    fleet = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
             "metadata": {"name": "chat-pool", "namespace": "inference"},
             "spec": {"selector": {"matchLabels": {"app": "llm-chat"}}, "targetPorts": [{"number": 8000}],
                      "appProtocol": "http", "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}}}}
    pool = ls.arm_inference_pool_like(fleet, POLICY, "canary", EndpointPickerRef(name="epp-canary"))
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["metadata"]["name"] == "lap-chat-fleet-canary"
    assert pool["spec"] == {
        "selector": {"matchLabels": role()["spec"]["selector"]["matchLabels"]},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"group": "", "kind": "Service", "name": "epp-canary", "port": {"number": 9002},
                              "failureMode": "FailClose"},
        "appProtocol": "http",
    }
    assert ls.arm_service_ports(fleet) == [{"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]
    with pytest.raises(LiveSplitError, match="1 to 8 unique target ports"):
        ls.build_arm_inference_pool(POLICY, "inference", "canary", [8000, 8000], EndpointPickerRef(name="e"))


# ------------------------------------------------------------------------------------------
# split: gatewayAPI, the route


def route(rules=None, annotations=None):
    meta = {"name": "chat", "namespace": "gw", "resourceVersion": "7"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": meta,
            "spec": {"parentRefs": [{"name": "inference-gateway"}], "rules": rules if rules is not None else [
                {"name": "health", "matches": [{"path": {"type": "PathPrefix", "value": "/health"}}],
                 "backendRefs": [{"name": "health", "port": 8080}]},
                {"name": "chat", "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                 "backendRefs": [
                     {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-pool",
                      "namespace": "inference", "filters": [{"type": "RequestHeaderModifier",
                                                             "requestHeaderModifier": {"set": [
                                                                 {"name": "x-fleet", "value": "chat"}]}}]},
                     {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-next",
                      "namespace": "inference", "weight": 0},
                 ]},
            ]}}


def gw(**over):
    body = {"httpRouteRef": {"name": "chat", "namespace": "gw"},
            "backendRef": {"kind": "InferencePool", "name": "chat-pool", "namespace": "inference"},
            "endpointPickers": {"canary": {"name": "epp-canary"}, "control": {"name": "epp-control"}}, **over}
    return GatewayAPISplit.model_validate(body)


def arms(fleet_ref, kind=BackendKind.InferencePool, port=None):
    return {r: ls.arm_backend_ref(fleet_ref, kind, b.role_deployment_name("chat-fleet", r, "inference", "inference"),
                                  port) for r in ("canary", "control")}


def fleet_ref():
    return route()["spec"]["rules"][1]["backendRefs"][0]


def test_split_route_weights_the_arms_and_saves_the_rule_verbatim():
    original = route()
    split = ls.split_route(original, gw(), arms(fleet_ref()), 0.05)
    assert split.rule_index == 1 and original == route(), "the route passed in is not modified"
    refs = split.route["spec"]["rules"][1]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [
        ("chat-pool", 18), ("chat-next", 0), ("lap-chat-fleet-canary", 1), ("lap-chat-fleet-control", 1)]
    assert split.weights.share == pytest.approx(0.05)
    canary = refs[2]
    assert canary["group"] == "inference.networking.k8s.io" and canary["kind"] == "InferencePool"
    assert canary["namespace"] == "inference" and canary["filters"] == fleet_ref()["filters"], \
        "an arm sees requests as the fleet does"
    assert "port" not in canary
    # the other rule and everything else: untouched
    assert split.route["spec"]["rules"][0] == original["spec"]["rules"][0]
    assert split.route["spec"]["parentRefs"] == original["spec"]["parentRefs"]
    saved = json.loads(split.route["metadata"]["annotations"][ANNOTATION_ORIGINAL_BACKEND_REFS])
    assert saved["backendRefs"] == original["spec"]["rules"][1]["backendRefs"] and saved["ruleName"] == "chat"
    assert ls.saved_backend_refs(split.route) == split.saved


def test_split_route_is_idempotent_and_restores_exactly():
    original = route(annotations={"team": "ml"})
    once = ls.split_route(original, gw(), arms(fleet_ref()), 0.1).route
    twice = ls.split_route(once, gw(), arms(fleet_ref()), 0.1).route
    assert twice == once
    assert ls.restore_route(once) == original
    assert ls.restore_route(ls.restore_route(once)) == original, "restoring twice is restoring once"
    # a route that had no annotations gets none back (not an empty map)
    bare = route()
    assert ls.restore_route(ls.split_route(bare, gw(), arms(fleet_ref()), 0.1).route) == bare
    # a new share re-splits from the saved original, not from the split weights
    resplit = ls.split_route(once, gw(), arms(fleet_ref()), 0.25).route
    assert [r["weight"] for r in resplit["spec"]["rules"][1]["backendRefs"]] == [2, 0, 1, 1]
    assert ls.restore_route(resplit) == original


def test_restore_keeps_the_users_other_edits_and_finds_a_moved_rule():
    split = ls.split_route(route(), gw(), arms(fleet_ref()), 0.05).route
    edited = copy.deepcopy(split)
    edited["spec"]["hostnames"] = ["chat.example.com"]
    edited["spec"]["rules"].insert(0, {"matches": [{"path": {"type": "Exact", "value": "/metrics"}}]})
    restored = ls.restore_route(edited)
    assert restored["spec"]["hostnames"] == ["chat.example.com"]
    assert restored["spec"]["rules"][2]["backendRefs"] == route()["spec"]["rules"][1]["backendRefs"]
    assert ANNOTATION_ORIGINAL_BACKEND_REFS not in (restored["metadata"].get("annotations") or {})


def test_restore_from_a_saved_record_and_a_lost_rule():
    split = ls.split_route(route(), gw(), arms(fleet_ref()), 0.05)
    without_annotation = copy.deepcopy(split.route)
    del without_annotation["metadata"]["annotations"]
    assert ls.restore_route(without_annotation, split.saved) == route()  # e.g. from the policy's status
    gone = copy.deepcopy(split.route)
    gone["spec"]["rules"] = gone["spec"]["rules"][:1]
    with pytest.raises(LiveSplitError, match="the split rule .* is gone"):
        ls.restore_route(gone)
    junk = route(annotations={ANNOTATION_ORIGINAL_BACKEND_REFS: "{not json"})
    with pytest.raises(LiveSplitError, match="cannot be read"):
        ls.restore_route(junk)


def test_split_a_service_backend_by_index_with_weights():
    rules = [{"backendRefs": [{"name": "chat", "port": 80, "weight": 90}, {"name": "chat-v2", "port": 80,
                                                                            "weight": 10}]}]
    spec = GatewayAPISplit.model_validate({"httpRouteRef": {"name": "chat"}, "ruleIndex": 0,
                                           "backendRef": {"name": "chat", "port": 80}})
    ref = rules[0]["backendRefs"][0]
    split = ls.split_route(route(rules=rules), spec, arms(ref, BackendKind.Service, 80), 0.025)
    refs = split.route["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r.get("port"), r["weight"]) for r in refs] == [
        ("chat", 80, 342), ("chat-v2", 80, 40), ("lap-chat-fleet-canary", 80, 9), ("lap-chat-fleet-control", 80, 9)]
    # each arm: 2.5% of the fleet's backendRef's traffic (9 of 360); chat-v2 keeps its 10% of the rule (40 of 400)
    assert split.weights.share == pytest.approx(0.025) and 40 / (342 + 40 + 18) == pytest.approx(0.10)
    assert refs[2]["group"] == "" and refs[2]["kind"] == "Service"


@pytest.mark.parametrize("fleet_w, others, pct, want", [
    (1, [], 0.05, (18, 1, ())),
    (1, [], 0.10, (8, 1, ())),
    (90, [10], 0.025, (342, 9, (40,))),
    (3, [0, 7], 0.2, (9, 3, (0, 35))),
    (1, [], 0.123456, (11767, 1929, ())),     # 12.3456%: 1929/15625, exact
])
def test_split_weights_are_exact_integers_with_the_others_share_kept(fleet_w, others, pct, want):
    w = ls.split_weights(fleet_w, others, pct)
    assert (w.fleet, w.arm, w.others) == want
    assert w.share == pytest.approx(pct, rel=1e-9)
    total_before, total_after = fleet_w + sum(others), w.fleet + 2 * w.arm + sum(w.others)
    for o, n in zip(others, w.others):
        assert n / total_after == pytest.approx(o / total_before)
    assert max(w.fleet, w.arm, *w.others) <= ls.MAX_WEIGHT


def test_split_weights_scale_down_to_gateway_apis_limit_and_refuse_what_cannot_fit():
    w = ls.split_weights(999_999, [1], 1 / 3 - 1e-7)
    assert max(w.fleet, w.arm, *w.others) <= ls.MAX_WEIGHT and w.share == pytest.approx(1 / 3, rel=1e-4)
    with pytest.raises(LiveSplitError, match="too small beside the rule's other weights"):
        ls.split_weights(1, [1_000_000], 0.4)
    with pytest.raises(LiveSplitError, match="weight 0"):
        ls.split_weights(0, [1], 0.1)


@pytest.mark.parametrize("spec_over, rules, field, words", [
    ({"ruleName": "missing"}, None, "spec.load.gatewayAPI.ruleName", "no rule named 'missing'"),
    ({"ruleIndex": 5}, None, "spec.load.gatewayAPI.ruleIndex", "has 2 rule(s): no rule 5"),
    ({"ruleName": "health"}, None, "spec.load.gatewayAPI.backendRef", "holds backendRef InferencePool "
                                                                       "inference/chat-pool nowhere"),
    ({"backendRef": {"kind": "InferencePool", "name": "other", "namespace": "inference"}}, None,
     "spec.load.gatewayAPI.backendRef", "has no rule with backendRef"),
    ({}, [{"backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat-pool",
                            "namespace": "inference"}]}] * 2,
     "spec.load.gatewayAPI.backendRef", "rules [0, 1] with backendRef"),
    ({"ruleIndex": 0}, [{"backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                          "name": "chat-pool", "namespace": "inference"}] * 2}],
     "spec.load.gatewayAPI.backendRef", "2 times"),
])
def test_split_route_refuses_a_route_without_the_rule_or_backend_naming_the_field(spec_over, rules, field, words):
    with pytest.raises(LiveSplitError) as err:
        ls.split_route(route(rules=rules), gw(**spec_over), arms(fleet_ref()), 0.05)
    assert err.value.field == field and words in err.value.message, err.value


def test_split_route_matches_group_kind_namespace_and_port():
    # the same name as a Service is not the pool; a Service ref in the route's own namespace matches
    # a backendRef without namespace; a port given must match
    rules = [{"backendRefs": [{"name": "chat-pool", "port": 80}]}]
    with pytest.raises(LiveSplitError, match="no rule with backendRef"):
        ls.split_route(route(rules=rules), gw(), arms(fleet_ref()), 0.05)
    svc = GatewayAPISplit.model_validate({"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat-pool",
                                                                                            "namespace": "gw"}})
    assert ls.split_route(route(rules=rules), svc, arms(rules[0]["backendRefs"][0], BackendKind.Service, 80),
                          0.05).rule_index == 0
    wrong_port = GatewayAPISplit.model_validate({"httpRouteRef": {"name": "chat"},
                                                 "backendRef": {"name": "chat-pool", "port": 81}})
    with pytest.raises(LiveSplitError, match="chat-pool:81"):
        ls.split_route(route(rules=rules), wrong_port, arms(rules[0]["backendRefs"][0], BackendKind.Service, 80), 0.05)


def test_split_route_refuses_a_rule_already_holding_an_arms_name():
    rules = copy.deepcopy(route()["spec"]["rules"])
    rules[1]["backendRefs"].append({"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                    "name": "lap-chat-fleet-canary"})
    with pytest.raises(LiveSplitError, match="already has a backendRef to InferencePool lap-chat-fleet-canary"):
        ls.split_route(route(rules=rules), gw(), arms(fleet_ref()), 0.05)


def test_a_service_arm_ref_needs_a_port():
    with pytest.raises(LiveSplitError, match="spec.load.gatewayAPI.armBackend"):
        ls.arm_backend_ref(fleet_ref(), BackendKind.Service, "lap-chat-fleet-canary")


# ------------------------------------------------------------------------------------------
# the safety abort


ABORT = AbortSpec()  # the defaults: 5 points, 20 requests or 3 errors, TTFT 3x, per-token 2x



# ------------------------------------------------------------------------------------------
# split: gatewayAPI, put together (what the state machine and the actions call)

POLICY = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
          "metadata": {"name": "chat-fleet", "namespace": "inference", "uid": "u-1"}}
POOL = {"kind": "InferencePool", "metadata": {"name": "chat-pool", "namespace": "inference"},
        "spec": {"selector": {"matchLabels": {"app": "chat"}}, "targetPorts": [{"number": 8000}],
                 "appProtocol": "http"}}


def test_gateway_split_names_the_arms_backends_and_is_idempotent():
    split = ls.gateway_split(route(), POLICY, gw(), "inference", 0.05, POOL)
    refs = split.route["spec"]["rules"][1]["backendRefs"]
    names = {r: ls.arm_backend_name(POLICY, r, "inference") for r in ("canary", "control")}
    assert [(r["name"], r.get("namespace"), r["weight"]) for r in refs[2:]] == [
        (names["canary"], "inference", split.weights.arm), (names["control"], "inference", split.weights.arm)]
    assert refs[2]["filters"] == refs[0]["filters"]  # the arms see the requests the fleet does
    again = ls.gateway_split(split.route, POLICY, gw(), "inference", 0.05, POOL)
    assert ls.route_split_in_place(split.route, again) and not ls.route_split_in_place(route(), again)
    assert ls.restore_route(split.route) == route()


def test_gateway_split_service_arms_take_the_fleets_port_and_no_namespace_in_the_routes_own():
    rules = [{"backendRefs": [{"name": "chat", "port": 8000, "weight": 3}]}]
    spec = GatewayAPISplit.model_validate({"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat"}})
    split = ls.gateway_split(route(rules), POLICY, spec, "gw", 0.25, None)
    arm = split.route["spec"]["rules"][0]["backendRefs"][1]
    assert arm["kind"] == "Service" and arm["port"] == 8000 and "namespace" not in arm
    assert (split.weights.fleet, split.weights.arm) == (2, 1) and split.weights.share == 0.25  # (6 : 3 : 3, /3)
    with pytest.raises(LiveSplitError) as exc:  # no rule holds the fleet's backendRef: the field is named
        ls.gateway_split(route([{"backendRefs": [{"name": "x", "port": 1}]}]), POLICY, spec, "gw", 0.25, None)
    assert exc.value.field == "spec.load.gatewayAPI.backendRef"
    full = [{"backendRefs": [{"name": "chat", "port": 8000}] + [{"name": f"b{i}", "port": 1} for i in range(14)]}]
    with pytest.raises(LiveSplitError, match="more than Gateway API's 16") as exc:
        ls.gateway_split(route(full), POLICY, spec, "gw", 0.25, None)
    assert exc.value.field == "spec.load.gatewayAPI.backendRef"


def test_arm_backends_are_owned_services_or_pools_of_the_arm_pods_only():
    pools = ls.arm_backends(POLICY, gw(), "inference", POOL)
    assert pools["canary"]["kind"] == "InferencePool" and pools["canary"]["spec"]["targetPorts"] == [{"number": 8000}]
    assert pools["control"]["spec"]["endpointPickerRef"]["name"] == "epp-control"
    assert pools["canary"]["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = GatewayAPISplit.model_validate({"httpRouteRef": {"name": "chat"}, "backendRef": {"name": "chat"}})
    svc = {"kind": "Service", "metadata": {"name": "chat", "namespace": "inference"},
           "spec": {"selector": {"app": "chat"}, "ports": [{"name": "http", "port": 80, "targetPort": 8000}]}}
    services = ls.arm_backends(POLICY, spec, "inference", svc)
    assert services["control"]["spec"]["selector"][LABEL_ROLE] == "control"
    assert services["control"]["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": 8000}]
    with pytest.raises(LiveSplitError, match="operator's own label"):
        ls.arm_backends(POLICY, spec, "inference", {**svc, "spec": {"selector": {LABEL_ROLE: "canary"}}})


@pytest.mark.parametrize("n,pct,capacity,want", [(10, 0.025, "surge", 1), (40, 0.10, "surge", 5),
                                                 (10, 0.10, "carveOut", 1)])
def test_gateway_arm_replicas_are_a_service_splits_and_one_below_it(n, pct, capacity, want):
    assert ls.gateway_arm_replicas(n, pct, capacity) == want


def test_gateway_arm_replicas_keep_carve_outs_bound():
    with pytest.raises(LiveSplitError) as exc:
        ls.gateway_arm_replicas(2, 0.1, "carveOut")
    assert exc.value.field == "spec.canary.capacity"


def test_abort_defaults():
    assert (ABORT.max_error_rate_increase, ABORT.min_requests, ABORT.min_errors) == (0.05, 20, 3)
    assert (ABORT.max_ttft_regression, ABORT.max_token_latency_regression) == (2.0, 1.0)
    assert ABORT.check_interval.total_seconds() == 10 and ABORT.window.total_seconds() == 60


def test_the_error_rate_aborts_with_the_message_of_the_condition():
    r = ls.abort_reason(ArmWindow(40, 5), ArmWindow(41, 0), ABORT)
    assert r is not None and r.signal == "errors" and r.reason == "CanaryErrorRate"
    assert r.message == ("canary error rate 12.5% vs control 0% over 40 requests (5 failed): more than 5 points "
                         "above the control's (analysis.abort.maxErrorRateIncrease)")
    assert (r.canary, r.control, r.limit) == (0.125, 0.0, 0.05)


@pytest.mark.parametrize("canary, control, aborts", [
    (ArmWindow(1, 1), ArmWindow(50, 0), False),     # one failed request alone never aborts
    (ArmWindow(2, 2), ArmWindow(50, 0), False),     # two of two: still below minErrors
    (ArmWindow(3, 3), ArmWindow(50, 0), True),      # three of three: overwhelming
    (ArmWindow(0, 3), ArmWindow(0, 0), True),       # failures counted before requests: still three
    (ArmWindow(20, 1), ArmWindow(20, 0), False),    # 5%: not more than 5 points
    (ArmWindow(20, 2), ArmWindow(20, 0), True),     # 10% of 20
    (ArmWindow(19, 2), ArmWindow(20, 0), False),    # 2 failed of 19: neither 20 requests nor 3 errors
    (ArmWindow(100, 12), ArmWindow(100, 8), False),  # 12% vs 8%: within 5 points of the control's
    (ArmWindow(100, 14), ArmWindow(100, 8), True),
    (ArmWindow(30, 3), ArmWindow(0, 0), True),      # a control without traffic counts as 0% failed
])
def test_the_error_check_needs_enough_requests_or_errors(canary, control, aborts):
    r = ls.abort_reason(canary, control, ABORT)
    assert (r is not None and r.signal == "errors") == aborts


def test_time_to_first_token_and_per_token_latency_abort_beyond_their_ratios():
    r = ls.abort_reason(ArmWindow(40, 0, ttft_s=1.9, token_latency_s=0.02), ArmWindow(41, 0, 0.4, 0.02), ABORT)
    assert r.signal == "ttft" and r.reason == "CanaryTimeToFirstToken"
    assert r.message == ("canary time to first token 1.9s vs control 400ms (4.75x) over 40 and 41 requests: more "
                         "than 3x the control's (analysis.abort.maxTtftRegression 200%)")
    r = ls.abort_reason(ArmWindow(40, 0, 0.5, token_latency_s=0.048), ArmWindow(41, 0, 0.4, 0.021), ABORT)
    assert r.signal == "tokenLatency" and r.reason == "CanaryTokenLatency"
    assert "48ms vs control 21ms (2.29x)" in r.message
    assert r.limit == 2.0
    # 3x and 2x: at the limits, not beyond
    assert ls.abort_reason(ArmWindow(40, 0, 1.2, 0.04), ArmWindow(41, 0, 0.4, 0.02), ABORT) is None


def test_errors_win_over_latency_and_the_latency_checks_need_both_arms_served():
    both = ls.abort_reason(ArmWindow(40, 10, 9.0, 1.0), ArmWindow(40, 0, 0.1, 0.01), ABORT)
    assert both.signal == "errors"
    assert ls.abort_reason(ArmWindow(19, 0, 9.0, 1.0), ArmWindow(40, 0, 0.1, 0.01), ABORT) is None
    assert ls.abort_reason(ArmWindow(40, 0, 9.0, 1.0), ArmWindow(19, 0, 0.1, 0.01), ABORT) is None
    assert ls.abort_reason(ArmWindow(40, 0, 9.0, None), ArmWindow(40, 0, None, 0.01), ABORT) is None
    assert ls.abort_reason(ArmWindow(40, 0, float("nan"), 1.0), ArmWindow(40, 0, 0.0, 0.0), ABORT) is None


def test_abort_thresholds_come_from_the_spec():
    strict = AbortSpec(max_error_rate_increase="1%", min_requests=5, min_errors=1, max_ttft_regression="50%",
                       max_token_latency_regression="20%")
    assert ls.abort_reason(ArmWindow(1, 1), ArmWindow(10, 0), strict).signal == "errors"
    assert ls.abort_reason(ArmWindow(5, 0, 0.7, 0.01), ArmWindow(5, 0, 0.4, 0.01), strict).signal == "ttft"
    assert ls.abort_reason(ArmWindow(5, 0, 0.4, 0.013), ArmWindow(5, 0, 0.4, 0.01), strict).signal == "tokenLatency"


def test_the_abort_is_blind_past_max_blind_from_what_it_last_saw_or_from_when_the_arms_served():
    from datetime import datetime, timedelta, timezone

    t0 = datetime(2026, 12, 7, tzinfo=timezone.utc)
    s = timedelta(seconds=1)
    assert ls.blind_reason(None, None, t0 + 3600 * s, ABORT, "x") is None          # nothing serves yet
    assert ls.blind_reason(None, t0, t0 + 120 * s, ABORT, "x") is None             # 2m is the default, inclusive
    r = ls.blind_reason(None, t0, t0 + 121 * s, ABORT, "Prometheus refused")      # never seen since serving
    assert r.signal == ls.AbortSignal.blind and r.reason == "AbortBlind"
    assert r.message == ("the safety abort has not seen both arms' metrics for 121s (analysis.abort.maxBlind is "
                         "2m): Prometheus refused")
    assert (r.canary, r.limit) == (121.0, 120.0)
    # the later of the last reading and the start of serving counts
    assert ls.blind_reason(t0 + 100 * s, t0, t0 + 200 * s, ABORT, "x") is None
    assert ls.blind_reason(t0, t0 + 100 * s, t0 + 200 * s, ABORT, "x") is None
    assert ls.blind_reason(t0 + 100 * s, t0, t0 + 221 * s, ABORT, "x") is not None
    wide = AbortSpec.model_validate({"maxBlind": "30m"})
    assert ls.blind_reason(t0, t0, t0 + 1799 * s, wide, "x") is None
