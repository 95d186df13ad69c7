"""Every CLI command answers --help, without loading torch; the presets table reproduces the paper's counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from lmlm.cli import app

runner = CliRunner()

COMMANDS = [[], ["quickstart"], ["reproduce"], ["presets"], ["world"], ["train"], ["generate"],
            ["kb"], ["kb", "build"], ["kb", "add"], ["kb", "edit"], ["kb", "delete"], ["kb", "lookup"],
            ["kb", "search"], ["kb", "stats"], ["kb", "log"], ["kb", "export"], ["kb", "import"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "lmlm")
def test_help(cmd):
    result = runner.invoke(app, cmd + ["--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def _commands(group, path=()):
    ctx = type(group).context_class(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield path + (name,), cmd
        if hasattr(cmd, "list_commands"):
            yield from _commands(cmd, path + (name,))


def test_every_flag_reads_as_english():
    """A switch named for its negative ('--no-db') is a flag, not '--no-db/--no-no-db'; every
    option of every command is spelled as a user would type it."""
    import typer

    seen = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        for param in cmd.params:
            names = list(getattr(param, "opts", [])) + list(getattr(param, "secondary_opts", []))
            seen += len(names)
            assert not [n for n in names if n.startswith("--no-no-")], (" ".join(path), names)
            assert all(n == n.lower() and "_" not in n for n in names if n.startswith("--")), (" ".join(path), names)
    assert seen > 200


def test_reproduce_reads_its_nlu_file_before_any_stage(tmp_path):
    bad = tmp_path / "task.json"
    bad.write_text(json.dumps({"examples": [{"target_scores": {"a": 1, "b": 0}}]}))
    for path, msg in ((tmp_path / "missing.json", "no file at"), (bad, "example 1 has no 'input'")):
        res = runner.invoke(app, ["reproduce", "--preset", "tiny", "--out", str(tmp_path / "out"),
                                  "--nlu-data", str(path)])
        assert res.exit_code == 2 and msg in res.output, res.output
    assert not (tmp_path / "out").exists()  # no stage ran


def test_help_loads_neither_torch_nor_transformers():
    """``lmlm --help`` and each group's help answer in well under a second: the heavy libraries load
    when a command runs, not when the CLI is read (in a fresh interpreter: this one has them)."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom lmlm.cli import app\n"
            "for cmd in ([], ['generate'], ['kb'], ['train'], ['eval'], ['bench'], ['serve'], ['pipeline']):\n"
            "    assert CliRunner().invoke(app, cmd + ['--help']).exit_code == 0, cmd\n"
            "print(sorted(m for m in ('torch', 'transformers', 'faiss') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_presets_names_a_tokenizer_path_that_is_not_there(tmp_path):
    res = runner.invoke(app, ["presets", "--tokenizer", f"gpt2={tmp_path / 'missing'}"])
    assert res.exit_code == 2 and "--tokenizer gpt2: tokenizer" in res.output and "no such file or folder" in res.output


def test_presets_json_matches_paper(shared_data):
    result = runner.invoke(app, ["presets", "--json",
                                 "--tokenizer", f"gpt2={shared_data / 'tokenizers' / 'gpt2'}",
                                 "--tokenizer", f"llama2={shared_data / 'tokenizers' / 'llama2'}"])
    assert result.exit_code == 0, result.output
    rows = {r["preset"]: r for r in json.loads(result.output)}
    expected = {"gpt2-124m": (50261, 124.4e6, None), "gpt2-355m": (50261, 354.8e6, None),
                "llama2-176m": (32004, 176.4e6, 160.0e6), "llama2-382m": (32004, 381.8e6, 357.3e6)}
    for name, (vocab, total, non_emb) in expected.items():
        row = rows[name]
        assert row["vocab_size"] == vocab
        assert abs(row["total"] - total) / total < 0.002
        if non_emb:
            assert abs(row["non_embedding"] - non_emb) / non_emb < 0.002


@pytest.mark.parametrize("cmd", [["world", "{out}", "--preset", "smoke"],
                                 ["quickstart", "--preset", "smoke", "--out", "{out}"],
                                 ["reproduce", "--preset", "tiny", "--out", "{out}"],
                                 ["pipeline", "wiki-cpu", "--corpus", "dump.xml", "--out", "{out}"]],
                         ids=lambda c: c[0])
def test_an_output_folder_that_is_a_file_is_refused_in_one_line(tmp_path, cmd):
    (tmp_path / "afile").write_text("x")
    for out, msg in ((tmp_path / "afile", "is a file, not a folder"), (tmp_path / "afile" / "w", "afile is a file")):
        res = runner.invoke(app, [a.format(out=out) for a in cmd])
        assert res.exit_code == 2 and msg in res.output, res.output  # a traceback exits 1
    assert (tmp_path / "afile").read_text() == "x"


def test_world_and_kb_commands(tmp_path):
    world = tmp_path / "world"
    assert runner.invoke(app, ["world", str(world), "--preset", "smoke"]).exit_code == 0
    kb = tmp_path / "kb"
    res = runner.invoke(app, ["kb", "build", str(kb), "--triples", str(world / "triples.jsonl"),
                              "--aliases", str(world / "aliases.jsonl")])
    assert res.exit_code == 0, res.output
    row = json.loads((world / "triples.jsonl").read_text().splitlines()[0])
    res = runner.invoke(app, ["kb", "lookup", str(kb), row["entity"], row["relation"]])
    assert res.exit_code == 0 and json.loads(res.output)["value"]
    first, last = row["entity"].split(" ", 1)
    res = runner.invoke(app, ["kb", "lookup", str(kb), f"{last}, {first}", row["relation"]])  # an alias the world wrote
    assert json.loads(res.output)["entity"] == row["entity"] and json.loads(res.output)["via"] == "alias"
    res = runner.invoke(app, ["kb", "alias", "list", str(kb), "--entity", row["entity"], "--json"])
    assert {"alias": f"{last}, {first}", "entity": row["entity"]} in json.loads(res.output)
    res = runner.invoke(app, ["kb", "alias", "add", str(kb), "The Subject", row["entity"], "--why", "test"])
    assert res.exit_code == 0 and "1 aliases added" in res.output and "no facts" not in res.output
    res = runner.invoke(app, ["kb", "alias", "add", str(kb), "Nobody", "No Such Person"])
    assert res.exit_code == 0 and "have no facts in" in " ".join(res.output.split())  # kept, and said
    assert json.loads(runner.invoke(app, ["kb", "lookup", str(kb), "the subject", row["relation"]]).output)["value"]
    res = runner.invoke(app, ["kb", "alias", "delete", str(kb), "The Subject"])
    assert res.exit_code == 0 and "deleted 1 aliases" in res.output
    assert runner.invoke(app, ["kb", "alias", "delete", str(kb), "The Subject"]).exit_code == 2
    assert runner.invoke(app, ["kb", "alias", "add", str(kb), "only-one"]).exit_code == 2
    # the name of another entity with facts is no alias: once that entity is deleted, it would answer for it
    other = next(json.loads(x)["entity"] for x in (world / "triples.jsonl").read_text().splitlines()
                 if json.loads(x)["entity"] != row["entity"])
    res = runner.invoke(app, ["kb", "alias", "add", str(kb), other, row["entity"]])
    assert res.exit_code == 2 and "is the name of an entity with facts" in " ".join(res.output.split()), res.output
    res = runner.invoke(app, ["kb", "delete", str(kb), "--entity", row["entity"], "--why", "test"])
    assert res.exit_code == 0 and "deleted" in res.output
    res = runner.invoke(app, ["kb", "lookup", str(kb), row["entity"], row["relation"]])
    assert json.loads(res.output)["miss"]["reason"] == "no_entity"  # deleted: no one else answers
    res = runner.invoke(app, ["kb", "lookup", str(kb), row["entity"], row["relation"], "--matching", "key",
                              "--threshold", "1.0"])
    assert json.loads(res.output)["miss"]["reason"] == "below_threshold"
    res = runner.invoke(app, ["kb", "alias", "list", str(kb), "--entity", row["entity"], "--json"])
    assert json.loads(res.output) == []  # its aliases went with it
    res = runner.invoke(app, ["kb", "lookup", str(tmp_path / "nope"), "a", "b"])
    assert res.exit_code == 2


def test_bench_options_a_run_cannot_take_are_one_line_and_exit_2(tmp_path):
    """Each bench refuses what it cannot run before any work: one ``error:`` line, exit 2, no traceback."""
    import socket
    import subprocess
    import sys

    with socket.create_server(("127.0.0.1", 0)) as s:
        free = s.getsockname()[1]  # closed again: nothing listens there
    cases = [(["kb", "--embed-keys", "0"], "--embed-keys"), (["kb", "--ann-queries", "0"], "--ann-queries"),
             (["authors", "--chunk-size", "0"], "--chunk-size"), (["annotate", "--people", "1"], "--people"),
             (["annotate", "--fraction", "2"], "--fraction"), (["annotate", "--annotator-lr", "-1"], "--annotator-lr"),
             (["generate", "--quick"], "--quick"),
             (["generate", "--model", str(tmp_path / "none"), "--kb", str(tmp_path / "nokb")], "no such model"),
             (["serve", "--model", str(tmp_path / "none")], "--model"),
             (["serve", "--url", f"http://127.0.0.1:{free}", "--token", "a-long-token"], "no lmlm server answers"),
             (["serve", "--url", "notaurl", "--editors", "0"], "no lmlm server answers"),
             (["serve", "--url", f"http://127.0.0.1:{free}"], "needs --token")]
    for args, said in cases:
        r = subprocess.run([sys.executable, "-m", "lmlm.cli", "bench", *args], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-800:])


def test_ctrl_c_says_the_command_was_interrupted(tmp_path):
    """Typer turns Ctrl-C into exit code 130 with nothing said; the command says it was interrupted."""
    import os
    import signal
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "lmlm.cli", "world", str(tmp_path / "w"), "--preset", "large"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)  # the large world takes several seconds to generate
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "error: interrupted", err
