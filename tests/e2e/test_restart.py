"""The operator is SIGKILLed as soon as the rollout enters each phase, and restarted at once.
The rollout must still end as an uninterrupted one does, with no duplicate or orphaned objects
and the exact original templates saved.

The two rollouts run at the same time (tests/e2e/together.py), each with an operator of its own
that watches its namespace only (a namespaced install's ``--namespace``), so that one scenario's
kills never interrupt the other's operator."""

from __future__ import annotations

import os
import random
import time

import pytest

from lookahead_operator.controller import builders as b
from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import wait_for

from . import together
from .conftest import OperatorProcess
from .helpers import (FLEET, GOOD_GPU, apply_policy, assert_no_failed_requests, deploy_fleet, get_policy,
                      no_leftovers, policy, production_traffic, sanitized, saved_templates, start_two_wave_rollout)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

scenarios = together.Scenarios()
NAMESPACES = {"killed_in_every_phase_still_completes": "e2e-restart",
              "seeded_random_kills_and_a_kill_between_two_patches_of_one_wave": "e2e-chaos"}


@pytest.fixture(scope="module")
def operators(devcluster, crd_installed, real_node, prometheus, tmp_path_factory):
    """One operator per scenario's namespace, started before and stopped after both."""
    ops = {ns: OperatorProcess(devcluster.kubeconfig, tmp_path_factory.mktemp(f"operator-{ns}"), namespace=ns)
           for ns in NAMESPACES.values()}
    for op in ops.values():
        op.start()
    yield ops
    for op in ops.values():
        op.stop()


@pytest.fixture(scope="module")
def running(request, kube_api, operators, prometheus, tmp_path_factory):
    yield from scenarios.run(request, kube_api, tmp_path_factory, operators=operators, prometheus=prometheus)


def _look(apps, custom, batch, ns) -> tuple[dict, int, int]:
    """Policy ``chat``'s status, its canary and control Deployments now, and the most live load Jobs
    of one step and role."""
    st = get_policy(custom, ns, "chat").get("status") or {}
    roles = apps.list_namespaced_deployment(
        ns, label_selector=f"{b.LABEL_POLICY}=chat,{b.LABEL_ROLE} in (canary,control)").items
    per_key: dict[tuple, int] = {}
    for j in batch.list_namespaced_job(ns, label_selector=f"{b.LABEL_POLICY}=chat").items:
        if not j.metadata.deletion_timestamp:
            key = (j.metadata.labels.get(b.LABEL_STEP), j.metadata.labels.get(f"{b.GROUP}/drives"))
            per_key[key] = per_key.get(key, 0) + 1
    return st, len(roles), max(per_key.values(), default=0)


@scenarios.add
def killed_in_every_phase_still_completes(apis, operators, prometheus, reliability):
    reliability.expect("Operator SIGKILLed at the entry of every phase it reaches, restarted at once",
                       "the rollout completes as uninterrupted (PromoteRegimeAware, Succeeded); originals saved "
                       "exactly; no duplicate or orphaned object; no invariant violation")
    apps, core, custom, batch = apis
    ns = NAMESPACES["killed_in_every_phase_still_completes"]
    operator_process = operators[ns]
    originals = start_two_wave_rollout(apps, core, custom, ns, prometheus.url)
    killed_in: list[str] = []
    max_roles = max_jobs_per_step_role = 0
    deadline = time.monotonic() + 600
    phase = None
    while time.monotonic() < deadline:
        st, roles, jobs = _look(apps, custom, batch, ns)
        phase = st.get("phase")
        max_roles, max_jobs_per_step_role = max(max_roles, roles), max(max_jobs_per_step_role, jobs)
        if phase in TERMINAL:
            break
        if phase and phase not in killed_in:
            operator_process.kill()
            killed_in.append(phase)
            operator_process.start()
        time.sleep(0.5)
    reliability.observed(f"{phase} ({(st.get('decision') or {}).get('action')}) after kills in "
                         f"{', '.join(killed_in)}; max canary+control {max_roles}, max load Jobs per step and "
                         f"role {max_jobs_per_step_role}", injected=len(killed_in))
    assert phase == "Succeeded", (phase, st.get("message"), operator_process.log()[-3000:])
    assert st["decision"]["action"] == "PromoteRegimeAware"
    # every phase of the rollout saw a kill (the short ones may pass within one tick of a restart)
    assert {"Launching", "Measuring", "Promoting", "Guarding"} <= set(killed_in), killed_in
    assert max_roles <= 2, "never more than one canary and one control"
    assert max_jobs_per_step_role <= 1, "never a duplicate load Job"
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        assert b.original_template(d) == originals[name], "the saved original is the first one, exactly"
        assert "--lookahead-max-batch-size" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="no orphaned canary/control/Jobs")


def test_killed_in_every_phase_still_completes(running, request, reliability):
    running.result(request)


SEED = int(os.environ.get("LOOKAHEAD_CHAOS_SEED", "20261201"))


@scenarios.add
def seeded_random_kills_and_a_kill_between_two_patches_of_one_wave(apis, operators, prometheus, tmp_path,
                                                                     reliability):
    """Issue 12: the operator is SIGKILLed at seeded random instants all through one rollout (each
    time 0.5-4 s after it is up again), and once exactly between the first and the second target
    patch of a two-Deployment wave (tests/e2e/chaos_operator.py's fault point). The rollout must end
    as an uninterrupted one does: PromoteRegimeAware, both targets promoted from their exact saved
    originals, never two canaries or controls or a duplicate load Job, no orphan left; the invariant
    watcher checks every event in between."""
    rng = random.Random(SEED)
    reliability.expect(
        "Operator SIGKILLed at >= 20 seeded random instants across one rollout, and between two "
        "Deployment patches of one wave",
        "the rollout completes as uninterrupted (PromoteRegimeAware, Succeeded); the half-patched wave is "
        "finished after the restart; originals saved exactly; no duplicate or orphaned object; no invariant "
        "violation; no production request failed", seed=SEED)
    apps, core, custom, batch = apis
    ns = NAMESPACES["seeded_random_kills_and_a_kill_between_two_patches_of_one_wave"]
    operator_process = operators[ns]
    url = deploy_fleet(apps, core, ns, {"chat-a": GOOD_GPU, "chat-b": GOOD_GPU}, serving=True)
    originals = saved_templates(apps, ns, FLEET)
    # the fleet serves its users through the whole rollout and every kill: none of their requests may fail
    wait_for(lambda: all((apps.read_namespaced_deployment(n, ns).status.ready_replicas or 0) == 1 for n in FLEET),
             timeout=120, what="the fleet ready", interval=1.0)
    traffic = production_traffic(url, tmp_path, seed=SEED % 1000).start()
    traffic.wait_requests(3, timeout=60, ok=True)
    t0 = time.time()
    with traffic:
        operator_process.kill()            # this test starts (and kills) its own
        marker = tmp_path / "died-mid-wave"
        # one wave of both Deployments: the fault point needs two patches in one wave
        apply_policy(custom, policy("chat", ns, "chat", prometheus.url, [1, 16], "regimeAware", ["100%"]))
        kills: list[str] = []
        max_roles = max_jobs_per_step_role = 0
        deadline = time.monotonic() + 900
        phase, st = None, {}
        while time.monotonic() < deadline and phase not in TERMINAL:
            operator_process.start(extra_env={"LOOKAHEAD_TEST_DIE_MID_WAVE": str(marker)}, chaos=True)
            operator_process.wait_up(60)
            kill_at = time.monotonic() + rng.uniform(0.5, 4.0)     # the fault schedule, not a wait
            while time.monotonic() < kill_at and operator_process.alive():
                st, roles, jobs = _look(apps, custom, batch, ns)
                phase = st.get("phase")
                max_roles, max_jobs_per_step_role = max(max_roles, roles), max(max_jobs_per_step_role, jobs)
                if phase in TERMINAL:
                    break
                time.sleep(0.2)
            if phase in TERMINAL:
                break
            if operator_process.alive():
                kills.append(phase or "New")
            else:
                kills.append(f"{phase} (mid-wave, between patches)")
            operator_process.kill()
        operator_process.kill()
        operator_process.start()           # its plain self again, for the clean-up of its namespace
    served = traffic.record.summary(since=t0)
    by_phase = {p: sum(1 for k in kills if k.split(" ")[0] == p) for p in dict.fromkeys(k.split(" ")[0] for k in kills)}
    reliability.observed(f"{phase} after {len(kills)} kills ({', '.join(f'{p} {n}' for p, n in by_phase.items())}); "
                         f"mid-wave kill fired: {marker.exists()}"
                         + (f" after patching {marker.read_text().strip()}" if marker.exists() else "")
                         + f"; max canary+control {max_roles}, max load Jobs per step and role "
                           f"{max_jobs_per_step_role}; production traffic: {served.line()}", injected=len(kills))
    assert phase == "Succeeded", (phase, st.get("message"), kills, operator_process.log()[-3000:])
    assert st["decision"]["action"] == "PromoteRegimeAware"
    assert len(kills) >= 20, kills
    assert marker.exists(), f"the mid-wave fault point never fired: {kills}"
    assert max_roles <= 2 and max_jobs_per_step_role <= 1, (max_roles, max_jobs_per_step_role)
    assert_no_failed_requests(traffic, t0, "the rollout with the operator killed again and again")
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        assert b.original_template(d) == originals[name], "the saved original is the first one, exactly"
        assert "--lookahead-max-batch-size" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="no orphaned canary/control/Jobs")


def test_seeded_random_kills_and_a_kill_between_two_patches_of_one_wave(running, request, reliability):
    running.result(request)
