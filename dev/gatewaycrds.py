"""Gateway API's HTTPRoute CRD and the Inference Extension's InferencePool CRD on a dev cluster, for
live mode's ``split: gatewayAPI`` (the integration test on a bare apiserver, the e2e test on the
node). The files come from the Go module proxy (``hack/fetch-gateway-crds.sh``, ``make
gateway-crds``), at the versions that script pins; ``crd_dir`` runs it when they are not cached yet."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lookahead_dev.devcluster import cache_dir, wait_for

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "fetch-gateway-crds.sh"


def _pinned(variable: str) -> str:
    """A version the script pins (``NAME=${NAME:-v1.2.3}``)."""
    line = next(x for x in SCRIPT.read_text().splitlines() if x.startswith(f"{variable}="))
    return line.split(":-", 1)[1].rstrip("}")


def crd_dir() -> Path:
    """The directory holding httproutes.yaml and inferencepools.yaml, fetched when not there yet."""
    out = cache_dir() / f"gateway-crds-{_pinned('GATEWAY_API_VERSION')}-{_pinned('INFERENCE_EXTENSION_VERSION')}"
    if not (out / "httproutes.yaml").is_file() or not (out / "inferencepools.yaml").is_file():
        subprocess.run(["bash", str(SCRIPT)], check=True, timeout=900)
    return out


def install(api: client.ApiClient, path: Path, timeout: float = 60.0) -> str:
    """Create the CRD in ``path`` (kept if it is there already) and wait until its kind is served;
    its name."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(path.read_text())
    name = body["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    group, plural = body["spec"]["group"], body["spec"]["names"]["plural"]
    version = next(v["name"] for v in body["spec"]["versions"] if v.get("storage"))

    def served():
        crd = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
        if conds.get("Established") != "True":
            return None
        client.CustomObjectsApi(api).list_cluster_custom_object(group, version, plural, limit=1)
        return True

    wait_for(served, timeout, f"CRD {name} served")
    return name


def install_gateway_crds(api: client.ApiClient) -> list[str]:
    """HTTPRoute (gateway.networking.k8s.io/v1) and InferencePool (inference.networking.k8s.io/v1)."""
    crds = crd_dir()
    return [install(api, crds / "httproutes.yaml"), install(api, crds / "inferencepools.yaml")]
