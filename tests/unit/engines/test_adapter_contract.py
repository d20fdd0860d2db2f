"""The contract every registered engine adapter honours, checked on a minimal container of its
engine (started by the adapter's own launcher, on an image whose name says nothing): detected as
itself, a canary that adds speculation and a control that is the fleet as it runs (its own
speculation read back by ``existing``), ``problems`` that agree with what
``render_on`` refuses, a regime setting exactly when a regime is supported, complete metric
names, and a checked version it accepts. A new engine gets these checks by its registry line."""

from __future__ import annotations

import copy
import shlex

import pytest

from lookahead_operator import engines
from lookahead_operator.api import metric_names as api_metric_names
from lookahead_operator.engines.argv import container_argv
from lookahead_operator.engines.base import EngineAdapter, EngineSetup, Launcher, lookahead_params
from lookahead_operator.engines.versions import RunningVersion, checked_version, engine_version, parse_version

NGRAM = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2, "promptLookupMax": 5}
ARGS = ["--model", "m", "--port", "8000"]
NEUTRAL_IMAGE = "registry.example/serving/server"

ADAPTERS = list(engines.ADAPTERS.values())


def adapters(**kw):
    return pytest.mark.parametrize("a", ADAPTERS, ids=[a.name for a in ADAPTERS], **kw)


def launch_forms(launcher: Launcher) -> list[list[str]]:
    """Every command prefix that starts the engine: the executable (with its subcommand), each module."""
    forms = [["python3", "-m", m] for m in launcher.modules]
    if launcher.executable:
        forms.insert(0, [launcher.executable] + ([launcher.subcommand] if launcher.subcommand else []))
    return forms


def minimal(a: EngineAdapter, tag: str = "latest", form: int = 0) -> dict:
    return {"name": "engine", "image": f"{NEUTRAL_IMAGE}:{tag}",
            "command": launch_forms(a.detection.launcher)[form] + ARGS}


def shell_form(c: dict) -> dict:
    return {**c, "command": ["sh", "-c", " ".join(shlex.quote(w) for w in c["command"]) + " 2>&1 | cat"]}


def setup_of(a: EngineAdapter, c: dict, spec) -> EngineSetup:
    p = lookahead_params(spec)
    return EngineSetup(c, None, p, engine_version(c, a.name, p, from_image_tag=a.version_from_image_tag),
                       container_argv(c, (a.detection.launcher,)))


def running(a: EngineAdapter) -> RunningVersion:
    """What a pod of ``a``'s engine at its checked version (ours: any release) says at its version endpoint."""
    return RunningVersion(a.checked_version or "0.1.0", "serving/fleet-0", a.version_paths[0])


def gate_setup(a: EngineAdapter, c: dict, spec) -> EngineSetup:
    """The setup ``support_problems`` checks, with the running engine's version read."""
    p = lookahead_params(spec)
    return EngineSetup(c, None, p, checked_version(c, a.name, p, running(a), from_image_tag=a.version_from_image_tag),
                       container_argv(c, (a.detection.launcher,)))


def flags(argv: list[str]) -> set[str]:
    return {x.split("=", 1)[0] for x in argv if x.startswith("-")}


def test_the_registry_lists_each_adapter_once_under_its_name():
    assert engines.ENGINES == tuple(engines.ADAPTERS) and len(ADAPTERS) == len(set(engines.ENGINES))
    assert len({a.detection.order for a in ADAPTERS}) == len(ADAPTERS)
    with pytest.raises(engines.EngineError, match="unknown engine"):
        engines.adapter("tgi")
    assert engines.support_problems(minimal(ADAPTERS[0]), "tgi", NGRAM, False) == [
        f"unknown engine 'tgi' (expected one of {', '.join(engines.ENGINES)})"]


@adapters()
def test_the_methods_an_adapter_renders_are_those_the_api_lets_through(a):
    """``spec.METHOD_ENGINES`` (what the CRD and the model accept per engine) is exactly what each
    adapter renders at its checked version: no method accepted at apply and refused in Pending,
    none refused at apply that the engine runs."""
    from lookahead_operator.api.spec import METHOD_ENGINES, Engine, method_engine_error

    c = minimal(a)
    renders = {m for m in engines.METHODS if not a.problems(gate_setup(a, c, {**NGRAM, "method": m}), False)}
    assert renders == {m.value for m, on in METHOD_ENGINES.items() if a.name in on}
    assert {m for m in engines.METHODS if method_engine_error(m, a.name) is None} == renders
    assert set(engines.METHODS) == {m.value for m in METHOD_ENGINES}
    assert set(engines.ENGINES) == {e.value for e in Engine} - {"auto"}


@adapters()
def test_adapter_is_a_complete_record(a):
    assert isinstance(a, EngineAdapter) and engines.adapter(a.name) is a
    for fn in (a.problems, a.render_on, a.render_control, a.existing, a.regime_config):
        assert callable(fn)
    assert launch_forms(a.detection.launcher), "an adapter must say how its engine is launched"


@adapters()
def test_detected_as_itself_from_every_launch_form_plain_and_in_a_shell(a):
    for form in range(len(launch_forms(a.detection.launcher))):
        c = minimal(a, form=form)
        sh = shell_form(c)
        for container in (c, sh):
            assert engines.detect_container_engine(container) == a.name, container
            assert engines.detect_engine({"spec": {"containers": [{"name": "proxy", "image": "envoy:1"}, container]}}) \
                == a.name
        # the launcher finds the engine command inside the script: its arguments are what follows it
        assert engines.container_flag(sh, "--port") == "8000"
        assert container_argv(sh, (a.detection.launcher,)) == ARGS


@adapters()
def test_canary_adds_speculation_and_the_control_is_the_fleet_as_it_runs(a):
    c = minimal(a)
    before = copy.deepcopy(c)
    on = a.render_on(c, NGRAM)
    off = a.render_control(c)
    assert c == before and on != c and off is not c         # pure: a new container, the input untouched
    ours = flags(on["command"]) - flags(off["command"])
    assert ours, "the canary must add speculation flags"
    assert a.existing(c) is None and a.existing(off) is None     # a fleet without speculation: a control without
    assert a.existing(on).method == "ngram"                      # the canary's method, read back
    # a fleet already running the canary's config: its control runs it too, and the canary is unchanged
    assert a.existing(a.render_control(on)).method == "ngram" and a.render_on(on, NGRAM) == on
    assert a.render_control(off) == off                     # idempotent
    assert set(flags(off["command"])) - set(flags(c["command"])) <= {"--enable-metrics"}, \
        "the control adds nothing but what measuring needs"
    assert engines.detect_container_engine(on) == engines.detect_container_engine(off) == a.name
    assert on["command"][:len(c["command"]) - len(ARGS)] == c["command"][:len(c["command"]) - len(ARGS)]


@adapters()
def test_a_different_existing_method_is_refused_unless_replace_existing(a):
    other = "jacobi" if a.name == "reference" else None
    other_spec = {**NGRAM, "method": other} if other else None
    fleet = a.render_on(minimal(a), NGRAM)                    # a fleet on ngram
    candidates = [m for m in engines.METHODS if m != "ngram" and not a.problems(setup_of(a, fleet, {
        **NGRAM, "method": m, "replaceExisting": True}), False)]
    if not candidates:
        return                                                # this engine runs one method only
    spec = other_spec or {**NGRAM, "method": candidates[0]}
    problems = a.problems(setup_of(a, fleet, spec), False)
    assert any("the fleet runs n-gram" in m and "spec.lookahead.replaceExisting: true" in m for m in problems)
    replaced = a.render_on(fleet, {**spec, "replaceExisting": True})
    assert a.existing(replaced).method == spec["method"] and a.existing(a.render_control(fleet)).method == "ngram"


@adapters()
def test_a_shell_form_renders_the_same_arguments_as_the_plain_form(a):
    c = minimal(a)
    launch = len(c["command"]) - len(ARGS)
    for plain, sh in ((a.render_on(c, NGRAM), a.render_on(shell_form(c), NGRAM)),
                      (a.render_control(c), a.render_control(shell_form(c)))):
        script = shlex.split(sh["command"][2])
        assert script[:-3] == plain["command"] and script[-3:] == ["2>&1", "|", "cat"]
        assert container_argv(sh, (a.detection.launcher,)) == plain["command"][launch:]


@adapters()
@pytest.mark.parametrize("regime", [None, 4])
def test_problems_are_strings_and_agree_with_what_render_on_refuses(a, regime):
    c = minimal(a)
    refused, accepted = [], []
    for method in engines.METHODS:
        spec = {**NGRAM, "method": method}
        problems = a.problems(gate_setup(a, c, spec), regime is not None)
        assert isinstance(problems, list) and all(isinstance(m, str) and m for m in problems)
        (refused if problems else accepted).append(method)
        assert engines.support_problems(c, a.name, spec, regime is not None, running(a)) == problems
        if problems:
            with pytest.raises(engines.EngineError) as exc:
                a.render_on(c, spec, regime)
            assert str(exc.value) == "; ".join(problems)
        else:
            a.render_on(c, spec, regime)
    assert refused, f"{a.name} refuses no method: an unsupported config must produce problems"
    if regime is None:
        assert accepted, f"{a.name} accepts no method"


@adapters()
def test_regime_config_exactly_when_a_regime_is_supported(a):
    c = minimal(a)
    p = lookahead_params(NGRAM)
    if a.problems(setup_of(a, c, NGRAM), True):
        with pytest.raises(engines.EngineError):
            a.regime_config(p, 4, None)
    else:
        setting = a.regime_config(p, 4, None)
        assert isinstance(setting, dict) and setting
        assert engines.regime_config(a.name, NGRAM, 4) == setting


@adapters()
def test_metric_names_are_complete_and_the_api_catalogue_entry(a):
    m = a.metrics
    assert m is api_metric_names.metric_names(a.name) is engines.metric_names(a.name)
    assert m.engine == a.name and m.labels
    for field in ("per_token_latency", "ttft", "e2e", "generation_tokens", "running", "waiting"):
        assert getattr(m, field), f"{a.name} has no {field} metric"
    assert m.accepted_tokens or m.drafts or m.acceptance_length_gauge, f"{a.name} has no acceptance signal"
    for names in (m.histograms(), m.counters(), m.gauges()):
        assert names and all(isinstance(v, str) and v for v in names.values())


@adapters()
def test_the_checked_version_is_accepted(a):
    if not a.version_from_image_tag:
        assert a.checked_version is None
        # what support_problems reads for it: its tag is not its version (the adapter says so)
        assert engines.support_problems(minimal(a, tag="9.9.9"), a.name, NGRAM, False, running(a)) == []
        assert setup_of(a, minimal(a, tag="9.9.9"), NGRAM).version.version is None
        return
    version = parse_version(a.checked_version)
    assert version is not None
    c = minimal(a, tag=f"v{a.checked_version}")
    assert setup_of(a, c, NGRAM).version.version == version
    assert engines.support_problems({"spec": {"containers": [c]}}, None, NGRAM, False, running(a)) == []
    # the user's statement, with no running version read, is taken too
    assert engines.support_problems({"spec": {"containers": [c]}}, None, {**NGRAM, "engineVersion": a.checked_version},
                                    False) == []


@adapters()
def test_the_version_endpoints_are_declared_and_their_answers_read(a):
    assert a.version_paths and all(path.startswith("/") for path in a.version_paths)
    answer = {"version": a.checked_version or "0.1.0", "model_path": "m"}
    for path in a.version_paths:
        assert engines.version_from_answer(a.name, path, answer) == answer["version"]
        for bad in ({}, {"version": None}, {"version": "latest"}, ["0.1.0"], "0.1.0"):
            with pytest.raises(engines.EngineError, match="version"):
                engines.version_from_answer(a.name, path, bad)


@adapters()
def test_a_version_in_doubt_proves_nothing_and_the_refusal_says_why(a):
    """No running version read and only a tag: every feature this adapter gates on a version is
    refused with the reason; the same fleet with its running version read is not."""
    c = minimal(a, tag=f"v{a.checked_version or '9.9.9'}")
    for method in engines.METHODS:
        for regime in (False, True):
            spec = {**NGRAM, "method": method}
            proven = engines.support_problems(c, a.name, spec, regime, running(a))
            unread = engines.support_problems(c, a.name, spec, regime)
            extra = [m for m in unread if m not in proven]
            assert all("could not be read from the running engine (no running pod was read)" in m
                       and "a tag alone is not proof" in m and "spec.lookahead.engineVersion" in m for m in extra), extra
