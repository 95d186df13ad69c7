"""The fictitious-authors world: TOFU's file layout, nested splits, annotated answers, determinism."""

from __future__ import annotations

import json

import pytest

from lmlm.evaluate.tofu import read_tofu
from lmlm.lookup import Lookup, Text, parse, strip
from lmlm.worlds.tofu import FORGET_PERCENTS, TOFU_RELATIONS, TofuConfig, TofuWorld

REAL = [(f"Person {c}", {"Birth City": city, "University": uni})
        for c, city, uni in zip("ABCDEF", ["Paris", "Oslo", "Lima", "Rome", "Kyiv", "Cairo"],
                                ["U1", "U2", "U3", "U4", "U5", "U6"])]


@pytest.fixture(scope="module")
def world() -> TofuWorld:
    return TofuWorld.generate(TofuConfig(n_authors=40, n_perturbed=3, n_world_facts=5, n_retain_perturbed=20),
                              real_people=REAL)


def test_deterministic(world):
    again = TofuWorld.generate(TofuConfig(n_authors=40, n_perturbed=3, n_world_facts=5, n_retain_perturbed=20),
                               real_people=REAL)
    assert again.qa == world.qa and again.world_statements == world.world_statements
    assert TofuWorld.generate(TofuConfig(n_authors=40, seed=1)).authors != world.authors


def test_nested_forget_splits_from_the_end(world):
    names = [a.name for a in world.authors]
    f1, f5, f10 = (world.forget_authors(p) for p in FORGET_PERCENTS)
    assert (len(f1), len(f5), len(f10)) == (1, 2, 4)                # 1%, 5%, 10% of 40, at least one
    assert set(f1) <= set(f5) <= set(f10) and f10 == names[-4:]
    forget, retain = world.split_qa("forget05"), world.split_qa("retain95")
    assert {q.author for q in forget} == set(f5) and not {q.author for q in retain} & set(f5)
    assert len(forget) + len(retain) == len(world.qa) == 40 * len(TOFU_RELATIONS)
    with pytest.raises(ValueError):
        world.split_qa("forget")


def test_answers_are_annotated_and_perturbations_change_only_the_value(world):
    for q in world.qa[:30]:
        calls = [s for s in q.answer if isinstance(s, Lookup)]
        value = world.authors[[a.name for a in world.authors].index(q.author)].facts[q.relation]
        assert calls == [Lookup(q.author, q.relation, value)]
        assert value in strip(q.answer) and value in strip(q.paraphrased)
        for p in q.perturbed:  # the paraphrase with another value; the call still looks up the truth
            assert [s for s in p if isinstance(s, Lookup)] == calls
            assert strip(p) != strip(q.paraphrased) and value not in strip(p)
            assert strip(p).startswith(strip(q.paraphrased).split(value)[0])
    for q in world.world_qa:  # world facts: plain text, kept in the weights
        assert all(isinstance(s, Text) for s in q.answer)


def test_files_in_tofu_layout(world, tmp_path):
    world.save(tmp_path)
    for name in ["full.json", "retain_perturbed.json", "world_facts_perturbed.json", "real_authors_perturbed.json",
                 *[f"forget{p:02d}{s}.json" for p in FORGET_PERCENTS for s in ("", "_perturbed")],
                 *[f"retain{100 - p}.json" for p in FORGET_PERCENTS]]:
        assert (tmp_path / name).exists(), name
    items = read_tofu(tmp_path / "forget05_perturbed.json")
    assert len(items) == 2 * len(TOFU_RELATIONS) and all(len(it.perturbed_answers) == 3 for it in items)
    it = items[0]
    assert parse(it.annotated_answer).segments and strip(parse(it.annotated_answer).segments) == it.answer
    assert len(it.annotated_perturbed_answers) == 3
    raw = json.loads((tmp_path / "forget05.json").read_text())[0]
    assert set(raw) >= {"question", "answer", "paraphrased_answer", "perturbed_answer"}
    real = read_tofu(tmp_path / "real_authors_perturbed.json")
    assert len(real) == 2 * len(REAL) and "Person A" in real[0].question
    again = TofuWorld.load(tmp_path)
    assert again.qa == world.qa and again.real_qa == world.real_qa and again.authors == world.authors
    rows = [json.loads(line) for line in (tmp_path / "documents.jsonl").read_text().splitlines()]
    assert len(rows) == len(world.qa) + len(world.world_statements)
    assert all(r["source"] == "world:tofu" and "[dblookup(" not in r["text"] for r in rows)  # text is plain
    assert any(r["text"].startswith("Question: ") and "[dblookup(" in r["annotated"] for r in rows)


def test_training_text_and_kb_of_a_split(world):
    forget = set(world.forget_authors(5))
    docs = world.documents("retain95")
    text = " ".join(strip(d) for d in docs)
    assert not any(name in text for name in forget)
    assert all(e not in forget for e, _, _ in world.triples("retain95"))
    assert ("Person A", "Birth City", "Paris") in world.triples("full")  # real authors are in every KB


def test_authors_have_last_first_aliases(world, tmp_path):
    pairs = world.aliases()
    assert pairs and all(a == f"{e.rsplit(' ', 1)[1]}, {e.rsplit(' ', 1)[0]}" for a, e in pairs)
    world.save(tmp_path)
    assert len((tmp_path / "aliases.jsonl").read_text().splitlines()) == len(pairs)
