"""Live mode (split: service) through the state machine: the split fixed at Preflight (or refused,
naming the field), arms that join the fleet's Service, the per-stratum table in status.live, the
safety abort, and the decision read from the table."""

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from lookahead_operator.api.status import (ConditionType, DecisionAction, LiveStatus, LiveStratum,
                                           LookaheadPolicyStatus, Phase)
from lookahead_operator.controller import livesplit
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import ActionKind as K
from lookahead_operator.controller.world import ReadError, Target
from lookahead_operator.measurement import live as live_measure
from lookahead_operator.measurement import measure
from lookahead_operator.measurement.results import LiveMeasurement
from lookahead_operator.measurement.stats.live import ArmWindow, LiveComparison, LiveWindow, Strata

from .test_statemachine import CANDIDATE, T0, cond, example_spec, kinds, world
from .test_statemachine import run as run_pass

SPEC = example_spec(**{"load.mode": "live", "load.livePercent": "10%"})
SERVICE = {"metadata": {"name": "chat", "namespace": "serving"}, "spec": {"selector": {"app": "chat"}}}
FLEET = [Target("serving", "a", "reference", owner="inference/chat-fleet", replicas=10)]
READY = {"canary": True, "control": True}


def run(w, **changes):
    """A pass whose live reading (if any) is as fresh as the pass: Prometheus had scraped both arms
    up to now, unless the test's measurement says how far (the abort's blind clock reads it)."""
    if w.live is not None and w.live.seen_until is None:
        w = replace(w, live=replace(w.live, seen_until=w.now))
    return run_pass(w, **changes)


def live_world(**kw):
    base = dict(spec=SPEC, fingerprint=SPEC.fingerprint(), targets=FLEET, live_service=SERVICE)
    base.update(kw)
    return world(**base)


def to_live_measuring(w):
    _, w = run(w)                                                     # Pending -> Preflight
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)    # Preflight -> Launching
    assert w.status.phase == Phase.Launching, w.status.message
    _, w = run(replace(w, roles_ready=READY))                         # Launching -> Measuring
    assert w.status.phase == Phase.Measuring
    return w


def at(w, seconds):
    return replace(w, now=T0 + timedelta(seconds=seconds))


def results(ratio: float, n: int = 30, seed: int = 0, offered: float = 4.0):
    """A live comparison whose canary's per-token latency is ``ratio`` x the control's."""
    rng = np.random.default_rng(seed)
    comp = LiveComparison(measure.thresholds(SPEC), Strata(live_measure.edges_from_rate(offered)))
    for _ in range(n):
        base = 0.02 * float(np.exp(rng.normal(0, 0.02)))
        c = ArmWindow(per_token_latency=base, token_rate=1 / base, ttft=0.1, requests=4, running=1.0)
        k = ArmWindow(per_token_latency=base * ratio * float(np.exp(rng.normal(0, 0.02))),
                      token_rate=1 / (base * ratio), ttft=0.1, requests=4, running=1.0)
        comp.add(LiveWindow(offered_load=offered, control=c, canary=k))
    return comp.results()


def healthy():
    return ArmWindow(per_token_latency=0.02, token_rate=50.0, ttft=0.1, requests=30, errors=0)


def test_preflight_fixes_the_split_and_the_arms_join_with_their_replicas():
    w = live_world()
    _, w = run(w)
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    assert w.status.phase == Phase.Launching
    # 10% of a 10-pod fleet with surge: one pod per arm is 1/12 = 8.33%, two would be 14.3%
    assert w.status.live.arm_replicas == 1 and w.status.live.share == pytest.approx(1 / 12, abs=1e-6)
    assert "Service serving/chat" in w.status.live.message and "8.33%" in w.status.live.message
    roles = [a for a in plan.actions if a.kind == K.ENSURE_ROLES]
    assert roles and all(a.replicas == 1 for a in roles)


def test_a_bigger_fleet_gets_more_replicas_per_arm():
    w = live_world(targets=[replace(FLEET[0], replicas=40)])
    _, w = run(w)
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    assert w.status.live.arm_replicas == 5  # 5 / (40 + 2 x 5) = 10% exactly
    assert [a.replicas for a in plan.actions if a.kind == K.ENSURE_ROLES] == [5]


@pytest.mark.parametrize("edit,field", [
    (dict(live_service=None, live_service_refusal="service: no Service in namespace serving selects the pods"),
     "spec.load.split"),
    (dict(spec=example_spec(**{"load.mode": "live", "load.livePercent": "5%"})), "spec.load.livePercent"),
])
def test_a_split_that_cannot_be_made_fails_naming_the_field_and_creates_nothing(edit, field):
    w = live_world(**edit)
    if "spec" in edit:
        w = replace(w, fingerprint=w.spec.fingerprint())
    _, w = run(w)
    plan, w = run(replace(w, preflight=CANDIDATE), preflight=None)
    assert w.status.phase == Phase.Failed
    c = cond(w.status, ConditionType.Accepted)
    assert c.status == "False" and c.reason == "LiveSplitRefused" and field in c.message
    assert K.ENSURE_ROLES not in kinds(plan) and K.RELEASE in kinds(plan)


def test_measuring_keeps_the_table_checks_the_abort_every_check_interval_and_decides_when_settled():
    w = to_live_measuring(live_world())
    edges = live_measure.edges_from_rate(4.0)
    pending = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(),
                              control_recent=healthy(), edges=edges)
    plan, w = run(replace(at(w, 30), live=pending), live=None)
    assert w.status.phase == Phase.Measuring
    assert w.status.progress.live_edges == list(edges)
    assert plan.requeue_after == SPEC.analysis.abort.check_interval.total_seconds()
    assert cond(w.status, ConditionType.CanaryHealthy).status == "True"
    assert [s.outcome for s in w.status.live.strata if s.windows] == ["Pending"]
    # settled before stepDuration: measures on; after it: Deciding
    settled = LiveMeasurement(windows=30, results=results(0.6), canary_recent=healthy(), control_recent=healthy())
    _, w2 = run(replace(at(w, 60), live=settled), live=None)
    assert w2.status.phase == Phase.Measuring
    _, w3 = run(replace(at(w, SPEC.load.step_duration.total_seconds() + 1), live=settled), live=None)
    assert w3.status.phase == Phase.Deciding
    assert w3.status.progress.live_edges == list(edges)  # fixed once, never re-read
    row = next(s for s in w3.status.live.strata if s.windows)
    assert row.outcome == "Wins" and row.latency_change < -0.3 and row.requests_canary == 120


def test_a_canary_that_fails_requests_is_aborted_at_once_and_the_fleet_is_untouched():
    w = to_live_measuring(live_world())
    failing = ArmWindow(per_token_latency=0.02, token_rate=50.0, ttft=0.1, requests=6, errors=4)
    m = LiveMeasurement(windows=2, results=results(1.0, n=2), canary_recent=failing, control_recent=healthy())
    plan, w = run(replace(at(w, 40), live=m), live=None)
    assert w.status.phase == Phase.RolledBack
    c = cond(w.status, ConditionType.CanaryHealthy)
    assert c.status == "False" and c.reason == "CanaryErrorRate" and "maxErrorRateIncrease" in c.message
    assert K.DELETE_ROLES in kinds(plan) and K.RESTORE not in kinds(plan) and K.PROMOTE not in kinds(plan)
    assert ("Warning", "CanaryErrorRate") in [(t, r) for t, r, _ in plan.events]
    r = w.status.rollback
    assert r.reason == "CanaryErrorRate" and "maxErrorRateIncrease" in r.message and r.at == T0 + timedelta(seconds=40)
    assert "the fleet was not touched" in w.status.message


def test_one_failed_request_does_not_abort():
    w = to_live_measuring(live_world())
    one = ArmWindow(per_token_latency=0.02, token_rate=50.0, ttft=0.1, requests=1, errors=1)
    m = LiveMeasurement(windows=1, results=results(1.0, n=1), canary_recent=one, control_recent=healthy())
    _, w = run(replace(at(w, 20), live=m), live=None)
    assert w.status.phase == Phase.Measuring


def test_no_data_by_the_deadline_is_inconclusive_never_a_win():
    w = to_live_measuring(live_world())
    m = LiveMeasurement(windows=4, results=results(0.5, n=4), canary_recent=healthy(), control_recent=healthy())
    _, w = run(replace(at(w, SPEC.analysis.deadline.total_seconds() + 1), live=m), live=None)
    assert w.status.phase == Phase.Deciding
    d = live_measure.decision(SPEC, w.status, max_batch_size=32)
    assert d.action == DecisionAction.Inconclusive and "lookahead stays off" in d.reason


def _decided(ratio, max_batch=32):
    w = to_live_measuring(live_world())
    m = LiveMeasurement(windows=30, results=results(ratio), canary_recent=healthy(), control_recent=healthy())
    _, w = run(replace(at(w, SPEC.load.step_duration.total_seconds() + 1), live=m), live=None)
    assert w.status.phase == Phase.Deciding
    return live_measure.decision(SPEC, w.status, max_batch_size=max_batch), w


def test_a_win_at_the_fleets_load_is_promoted_regime_aware_up_to_the_batch_it_was_measured_at():
    d, w = _decided(0.6)
    assert d.action == DecisionAction.PromoteRegimeAware
    assert [(r.start, r.end, r.enabled) for r in d.regime] == [(1, 1, True), (2, 32, False)]
    assert "running batch of 1" in d.reason
    plan, w = run(replace(w, decision=d))
    assert w.status.phase == Phase.Promoting


def test_a_loss_at_the_fleets_load_rolls_back():
    d, w = _decided(1.5)
    assert d.action == DecisionAction.Rollback
    _, w = run(replace(w, decision=d))
    assert w.status.phase == Phase.RolledBack


def _table_decision(*rows):
    """decision() on a status.live table of (windows, outcome[, pairs[, latency change]]) rows, one
    per doubling of load (latency +20% unless given)."""
    strata = [LiveStratum(index=i, offered_low=2.0 ** i, offered_high=2.0 ** (i + 1), windows=row[0], outcome=row[1],
                          pairs=row[2] if len(row) > 2 else row[0], latency_change=row[3] if len(row) > 3 else 0.2,
                          control_running=1.0 + i)
              for i, row in enumerate(rows)]
    return live_measure.decision(SPEC, LookaheadPolicyStatus(live=LiveStatus(strata=strata)), max_batch_size=32)


def test_a_loss_where_the_fleet_runs_rolls_back_though_a_brief_lower_load_is_pending():
    # CI's run of the loss e2e: traffic dipped into the stratum below for 7 windows, too few to
    # tell, and the two strata it spent 63 windows in regressed: that is a measured loss
    enough = SPEC.load.min_samples_per_step
    d = _table_decision((enough, "Pending"), (3 * enough, "NoGain"), (6 * enough, "Regresses"))
    assert d.action == DecisionAction.Rollback
    assert "lower load it visited has no answer" in d.reason and "Regresses" in d.reason
    # Pending at the bottom with nothing lost above, or nothing visited: no answer either way
    assert _table_decision((enough, "Pending"), (enough, "Wins")).action == DecisionAction.Inconclusive
    assert _table_decision((enough - 1, "Regresses")).action == DecisionAction.Inconclusive
    # a run of Wins from the bottom still promotes up to its busiest stratum, off above the loss
    d = _table_decision((0, "Pending"), (enough, "Wins"), (enough, "Wins"), (enough, "Regresses"))
    assert d.action == DecisionAction.PromoteRegimeAware
    assert [(r.start, r.end, r.enabled) for r in d.regime] == [(1, 3, True), (4, 32, False)]


def test_a_low_load_whose_windows_are_too_rarely_paired_to_answer_is_read_as_unmeasured():
    # a run of the win e2e: at the lowest load the arms' one pod each idled in most windows; 9
    # windows, 3 paired, Pending to the deadline, above it two strata won: regime-aware, saying so
    enough = SPEC.load.min_samples_per_step
    d = _table_decision((enough + 4, "Pending", 3), (5 * enough, "Wins"), (7 * enough, "Wins"))
    assert d.action == DecisionAction.PromoteRegimeAware, d.reason
    assert [(r.start, r.end, r.enabled) for r in d.regime] == [(1, 3, True), (4, 32, False)]
    assert "too few windows to answer" in d.reason and "(3 paired)" in d.reason
    # paired enough, still Pending at the deadline, its estimate against the canary: an answer is
    # missing, nothing is promoted
    assert _table_decision((enough + 4, "Pending"), (5 * enough, "Wins")).action == DecisionAction.Inconclusive
    # no stratum with enough pairs anywhere: Inconclusive, never a win
    d = _table_decision((3 * enough, "Pending", enough - 1))
    assert d.action == DecisionAction.Inconclusive and "paired windows" in d.reason


def test_a_brief_lower_load_leaning_the_canarys_way_below_a_win_is_read_as_unmeasured():
    # runs of the win e2e: the lowest load the traffic dipped to got 13 windows (11 paired) at
    # -53% latency, too few to settle at the family split, while the two strata above won
    enough = SPEC.load.min_samples_per_step
    rows = ((enough + 3, "Pending", enough + 1, -0.53), (5 * enough, "Wins"), (7 * enough, "Wins"))
    d = _table_decision(*rows)
    assert d.action == DecisionAction.PromoteRegimeAware, d.reason
    assert [(r.start, r.end, r.enabled) for r in d.regime] == [(1, 3, True), (4, 32, False)]
    assert "Pending latency -53.0%" in d.reason and "covered by the win above it" in d.reason
    # the same stratum leaning against the canary (or with no estimate): Inconclusive, as before
    for change in (0.05, None):
        d = _table_decision((enough + 3, "Pending", enough + 1, change), *rows[1:])
        assert d.action == DecisionAction.Inconclusive, d.reason
    # leaning the canary's way, with a loss and no Win above it: still a measured loss
    d = _table_decision(rows[0], (5 * enough, "NoGain"))
    assert d.action == DecisionAction.Rollback
    # leaning its way with nothing settled above: no answer
    d = _table_decision(rows[0], (5 * enough, "Pending", 5 * enough, -0.1))
    assert d.action == DecisionAction.Inconclusive
    # a Pending stratum between two Wins still ends the run (only below the run is it passed over)
    d = _table_decision((5 * enough, "Wins"), rows[0], (5 * enough, "Wins"))
    assert d.action == DecisionAction.PromoteRegimeAware
    assert [(r.start, r.end, r.enabled) for r in d.regime] == [(1, 1, True), (2, 32, False)]


def test_edges_put_the_fleets_load_in_the_middle_of_a_stratum_one_per_doubling():
    edges = live_measure.edges_from_rate(4.0)
    assert len(edges) == 4 and all(b == pytest.approx(2 * a) for a, b in zip(edges, edges[1:]))
    s = Strata(edges)
    lo, hi = s.bounds(s.index(4.0))
    assert lo < 4.0 < hi and hi / 4.0 == pytest.approx(4.0 / lo)
    assert live_measure.edges_from_rate(0.0) == () and live_measure.edges_from_rate(None) == ()


def test_an_arm_window_from_prometheus_counters():
    from lookahead_operator.measurement.prometheus import RoleSample

    s = RoleSample(per_token_latency_s=0.02, output_tokens=400.0, seconds=10.0, started=5.0, ttft_s=0.2)
    a = live_measure.arm_window(s, [0.8], errors=1)
    assert a.per_token_latency == 0.02 and a.ttft == 0.2 and a.requests == 5 and a.errors == 1
    assert a.token_rate == pytest.approx(50.0) and a.running == 0.8   # 400 tokens / (0.8 x 10 s)
    # two pods: the running batch is a pod's (their mean), the token rate per request in flight on both
    two = live_measure.arm_window(s, [0.6, 1.0])
    assert two.running == pytest.approx(0.8) and two.token_rate == pytest.approx(400 / (1.6 * 10))
    # requests that failed before their first token count as served
    assert live_measure.arm_window(s, [0.8], errors=4, served=9).requests == 9
    stall = live_measure.arm_window(RoleSample(output_tokens=0.0, seconds=10.0, started=2.0), [1.0])
    assert stall.token_rate == 0.0 and stall.per_token_latency is None
    idle = live_measure.arm_window(RoleSample(output_tokens=0.0, seconds=10.0, started=0.0), [0.0])
    assert idle.token_rate is None


def test_the_arm_pods_join_the_service_and_keep_their_role_label():
    target = {"metadata": {"name": "a", "namespace": "serving"},
              "spec": {"selector": {"matchLabels": {"app": "chat"}},
                       "template": {"metadata": {"labels": {"app": "chat", "tier": "gpu"}}}}}
    other = {"metadata": {"name": "batch", "namespace": "serving"}, "spec": {"selector": {"app": "batch"}}}
    assert livesplit.fleet_service([other, SERVICE], target) is SERVICE
    with pytest.raises(livesplit.LiveSplitError, match="spec.load.split"):
        livesplit.fleet_service([other], target)


def test_arm_replicas_are_the_splits_in_live_mode_and_canary_replicas_otherwise():
    status = LookaheadPolicyStatus()
    assert livesplit.arm_replicas(SPEC, status) == SPEC.canary.replicas
    status.live = LiveStatus(arm_replicas=3)
    assert livesplit.arm_replicas(SPEC, status) == 3
    sweep = example_spec()
    assert livesplit.arm_replicas(sweep, status) == sweep.canary.replicas


UNREACHABLE = [ReadError("prometheus", "http://prometheus:9090: ConnectionError: refused")]


def blind(w, seconds, **kw):
    """A pass at ``seconds`` where Prometheus could not be read (no live reading, a read error)."""
    return run_pass(replace(at(w, seconds), live=None, read_errors=UNREACHABLE, **kw))


def assert_blind_abort(plan, w, why):
    assert w.status.phase == Phase.RolledBack and w.status.rollback.reason == "AbortBlind", w.status.message
    c = cond(w.status, ConditionType.CanaryHealthy)
    assert c.status == "False" and c.reason == "AbortBlind"
    assert "analysis.abort.maxBlind is 2m" in c.message and why in c.message, c.message
    assert K.DELETE_ROLES in kinds(plan) and K.PROMOTE not in kinds(plan) and K.RESTORE not in kinds(plan)
    assert ("Warning", "AbortBlind") in [(t, r) for t, r, _ in plan.events]
    assert "the fleet was not touched" in w.status.message


def test_a_canary_the_abort_cannot_see_for_max_blind_loses_its_share():
    w = to_live_measuring(live_world())          # measuring from T0
    seen = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(), control_recent=healthy())
    _, w = run(replace(at(w, 30), live=seen), live=None)
    assert w.status.progress.abort_seen_until == T0 + timedelta(seconds=30)
    # Prometheus stops answering: up to maxBlind (2m) after what the abort last saw, it measures on
    for t in (60, 100, 150):
        plan, w = blind(w, t)
        assert w.status.phase == Phase.Measuring and K.DELETE_ROLES not in kinds(plan)
        assert cond(w.status, ConditionType.MetricsAvailable).status == "False"
    plan, w = blind(w, 151)                      # 121 s since it last saw both arms
    assert_blind_abort(plan, w, "ConnectionError: refused")
    assert "121s" in w.status.rollback.message


def test_a_reading_within_max_blind_restarts_the_blind_clock():
    w = to_live_measuring(live_world())
    m = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(), control_recent=healthy())
    _, w = blind(w, 110)
    _, w = run(replace(at(w, 115), live=m), live=None)    # Prometheus is back before 2m
    assert w.status.progress.abort_seen_until == T0 + timedelta(seconds=115)
    _, w = blind(w, 230)
    assert w.status.phase == Phase.Measuring
    plan, w = blind(w, 236)
    assert_blind_abort(plan, w, "ConnectionError")


@pytest.mark.parametrize("seen_until,why", [
    (None, "no live series of an arm's pods"),                   # an arm's targets are down
    (T0 + timedelta(seconds=20), "scraped both arms only up to"),  # Prometheus answers, but stopped scraping
])
def test_prometheus_answering_without_fresh_samples_of_both_arms_is_blind_too(seen_until, why):
    w = to_live_measuring(live_world())
    m = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(), control_recent=healthy(),
                        seen_until=seen_until)
    _, w = run_pass(replace(at(w, 100), live=m), live=None)
    assert w.status.phase == Phase.Measuring
    plan, w = run_pass(replace(at(w, 141), live=m), live=None)
    assert_blind_abort(plan, w, why)


def test_paused_live_policies_keep_the_safety_abort():
    w = to_live_measuring(live_world())
    paused = SPEC.model_copy(update={"paused": True})
    m = LiveMeasurement(windows=3, results=results(0.6, n=3), canary_recent=healthy(), control_recent=healthy())
    plan, w = run(replace(at(w, 30), spec=paused, generation=2, live=m), live=None)
    assert w.status.phase == Phase.Measuring and cond(w.status, ConditionType.Paused).status == "True"
    # the pause freezes the measurement, not the tripwire: looked at every checkInterval
    assert plan.requeue_after == SPEC.analysis.abort.check_interval.total_seconds()
    failing = ArmWindow(per_token_latency=0.02, token_rate=50.0, ttft=0.1, requests=6, errors=4)
    plan, w = run(replace(at(w, 40), live=replace(m, canary_recent=failing)), live=None)
    assert w.status.phase == Phase.RolledBack and w.status.rollback.reason == "CanaryErrorRate"
    assert K.DELETE_ROLES in kinds(plan)
    # and blind while paused: the same bound
    w2 = to_live_measuring(live_world())
    _, w2 = run(replace(at(w2, 30), spec=paused, generation=2, live=m), live=None)
    plan, w2 = blind(w2, 151)
    assert_blind_abort(plan, w2, "ConnectionError")


def test_the_passes_that_watch_the_live_arms_and_read_prometheus():
    sweep = example_spec()
    for phase in Phase:
        watched = sm.watches_live_arms(phase, SPEC)
        assert watched == (phase in (Phase.Measuring, Phase.Deciding)), phase
        assert not sm.watches_live_arms(phase, sweep) and not sm.watches_live_arms(phase, None)
        assert sm.reads_prometheus(phase, SPEC) == (watched or sm.need(phase, SPEC) is not None
                                                    and sm.need(phase, SPEC) != "Decision"), phase
    # a sweep's Deciding reads nothing (the decision is pure), live mode's reads the abort's windows
    assert not sm.reads_prometheus(Phase.Deciding, sweep) and sm.reads_prometheus(Phase.Deciding, SPEC)


def test_a_sweep_is_never_aborted_for_blindness():
    from .test_statemachine import to_measuring, world as sweep_world
    w = to_measuring(sweep_world())
    plan, w = run_pass(replace(at(w, 1000), read_errors=UNREACHABLE))
    assert w.status.phase == Phase.Measuring and K.DELETE_ROLES not in kinds(plan)


def test_a_decision_awaiting_approval_keeps_the_safety_abort_on_the_arms_that_still_serve_users():
    spec = example_spec(**{"load.mode": "live", "load.livePercent": "10%", "promotion.requireApproval": True})
    w = to_live_measuring(live_world(spec=spec, fingerprint=spec.fingerprint()))
    m = LiveMeasurement(windows=30, results=results(0.6), canary_recent=healthy(), control_recent=healthy())
    _, w = run(replace(at(w, spec.load.step_duration.total_seconds() + 1), live=m), live=None)
    assert w.status.phase == Phase.Deciding
    d = live_measure.decision(spec, w.status, max_batch_size=32)
    assert d.action == DecisionAction.PromoteRegimeAware
    # healthy: it waits for approval, looking again every abort.checkInterval (not only on an event)
    plan, w = run(replace(w, decision=d, live=m), live=None)
    assert w.status.phase == Phase.Deciding
    assert cond(w.status, ConditionType.Approved).reason == "AwaitingApproval"
    assert plan.requeue_after == spec.analysis.abort.check_interval.total_seconds()
    # the canary starts failing users' requests while the decision waits: aborted, nothing promoted
    failing = ArmWindow(per_token_latency=0.02, token_rate=50.0, ttft=0.1, requests=6, errors=4)
    bad = replace(m, canary_recent=failing)
    plan, w = run(replace(w, decision=d, live=bad), live=None)
    assert w.status.phase == Phase.RolledBack
    assert cond(w.status, ConditionType.CanaryHealthy).reason == "CanaryErrorRate"
    assert K.DELETE_ROLES in kinds(plan) and K.PROMOTE not in kinds(plan)


def test_a_decision_awaiting_approval_with_prometheus_gone_loses_its_share_after_max_blind():
    spec = example_spec(**{"load.mode": "live", "load.livePercent": "10%", "promotion.requireApproval": True})
    w = to_live_measuring(live_world(spec=spec, fingerprint=spec.fingerprint()))
    m = LiveMeasurement(windows=30, results=results(0.6), canary_recent=healthy(), control_recent=healthy())
    t = spec.load.step_duration.total_seconds() + 1
    _, w = run(replace(at(w, t), live=m), live=None)
    d = live_measure.decision(spec, w.status, max_batch_size=32)
    plan, w = run(replace(at(w, t + 10), decision=d, live=m), live=None)
    assert cond(w.status, ConditionType.Approved).reason == "AwaitingApproval"
    plan, w = blind(w, t + 10 + 120, decision=d)
    assert w.status.phase == Phase.Deciding
    plan, w = blind(w, t + 10 + 121, decision=d)
    assert_blind_abort(plan, w, "ConnectionError")
