"""What several integration tests do the same way: name and create namespaces in the session's
apiserver, poll a condition that may fail at once, and stop a child process they started."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

from kubernetes import client

T = TypeVar("T")


def unique_name(prefix: str) -> str:
    """``prefix`` and six random hex digits: a name no other test (or earlier run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_namespace(kube_api: client.ApiClient, prefix: str) -> str:
    """A new namespace with a unique name starting with ``prefix``; returns its name."""
    name = unique_name(prefix)
    client.CoreV1Api(kube_api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def namespace_while_used(kube_api: client.ApiClient, prefix: str) -> Iterator[str]:
    """The body of a namespace fixture (``yield from`` it, in the fixture's own scope): a new
    namespace named after ``prefix``, deleted at the fixture's teardown."""
    name = create_namespace(kube_api, prefix)
    yield name
    client.CoreV1Api(kube_api).delete_namespace(name)


def wait_until(cond: Callable[[], T], timeout: float, what: str, interval: float) -> T:
    """Call ``cond`` every ``interval`` s until it returns something truthy, and return that.

    Unlike ``lookahead_dev.devcluster.wait_for``, an exception from ``cond`` is not retried: it
    fails the test at once (a server that exited). After ``timeout`` s: AssertionError."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def terminate(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM ``proc`` if it still runs, then SIGKILL it if it has not exited after ``grace`` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
