"""Validation: one reason per rejected call, the input text never changed, counts in a report."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmlm.annotate.corrupt import KINDS, corrupt_documents, filter_scores
from lmlm.annotate.validate import REASONS, ValidationReport, calls_with_offsets, insert_calls, validate
from lmlm.lookup import Lookup, parse, strip
from lmlm.worlds.bios import BiosWorld

TEXT = "Ada Lovelace was born in London. She studied Mathematics at Cambridge."
GOOD = ("Ada Lovelace was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London. She studied "
        "[dblookup('Ada Lovelace', 'Major') -> Mathematics] Mathematics at "
        "[dblookup('Ada Lovelace', 'University') -> Cambridge] Cambridge.")


def reasons(annotation, text=TEXT, **kw):
    v = validate(text, annotation, **kw)
    assert strip(v.segments) == text
    return [(r.reason, r.at) for r in v.rejected], [(c.relation, at) for c, at in zip(v.kept, v.positions)]


def test_good_annotation_is_kept_as_is():
    v = validate(TEXT, GOOD)
    assert v.annotated == GOOD and not v.rejected and not v.text_changed
    assert v.positions == [25, 45, 60] and TEXT[45:56] == "Mathematics"


def test_each_reason():
    bad = GOOD.replace("'Major') -> Mathematics]", "'Major' -> Mathematics]")  # no closing parenthesis
    assert reasons(bad)[0] == [("malformed", 45)]
    assert reasons(GOOD.replace("-> London]", "-> Paris]"))[0] == [("value_not_after_call", 25)]
    assert reasons(GOOD.replace("('Ada Lovelace', 'Birth City')", "('Charles Babbage', 'Birth City')"))[0] == \
        [("entity_not_in_left_context", 25)]
    look_ahead = "[dblookup('Ada Lovelace', 'Name') -> Ada Lovelace] " + TEXT
    assert reasons(look_ahead)[0] == [("entity_not_in_left_context", 0)]
    call = "[dblookup('Ada Lovelace', 'Birth City') -> London]"
    assert reasons(GOOD.replace(call, call + call))[0] == [("duplicate", 25)]
    # the same key with another value at the same mention: the KB answers one value for a key
    text = "Ada Lovelace was born on 10 December 1815."
    ann = ("Ada Lovelace was born on [dblookup('Ada Lovelace', 'Birth Date') -> 10 December 1815] "
           "[dblookup('ada lovelace', 'birth date') -> 1815] 10 December 1815.")
    assert reasons(ann, text) == ([("duplicate", 25)], [("Birth Date", 25)])


def test_text_changed_keeps_calls_where_the_text_is_intact():
    changed = GOOD.replace("London.", "London, England.")
    rejected, kept = reasons(changed)
    v = validate(TEXT, changed)
    assert v.text_changed and not rejected and [r for r, _ in kept] == ["Birth City", "Major", "University"]
    rewritten = GOOD.replace("studied [dblookup('Ada Lovelace', 'Major') -> Mathematics] Mathematics",
                             "read [dblookup('Ada Lovelace', 'Major') -> Maths] Maths")
    assert ("text_changed", -1) in reasons(rewritten)[0]


def test_values_may_be_lists_and_follow_an_article():
    text = "Bea is a singer, songwriter, and actress who studied at the University of Oslo."
    ann = ("Bea is a [dblookup('Bea', 'Occupation') -> singer, songwriter, actress] singer, songwriter, and actress "
           "who studied at [dblookup('Bea', 'University') -> University of Oslo] the University of Oslo.")
    assert reasons(ann, text) == ([], [("Occupation", 9), ("University", 56)])


def test_token_form_and_code_free_answers():
    tokens = "Ada Lovelace was born in <|db_start|> Ada Lovelace <|sep|> Birth City <|db_retrieve|> London <|db_end|> London."
    v = validate("Ada Lovelace was born in London.", tokens)
    assert [c.value for c in v.kept] == ["London"]



def test_malformed_calls_of_the_token_form_are_rejected(tmp_path):
    import json

    from lmlm.annotate.pipeline import validate_file

    text = "Ada Lovelace was born in London. She died in 1852."
    unclosed = ("Ada Lovelace was born in <|db_start|> Ada Lovelace <|sep|> Birth City <|db_retrieve|> London London. "
                "She died in <|db_start|> Ada Lovelace <|sep|> Death Year <|db_retrieve|> 1852 <|db_end|> 1852.")
    v = validate(text, unclosed)
    assert [(r.reason, r.at) for r in v.rejected] == [("malformed", 25)] and [c.value for c in v.kept] == ["1852"]
    no_entity = text.replace("in 1852", "in <|db_start|> <|sep|> Death Year<|db_retrieve|>1852<|db_end|> 1852")
    stray = text.replace("born in", "born <|sep|> in")
    for ann in (no_entity, stray):
        v = validate(text, ann)
        assert [r.reason for r in v.rejected] == ["malformed"] and not v.kept and not v.text_changed
        assert strip(v.segments) == text
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "a", "text": text, "annotated": unclosed}) + "\n")
    report = validate_file(tmp_path / "a.jsonl", tmp_path / "v")
    assert report["calls"] == 2 and report["kept"] == 1 and report["rejected_by_reason"]["malformed"] == 1
    assert [json.loads(r)["reason"] for r in (tmp_path / "v" / "rejected.jsonl").read_text().splitlines()] == \
        ["malformed"]

def test_insert_calls_places_calls_before_their_words():
    call = Lookup("Ada", "Birth City", "London")
    segs = insert_calls("Ada was born in London.", [(16, call), (16, Lookup("Ada", "Birth Country", "England"))])
    assert strip(segs) == "Ada was born in London."
    assert calls_with_offsets(segs) == [(16, call), (16, Lookup("Ada", "Birth Country", "England"))]
    with pytest.raises(TypeError):
        validate(TEXT, None)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab [](),'->dblookup")), max_size=80))
def test_any_answer_leaves_the_text_unchanged(noise):
    v = validate(TEXT, noise)
    assert strip(v.segments) == TEXT
    assert len(v.kept) == len(v.positions)


def test_validation_removes_damaged_calls_on_a_world():
    world = BiosWorld.generate("smoke")
    docs = [d.segments for d in world.train_documents]
    damaged = corrupt_documents(docs, fraction=0.2, seed=1)
    assert [parse(d.annotated).problems == [] for d in damaged].count(False) > 0
    results = [validate(d.text, d.annotated) for d in damaged]
    scores = filter_scores(damaged, [set(v.positions) for v in results])
    assert scores["kept_clean"] == 1.0
    for kind in ("wrong_entity", "malformed", "value_not_in_text"):
        assert scores["removed"][kind] == 1.0, kind
    assert scores["removed"]["relation_not_inferable"] == 0.0  # left to the corrector
    report = ValidationReport.of(results).to_dict()
    assert set(report["rejected_by_reason"]) == set(REASONS)
    assert report["calls"] == sum(len(d.labels) for d in damaged) and set(KINDS) <= set(scores["removed"])


def test_names_match_in_either_unicode_form():
    """A call writing "Zoë" composed, in a text that writes it decomposed (or the other way round), names
    the entity to its left; a name the text does not hold is still refused."""
    import unicodedata

    for text_form, call_form in (("NFD", "NFC"), ("NFC", "NFD")):
        text = unicodedata.normalize(text_form, "Zoë Kravitz was born in Los Angeles.")
        name = unicodedata.normalize(call_form, "Zoë Kravitz")
        v = validate(text, text.replace("born in ", f"born in [dblookup('{name}', 'Birth City') -> Los Angeles] "))
        assert len(v.kept) == 1 and not v.rejected and not v.text_changed, (text_form, v.rejected)
    wrong = "born in [dblookup('Chloë Sevigny', 'Birth City') -> Los Angeles] "
    other = validate(text, text.replace("born in ", wrong))
    assert [r.reason for r in other.rejected] == ["entity_not_in_left_context"]
