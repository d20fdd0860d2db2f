"""The analysis report: a rich table on the terminal, and report.json, PNG plots and report.html.

Plots (control vs canary, against batch size, with axes, units, legend and 95% error bars):

* ``per_token_latency.png`` -- mean per-token latency (ms) per request, error bars: 95% interval of
  the mean over requests;
* ``throughput.png`` -- output tokens/s of the closed loop, error bars: 95% interval of the mean over
  the per-interval samples.

The HTML embeds both PNGs (base64), the per-batch table, the crossover and the decision with its
reason, so it is one self-contained file.

Acceptance, per batch size, on the canary, three ways: the acceptance rate (accepted / draft
tokens), the **mean acceptance length** (``1 + accepted / drafts``: tokens per verification step,
bonus token included -- what vLLM's and SGLang's logs call acceptance length) and the
**per-position acceptance** (share of drafts whose k-th token was accepted, from
``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}``). A row that carries
``meanAcceptanceLength`` / ``acceptanceByPosition`` keeps them; otherwise they are derived from the
canary engine's own ``/metrics`` deltas over the measured rounds (``server``: sample name -> delta;
the per-position counter under ``position_key(name, k)``).
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from pathlib import Path
from typing import Any, Mapping

from lookahead_operator.measurement.acceptance import acceptance_length, position_key

COLORS = {"control": "#1f77b4", "canary": "#d62728"}


def _fmt(x: Any, nd: int = 1, pct: bool = False) -> str:
    if x is None:
        return "-"
    if pct:
        return f"{100 * x:+.{nd}f}%"
    return f"{x:.{nd}f}"


def _bound_words(x: float) -> str:
    """One end of a relative-change interval for a person: beyond +-100% (a 2x change either way)
    a percent says nothing more, so it reads as a bound."""
    if x >= 1.0:
        return ">+100"
    if x <= -0.99:
        return "<-99"
    return f"{100 * x:+.0f}"


def _interval_words(iv: list[float] | None, unit: str = "%") -> str:
    """``[-60, -30]%``: the interval of a relative change, whole percent, clipped where unbounded."""
    if not iv:
        return "-"
    sep = ", " if unit else ","  # the compact form (console table) drops the space and the unit
    return f"[{_bound_words(iv[0])}{sep}{_bound_words(iv[1])}]{unit}"


def change_words(estimate: float | None, interval: list[float] | tuple[float, float] | None) -> str:
    """``-19% [-30,-10]``: a relative change and its interval in the console's compact form (the
    table's cells and `analyze`'s progress line)."""
    return f"{_fmt(estimate, 0, pct=True)} {_interval_words(list(interval) if interval else None, unit='')}"


def acceptance_detail(server: Mapping[str, float], m: Any) -> dict[str, Any]:
    """Mean acceptance length and per-position acceptance from an engine's ``/metrics`` deltas
    (``m``: the engine's ``MetricNames``); ``None`` where not measured (no drafts: never 0)."""
    out: dict[str, Any] = {"meanAcceptanceLength": None, "acceptanceByPosition": None}
    drafts = server.get(m.drafts) if getattr(m, "drafts", None) else None
    if not drafts or drafts <= 0:
        return out
    accepted = server.get(m.accepted_tokens) if m.accepted_tokens else None
    generated = None if m.accepted_tokens else server.get(m.generation_tokens)
    out["meanAcceptanceLength"] = acceptance_length(drafts, accepted, generated)
    name = getattr(m, "accepted_per_position", None)
    if name:
        by_pos = []
        while position_key(name, len(by_pos)) in server:
            by_pos.append(server[position_key(name, len(by_pos))] / drafts)
        out["acceptanceByPosition"] = by_pos or None
    return out


def _positions_words(xs: list[float] | None) -> str:
    if not xs:
        return "-"
    return " / ".join(f"{x:.2f}" for x in xs)


# ---------------------------------------------------------------------------------------------
# plots


def _plot(rows: list[dict], kind: str, path: Path, title_suffix: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    xs = [r["batchSize"] for r in rows]
    for role in ("control", "canary"):
        if kind == "latency":
            ys = [r[role]["perTokenMs"] for r in rows]
            es = [r[role]["perTokenMsCI95"] or 0.0 for r in rows]
        else:
            ys = [r[role]["intervalTokensPerSecondMean"] or r[role]["tokensPerSecond"] for r in rows]
            es = [r[role]["intervalTokensPerSecondCI95"] or 0.0 for r in rows]
        pts = [(x, y, e) for x, y, e in zip(xs, ys, es) if y is not None]
        if not pts:
            continue
        label = "control (lookahead off)" if role == "control" else "canary (lookahead on)"
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                    capsize=4, linewidth=2, color=COLORS[role], label=label)
    crossover = None
    if rows and rows[0].get("_crossover"):
        crossover = rows[0]["_crossover"]
    if crossover:
        ax.axvline(crossover, color="#555555", linestyle="--", linewidth=1.2,
                   label=f"crossover: lookahead off from batch {crossover}")
    # the verdict of each batch size, along the top
    for x, r in zip(xs, rows):
        ax.annotate(r["verdict"], (x, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -11),
                    textcoords="offset points", ha="center", va="center", fontsize=8, color="#333333",
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "#bbbbbb"})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("batch size (concurrent requests)")
    if kind == "latency":
        ax.set_ylabel("per-token latency (ms / token)")
        ax.set_title(f"Per-token latency vs batch size{title_suffix}\n(lower is better; bars: 95% CI of each role's mean;\nverdicts: the paired test, as in the table)",
                     fontsize=10)
    else:
        ax.set_ylabel("output throughput (tokens / s)")
        ax.set_title(f"Throughput vs batch size{title_suffix}\n(higher is better; bars: 95% CI of each role's mean;\nverdicts: the paired test, as in the table)",
                     fontsize=10)
    # room at the top for the verdict labels
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top * 1.15)
    ax.set_xlim(min(xs) / 1.3, max(xs) * 1.3) if xs else None
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = buf.getvalue()
    path.write_bytes(data)
    return data


# ---------------------------------------------------------------------------------------------
# HTML


def _html(data: dict, pngs: dict[str, bytes]) -> str:
    d = data.get("decision") or {}
    rows = []
    for r in data["batches"]:
        rows.append(
            "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in (
                r["batchSize"], _fmt(r["controlTpotMs"], 2), _fmt(r["canaryTpotMs"], 2),
                _fmt(r["tpotChange"], 1, pct=True), _interval_words(r["tpotInterval"]),
                _fmt(r["controlTokensPerSecond"]), _fmt(r["canaryTokensPerSecond"]),
                _fmt(r["throughputChange"], 1, pct=True), _interval_words(r["throughputInterval"]),
                _fmt(r["acceptanceRate"], 2), _fmt(r.get("meanAcceptanceLength"), 2),
                _positions_words(r.get("acceptanceByPosition")), r["verdict"], f'{r["rounds"]} ({r["stopped"]})',
                f'{r["control"]["requests"]}/{r["canary"]["requests"]}',
            )) + "</tr>")
    imgs = "".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(b).decode()}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>" for name, b in pngs.items())
    th = data["thresholds"]
    regime = ""
    if data.get("regimeConfig"):
        regime = f"<p><b>Engine setting for the regime:</b> <code>{html.escape(json.dumps(data['regimeConfig']))}</code></p>"
    warnings = []
    for r in data["batches"]:
        for role in ("control", "canary"):
            for w in r[role]["clientWarnings"]:
                warnings.append(f"batch {r['batchSize']} {role}: {w}")
    warn_html = ("<h2>Load generator warnings</h2><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
                 + "</ul>") if warnings else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Lookahead analysis: {html.escape(str(data['model']))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
th {{ background: #f3f3f3; }}
.decision {{ font-size: 1.2em; padding: 0.6em; background: #f7f7e8; border-left: 4px solid #c90; }}
figure {{ display: inline-block; margin: 0.5em; }}
code {{ background: #f3f3f3; padding: 1px 4px; }}
</style></head><body>
<h1>Lookahead analysis</h1>
<p>Model <b>{html.escape(str(data['model']))}</b> (backend {html.escape(str(data['backend']))}), engine
{html.escape(str(data['engine']))}, lookahead <code>{html.escape(json.dumps(data['lookahead']))}</code>,
prompts <b>{html.escape(str(data['prompts']))}</b> (max {data['maxTokens']} tokens), batch sizes
{html.escape(', '.join(map(str, data['batchSizes'])))}, on {html.escape(str(data.get('cpu') or 'an unknown CPU'))}.</p>
<p>Thresholds: latency must improve by more than {100 * th['minLatencyImprovement']:.0f}%, throughput may fall by
at most {100 * th['maxThroughputRegression']:.0f}%, at confidence {th['confidence']:.2f} for the whole decision
(paired, anytime-valid confidence sequences, each test at its share {th.get('perTestConfidence', th['confidence']):.4f};
at least {th['minSamples']} control/canary round pairs).</p>
<div class="decision"><b>Decision: {html.escape(str(d.get('action')))}</b>
{('(crossover at batch size ' + str(data['crossoverBatchSize']) + ')') if data.get('crossoverBatchSize') else ''}
<br>{html.escape(str(d.get('reason', '')))}</div>
{regime}
<h2>Per batch size</h2>
<table><tr><th>batch</th><th>control ms/token</th><th>canary ms/token</th><th>change</th><th>interval</th>
<th>control tok/s</th><th>canary tok/s</th><th>change</th><th>interval</th><th>acceptance rate</th>
<th>mean acceptance length (tokens/step)</th><th>acceptance by draft position</th><th>verdict</th>
<th>rounds (stop)</th><th>requests</th></tr>
{''.join(rows)}</table>
{('<p>Not measured (the decision was settled before them): batch sizes ' + html.escape(', '.join(map(str, data['notMeasured']))) + '.</p>') if data.get('notMeasured') else ''}
<h2>Plots</h2>{imgs}
{warn_html}
<h2>How these numbers were measured</h2>
<ul><li>Per-token latency: {html.escape(data['method']['latencySamples'])}.</li>
<li>Throughput: {html.escape(data['method']['throughputSamples'])}.</li>
<li>Statistics: {html.escape(data['method']['statistics'])}; a batch size stops as soon as its verdict is settled.</li>
<li>Acceptance (canary, from the engine's own counters over the measured rounds): rate = accepted / draft tokens;
mean acceptance length = 1 + accepted tokens / drafts (tokens per verification step, bonus token included);
by draft position = drafts whose k-th token was accepted / drafts (position 0 first).</li>
<li>Control and canary received the same prompts in the same order, in alternating rounds.</li></ul>
<p>Wall time {data['wallSeconds']:.0f} s (engine start {data['engineStartSeconds']:.0f} s). Raw numbers: report.json.</p>
</body></html>
"""


def write_report(result, out: Path) -> dict:
    """Write report.json, per_token_latency.png, throughput.png and report.html; return the data."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    m = getattr(result, "metric_names", None)
    for row, b in zip(data["batches"], getattr(result, "batches", [])):
        derived = acceptance_detail(getattr(b.canary, "server", {}) or {}, m) if m is not None else {}
        for k, v in derived.items():
            if row.get(k) is None:
                row[k] = v
    for row in data["batches"]:
        row.setdefault("meanAcceptanceLength", None)
        row.setdefault("acceptanceByPosition", None)
    rows = [dict(r, _crossover=data.get("crossoverBatchSize")) for r in data["batches"]]
    suffix = f" ({data['model']})" if data["backend"] == "model" else " (simulated engine)"
    files = {
        "html": str(out / "report.html"),
        "json": str(out / "report.json"),
        "perTokenLatencyPng": str(out / "per_token_latency.png"),
        "throughputPng": str(out / "throughput.png"),
    }
    pngs = {
        "per_token_latency.png": _plot(rows, "latency", Path(files["perTokenLatencyPng"]), suffix),
        "throughput.png": _plot(rows, "throughput", Path(files["throughputPng"]), suffix),
    }
    data["files"] = files
    data["reportWrittenAt"] = time.time()
    Path(files["html"]).write_text(_html(data, pngs))
    Path(files["json"]).write_text(json.dumps(data, indent=1, default=str) + "\n")
    result.files = files
    return data


def print_summary(data: dict, console) -> None:
    """The verdict table and the decision, in 80 columns."""
    from rich import box
    from rich.table import Table

    t = Table(title=f"lookahead vs greedy: {data['model']} ({data['backend']})", box=box.SIMPLE_HEAD,
              padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True,
              caption="n: control/canary round pairs; CI: confidence interval, percent")
    for col in ("batch", "control\nms/tok", "canary\nms/tok", "latency\nchange [CI]",
                "throughput\nchange [CI]", "acc.\nlen.", "verdict", "n"):
        t.add_column(col, justify="right", no_wrap=True)
    style = {"Wins": "green", "Regresses": "red", "NoGain": "yellow", "Pending": "dim"}
    for r in data["batches"]:
        t.add_row(
            str(r["batchSize"]), _fmt(r["controlTpotMs"], 1), _fmt(r["canaryTpotMs"], 1),
            change_words(r["tpotChange"], r["tpotInterval"]),
            change_words(r["throughputChange"], r["throughputInterval"]),
            _fmt(r.get("meanAcceptanceLength"), 2),
            f"[{style.get(r['verdict'], '')}]{r['verdict']}",
            str(r.get("rounds", "-")),
        )
    console.print(t)
    console.print(f"lookahead: {json.dumps(data['lookahead'])}")
    console.print(f"machine: {data.get('cpu') or 'unknown'}")
    d = data.get("decision") or {}
    if data.get("notMeasured"):
        console.print(f"not measured (the decision was settled before them): batch sizes {data['notMeasured']}")
    console.print(f"crossover batch size: {data.get('crossoverBatchSize') or '-'}")
    console.print(f"[bold]decision: {d.get('action')}[/bold] - {d.get('reason')}")
    if data.get("regimeConfig"):
        console.print(f"engine setting: {json.dumps(data['regimeConfig'])}")
    for r in data["batches"]:
        for role in ("control", "canary"):
            for w in r[role]["clientWarnings"]:
                console.print(f"[yellow]load generator may be the bottleneck at batch {r['batchSize']} ({role}): {w}")
    console.print(f"report: {data['files'].get('html')}  (wall {data['wallSeconds']:.0f} s)")
