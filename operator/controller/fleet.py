"""The fleet as the state machine sees it: a target Deployment's ownership, promotion and rollout
state (``world.Target``), read off the Deployment object. Pure functions of API objects."""

from __future__ import annotations

import statistics
from dataclasses import replace
from datetime import datetime
from typing import Any

from lookahead_operator.controller import builders as b
from lookahead_operator import engines
from lookahead_operator.controller.world import LoadBudget, Target
from lookahead_operator.api.names import ANNOTATION_ORIGINAL_TEMPLATE, ANNOTATION_OWNER, ANNOTATION_PROMOTED


def target_of(deployment: dict, spec_engine: Any) -> Target:
    meta = deployment["metadata"]
    ann = meta.get("annotations") or {}
    engine = getattr(spec_engine, "value", spec_engine)
    if engine in (None, "auto"):
        engine = engines.detect_engine(deployment["spec"]["template"])
    return Target(namespace=meta["namespace"], name=meta["name"], engine=engine, load_budget=load_budget_of(deployment),
                  owner=ann.get(ANNOTATION_OWNER), owned_by=owned_by(deployment),
                  saved=bool(ann.get(ANNOTATION_ORIGINAL_TEMPLATE)),
                  promoted=ann.get(ANNOTATION_PROMOTED), rolled_out=deployment_ready(deployment),
                  rollout_failed=rollout_failed(deployment), replicas=b.fleet_replicas(deployment),
                  lent=b.lent_replicas(deployment), carved=b.carved_replicas(deployment), **_strategy(deployment))


def _strategy(deployment: dict) -> dict:
    strategy = (deployment.get("spec") or {}).get("strategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    return {"recreate": strategy.get("type") == "Recreate",
            "max_surge": str(rolling.get("maxSurge", "25%")), "max_unavailable": str(rolling.get("maxUnavailable", "25%"))}


def _resolve(value: str, replicas: int, round_up: bool) -> int:
    if value.endswith("%"):
        share = int(value[:-1]) * replicas
        return -(-share // 100) if round_up else share // 100
    return int(value)


def rollout_unavailable(t: Target, replicas: int) -> int:
    """How many of its ``replicas`` the target's own rollout may take down before their successors
    are up, as the Deployment controller resolves its strategy (maxSurge rounded up, maxUnavailable
    down, 1 when both come to 0; Recreate: all). 0 means every step of its rollout needs a spare
    pod's worth of capacity: on a full GPU pool it never progresses."""
    if t.recreate:
        return replicas
    try:
        surge, unavailable = _resolve(t.max_surge, replicas, True), _resolve(t.max_unavailable, replicas, False)
    except ValueError:
        return 0
    return 1 if surge == 0 and unavailable == 0 else unavailable


def owned_by(deployment: dict) -> str | None:
    """Who else owns the Deployment, in words (``InferenceService/llama (serving.kserve.io/v1beta1)``):
    its controller owner reference (a KServe InferenceService, an Argo Rollout through
    ``workloadRef``, a LeaderWorkerSet), else its first owner reference; ``None`` when it has
    none. Such an owner puts back the template it wants, reverting what the operator writes."""
    refs = [r for r in deployment["metadata"].get("ownerReferences") or [] if isinstance(r, dict)]
    if not refs:
        return None
    ref = next((r for r in refs if r.get("controller")), refs[0])
    return f"{ref.get('kind') or '?'}/{ref.get('name') or '?'} ({ref.get('apiVersion') or '?'})"


def with_wave(target: Target, wave_deployment: dict | None) -> Target:
    """The target with what its wave Deployment (if any) shows: its replicas and whether they are
    rolled out and available."""
    if wave_deployment is None:
        return target
    return replace(target, wave_replicas=int((wave_deployment.get("spec") or {}).get("replicas") or 0),
                   wave_ready=deployment_ready(wave_deployment))


#: Kubernetes' defaults for a probe's fields (core/v1 Probe).
_PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "failureThreshold": 3}
#: Kubernetes' default spec.progressDeadlineSeconds of a Deployment.
PROGRESS_DEADLINE_DEFAULT_S = 600.0


def probe_budget_s(probe: dict) -> float:
    """How long a probe gives a starting container: initialDelaySeconds + failureThreshold x
    periodSeconds, each with Kubernetes' default when unset (0, 3, 10)."""
    def field_(name: str) -> int:
        value = probe.get(name)
        return _PROBE_DEFAULTS[name] if value is None else max(0, int(value))
    return float(field_("initialDelaySeconds") + field_("failureThreshold") * field_("periodSeconds"))


def load_budget_of(deployment: dict) -> LoadBudget:
    """How long the Deployment itself lets its pods take to load (``world.LoadBudget``): its
    engine container's startupProbe budget (``probe_budget_s``: the kubelet restarts the container
    past it), or, without one, the larger of its readinessProbe's and livenessProbe's (the liveness
    probe's initialDelaySeconds is how older manifests give a model its load time); and its
    spec.progressDeadlineSeconds (the Deployment controller's own bound on a pod that makes no
    progress). Measured load times come from pods (``with_load_time``)."""
    spec = deployment.get("spec") or {}
    progress = spec.get("progressDeadlineSeconds")
    budget = LoadBudget(progress_deadline_s=PROGRESS_DEADLINE_DEFAULT_S if progress is None else float(progress))
    template = spec.get("template") or {}
    try:
        container = template["spec"]["containers"][b.engine_container_index(template, engines.is_engine_container)]
    except (KeyError, IndexError, ValueError):
        return budget
    if container.get("startupProbe"):
        return replace(budget, probe_s=probe_budget_s(container["startupProbe"]), probe="startupProbe")
    probes = [(probe_budget_s(container[p]), p) for p in ("readinessProbe", "livenessProbe") if container.get(p)]
    if not probes:
        return budget
    seconds, which = max(probes)
    return replace(budget, probe_s=seconds, probe=which)


def _time(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def pod_load_s(pod: dict) -> float | None:
    """How long a ready pod took to become ready: its Ready condition's lastTransitionTime minus
    when it started, its status.startTime (image pulls and init containers count, as they will for
    a new pod), or its engine container's state.running.startedAt once that container restarted
    (the load that counts is the one since). None: not ready, being deleted, or no times."""
    if (pod.get("metadata") or {}).get("deletionTimestamp") or not pod_ready(pod):
        return None
    status = pod.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    start = _time(status.get("startTime"))
    try:
        name = pod["spec"]["containers"][b.engine_container_index(pod, engines.is_engine_container)].get("name")
    except (KeyError, IndexError, ValueError):
        name = None
    engine = next((c for c in status.get("containerStatuses") or [] if c.get("name") == name), {})
    if engine.get("restartCount"):
        start = _time(((engine.get("state") or {}).get("running") or {}).get("startedAt"))
    end = _time(ready.get("lastTransitionTime"))
    if start is None or end is None or end < start:
        return None
    return (end - start).total_seconds()


def measured_load_s(pods: list[dict]) -> float | None:
    """The load time of a target's current pods (``pod_load_s``): the median over its ready pods
    (a pod whose readiness flapped later shows its last transition, which would read as a load as
    long as its age; the median leaves such a minority out). None: no ready pod to read."""
    loads = [s for s in (pod_load_s(p) for p in pods) if s is not None]
    return statistics.median_low(loads) if loads else None


def with_load_time(target: Target, pods: list[dict]) -> Target:
    """The target with the measured load time of its current pods (``measured_load_s``)."""
    measured = measured_load_s(pods)
    if measured is None:
        return target
    return replace(target, load_budget=replace(target.load_budget, measured_s=measured))


def deployment_ready(d: dict) -> bool:
    """The latest template is rolled out: observed, updated and ready on every replica."""
    spec, status = d.get("spec") or {}, d.get("status") or {}
    want = int(spec.get("replicas", 1) or 0)
    return (int(status.get("observedGeneration") or 0) >= int(d["metadata"].get("generation") or 0)
            and int(status.get("updatedReplicas") or 0) >= want
            and int(status.get("readyReplicas") or 0) >= want
            and int(status.get("replicas") or 0) == want)


def rollout_failed(d: dict) -> str | None:
    """The Deployment controller's own verdict on the latest rollout: its Progressing condition
    with reason ProgressDeadlineExceeded (for the generation it has observed), in words."""
    status = d.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(d["metadata"].get("generation") or 0):
        return None
    for c in status.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("status") == "False" \
                and c.get("reason") == "ProgressDeadlineExceeded":
            return c.get("message") or "ProgressDeadlineExceeded"
    return None


def newest_promoted(targets: list[Target]) -> Target | None:
    """The target promoted last (waves promote targets in their stable order)."""
    promoted = sorted((t for t in targets if t.promoted), key=lambda t: t.key)
    return promoted[-1] if promoted else None


def unschedulable(pods: list[dict]) -> str | None:
    """The scheduler's reason the first of ``pods`` it cannot place is not placed (its PodScheduled
    condition False with reason Unschedulable: "0/1 nodes are available: 1 Insufficient
    nvidia.com/gpu."), else None. Pods being deleted do not count."""
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return c.get("message") or "Unschedulable"
    return None


def scheduled(pods: list[dict]) -> bool:
    """The scheduler placed every one of ``pods`` (and there is at least one)."""
    return bool(pods) and all(any(c.get("type") == "PodScheduled" and c.get("status") == "True"
                                  for c in (p.get("status") or {}).get("conditions") or []) for p in pods)


def _extended(name: str) -> bool:
    """An extended resource (``nvidia.com/gpu``, ``amd.com/gpu``, ``google.com/tpu``): a name with a
    domain outside kubernetes.io, as Kubernetes defines it (what a device plugin advertises)."""
    domain = name.split("/", 1)[0] if "/" in name else ""
    return bool(domain) and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io")) \
        and not name.startswith("requests.")


def accelerators(template: dict) -> dict[str, int]:
    """The extended resources one pod of ``template`` takes (GPUs, TPUs), summed over its containers:
    their requests, else their limits (an extended resource's request is its limit)."""
    out: dict[str, int] = {}
    for c in (template.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for name, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            if _extended(name):
                try:
                    out[name] = out.get(name, 0) + int(str(value))
                except ValueError:
                    continue
    return out


def pool_room(nodes: list[dict], pods: list[dict], template: dict) -> dict[str, tuple[int, int]]:
    """For each accelerator ``template``'s pods take: (free, allocatable) over the nodes they could
    run on (schedulable, matching its ``nodeSelector``, advertising it), free being allocatable
    less what placed pods there request. Taints and affinity are the scheduler's to weigh: this is
    the pool's size, not a placement."""
    wanted = accelerators(template)
    selector = (template.get("spec") or {}).get("nodeSelector") or {}
    pool = {}
    for n in nodes:
        labels = (n.get("metadata") or {}).get("labels") or {}
        if (n.get("spec") or {}).get("unschedulable") or any(labels.get(k) != v for k, v in selector.items()):
            continue
        pool[n["metadata"]["name"]] = (n.get("status") or {}).get("allocatable") or {}
    out = {}
    for name in wanted:
        total = sum(_count(a.get(name)) for a in pool.values())
        used = sum(accelerators({"spec": p.get("spec") or {}}).get(name, 0) for p in pods
                   if (p.get("spec") or {}).get("nodeName") in pool)
        out[name] = (max(0, total - used), total)
    return out


def _count(value) -> int:
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def pod_ready(pod: dict) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


#: The flag that caps concurrent requests, per engine, and its default when the flag is absent
#: (None: not known here; the decision then assumes a large engine).
_MAX_BATCH_FLAG = {"reference": ("--max-num-seqs", 32), "vllm": ("--max-num-seqs", None),
                   "sglang": ("--max-running-requests", None)}


def engine_max_batch(deployment: dict | None, engine: str | None) -> int | None:
    """The most requests the target's engine runs at once (the top of the regime ranges): lookahead
    is on everywhere only when it was measured winning up to here."""
    if deployment is None:
        return None
    flag, default = _MAX_BATCH_FLAG.get(engine or "reference", (None, None))
    if flag is None:
        return None
    template = deployment["spec"]["template"]
    container = template["spec"]["containers"][b.engine_container_index(template, engines.is_engine_container)]
    try:
        value = engines.container_flag(container, flag)
        return int(value) if value is not None else default
    except (engines.EngineError, ValueError):
        return default
