"""What the end-to-end tests build and read the same way: the simulated engine fleet and the
shortened policy they apply, the policy's API coordinates, and the reads and waits around them.

Plain functions on the clients of the ``apis`` fixture (tests/e2e/conftest.py), so that each test
still says, line by line, what it creates and how long it waits."""

from __future__ import annotations

import json

from kubernetes import client

from lookahead_operator.api.names import GROUP, PLURAL, VERSION
from lookahead_operator.controller import builders as b
from lookahead_dev.devcluster import wait_for
from lookahead_dev.node import image_name

ENGINE_IMAGE = image_name("engine")  # built by hack/build-images.sh, pulled from the node's registry
FLEET = ("chat-a", "chat-b")          # the two target Deployments most rollouts run on

# A100 + Llama-3-8B roofline: decode is memory-bound at batch 1 (lookahead cuts per-token
# latency) and compute-bound at batch 32 (the extra Jacobi tokens cost real time).
# time_scale 3 keeps the simulated engines and the load generators light on two CPU cores.
GOOD_GPU = {"gpu": "a100-80gb", "model": "llama-3-8b", "acceptance": 0.6, "noise_sigma": 0.03, "time_scale": 3}
# Same hardware, but a workload where drafts are almost never accepted and speculating steps
# carry a large fixed cost: lookahead only loses.
BAD_GPU = {"gpu": "a100-80gb", "model": "llama-3-8b", "acceptance": 0.02, "noise_sigma": 0.03,
           "spec_overhead_s": 0.03, "time_scale": 3}

# A config that costs 20% of throughput at every batch size up to 16, so at whatever load the fleet runs:
# drafts are almost never accepted and a speculating step carries 4 ms (x time_scale) of fixed
# cost, while the extra draft tokens are free (compute far from binding: a flops override, the
# memory side is the A100's). With lookahead off it is GOOD_GPU's A100 exactly, so its control
# and the rest of the fleet are the same machine (tests/unit/canary/test_simulator.py pins both).
MILD_GPU = {"gpu": "a100-80gb", "model": "llama-3-8b", "acceptance": 0.02, "noise_sigma": 0.03,
            "spec_overhead_s": 0.004, "flops": 3.12e15, "time_scale": 3}


def engine_deployment(ns: str, name: str, sim: dict, app: str, serving: bool = False) -> dict:
    """``serving``: a fleet that serves users behind a Service, set up as docs/operator.md says
    ("Your users during a rollout"): a terminating pod keeps serving until kube-proxy has taken it
    out (preStop), then drains its streams within its grace period."""
    labels = {"app": app, "fleet": name}
    dep = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {"containers": [{
                    "name": "engine",
                    "image": ENGINE_IMAGE,
                    "command": ["python3", "-m", "lookahead_canary.server"],
                    "args": ["--host", "$(POD_IP)", "--port", "8000", "--backend", "simulate",
                             "--sim-config", json.dumps(sim), "--max-num-seqs", "64",
                             "--served-model-name", "chat"],
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "ports": [{"name": "http", "containerPort": 8000}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
                    # several rollouts share the two-core node at once (tests/e2e/together.py):
                    # a request the scheduler fits for all of them (a simulated engine idles
                    # between requests; it uses a few percent of a core)
                    "resources": {"requests": {"cpu": "50m"}},
                }]},
            },
        },
    }
    if serving:
        pod = dep["spec"]["template"]["spec"]
        pod["terminationGracePeriodSeconds"] = 30
        pod["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 3}}}
    return dep


def serve(core, ns: str, app: str = "chat") -> str:
    """The fleet's Service (every pod of ``app``), as its users reach it; its URL (the ClusterIP:
    the test process resolves no cluster name)."""
    svc = core.create_namespaced_service(ns, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": app},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    return f"http://{svc.spec.cluster_ip}"


def production_traffic(url: str, tmp_path, seed: int, schedule: str = "0:1"):
    """Open-loop production traffic (``lookahead_dev.traffic``) to ``url`` for a ``with`` block:
    Poisson arrivals at ``schedule`` (requests per second), half of them streamed, a mix of the
    bundled prompt sets; every outcome in ``.record``. One request per second by default: several
    rollouts share the two-core node; a test whose guard must see every pod served often asks
    for more (``schedule``)."""
    from lookahead_dev.traffic import ProductionTraffic

    return ProductionTraffic(url, out=tmp_path / "traffic.jsonl", schedule=schedule, seed=seed, timeout=60,
                             log=tmp_path / "traffic.log")


def assert_no_failed_requests(traffic, since: float, what: str) -> str:
    """Every production request sent since ``since`` (Unix time) answered; the record's summary line."""
    from lookahead_dev.traffic import format_failures

    summary = traffic.record.summary(since=since)
    assert summary.failed == 0 and summary.not_sent == 0, f"{what}: {format_failures(summary)}"
    assert summary.ok > 0, f"{what}: no request answered: {summary.line()}"
    return summary.line()


def policy(name: str, ns: str, app: str, prometheus_url: str, batch_sizes: list[int], mode: str,
           waves: list[str]) -> dict:
    """A policy with shortened clocks (60 s steps, 4 s warm-up, 5 samples, 6 m deadline, 15 s waves,
    20 s guard) and small load requests, so that whole rollouts fit a test, several at once: the
    defaults themselves are exercised end to end by test_shipped_example.py, and their physics
    (samples per step) by the unit tests."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "LookaheadPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "targets": {"selector": {"matchLabels": {"app": app}}},
            "engine": "reference",
            "lookahead": {"method": "jacobi", "window": 7, "ngram": 5, "guessSet": 7},
            # (load.resources: the default 250m CPU per generator is for a real fleet's load; here
            # several rollouts share two cores, and a generator of a few requests idles)
            "load": {"mode": "sweep", "batchSizes": batch_sizes, "stepDuration": "60s", "warmup": "4s",
                     "minSamplesPerStep": 5, "prompts": {"builtin": "chat"},
                     "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}},
            "analysis": {"prometheus": {"url": prometheus_url}, "maxThroughputRegression": "2%",
                         "minLatencyImprovement": "5%", "confidence": 0.99, "deadline": "6m"},
            "promotion": {"mode": mode, "waves": waves, "waveDuration": "15s",
                          "guard": {"duration": "20s"}},
        },
    }


def namespace_names(core) -> set[str]:
    return {n.metadata.name for n in core.list_namespace().items}


def delete_namespaces(core, names: set[str], timeout: float) -> None:
    """Delete the namespaces ``names`` and wait until they are gone (AssertionError after ``timeout`` s)."""
    for ns in names:
        try:
            core.delete_namespace(ns)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not (names & namespace_names(core)), timeout=timeout,
             what=f"namespaces {sorted(names)} deleted", interval=1.0)


def make_namespace(core, ns):
    core.create_namespace({"metadata": {"name": ns}})


def deploy_fleet(apps, core, ns: str, sims: dict[str, dict], serving: bool = False) -> str | None:
    """Namespace ``ns`` and in it one engine Deployment of app ``chat`` per name in ``sims`` (in
    that order), each serving its simulator configuration. ``serving``: behind the Service
    ``chat`` as well (``serve``), whose URL is returned."""
    make_namespace(core, ns)
    for name, sim in sims.items():
        apps.create_namespaced_deployment(ns, engine_deployment(ns, name, sim, "chat", serving=serving))
    return serve(core, ns) if serving else None


def apply_policy(custom, body: dict) -> None:
    """Create the LookaheadPolicy ``body`` in its own namespace."""
    custom.create_namespaced_custom_object(GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body)


def start_two_wave_rollout(apps, core, custom, ns: str, prometheus_url: str) -> dict[str, dict]:
    """The common rollout: the fleet ``FLEET`` in ``ns``, both on the workload where lookahead wins,
    and policy ``chat`` on it (regime-aware, measured at batch 1 and 16, waves of 50% then 100%).
    Returns the targets' pod templates as saved before the policy was applied."""
    deploy_fleet(apps, core, ns, {name: GOOD_GPU for name in FLEET})
    originals = saved_templates(apps, ns, FLEET)
    apply_policy(custom, policy("chat", ns, "chat", prometheus_url, [1, 16], "regimeAware", ["50%", "100%"]))
    return originals


def get_policy(custom, ns, name):
    return custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def conditions(st: dict) -> dict:
    """A policy status's conditions by type."""
    return {c["type"]: c for c in st.get("conditions") or []}


def measuring_under_load(custom, ns, name):
    """The policy's status once it measures with its load started, else None (a ``wait_for`` condition)."""
    st = get_policy(custom, ns, name).get("status") or {}
    return st if st.get("phase") == "Measuring" and (st.get("progress") or {}).get("loadStartedAt") else None


def wait_phase(custom, ns, name, phases, timeout, operator):
    seen = []

    def check():
        st = get_policy(custom, ns, name).get("status") or {}
        phase = st.get("phase")
        if not seen or seen[-1] != phase:
            seen.append(phase)
        return st if phase in phases else None

    try:
        return wait_for(check, timeout=timeout, interval=1.0, what=f"{ns}/{name} in {phases}")
    except Exception as exc:
        st = get_policy(custom, ns, name).get("status")
        raise AssertionError(f"phases seen {seen}; status {json.dumps(st, indent=1)[:3000]}\n"
                             f"operator log tail:\n{operator.log()[-3000:]}") from exc


def sanitized(apps, ns, name):
    return client.ApiClient().sanitize_for_serialization(apps.read_namespaced_deployment(name, ns))


def saved_templates(apps, ns: str, names=FLEET) -> dict[str, dict]:
    """Each named Deployment's pod template as the apiserver serves it now (to compare later)."""
    return {n: sanitized(apps, ns, n)["spec"]["template"] for n in names}


def events_of(core, ns, name):
    return [e for e in core.list_namespaced_event(ns).items if e.involved_object.name == name]


def no_leftovers(apps, batch, ns, policy_name):
    sel = f"{b.LABEL_POLICY}={policy_name},{b.LABEL_POLICY_NAMESPACE}={ns}"
    return (not apps.list_namespaced_deployment(ns, label_selector=sel).items
            and not [j for j in batch.list_namespaced_job(ns, label_selector=sel).items
                     if not j.metadata.deletion_timestamp])
