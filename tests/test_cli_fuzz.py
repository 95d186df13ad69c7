"""Hostile input to the whole CLI: every command and option, generated bad values and bad files.

Whatever the input, a command answers with exit code 2 and one line on stderr (``error: ...``):
never a traceback, never exit 0 with nothing done. Runs in-process through ``lmlm.cli.main``, so an
exception that escapes is a failure of the test with its traceback.
"""

from __future__ import annotations

import enum
import json
import typing
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmlm.cli import app, main
from lmlm.kb import KnowledgeBase, Triple


def _leaves(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in sorted(cmd.commands.items()):
            yield from _leaves(sub, (*path, name))
    else:
        yield path, cmd


def _core(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _core(args[0]) if args and typing.get_origin(annotation) is not None else annotation


def _kind(param) -> str | None:
    t = _core(param.type_descriptor.annotation)
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return "choice"
    if t is bool or getattr(param, "is_flag", False):
        return None
    return {int: "int", float: "float"}.get(t)


COMMANDS = list(_leaves(typer.main.get_command(app)))
# (command, option, kind, min, max, choices) for every typed option of every command
TYPED = [(path, p.opts[0], kind, p.min, p.max,
          [e.value for e in _core(p.type_descriptor.annotation)] if kind == "choice" else [])
         for path, cmd in COMMANDS for p in cmd.params
         if p.param_type_name == "option" and (kind := _kind(p)) is not None]


def _placeholders(cmd) -> list[str]:
    """Required positional arguments filled with harmless values (the option under test fails first or with them)."""
    out = []
    for p in cmd.params:
        if p.param_type_name == "argument" and p.required:
            out.append("1" if _core(p.type_descriptor.annotation) is int else "no-such-thing")
    return out


def _not_a_number(s: str) -> bool:
    for conv in (int, float):
        try:
            conv(s)
            return False
        except (ValueError, OverflowError):
            pass
    return True


def _run(argv, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return rc, [ln for ln in err.splitlines() if ln.strip()]


def _assert_one_line_error(rc, lines, argv):
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), (argv, rc, lines[-5:])


def test_every_command_is_covered():
    assert len(COMMANDS) >= 40 and len(TYPED) >= 120  # the whole CLI, not a sample


@st.composite
def bad_option(draw):
    path, opt, kind, lo, hi, choices = draw(st.sampled_from(TYPED))
    text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12)
    if kind == "choice":
        value = draw(text.filter(lambda s: s not in choices and not s.startswith("-")))
    else:
        candidates = [text.filter(lambda s: _not_a_number(s) and not s.startswith("-"))]
        if lo is not None:
            candidates.append(st.integers(-10**6, int(lo) - 1).map(str) if kind == "int" else
                              st.floats(-1e6, float(lo), exclude_max=True).map(repr))
        if hi is not None:
            candidates.append(st.integers(int(hi) + 1, 10**6).map(str) if kind == "int" else
                              st.floats(float(hi), 1e6, exclude_min=True).map(repr))
        value = draw(st.one_of(candidates))
    return path, opt, value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bad_option())
def test_bad_option_values_get_one_line_and_exit_2(case, capsys):
    path, opt, value = case
    cmd = dict(COMMANDS)[path]
    argv = [*path, *_placeholders(cmd), f"{opt}={value}"]
    _assert_one_line_error(*_run(argv, capsys), argv)


# -- bad files -----------------------------------------------------------------------------------------

def _bad_files(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    good = [json.dumps({"id": f"d{i}", "annotated": f"Ada {i} was born in London.", "entity": "Ada",
                        "relation": "Birth City", "value": "London"}) for i in range(4)]
    files = {"missing": root / "missing.jsonl", "folder": root / "folder", "empty": root / "empty.jsonl",
             "not-utf8": root / "latin.jsonl", "broken-line": root / "broken.jsonl",
             "truncated": root / "truncated.jsonl", "binary": root / "garbage.bin", "blank-lines": root / "blank.jsonl"}
    files["folder"].mkdir(exist_ok=True)
    files["empty"].write_text("")
    files["not-utf8"].write_bytes("{\"annotated\": \"Zoë\"}\n".encode("latin-1") + b"\xff\xfe\n")
    files["broken-line"].write_text("\n".join([*good[:2], "{\"annotated\": \"cut", *good[2:]]) + "\n")
    files["truncated"].write_text("\n".join(good)[:-9])
    files["binary"].write_bytes(bytes(range(256)) * 8)
    files["blank-lines"].write_text("\n\n  \n")
    return files


def _file_commands(tmp: Path, kb: Path) -> dict[str, list]:
    out = tmp / "out"
    return {
        "train --data": ["train", "--data", "{F}", "--max-steps", "1", "--out", out / "t", "--no-progress"],
        "train --config": ["train", "--config", "{F}"],
        "kb build --triples": ["kb", "build", tmp / "kb-new", "--triples", "{F}", "--no-embed"],
        "kb import": ["kb", "import", kb, "{F}"],
        "kb delete --forget": ["kb", "delete", kb, "--forget", "{F}"],
        "kb build --aliases": ["kb", "build", tmp / "kb-al", "--triples", tmp / "t.jsonl", "--aliases", "{F}"],
        "kb lookup (KB path)": ["kb", "lookup", "{F}", "Ada", "Birth City"],
        "kb stats (KB path)": ["kb", "stats", "{F}"],
        "annotate validate": ["annotate", "validate", "{F}", "--out", out / "v"],
        "annotate correct": ["annotate", "correct", "{F}", "--out", out / "c"],
        "annotate distill": ["annotate", "distill", "{F}", "--out", out / "d"],
        "data prepare": ["data", "prepare", "{F}", "--tokenizer", "bpe:300", "--out", out / "s"],
        "generate --model": ["generate", "Ada was born in", "--model", "{F}", "--no-db"],
        "eval perplexity --model": ["eval", "perplexity", "--model", "{F}", "--data", "{F}"],
        "pipeline recipe": ["pipeline", "{F}", "--out", out / "p"],
    }


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "t.jsonl").write_text(json.dumps({"entity": "Ada", "relation": "Birth City", "value": "London"}) + "\n")
    kb = KnowledgeBase.create(tmp / "kb")
    kb.add([Triple("Ada", "Birth City", "London")])
    kb.close()
    return tmp, _bad_files(tmp / "bad"), _file_commands(tmp, tmp / "kb")


@pytest.mark.parametrize("command", list(_file_commands(Path("."), Path("."))))
def test_bad_files_get_one_line_and_exit_2(hostile, command, capsys):
    tmp, files, commands = hostile
    for kind, f in files.items():
        argv = [str(f) if a == "{F}" else a for a in commands[command]]
        rc, lines = _run(argv, capsys)
        _assert_one_line_error(rc, lines, (kind, argv))
        assert str(f.name) in lines[0] or kind in ("folder", "binary", "truncated", "not-utf8", "broken-line",
                                                    "empty", "blank-lines") or command.startswith("generate"), lines


@pytest.mark.parametrize("stage", ["distill", "correct"])
def test_annotator_stages_refuse_text_without_calls(tmp_path, stage, capsys):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"id": str(i), "text": f"Person {i} was born in Paris."}) + "\n"
                             for i in range(5)))
    rc, lines = _run(["annotate", stage, plain, "--out", tmp_path / "out"], capsys)
    _assert_one_line_error(rc, lines, stage)
    assert "lookup call" in lines[0] and not (tmp_path / "out").exists()  # refused before any training


COUNTS = ("max-new-tokens", "batch", "threads", "steps", "repeats", "shard-size", "n-ctx", "--k", "tokens")


def test_counts_declare_their_lower_bound():
    """An option that counts things (tokens, rows, threads, steps) refuses 0 or less at parsing, so the
    fuzzing above tries values under the bound; unbounded, a 0 reached torch or a loop as a traceback."""
    unbounded = [(" ".join(path), opt) for path, opt, kind, lo, _, _ in TYPED
                 if kind == "int" and lo is None and any(c in opt for c in COUNTS)]
    assert not unbounded


@pytest.mark.parametrize("argv", [["bench", "generate", "--threads", "0"], ["serve", "--max-batch", "0"],
                                  ["kb", "search", "no-such-kb", "Ada", "Birth City", "-k", "0"]])
def test_a_zero_count_is_one_line(argv, capsys):
    rc, lines = _run(argv, capsys)
    _assert_one_line_error(rc, lines, argv)
    assert argv[-2] in lines[0] or "--k" in lines[0]
