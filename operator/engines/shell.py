"""Shell-form containers (``sh -c "vllm serve $MODEL ... | tee log"``): find the one engine command
in the script and edit only its arguments, so everything else (``$MODEL``, pipes, ``&&``,
redirections, comments) survives byte for byte.

A small POSIX-shell tokenizer keeps every token's source span. A script too complex to edit
safely (a here-document, the engine started twice or not at all, arguments after a redirection,
an expansion standing where a flag could be) raises :class:`ShellTooComplex`.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from lookahead_operator.engines.base import Launcher


class ShellTooComplex(Exception):
    """A script this module cannot edit safely; the message says why."""


@dataclass
class Token:
    kind: str           # "word" | "op" | "redir"
    text: str           # source text
    start: int
    end: int
    value: str = ""     # words: the value after quote removal (literal parts only)
    opaque: bool = False  # words: contains an expansion ($X, $(..), `..`, globs, ~)
    literal_prefix: str = ""  # words: the value up to the first expansion


_OPERATORS = ("&>>", "<<-", "<<<", "&&", "||", ";;", "|&", "&>", ">>", "<<", "<&", ">&", "<>", ">|",
              "|", "&", ";", "<", ">", "(", ")")
_HEREDOCS = ("<<", "<<-", "<<<")
_WORD_END = " \t\n|&;<>()"


def _skip_parens(s: str, i: int) -> int:
    """``s[i]`` is ``(``: the index after its matching ``)``, skipping quoted text."""
    depth = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                raise ShellTooComplex("an unterminated single quote")
            i = j + 1
            continue
        if c == '"':
            i = _skip_double(s, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ShellTooComplex("an unterminated $( ... )")


def _skip_double(s: str, i: int) -> int:
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if c == "$" or c == "`":
            i = _skip_expansion(s, i)
            continue
        i += 1
    raise ShellTooComplex("an unterminated double quote")


def _skip_expansion(s: str, i: int) -> int:
    """``s[i]`` is ``$`` or a backtick: the index after the expansion."""
    n = len(s)
    if s[i] == "`":
        j = i + 1
        while j < n and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= n:
            raise ShellTooComplex("an unterminated backquote")
        return j + 1
    if i + 1 >= n:
        return i + 1
    c = s[i + 1]
    if c == "(":
        return _skip_parens(s, i + 1)
    if c == "{":
        j = s.find("}", i + 2)
        if j < 0:
            raise ShellTooComplex("an unterminated ${ ... }")
        return j + 1
    if c == "'":
        raise ShellTooComplex("ANSI-C quoting ($'...')")
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", s[i + 1:])
    return i + 1 + (len(m.group(0)) if m else 0)


@dataclass
class _WordReader:
    """Reads one word from ``s[i:]``: its value after quote removal and where an expansion starts."""
    s: str
    i: int
    value: list[str] = field(default_factory=list)
    prefix: list[str] | None = None
    opaque: bool = False

    def read(self) -> Token:
        s, start = self.s, self.i
        while self.i < len(s) and s[self.i] not in _WORD_END:
            c = s[self.i]
            if c == "\\":
                if s[self.i + 1:self.i + 2] != "\n":
                    self.value.append(s[self.i + 1:self.i + 2])
                self.i += 2
            elif c == "'":
                self._single_quoted()
            elif c == '"':
                self._double_quoted()
            elif c in "$`":
                self._expansion()
            else:
                if c in "*?[" or (c == "~" and self.i == start) or (c == "{" and "}" in s[self.i:]):
                    self._mark_opaque()
                self.value.append(c)
                self.i += 1
        literal = self.prefix if self.prefix is not None else self.value
        return Token("word", s[start:self.i], start, self.i, "".join(self.value), self.opaque, "".join(literal))

    def _mark_opaque(self) -> None:
        if self.prefix is None:
            self.prefix = list(self.value)
        self.opaque = True

    def _expansion(self) -> None:
        self._mark_opaque()
        self.i = _skip_expansion(self.s, self.i)

    def _single_quoted(self) -> None:
        j = self.s.find("'", self.i + 1)
        if j < 0:
            raise ShellTooComplex("an unterminated single quote")
        self.value.append(self.s[self.i + 1:j])
        self.i = j + 1

    def _double_quoted(self) -> None:
        s, n = self.s, len(self.s)
        self.i += 1
        while True:
            if self.i >= n:
                raise ShellTooComplex("an unterminated double quote")
            c = s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\" and self.i + 1 < n and s[self.i + 1] in '$`"\\\n':
                if s[self.i + 1] != "\n":
                    self.value.append(s[self.i + 1])
                self.i += 2
            elif c in "$`":
                self._expansion()
            else:
                self.value.append(c)
                self.i += 1


def _operator_at(s: str, i: int) -> str | None:
    op = next((o for o in _OPERATORS if s.startswith(o, i)), None)
    if op in _HEREDOCS:
        raise ShellTooComplex("a here-document")
    return op


def tokens(s: str) -> list[Token]:
    """The script's words, operators and redirections (a newline is an operator)."""
    toks: list[Token] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t":
            i += 1
        elif c == "\\" and s[i + 1:i + 2] == "\n":
            i += 2
        elif c == "#":
            while i < n and s[i] != "\n":
                i += 1
        elif c == "\n":
            toks.append(Token("op", "\n", i, i + 1))
            i += 1
        elif op := _operator_at(s, i):
            kind = "redir" if op[0] in "<>" or op.startswith("&>") or op in ("<&", ">&") else "op"
            toks.append(Token(kind, op, i, i + len(op)))
            i += len(op)
        else:
            word = _WordReader(s, i).read()
            i = word.end
            if word.text.isdigit() and i < n and s[i] in "<>":       # an IO number: 2>&1, 1>/dev/null
                op = _operator_at(s, i)
                word = Token("redir", s[word.start:i + len(op)], word.start, i + len(op))
                i = word.end
            toks.append(word)
    return toks


_PY = re.compile(r"(^|/)python[0-9.]*$")


def _launch_span(words: list[Token], i: int, launcher: Launcher) -> tuple[int, int] | None:
    """``(i, end)`` when ``words[i:end]`` start the engine with ``launcher``, else ``None``."""
    w = words[i]
    nxt = words[i + 1].value if i + 1 < len(words) else None
    if launcher.executable and w.value.rsplit("/", 1)[-1] == launcher.executable:
        if launcher.subcommand and nxt == launcher.subcommand:
            return i, i + 2
        return None if launcher.subcommand_required else (i, i + 1)
    if launcher.modules and _PY.search(w.value):
        j = i + 1
        while j < len(words) and words[j].value.startswith("-") and words[j].value != "-m":
            j += 1
        if j + 1 < len(words) and words[j].value == "-m" and words[j + 1].value in launcher.modules:
            return i, j + 2
    return None


def engine_words(words: list[Token], launchers: Sequence[Launcher]) -> tuple[int, int] | None:
    """In one simple command, ``(start, end)`` of the words that invoke the engine (``vllm
    serve``, ``python3 -u -m sglang.launch_server``, ...); the engine's arguments follow ``end``."""
    for i, w in enumerate(words):
        if w.opaque:
            continue
        for launcher in launchers:
            span = _launch_span(words, i, launcher)
            if span:
                return span
    return None


@dataclass
class ShellEdit:
    """The engine command inside ``sh -c SCRIPT``: its argument words and where they are."""
    script: str
    args: list[Token]               # the engine's argument words, in order
    seps: list[str]                 # the source text before each argument word
    insert_at: int                  # index in script where the argument region starts
    region_end: int                 # index in script where it ends

    def argv(self) -> list[str]:
        """The arguments; one built from an expansion shows as its literal prefix + ``\\x00N\\x00``."""
        return [t.value if not t.opaque else f"{t.literal_prefix}\x00{k}\x00" for k, t in enumerate(self.args)]

    def render(self, new: list[str]) -> str:
        """The script with the engine's arguments replaced by ``new``; unchanged words keep their text."""
        old = self.argv()
        out: list[str] = []
        sm = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        for tag, a0, a1, b0, b1 in sm.get_opcodes():
            if tag == "equal":
                for k in range(a0, a1):
                    out.append(self.seps[k] + self.args[k].text)
                continue
            if tag == "delete":
                continue
            for off, k in enumerate(range(b0, b1)):
                v = new[k]
                if "\x00" in v:
                    raise ShellTooComplex(f"an argument built from an expansion would have to be rewritten ({v!r})")
                sep = self.seps[a0 + off] if tag == "replace" and a0 + off < a1 else " "
                out.append(sep + shlex.quote(v))
        return self.script[:self.insert_at] + "".join(out) + self.script[self.region_end:]


def _engine_command(script: str, launchers: Sequence[Launcher]) -> tuple[list[Token], Token]:
    """The one simple command that starts the engine, and its last launch word."""
    commands: list[list[Token]] = [[]]
    for t in tokens(script):
        if t.kind == "op":
            commands.append([])
        else:
            commands[-1].append(t)
    found: list[tuple[list[Token], Token]] = []
    for cmd in commands:
        words = [t for t in cmd if t.kind == "word"]
        span = engine_words(words, launchers)
        if span:
            found.append((cmd, words[span[1] - 1]))
    if not found:
        raise ShellTooComplex("no engine command found in the script")
    if len(found) > 1:
        raise ShellTooComplex("the engine is started more than once in the script")
    return found[0]


def _refuse_expansions_that_may_be_flags(args: list[Token]) -> None:
    for n, t in enumerate(args):
        if not t.opaque or t.literal_prefix.startswith("-"):
            continue
        prev = args[n - 1] if n else None
        if prev is not None and not prev.opaque and prev.value.startswith("-") and "=" not in prev.value:
            continue                        # the value of the flag before it
        if n == 0:
            continue                        # a positional model argument (vllm serve $MODEL)
        raise ShellTooComplex(f"the argument {t.text} is an expansion that may hold engine flags")


def parse_script(script: str, launchers: Sequence[Launcher]) -> ShellEdit:
    """The engine command in ``script`` (started by one of ``launchers``), ready to edit."""
    cmd, last_engine_word = _engine_command(script, launchers)
    args: list[Token] = []
    seps: list[str] = []
    prev_end = last_engine_word.end
    k = cmd.index(last_engine_word) + 1
    seen_redir = False
    while k < len(cmd):
        t = cmd[k]
        if t.kind == "redir":
            seen_redir = True
            k += 2                          # the operator and its target word
            continue
        if seen_redir:
            raise ShellTooComplex("engine arguments after a redirection")
        args.append(t)
        seps.append(script[prev_end:t.start])
        prev_end = t.end
        k += 1
    _refuse_expansions_that_may_be_flags(args)
    return ShellEdit(script, args, seps, last_engine_word.end, prev_end)


def script_index(argv: list[str]) -> int | None:
    """``sh -c SCRIPT`` / ``bash -lc SCRIPT`` / ``bash -o pipefail -c SCRIPT``: the index of SCRIPT."""
    if not argv or not re.search(r"(^|/)(ba|da|z|k|a)?sh$", argv[0]):
        return None
    i = 1
    while i < len(argv) - 1:
        a = argv[i]
        if re.fullmatch(r"-[a-zA-Z]*c[a-zA-Z]*", a):
            return i + 1
        if a in ("-o", "+o"):
            i += 2
            continue
        if a.startswith(("-", "+")):
            i += 1
            continue
        return None
    return None
