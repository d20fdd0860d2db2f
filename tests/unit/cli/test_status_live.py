"""`kubectl lookahead status` on a live-mode policy: the split, the per-stratum table, the
crossover and the abort, in 80 columns (or one line a stratum when narrower)."""

from lookahead_operator.cli.plugin import format_status

POLICY = {"metadata": {"name": "chat", "namespace": "serving"}, "status": {
    "phase": "RolledBack", "message": "live: canary error rate ...",
    "rollback": {"reason": "CanaryErrorRate", "message": "live: canary error rate 100% vs control 0% ..."},
    "live": {"split": "service", "message": "through Service serving/chat: canary and control 1 replica each",
             "strata": [
                 {"index": 0, "offeredLow": 0, "offeredHigh": 1.18, "windows": 0, "outcome": "Pending"},
                 {"index": 1, "offeredLow": 1.18, "offeredHigh": 2.36, "windows": 12, "outcome": "Wins",
                  "latencyChange": -0.382, "latencyInterval": [-0.451, -0.302], "ttftChange": 0.01,
                  "controlRunning": 0.92, "canaryRunning": 0.6},
                 {"index": 2, "offeredLow": 2.36, "offeredHigh": None, "windows": 9, "outcome": "Regresses",
                  "latencyChange": 0.2, "latencyInterval": [0.1, 0.3], "controlRunning": 12.5, "canaryRunning": 15.25}],
             "crossoverOffered": 2.36, "crossoverBatch": 12.5}}}


def test_the_live_table_fits_80_columns_with_each_stratum_on_its_own_line():
    lines = format_status(POLICY, width=80)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    text = "\n".join(lines)
    assert "through Service serving/chat" in text and "no per-batch results yet" not in text
    rows = [line for line in lines if line.startswith("[")]
    assert rows[0].split()[:3] == ["[0,", "1.18)", "0"]
    assert rows[1].split()[:5] == ["[1.18,", "2.36)", "12", "Wins", "-38.2%"] and "0.9/0.6" in rows[1]
    assert rows[2].split()[:4] == ["[2.36,", "inf)", "9", "Regresses"] and "12.5/15.2" in rows[2]
    assert "stops paying at 2.36 requests per pod per window" in text and "12.5" in text
    assert "rolled back: live: canary error rate 100%" in text


def test_a_narrow_terminal_gets_one_record_a_stratum_and_no_number_cut():
    lines = format_status(POLICY, width=50)
    text = "\n".join(lines)
    assert "-38.2%" in text and "[-45.1, -30.2]" in text.replace("\n    ", " ")
