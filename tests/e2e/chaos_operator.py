"""The operator (`kopf run -m lookahead_operator.handlers ...`, the arguments given) with one
test-side fault point: with ``LOOKAHEAD_TEST_DIE_MID_WAVE`` set to a file path, the process
SIGKILLs itself right after the first target of a wave of two or more is patched, before the
next one -- the instant no timer-driven kill can be sure to hit. It writes the path first, so the
test knows the fault fired. Nothing here is imported by the operator itself; the wrapper patches
``lookahead_operator.kube.Kube.patch_deployment`` in this process only.

    python -m tests.e2e.chaos_operator run --standalone --all-namespaces -m lookahead_operator.handlers
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path


def _install(marker: Path) -> None:
    from lookahead_operator import actions, api, kube

    state = threading.local()
    promote = actions.ACTIONS[actions.sm.ActionKind.PROMOTE]

    def promote_and_count(c, a):
        state.wave_size, state.patched = len(a.targets), 0
        try:
            return promote(c, a)
        finally:
            state.wave_size = 0

    original_patch = kube.Kube.patch_deployment

    def patch_deployment(self, namespace, name, patch):
        original_patch(self, namespace, name, patch)
        promoted = api.ANNOTATION_PROMOTED in ((patch.get("metadata") or {}).get("annotations") or {})
        if promoted and getattr(state, "wave_size", 0) >= 2:
            state.patched += 1
            if state.patched == 1 and not marker.exists():
                marker.write_text(f"{namespace}/{name}\n")
                os.kill(os.getpid(), signal.SIGKILL)

    actions.ACTIONS[actions.sm.ActionKind.PROMOTE] = promote_and_count
    kube.Kube.patch_deployment = patch_deployment


def main() -> None:
    marker = os.environ.get("LOOKAHEAD_TEST_DIE_MID_WAVE")
    if marker:
        _install(Path(marker))
    from kopf.cli import main as kopf_main

    sys.argv = ["kopf", *sys.argv[1:]]
    kopf_main()


if __name__ == "__main__":
    main()
