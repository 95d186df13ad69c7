"""KB-grounded biography precision: claims, support, FActScore's length penalty, by hand and end to end."""

from __future__ import annotations

import json
import math

import pytest
from eval_support import DictKB, ScriptedGenerator

from lmlm.evaluate.factscore import (
    World,
    factscore_eval,
    length_penalty,
    lookup_claims,
    read_topics,
    score_claims,
    value_claims,
    world_from_kb,
)
from lmlm.generate import LookupGenerator

WORLD = World([("Ada Lind", "Birth City", "Paris"), ("Ada Lind", "Occupation", "baker"),
               ("Bram Moss", "Birth City", "Oslo"), ("Bram Moss", "Occupation", "pilot"),
               ("Cleo Ray", "Spouse", "Paris Hilton")])


def test_length_penalty():
    assert length_penalty(5) == pytest.approx(math.exp(1 - 10 / 5))
    assert length_penalty(10) == 1.0 and length_penalty(12) == 1.0
    assert length_penalty(0) == 0.0 and length_penalty(3, gamma=0) == 1.0


def test_claims_by_hand():
    text = ("[dblookup('Ada Lind', 'Birth City') -> Paris] Paris. [dblookup('Ada Lind', 'Occupation') -> pilot] "
            "pilot. Her friend [dblookup('Bram Moss', 'Birth City') -> Oslo] Oslo.")
    claims = lookup_claims(text, "Ada Lind")
    assert claims == [("Ada Lind", "Birth City", "Paris"), ("Ada Lind", "Occupation", "pilot")]  # Bram's is not hers
    s = score_claims(claims, "Ada Lind", WORLD)
    assert (s["n_claims"], s["supported"], s["precision"]) == (2, 1, 0.5)
    assert s["score"] == pytest.approx(0.5 * math.exp(1 - 10 / 2))
    # values named in plain text: "Paris Hilton" once (not also "Paris"), the topic's name is no claim
    vc = value_claims("Ada Lind, a baker, met Paris Hilton in Oslo.", "Ada Lind", WORLD)
    assert [v for _, _, v in vc] == ["paris hilton", "baker", "oslo"]
    assert score_claims(vc, "Ada Lind", WORLD, gamma=0)["precision"] == pytest.approx(1 / 3)


def test_factscore_eval_by_hand():
    gen = ScriptedGenerator({
        "Tell me a bio of Ada Lind. Ada Lind is": " a [dblookup('Ada Lind', 'Occupation') -> baker] baker born in "
                                                  "[dblookup('Ada Lind', 'Birth City') -> Paris] Paris.",
        "Tell me a bio of Bram Moss. Bram Moss is": " a [dblookup('Bram Moss', 'Occupation') -> nurse] nurse.",
        "Tell me a bio of Nobody. Nobody is": " unknown."})
    records = []
    m = factscore_eval(gen, ["Ada Lind", "Bram Moss", "Nobody"], WORLD, records=records)
    assert gen.calls[0]["repetition_penalty"] == 1.2 and gen.calls[0]["max_new_tokens"] == 256
    ada, bram = 1.0 * math.exp(1 - 10 / 2), 0.0  # 2 of 2 supported with 2 claims; 0 of 1
    assert m["factscore_score"] == pytest.approx((ada + bram) / 2)
    assert m["factscore_score_no_penalty"] == pytest.approx(0.5)
    assert m["factscore_claims_per_response"] == pytest.approx(1.5)
    assert m["factscore_respond_ratio"] == pytest.approx(2 / 3) and m["factscore_n"] == 3.0
    assert [r["n_claims"] for r in records] == [2, 1, 0]
    values = factscore_eval(gen, ["Ada Lind"], WORLD, claims="values", gamma=0)  # baker, paris in the text
    assert values["factscore_score"] == 1.0
    with pytest.raises(ValueError, match="claims"):
        factscore_eval(gen, ["Ada Lind"], WORLD, claims="atoms")


def test_read_topics(tmp_path):
    (tmp_path / "names.txt").write_text("Ada Lind\n\nBram Moss\n")
    (tmp_path / "prompt_entities.jsonl").write_text(json.dumps({"topic": "Ada Lind"}) + "\n"
                                                    + json.dumps({"input": "Bram Moss"}) + "\n")
    assert read_topics(tmp_path / "names.txt") == read_topics(tmp_path / "prompt_entities.jsonl") == \
        ["Ada Lind", "Bram Moss"]


def test_factscore_on_a_tiny_lmlm(world):
    kb = DictKB(world.facts)
    names = [n for n, _, _ in world.people[:6]]
    gen = LookupGenerator(world.model, world.tok, kb)
    records = []
    m = factscore_eval(gen, names, world_from_kb(kb), prompt="{name} was born in", max_new_tokens=24,
                       records=records)
    answered = [r for r in records if r["n_claims"]]
    assert m["factscore_respond_ratio"] == pytest.approx(len(answered) / 6)
    if answered:
        assert m["factscore_score"] == pytest.approx(sum(r["score"] for r in answered) / len(answered))
        # every lookup about the topic was answered by the KB that is the world: all supported
        assert all(r["supported"] == r["n_claims"] for r in answered)
