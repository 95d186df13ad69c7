"""``lmlm eval forgetting``: the model fixed, the KB varied (full, deleted with lookups on, lookups off),
residue per adversarial kind, on the tiny trained world and a real KB."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lmlm.checkpoint import save_checkpoint
from lmlm.evaluate.cli import eval_app
from lmlm.evaluate.forgetting import (Fact, alias_closure, misspellings, probes, read_facts, relation_paraphrases,
                                      transliterations)
from lmlm.kb import KnowledgeBase, Triple

runner = CliRunner()


def test_adversarial_forms_of_a_name_and_a_relation():
    assert {"jamie mcfarland", "J. Mcfarland", "Jamie Mcfalrand", "Jamie Mcfaland"} <= set(misspellings("Jamie Mcfarland"))
    assert "Jasmine Bahr" in transliterations("Jasmine Bähr")  # diacritics folded
    forms = transliterations("Ada Lind")
    assert any(not f.isascii() for f in forms) and "Ada Lynd" in forms  # one added, and a respelling
    assert "birthplace" in relation_paraphrases("Birth City")
    assert relation_paraphrases("Capital") == ["seat of government"]  # the annotator's cue words
    facts = [Fact("Ada Lind", r, v, f"Ada Lind's {r.lower()} is") for r, v in
             (("Birth City", "Oslo"), ("Occupation", "pilot"), ("Employer", "Acme"))]
    ps = probes(facts, {"Ada Lind": ["Lind, Ada"]})
    kinds = {p.kind for p in ps}
    assert kinds == {"name", "alias", "misspelling", "transliteration", "relation", "description"}
    alias = next(p for p in ps if p.kind == "alias")
    assert alias.prompt == "Lind, Ada's birth city is" and alias.fact is facts[0]
    desc = next(p for p in ps if p.kind == "description" and p.fact is facts[0])
    assert "Ada Lind" not in desc.entity and "pilot" in desc.entity and "Acme" in desc.prompt


def test_the_alias_closure_reaches_another_entity_sharing_an_alias(tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple("Ada Lind", "Birth City", "Oslo"), Triple("Augusta Lind", "Birth City", "Oslo"),
            Triple("Bram Moss", "Birth City", "Lima")], embed=False)
    kb.add_aliases([("Lind, Ada", "Ada Lind"), ("Countess Lind", "Ada Lind"), ("Countess Lind", "Augusta Lind")])
    assert set(alias_closure(kb, "Ada Lind")) == {"Ada Lind", "Lind, Ada", "Countess Lind", "Augusta Lind"}
    assert alias_closure(kb, "Bram Moss") == ["Bram Moss"]
    kb.close()


def test_read_facts_takes_our_lines_and_trex_records_and_names_a_bad_line(tmp_path):
    p = tmp_path / "facts.jsonl"
    p.write_text(json.dumps({"entity": "Ada Lind", "relation": "Birth City", "value": "Oslo", "prompt": "Ada Lind was born in"})
                 + "\n" + json.dumps({"sub_label": "Aruba", "predicate_id": "Capital", "obj_label": "Oranjestad",
                                      "masked_sentences": ["Aruba\nIts capital is [MASK] ."]}) + "\n")
    facts = read_facts(p)
    assert facts[1] == Fact("Aruba", "Capital", "Oranjestad", "Aruba\nIts capital is")
    p.write_text(json.dumps({"entity": "Ada Lind", "relation": "Birth City", "value": "Oslo"}) + "\n")
    with pytest.raises(ValueError, match=r"facts.jsonl:1: missing prompt"):
        read_facts(p)


@pytest.fixture(scope="module")
def run_dir(world, tmp_path_factory):
    """The tiny LMLM and a KB of its facts, where the first person is also held under a second name that
    shares an alias with hers (the same person twice, as merged sources leave a KB)."""
    root = tmp_path_factory.mktemp("eval-forgetting")
    save_checkpoint(root / "lmlm", world.model, world.tok, {"mode": "lmlm", "kb": str(root / "kb")})
    save_checkpoint(root / "standard", world.model, world.tok, {"mode": "standard"})
    kb = KnowledgeBase.create(root / "kb")
    first, city, job = world.people[0]
    twin = "Countess " + first.split()[-1]
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()] +
           [Triple(f"{first} Senior", "Birth City", city), Triple(f"{first} Senior", "Occupation", job)], embed=False)
    kb.add_aliases([(twin, first), (twin, f"{first} Senior")])
    kb.close()
    rows = [{"entity": n, "relation": "Birth City", "value": c, "prompt": f"{n} was born in"} for n, c, _ in world.people[:3]]
    rows += [{"entity": n, "relation": "Occupation", "value": j, "prompt": f"{n} works as a"} for n, _, j in world.people[:3]]
    (root / "forget.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    unseen = [{"entity": "Zora Quist", "relation": "Birth City", "value": "Lima", "prompt": "Zora Quist was born in"}]
    (root / "unseen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unseen))
    return root


def _run(args):
    res = runner.invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])["metrics"]


def test_forgetting_command_deletes_the_alias_closure_and_leaves_no_residue(world, run_dir, tmp_path):
    out = tmp_path / "forget.json"
    m = _run(["forgetting", "--model", str(run_dir / "lmlm"), "--facts", str(run_dir / "forget.jsonl"),
              "--unseen", str(run_dir / "unseen.jsonl"), "--standard", str(run_dir / "standard"), "--out", str(out)])
    assert m["forgetting_n_facts"] == 6 and m["forgetting_entities"] == 3
    assert m["forgetting_full_kb_answered"] == 1.0 and m["forgetting_full_precision"] >= 0.8  # the facts were there
    # the first person's closure: her alias and the second row it names (both asked as aliases), its facts deleted too
    assert m["forgetting_facts_deleted"] == 8 and m["forgetting_aliases"] == 2
    assert m["forgetting_residue_kb"] == 0.0 and m["forgetting_n_unseen"] == 1
    assert "forgetting_unseen_standard" in m and 0 <= m["forgetting_parametric_leakage"] <= 1
    result = json.loads(out.read_text())
    by_kind = result["records"][0]["by_kind"]
    assert set(by_kind) == {"name", "alias", "misspelling", "transliteration", "relation", "description"}
    assert by_kind["alias"]["n"] == 4 and by_kind["alias"]["kb_entity_answered"] == 0.0
    rows = result["records"][1:]
    assert len(rows) == m["forgetting_n_probes"] and all(r["kb_entity"].get("miss") for r in rows)
    twin = next(r for r in rows if r["kind"] == "alias" and r["query_entity"].startswith("Countess"))
    assert twin["kb_entity"]["miss"] == "no_entity"
    # the KB given is left as it was: the audit deletes from a copy
    kb = KnowledgeBase.open(run_dir / "kb")
    assert kb.lookup(world.people[0][0], "Birth City").value == world.people[0][1]
    kb.close()


def test_the_start_model_tells_leakage_inherited_from_leakage_learned(run_dir):
    """``--start``: the model an LMLM was continued from, asked the forget set's prompts. Given the LMLM's
    own weights, it states with no KB exactly what DEL-OFF states: all of it inherited, none learned."""
    m = _run(["forgetting", "--model", str(run_dir / "lmlm"), "--facts", str(run_dir / "forget.jsonl"),
              "--start", str(run_dir / "lmlm"), "--kinds", "name"])
    assert m["forgetting_start_knew"] == m["forgetting_parametric_leakage"]
    assert m["forgetting_learned_leakage"] == 0.0


def test_forgetting_refuses_bad_input_in_one_line(run_dir, tmp_path):
    base = ["forgetting", "--model", str(run_dir / "lmlm")]
    for args, words in ((base, "--facts FILE or --world DIR"),
                        (base + ["--facts", str(run_dir / "forget.jsonl"), "--kinds", "name,rumour"], "--kinds takes"),
                        (base + ["--world", str(tmp_path)], "not a biography world"),
                        (base + ["--facts", str(run_dir / "forget.jsonl"), "--start", str(tmp_path / "none")],
                         "none"),
                        (["forgetting", "--model", str(run_dir / "standard"), "--facts", str(run_dir / "forget.jsonl")],
                         "Standard checkpoint")):
        res = runner.invoke(eval_app, args)
        assert res.exit_code == 2 and words in res.output, res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\"entity\": \"Ada\"}\n")
    res = runner.invoke(eval_app, base + ["--facts", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl:1: missing relation" in res.output
