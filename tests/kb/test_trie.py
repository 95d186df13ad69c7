"""The prefix tree of KB keys: paths, walking, and keeping up with adds, edits and deletes."""

from __future__ import annotations

import pytest

from lmlm.kb import Triple
from lmlm.generate.trie import KeyTrie, TokenTrie
from lmlm.tokens import LookupTokenizer, train_bpe


@pytest.fixture(scope="module")
def tok() -> LookupTokenizer:
    text = "Ada Lovelace was born in London. Charles Babbage died in 1871. Alan Turing was a mathematician."
    return LookupTokenizer(train_bpe([text] * 3, vocab_size=300, min_frequency=1))


def _walk(trie: KeyTrie, path) -> bool:
    """Whether every step of ``path`` is allowed by the tree."""
    return all((ids := trie.next_tokens(path[:i])) is not None and path[i] in ids.tolist() for i in range(len(path)))


def test_paths_follow_the_call_layout(kb, tok):
    trie = KeyTrie(kb, tok)
    assert len(trie) == 3 and ("Ada Lovelace", "Birth City") in trie and trie.version == kb.version
    path = trie.path("Ada Lovelace", "Birth City")
    e, r = tok.encode_field("Ada Lovelace"), tok.encode_field("Birth City")
    assert path == (*e, tok.sep_id, *r, tok.retrieve_id)
    assert _walk(trie, path)
    # the root offers the first token of every entity, and nothing else
    firsts = {tok.encode_field(name)[0] for name in ("Ada Lovelace", "Charles Babbage", "Alan Turing")}
    assert set(trie.next_tokens([]).tolist()) == firsts
    # after a whole entity only <|sep|> may follow; off the tree there is no answer
    assert trie.next_tokens(e).tolist() == [tok.sep_id]
    assert trie.next_tokens([tok.end_id]) is None
    assert trie.next_tokens(path) is None  # a finished query has nothing after it
    assert trie.is_prefix(path) and trie.is_prefix(path[:2]) and not trie.is_prefix([tok.end_id])


def test_follows_adds_and_deletes(kb, tok):
    trie = KeyTrie(kb, tok)
    assert not trie.refresh()  # nothing changed
    kb.add([Triple("Ada Lovelace", "Death Year", "1852"), Triple("Grace Hopper", "Employer", "US Navy")])
    assert trie.refresh() and len(trie) == 5
    assert _walk(trie, trie.path("Grace Hopper", "Employer"))
    ada = tok.encode_field("Ada Lovelace")
    relations = {trie.path("Ada Lovelace", r)[len(ada) + 1] for r in ("Birth City", "Death Year")}
    assert set(trie.next_tokens([*ada, tok.sep_id]).tolist()) == relations  # two relations share the entity
    gone = trie.path("Ada Lovelace", "Birth City")
    kb.delete(entity="Ada Lovelace", relation="Birth City", why="test")
    assert trie.refresh() and ("Ada Lovelace", "Birth City") not in trie
    assert not _walk(trie, gone) and _walk(trie, trie.path("Ada Lovelace", "Death Year"))
    death = trie.path("Ada Lovelace", "Death Year")
    kb.delete(entity="Ada Lovelace", why="test")
    assert trie.refresh() and len(trie) == 3 and not _walk(trie, death)
    kb.edit("Alan Turing", "Occupation", "logician")  # a new value, the same key: the tree is unchanged
    assert trie.refresh() and len(trie) == 3 and _walk(trie, trie.path("Alan Turing", "Occupation"))


def test_needs_a_kb(tok):
    with pytest.raises(TypeError, match="keys"):
        KeyTrie(object(), tok)


def test_token_trie_counts_shared_prefixes_and_whole_sequences():
    trie = TokenTrie([(5, 7), (5, 8, 9), (5, 8)])
    assert trie.children(()) == [5] and trie.children((5,)) == [7, 8] and trie.children((5, 8)) == [9]
    assert trie.is_whole((5, 8)) and trie.is_whole((5, 8, 9)) and not trie.is_whole((5,))
    assert trie.children((6,)) == [] and not trie.is_prefix((6,))
    trie.remove((5, 8))  # (5, 8, 9) still passes through: the prefix stays, no longer whole
    assert trie.children((5, 8)) == [9] and not trie.is_whole((5, 8))
    trie.remove((5, 8, 9))
    assert trie.children((5,)) == [7] and trie.next_tokens((5,)).tolist() == [7]
    trie.remove((5, 7))
    assert not trie and trie.next_tokens(()) is None
