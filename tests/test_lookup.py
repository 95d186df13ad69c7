"""The lookup grammar: round trips, malformed input kept as text, both surface forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmlm.lookup import (
    PAPER_TOKENS, RELEASED_TOKENS, Lookup, LookupSyntaxError, LookupTokens, Text, convert, parse, plain_text,
    render, strip,
)

# Field text: anything printable, including quotes, commas, parentheses, brackets, backslashes and
# unicode, but no leading/trailing whitespace and no lookup markers (those make a call invalid).
_field = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20,
).map(str.strip).filter(lambda s: s and not any(t in s for t in PAPER_TOKENS.as_list()))
_plain = st.text(max_size=30).filter(
    lambda s: "[dblookup(" not in s and not any(t in s for t in PAPER_TOKENS.as_list()))


@st.composite
def _documents(draw):
    segs = []
    for _ in range(draw(st.integers(0, 4))):
        segs.append(Text(draw(_plain)))
        segs.append(Lookup(draw(_field), draw(_field), draw(_field)))
    segs.append(Text(draw(_plain)))
    return [s for s in segs if not (isinstance(s, Text) and s.text == "")]


def _merged(segs):
    out = []
    for s in segs:
        if out and isinstance(s, Text) and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + s.text)
        else:
            out.append(s)
    return out


@settings(max_examples=300, deadline=None)
@given(_documents())
def test_dblookup_round_trip(segs):
    text = render(segs)
    parsed = parse(text)
    assert parsed.problems == []
    assert parsed.segments == _merged(segs)
    assert render(parsed.segments) == text


@settings(max_examples=300, deadline=None)
@given(_documents())
def test_token_form_round_trip(segs):
    # token form separates fields by spaces, so values that are only whitespace-safe survive
    text = render(segs, form="tokens")
    parsed = parse(text, form="tokens")
    assert parsed.problems == []
    assert render(parsed.segments, form="tokens") == text


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(list("ab '\"\\[]()->,") + ["[dblookup(", "<|db_start|>", "<|sep|>",
                                                               "<|db_retrieve|>", "<|db_end|>", "é"]),
                max_size=40).map("".join))
def test_parse_never_loses_text(text):
    for form in ("auto", "dblookup", "tokens"):
        parsed = parse(text, form=form)  # never raises in lenient mode
        spans = [s.span for s in parsed.segments]
        # the spans tile the input exactly, in order
        assert "".join(text[a:b] for a, b in spans) == text
        assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
        for p in parsed.problems:
            assert 0 <= p.position < len(text)
        if parsed.problems:
            with pytest.raises(LookupSyntaxError):
                parse(text, form=form, strict=True)


def test_apostrophes_unicode_and_commas():
    seg = Lookup("Conan O'Brien", "Birth Place (city)", "Brookline, Massachusetts")
    text = "Born in " + render([seg]) + " Brookline, Massachusetts."
    assert "O\\'Brien" in text
    parsed = parse(text)
    assert parsed.lookups == [seg]
    assert parsed.strip() == "Born in Brookline, Massachusetts."
    uni = parse("[dblookup('Beyoncé Knowles-Carter', 'Birth Date') -> September 4, 1981] September 4, 1981")
    assert uni.lookups[0].entity == "Beyoncé Knowles-Carter"
    dq = parse('x [dblookup("O\'Brien", "Job") -> host] host')
    assert dq.lookups == [Lookup("O'Brien", "Job", "host")]


def test_malformed_calls_are_reported_and_kept():
    text = "A [dblookup('Ada', 'Born') -> ] B [dblookup('Ada' 'x') -> y] C [dblookup('unterminated"
    parsed = parse(text)
    assert parsed.lookups == []
    assert strip(parsed.segments) == text
    reasons = [p.reason for p in parsed.problems]
    assert len(reasons) == 3
    assert "empty value" in reasons[0]
    assert [p.position for p in parsed.problems] == [text.index("[dbl"), text.index("[dbl", 5),
                                                     text.rindex("[dbl")]
    with pytest.raises(LookupSyntaxError, match="line 3"):
        parse(text, strict=True, source="corpus.jsonl line 3")


def test_token_form_and_conversion():
    text = "Napoleon was born on [dblookup('Napoleon', 'Birth Date') -> August 15, 1769] August 15, 1769."
    tok = convert(text, "tokens")
    assert tok == ("Napoleon was born on <|db_start|> Napoleon <|sep|> Birth Date <|db_retrieve|> "
                   "August 15, 1769 <|db_end|> August 15, 1769.")
    assert convert(tok, "dblookup") == text
    released = render(parse(text).segments, form="tokens", tokens=RELEASED_TOKENS)
    assert "<|db_entity|> Napoleon <|db_relationship|> Birth Date <|db_return|>" in released
    assert parse(released, tokens=RELEASED_TOKENS).lookups == parse(text).lookups
    bad = parse("x <|sep|> y <|db_start|> a <|sep|> b")
    assert bad.lookups == [] and len(bad.problems) == 2
    assert strip(bad.segments) == "x <|sep|> y <|db_start|> a <|sep|> b"


def test_strip_drops_the_space_that_belongs_to_the_call():
    parsed = parse("born [dblookup('A', 'Birth Date') -> 1990] 1990 in [dblookup('A', 'City') -> Rome] Rome")
    plain, positions = plain_text(parsed.segments)
    assert plain == "born 1990 in Rome"
    assert positions == [5, 13]


def test_token_vocabulary_validation():
    with pytest.raises(ValueError, match="distinct"):
        LookupTokens("<a>", "<a>", "<b>", "<c>")
    with pytest.raises(ValueError, match="unknown lookup token vocabulary"):
        LookupTokens.from_name("nope")
    assert LookupTokens.from_name("released") == RELEASED_TOKENS
