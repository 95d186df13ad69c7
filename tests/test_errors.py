"""Every error lmlm raises on purpose derives from ``LmlmError``; the CLI turns that one type into one line and exit 2."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import pytest

from lmlm.errors import LmlmError, MissingExtra, need

PACKAGE = Path(__file__).resolve().parents[1] / "lmlm"
BUILTIN_ERRORS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)}
SIGNALS = {"lmlm.stages.Stopped"}  # control flow, not an error: a run stopped where it was asked to


def error_classes() -> list[tuple[str, str]]:
    """``(module, class)`` for each public class in the package named ``...Error`` or with a built-in exception as a base."""
    out = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ClassDef) and not node.name.startswith("_")
                    and (node.name.endswith("Error")
                         or any(isinstance(b, ast.Name) and b.id in BUILTIN_ERRORS for b in node.bases))):
                out.append((module, node.name))
    return sorted(out)


def test_every_project_error_derives_from_the_one_base():
    found = error_classes()
    names = {c for _, c in found}
    assert {"KBError", "CorpusError", "BackendError", "RecipeError", "ShardError"} <= names
    outside = [f"{m}.{c}" for m, c in found if f"{m}.{c}" not in SIGNALS
               and not issubclass(getattr(importlib.import_module(m), c), LmlmError)]
    assert outside == []


def test_errors_keep_their_other_bases():
    from lmlm.annotate.backends import BackendError
    from lmlm.corpus import CorpusError
    from lmlm.kb import KBNotFound

    assert issubclass(CorpusError, ValueError) and issubclass(BackendError, RuntimeError)
    assert issubclass(KBNotFound, FileNotFoundError) and issubclass(KBNotFound, LmlmError)


def test_a_missing_extra_names_the_install_command():
    with pytest.raises(MissingExtra, match=r"pip install 'lmlm\[worlds\]'") as e:
        need("lmlm_no_such_module", "worlds", "synthetic worlds")
    assert isinstance(e.value, LmlmError) and isinstance(e.value, ImportError)
    assert need("json", "worlds", "x").dumps([]) == "[]"


def test_the_cli_turns_any_lmlm_error_into_one_line_and_exit_2(capsys):
    import typer

    from lmlm.cli_errors import user_errors

    with pytest.raises(typer.Exit) as e, user_errors():
        raise LmlmError("bad  input\n  here: --flag")
    assert e.value.exit_code == 2
    assert capsys.readouterr().err == "error: bad input here: --flag\n"
