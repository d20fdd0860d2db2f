"""Thin Kubernetes I/O for the operator: reading the world and carrying out a plan's actions.

Every action is idempotent (create-if-absent, patch-to-a-value, delete-if-present), so an
operator killed half-way through a plan redoes the rest on the next pass without duplicates.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from typing import Iterable

from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_operator.api import names as api

log = logging.getLogger("lookahead_operator.kube")   # the name operators filter their logs by
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


#: Concurrent connections to the API server kept open (the pass threads, the Event posters and
#: spare): a smaller pool discards connections under load, and each new one is a TLS handshake.
POOL_SIZE = int(os.environ.get("LOOKAHEAD_API_CONNECTIONS", "24"))
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
_APPS, _BATCH, _CORE = "/apis/apps/v1", "/apis/batch/v1", "/api/v1"


#: Gateway API's HTTPRoute (standard channel, v1) and the Inference Extension's InferencePool (v1).
_ROUTES = "/apis/gateway.networking.k8s.io/v1"
_POOLS = "/apis/inference.networking.k8s.io/v1"


def _backend_path(kind: str, namespace: str, name: str | None = None) -> str:
    """A Service's or an InferencePool's path (the collection's, without ``name``)."""
    base = {"Service": f"{_CORE}/namespaces/{namespace}/services",
            "InferencePool": f"{_POOLS}/namespaces/{namespace}/inferencepools"}[kind]
    return f"{base}/{name}" if name else base


def _policies_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{POLICY_PLURAL}"
    return f"{path}/{name}" if name else path


class Kube:
    """The operator's requests to the API server, as plain JSON dicts in and out.

    Requests go through the Kubernetes client's configuration, authentication and connection pool
    (``ApiClient.param_serialize`` and its REST client) but not its generated API methods: those
    validate every argument with pydantic and build typed models of every answer, which the
    operator would only turn back into dicts; at hundreds of policies that was a fifth of the
    operator's CPU. Errors are the client's ``ApiException`` (``status``, ``reason``, ``body``)."""

    def __init__(self, api_client: client.ApiClient | None = None, namespace: str | None = None):
        """``namespace``: a namespaced install's one namespace (``controller.tenancy``'s watch
        namespace). Every read that would list across namespaces (our canary, control, wave
        Deployments and load Jobs by label, placed pods) then lists that namespace only, and
        nothing cluster-scoped is read (Namespaces, CRDs): its Role grants nothing more."""
        self.namespace = namespace
        if api_client is None:
            cfg = client.Configuration.get_default_copy()
            cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, POOL_SIZE)
            api_client = client.ApiClient(cfg)
        self.api_client = api_client
        self.api_client.user_agent = USER_AGENT
        self._crd_checked: tuple[float, bool] | None = None

    # --- transport -------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, query: dict | None = None, body=None,
                content_type: str = "application/json", ignore: Iterable[int] = ()) -> dict | None:
        """One bounded request; the answer's JSON, or None for a status in ``ignore``."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, _, _ = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=[(k, v) for k, v in (query or {}).items() if v],
            header_params=headers, auth_settings=["BearerToken"])
        resp = self.api_client.rest_client.request(method, url, headers=headers, body=body, _request_timeout=TIMEOUT)
        data = resp.read()
        if not 200 <= resp.status <= 299:
            if resp.status in ignore:
                return None
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return json.loads(data) if data else None

    def _list(self, path: str, label_selector: str = "", field_selector: str = "") -> list[dict]:
        query = {"labelSelector": label_selector} | ({"fieldSelector": field_selector} if field_selector else {})
        out = self.request("GET", path, query=query) or {}
        kind = (out.get("kind") or "").removesuffix("List")
        items = out.get("items") or []
        for item in items:  # list items come without their kind (our builders and readers expect it)
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", out.get("apiVersion"))
        return items

    # --- reads -----------------------------------------------------------------------------------
    def target_namespaces(self, policy_namespace: str, namespace_selector, namespaces: list[str] | None) -> list[str]:
        """The namespaces to search: the explicit list, else those the selector (a
        ``api.spec.LabelSelector``; empty = all) matches, else the policy's own."""
        if self.namespace is not None:   # namespaced: nothing beyond it (no Namespaces to select from)
            if namespaces:
                return [ns for ns in sorted(set(namespaces)) if ns == self.namespace]
            return [] if namespace_selector is not None else [policy_namespace]
        if namespaces:
            return sorted(namespaces)
        if namespace_selector is not None:
            items = self._list(f"{_CORE}/namespaces", namespace_selector.to_label_selector_string())
            return sorted(ns["metadata"]["name"] for ns in items)
        return [policy_namespace]

    def deployments(self, namespaces: Iterable[str], selector) -> list[dict]:
        """Deployments matching ``selector`` (a ``api.spec.LabelSelector``), never our own canary/control."""
        sel = selector.to_label_selector_string() if selector is not None else ""
        out: list[dict] = []
        for ns in namespaces:
            for body in self._list(f"{_APPS}/namespaces/{ns}/deployments", sel):
                labels = body["metadata"].get("labels") or {}
                if labels.get(api.LABEL_MANAGED_BY) == api.MANAGED_BY:
                    continue  # never treat our own canary/control as fleet
                out.append(body)
        return out

    def _across(self, group_path: str, plural: str) -> str:
        """The path listing ``plural`` in every namespace, or in a namespaced install's one."""
        return (f"{group_path}/namespaces/{self.namespace}/{plural}" if self.namespace is not None
                else f"{group_path}/{plural}")

    def get_deployment(self, namespace: str, name: str) -> dict | None:
        return self.request("GET", f"{_APPS}/namespaces/{namespace}/deployments/{name}", ignore=(404,))

    fresh_deployment = get_deployment  # (a cached view reads the API for this one)

    @staticmethod
    def _policy_selector(policy_ns: str, policy_name: str) -> str:
        return f"{api.LABEL_POLICY}={policy_name},{api.LABEL_POLICY_NAMESPACE}={policy_ns}"

    def role_deployments(self, policy_ns: str, policy_name: str) -> list[dict]:
        sel = f"{self._policy_selector(policy_ns, policy_name)},{api.LABEL_MANAGED_BY}={api.MANAGED_BY}"
        return [d for d in self._list(self._across(_APPS, "deployments"), sel)
                if (d["metadata"].get("labels") or {}).get(api.LABEL_ROLE) in api.ROLES]

    def wave_deployments(self, policy_ns: str, policy_name: str) -> list[dict]:
        """The policy's wave Deployments (``builders.build_wave_deployment``), in every namespace."""
        sel = (f"{self._policy_selector(policy_ns, policy_name)},{api.LABEL_MANAGED_BY}={api.MANAGED_BY},"
               f"{api.LABEL_ROLE}={api.ROLE_WAVE}")
        return self._list(self._across(_APPS, "deployments"), sel)

    def role_pods(self, namespace: str, policy_ns: str, policy_name: str, role: str) -> list[dict]:
        sel = f"{self._policy_selector(policy_ns, policy_name)},{api.LABEL_ROLE}={role}"
        return self._list(f"{_CORE}/namespaces/{namespace}/pods", sel)

    def pods(self, namespace: str, selector: dict | None) -> list[dict]:
        return self._list(f"{_CORE}/namespaces/{namespace}/pods", selector_string(selector))

    def services(self, namespace: str) -> list[dict]:
        """The Services of ``namespace`` (live mode: which one selects the fleet's pods)."""
        return self._list(f"{_CORE}/namespaces/{namespace}/services")

    def get_http_route(self, namespace: str, name: str) -> dict | None:
        """The user's HTTPRoute (live mode, split gatewayAPI), None when there is none (or the
        Gateway API's CRD is not installed: the path is then not served, a 404 too)."""
        return self.request("GET", f"{_ROUTES}/namespaces/{namespace}/httproutes/{name}", ignore=(404,))

    def get_backend(self, kind: str, namespace: str, name: str) -> dict | None:
        """A Service or an InferencePool by name, None when there is none."""
        return self.request("GET", _backend_path(kind, namespace, name), ignore=(404,))

    def serves_inference_pools(self) -> bool:
        """Whether the apiserver serves InferencePools (inference.networking.k8s.io/v1): API discovery,
        which every user may read."""
        served = self.request("GET", _POOLS, ignore=(404,)) or {}
        return any(r.get("name") == "inferencepools" for r in served.get("resources") or [])

    def nodes(self) -> list[dict]:
        return self._list(f"{_CORE}/nodes")

    def placed_pods(self) -> list[dict]:
        """Every pod that holds what the scheduler gave it (placed on a node, not finished), in
        every namespace: what a node's allocatable is already spent on."""
        return self._list(self._across(_CORE, "pods"), field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")

    def load_jobs(self, policy_ns: str, policy_name: str) -> list[dict]:
        sel = f"{self._policy_selector(policy_ns, policy_name)},{api.LABEL_ROLE}=loadgen"
        return self._list(self._across(_BATCH, "jobs"), sel)

    def get_policy(self, namespace: str, name: str) -> dict | None:
        return self.request("GET", _policies_path(namespace, name), ignore=(404,))

    # --- writes ------------------------------------------------------------------------------------
    def replace_policy_status(self, body: dict) -> dict:
        """Write the status subresource by replacement, with the body's resourceVersion: keys absent
        from the new status disappear, and a concurrent change answers 409 instead of being lost."""
        meta = body["metadata"]
        return self.request("PUT", _policies_path(meta["namespace"], meta["name"]) + "/status", body=body)

    def patch_deployment(self, namespace: str, name: str, patch: dict) -> None:
        self.request("PATCH", f"{_APPS}/namespaces/{namespace}/deployments/{name}", body=patch,
                     content_type=STRATEGIC_MERGE)

    def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        """Add ``labels`` to a pod of ours (the control joining the fleet's Service): a merge patch
        of its metadata only; its ReplicaSet still owns it (its selector is unchanged)."""
        self.request("PATCH", f"{_CORE}/namespaces/{namespace}/pods/{name}", body={"metadata": {"labels": labels}},
                     content_type="application/merge-patch+json")

    def replace_http_route(self, body: dict) -> dict:
        """Write an HTTPRoute whole (PUT) with the body's resourceVersion: a route changed since it was
        read answers 409 instead of being overwritten."""
        meta = body["metadata"]
        return self.request("PUT", f"{_ROUTES}/namespaces/{meta['namespace']}/httproutes/{meta['name']}", body=body)

    def delete_arm_backends(self, namespace: str, names: Iterable[str], policy_ns: str, policy_name: str) -> int:
        """Delete the Services and InferencePools of ``names`` in ``namespace`` that this policy made
        (its labels and ``managed-by`` on them; another object of that name is never touched). A kind
        not served (no InferencePool CRD) has nothing to delete."""
        n = 0
        for kind in ("Service", "InferencePool"):
            for name in names:
                obj = self.get_backend(kind, namespace, name)
                labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
                if (obj is None or labels.get(api.LABEL_POLICY) != policy_name
                        or labels.get(api.LABEL_POLICY_NAMESPACE) != policy_ns
                        or labels.get(api.LABEL_MANAGED_BY) != api.MANAGED_BY):
                    continue
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(_backend_path(kind, namespace, name))
                forget_created(kind, namespace, name)
                n += 1
        return n

    def replace_deployment(self, body: dict) -> None:
        meta = body["metadata"]
        self.request("PUT", f"{_APPS}/namespaces/{meta['namespace']}/deployments/{meta['name']}", body=body)

    def create_if_absent(self, body: dict) -> bool:
        ns = body["metadata"]["namespace"]
        kind = body["kind"]
        if kind == "Deployment":
            path = f"{_APPS}/namespaces/{ns}/deployments"
        elif kind == "Job":
            path = f"{_BATCH}/namespaces/{ns}/jobs"
        elif kind == "PodMonitor":
            path = f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors"
            # the CRD removed since ``has_pod_monitor_crd`` looked (a minute's cache): not served
            # any more, so nothing to create; the next look asks the apiserver again
            try:
                answer = self.request("POST", path, body=body, ignore=(404, 409))
            except ApiException as exc:
                # a CRD being deleted refuses every create with 403 "... while custom resource
                # definition is terminating": as good as not served (its objects are going too)
                if exc.status == 403 and "terminating" in str(exc.body or ""):
                    self._crd_checked = (time.monotonic(), False)
                    return False
                raise
            if answer is None and self._crd_checked and not self._pod_monitors_served_now():
                self._crd_checked = (time.monotonic(), False)
                return False
            return answer is not None
        elif kind in ("Service", "InferencePool"):  # live mode, split gatewayAPI: an arm's own backend
            path = _backend_path(kind, ns)
        else:
            raise ValueError(f"cannot create {kind}")
        return self.request("POST", path, body=body, ignore=(409,)) is not None

    def _delete(self, path: str) -> None:
        self.request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1",
                                           "propagationPolicy": "Background"}, ignore=(404,))

    def delete_role_deployments(self, policy_ns: str, policy_name: str) -> int:
        n = 0
        for d in self.role_deployments(policy_ns, policy_name):
            meta = d["metadata"]
            self._delete(f"{_APPS}/namespaces/{meta['namespace']}/deployments/{meta['name']}")
            forget_created("Deployment", meta["namespace"], meta["name"])
            n += 1
        return n

    def delete_wave_deployments(self, policy_ns: str, policy_name: str,
                                targets: "set[tuple[str, str]] | None" = None) -> int:
        """Delete the policy's wave Deployments (of ``targets``, by namespace and target name; all
        when None), listed through the API."""
        n = 0
        for d in self.wave_deployments(policy_ns, policy_name):
            meta = d["metadata"]
            if targets is not None and (meta["namespace"], (meta.get("labels") or {}).get(api.LABEL_TARGET)) \
                    not in targets:
                continue
            if not meta.get("deletionTimestamp"):
                self._delete(f"{_APPS}/namespaces/{meta['namespace']}/deployments/{meta['name']}")
            forget_created("Deployment", meta["namespace"], meta["name"])
            n += 1
        return n

    def delete_load_jobs(self, policy_ns: str, policy_name: str) -> int:
        n = 0
        for j in self.load_jobs(policy_ns, policy_name):
            meta = j["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            self._delete(f"{_BATCH}/namespaces/{meta['namespace']}/jobs/{meta['name']}")
            forget_created("Job", meta["namespace"], meta["name"])
            n += 1
        return n

    def data_key(self, kind: str, namespace: str, name: str, key: str) -> str:
        """The text under ``key`` of Secret or ConfigMap ``namespace/name`` (a Secret's value decoded
        from base64): what ``analysis.prometheus`` names (credentials, a CA bundle). Read at each use,
        never cached, so an edited Secret is picked up. Raises ``DataKeyError`` saying which object or
        key cannot be read and why (never a value)."""
        plural = {"Secret": "secrets", "ConfigMap": "configmaps"}[kind]
        try:
            obj = self.request("GET", f"{_CORE}/namespaces/{namespace}/{plural}/{name}", ignore=(404,))
        except ApiException as exc:
            raise DataKeyError(f"{kind} {namespace}/{name} could not be read ({api_message(exc)})") from None
        if obj is None:
            raise DataKeyError(f"{kind} {namespace}/{name} not found")
        data = obj.get("data") or {}
        if key not in data:
            keys = ", ".join(sorted(data)[:20]) or "none"
            raise DataKeyError(f"{kind} {namespace}/{name} has no key {key!r} (its keys: {keys})")
        if kind != "Secret":
            return data[key]
        try:
            return base64.b64decode(data[key], validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            raise DataKeyError(f"{kind} {namespace}/{name} key {key!r} is not UTF-8 text") from None

    def has_pod_monitor_crd(self) -> bool:
        """Whether the Prometheus Operator's PodMonitor CRD exists (looked up at most once a minute)."""
        if self._crd_checked and time.monotonic() - self._crd_checked[0] < 60:
            return self._crd_checked[1]
        found = self._pod_monitors_served_now()
        self._crd_checked = (time.monotonic(), found)
        return found

    def _pod_monitors_served_now(self) -> bool:
        if self.namespace is not None:  # namespaced: no grant on CRDs; API discovery is open to every user
            served = self.request("GET", "/apis/monitoring.coreos.com/v1", ignore=(404,)) or {}
            return any(r.get("name") == "podmonitors" for r in served.get("resources") or [])
        return self.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                   "podmonitors.monitoring.coreos.com", ignore=(404,)) is not None

    def event(self, policy: dict, type_: str, reason: str, message: str, component: str = "lookahead-operator") -> None:
        from datetime import datetime, timezone
        meta = policy["metadata"]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": policy.get("apiVersion"), "kind": policy.get("kind"),
                                   "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
                "reason": reason, "message": message[:1024], "type": type_, "firstTimestamp": now,
                "lastTimestamp": now, "count": 1, "source": {"component": component}}
        self.request("POST", f"{_CORE}/namespaces/{meta['namespace']}/events", body=body)


def dumps_compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class DataKeyError(LookupError):
    """A Secret's or ConfigMap's key that cannot be read (``Kube.data_key``): which, and why."""


def api_message(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
    return f"{type(exc).__name__}: {exc}"
