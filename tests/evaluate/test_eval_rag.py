"""The RAG baseline: passages, BM25 retrieval on a tiny corpus, the paper's prompt, the context budget."""

from __future__ import annotations

import bm25s  # noqa: F401  (a declared dependency: a broken install fails here, it is not skipped)
import pytest

from lmlm.evaluate.rag import (
    RAG_TEMPLATE,
    BM25Retriever,
    RagGenerator,
    corpus_passages,
    rag_training_documents,
)
from lmlm.evaluate.trex import TrexItem, trex_eval  # noqa: E402
from lmlm.generate import LookupGenerator  # noqa: E402

CORPUS = ["Ada Lind was born in Paris. She works as a baker.", "Bram Moss was born in Oslo. He flies planes as a pilot.",
          "The weather was mild that spring.", "Cleo Lind works as a nurse in Lima."]


def test_passages_keep_sentences_whole():
    assert corpus_passages(["a b c. d e f. g h"], words=6) == ["a b c. d e f.", "g h"]
    assert corpus_passages(["one two three four five"], words=2) == ["one two", "three four", "five"]
    with pytest.raises(ValueError):
        corpus_passages(["x"], words=0)


def test_bm25_finds_the_passage_about_the_query():
    r = BM25Retriever(CORPUS)
    hits = r.retrieve(["Where was Bram Moss born?", "Ada Lind was born in", "zzz"], k=2)
    assert hits[0][0][0] == CORPUS[1] and hits[1][0][0] == CORPUS[0]
    assert hits[0][0][1] > hits[0][1][1] if len(hits[0]) > 1 else True
    assert hits[2] == []                                                  # no word in common: nothing retrieved


def test_rag_prompt_and_context_budget(world):
    gen = LookupGenerator(world.model, world.tok, None, use_db=False)
    rag = RagGenerator(gen, BM25Retriever(CORPUS), k=4)
    prompt, kept = rag.build_prompt("Ada Lind was born in", ["P1 text.", "P2 text."], max_new_tokens=8)
    assert prompt == RAG_TEMPLATE.format(documents="\n".join(kept), query="Ada Lind was born in")
    short = RagGenerator(gen, rag.retriever, template="{documents}\n{query}")
    assert short.build_prompt("Ada", ["P1.", "P2."], 8) == ("P1.\nP2.\nAda", ["P1.", "P2."])
    long = [" ".join(["born"] * 30)] * 4                                  # 4 x 30 tokens do not fit 128 positions
    prompt, kept = short.build_prompt("Ada Lind was born in", long, max_new_tokens=8)
    assert 0 < len(kept) < 4 and len(world.tok.encode_text(prompt)) + 1 + 8 <= 128
    n, c, _ = world.people[0]
    res = rag.generate([f"{n} was born in"], max_new_tokens=6)
    assert res[0].prompt == f"{n} was born in" and rag.last_passages[0]  # the query, not the RAG prompt
    m = trex_eval(rag, [TrexItem(f"{n} was born in", c)], force_lookup=False, max_new_tokens=6)
    assert m["trex_n"] == 1.0 and 0.0 <= m["trex_exact_match"] <= 1.0


def test_given_passages_replace_the_retrievers(world):
    rag = RagGenerator(LookupGenerator(world.model, world.tok, None, use_db=False), BM25Retriever(CORPUS), k=4)
    rag.generate(["Ada Lind was born in", "Bram Moss was born in"], max_new_tokens=4,
                 passages=[["Ada Lind was born in Cairo."], []])
    assert rag.last_passages == [["Ada Lind was born in Cairo."], []]
    with pytest.raises(ValueError, match="passage lists"):
        rag.generate(["Ada Lind was born in"], passages=[[], []])


def test_reader_training_documents(world):
    texts = CORPUS * 10
    retriever = BM25Retriever(corpus_passages(CORPUS, words=12))
    docs = rag_training_documents(texts, retriever, world.tok, fraction=0.5, k=2, seed=0)
    changed = [(t, d) for t, d in zip(texts, docs) if d != t]
    assert 10 <= len(changed) <= 30                                    # about half
    assert docs == rag_training_documents(texts, retriever, world.tok, fraction=0.5, k=2, seed=0)  # seeded
    for t, d in changed:
        head, _, query = d.rpartition("\n")
        assert query == t and head.startswith(RAG_TEMPLATE.split("{documents}")[0])
        # the passages are those retrieved for the document's first sentence, best first
        first = retriever.retrieve([t.split(". ")[0] + ("." if ". " in t else "")], 2)[0]
        assert head.endswith("\n".join(p for p, _ in first))
    fitted = rag_training_documents(texts, retriever, world.tok, fraction=1.0, k=2, max_tokens=60)
    assert all(len(world.tok.encode_text(d)) + 1 <= 60 or d == t for d, t in zip(fitted, texts))
    assert rag_training_documents(texts, retriever, world.tok, fraction=0.0) == texts
