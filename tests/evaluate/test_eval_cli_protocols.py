"""``lmlm eval perplexity|tofu|offloading|rag`` on a tiny checkpoint, its KB and files in each format."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lmlm.checkpoint import save_checkpoint
from lmlm.evaluate.cli import eval_app
from lmlm.kb import KnowledgeBase, Triple
from lmlm.lookup import Lookup, Text, render
from lmlm.worlds.tofu import TofuConfig, TofuWorld

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(world, tmp_path_factory):
    """Checkpoints (LMLM and Standard modes of the tiny model), a KB of its facts, documents, a TOFU folder."""
    root = tmp_path_factory.mktemp("eval-cli-protocols")
    save_checkpoint(root / "lmlm", world.model, world.tok, {"mode": "lmlm", "kb": str(root / "kb")})
    save_checkpoint(root / "standard", world.model, world.tok, {"mode": "standard"})
    docs = [[Text(f"{n} was born in "), Lookup(n, "Birth City", c), Text(f" {c}. {n} works as a "),
             Lookup(n, "Occupation", j), Text(f" {j}.")] for n, c, j in world.people[:6]]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": render(d)}) + "\n" for d in docs))
    tofu = TofuWorld.generate(TofuConfig(n_authors=20, n_perturbed=2, n_world_facts=3, n_retain_perturbed=6),
                              real_people=[(n, {"Birth City": c}) for n, c, _ in world.people[:4]])
    tofu.save(root / "tofu")
    kb = KnowledgeBase.create(root / "kb")
    facts = {(e, r): v for (e, r), v in world.facts.items()} | {(e, r): v for e, r, v in tofu.triples()}
    kb.add([Triple(e, r, v) for (e, r), v in facts.items()], embed=False)
    kb.close()
    return root




def _run(args):
    res = runner.invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])["metrics"]


def test_perplexity_command(world, run_dir, tmp_path):
    m = _run(["perplexity", "--model", str(run_dir / "lmlm"), "--data", str(run_dir / "docs.jsonl"),
              "--out", str(tmp_path / "ppl.json")])
    assert m["perplexity_static"] > 1 and m["perplexity_normalized"] > 1 and m["perplexity_dynamic"] > 1
    assert m["perplexity_dynamic_lookup_found"] >= 0 and "perplexity_loss_value" in m
    # n: the documents and the queries the model wrote, each query a record to read the misses by
    assert m["perplexity_documents"] == 6 and m["perplexity_dynamic_lookups"] == 12
    records = json.loads((tmp_path / "ppl.json").read_text())["records"]
    assert len(records) == 12 and records[0]["document"] == "1" and records[-1]["document"] == "6"
    assert records[0]["reference"] == [world.people[0][0], "Birth City"] and records[6]["reference"][1] == "Occupation"
    assert sum(r["found"] for r in records) == round(m["perplexity_dynamic_lookup_found"] * 12)
    assert m["perplexity_dynamic_lookup_wrong_entity"] == sum(r["matched"] and not r["found"] for r in records)
    s = _run(["perplexity", "--model", str(run_dir / "standard"), "--data", str(run_dir / "docs.jsonl"),
              "--out", str(tmp_path / "ppl-std.json")])
    assert s["perplexity_org_tokens"] == m["perplexity_org_tokens"]     # the same text tokens are scored
    plain = tmp_path / "plain.txt"
    plain.write_text("Ada Lind was born in Paris. She works as a painter.\n")
    res = runner.invoke(eval_app, ["perplexity", "--model", str(run_dir / "lmlm"), "--data", str(plain),
                                   "--out", str(tmp_path / "plain.json")])
    assert res.exit_code == 0 and "no lookup calls" in res.output, res.output
    metrics = json.loads(res.stdout.strip().splitlines()[-1])["metrics"]
    assert "perplexity_dynamic" not in metrics and metrics["perplexity_static"] > 1  # not the static number again
    # a file that marks splits: its held-out documents, and with --limit the message says how many are scored
    marked = tmp_path / "marked.jsonl"
    marked.write_text("".join(json.dumps({"text": line["text"], "split": s}) + "\n" for line, s in zip(
        map(json.loads, (run_dir / "docs.jsonl").read_text().splitlines()), ["train"] + ["heldout"] * 5)))
    res = runner.invoke(eval_app, ["perplexity", "--model", str(run_dir / "lmlm"), "--data", str(marked),
                                   "--limit", "2", "--no-dynamic", "--out", str(tmp_path / "limited.json")])
    assert res.exit_code == 0, res.output
    assert "scoring the first 2 of the 5 held-out documents (heldout) of 6" in res.output, res.output
    assert json.loads((tmp_path / "limited.json").read_text())["config"]["documents"] == 2
    marked.write_text(marked.read_text().replace('"heldout"', '"train"'))  # every document trained on: said
    res = runner.invoke(eval_app, ["perplexity", "--model", str(run_dir / "lmlm"), "--data", str(marked),
                                   "--limit", "1", "--no-dynamic", "--out", str(tmp_path / "trained.json")])
    assert res.exit_code == 0 and "is in split train: this scores text the model was trained on" in res.output


def test_perplexity_scores_the_documents_of_any_held_out_split(run_dir, tmp_path):
    """A file whose documents carry ``train`` and ``test`` (or ``validation``): the held-out ones only,
    as ``lmlm train`` trains on ``train``; the same number as a file of the held-out documents alone."""
    lines = (run_dir / "docs.jsonl").read_text().splitlines()
    split = [{**json.loads(x), "split": "train" if k < 3 else "test"} for k, x in enumerate(lines)]
    (tmp_path / "split.jsonl").write_text("".join(json.dumps(d) + "\n" for d in split))
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(d) + "\n" for d in split[3:]))
    args = ["perplexity", "--model", str(run_dir / "lmlm"), "--no-dynamic"]
    res = runner.invoke(eval_app, args + ["--data", str(tmp_path / "split.jsonl"), "--out", str(tmp_path / "a.json")])
    assert res.exit_code == 0 and "the 3 held-out documents (test) of 6" in res.output, res.output
    both = json.loads(res.stdout.strip().splitlines()[-1])["metrics"]
    alone = _run(args + ["--data", str(tmp_path / "test.jsonl"), "--out", str(tmp_path / "b.json")])
    assert both == alone and json.loads((tmp_path / "a.json").read_text())["config"]["documents"] == 3


def test_a_missing_kb_names_the_commands_own_options(world, run_dir, tmp_path):
    """An LMLM checkpoint that names no KB: one line naming options the command has, then the way out works."""
    save_checkpoint(tmp_path / "no-kb", world.model, world.tok, {"mode": "lmlm"})
    args = ["perplexity", "--model", str(tmp_path / "no-kb"), "--data", str(run_dir / "docs.jsonl")]
    res = runner.invoke(eval_app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "no knowledge base" in res.output and "--no-dynamic" in res.output and "--no-db" not in res.output
    m = _run(args + ["--no-dynamic", "--out", str(tmp_path / "ppl.json")])
    assert m["perplexity_static"] > 1 and "perplexity_dynamic" not in m
    tofu = runner.invoke(eval_app, ["tofu", "--model", str(tmp_path / "no-kb"), "--data", str(run_dir / "tofu")])
    assert tofu.exit_code == 2 and "--kb" in tofu.output and "--no-db" in tofu.output


def test_tofu_command_kb_delete_and_npo(run_dir, tmp_path):
    base = ["tofu", "--model", str(run_dir / "lmlm"), "--kb", str(run_dir / "kb"), "--data", str(run_dir / "tofu"),
            "--max-new-tokens", "8"]
    before = _run(base + ["--out", str(tmp_path / "before.json"), "--retain-model", str(run_dir / "lmlm"),
                          "--retain-kb", str(run_dir / "kb")])
    assert before["tofu_forget_quality"] == pytest.approx(1.0)           # the model against itself
    assert all(isinstance(v, (int, float)) for v in before.values())      # lists go to the records
    assert json.loads((tmp_path / "before.json").read_text())["records"][0]["per_question"]
    after = _run(base + ["--unlearn", "kb", "--out", str(tmp_path / "after.json")])
    doc = json.loads((tmp_path / "after.json").read_text())
    assert doc["config"]["deletion"]["deleted"] == 7 and 0 <= after["tofu_model_utility"] <= 1
    kb = KnowledgeBase.open(run_dir / "kb")                              # the KB itself is untouched
    forget = TofuWorld.load(run_dir / "tofu").forget_authors(5)[0]
    assert kb.lookup_batch([(forget, "Birth Place")])[0] is not None
    kb.close()
    npo = _run(["tofu", "--model", str(run_dir / "standard"), "--data", str(run_dir / "tofu"), "--unlearn", "npo",
                "--steps", "2", "--eval-every", "1", "--max-new-tokens", "4", "--out", str(tmp_path / "npo.json")])
    traj = json.loads((tmp_path / "npo.json").read_text())["records"]
    assert [r["step"] for r in traj] == [0, 1, 2] and "tofu_model_utility" in npo


def test_tofu_release_files_and_an_lmlm_without_its_kb(run_dir, tmp_path):
    """TOFU's own files have no annotated answers: an LMLM with its KB cannot be scored on them, and the
    line says so and names --no-db, which scores the plain answers (the retain model alike)."""
    from lmlm.evaluate.base import read_json_records

    (tmp_path / "tofu").mkdir()
    for name in ("forget05_perturbed.json", "retain_perturbed.json"):
        rows = read_json_records(run_dir / "tofu" / name)
        (tmp_path / "tofu" / name).write_text("".join(json.dumps({k: v for k, v in r.items()
                                                                  if not k.startswith("annotated")}) + "\n"
                                                      for r in rows))
    base = ["tofu", "--model", str(run_dir / "lmlm"), "--data", str(tmp_path / "tofu"), "--limit", "3",
            "--max-new-tokens", "4"]
    res = runner.invoke(eval_app, base + ["--out", str(tmp_path / "a.json")])
    assert res.exit_code == 2 and "--no-db scores the plain answers" in " ".join(res.output.split()), res.output
    m = _run(base + ["--no-db", "--retain-model", str(run_dir / "lmlm"), "--out", str(tmp_path / "b.json")])
    assert m["tofu_forget_n"] == 3 and m["tofu_forget_quality"] == pytest.approx(1.0)  # itself, scored alike
    assert json.loads((tmp_path / "b.json").read_text())["config"]["no_db"] is True


def test_offloading_command(run_dir, tmp_path):
    m = _run(["offloading", "--lmlm", str(run_dir / "lmlm"), "--standard", str(run_dir / "standard"),
              "--data", str(run_dir / "docs.jsonl"), "--ratios", "0.5,1", "--corpora", str(tmp_path / "corpora"),
              "--out", str(tmp_path / "off.json")])
    assert m["offloading_facts"] == 12 and "offloading_threshold_50" in m
    half = (tmp_path / "corpora" / "ratio-050.jsonl").read_text()
    assert half.count("[dblookup(") == 6 * 2 // 2 and (tmp_path / "corpora" / "ratio-100.jsonl").exists()
    given = [{**json.loads(x), "id": f"doc-{k}", "split": "heldout" if k % 2 else "train", "person": k}
             for k, x in enumerate((run_dir / "docs.jsonl").read_text().splitlines())]
    (tmp_path / "split.jsonl").write_text("".join(json.dumps(d) + "\n" for d in given))
    _run(["offloading", "--lmlm", str(run_dir / "lmlm"), "--standard", str(run_dir / "standard"),
          "--data", str(tmp_path / "split.jsonl"), "--ratios", "0.5", "--corpora", str(tmp_path / "c2"),
          "--out", str(tmp_path / "off2.json")])
    kept = [json.loads(x) for x in (tmp_path / "c2" / "ratio-050.jsonl").read_text().splitlines()]
    assert [(d["id"], d["split"], d["person"]) for d in kept] == [(d["id"], d["split"], d["person"]) for d in given]
    doc = json.loads((tmp_path / "off.json").read_text())
    assert doc["protocol"]["primary"] is None  # a ranking: the perplexity per ratio needs a model trained on each
    records = doc["records"]
    diffs = [r["loss_difference"] for r in records]
    assert diffs == sorted(diffs, reverse=True)
    swapped = runner.invoke(eval_app, ["offloading", "--lmlm", str(run_dir / "standard"), "--standard",
                                       str(run_dir / "lmlm"), "--data", str(run_dir / "docs.jsonl")])
    assert swapped.exit_code == 2 and "is a standard checkpoint" in " ".join(swapped.output.split()), swapped.output


def test_offloading_of_a_corpus_without_calls_is_refused(run_dir, tmp_path):
    """Plain documents have no fact to rank: one line, exit 2, no results file (was exit 0 with 0 facts)."""
    (tmp_path / "plain.jsonl").write_text(json.dumps({"text": "Ada Lind was born in Paris."}) + "\n")
    res = runner.invoke(eval_app, ["offloading", "--lmlm", str(run_dir / "lmlm"), "--standard",
                                   str(run_dir / "standard"), "--data", str(tmp_path / "plain.jsonl"),
                                   "--out", str(tmp_path / "off.json")])
    assert res.exit_code == 2 and "no lookup calls in" in res.output and "plain.jsonl" in res.output, res.output
    assert not (tmp_path / "off.json").exists()


def test_rag_command(world, run_dir, tmp_path):
    data = tmp_path / "P19.jsonl"
    data.write_text("".join(json.dumps({"uuid": str(k), "obj_label": c, "sub_label": n, "predicate_id": "P19",
                                        "masked_sentences": [f"{n} was born in [MASK] ."]}) + "\n"
                            for k, (n, c, _) in enumerate(world.people[:3])))
    m = _run(["rag", "--model", str(run_dir / "standard"), "--corpus", str(run_dir / "docs.jsonl"), "--data", str(data),
              "-k", "2", "--words", "20", "--max-new-tokens", "6", "--out", str(tmp_path / "rag.json")])
    assert m["rag_trex_n"] == 3 and 0 <= m["rag_trex_exact_match"] <= 1
    records = json.loads((tmp_path / "rag.json").read_text())["records"]
    assert all(1 <= len(r["passages"]) <= 2 for r in records) and not any("_lookup_" in k for k in m)
    # the docs state each person's city, and BM25 finds a passage naming the person: the ceiling is met
    assert m["rag_answer_in_passages"] == sum(r["gold"] in " ".join(r["passages"]) for r in records) / 3
    assert json.loads((tmp_path / "rag.json").read_text())["protocol"]["primary"] == "rag_trex_exact_match"
    qa = tmp_path / "qa.jsonl"  # PopQA's columns as JSON lines: the results file names the metric it holds
    qa.write_text("".join(json.dumps({"question": f"Where was {n} born?", "subj": n, "prop": "place of birth",
                                      "possible_answers": json.dumps([c])}) + "\n" for n, c, _ in world.people[:2]))
    m = _run(["rag", "--model", str(run_dir / "standard"), "--corpus", str(run_dir / "docs.jsonl"), "--data", str(qa),
              "--task", "popqa", "-k", "2", "--words", "20", "--max-new-tokens", "6",
              "--out", str(tmp_path / "qa.json")])
    primary = json.loads((tmp_path / "qa.json").read_text())["protocol"]["primary"]
    assert primary == "rag_popqa_accuracy" and m[primary] == m["rag_popqa_accuracy"]
    res = runner.invoke(eval_app, ["rag", "--model", str(run_dir / "standard"), "--corpus", str(run_dir / "docs.jsonl"),
                                   "--data", str(data), "--task", "nope"])
    assert res.exit_code == 2 and "--task" in res.output


def test_results_files_are_strict_json_and_out_is_a_file(tmp_path):
    """A metric with no items (NaN) is null in the results file, as on the metrics line, so any JSON
    reader takes it; ``--out`` naming a folder is refused before anything is evaluated."""
    import math

    from lmlm.evaluate.base import Protocol, write_results

    path = write_results(tmp_path / "r.json", Protocol("x", "x_a"), {"x_a": math.nan, "x_b": 0.5},
                         [{"precision": math.nan, "n": [1.0, math.inf]}])
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in strict JSON"))
    assert doc["metrics"] == {"x_a": None, "x_b": 0.5} and doc["records"] == [{"precision": None, "n": [1.0, None]}]
    (tmp_path / "results").mkdir()
    res = CliRunner().invoke(eval_app, ["trex", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "d.jsonl"),
                                        "--out", str(tmp_path / "results")])
    assert res.exit_code == 2 and "Invalid value for '--out'" in res.output and "folder" in res.output, res.output
    (tmp_path / "d.jsonl").write_text("")  # a path under a file: refused at once, not after the evaluation
    res = CliRunner().invoke(eval_app, ["trex", "--model", str(tmp_path / "none"), "--data", str(tmp_path / "d.jsonl"),
                                        "--out", str(tmp_path / "d.jsonl" / "sub" / "r.json")])
    said = " ".join(res.output.replace("│", " ").split())  # the message as one line, the error box's frame gone
    assert res.exit_code == 2 and "is a file, so" in said and "cannot be written" in said, res.output
