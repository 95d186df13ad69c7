"""KB-grounded biography precision: relation-aware claims, support, FActScore's length penalty, by hand and end to end."""

from __future__ import annotations

import json
import math

import pytest
from eval_support import DictKB, ScriptedGenerator

from lmlm.evaluate.factscore import (
    FACTSCORE,
    Claim,
    ClaimPatterns,
    World,
    factscore_eval,
    length_penalty,
    lookup_claims,
    read_topics,
    score_claims,
    text_claims,
    world_from_kb,
)
from lmlm.generate import LookupGenerator
from lmlm.worlds.bios import BiosWorld

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
    assert claims == [Claim("Ada Lind", "Birth City", "Paris"), Claim("Ada Lind", "Occupation", "pilot")]  # not Bram's
    s = score_claims(claims, "Ada Lind", WORLD)
    assert (s["n_claims"], s["supported"], s["precision"]) == (2, 1, 0.5)
    assert s["score"] == pytest.approx(0.5 * math.exp(1 - 10 / 2))


PATTERNS = ClaimPatterns(["{subject} was born in {Birth City}.", "{subject} works as a {Occupation}.",
                          "{subject} was born in {Birth City} and works as a {Occupation}.",
                          "{subject} married {Spouse}."])


def test_text_claims_are_relation_aware():
    # the relation is the one the sentence states: Oslo is a value of the world, but not Ada's birth city
    claims = text_claims("Ada Lind was born in Oslo. She works as a baker.", "Ada Lind", WORLD, PATTERNS)
    assert claims == [Claim("Ada Lind", "Birth City", "oslo"), Claim("Ada Lind", "Occupation", "baker")]
    s = score_claims(claims, "Ada Lind", WORLD, gamma=0)
    assert s["supported_each"] == [False, True]
    # a value under another relation is no support: Paris is her city, not her job
    assert score_claims([Claim("Ada Lind", "Occupation", "paris")], "Ada Lind", WORLD)["supported"] == 0
    # longest value first: "Paris Hilton", not "Paris"; a sentence stating no fact makes no claim
    claims = text_claims("Cleo Ray married Paris Hilton. She is a lifelong fan of Paris.", "Cleo Ray", WORLD, PATTERNS)
    assert claims == [Claim("Cleo Ray", "Spouse", "paris hilton")]


def test_invented_values_are_unsupported_claims():
    claims = text_claims("Ada Lind was born in Zyxtown. She works as a baker.", "Ada Lind", WORLD, PATTERNS)
    assert claims[0] == Claim("Ada Lind", "Birth City", "zyxtown", invented=True)
    s = score_claims(claims, "Ada Lind", WORLD, gamma=0)
    assert (s["n_claims"], s["supported"], s["invented"]) == (2, 1, 1)
    # a value after another value's cue: "born in X and works as a Y"
    claims = text_claims("Ada Lind was born in Paris and works as a juggler.", "Ada Lind", WORLD, PATTERNS)
    assert claims == [Claim("Ada Lind", "Birth City", "paris"), Claim("Ada Lind", "Occupation", "juggler", True)]


def test_training_documents_are_read_exactly():
    """Every genuine training biography states only true facts: each one is found under its relation,
    all supported, and filler sentences ("a lifelong fan of jazz music") make no claim."""
    world = BiosWorld.generate("smoke")
    truth = World([(p.name, r, v) for p in world.people for r, v in p.facts.items()])
    patterns = ClaimPatterns()
    for doc in world.train_documents + world.heldout_documents:
        claims = patterns.claims(doc.plain, doc.person, truth)
        stated = {(lk.relation, " ".join(lk.value.lower().replace(",", " ").replace("-", " ").split()))
                  for lk in doc.lookups}
        assert {(c.relation, c.value) for c in claims} == stated, doc.plain
        assert score_claims(claims, doc.person, truth)["supported"] == len(claims)
    # the employer's city is no birth city: "born in X" with X where the person works is unsupported
    p = next(p for p in world.people if p.facts["Birth City"] != p.facts["Employer City"])
    s = score_claims(patterns.claims(f"{p.name} was born in {p.facts['Employer City']}.", p.name, truth), p.name, truth)
    assert (s["n_claims"], s["supported"]) == (1, 0)


def test_factscore_eval_by_hand():
    assert FACTSCORE.primary == "factscore_score_no_penalty"  # comparable with the paper: reported first
    gen = ScriptedGenerator({
        "Tell me a bio of Ada Lind. Ada Lind is": " a [dblookup('Ada Lind', 'Occupation') -> baker] baker born in "
                                                  "[dblookup('Ada Lind', 'Birth City') -> Paris] Paris.",
        "Tell me a bio of Bram Moss. Bram Moss is": " a [dblookup('Bram Moss', 'Occupation') -> nurse] nurse.",
        "Tell me a bio of Nobody. Nobody is": " unknown."})
    records = []
    m = factscore_eval(gen, ["Ada Lind", "Bram Moss", "Nobody"], WORLD, records=records)
    assert list(m)[0] == "factscore_score_no_penalty"
    assert gen.calls[0]["repetition_penalty"] == 1.2 and gen.calls[0]["max_new_tokens"] == 256
    ada, bram = 1.0 * math.exp(1 - 10 / 2), 0.0  # 2 of 2 supported with 2 claims; 0 of 1
    assert m["factscore_score"] == pytest.approx((ada + bram) / 2)
    assert m["factscore_score_no_penalty"] == pytest.approx(0.5)
    assert m["factscore_claims_per_response"] == pytest.approx(1.5)
    assert m["factscore_respond_ratio"] == pytest.approx(2 / 3) and m["factscore_n"] == 3.0
    assert [r["n_claims"] for r in records] == [2, 1, 0]
    # read from the text, the prompt's "Ada Lind is" included: "a baker born in Paris" states one fact here
    text = factscore_eval(gen, ["Ada Lind"], WORLD, claims="text", gamma=0, patterns=ClaimPatterns(
        ["{subject} is a {Occupation} born in {Birth City}.", "{subject} was born in {Birth City}."]))
    assert text["factscore_score_no_penalty"] == 1.0 and text["factscore_claims_per_response"] == 2.0
    with pytest.raises(ValueError, match="claims"):
        factscore_eval(gen, ["Ada Lind"], WORLD, claims="values")


def test_precision_split_by_stated_facts():
    world = World([("Ada Lind", "Birth City", "Paris"), ("Ada Lind", "Occupation", "baker")],
                  stated=[("Ada Lind", "Birth City")])
    gen = ScriptedGenerator({"Tell me a bio of Ada Lind. Ada Lind is": " born in Paris. She works as a pilot."})
    m = factscore_eval(gen, ["Ada Lind"], world, claims="text", gamma=0, patterns=ClaimPatterns(
        ["{subject} is born in {Birth City}.", "{subject} works as a {Occupation}."]))
    assert m["factscore_precision_stated"] == 1.0 and m["factscore_claims_stated"] == 1.0
    assert m["factscore_precision_kb_only"] == 0.0 and m["factscore_claims_kb_only"] == 1.0
    # a topic the world does not hold: its claims are unsupported, and neither stated nor KB-only
    gen.outputs["Tell me a bio of Zed Quill. Zed Quill is"] = " born in Paris. He works as a pilot."
    m = factscore_eval(gen, ["Ada Lind", "Zed Quill"], world, claims="text", gamma=0, patterns=ClaimPatterns(
        ["{subject} is born in {Birth City}.", "{subject} works as a {Occupation}."]))
    assert m["factscore_claims_stated"] == 1.0 and m["factscore_claims_kb_only"] == 1.0


def test_read_topics(tmp_path):
    (tmp_path / "names.txt").write_text("Ada Lind\n\nBram Moss\n")
    (tmp_path / "prompt_entities.jsonl").write_text(json.dumps({"topic": "Ada Lind"}) + "\n"
                                                    + json.dumps({"input": "Question: Tell me a bio of Bram Moss."})
                                                    + "\n")
    assert read_topics(tmp_path / "names.txt") == read_topics(tmp_path / "prompt_entities.jsonl") == \
        ["Ada Lind", "Bram Moss"]


def test_factscore_on_a_tiny_lmlm(world):
    kb = DictKB(world.facts)
    names = [n for n, _, _ in world.people]
    gen = LookupGenerator(world.model, world.tok, kb)
    records = []
    # no repetition penalty: it keeps this tiny model from copying the topic's name into its query
    m = factscore_eval(gen, names, world_from_kb(kb), prompt="{name} was born in", max_new_tokens=24,
                       repetition_penalty=1.0, records=records)
    answered = [r for r in records if r["n_claims"]]
    assert len(answered) >= 3, "the trained model looks some of its topics up"
    assert m["factscore_respond_ratio"] == pytest.approx(len(answered) / len(names))
    assert m["factscore_score"] == pytest.approx(sum(r["score"] for r in answered) / len(answered))
    # every lookup about the topic was answered by the KB that is the world: all supported
    assert all(r["supported"] == r["n_claims"] for r in answered)
