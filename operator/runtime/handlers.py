"""Kopf handlers: thin. The Kopf wiring around one reconcile pass.

    kopf run -m lookahead_operator.runtime.handlers --all-namespaces --liveness=http://0.0.0.0:8080/healthz

or, a namespaced install (the chart's ``watchNamespace``), watching and acting in one namespace::

    LOOKAHEAD_WATCH_NAMESPACE=team-a kopf run -m lookahead_operator.runtime.handlers --namespace=team-a ...

A pass: ``observe.observe`` reads the world from the watched caches (``cache``), the pure
``statemachine.reconcile`` returns the whole next status and the actions, ``actions.ACTIONS``
carries each out (one small idempotent function each), and ``write_status`` replaces the status
whole. Here: the indexes (the caches), a daemon per policy that sleeps for the plan's
``requeue_after`` or until something it waits on changes (``wake``, ``wake_on_deployment``; a
finished policy costs no periodic API request), and the finalizer (``statemachine.deletion_plan``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from datetime import datetime, timezone

import kopf
import kubernetes
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from lookahead_operator.controller import actions
from lookahead_operator.api import names as api
from lookahead_operator.kube import cache
from lookahead_operator.controller import conditions
from lookahead_operator import engines
from lookahead_operator.runtime import metrics, notify
from lookahead_operator.runtime.wakeups import Wakeups, pending_namespaces
from lookahead_operator.controller import observe, tenancy
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import Action, Observed
from lookahead_operator.api.names import FINALIZER, GROUP, PLURAL, VERSION
from lookahead_operator.controller.conditions import Fact
from lookahead_operator.kube.client import Kube, api_message
from lookahead_operator.api.policy import MAX_POLICY_NAME, NAME_TOO_LONG
from lookahead_operator.api.spec import LookaheadPolicySpec, spec_error
from lookahead_operator.api.status import ConditionType, LookaheadPolicyStatus, Phase

log = logging.getLogger("lookahead_operator")

MAX_PASSES = 4            # passes chained within one wake-up while phases move on at once
ERROR_BACKOFF_S = float(os.environ.get("LOOKAHEAD_ERROR_BACKOFF_SECONDS", "5"))
_kube: Kube | None = None
#: the daemons' wake-up events and what decides which a watch event sets (one for the operator)
wakeups = Wakeups()
try:  # decisions, rollbacks, failures to the chart's notification sinks (none: sends nothing)
    notifier = notify.from_env()
except ValueError as _exc:
    raise SystemExit(str(_exc)) from None


def kube() -> Kube:
    global _kube
    if _kube is None:
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()
        _kube = Kube(namespace=observe.WATCH_NAMESPACE)
    return _kube


class _NoDiffBase(kopf.DiffBaseStorage):
    """No "last handled" copy of anything. Kopf keeps one to tell creations and updates apart (the
    default deep-copies the whole body at every watch event of every watched kind, and writes it
    into an annotation of every new policy: one more PATCH and one more event each). No handler here
    reacts to a creation or an update: a policy has a daemon (woken by ``wake``) and a deletion
    handler; Deployments, Pods, Jobs and Namespaces only feed the caches. So every object reads as
    seen before and unchanged."""

    def build(self, *, body, extra_fields=None):
        return {}

    def fetch(self, *, body):
        return {}

    def store(self, *, body, patch, essence) -> None:
        return None


def peering_priority(pod_name: str) -> int:
    """A replica's Kopf peering priority, from its pod name: distinct per replica (28 bits of a
    hash). Kopf pauses an operator when it sees a peer of higher priority, and pauses every one
    of them when two share a priority -- the chart's identical replicas, all at the default 0,
    would all have frozen."""
    return int(hashlib.sha256(pod_name.encode()).hexdigest()[:7], 16) + 1


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    if observe.WATCH_NAMESPACE is not None:
        if settings.peering.clusterwide:
            # Kopf would watch policies everywhere while the operator may act in one namespace only
            raise kopf.PermanentError(
                f"{tenancy.WATCH_ENV}={observe.WATCH_NAMESPACE} (a namespaced install) but Kopf runs with "
                f"--all-namespaces: run `kopf run ... --namespace={observe.WATCH_NAMESPACE}` (the chart does), "
                f"or leave {tenancy.WATCH_ENV} empty for a cluster-wide operator")
        # Kopf's own cluster-scoped watches (Namespaces, CRDs) are not granted by a namespaced Role
        settings.scanning.disabled = True
        log.info("namespaced install: watching and acting in namespace %s only (%s); no GPU-pool capacity "
                 "check (Nodes are not readable)", observe.WATCH_NAMESPACE, tenancy.WATCH_WHERE)
    settings.persistence.finalizer = FINALIZER
    if os.environ.get("LOOKAHEAD_PEERING_PRIORITY"):
        settings.peering.priority = int(os.environ["LOOKAHEAD_PEERING_PRIORITY"])
    elif settings.peering.priority == 0 and os.environ.get("POD_NAME"):
        settings.peering.priority = peering_priority(os.environ["POD_NAME"])
    # A replica that dies is given up on after this long, and a paused one takes over (Kopf's
    # default is 60 s; each replica refreshes its record 5-10 s before it expires).
    settings.peering.lifetime = int(os.environ.get("LOOKAHEAD_PEERING_LIFETIME", "20"))
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = _NoDiffBase()
    # Only our own Pods and load Jobs are watched: the API server filters them (Kopf's label filters
    # on the indexes below are client-side: every Pod of the cluster would be sent and processed).
    settings.watching.label_selectors["pods"] = api.LABEL_POLICY
    settings.watching.label_selectors["batch", "v1", "jobs"] = f"{api.LABEL_ROLE}=loadgen"
    settings.posting.level = logging.WARNING  # our own events say what happened; Kopf's would repeat it
    log.setLevel(os.environ.get("LOOKAHEAD_LOG_LEVEL", "INFO"))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # the kubelet's probes every few seconds would bury the rollout in `kubectl logs`
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
    settings.watching.server_timeout = 120
    # Kopf's executor runs only the (sync) deletion handler now: the indexes and events are async.
    settings.execution.max_workers = int(os.environ.get("LOOKAHEAD_MAX_WORKERS", "4"))
    kube()
    port = int(os.environ.get("LOOKAHEAD_METRICS_PORT", "9100"))
    if port:
        metrics.serve(port, os.environ.get("LOOKAHEAD_METRICS_ADDR", "0.0.0.0"))


PASS_THREADS = int(os.environ.get("LOOKAHEAD_PASS_THREADS", "16"))


@kopf.on.startup()
async def threads(**_) -> None:
    """Passes run in threads (the Kubernetes client blocks). They wait on the API server and
    Prometheus most of the time; a few more than the cores keep both busy when hundreds of policies
    are applied at once, and no more: every thread is memory (its stack, its malloc arena) and
    contention for the GIL."""
    from concurrent.futures import ThreadPoolExecutor

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(PASS_THREADS, thread_name_prefix="pass"))


@kopf.on.probe(id="reconciles")
def probe(**_) -> float:
    return metrics.RECONCILES._value.get()


# --- watched caches (reads come from these, not from list calls) -------------------------------------

# (async: Kopf runs a sync handler in a thread, once per watch event of every object)

async def namespace_labels(name, labels, **_):
    return {name: dict(labels)}


if observe.WATCH_NAMESPACE is None:  # (a namespaced install may not watch Namespaces: no namespace selector)
    namespace_labels = kopf.index("namespaces")(namespace_labels)


@kopf.index("apps", "v1", "deployments")
async def deployments_by_namespace(namespace, body, **_):
    return {namespace: cache.slim_deployment(body)}


@kopf.index("pods", labels={api.LABEL_POLICY: kopf.PRESENT})
async def pods_by_policy(labels, body, **_):
    return {(labels.get(api.LABEL_POLICY_NAMESPACE), labels.get(api.LABEL_POLICY)): cache.slim_pod(body)}


@kopf.index("batch", "v1", "jobs", labels={api.LABEL_ROLE: "loadgen"})
async def jobs_by_policy(labels, body, **_):
    return {(labels.get(api.LABEL_POLICY_NAMESPACE), labels.get(api.LABEL_POLICY)): cache.slim_job(body)}


# --- scheduling: a daemon per policy, woken by changes -------------------------------------------------

#: how long a daemon waits for a newer version of its policy (``Wakeups.wait_for_newer``) before
#: it tries again anyway
STALE_WAIT_S = 2.0


@kopf.on.event(GROUP, VERSION, PLURAL)
async def wake(meta, **_) -> None:
    """A change of the spec or of a gate annotation wakes the policy's daemon at once (status
    writes, ours included, do not); so does any newer version of a policy whose daemon waits for one."""
    wakeups.policy_event(meta)


@kopf.on.event("apps", "v1", "deployments")
async def wake_on_deployment(meta, **_) -> None:
    """A canary/control or a claimed target changed (created, ready, rolled out, failed): wake its
    policy; any other Deployment may be a new target for a policy still looking for its fleet in
    that namespace."""
    wakeups.deployment_event(meta)


async def _sleep(wake_event: asyncio.Event, stopped, timeout: float | None) -> None:
    waiters = [asyncio.ensure_future(wake_event.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=30.0)
async def run(stopped, body, meta, deployments_by_namespace, pods_by_policy, jobs_by_policy,
              namespace_labels=None, **_) -> None:
    """One policy's daemon: a pass whenever something it waits on changes, or its plan's time has
    come. Between passes it holds nothing of the policy but the resourceVersions its own status
    writes replaced (the live body is Kopf's; hundreds of sleeping daemons must not each keep a
    copy)."""
    uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]
    key = f"{namespace}/{name}"
    wake_event = wakeups.register(key, uid)
    indexes = (namespace_labels, deployments_by_namespace, pods_by_policy, jobs_by_policy)
    superseded: frozenset[str] = frozenset()   # resourceVersions our own status writes replaced
    first = True
    stale_since: float | None = None           # waiting since then for the watch to bring a newer version
    loop = asyncio.get_running_loop()
    try:
        while not stopped:
            wake_event.clear()
            live = body["metadata"]            # (Kopf replaces the live body whole on each event)
            if live.get("deletionTimestamp"):
                break
            seen_rv = live.get("resourceVersion")
            fresh = None
            if first and FINALIZER not in (live.get("finalizers") or []) or seen_rv in superseded:
                # Kopf puts its finalizer on a new policy by a PATCH at its first event, as this daemon
                # starts; or our own status write has not come back through the watch yet. A pass on
                # the version before either would only conflict: wait for the next one (bounded).
                stale_since = stale_since if stale_since is not None else loop.time()
                left = STALE_WAIT_S - (loop.time() - stale_since)
                if left > 0:
                    wakeups.wait_for_newer(uid, seen_rv)
                    await _sleep(wake_event, stopped, left)
                    continue
                if seen_rv in superseded:      # the watch lags that much: read the policy itself
                    fresh = await asyncio.to_thread(kube().get_policy, namespace, name)
                    if fresh is None:
                        break
            elif superseded:
                superseded = frozenset()       # the watch has caught up with our writes
            first, stale_since = False, None
            try:
                requeue, wrote, conflict = await _pass(namespace, name, fresh or body, indexes)
                superseded |= wrote
                if conflict:                   # the policy changed under us: re-plan on the version the watch brings
                    if body["metadata"].get("resourceVersion") != seen_rv:
                        requeue = 0            # (it came while the pass ran)
                    else:
                        wakeups.wait_for_newer(uid, seen_rv)
                        requeue = STALE_WAIT_S
            except Exception:  # noqa: BLE001 - the API or a bug: log, back off, try again
                log.exception("reconcile of %s failed; retrying in %ss", key, ERROR_BACKOFF_S)
                requeue = ERROR_BACKOFF_S
            if stopped:
                break
            if requeue == 0:
                continue
            await _sleep(wake_event, stopped, requeue)
    finally:
        wakeups.forget(key, uid)


async def _pass(namespace: str, name: str, body, indexes: tuple) -> tuple[float | None, frozenset[str], bool]:
    """Parse the policy, copy what it may read from the caches (in the event loop, where Kopf
    updates them), and run ``reconcile_once`` in a thread."""
    raw = cache.cached(body)
    spec, error = parse_spec(raw)
    status = parse_status(raw)
    snap = cache.Snapshot.of(namespace, name, spec, status.targets, *indexes)
    try:
        requeue, wrote, conflict = await asyncio.to_thread(reconcile_once, raw, spec, error, status, snap)
    except Exception:
        metrics.RECONCILE_ERRORS.labels(status.phase).inc()   # (a refused action is counted where it is)
        raise
    return requeue, wrote[0] if wrote is not None else frozenset(), conflict


# --- one reconcile --------------------------------------------------------------------------------

def parse_spec(body: dict) -> tuple[LookaheadPolicySpec | None, str | None]:
    """The spec, parsed once (``LookaheadPolicySpec.parse_stored``: fields of a newer CRD are
    ignored, and logged once), or why it cannot be acted on (naming the field)."""
    meta = body["metadata"]
    if len(meta["name"]) > MAX_POLICY_NAME:
        return None, NAME_TOO_LONG
    try:
        spec, ignored = LookaheadPolicySpec.parse_stored(body.get("spec"))
    except ValidationError as exc:
        return None, spec_error(exc)
    if ignored and _first_sighting((meta.get("uid"), tuple(ignored))):
        log.warning("%s/%s: ignoring %s, unknown to this operator version (a newer CRD?)",
                    meta.get("namespace"), meta.get("name"), ", ".join(ignored))
    return spec, None


#: (policy uid, ignored fields) already logged, least recently seen first: bounded (an operator
#: that runs for months sees policies come and go), so one long unseen may be logged once more
_IGNORED_FIELDS_LOGGED: "OrderedDict[tuple, None]" = OrderedDict()
_IGNORED_FIELDS_MAX = 1024
_IGNORED_FIELDS_LOCK = threading.Lock()   # passes parse in the event loop, the finalizer in Kopf's executor


def _first_sighting(key: tuple) -> bool:
    """Whether ``key`` is new to ``_IGNORED_FIELDS_LOGGED``, which then remembers it as the most
    recent of at most ``_IGNORED_FIELDS_MAX`` keys."""
    with _IGNORED_FIELDS_LOCK:
        if key in _IGNORED_FIELDS_LOGGED:
            _IGNORED_FIELDS_LOGGED.move_to_end(key)
            return False
        _IGNORED_FIELDS_LOGGED[key] = None
        if len(_IGNORED_FIELDS_LOGGED) > _IGNORED_FIELDS_MAX:
            _IGNORED_FIELDS_LOGGED.popitem(last=False)
        return True


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
                   snap: cache.Snapshot) -> tuple[float | None, tuple[frozenset, dict] | None, bool]:
    """Passes over one policy until its phase settles, reading from the watched caches; the status
    is written after each pass that changed it. Returns (seconds until the next pass, or None to wait
    for a change; the last object written, if any; whether a status write conflicted with a newer
    version of the policy)."""
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
        world = observe.observe(view, body, spec, error, status, now)
        plan = sm.reconcile(world)
        failure = _carry_out(actions.Ctx(view, body, spec, world), plan.actions)
        if failure is not None:
            metrics.RECONCILE_ERRORS.labels(status.phase).inc()
            log.warning("%s: %s", key, failure)
            status = _with_fact(status, ConditionType.Reconciled, Fact(False, "ActionFailed", failure), world)
            out = _write(k, body, status)
            if out is not None:
                superseded.add(out[0])
                body = out[1]
            return ERROR_BACKOFF_S, _last_written(superseded, body), False
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
                return None, _last_written(superseded, body), True
            raise
        if out is not None:
            superseded.add(out[0])
            body = out[1]
        if moved:  # the operator's log tells the rollout as `kubectl logs` readers expect
            log.info("%s: phase %s -> %s", key, world.status.phase, status.phase)
        for type_, reason, message in plan.events:  # once what they tell is on record
            actions.post_event(k, body, type_, reason, message)
        notifier.submit(notify.notices(meta["namespace"], meta["name"], world.status, status, now.isoformat()))
        log.debug("%s: pass %s -> %s in %.3fs, next in %s", key, world.status.phase, status.phase,
                  (_now_precise() - t_pass), requeue)
        if not moved or requeue is None or requeue > 1.0:
            break
    _note_pending(key, spec, status, snap)
    metrics.record_policy(key, status)
    return requeue, _last_written(superseded, body), False


def _carry_out(ctx: actions.Ctx, plan: list[Action]) -> str | None:
    """Carry out a plan's actions in order; at the first that fails (the API, an engine's adapter,
    a disappeared target), stop and say which and why."""
    for action in plan:
        try:
            actions.ACTIONS[action.kind](ctx, action)
        except (ApiException, engines.EngineError, ValueError, OSError) as exc:
            return f"{action.kind} failed: {api_message(exc)}"
    return None


def _last_written(superseded: set[str], body: dict) -> tuple[frozenset, dict] | None:
    """What ``reconcile_once`` returns of its writes: the resourceVersions they replaced and the
    last object written, or None when it wrote nothing."""
    return (frozenset(superseded), body) if superseded else None


def _note_pending(key: str, spec: LookaheadPolicySpec | None, status: LookaheadPolicyStatus,
                  snap: cache.Snapshot) -> None:
    """A policy still in Pending waits for its targets: a new Deployment in the namespaces it
    searches (any, for a namespace selector) wakes it."""
    if status.phase == Phase.Pending:
        wakeups.set_pending(key, pending_namespaces(spec, snap.deployments))
    else:
        wakeups.not_pending(key)


def _write(k: Kube, body: dict, status: LookaheadPolicyStatus) -> tuple[str, dict] | None:
    before = body["metadata"].get("resourceVersion")
    out = write_status(k, body, status)
    return (before, out) if out is not body else None


def _with_fact(status: LookaheadPolicyStatus, type_: ConditionType, fact: Fact, world: Observed):
    out = status.model_copy(deep=True)
    out.conditions = conditions.derive(status.conditions, {type_: fact}, status.phase, status.message or "",
                                       world.generation, world.now)
    return out


def write_status(k: Kube, body: dict, status: LookaheadPolicyStatus) -> dict:
    """Replace the status whole when it changed (optimistic concurrency on resourceVersion)."""
    new = status.to_dict()
    if new == (body.get("status") or {}):
        return body
    return k.replace_policy_status({**body, "status": new})


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
    world = Observed(now=_now(), name=name, namespace=namespace, generation=int(meta.get("generation", 1)),
                        spec=spec, status=status)
    known = observe.known_targets(k, status, spec.engine if spec else None)
    if spec is not None:  # and whatever matches now (a claim may have landed after the last status write)
        keys = {t.key for t in known}
        namespaces = k.target_namespaces(namespace, spec.targets.namespace_selector, spec.targets.namespaces)
        known += [t for t in (observe.target_of(d, spec.engine) for d in k.deployments(namespaces, spec.targets.selector))
                  if t.key not in keys]
    world.targets = known
    ctx = actions.Ctx(k, body, spec, world)
    for action in sm.deletion_plan(status, world.targets, world.key):
        actions.ACTIONS[action.kind](ctx, action)
    metrics.record_policy(world.key, None)
