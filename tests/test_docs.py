"""Every ``lmlm`` command the README and ``docs/`` show names a command the CLI has and only options it takes.

A renamed option or a moved command otherwise leaves the documentation telling users to type what
now exits 2. Read from the Markdown's shell blocks as a user would copy them (comments dropped, lines
joined at a trailing backslash, ``&&`` and ``|`` splitting one line into commands).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from lmlm.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.S)


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(page:line, argv)`` of every ``lmlm`` command in the pages' shell blocks."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in BLOCK.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            lines = block.group(1).splitlines()
            i = 0
            while i < len(lines):
                at, line = i, lines[i]
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i]
                i += 1
                words = shlex.split(line, comments=True)
                command: list[str] = []
                for word in words + ["&&"]:
                    if word in ("&&", "||", "|", ";"):
                        if command and command[0] == "lmlm":
                            found.append((f"{page.relative_to(ROOT)}:{first + at}", command[1:]))
                        command = []
                    else:
                        command.append(word)
    return found


def _leaf(argv: list[str]):
    """The click command ``argv`` names and the words after its name."""
    cmd = typer.main.get_command(app)
    while hasattr(cmd, "get_command") and argv and not argv[0].startswith("-"):
        sub = cmd.get_command(type(cmd).context_class(cmd), argv[0])
        if sub is None:
            return cmd, argv
        cmd, argv = sub, argv[1:]
    return cmd, argv


def test_every_documented_command_is_one_the_cli_takes():
    commands = documented_commands()
    assert len(commands) > 60  # the pages were read at all
    wrong = []
    for where, argv in commands:
        cmd, rest = _leaf(argv)
        if hasattr(cmd, "get_command"):
            wrong.append(f"{where}: 'lmlm {' '.join(argv)}' names no command of '{cmd.name}'")
            continue
        options = {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
        unknown = [w.split("=")[0] for w in rest if w.startswith("-") and w != "-" and w.split("=")[0] not in options]
        if unknown:
            wrong.append(f"{where}: 'lmlm {' '.join(argv[:len(argv) - len(rest)])}' takes no {', '.join(unknown)}")
    assert not wrong, "\n".join(wrong)


def test_a_wrong_option_in_a_page_is_caught():
    """The check itself: an option no command has, and a command that does not exist, are named."""
    cmd, rest = _leaf(["kb", "lookup", "K", "e", "r", "--no-such-option"])
    assert cmd.name == "lookup" and rest[-1] == "--no-such-option"
    assert "--no-such-option" not in {o for p in cmd.params for o in getattr(p, "opts", ())}
    group, rest = _leaf(["kb", "frobnicate"])
    assert hasattr(group, "get_command") and rest == ["frobnicate"]
