"""Thin Kubernetes I/O for the operator: reading the world and carrying out a plan's actions.

Every action is idempotent (create-if-absent, patch-to-a-value, delete-if-present), so an
operator killed half-way through a plan redoes the rest on the next pass without duplicates.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable, Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException

from . import api
from . import builders as b

log = logging.getLogger("lookahead_operator.kube")
USER_AGENT = "lookahead-operator/0.1"
# Every request is bounded: (connect, read) seconds. Nothing outside the process is assumed to answer.
TIMEOUT = (5, 30)
POLICY_API = (api.GROUP, api.VERSION)
POLICY_PLURAL = api.PLURAL


#: Objects this process created (or found existing) in the last RECENT_S seconds, by
#: (kind, namespace, name): a cache not yet updated by the watch must not make us create them again.
RECENT_S = 120.0
_recent: dict[tuple[str, str, str], float] = {}


def mark_created(kind: str, namespace: str, name: str) -> None:
    _recent[(kind, namespace, name)] = time.monotonic()


def recently_created(kind: str, namespace: str, name: str) -> bool:
    t = _recent.get((kind, namespace, name))
    if t is None:
        return False
    if time.monotonic() - t > RECENT_S:
        _recent.pop((kind, namespace, name), None)
        return False
    return True


def forget_created(kind: str, namespace: str, name: str) -> None:
    _recent.pop((kind, namespace, name), None)


def _ignore(status: int, fn: Callable, *args, **kwargs):
    kwargs.setdefault("_request_timeout", TIMEOUT)
    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status == status:
            return None
        raise


def selector_string(selector: dict | None) -> str:
    """A label selector (matchLabels + matchExpressions) as the API's query string."""
    parts: list[str] = []
    selector = selector or {}
    for k, v in sorted((selector.get("matchLabels") or selector.get("match_labels") or {}).items()):
        parts.append(f"{k}={v}")
    for expr in selector.get("matchExpressions") or selector.get("match_expressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ValueError(f"unknown selector operator {op!r}")
    return ",".join(parts)


class Kube:
    def __init__(self, api_client: client.ApiClient | None = None):
        self.api_client = api_client or client.ApiClient()
        self.api_client.user_agent = USER_AGENT
        self._crd_checked: tuple[float, bool] | None = None
        self.apps = client.AppsV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self._sanitize = self.api_client.sanitize_for_serialization

    # --- reads -----------------------------------------------------------------------------------
    def target_namespaces(self, policy_namespace: str, namespace_selector, namespaces: list[str] | None) -> list[str]:
        """The namespaces to search: the explicit list, else those the selector (a
        ``models.LabelSelector``; empty = all) matches, else the policy's own."""
        if namespaces:
            return sorted(namespaces)
        if namespace_selector is not None:
            items = self.core.list_namespace(label_selector=namespace_selector.to_label_selector_string(),
                                             _request_timeout=TIMEOUT).items
            return sorted(ns.metadata.name for ns in items)
        return [policy_namespace]

    def deployments(self, namespaces: Iterable[str], selector) -> list[dict]:
        """Deployments matching ``selector`` (a ``models.LabelSelector``), never our own canary/control."""
        sel = selector.to_label_selector_string() if selector is not None else ""
        out: list[dict] = []
        for ns in namespaces:
            for d in self.apps.list_namespaced_deployment(ns, label_selector=sel, _request_timeout=TIMEOUT).items:
                body = self._sanitize(d)
                labels = body["metadata"].get("labels") or {}
                if labels.get(b.LABEL_MANAGED_BY) == b.MANAGED_BY:
                    continue  # never treat our own canary/control as fleet
                out.append(body)
        return out

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        d = _ignore(404, self.apps.read_namespaced_deployment, name, namespace)
        return self._sanitize(d) if d is not None else None

    fresh_deployment = get_deployment  # (a cached view reads the API for this one)

    @staticmethod
    def _policy_selector(policy_ns: str, policy_name: str) -> str:
        return f"{b.LABEL_POLICY}={policy_name},{b.LABEL_POLICY_NAMESPACE}={policy_ns}"

    def role_deployments(self, policy_ns: str, policy_name: str) -> list[dict]:
        sel = f"{self._policy_selector(policy_ns, policy_name)},{b.LABEL_MANAGED_BY}={b.MANAGED_BY}"
        items = self.apps.list_deployment_for_all_namespaces(label_selector=sel, _request_timeout=TIMEOUT).items
        return [self._sanitize(d) for d in items if (d.metadata.labels or {}).get(b.LABEL_ROLE) in b.ROLES]

    def role_pods(self, namespace: str, policy_ns: str, policy_name: str, role: str) -> list[dict]:
        sel = f"{self._policy_selector(policy_ns, policy_name)},{b.LABEL_ROLE}={role}"
        return [self._sanitize(p) for p in self.core.list_namespaced_pod(namespace, label_selector=sel, _request_timeout=TIMEOUT).items]

    def pods(self, namespace: str, selector: dict | None) -> list[dict]:
        sel = selector_string(selector)
        return [self._sanitize(p) for p in self.core.list_namespaced_pod(namespace, label_selector=sel, _request_timeout=TIMEOUT).items]

    def load_jobs(self, policy_ns: str, policy_name: str) -> list[dict]:
        sel = f"{self._policy_selector(policy_ns, policy_name)},{b.LABEL_ROLE}=loadgen"
        return [self._sanitize(j) for j in self.batch.list_job_for_all_namespaces(label_selector=sel, _request_timeout=TIMEOUT).items]

    def get_policy(self, namespace: str, name: str) -> dict | None:
        return _ignore(404, self.custom.get_namespaced_custom_object, *POLICY_API, namespace, POLICY_PLURAL, name)

    # --- writes ------------------------------------------------------------------------------------
    def replace_policy_status(self, body: dict) -> dict:
        """Write the status subresource by replacement, with the body's resourceVersion: keys absent
        from the new status disappear, and a concurrent change answers 409 instead of being lost."""
        meta = body["metadata"]
        return self.custom.replace_namespaced_custom_object_status(
            *POLICY_API, meta["namespace"], POLICY_PLURAL, meta["name"], body, _request_timeout=TIMEOUT)

    def patch_deployment(self, namespace: str, name: str, patch: dict) -> None:
        self.apps.patch_namespaced_deployment(name, namespace, patch, _request_timeout=TIMEOUT)

    def replace_deployment(self, body: dict) -> None:
        meta = body["metadata"]
        self.apps.replace_namespaced_deployment(meta["name"], meta["namespace"], body, _request_timeout=TIMEOUT)

    def create_if_absent(self, body: dict) -> bool:
        ns = body["metadata"]["namespace"]
        kind = body["kind"]
        try:
            if kind == "Deployment":
                self.apps.create_namespaced_deployment(ns, body, _request_timeout=TIMEOUT)
            elif kind == "Job":
                self.batch.create_namespaced_job(ns, body, _request_timeout=TIMEOUT)
            elif kind == "PodMonitor":
                self.custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", ns, "podmonitors", body, _request_timeout=TIMEOUT)
            else:
                raise ValueError(f"cannot create {kind}")
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def delete_role_deployments(self, policy_ns: str, policy_name: str) -> int:
        n = 0
        for d in self.role_deployments(policy_ns, policy_name):
            meta = d["metadata"]
            _ignore(404, self.apps.delete_namespaced_deployment, meta["name"], meta["namespace"],
                    propagation_policy="Background")
            forget_created("Deployment", meta["namespace"], meta["name"])
            n += 1
        return n

    def delete_load_jobs(self, policy_ns: str, policy_name: str) -> int:
        n = 0
        for j in self.load_jobs(policy_ns, policy_name):
            meta = j["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            _ignore(404, self.batch.delete_namespaced_job, meta["name"], meta["namespace"],
                    propagation_policy="Background")
            forget_created("Job", meta["namespace"], meta["name"])
            n += 1
        return n

    def has_pod_monitor_crd(self) -> bool:
        """Whether the Prometheus Operator's PodMonitor CRD exists (looked up at most once a minute)."""
        import time
        if self._crd_checked and time.monotonic() - self._crd_checked[0] < 60:
            return self._crd_checked[1]
        ext = client.ApiextensionsV1Api(self.api_client)
        found = _ignore(404, ext.read_custom_resource_definition, "podmonitors.monitoring.coreos.com") is not None
        self._crd_checked = (time.monotonic(), found)
        return found

    def event(self, policy: dict, type_: str, reason: str, message: str, component: str = "lookahead-operator") -> None:
        from datetime import datetime, timezone
        meta = policy["metadata"]
        now = datetime.now(timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(api_version=policy.get("apiVersion"), kind=policy.get("kind"),
                                                     name=meta["name"], namespace=meta["namespace"],
                                                     uid=meta.get("uid")),
            reason=reason, message=message[:1024], type=type_, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=component))
        self.core.create_namespaced_event(meta["namespace"], body, _request_timeout=TIMEOUT)


def dumps_compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def api_message(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
    return f"{type(exc).__name__}: {exc}"
