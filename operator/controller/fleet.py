"""The fleet as the state machine sees it: a target Deployment's ownership, promotion and rollout
state (``world.Target``), read off the Deployment object. Pure functions of API objects."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lookahead_operator.controller import builders as b
from lookahead_operator import engines
from lookahead_operator.controller.world import Target
from lookahead_operator.api.names import ANNOTATION_ORIGINAL_TEMPLATE, ANNOTATION_OWNER, ANNOTATION_PROMOTED


def target_of(deployment: dict, spec_engine: Any) -> Target:
    meta = deployment["metadata"]
    ann = meta.get("annotations") or {}
    engine = getattr(spec_engine, "value", spec_engine)
    if engine in (None, "auto"):
        engine = engines.detect_engine(deployment["spec"]["template"])
    return Target(namespace=meta["namespace"], name=meta["name"], engine=engine,
                  owner=ann.get(ANNOTATION_OWNER), saved=bool(ann.get(ANNOTATION_ORIGINAL_TEMPLATE)),
                  promoted=ann.get(ANNOTATION_PROMOTED), rolled_out=deployment_ready(deployment),
                  rollout_failed=rollout_failed(deployment), replicas=b.fleet_replicas(deployment),
                  lent=b.lent_replicas(deployment))


def with_wave(target: Target, wave_deployment: dict | None) -> Target:
    """The target with what its wave Deployment (if any) shows: its replicas and whether they are
    rolled out and available."""
    if wave_deployment is None:
        return target
    return replace(target, wave_replicas=int((wave_deployment.get("spec") or {}).get("replicas") or 0),
                   wave_ready=deployment_ready(wave_deployment))


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


def pod_ready(pod: dict) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


#: The flag that caps concurrent requests, per engine, and its default when the flag is absent
#: (None: not known here; the decision then assumes a large engine).
_MAX_BATCH_FLAG = {"reference": ("--max-num-seqs", 32), "vllm": ("--max-num-seqs", None),
                   "sglang": ("--max-running-requests", None), "trtllm": ("--max_batch_size", None)}


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
