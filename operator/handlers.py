"""Kopf handlers: thin. Observe the world, ask the state machine what to do, do it, write status.

    kopf run -m lookahead_operator.handlers --all-namespaces --liveness=http://0.0.0.0:8080/healthz

The logic lives in pure modules: ``statemachine.reconcile`` (phases), ``builders`` (objects),
``measure`` (Prometheus -> statistics -> verdicts, decision, guard). This file reads the cluster
(``observe``), carries out a plan's actions (``execute``) and patches the status subresource.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone

import kopf
import kubernetes
from pydantic import ValidationError

from . import builders as b
from . import engines, measure, metrics
from . import statemachine as sm
from .kube import Kube
from .models import GROUP, PLURAL, VERSION, LookaheadPolicySpec

log = logging.getLogger("lookahead_operator")

TICK_S = float(os.environ.get("LOOKAHEAD_TICK_SECONDS", "5"))
ANNOTATION_APPROVE = f"{b.GROUP}/approve"
ANNOTATION_ABORT = f"{b.GROUP}/abort"
_kube: Kube | None = None


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
    settings.persistence.finalizer = f"{b.GROUP}/cleanup"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=b.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=b.GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened; Kopf's would repeat it
    # A timer fires every tick; Kopf would log each success at INFO.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = 120
    settings.execution.max_workers = int(os.environ.get("LOOKAHEAD_MAX_WORKERS", "32"))
    port = int(os.environ.get("LOOKAHEAD_METRICS_PORT", "9100"))
    if port:
        metrics.serve(port, os.environ.get("LOOKAHEAD_METRICS_ADDR", "0.0.0.0"))
    kube()


@kopf.on.probe(id="reconciles")
def probe(**_) -> float:
    return metrics.RECONCILES._value.get()


def _parse_spec(spec: dict) -> tuple[LookaheadPolicySpec | None, str | None]:
    try:
        return LookaheadPolicySpec.model_validate(dict(spec)), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "spec." + ".".join(str(p) for p in first["loc"])
        return None, f"{where}: {first['msg']}"


def observe(body: dict, spec: LookaheadPolicySpec | None, spec_error: str | None, now: datetime) -> sm.Observed:
    meta = body["metadata"]
    status = dict(body.get("status") or {})
    k = kube()
    world = sm.Observed(now=now, name=meta["name"], namespace=meta["namespace"],
                        generation=int(meta.get("generation", 1)), spec=spec, status=status, spec_error=spec_error)
    if spec is None:
        return world
    annotations = meta.get("annotations") or {}
    approve = annotations.get(ANNOTATION_APPROVE)
    world.approved_decision = approve or None
    world.fingerprint = spec.fingerprint()
    world.abort_requested = annotations.get(ANNOTATION_ABORT, "").lower() in ("true", "1", "yes")

    namespaces = k.target_namespaces(meta["namespace"], _dump(spec.targets.namespace_selector),
                                     spec.targets.namespaces)
    deployments = k.deployments(namespaces, _dump(spec.targets.selector))
    world.targets = [measure.target_of(d, spec.engine) for d in deployments]
    roles = {d["metadata"]["labels"][b.LABEL_ROLE]: d for d in k.role_deployments(meta["namespace"], meta["name"])}
    world.roles_present = {r: r in roles for r in b.ROLES}
    world.roles_ready = {r: measure.deployment_ready(roles[r]) if r in roles else False for r in b.ROLES}

    phase = status.get("phase") or sm.PENDING
    progress = status.get("progress") or {}
    if progress.get("fingerprint") not in (None, world.fingerprint):
        return world  # the spec changed: the state machine restarts; measure nothing old
    if phase == sm.PREFLIGHT:
        world.preflight, world.auto_batch_sizes = measure.preflight(spec, world.targets)
    elif phase == sm.MEASURING:
        world.step = measure.step(spec, (meta["namespace"], meta["name"]), status, now)
    elif phase == sm.DECIDING:
        world.decision = measure.decision(spec, status, now, world.targets)
    elif phase in (sm.PROMOTING, sm.GUARDING):
        world.guard = measure.guard(spec, (meta["namespace"], meta["name"]), status, now,
                                    k.load_jobs(meta["namespace"], meta["name"]))
    return world


def _dump(model):
    return model.model_dump(by_alias=True, exclude_none=True) if model is not None else None


def execute(body: dict, spec: LookaheadPolicySpec, world: sm.Observed, action: sm.Action) -> None:
    """Carry out one action. Each is idempotent; an exception stops the rest of the plan, and
    the next tick re-plans from what is then in the cluster."""
    k = kube()
    me = sm.policy_key(world)
    a = action.args
    if action.kind == sm.CLAIM:
        for ns, name in a["targets"]:
            d = k.get_deployment(ns, name)
            if d is not None:
                k.patch_deployment(ns, name, b.claim_patch(d, me))
    elif action.kind == sm.RELEASE:
        for ns, name in a["targets"]:
            d = k.get_deployment(ns, name)
            ann = (d or {}).get("metadata", {}).get("annotations") or {}
            # Never drop the saved template of a Deployment that is still promoted.
            if d is not None and ann.get(b.ANNOTATION_OWNER) == me and not ann.get(b.ANNOTATION_PROMOTED):
                k.patch_deployment(ns, name, b.release_patch())
    elif action.kind == sm.ENSURE_ROLES:
        if all(world.roles_present.get(r) for r in b.ROLES):
            return
        source = measure.reference_target(world.targets)
        d = k.get_deployment(*source.key)
        if d is None:
            raise kopf.TemporaryError(f"target {source.namespace}/{source.name} disappeared", delay=5)
        engine = source.engine or "reference"
        for role in b.ROLES:
            if world.roles_present.get(role):
                continue
            transform = ((lambda c: engines.render_lookahead(c, spec.lookahead, None, engine)) if role == "canary"
                         else (lambda c: engines.render_off(c, engine)))
            obj = b.build_role_deployment(d, body, role, spec.canary.replicas, transform,
                                          engines.is_engine_container)
            if k.create_if_absent(obj):
                kopf.event(body, type="Normal", reason="Launched",
                           message=f"created {role} {obj['metadata']['namespace']}/{obj['metadata']['name']}")
        if k.has_pod_monitor_crd():
            k.create_if_absent(b.build_pod_monitor(body, source.namespace))
    elif action.kind == sm.ENSURE_LOAD:
        source = measure.reference_target(world.targets)
        pods = {role: k.role_pods(source.namespace, world.namespace, world.name, role) for role in b.ROLES}
        for job in measure.load_jobs(spec, body, source.namespace, a["step"], a["batch_size"], pods):
            k.create_if_absent(job)
    elif action.kind == sm.ENSURE_GUARD_LOAD:
        newest = measure.newest_promoted(world.targets)
        d = k.get_deployment(*newest.key) if newest else None
        if d is None:
            return
        source = measure.reference_target(world.targets)
        control = k.role_pods(source.namespace, world.namespace, world.name, "control")
        fleet_pods = k.pods(newest.namespace, d["spec"]["selector"])
        for job in measure.guard_jobs(spec, body, a["wave"], a["batch_size"], newest, fleet_pods, control):
            k.create_if_absent(job)
    elif action.kind == sm.DELETE_LOAD:
        k.delete_load_jobs(world.namespace, world.name, a.get("step"))
    elif action.kind == sm.DELETE_ROLES:
        k.delete_role_deployments(world.namespace, world.name)
    elif action.kind == sm.PATCH:
        regime = measure.promotion_regime(world.status)
        for ns, name in a["targets"]:
            d = k.get_deployment(ns, name)
            if d is None:
                continue
            if b.original_template(d) is None:  # claimed before, but be safe: save first
                k.patch_deployment(ns, name, b.claim_patch(d, me))
                d = k.get_deployment(ns, name)
            engine = measure.target_of(d, spec.engine).engine or "reference"
            patch = b.promote_patch(d, lambda c: engines.render_lookahead(c, spec.lookahead, regime, engine),
                                    engines.is_engine_container, a["decision_id"])
            k.patch_deployment(ns, name, patch)
            kopf.event(body, type="Normal", reason="Promoted", message=f"lookahead on in {ns}/{name}")
    elif action.kind == sm.RESTORE:
        for ns, name in a["targets"]:
            d = k.get_deployment(ns, name)
            if d is not None and b.original_template(d) is not None:
                k.replace_deployment(b.restore_body(d))
                kopf.event(body, type="Warning", reason="Restored",
                           message=f"{ns}/{name} restored to its saved pod template")
    else:
        raise ValueError(f"unknown action {action.kind}")


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_S, sharp=False, id="reconcile")
def reconcile(body, spec, meta, patch: kopf.Patch, **_) -> None:
    """One tick. When a pass moves the policy to a phase that has work to do at once (its plan asks
    to look again within a second), run the next pass now rather than a tick later; the status is
    carried forward in memory and patched once at the end."""
    metrics.RECONCILES.inc()
    model, error = _parse_spec(spec)
    body = dict(body)
    original = dict(body.get("status") or {})
    status = original
    for _ in range(MAX_PASSES_PER_TICK):
        now = datetime.now(timezone.utc)
        phase_before = status.get("phase") or sm.PENDING
        try:
            world = observe({**body, "status": status}, model, error, now)
            plan = sm.reconcile(world)
            for action in plan.actions:
                execute(body, model, world, action)
        except Exception:
            metrics.RECONCILE_ERRORS.labels(phase_before).inc()
            _write_status(patch, original, status)
            raise
        for type_, reason, message in plan.events:
            kopf.event(body, type=type_, reason=reason, message=message)
        phase_after = plan.status.get("phase") or sm.PENDING
        if phase_after != phase_before:
            _record_transition(status, plan.status, phase_before, phase_after, now)
        status = plan.status
        if phase_after == phase_before or plan.requeue_after > 1.0:
            break
    metrics.record_phase(f"{meta['namespace']}/{meta['name']}", status.get("phase") or sm.PENDING)
    _write_status(patch, original, status)


MAX_PASSES_PER_TICK = 4


def _record_transition(old: dict, new: dict, before: str, after: str, now: datetime) -> None:
    metrics.TIME_IN_PHASE.labels(before).observe(measure.seconds_since((old.get("progress") or {}).get("phaseSince"), now))
    if after == sm.ROLLED_BACK:
        metrics.ROLLBACKS.labels((new.get("rollback") or {}).get("reason", "Decision")).inc()
    if new.get("decision") and before == sm.DECIDING:
        metrics.DECISIONS.labels(new["decision"]["action"]).inc()


def _write_status(patch: kopf.Patch, original: dict, status: dict) -> None:
    """Patch the keys that changed. Nulls inside values are dropped first: the apiserver does not
    store them, so keeping them would make every tick look like a change."""
    for key, value in status.items():
        value = _drop_none(value) if value is not None else None
        if original.get(key) != value:
            patch.status[key] = value


def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


@kopf.on.delete(GROUP, VERSION, PLURAL, id="cleanup")
def cleanup(body, meta, **_) -> None:
    """Deleting a policy removes its canary, control and load Jobs. The fleet is left as the policy
    left it, except mid-rollout (Promoting or Guarding, not yet Succeeded): then promoted
    Deployments are restored to their saved templates, since no guard will watch them any more."""
    k = kube()
    name, namespace = meta["name"], meta["namespace"]
    me = f"{namespace}/{name}"
    phase = (body.get("status") or {}).get("phase")
    k.delete_load_jobs(namespace, name)
    k.delete_role_deployments(namespace, name)
    for t in (body.get("status") or {}).get("targets") or []:
        d = k.get_deployment(t["namespace"], t["name"])
        if d is None:
            continue
        ann = d["metadata"].get("annotations") or {}
        if ann.get(b.ANNOTATION_OWNER) != me:
            continue
        if ann.get(b.ANNOTATION_PROMOTED) and phase in (sm.PROMOTING, sm.GUARDING):
            k.replace_deployment(b.restore_body(d))
        elif ann.get(b.ANNOTATION_PROMOTED):
            # Succeeded: lookahead stays on; keep the saved template so it can still be put back by hand.
            k.patch_deployment(t["namespace"], t["name"], {"metadata": {"annotations": {b.ANNOTATION_OWNER: None}}})
        else:
            k.patch_deployment(t["namespace"], t["name"], b.release_patch())
    metrics.record_phase(me, None)
