"""What the state machine sees: one policy's world (``world.Observed``), read through a
``cache.CachedView`` (or the API client itself) and measured as ``statemachine.NEEDS`` says."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import replace
from datetime import datetime, timedelta

from lookahead_operator.controller import builders as b
from kubernetes.client.rest import ApiException

from lookahead_canary import units
from lookahead_operator import engines
from lookahead_operator.controller import fleet, livesplit, loadjobs, tenancy
from lookahead_operator.measurement import live as live_measure, measure, prometheus
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import WITH_ROLES, Need, Observed, ReadError, Target
from lookahead_operator.measurement.results import GuardPods
from lookahead_operator.controller.roles import role_transform
from lookahead_operator.api.names import (
    ANNOTATION_ABORT,
    ANNOTATION_APPROVE,
    ANNOTATION_ORIGINAL_TEMPLATE,
    ANNOTATION_PROMOTED,
    LABEL_DRIVES,
    LABEL_POD,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_TARGET,
    ROLES,
)
from lookahead_operator.kube import podhttp
from lookahead_operator.kube.client import Kube, api_message, recently_created
from lookahead_operator.api.policy import MAX_POLICY_NAME
from lookahead_operator.api.spec import BackendKind, LoadMode, LoadSplit, LookaheadPolicySpec
from lookahead_operator.api.status import Decision, LookaheadPolicyStatus, Phase

#: world.Observed.poll_s: a safety net only; changes to the policy and to the Deployments it
#: waits on wake it at once, and a pass that finds nothing new reads only the watched caches.
POLL_S = float(os.environ.get("LOOKAHEAD_POLL_SECONDS", "30"))
#: The launch and rollout deadline when neither a policy (promotion.rolloutDeadline) nor its fleet's
#: readiness asks for longer: the chart's operator.defaultRolloutDeadline (a cluster whose models all
#: load slowly may raise it). A duration ("10m").
def _duration_env(name: str, default: str) -> timedelta:
    raw = os.environ.get(name) or default
    try:
        return timedelta(seconds=units.parse_duration(raw))
    except ValueError as exc:
        raise SystemExit(f"{name}={raw!r}: {exc} (a duration such as 10m)") from None


DEFAULT_DEADLINE = _duration_env("LOOKAHEAD_DEFAULT_ROLLOUT_DEADLINE", "10m")


def _allow_list_env() -> dict[str, frozenset[str]]:
    try:
        return tenancy.parse_allow_list(os.environ.get(tenancy.ENV))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


#: The namespaces a policy may target beyond its own (``tenancy``): the chart's crossNamespaceTargets.
CROSS_NAMESPACE = _allow_list_env()


def _watch_namespace_env() -> str | None:
    try:
        return tenancy.parse_watch_namespace(os.environ.get(tenancy.WATCH_ENV), CROSS_NAMESPACE)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


#: A namespaced install's one namespace (the chart's watchNamespace), None when cluster-wide: its
#: policies target that namespace alone, and nothing cluster-scoped (Nodes, every namespace's Pods,
#: Namespaces) is read.
WATCH_NAMESPACE = _watch_namespace_env()


def observe(k, body: dict, spec: LookaheadPolicySpec | None, spec_error: str | None, status: LookaheadPolicyStatus,
            now: datetime) -> Observed:
    """The world as the state machine sees it, read through ``k`` (a ``cache.CachedView``, or the
    API client itself)."""
    meta = body["metadata"]
    world = Observed(now=now, name=meta["name"], namespace=meta["namespace"],
                        generation=int(meta.get("generation", 1)), spec=spec, status=status, spec_error=spec_error,
                        poll_s=POLL_S, default_deadline=DEFAULT_DEADLINE)
    if len(meta["name"]) > MAX_POLICY_NAME:
        return world  # nothing can have been created: our labels could not hold the name
    if spec is None:
        world.targets = known_targets(k, status, None)
        return world
    annotations = meta.get("annotations") or {}
    world.approved_decision = annotations.get(ANNOTATION_APPROVE) or None
    world.fingerprint = spec.fingerprint()
    world.abort_requested = annotations.get(ANNOTATION_ABORT, "").lower() in ("true", "1", "yes")

    namespaces = k.target_namespaces(meta["namespace"], spec.targets.namespace_selector, spec.targets.namespaces)
    refused = tenancy.refused_namespaces(meta["namespace"], namespaces, CROSS_NAMESPACE)
    selector = spec.targets.namespace_selector is not None and not spec.targets.namespaces
    if WATCH_NAMESPACE is not None and (refused or selector):
        # a namespaced install: its own namespace only (a selector cannot even be read: no Namespaces)
        world.namespace_refusal = tenancy.scope_refusal(WATCH_NAMESPACE, refused, selector)
        namespaces = [ns for ns in namespaces if ns not in refused] if not selector else [meta["namespace"]]
    elif refused:  # never read, claim or change a Deployment there (the claimed ones are still put back)
        world.namespace_refusal = tenancy.refusal(meta["namespace"], refused, CROSS_NAMESPACE)
        namespaces = [ns for ns in namespaces if ns not in refused]
    found = [target_of(d, spec.engine) for d in k.deployments(namespaces, spec.targets.selector)]
    keys = {t.key for t in found}
    # Targets we touched that no longer match the selector are still ours to put back.
    world.targets = found + [t for t in known_targets(k, status, spec.engine) if t.key not in keys]
    waves = {(d["metadata"]["namespace"], (d["metadata"].get("labels") or {}).get(LABEL_TARGET)): d
             for d in k.wave_deployments(meta["namespace"], meta["name"])}
    if waves:
        world.targets = [fleet.with_wave(t, waves.get(t.key)) for t in world.targets]
    if status.phase == Phase.Launching:
        world.targets = with_source_load_time(k, world)
    roles = {d["metadata"]["labels"][LABEL_ROLE]: d for d in k.role_deployments(meta["namespace"], meta["name"])}
    role_ns = world.roles_namespace = _role_namespace(world, roles)
    world.roles_present = {r: r in roles or recently_created(
        "Deployment", role_ns, b.role_deployment_name(meta["name"], r, meta["namespace"], role_ns)) for r in ROLES}
    world.roles_ready = {r: fleet.deployment_ready(roles[r]) if r in roles else False for r in ROLES}
    world.support_problems = _support_problems(k, spec, world, status.phase)
    jobs = k.load_jobs(meta["namespace"], meta["name"])
    run = status.progress.load_run
    world.load_running = running_load(jobs, run)
    world.load_finished = finished_load(jobs, run)
    driven = {r: k.role_pods(role_ns, meta["namespace"], meta["name"], r) for r in ROLES}
    world.roles_unschedulable = {r: why for r in ROLES if (why := fleet.unschedulable(driven[r]))}
    world.roles_scheduled = {r for r in ROLES if fleet.scheduled(driven[r])}
    if status.phase == Phase.Preflight:
        _read_pool(k, world)
    if status.phase in (Phase.Promoting, Phase.Guarding):
        # read once per pass: the guard's load Jobs are aimed at these pods (actions), and a Job
        # whose pod is no longer among them drives nothing
        listed = in_play_pods(k, world)
        world.targets = [fleet.with_load_time(t, listed[t.key]) if t.key in listed else t for t in world.targets]
        world.guard_pods = driven["promoted"] = guard_fleet_pods(listed, world)
        world.guard_sides = guard_sides(listed, world, status, driven["control"])
    world.load_pods_gone = gone_load_targets(jobs, run, driven)
    if spec.load.mode == LoadMode.live and spec.load.split == LoadSplit.gateway_api:
        if status.phase in (Phase.Preflight, Phase.Launching, Phase.Measuring) or (
                status.phase in WITH_ROLES and not all(world.roles_present.values())):
            # the route and the fleet's backend: Preflight's split, the route written in Launching,
            # still split as written while Measuring reads the arms, an arm (re)created; not in the
            # later phases (every exit's restore reads the route afresh)
            _read_live_route(k, world, spec)
    elif spec.load.mode == LoadMode.live and (status.phase == Phase.Preflight or (
            status.phase in WITH_ROLES and not all(world.roles_present.values()))):
        # the Service canary and control join: Preflight's split, and an arm (re)created; not every pass
        _read_live_service(k, world)

    if status.progress.fingerprint not in (None, world.fingerprint):
        return world  # the spec changed: the state machine restarts; measure nothing old
    need = sm.need(status.phase, spec)
    policy = (meta["namespace"], meta["name"])
    # Prometheus is queried in these phases, with the Secrets analysis.prometheus names read now (an
    # edited Secret is picked up); one that cannot be read is a read error, like an unreachable Prometheus
    access = prometheus_access(k, meta["namespace"], spec) if sm.reads_prometheus(status.phase, spec) else None
    # live arms serving users while nothing is measured (a decision awaiting approval, or paused):
    # the safety abort's windows alone, not every window since the arms served
    abort_only = sm.watches_live_arms(status.phase, spec) and (need is Need.DECISION or spec.paused)
    try:
        if need is Need.PREFLIGHT:
            world.preflight = measure.read_preflight(spec, world.targets, access=access)
        elif need is Need.STEP:
            world.step = measure.step(spec, policy, status, now, access=access)
        elif need is Need.LIVE and abort_only:
            world.live = live_measure.abort_reading(spec, policy, status, now, access=access)
        elif need is Need.LIVE:
            play = sm.in_play(world)
            world.live = live_measure.measure(spec, policy, status, now, [t.key for t in play],
                                      sum(t.replicas for t in play), access=access)
        elif need is Need.DECISION:
            source = sm.role_source(world)
            top = fleet.engine_max_batch(k.get_deployment(*source.key), source.engine) if source else None
            decide = live_measure.decision if spec.load.mode == LoadMode.live else measure.decision
            world.decision = with_promoted_config(decide(spec, status, max_batch_size=top), spec,
                                                  measure.status_engine(status))
            if abort_only:
                world.live = live_measure.abort_reading(spec, policy, status, now, access=access)
        elif need is Need.GUARD:
            world.guard = measure.guard(spec, policy, status, now, k.load_jobs(*policy), world.guard_sides,
                                        access=access)
    except measure.READ_ERRORS as exc:
        world.read_errors.append(ReadError("prometheus", f"{spec.analysis.prometheus.url}: "
                                                            f"{type(exc).__name__}: {exc}"[:500]))
    return world


def prometheus_access(k, namespace: str, spec: LookaheadPolicySpec) -> prometheus.PrometheusAccess:
    """``analysis.prometheus`` with the Secrets (and CA ConfigMap) it names read from the policy's
    namespace through ``k`` (``Kube.data_key``); what cannot be read is the access's ``error``
    (``prometheus.access_from_spec``), which every query then raises as a read error."""
    def read(kind: str, name: str, key: str) -> str:
        return k.data_key(kind, namespace, name, key)

    return prometheus.access_from_spec(spec.analysis.prometheus, read)


def with_promoted_config(decision: Decision, spec: LookaheadPolicySpec, engine: str) -> Decision:
    """A regime-aware promotion's decision with the engine config it will write
    (``engines.regime_config`` up to ``measure.regime_cap``), or the reason the engine cannot have one."""
    cap = measure.regime_cap(decision)
    if cap is None:
        return decision
    try:
        config = engines.regime_config(engine, spec.lookahead, cap)
    except engines.EngineError as exc:
        config = {"error": str(exc)}
    return decision.model_copy(update={"config": config})


def _read_live_service(k, world: Observed) -> None:
    """Live mode, split service: the Service the arm pods join (``livesplit.fleet_service``), or
    why there is none."""
    source = sm.role_source(world)
    d = k.get_deployment(*source.key) if source is not None else None
    if d is None:
        return
    try:
        world.live_service = livesplit.fleet_service(k.services(source.namespace), d)
    except livesplit.LiveSplitError as exc:
        world.live_service_refusal = exc.message


def _read_live_route(k, world: Observed, spec: LookaheadPolicySpec) -> None:
    """Live mode, split gatewayAPI: the user's HTTPRoute and the fleet's backend its rule names
    (``livesplit.route_ref``, ``fleet_backend_ref``), read by name; one that is missing or cannot be
    read is data (``live_gateway_refusal``: the spec field, and why), never a failed pass."""
    gw = spec.load.gateway_api
    if gw is None:
        return
    ns, name = livesplit.route_ref(gw, world.namespace)
    try:
        world.live_route = k.get_http_route(ns, name)
    except ApiException as exc:
        world.live_gateway_refusal = ("spec.load.gatewayAPI.httpRouteRef",
                                      f"HTTPRoute {ns}/{name} could not be read: {api_message(exc)}"[:500])
        return
    if world.live_route is None:
        world.live_route_gone = True
        world.live_gateway_refusal = ("spec.load.gatewayAPI.httpRouteRef",
                                      f"HTTPRoute {ns}/{name} not found (is Gateway API's HTTPRoute CRD installed?)")
        return
    kind, bns, bname = livesplit.fleet_backend_ref(gw, ns)
    try:
        world.live_backend = k.get_backend(kind.value, bns, bname)
    except ApiException as exc:
        world.live_gateway_refusal = ("spec.load.gatewayAPI.backendRef",
                                      f"{kind.value} {bns}/{bname} could not be read: {api_message(exc)}"[:500])
        return
    if world.live_backend is None:
        world.live_gateway_refusal = ("spec.load.gatewayAPI.backendRef", f"{kind.value} {bns}/{bname} not found")
        return
    world.live_backend.setdefault("kind", kind.value)
    if world.status.phase == Phase.Preflight and gw.arm_kind == BackendKind.InferencePool \
            and kind != BackendKind.InferencePool:
        try:  # InferencePool arms beside a Service fleet: is the kind served at all? (else every create 404s)
            served = k.serves_inference_pools()
        except ApiException as exc:
            served, why = False, f"could not be looked up: {api_message(exc)}"[:300]
        else:
            why = "is not served by this cluster (install the Gateway API Inference Extension's CRDs)"
        if not served:
            world.live_gateway_refusal = ("spec.load.gatewayAPI.armBackend", f"InferencePool {why}")


def _read_pool(k, world: Observed) -> None:
    """What one pod of the fleet takes of the accelerators (``fleet.accelerators``) and, if any,
    how much of them the pool has free (``fleet.pool_room``): Preflight says so before anything is
    created. A read the API refuses (an older chart's RBAC without nodes) is said, not fatal."""
    source = sm.role_source(world)
    d = k.get_deployment(*source.key) if source is not None else None
    if d is None:
        return
    template = d["spec"]["template"]
    world.accelerators = fleet.accelerators(template)
    if not world.accelerators:
        return
    if WATCH_NAMESPACE is not None:  # a namespaced install has no grant on Nodes nor on other namespaces' Pods
        world.pool_error = (f"not read: this operator is installed for namespace {WATCH_NAMESPACE} only "
                            f"({tenancy.WATCH_WHERE}) and may not list Nodes nor every namespace's Pods; "
                            "spec.canary.capacity: carveOut needs no spare accelerator")
        return
    try:
        world.pool = fleet.pool_room(k.nodes(), k.placed_pods(), template)
    except Exception as exc:  # noqa: BLE001 - the pool unread is data: the state machine says so
        world.pool_error = f"{type(exc).__name__}: {exc}"[:300]


def with_source_load_time(k, world: Observed) -> list[Target]:
    """The targets, the one canary and control are cloned from (``sm.role_source``) with the
    measured load time of its current pods (``fleet.with_load_time``), which the launch deadline
    follows when the policy sets none: one list call per pass, in Launching only (a fleet's pods
    are in no watched cache)."""
    source = sm.role_source(world)
    d = k.get_deployment(*source.key) if source is not None else None
    if d is None:
        return world.targets
    pods = k.pods(source.namespace, d["spec"]["selector"])
    return [fleet.with_load_time(t, pods) if t.key == source.key else t for t in world.targets]


def in_play_pods(k, world: Observed) -> dict[tuple[str, str], list[dict]]:
    """Each in-play target's pods (``sm.in_play``), one list call per target per pass (a fleet's
    pods are in no watched cache); the guard's two readers below share it."""
    out = {}
    for t in sm.in_play(world):
        d = k.get_deployment(*t.key)
        if d is not None:
            out[t.key] = k.pods(t.namespace, d["spec"]["selector"])
    return out


def guard_fleet_pods(listed: dict[tuple[str, str], list[dict]], world: Observed) -> list[dict]:
    """The pods of the target promoted last (``fleet.newest_promoted``, never one left to its
    user), which the synthetic guard drives, from this pass's ``in_play_pods``."""
    newest = fleet.newest_promoted(sm.in_play(world))
    return list(listed.get(newest.key, [])) if newest else []


def guard_sides(listed: dict[tuple[str, str], list[dict]], world: Observed, status: LookaheadPolicyStatus,
                control: list[dict]) -> GuardPods:
    """The pods the guard compares (``results.GuardPods``), ready and not terminating, from this
    pass's ``in_play_pods``: the promoted side is the target promoted last's pods that carry this
    decision's id (its wave Deployment's, or all of its own once promoted whole); the baseline is
    every in-play target's pods without it; the control's pods are listed apart (they serve beside
    the fleet in production mode). A pod of ours that joined the Service (a role label) is never
    counted as fleet."""
    decision = status.decision.id if status.decision else None
    play = sm.in_play(world)
    newest = fleet.newest_promoted(play)
    promoted, baseline = [], []
    for t in play:
        for pod in listed.get(t.key, []):
            meta = pod["metadata"]
            if livesplit.is_arm_pod(pod) or meta.get("deletionTimestamp") or not fleet.pod_ready(pod):
                continue
            key = (meta["namespace"], meta["name"])
            if decision and (meta.get("annotations") or {}).get(ANNOTATION_PROMOTED) == decision:
                if newest is not None and t.key == newest.key:
                    promoted.append(key)
            else:
                baseline.append(key)
    ctl = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in control
           if not p["metadata"].get("deletionTimestamp") and fleet.pod_ready(p)]
    return GuardPods(promoted=tuple(sorted(set(promoted))), baseline=tuple(sorted(set(baseline))),
                     control=tuple(sorted(ctl)), targets=tuple(sorted(t.key for t in play)))


def current_load_jobs(jobs: list[dict], run: int | None) -> list[dict]:
    """The load Jobs of run ``run`` (label ``run``; None is run 0): those of earlier runs are being
    replaced, and drive nothing the state machine waits on."""
    return [j for j in jobs if (j["metadata"].get("labels") or {}).get(LABEL_RUN) == str(run or 0)]


def running_load(jobs: list[dict], run: int | None) -> set[str]:
    """The roles (``drives`` label) whose load Job of run ``run``, not being deleted, has a ready
    pod (Job ``status.ready``; a load generator has no readiness probe, so ready = running)."""
    return {j["metadata"]["labels"].get(LABEL_DRIVES) for j in current_load_jobs(jobs, run)
            if not j["metadata"].get("deletionTimestamp") and ((j.get("status") or {}).get("ready") or 0) > 0}


def finished_load(jobs: list[dict], run: int | None) -> set[str]:
    """The roles whose load Job of run ``run`` has ended (its pod exited: the duration ran out, or
    the load generator failed): nothing drives that role any more."""
    out = set()
    for j in current_load_jobs(jobs, run):
        st = j.get("status") or {}
        if not j["metadata"].get("deletionTimestamp") and (
                st.get("succeeded") or st.get("failed") or st.get("completionTime")):
            out.add(j["metadata"]["labels"].get(LABEL_DRIVES))
    return out


def gone_load_targets(jobs: list[dict], run: int | None, pods_by_role: dict[str, list[dict]]) -> set[str]:
    """The roles whose load Job of run ``run`` drives a pod (by its IP: label ``pod``) that is
    gone (deleted, evicted, replaced by its Deployment): that load reaches nothing any more, and
    the role's new pod is not driven."""
    out = set()
    for j in current_load_jobs(jobs, run):
        labels = j["metadata"]["labels"]
        role, pod = labels.get(LABEL_DRIVES), labels.get(LABEL_POD)
        if role not in pods_by_role or not pod:
            continue
        live = {p["metadata"]["name"] for p in pods_by_role[role] if not p["metadata"].get("deletionTimestamp")}
        if pod not in live:
            out.add(role)
    return out


def _role_namespace(world: Observed, roles: dict) -> str:
    """Where the canary and control live: where they are, else beside the target they are cloned
    from (``statemachine.role_source``)."""
    if roles:
        return next(iter(roles.values()))["metadata"]["namespace"]
    source = sm.role_source(world)
    return source.namespace if source is not None else world.namespace


def _support_problems(k: Kube, spec: LookaheadPolicySpec, world: Observed, phase: Phase) -> list[str]:
    if phase not in (Phase.Pending, Phase.Preflight) or not world.targets:
        return []
    source = sm.role_source(world)
    d = k.get_deployment(*source.key)
    if d is None:
        return []
    template = d["spec"]["template"]
    engine = source.engine or "reference"
    running = running_version(k, d, engine)
    regime_aware = spec.promotion.mode == "regimeAware"
    problems = list(engines.support_problems(template, engine, spec.lookahead, regime_aware, running))
    could_pass = engines.RunningVersion(_stated_release(spec, template), pod="a ready pod")
    if problems and running.pod is None and not list(
            engines.support_problems(template, engine, spec.lookahead, regime_aware, could_pass)):
        # no ready pod yet (a fleet still loading its model): a pod that says the release the
        # template states would be accepted, so wait for one to ask rather than refuse
        world.version_wait = (f"{running.error}: waiting for one to read the {engine} version from before "
                              "anything is claimed (a tag alone is no proof)")
        return []
    if not problems:  # what the adapters cannot render is refused now, not at the first patch
        container = template["spec"]["containers"][b.engine_container_index(template, engines.is_engine_container)]
        for role in ROLES:
            try:
                role_transform(spec, role, engine)(container)
            except engines.EngineError as exc:
                problems.append(f"{role}: {exc}")
    return problems


def _stated_release(spec: LookaheadPolicySpec, template: dict) -> str:
    """The release the policy or the template states (spec.lookahead.engineVersion, else the image
    tag), else one newer than any: only to ask whether a ready pod could be accepted at all."""
    if spec.lookahead.engine_version:
        return str(spec.lookahead.engine_version)
    tagged = engines.image_version(str(b.engine_container(template, engines.is_engine_container).get("image") or ""))
    return ".".join(map(str, tagged)) if tagged else "999.0.0"


_VERSIONS: "OrderedDict[tuple, engines.RunningVersion]" = OrderedDict()
_VERSIONS_MAX = 1024


def running_version(k, deployment: dict, engine: str) -> engines.RunningVersion:
    """What the engine of one ready pod of ``deployment`` says its version is: its version
    endpoints (``engines.version_paths``: the next only after a 404) at
    ``http://<podIP>:<engine port>`` (``loadjobs.engine_port``), each read once with a short
    timeout and no retry (``kube.podhttp``); a failure is data (``RunningVersion.error``), for
    the gate's message. A pod running the template's engine image is preferred (one of an older
    ReplicaSet may run another release). Remembered per pod and image, once read."""
    meta = deployment["metadata"]
    template = deployment["spec"]["template"]
    pods = [p for p in k.pods(meta["namespace"], deployment["spec"]["selector"])
            if fleet.pod_ready(p) and not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("podIP")]
    if not pods:
        return engines.RunningVersion(None, error=f"no ready pod of {meta['namespace']}/{meta['name']} to read it from")
    image = b.engine_container(template, engines.is_engine_container).get("image")
    pod = next((p for p in pods if _engine_image(p, template) == image), pods[0])
    name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    key = (pod["metadata"].get("uid") or name, engine,
           tuple(c.get("imageID") for c in (pod.get("status") or {}).get("containerStatuses") or []))
    if key in _VERSIONS:
        return _VERSIONS[key]
    ip = pod["status"]["podIP"]
    base = f"http://{f'[{ip}]' if ':' in ip else ip}:{loadjobs.engine_port(pod, template)}"
    paths = engines.version_paths(engine)
    for i, path in enumerate(paths):
        try:
            text = engines.version_from_answer(engine, path, podhttp.get_json(base + path))
        except podhttp.PodHTTPError as exc:
            if exc.not_found and i + 1 < len(paths):
                continue
            return engines.RunningVersion(None, name, path, error=f"could not read the version from pod {name}: {exc}")
        except engines.EngineError as exc:
            return engines.RunningVersion(None, name, path, error=f"could not read the version from pod {name}: {path}: {exc}")
        found = _VERSIONS[key] = engines.RunningVersion(text, name, path)
        if len(_VERSIONS) > _VERSIONS_MAX:
            _VERSIONS.popitem(last=False)
        return found
    return engines.RunningVersion(None, name, error=f"pod {name} has no version endpoint")


def _engine_image(pod: dict, template: dict) -> str | None:
    try:
        engine = b.engine_container(template, engines.is_engine_container)
        return b.engine_container(pod, engines.is_engine_container, engine.get("name")).get("image")
    except (KeyError, ValueError):
        return None


def known_targets(k: Kube, status: LookaheadPolicyStatus, engine) -> list[Target]:
    out = []
    for row in status.targets or []:
        d = k.get_deployment(row.namespace, row.name)
        if d is not None:
            out.append(target_of(d, engine or row.engine))
    return out


def target_of(deployment: dict, engine) -> Target:
    """A target Deployment as the state machine sees it (``fleet.target_of``), with whether its user
    edited its pod template since our last write (``builders.user_edited``)."""
    return replace(fleet.target_of(deployment, engine), user_edited=_user_edited(deployment))


_EDITED: "OrderedDict[tuple, bool]" = OrderedDict()
_EDITED_MAX = 4096


def _user_edited(d: dict) -> bool:
    """``builders.user_edited``, remembered per resourceVersion: a pass over an unchanged target
    parses and compares no template."""
    meta = d["metadata"]
    ann = meta.get("annotations") or {}
    if not ann.get(ANNOTATION_ORIGINAL_TEMPLATE):
        return False
    rv = meta.get("resourceVersion")
    if not rv:
        return b.user_edited(d)
    key = (meta.get("namespace"), meta.get("name"), meta.get("uid"), rv)
    hit = _EDITED.get(key)
    if hit is None:
        hit = _EDITED[key] = b.user_edited(d)
        if len(_EDITED) > _EDITED_MAX:
            _EDITED.popitem(last=False)
    return hit
