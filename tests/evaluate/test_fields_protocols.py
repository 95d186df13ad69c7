"""The editing and forgetting protocols as one report section (``lmlm.evaluate.protocols``), on the tiny
trained world: KB edits beside FT-L, the audit, the files each writes, the section's Markdown and figure."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import torch

from lmlm.evaluate.forgetting import KINDS, Fact
from lmlm.evaluate.protocols import protocol_lines, run_protocols
from lmlm.kb import KnowledgeBase, Triple
from lmlm.report import plot_protocols

SAY = {"Birth City": ["{} was born in", "{}'s birth city is", "{} is a native of"],
       "Occupation": ["{} works as a", "{}'s job is", "{} is employed as a"]}
PHRASES = SimpleNamespace(phrasings=lambda e, r: [t.format(e) for t in SAY[r]])


def test_kb_edits_beside_ft_l_and_the_audit_on_copies_of_the_kb(world, tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()])
    kb.add_aliases([("Countess " + world.people[0][0].split()[-1], world.people[0][0])])
    version, size = kb.version, len(kb)
    kb.close()
    standard = copy.deepcopy(world.model)
    weights = {k: v.clone() for k, v in standard.state_dict().items()}
    forget = [f for n, c, j in world.people[:2]
              for f in (Fact(n, "Birth City", c, f"{n} was born in"), Fact(n, "Occupation", j, f"{n} works as a"))]
    unseen = [Fact("Zora Quist", "Birth City", "Lima", "Zora Quist was born in")]

    section = run_protocols((world.model, world.tok), tmp_path / "kb", tmp_path / "protocols", facts=world.facts,
                            world=PHRASES, standard=(standard, world.tok), forget=forget, unseen=unseen,
                            edits=[1, 12], weight_edits=[1, 3], sample=12, fluency_n=3, fluency_tokens=16,
                            decoding={"name_bias": 10.0, "copy_bias": 5.0},
                            log=lambda s: None)

    lmlm, ftl = section["editing"]["lmlm"]["rows"], section["editing"]["ft-l"]["rows"]
    assert [r["edits"] for r in lmlm] == [1, 12] and [r["edits"] for r in ftl] == [1, 3]
    twelve = lmlm[-1]
    assert twelve["n_efficacy_accuracy"] == 12 and twelve["n_fluency"] == 3
    # a KB edit moves an answer exactly where the lookup reaches the key: efficacy is the unedited precision
    assert twelve["efficacy_accuracy"] == twelve["unedited_precision"] >= 0.6
    assert twelve["neighborhood_unchanged"] == 1.0
    assert all(torch.equal(standard.state_dict()[k], v) for k, v in weights.items())  # FT-L's edits undone

    fo = section["forgetting"]
    assert fo["n_facts"] == 4 and fo["aliases"] == 1 and fo["residue_kb"] == 0.0 and fo["n_unseen"] == 1
    assert set(fo["by_kind"]) == set(KINDS) and all(r["kb_entity_residue"] == 0.0 for r in fo["by_kind"].values())
    assert fo["full_precision"] >= 0.5 and "unseen_standard" in fo

    # the KB given is left as it was: every edit and delete went to a copy
    kb = KnowledgeBase.open(tmp_path / "kb")
    assert (kb.version, len(kb)) == (version, size)
    assert kb.lookup(world.people[0][0], "Birth City").value == world.people[0][1]
    kb.close()
    # the results files are those of lmlm eval editing and lmlm eval forgetting, the rewrites CounterFact's
    for name, protocol in (("editing-lmlm", "editing"), ("editing-ft-l", "editing"), ("forgetting", "forgetting")):
        doc = json.loads((tmp_path / "protocols" / f"{name}.json").read_text())
        assert doc["protocol"]["name"] == protocol and doc["metrics"] and doc["records"]
    rewrites = json.loads((tmp_path / "protocols" / "counterfact.json").read_text())
    assert len(rewrites) == 12 and {"requested_rewrite", "neighborhood_prompts"} <= set(rewrites[0])

    md = "\n".join(protocol_lines(json.loads(json.dumps(section))))  # as report.json holds it
    assert md.count("| LMLM (KB edit) |") == 2 and md.count("| FT-L (weights, Standard model) |") == 2
    assert "MEMIT 94.7 / 85.8 / 60.5" in md and "| misspelling |" in md
    assert plot_protocols(section, tmp_path / "editing.png") and (tmp_path / "editing.png").stat().st_size > 1000


def test_a_kb_whose_relations_have_one_value_each_is_not_edited_and_says_why(world, tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    facts = {("Ada Lind", "Birth City"): "Oslo", ("Ben Ray", "Occupation"): "baker"}
    kb.add([Triple(e, r, v) for (e, r), v in facts.items()], embed=False)
    kb.close()
    section = run_protocols((world.model, world.tok), tmp_path / "kb", tmp_path / "p", facts=facts, edits=[1],
                            log=lambda s: None)
    assert "single value" in section["editing"]["skipped"] and "forgetting" not in section
    assert "Editing not measured: no fact can be edited" in "\n".join(protocol_lines(section))


def test_the_batch_size_changes_no_greedy_answer_of_the_protocols(world, tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()])
    kb.close()
    forget = [Fact(n, "Birth City", c, f"{n} was born in") for n, c, _ in world.people[:3]]
    sections = [run_protocols((world.model, world.tok), tmp_path / "kb", tmp_path / f"p{size}", facts=world.facts,
                              world=PHRASES, standard=(copy.deepcopy(world.model), world.tok), forget=forget,
                              edits=[12], weight_edits=[3], sample=12, fluency_n=0, batch_size=size,
                              decoding={"name_bias": 10.0, "copy_bias": 5.0}, log=lambda s: None)
                for size in (1, 16)]

    def untimed(rows):  # fluency samples its texts: not a greedy answer
        return [{k: v for k, v in r.items() if "seconds" not in k and "fluency" not in k} for r in rows]

    records = [json.loads((tmp_path / f"p{size}" / "editing-lmlm.json").read_text())["records"] for size in (1, 16)]
    assert untimed(records[0]) == untimed(records[1]) and len(records[0][0]["cases"]) == 12  # each answer, one by one
    for part in ("lmlm", "ft-l"):
        assert untimed(sections[0]["editing"][part]["rows"]) == untimed(sections[1]["editing"][part]["rows"])
    assert sections[0]["forgetting"] == sections[1]["forgetting"]
