"""Where an engine's arguments live in a container, and flag edits on them: ``args`` (preferred),
``command``, or inside a ``sh -c`` script (``engines.shell``). A present flag is replaced in
place, never duplicated; every edit returns a NEW container.
"""

from __future__ import annotations

import copy
from typing import Callable, Mapping, Sequence

from lookahead_operator.engines import shell
from lookahead_operator.engines.base import EngineError, Launcher

ArgvEdit = Callable[[list[str]], list[str]]


def remove_flag(argv: list[str], flag: str, takes_value: bool = True) -> list[str]:
    """``argv`` without ``flag`` (``--flag value`` or ``--flag=value``; a bare switch if not ``takes_value``)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def set_flag(argv: list[str], flag: str, value: str | None) -> list[str]:
    """Set ``flag`` (to ``value``; ``None`` = a bare switch) replacing the first occurrence in
    place and dropping any others."""
    out: list[str] = []
    placed = False
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag or a.startswith(flag + "="):
            if a == flag and value is not None:
                skip = True
            if not placed:
                out += [flag] + ([value] if value is not None else [])
                placed = True
            continue
        out.append(a)
    if not placed:
        out += [flag] + ([value] if value is not None else [])
    return out


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` (``--flag value`` or ``--flag=value``), ``None`` if absent."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def int_or_none(v: str | None) -> int | None:
    """An argument as an int; ``None`` when absent, not a number, or built from a shell expansion."""
    if v is None or "\x00" in v:
        return None
    try:
        return int(v)
    except ValueError:
        return None


def env_value(container: Mapping, name: str) -> str | None:
    """The literal value of the container's environment variable ``name``."""
    for e in container.get("env") or []:
        if e.get("name") == name:
            return e.get("value")
    return None


class _ContainerArgv:
    """The engine's arguments of one (copied) container, and how to write them back."""

    def __init__(self, container: dict, launchers: Sequence[Launcher]):
        self.c = container
        self.shell: shell.ShellEdit | None = None
        cmd = list(container.get("command") or [])
        args = list(container.get("args") or [])
        idx = shell.script_index(cmd + args)
        if idx is not None:
            self.where = "command" if idx < len(cmd) else "args"
            self._script_idx = idx if idx < len(cmd) else idx - len(cmd)
            try:
                self.shell = shell.parse_script(str((cmd + args)[idx]), launchers)
            except shell.ShellTooComplex as exc:
                raise EngineError(
                    f"container {self._name()!r}: cannot edit its shell command safely ({exc}); start the engine "
                    f"without a shell wrapper, or with the engine flags outside any expansion") from None
            self.argv = self.shell.argv()
        elif args or not cmd:
            self.where = "args"
            self.argv = args
        else:
            self.where = "command"
            self.argv = cmd

    def _name(self) -> str:
        return self.c.get("name") or "?"

    def done(self) -> dict:
        if self.shell is None:
            self.c[self.where] = self.argv
            return self.c
        argv = list(self.c.get(self.where) or [])
        try:
            argv[self._script_idx] = self.shell.render(self.argv)
        except shell.ShellTooComplex as exc:
            raise EngineError(f"container {self._name()!r}: cannot edit its shell command safely ({exc})") from None
        self.c[self.where] = argv
        return self.c


def edit_container(container: Mapping, fn: ArgvEdit, launchers: Sequence[Launcher]) -> dict:
    """A NEW container whose engine arguments are ``fn(arguments)``."""
    edit = _ContainerArgv(copy.deepcopy(dict(container)), launchers)
    edit.argv = fn(edit.argv)
    return edit.done()


def container_argv(container: Mapping, launchers: Sequence[Launcher]) -> list[str]:
    """The engine's argument list as the adapters see it (inside ``sh -c`` too, where the engine
    is the command one of ``launchers`` starts; an argument built from a shell expansion shows as
    its literal prefix plus ``\\x00N\\x00``)."""
    return list(_ContainerArgv(copy.deepcopy(dict(container)), launchers).argv)
