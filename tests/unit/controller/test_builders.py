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
    (10, [10, 50, 100], [1, 5, 10]),
    (3, [10, 50, 100], [1, 2, 3]),
    (1, [10, 50, 100], [1, 1, 1]),
    (4, [25, 100], [1, 4]),
])
def test_wave_members_cumulative(n, waves, expected):
    targets = [("ns", f"d{i:02d}") for i in range(n)]
    sizes = [len(b.wave_members(targets, waves, w)) for w in range(len(waves))]
    assert sizes == expected
    assert b.wave_members(targets, waves, 0) == sorted(targets)[:expected[0]]


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
