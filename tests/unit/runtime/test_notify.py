"""Notifications (issue 24, item 5): what a pass tells, once per decision and once per terminal
phase, and the two message shapes."""

from __future__ import annotations

import pytest

from lookahead_operator.api.status import LookaheadPolicyStatus
from lookahead_operator.runtime import notify

AT = "2026-12-05T09:00:00+00:00"


def status(phase: str, decision: dict | None = None, **extra) -> LookaheadPolicyStatus:
    return LookaheadPolicyStatus.model_validate({"phase": phase, **({"decision": decision} if decision else {}),
                                                 **extra})


PROMOTE = {"id": "g1-PromoteRegimeAware", "action": "PromoteRegimeAware",
           "reason": "per-token latency -31% at batch 1; lookahead off from batch 8"}


def test_a_decision_is_told_once_with_its_reason():
    deciding, promoting = status("Deciding"), status("Promoting", PROMOTE)
    (n,) = notify.notices("inference", "chat", deciding, promoting, AT)
    assert (n.kind, n.action, n.phase, n.previous, n.warning) == \
        ("decision", "PromoteRegimeAware", "Promoting", "Deciding", False)
    assert n.message == PROMOTE["reason"]
    assert notify.notices("inference", "chat", promoting, status("Guarding", PROMOTE), AT) == []  # same id: not again
    assert notify.notices("inference", "chat", status("Measuring"), status("Measuring", {
        "id": "w", "action": "Wait", "reason": "not yet"}), AT) == []


def test_terminal_phases_are_told_rollbacks_and_failures_as_warnings():
    guarding = status("Guarding", PROMOTE)
    rolled = status("RolledBack", PROMOTE, rollback={"reason": "GuardRegression",
                                                     "message": "throughput -9% at batch 16"})
    (n,) = notify.notices("inference", "chat", guarding, rolled, AT)
    assert (n.kind, n.phase, n.warning, n.message) == ("finished", "RolledBack", True, "throughput -9% at batch 16")
    (ok,) = notify.notices("inference", "chat", guarding, status("Succeeded", PROMOTE, message="promoted"), AT)
    assert (ok.phase, ok.warning) == ("Succeeded", False)
    failed = notify.notices("inference", "chat", status("Pending"), status("Failed", message="EngineUnsupported"), AT)
    assert [(n.kind, n.warning, n.message) for n in failed] == [("finished", True, "EngineUnsupported")]
    # a decision that ends the rollout at once is told twice: the decision, and the end
    both = notify.notices("inference", "chat", status("Deciding"), status("RolledBack", {
        "id": "g1-Rollback", "action": "Rollback", "reason": "slower at every batch size"},
        rollback={"reason": "Decision"}), AT)
    assert [(n.kind, n.warning) for n in both] == [("decision", True), ("finished", True)]


def test_message_shapes():
    (n,) = notify.notices("inference", "chat", status("Deciding"), status("Promoting", PROMOTE), AT)
    body = notify.webhook_body(n)
    assert body["summary"] == "LookaheadPolicy inference/chat: decided PromoteRegimeAware"
    assert {k: body[k] for k in ("kind", "namespace", "policy", "action", "severity", "at")} == {
        "kind": "decision", "namespace": "inference", "policy": "chat", "action": "PromoteRegimeAware",
        "severity": "info", "at": AT}
    text = notify.slack_body(n)["text"]
    assert text.startswith(":information_source: *LookaheadPolicy inference/chat: decided PromoteRegimeAware*")
    assert PROMOTE["reason"] in text and list(notify.slack_body(n)) == ["text"]


def test_urls_are_checked_and_named():
    assert notify.check_url(notify.ENV_SLACK, " https://hooks.slack.com/services/T/B/X ") == \
        "https://hooks.slack.com/services/T/B/X"
    for bad in ("hooks.slack.com/x", "ftp://h/x", "https://"):
        with pytest.raises(ValueError, match=notify.ENV_WEBHOOK):
            notify.check_url(notify.ENV_WEBHOOK, bad)
    assert notify.from_env({}).sinks == {}
    assert set(notify.from_env({notify.ENV_WEBHOOK: "http://r:8080/hook", notify.ENV_SLACK: ""}).sinks) == {"webhook"}
