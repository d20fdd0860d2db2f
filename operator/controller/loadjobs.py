"""The load Jobs that drive canary, control and promoted pods: which pods, at which concurrency,
for how long, with which prompts. Pure: the policy's spec and the pods as read -> Job bodies
(``builders.build_load_job`` renders each)."""

from __future__ import annotations

import json
import os
from datetime import datetime

from pydantic import ValidationError

from lookahead_operator import engines
from lookahead_operator.controller import builders as b
from lookahead_operator.controller.world import Target
from lookahead_operator.controller.fleet import pod_ready
from lookahead_operator.api.spec import LOAD_POD_FIELDS, LoadSpec, LookaheadPolicySpec
from lookahead_operator.api.names import ANNOTATION_PROMOTED, LABEL_POD, ROLES

DEFAULT_LOADGEN_IMAGE = (os.environ.get("LOOKAHEAD_LOADGEN_IMAGE", "").strip()
                         or "ghcr.io/lookahead-rollout/lookahead-rollout:0.1.0")
POD_DEFAULTS_ENV = "LOOKAHEAD_LOAD_POD_DEFAULTS"


def pod_defaults(raw: str | None) -> dict:
    """The operator's defaults for the load generator Pods (the chart's operator.loadJobs, as JSON:
    nodeSelector, tolerations, priorityClassName, imagePullSecrets), checked by the same rules as a
    policy's ``load`` fields; ``ValueError`` naming the variable when they break them."""
    if not raw or not raw.strip():
        return {}
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or set(data) - set(LOAD_POD_FIELDS):
            raise ValueError(f"expected an object with only {', '.join(LOAD_POD_FIELDS)}")
        return LoadSpec.model_validate({k: v for k, v in data.items() if v not in ("", None, [], {})}).pod_options()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{POD_DEFAULTS_ENV} (the chart's operator.loadJobs): "
                         f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    except ValueError as exc:  # (json.JSONDecodeError too)
        raise ValueError(f"{POD_DEFAULTS_ENV} (the chart's operator.loadJobs): {exc}") from None


try:
    POD_DEFAULTS = pod_defaults(os.environ.get(POD_DEFAULTS_ENV))
except ValueError as _exc:
    raise SystemExit(str(_exc)) from None


def _load_image(spec: LookaheadPolicySpec) -> str:
    return spec.load.loadgen_image or DEFAULT_LOADGEN_IMAGE


def engine_port(pod: dict, template: dict | None = None) -> int:
    """The port the engine serves on in ``pod``, found by what the container is, never by its
    position (a mesh proxy injected first, Linkerd's, is not the engine): the engine container of
    ``template`` (the pod template the pod was made from; engine detection reads its image and
    command line), matched in the pod by name; its port named ``http``, else its first declared
    port, else the engine's own (its ``--port``, else the engine's default: ``engines.listen_port``).
    Without a template: the pod's engine container by detection, else its first that is not a
    mesh proxy (``builders.engine_container_index``)."""
    engine = b.engine_container(template, engines.is_engine_container) if template else None
    container = b.engine_container(pod, engines.is_engine_container, engine.get("name") if engine else None)
    if not container.get("ports") and engine is not None:
        container = engine
    return b.container_port(container, engines.listen_port(engine if engine is not None else container))


def _url(pod: dict, template: dict | None) -> str:
    return f"http://{pod['status']['podIP']}:{engine_port(pod, template)}"


def guard_jobs(spec: LookaheadPolicySpec, policy: dict, wave: int, run: int, batch_size: int,
               newest: Target, fleet_pods: list[dict], control_pods: list[dict],
               promoted_template: dict | None = None, control_template: dict | None = None) -> list[dict]:
    """The guard's load: one Job on a ready pod of ``newest`` that runs the promoted template (its
    pods carry the decision id), one on a ready control pod. Each lasts as long as a guard may wait
    for its data (a wave or the final guard waits past its duration, up to ``analysis.deadline``,
    until the comparison has enough samples); the state machine deletes them when the guard moves
    on. A Job that ran out sooner would leave the guard without load, then without data. Each is
    aimed at its pod's engine port (``engine_port``; ``promoted_template``: the pod template of
    ``newest``, ``control_template``: the one the control was cloned from)."""
    promoted_pods = [p for p in fleet_pods
                     if (p["metadata"].get("annotations") or {}).get(ANNOTATION_PROMOTED) == newest.promoted
                     and not p["metadata"].get("deletionTimestamp")]
    duration = max(spec.promotion.guard.duration + spec.promotion.wave_duration,
                   spec.analysis.deadline).total_seconds()
    jobs = []
    for role, pods, template in (("promoted", promoted_pods, promoted_template),
                                 ("control", control_pods, control_template)):
        ready = sorted((p for p in pods if (p.get("status") or {}).get("podIP") and pod_ready(p)),
                       key=lambda p: p["metadata"]["name"])
        if not ready:
            return []  # both or neither: a one-sided load would compare nothing
        pod = ready[0]
        url = _url(pod, template)
        jobs.append(b.build_load_job(policy, pod["metadata"]["namespace"], role, f"w{wave}", run, batch_size, url,
                                     duration, _load_image(spec), spec.load.prompts,
                                     extra_labels={LABEL_POD: pod["metadata"]["name"]},
                                     resources=spec.load.resources.as_container(),
                                     pod_options=spec.load.pod_options(POD_DEFAULTS)))
    return jobs


def step_jobs(spec: LookaheadPolicySpec, policy: dict, namespace: str, step_index: int, run: int, batch_size: int,
              pods_by_role: dict[str, list[dict]], until: datetime, now: datetime,
              template: dict | None = None) -> list[dict]:
    """One closed-loop load Job per role for a measurement step, aimed at a ready pod of the role
    (its pod IP and its engine's port, ``engine_port``, ``template`` being the pod template canary
    and control were cloned from: no Service or DNS needed). Both roles or neither: a one-sided
    load would leave the other role idle, and idle windows read as stalls. Each Job runs for as
    long as the step may measure: its stepDuration, and for a step whose answer is unclear then,
    up to ``until`` (``statemachine.step_deadline``, carried by the state machine's action); the
    state machine deletes it when the step ends."""
    duration = max(spec.load.step_duration.total_seconds(), (until - now).total_seconds())
    jobs = []
    for role in ROLES:
        pods = [p for p in pods_by_role.get(role, []) if (p.get("status") or {}).get("podIP") and pod_ready(p)]
        if not pods:
            return []
        pod = sorted(pods, key=lambda p: p["metadata"]["name"])[0]
        url = _url(pod, template)
        jobs.append(b.build_load_job(policy, namespace, role, step_index, run, batch_size, url, duration,
                                     _load_image(spec), spec.load.prompts,
                                     extra_labels={LABEL_POD: pod["metadata"]["name"]},
                                     resources=spec.load.resources.as_container(),
                                     pod_options=spec.load.pod_options(POD_DEFAULTS)))
    return jobs
