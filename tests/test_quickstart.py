"""The whole story, smoke-sized: world, KB, two models trained for real, evaluation, edits, report."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from lmlm.kb import KnowledgeBase
from lmlm.quickstart import quickstart
from lmlm.worlds.bios import BiosWorld


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    report = quickstart(out, preset="smoke")
    return out, report


def _unit(x):
    return isinstance(x, float) and 0.0 <= x <= 1.0


def test_report_contract(run):
    out, report = run
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["factual_precision"] == report["factual_precision"]
    fp = report["factual_precision"]
    for k in ("lmlm", "lmlm_no_db", "standard"):
        assert _unit(fp[k])
        for bucket in ("1", "2-4", "5+"):
            assert set(fp["by_mentions"][bucket]) == {"lmlm", "lmlm_no_db", "standard"}
    assert _unit(report["added_knowledge"]["lmlm"]) and _unit(report["edits"]["lmlm"])
    u = report["unlearning"]
    for k in ("forget_before", "forget_after", "retain_before", "retain_after"):
        assert _unit(u[k])
    assert u["seconds"] > 0 and u["facts_deleted"] == 6 * u["people"]
    p = report["perplexity"]
    for k in ("static", "dynamic", "normalized"):
        assert p["lmlm"][k] > 1.0
    assert p["standard"] > 1.0
    for k in ("lmlm", "standard"):
        m = report["models"][k]
        assert m["parameters"]["total"] > 0 and m["training_tokens"] > 0 and m["training_seconds"] > 0
    # same budget: same steps of the same number of tokens
    assert report["models"]["lmlm"]["training_tokens"] == report["models"]["standard"]["training_tokens"]


def test_report_for_people(run):
    out, report = run
    md = (out / "report.md").read_text()
    assert "Factual precision" in md and "⟦" in md  # lookups visibly marked in the samples
    for fig in ("factual_precision", "knowledge_changes", "perplexity", "training_loss"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 1000


def test_knowledge_lives_in_the_kb(run):
    out, report = run
    fp, u = report["factual_precision"], report["unlearning"]
    # without its database the LMLM cannot state the values: they were never trained on
    assert fp["lmlm_no_db"] <= 0.05
    # deleting facts is immediate and complete; other people's facts are untouched
    assert u["forget_after"] <= 0.05
    assert u["forget_after"] <= u["forget_before"]
    assert abs(u["retain_after"] - u["retain_before"]) <= 0.02
    # the deletes are in the KB's log and unreachable by exact lookup
    world = BiosWorld.load(out / "world")
    kb = KnowledgeBase.open(out / "kb-eval")
    forget = world.forget_set(0.05, seed=0)
    for person in forget:
        for relation in world.person(person).facts:
            m = kb.lookup(person, relation)
            assert m is None or m.entity != person
    ops = {v.op for v in kb.log(limit=None)}
    assert {"add", "edit", "delete"} <= ops
    kb.close()


def test_checkpoints_load_with_transformers(run):
    out, _ = run
    for mode in ("lmlm", "standard"):
        model = AutoModelForCausalLM.from_pretrained(out / f"train-{mode}" / "checkpoint")
        assert model.num_parameters() > 0


def test_rerun_resumes_without_training_again(run):
    out, report = run
    again = quickstart(out, preset="smoke")
    # nothing retrained: the same checkpoints give the same greedy results
    assert again["factual_precision"] == report["factual_precision"]
    assert again["models"]["lmlm"]["training_seconds"] == report["models"]["lmlm"]["training_seconds"]
