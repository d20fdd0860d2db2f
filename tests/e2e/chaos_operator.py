"""The operator (`kopf run -m lookahead_operator.runtime.handlers ...`, the arguments given) with one
test-side fault point: with ``LOOKAHEAD_TEST_DIE_MID_WAVE`` set to a file path, the process
SIGKILLs itself right after the first target of a wave of two or more is written (promotion
is a whole-object PUT, ``Kube.replace_deployment``; a merge patch is counted too), before the
next one -- the instant no timer-driven kill can be sure to hit. It writes the path first, so the
test knows the fault fired. Nothing here is imported by the operator itself; the wrapper patches
``lookahead_operator.kube.client.Kube``'s two Deployment writes in this process only.

    python -m tests.e2e.chaos_operator run --standalone --all-namespaces -m lookahead_operator.runtime.handlers
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path


def _install(marker: Path) -> None:
    from lookahead_operator.controller import actions
    from lookahead_operator.api import names as api
    from lookahead_operator.kube import client as kube

    state = threading.local()
    promote = actions.ACTIONS[actions.ActionKind.PROMOTE]

    def promote_and_count(c, a):
        state.wave_size, state.patched = len(a.targets), 0
        try:
            return promote(c, a)
        finally:
            state.wave_size = 0

    def after_write(obj: dict) -> None:
        """A write that carries the promoted annotation is one target's promotion (a restore drops
        it, a claim has none); the first of a wave of two or more is the fault point."""
        promoted = api.ANNOTATION_PROMOTED in ((obj.get("metadata") or {}).get("annotations") or {})
        if promoted and getattr(state, "wave_size", 0) >= 2:
            state.patched += 1
            if state.patched == 1 and not marker.exists():
                meta = obj.get("metadata") or {}
                marker.write_text(f"{meta.get('namespace', '?')}/{meta.get('name', '?')}\n")
                os.kill(os.getpid(), signal.SIGKILL)

    original_patch, original_replace = kube.Kube.patch_deployment, kube.Kube.replace_deployment

    def patch_deployment(self, namespace, name, patch):
        original_patch(self, namespace, name, patch)
        after_write({**patch, "metadata": {**(patch.get("metadata") or {}), "namespace": namespace, "name": name}})

    def replace_deployment(self, body, *args, **kwargs):
        out = original_replace(self, body, *args, **kwargs)
        after_write(body)
        return out

    actions.ACTIONS[actions.ActionKind.PROMOTE] = promote_and_count
    kube.Kube.patch_deployment = patch_deployment
    kube.Kube.replace_deployment = replace_deployment


def main() -> None:
    marker = os.environ.get("LOOKAHEAD_TEST_DIE_MID_WAVE")
    if marker:
        _install(Path(marker))
    from kopf.cli import main as kopf_main

    sys.argv = ["kopf", *sys.argv[1:]]
    kopf_main()


if __name__ == "__main__":
    main()
