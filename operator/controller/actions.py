"""The actions a plan asks for: one small idempotent function each (``ACTIONS``), reading through
a ``cache.CachedView`` (or the API client) and writing through the API; and Events, posted off the
critical path."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from dataclasses import dataclass

from kubernetes.client.rest import ApiException

from lookahead_operator.controller import builders as b
from lookahead_operator.kube import cache
from lookahead_operator import engines
from lookahead_operator.controller import fleet
from lookahead_operator.controller import livesplit, loadjobs
from lookahead_operator.controller.roles import candidate_transform, role_transform
from lookahead_operator.measurement import measure
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import Action, ActionKind, Observed, Target
from lookahead_operator.kube.client import Kube, api_message
from lookahead_operator.api.names import ANNOTATION_OWNER, ANNOTATION_PROMOTED, ROLES
from lookahead_operator.api.spec import CanaryCapacity, LoadMode, LoadSplit, LookaheadPolicySpec

log = logging.getLogger("lookahead_operator")

try:
    #: The chart's podMonitor.labels (``builders.chart_pod_monitor_labels``): on every PodMonitor.
    POD_MONITOR_LABELS = b.chart_pod_monitor_labels(os.environ.get(b.POD_MONITOR_LABELS_ENV))
except ValueError as _exc:
    raise SystemExit(str(_exc)) from None

#: How many times a whole-object write (promote, restore) re-reads and retries after a 409 (the
#: Deployment changed between the read and the write: a status update, a scale, or a user's edit,
#: which the re-read then finds).
WRITE_ATTEMPTS = 3


@dataclass
class Ctx:
    k: Kube
    body: dict                        # the policy object
    spec: LookaheadPolicySpec | None
    world: Observed

    @property
    def me(self) -> str:
        return self.world.key


@contextlib.contextmanager
def _unless_gone():
    """A target deleted under us (its namespace being deleted, say) has nothing left to claim,
    promote, restore or release: a 404 on it is done, not a failed pass (a failed pass would keep
    the policy's finalizer, and the namespace, forever). The cache may still list it."""
    try:
        yield
    except ApiException as exc:
        if exc.status != 404:
            raise


def _owned_elsewhere(c: Ctx, d: dict, doing: str) -> bool:
    """A Deployment another controller owns (``fleet.owned_by``: a KServe InferenceService, an Argo
    Rollout, a LeaderWorkerSet) is never claimed or promoted: its owner would revert the write.
    (Pending refuses such targets before any claim; this holds on every other path too.)"""
    owner = fleet.owned_by(d)
    if owner:
        log.warning("%s: not %s %s/%s: it is managed by %s", c.me, doing, d["metadata"]["namespace"],
                    d["metadata"]["name"], owner)
    return owner is not None


def _claim(c: Ctx, a: Action) -> None:
    for ns, name in a.targets:
        d = c.k.fresh_deployment(ns, name)  # the template saved must be the latest
        if d is not None and _owned_elsewhere(c, d, "claiming"):
            continue
        if d is not None:
            with _unless_gone():
                c.k.patch_deployment(ns, name, b.claim_patch(d, c.me))


def _release(c: Ctx, a: Action) -> None:
    for ns, name in a.targets:
        d = c.k.get_deployment(ns, name)
        if d is not None and b.carved_replicas(d):
            d = c.k.fresh_deployment(ns, name)  # (what it gives back is read fresh: never twice)
        ann = (d or {}).get("metadata", {}).get("annotations") or {}
        # Never drop the saved template of a Deployment that is still promoted.
        if d is not None and ann.get(ANNOTATION_OWNER) == c.me and not ann.get(ANNOTATION_PROMOTED):
            with _unless_gone():
                c.k.patch_deployment(ns, name, b.let_go_patch(d))


def _leave(c: Ctx, a: Action) -> None:
    """A target its user edited: drop every mark of ours (annotations only, never the template), so
    nothing of this policy, nor a later claim, can put an outdated template back over the edit."""
    for ns, name in a.targets:
        d = c.k.fresh_deployment(ns, name)  # (fresh: a lagging cache would repeat the release and its event)
        if d is not None and (d["metadata"].get("annotations") or {}).get(ANNOTATION_OWNER) == c.me:
            _let_go(c, d)


def _let_go(c: Ctx, d: dict) -> None:
    ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
    with _unless_gone():
        # (its template is the user's; the replicas it lent to a wave Deployment come back)
        c.k.patch_deployment(ns, name, b.let_go_patch(d))
        post_event(c.k, c.body, "Warning", "LeftToUser",
                   f"{ns}/{name}: its pod template was changed by someone else since the operator claimed it; the "
                   "user's change wins: released, and neither promoted nor restored by this policy")


def _disown(c: Ctx, a: Action) -> None:
    for ns, name in a.targets:
        d = c.k.get_deployment(ns, name)
        if d is not None and (d["metadata"].get("annotations") or {}).get(ANNOTATION_OWNER) == c.me:
            with _unless_gone():
                c.k.patch_deployment(ns, name, {"metadata": {"annotations": {ANNOTATION_OWNER: None}}})


def _ensure_roles(c: Ctx, a: Action) -> None:
    w = c.world
    roles = {r for r, present in w.roles_present.items() if present}
    if all(r in roles for r in ROLES):
        return
    source = sm.role_source(w)  # (never a target left to its user: its template is no longer the fleet's)
    d = c.k.get_deployment(*source.key)
    if d is None:
        raise ValueError(f"target {source.namespace}/{source.name} disappeared")
    engine = source.engine or "reference"
    replicas = a.replicas or c.spec.canary.replicas
    live = c.spec.load.mode == LoadMode.live
    gateway = live and c.spec.load.split == LoadSplit.gateway_api
    if gateway and w.live_backend is None:
        return  # the fleet's backend unread (observe said why): its selector must come off the arm pods first
    if live and not gateway and w.live_service is None:
        return  # no Service to join (observe said why; Preflight refuses it): arms that serve no one are not made
    if c.spec.canary.capacity == CanaryCapacity.carve_out and not b.carved_replicas(d):
        # their replicas out of the fleet first, saved on it in the same write: a full GPU pool
        # then has room for them, and every exit (DELETE_ROLES, RESTORE, RELEASE) gives them back
        pods = 2 * replicas
        d = c.k.fresh_deployment(*source.key)
        if d is None:
            raise ValueError(f"target {source.namespace}/{source.name} disappeared")
        if not b.carved_replicas(d):
            c.k.patch_deployment(*source.key, b.carve_patch(d, pods))
            post_event(c.k, c.body, "Normal", "CarvedOut",
                       f"{source.namespace}/{source.name}: {pods} of its replicas taken out for canary and control "
                       "(canary.capacity carveOut); given back when they go")
    serving = b.engine_container(d["spec"]["template"], engines.is_engine_container)  # by what it is, not position
    default_port = engines.listen_port(serving, engine)
    for role in ROLES:
        if role in roles:
            continue
        obj = b.build_role_deployment(d, c.body, role, replicas, role_transform(c.spec, role, engine),
                                      engines.is_engine_container, default_port=default_port)
        if gateway:  # split gatewayAPI: reached through their own backends only, never the fleet's
            obj = livesplit.gateway_arm_template(obj, w.live_backend)
        elif live:  # split service: their pods join the fleet's Service (its selector's labels back on them)
            obj = livesplit.live_service_template(obj, w.live_service, d)
        if c.k.create_if_absent(obj):
            post_event(c.k, c.body, "Normal", "Launched",
                   f"created {role} {obj['metadata']['namespace']}/{obj['metadata']['name']}")
    if c.k.has_pod_monitor_crd():
        labels = b.pod_monitor_labels(POD_MONITOR_LABELS, c.spec.analysis.prometheus.pod_monitor_labels)
        c.k.create_if_absent(b.build_pod_monitor(c.body, source.namespace, b.metrics_port_ref(serving, default_port),
                                                 labels=labels))


def _roles_namespace(w: Observed) -> str:
    """Where canary and control are (observed), else beside the target they are cloned from."""
    return w.roles_namespace or sm.role_source(w).namespace


def _template(c: Ctx, target: Target | None) -> dict | None:
    """A target's pod template (what its pods, and canary and control, were made from: the load
    finds the engine's port in them by it), ``None`` when it is gone."""
    d = c.k.get_deployment(*target.key) if target is not None else None
    return (d or {}).get("spec", {}).get("template")


def _ensure_load(c: Ctx, a: Action) -> None:
    w = c.world
    namespace = _roles_namespace(w)
    pods = {role: c.k.role_pods(namespace, w.namespace, w.name, role) for role in ROLES}
    for job in loadjobs.step_jobs(c.spec, c.body, namespace, a.step, a.run, a.batch_size, pods, a.until or w.now,
                                  w.now, _template(c, sm.role_source(w))):
        c.k.create_if_absent(job)


def _ensure_guard_load(c: Ctx, a: Action) -> None:
    w = c.world
    newest = fleet.newest_promoted(sm.in_play(w))  # never a target left to its user
    if newest is None:
        return
    control = c.k.role_pods(_roles_namespace(w), w.namespace, w.name, "control")
    # its pods as observe read them this pass (observe.guard_fleet_pods): not listed again
    for job in loadjobs.guard_jobs(c.spec, c.body, a.wave, a.run, a.batch_size, newest, w.guard_pods, control,
                                   _template(c, newest), _template(c, sm.role_source(w))):
        c.k.create_if_absent(job)


def _serve_control(c: Ctx, a: Action) -> None:
    """The control's pods join the fleet's Service: they get the labels of the selector of the
    target they were cloned from (which ``builders.build_role_deployment`` left off them), so the
    Service, which selects the fleet by those, sends them their share of production traffic while
    the guard compares on it. Pods that have them are not written."""
    w = c.world
    source = sm.role_source(w)
    d = c.k.get_deployment(*source.key) if source is not None else None
    if d is None:
        return
    for pod in c.k.role_pods(_roles_namespace(w), w.namespace, w.name, "control"):
        labels = b.serving_labels(d, pod)
        if labels is not None:
            c.k.label_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], labels)


def _delete_load(c: Ctx, a: Action) -> None:
    c.k.delete_load_jobs(c.world.namespace, c.world.name)


def _delete_roles(c: Ctx, a: Action) -> None:
    c.k.delete_role_deployments(c.world.namespace, c.world.name)
    for ns, name in a.targets:  # the replicas carved out of them for canary and control, back
        d = c.k.fresh_deployment(ns, name)
        patch = b.return_carved_patch(d) if d is not None else {}
        if patch:
            with _unless_gone():
                c.k.patch_deployment(ns, name, patch)
            back = b.carved_back(d)
            post_event(c.k, c.body, "Normal", "GivenBack",
                       f"{ns}/{name}: the {back} replicas taken out for canary and control given back" if back else
                       f"{ns}/{name}: its replica count was set by someone else since the carve-out "
                       f"({d['spec'].get('replicas')}): it stands, nothing added")


def _replace_checked(c: Ctx, ns: str, name: str, write, read=None) -> None:
    """Read the object fresh (``read(ns, name)``, a target Deployment by default) and ``write(d)``
    (a whole-object PUT carrying the resourceVersion read); on a 409 read again and retry
    (``WRITE_ATTEMPTS``). ``write`` returns nothing and decides from what it read, so every retry
    re-checks the object (a user's edit that raced the write is then seen and left alone). A 404
    (the object deleted under us, ``_unless_gone``) is done."""
    read = read or c.k.fresh_deployment
    for attempt in range(WRITE_ATTEMPTS):
        d = read(ns, name)
        if d is None:
            return
        try:
            with _unless_gone():
                write(d)
            return
        except ApiException as exc:
            if exc.status != 409 or attempt + 1 >= WRITE_ATTEMPTS:
                raise


def _promote(c: Ctx, a: Action) -> None:
    """Promote each target's pods of this wave (``a.pods``, aligned with ``a.targets``; none given:
    all of them). Whole: its template replaced wholesale with the saved original plus the engine
    change (``builders.promote_body``, a PUT with the resourceVersion read), the replicas it lent
    to a wave Deployment given back in the same write. In part: its wave Deployment runs that many
    replicas of the promoted template, then the target lends them (``builders.lend_body``: its
    ``spec.replicas`` that many lower, one PUT), so the fleet never has fewer pods than it had.
    Never merged onto whatever is live, never over a template its user edited (the next pass leaves
    that one to them), and a no-op on a target already promoted so with this decision."""
    regime = measure.promotion_regime(c.world.status)
    pods = dict(zip(a.targets, a.pods))
    no_spare = c.spec.canary.capacity == CanaryCapacity.carve_out

    def write(d: dict) -> None:
        ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
        if _owned_elsewhere(c, d, "promoting"):
            return
        if b.original_template(d) is None:  # claimed before, but be safe: save first
            c.k.patch_deployment(ns, name, b.claim_patch(d, c.me))
            d = c.k.fresh_deployment(ns, name)
            if d is None:
                return
        ann = d["metadata"].get("annotations") or {}
        if b.user_edited(d):
            log.warning("%s: not promoting %s/%s: its pod template was edited by its user", c.me, ns, name)
            return
        engine = fleet.target_of(d, c.spec.engine).engine or "reference"

        transform = candidate_transform(c.spec, engine, regime)  # the canary's change, with the regime

        want = pods.get((ns, name))
        total = b.fleet_replicas(d)
        if want is not None and 0 < want < total and no_spare:
            # a full pool (carveOut): its pods go first, then the wave's start in their place (the
            # fleet serves with fewer pods meanwhile; no wave ever needs a spare accelerator)
            if not (ann.get(ANNOTATION_PROMOTED) == a.decision_id and b.lent_replicas(d) == want):
                c.k.replace_deployment(b.lend_body(d, want, a.decision_id))
                post_event(c.k, c.body, "Normal", "Promoted",
                           f"lookahead on in {want} of {total} pods of {ns}/{name} (its pods first: carveOut)")
            _ensure_wave(c, d, want, transform, a.decision_id)
            return
        if want is not None and 0 < want < total:
            if not _ensure_wave(c, d, want, transform, a.decision_id):
                return  # its pods are starting: a later pass lends once they serve (their status wakes it)
            if ann.get(ANNOTATION_PROMOTED) == a.decision_id and b.lent_replicas(d) == want:
                return  # lent before (and not edited since)
            c.k.replace_deployment(b.lend_body(d, want, a.decision_id))
            post_event(c.k, c.body, "Normal", "Promoted", f"lookahead on in {want} of {total} pods of {ns}/{name}")
            return
        if ann.get(ANNOTATION_PROMOTED) == a.decision_id and ann.get(b.ANNOTATION_PROMOTED_TEMPLATE):
            return  # done before (and not edited since): nothing to write
        c.k.replace_deployment(b.promote_body(d, transform, engines.is_engine_container, a.decision_id))
        if no_spare and b.lent_replicas(d):
            # (a full pool: the wave Deployment's pods make room for the replicas it gave back)
            c.k.delete_wave_deployments(c.world.namespace, c.world.name, {(ns, name)})
        post_event(c.k, c.body, "Normal", "Promoted", f"lookahead on in {ns}/{name}")

    for ns, name in a.targets:
        _replace_checked(c, ns, name, write)


def _ensure_wave(c: Ctx, d: dict, pods: int, transform, decision_id: str) -> bool:
    """The target's wave Deployment with ``pods`` replicas of the promoted template of this decision:
    created, or its replicas set (a template of another decision is replaced whole). True once
    all of them are rolled out and available, so that the target lends replicas only to pods
    that already serve (the fleet never has fewer serving pods than before); False meanwhile,
    and while an old one is still being deleted (a later pass creates it)."""
    want = b.build_wave_deployment(d, c.body, pods, transform, engines.is_engine_container, decision_id)
    meta = want["metadata"]
    live = c.k.fresh_deployment(meta["namespace"], meta["name"])
    if live is None:
        c.k.create_if_absent(want)  # (a lagging cache that still lists it: a later pass creates it)
        return False
    if live["metadata"].get("deletionTimestamp"):
        return False
    if (live["metadata"].get("annotations") or {}).get(ANNOTATION_PROMOTED) != decision_id:
        body = {**want, "metadata": {**want["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]}}
        body["spec"] = {**want["spec"], "selector": live["spec"]["selector"]}  # (immutable)
        c.k.replace_deployment(body)
        return False
    if int(live["spec"].get("replicas") or 0) != pods:
        c.k.patch_deployment(meta["namespace"], meta["name"], {"spec": {"replicas": pods}})
        return False
    return fleet.deployment_ready(live)


def _delete_waves(c: Ctx, a: Action) -> None:
    c.k.delete_wave_deployments(c.world.namespace, c.world.name, set(a.targets) if a.targets else None)


def _restore(c: Ctx, a: Action) -> None:
    """Put each target's saved template back (a PUT with the resourceVersion read), unless its user
    edited it: then the user's template stays and only our marks go."""

    def write(d: dict) -> None:
        ns, name = d["metadata"]["namespace"], d["metadata"]["name"]
        if b.original_template(d) is None:
            return
        if b.user_edited(d):
            if (d["metadata"].get("annotations") or {}).get(ANNOTATION_OWNER) in (c.me, None):
                _let_go(c, d)
            return
        c.k.replace_deployment(b.restore_body(d))
        lent = b.lent_replicas(d)
        post_event(c.k, c.body, "Warning", "Restored", f"{ns}/{name} restored to its saved pod template"
                   + (f" and {b.fleet_replicas(d)} replicas ({lent} given back from its wave Deployment)"
                      if lent else ""))

    for ns, name in a.targets:
        _replace_checked(c, ns, name, write)


def _ensure_arm_backends(c: Ctx, a: Action) -> None:
    """``split: gatewayAPI``: each arm's own Service or InferencePool (``livesplit.arm_backends``),
    owned by the policy, beside the arm pods; nothing while the fleet's backend is unread."""
    w = c.world
    if w.live_backend is None or c.spec is None or c.spec.load.gateway_api is None:
        return
    for role, obj in livesplit.arm_backends(c.body, c.spec.load.gateway_api, _roles_namespace(w),
                                            w.live_backend).items():
        if c.k.create_if_absent(obj):
            post_event(c.k, c.body, "Normal", "Launched", f"created {role}'s {obj['kind']} "
                       f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")


def _split_route(c: Ctx, a: Action) -> None:
    """Re-weight the route's rule (``livesplit.gateway_split``: its backendRefs saved verbatim on
    the route in the same write), read fresh and written with ``_replace_checked`` (one PUT carrying
    that resourceVersion; a 409, the route changed since by a user or a gateway controller, reads
    it again and splits that). A route already split so is not written; a route gone is not split
    (the next pass reads it and the state machine decides)."""
    w, gw = c.world, c.spec.load.gateway_api if c.spec is not None else None
    if gw is None or a.route is None:
        return

    def write(route: dict) -> None:
        want = livesplit.gateway_split(route, c.body, gw, _roles_namespace(w), c.spec.load.live_percent or 0.0,
                                       w.live_backend)
        if livesplit.route_split_in_place(route, want):
            return
        c.k.replace_http_route(want.route)
        post_event(c.k, c.body, "Normal", "RouteSplit",
                   f"HTTPRoute {a.route[0]}/{a.route[1]} rule {want.rule_index}: the fleet's backendRef weight "
                   f"{want.weights.fleet}, canary and control {want.weights.arm} each "
                   f"({want.weights.share * 100:.4g}% each); its backendRefs as they were are saved on it")

    _replace_checked(c, *a.route, write, read=c.k.get_http_route)


def _restore_route(c: Ctx, a: Action) -> None:
    """Put the route's split rule back exactly (``livesplit.restore_route``: the saved backendRefs
    verbatim, the annotation removed), from the annotation on the route as read now (after an
    operator restart too), written with ``_replace_checked`` (the resourceVersion read, re-read on
    a 409). A route that is not split (restored before, never split) or gone is left alone. An
    annotation that cannot be read, or a split rule the user removed, cannot be put back: a Warning
    Event says so (what to restore by hand), and the exit goes on: nothing is retried forever."""
    if a.route is None:
        return
    ns, name = a.route

    def write(route: dict) -> None:
        if ((route.get("metadata") or {}).get("annotations") or {}).get(livesplit.ANNOTATION_ORIGINAL_BACKEND_REFS) \
                is None:
            return
        try:
            restored = livesplit.restore_route(route)
        except livesplit.LiveSplitError as exc:
            post_event(c.k, c.body, "Warning", "RouteNotRestored", f"{exc}")
            return
        c.k.replace_http_route(restored)
        post_event(c.k, c.body, "Normal", "RouteRestored",
                   f"HTTPRoute {ns}/{name}: the split rule's backendRefs restored as they were; the fleet's again")

    _replace_checked(c, ns, name, write, read=c.k.get_http_route)


def _delete_arm_backends(c: Ctx, a: Action) -> None:
    """The arms' own Services and InferencePools (by name, ``livesplit.arm_backend_name``), beside
    the arms, or in any target's namespace (deletion: the arms may be gone already)."""
    w = c.world
    namespaces = {ns for ns in [w.roles_namespace, *(t.namespace for t in w.targets)] if ns} or {w.namespace}
    for ns in sorted(namespaces):
        names = [livesplit.arm_backend_name(c.body, role, ns) for role in ROLES]
        if c.k.delete_arm_backends(ns, names, w.namespace, w.name):
            post_event(c.k, c.body, "Normal", "Deleted", f"deleted the arms' own backends in {ns}")


ACTIONS = {
    ActionKind.CLAIM: _claim,
    ActionKind.RELEASE: _release,
    ActionKind.DISOWN: _disown,
    ActionKind.ENSURE_ROLES: _ensure_roles,
    ActionKind.DELETE_ROLES: _delete_roles,
    ActionKind.ENSURE_LOAD: _ensure_load,
    ActionKind.ENSURE_GUARD_LOAD: _ensure_guard_load,
    ActionKind.SERVE_CONTROL: _serve_control,
    ActionKind.DELETE_LOAD: _delete_load,
    ActionKind.PROMOTE: _promote,
    ActionKind.DELETE_WAVES: _delete_waves,
    ActionKind.RESTORE: _restore,
    ActionKind.LEAVE: _leave,
    ActionKind.ENSURE_ARM_BACKENDS: _ensure_arm_backends,
    ActionKind.SPLIT_ROUTE: _split_route,
    ActionKind.RESTORE_ROUTE: _restore_route,
    ActionKind.DELETE_ARM_BACKENDS: _delete_arm_backends,
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
            log.warning("could not post event %s: %s", reason, api_message(exc))


def post_event(k: Kube, body: dict, type_: str, reason: str, message: str) -> None:
    """Post an Event off the critical path (a background thread posts them in order)."""
    global _poster
    if _poster is None or not _poster.is_alive():
        for i in range(4):  # a few in parallel: hundreds of policies starting at once post hundreds of events
            _poster = threading.Thread(target=_post_events, name=f"events-{i}", daemon=True)
            _poster.start()
    meta = body["metadata"]
    # every event is also a log line: `kubectl logs` of the operator tells the rollout (a phase
    # change is on the line before, handlers' "phase A -> B": not said twice)
    (log.warning if type_ == "Warning" else log.info)("%s/%s: %s: %s", meta.get("namespace"), meta["name"],
                                                          reason, sm.without_transition(message))
    ref = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
           "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")}}
    try:
        _events.put_nowait((k.k if isinstance(k, cache.CachedView) else k, ref, type_, reason, message))
    except queue.Full:
        log.warning("event queue full: dropped %s %s", reason, message[:200])
