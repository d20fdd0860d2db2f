import io

from lookahead_operator import plugin


import pytest


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


def test_status_table_formats_rows_and_missing_values():
    policy = {"metadata": {"name": "p", "namespace": "ns"},
              "status": {"phase": "Measuring", "batches": [
                  {"batchSize": 1, "controlTpotMs": 20.0, "canaryTpotMs": 12.5, "tpotChange": -0.375,
                   "tpotInterval": [-0.41, -0.339], "controlTokensPerSecond": 50.0, "canaryTokensPerSecond": 80.0,
                   "throughputChange": 0.6, "acceptanceRate": 0.42, "samples": {"control": 30, "canary": 31},
                   "verdict": "Wins"},
                  {"batchSize": 8, "verdict": "Pending"}]}}
    rows = plugin.status_rows(policy)
    assert rows[0][:4] == ["1", "20.00", "12.50", "-37.5% [-41.0, -33.9]"]
    assert rows[0][-1] == "Wins" and rows[0][-2] == "30/31" and rows[1][1] == "-" and rows[1][-1] == "Pending"
    out = io.StringIO()
    plugin.print_status(policy, out)
    assert "Measuring" in out.getvalue() and "Wins" in out.getvalue()
