"""`kubectl lookahead approve|abort|pause|resume|status|report POLICY`: the gates, acting through
the Kubernetes API on LookaheadPolicy objects. The operator sees them on its next tick and says so
in status and events.

- approve: annotation ``lookahead.dev/approve=<decision id>`` (an approval names the decision it
  saw; a changed spec makes a new decision, which needs a new approval)
- abort:   annotation ``lookahead.dev/abort=true`` (rolls back whatever was promoted)
- pause / resume: ``spec.paused``

Connection: ``--kubeconfig PATH`` (else ``$KUBECONFIG``, a ``:``-separated list as kubectl reads it,
else ``~/.kube/config``, else the in-cluster ServiceAccount), ``--context NAME`` (else the
kubeconfig's current-context), ``-n NS`` (else the context's namespace, else ``default``). Every API
call is bounded by ``--request-timeout`` (default 10 s) and is tried once.

Every failure is one line on stderr, ``kubectl-lookahead: <what failed>: <what to do>``, and an
exit status a script can act on (``EXIT_CODES``, also shown by ``--help``):

  0  done
  1  not found or nothing to do: no such policy, the LookaheadPolicy CRD is not installed,
     nothing to approve, or another refusal by the API server
  2  bad input: an invalid namespace or policy name (refused before any API call), a change the
     API server rejected as invalid, a usage error
  3  cannot use the cluster: no kubeconfig, a kubeconfig that does not parse or names no usable
     context, connection refused, an untrusted TLS certificate, a timeout, an API server error (5xx)
  4  not allowed: the credentials were rejected (401) or RBAC forbids the request (403)

The ``status`` table is plain text no wider than the output: ``$COLUMNS``, else the terminal's
width, else 80 (a pipe). Columns that do not fit continue in a second table (each repeats the batch
column); a number is never cut.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from lookahead_operator.api.names import ANNOTATION_ABORT, ANNOTATION_ABORT_REASON, ANNOTATION_APPROVE, GROUP, PLURAL, VERSION

PROG = "kubectl-lookahead"

EXIT_OK, EXIT_NOT_FOUND, EXIT_BAD_INPUT, EXIT_CLUSTER, EXIT_FORBIDDEN = 0, 1, 2, 3, 4
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_NOT_FOUND: "not found or nothing to do (no such policy, CRD not installed, nothing to approve)",
    EXIT_BAD_INPUT: "bad input (invalid namespace or policy name, a change the API server rejected, usage)",
    EXIT_CLUSTER: "cannot use the cluster (no or broken kubeconfig, unreachable, untrusted TLS, timeout, 5xx)",
    EXIT_FORBIDDEN: "not allowed (401 Unauthorized, 403 Forbidden by RBAC)",
}
EXIT_EPILOG = "exit status:\n" + "\n".join(f"  {code}  {what}" for code, what in EXIT_CODES.items())
DEFAULT_REQUEST_TIMEOUT = 10.0
CRD_HINT = ("helm install lookahead-operator charts/lookahead-operator -n lookahead-system --create-namespace, "
            "or kubectl apply -f crds/")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class GateError(ValueError):
    pass


class PluginError(Exception):
    """A failure the plugin reports as one line and an exit status."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = " ".join(str(message).split())


# ---------------------------------------------------------------------------------- the gates

def approve_patch(policy: dict) -> dict:
    decision = (policy.get("status") or {}).get("decision") or {}
    if not decision.get("id") or decision.get("action") not in ("Promote", "PromoteRegimeAware"):
        raise GateError(f"nothing to approve: the policy's decision is {decision.get('action') or 'not made yet'} "
                        "(kubectl lookahead status shows it)")
    return {"metadata": {"annotations": {ANNOTATION_APPROVE: decision["id"]}}}


def abort_patch(reason: str | None = None) -> dict:
    ann = {ANNOTATION_ABORT: "true"}
    if reason:
        ann[ANNOTATION_ABORT_REASON] = reason[:256]
    return {"metadata": {"annotations": ann}}


def pause_patch(paused: bool) -> dict:
    return {"spec": {"paused": paused}}


# ----------------------------------------------------------------------------- input checks

def check_namespace(ns: str, source: str = "-n/--namespace") -> None:
    """Kubernetes validates namespace names as DNS-1123 labels."""
    if not isinstance(ns, str) or len(ns) > 63 or not _DNS1123_LABEL.match(ns):
        raise PluginError(EXIT_BAD_INPUT, f"invalid namespace {ns!r} ({source}): a namespace is at most 63 "
                                          "lowercase letters, digits and '-', starting and ending with a letter "
                                          "or digit")


def check_policy_name(name: str) -> None:
    """Kubernetes validates custom object names as DNS-1123 subdomains."""
    if not isinstance(name, str) or len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        raise PluginError(EXIT_BAD_INPUT, f"invalid policy name {name!r} (POLICY): a name is at most 253 lowercase "
                                          "letters, digits, '-' and '.', starting and ending with a letter or digit")


# --------------------------------------------------------------------------- the status table

@dataclass(frozen=True)
class Column:
    key: str
    header: tuple[str, ...]  # header lines
    numeric: bool            # right-aligned


COLUMNS: tuple[Column, ...] = (
    Column("batchSize", ("batch",), True),
    Column("controlTpotMs", ("control", "ms/tok"), True),
    Column("canaryTpotMs", ("canary", "ms/tok"), True),
    Column("tpotChange", ("TPOT", "change"), True),
    Column("tpotInterval", ("TPOT CS", "%"), True),
    Column("controlTokensPerSecond", ("control", "tok/s"), True),
    Column("canaryTokensPerSecond", ("canary", "tok/s"), True),
    Column("throughputChange", ("tok/s", "change"), True),
    Column("throughputInterval", ("tok/s CS", "%"), True),
    Column("acceptanceRate", ("accept", "rate"), True),
    Column("samples", ("samples", "ctl/can"), True),
    Column("verdict", ("verdict",), False),
)
# Which columns go into the first table, group by group, when they do not all fit: the verdict and
# the changes first, then absolute latency, acceptance and samples, then absolute tokens/s, then
# the intervals. A group that does not fit moves whole to the next table.
COLUMN_GROUPS: tuple[tuple[str, ...], ...] = (
    ("verdict", "tpotChange", "throughputChange"),
    ("controlTpotMs", "canaryTpotMs"),
    ("acceptanceRate", "samples"),
    ("controlTokensPerSecond", "canaryTokensPerSecond"),
    ("tpotInterval", "throughputInterval"),
)
GAP = 2


def _fmt(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None:
        return "-"
    try:
        return fmt.format(x)
    except (TypeError, ValueError):
        return str(x)


def _pct(x: Any) -> Any:
    return 100 * x if isinstance(x, (int, float)) and not isinstance(x, bool) else x


def _interval(iv: Any) -> str:
    if isinstance(iv, (list, tuple)) and len(iv) == 2 and all(isinstance(v, (int, float)) for v in iv):
        return f"[{100 * iv[0]:+.1f}, {100 * iv[1]:+.1f}]"
    return "-" if iv is None else str(iv)


def _samples(n: Any) -> str:
    if not isinstance(n, dict) or not n:
        return "-"
    return f"{_fmt(n.get('control'), '{}')}/{_fmt(n.get('canary'), '{}')}"


_CELL: dict[str, Callable[[dict], str]] = {
    "batchSize": lambda r: _fmt(r.get("batchSize"), "{}"),
    "controlTpotMs": lambda r: _fmt(r.get("controlTpotMs")),
    "canaryTpotMs": lambda r: _fmt(r.get("canaryTpotMs")),
    "tpotChange": lambda r: _fmt(_pct(r.get("tpotChange")), "{:+.1f}%"),
    "tpotInterval": lambda r: _interval(r.get("tpotInterval")),
    "controlTokensPerSecond": lambda r: _fmt(r.get("controlTokensPerSecond"), "{:.1f}"),
    "canaryTokensPerSecond": lambda r: _fmt(r.get("canaryTokensPerSecond"), "{:.1f}"),
    "throughputChange": lambda r: _fmt(_pct(r.get("throughputChange")), "{:+.1f}%"),
    "throughputInterval": lambda r: _interval(r.get("throughputInterval")),
    "acceptanceRate": lambda r: _fmt(r.get("acceptanceRate")),
    "samples": lambda r: _samples(r.get("samples")),
    "verdict": lambda r: _fmt(r.get("verdict"), "{}"),
}


def status_rows(policy: dict) -> list[list[str]]:
    """The per-batch table of a policy's status, as rows of text, one cell per ``COLUMNS`` entry.
    Rows that are not objects are skipped; keys the table does not know are ignored."""
    batches = (policy.get("status") or {}).get("batches") or []
    return [[_CELL[c.key](r) for c in COLUMNS] for r in batches if isinstance(r, dict)]


def _widths(rows: list[list[str]], columns: tuple[Column, ...] = COLUMNS) -> list[int]:
    return [max([len(h) for h in c.header] + [len(row[i]) for row in rows]) for i, c in enumerate(columns)]


def _pack(widths: list[int], width: int) -> list[list[int]] | None:
    """Column indexes per table: each starts with the batch column and is at most ``width`` wide.
    None when even the batch column and one other do not fit."""
    index = {c.key: i for i, c in enumerate(COLUMNS)}
    groups = [[index[k] for k in g] for g in COLUMN_GROUPS]

    def span(cols: list[int]) -> int:
        return sum(widths[i] for i in cols) + GAP * (len(cols) - 1)

    # a group wider than a whole table is split into its columns
    units: list[list[int]] = []
    for g in groups:
        if span([0] + g) <= width:
            units.append(g)
        else:
            units.extend([i] for i in g)
    if any(span([0] + u) > width for u in units):
        return None
    tables: list[list[int]] = []
    while units:
        table, rest = [0], []
        for u in units:
            if span(table + u) <= width:
                table += u
            else:
                rest.append(u)
        tables.append(sorted(table))
        units = rest
    return tables


def _render_table(cols: list[int], widths: list[int], rows: list[list[str]],
                  columns: tuple[Column, ...] = COLUMNS) -> list[str]:
    height = max(len(columns[i].header) for i in cols)
    lines = []

    def line(cells: list[tuple[str, int]]) -> str:
        parts = [(text.rjust(widths[i]) if columns[i].numeric else text.ljust(widths[i])) for text, i in cells]
        return (" " * GAP).join(parts).rstrip()

    for k in range(height):
        # a one-line header sits on the last header line
        lines.append(line([(h[k - (height - len(h))] if k >= height - len(h) else "", i)
                           for i in cols for h in [columns[i].header]]))
    for row in rows:
        lines.append(line([(row[i], i) for i in cols]))
    return lines


def _render_records(rows: list[list[str]], width: int, columns: tuple[Column, ...] = COLUMNS) -> list[str]:
    """Too narrow for any table: one block per row (its first column's header and value), one
    value a line."""
    out = []
    for row in rows:
        out.append(f"{' '.join(columns[0].header)} {row[0]}")
        for c, cell in zip(columns[1:], row[1:]):
            out.extend(_wrap(f"  {' '.join(c.header)}: {cell}", width, indent="    "))
    return out


def _wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    """Word-wrapped to ``width``; a word is broken only when it is longer than a whole line."""
    return textwrap.wrap(text, width=max(width, len(indent) + 8), subsequent_indent=indent,
                         break_on_hyphens=False) or [""]


def format_status(policy: dict, width: int = 80) -> list[str]:
    """``kubectl lookahead status`` as lines of plain text, none wider than ``width`` (unless a single
    word or number is), no number cut."""
    meta, st = policy.get("metadata") or {}, policy.get("status") or {}
    out: list[str] = []
    wave = st.get("currentWave")
    waves = st.get("waves")
    wave_text = "-" if not wave else (f"{wave}/{len(waves)}" if isinstance(waves, list) and waves else str(wave))
    head = f"{meta.get('namespace', '-')}/{meta.get('name', '-')}  phase {st.get('phase') or 'Pending'}  wave {wave_text}"
    out += _wrap(head + (f"  {st['message']}" if st.get("message") else ""), width)

    rows = status_rows(policy)
    live = _live_lines(st, width)
    if live:
        out += live
    elif rows:
        widths = _widths(rows)
        tables = _pack(widths, width)
        if tables is None:
            out += ["canary vs control"] + _render_records(rows, width)
        else:
            for n, cols in enumerate(tables):
                out += ["", "canary vs control" + (" (continued)" if n else "")]
                out += _render_table(cols, widths, rows)
        out.append("")
    else:
        out.append("no per-batch results yet")

    d = st.get("decision")
    if isinstance(d, dict) and d:
        crossover = d.get("crossoverBatchSize") or st.get("crossoverBatchSize") or "-"
        out += _wrap(f"decision {d.get('action') or '-'} (crossover {crossover}): {d.get('reason') or ''}".rstrip(),
                     width)
    out += _fleet_lines(st, width)
    out += _guard_lines(st, width)
    for c in st.get("conditions") or []:
        if isinstance(c, dict):
            out += _wrap(f"  {c.get('type', '-'):<14} {c.get('status', '-'):<6} {c.get('reason', '-')}: "
                         f"{c.get('message', '')}".rstrip(), width, indent=" " * 6)
    rollback = st.get("rollback")
    if isinstance(rollback, dict) and rollback:
        out += _wrap(f"rolled back: {rollback.get('message') or ''}".rstrip(), width)
    return out


#: status.live's per-stratum table: one row a stratum of offered load (``LiveStratum``).
LIVE_COLUMNS: tuple[Column, ...] = (
    Column("load", ("load",), False),
    Column("windows", ("windows",), True),
    Column("outcome", ("outcome",), False),
    Column("latencyChange", ("latency",), True),
    Column("latencyInterval", ("interval %",), True),
    Column("ttftChange", ("ttft",), True),
    Column("running", ("batch",), True),
)
_LIVE_CELL: dict[str, Callable[[dict], str]] = {
    "load": lambda r: f"[{_fmt(r.get('offeredLow'), '{:.3g}')}, "
                      f"{_fmt(r.get('offeredHigh'), '{:.3g}') if r.get('offeredHigh') else 'inf'})",
    "windows": lambda r: _fmt(r.get("windows"), "{}"),
    "outcome": lambda r: _fmt(r.get("outcome"), "{}"),
    "latencyChange": lambda r: _fmt(_pct(r.get("latencyChange")), "{:+.1f}%"),
    "latencyInterval": lambda r: _interval(r.get("latencyInterval")),
    "ttftChange": lambda r: _fmt(_pct(r.get("ttftChange")), "{:+.0f}%"),
    "running": lambda r: f"{_fmt(r.get('controlRunning'), '{:.1f}')}/{_fmt(r.get('canaryRunning'), '{:.1f}')}",
}


def _live_lines(st: dict, width: int) -> list[str]:
    """Live mode: the split in words, then the per-stratum table (offered load per fleet pod per
    window; the canary's per-token latency and TTFT change vs the control; both arms' mean running
    batch, control/canary), then the crossover; as the per-batch table is drawn, one record a
    stratum when too narrow.
    (An abort is said by the rollback line, as any rollback is.)"""
    live = st.get("live")
    if not isinstance(live, dict) or not live:
        return []
    out = [""] + _wrap(f"live: {live.get('message') or live.get('split') or ''}".rstrip(), width)
    out += _wrap("per stratum of offered load (requests per fleet pod per window): the canary's per-token "
                 "latency and TTFT vs the control's, each arm's mean running batch (control/canary)", width)
    rows = [r for r in live.get("strata") or [] if isinstance(r, dict)]
    if not rows:
        return out + ["no live windows yet", ""]
    cells = [[_LIVE_CELL[c.key](r) for c in LIVE_COLUMNS] for r in rows]
    widths = _widths(cells, LIVE_COLUMNS)
    if sum(widths) + GAP * (len(widths) - 1) <= width:
        out += _render_table(list(range(len(LIVE_COLUMNS))), widths, cells, LIVE_COLUMNS)
    else:
        out += _render_records(cells, width, LIVE_COLUMNS)
    if live.get("crossoverOffered") is not None:
        out += _wrap(f"lookahead stops paying at {live['crossoverOffered']:.3g} requests per pod per window "
                     f"(the control's running batch there: {_fmt(live.get('crossoverBatch'), '{:.1f}')})", width)
    return out + [""]


def _guard_lines(st: dict, width: int) -> list[str]:
    """The guard's latest comparison in one paragraph: its mode, who is compared, the sentence."""
    g = st.get("guard")
    if not isinstance(g, dict) or not g:
        return []
    where = f"wave {g['wave']}" if g.get("wave") else "final guard"
    sides = ""
    if g.get("promotedPods") is not None:
        sides = f", {g['promotedPods']} promoted pod(s) vs {g.get('baselinePods', '-')}"
        if g.get("promotedOffered") is not None:
            sides += f" at {g['promotedOffered']:.2f} vs {g.get('baselineOffered') or 0:.2f} req/s per pod"
    return _wrap(f"guard ({g.get('mode') or 'synthetic'}, {where}{sides}): {g.get('message') or ''}".rstrip(), width)


def _fleet_lines(st: dict, width: int) -> list[str]:
    """One line per target once something of the fleet is promoted: how many of its pods run
    lookahead (a replica wave promotes a Deployment in part), or that its user took it back."""
    rows = [t for t in st.get("targets") or [] if isinstance(t, dict)]
    if not any(t.get("promoted") or t.get("userEdited") for t in rows):
        return []
    out = []
    for t in rows:
        name = f"{t.get('namespace', '-')}/{t.get('name', '-')}"
        if t.get("userEdited"):
            state = "left to its user (pod template edited mid-rollout)"
        elif t.get("promoted"):
            pods, replicas = t.get("promotedPods"), t.get("replicas")
            share = f"{pods} of {replicas} pods" if isinstance(pods, int) and isinstance(replicas, int) else "promoted"
            state = f"lookahead on in {share}" + (f" (since wave {t['wave']})" if t.get("wave") else "")
        else:
            state = "not promoted"
        out += _wrap(f"  target {name}: {state}", width, indent=" " * 6)
    return out


def output_width(out) -> int:
    """``$COLUMNS``, else the terminal's width, else 80 (a pipe or a file)."""
    cols = os.environ.get("COLUMNS", "").strip()
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        pass
    return 80


def print_status(policy: dict, out=None, width: int | None = None) -> None:
    out = out or sys.stdout
    lines = format_status(policy, width or output_width(out))
    out.write("\n".join(lines) + "\n")
    out.flush()


# ------------------------------------------------------------------------------ the command line

def _timeout(text: str) -> float:
    """kubectl's --request-timeout: seconds, or with a unit (10s, 1m)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"invalid timeout {text!r}: a positive number of seconds, or 500ms, 10s, 1m")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    for verb, helptext in (("approve", "allow the promotion a decision awaits"),
                           ("abort", "stop the rollout and restore the fleet"),
                           ("pause", "hold the policy where it is"), ("resume", "let a paused policy go on"),
                           ("status", "phase, per-batch table, decision and conditions"),
                           ("report", "the decision and every number behind it, as JSON")):
        p = sub.add_parser(verb, help=helptext, description=helptext, epilog=EXIT_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("policy", help="LookaheadPolicy name")
        p.add_argument("-n", "--namespace", default=None, help="namespace (default: the kubeconfig context's)")
        p.add_argument("--kubeconfig", default=None, metavar="PATH",
                       help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)")
        p.add_argument("--context", default=None, metavar="NAME",
                       help="kubeconfig context (default: the current-context)")
        p.add_argument("--request-timeout", type=_timeout, default=DEFAULT_REQUEST_TIMEOUT, metavar="SECONDS",
                       help=f"bound on each API request (default {DEFAULT_REQUEST_TIMEOUT:g}s)")
        if verb == "abort":
            p.add_argument("--reason", default=None)
        p.set_defaults(func=run_gate, verb=verb)


# --------------------------------------------------------------------------- the API connection

@dataclass
class Session:
    api: Any                # kubernetes.client.CustomObjectsApi
    namespace: str          # the default namespace
    namespace_source: str   # where it came from, for messages
    server: str
    context: str
    timeout: float


def _kubeconfig_files(args: argparse.Namespace) -> tuple[list[str], str]:
    """The kubeconfig paths to read, and how to name them in a message."""
    if args.kubeconfig:
        return [os.path.expanduser(args.kubeconfig)], f"--kubeconfig {args.kubeconfig}"
    env = os.environ.get("KUBECONFIG")
    if env:
        return [os.path.expanduser(p) for p in env.split(os.pathsep) if p], f"KUBECONFIG={env}"
    return [os.path.expanduser("~/.kube/config")], "~/.kube/config"


def _check_kubeconfig(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PluginError(EXIT_CLUSTER, f"kubeconfig {path} is not valid YAML{where} ({problem}): fix it, or point "
                                        "KUBECONFIG / --kubeconfig at a working one (kubectl config view)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PluginError(EXIT_CLUSTER, f"cannot read kubeconfig {path} ({exc.__class__.__name__}: "
                                        f"{getattr(exc, 'strerror', None) or exc}): check the path and its "
                                        "permissions, or pass --kubeconfig") from None
    if not isinstance(data, dict) or not any(k in data for k in ("clusters", "contexts", "users")):
        found = "an empty file" if data is None else f"a YAML {type(data).__name__}"
        raise PluginError(EXIT_CLUSTER, f"kubeconfig {path} is not a kubeconfig ({found}; expected a mapping with "
                                        "clusters, contexts and users): point KUBECONFIG / --kubeconfig at a working "
                                        "one (kubectl config view)")
    return data


def connect(args: argparse.Namespace) -> Session:
    """Load the kubeconfig (or the in-cluster config) into a fresh client configuration."""
    import urllib3
    from kubernetes import client, config

    timeout = getattr(args, "request_timeout", None) or DEFAULT_REQUEST_TIMEOUT
    cfg = client.Configuration()
    files, named = _kubeconfig_files(args)
    existing = [p for p in files if os.path.isfile(p)]
    in_cluster = not args.kubeconfig and not existing and os.environ.get("KUBERNETES_SERVICE_HOST")
    if in_cluster:
        if args.context:
            raise PluginError(EXIT_CLUSTER, f"--context {args.context} needs a kubeconfig, and {named} does not "
                                            "exist: set KUBECONFIG or pass --kubeconfig PATH")
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as exc:
            raise PluginError(EXIT_CLUSTER, f"no kubeconfig ({named} does not exist) and the in-cluster "
                                            f"configuration failed ({exc}): set KUBECONFIG or pass --kubeconfig PATH")
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                namespace = f.read().strip() or "default"
        except OSError:
            namespace = "default"
        context, ns_source = "in-cluster", "the in-cluster ServiceAccount's namespace"
    else:
        if not existing:
            raise PluginError(EXIT_CLUSTER, f"no kubeconfig: {named} does not exist and this is not a pod in a "
                                            "cluster: set KUBECONFIG or pass --kubeconfig PATH "
                                            "(the file kubectl uses: kubectl config view)")
        docs = [_check_kubeconfig(p) for p in existing]
        names = [c.get("name") for d in docs for c in (d.get("contexts") or []) if isinstance(c, dict)]
        current = args.context or next((d.get("current-context") for d in docs if d.get("current-context")), None)
        listed = ", ".join(str(n) for n in names) or "none"
        if not current:
            raise PluginError(EXIT_CLUSTER, f"kubeconfig {named} has no current-context: pass --context NAME "
                                            f"(contexts: {listed})")
        if current not in names:
            raise PluginError(EXIT_CLUSTER, f"context {current!r} is not in kubeconfig {named} (contexts: {listed}): "
                                            "pass --context NAME or fix current-context")
        joined = os.pathsep.join(existing)
        try:
            config.load_kube_config(config_file=joined, context=current, client_configuration=cfg,
                                    persist_config=False)
            contexts, _ = config.list_kube_config_contexts(config_file=joined)
        except config.ConfigException as exc:
            raise PluginError(EXIT_CLUSTER, f"kubeconfig {named}, context {current!r}, is not usable "
                                            f"({str(exc).splitlines()[0] if str(exc) else 'ConfigException'}): fix it "
                                            "or pass --kubeconfig / --context") from None
        except (ValueError, TypeError, KeyError, AttributeError, OSError) as exc:
            raise PluginError(EXIT_CLUSTER, f"kubeconfig {named}, context {current!r}, is not usable "
                                            f"({exc.__class__.__name__}: {exc}): fix it or pass --kubeconfig / "
                                            "--context") from None
        ctx = next((c for c in contexts if c.get("name") == current), {})
        namespace = (ctx.get("context") or {}).get("namespace") or "default"
        context, ns_source = current, f"the namespace of kubeconfig context {current!r}"
    # one try per call, bounded by the request timeout: a dead cluster answers in seconds, not minutes
    cfg.retries = urllib3.Retry(total=0, redirect=0, raise_on_redirect=False, raise_on_status=False)
    return Session(api=client.CustomObjectsApi(client.ApiClient(cfg)), namespace=namespace,
                   namespace_source=ns_source, server=cfg.host, context=context, timeout=timeout)


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and everything it wraps (urllib3's ``.reason``, causes, contexts)."""
    seen, todo = [], [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [getattr(e, "reason", None) if isinstance(getattr(e, "reason", None), BaseException) else None,
                 e.__cause__, e.__context__]
    return seen


def transport_error(exc: BaseException, server: str, timeout: float) -> PluginError:
    """A request that got no HTTP answer, as one line."""
    import ssl

    chain = _chain(exc)
    text = " ".join(str(e) for e in chain) + " " + str(getattr(exc, "reason", ""))
    names = {type(e).__name__ for e in chain}
    hint = "is the cluster up? check KUBECONFIG / --kubeconfig / --context"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "Connection refused" in text:
        cause = "connection refused"
    elif (any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) or "CERTIFICATE_VERIFY_FAILED" in text
          or "certificate verify failed" in text):
        detail = next((getattr(e, "verify_message", None) for e in chain if getattr(e, "verify_message", None)),
                      None) or "certificate verify failed"
        return PluginError(EXIT_CLUSTER, f"cannot trust the Kubernetes API at {server} (TLS: {detail}): the "
                                         "kubeconfig's certificate-authority does not match the cluster; fetch a fresh "
                                         "kubeconfig for this cluster")
    elif "NameResolutionError" in names or "Name or service not known" in text or "nodename nor servname" in text \
            or "Temporary failure in name resolution" in text:
        cause = "cannot resolve the host name"
    elif any(isinstance(e, TimeoutError) for e in chain) or names & {"ConnectTimeoutError", "ReadTimeoutError"} \
            or "timed out" in text:
        cause = f"no answer within {timeout:g}s"
        hint = "is the cluster up and the network path open? raise --request-timeout if it is slow"
    elif any(isinstance(e, ssl.SSLError) for e in chain) or "SSLError" in names or "SSL" in text:
        first = next((str(e) for e in chain if isinstance(e, ssl.SSLError)), "") or text
        return PluginError(EXIT_CLUSTER, f"TLS with the Kubernetes API at {server} failed ({first.strip()[:160]}): "
                                         "check the server URL and the certificates in the kubeconfig")
    else:
        last = chain[-1] if chain else exc
        cause = f"{type(last).__name__}: {str(last)[:160]}"
    return PluginError(EXIT_CLUSTER, f"cannot reach the Kubernetes API at {server} ({cause}): {hint}")


def _server_message(body: Any) -> tuple[str, dict]:
    """The message of a Kubernetes Status body (or the body's first line), and the Status."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return "", {}
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        return str(body).strip().splitlines()[0][:200] if str(body).strip() else "", {}
    if not isinstance(status, dict):
        return str(body)[:200], {}
    return str(status.get("message") or "")[:300], status


def api_error(status: int, reason: str, body: Any, *, action: str, namespace: str, name: str,
              server: str, timeout: float = DEFAULT_REQUEST_TIMEOUT) -> PluginError:
    """An HTTP answer other than success, as one line (pure: the unit tests call it)."""
    message, st = _server_message(body)
    said = f": {message}" if message else ""
    if not status:  # the client's own failure (TLS) before any answer
        return transport_error(RuntimeError(reason or ""), server, timeout)
    if status == 401:
        return PluginError(EXIT_FORBIDDEN, f"the Kubernetes API at {server} rejected the credentials (401 "
                                           "Unauthorized): the token or client certificate in the kubeconfig is "
                                           "invalid or expired; log in again or fix the kubeconfig's user")
    if status == 403:
        return PluginError(EXIT_FORBIDDEN, f"forbidden (403){said or ''}: ask a cluster admin for RBAC to {action} "
                                           f"lookaheadpolicies.{GROUP} in namespace {namespace} (kubectl auth can-i "
                                           f"{action} lookaheadpolicies.{GROUP} -n {namespace})")
    if status == 404:
        details = st.get("details") if isinstance(st.get("details"), dict) else {}
        if st.get("kind") == "Status" and details.get("kind") == "namespaces":
            return PluginError(EXIT_NOT_FOUND, f"namespace {namespace} not found (kubectl get namespaces)")
        if st.get("kind") == "Status" and st.get("reason") == "NotFound" and details.get("kind") == PLURAL:
            return PluginError(EXIT_NOT_FOUND, f"LookaheadPolicy {name!r} not found in namespace {namespace} "
                                               f"(kubectl get lookaheadpolicies -n {namespace})")
        return PluginError(EXIT_NOT_FOUND, f"the LookaheadPolicy CRD is not installed in the cluster at {server} "
                                           f"(no {PLURAL}.{GROUP}/{VERSION} API): {CRD_HINT}")
    if status in (400, 409, 422):
        return PluginError(EXIT_BAD_INPUT, f"the Kubernetes API refused to {action} LookaheadPolicy {namespace}/{name} "
                                           f"({status} {reason}){said}")
    if status == 429 or status >= 500:
        return PluginError(EXIT_CLUSTER, f"the Kubernetes API at {server} failed ({status} {reason}){said}: try "
                                         "again; if it persists, check the control plane (kubectl get --raw "
                                         "'/readyz?verbose')")
    return PluginError(EXIT_NOT_FOUND, f"the Kubernetes API answered {status} {reason} to {action} LookaheadPolicy "
                                       f"{namespace}/{name}{said}")


def _call(session: Session, action: str, name: str, namespace: str, fn: Callable, *args: Any) -> Any:
    import ssl

    import urllib3
    from kubernetes.client.rest import ApiException

    try:
        return fn(GROUP, VERSION, namespace, PLURAL, name, *args, _request_timeout=session.timeout)
    except ApiException as exc:
        raise api_error(exc.status, exc.reason, exc.body, action=action, namespace=namespace, name=name,
                        server=session.server, timeout=session.timeout) from None
    except (urllib3.exceptions.HTTPError, ssl.SSLError, OSError) as exc:
        raise transport_error(exc, session.server, session.timeout) from None


def run_gate(args: argparse.Namespace) -> int:
    try:
        return _run_gate(args)
    except PluginError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return exc.code
    except GateError as exc:
        print(f"{PROG}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kubectl lookahead status p | head -3`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK


def _run_gate(args: argparse.Namespace) -> int:
    check_policy_name(args.policy)
    if args.namespace is not None:
        check_namespace(args.namespace)
    session = connect(args)
    ns = args.namespace or session.namespace
    if args.namespace is None:
        check_namespace(ns, session.namespace_source)
    api = session.api
    policy = _call(session, "get", args.policy, ns, api.get_namespaced_custom_object)
    patch = _gate_patch(args, policy)
    if patch is not None:
        _call(session, "patch", args.policy, ns, api.patch_namespaced_custom_object, patch)
        print(f"lookaheadpolicy.{GROUP}/{args.policy} {args.verb}{'d' if args.verb.endswith('e') else 'ed'}")
        return EXIT_OK
    if args.verb == "status":
        print_status(policy)
        return EXIT_OK
    st = policy.get("status") or {}
    print(json.dumps({"policy": f"{ns}/{args.policy}", "phase": st.get("phase"), "decision": st.get("decision"),
                      "batches": st.get("batches"), "preflight": st.get("preflight"), "guard": st.get("guard"),
                      "rollback": st.get("rollback"), "targets": st.get("targets")}, indent=2))
    return EXIT_OK


def _gate_patch(args: argparse.Namespace, policy: dict) -> dict | None:
    return {
        "approve": lambda: approve_patch(policy),
        "abort": lambda: abort_patch(getattr(args, "reason", None)),
        "pause": lambda: pause_patch(True),
        "resume": lambda: pause_patch(False),
    }.get(args.verb, lambda: None)()

