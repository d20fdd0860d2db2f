"""Pure builders: the objects the operator creates or patches, as plain dicts.

Nothing here talks to the API server. The handlers call these and send what they return.
The engine-specific part (which flags turn lookahead on or off) is a callable passed in from
``lookahead_operator.engines``, so one builder serves vLLM, SGLang and the reference engine.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Callable, Iterable

from lookahead_operator.api.spec import MAX_POD_MONITOR_LABELS, pod_monitor_label_problem
from lookahead_operator.api.names import (  # noqa: F401 - the names builders put on objects (api/names.py owns them)
    ANNOTATION_ORIGINAL_TEMPLATE,
    ANNOTATION_OWNER,
    ANNOTATION_PROMOTED,
    ANNOTATION_SOURCE,
    DEFAULT_LOAD_LIMITS,
    DEFAULT_LOAD_REQUESTS,
    GROUP,
    LABEL_DRIVES,
    LABEL_GENERATION,
    LABEL_MANAGED_BY,
    LABEL_POD,
    LABEL_POLICY,
    LABEL_POLICY_NAMESPACE,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_STEP,
    LABEL_TARGET,
    LABEL_WAVE,
    MANAGED_BY,
    ROLE_WAVE,
    ROLES,
)

PROMPTS_MOUNT = "/etc/lookahead/prompts"  # where a load Job mounts the policy's configMapRef prompts

ContainerTransform = Callable[[dict], dict]


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 name from parts; too-long names are cut and suffixed with a stable hash."""
    name = "-".join(p.strip("-").lower() for p in parts if p)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def policy_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def owned_name(policy_namespace: str | None, policy_name: str, namespace: str | None, *suffix: str) -> str:
    """The name of an object the policy creates in ``namespace``: ``lap-<policy>-<suffix>``. In
    another namespace than the policy's, two policies of the same name (from two namespaces) can
    target it, so the name also carries a short hash of the policy's namespace/name there."""
    parts = ["lap", policy_name]
    if policy_namespace and namespace and policy_namespace != namespace:
        parts.append(hashlib.sha256(policy_key(policy_namespace, policy_name).encode()).hexdigest()[:6])
    return dns_name(*parts, *suffix)


def role_deployment_name(policy_name: str, role: str, policy_namespace: str | None = None,
                         namespace: str | None = None) -> str:
    return owned_name(policy_namespace, policy_name, namespace, role)


#: The proxies a service mesh injects into pods (Linkerd puts its own first): never the engine,
#: whatever their position.
MESH_PROXIES = frozenset({"linkerd-proxy", "istio-proxy"})


def engine_container_index(template: dict, is_engine: Callable[[dict], bool], name: str | None = None) -> int:
    """Index of the serving container in a pod template (or a pod): the one named ``name`` when
    given and present (a pod's containers keep their template's names; a pod as the cache keeps
    it has only names and ports, nothing engine detection reads), else the first one the engine
    adapter recognises, else the first that is not a mesh proxy (``MESH_PROXIES``), else the first."""
    containers = template.get("spec", {}).get("containers") or []
    if not containers:
        raise ValueError("the target's pod template has no containers")
    for i, container in enumerate(containers):
        if name is not None and container.get("name") == name:
            return i
    for i, container in enumerate(containers):
        if is_engine(container):
            return i
    return next((i for i, c in enumerate(containers) if c.get("name") not in MESH_PROXIES), 0)


def engine_container(template: dict, is_engine: Callable[[dict], bool], name: str | None = None) -> dict:
    """The serving container of a pod template or a pod (``engine_container_index``)."""
    return template["spec"]["containers"][engine_container_index(template, is_engine, name)]


def _with_container(template: dict, index: int, transform: ContainerTransform) -> dict:
    out = copy.deepcopy(template)
    containers = out["spec"]["containers"]
    containers[index] = transform(copy.deepcopy(containers[index]))
    return out


def policy_labels(policy: dict) -> dict[str, str]:
    """The labels that identify a policy's objects (name and namespace)."""
    return {LABEL_POLICY: policy["metadata"]["name"], LABEL_POLICY_NAMESPACE: policy["metadata"]["namespace"]}


def role_labels(policy: dict, role: str, target_name: str, generation: int) -> dict[str, str]:
    return {
        **policy_labels(policy),
        LABEL_ROLE: role,
        LABEL_TARGET: target_name,
        LABEL_GENERATION: str(generation),
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def owner_reference(policy: dict) -> dict:
    meta = policy["metadata"]
    return {
        "apiVersion": policy.get("apiVersion", f"{GROUP}/v1alpha1"),
        "kind": policy.get("kind", "LookaheadPolicy"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_metadata(policy: dict, name: str, namespace: str, labels: dict, annotations: dict | None = None) -> dict:
    """The metadata of an object we create for ``policy``: owned by it (garbage-collected with it)
    where Kubernetes allows, in the policy's own namespace; elsewhere the finalizer cleans up."""
    meta: dict = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    if policy["metadata"].get("namespace") == namespace:
        meta["ownerReferences"] = [owner_reference(policy)]
    return meta


def serving_labels(target: dict, pod: dict) -> dict[str, str] | None:
    """The labels a role pod needs to join the fleet's Service beside ``target``'s pods: the
    target selector's ``matchLabels`` (which ``build_role_deployment`` leaves off role pods), to be
    merged onto the pod; None when it has them all already, is being deleted, or the selector has
    no ``matchLabels`` (a ``matchExpressions``-only selector is not written onto a pod)."""
    want = dict(((target.get("spec") or {}).get("selector") or {}).get("matchLabels") or {})
    meta = pod.get("metadata") or {}
    have = meta.get("labels") or {}
    if not want or meta.get("deletionTimestamp") or all(have.get(k) == v for k, v in want.items()):
        return None
    return want


def build_role_deployment(target: dict, policy: dict, role: str, replicas: int,
                          transform: ContainerTransform, is_engine: Callable[[dict], bool],
                          metrics_port: int | None = None, metrics_path: str = "/metrics",
                          default_port: int = 8000) -> dict:
    """The canary (lookahead on) or control (off) Deployment, cloned from the target's pod template.

    Everything of the template is kept (image, resources, node selectors, tolerations, volumes,
    env); only the engine container's lookahead flags differ, as the engine adapter renders them.
    The clone lives in the target's namespace. An owner reference to the policy is set when the
    policy is in the same namespace (owner references cannot cross namespaces); the policy's
    finalizer deletes clones in other namespaces by label.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    policy_name = policy["metadata"]["name"]
    generation = int(policy["metadata"].get("generation", 1))
    target_meta = target["metadata"]
    labels = role_labels(policy, role, target_meta["name"], generation)
    template = copy.deepcopy(target["spec"]["template"])
    index = engine_container_index(template, is_engine)
    template = _with_container(template, index, transform)
    tmeta = template.setdefault("metadata", {})
    # The clone must not match the fleet's Service or the fleet Deployment's selector.
    tmeta["labels"] = {**{k: v for k, v in (tmeta.get("labels") or {}).items()
                          if k not in _selector_keys(target)}, **labels}
    annotations = dict(tmeta.get("annotations") or {})
    port = metrics_port or container_port(template["spec"]["containers"][index], default_port)
    annotations.update({"prometheus.io/scrape": "true", "prometheus.io/path": metrics_path,
                        "prometheus.io/port": str(port)})
    tmeta["annotations"] = annotations
    meta = owned_metadata(policy, role_deployment_name(policy_name, role, policy["metadata"].get("namespace"),
                                                       target_meta["namespace"]),
                          target_meta["namespace"], labels,
                          {ANNOTATION_SOURCE: f"{target_meta['namespace']}/{target_meta['name']}"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {**policy_labels(policy), LABEL_ROLE: role}},
            "template": template,
        },
    }


def _selector_keys(target: dict) -> set[str]:
    return set((target["spec"].get("selector") or {}).get("matchLabels") or {})


def serving_port_spec(container: dict) -> dict | None:
    """The engine container's serving port as it declares it: the port named ``http``, else its
    first declared port; ``None`` when it declares none."""
    ports = container.get("ports") or []
    return next((p for p in ports if p.get("name") == "http"), ports[0] if ports else None)


def container_port(container: dict, default: int = 8000) -> int:
    """The serving port's number (``serving_port_spec``), else ``default`` (the engine's own:
    ``engines.listen_port``)."""
    port = serving_port_spec(container)
    return int(port["containerPort"]) if port else default


def metrics_port_ref(container: dict, default: int = 8000) -> str | int:
    """How a PodMonitor names the engine's serving port: its name, else its number (``default``
    when it declares none: then no PodMonitor endpoint can select it, see ``build_pod_monitor``)."""
    port = serving_port_spec(container)
    return port["name"] if port and port.get("name") else container_port(container, default)


def _load_prompts(prompts) -> tuple[str, list[dict], list[dict]]:
    """The load generator's ``--prompts`` argument, and the volume and mount its prompts need: a
    bundled set by name (none), or the team's ConfigMap mounted at ``PROMPTS_MOUNT``."""
    ref = getattr(prompts, "config_map_ref", None)
    if ref is None:
        builtin = getattr(prompts, "builtin", None) or prompts or "chat"
        return str(getattr(builtin, "value", builtin)), [], []
    volume = {"name": "prompts", "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}]}}
    mount = {"name": "prompts", "mountPath": PROMPTS_MOUNT, "readOnly": True}
    return f"{PROMPTS_MOUNT}/{ref.key}", [volume], [mount]


def build_load_job(policy: dict, namespace: str, role: str, step: int | str, run: int, batch_size: int, url: str,
                   duration_s: float, image: str, prompts, model: str | None = None,
                   extra_labels: dict[str, str] | None = None,
                   resources: dict[str, dict[str, str]] | None = None,
                   pod_options: dict | None = None) -> dict:
    """A closed-loop load generator Job holding ``batch_size`` requests in flight against one role.

    ``pod_options``: the pod spec's nodeSelector, tolerations, priorityClassName and
    imagePullSecrets (``api.spec.LoadSpec.pod_options``: the policy's, else the operator's defaults).

    ``prompts`` is the policy's ``load.prompts`` (an ``api.spec.PromptSource``): a bundled set by name,
    or the team's own JSON-lines prompts mounted from their ConfigMap (in ``namespace``). The name
    carries ``run`` (``status.progress.loadRun``), never the policy's generation, so a restarted
    step gets a fresh Job and pausing (which bumps the generation) duplicates nothing.
    """
    policy_name = policy["metadata"]["name"]
    labels = {**policy_labels(policy), LABEL_ROLE: "loadgen", LABEL_STEP: str(step), LABEL_RUN: str(run),
              LABEL_MANAGED_BY: MANAGED_BY, LABEL_DRIVES: role, **(extra_labels or {})}
    prompts_arg, volumes, mounts = _load_prompts(prompts)
    args = ["--url", url, "--concurrency", str(batch_size), "--step-duration", f"{int(duration_s)}s",
            "--prompts", prompts_arg, "--json"]
    if model:
        args += ["--model", model]
    meta = owned_metadata(policy, owned_name(policy["metadata"].get("namespace"), policy_name, namespace, f"r{run}",
                                             f"s{step}", role), namespace, labels)
    container = {
        "name": "loadgen",
        "image": image,
        "command": ["python3", "-m", "lookahead_canary.loadgen"],
        "args": args,
        # the policy's load.resources (api.spec.LoadResources), else its defaults
        "resources": resources if resources is not None else {"requests": dict(DEFAULT_LOAD_REQUESTS),
                                                              "limits": dict(DEFAULT_LOAD_LIMITS)},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec = {
        "restartPolicy": "Never",
        # a deleted load Job must stop loading before the next step's starts: the load generator
        # exits on SIGTERM, and the kubelet's SIGKILL follows soon if it could not
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
    }
    if volumes:
        pod_spec["volumes"] = volumes
    pod_spec.update(pod_options or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 1,
            "ttlSecondsAfterFinished": 3600,
            "activeDeadlineSeconds": int(duration_s * 3 + 120),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


#: The chart's podMonitor.labels, as JSON: the labels on every PodMonitor the operator creates
#: (kube-prometheus-stack's Prometheus picks PodMonitors labelled ``release: <its release>``).
POD_MONITOR_LABELS_ENV = "LOOKAHEAD_POD_MONITOR_LABELS"


def chart_pod_monitor_labels(raw: str | None) -> dict[str, str]:
    """The chart's podMonitor.labels from ``LOOKAHEAD_POD_MONITOR_LABELS`` (a JSON object; unset,
    empty or ``null``: none), checked by the rule of a policy's ``analysis.prometheus.podMonitorLabels``
    (Kubernetes label syntax, none of the operator's own). ``ValueError`` naming the variable and
    the first bad label otherwise (the operator refuses to start on it)."""
    where = f"{POD_MONITOR_LABELS_ENV} (the chart's podMonitor.labels)"
    if not raw or not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg}); expected an object such as "
                         '{"release": "kube-prometheus-stack"}') from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object (label key -> value), got {type(data).__name__}")
    if len(data) > MAX_POD_MONITOR_LABELS:
        raise ValueError(f"{where}: at most {MAX_POD_MONITOR_LABELS} labels, got {len(data)}")
    for key, value in data.items():
        problem = pod_monitor_label_problem(key, value)
        if problem:
            raise ValueError(f"{where}: {problem}")
    return dict(data)


def build_pod_monitor(policy: dict, namespace: str, port: str | int = "http", path: str = "/metrics",
                      labels: dict[str, str] | None = None) -> dict:
    """A Prometheus Operator PodMonitor scraping the policy's canary and control pods on their
    engine container's port (``metrics_port_ref``: never a mesh proxy's port): by name (``port``),
    or by number for a port without one (``portNumber``, Prometheus Operator 0.79+, which replaced
    the deprecated ``targetPort``; an older operator drops the field it does not know, so a
    relabelling keeps only that port number on every version).

    ``labels`` go on its metadata beside the operator's own: what a Prometheus' ``podMonitorSelector``
    picks (the chart's podMonitor.labels with the policy's ``analysis.prometheus.podMonitorLabels``
    over them: ``pod_monitor_labels``). The validation refuses the operator's own keys in them; were
    one to get through, the operator's value wins.

    The relabelling copies the pod labels the queries rely on into ``lookahead_dev_role``,
    ``lookahead_dev_policy`` and ``lookahead_dev_target`` (what the annotation-based scrape config
    documented in docs/analyze.md produces too), so one set of PromQL serves both.
    """
    policy_name = policy["metadata"]["name"]
    relabel = [
        {"sourceLabels": [f"__meta_kubernetes_pod_label_lookahead_dev_{k}"], "targetLabel": f"lookahead_dev_{k}"}
        for k in ("role", "policy", "policy_namespace", "target")
    ] + [{"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"}]
    if isinstance(port, int):
        endpoint: dict = {"portNumber": port}
        relabel.insert(0, {"sourceLabels": ["__meta_kubernetes_pod_container_port_number"], "regex": str(port),
                           "action": "keep"})
    else:
        endpoint = {"port": port}
    meta = owned_metadata(policy, owned_name(policy["metadata"].get("namespace"), policy_name, namespace), namespace,
                          {**(labels or {}), **policy_labels(policy), LABEL_MANAGED_BY: MANAGED_BY})
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": policy_labels(policy),
                         "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": list(ROLES)}]},
            "podMetricsEndpoints": [{**endpoint, "path": path, "interval": "5s", "relabelings": relabel}],
        },
    }


def pod_monitor_labels(chart: dict[str, str], policy: dict[str, str] | None) -> dict[str, str]:
    """The labels a policy's PodMonitor carries besides the operator's own: the chart's, with the
    policy's ``analysis.prometheus.podMonitorLabels`` over them (same key: the policy's value)."""
    return {**chart, **(policy or {})}


# --- the user's Deployments: save, promote, restore ------------------------------------------
#
# What the operator writes on a target, and how it tells its own writes from a user's edit
# (docs/operator.md, "When a user edits a target mid-rollout"):
#
# * claim: annotations only (owner, the exact pod template saved); never the template;
# * promote: one PUT of the whole Deployment as read (optimistic concurrency on its
#   resourceVersion): the template built from the SAVED original plus the engine change, and, in
#   the same write, the decision id and the digest of that template (``ANNOTATION_PROMOTED_TEMPLATE``);
# * restore: one PUT with the saved template back and our annotations removed.
#
# Each write changes the template and the annotations that describe it together, so any version of
# the object (fresh or from a lagging cache) says which template the operator last wrote: the saved
# original when not marked promoted, the digest when marked. Anything else is a user's edit.

#: On a promoted target: the digest of the pod template the operator wrote (``template_digest``).
#: (One more operator annotation beside those of ``api/names.py``.)
ANNOTATION_PROMOTED_TEMPLATE = f"{GROUP}/promoted-template"
#: On a target promoted in part (a replica wave): how many of its replicas the operator lent to the
#: target's wave Deployment (``build_wave_deployment``), which runs them with lookahead on. Its
#: ``spec.replicas`` is that many lower than before; restoring gives them back.
ANNOTATION_PROMOTED_PODS = f"{GROUP}/promoted-pods"
#: On the target canary and control are cloned from, with ``canary.capacity: carveOut``: how many
#: of its replicas the operator took out of it for them, and of how many ("2/4", ``carve_patch``).
#: Its ``spec.replicas`` is that many lower; deleting the roles, restoring, releasing or leaving it
#: gives them back (unless someone else has set its count since: ``carved_back``).
ANNOTATION_CARVED_OUT = f"{GROUP}/carved-out"

#: Every annotation the operator puts on a target Deployment (and removes when it lets go of it).
TARGET_ANNOTATIONS = (ANNOTATION_OWNER, ANNOTATION_ORIGINAL_TEMPLATE, ANNOTATION_PROMOTED, ANNOTATION_PROMOTED_TEMPLATE,
                      ANNOTATION_PROMOTED_PODS, ANNOTATION_CARVED_OUT)


def canonical(obj) -> str:
    """Canonical JSON: sorted keys, no whitespace (how the saved template is written)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def original_template(deployment: dict) -> dict | None:
    raw = (deployment["metadata"].get("annotations") or {}).get(ANNOTATION_ORIGINAL_TEMPLATE)
    return json.loads(raw) if raw else None


_PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def _pull_policy(image: str | None) -> str:
    image = image or ""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_container(c: dict) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _pull_policy(c.get("image")))
    c.setdefault("resources", {})
    for port in c.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for env in c.get("env") or []:
        ref = (env.get("valueFrom") or {}).get("fieldRef")
        if ref is not None:
            ref.setdefault("apiVersion", "v1")
    for name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = c.get(name)
        if probe is None:
            continue
        for k, v in _PROBE_DEFAULTS.items():
            probe.setdefault(k, v)
        if "httpGet" in probe:
            probe["httpGet"].setdefault("scheme", "HTTP")


def comparable_template(template: dict, strip_promoted: bool = False) -> dict:
    """A pod template as the apiserver stores it, for comparisons: the defaults it fills in
    (``SetDefaults_PodSpec``/``_Container``, probes, ports, volumes) added where missing and
    ``null`` metadata values (``creationTimestamp: null``) dropped. The identity on a template the
    apiserver returned (every default is already there), so it never hides a user's edit of a live
    object; it makes a template the operator computed (the saved original plus the engine change)
    compare equal to what the apiserver stores for it. ``strip_promoted``: without the operator's
    own ``ANNOTATION_PROMOTED`` on the template's metadata."""
    t = copy.deepcopy(dict(template or {}))
    meta = {k: v for k, v in (t.get("metadata") or {}).items() if v is not None}
    if strip_promoted and meta.get("annotations"):
        rest = {k: v for k, v in meta["annotations"].items() if k != ANNOTATION_PROMOTED}
        if rest:
            meta["annotations"] = rest
        else:
            meta.pop("annotations")
    t["metadata"] = meta
    spec = t.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            _default_container(c)
    for v in spec.get("volumes") or []:
        for kind in ("configMap", "secret"):
            if kind in v:
                v[kind].setdefault("defaultMode", 420)
    return t


def template_digest(template: dict) -> str:
    """The digest recorded with a promotion (``ANNOTATION_PROMOTED_TEMPLATE``): sha256 of the
    canonical JSON of ``comparable_template(template)``."""
    return "sha256:" + hashlib.sha256(canonical(comparable_template(template)).encode()).hexdigest()


def user_edited(deployment: dict) -> bool:
    """Whether someone else changed a claimed target's pod template since the operator last wrote it.

    The template must be the one the operator's last write left: the saved original when the
    Deployment is not marked promoted, or exactly the template it promoted (its digest,
    ``ANNOTATION_PROMOTED_TEMPLATE``) when it is. Only ``spec.template`` counts: replicas (``kubectl
    scale``, an HPA), the Deployment's own labels and annotations, its strategy, its status are not
    an edit. Anything in the template is (an image, an env var, a flag, ``kubectl rollout restart``'s
    annotation, ``kubectl rollout undo`` back to the original while promoted). False when nothing is
    saved (not claimed), when the saved template is unreadable, and for a promotion written by an
    operator that recorded no digest (it cannot be told apart). A target promoted in part (a replica
    wave, ``ANNOTATION_PROMOTED_PODS``) keeps its saved template: that is what it must have."""
    ann = deployment["metadata"].get("annotations") or {}
    if not ann.get(ANNOTATION_ORIGINAL_TEMPLATE):
        return False
    live = (deployment.get("spec") or {}).get("template") or {}
    if ann.get(ANNOTATION_PROMOTED) and not ann.get(ANNOTATION_PROMOTED_PODS):
        digest = ann.get(ANNOTATION_PROMOTED_TEMPLATE)
        return bool(digest) and template_digest(live) != digest
    try:
        saved = original_template(deployment)
    except ValueError:
        return False
    return (canonical(comparable_template(live, strip_promoted=True))
            != canonical(comparable_template(saved, strip_promoted=True)))


def claim_patch(deployment: dict, owner: str) -> dict:
    """Mark a fleet Deployment as owned by a policy and save its pod template, exactly, before
    anything else touches it (annotations only: the template is not touched). A template saved
    earlier is kept -- after a crash the first save is the truth -- unless the template was edited
    by someone else since (``user_edited``): a saved copy that is no longer what runs would one day
    be restored over the user's change, so the current template is saved instead and the promotion
    marks that described the old one go."""
    annotations: dict = {ANNOTATION_OWNER: owner}
    saved = bool((deployment["metadata"].get("annotations") or {}).get(ANNOTATION_ORIGINAL_TEMPLATE))
    if not saved or user_edited(deployment):
        annotations[ANNOTATION_ORIGINAL_TEMPLATE] = canonical(deployment["spec"]["template"])
        if saved:
            annotations.update({ANNOTATION_PROMOTED: None, ANNOTATION_PROMOTED_TEMPLATE: None})
    return {"metadata": {"annotations": annotations}}


def promote_patch(deployment: dict, transform: ContainerTransform, is_engine: Callable[[dict], bool],
                  decision_id: str) -> dict:
    """What promoting one fleet Deployment writes: the template built from the SAVED original with
    lookahead turned on (never from the live one), the decision id, and the digest of that template
    (so a later edit by anyone else can be told apart: ``user_edited``). ``promote_body`` writes it
    as a whole-object replacement."""
    saved = original_template(deployment)
    if saved is None:
        raise ValueError(f"refusing to promote {deployment['metadata']['name']}: its original template "
                         "was not saved first")
    template = _with_container(saved, engine_container_index(saved, is_engine), transform)
    tmeta = template.setdefault("metadata", {})
    # Pods of the promoted template say so, which lets the guard pick a promoted pod to compare.
    tmeta["annotations"] = {**(tmeta.get("annotations") or {}), ANNOTATION_PROMOTED: decision_id}
    return {"metadata": {"annotations": {ANNOTATION_PROMOTED: decision_id,
                                         ANNOTATION_PROMOTED_TEMPLATE: template_digest(template)}},
            "spec": {"template": template}}


def promote_body(deployment: dict, transform: ContainerTransform, is_engine: Callable[[dict], bool],
                 decision_id: str) -> dict:
    """The Deployment as read (``deployment``: fresh from the API, with its resourceVersion) with
    the promoted template in place of its template, whole, and the promotion annotations: for a
    replacement (PUT). Nothing of the live template is merged in, and the resourceVersion makes the
    write fail (409) rather than overwrite a change made since the read; a re-run after success
    writes the same object again. Refuses a target whose template its user edited."""
    if user_edited(deployment):
        raise ValueError(f"refusing to promote {deployment['metadata']['name']}: its pod template was edited "
                         "by its user since the operator claimed it")
    patch = promote_patch(deployment, transform, is_engine, decision_id)
    out = _given_back(deployment)
    out["spec"]["template"] = patch["spec"]["template"]
    out["metadata"]["annotations"] = {**(out["metadata"].get("annotations") or {}),
                                      **patch["metadata"]["annotations"]}
    return out


def restore_body(deployment: dict) -> dict:
    """The Deployment with its saved pod template put back exactly, the replicas it lent to a wave
    Deployment and those carved out for canary and control given back, and our annotations removed
    (for a full replace, so fields we added to the template do not survive a merge). The caller
    checks ``user_edited`` first: a template its user edited is never restored over."""
    saved = original_template(deployment)
    if saved is None:
        raise ValueError(f"{deployment['metadata']['name']} has no saved template to restore")
    out = _given_back(deployment, carved=True)
    out["spec"]["template"] = saved
    annotations = dict(out["metadata"].get("annotations") or {})
    for key in TARGET_ANNOTATIONS:
        annotations.pop(key, None)
    out["metadata"]["annotations"] = annotations
    return out


def release_patch() -> dict:
    """Give a Deployment back: drop every mark of ours (a patch of annotations only, ``null``
    deletes; the template is not touched). For a never-promoted target, and for one its user
    edited (``user_edited``), whose saved template must not outlive the edit."""
    return {"metadata": {"annotations": {key: None for key in TARGET_ANNOTATIONS}}}


def _count_mark(deployment: dict, annotation: str) -> int:
    raw = (deployment["metadata"].get("annotations") or {}).get(annotation)
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        return 0


def let_go_patch(deployment: dict) -> dict:
    """A merge patch letting go of a target: every replica we took given back (``give_back_patch``,
    with its resourceVersion) and every mark of ours dropped (``release_patch``), in one write."""
    patch = give_back_patch(deployment)
    meta = {**patch.get("metadata", {}), "annotations": release_patch()["metadata"]["annotations"]}
    return {**patch, "metadata": meta}


def lent_replicas(deployment: dict) -> int:
    """How many replicas the target lent to its wave Deployment (``ANNOTATION_PROMOTED_PODS``; 0:
    none, or an unreadable mark)."""
    return _count_mark(deployment, ANNOTATION_PROMOTED_PODS)


def _carve_mark(deployment: dict) -> tuple[int, int | None]:
    """``ANNOTATION_CARVED_OUT`` read: (replicas taken, the fleet's replicas before), "2/4"; (0,
    None): none, or an unreadable mark."""
    raw = str((deployment["metadata"].get("annotations") or {}).get(ANNOTATION_CARVED_OUT) or "")
    taken, _, before = raw.partition("/")
    try:
        return max(0, int(taken)), int(before) if before else None
    except ValueError:
        return 0, None


def carved_replicas(deployment: dict) -> int:
    """How many replicas were taken out of the target for canary and control
    (``ANNOTATION_CARVED_OUT``, ``canary.capacity: carveOut``; 0: none)."""
    return _carve_mark(deployment)[0]


def carved_back(deployment: dict) -> int:
    """How many replicas giving the carve-out back adds: those taken, if the fleet still has the
    count the carve left it (its own plus those lent to its wave Deployment); none if someone else
    set its count since (a GitOps self-heal that put it back, a `kubectl scale`, an HPA): theirs
    stands, and adding ours on top would leave it with more than it had."""
    taken, before = _carve_mark(deployment)
    if not taken:
        return 0
    if before is not None and fleet_replicas(deployment) != before - taken:
        return 0
    return taken


def carve_patch(deployment: dict, pods: int) -> dict:
    """A merge patch taking ``pods`` replicas out of the target for canary and control, and saying
    so on it in the same write (so a restarted operator knows what to give back). It carries the
    resourceVersion read: a scale (a user, an HPA) since the read fails it (409) rather than being
    overwritten. The target keeps at least one replica serving."""
    if carved_replicas(deployment):
        raise ValueError(f"{deployment['metadata']['name']}: replicas already carved out")
    have = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
    if not 0 < pods < have:
        raise ValueError(f"{deployment['metadata']['name']}: carving {pods} replica(s) out of {have} would leave "
                         "no pod serving")
    return {"metadata": {**_read_version(deployment), "annotations": {ANNOTATION_CARVED_OUT: f"{pods}/{have}"}},
            "spec": {"replicas": have - pods}}


def fleet_replicas(deployment: dict) -> int:
    """The replicas the target serves with, its own and those lent to its wave Deployment: what a
    wave's percentage is a share of, and what restoring leaves it with (plus any carved out for
    canary and control, ``carved_replicas``, which serve no users meanwhile)."""
    replicas = (deployment.get("spec") or {}).get("replicas")
    return int(1 if replicas is None else replicas) + lent_replicas(deployment)


def _given_back(deployment: dict, carved: bool = False) -> dict:
    """A copy of the Deployment with the replicas it lent to its wave Deployment given back (its
    ``spec.replicas`` raised by as many, the mark dropped), and with ``carved`` those carved out for
    canary and control too. "What we took, back": a replica count changed meanwhile by its user or
    an HPA is kept, plus ours."""
    out = copy.deepcopy(deployment)
    back = lent_replicas(deployment) + (carved_back(deployment) if carved else 0)
    if back:
        out["spec"]["replicas"] = int((deployment.get("spec") or {}).get("replicas", 1) or 0) + back
    annotations = out["metadata"].get("annotations") or {}
    annotations.pop(ANNOTATION_PROMOTED_PODS, None)
    if carved:
        annotations.pop(ANNOTATION_CARVED_OUT, None)
    return out


def give_back_patch(deployment: dict) -> dict:
    """A merge patch giving back every replica we took from the target: those lent to its wave
    Deployment and those carved out for canary and control (for a target left to its user or
    released: its replicas are not ours to keep). It carries the resourceVersion read, so a stale
    read cannot give them back twice."""
    lent, carved = lent_replicas(deployment), carved_replicas(deployment)
    if not lent and not carved:
        return {}
    back = lent + carved_back(deployment)
    return {"spec": {"replicas": int((deployment.get("spec") or {}).get("replicas", 1) or 0) + back},
            "metadata": {**_read_version(deployment),
                         "annotations": {ANNOTATION_PROMOTED_PODS: None, ANNOTATION_CARVED_OUT: None}}}


def _read_version(deployment: dict) -> dict:
    """The resourceVersion read, for a merge patch that must fail (409) rather than act on a stale read."""
    version = deployment["metadata"].get("resourceVersion")
    return {"resourceVersion": version} if version else {}


def return_carved_patch(deployment: dict) -> dict:
    """A merge patch giving back the replicas carved out for canary and control (once they are
    deleted), and only those (``{}``: none). With the resourceVersion read, as ``give_back_patch``."""
    if not carved_replicas(deployment):
        return {}
    back = carved_back(deployment)
    return {"spec": {"replicas": int((deployment.get("spec") or {}).get("replicas", 1) or 0) + back},
            "metadata": {**_read_version(deployment), "annotations": {ANNOTATION_CARVED_OUT: None}}}


def lend_body(deployment: dict, pods: int, decision_id: str) -> dict:
    """The target promoted in part: ``pods`` of its fleet replicas (``fleet_replicas``) run in its
    wave Deployment, so its own ``spec.replicas`` is that many lower and the mark says how many it
    lent and with which decision. Its pod template is not touched (the user's Deployment keeps
    owning its pods). For a replacement (PUT) with the resourceVersion read."""
    total = fleet_replicas(deployment)
    if not 0 < pods < total:
        raise ValueError(f"{deployment['metadata']['name']}: a part promotion lends 1..{total - 1} of its "
                         f"{total} replicas, not {pods}")
    if original_template(deployment) is None:
        raise ValueError(f"refusing to promote {deployment['metadata']['name']}: its original template "
                         "was not saved first")
    out = copy.deepcopy(deployment)
    out["spec"]["replicas"] = total - pods
    annotations = {**(out["metadata"].get("annotations") or {}), ANNOTATION_PROMOTED: decision_id,
                   ANNOTATION_PROMOTED_PODS: str(pods)}
    annotations.pop(ANNOTATION_PROMOTED_TEMPLATE, None)
    out["metadata"]["annotations"] = annotations
    return out


def wave_deployment_name(policy: dict, target: dict) -> str:
    meta = policy["metadata"]
    return owned_name(meta.get("namespace"), meta["name"], target["metadata"]["namespace"],
                      target["metadata"]["name"], ROLE_WAVE)


def build_wave_deployment(target: dict, policy: dict, pods: int, transform: ContainerTransform,
                          is_engine: Callable[[dict], bool], decision_id: str) -> dict:
    """The target's wave Deployment: ``pods`` replicas of the promoted template (``promote_patch``:
    the saved original plus the engine change), serving beside the target's own pods. Its pods keep
    every label of the template, so the fleet's Service sends them their share of the users and
    the target's selector counts them as fleet (the guard picks them by the decision id on them);
    they add the policy's labels and ``wave: <target>``, which its own selector requires, so no
    ReplicaSet of the target's ever adopts them. The Deployment itself is labelled ``role: wave``. Owned by the policy (same namespace) or deleted
    by its finalizer, like canary and control."""
    template = promote_patch(target, transform, is_engine, decision_id)["spec"]["template"]
    labels = role_labels(policy, ROLE_WAVE, target["metadata"]["name"],
                         int(policy["metadata"].get("generation", 1)))
    # Its pods are fleet pods: no role label (Prometheus jobs and PodMonitors that keep the fleet
    # and leave canary and control to the operator's own job see them as fleet), but the policy's
    # labels and the target they serve for, which its selector requires.
    selector = {**policy_labels(policy), LABEL_WAVE: target["metadata"]["name"]}
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **selector}
    ns = target["metadata"]["namespace"]
    meta = owned_metadata(policy, wave_deployment_name(policy, target), ns, labels,
                          {ANNOTATION_SOURCE: f"{ns}/{target['metadata']['name']}", ANNOTATION_PROMOTED: decision_id})
    spec = {"replicas": pods, "selector": {"matchLabels": selector}, "template": template}
    for key in ("strategy", "minReadySeconds", "progressDeadlineSeconds"):
        if key in target["spec"]:
            spec[key] = copy.deepcopy(target["spec"][key])
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def wave_pods(sizes: Iterable[tuple[tuple[str, str], int]], waves_percent: list[float],
              wave: int) -> dict[tuple[str, str], int]:
    """How many pods of each target run lookahead once wave ``wave`` (0-based) is done.

    A wave's percentage is a share of the fleet's serving pods (``sizes``: each target's
    ``fleet_replicas``), across all targets: ceil(pct * total / 100), at least one, filled target
    by target in a stable order, so at most one target is promoted in part at a time. A target
    whose count reaches its replicas is promoted whole (its template); one in part lends that many
    replicas to its wave Deployment. A target of no replicas is promoted with the last wave.
    Targets not in the result (0 pods) are not promoted yet."""
    ordered = sorted(sizes)
    pct = waves_percent[min(wave, len(waves_percent) - 1)]
    last = pct >= 100
    total = sum(max(0, n) for _, n in ordered)
    left = max(1, math.ceil(pct * total / 100 - 1e-9)) if total else 0
    out: dict[tuple[str, str], int] = {}
    for key, n in ordered:
        n = max(0, n)
        if n == 0:
            if last:
                out[key] = 0
            continue
        take = n if last else min(n, left)
        left -= take
        if take:
            out[key] = take
    return out
