"""A namespaced install (issue 24, item 4: "a Role, one watched namespace"): the chart's
``watchNamespace``, the operator's ``LOOKAHEAD_WATCH_NAMESPACE``. The operator then watches and acts
in that one namespace with a Role there: a policy targets that namespace alone (another named
namespace, or a namespace selector, is refused with a condition naming the setting), nothing
cluster-scoped is read (the GPU-pool check is skipped and said so; the PodMonitor CRD is looked up
by API discovery), every "all namespaces" list of the API client lists that namespace, and Kopf
must run with ``--namespace``. The chart's side: tests/integration/test_chart.py; the real
apiserver with the Role alone: tests/integration/test_namespaced_install.py."""

from __future__ import annotations

from types import SimpleNamespace

import kopf
import pytest

from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import ConditionType
from lookahead_operator.controller import observe, tenancy
from lookahead_operator.controller import statemachine as sm
from lookahead_operator.controller.world import ActionKind, Target
from lookahead_operator.kube import cache
from lookahead_operator.kube.client import Kube
from lookahead_operator.runtime import handlers

from .test_capacity import ME, TP2
from .test_statemachine import example_spec, world
from .test_tenancy import POLICY, observed
from ..kube.test_cache import target


def test_the_watch_namespace_parses_and_refuses_what_cannot_work():
    assert tenancy.parse_watch_namespace(None) is None and tenancy.parse_watch_namespace("  ") is None
    assert tenancy.parse_watch_namespace("team-a") == "team-a"
    assert tenancy.parse_watch_namespace(" team-a ", {}) == "team-a"
    for bad in ("Team-A", "team_a", "-a", "a" * 64, "a,b"):
        with pytest.raises(ValueError, match="not a namespace name") as err:
            tenancy.parse_watch_namespace(bad)
        assert str(err.value).startswith(tenancy.WATCH_ENV)
    # with an allow-list: a namespaced operator can reach no other namespace; both settings named
    with pytest.raises(ValueError) as err:
        tenancy.parse_watch_namespace("team-a", tenancy.parse_allow_list('{"team-a": ["inference"]}'))
    assert tenancy.WATCH_ENV in str(err.value) and tenancy.ENV in str(err.value)
    assert "watchNamespace" in str(err.value) and "crossNamespaceTargets" in str(err.value)


@pytest.fixture()
def namespaced(monkeypatch):
    monkeypatch.setattr(observe, "CROSS_NAMESPACE", {})
    monkeypatch.setattr(observe, "WATCH_NAMESPACE", "team-a")


def found_condition(plan):
    return next(c for c in plan.status.conditions if c.type == ConditionType.TargetsFound)


def test_a_policy_naming_another_namespace_is_refused_naming_the_watch_namespace(namespaced):
    fleet = {"team-a": [target("team-a")], "kube-system": [target("kube-system", "coredns")]}
    world_ = observed(fleet, POLICY)
    assert [t.key for t in world_.targets] == [("team-a", "llm")]      # kube-system's never read
    plan = sm.reconcile(world_)
    assert plan.actions == []                                         # nothing claimed, anywhere
    found = found_condition(plan)
    assert (found.status, found.reason) == ("False", "NamespaceNotAllowed")
    assert "installed for namespace team-a only" in found.message and "watchNamespace" in found.message
    assert "spec.targets.namespaces names kube-system" in found.message
    assert "crossNamespaceTargets" not in found.message                # no list can allow it here


def test_a_namespace_selector_is_refused_in_a_namespaced_install(namespaced):
    selector = {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}, "namespaceSelector": {}}}
    plan = sm.reconcile(observed({"team-a": [target("team-a")]}, selector))
    found = found_condition(plan)
    assert found.reason == "NamespaceNotAllowed" and "spec.targets.namespaceSelector is set" in found.message
    assert plan.actions == []


def test_its_own_namespace_goes_on_as_in_a_cluster_wide_install(namespaced):
    own = {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}}}
    assert [a.kind for a in sm.reconcile(observed({"team-a": [target("team-a")]}, own)).actions] == [ActionKind.CLAIM]
    named = {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}, "namespaces": ["team-a"]}}
    assert [a.kind for a in sm.reconcile(observed({"team-a": [target("team-a")]}, named)).actions] == \
        [ActionKind.CLAIM]


class PoolReads:
    """A GPU fleet's Deployment; Nodes and every namespace's Pods must not be read."""

    def get_deployment(self, namespace, name):
        return {"spec": {"template": TP2}}

    def nodes(self):
        raise AssertionError("a namespaced install read Nodes")

    def placed_pods(self):
        raise AssertionError("a namespaced install listed every namespace's Pods")


def test_the_pool_is_not_read_and_the_condition_says_why(namespaced):
    spec = example_spec(**{"load.batchSizes": [1, 8]})
    w = world(spec=spec, fingerprint=spec.fingerprint(),
              targets=[Target("serving", "a", "reference", owner=ME, replicas=4, max_unavailable="1", max_surge="0")])
    observe._read_pool(PoolReads(), w)
    assert w.accelerators == {"nvidia.com/gpu": 2} and w.pool is None
    assert "installed for namespace team-a only" in w.pool_error and "Nodes" in w.pool_error
    from .test_capacity import preflight_world   # the state machine says it as the capacity condition
    plan = preflight_world(error=w.pool_error)
    c = next(c for c in plan.status.conditions if c.type == ConditionType.CapacityAvailable)
    assert c.reason == "PoolUnknown" and "installed for namespace team-a only" in c.message


class Recorder(Kube):
    """The API client with its transport recorded (every list answers empty)."""

    def __init__(self, namespace=None, answers=None):
        super().__init__(SimpleNamespace(user_agent=None), namespace=namespace)
        self.paths: list[str] = []
        self.answers = answers or {}

    def request(self, method, path, **kw):
        self.paths.append(path)
        return self.answers.get(path, {"items": []})


def test_the_api_client_lists_the_watch_namespace_only():
    k = Recorder("team-a")
    k.role_deployments("team-a", "p")
    k.wave_deployments("team-a", "p")
    k.load_jobs("team-a", "p")
    k.placed_pods()
    assert k.paths == ["/apis/apps/v1/namespaces/team-a/deployments", "/apis/apps/v1/namespaces/team-a/deployments",
                       "/apis/batch/v1/namespaces/team-a/jobs", "/api/v1/namespaces/team-a/pods"]
    # the namespaces it searches: never beyond it, and no Namespace list for a selector
    spec = LookaheadPolicySpec.model_validate(
        {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}, "namespaceSelector": {"matchLabels": {"tier": "x"}}}})
    k.paths.clear()
    assert k.target_namespaces("team-a", None, ["kube-system", "team-a"]) == ["team-a"]
    assert k.target_namespaces("team-a", spec.targets.namespace_selector, None) == []
    assert k.target_namespaces("team-a", None, None) == ["team-a"]
    assert k.paths == []
    # cluster-wide (no namespace): as before
    wide = Recorder()
    wide.role_deployments("team-a", "p")
    wide.load_jobs("team-a", "p")
    assert wide.paths == ["/apis/apps/v1/deployments", "/apis/batch/v1/jobs"]
    assert wide.target_namespaces("team-a", None, ["kube-system", "team-a"]) == ["kube-system", "team-a"]


def test_the_podmonitor_crd_is_looked_up_by_discovery_in_a_namespaced_install():
    k = Recorder("team-a", {"/apis/monitoring.coreos.com/v1": {"resources": [{"name": "podmonitors"}]}})
    assert k.has_pod_monitor_crd() and k.paths == ["/apis/monitoring.coreos.com/v1"]
    none = Recorder("team-a", {"/apis/monitoring.coreos.com/v1": None})
    assert none.has_pod_monitor_crd() is False
    wide = Recorder(answers={})
    wide.has_pod_monitor_crd()
    assert wide.paths == ["/apis/apiextensions.k8s.io/v1/customresourcedefinitions/podmonitors.monitoring.coreos.com"]


def test_a_podmonitor_crd_removed_since_the_cached_look_is_not_an_error():
    """The CRD looked up less than a minute ago, removed since: the create answers 404, which
    says "not served" (nothing created, no exception), and the cache is corrected at once."""
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/podmonitors.monitoring.coreos.com"
    k = Recorder(answers={crd: {"kind": "CustomResourceDefinition"}})
    assert k.has_pod_monitor_crd()
    k.answers = {crd: None, "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors": None}  # 404s
    mon = {"kind": "PodMonitor", "metadata": {"name": "m", "namespace": "team-a"}}
    assert k.create_if_absent(mon) is False
    assert k.has_pod_monitor_crd() is False and k.paths[-1] == crd
    # one that exists already (409) while the CRD is served: not created, the cache kept
    k = Recorder(answers={crd: {"kind": "CustomResourceDefinition"},
                          "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors": None})
    assert k.has_pod_monitor_crd() and k.create_if_absent(mon) is False and k.has_pod_monitor_crd()


def test_a_podmonitor_crd_being_deleted_is_not_an_error_but_rbac_is():
    """A CRD being deleted refuses creates with 403 "... while custom resource definition is
    terminating": not served (nothing created, the cache corrected); any other 403 (RBAC) is an
    error, as before."""
    from kubernetes.client.rest import ApiException

    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/podmonitors.monitoring.coreos.com"
    mons = "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors"
    mon = {"kind": "PodMonitor", "metadata": {"name": "m", "namespace": "team-a"}}

    class Refusing(Recorder):
        body = ""

        def request(self, method, path, **kw):
            if method == "POST" and path == mons:
                exc = ApiException(status=403, reason="Forbidden")
                exc.body = self.body
                raise exc
            return super().request(method, path, **kw)

    k = Refusing(answers={crd: {"kind": "CustomResourceDefinition"}})
    assert k.has_pod_monitor_crd()
    k.body = ('{"kind":"Status","message":"podmonitors.monitoring.coreos.com \\"m\\" is forbidden: create not '
              'allowed while custom resource definition is terminating","reason":"Forbidden","code":403}')
    assert k.create_if_absent(mon) is False and k.has_pod_monitor_crd() is False
    k = Refusing(answers={crd: {"kind": "CustomResourceDefinition"}})
    k.body = '{"kind":"Status","message":"podmonitors.monitoring.coreos.com is forbidden: User \\"x\\" cannot create","code":403}'
    with pytest.raises(ApiException):
        k.create_if_absent(mon)


def test_a_snapshot_without_the_namespaces_index_still_serves_a_selector_policy():
    spec = LookaheadPolicySpec.model_validate(
        {**POLICY, "targets": {"selector": {"matchLabels": {"app": "llm"}}, "namespaceSelector": {}}})
    snap = cache.Snapshot.of("team-a", "p", spec, [], None, {"team-a": [target("team-a")]}, {}, {})
    assert snap.namespaces == {} and list(snap.deployments) == ["team-a"]


@pytest.fixture()
def log_levels():
    """``handlers.configure`` sets a few loggers' levels: put them back."""
    import logging

    names = ("lookahead_operator", "kopf.objects", "aiohttp.access", "kopf.activities.probe")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)


def test_kopf_must_run_namespaced_when_the_operator_is(monkeypatch):
    monkeypatch.setattr(observe, "WATCH_NAMESPACE", "team-a")
    settings = kopf.OperatorSettings()
    settings.peering.clusterwide = True
    with pytest.raises(kopf.PermanentError) as err:
        handlers.configure(settings)
    assert "--namespace=team-a" in str(err.value) and tenancy.WATCH_ENV in str(err.value)


def test_a_namespaced_kopf_scans_no_cluster_scoped_resources(monkeypatch, log_levels):
    monkeypatch.setattr(observe, "WATCH_NAMESPACE", "team-a")
    monkeypatch.setattr(handlers, "kube", lambda: None)
    monkeypatch.setenv("LOOKAHEAD_METRICS_PORT", "0")
    settings = kopf.OperatorSettings()
    settings.peering.clusterwide = False
    handlers.configure(settings)
    assert settings.scanning.disabled is True


def test_the_daemon_runs_without_the_namespaces_index():
    import inspect

    assert inspect.signature(handlers.run).parameters["namespace_labels"].default is None
