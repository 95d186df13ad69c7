"""Token roles: one encoding for labels, perplexities and the generator; org tokens match Standard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmlm.lookup import Lookup, Text, parse, strip
from lmlm.tokens import (
    CALL, ENTITY, IGNORE_INDEX, ORG, RELATION, VALUE, LookupTokenizer, labels_from_roles, load_tokenizer, train_bpe,
)

DOC = ("Napoleon was born on [dblookup('Napoleon', 'Birth Date') -> August 15, 1769] August 15, 1769. "
       "Conan O'Brien studied at [dblookup('Conan O\\'Brien', 'University') -> Harvard] Harvard.")


@pytest.fixture(scope="module")
def bpe() -> LookupTokenizer:
    texts = [strip(parse(DOC).segments)] * 3 + ["The quick brown fox jumps over the lazy dog."] * 3
    return LookupTokenizer(train_bpe(texts, vocab_size=400, min_frequency=1))


def _check(tok: LookupTokenizer, text: str):
    segs = parse(text).segments
    enc = tok.encode(segs)
    assert len(enc.input_ids) == len(enc.roles)
    org = [i for i, r in zip(enc.input_ids, enc.roles) if r == ORG]
    assert org == tok.encode_plain(strip(segs)).input_ids
    assert enc.input_ids[0] == tok.doc_id
    # call markers carry the CALL role and appear in order start, sep, retrieve, end
    markers = [i for i, r in zip(enc.input_ids, enc.roles) if r == CALL]
    assert markers == list(tok.call_ids) * len(parse(text).lookups)
    # the value tokens are exactly what the generator forces after <|db_retrieve|>
    for lk in parse(text).lookups:
        cont = tok.value_continuation(lk.value)
        ids = enc.input_ids
        starts = [k for k in range(len(ids)) if ids[k:k + len(cont)] == cont]
        assert starts and all(ids[k - 1] == tok.retrieve_id for k in starts[:1])
    labels = labels_from_roles(enc.input_ids, enc.roles, tok.end_id)
    for t, r, lab in zip(enc.input_ids, enc.roles, labels):
        masked = r == VALUE or t == tok.end_id
        assert (lab == IGNORE_INDEX) == masked
    assert tok.decode_segments(enc.input_ids) == parse(text).segments
    return enc


def test_roles_with_trained_bpe(bpe):
    enc = _check(bpe, DOC)
    roles = set(enc.roles)
    assert roles == {ORG, CALL, ENTITY, RELATION, VALUE}


@pytest.mark.parametrize("name", ["gpt2", "llama2"])
def test_roles_with_paper_tokenizers(shared_data, name):
    tok = load_tokenizer(shared_data / "tokenizers" / name)
    assert len(tok) == {"gpt2": 50261, "llama2": 32004}[name]
    _check(tok, DOC)
    _check(tok, "[dblookup('Ada', 'Birth City') -> London] London is where Ada was born.")


_word = st.text(alphabet="abcdefgh XYZé'", min_size=1, max_size=8).map(str.strip).filter(bool)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_word, _word, _word, st.sampled_from([" ", ". ", ", "])), min_size=1, max_size=4))
def test_org_tokens_match_standard_for_any_document(bpe, parts):
    segs = []
    for prefix, ent, val, sep in parts:
        segs += [Text(prefix + " "), Lookup(ent, "Rel", val), Text(" " + val + sep)]
    enc = bpe.encode(segs)
    org = [i for i, r in zip(enc.input_ids, enc.roles) if r == ORG]
    assert org == bpe.encode_plain(strip(segs)).input_ids


def test_unfinished_call_decodes_as_text(bpe):
    ids = [bpe.doc_id] + bpe.encode_text("Ada was born in") + [bpe.start_id] + bpe.encode_field("Ada") + [bpe.sep_id]
    segs = bpe.decode_segments(ids)
    assert all(isinstance(s, Text) for s in segs)
    assert "<|db_start|>" in "".join(s.text for s in segs)
