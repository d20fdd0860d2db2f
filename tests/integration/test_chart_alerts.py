"""The chart's operations hooks: the PrometheusRule's alerts (`promtool check rules` and `promtool
test rules` with tests/integration/promrules/alerts_test.yaml, each alert firing and not firing)
and the Grafana dashboard ConfigMap, whose every query (template variables resolved as Grafana
does) runs on a real Prometheus scraping the operator's metrics endpoint
(``lookahead_operator.runtime.metrics``, fed the status of a few policies)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from lookahead_canary import process
from lookahead_dev.devcluster import control_plane_binary, free_port

from .helpers import terminate, wait_until
from .test_chart import CHART, by_kind, render, run_helm

pytestmark = pytest.mark.integration

PROMTOOL = "/usr/bin/promtool"
ALERTS_TEST = Path(__file__).with_name("promrules") / "alerts_test.yaml"
DASHBOARD = CHART / "dashboards" / "lookahead.json"
RELEASE, NAMESPACE = "lookahead-operator", "lookahead-system"   # what alerts_test.yaml's series assume
JOB = f"{RELEASE}-metrics"                                      # the ServiceMonitor's job: the Service's name
ALERTS = {"LookaheadPolicyFailed", "LookaheadPolicyRolledBack", "LookaheadOperatorDown", "LookaheadReconcileErrors"}
ON = ["--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true"]


@pytest.fixture(scope="module")
def helm() -> str:
    return str(control_plane_binary("helm"))


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def rule_groups(helm: str, *extra: str) -> dict:
    (rule,) = by_kind(render(helm, RELEASE, NAMESPACE, *ON, *extra))["PrometheusRule"]
    return rule


def dashboards(kinds: dict[str, list[dict]]) -> list[dict]:
    return [d for d in kinds.get("ConfigMap", []) if d["metadata"]["name"] == f"{RELEASE}-dashboard"]


def write_rules(rule: dict, where: Path) -> Path:
    """The PrometheusRule's spec as a Prometheus rules file (the Prometheus Operator mounts it so)."""
    path = where / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------
# rendering and values

def test_alerts_and_dashboard_are_off_by_default(helm):
    kinds = by_kind(render(helm, RELEASE, NAMESPACE))
    assert "PrometheusRule" not in kinds and not dashboards(kinds)


def test_helm_lint_with_alerts_and_dashboard(helm):
    run_helm(helm, "lint", "--strict", str(CHART), *ON, "--set", "prometheusRule.additionalLabels.release=kps",
             "--set", "prometheusRule.alertLabels.team=ml", "--set", "grafanaDashboard.annotations.grafana_folder=LLM")


@pytest.mark.parametrize("args, message", [
    (["--set", "prometheusRule.policyFailed.for=soon"], "for"),
    (["--set", "prometheusRule.operatorDown.upSelector=job=\"x\"}"], "upSelector"),
    (["--set", "prometheusRule.reconcileErrors.threshold=-1"], "threshold"),
    (["--set", "prometheusRule.unknown=1"], "unknown"),
    (["--set", "grafanaDashboard.label="], "label"),
])
def test_bad_alert_and_dashboard_values_are_refused(helm, args, message):
    proc = run_helm(helm, "template", "r", str(CHART), *ON, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_prometheus_rule_object_and_alerts(helm, tmp_path):
    rule = rule_groups(helm, "--set", "prometheusRule.additionalLabels.release=kps",
                       "--set", "prometheusRule.alertLabels.team=ml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} == ALERTS
    for a in alerts:
        assert a["labels"]["team"] == "ml" and a["labels"]["severity"], a
        assert a["annotations"]["summary"] and len(a["annotations"]["description"]) > 80, a
    (down,) = [a for a in alerts if a["alert"] == "LookaheadOperatorDown"]
    assert down["expr"] == f'absent(up{{job="{JOB}",namespace="{NAMESPACE}"}} == 1)'
    check = promtool("check", "rules", str(write_rules(rule, tmp_path)))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 4 rules found" in check.stdout, check.stdout


def test_operator_down_follows_a_custom_up_selector(helm, tmp_path):
    rule = rule_groups(helm, "--set-string", 'prometheusRule.operatorDown.upSelector=job="kubernetes-pods"\\,app="op"')
    (down,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "LookaheadOperatorDown"]
    assert down["expr"] == 'absent(up{job="kubernetes-pods",app="op"} == 1)'
    check = promtool("check", "rules", str(write_rules(rule, tmp_path)))
    assert check.returncode == 0, check.stdout + check.stderr


def test_promtool_test_rules_each_alert_fires_and_does_not(helm, tmp_path):
    """alerts_test.yaml: every alert fires where it should (labels and annotations exact) and stays
    quiet where it should not (before its `for`, once resolved, on other jobs' or releases' series)."""
    write_rules(rule_groups(helm), tmp_path)
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    tested = {a["alertname"] for t in yaml.safe_load(ALERTS_TEST.read_text())["tests"] for a in t["alert_rule_test"]}
    assert tested == ALERTS
    proc = promtool("test", "rules", str(tmp_path / ALERTS_TEST.name))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout


def test_dashboard_configmap(helm):
    (cm,) = dashboards(by_kind(render(helm, RELEASE, NAMESPACE, *ON)))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == NAMESPACE
    (body,) = cm["data"].values()
    assert json.loads(body) == json.loads(DASHBOARD.read_text())
    (cm,) = dashboards(by_kind(render(helm, RELEASE, NAMESPACE, *ON, "--set", "grafanaDashboard.label=dashboards",
                                      "--set", "grafanaDashboard.labelValue=lookahead",
                                      "--set", "grafanaDashboard.namespace=grafana",
                                      "--set", "grafanaDashboard.annotations.grafana_folder=LLM")))
    assert cm["metadata"]["labels"]["dashboards"] == "lookahead" and "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "grafana" and cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}


# ------------------------------------------------------------------------------------------
# the dashboard's and the alerts' queries on a real Prometheus

FEED = textwrap.dedent("""
    import sys, time
    from lookahead_operator.api.status import LookaheadPolicyStatus
    from lookahead_operator.runtime import metrics

    rows = [{"batchSize": 1, "verdict": "Wins", "tpotChange": -0.31, "throughputChange": 0.02},
            {"batchSize": 8, "verdict": "NoGain", "tpotChange": -0.01, "throughputChange": -0.03},
            {"batchSize": 32, "verdict": "Pending"}]
    policies = (("inference/chat", "Measuring"), ("inference/summarize", "Failed"), ("team-b/code", "RolledBack"))
    for key, phase in policies:
        metrics.record_policy(key, LookaheadPolicyStatus.model_validate({"phase": phase, "batches": rows}))
    metrics.RECONCILES.inc(7)
    metrics.RECONCILE_ERRORS.labels("Measuring").inc()
    metrics.DECISIONS.labels("Rollback").inc()
    metrics.ROLLBACKS.labels("GuardRegression").inc()
    metrics.TIME_IN_PHASE.labels("Measuring").observe(420)
    metrics.serve(int(sys.argv[1]), "127.0.0.1")
    while True:
        metrics.RECONCILES.inc()
        time.sleep(0.2)
""")


@pytest.fixture(scope="module")
def operator_metrics(prometheus, tmp_path_factory):
    """The operator's metrics endpoint (its own module and registry, in a process of its own),
    scraped by the session's Prometheus with the target labels a ServiceMonitor gives it."""
    port = free_port()
    log = tmp_path_factory.mktemp("operator-metrics") / "metrics.log"
    proc = process.start([sys.executable, "-c", FEED, str(port)], log)
    address = f"127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=2):
                return True
        except OSError:
            return proc.poll() is not None   # exited: nothing to wait for

    try:
        wait_until(answers, 30, "the operator's metrics endpoint", 0.1)
        assert proc.poll() is None, log.read_text()
        prometheus.set_targets([{"address": address, "labels": {"job": JOB, "namespace": NAMESPACE}}],
                               source="chart-dashboard")
        prometheus.wait_target_up(address, timeout=60)
        # rates need two scrapes of the counters
        wait_until(lambda: query(prometheus, f'rate(lookahead_operator_reconciles_total{{job="{JOB}"}}[1m]) > 0'),
                   30, "two scrapes of the operator", 0.5)
        yield prometheus
    finally:
        prometheus.set_targets([], source="chart-dashboard")
        terminate(proc, 5)
        assert proc.returncode is not None, log.read_text()


def query(prometheus, promql: str) -> list[dict]:
    """An instant query; a query Prometheus refuses fails the test with its error."""
    url = f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"Prometheus refused {promql!r}: {exc.read().decode(errors='replace')}") from exc
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


def label_values(prometheus, selector: str, label: str) -> list[str]:
    """What Grafana's ``label_values(selector, label)`` variable query lists."""
    url = f"{prometheus.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = next(g for g in m.groups() if g)
        assert name in values, f"{expr!r}: unknown template variable ${name}"
        return values[name]
    return VARIABLE.sub(one, expr)


def regex_escape(value: str) -> str:
    """A value in a PromQL regex matcher, escaped as Grafana's Prometheus data source does (two
    backslashes in the PromQL string: one in the regex)."""
    return re.sub(r"[$^*+?.()|\\{}\[\]]", lambda m: "\\\\" + m.group(0), value)


def resolve_variables(prometheus, dashboard: dict, pick_all: bool) -> dict[str, str]:
    """Each query variable resolved in order, as Grafana does: its label_values query (earlier
    variables substituted) must list values; then either "All" (its allValue, else the regex
    alternation Grafana builds of every value) or its first value."""
    values = dict(GRAFANA_BUILTINS)
    for var in dashboard["templating"]["list"]:
        if var["type"] == "datasource":
            assert var["query"] == "prometheus"
            continue
        assert var["type"] == "query", var
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", substitute(q, values))
        assert m, f"variable {var['name']}: {q!r} is not label_values(selector, label)"
        options = label_values(prometheus, m.group(1), m.group(2))
        assert options, f"variable {var['name']}: {m.group(0)!r} lists nothing"
        if pick_all and var.get("includeAll"):
            values[var["name"]] = var.get("allValue") or "(" + "|".join(map(regex_escape, options)) + ")"
        else:
            values[var["name"]] = regex_escape(options[0])
    return values


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            out += [(sub["title"], t["expr"]) for t in sub.get("targets", [])]
    return out


@pytest.mark.parametrize("pick_all", [True, False], ids=["all", "one"])
def test_every_dashboard_query_runs_and_has_data(operator_metrics, pick_all):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                                    for p in dashboard["panels"] if p["type"] != "row")
    values = resolve_variables(operator_metrics, dashboard, pick_all)
    queries = panel_queries(dashboard)
    assert len(queries) >= 12
    empty = []
    for title, expr in queries:
        promql = substitute(expr, values)
        assert "$" not in promql, promql
        if not query(operator_metrics, promql):
            empty.append((title, promql))
    assert not empty, f"queries with no data (a metric or label the operator does not export?): {empty}"


def test_alert_expressions_on_the_operators_real_metrics(helm, operator_metrics):
    """The alerts' metric and label names are the ones the operator exports: on its live endpoint
    the Failed and RolledBack alerts select exactly the policies in those phases, and the
    operator-down expression sees its up series (so it is quiet)."""
    exprs = {r["alert"]: r["expr"] for g in rule_groups(helm)["spec"]["groups"] for r in g["rules"]}
    failed = query(operator_metrics, exprs["LookaheadPolicyFailed"])
    assert [(r["metric"]["policy_namespace"], r["metric"]["policy"]) for r in failed] == [("inference", "summarize")]
    rolled = query(operator_metrics, exprs["LookaheadPolicyRolledBack"])
    assert [(r["metric"]["policy_namespace"], r["metric"]["policy"]) for r in rolled] == [("team-b", "code")]
    assert query(operator_metrics, exprs["LookaheadOperatorDown"]) == []
    assert query(operator_metrics, exprs["LookaheadOperatorDown"].replace(NAMESPACE, "elsewhere")) != []
    errors = exprs["LookaheadReconcileErrors"]
    assert query(operator_metrics, errors.rsplit(">", 1)[0]), errors   # the sum itself has the operator's series
