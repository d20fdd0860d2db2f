"""The kube-apiserver restarted mid-rollout (issue 12): once while a step is measured and once
mid-wave, each time stopped (SIGTERM, as a control-plane upgrade or a crash-restart does) and
started again on the same address. Expected, written down first: the operator's watches, the
kubelet, Prometheus' pod discovery and the invariant watcher reconnect by themselves; the rollout
ends as an uninterrupted one does (Succeeded, PromoteRegimeAware), both targets promoted from their
exact saved originals, no duplicate or orphaned object, no invariant violation."""

from __future__ import annotations

import pytest

from lookahead_operator.controller import builders as b
from lookahead_operator.api.status import TERMINAL_PHASES as TERMINAL
from lookahead_dev.devcluster import wait_for

from .helpers import get_policy, measuring_under_load, no_leftovers, sanitized, start_two_wave_rollout, wait_phase

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_apiserver_restarted_mid_measurement_and_mid_wave(devcluster, apis, operator_process, prometheus,
                                                          reliability):
    reliability.expect("kube-apiserver restarted (SIGTERM, same address) mid-measurement and again mid-wave",
                       "operator, kubelet, Prometheus discovery and the invariant watcher reconnect; the rollout "
                       "ends as uninterrupted (Succeeded, PromoteRegimeAware), originals exact, no orphan, no "
                       "invariant violation")
    apps, core, custom, batch = apis
    ns = "e2e-apiserver"
    originals = start_two_wave_rollout(apps, core, custom, ns, prometheus.url)
    wait_for(lambda: measuring_under_load(custom, ns, "chat"), timeout=240, what="measuring under load", interval=1.0)
    down = [devcluster.restart_apiserver()]

    def mid_wave():
        st = get_policy(custom, ns, "chat").get("status") or {}
        promoted = [t for t in st.get("targets") or [] if t.get("promoted")]
        return st if st.get("phase") in TERMINAL or (st.get("phase") == "Promoting" and promoted) else None

    st = wait_for(mid_wave, timeout=600, what="mid-wave", interval=0.5)
    in_phase = st.get("phase")
    down.append(devcluster.restart_apiserver())
    st = wait_phase(custom, ns, "chat", TERMINAL, 420, operator_process)
    reliability.observed(f"restarted in Measuring ({down[0]:.1f} s down) and in {in_phase} ({down[1]:.1f} s down); "
                         f"{st['phase']} ({st['decision']['action']})", injected=2)
    assert in_phase == "Promoting", in_phase
    assert st["phase"] == "Succeeded" and st["decision"]["action"] == "PromoteRegimeAware", st.get("message")
    for name in ("chat-a", "chat-b"):
        d = sanitized(apps, ns, name)
        assert b.original_template(d) == originals[name], "the saved original is the first one, exactly"
        assert "--lookahead-max-batch-size" in d["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_for(lambda: no_leftovers(apps, batch, ns, "chat"), timeout=60, what="no orphaned canary/control/Jobs")
