"""Which new Deployments wake a policy waiting in Pending (``wakeups.pending_namespaces``)."""

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.runtime.wakeups import pending_namespaces

SELECTOR = {"matchLabels": {"app": "chat"}}


def test_a_policy_in_its_own_namespace_waits_on_the_namespaces_it_searches():
    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": SELECTOR}})
    assert pending_namespaces(spec, {"inference": 1}) == frozenset({"inference"})


def test_named_namespaces_are_waited_on_even_beside_a_namespace_selector():
    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": SELECTOR, "namespaces": ["a", "b"],
                                                           "namespaceSelector": {"matchLabels": {"team": "x"}}}})
    assert pending_namespaces(spec, ["a", "b"]) == frozenset({"a", "b"})


def test_a_namespace_selector_naming_no_namespace_waits_on_any_namespace():
    spec = LookaheadPolicySpec.model_validate({"targets": {"selector": SELECTOR,
                                                           "namespaceSelector": {"matchLabels": {"team": "x"}}}})
    assert pending_namespaces(spec, ["a"]) is None     # a namespace labelled later may hold its targets


def test_a_spec_that_does_not_parse_waits_on_what_is_searched_now():
    assert pending_namespaces(None, ["inference"]) == frozenset({"inference"})
