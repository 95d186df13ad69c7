"""T-REx: LAMA's file formats, the cloze prompt, exact match / precision@1 by hand, a tiny LMLM end to end."""

from __future__ import annotations

import json

import pytest
from eval_support import DictKB, ScriptedGenerator

from lmlm.evaluate.cloze import content_words, match_first_content_words
from lmlm.evaluate.trex import cloze_prompt, read_trex, score_trex, trex_eval
from lmlm.generate import LookupGenerator

# three records as LAMA writes them: evidences (T-REx release), masked_sentences (LAMA's loader), masked_sentence
LAMA = [
    {"uuid": "a1", "obj_uri": "Q90", "obj_label": "Paris", "sub_uri": "Q1", "sub_label": "Ada Lind",
     "predicate_id": "P19", "evidences": [
         {"masked_sentence": "[MASK] is where Ada Lind was born.", "obj_surface": "Paris"},
         {"masked_sentence": "Ada Lind was born in [MASK] .", "obj_surface": "Paris"}]},
    {"uuid": "a2", "obj_label": "actor", "sub_label": "Jaideep Sahni", "predicate_id": "P106",
     "masked_sentences": ["Jaideep Sahni (born 1968) is an Indian [MASK]."]},
    {"uuid": "a3", "obj_label": "Oslo", "sub_label": "Bram Moss", "predicate_id": "P19",
     "masked_sentence": "Bram Moss was born in [MASK], a city in the north."},
]


def _write(tmp_path, records=LAMA, name="P19.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_cloze_prompt():
    assert cloze_prompt("Jaideep Sahni (born 1968) is an Indian [MASK] .") == "Jaideep Sahni (born 1968) is an Indian"
    assert cloze_prompt("X was born in [MASK].") == "X was born in"
    assert cloze_prompt("[MASK] is the capital.") is None  # nothing to the left
    assert cloze_prompt("Born in [MASK], a city.") is None
    assert cloze_prompt("Born in [MASK], a city.", left_to_right=False) == "Born in"
    assert cloze_prompt("no mask here") is None


def test_read_trex_formats(tmp_path):
    items = read_trex(_write(tmp_path))
    # a1: the first evidence has [MASK] first, the second is usable; a3 is not left to right
    assert [(i.prompt, i.gold, i.relation, i.uid) for i in items] == [
        ("Ada Lind was born in", "Paris", "P19", "a1"),
        ("Jaideep Sahni (born 1968) is an Indian", "actor", "P106", "a2")]
    loose = read_trex(tmp_path / "P19.jsonl", left_to_right=False)
    assert [i.uid for i in loose] == ["a1", "a2", "a3"] and loose[2].prompt == "Bram Moss was born in"
    assert len(read_trex(tmp_path, limit=1)) == 1  # a folder of relation files
    (tmp_path / "bad.jsonl").write_text('{"sub_label": "x"}\n')
    with pytest.raises(ValueError, match="obj_label"):
        read_trex(tmp_path / "bad.jsonl")


def test_content_words():
    assert content_words("is an Indian actor, and a writer") == ["indian", "actor", "writer"]
    # "is", "the" and "of" are skipped: "United" is the 2nd content word, within 2 but not 1
    assert match_first_content_words(" is the capital of the United States", "United States", 1) is False
    assert match_first_content_words(" is the capital of the United States", "United States", 2) is True
    assert match_first_content_words(" the actor", "actor", 1)
    assert match_first_content_words(" was in the", "the", 5)  # an all-stop-word gold matches on all words
    # "May" is a month, not a stop word: May 27 is not June 27
    assert match_first_content_words(" on June 27, 1960 in Lima", "May 27, 1960") is False
    assert match_first_content_words(" on May 27, 1960 in Lima", "May 27, 1960") is True


def test_exact_match_and_precision_at_1_by_hand():
    from lmlm.evaluate.trex import TrexItem

    items = [TrexItem("p1", "actor"), TrexItem("p2", "Paris"), TrexItem("p3", "New York"), TrexItem("p4", "Oslo")]
    outputs = [" actor and writer.",                       # first content word: EM 1, P@1 1
               " the city of Lyon, near Paris.",          # content words: city lyon near paris -> EM 1, P@1 0
               " a famous big old town in New York",      # famous big old town new: "new york" starts 5th -> EM 1
               " one two three four five Oslo"]           # Oslo is the 6th content word -> EM 0
    s = score_trex(outputs, items)
    assert [x["exact_match"] for x in s] == [True, True, True, False]
    assert [x["precision_at_1"] for x in s] == [True, False, False, False]


def test_read_trex_takes_what_users_bring(tmp_path):
    rec = {"obj_label": "South Michelle", "sub_label": "Du\u0303ng Morris", "predicate_id": "P19",
           "evidences": ["Du\u0303ng\u00a0Morris was born in [MASK] ."]}  # decomposed, a no-break space, a bare string
    path = tmp_path / "P19.jsonl"
    path.write_text("\ufeff" + json.dumps(rec) + "\n", encoding="utf-8")
    (item,) = read_trex(path)
    assert (item.prompt, item.subject) == ("Dũng Morris was born in", "Dũng Morris")
    path.write_text(json.dumps({**rec, "obj_label": None}) + "\n")
    with pytest.raises(ValueError, match=r"P19\.jsonl:1: 'obj_label' is None"):
        read_trex(path)


def test_trex_eval_metrics_by_hand(tmp_path):
    items = read_trex(_write(tmp_path), left_to_right=False)  # 3 items: Paris (P19), actor (P106), Oslo (P19)
    gen = ScriptedGenerator({
        "Ada Lind was born in": "[dblookup('Ada Lind', 'Birth City') -> Paris] Paris.",
        "Jaideep Sahni (born 1968) is an Indian": " film director and actor.",
        "Bram Moss was born in": "[dblookup('Bram Moss', 'Birth City') -> Rome] Rome."})
    records = []
    m = trex_eval(gen, items, records=records)
    assert gen.calls[0]["force_lookup"] is True
    assert m["trex_exact_match"] == pytest.approx(2 / 3)   # Paris, actor (3rd content word)
    assert m["trex_precision_at_1"] == pytest.approx(1 / 3)  # Paris only
    assert m["trex_n"] == 3.0 and m["trex_lookup_found"] == pytest.approx(2 / 3)
    assert m["trex_lookup_answered"] == pytest.approx(2 / 3) and m["trex_lookup_wrong_entity"] == 0
    # a lookup answered about someone else is an answer, not a find
    gen.outputs["Bram Moss was born in"] = "[dblookup('Ada Lind', 'Birth City') -> Paris] Paris."
    m = trex_eval(gen, items)
    assert m["trex_lookup_found"] == pytest.approx(1 / 3) and m["trex_lookup_answered"] == pytest.approx(2 / 3)
    assert m["trex_lookup_wrong_entity"] == 1
    assert m["trex_exact_match_P19"] == 0.5 and m["trex_exact_match_P106"] == 1.0
    assert m["trex_n_P19"] == 2 and m["trex_n_P106"] == 1  # each relation's share is read beside its n
    assert all(k.startswith("trex_") for k in m)
    assert records[0]["output"] == "Paris." and records[0]["lookups"]  # lookups stripped, kept in the record


def _born_in(world, tmp_path, n: int):
    """T-REx items "NAME was born in [MASK]." for the tiny world's first ``n`` people, and an LMLM on its facts."""
    lines = [{"uuid": str(k), "obj_label": city, "sub_label": name, "predicate_id": "P19",
              "masked_sentences": [f"{name} was born in [MASK]."]}
             for k, (name, city, _) in enumerate(world.people[:n])]
    return read_trex(_write(tmp_path, lines)), LookupGenerator(world.model, world.tok, DictKB(world.facts),
                                                               on_miss="skip")


def test_trex_on_a_tiny_lmlm(world, tmp_path):
    """End to end: the forced lookup asks the KB at the masked position; the metrics agree with what a
    reader of the outputs sees (every gold is one city, no stop word)."""
    items, gen = _born_in(world, tmp_path, 12)
    records = []
    m = trex_eval(gen, items, max_new_tokens=16, records=records)
    assert m["trex_n"] == 12
    words = [[w.strip(".,;:!?") for w in r["output"].split()] for r in records]
    first = [bool(w) and w[0] == it.gold for w, it in zip(words, items)]
    anywhere = [it.gold in w for w, it in zip(words, items)]
    assert m["trex_precision_at_1"] == pytest.approx(sum(first) / 12)  # the first word is the answer
    assert sum(first) / 12 <= m["trex_exact_match"] <= sum(anywhere) / 12
    assert m["trex_exact_match"] > 0, "the KB answered some lookups with the gold city"
    for r in records:
        assert "[dblookup" not in r["output"] and "<|db" not in r["output"]
        assert r["lookups"], "a lookup was forced at the mask"


def test_the_answer_budget_is_text_the_calls_come_on_top(world, tmp_path):
    """An LMLM answers in as many tokens of text as a Standard model: its forced call does not eat
    the budget (2 tokens of text here, where the call alone takes more)."""
    items, gen = _born_in(world, tmp_path, 8)
    records = []
    m = trex_eval(gen, items, max_new_tokens=2, records=records)
    assert all(r["lookups"] for r in records)
    assert all(len(world.tok.hf.encode(r["output"], add_special_tokens=False)) <= 2 for r in records)
    assert m["trex_exact_match"] > 0 and all(r["output"].strip() for r in records), records


def test_lookup_found_counts_no_namesake_of_the_paper_key_match(world, tmp_path):
    """Three people deleted from a real KB: the paper's whole-key match answers their queries with a
    namesake's fact ("Ada Lind" -> another Lind's city). Those answers are about someone else, not found,
    though the query named the subject; entity-aware matching answers none of them."""
    from lmlm.kb import KnowledgeBase, Triple

    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()])
    gone = [n for n, _, _ in world.people[:3]]
    for name in gone:
        kb.delete(entity=name)
    facts = [{"obj_label": c, "sub_label": n, "masked_sentences": [f"{n} was born in [MASK] ."]}
             for n, c, _ in world.people[:3]]
    items = read_trex(_write(tmp_path, facts))
    records: list = []
    key = trex_eval(LookupGenerator(world.model, world.tok, kb, matching="key", on_miss="skip"), items,
                    max_new_tokens=4, records=records)
    named = [r for r in records if r["lookups"] and r["lookups"][0]["query_entity"] in gone]
    assert named and all(r["lookups"][0]["found"] and r["lookups"][0]["matched_entity"] not in gone for r in named)
    assert key["trex_lookup_found"] == 0.0 and key["trex_lookup_wrong_entity"] == key["trex_lookup_answered"] * 3
    aware = trex_eval(LookupGenerator(world.model, world.tok, kb, on_miss="skip"), items, max_new_tokens=4)
    assert aware["trex_lookup_answered"] == 0.0 and aware["trex_lookup_wrong_entity"] == 0.0
    kb.close()


@pytest.mark.parametrize("hits,n", [(8, 17), (11, 16), (0, 5), (5, 5), (59, 60), (1, 1)])
def test_the_precision_interval_is_wilsons_as_scipy_computes_it(hits, n):
    """The 95% interval the pipeline's report gives each cloze precision, against scipy's Wilson interval."""
    from scipy.stats import binomtest

    from lmlm.evaluate.base import wilson_interval

    want = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(hits, n)
    assert (low, high) == pytest.approx((want.low, want.high), abs=1e-5)
    assert low <= hits / n <= high and (low == 0) == (hits == 0) and (high == 1) == (hits == n)
