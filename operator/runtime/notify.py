"""Notifications: a decision, a promotion finished, a rollback, a failure, posted to a generic
webhook (JSON) and a Slack-compatible incoming webhook (``{"text": ...}``), never blocking a pass.

The URLs come from Secrets through the operator's environment (the chart's ``notifications``:
``LOOKAHEAD_NOTIFY_WEBHOOK_URL``, ``LOOKAHEAD_NOTIFY_SLACK_URL``, set with ``secretKeyRef``, so
the operator needs no access to Secrets). A pass only puts a notice on a bounded queue; one thread
posts it with a bounded timeout and a few retries, and counts what became of it
(``lookahead_operator_notifications_total{sink, result}``). A notice is sent once per transition
this process writes: at most once, since a process killed between writing the status and posting
loses it (the status and the Events stay the record).

Why not a library: Apprise or slack_sdk would add a dependency for two HTTP POSTs; httpx (already
a dependency) does them with the timeout and the error handling below.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from lookahead_operator.api.status import TERMINAL_PHASES, LookaheadPolicyStatus, Phase
from lookahead_operator.runtime import metrics

log = logging.getLogger(__name__)

ENV_WEBHOOK = "LOOKAHEAD_NOTIFY_WEBHOOK_URL"
ENV_SLACK = "LOOKAHEAD_NOTIFY_SLACK_URL"
TIMEOUT_S = 5.0
RETRIES = 3            # after the first try: 1 s, 2 s, 4 s apart
QUEUE_MAX = 256        # a receiver down for long drops the oldest news, never blocks a pass


@dataclass(frozen=True)
class Notice:
    kind: str          # "decision" | "finished"
    namespace: str
    policy: str
    phase: str         # the phase the policy entered
    previous: str      # the phase it left
    action: str | None  # the decision's action (DecisionAction), when there is one
    message: str       # the decision's reason, the rollback's message, or the status message
    at: str            # ISO time of the transition
    warning: bool      # a rollback or a failure

    def title(self) -> str:
        if self.kind == "decision":
            return f"LookaheadPolicy {self.namespace}/{self.policy}: decided {self.action}"
        return f"LookaheadPolicy {self.namespace}/{self.policy}: {self.phase}"


def notices(namespace: str, name: str, old: LookaheadPolicyStatus, new: LookaheadPolicyStatus,
            at: str) -> list[Notice]:
    """What is worth telling about one pass that moved ``old`` to ``new`` (pure): a new decision
    (once per decision id), and entering a terminal phase (Succeeded, RolledBack, NotACandidate,
    Failed)."""
    out = []
    decided = new.decision
    if decided is not None and decided.action != "Wait" and (old.decision is None or old.decision.id != decided.id):
        out.append(Notice("decision", namespace, name, str(new.phase), str(old.phase), str(decided.action),
                          decided.reason, at, str(decided.action) in ("Rollback", "Inconclusive")))
    if new.phase in TERMINAL_PHASES and new.phase != old.phase:
        why = (new.rollback.message or new.rollback.reason) if new.phase == Phase.RolledBack and new.rollback else \
            (new.message or "")
        out.append(Notice("finished", namespace, name, str(new.phase), str(old.phase),
                          str(decided.action) if decided else None, why, at,
                          new.phase in (Phase.RolledBack, Phase.Failed)))
    return out


def webhook_body(n: Notice) -> dict:
    """The generic webhook's JSON: every field, and a one-line summary."""
    return {"kind": n.kind, "namespace": n.namespace, "policy": n.policy, "phase": n.phase,
            "previousPhase": n.previous, "action": n.action, "message": n.message, "at": n.at,
            "severity": "warning" if n.warning else "info", "summary": n.title()}


def slack_body(n: Notice) -> dict:
    """A Slack incoming webhook's message (Mattermost, Rocket.Chat and Teams' Slack-compatible
    endpoints take the same ``text``)."""
    mark = ":warning:" if n.warning else ":white_check_mark:" if n.phase == Phase.Succeeded else ":information_source:"
    return {"text": f"{mark} *{n.title()}* ({n.previous} -> {n.phase})\n{n.message}"[:3000]}


def check_url(env: str, url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else ``ValueError`` naming the variable."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{env}: not an http(s) URL with a host (the Secret named in the chart's notifications "
                         "holds it); fix the Secret's value or leave the chart's notifications unset")
    return url.strip()


class Notifier:
    """Posts notices from one thread. ``sinks``: name -> (URL, body builder)."""

    def __init__(self, sinks: dict[str, tuple[str, object]], timeout_s: float = TIMEOUT_S, retries: int = RETRIES,
                 backoff_s: float = 1.0):
        self.sinks = sinks
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._queue: queue.Queue[tuple[str, Notice]] = queue.Queue(maxsize=QUEUE_MAX)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, items: list[Notice]) -> None:
        """Queue ``items`` for every sink; returns at once (a full queue drops, counted)."""
        if not self.sinks or not items:
            return
        self._start()
        for n in items:
            for sink in self.sinks:
                try:
                    self._queue.put_nowait((sink, n))
                except queue.Full:
                    metrics.NOTIFICATIONS.labels(sink, "dropped").inc()
                    log.warning("notification to %s dropped (queue full): %s", sink, n.title())

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="notifications", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as http:
            while True:
                sink, n = self._queue.get()
                try:
                    self._post(http, sink, n)
                finally:
                    self._queue.task_done()

    def _post(self, http: httpx.Client, sink: str, n: Notice) -> None:
        url, build = self.sinks[sink]
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = http.post(url, json=build(n))  # type: ignore[operator]
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code < 300:
                metrics.NOTIFICATIONS.labels(sink, "sent").inc()
                return
            error = f"HTTP {r.status_code}"
            if r.status_code < 500 and r.status_code != 429:
                break          # the receiver refuses this message: retrying will not help
        metrics.NOTIFICATIONS.labels(sink, "failed").inc()
        log.warning("notification to %s failed (%s): %s", sink, error, n.title())

    def drain(self, timeout: float) -> bool:
        """Wait until every queued notice was posted or given up (tests, shutdown); True if so."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def from_env(environ: dict[str, str] | None = None) -> Notifier:
    """The notifier the chart configured (none configured: one that sends nothing). A malformed
    URL raises ``ValueError`` naming it (the operator refuses to start on it)."""
    env = os.environ if environ is None else environ
    sinks: dict[str, tuple[str, object]] = {}
    for name, var, build in (("webhook", ENV_WEBHOOK, webhook_body), ("slack", ENV_SLACK, slack_body)):
        if env.get(var, "").strip():
            sinks[name] = (check_url(var, env[var]), build)
    return Notifier(sinks)
