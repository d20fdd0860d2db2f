"""One policy on the real SmolLM2-135M model: the fleet, the canary and the control are reference
engines running real torch decoding on CPU, as Pods on the real node, measured through the real
Prometheus. Whatever the verdict on this hardware, it must come from real numbers, and
analysisOnly never touches the fleet.

This one runs the torch runtime (the engine image's own numpy runtime serving the same weights is
tests/e2e/test_shipped_example.py's): torch reaches the Pods by a read-only ``hostPath`` mount of
this machine's own site-packages (and the model by one of the project's model cache), not through
the image, which is torch-free; the node is this machine, so the bytes are already here, and a 2+
GB image layer would cost more to pack and push than this whole test."""

from __future__ import annotations

import pytest

import site
from pathlib import Path

import torch

from lookahead_canary.models import cache_root
from lookahead_dev.devcluster import wait_for
from lookahead_dev.node import image_name

from .helpers import (GROUP, VERSION, apply_policy, events_of, make_namespace, no_leftovers, sanitized,
                      wait_phase)

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


HOST_SITE = str(Path(torch.__file__).resolve().parents[1])  # torch, transformers and their dependencies
assert HOST_SITE in site.getsitepackages(), HOST_SITE


def smollm2_deployment(ns: str) -> dict:
    labels = {"app": "smol"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "smol", "namespace": ns, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true"}},
                              "spec": {"containers": [{
                                  "name": "engine", "image": image_name("engine"),
                                  "command": ["python3", "-m", "lookahead_canary.server"],
                                  "args": ["--host", "0.0.0.0", "--port", "8000", "--model", "smollm2",
                                           "--max-num-seqs", "4"],
                                  "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                                          {"name": "PYTHONPATH", "value": "/opt/lookahead/site:/opt/host-site"},
                                          {"name": "LOOKAHEAD_CACHE", "value": "/cache"},
                                          {"name": "HF_HUB_OFFLINE", "value": "1"}],
                                  "volumeMounts": [{"name": "host-site", "mountPath": "/opt/host-site", "readOnly": True},
                                                   {"name": "models", "mountPath": "/cache/models", "readOnly": True}],
                                  "ports": [{"name": "http", "containerPort": 8000}],
                                  "readinessProbe": {"httpGet": {"path": "/health", "port": 8000},
                                                     "periodSeconds": 2, "failureThreshold": 90}}],
                                           # the model cache's weights are root's, mode 0600
                                           # (hostPath files keep their owner): read them as root
                                           "securityContext": {"runAsUser": 0},
                                           "volumes": [
                                               {"name": "host-site", "hostPath": {"path": HOST_SITE, "type": "Directory"}},
                                               {"name": "models", "hostPath": {"path": str(cache_root() / "models"),
                                                                               "type": "Directory"}}]}}},
    }


def test_real_model_policy_decides_from_real_numbers(apis, operator_process, prometheus):
    apps, core, custom, batch = apis
    ns = "e2e-smollm2"
    make_namespace(core, ns)
    apps.create_namespaced_deployment(ns, smollm2_deployment(ns))
    before = sanitized(apps, ns, "smol")
    apply_policy(custom, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LookaheadPolicy",
        "metadata": {"name": "smol", "namespace": ns},
        "spec": {
            "targets": {"selector": {"matchLabels": {"app": "smol"}}},
            "engine": "reference",
            "lookahead": {"method": "jacobi", "window": 4, "ngram": 3, "guessSet": 4},
            "load": {"mode": "sweep", "batchSizes": [1], "stepDuration": "100s", "warmup": "10s",
                     "minSamplesPerStep": 5, "prompts": {"builtin": "code"}},
            "analysis": {"prometheus": {"url": prometheus.url}, "deadline": "4m", "confidence": 0.95},
            "promotion": {"mode": "analysisOnly", "waves": ["100%"]},
        }})
    st = wait_phase(custom, ns, "smol", {"Succeeded", "RolledBack", "Failed", "NotACandidate"}, 420, operator_process)
    row = st["batches"][0]
    assert row["batchSize"] == 1
    assert row["controlTpotMs"] > 1 and row["canaryTpotMs"] > 1, row
    assert row["controlTokensPerSecond"] > 0 and row["canaryTokensPerSecond"] > 0, row
    assert row["acceptanceRate"] is not None and 0 <= row["acceptanceRate"] <= 1, row
    assert row["samples"]["control"] >= 1 and row["samples"]["canary"] >= 1
    assert st["decision"]["action"] in ("Promote", "PromoteRegimeAware", "Rollback", "Inconclusive")
    assert st["decision"]["reason"]
    assert not any(e.reason == "Promoted" for e in events_of(core, ns, "smol"))
    assert sanitized(apps, ns, "smol")["spec"] == before["spec"], "analysisOnly never touches the fleet"
    wait_for(lambda: no_leftovers(apps, batch, ns, "smol"), timeout=60, what="canary/control/Jobs removed")
