"""The operator's own metrics (prometheus_client), served on its /metrics port.

What the chart's alerts (templates/prometheusrule.yaml) and Grafana dashboard
(dashboards/lookahead.json) query; docs/operator.md lists them."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge,
                               Histogram, start_http_server)

from lookahead_operator.api.status import Phase

if TYPE_CHECKING:
    from lookahead_operator.api.status import LookaheadPolicyStatus

REGISTRY = CollectorRegistry()
# the process's own health (process_cpu_seconds_total, process_resident_memory_bytes, ...), as the
# default registry would have it
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

POLICIES_BY_PHASE = Gauge("lookahead_operator_policies", "LookaheadPolicies by phase.", ["phase"], registry=REGISTRY)
DECISIONS = Counter("lookahead_operator_decisions", "Decisions taken, by action.", ["action"], registry=REGISTRY)
ROLLBACKS = Counter("lookahead_operator_rollbacks", "Automatic or requested rollbacks, by reason.", ["reason"],
                    registry=REGISTRY)
RECONCILE_ERRORS = Counter("lookahead_operator_reconcile_errors",
                           "Reconcile passes that failed (an action refused, or the pass raised), by phase.",
                           ["phase"], registry=REGISTRY)
RECONCILES = Counter("lookahead_operator_reconciles", "Reconcile passes.", registry=REGISTRY)
NOTIFICATIONS = Counter("lookahead_operator_notifications",
                        "Notifications (runtime.notify) by sink (webhook, slack) and result (sent, failed, dropped).",
                        ["sink", "result"], registry=REGISTRY)
TIME_IN_PHASE = Histogram("lookahead_operator_phase_seconds", "Seconds a policy spent in a phase before leaving it.",
                          ["phase"], buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200), registry=REGISTRY)

# Per policy. Its namespace is `policy_namespace`: a scrape's target labels (the ServiceMonitor's
# `namespace`, the operator's own) would otherwise rename it to `exported_namespace`.
_POLICY = ["policy_namespace", "policy"]
POLICY_PHASE = Gauge("lookahead_operator_policy_phase", "1 for the phase each policy is in (one series a policy).",
                     [*_POLICY, "phase"], registry=REGISTRY)
BATCH_VERDICT = Gauge("lookahead_operator_policy_batch_verdict",
                      "1 for the verdict of each measured batch size of each policy (status.batches).",
                      [*_POLICY, "batch_size", "verdict"], registry=REGISTRY)
BATCH_TPOT_CHANGE = Gauge("lookahead_operator_policy_batch_tpot_change",
                          "Canary vs control per-token latency change per batch size, fraction (-0.3 = 30% lower).",
                          [*_POLICY, "batch_size"], registry=REGISTRY)
BATCH_THROUGHPUT_CHANGE = Gauge("lookahead_operator_policy_batch_throughput_change",
                                "Canary vs control throughput change per batch size, fraction.",
                                [*_POLICY, "batch_size"], registry=REGISTRY)

for _phase in Phase:  # every phase's error counter from 0: rate() and increase() see the first error
    RECONCILE_ERRORS.labels(_phase.value)

_lock = threading.Lock()   # passes record from their threads, the finalizer from Kopf's executor
_phases: dict[str, str] = {}
_series: dict[str, set[tuple[Gauge, tuple[str, ...]]]] = {}   # policy -> the per-policy series it has


def _record_phase(policy: str, phase: str | None) -> None:
    """Keep the by-phase gauge equal to the policies this process reconciles (``_lock`` held)."""
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


def record_policy(policy: str, status: "LookaheadPolicyStatus | None") -> None:
    """After a pass (``status``) or a deletion (None) of ``policy`` ("namespace/name"): the by-phase
    gauge, and the policy's own series (its phase, and per measured batch size its verdict and
    changes), replaced whole; a deleted policy's series are removed."""
    values: dict[tuple[Gauge, tuple[str, ...]], float] = {}
    if status is not None:
        namespace, _, name = policy.partition("/")
        values[(POLICY_PHASE, (namespace, name, str(status.phase)))] = 1
        for row in status.batches or []:
            size = str(row.batch_size)
            values[(BATCH_VERDICT, (namespace, name, size, str(row.verdict)))] = 1
            if row.tpot_change is not None:
                values[(BATCH_TPOT_CHANGE, (namespace, name, size))] = row.tpot_change
            if row.throughput_change is not None:
                values[(BATCH_THROUGHPUT_CHANGE, (namespace, name, size))] = row.throughput_change
    with _lock:
        _record_phase(policy, None if status is None else str(status.phase))
        for gauge, labels in _series.pop(policy, set()) - values.keys():
            gauge.remove(*labels)
        for (gauge, labels), value in values.items():
            gauge.labels(*labels).set(value)
        if values:
            _series[policy] = set(values)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
