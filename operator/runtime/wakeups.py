"""Which policy daemon to wake, and when: the scheduling state behind the Kopf handlers.

Each policy's daemon (``handlers.run``) sleeps on its own ``asyncio.Event`` until its plan's time
comes or something it waits on changes. ``Wakeups`` keeps what decides the latter: the daemons'
events, which policy a key names, the policies still looking for their targets (a new Deployment
in a namespace they search wakes them), the version of the policy a daemon waits to see replaced
(its write conflicted, or Kopf's finalizer is not on it yet), and what of each policy was seen last
(a change of spec or gate annotation wakes it; a status write does not). One instance serves the
whole operator (``handlers.wakeups``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping

from lookahead_operator.api.names import (
    ANNOTATION_ABORT,
    ANNOTATION_APPROVE,
    ANNOTATION_OWNER,
    LABEL_POLICY,
    LABEL_POLICY_NAMESPACE,
)


def signature(meta: Mapping[str, Any]) -> tuple:
    """What of a policy, when it changes, asks for a pass: its spec (generation) and its gates."""
    ann = meta.get("annotations") or {}
    return (meta.get("generation"), ann.get(ANNOTATION_APPROVE), ann.get(ANNOTATION_ABORT))


def pending_namespaces(spec: Any, searched: Iterable[str]) -> frozenset[str] | None:
    """Where a new Deployment wakes a policy waiting in Pending for its targets: any namespace
    (None) when its spec picks namespaces by a selector and names none, else the namespaces it
    searches now (``searched``). ``spec``: the parsed spec, or None when it does not parse."""
    if spec is not None and spec.targets.namespace_selector is not None and not spec.targets.namespaces:
        return None
    return frozenset(searched)


class Wakeups:
    """The daemons' wake-up events and what decides which one a watch event sets."""

    def __init__(self) -> None:
        self.wakers: dict[str, asyncio.Event] = {}   # policy uid -> the event its daemon sleeps on
        self.uid_by_key: dict[str, str] = {}          # "namespace/name" of a policy -> its uid
        self.seen: dict[str, tuple] = {}              # policy uid -> its last ``signature``
        #: policies waiting for their targets to appear -> the namespaces they search (None: any, for
        #: a namespace selector), so that a new Deployment wakes only those it may concern
        self.pending: dict[str, frozenset[str] | None] = {}
        #: uid -> the policy's resourceVersion its daemon saw when it found it could not go on with
        #: it (a write conflicted, or Kopf's finalizer is not on it yet): the next event wakes it
        self.stale: dict[str, str] = {}

    # --- a daemon's life ----------------------------------------------------------------------------
    def register(self, key: str, uid: str) -> asyncio.Event:
        """A daemon starts for policy ``key``: the event it sleeps on."""
        self.uid_by_key[key] = uid
        return self.wakers.setdefault(uid, asyncio.Event())

    def forget(self, key: str, uid: str) -> None:
        """A daemon ends: nothing of its policy is kept (a newer daemon of the same key keeps its uid)."""
        self.wakers.pop(uid, None)
        self.seen.pop(uid, None)
        self.stale.pop(uid, None)
        self.pending.pop(key, None)
        if self.uid_by_key.get(key) == uid:
            del self.uid_by_key[key]

    def wait_for_newer(self, uid: str, resource_version: str | None) -> None:
        """The daemon of ``uid`` waits for a version of its policy other than ``resource_version``."""
        self.stale[uid] = resource_version

    def set_pending(self, key: str, namespaces: frozenset[str] | None) -> None:
        """Policy ``key`` waits for its targets in ``namespaces`` (None: in any namespace)."""
        self.pending[key] = namespaces

    def not_pending(self, key: str) -> None:
        self.pending.pop(key, None)

    # --- watch events -------------------------------------------------------------------------------
    def wake(self, key: str) -> None:
        """Wake the daemon of policy ``key`` ("namespace/name"), if it runs."""
        uid = self.uid_by_key.get(key)
        if uid in self.wakers:
            self.wakers[uid].set()

    def policy_event(self, meta: Mapping[str, Any]) -> None:
        """A policy's watch event: a change of its spec or of a gate annotation wakes its daemon (status
        writes, ours included, do not); so does any newer version of a policy whose daemon waits for one."""
        uid = meta.get("uid")
        sig = signature(meta)
        stale = self.stale.get(uid)
        if self.seen.get(uid) != sig or (stale is not None and meta.get("resourceVersion") != stale):
            self.seen[uid] = sig
            self.stale.pop(uid, None)
            if uid in self.wakers:
                self.wakers[uid].set()

    def deployment_event(self, meta: Mapping[str, Any]) -> None:
        """A Deployment's watch event: a canary/control or a claimed target wakes its policy; any other
        Deployment may be a new target for a policy still looking for its fleet in that namespace."""
        labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
        if labels.get(LABEL_POLICY) and labels.get(LABEL_POLICY_NAMESPACE):
            self.wake(f"{labels[LABEL_POLICY_NAMESPACE]}/{labels[LABEL_POLICY]}")
        elif ann.get(ANNOTATION_OWNER):
            self.wake(ann[ANNOTATION_OWNER])
        elif self.pending:
            namespace = meta.get("namespace")
            for key, namespaces in list(self.pending.items()):
                if namespaces is None or namespace in namespaces:
                    self.wake(key)
