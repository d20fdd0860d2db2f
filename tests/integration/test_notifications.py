"""Notifications (issue 24, item 5) posted over real HTTP to a local receiver: one message per
notice and sink; a receiver that hangs or fails never blocks the caller, is retried within bounds,
and is counted."""

from __future__ import annotations

import time

import pytest

from lookahead_dev.webhook_receiver import WebhookReceiver
from lookahead_operator.api.status import LookaheadPolicyStatus
from lookahead_operator.runtime import metrics, notify

pytestmark = pytest.mark.integration


@pytest.fixture()
def receiver():
    made = []

    def make(**kw) -> WebhookReceiver:
        made.append(WebhookReceiver(**kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def notices(phase_from="Deciding", phase_to="Promoting"):
    old = LookaheadPolicyStatus.model_validate({"phase": phase_from})
    new = LookaheadPolicyStatus.model_validate({"phase": phase_to, "decision": {
        "id": "g1-Promote", "action": "Promote", "reason": "faster at every batch size"}})
    return notify.notices("inference", "chat", old, new, "2026-12-05T09:00:00+00:00")


def count(sink: str, result: str) -> float:
    return metrics.REGISTRY.get_sample_value("lookahead_operator_notifications_total",
                                             {"sink": sink, "result": result}) or 0.0


def test_each_sink_gets_one_message_per_notice(receiver):
    hook, slack = receiver(), receiver()
    n = notify.from_env({notify.ENV_WEBHOOK: hook.url + "/hook", notify.ENV_SLACK: slack.url + "/services/T/B/X"})
    sent = count("webhook", "sent"), count("slack", "sent")
    n.submit(notices())
    assert n.drain(10)
    assert [(g["path"], g["body"]["kind"], g["body"]["action"]) for g in hook.got] == [("/hook", "decision", "Promote")]
    assert len(slack.got) == 1 and "decided Promote" in slack.got[0]["body"]["text"]
    assert (count("webhook", "sent"), count("slack", "sent")) == (sent[0] + 1, sent[1] + 1)


def test_a_failing_receiver_is_retried_then_given_up_and_a_refusal_is_not_retried(receiver):
    flaky = receiver(answers=[503, 502])
    n = notify.Notifier({"webhook": (flaky.url, notify.webhook_body)}, backoff_s=0.05)
    n.submit(notices())
    assert n.drain(10)
    assert [g["code"] for g in flaky.got] == [503, 502, 200]          # retried on 5xx, then delivered
    down = receiver(answers=[500] * 10)
    failed = count("webhook", "failed")
    n = notify.Notifier({"webhook": (down.url, notify.webhook_body)}, retries=2, backoff_s=0.05)
    n.submit(notices())
    assert n.drain(10)
    assert len(down.got) == 3 and count("webhook", "failed") == failed + 1   # bounded: 1 + 2 retries
    refused = receiver(answers=[400])
    n = notify.Notifier({"webhook": (refused.url, notify.webhook_body)}, backoff_s=0.05)
    n.submit(notices())
    assert n.drain(10) and len(refused.got) == 1


def test_a_hanging_receiver_never_blocks_the_pass(receiver):
    slow = receiver(hang=3.0)
    n = notify.Notifier({"webhook": (slow.url, notify.webhook_body)}, timeout_s=0.5, retries=0)
    t0 = time.monotonic()
    n.submit(notices() * 5)
    assert time.monotonic() - t0 < 0.2, "submit waited on the receiver"
    failed = count("webhook", "failed")
    assert n.drain(15)
    assert count("webhook", "failed") == failed + 5                  # each gave up at its timeout
