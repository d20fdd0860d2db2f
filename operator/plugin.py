"""`kubectl lookahead approve|abort|pause|resume|status|report POLICY`: the gates, acting through
the Kubernetes API on LookaheadPolicy objects. The operator sees them on its next tick and says so
in status and events.

- approve: annotation ``lookahead.dev/approve=<decision id>`` (an approval names the decision it
  saw; a changed spec makes a new decision, which needs a new approval)
- abort:   annotation ``lookahead.dev/abort=true`` (rolls back whatever was promoted)
- pause / resume: ``spec.paused``
"""

from __future__ import annotations

import argparse
import json
import sys

GROUP, VERSION, PLURAL = "lookahead.dev", "v1alpha1", "lookaheadpolicies"


class GateError(ValueError):
    pass


def approve_patch(policy: dict) -> dict:
    decision = (policy.get("status") or {}).get("decision") or {}
    if not decision.get("id") or decision.get("action") not in ("Promote", "PromoteRegimeAware"):
        raise GateError(f"nothing to approve: the policy's decision is {decision.get('action') or 'not made yet'} "
                        "(kubectl lookahead status shows it)")
    return {"metadata": {"annotations": {f"{GROUP}/approve": decision["id"]}}}


def abort_patch(reason: str | None = None) -> dict:
    ann = {f"{GROUP}/abort": "true"}
    if reason:
        ann[f"{GROUP}/abort-reason"] = reason[:256]
    return {"metadata": {"annotations": ann}}


def pause_patch(paused: bool) -> dict:
    return {"spec": {"paused": paused}}


def status_rows(policy: dict) -> list[list[str]]:
    """The per-batch table of a policy's status, as rows of text."""
    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    def pct(x):
        return None if x is None else 100 * x

    rows = []
    for r in (policy.get("status") or {}).get("batches") or []:
        iv = r.get("tpotInterval")
        n = r.get("samples") or {}
        rows.append([str(r["batchSize"]), f(r.get("controlTpotMs")), f(r.get("canaryTpotMs")),
                     f(pct(r.get("tpotChange")), "{:+.1f}%") + (f" [{100 * iv[0]:+.1f}, {100 * iv[1]:+.1f}]" if iv else ""),
                     f(r.get("controlTokensPerSecond"), "{:.1f}"), f(r.get("canaryTokensPerSecond"), "{:.1f}"),
                     f(pct(r.get("throughputChange")), "{:+.1f}%"), f(r.get("acceptanceRate"), "{:.2f}"),
                     f"{n.get('control', '-')}/{n.get('canary', '-')}" if n else "-", r.get("verdict", "-")])
    return rows


def print_status(policy: dict, out=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out or sys.stdout)
    meta, st = policy["metadata"], policy.get("status") or {}
    console.print(f"[bold]{meta['namespace']}/{meta['name']}[/bold]  phase [bold]{st.get('phase', 'Pending')}[/bold]"
                  f"  wave {st.get('currentWave') or '-'}  {st.get('message') or ''}")
    table = Table("batch", "control ms/tok", "canary ms/tok", "TPOT change [CS]", "control tok/s",
                  "canary tok/s", "throughput", "acceptance", "n", "verdict", title="canary vs control")
    for row in status_rows(policy):
        table.add_row(*row)
    console.print(table)
    d = st.get("decision")
    if d:
        console.print(f"[bold]decision[/bold] {d.get('action')} (crossover {d.get('crossoverBatchSize') or '-'}): "
                      f"{d.get('reason')}")
    for c in st.get("conditions") or []:
        console.print(f"  {c['type']:<14} {c['status']:<6} {c['reason']}: {c.get('message', '')}")
    if st.get("rollback"):
        console.print(f"[red]rolled back[/red]: {st['rollback'].get('message')}")


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    for verb, helptext in (("approve", "allow the promotion a decision awaits"),
                           ("abort", "stop the rollout and restore the fleet"),
                           ("pause", "hold the policy where it is"), ("resume", "let a paused policy go on"),
                           ("status", "phase, per-batch table, decision and conditions"),
                           ("report", "the decision and every number behind it, as JSON")):
        p = sub.add_parser(verb, help=helptext)
        p.add_argument("policy", help="LookaheadPolicy name")
        p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig's)")
        if verb == "abort":
            p.add_argument("--reason", default=None)
        p.set_defaults(func=run_gate, verb=verb)


def _api():
    from kubernetes import client, config

    try:
        config.load_kube_config()
        _, active = config.list_kube_config_contexts()
        namespace = active.get("context", {}).get("namespace") or "default"
    except config.ConfigException:
        config.load_incluster_config()
        namespace = "default"
    return client.CustomObjectsApi(), namespace


def run_gate(args: argparse.Namespace) -> int:
    from kubernetes.client.rest import ApiException

    api, default_ns = _api()
    ns = args.namespace or default_ns
    try:
        policy = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, args.policy)
    except ApiException as exc:
        if exc.status == 404:
            print(f"error: LookaheadPolicy {ns}/{args.policy} not found (kubectl get lap -n {ns})", file=sys.stderr)
            return 1
        raise
    try:
        patch = _gate_patch(args, policy)
    except GateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if patch is not None:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, args.policy, patch)
        print(f"lookaheadpolicy.{GROUP}/{args.policy} {args.verb}{'d' if args.verb.endswith('e') else 'ed'}")
        return 0
    if args.verb == "status":
        print_status(policy)
        return 0
    st = policy.get("status") or {}
    print(json.dumps({"policy": f"{ns}/{args.policy}", "phase": st.get("phase"), "decision": st.get("decision"),
                      "batches": st.get("batches"), "preflight": st.get("preflight"), "guard": st.get("guard"),
                      "rollback": st.get("rollback"), "targets": st.get("targets")}, indent=2))
    return 0


def _gate_patch(args: argparse.Namespace, policy: dict) -> dict | None:
    return {
        "approve": lambda: approve_patch(policy),
        "abort": lambda: abort_patch(getattr(args, "reason", None)),
        "pause": lambda: pause_patch(True),
        "resume": lambda: pause_patch(False),
    }.get(args.verb, lambda: None)()
