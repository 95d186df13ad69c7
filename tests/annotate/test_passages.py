"""Passages: a document no longer than the limit is one piece; a longer one is cut where its text allows."""

import random

from lmlm.annotate.passages import cover_passages

WRAPPED = ("Marie Curie was a physicist and chemist who was\nborn in Warsaw in 1867 and studied at the\n"
           "University of Paris.")


def test_a_short_hard_wrapped_document_is_one_passage():
    assert cover_passages(WRAPPED, 1000) == [WRAPPED]
    assert cover_passages("Title\n\nAda was born in 1815.", 100) == ["Title\n\nAda was born in 1815."]


def test_a_long_document_is_cut_at_blank_lines_then_sentence_ends_never_into_tiny_pieces():
    para = "Ada was born\nin London in 1815. She wrote\nthe first program. " * 2
    text = para + "\n\n" + para
    pieces = cover_passages(text, len(para) + 10)
    assert pieces == [para + "\n\n", para]
    pieces = cover_passages(para, 70)  # no blank line: sentence ends, not the line breaks inside sentences
    assert pieces == ["Ada was born\nin London in 1815. She wrote\nthe first program. ",
                      "Ada was born\nin London in 1815. She wrote\nthe first program. "]
    rng = random.Random(0)
    for _ in range(500):
        t = "".join(rng.choice("ab .\n\nA") for _ in range(rng.randint(1, 300)))
        m = rng.randint(1, 60)
        pieces = cover_passages(t, m)
        assert "".join(pieces) == t and all(0 < len(p) <= m for p in pieces)
