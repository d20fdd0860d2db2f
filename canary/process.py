"""Starting and stopping child processes, one way for the whole project: each child in its own
session (so its whole process group can be signalled), stdin closed, output to a log file; stop is
SIGTERM to the group, then SIGKILL if it outlives the timeout. Used by ``analyze`` (engines), the
local control plane and the tests' operator process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["start", "stop", "kill_process_group", "pid_alive"]


def start(argv: Sequence[str], log: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
          cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen:
    """``argv`` in a new session, stdout and stderr appended to ``log``."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=dict(env) if env is not None else None,
                                cwd=str(cwd) if cwd is not None else None)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def kill_process_group(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group led by ``pid``; SIGKILL it if it outlives ``timeout``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def stop(popen: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Stop a child started by :func:`start` (and everything it started), and reap it."""
    if popen is None:
        return
    if popen.poll() is None:
        kill_process_group(popen.pid, timeout)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=timeout)
