"""Replica waves on the real node (issue 22): a fleet of one Deployment of ten replicas, behind its
Service and serving production traffic, promoted by ``waves: [10%, 50%, 100%]`` in steps of its
pods: one, then five, then all ten, each wave rolled out and guarded before the next. The user's
Deployment lends replicas to the policy's wave Deployment while it is promoted in part, and gets
them back with the promoted template at the last wave; no user request fails on the way."""

from __future__ import annotations

import threading
import time

import pytest

from lookahead_operator.controller import builders as b
from lookahead_dev.devcluster import wait_for

from .helpers import (GOOD_GPU, apply_policy, assert_no_failed_requests, engine_deployment, events_of, get_policy,
                      make_namespace, no_leftovers, policy, production_traffic, sanitized, serve)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NAME, REPLICAS = "chat-fleet", 10


def _fleet(ns: str) -> dict:
    # a serving fleet (preStop, grace period: engine_deployment's ``serving``) of ten replicas
    dep = engine_deployment(ns, NAME, GOOD_GPU, "chat", serving=True)
    dep["spec"]["replicas"] = REPLICAS
    # ten engines beside the other tests' pods on a two-core node: a request the scheduler can fit
    # (the simulated engines idle between requests)
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}}
    return dep


def _ready(p) -> bool:
    return p.metadata.deletion_timestamp is None and any(c.type == "Ready" and c.status == "True"
                                                         for c in p.status.conditions or [])


def _why_out(p) -> tuple:
    """A pod not serving: name, owner, being deleted, its Ready condition (what a failure must say)."""
    ready = next((c for c in p.status.conditions or [] if c.type == "Ready"), None)
    owner = (p.metadata.owner_references or [None])[0]
    return (p.metadata.name, owner and owner.name, p.metadata.deletion_timestamp is not None,
            ready and (ready.status, ready.reason, ready.message))


def test_one_deployment_of_ten_replicas_is_promoted_1_then_5_then_10_pods_each_wave_guarded(
        apis, operator_pod, prometheus, tmp_path):
    apps, core, custom, batch = apis
    ns = "e2e-replica-waves"
    make_namespace(core, ns)
    apps.create_namespaced_deployment(ns, _fleet(ns))
    url = serve(core, ns)
    original = sanitized(apps, ns, NAME)["spec"]["template"]

    def fleet_pods() -> list:
        return core.list_namespaced_pod(ns, label_selector="app=chat").items

    def ready_pods() -> list:
        return [p for p in fleet_pods() if _ready(p)]

    wait_for(lambda: len(ready_pods()) == REPLICAS, 180, "the fleet's ten pods ready", interval=1.0)
    # (three requests a second: eleven pods serve it, the control among them once it joins the
    # Service for the guard, and wave 1's guard compares one promoted pod, which needs requests in
    # most of its 5-second windows)
    traffic = production_traffic(url, tmp_path, seed=22, schedule="0:3")
    # while a wave's guard watches it: (wave, pods the status says, lookahead pods serving, all serving)
    seen: list[tuple[int, int, int, int]] = []
    short: list[tuple] = []        # samples with fewer than ten serving: (time, phase, wave, pods not serving)
    serving_pods: list[int] = []   # every second from the first wave to the end: the fleet's ready pods
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                st = get_policy(custom, ns, "chat").get("status") or {}
                row = next(iter(st.get("targets") or []), {})
                wave = st.get("currentWave")
                if st.get("phase") in ("Promoting", "Guarding"):
                    everyone = fleet_pods()
                    pods = [p for p in everyone if _ready(p)]
                    serving_pods.append(len(pods))
                    if len(pods) < REPLICAS:   # what a failure needs to say: which pods were out, and why
                        short.append((time.time(), st.get("phase"), wave,
                                      [_why_out(p) for p in everyone if not _ready(p)]))
                    if st.get("phase") == "Promoting" and wave and (st.get("guard") or {}).get("wave") == wave:
                        on = sum(1 for p in pods if (p.metadata.annotations or {}).get(b.ANNOTATION_PROMOTED))
                        seen.append((wave, row.get("promotedPods"), on, len(pods)))
            except Exception:  # noqa: BLE001 - a read that failed is a sample missed, not a verdict
                pass
            stop.wait(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    with traffic:
        traffic.wait_requests(3, timeout=60, ok=True)
        t0 = time.time()
        watcher.start()
        # (one batch size: the waves are the point, and a second measured step would add a minute;
        # the waves are the issue's [10%, 50%, 100%], which is also the default)
        apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1], "regimeAware", ["10%", "50%", "100%"]))
        try:
            st = wait_for(lambda: (s := get_policy(custom, ns, "chat").get("status") or {}).get("phase") in
                          {"Succeeded", "RolledBack", "Failed", "NotACandidate"} and s, 900,
                          "the rollout ended", interval=1.0)
        finally:
            stop.set()
            watcher.join(timeout=10)
        assert st["phase"] == "Succeeded", (st.get("message"), st.get("guard"), operator_pod.log()[-3000:])
        # each wave guarded on the production traffic, with no load of ours on a serving pod
        assert st["progress"]["guardMode"] == "production" and st["guard"]["enoughData"], st.get("guard")
        wait_for(lambda: len(ready_pods()) == REPLICAS and no_leftovers(apps, batch, ns, "chat"), 120,
                 "ten promoted pods and nothing of the policy's left", interval=1.0)
    served = assert_no_failed_requests(traffic, t0, "the replica waves")
    print(f"\nproduction traffic through the replica waves: {served}; waves seen {sorted(set(seen))}")

    # each wave guarded, with as many lookahead pods serving as it promised
    by_wave = {w: {(pods, serving) for ww, pods, serving, _ in seen if ww == w} for w in (1, 2, 3)}
    assert (1, 1) in by_wave[1] and (5, 5) in by_wave[2] and (10, 10) in by_wave[3], seen
    # and never fewer than ten pods serving, sampled every second through the waves: a wave
    # Deployment's pods serve before the fleet lends them; the last wave is the Deployment's own
    # rolling update (its default maxUnavailable, 25%, of 10 is 2), the wave pods serving through it
    print(f"serving pods through the waves: min {min(serving_pods)}, max {max(serving_pods)}, "
          f"{len(serving_pods)} samples")
    assert len(serving_pods) > 30 and min(serving_pods) >= REPLICAS, (serving_pods, short)
    promoted = wait_for(lambda: len(r := [e.message for e in sorted(events_of(core, ns, "chat"),
                                                                     key=lambda e: e.first_timestamp)
                                          if e.reason == "Promoted"]) >= 3 and r, 30, "Promoted events")
    assert promoted == [f"lookahead on in 1 of 10 pods of {ns}/{NAME}", f"lookahead on in 5 of 10 pods of {ns}/{NAME}",
                        f"lookahead on in {ns}/{NAME}"], promoted

    # the user's Deployment owns every pod again: all ten replicas, the promoted template, the original saved
    d = sanitized(apps, ns, NAME)
    assert d["spec"]["replicas"] == REPLICAS
    assert "--speculative-config" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    assert b.original_template(d) == original
    ann = d["metadata"].get("annotations") or {}
    assert b.ANNOTATION_PROMOTED_PODS not in ann
    row = get_policy(custom, ns, "chat")["status"]["targets"][0]
    assert (row["replicas"], row["promotedPods"], row["wave"]) == (10, 10, 1), row
