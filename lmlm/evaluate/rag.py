"""The RAG baseline: BM25 passages of the training corpus prepended to a Standard model's prompt.

The paper's controlled RAG baseline (section 4.3, appendix C "Additional Notes on RAG") retrieves
the top 4 of English Wikipedia's 100-word passages with BM25 (FlashRAG's retriever) and prompts

    Answer the question or complete the prompt based on the given document. The following are
    given documents: [RETRIEVED_DOCUMENTS]\\n[USER_QUERY]

at inference time only, without fine-tuning. Here the corpus is whatever the models were trained
on, cut into passages of at most ``words`` words; BM25 is `bm25s` (Lucene's scoring, English stop
words). :class:`RagGenerator` wraps a generator so that every protocol (T-REx, PopQA, FactScore)
runs unchanged on "Standard + RAG"; passages that would not fit the model's context with the
generated tokens are dropped from the end, the prompt itself is never cut.

A 355M model pretrained on Wikipedia has seen enough text to copy from a passage in its context; a
small model trained on short biographies has not, and reads nothing it is given. A reader that
can read is trained the way a RAG model is: :func:`rag_training_documents` prepends, in the same
template, the passages retrieved for a document's first sentence to a share of the training
documents, so the model learns to use them.

Exercised by ``lmlm eval rag`` and ``lmlm reproduce``.

Examples:
    >>> retriever = BM25Retriever(corpus_passages(texts, words=100))
    >>> retriever.retrieve(["Ada Lovelace was born in"], k=4)[0][0]
    ('Ada Lovelace was born in London ...', 3.1)
    >>> rag = RagGenerator(LookupGenerator(standard, tok, None, use_db=False), retriever)
    >>> trex_eval(rag, items, force_lookup=False)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..models import max_positions
from .base import Protocol

__all__ = ["RAG", "RAG_TEMPLATE", "BM25Retriever", "RagGenerator", "corpus_passages", "rag_training_documents"]

RAG = Protocol("rag", "rag_trex_exact_match", paper="LMLM section 4.3 and appendix C, RAG baseline (BM25 top-4)")
RAG_TEMPLATE = ("Answer the question or complete the prompt based on the given document. "
                "The following are given documents: {documents}\n{query}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def corpus_passages(texts: Iterable[str], words: int = 100) -> list[str]:
    """Passages of at most ``words`` words; sentences are kept whole unless one alone is longer."""
    if words < 1:
        raise ValueError(f"words must be >= 1, got {words}")
    out = []
    for text in texts:
        cur: list[str] = []
        for sentence in _SENTENCE_END.split(text.strip()):
            w = sentence.split()
            if cur and len(cur) + len(w) > words:
                out.append(" ".join(cur))
                cur = []
            while len(w) > words:
                out.append(" ".join(w[:words]))
                w = w[words:]
            cur += w
        if cur:
            out.append(" ".join(cur))
    return out


class BM25Retriever:
    """BM25 over passages (``bm25s``).

    Args:
        passages: the texts to search.
        stopwords (default "en"): bm25s's English stop words; None keeps every word.
    """

    def __init__(self, passages: Sequence[str], stopwords: str | None = "en"):
        from ..errors import need

        bm25s = need("bm25s", "rag", "the BM25 RAG baseline")

        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self._bm25s, self.stopwords = bm25s, stopwords
        self.passages = list(passages)
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(self.passages, stopwords=stopwords, show_progress=False), show_progress=False)

    def retrieve(self, queries: Sequence[str], k: int = 4) -> list[list[tuple[str, float]]]:
        """The ``k`` best passages of each query with their BM25 scores, best first (zero scores dropped)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        tokens = self._bm25s.tokenize(list(queries), stopwords=self.stopwords, show_progress=False)
        docs, scores = self.index.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [[(self.passages[int(d)], float(s)) for d, s in zip(row_d, row_s) if s > 0]
                for row_d, row_s in zip(docs, scores)]


class RagGenerator:
    """A generator whose prompts get the top ``k`` passages in the paper's template.

    Args:
        generator: a :class:`lmlm.generate.LookupGenerator` (a Standard model: ``use_db=False``).
        retriever: a :class:`BM25Retriever`.
        k (int, default 4): passages per prompt (the paper's 4).
        template (str): ``{documents}`` and ``{query}``; the paper's by default.
    """

    def __init__(self, generator, retriever: BM25Retriever, k: int = 4, template: str = RAG_TEMPLATE):
        if "{documents}" not in template or "{query}" not in template:
            raise ValueError("template needs {documents} and {query}")
        self.generator, self.retriever, self.k, self.template = generator, retriever, k, template
        self.tok = generator.tok
        self.last_passages: list[list[str]] = []

    def build_prompt(self, query: str, passages: Sequence[str], max_new_tokens: int) -> tuple[str, list[str]]:
        """The RAG prompt for ``query`` and the passages that fit the context."""
        budget = max_positions(self.generator.model) - max_new_tokens - 1  # 1: the document separator
        kept = list(passages)
        while True:
            prompt = self.template.format(documents="\n".join(kept), query=query)
            if not kept or len(self.tok.encode_text(prompt)) <= budget:
                return prompt, kept
            kept.pop()

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 64,
                 passages: Sequence[Sequence[str]] | None = None, **kwargs):
        """The wrapped generator's results for the RAG prompts; each result's ``prompt`` is the query.

        ``passages``: the passages of each prompt, instead of the retriever's (a control: the passage
        that holds the answer, put right before the prompt).
        """
        if passages is None:
            passages = [[t for t, _ in h] for h in self.retriever.retrieve(prompts, self.k)]
        elif len(passages) != len(prompts):
            raise ValueError(f"{len(passages)} passage lists for {len(prompts)} prompts")
        built = [self.build_prompt(p, list(ps), max_new_tokens) for p, ps in zip(prompts, passages)]
        self.last_passages = [kept for _, kept in built]
        results = self.generator.generate([b for b, _ in built], max_new_tokens=max_new_tokens, **kwargs)
        for r, p in zip(results, prompts):
            r.prompt = p
        return results


def _first_sentence(text: str) -> str:
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def rag_training_documents(texts: Sequence[str], retriever: BM25Retriever, tok, *, fraction: float = 0.5,
                           k: int = 4, max_tokens: int | None = None, seed: int = 0,
                           template: str = RAG_TEMPLATE) -> list[str]:
    """Training texts for a reader that can read: a random ``fraction`` of ``texts`` get the ``k``
    passages BM25 retrieves for their first sentence, in ``template``; the rest are left as they are.

    With ``max_tokens`` (the training block), passages are dropped from the end until the document
    fits, so the passages and the text they help with are seen together.
    """
    import random

    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    rng = random.Random(seed)
    picked = [i for i in range(len(texts)) if rng.random() < fraction]
    hits = retriever.retrieve([_first_sentence(texts[i]) for i in picked], k) if picked else []
    out = list(texts)
    for i, h in zip(picked, hits):
        kept = [t for t, _ in h]
        while True:
            doc = template.format(documents="\n".join(kept), query=texts[i])
            if not kept or max_tokens is None or len(tok.encode_text(doc)) + 1 <= max_tokens:
                break
            kept.pop()
        out[i] = doc if kept else texts[i]
    return out
