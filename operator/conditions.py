"""Status conditions in the Kubernetes API convention, as pure functions over plain dicts."""

from __future__ import annotations

from datetime import datetime, timezone


def now_rfc3339(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict] | None, type_: str, status: bool | str, reason: str, message: str,
                  generation: int | None, now: datetime | None = None) -> list[dict]:
    """Return a new list with condition ``type_`` set.

    ``lastTransitionTime`` moves only when the status changes, as the API conventions require;
    reason, message and observedGeneration are always updated.
    """
    status_str = status if isinstance(status, str) else ("True" if status else "False")
    out: list[dict] = []
    found = False
    for cond in conditions or []:
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        changed = cond.get("status") != status_str
        out.append({
            "type": type_,
            "status": status_str,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(now) if changed else cond.get("lastTransitionTime", now_rfc3339(now)),
            "observedGeneration": generation,
        })
    if not found:
        out.append({"type": type_, "status": status_str, "reason": reason, "message": message,
                    "lastTransitionTime": now_rfc3339(now), "observedGeneration": generation})
    return out


def get_condition(conditions: list[dict] | None, type_: str) -> dict | None:
    for cond in conditions or []:
        if cond.get("type") == type_:
            return cond
    return None
