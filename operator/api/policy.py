"""The LookaheadPolicy API (``lookahead.dev/v1alpha1``) as a whole object: metadata, spec and
status, and the one rule on the object's root (the name's length).

The models of this package are the single source of truth of the CRD: ``python3 -m
lookahead_dev.crdgen`` turns their JSON schema into the OpenAPI v3 structural schema in
``crds/lookaheadpolicies.yaml`` (and the chart's copy). The spec's models are in
``lookahead_operator.api.spec``, the status's in ``lookahead_operator.api.status``, what both are
built from (wire types, CEL helpers, base models) in ``lookahead_operator.api.schema``, the API's
names in ``lookahead_operator.api.names``.

    spec = LookaheadPolicySpec.model_validate(body["spec"])      # what the apiserver stores
    spec.analysis.max_throughput_regression                        # 0.02 (written "2%")
    spec.load.step_duration                                        # timedelta(seconds=120)

Gates (what ``kubectl lookahead pause|resume|approve|abort`` does):

* pause / resume: ``spec.paused`` (a spec field: it is desired state, and GitOps tools can own it).
  It bumps ``metadata.generation``, so the operator must not treat a change of ``paused`` alone as
  a spec edit: compare :meth:`LookaheadPolicySpec.fingerprint`, which leaves ``paused`` out.
* approve: annotation ``lookahead.dev/approve`` whose value is the ``metadata.generation`` being
  approved (what ``lookahead_operator.runtime.handlers`` reads). An approval of an earlier generation
  does not match after a spec edit and is ignored. Needed only when
  ``spec.promotion.requireApproval``.
* abort: annotation ``lookahead.dev/abort: "true"``. The operator rolls back what it promoted
  and ends in ``RolledBack``.

Annotations do not bump ``metadata.generation``, so approving or aborting never restarts a
measurement. What the operator saw of the gates is mirrored in ``status.gates``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from lookahead_operator.api.names import API_VERSION, KIND
from lookahead_operator.api.schema import ApiModel, _cel
from lookahead_operator.api.spec import LookaheadPolicySpec
from lookahead_operator.api.status import LookaheadPolicyStatus

# Label values are at most 63 characters; the policy's name is one (lookahead.dev/policy).
MAX_POLICY_NAME = 63
NAME_TOO_LONG = (f"metadata.name must be at most {MAX_POLICY_NAME} characters: it is the value of the "
                 "lookahead.dev/policy label on every object the policy creates")
# Rules on the whole object (the CRD's root schema): only metadata.name is visible to CEL there.
ROOT_VALIDATIONS = [_cel(f"size(self.metadata.name) <= {MAX_POLICY_NAME}", NAME_TOO_LONG)]


class LookaheadPolicy(ApiModel):
    """A whole object, as the apiserver returns it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", validate_default=True)

    api_version: Literal["lookahead.dev/v1alpha1"] = API_VERSION
    kind: Literal["LookaheadPolicy"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: LookaheadPolicySpec
    status: Optional[LookaheadPolicyStatus] = None

    @model_validator(mode="after")
    def _name_fits(self) -> "LookaheadPolicy":
        name = self.metadata.get("name") or ""
        if len(name) > MAX_POLICY_NAME:
            raise ValueError(NAME_TOO_LONG)
        return self

    @classmethod
    def from_body(cls, body: Any) -> "LookaheadPolicy":
        """From a Kopf body or a dict; ``status`` is read leniently."""
        data = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}
        if "metadata" in data:
            data["metadata"] = dict(data["metadata"])
        return cls.model_validate(data)
