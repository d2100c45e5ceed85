"""The code blocks of the docs' Markdown, for tests/test_docs.py: which run, which do not and why.

A fenced block tagged ``python``, ``bash``, ``sh`` or ``console`` runs unless the line directly above
its fence is ``<!-- not run: REASON -->``; blocks in other languages (``text``, ``json``, ``toml``…) are
shown, never run. Every ``mechkit …`` command line in any block is also parsed against the real CLI.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"python", "py", "bash", "sh", "console", "shell"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason, when marked; "" when marked without one

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.not_run is None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order (indented fences, as in admonitions, included)."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"].lower()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        marker = NOT_RUN.match(lines[i - 1]) if i > 0 else None
        found.append(Block(path, i + 1, lang, "\n".join(body) + "\n", marker["reason"] if marker else None))
        i = j + 1
    return found


def shell_commands(code: str) -> list[str]:
    """The logical lines of a shell block (``\\`` continuations joined, comments and prompts dropped)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def mechkit_invocations(block: Block) -> list[list[str]]:
    """The argument lists of every ``mechkit …`` command in a block (shell lines, or strings in Python)."""
    if block.lang in {"python", "py"}:
        return []
    found = []
    for command in shell_commands(block.code):
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", command):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value mechkit …
                words = words[1:]
            if words and Path(words[0]).name == "mechkit":
                found.append(words[1:])
    return found


def only_mechkit(block: Block) -> bool:
    """True when every command of a shell block is a plain ``mechkit …`` call (run in-process then)."""
    commands = shell_commands(block.code)
    return bool(commands) and all(
        re.fullmatch(r"mechkit(\s.*)?", c) and not re.search(r"[|&;<>$`]", c) for c in commands)


def check_parses(args: list[str]) -> None:
    """Parse ``mechkit ARGS`` with the real CLI without running it; raises click's error if it does not.

    Paths need not exist (a doc names files the reader will have), and ``--help`` lines are checked up
    to the command they ask about. An option that checks its file exists while parsing (``--vectors``)
    is parsed again in a scratch directory where the files it names exist (empty).
    """
    import os
    import tempfile

    from mechkit.errors import MechkitError

    with tempfile.TemporaryDirectory(prefix="mechkit-docs-parse-") as scratch:
        for _ in range(8):
            try:
                return _parse(args)
            except MechkitError as err:
                missing = re.match(r"(\S+) does not exist", err.problem.split(": ", 1)[-1])
                if not missing or os.path.isabs(missing[1]) or ".." in missing[1]:
                    raise
                target = Path(scratch) / missing[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
                args = [a.replace(missing[1], str(target)) for a in args]
        raise ValueError(f"mechkit {' '.join(args)}: still names missing files after 8 tries")


def _parse(args: list[str]) -> None:
    import click

    from mechkit.cli.main import cli

    args = [a for a in args if a not in ("--help", "-h")]
    command, ctx, rest, name = cli, None, list(args), "mechkit"
    while True:
        if not rest and isinstance(command, click.Group):
            return  # `mechkit --help`, `mechkit taskvec --help`: the command exists
        try:
            ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
        except click.BadParameter as err:
            if isinstance(getattr(err.param, "type", None), click.Path):
                return
            raise
        if not isinstance(command, click.Group):
            return
        rest = [*ctx._protected_args, *ctx.args] if hasattr(ctx, "_protected_args") else list(ctx.args)
        if not rest:
            return
        name = rest[0]
        sub = command.get_command(ctx, name)
        if sub is None:
            raise click.UsageError(f"no such command {name!r}")
        command, rest = sub, rest[1:]


def markdown_files(root: Path) -> list[Path]:
    """The hand-written Markdown the docs are made of: docs/, the README, bench/README.md."""
    files = sorted((root / "docs").rglob("*.md"))
    return [root / "README.md", root / "bench" / "README.md", *files]
