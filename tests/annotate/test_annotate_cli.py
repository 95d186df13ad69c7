"""``lmlm annotate``: every command answers --help; validate -> correct -> distill -> run chained on a world."""

import json

import pytest
from typer.testing import CliRunner

from lmlm.cli import app

runner = CliRunner()
COMMANDS = ["seed", "validate", "correct", "distill", "run", "serve-gguf", "wikipedia"]


@pytest.mark.parametrize("cmd", [["annotate", c] for c in COMMANDS] + [["bench", "annotate"]], ids=" ".join)
def test_help(cmd):
    result = runner.invoke(app, cmd + ["--help"])
    assert result.exit_code == 0, result.output


def test_stages_chained(tmp_path):
    world = tmp_path / "world"
    assert runner.invoke(app, ["world", str(world), "--preset", "smoke"]).exit_code == 0
    docs = world / "documents.jsonl"
    res = runner.invoke(app, ["annotate", "validate", str(docs), "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "v" / "report.json").read_text())["rejected"] == 0

    res = runner.invoke(app, ["annotate", "correct", str(tmp_path / "v" / "annotated.jsonl"), "--out",
                              str(tmp_path / "c"), "--steps", "3", "--drop", "0.2"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "c" / "losses.png").exists()
    # kept.jsonl lists the calls it keeps (not the input's), and scores name documents by their ids
    kept = [json.loads(x) for x in (tmp_path / "c" / "kept.jsonl").read_text().splitlines()]
    assert all(len(d["calls"]) == d["annotated"].count("[dblookup(") for d in kept)
    dropped = sum(json.loads(x)["dropped"] for x in (tmp_path / "c" / "scores.jsonl").read_text().splitlines())
    before = sum(len(json.loads(x)["calls"]) for x in (tmp_path / "v" / "annotated.jsonl").read_text().splitlines())
    assert dropped > 0 and sum(len(d["calls"]) for d in kept) == before - dropped
    first = json.loads((tmp_path / "c" / "scores.jsonl").read_text().splitlines()[0])
    assert first["doc_id"] == kept[first["doc"]]["id"]
    res = runner.invoke(app, ["annotate", "distill", str(tmp_path / "c" / "kept.jsonl"), "--out", str(tmp_path / "a"),
                              "--steps", "3"])
    assert res.exit_code == 0, res.output
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Ada Lovelace was born in London.\nAlan Turing studied Mathematics.\n")
    res = runner.invoke(app, ["annotate", "run", str(corpus), "--annotator", str(tmp_path / "a"), "--out",
                              str(tmp_path / "r"), "--shard-size", "1"])
    assert res.exit_code == 0, res.output
    assert len((tmp_path / "r" / "annotated.jsonl").read_text().splitlines()) == 2


def test_bad_input_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{oops\n')
    res = runner.invoke(app, ["annotate", "validate", str(bad), "--out", str(tmp_path / "v")])
    assert res.exit_code == 2 and "bad.jsonl:2" in res.output
    res = runner.invoke(app, ["annotate", "run", str(bad), "--annotator", str(tmp_path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    res = runner.invoke(app, ["annotate", "seed", str(tmp_path / "none.jsonl"), "--backend", "x", "--out", "o"])
    assert res.exit_code == 2 and "none.jsonl" in res.output


def test_user_errors_are_one_line_before_any_work(tmp_path):
    import bz2

    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "a", "text": "Ada Lovelace was born in London."}) + "\n")
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    commands = [["validate", str(docs)], ["correct", str(docs), "--steps", "1"], ["distill", str(docs), "--steps", "1"],
                ["run", str(docs), "--annotator", str(tmp_path)], ["wikipedia", str(tmp_path / "dump.xml")],
                ["seed", str(docs), "--backend", "openai://127.0.0.1:1/v1?model=m", "--no-cache"]]
    for cmd in commands:
        res = runner.invoke(app, ["annotate", *cmd, "--out", str(afile)])
        assert res.exit_code == 2 and "afile: is a file" in res.output, (cmd, res.output)
        assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["annotate", "seed", str(docs), "--backend", "hf:/nonexistent", "--no-cache",
                              "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "/nonexistent" in res.output and res.exception.__class__ is SystemExit
    # a dump cut short: named as such, and no partial file left
    pages = "".join(f"<page><title>P{i}</title><ns>0</ns><id>{i}</id><revision><text>Person {i} was born in "
                    f"City{i}. {'Filler text. ' * 300}</text></revision></page>" for i in range(200))
    data = bz2.compress(f"<mediawiki>{pages}</mediawiki>".encode())
    (tmp_path / "cut.xml.bz2").write_bytes(data[:len(data) // 2])
    res = runner.invoke(app, ["annotate", "wikipedia", str(tmp_path / "cut.xml.bz2"), "--out", str(tmp_path / "w")])
    assert res.exit_code == 2 and "cut.xml.bz2: the dump is truncated or corrupt" in res.output, res.output
    assert not [p for p in (tmp_path / "w").rglob("*") if p.is_file()]


def test_serve_gguf_names_a_port_out_of_range_or_in_use():
    import socket

    res = runner.invoke(app, ["annotate", "serve-gguf", "--port", "99999"])
    assert res.exit_code == 2 and "--port 99999: a port is a number from 1 to 65535" in res.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = runner.invoke(app, ["annotate", "serve-gguf", "--port", str(port)])
    assert res.exit_code == 2 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in res.output, res.output
