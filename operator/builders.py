"""Pure builders: the objects the operator creates or patches, as plain dicts.

Nothing here talks to the API server. The handlers call these and send what they return.
The engine-specific part (which flags turn lookahead on or off) is a callable passed in from
``lookahead_operator.engines``, so one builder serves vLLM, SGLang and the reference engine.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Callable, Iterable

from .api import (  # noqa: F401 - the names builders put on objects (api.py owns them)
    ANNOTATION_ORIGINAL_TEMPLATE,
    ANNOTATION_OWNER,
    ANNOTATION_PROMOTED,
    ANNOTATION_SOURCE,
    GROUP,
    LABEL_DRIVES,
    LABEL_GENERATION,
    LABEL_MANAGED_BY,
    LABEL_POD,
    LABEL_POLICY,
    LABEL_POLICY_NAMESPACE,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_STEP,
    LABEL_TARGET,
    MANAGED_BY,
    ROLES,
)

PROMPTS_MOUNT = "/etc/lookahead/prompts"  # where a load Job mounts the policy's configMapRef prompts

ContainerTransform = Callable[[dict], dict]


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 name from parts; too-long names are cut and suffixed with a stable hash."""
    name = "-".join(p.strip("-").lower() for p in parts if p)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def policy_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def owned_name(policy_namespace: str | None, policy_name: str, namespace: str | None, *suffix: str) -> str:
    """The name of an object the policy creates in ``namespace``: ``lap-<policy>-<suffix>``. In
    another namespace than the policy's, two policies of the same name (from two namespaces) can
    target it, so the name also carries a short hash of the policy's namespace/name there."""
    parts = ["lap", policy_name]
    if policy_namespace and namespace and policy_namespace != namespace:
        parts.append(hashlib.sha256(policy_key(policy_namespace, policy_name).encode()).hexdigest()[:6])
    return dns_name(*parts, *suffix)


def role_deployment_name(policy_name: str, role: str, policy_namespace: str | None = None,
                         namespace: str | None = None) -> str:
    return owned_name(policy_namespace, policy_name, namespace, role)


def engine_container_index(template: dict, is_engine: Callable[[dict], bool]) -> int:
    """Index of the serving container in a pod template: the first one the engine adapter
    recognises, else the first container."""
    containers = template.get("spec", {}).get("containers") or []
    if not containers:
        raise ValueError("the target's pod template has no containers")
    for i, container in enumerate(containers):
        if is_engine(container):
            return i
    return 0


def _with_container(template: dict, index: int, transform: ContainerTransform) -> dict:
    out = copy.deepcopy(template)
    containers = out["spec"]["containers"]
    containers[index] = transform(copy.deepcopy(containers[index]))
    return out


def policy_labels(policy: dict) -> dict[str, str]:
    """The labels that identify a policy's objects (name and namespace)."""
    return {LABEL_POLICY: policy["metadata"]["name"], LABEL_POLICY_NAMESPACE: policy["metadata"]["namespace"]}


def role_labels(policy: dict, role: str, target_name: str, generation: int) -> dict[str, str]:
    return {
        **policy_labels(policy),
        LABEL_ROLE: role,
        LABEL_TARGET: target_name,
        LABEL_GENERATION: str(generation),
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def owner_reference(policy: dict) -> dict:
    meta = policy["metadata"]
    return {
        "apiVersion": policy.get("apiVersion", f"{GROUP}/v1alpha1"),
        "kind": policy.get("kind", "LookaheadPolicy"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_role_deployment(target: dict, policy: dict, role: str, replicas: int,
                          transform: ContainerTransform, is_engine: Callable[[dict], bool],
                          metrics_port: int | None = None, metrics_path: str = "/metrics") -> dict:
    """The canary (lookahead on) or control (off) Deployment, cloned from the target's pod template.

    Everything of the template is kept (image, resources, node selectors, tolerations, volumes,
    env); only the engine container's lookahead flags differ, as the engine adapter renders them.
    The clone lives in the target's namespace. An owner reference to the policy is set when the
    policy is in the same namespace (owner references cannot cross namespaces); the policy's
    finalizer deletes clones in other namespaces by label.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    policy_name = policy["metadata"]["name"]
    generation = int(policy["metadata"].get("generation", 1))
    target_meta = target["metadata"]
    labels = role_labels(policy, role, target_meta["name"], generation)
    template = copy.deepcopy(target["spec"]["template"])
    index = engine_container_index(template, is_engine)
    template = _with_container(template, index, transform)
    tmeta = template.setdefault("metadata", {})
    # The clone must not match the fleet's Service or the fleet Deployment's selector.
    tmeta["labels"] = {**{k: v for k, v in (tmeta.get("labels") or {}).items()
                          if k not in _selector_keys(target)}, **labels}
    annotations = dict(tmeta.get("annotations") or {})
    port = metrics_port or container_port(template["spec"]["containers"][index])
    annotations.update({"prometheus.io/scrape": "true", "prometheus.io/path": metrics_path,
                        "prometheus.io/port": str(port)})
    tmeta["annotations"] = annotations
    meta = {
        "name": role_deployment_name(policy_name, role, policy["metadata"].get("namespace"),
                                     target_meta["namespace"]),
        "namespace": target_meta["namespace"],
        "labels": labels,
        "annotations": {ANNOTATION_SOURCE: f"{target_meta['namespace']}/{target_meta['name']}"},
    }
    if policy["metadata"].get("namespace") == target_meta["namespace"]:
        meta["ownerReferences"] = [owner_reference(policy)]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {**policy_labels(policy), LABEL_ROLE: role}},
            "template": template,
        },
    }


def _selector_keys(target: dict) -> set[str]:
    return set((target["spec"].get("selector") or {}).get("matchLabels") or {})


def container_port(container: dict, default: int = 8000) -> int:
    """The serving port: the port named ``http``, else the first declared port, else 8000."""
    ports = container.get("ports") or []
    for p in ports:
        if p.get("name") == "http":
            return int(p["containerPort"])
    return int(ports[0]["containerPort"]) if ports else default


def build_load_job(policy: dict, namespace: str, role: str, step: int | str, run: int, batch_size: int, url: str,
                   duration_s: float, image: str, prompts, model: str | None = None,
                   extra_labels: dict[str, str] | None = None) -> dict:
    """A closed-loop load generator Job holding ``batch_size`` requests in flight against one role.

    ``prompts`` is the policy's ``load.prompts`` (a ``models.PromptSource``): a bundled set by name,
    or the team's own JSON-lines prompts mounted from their ConfigMap (in ``namespace``). The name
    carries ``run`` (``status.progress.loadRun``), never the policy's generation, so a restarted
    step gets a fresh Job and pausing (which bumps the generation) duplicates nothing.
    """
    policy_name = policy["metadata"]["name"]
    labels = {**policy_labels(policy), LABEL_ROLE: "loadgen", LABEL_STEP: str(step), LABEL_RUN: str(run),
              LABEL_MANAGED_BY: MANAGED_BY, LABEL_DRIVES: role, **(extra_labels or {})}
    volumes, mounts = [], []
    ref = getattr(prompts, "config_map_ref", None)
    if ref is not None:
        prompts_arg = f"{PROMPTS_MOUNT}/{ref.key}"
        volumes.append({"name": "prompts", "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}]}})
        mounts.append({"name": "prompts", "mountPath": PROMPTS_MOUNT, "readOnly": True})
    else:
        builtin = getattr(prompts, "builtin", None) or prompts or "chat"
        prompts_arg = str(getattr(builtin, "value", builtin))
    args = ["--url", url, "--concurrency", str(batch_size), "--step-duration", f"{int(duration_s)}s",
            "--prompts", prompts_arg, "--json"]
    if model:
        args += ["--model", model]
    meta = {"name": owned_name(policy["metadata"].get("namespace"), policy_name, namespace, f"r{run}", f"s{step}", role),
            "namespace": namespace, "labels": labels}
    if policy["metadata"].get("namespace") == namespace:
        meta["ownerReferences"] = [owner_reference(policy)]
    container = {
        "name": "loadgen",
        "image": image,
        "command": ["python3", "-m", "lookahead_canary.loadgen"],
        "args": args,
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                      "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec = {
        "restartPolicy": "Never",
        # a deleted load Job must stop loading before the next step's starts: the load generator
        # exits on SIGTERM, and the kubelet's SIGKILL follows soon if it could not
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    if volumes:
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 1,
            "ttlSecondsAfterFinished": 3600,
            "activeDeadlineSeconds": int(duration_s * 3 + 120),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def build_pod_monitor(policy: dict, namespace: str, port_name: str = "http", path: str = "/metrics") -> dict:
    """A Prometheus Operator PodMonitor scraping the policy's canary and control pods.

    The relabelling copies the pod labels the queries rely on into ``lookahead_dev_role``,
    ``lookahead_dev_policy`` and ``lookahead_dev_target`` (what the annotation-based scrape config
    documented in docs/analyze.md produces too), so one set of PromQL serves both.
    """
    policy_name = policy["metadata"]["name"]
    relabel = [
        {"sourceLabels": [f"__meta_kubernetes_pod_label_lookahead_dev_{k}"], "targetLabel": f"lookahead_dev_{k}"}
        for k in ("role", "policy", "policy_namespace", "target")
    ] + [{"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"}]
    meta = {"name": owned_name(policy["metadata"].get("namespace"), policy_name, namespace), "namespace": namespace,
            "labels": {**policy_labels(policy), LABEL_MANAGED_BY: MANAGED_BY}}
    if policy["metadata"].get("namespace") == namespace:
        meta["ownerReferences"] = [owner_reference(policy)]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": policy_labels(policy),
                         "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": list(ROLES)}]},
            "podMetricsEndpoints": [{"port": port_name, "path": path, "interval": "5s",
                                     "relabelings": relabel}],
        },
    }


# --- the user's Deployments: save, promote, restore ------------------------------------------

def original_template(deployment: dict) -> dict | None:
    raw = (deployment["metadata"].get("annotations") or {}).get(ANNOTATION_ORIGINAL_TEMPLATE)
    return json.loads(raw) if raw else None


def claim_patch(deployment: dict, owner: str) -> dict:
    """Mark a fleet Deployment as owned by a policy and save its pod template, exactly, before
    anything else touches it. A template saved earlier is never overwritten: after a crash the
    first save is the truth."""
    annotations = {ANNOTATION_OWNER: owner}
    if original_template(deployment) is None:
        annotations[ANNOTATION_ORIGINAL_TEMPLATE] = json.dumps(deployment["spec"]["template"], sort_keys=True,
                                                               separators=(",", ":"))
    return {"metadata": {"annotations": annotations}}


def promote_patch(deployment: dict, transform: ContainerTransform, is_engine: Callable[[dict], bool],
                  decision_id: str) -> dict:
    """The patch that turns lookahead on in one fleet Deployment (a JSON merge patch of the whole
    template, so a re-run is idempotent)."""
    saved = original_template(deployment)
    if saved is None:
        raise ValueError(f"refusing to promote {deployment['metadata']['name']}: its original template "
                         "was not saved first")
    template = _with_container(saved, engine_container_index(saved, is_engine), transform)
    tmeta = template.setdefault("metadata", {})
    # Pods of the promoted template say so, which lets the guard pick a promoted pod to compare.
    tmeta["annotations"] = {**(tmeta.get("annotations") or {}), ANNOTATION_PROMOTED: decision_id}
    return {"metadata": {"annotations": {ANNOTATION_PROMOTED: decision_id}},
            "spec": {"template": template}}


def restore_body(deployment: dict) -> dict:
    """The Deployment with its saved pod template put back exactly and our annotations removed
    (for a full replace, so fields we added to the template do not survive a merge)."""
    saved = original_template(deployment)
    if saved is None:
        raise ValueError(f"{deployment['metadata']['name']} has no saved template to restore")
    out = copy.deepcopy(deployment)
    out["spec"]["template"] = saved
    annotations = dict(out["metadata"].get("annotations") or {})
    for key in (ANNOTATION_ORIGINAL_TEMPLATE, ANNOTATION_OWNER, ANNOTATION_PROMOTED):
        annotations.pop(key, None)
    out["metadata"]["annotations"] = annotations
    return out


def release_patch() -> dict:
    """Give a never-promoted Deployment back: drop our ownership marks (merge patch null deletes)."""
    return {"metadata": {"annotations": {ANNOTATION_OWNER: None, ANNOTATION_ORIGINAL_TEMPLATE: None,
                                         ANNOTATION_PROMOTED: None}}}


def wave_members(targets: Iterable[tuple[str, str]], waves_percent: list[float], wave: int) -> list[tuple[str, str]]:
    """Which targets are promoted once wave ``wave`` (0-based) is done: the first
    ceil(pct * n / 100) of the targets in a stable order, at least one per wave."""
    ordered = sorted(targets)
    if not ordered:
        return []
    pct = waves_percent[min(wave, len(waves_percent) - 1)]
    count = max(1, math.ceil(pct * len(ordered) / 100 - 1e-9))
    return ordered[: min(len(ordered), count)]
