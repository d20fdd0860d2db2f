import json

import pytest

from lookahead_operator.controller import builders as b

POLICY = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
          "metadata": {"name": "chat-fleet", "namespace": "inference", "uid": "u-1", "generation": 3}}


def target(ns="inference", name="llm-chat", args=None):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "annotations": {"team": "a"}},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "llm-chat"}},
            "template": {
                "metadata": {"labels": {"app": "llm-chat", "tier": "gpu"}},
                "spec": {
                    "nodeSelector": {"gpu": "h100"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "volumes": [{"name": "models", "emptyDir": {}}],
                    "containers": [
                        {"name": "sidecar", "image": "busybox"},
                        {"name": "engine", "image": "vllm/vllm-openai:v0.12", "args": args or ["--model", "m"],
                         "ports": [{"name": "http", "containerPort": 8080}],
                         "env": [{"name": "A", "value": "1"}],
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    ],
                },
            },
        },
    }


def is_engine(c):
    return c["name"] == "engine"


def add_flag(c):
    c["args"] = c.get("args", []) + ["--speculative-config", "{}"]
    return c


def test_role_deployment_clones_template_and_changes_only_engine_flags():
    t = target()
    d = b.build_role_deployment(t, POLICY, "canary", 1, add_flag, is_engine)
    spec = d["spec"]["template"]["spec"]
    orig = t["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "volumes"):
        assert spec[key] == orig[key]
    assert spec["containers"][0] == orig["containers"][0]
    engine = spec["containers"][1]
    assert engine["args"] == ["--model", "m", "--speculative-config", "{}"]
    assert {k: v for k, v in engine.items() if k != "args"} == {k: v for k, v in orig["containers"][1].items() if k != "args"}
    # the target's own object is untouched
    assert t["spec"]["template"]["spec"]["containers"][1]["args"] == ["--model", "m"]


def test_role_deployment_labels_scrape_annotations_and_owner():
    d = b.build_role_deployment(target(), POLICY, "control", 2, lambda c: c, is_engine)
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels[b.LABEL_ROLE] == "control" and labels[b.LABEL_POLICY] == "chat-fleet"
    assert labels[b.LABEL_TARGET] == "llm-chat" and labels[b.LABEL_GENERATION] == "3"
    assert "app" not in labels, "the clone must not join the fleet's Service selector"
    assert labels["tier"] == "gpu"
    ann = d["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8080"
    assert d["spec"]["replicas"] == 2
    assert d["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert d["metadata"]["name"] == "lap-chat-fleet-control"


def test_no_cross_namespace_owner_reference():
    d = b.build_role_deployment(target(ns="other"), POLICY, "canary", 1, lambda c: c, is_engine)
    assert "ownerReferences" not in d["metadata"]
    assert d["metadata"]["namespace"] == "other"


def test_two_policies_of_one_name_from_two_namespaces_create_distinct_objects_in_a_shared_namespace():
    """Issue 12: `team-a/chat-fleet` and `team-b/chat-fleet` both target Deployments in `inference`
    (targets.namespaces). Their canaries, controls, load Jobs and PodMonitors live there; with the
    policy's name alone they were the same objects (the second policy's create hit the first's).
    In the policy's own namespace the names stay as they were (running policies keep theirs)."""
    a = {**POLICY, "metadata": {**POLICY["metadata"], "namespace": "team-a", "uid": "u-a"}}
    bb = {**POLICY, "metadata": {**POLICY["metadata"], "namespace": "team-b", "uid": "u-b"}}
    names = []
    for pol in (a, bb):
        d = b.build_role_deployment(target(), pol, "canary", 1, lambda c: c, is_engine)
        job = b.build_load_job(pol, "inference", "canary", 0, 1, 8, "http://10.0.0.1:8080", 60, "img", "chat")
        mon = b.build_pod_monitor(pol, "inference")
        names.append((d["metadata"]["name"], job["metadata"]["name"], mon["metadata"]["name"]))
        assert d["metadata"]["name"] == b.role_deployment_name("chat-fleet", "canary", pol["metadata"]["namespace"],
                                                               "inference"), "observe finds it by this name"
    assert all(x != y for x, y in zip(*names)), names
    assert all(n.startswith("lap-chat-fleet-") and len(n) <= 63 for n in names[0] + names[1])
    same = b.build_load_job(POLICY, "inference", "canary", 0, 1, 8, "http://10.0.0.1:8080", 60, "img", "chat")
    assert same["metadata"]["name"] == "lap-chat-fleet-r1-s0-canary"
    assert b.build_pod_monitor(POLICY, "inference")["metadata"]["name"] == "lap-chat-fleet"


def test_bad_role_rejected():
    with pytest.raises(ValueError, match="role"):
        b.build_role_deployment(target(), POLICY, "primary", 1, lambda c: c, is_engine)


def test_dns_name_is_bounded_and_stable():
    long = b.dns_name("lap", "x" * 80, "canary")
    assert len(long) <= 63 and long == b.dns_name("lap", "x" * 80, "canary")
    assert long != b.dns_name("lap", "x" * 81, "canary")


def test_claim_saves_template_once_and_restore_is_exact():
    t = target()
    original = json.loads(json.dumps(t["spec"]["template"]))
    patch = b.claim_patch(t, "inference/chat-fleet")
    t["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    assert b.original_template(t) == original
    promoted = b.promote_patch(t, add_flag, is_engine, "d1")
    t["spec"]["template"] = promoted["spec"]["template"]
    t["metadata"]["annotations"].update(promoted["metadata"]["annotations"])
    # a second claim (e.g. after a crash) must not overwrite the saved original
    again = b.claim_patch(t, "inference/chat-fleet")
    assert b.ANNOTATION_ORIGINAL_TEMPLATE not in again["metadata"]["annotations"]
    restored = b.restore_body(t)
    assert restored["spec"]["template"] == original
    assert restored["metadata"]["annotations"] == {"team": "a"}


def test_promote_refuses_without_saved_template():
    with pytest.raises(ValueError, match="not saved"):
        b.promote_patch(target(), add_flag, is_engine, "d1")


@pytest.mark.parametrize("n,waves,expected", [
    (10, [10, 50, 100], [1, 5, 10]),     # the fleet: one Deployment of 10 replicas
    (3, [10, 50, 100], [1, 2, 3]),       # ceil: a wave never rounds down to nothing
    (1, [10, 50, 100], [1, 1, 1]),       # one replica: promoted whole in wave 1
    (4, [25, 100], [1, 4]),
    (7, [33, 66, 100], [3, 5, 7]),
])
def test_a_wave_is_a_share_of_one_deployments_replicas(n, waves, expected):
    plans = [b.wave_pods([(("ns", "fleet"), n)], waves, w) for w in range(len(waves))]
    assert [p[("ns", "fleet")] for p in plans] == expected


def test_waves_fill_targets_in_order_so_at_most_one_is_promoted_in_part():
    sizes = [(("ns", "b"), 4), (("ns", "a"), 4), (("ns", "z"), 0)]
    waves = [10, 50, 75, 100]
    assert b.wave_pods(sizes, waves, 0) == {("ns", "a"): 1}
    assert b.wave_pods(sizes, waves, 1) == {("ns", "a"): 4}
    assert b.wave_pods(sizes, waves, 2) == {("ns", "a"): 4, ("ns", "b"): 2}
    # the last wave promotes every target whole, one scaled to zero included
    assert b.wave_pods(sizes, waves, 3) == {("ns", "a"): 4, ("ns", "b"): 4, ("ns", "z"): 0}
    assert b.wave_pods([], waves, 0) == {}


def claimed(t=None, replicas=10):
    t = t or target()
    t["spec"]["replicas"] = replicas
    t["metadata"]["annotations"].update(b.claim_patch(t, "inference/chat-fleet")["metadata"]["annotations"])
    return t


def test_lending_replicas_to_a_wave_leaves_the_template_and_restore_gives_them_back():
    t = claimed()
    saved = json.loads(json.dumps(t["spec"]["template"]))
    lent = b.lend_body(t, 3, "d1")
    assert lent["spec"]["replicas"] == 7 and lent["spec"]["template"] == saved
    ann = lent["metadata"]["annotations"]
    assert ann[b.ANNOTATION_PROMOTED] == "d1" and ann[b.ANNOTATION_PROMOTED_PODS] == "3"
    assert b.fleet_replicas(lent) == 10 and b.lent_replicas(lent) == 3
    assert not b.user_edited(lent), "a part promotion keeps the saved template: no edit"
    # the next wave lends more from the same fleet of 10
    more = b.lend_body(lent, 5, "d1")
    assert more["spec"]["replicas"] == 5 and b.fleet_replicas(more) == 10
    restored = b.restore_body(more)
    assert restored["spec"]["replicas"] == 10 and restored["spec"]["template"] == saved
    assert restored["metadata"]["annotations"] == {"team": "a"}
    # an HPA or the user scaled it meanwhile: what was lent comes back on top of that
    more["spec"]["replicas"] = 8
    assert b.restore_body(more)["spec"]["replicas"] == 13
    with pytest.raises(ValueError, match="1..9"):
        b.lend_body(t, 10, "d1")


def test_a_user_edit_of_a_target_promoted_in_part_is_seen_and_gives_the_replicas_back():
    lent = b.lend_body(claimed(), 3, "d1")
    lent["spec"]["template"]["spec"]["containers"][1]["image"] = "vllm/vllm-openai:v0.13"
    assert b.user_edited(lent)
    patch = b.give_back_patch(lent)
    assert patch["spec"] == {"replicas": 10}
    assert patch["metadata"]["annotations"] == {b.ANNOTATION_PROMOTED_PODS: None, b.ANNOTATION_CARVED_OUT: None}
    assert b.give_back_patch(claimed()) == {}


def test_promoting_whole_gives_back_what_was_lent():
    lent = b.lend_body(claimed(), 5, "d1")
    whole = b.promote_body(lent, add_flag, is_engine, "d1")
    assert whole["spec"]["replicas"] == 10
    ann = whole["metadata"]["annotations"]
    assert b.ANNOTATION_PROMOTED_PODS not in ann and ann[b.ANNOTATION_PROMOTED_TEMPLATE]
    assert whole["spec"]["template"]["spec"]["containers"][1]["args"][-2:] == ["--speculative-config", "{}"]


def test_the_wave_deployment_serves_as_fleet_but_no_replicaset_of_the_target_adopts_its_pods():
    t = claimed()
    w = b.build_wave_deployment(t, POLICY, 3, add_flag, is_engine, "d1")
    assert w["metadata"]["namespace"] == "inference" and w["spec"]["replicas"] == 3
    assert w["metadata"]["name"] == b.wave_deployment_name(POLICY, t)
    pod_labels = w["spec"]["template"]["metadata"]["labels"]
    # the fleet's Service (and the target's selector, which the guard lists by) select its pods
    assert all(pod_labels[k] == v for k, v in t["spec"]["selector"]["matchLabels"].items())
    assert pod_labels["tier"] == "gpu"
    # its own selector needs labels the target's pods never have
    own = w["spec"]["selector"]["matchLabels"]
    assert own[b.LABEL_WAVE] == "llm-chat" and own[b.LABEL_POLICY] == "chat-fleet"
    # fleet pods, not a role of ours: a scrape job that keeps the fleet and drops canary/control keeps them
    assert b.LABEL_ROLE not in pod_labels and w["metadata"]["labels"][b.LABEL_ROLE] == "wave"
    assert not all(k in t["spec"]["template"]["metadata"]["labels"] for k in own)
    assert all(pod_labels[k] == v for k, v in own.items())
    # the promoted template: the saved original plus the change, marked with the decision
    assert w["spec"]["template"] == b.promote_patch(t, add_flag, is_engine, "d1")["spec"]["template"] | {
        "metadata": w["spec"]["template"]["metadata"]}
    assert w["spec"]["template"]["metadata"]["annotations"][b.ANNOTATION_PROMOTED] == "d1"
    assert w["metadata"]["labels"][b.LABEL_MANAGED_BY] == b.MANAGED_BY, "never taken for fleet"
    assert w["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    with pytest.raises(ValueError, match="not saved"):
        b.build_wave_deployment(target(), POLICY, 3, add_flag, is_engine, "d1")


def test_load_job_shape():
    j = b.build_load_job(POLICY, "inference", "canary", 2, 5, 8, "http://10.0.0.5:8080", 120, "img:1", "chat")
    c = j["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:4] == ["--url", "http://10.0.0.5:8080", "--concurrency", "8"]
    assert j["metadata"]["labels"][b.LABEL_STEP] == "2" and j["metadata"]["labels"][b.LABEL_RUN] == "5"
    assert j["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_promote_records_the_digest_of_the_template_it_writes_and_restore_removes_it():
    t = target()
    t["metadata"]["annotations"].update(b.claim_patch(t, "inference/chat-fleet")["metadata"]["annotations"])
    assert not b.user_edited(t)
    patch = b.promote_patch(t, add_flag, is_engine, "d1")
    digest = patch["metadata"]["annotations"][b.ANNOTATION_PROMOTED_TEMPLATE]
    assert digest == b.template_digest(patch["spec"]["template"]) and digest.startswith("sha256:")
    body = b.promote_body(t, add_flag, is_engine, "d1")
    assert body["spec"]["template"] == patch["spec"]["template"] and not b.user_edited(body)
    body["spec"]["template"]["spec"]["containers"][1]["env"].append({"name": "B", "value": "2"})
    assert b.user_edited(body), "an unrelated env var added to the promoted template is the user's edit"
    assert b.ANNOTATION_PROMOTED_TEMPLATE not in b.restore_body(body)["metadata"]["annotations"]


def test_a_control_pod_gets_exactly_the_targets_selector_labels_to_join_its_service():
    """``serving_labels``: the target selector's matchLabels, merged onto a role pod that lacks any
    of them; nothing for a pod that has them all, one being deleted, or a selector without
    matchLabels (an expression is not a label to write)."""
    target = {"spec": {"selector": {"matchLabels": {"app": "chat", "fleet": "chat-a"}}}}
    pod = {"metadata": {"name": "ctl-0", "labels": {"lookahead.dev/role": "control", "app": "chat"}}}
    assert b.serving_labels(target, pod) == {"app": "chat", "fleet": "chat-a"}
    joined = {"metadata": {"labels": {**pod["metadata"]["labels"], "fleet": "chat-a"}}}
    assert b.serving_labels(target, joined) is None
    assert b.serving_labels(target, {"metadata": {**pod["metadata"], "deletionTimestamp": "t"}}) is None
    exprs = {"spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}}
    assert b.serving_labels(exprs, pod) is None
