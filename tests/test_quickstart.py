"""The whole story, smoke-sized: world, KB, two models trained for real, evaluation, edits, report."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from lmlm.kb import KnowledgeBase
from lmlm.quickstart import quickstart
from lmlm.worlds.bios import BiosWorld

pytestmark = pytest.mark.slow  # the smoke preset end to end: 3 minutes with native bf16, 10 without


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
            assert {"lmlm", "lmlm_no_db", "standard"} <= set(fp["by_mentions"][bucket])
    assert _unit(report["added_knowledge"]["lmlm"]) and _unit(report["edits"]["lmlm"])
    for k in ("lmlm_plain", "lmlm_paper", "standard"):  # the same items, decoded otherwise
        assert _unit(report["added_knowledge"][k])
    # the LMLM rows are decoded with both biases; the paper's plain decoding beside them
    assert _unit(fp["lmlm_plain"]) and _unit(fp["lmlm_paper"]) and fp["name_bias"] > 0 and fp["copy_bias"] > 0
    u = report["unlearning"]
    for k in ("forget_before", "forget_after", "retain_before", "retain_after", "forget_after_plain",
              "retain_before_plain", "retain_after_plain"):
        assert _unit(u[k])
    assert u["seconds"] > 0 and u["facts_deleted"] == 6 * u["people"]
    p = report["perplexity"]
    for k in ("static", "dynamic", "normalized"):
        assert p["lmlm"][k] > 1.0
    assert p["standard"] > 1.0
    assert set(p["by_group"]) == {"trained", "added"}
    assert sum(g["documents"] for g in p["by_group"].values()) == p["documents"]
    assert sum(g["lookups"] for g in p["by_group"].values()) == p["lmlm"]["dynamic_lookups"]
    for k in ("lmlm", "standard"):
        m = report["models"][k]
        assert m["parameters"]["total"] > 0 and m["training_tokens"] > 0 and m["training_seconds"] > 0
    # same budget: same steps of the same number of tokens
    assert report["models"]["lmlm"]["training_tokens"] == report["models"]["standard"]["training_tokens"]


def test_editing_and_forgetting_by_the_fields_protocols(run):
    out, report = run
    p, cfg = report["protocols"], report["config"]
    rows = p["editing"]["lmlm"]["rows"]
    assert [r["edits"] for r in rows] == cfg["protocol_edits"]
    assert [r["edits"] for r in p["editing"]["ft-l"]["rows"]] == cfg["protocol_weight_edits"]
    for r in rows:  # a KB edit costs what the lookup costs: the new value wherever the old one was found
        assert _unit(r["efficacy_accuracy"]) and r["efficacy_accuracy"] >= r["unedited_precision"] - 0.1
        assert r["neighborhood_unchanged"] in (None, 1.0)
    f = p["forgetting"]
    assert f["facts_deleted"] == report["unlearning"]["facts_deleted"]  # the quickstart's own forget set
    assert f["residue_kb"] == 0.0 and all(k["kb_entity_residue"] == 0.0 for k in f["by_kind"].values())
    assert _unit(f["parametric_leakage"]) and _unit(f["unseen_standard"])
    md = (out / "report.md").read_text()
    assert "by the fields' protocols" in md and "MEMIT 94.7" in md
    assert (out / "figures" / "editing.png").stat().st_size > 1000


def test_report_for_people(run):
    out, report = run
    md = (out / "report.md").read_text()
    assert "Factual precision" in md and "⟦" in md  # lookups visibly marked in the samples
    for fig in ("factual_precision", "knowledge_changes", "perplexity", "training_loss"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 1000


def test_perplexity_reads_a_kb_with_every_heldout_fact(run):
    """The added people's facts are in the KB when the dynamic perplexity is measured: some of their
    lookups find the right person (before, the KB lacked them: any answer was someone else's)."""
    _, report = run
    added = report["perplexity"]["by_group"]["added"]
    assert added["lookups"] > 0 and added["lookup_found_rate"] > 0
    assert added["lookup_found_rate"] <= added["lookup_matched_rate"]


def test_precision_split_by_stated_and_kb_only_facts(run):
    out, report = run
    fp = report["factual_precision"]
    world = BiosWorld.load(out / "world")
    n_stated = fp["stated_counts"]["stated"]
    assert n_stated + fp["stated_counts"]["kb_only"] == fp["n"] and fp["stated_counts"]["kb_only"] > 0
    # a fact no document states is out of the Standard model's reach, not out of the LMLM's
    assert fp["by_stated"]["kb_only"]["standard"] <= 0.1
    assert fp["by_stated"]["kb_only"]["lmlm"] > fp["by_stated"]["kb_only"]["standard"]
    stated = sum(world.stated(p.name, r) for p in world.people_in("train") for r in p.facts)
    assert stated == world.stats()["triples"]["facts_stated"]
    md = (out / "report.md").read_text()
    assert "KB only" in md and "stated in training text" in md and "added people" in md
    assert ("| entity-aware, both biases (default) | entity-aware, plain decoding "
            "| paper's single-key match, plain decoding |") in md


def test_knowledge_lives_in_the_kb(run):
    out, report = run
    fp, u = report["factual_precision"], report["unlearning"]
    # without its database the LMLM cannot state the values: they were never trained on
    assert fp["lmlm_no_db"] <= 0.05
    # deleting facts is immediate and complete; other people's facts are untouched
    assert u["forget_after"] <= 0.05
    assert u["forget_after"] <= u["forget_before"]
    assert abs(u["retain_after"] - u["retain_before"]) <= 0.02
    # lookups of deleted or absent people never return someone else's fact; the paper's matching does
    w = report["wrong_entity"]
    assert w["deleted"]["wrong"] == 0  # their keys looked up: never another person's fact
    assert w["absent"]["wrong"] == 0
    # generated text about them: only where the model itself wrote another person's exact name
    for g in (w["deleted"], w["absent"]):
        assert g["generated"]["wrong"] < g["paper"]["generated"]["wrong"]
        # decoded plainly (no name or copy bias) as well
        assert max(g["generated"]["wrong"], g["plain"]["generated"]["wrong"]) < g["paper"]["generated"]["wrong"]
        for row in (g, g["plain"]):
            assert all(query == matched for _, query, matched in row["generated"]["examples"])
    assert u["forget_after_plain"] <= 0.05 and w["deleted"]["plain"]["wrong"] == 0
    assert w["deleted"]["paper"]["wrong"] == w["deleted"]["paper"]["n"] > 0
    assert w["cloze"]["share"] <= w["cloze"]["paper"]["share"]
    # the deletes are in the KB's log and unreachable by exact lookup
    world = BiosWorld.load(out / "world")
    kb = KnowledgeBase.open(out / "kb-eval")
    forget = world.forget_set(0.05, seed=0)
    for person in forget:
        for relation in world.person(person).facts:
            assert kb.lookup(person, relation) is None  # entity-aware: nobody else's fact either
            assert kb.explain(person, relation).reason == "no_entity"
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
