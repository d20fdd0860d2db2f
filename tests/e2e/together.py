"""The scenarios of one test module run at the same time on the one real node (issue 22: CI's
budget). An end-to-end rollout mostly waits (steps, warm-ups, waves, guards, deadlines: the
engines are simulated and idle between requests), so three rollouts side by side take about as
long as the longest of them, not as long as all three.

A module registers its scenarios (what a test used to do, line by line: build a fleet, apply a
policy, inject its fault, wait, assert), written as a test is, asking by parameter name for what
they need (``apis``, ``tmp_path``, ``reliability``, ``invariants``, and the module's shared
fixtures: its operator, ``prometheus``), with ``scenarios.add``; its module fixture ``running``
(``yield from scenarios.run(...)``) starts one thread per scenario whose test is selected, all at
once, each in its own namespaces, against the module's one operator; each test then waits for its own scenario
(``running.result(request)``) and fails with that scenario's own traceback. ``pytest -k`` of one
test still runs that scenario alone.

What the per-test fixtures of tests/e2e/conftest.py do, the module fixture does for all of its
scenarios at once: one invariant watcher from before the first scenario starts to after the last
ends (each test also checks it when it ends, so a violation fails the test that sees it), and the
namespaces the scenarios created deleted at the end, while the operator still runs. Each
scenario's ``reliability`` row is written by its own test, passed or failed, as before.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Callable

import pytest
from kubernetes import client

from . import reliability as rel
from .helpers import delete_namespaces, namespace_names

SCENARIO_TIMEOUT_S = 840   # a scenario's own waits end well before this; then its test fails saying so


Scenario = Callable[..., None]


class Running:
    """The scenarios of one module, started together; ``result`` waits for one."""

    def __init__(self, watcher):
        self.watcher = watcher
        self.threads: dict[str, threading.Thread] = {}
        self.errors: dict[str, BaseException] = {}
        self.recorders: dict[str, rel.Recorder] = {}

    def start(self, name: str, fn: Scenario, fixtures: dict[str, Any]) -> None:
        """Run ``fn`` in a thread with the ``fixtures`` its parameters name."""
        wanted = inspect.signature(fn).parameters
        missing = [p for p in wanted if p not in fixtures]
        assert not missing, f"scenario {name!r} asks for {missing}; a scenario gets {sorted(fixtures)}"
        kwargs = {p: fixtures[p] for p in wanted}

        def body() -> None:
            try:
                fn(**kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the scenario's test, which raises it
                self.errors[name] = exc

        self.recorders[name] = fixtures["reliability"]
        t = threading.Thread(target=body, name=f"scenario-{name}", daemon=True)
        self.threads[name] = t
        t.start()

    def join_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads.values():
            t.join(max(0.0, deadline - time.monotonic()))

    def result(self, request: pytest.FixtureRequest) -> None:
        """Wait for the scenario of the test that asks (its name is the test's, less ``test_``);
        raise what it raised; then the invariants, as every end-to-end test checks them."""
        name = _scenario_name(request.node)
        t = self.threads.get(name)
        assert t is not None, f"scenario {name!r} was not started (the module registers none of that name)"
        t.join(SCENARIO_TIMEOUT_S)
        assert not t.is_alive(), f"scenario {name!r} still running after {SCENARIO_TIMEOUT_S} s"
        if name in self.errors:
            raise self.errors[name]
        self.watcher.assert_clean()


def _scenario_name(item: pytest.Item) -> str:
    return getattr(item, "originalname", item.name).removeprefix("test_")


class Scenarios:
    """A module's registry: ``@scenarios.add`` on each scenario function (named as its test, less
    ``test_``)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Scenario] = {}

    def add(self, fn: Scenario) -> Scenario:
        self.by_name[fn.__name__] = fn
        return fn

    def run(self, request: pytest.FixtureRequest, kube_api, tmp_path_factory, **shared: Any):
        """The body of a module fixture: start the module's selected scenarios, yield ``Running``,
        then wait for them, delete their namespaces and stop the watcher. ``shared``: the module's
        fixtures every scenario may ask for by name (its operator, ``prometheus``)."""
        from lookahead_dev.invariants import InvariantWatcher

        items = [i for i in request.session.items if i.module is request.module]
        names = [n for n in dict.fromkeys(_scenario_name(i) for i in items) if n in self.by_name]
        core = client.CoreV1Api(kube_api)
        before = namespace_names(core)
        # (strict_decisions=False as in conftest's per-test watcher: a regime-aware promotion at
        # the deadline may leave a planned batch size above the measured wins unsettled)
        watcher = InvariantWatcher(kube_api, strict_decisions=False)
        watcher.start()
        assert watcher.wait_synced(30), watcher.events()[-5:]
        running = Running(watcher)
        api_clients = []
        try:
            for name in names:
                item = next(i for i in items if _scenario_name(i) == name)
                api = client.ApiClient(kube_api.configuration)
                api_clients.append(api)
                # (each scenario's clients on an ApiClient of its own, as conftest's ``apis``)
                apis = (client.AppsV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api),
                        client.BatchV1Api(api))
                running.start(name, self.by_name[name], {
                    **shared, "apis": apis, "tmp_path": tmp_path_factory.mktemp(name[:40]),
                    "reliability": rel.Recorder(item.nodeid), "invariants": watcher})
            yield running
        finally:
            running.join_all(SCENARIO_TIMEOUT_S)
            try:
                delete_namespaces(core, namespace_names(core) - before, timeout=180)
            finally:
                watcher.stop()
                for api in api_clients:
                    api.close()
            watcher.assert_clean()


def recorder_of(request: pytest.FixtureRequest) -> rel.Recorder | None:
    """The reliability row of a scenario started by its module's ``running`` fixture, if any."""
    if "running" not in request.fixturenames:
        return None
    return request.getfixturevalue("running").recorders.get(_scenario_name(request.node))
