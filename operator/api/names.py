"""The names of the LookaheadPolicy API and of everything the operator puts on objects: the API
group, version and resource, the annotations and labels, the finalizer. One module, imported by
every layer: the API models (api.spec, api.status, api.policy), kube, controller, measurement,
runtime and the kubectl plugin.

On the wire (Prometheus), labels arrive sanitised: ``lookahead.dev/role`` is ``lookahead_dev_role``
(``PROM_LABEL_*``).
"""

from __future__ import annotations

GROUP = "lookahead.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LookaheadPolicy"
LIST_KIND = "LookaheadPolicyList"
PLURAL = "lookaheadpolicies"
SINGULAR = "lookaheadpolicy"
SHORT_NAMES = ["lap"]
CATEGORIES = ["lookahead"]
CRD_NAME = f"{PLURAL}.{GROUP}"
FINALIZER = f"{GROUP}/cleanup"

# --- on the policy: the gates (kubectl lookahead approve|abort)
ANNOTATION_APPROVE = f"{GROUP}/approve"          # the decision id approved
ANNOTATION_ABORT = f"{GROUP}/abort"              # "true": roll back whatever was promoted
ANNOTATION_ABORT_REASON = f"{GROUP}/abort-reason"

# --- on a user's Deployment: which policy owns it, the pod template before we touched it, and
# the decision it was promoted with (also on the promoted template's pods)
ANNOTATION_OWNER = f"{GROUP}/owned-by"
ANNOTATION_ORIGINAL_TEMPLATE = f"{GROUP}/original-template"
ANNOTATION_PROMOTED = f"{GROUP}/promoted"
ANNOTATION_SOURCE = f"{GROUP}/source"             # on a canary/control: the target it was cloned from
# --- on a user's HTTPRoute in live mode (split gatewayAPI): the split rule's backendRefs before we
# re-weighted it, written back verbatim on every exit
ANNOTATION_ORIGINAL_BACKEND_REFS = f"{GROUP}/original-backend-refs"

# --- labels on everything the operator creates
LABEL_POLICY = f"{GROUP}/policy"
# Policy names repeat across namespaces: every selector of ours pairs the name with its namespace.
LABEL_POLICY_NAMESPACE = f"{GROUP}/policy-namespace"
LABEL_ROLE = f"{GROUP}/role"                      # canary | control | wave | loadgen
LABEL_TARGET = f"{GROUP}/target"                  # the target Deployment's name
LABEL_STEP = f"{GROUP}/step"                      # on a load Job: the step (or w<wave> for the guard)
LABEL_RUN = f"{GROUP}/run"                        # on a load Job: status.progress.loadRun when started
LABEL_DRIVES = f"{GROUP}/drives"                  # on a load Job: the role it drives (canary, control, promoted)
LABEL_WAVE = f"{GROUP}/wave"                      # on a wave Deployment's pods: the target they are fleet of
LABEL_POD = f"{GROUP}/pod"                        # on a load Job: the pod it drives (by IP)
LABEL_GENERATION = f"{GROUP}/generation"          # on a canary/control: the policy generation that made it
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "lookahead-operator"
ROLES = ("canary", "control")
ROLE_WAVE = "wave"                                # a target's wave Deployment: its replicas promoted in part

# --- the same labels as Prometheus sees them
PROM_LABEL_POLICY = "lookahead_dev_policy"
PROM_LABEL_POLICY_NAMESPACE = "lookahead_dev_policy_namespace"
PROM_LABEL_ROLE = "lookahead_dev_role"
PROM_LABEL_TARGET = "lookahead_dev_target"

# --- the load generator Pods' resources when a policy leaves load.resources out
DEFAULT_LOAD_REQUESTS = {"cpu": "250m", "memory": "256Mi"}
DEFAULT_LOAD_LIMITS = {"memory": "512Mi"}
