"""The watched caches' pure logic: what the indexes keep of each object (``cache.slim_*``), what a
pass reads from them (``cache.Snapshot``, ``cache.CachedView``), which events wake which policy
(``handlers.wake``, ``handlers.wake_on_deployment``), and the raw JSON transport of ``kube.Kube``."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone

import pytest

from lookahead_operator.controller import actions
from lookahead_operator.api import names as api
from lookahead_operator.controller import builders as b
from lookahead_operator.kube import cache
from lookahead_operator.controller import fleet
from lookahead_operator.runtime import handlers
from lookahead_operator.kube import client as kube
from lookahead_operator.controller import loadjobs
from lookahead_operator.measurement import measure
from lookahead_operator.controller import observe
from lookahead_operator.api.spec import LabelSelector, LookaheadPolicySpec
from lookahead_operator.api.status import LookaheadPolicyStatus
from lookahead_operator.controller.world import Observed, Target

T_JOBS = datetime(2026, 12, 1, tzinfo=timezone.utc)  # when a step's load Jobs are built (their duration is tested in test_statemachine)

POLICY = {"apiVersion": "lookahead.dev/v1alpha1", "kind": "LookaheadPolicy",
          "metadata": {"name": "bench", "namespace": "team-a", "uid": "u-1", "generation": 2}}
MANAGED = [{"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:status": {}}}]


def target(ns="team-a", name="llm", labels=None, annotations=None, **status):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "generation": 3,
                     "resourceVersion": "17", "labels": labels or {"app": "llm"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", **(annotations or {})},
                     "managedFields": MANAGED, "creationTimestamp": "2026-12-01T08:00:00Z"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}},
                 "template": {"metadata": {"labels": {"app": "llm"}},
                              "spec": {"containers": [{"name": "engine", "image": "local/reference-engine",
                                                       "command": ["python3", "-m", "lookahead_canary.server"],
                                                       "args": ["--port", "8000", "--max-num-seqs", "16"],
                                                       "ports": [{"name": "http", "containerPort": 8000}]}]}}},
        "status": {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                   "availableReplicas": 2, "collisionCount": 0,
                   "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                                   "message": "ok", "lastUpdateTime": "2026-12-01T08:00:00Z",
                                   "lastTransitionTime": "2026-12-01T08:00:00Z"}], **status},
    }


def role(role_name="canary", ns="team-a", policy=POLICY):
    d = b.build_role_deployment(target(ns), policy, role_name, 1, lambda c: c, lambda c: c["name"] == "engine")
    d["metadata"].update(uid=f"uid-{role_name}", resourceVersion="20", generation=1, managedFields=MANAGED)
    d["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}
    return d


def pod(role_name="canary", ns="team-a", name=None, ready=True, ip="10.0.0.7"):
    labels = {api.LABEL_POLICY: "bench", api.LABEL_POLICY_NAMESPACE: "team-a", api.LABEL_ROLE: role_name}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name or f"bench-{role_name}-abc", "namespace": ns, "labels": labels, "uid": "p",
                     "managedFields": MANAGED, "ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}]},
        "spec": {"containers": [{"name": "engine", "image": "x", "args": ["--port", "9000"],
                                 "ports": [{"name": "http", "containerPort": 9000}],
                                 "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run"}]}],
                 "volumes": [{"name": "kube-api-access", "projected": {"sources": []}}],
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": "2026-12-01T08:00:00Z"}],
                   "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0}]},
    }


def job(run="3", drives="promoted", ready=None):
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"bench-load-{drives}", "namespace": "team-a", "managedFields": MANAGED,
                     "creationTimestamp": "2026-12-01T08:00:00Z",
                     "labels": {api.LABEL_POLICY: "bench", api.LABEL_POLICY_NAMESPACE: "team-a",
                                api.LABEL_ROLE: "loadgen", api.LABEL_RUN: run, api.LABEL_DRIVES: drives,
                                api.LABEL_POD: "llm-abc"}},
        "spec": {"template": {"spec": {"containers": [{"name": "load", "image": "x", "args": ["--many"] * 50}]}}},
        "status": {"active": 1, "startTime": "2026-12-01T08:00:01Z", "uncountedTerminatedPods": {},
                   **({"ready": ready} if ready is not None else {})},
    }


# --- what the indexes keep -----------------------------------------------------------------------

def test_slim_deployment_keeps_what_fleet_and_builders_read():
    full = target(annotations={api.ANNOTATION_OWNER: "team-a/bench", api.ANNOTATION_ORIGINAL_TEMPLATE: "{}"})
    slim = cache.slim_deployment(full)
    assert "managedFields" not in slim["metadata"]
    assert "kubectl.kubernetes.io/last-applied-configuration" not in slim["metadata"]["annotations"]
    assert slim["spec"] == full["spec"]  # a target's template is what canary and control are cloned from
    assert slim["status"]["conditions"] == [{"type": "Progressing", "status": "True",
                                             "reason": "NewReplicaSetAvailable", "message": "ok"}]
    assert fleet.target_of(slim, "auto") == fleet.target_of(full, "auto")
    assert fleet.engine_max_batch(slim, "reference") == fleet.engine_max_batch(full, "reference") == 16
    assert b.build_role_deployment(slim, POLICY, "canary", 1, lambda c: c, lambda c: c["name"] == "engine") == \
        b.build_role_deployment(full, POLICY, "canary", 1, lambda c: c, lambda c: c["name"] == "engine")
    assert full["metadata"]["managedFields"] == MANAGED  # the watched object itself is left alone


@pytest.mark.parametrize("status", [
    {"observedGeneration": 2, "readyReplicas": 2},  # not observed yet
    {"readyReplicas": 1},
    {"conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                     "message": "deadline exceeded", "lastUpdateTime": "x"}]},
])
def test_slim_deployment_reads_the_same_rollout_state(status):
    full = target(**status)
    slim = cache.slim_deployment(full)
    assert fleet.deployment_ready(slim) == fleet.deployment_ready(full)
    assert fleet.rollout_failed(slim) == fleet.rollout_failed(full)


def test_slim_deployment_of_our_own_role_drops_the_template():
    full = role("control")
    slim = cache.slim_deployment(full)
    assert "template" not in slim["spec"] and slim["spec"]["replicas"] == 1
    assert slim["metadata"]["labels"] == full["metadata"]["labels"]
    assert fleet.deployment_ready(slim) is fleet.deployment_ready(full) is True
    assert "template" in full["spec"]


def test_slim_pod_and_job_keep_what_load_jobs_and_the_guard_read():
    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "llm"}}},
                                               "engine": "reference", "load": {"batchSizes": [1, 8]}})
    pods = {"canary": [pod("canary")], "control": [pod("control", ip="10.0.0.8"), pod("control", name="x", ready=False)]}
    slim = {r: [cache.slim_pod(p) for p in ps] for r, ps in pods.items()}
    assert "volumes" not in slim["canary"][0]["spec"] and "managedFields" not in slim["canary"][0]["metadata"]
    assert loadjobs.step_jobs(spec, POLICY, "team-a", 0, 1, 8, slim, T_JOBS, T_JOBS) == \
        loadjobs.step_jobs(spec, POLICY, "team-a", 0, 1, 8, pods, T_JOBS, T_JOBS)
    assert len(loadjobs.step_jobs(spec, POLICY, "team-a", 0, 1, 8, slim, T_JOBS, T_JOBS)) == 2
    j = cache.slim_job(job())
    assert "spec" not in j and j["status"] == {"active": 1, "startTime": "2026-12-01T08:00:01Z", "conditions": []}
    # which load Jobs run: Job status.ready survives the slimming, and only the current run counts
    jobs = [cache.slim_job(job(drives="control", ready=1)), cache.slim_job(job(ready=0)),
            cache.slim_job(job(run="2", drives="canary", ready=1))]
    assert observe.running_load(jobs, 3) == {"control"}
    assert observe.running_load(jobs + [cache.slim_job(job(ready=1))], 3) == {"control", "promoted"}
    # which load Jobs drive a pod that is gone (by the pod label every load Job carries)
    canary_pods = [{"metadata": {"name": "llm-abc"}}]
    jobs = [cache.slim_job(job(drives="canary", ready=1)), cache.slim_job(job(drives="control", ready=1))]
    assert observe.gone_load_targets(jobs, 3, {"canary": canary_pods, "control": canary_pods}) == set()
    assert observe.gone_load_targets(jobs, 3, {"canary": [{"metadata": {"name": "llm-new"}}],
                                               "control": canary_pods}) == {"canary"}
    assert observe.gone_load_targets(jobs, 4, {"canary": [], "control": []}) == set(), "only the current run"
    # the guard finds its Job by labels and compares from when the load ran (status.progress)
    status = LookaheadPolicyStatus.model_validate({"progress": {"loadRun": 3, "guardMode": "synthetic"}})
    now = datetime(2026, 12, 1, 8, 0, 3, tzinfo=timezone.utc)  # before the first window: nothing is queried
    check = measure.guard(spec, ("team-a", "bench"), status, now, [cache.slim_job(job(drives="control")), j])
    assert check.enough_data is False and "pods to run" in check.message
    status = LookaheadPolicyStatus.model_validate({"progress": {"loadRun": 3, "loadStartedAt": "2026-12-01T08:00:02Z",
                                                                "guardMode": "synthetic"}})
    check = measure.guard(spec, ("team-a", "bench"), status, now, [cache.slim_job(job(drives="control")), j])
    assert check.enough_data is False and "waiting for the guard load" not in check.message


# --- what a pass reads ---------------------------------------------------------------------------

class FakeKube:
    def __init__(self):
        self.created = []

    def create_if_absent(self, body):
        self.created.append((body["kind"], body["metadata"]["namespace"], body["metadata"]["name"]))
        return True

    def get_deployment(self, namespace, name):
        return {"fresh": True}


def view(deployments=(), pods=(), jobs=(), namespaces=None):
    snap = cache.Snapshot(namespaces=namespaces or {}, pods=list(pods), jobs=list(jobs))
    for d in deployments:
        snap.deployments.setdefault(d["metadata"]["namespace"], []).append(cache.slim_deployment(d))
    return cache.CachedView(FakeKube(), snap)


def test_deployments_match_the_selector_never_our_own_and_are_sorted():
    v = view([target(name="z"), target(name="a"), target(name="other", labels={"app": "db"}), role("canary"),
              target("team-b", "llm")])
    sel = LabelSelector.model_validate({"matchLabels": {"app": "llm"}})
    assert [d["metadata"]["name"] for d in v.deployments(["team-a"], sel)] == ["a", "z"]
    assert [d["metadata"]["name"] for d in v.deployments(["team-a"], None)] == ["a", "other", "z"]
    assert [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in v.deployments(["team-b", "team-a"], sel)] \
        == [("team-a", "a"), ("team-a", "z"), ("team-b", "llm")]
    assert v.get_deployment("team-a", "z")["metadata"]["name"] == "z"
    assert v.get_deployment("team-a", "nope") is None
    assert v.fresh_deployment("team-a", "z") == {"fresh": True}  # read through before a write


def test_role_deployments_pair_policy_name_and_namespace():
    other = dict(POLICY, metadata={**POLICY["metadata"], "namespace": "team-b"})
    deleting = role("control")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T08:00:00Z"
    v = view([role("canary"), deleting, role("canary", ns="team-b", policy=other), target()])
    assert [d["metadata"]["labels"][api.LABEL_ROLE] for d in v.role_deployments("team-a", "bench")] == ["canary"]
    assert len(v.role_deployments("team-b", "bench")) == 1
    assert v.role_deployments("team-c", "bench") == []


def test_role_pods_and_load_jobs():
    v = view(pods=[cache.slim_pod(pod("canary")), cache.slim_pod(pod("control")),
                   cache.slim_pod(pod("canary", ns="elsewhere"))], jobs=[cache.slim_job(job())])
    assert [p["metadata"]["labels"][api.LABEL_ROLE] for p in v.role_pods("team-a", "team-a", "bench", "canary")] \
        == ["canary"]
    assert [j["metadata"]["name"] for j in v.load_jobs("team-a", "bench")] == ["bench-load-promoted"]


def test_create_if_absent_skips_what_the_cache_or_a_recent_create_holds():
    v = view([role("canary")], jobs=[cache.slim_job(job())])
    assert v.create_if_absent(role("canary")) is False                      # in the cache
    assert v.create_if_absent({"kind": "Job", "metadata": {"namespace": "team-a", "name": "bench-load-promoted"}}) \
        is False
    control = role("control")
    name = control["metadata"]["name"]
    kube.forget_created("Deployment", "team-a", name)
    try:
        assert v.create_if_absent(control) is True
        assert v.k.created == [("Deployment", "team-a", name)]
        assert v.create_if_absent(control) is False                        # created moments ago: not again
        assert v.k.created == [("Deployment", "team-a", name)]
    finally:
        kube.forget_created("Deployment", "team-a", name)


def test_snapshot_takes_what_one_policy_needs():
    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "llm"}}},
                                               "engine": "reference"})
    deployments = {"team-a": [target()], "team-b": [target("team-b")], "old": [target("old")]}
    namespaces = {"team-a": [{"env": "prod"}], "team-b": [{"env": "prod"}], "old": [{}]}
    pods = {("team-a", "bench"): [pod()], ("team-b", "bench"): [pod(ns="team-b")]}
    jobs = {("team-a", "bench"): [job()]}
    status_targets = [type("Row", (), {"namespace": "old"})()]
    snap = cache.Snapshot.of("team-a", "bench", spec, status_targets, namespaces, deployments, pods, jobs)
    assert set(snap.deployments) == {"team-a", "old"}   # its own namespace, and where its targets were
    assert snap.namespaces == {}                        # no namespace selector: labels not copied
    assert len(snap.pods) == 1 and snap.pods[0]["metadata"]["namespace"] == "team-a" and len(snap.jobs) == 1
    by_labels = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"app": "llm"}},
                                                                "namespaceSelector": {"matchLabels": {"env": "prod"}}},
                                                    "engine": "reference"})
    snap = cache.Snapshot.of("team-a", "bench", by_labels, [], namespaces, deployments, pods, {})
    assert set(snap.deployments) == {"team-a", "team-b"} and snap.jobs == []
    assert cache.CachedView(FakeKube(), snap).target_namespaces("team-a", by_labels.targets.namespace_selector,
                                                                None) == ["team-a", "team-b"]
    assert cache.CachedView.select_namespaces({}, "team-a", None, ["z", "y"]) == ["y", "z"]
    assert cache.Snapshot.of("team-a", "bench", None, [], {}, {}, {}, {}).deployments == {"team-a": []}


# --- which events wake which policy --------------------------------------------------------------

@pytest.fixture
def daemons():
    """Three policies' daemons as ``handlers.run`` registers them, waiting."""
    saved = (dict(handlers.wakeups.wakers), dict(handlers.wakeups.uid_by_key), dict(handlers.wakeups.pending),
             dict(handlers.wakeups.stale), dict(handlers.wakeups.seen))
    events = {}
    for key in ("team-a/bench", "team-b/bench", "team-c/bench"):
        uid = f"uid-{key}"
        handlers.wakeups.uid_by_key[key] = uid
        events[key] = handlers.wakeups.wakers[uid] = asyncio.Event()
    yield events
    for live, old in zip((handlers.wakeups.wakers, handlers.wakeups.uid_by_key, handlers.wakeups.pending,
                          handlers.wakeups.stale, handlers.wakeups.seen), saved):
        live.clear()
        live.update(old)


def _woken(events):
    out = {k for k, e in events.items() if e.is_set()}
    for e in events.values():
        e.clear()
    return out


def test_a_new_deployment_wakes_only_pending_policies_searching_its_namespace(daemons):
    handlers.wakeups.pending.update({"team-a/bench": frozenset({"team-a"}), "team-c/bench": None})
    asyncio.run(handlers.wake_on_deployment(meta={"namespace": "team-a", "labels": {"app": "llm"}}))
    assert _woken(daemons) == {"team-a/bench", "team-c/bench"}  # team-c's searches by namespace labels
    asyncio.run(handlers.wake_on_deployment(meta={"namespace": "team-z", "labels": {"app": "llm"}}))
    assert _woken(daemons) == {"team-c/bench"}


def test_our_deployments_and_claimed_targets_wake_their_policy(daemons):
    handlers.wakeups.pending.update({"team-c/bench": None})
    labels = {api.LABEL_POLICY: "bench", api.LABEL_POLICY_NAMESPACE: "team-b", api.LABEL_ROLE: "canary"}
    asyncio.run(handlers.wake_on_deployment(meta={"namespace": "team-b", "labels": labels}))
    assert _woken(daemons) == {"team-b/bench"}
    asyncio.run(handlers.wake_on_deployment(meta={"namespace": "x", "labels": {},
                                                  "annotations": {api.ANNOTATION_OWNER: "team-a/bench"}}))
    assert _woken(daemons) == {"team-a/bench"}


def test_a_policy_wakes_on_spec_or_gates_and_on_a_newer_version_when_waiting_for_one(daemons):
    uid = "uid-team-a/bench"
    meta = {"uid": uid, "generation": 1, "resourceVersion": "5", "annotations": {}}
    asyncio.run(handlers.wake(meta=meta))
    assert _woken(daemons) == {"team-a/bench"}                  # first sight
    asyncio.run(handlers.wake(meta={**meta, "resourceVersion": "6"}))
    assert _woken(daemons) == set()                             # a status write: nothing to do
    handlers.wakeups.stale[uid] = "6"                           # the daemon waits for a version newer than 6
    asyncio.run(handlers.wake(meta={**meta, "resourceVersion": "6"}))
    assert _woken(daemons) == set()
    asyncio.run(handlers.wake(meta={**meta, "resourceVersion": "7"}))
    assert _woken(daemons) == {"team-a/bench"} and uid not in handlers.wakeups.stale
    asyncio.run(handlers.wake(meta={**meta, "resourceVersion": "8", "annotations": {api.ANNOTATION_APPROVE: "d1"}}))
    assert _woken(daemons) == {"team-a/bench"}                  # a gate


def test_no_diff_base_is_kept():
    storage = handlers._NoDiffBase()
    assert storage.build(body=POLICY) == {} and storage.fetch(body=POLICY) == {}
    assert storage.store(body=POLICY, patch=None, essence={"spec": {}}) is None


# --- the raw JSON transport ----------------------------------------------------------------------

class FakeResponse:
    def __init__(self, status, payload, reason="OK"):
        self.status, self.reason = status, reason
        self.data = json.dumps(payload).encode() if payload is not None else b""
        self.headers = {}

    def read(self):
        return self.data


class FakeRest:
    def __init__(self, *responses):
        self.responses = list(responses)
        self.calls = []

    def request(self, method, url, headers=None, body=None, _request_timeout=None):
        self.calls.append((method, url, headers, body, _request_timeout))
        return self.responses.pop(0)


def fake_kube(*responses):
    from kubernetes import client

    cfg = client.Configuration(host="https://apiserver:6443", api_key={"BearerToken": "Bearer t0k"})
    k = kube.Kube(client.ApiClient(cfg))
    k.api_client.rest_client = FakeRest(*responses)
    return k


def test_requests_are_plain_json_with_auth_user_agent_and_a_bound():
    k = fake_kube(FakeResponse(200, {"kind": "DeploymentList", "apiVersion": "apps/v1",
                                     "items": [{"metadata": {"name": "a"}}]}))
    items = k.role_deployments("team-a", "bench")
    assert items == []  # (no role label: not ours)
    method, url, headers, body, timeout = k.api_client.rest_client.calls[0]
    assert method == "GET" and body is None and timeout == kube.TIMEOUT
    assert url.startswith("https://apiserver:6443/apis/apps/v1/deployments?labelSelector=")
    from lookahead_dev.bench_operator import _POLICY_NS  # (what the benchmark attributes requests by)
    assert _POLICY_NS.search(url).group(1) == "team-a"
    assert headers["User-Agent"] == kube.USER_AGENT and headers["authorization"] == "Bearer t0k"


def test_list_items_get_their_kind_and_patches_are_strategic_merges():
    k = fake_kube(FakeResponse(200, {"kind": "PodList", "apiVersion": "v1", "items": [{"metadata": {"name": "p"}}]}),
                  FakeResponse(200, {"kind": "Deployment"}))
    assert k.pods("team-a", {"matchLabels": {"app": "llm"}}) == [{"metadata": {"name": "p"}, "kind": "Pod",
                                                                  "apiVersion": "v1"}]
    k.patch_deployment("team-a", "llm", {"metadata": {"annotations": {"x": None}}})
    method, url, headers, body, _ = k.api_client.rest_client.calls[1]
    assert (method, url) == ("PATCH", "https://apiserver:6443/apis/apps/v1/namespaces/team-a/deployments/llm")
    assert headers["Content-Type"] == kube.STRATEGIC_MERGE and body == {"metadata": {"annotations": {"x": None}}}


def test_errors_are_api_exceptions_and_expected_ones_are_answers():
    from kubernetes.client.rest import ApiException

    k = fake_kube(FakeResponse(404, {"kind": "Status", "code": 404}, "Not Found"),
                  FakeResponse(409, {"kind": "Status", "code": 409}, "Conflict"),
                  FakeResponse(409, {"kind": "Status", "code": 409}, "Conflict"),
                  FakeResponse(201, {"kind": "Deployment"}))
    assert k.get_deployment("team-a", "gone") is None
    assert k.create_if_absent(role("canary")) is False        # exists already
    with pytest.raises(ApiException) as exc:
        k.replace_policy_status({**POLICY, "status": {}})
    assert exc.value.status == 409 and "Conflict" in kube.api_message(exc.value)
    assert k.create_if_absent(role("control")) is True
    assert k.api_client.rest_client.calls[2][1].endswith("/apis/lookahead.dev/v1alpha1/namespaces/team-a/"
                                                         "lookaheadpolicies/bench/status")


def test_current_load_jobs_are_those_of_the_run_and_feed_running_and_gone():
    """``observe.current_load_jobs``: the Jobs of the policy's current load run (run None is run 0),
    whatever their state; ``running_load`` then leaves out those being deleted, ``gone_load_targets``
    reads them all."""
    deleting = cache.slim_job(job(drives="canary", ready=1))
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T08:00:05Z"
    unlabelled = {"metadata": {"name": "x", "namespace": "team-a"}}
    jobs = [cache.slim_job(job(drives="control", ready=1)), deleting, cache.slim_job(job(run="2", ready=1)),
            cache.slim_job(job(run="0", drives="canary")), unlabelled]
    assert [j["metadata"]["labels"][api.LABEL_DRIVES] for j in observe.current_load_jobs(jobs, 3)] == \
        ["control", "canary"]
    assert [j["metadata"]["labels"][api.LABEL_DRIVES] for j in observe.current_load_jobs(jobs, None)] == ["canary"]
    assert observe.current_load_jobs(jobs, 4) == []
    assert observe.running_load(jobs, 3) == {"control"}, "a Job being deleted runs no load"
    assert observe.gone_load_targets(jobs, 3, {"canary": [], "control": [{"metadata": {"name": "llm-abc"}}]}) \
        == {"canary"}


def test_finished_load_is_a_current_job_whose_pod_exited_as_the_cache_keeps_it():
    """``observe.finished_load``: the guard restarts its load when a current Job ended (succeeded
    or failed) without the data it needed; the cache's slim Job must keep what says so."""
    done = job(drives="promoted")
    done["status"] = {"succeeded": 1, "completionTime": "2026-12-01T08:01:00Z"}
    failed = job(drives="control")
    failed["status"] = {"failed": 1}
    old = job(run="2", drives="canary")
    old["status"] = {"succeeded": 1}
    jobs = [cache.slim_job(j) for j in (done, failed, old, job(drives="canary", ready=1))]
    assert observe.finished_load(jobs, 3) == {"promoted", "control"}
    assert observe.finished_load(jobs, 2) == {"canary"} and observe.finished_load(jobs, 4) == set()
    jobs[0]["metadata"]["deletionTimestamp"] = "2026-12-01T08:01:01Z"
    assert observe.finished_load(jobs, 3) == {"control"}, "a Job being deleted is already being replaced"


def test_the_guards_fleet_pods_are_read_once_from_the_newest_promoted_target():
    """``observe.in_play_pods``: in Promoting and Guarding one list call per in-play target (not one
    left to its user) per pass; ``guard_fleet_pods`` picks the target promoted last from it, the
    guard's Jobs are built from that list and a guard Job whose pod is not in it drives nothing
    (``gone_load_targets``)."""
    from lookahead_operator.api.status import Phase

    class Reads:
        def __init__(self):
            self.calls = []

        def get_deployment(self, ns, name):
            self.calls.append(("get", ns, name))
            return {"spec": {"selector": {"matchLabels": {"fleet": name}}}}

        def pods(self, ns, selector):
            self.calls.append(("pods", ns, selector["matchLabels"]["fleet"]))
            return [{"metadata": {"name": f"{selector['matchLabels']['fleet']}-new"}}]

    me = "inference/chat-fleet"
    targets = [Target("serving", "a", "reference", owner=me, promoted="d1"),
               Target("serving", "b", "reference", owner=me, promoted="d1", user_edited=True),
               Target("serving", "c", "reference", owner=me)]
    w = Observed(now=datetime(2026, 12, 1, tzinfo=timezone.utc), name="chat-fleet", namespace="inference",
                 generation=1, fingerprint="f", spec=None, status=LookaheadPolicyStatus(phase=Phase.Guarding),
                 targets=targets)
    k = Reads()
    listed = observe.in_play_pods(k, w)
    assert k.calls == [("get", "serving", "a"), ("pods", "serving", "a"), ("get", "serving", "c"),
                       ("pods", "serving", "c")], "b is its user's; each target in play is listed once"
    pods = observe.guard_fleet_pods(listed, w)
    assert pods == [{"metadata": {"name": "a-new"}}], "a was promoted last for us"
    guard_job = job(drives="promoted")
    guard_job["metadata"]["labels"][api.LABEL_POD] = "a-old"
    assert observe.gone_load_targets([cache.slim_job(guard_job)], 3, {"promoted": pods}) == {"promoted"}
    guard_job["metadata"]["labels"][api.LABEL_POD] = "a-new"
    assert observe.gone_load_targets([cache.slim_job(guard_job)], 3, {"promoted": pods}) == set()
    rest = Observed(**{**w.__dict__, "targets": targets[2:]})
    assert observe.guard_fleet_pods(observe.in_play_pods(Reads(), rest), rest) == []


def test_each_replica_gets_its_own_nonzero_peering_priority():
    """Kopf pauses every operator that sees a peer of its own priority: the chart's replicas (one
    ReplicaSet, pod names differing in their suffix) must never share one, nor take Kopf's 0."""
    names = [f"lookahead-lookahead-operator-5dbcc6877d-{s}" for s in ("l9kdd", "n2kxf", "6p6wq", "gzswd", "kq62h")]
    prios = [handlers.peering_priority(n) for n in names]
    assert len(set(prios)) == len(prios) and min(prios) > 0
    assert prios == [handlers.peering_priority(n) for n in names], "stable across restarts of the same Pod"


def test_a_newer_crd_field_is_logged_once_per_policy_and_what_is_remembered_is_bounded(caplog):
    """``handlers.parse_spec`` logs each policy's ignored fields once, and remembers at most
    ``_IGNORED_FIELDS_MAX`` policies: an operator that runs for months sees many come and go."""
    spec = {"targets": {"selector": {"matchLabels": {"app": "x"}}}, "analysis": {"futureKnob": "on"}}
    handlers._IGNORED_FIELDS_LOGGED.clear()
    body = {"metadata": {"name": "p", "namespace": "n", "uid": "u-0"}, "spec": spec}
    with caplog.at_level("WARNING", logger="lookahead_operator"):
        assert handlers.parse_spec(body)[1] is None and handlers.parse_spec(body)[1] is None
    assert [r.getMessage() for r in caplog.records] == \
        ["n/p: ignoring spec.analysis.futureKnob, unknown to this operator version (a newer CRD?)"]
    for i in range(handlers._IGNORED_FIELDS_MAX + 10):
        handlers.parse_spec({"metadata": {"name": "p", "namespace": "n", "uid": f"u-{i + 1}"}, "spec": spec})
    assert len(handlers._IGNORED_FIELDS_LOGGED) == handlers._IGNORED_FIELDS_MAX
    assert ("u-0", ("spec.analysis.futureKnob",)) not in handlers._IGNORED_FIELDS_LOGGED, "the oldest went first"
    body["spec"] = {**spec, "analysis": {"confidence": 7}}
    parsed, error = handlers.parse_spec(body)
    assert parsed is None and error.startswith("spec.analysis.confidence"), "a bad value is still refused"
    handlers._IGNORED_FIELDS_LOGGED.clear()


def test_an_event_is_posted_as_planned_and_logged_without_the_phase_change(caplog):
    """``actions.post_event``: the Event carries the message as the state machine wrote it; its log
    line leaves out the ``A -> B: `` the handler's phase line already says."""
    posted = []

    class Api:
        def event(self, ref, type_, reason, message):
            posted.append((ref["metadata"]["name"], type_, reason, message))

    with caplog.at_level("INFO", logger="lookahead_operator"):
        actions.post_event(Api(), POLICY, "Normal", "TargetsClaimed", "Pending -> Preflight: claimed 2 Deployment(s)")
        for _ in range(200):
            if posted:
                break
            time.sleep(0.01)
    assert posted == [("bench", "Normal", "TargetsClaimed", "Pending -> Preflight: claimed 2 Deployment(s)")]
    assert [r.getMessage() for r in caplog.records] == ["team-a/bench: TargetsClaimed: claimed 2 Deployment(s)"]


def test_the_guard_compares_the_newest_promoted_targets_pods_with_every_pod_not_promoted():
    """``observe.guard_sides``: ready pods only; those carrying this decision's id on the target
    promoted last are the promoted side, any pod without it (any in-play target) the baseline; a pod
    of ours that joined the fleet's Service (a role label) is never fleet; the control is apart."""
    from lookahead_operator.api.status import Decision, Phase

    def pod(name, promoted=None, ready=True, labels=None, deleting=False):
        meta = {"namespace": "serving", "name": name, "labels": labels or {},
                "annotations": {api.ANNOTATION_PROMOTED: promoted} if promoted else {}}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-01T08:00:00Z"
        return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}

    class Reads:
        def get_deployment(self, ns, name):
            return {"spec": {"selector": {"matchLabels": {"fleet": name}}}}

        def pods(self, ns, selector):
            return {"a": [pod("a-1", "d1"), pod("a-2"), pod("a-3", "d1", ready=False),
                          pod("ctl-0", labels={api.LABEL_ROLE: "control"})],
                    "b": [pod("b-1", "d1"), pod("b-2", deleting=True)],
                    "c": [pod("c-1")]}[selector["matchLabels"]["fleet"]]

    me = "inference/chat-fleet"
    targets = [Target("serving", "a", "reference", owner=me, promoted="d1", lent=1, replicas=2),
               Target("serving", "b", "reference", owner=me, promoted="d1"),
               Target("serving", "c", "reference", owner=me, user_edited=True)]
    status = LookaheadPolicyStatus(phase=Phase.Promoting, decision=Decision(id="d1", action="Promote", reason="r"))
    w = Observed(now=datetime(2026, 12, 1, tzinfo=timezone.utc), name="chat-fleet", namespace="inference",
                 generation=1, fingerprint="f", spec=None, status=status, targets=targets)
    control = [pod("ctl-0"), pod("ctl-1", ready=False)]
    sides = observe.guard_sides(observe.in_play_pods(Reads(), w), w, status, control)
    assert sides.promoted == (("serving", "b-1"),), "b was promoted last; a's promoted pod was guarded before"
    assert sides.baseline == (("serving", "a-2"),), "c is its user's; b-2 is going; a-3 is not ready"
    assert sides.control == (("serving", "ctl-0"),)
    assert sides.targets == (("serving", "a"), ("serving", "b"))
