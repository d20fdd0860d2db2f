"""Kopf handlers: thin. Observe the world, ask the state machine what to do, do it, write status.

    kopf run -m lookahead_operator.handlers --all-namespaces --liveness=http://0.0.0.0:8080/healthz

The logic lives in pure modules: ``statemachine.reconcile`` (phases, deadlines, the next status),
``builders`` (objects), ``measure`` (Prometheus -> statistics -> verdicts, decision, guard). This
file reads the cluster (``observe``), carries out a plan's actions (``ACTIONS``, one small
idempotent function each) and writes the whole status back (``write_status``).

Scheduling: one asyncio daemon per policy runs a pass, then sleeps for the plan's
``requeue_after``, or until the policy's spec or gate annotations change (``wake``). A finished
policy (``requeue_after`` None) sleeps until it changes: it costs no periodic API request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

import kopf
import kubernetes
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from . import builders as b
from . import api, cache, conditions, engines, fleet, loadjobs, measure, metrics
from . import statemachine as sm
from .conditions import Fact
from .kube import Kube
from .api import ANNOTATION_ABORT, ANNOTATION_APPROVE, FINALIZER, GROUP, PLURAL, VERSION
from .models import (
    MAX_POLICY_NAME,
    NAME_TOO_LONG,
    ConditionType,
    LookaheadPolicySpec,
    LookaheadPolicyStatus,
    Phase,
)
from .statemachine import ActionKind

log = logging.getLogger("lookahead_operator")

MAX_PASSES = 4            # passes chained within one wake-up while phases move on at once
# statemachine.Observed.poll_s: a safety net only; changes to the policy and to the Deployments it
# waits on wake it at once, and a pass that finds nothing new reads only the watched caches.
POLL_S = float(os.environ.get("LOOKAHEAD_POLL_SECONDS", "30"))
ERROR_BACKOFF_S = float(os.environ.get("LOOKAHEAD_ERROR_BACKOFF_SECONDS", "5"))
_kube: Kube | None = None
_wakers: dict[str, asyncio.Event] = {}
_seen: dict[str, tuple] = {}


def kube() -> Kube:
    global _kube
    if _kube is None:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened; Kopf's would repeat it
    log.setLevel(os.environ.get("LOOKAHEAD_LOG_LEVEL", "INFO"))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = 120
    settings.execution.max_workers = int(os.environ.get("LOOKAHEAD_MAX_WORKERS", "32"))
    _warm_up(kube())
    port = int(os.environ.get("LOOKAHEAD_METRICS_PORT", "9100"))
    if port:
        metrics.serve(port, os.environ.get("LOOKAHEAD_METRICS_ADDR", "0.0.0.0"))


@kopf.on.startup()
async def threads(**_) -> None:
    """Passes run in threads (the Kubernetes client blocks): enough of them that hundreds of
    policies applied at once do not queue behind each other."""
    from concurrent.futures import ThreadPoolExecutor

    workers = int(os.environ.get("LOOKAHEAD_PASS_THREADS", "64"))
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(workers, thread_name_prefix="pass"))


def _warm_up(k: Kube) -> None:
    """The Kubernetes client builds each model class (pydantic) on first use, ~0.2 s of CPU apiece:
    deserialize one of each object the operator reads or writes now, at start, rather than inside
    the first hundred reconciles."""
    import json

    template = {"metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "engine", "image": "x", "command": ["x"], "args": ["--x"],
                                         "env": [{"name": "A", "value": "1"}],
                                         "ports": [{"name": "http", "containerPort": 8000}],
                                         "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}},
                                         "resources": {"requests": {"cpu": "1"}},
                                         "securityContext": {"capabilities": {"drop": ["ALL"]}},
                                         "volumeMounts": [{"name": "p", "mountPath": "/p"}]}],
                         "volumes": [{"name": "p", "configMap": {"name": "c", "items": [{"key": "k", "path": "k"}]}}],
                         "securityContext": {"runAsUser": 1, "seccompProfile": {"type": "RuntimeDefault"}}}}
    meta = {"name": "x", "namespace": "x", "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x",
                                                               "uid": "u"}]}
    samples = {
        "V1Deployment": {"metadata": meta, "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template},
                         "status": {"conditions": [{"type": "Progressing", "status": "True"}]}},
        "V1Job": {"metadata": meta, "spec": {"template": template}, "status": {"conditions": []}},
        "V1PodList": {"items": [{"metadata": meta, "spec": template["spec"],
                                 "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                            "containerStatuses": [{"name": "x", "image": "x", "imageID": "x",
                                                                   "ready": True, "restartCount": 0}]}}],
                      "metadata": {}},
        "V1DeploymentList": {"items": [], "metadata": {}}, "V1JobList": {"items": [], "metadata": {}},
        "V1NamespaceList": {"items": [{"metadata": meta}], "metadata": {}},
        "CoreV1Event": {"metadata": meta, "involvedObject": {"name": "x"}, "source": {"component": "x"}},
        "V1Status": {"details": {"causes": [{"field": "x"}]}},
    }
    for klass, data in samples.items():
        try:
            k.api_client.deserialize(json.dumps(data), klass, "application/json")
        except Exception as exc:  # noqa: BLE001 - a warm-up only
            log.debug("warm-up of %s: %s", klass, exc)


@kopf.on.probe(id="reconciles")
def probe(**_) -> float:
    return metrics.RECONCILES._value.get()


# --- watched caches (reads come from these, not from list calls) -------------------------------------

@kopf.index("namespaces")
def namespace_labels(name, labels, **_):
    return {name: dict(labels)}


@kopf.index("apps", "v1", "deployments")
def deployments_by_namespace(namespace, body, **_):
    return {namespace: cache.cached(body)}


@kopf.index("pods", labels={api.LABEL_POLICY: kopf.PRESENT})
def pods_by_policy(labels, body, **_):
    return {(labels.get(api.LABEL_POLICY_NAMESPACE), labels.get(api.LABEL_POLICY)): cache.cached(body)}


@kopf.index("batch", "v1", "jobs", labels={api.LABEL_ROLE: "loadgen"})
def jobs_by_policy(labels, body, **_):
    return {(labels.get(api.LABEL_POLICY_NAMESPACE), labels.get(api.LABEL_POLICY)): cache.cached(body)}


# --- scheduling: a daemon per policy, woken by changes -------------------------------------------------

_uid_by_key: dict[str, str] = {}     # "namespace/name" of a policy -> its uid (for wake-ups)
_pending: set[str] = set()           # policies waiting for their targets to appear


def _wake(key: str) -> None:
    uid = _uid_by_key.get(key)
    if uid in _wakers:
        _wakers[uid].set()


def _signature(meta) -> tuple:
    ann = meta.get("annotations") or {}
    return (meta.get("generation"), ann.get(ANNOTATION_APPROVE), ann.get(ANNOTATION_ABORT))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def wake(meta, **_) -> None:
    """A change of the spec or of a gate annotation wakes the policy's daemon at once (status
    writes, ours included, do not)."""
    uid = meta.get("uid")
    sig = _signature(meta)
    if _seen.get(uid) != sig:
        _seen[uid] = sig
        if uid in _wakers:
            _wakers[uid].set()


@kopf.on.event("apps", "v1", "deployments")
async def wake_on_deployment(meta, **_) -> None:
    """A canary/control or a claimed target changed (created, ready, rolled out, failed): wake its
    policy; any other Deployment may be a new target for a policy still looking for its fleet."""
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(api.LABEL_POLICY) and labels.get(api.LABEL_POLICY_NAMESPACE):
        _wake(f"{labels[api.LABEL_POLICY_NAMESPACE]}/{labels[api.LABEL_POLICY]}")
    elif ann.get(api.ANNOTATION_OWNER):
        _wake(ann[api.ANNOTATION_OWNER])
    else:
        for key in list(_pending):
            _wake(key)


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=30.0)
async def run(stopped, body, meta, namespace_labels, deployments_by_namespace, pods_by_policy, jobs_by_policy,
              **_) -> None:
    uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]
    key = f"{namespace}/{name}"
    _uid_by_key[key] = uid
    wake_event = _wakers.setdefault(uid, asyncio.Event())
    written: tuple[frozenset, dict] | None = None   # (resourceVersions our writes replaced, the object as written)
    try:
        while not stopped:
            wake_event.clear()
            raw = cache.cached(body)        # the live body as of now (Kopf replaces it whole on each event)
            if raw["metadata"].get("deletionTimestamp"):
                break
            if written is not None and raw["metadata"].get("resourceVersion") in written[0]:
                raw = written[1]            # our own status write has not come back through the watch yet
            spec, error = parse_spec(raw)
            status = parse_status(raw)
            snap = cache.Snapshot.of(namespace, name, spec, status.targets, namespace_labels,
                                     deployments_by_namespace, pods_by_policy, jobs_by_policy)
            try:
                requeue, wrote = await asyncio.to_thread(reconcile_once, raw, spec, error, status, snap)
                if wrote is not None:
                    written = (wrote[0] | (written[0] if written else frozenset()), wrote[1])
            except Exception:  # noqa: BLE001 - the API or a bug: log, back off, try again
                log.exception("reconcile of %s failed; retrying in %ss", key, ERROR_BACKOFF_S)
                requeue = ERROR_BACKOFF_S
            if stopped:
                break
            waiters = [asyncio.ensure_future(wake_event.wait()), asyncio.ensure_future(stopped.wait())]
            try:
                await asyncio.wait(waiters, timeout=requeue, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
    finally:
        _wakers.pop(uid, None)
        _seen.pop(uid, None)
        _pending.discard(key)
        if _uid_by_key.get(key) == uid:
            del _uid_by_key[key]


# --- one reconcile --------------------------------------------------------------------------------

def parse_spec(body: dict) -> tuple[LookaheadPolicySpec | None, str | None]:
    """The spec, parsed once, or why it cannot be acted on (naming the field)."""
    if len(body["metadata"]["name"]) > MAX_POLICY_NAME:
        return None, NAME_TOO_LONG
    try:
        return LookaheadPolicySpec.model_validate(dict(body.get("spec") or {})), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, f"spec{'.' + where if where else ''}: {first['msg']}"


def parse_status(body: dict) -> LookaheadPolicyStatus:
    try:
        return LookaheadPolicyStatus.model_validate(body.get("status") or {})
    except ValidationError:
        log.warning("status of %s/%s does not parse; starting from Pending", body["metadata"].get("namespace"),
                    body["metadata"].get("name"))
        return LookaheadPolicyStatus()


def _now_precise() -> float:
    import time
    return time.monotonic()


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def reconcile_once(body: dict, spec: LookaheadPolicySpec | None, error: str | None, status: LookaheadPolicyStatus,
                   snap: cache.Snapshot) -> tuple[float | None, tuple[frozenset, dict] | None]:
    """Passes over one policy until its phase settles, reading from the watched caches; the status
    is written after each pass that changed it. Returns (seconds until the next pass, or None to wait
    for a change; the last object written, if any)."""
    k = kube()
    view = cache.CachedView(k, snap)
    metrics.RECONCILES.inc()
    meta = body["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    requeue: float | None = None
    superseded: set[str] = set()   # resourceVersions our own writes replaced
    for _ in range(MAX_PASSES):
        now = _now()
        t_pass = _now_precise()
        world = observe(view, body, spec, error, status, now)
        plan = sm.reconcile(world)
        ctx = Ctx(view, body, spec, world)
        try:
            for action in plan.actions:
                ACTIONS[action.kind](ctx, action)
        except (ApiException, engines.EngineError, ValueError, OSError) as exc:
            metrics.RECONCILE_ERRORS.labels(status.phase).inc()
            why = f"{action.kind} failed: {_api_message(exc)}"
            log.warning("%s: %s", key, why)
            status = _with_fact(status, ConditionType.Reconciled, Fact(False, "ActionFailed", why), world)
            out = _write(k, body, status)
            if out is not None:
                superseded.add(out[0])
                body = out[1]
            return ERROR_BACKOFF_S, (frozenset(superseded), body) if superseded else None
        new = _with_fact(plan.status, ConditionType.Reconciled, Fact(True, "Done", "the last pass's actions were "
                                                                      "carried out"), world)
        if new.phase != status.phase:
            _record_transition(status, new, now)
        moved = new.phase != status.phase
        status = new
        requeue = plan.requeue_after
        # Written after every pass that acted or moved: what was done (a claim, a canary) is on
        # record before the next pass does more; a pass that changed nothing writes nothing.
        try:
            out = _write(k, body, status)
        except ApiException as exc:
            if exc.status == 409:  # the policy changed under us: the watch brings the new one; re-plan
                return 0.5, (frozenset(superseded), body) if superseded else None
            raise
        if out is not None:
            superseded.add(out[0])
            body = out[1]
        for type_, reason, message in plan.events:  # once what they tell is on record
            _event(k, body, type_, reason, message)
        log.debug("%s: pass %s -> %s in %.3fs, next in %s", key, world.status.phase, status.phase,
                  (_now_precise() - t_pass), requeue)
        if not moved or requeue is None or requeue > 1.0:
            break
    if status.phase == Phase.Pending:
        _pending.add(key)
    else:
        _pending.discard(key)
    metrics.record_phase(key, status.phase)
    return requeue, (frozenset(superseded), body) if superseded else None


def _write(k: Kube, body: dict, status: LookaheadPolicyStatus) -> tuple[str, dict] | None:
    before = body["metadata"].get("resourceVersion")
    out = write_status(k, body, status)
    return (before, out) if out is not body else None


def _with_fact(status: LookaheadPolicyStatus, type_: ConditionType, fact: Fact, world: sm.Observed):
    out = status.model_copy(deep=True)
    out.conditions = conditions.derive(status.conditions, {type_: fact}, status.phase, status.message or "",
                                       world.generation, world.now)
    return out


def _api_message(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
    return f"{type(exc).__name__}: {exc}"


def write_status(k: Kube, body: dict, status: LookaheadPolicyStatus) -> dict:
    """Replace the status whole when it changed (optimistic concurrency on resourceVersion)."""
    new = status.to_dict()
    if new == (body.get("status") or {}):
        return body
    return k.replace_policy_status({**body, "status": new})


def observe(k, body: dict, spec: LookaheadPolicySpec | None, spec_error: str | None, status: LookaheadPolicyStatus,
            now: datetime) -> sm.Observed:
    """The world as the state machine sees it, read through ``k`` (a ``cache.CachedView``, or the
    API client itself)."""
    meta = body["metadata"]
    world = sm.Observed(now=now, name=meta["name"], namespace=meta["namespace"],
                        generation=int(meta.get("generation", 1)), spec=spec, status=status, spec_error=spec_error,
                        poll_s=POLL_S)
    if len(meta["name"]) > MAX_POLICY_NAME:
        return world  # nothing can have been created: our labels could not hold the name
    if spec is None:
        world.targets = _known_targets(k, status, None)
        return world
    annotations = meta.get("annotations") or {}
    world.approved_decision = annotations.get(ANNOTATION_APPROVE) or None
    world.fingerprint = spec.fingerprint()
    world.abort_requested = annotations.get(ANNOTATION_ABORT, "").lower() in ("true", "1", "yes")

    namespaces = k.target_namespaces(meta["namespace"], spec.targets.namespace_selector, spec.targets.namespaces)
    found = [fleet.target_of(d, spec.engine) for d in k.deployments(namespaces, spec.targets.selector)]
    keys = {t.key for t in found}
    # Targets we touched that no longer match the selector are still ours to put back.
    world.targets = found + [t for t in _known_targets(k, status, spec.engine) if t.key not in keys]
    roles = {d["metadata"]["labels"][b.LABEL_ROLE]: d for d in k.role_deployments(meta["namespace"], meta["name"])}
    world.roles_present = {r: r in roles or cache.recently_created(
        "Deployment", _role_namespace(world, roles), b.role_deployment_name(meta["name"], r)) for r in b.ROLES}
    world.roles_ready = {r: fleet.deployment_ready(roles[r]) if r in roles else False for r in b.ROLES}
    world.support_problems = _support_problems(k, spec, world.targets, status.phase)

    if status.progress.fingerprint not in (None, world.fingerprint):
        return world  # the spec changed: the state machine restarts; measure nothing old
    need = sm.NEEDS.get(status.phase)
    policy = (meta["namespace"], meta["name"])
    try:
        if need is sm.Need.PREFLIGHT:
            world.preflight = measure.preflight(spec, world.targets)
        elif need is sm.Need.STEP:
            world.step = measure.step(spec, policy, status, now)
        elif need is sm.Need.DECISION:
            source = fleet.reference_target(world.targets) if world.targets else None
            top = fleet.engine_max_batch(k.get_deployment(*source.key), source.engine) if source else None
            world.decision = measure.decision(spec, status, max_batch_size=top)
        elif need is sm.Need.GUARD:
            world.guard = measure.guard(spec, policy, status, now, k.load_jobs(*policy))
    except measure.READ_ERRORS as exc:
        world.read_errors.append(sm.ReadError("prometheus", f"{spec.analysis.prometheus.url}: "
                                                            f"{type(exc).__name__}: {exc}"[:500]))
    return world


def _role_namespace(world: sm.Observed, roles: dict) -> str:
    """Where the canary and control live: beside the first target (``fleet.reference_target``)."""
    if roles:
        return next(iter(roles.values()))["metadata"]["namespace"]
    return fleet.reference_target(world.targets).namespace if world.targets else world.namespace


def _support_problems(k: Kube, spec: LookaheadPolicySpec, targets: list[sm.Target], phase: Phase) -> list[str]:
    check = getattr(engines, "support_problems", None)
    if check is None or phase not in (Phase.Pending, Phase.Preflight) or not targets:
        return []
    source = fleet.reference_target(targets)
    d = k.get_deployment(*source.key)
    if d is None:
        return []
    template = d["spec"]["template"]
    engine = source.engine or "reference"
    problems = list(check(template, engine, spec.lookahead, spec.promotion.mode == "regimeAware"))
    if not problems:  # what the adapters cannot render is refused now, not at the first patch
        container = template["spec"]["containers"][b.engine_container_index(template, engines.is_engine_container)]
        for role in b.ROLES:
            try:
                _role_transform(spec, role, engine)(container)
            except engines.EngineError as exc:
                problems.append(f"{role}: {exc}")
    return problems


def _known_targets(k: Kube, status: LookaheadPolicyStatus, engine) -> list[sm.Target]:
    out = []
    for row in status.targets or []:
        d = k.get_deployment(row.namespace, row.name)
        if d is not None:
            out.append(fleet.target_of(d, engine or row.engine))
    return out


# --- actions: one small idempotent function each --------------------------------------------------

@dataclass
class Ctx:
    k: Kube
    body: dict                        # the policy object
    spec: LookaheadPolicySpec | None
    world: sm.Observed

    @property
    def me(self) -> str:
        return self.world.key


def _claim(c: Ctx, a: sm.Action) -> None:
    for ns, name in a.targets:
        d = c.k.fresh_deployment(ns, name)  # the template saved must be the latest
        if d is not None:
            c.k.patch_deployment(ns, name, b.claim_patch(d, c.me))


def _release(c: Ctx, a: sm.Action) -> None:
    for ns, name in a.targets:
        d = c.k.get_deployment(ns, name)
        ann = (d or {}).get("metadata", {}).get("annotations") or {}
        # Never drop the saved template of a Deployment that is still promoted.
        if d is not None and ann.get(b.ANNOTATION_OWNER) == c.me and not ann.get(b.ANNOTATION_PROMOTED):
            c.k.patch_deployment(ns, name, b.release_patch())


def _disown(c: Ctx, a: sm.Action) -> None:
    for ns, name in a.targets:
        d = c.k.get_deployment(ns, name)
        if d is not None and (d["metadata"].get("annotations") or {}).get(b.ANNOTATION_OWNER) == c.me:
            c.k.patch_deployment(ns, name, {"metadata": {"annotations": {b.ANNOTATION_OWNER: None}}})


def _role_transform(spec: LookaheadPolicySpec, role: str, engine: str):
    if role == "canary":
        return lambda container: engines.render_lookahead(container, spec.lookahead, None, engine)
    return lambda container: engines.render_off(container, engine)


def _ensure_roles(c: Ctx, a: sm.Action) -> None:
    w = c.world
    roles = {r for r, present in w.roles_present.items() if present}
    if all(r in roles for r in b.ROLES):
        return
    source = fleet.reference_target(w.targets)
    d = c.k.get_deployment(*source.key)
    if d is None:
        raise ValueError(f"target {source.namespace}/{source.name} disappeared")
    engine = source.engine or "reference"
    for role in b.ROLES:
        if role in roles:
            continue
        obj = b.build_role_deployment(d, c.body, role, c.spec.canary.replicas, _role_transform(c.spec, role, engine),
                                      engines.is_engine_container)
        if c.k.create_if_absent(obj):
            _event(c.k, c.body, "Normal", "Launched",
                   f"created {role} {obj['metadata']['namespace']}/{obj['metadata']['name']}")
    if c.k.has_pod_monitor_crd():
        c.k.create_if_absent(b.build_pod_monitor(c.body, source.namespace))


def _ensure_load(c: Ctx, a: sm.Action) -> None:
    w = c.world
    source = fleet.reference_target(w.targets)
    pods = {role: c.k.role_pods(source.namespace, w.namespace, w.name, role) for role in b.ROLES}
    for job in loadjobs.step_jobs(c.spec, c.body, source.namespace, a.step, a.run, a.batch_size, pods):
        c.k.create_if_absent(job)


def _ensure_guard_load(c: Ctx, a: sm.Action) -> None:
    w = c.world
    newest = fleet.newest_promoted(w.targets)
    d = c.k.get_deployment(*newest.key) if newest else None
    if d is None:
        return
    source = fleet.reference_target(w.targets)
    control = c.k.role_pods(source.namespace, w.namespace, w.name, "control")
    fleet_pods = c.k.pods(newest.namespace, d["spec"]["selector"])
    for job in loadjobs.guard_jobs(c.spec, c.body, a.wave, a.run, a.batch_size, newest, fleet_pods, control):
        c.k.create_if_absent(job)


def _delete_load(c: Ctx, a: sm.Action) -> None:
    c.k.delete_load_jobs(c.world.namespace, c.world.name)


def _delete_roles(c: Ctx, a: sm.Action) -> None:
    c.k.delete_role_deployments(c.world.namespace, c.world.name)


def _promote(c: Ctx, a: sm.Action) -> None:
    regime = measure.promotion_regime(c.world.status)
    for ns, name in a.targets:
        d = c.k.fresh_deployment(ns, name)
        if d is None:
            continue
        if b.original_template(d) is None:  # claimed before, but be safe: save first
            c.k.patch_deployment(ns, name, b.claim_patch(d, c.me))
            d = c.k.fresh_deployment(ns, name)
        engine = fleet.target_of(d, c.spec.engine).engine or "reference"
        patch = b.promote_patch(d, lambda ct: engines.render_lookahead(ct, c.spec.lookahead, regime, engine),
                                engines.is_engine_container, a.decision_id)
        c.k.patch_deployment(ns, name, patch)
        _event(c.k, c.body, "Normal", "Promoted", f"lookahead on in {ns}/{name}")


def _restore(c: Ctx, a: sm.Action) -> None:
    for ns, name in a.targets:
        d = c.k.fresh_deployment(ns, name)
        if d is not None and b.original_template(d) is not None:
            c.k.replace_deployment(b.restore_body(d))
            _event(c.k, c.body, "Warning", "Restored", f"{ns}/{name} restored to its saved pod template")


ACTIONS = {
    ActionKind.CLAIM: _claim,
    ActionKind.RELEASE: _release,
    ActionKind.DISOWN: _disown,
    ActionKind.ENSURE_ROLES: _ensure_roles,
    ActionKind.DELETE_ROLES: _delete_roles,
    ActionKind.ENSURE_LOAD: _ensure_load,
    ActionKind.ENSURE_GUARD_LOAD: _ensure_guard_load,
    ActionKind.DELETE_LOAD: _delete_load,
    ActionKind.PROMOTE: _promote,
    ActionKind.RESTORE: _restore,
}
assert set(ACTIONS) == set(ActionKind)


_events: "queue.Queue[tuple]" = queue.Queue(maxsize=10_000)
_poster: threading.Thread | None = None


def _post_events() -> None:
    while True:
        k, body, type_, reason, message = _events.get()
        try:
            k.event(body, type_, reason, message)
        except (ApiException, OSError) as exc:  # an event is worth a log line, never a failed pass
            log.warning("could not post event %s: %s", reason, _api_message(exc))


def _event(k: Kube, body: dict, type_: str, reason: str, message: str) -> None:
    """Post an Event off the critical path (a background thread posts them in order)."""
    global _poster
    if _poster is None or not _poster.is_alive():
        for i in range(4):  # a few in parallel: hundreds of policies starting at once post hundreds of events
            _poster = threading.Thread(target=_post_events, name=f"events-{i}", daemon=True)
            _poster.start()
    meta = body["metadata"]
    ref = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
           "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")}}
    try:
        _events.put_nowait((k.k if isinstance(k, cache.CachedView) else k, ref, type_, reason, message))
    except queue.Full:
        log.warning("event queue full: dropped %s %s", reason, message[:200])


def _record_transition(old: LookaheadPolicyStatus, new: LookaheadPolicyStatus, now: datetime) -> None:
    since = old.progress.phase_since
    metrics.TIME_IN_PHASE.labels(old.phase).observe(max(0.0, (now - since).total_seconds()) if since else 0.0)
    if new.phase == Phase.RolledBack:
        metrics.ROLLBACKS.labels(new.rollback.reason if new.rollback else "Decision").inc()
    if new.decision is not None and old.phase == Phase.Deciding:
        metrics.DECISIONS.labels(str(new.decision.action)).inc()


# --- deletion -------------------------------------------------------------------------------------

@kopf.on.delete(GROUP, VERSION, PLURAL, id="cleanup")
def cleanup(body, meta, **_) -> None:
    """Deleting a policy carries out ``statemachine.deletion_plan``."""
    name, namespace = meta["name"], meta["namespace"]
    if len(name) > MAX_POLICY_NAME:
        return  # refused at every pass: nothing was created or claimed
    k = kube()
    body = dict(body)
    status = parse_status(body)
    spec, _ = parse_spec(body)
    world = sm.Observed(now=_now(), name=name, namespace=namespace, generation=int(meta.get("generation", 1)),
                        spec=spec, status=status)
    known = _known_targets(k, status, spec.engine if spec else None)
    if spec is not None:  # and whatever matches now (a claim may have landed after the last status write)
        keys = {t.key for t in known}
        namespaces = k.target_namespaces(namespace, spec.targets.namespace_selector, spec.targets.namespaces)
        known += [t for t in (fleet.target_of(d, spec.engine) for d in k.deployments(namespaces, spec.targets.selector))
                  if t.key not in keys]
    world.targets = known
    ctx = Ctx(k, body, spec, world)
    for action in sm.deletion_plan(status, world.targets, world.key):
        ACTIONS[action.kind](ctx, action)
    metrics.record_phase(world.key, None)
