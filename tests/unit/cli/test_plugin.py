import io
import re

import pytest

from lookahead_operator.cli import plugin
from lookahead_operator.cli.main import build_parser


def test_approve_names_the_decision():
    policy = {"metadata": {"generation": 4}, "status": {"decision": {"id": "ab12cd34-Promote", "action": "Promote"}}}
    assert plugin.approve_patch(policy) == {"metadata": {"annotations": {"lookahead.dev/approve": "ab12cd34-Promote"}}}


@pytest.mark.parametrize("status", [{}, {"decision": {"id": "x-Rollback", "action": "Rollback"}}])
def test_nothing_to_approve_is_an_error(status):
    with pytest.raises(plugin.GateError, match="nothing to approve"):
        plugin.approve_patch({"metadata": {"generation": 1}, "status": status})


def test_abort_and_pause_patches():
    assert plugin.abort_patch()["metadata"]["annotations"] == {"lookahead.dev/abort": "true"}
    assert plugin.abort_patch("bad canary")["metadata"]["annotations"]["lookahead.dev/abort-reason"] == "bad canary"
    assert plugin.pause_patch(True) == {"spec": {"paused": True}}


def _col(key):
    return [c.key for c in plugin.COLUMNS].index(key)


def test_status_table_formats_rows_and_missing_values():
    policy = {"metadata": {"name": "p", "namespace": "ns"},
              "status": {"phase": "Measuring", "batches": [
                  {"batchSize": 1, "controlTpotMs": 20.0, "canaryTpotMs": 12.5, "tpotChange": -0.375,
                   "tpotInterval": [-0.41, -0.339], "controlTokensPerSecond": 50.0, "canaryTokensPerSecond": 80.0,
                   "throughputChange": 0.6, "acceptanceRate": 0.42, "samples": {"control": 30, "canary": 31},
                   "verdict": "Wins"},
                  {"batchSize": 8, "verdict": "Pending"}]}}
    rows = plugin.status_rows(policy)
    assert rows[0][:5] == ["1", "20.00", "12.50", "-37.5%", "[-41.0, -33.9]"]
    assert rows[0][_col("throughputChange")] == "+60.0%" and rows[0][_col("throughputInterval")] == "-"
    assert rows[0][-1] == "Wins" and rows[0][-2] == "30/31" and rows[1][1] == "-" and rows[1][-1] == "Pending"
    out = io.StringIO()
    plugin.print_status(policy, out)
    assert "Measuring" in out.getvalue() and "Wins" in out.getvalue()


# Numbers as wide as real ones get: a slow big model (ms/tok in the thousands), a large fleet
# (tokens/s in the hundreds of thousands), changes over 100 %, samples in the tens of thousands.
BIG = {"metadata": {"name": "chat-fleet-with-a-long-name", "namespace": "inference-production"},
       "status": {
           "phase": "Measuring", "currentWave": 2, "waves": [{}, {}, {}],
           "message": "measuring batch size 16 of [1, 2, 4, 8, 16, 32]: 1234 of 5000 samples per role, step 4 of 6",
           "batches": [
               {"batchSize": 1, "controlTpotMs": 1234.5678, "canaryTpotMs": 987.6543, "tpotChange": -0.2,
                "tpotInterval": [-0.2512, -0.1487], "controlTokensPerSecond": 123456.78,
                "canaryTokensPerSecond": 234567.89, "throughputChange": 0.9001,
                "throughputInterval": [0.8512, 0.9543], "acceptanceRate": 0.4242,
                "samples": {"control": 12345, "canary": 23456}, "verdict": "Wins",
                "latencyVerdict": "Better", "someFutureKey": {"nested": [1, 2]}},
               {"batchSize": 32, "controlTpotMs": 45.01, "canaryTpotMs": 99.99, "tpotChange": 1.2215,
                "tpotInterval": [1.1013, 1.3456], "controlTokensPerSecond": 711.1, "canaryTokensPerSecond": 322.2,
                "throughputChange": -0.5469, "throughputInterval": [-0.6021, -0.4987], "acceptanceRate": 0.0312,
                "samples": {"control": 7, "canary": 9}, "verdict": "Inconclusive"},
               {"batchSize": 1024, "verdict": "Pending", "samples": {"control": 3}},
           ],
           "decision": {"action": "Wait", "reason": "batch 32 regresses throughput by 54.7% (interval -60.2% to "
                                                  "-49.9%) while batch 1 wins 20.0% latency; 2 batch sizes to go",
                        "crossoverBatchSize": 32},
           "conditions": [{"type": "Accepted", "status": "True", "reason": "Valid",
                           "message": "spec valid; 3 Deployments selected in 2 namespaces with 123456 replicas"}],
       }}

EXPECTED_CELLS = {
    "batchSize": ["1", "32", "1024"],
    "controlTpotMs": ["1234.57", "45.01"],
    "canaryTpotMs": ["987.65", "99.99"],
    "tpotChange": ["-20.0%", "+122.2%"],
    "tpotInterval": ["[-25.1, -14.9]", "[+110.1, +134.6]"],
    "controlTokensPerSecond": ["123456.8", "711.1"],
    "canaryTokensPerSecond": ["234567.9", "322.2"],
    "throughputChange": ["+90.0%", "-54.7%"],
    "throughputInterval": ["[+85.1, +95.4]", "[-60.2, -49.9]"],
    "acceptanceRate": ["0.42", "0.03"],
    "samples": ["12345/23456", "7/9", "3/-"],
    "verdict": ["Wins", "Inconclusive", "Pending"],
}


def _whole(cell: str, text: str) -> bool:
    return re.search(r"(?<!\S)" + re.escape(cell) + r"(?!\S)", text) is not None


@pytest.mark.parametrize("width", [80, 60, 200, 100, 45])
def test_status_table_fits_the_width_and_never_cuts_a_number(width):
    lines = plugin.format_status(BIG, width)
    text = "\n".join(lines)
    assert lines and all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert "…" not in text and "..." not in text
    for key, cells in EXPECTED_CELLS.items():
        for cell in cells:
            assert _whole(cell, text), (width, key, cell)
    # and nothing in the tables is a fragment of a number: every numeric token is one we expect
    allowed = {tok for cells in EXPECTED_CELLS.values() for cell in cells for tok in re.split(r"[\s\[\],/]+", cell)}
    start = lines.index("canary vs control")
    end = len(lines) - lines[::-1].index("") - 1
    table_tokens = {tok for line in lines[start:end] for tok in re.split(r"[\s\[\],/]+", line)
                    if re.fullmatch(r"[-+]?\d[\d.]*%?", tok)}
    assert table_tokens <= allowed, table_tokens - allowed


def test_status_table_is_one_table_when_wide_and_continues_when_narrow():
    assert "\n".join(plugin.format_status(BIG, 200)).count("canary vs control") == 1
    narrow = plugin.format_status(BIG, 80)
    assert sum(line.startswith("canary vs control") for line in narrow) >= 2
    # every table begins with the batch column, so a continued row can be matched to its batch size
    for i, line in enumerate(narrow):
        if line.startswith("canary vs control"):
            assert narrow[i + 2].split()[0] == "batch"


def test_status_too_narrow_for_a_table_lists_each_value():
    lines = plugin.format_status(BIG, 18)  # narrower than the batch and verdict columns together
    text = "\n".join(lines)
    assert "canary vs control" in lines and all(len(line) <= 18 for line in lines)
    for cells in EXPECTED_CELLS.values():
        for cell in cells:  # an interval may wrap after its comma; each number stays whole
            for number in re.split(r"[\s\[\],]+", cell):
                assert not number or re.search(r"(?<![\w.+-])" + re.escape(number) + r"(?![\w.%])", text), number
    assert "batch 1024" in text


def test_status_tolerates_missing_and_odd_values():
    odd = {"metadata": {"name": "p", "namespace": "n"},
           "status": {"batches": [{"batchSize": 2, "tpotInterval": [0.1], "samples": None, "acceptanceRate": "n/a"},
                                  "not-a-row", {}],
                      "decision": {}, "conditions": [{"type": "Ready"}], "waves": 3, "currentWave": 1}}
    text = "\n".join(plugin.format_status(odd, 80))
    assert "phase Pending" in text and "wave 1" in text and "n/a" in text and "[0.1]" in text
    assert plugin.format_status({"metadata": {"name": "p", "namespace": "n"}}, 80)[-1] == "no per-batch results yet"


def test_status_shows_the_guard_what_it_compares_and_on_what():
    policy = {"metadata": {"name": "p", "namespace": "n"},
              "status": {"phase": "Promoting", "currentWave": 2, "guard": {
                  "wave": 2, "mode": "production", "promotedPods": 5, "baselinePods": 6, "promotedOffered": 0.41,
                  "baselineOffered": 0.39, "message": "production traffic: 5 promoted pod(s) per-token latency -31.0% "
                                                      "[-40.2%, -20.1%] vs 5 not-yet-promoted pod(s) and the control"}}}
    lines = plugin.format_status(policy, 80)
    text = " ".join(" ".join(lines).split())   # wrapped lines, read as one
    assert "guard (production, wave 2, 5 promoted pod(s) vs 6 at 0.41 vs 0.39 req/s per pod):" in text
    assert "-31.0% [-40.2%, -20.1%]" in text and all(len(line) <= 80 for line in lines)
    idle = {"metadata": {"name": "p", "namespace": "n"},
            "status": {"phase": "Guarding", "guard": {"mode": "synthetic", "message": "batch size 8: throughput +1%"}}}
    assert "guard (synthetic, final guard): batch size 8: throughput +1%" in " ".join(plugin.format_status(idle, 80))


def test_output_width_honours_columns_and_defaults_to_80_for_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert plugin.output_width(io.StringIO()) == 80
    monkeypatch.setenv("COLUMNS", "132")
    assert plugin.output_width(io.StringIO()) == 132
    out = io.StringIO()
    plugin.print_status(BIG, out)
    assert max(len(line) for line in out.getvalue().splitlines()) > 80  # 132 lets lines grow past 80
    monkeypatch.setenv("COLUMNS", "60")
    out = io.StringIO()
    plugin.print_status(BIG, out)
    assert max(len(line) for line in out.getvalue().splitlines()) <= 60


@pytest.mark.parametrize("name,ok", [("default", True), ("a", True), ("team-a1", True), ("a" * 63, True),
                                     ("a" * 64, False), ("Bad_NS!", False), ("-a", False), ("a-", False),
                                     ("a.b", False), ("", False), ("UPPER", False)])
def test_namespace_names_are_dns1123_labels(name, ok):
    if ok:
        plugin.check_namespace(name)
    else:
        with pytest.raises(plugin.PluginError, match="invalid namespace") as exc:
            plugin.check_namespace(name)
        assert exc.value.code == plugin.EXIT_BAD_INPUT and "-n/--namespace" in exc.value.message


@pytest.mark.parametrize("name,ok", [("chat-fleet", True), ("a.b-c.d", True), ("a" * 253, True), ("a" * 254, False),
                                     ("Chat", False), ("a..b", False), (".a", False), ("a_b", False), ("", False)])
def test_policy_names_are_dns1123_subdomains(name, ok):
    if ok:
        plugin.check_policy_name(name)
    else:
        with pytest.raises(plugin.PluginError, match="invalid policy name") as exc:
            plugin.check_policy_name(name)
        assert exc.value.code == plugin.EXIT_BAD_INPUT


def _err(status, reason="", body=None, action="get"):
    return plugin.api_error(status, reason, body, action=action, namespace="team-a", name="chat",
                            server="https://k8s.example:6443")


def test_api_answers_become_one_line_with_an_exit_code():
    cases = [
        (_err(401, "Unauthorized", '{"kind":"Status","code":401,"message":"Unauthorized"}'), 4, "401 Unauthorized"),
        (_err(403, "Forbidden", '{"kind":"Status","reason":"Forbidden","code":403,"message":"lookaheadpolicies.'
                                'lookahead.dev \\"chat\\" is forbidden: User \\"bob\\" cannot get resource"}'),
         4, 'User "bob" cannot get resource'),
        (_err(404, "Not Found", '{"kind":"Status","reason":"NotFound","code":404,"details":{"name":"chat",'
                                '"group":"lookahead.dev","kind":"lookaheadpolicies"}}'),
         1, "LookaheadPolicy 'chat' not found in namespace team-a"),
        (_err(404, "Not Found", "404 page not found\n"), 1, "the LookaheadPolicy CRD is not installed"),
        (_err(404, "Not Found", b"404 page not found\n"), 1, "kubectl apply -f crds/"),
        (_err(422, "Unprocessable Entity", '{"kind":"Status","message":"spec.paused: Invalid value"}', "patch"),
         2, "refused to patch"),
        (_err(503, "Service Unavailable", "etcdserver: leader changed\nmore"), 3, "failed (503 Service Unavailable)"),
        (_err(500, "Internal Server Error", None), 3, "try again"),
        (_err(0, "SSLError\nMaxRetryError(... [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed"
                 " certificate in certificate chain (_ssl.c:1006)')))"), 3, "cannot trust the Kubernetes API"),
    ]
    for err, code, text in cases:
        assert err.code == code and text in err.message, (err.code, err.message)
        assert "\n" not in err.message and err.message.strip()


def test_forbidden_names_the_verb_and_namespace():
    msg = _err(403, "Forbidden", "", action="patch").message
    assert "patch lookaheadpolicies.lookahead.dev in namespace team-a" in msg


@pytest.mark.parametrize("text,seconds", [("10", 10), ("2.5", 2.5), ("500ms", 0.5), ("3s", 3), ("1m", 60)])
def test_request_timeout_values(text, seconds):
    assert plugin._timeout(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-1", "soon", "1h"])
def test_request_timeout_rejects(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        plugin._timeout(text)


def test_help_documents_the_exit_codes_and_connection_options():
    parser = build_parser()
    top = parser.format_help()
    assert "3  cannot use the cluster" in top and "4  not allowed" in top
    verb = next(a for a in parser._actions if a.dest == "verb").choices["status"].format_help()
    for text in ("--kubeconfig", "--context", "--request-timeout", "1  not found", "2  bad input"):
        assert text in verb
    args = parser.parse_args(["pause", "p", "--kubeconfig", "/k", "--context", "c", "-n", "ns"])
    assert (args.kubeconfig, args.context, args.namespace, args.request_timeout) == ("/k", "c", "ns", 10.0)


def test_status_says_how_many_pods_of_each_target_run_lookahead():
    policy = {"metadata": {"name": "p", "namespace": "n"},
              "status": {"phase": "Promoting", "currentWave": 2, "targets": [
                  {"namespace": "n", "name": "chat", "promoted": True, "wave": 1, "replicas": 10, "promotedPods": 5},
                  {"namespace": "n", "name": "chat-b", "promoted": False, "replicas": 2},
                  {"namespace": "n", "name": "chat-c", "userEdited": True, "promoted": False},
                  "not-a-row"]}}
    lines = plugin.format_status(policy, 80)
    assert "  target n/chat: lookahead on in 5 of 10 pods (since wave 1)" in lines
    assert "  target n/chat-b: not promoted" in lines
    assert any(line.startswith("  target n/chat-c: left to its user") for line in lines)
    assert all(len(line) <= 80 for line in lines)
    quiet = {"metadata": {"name": "p", "namespace": "n"},
             "status": {"targets": [{"namespace": "n", "name": "chat", "promoted": False}]}}
    assert not any("target" in line for line in plugin.format_status(quiet, 80)), "nothing promoted: no fleet lines"
