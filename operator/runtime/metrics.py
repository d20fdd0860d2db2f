"""The operator's own metrics (prometheus_client), served on its /metrics port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

POLICIES_BY_PHASE = Gauge("lookahead_operator_policies", "LookaheadPolicies by phase.", ["phase"], registry=REGISTRY)
DECISIONS = Counter("lookahead_operator_decisions", "Decisions taken, by action.", ["action"], registry=REGISTRY)
ROLLBACKS = Counter("lookahead_operator_rollbacks", "Automatic or requested rollbacks, by reason.", ["reason"],
                    registry=REGISTRY)
RECONCILE_ERRORS = Counter("lookahead_operator_reconcile_errors", "Reconcile passes that raised.", ["phase"],
                           registry=REGISTRY)
RECONCILES = Counter("lookahead_operator_reconciles", "Reconcile passes.", registry=REGISTRY)
TIME_IN_PHASE = Histogram("lookahead_operator_phase_seconds", "Seconds a policy spent in a phase before leaving it.",
                          ["phase"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200), registry=REGISTRY)

_phases: dict[str, str] = {}


def record_phase(policy: str, phase: str | None) -> None:
    """Keep the by-phase gauge equal to the policies this process reconciles."""
    if phase is None:
        _phases.pop(policy, None)
    else:
        _phases[policy] = phase
    counts: dict[str, int] = {}
    for p in _phases.values():
        counts[p] = counts.get(p, 0) + 1
    for p in list(POLICIES_BY_PHASE._metrics):  # reset phases no policy is in any more
        POLICIES_BY_PHASE.labels(*p).set(0)
    for p, n in counts.items():
        POLICIES_BY_PHASE.labels(p).set(n)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
