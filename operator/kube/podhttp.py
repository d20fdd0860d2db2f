"""Reading a small JSON answer from a pod's own HTTP endpoint (a fleet engine's version), bounded:
one request, ``POD_HTTP_TIMEOUT_S`` for each of connect and read (the whole answer within twice that), no retries, no proxy
from the environment (a pod IP is reached directly). A failure is data: :class:`PodHTTPError`
with what happened, for a message; a 404 is told apart (:attr:`PodHTTPError.not_found`) so a
caller can try an older release's path."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

#: Every read of a pod's endpoint is bounded; the pass does not wait longer, and does not retry.
POD_HTTP_TIMEOUT_S = 2.0
#: The most of an answer read: a version endpoint's answer is small (SGLang's server info is a few KiB).
MAX_ANSWER_BYTES = 1 << 20


class PodHTTPError(Exception):
    """A pod's endpoint did not answer with JSON; ``status`` is the HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


def get_json(url: str, timeout_s: float = POD_HTTP_TIMEOUT_S) -> Any:
    """``GET url`` and its JSON answer; :class:`PodHTTPError` for anything else (a refused or
    timed-out connection, a non-2xx status, an answer that is not JSON or is too large). The whole
    exchange ends within about twice ``timeout_s`` (connect, then the answer by its deadline)."""
    deadline = time.monotonic() + 2 * timeout_s
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout_s), trust_env=False, follow_redirects=False) as client:
            with client.stream("GET", url, headers={"Accept": "application/json"}) as r:
                if r.status_code // 100 != 2:
                    raise PodHTTPError(f"GET {url}: HTTP {r.status_code}", r.status_code)
                body = b""
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise PodHTTPError(f"GET {url}: the answer is larger than {MAX_ANSWER_BYTES} bytes")
                    if time.monotonic() > deadline:
                        raise PodHTTPError(f"GET {url}: the answer took longer than {2 * timeout_s:g} s")
    except httpx.TimeoutException:
        raise PodHTTPError(f"GET {url}: no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise PodHTTPError(f"GET {url}: {type(exc).__name__}: {exc}") from None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise PodHTTPError(f"GET {url}: the answer is not JSON ({exc})", r.status_code) from None
