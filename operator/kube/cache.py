"""Reads from watched caches: the operator's view of Deployments, Namespaces, its own Pods and load
Jobs, kept by Kopf indexes (``handlers``) from watch events, so that a steady-state reconcile
reads nothing from the API server and writes are its only requests.

An index keeps only what a pass reads of each object (``slim_deployment``, ``slim_pod``,
``slim_job``): at hundreds of policies whole objects were most of the operator's memory.
``Snapshot.of(...)`` copies, in the event loop, the part of the indexes one policy needs; a
``CachedView`` answers the same read calls as ``kube.client.Kube`` from it (the actions and ``observe``
take either). Kopf fills every index from a full list before any handler runs, so after a restart
the first pass already sees the whole cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from lookahead_operator.api import names as api
from lookahead_operator.kube.client import Kube, mark_created, recently_created
from lookahead_operator.api.spec import LabelSelector, LookaheadPolicySpec

_DROP_META = ("managedFields",)
_KEEP_META = ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "annotations",
              "creationTimestamp", "deletionTimestamp", "ownerReferences")
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_DEPLOYMENT_STATUS = ("observedGeneration", "replicas", "updatedReplicas", "readyReplicas", "availableReplicas")


def _meta(meta: Mapping[str, Any]) -> dict:
    out = {k: v for k, v in meta.items() if k in _KEEP_META}
    if _LAST_APPLIED in (out.get("annotations") or {}):  # kubectl's copy of the whole object: never read
        out["annotations"] = {k: v for k, v in out["annotations"].items() if k != _LAST_APPLIED}
    return out


def _conditions(status: Mapping[str, Any]) -> list[dict]:
    return [{k: c[k] for k in ("type", "status", "reason", "message") if k in c} for c in status.get("conditions") or []]


def slim_deployment(body: Mapping[str, Any]) -> dict:
    """What the deployments cache keeps of a Deployment: identity, labels and annotations, the spec
    (a target's pod template is what canary and control are cloned from) and the rollout status.
    Our own canary and control keep no pod template (nothing reads it from the cache: they are
    never fleet), which halves what the cache holds for a policy in flight."""
    meta = _meta(body.get("metadata") or {})
    spec = dict(body.get("spec") or {})
    if (meta.get("labels") or {}).get(api.LABEL_MANAGED_BY) == api.MANAGED_BY:
        spec.pop("template", None)
    status = body.get("status") or {}
    slim_status = {k: status[k] for k in _DEPLOYMENT_STATUS if k in status}
    slim_status["conditions"] = _conditions(status)
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": meta, "spec": spec,
            "status": slim_status}


def slim_pod(body: Mapping[str, Any]) -> dict:
    """What the pods cache keeps of one of our Pods: identity and labels, each container's name and
    ports (the load Jobs' target port), and whether and where it serves (phase, IP, conditions)."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": _meta(body.get("metadata") or {}),
            "spec": {"containers": [{k: c[k] for k in ("name", "ports") if k in c} for c in spec.get("containers") or []]},
            "status": {**{k: status[k] for k in ("phase", "podIP") if k in status}, "conditions": _conditions(status)}}


def slim_job(body: Mapping[str, Any]) -> dict:
    """What the jobs cache keeps of a load Job: identity, labels and creation time, and its status
    counters (not its pod template)."""
    status = body.get("status") or {}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": _meta(body.get("metadata") or {}),
            "status": {**{k: status[k] for k in ("active", "ready", "succeeded", "failed", "startTime", "completionTime")
                          if k in status}, "conditions": _conditions(status)}}


def cached(body: Mapping[str, Any]) -> dict:
    """A policy's body as a pass reads it: its top level as a plain dict (no managedFields). Each
    watch event brings a freshly parsed object that nothing mutates afterwards, so the nested
    values are shared, not copied (a deep copy of every event was the operator's largest CPU cost
    at hundreds of policies)."""
    out = dict(body)
    meta = dict(out.get("metadata") or {})
    for key in _DROP_META:
        meta.pop(key, None)
    out["metadata"] = meta
    return out


def _items(index: Any, key: Any) -> list[dict]:
    """The values a Kopf index holds under ``key`` (a Store is iterable), as a list."""
    try:
        store = index[key]
    except KeyError:
        return []
    return list(store)


@dataclass
class Snapshot:
    """What one policy's pass may read: copies taken in the event loop."""

    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)      # name -> labels
    deployments: dict[str, list[dict]] = field(default_factory=dict)         # namespace -> Deployments
    pods: list[dict] = field(default_factory=list)                           # this policy's pods
    jobs: list[dict] = field(default_factory=list)                           # this policy's load Jobs

    @classmethod
    def of(cls, policy_ns: str, policy_name: str, spec: LookaheadPolicySpec | None, status_targets: Iterable,
           namespaces_idx: Any, deployments_idx: Any, pods_idx: Any, jobs_idx: Any) -> "Snapshot":
        snap = cls()
        if (namespaces_idx is not None and spec is not None and spec.targets.namespace_selector is not None
                and not spec.targets.namespaces):
            # (no index: a namespaced install, which watches no Namespaces and selects none)
            # (only then: copying every namespace's labels on every pass would cost O(namespaces))
            snap.namespaces = {name: dict(next(iter(_items(namespaces_idx, name)), {})) for name in list(namespaces_idx)}
        wanted = {policy_ns} | {t.namespace for t in status_targets or []}
        if spec is not None:
            wanted |= set(CachedView.select_namespaces(snap.namespaces, policy_ns, spec.targets.namespace_selector,
                                                       spec.targets.namespaces))
        snap.deployments = {ns: _items(deployments_idx, ns) for ns in wanted}
        key = (policy_ns, policy_name)
        snap.pods = _items(pods_idx, key)
        snap.jobs = _items(jobs_idx, key)
        return snap


class CachedView:
    """``kube.client.Kube``'s read calls answered from a ``Snapshot``; writes go to the real client."""

    def __init__(self, k: Kube, snap: Snapshot):
        self.k = k
        self.snap = snap

    def __getattr__(self, name: str):  # writes and anything not cached: the API client
        return getattr(self.k, name)

    @staticmethod
    def select_namespaces(namespaces: Mapping[str, Mapping[str, str]], policy_namespace: str,
                          namespace_selector: LabelSelector | None, explicit: list[str] | None) -> list[str]:
        if explicit:
            return sorted(explicit)
        if namespace_selector is not None:
            return sorted(n for n, labels in namespaces.items() if namespace_selector.matches(labels))
        return [policy_namespace]

    def target_namespaces(self, policy_namespace: str, namespace_selector: LabelSelector | None,
                          namespaces: list[str] | None) -> list[str]:
        return self.select_namespaces(self.snap.namespaces, policy_namespace, namespace_selector, namespaces)

    def deployments(self, namespaces: Iterable[str], selector: LabelSelector | None) -> list[dict]:
        out = []
        for ns in namespaces:
            for d in self.snap.deployments.get(ns, []):
                labels = d["metadata"].get("labels") or {}
                if labels.get(api.LABEL_MANAGED_BY) == api.MANAGED_BY:
                    continue  # never treat our own canary/control as fleet
                if selector is None or selector.matches(labels):
                    out.append(d)
        return sorted(out, key=lambda d: (d["metadata"]["namespace"], d["metadata"]["name"]))

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        return next((d for d in self.snap.deployments.get(namespace, []) if d["metadata"]["name"] == name), None)

    def fresh_deployment(self, namespace: str, name: str) -> dict | None:
        """Read through to the API: before a write that must see the latest object."""
        return self.k.get_deployment(namespace, name)

    def _policy_deployments(self, policy_ns: str, policy_name: str, roles: Iterable[str]) -> list[dict]:
        """The policy's own Deployments of the given roles (labels), not being deleted."""
        out = []
        for items in self.snap.deployments.values():
            for d in items:
                labels = d["metadata"].get("labels") or {}
                if (labels.get(api.LABEL_POLICY) == policy_name and labels.get(api.LABEL_POLICY_NAMESPACE) == policy_ns
                        and labels.get(api.LABEL_MANAGED_BY) == api.MANAGED_BY
                        and labels.get(api.LABEL_ROLE) in roles and not d["metadata"].get("deletionTimestamp")):
                    out.append(d)
        return out

    def role_deployments(self, policy_ns: str, policy_name: str) -> list[dict]:
        return self._policy_deployments(policy_ns, policy_name, api.ROLES)

    def wave_deployments(self, policy_ns: str, policy_name: str) -> list[dict]:
        return self._policy_deployments(policy_ns, policy_name, (api.ROLE_WAVE,))

    def role_pods(self, namespace: str, policy_ns: str, policy_name: str, role: str) -> list[dict]:
        return [p for p in self.snap.pods if p["metadata"]["namespace"] == namespace
                and (p["metadata"].get("labels") or {}).get(api.LABEL_ROLE) == role]

    def load_jobs(self, policy_ns: str, policy_name: str) -> list[dict]:
        return list(self.snap.jobs)

    # Deletions are rare (a step's end, a rollback) and must not miss what the watch has not
    # brought yet: they list and delete through the API (``kube.client.Kube``), not from the cache.

    def create_if_absent(self, body: dict) -> bool:
        meta = body["metadata"]
        kind = body["kind"]
        if kind == "Job" and any(j["metadata"]["name"] == meta["name"] for j in self.snap.jobs):
            return False
        if kind == "Deployment" and self.get_deployment(meta["namespace"], meta["name"]) is not None:
            return False
        if recently_created(kind, meta["namespace"], meta["name"]):
            return False
        created = self.k.create_if_absent(body)
        mark_created(kind, meta["namespace"], meta["name"])  # created now, or found existing (409)
        return created
