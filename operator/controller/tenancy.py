"""Which namespaces a policy may touch: its own, and what the cluster admin lists for it.

The operator may patch every Deployment in the cluster; a LookaheadPolicy is created by whoever
may create one in *its own* namespace. Without a rule, ``targets.namespaces`` or a
``targets.namespaceSelector`` would let that person have the operator change Deployments in any
namespace (kube-system included). So a policy targets its own namespace only, unless the cluster
admin's allow-list (the chart's ``crossNamespaceTargets``, the operator's environment variable
``LOOKAHEAD_CROSS_NAMESPACE_TARGETS``: a JSON object, policy namespace -> namespaces its policies may
also target, ``"*"`` for any) says otherwise. The chart's ValidatingAdmissionPolicy refuses the same
at apply time; this is the operator's own check for when that policy is absent or bypassed.

A namespaced install (the chart's ``watchNamespace``, the operator's ``LOOKAHEAD_WATCH_NAMESPACE``)
narrows this further: the operator watches and acts in that one namespace, with a Role there and
no cluster-wide grant, so a policy there targets that namespace only (no allow-list, no
namespace selector: the operator may not read other namespaces, nor the Namespace objects'
labels).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

ENV = "LOOKAHEAD_CROSS_NAMESPACE_TARGETS"
#: The one namespace a namespaced install watches and acts in (empty or unset: cluster-wide).
WATCH_ENV = "LOOKAHEAD_WATCH_NAMESPACE"
#: Where the admin sets it (named in every refusal it causes).
WATCH_WHERE = "the chart's watchNamespace (the operator's LOOKAHEAD_WATCH_NAMESPACE)"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ANY = "*"
#: Where the admin sets the list (named in every refusal).
WHERE = "the chart's crossNamespaceTargets (the operator's LOOKAHEAD_CROSS_NAMESPACE_TARGETS)"


def parse_allow_list(raw: str | None) -> dict[str, frozenset[str]]:
    """The allow-list from its JSON text (empty or unset: none). A malformed value raises
    ``ValueError`` naming what is wrong (the operator refuses to start on it)."""
    if not raw or not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV}: not JSON ({exc.msg}); expected an object such as "
                         '{"platform": ["*"], "team-a": ["inference"]}') from None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV}: expected a JSON object (policy namespace -> list of namespaces), "
                         f"got {type(data).__name__}")
    allow: dict[str, frozenset[str]] = {}
    for ns, targets in data.items():
        if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"{ENV}: {ns!r} must map to a list of namespace names (or \"*\")")
        allow[str(ns)] = frozenset(targets)
    return allow


def may_target(policy_namespace: str, namespace: str, allow: Mapping[str, frozenset[str]]) -> bool:
    """True if a policy in ``policy_namespace`` may touch Deployments in ``namespace``."""
    if namespace == policy_namespace:
        return True
    listed = allow.get(policy_namespace, frozenset())
    return ANY in listed or namespace in listed


def refused_namespaces(policy_namespace: str, namespaces: Iterable[str],
                       allow: Mapping[str, frozenset[str]]) -> list[str]:
    """Of the namespaces a policy's targets name or select, those it may not touch (sorted)."""
    return sorted({ns for ns in namespaces if not may_target(policy_namespace, ns, allow)})


def refusal(policy_namespace: str, refused: list[str], allow: Mapping[str, frozenset[str]]) -> str:
    """The condition message: which namespaces, and what would allow them."""
    listed = sorted(allow.get(policy_namespace, frozenset()))
    has = (f"it lists {', '.join(listed)} for {policy_namespace}" if listed
           else f"it has no entry for {policy_namespace}")
    return (f"refused: a policy in namespace {policy_namespace} may not target namespace(s) "
            f"{', '.join(refused)}: a policy targets its own namespace unless the cluster admin allows more in "
            f"{WHERE}, and {has}; narrow spec.targets (namespaces, namespaceSelector) or ask them to list it")


def parse_watch_namespace(raw: str | None, allow: Mapping[str, frozenset[str]] | None = None) -> str | None:
    """The namespace a namespaced install watches (None: cluster-wide) from its environment
    value. A value that is no namespace name, or one set together with a non-empty allow-list
    (``allow``: a namespaced operator can reach no other namespace), raises ``ValueError`` naming
    both settings (the operator refuses to start on it)."""
    if raw is None or not raw.strip():
        return None
    ns = raw.strip()
    if not _DNS_LABEL.match(ns):
        raise ValueError(f"{WATCH_ENV}={raw!r}: not a namespace name (lower-case letters, digits and '-', "
                         "at most 63); leave it empty for a cluster-wide operator")
    if allow:
        raise ValueError(f"{WATCH_ENV}={ns} and {ENV} are both set: a namespaced install (the chart's "
                         f"watchNamespace) acts in namespace {ns} only and can reach no other namespace; leave "
                         "crossNamespaceTargets empty, or install cluster-wide (watchNamespace empty)")
    return ns


def scope_refusal(watch: str, refused: list[str], selector: bool) -> str:
    """The condition message of a namespaced install for a policy whose targets reach beyond its
    namespace: the namespaces it names (``refused``) or a namespace selector (``selector``)."""
    what = (f"spec.targets.namespaces names {', '.join(refused)}" if refused else "") + \
        (" and " if refused and selector else "") + ("spec.targets.namespaceSelector is set" if selector else "")
    return (f"refused: this operator is installed for namespace {watch} only ({WATCH_WHERE}) and a policy there "
            f"targets Deployments in {watch} alone, but {what}; leave them out (or name only {watch}), or have "
            "the cluster admin install the operator cluster-wide")
