"""PopQA: the official tsv / JSON columns, completion prompts, answer matching by hand, FanOutQA's dev set."""

from __future__ import annotations

import csv
import json

import pytest
from eval_support import DictKB, ScriptedGenerator

from lmlm.evaluate.popqa import (
    answer_in_output,
    completion_prompt,
    normalize_answer,
    popqa_eval,
    read_fanoutqa,
    read_popqa,
    read_qa,
)
from lmlm.generate import LookupGenerator

COLUMNS = ["id", "subj", "prop", "obj", "subj_id", "prop_id", "obj_id", "s_aliases", "o_aliases", "s_uri", "o_uri",
           "s_wiki_title", "o_wiki_title", "s_pop", "o_pop", "question", "possible_answers"]
ROWS = [
    dict(id="4222362", subj="George Rankin", prop="occupation", obj="politician", s_wiki_title="George Rankin",
         s_pop="142", question="What is George Rankin's occupation?",
         possible_answers='["politician", "political leader", "political figure"]'),
    dict(id="1", subj="Ufa", prop="capital of", obj="Bashkortostan", s_wiki_title="Ufa", s_pop="37",
         question="What is Ufa the capital of?", possible_answers='["Bashkortostan", "Republic of Bashkortostan"]'),
    dict(id="2", subj="Ada Lind", prop="place of birth", obj="Paris", s_wiki_title="Ada_Lind", s_pop="5",
         question="In what city was Ada Lind born?", possible_answers='["Paris"]'),
]


def _tsv(tmp_path, rows=ROWS):
    path = tmp_path / "test.tsv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, delimiter="\t", restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def test_normalize_and_match():
    assert normalize_answer("The Beatles, 1,200 times!") == "beatles 1200 times"
    assert answer_in_output(" the Republic of Bashkortostan.", ["Bashkortostan"])
    assert not answer_in_output(" Romeo and Juliet", ["Rome"])  # word boundaries
    assert answer_in_output(" born in 1,969 or so", ["1969"])
    assert not answer_in_output(" anything", ["", "the"])  # empty after normalization: never matches


def test_completion_prompt():
    assert completion_prompt("What is Ufa the capital of?", "capital of", "Ufa") == \
        "What is Ufa the capital of? Ufa is the capital of"  # the paper's example
    assert completion_prompt("Who knows?", "unknown relation", "X") == "Who knows? The answer is"


def test_read_popqa_tsv_and_jsonl(tmp_path):
    items = read_popqa(_tsv(tmp_path))
    assert [it.answers for it in items] == [("politician", "political leader", "political figure"),
                                           ("Bashkortostan", "Republic of Bashkortostan"), ("Paris",)]
    assert items[0].prompt == "What is George Rankin's occupation? George Rankin's occupation is"
    assert items[2].prompt == "In what city was Ada Lind born? Ada Lind was born in"
    assert [it.uid for it in read_popqa(tmp_path / "test.tsv", max_popularity=100)] == ["1", "2"]  # long tail
    jl = tmp_path / "popqa.jsonl"
    jl.write_text("".join(json.dumps({**r, "possible_answers": json.loads(r["possible_answers"])}) + "\n"
                          for r in ROWS))
    assert [it.answers for it in read_qa(jl)] == [it.answers for it in items]  # a real list works too
    jl.write_text(json.dumps({"question": "Q?", "possible_answers": '["a"]', "prompt": "My own rewrite:"}) + "\n")
    assert read_popqa(jl)[0].prompt == "My own rewrite:"
    jl.write_text('{"question": "Q?"}\n')
    with pytest.raises(ValueError, match="possible_answers"):
        read_popqa(jl)


def test_readers_take_what_users_bring_and_name_what_they_cannot(tmp_path):
    """A BOM, a name in decomposed Unicode or with a no-break space reads as the name; a row that
    cannot be an item is named by file and line, never scored."""
    nfd = {**ROWS[2], "subj": "Dũng Morris".replace("ũ", "u\u0303"),
           "question": "In what city was Dũng\u00a0Morris born?"}
    path = _tsv(tmp_path, [nfd])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))  # Excel's UTF-8 CSV, CRLF
    (item,) = read_popqa(path)
    assert item.subject == "Dũng Morris" and item.prompt == "In what city was Dũng Morris born? Dũng Morris was born in"
    jl = tmp_path / "p.jsonl"
    jl.write_text('\ufeff{"question": "Q?", "possible_answers": ["a"]}\n{"question": "Q?", possible_answers: 1}\n',
                  encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:2: not a JSON line"):
        read_popqa(jl)
    for row, msg in (({**ROWS[2], "s_pop": "n/a"}, r"test\.tsv:2: could not convert"),
                     ({**ROWS[2], "possible_answers": '["Paris"'}, r"test\.tsv:2: possible_answers .* not a JSON list"),
                     ({**ROWS[2], "possible_answers": "[]"}, r"test\.tsv:2: no possible answer")):
        with pytest.raises(ValueError, match=msg):
            read_popqa(_tsv(tmp_path, [row]))
    short = _tsv(tmp_path, ROWS[:1])
    short.write_text(short.read_text() + "7\tX\toccupation\n")  # a row of 3 cells under 17 columns
    with pytest.raises(ValueError, match=r"test\.tsv:3: the row's cells do not match the header's 17 columns"):
        read_popqa(short)
    comma = tmp_path / "tabs.csv"
    comma.write_text(_tsv(tmp_path).read_text())  # tab-separated text under .csv
    with pytest.raises(ValueError, match="tab-separated"):
        read_popqa(comma)


def test_popqa_eval_by_hand(tmp_path):
    items = read_popqa(_tsv(tmp_path))
    gen = ScriptedGenerator({
        items[0].prompt: " a retired political leader.",                                    # alias: correct
        items[1].prompt: " [dblookup('Ufa', 'Capital Of') -> Bashkortostan] Bashkortostan.",  # correct
        items[2].prompt: " [dblookup('Ada Lind', 'Birth City') -> Paris] Lyon."})            # lookup stripped: wrong
    records = []
    m = popqa_eval(gen, items, records=records)
    assert m["popqa_accuracy"] == pytest.approx(2 / 3) and m["popqa_n"] == 3.0
    assert m["popqa_accuracy_place_of_birth"] == 0.0 and m["popqa_accuracy_capital_of"] == 1.0
    assert sum(v for k, v in m.items() if k.startswith("popqa_n_")) == 3 and m["popqa_n_capital_of"] >= 1
    assert m["popqa_lookup_found"] == pytest.approx(2 / 3)
    assert [r["correct"] for r in records] == [True, True, False] and records[2]["output"] == " Lyon."


FANOUT = [{"id": "q1", "question": "What is the batting hand of each of the first two picks?", "categories": [],
           "answer": {"Pat Burrell": "Right", "Mark Mulder": "Left"},
           "decomposition": [
               {"id": "s1", "question": "Who were the first 2 picks?", "decomposition": [], "depends_on": [],
                "answer": ["Pat Burrell", "Mark Mulder"], "evidence": {"title": "1998 MLB draft"}},
               {"id": "s2", "question": "What is the batting hand of Pat Burrell?", "decomposition": [],
                "answer": "Right", "depends_on": ["s1"], "evidence": {"title": "Pat Burrell"}},
               {"id": "s3", "question": "Nested?", "answer": None, "decomposition": [
                   {"id": "s4", "question": "How tall is Mark Mulder in m?", "decomposition": [], "answer": 1.98,
                    "evidence": {"title": "Mark Mulder"}},
                   {"id": "s5", "question": "Is Mark Mulder left-handed?", "decomposition": [], "answer": True}]}]}]


def test_read_fanoutqa_fixture(tmp_path):
    path = tmp_path / "fanout-final-dev.json"
    path.write_text(json.dumps(FANOUT))
    items = read_qa(path)  # told from the file: FanOutQA
    assert [(it.uid, it.answers, it.subject) for it in items] == [
        ("s1", ("Pat Burrell", "Mark Mulder"), "1998 MLB draft"), ("s2", ("Right",), "Pat Burrell"),
        ("s4", ("1.98",), "Mark Mulder"), ("s5", ("yes",), "")]
    assert items[1].prompt == "What is the batting hand of Pat Burrell? The answer is"


def test_read_fanoutqa_dev(shared_data):
    items = read_fanoutqa(shared_data / "fanoutqa" / "fanout-final-dev.json")
    assert 2050 <= len(items) <= 2200  # about 2,100 single-hop questions with answers
    assert len({it.uid for it in items}) == len(items) and all(it.answers and it.question for it in items)


def test_popqa_on_a_tiny_lmlm(world, tmp_path):
    rows = [dict(id=str(k), subj=name, prop="place of birth", obj=city, s_pop="3",
                 question=f"In what city was {name} born?", possible_answers=json.dumps([city]))
            for k, (name, city, _) in enumerate(world.people[:8])]
    items = read_popqa(_tsv(tmp_path, rows))
    gen = LookupGenerator(world.model, world.tok, DictKB(world.facts))
    records = []
    m = popqa_eval(gen, items, max_new_tokens=12, records=records)
    assert m["popqa_n"] == 8
    assert m["popqa_accuracy"] == pytest.approx(sum(answer_in_output(r["output"], r["answers"]) for r in records) / 8)
    assert all("<|db" not in r["output"] for r in records)
