"""``lmlm eval``: every command's --help, and each protocol from a saved checkpoint, a KB folder and a file."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from lmlm.checkpoint import save_checkpoint
from lmlm.evaluate.cli import eval_app
from lmlm.kb import KnowledgeBase, Triple

runner = CliRunner()
COMMANDS = ["trex", "popqa", "nlu", "factscore", "perplexity", "tofu", "rag"]


@pytest.fixture(scope="module")
def run_dir(world, tmp_path_factory):
    """A checkpoint of the tiny world's model and a KB folder of its facts (keys not embedded)."""
    root = tmp_path_factory.mktemp("eval-cli")
    save_checkpoint(root / "checkpoint", world.model, world.tok, {"mode": "lmlm", "kb": str(root / "kb")})
    kb = KnowledgeBase.create(root / "kb")
    kb.add([Triple(e, r, v, source=f"bio-{e}") for (e, r), v in world.facts.items()], embed=False)
    kb.close()
    return root




def _run(args):
    res = runner.invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command):
    res = runner.invoke(eval_app, [command, "--help"])
    assert res.exit_code == 0 and "--model" in res.output and "--data" in res.output


def test_offloading_help():
    res = runner.invoke(eval_app, ["offloading", "--help"])
    assert res.exit_code == 0 and "--lmlm" in res.output and "--standard" in res.output


def test_trex_command(world, run_dir, tmp_path):
    data = tmp_path / "P19.jsonl"
    data.write_text("".join(json.dumps({"uuid": str(k), "obj_label": c, "sub_label": n, "predicate_id": "P19",
                                        "masked_sentences": [f"{n} was born in [MASK] ."]}) + "\n"
                            for k, (n, c, _) in enumerate(world.people[:4])))
    out = tmp_path / "trex.json"
    last = _run(["trex", "--model", str(run_dir / "checkpoint"), "--data", str(data), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["metrics"] == last["metrics"] and doc["protocol"]["primary"] == "trex_exact_match"
    assert doc["metrics"]["trex_n"] == 4 and len(doc["records"]) == 4 and doc["config"]["force_lookup"] is True
    assert all(r["lookups"] for r in doc["records"])  # the checkpoint's KB answered the forced lookups
    assert [(r["uuid"], r["subject"]) for r in doc["records"]] == [(str(k), n) for k, (n, _, _) in
                                                                   enumerate(world.people[:4])]  # back to the file
    assert doc["config"]["kb"] and doc["config"]["kb_version"] >= 1  # which KB, as of which version
    with data.open("a") as f:  # a fact whose only sentence has its [MASK] mid-sentence: left out, and said
        f.write(json.dumps({"obj_label": "x", "sub_label": "y", "masked_sentences": ["[MASK] is y."]}) + "\n")
    res = runner.invoke(eval_app, ["trex", "--model", str(run_dir / "checkpoint"), "--data", str(data),
                                   "--out", str(out)])
    assert res.exit_code == 0 and "1 of 5 T-REx records left out" in res.output, res.output
    assert "generate: 100%" in res.output  # a progress bar over the batches (a full T-REx run takes hours)


def test_popqa_and_factscore_commands(world, run_dir, tmp_path):
    data = tmp_path / "test.tsv"
    with data.open("w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["id", "subj", "prop", "obj", "s_pop", "question", "possible_answers"])
        for k, (n, c, _) in enumerate(world.people[:3]):
            w.writerow([k, n, "place of birth", c, 10, f"In what city was {n} born?", json.dumps([c])])
    m = _run(["popqa", "--model", str(run_dir / "checkpoint"), "--kb", str(run_dir / "kb"), "--data", str(data),
              "--out", str(tmp_path / "popqa.json"), "--max-new-tokens", "12"])["metrics"]
    assert m["popqa_n"] == 3 and 0 <= m["popqa_accuracy"] <= 1
    forced = _run(["popqa", "--model", str(run_dir / "checkpoint"), "--data", str(data), "--force-lookup",
                   "--out", str(tmp_path / "forced.json"), "--max-new-tokens", "4"])["metrics"]
    config = {f: json.loads((tmp_path / f"{f}.json").read_text())["config"] for f in ("popqa", "forced")}
    assert config["popqa"]["force_lookup"] is False and config["forced"]["force_lookup"] is True  # which protocol ran
    assert forced["popqa_lookup_answered"] > 0  # lookups opened right after the prompts
    topics = tmp_path / "topics.txt"
    topics.write_text("\n".join(n for n, _, _ in world.people[:2]))
    m = _run(["factscore", "--model", str(run_dir / "checkpoint"), "--data", str(topics), "--max-new-tokens", "24",
              "--claims", "text", "--out", str(tmp_path / "fs.json")])["metrics"]
    assert m["factscore_n"] == 2 and set(m) >= {"factscore_score", "factscore_respond_ratio"}
    assert m["factscore_topics_unknown"] == 0
    topics.write_text(f"{world.people[0][0]}\nKang Ji-hwan\n")  # FActScore's own topic: no fact of it in the KB
    res = runner.invoke(eval_app, ["factscore", "--model", str(run_dir / "checkpoint"), "--data", str(topics),
                                   "--max-new-tokens", "8", "--claims", "text", "--out", str(tmp_path / "fs2.json")])
    assert res.exit_code == 0 and "1 of 2 topics have no fact in" in res.output, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["metrics"]["factscore_topics_unknown"] == 1
    res = runner.invoke(eval_app, ["factscore", "--model", str(run_dir / "checkpoint"), "--data", str(topics),
                                   "--max-new-tokens", "1", "--claims", "text", "--out", str(tmp_path / "fs3.json")])
    m = json.loads(res.stdout.strip().splitlines()[-1])["metrics"]  # one token states no fact: no score, and said
    assert m["factscore_respond_ratio"] == 0 and "no response made a claim" in res.output, res.output
    # the KB's own answers checked against the KB itself: 1.0 by construction, refused
    res = runner.invoke(eval_app, ["factscore", "--model", str(run_dir / "checkpoint"), "--data", str(topics)])
    assert res.exit_code == 2 and "supported by construction" in " ".join(res.output.split()), res.output


def test_factscore_lookups_of_a_model_that_makes_none_is_refused(world, run_dir, tmp_path):
    """A Standard model, or an LMLM with --no-db, makes no lookups: --claims lookups (the default) would score
    no claim at all and exit 0 with every score null; one line says to read the text's claims instead."""
    save_checkpoint(tmp_path / "standard", world.model, world.tok, {"mode": "standard"})
    topics = tmp_path / "topics.txt"
    topics.write_text("\n".join(n for n, _, _ in world.people[:2]))
    for args in (["--model", str(tmp_path / "standard")], ["--model", str(run_dir / "checkpoint"), "--no-db"]):
        res = runner.invoke(eval_app, ["factscore", *args, "--data", str(topics), "--world", str(run_dir / "kb"),
                                       "--out", str(tmp_path / "fs.json")])
        assert res.exit_code == 2 and "makes no lookups" in res.output and "--claims text" in res.output, res.output
        assert not (tmp_path / "fs.json").exists()
    m = _run(["factscore", "--model", str(tmp_path / "standard"), "--data", str(topics), "--world", str(run_dir / "kb"),
              "--claims", "text", "--max-new-tokens", "16", "--out", str(tmp_path / "fs.json")])["metrics"]
    assert m["factscore_n"] == 2


def test_nlu_command(run_dir, shared_data, tmp_path):
    m = _run(["nlu", "--model", str(run_dir / "checkpoint"), "--data", str(shared_data / "bigbench" / "social_iqa.json"),
              "--limit", "4", "--out", str(tmp_path / "nlu.json")])["metrics"]
    assert m["nlu_n"] == 4 and 0 <= m["nlu_acc_norm"] <= 1


def test_nlu_choice_longer_than_the_context_is_one_line(run_dir, tmp_path):
    """A choice of more tokens than the model reads: one line naming the file and the example, exit 2."""
    task = {"examples": [{"input": "Pick one.", "target_scores": {"yes": 1, "no": 0}},
                         {"input": "Pick one.", "target_scores": {"yes": 1, "no " * 200: 0}}]}
    (tmp_path / "task.json").write_text(json.dumps(task))
    res = runner.invoke(eval_app, ["nlu", "--model", str(run_dir / "checkpoint"), "--data", str(tmp_path / "task.json"),
                                   "--out", str(tmp_path / "nlu.json")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "task.json: example 2: the choice 'no no" in res.output and "context of 128" in res.output, res.output


def test_nlu_template_errors_name_the_option(run_dir, shared_data):
    """A template that is no format string is the option's fault, not the benchmark file's."""
    for template in ("Q: {input} {", "Q: {question}", "Q: nothing"):
        res = runner.invoke(eval_app, ["nlu", "--model", str(run_dir / "checkpoint"), "--template", template,
                                       "--data", str(shared_data / "bigbench" / "social_iqa.json")])
        assert res.exit_code == 2 and "error: --template" in res.output, res.output
        assert "cannot read the benchmark file" not in res.output


def test_errors(run_dir, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    res = runner.invoke(eval_app, ["trex", "--model", str(run_dir / "checkpoint"), "--data", str(tmp_path / "empty.jsonl")])
    assert res.exit_code == 2 and "no usable" in res.output
    res = runner.invoke(eval_app, ["nlu", "--model", str(run_dir / "checkpoint"), "--data", str(tmp_path / "empty.jsonl")])
    assert res.exit_code == 2 and "cannot read" in res.output
    import gzip

    (tmp_path / "P19.jsonl.gz").write_bytes(gzip.compress(b'{"obj_label": "Paris"}\n'))
    res = runner.invoke(eval_app, ["trex", "--model", str(run_dir / "checkpoint"),
                                   "--data", str(tmp_path / "P19.jsonl.gz")])
    assert res.exit_code == 2 and "P19.jsonl.gz is not UTF-8 text" in res.output, res.output
    (tmp_path / "names.txt").write_text("Ada Lind\n")
    res = runner.invoke(eval_app, ["factscore", "--model", str(tmp_path), "--data", str(tmp_path / "names.txt")])
    assert res.exit_code == 2 and "not a model folder" in res.output
