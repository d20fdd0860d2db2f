"""The README's "Install on a real cluster" block, run by bash as a user pastes it, on the test node.

What the block does, it does for real: `make images REGISTRY=...` pushes the three images and the
chart to a registry (the node's own, CNCF distribution over HTTPS with its own CA, which the user's
clients trust through ``SSL_CERT_FILE`` as the README says), `helm install oci://...` installs the
operator from there, the kubelet pulls the operator's image and the example fleet's from there, and
`kubectl` / `kubectl lookahead` (the plugin the Python package installs) answer.

Changed in the block, and nothing else (each checked to be there, so that an edit of the README
that drops it fails here rather than silently running something else):
* ``REGISTRY``: ``registry.example.com/ml-platform`` becomes ``<the node's registry>/ml-platform``;
* one more `helm install` setting the test cluster needs and a user's does not:
  ``crds.install=false`` (the session's CRD is already installed for the other tests, and Helm
  refuses to adopt an object it did not create).

The example's reference fleet runs from the engine image pushed to the user's registry (SmolLM2
on its numpy runtime) and is checked serving; this test checks the install path (pushed, pulled,
installed, the fleet up, the policy seen and reported), not a decision: the decision on the
example is tests/e2e/test_shipped_example.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from lookahead_dev.devcluster import control_plane_binary, wait_for
from lookahead_dev.registry import registry_binary

from .helpers import GROUP, PLURAL, VERSION, get_policy

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
RELEASE, OPERATOR_NS, FLEET_NS, POLICY = "lookahead", "lookahead-system", "inference", "chat-fleet"


def readme_install_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Install on a real cluster", 1)[1]
    found = re.search(r"^```\n(.*?)^```", section, flags=re.S | re.M)
    assert found, "README: no code block under 'Install on a real cluster'"
    return found.group(1)


def substitute(block: str, old: str, new: str) -> str:
    assert block.count(old) == 1, f"README's install block no longer has {old!r} once:\n{block}"
    return block.replace(old, new)


def _gone(read) -> bool:
    try:
        read()
        return False
    except client.ApiException as exc:
        return exc.status == 404


def test_the_readmes_install_block_runs_on_a_cluster_from_a_users_own_registry(
        devcluster, crd_installed, real_node, prometheus, apis, tmp_path):
    apps, core, custom, _batch = apis
    registry = f"{real_node.registry.address}/ml-platform"
    script = substitute(readme_install_block(), "export REGISTRY=registry.example.com/ml-platform",
                        f"export REGISTRY={registry}")
    anchor = "--set image.repository=$REGISTRY/lookahead-rollout/lookahead-rollout\n"
    script = substitute(script, anchor, anchor.rstrip("\n") + " \\\n  --set crds.install=false\n")
    chart = yaml.safe_load((REPO / "charts" / "lookahead-operator" / "Chart.yaml").read_text())
    bindir = str(control_plane_binary("kubectl").parent)  # kubectl and helm, as on a user's PATH
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "KUBECONFIG": str(devcluster.kubeconfig),
           **real_node.registry.client_env()}
    env.pop("REGISTRY", None)
    (tmp_path / "install.sh").write_text(script)
    try:
        res = subprocess.run(["bash", "-euo", "pipefail", str(tmp_path / "install.sh")], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=420)
        print(f"\n$ README install block\n{res.stdout}{res.stderr}")
        assert res.returncode == 0, f"the README's block failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        assert f"oci://{registry}/charts/lookahead-operator" in res.stdout  # make images pushed the chart

        # the operator runs from the image just pushed to the user's registry
        image = f"{registry}/lookahead-rollout/lookahead-rollout:{chart['appVersion']}"
        deployment = f"{RELEASE}-lookahead-operator"
        wait_for(lambda: (apps.read_namespaced_deployment(deployment, OPERATOR_NS).status.ready_replicas or 0) >= 1,
                 timeout=180, interval=1.0, what="the operator installed by the README ready")
        pods = core.list_namespaced_pod(OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}").items
        assert pods and all(p.spec.containers[0].image == image for p in pods), [p.spec.containers[0].image
                                                                                   for p in pods]

        # it saw the example's policy and says so in status, which the plugin prints
        st = wait_for(lambda: (get_policy(custom, FLEET_NS, POLICY).get("status") or {}).get("phase"),
                      timeout=120, interval=1.0, what="the example policy's phase set by the operator")
        shown = subprocess.run(["kubectl", "lookahead", "status", POLICY, "-n", FLEET_NS], env=env,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and POLICY in shown.stdout, (shown.stdout, shown.stderr)
        print(f"$ kubectl lookahead status {POLICY} -n {FLEET_NS}  (phase {st})\n{shown.stdout}")

        # the example fleet's reference engine names the image pushed to the user's registry (the
        # sed in the block), which is there to pull, and the kubelet pulled it: the fleet serves
        d = apps.read_namespaced_deployment("chat-reference", FLEET_NS)
        ref = d.spec.template.spec.containers[0].image
        assert ref.startswith(f"{registry}/lookahead-rollout/lookahead-rollout-engine:"), ref
        crane = subprocess.run([str(registry_binary("crane")), "digest", ref], env=env, capture_output=True,
                               text=True, timeout=60)
        assert crane.returncode == 0 and crane.stdout.startswith("sha256:"), (ref, crane.stderr)
        wait_for(lambda: (apps.read_namespaced_deployment("chat-reference", FLEET_NS).status.ready_replicas or 0) == 2,
                 timeout=240, interval=1.0, what="the example's reference fleet serving (its image pulled)")
    finally:
        # a user's way out, in order: the policy (its finalizer needs the operator), the example,
        # the operator
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, FLEET_NS, PLURAL, POLICY)
            wait_for(lambda: _gone(lambda: get_policy(custom, FLEET_NS, POLICY)), timeout=120, interval=1.0,
                     what="the example policy deleted (finalizer ran)")
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        except TimeoutError:  # the operator never came up: nothing of the fleet was touched
            custom.patch_namespaced_custom_object(GROUP, VERSION, FLEET_NS, PLURAL, POLICY,
                                                  {"metadata": {"finalizers": []}})
        try:
            core.delete_namespace(FLEET_NS)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        subprocess.run([str(control_plane_binary("helm")), "uninstall", RELEASE, "--namespace", OPERATOR_NS,
                        "--wait", "--timeout", "90s"], env=env, capture_output=True, timeout=120)
        wait_for(lambda: _gone(lambda: core.read_namespace(FLEET_NS)), timeout=180, interval=1.0,
                 what=f"namespace {FLEET_NS} gone")
