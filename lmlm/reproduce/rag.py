"""Stage ``rag``: BM25 passages of the training corpus prepended to two readers, on T-REx, PopQA and FactScore.

* ``standard``: the biography run's Standard model, passages at inference only: the paper's
  baseline (appendix C: "Retrieval is performed at inference time only, without fine-tuning").
  A 355M model pretrained on Wikipedia copies from its context; this 5M one never learned to.
* ``reader``: a Standard model trained with the same recipe and budget on the training corpus
  where ``rag_reader_fraction`` of the documents carry the passages BM25 retrieves for their first
  sentence (:func:`lmlm.evaluate.rag.rag_training_documents`): a reader that can read.

Two controls tell retrieval from reading: how often a retrieved passage names both the subject and
the answer (what a reader could copy), and each reader's T-REx exact match when the passage that
names both is put right before the prompt (an oracle retriever). The reader is kept in ``OUT/rag``.
"""

from __future__ import annotations

import math

from ..jsonio import read_json, write_json
from .context import Run, console

__all__ = ["rag_stage"]


def _reader(run: Run, retriever, texts: list[str]) -> tuple[object, dict]:
    """The Standard model trained with passages before part of its documents (trained once, then loaded),
    and how many of its training documents had passages (a passage that does not fit is not given)."""
    from ..checkpoint import is_checkpoint, load_checkpoint
    from ..evaluate.rag import rag_training_documents
    from ..quickstart import train_config
    from ..train import train

    folder = run.out / "rag" / "reader"
    counts = folder / "passages.json"
    if not is_checkpoint(folder / "checkpoint") or not counts.exists():
        qs = run.quickstart_config
        docs = rag_training_documents(texts, retriever, run.tok, fraction=run.cfg.rag_reader_fraction, k=run.cfg.rag_k,
                                      max_tokens=qs.seq_len, seed=run.cfg.seed)
        given = {"documents": len(docs), "with_passages": sum(d != t for d, t in zip(docs, texts))}
        console.rule(f"RAG: train a reader on {given['with_passages']} of {len(docs)} documents "
                     "with retrieved passages")
        if not is_checkpoint(folder / "checkpoint"):
            train(train_config(qs, "standard", folder, run.bios / "kb"), docs, run.tok)
        write_json(counts, given)
    return load_checkpoint(folder / "checkpoint")[0], read_json(counts)


def _names(passage: str, *words: str) -> bool:
    low = passage.lower()
    return all(w.lower() in low for w in words)


def _oracle(passages: list[str], items) -> tuple[list[list[str]], int]:
    """For each T-REx item, a corpus passage naming its subject and its answer (none: no passage)."""
    by_subject: dict[str, list[str]] = {}
    for it in items:
        by_subject.setdefault(it.subject, [])
    for p in passages:
        for subject, hits in by_subject.items():
            if subject in p:
                hits.append(p)
    out = [[next((p for p in by_subject[it.subject] if _names(p, it.gold)), "")] for it in items]
    return [[p for p in ps if p] for ps in out], sum(bool(ps[0]) for ps in out)


def rag_stage(run: Run) -> dict:
    from ..evaluate.rag import BM25Retriever, RagGenerator, corpus_passages
    from ..evaluate.trex import trex_eval
    from ..generate import LookupGenerator
    from .factual import inputs, protocols

    cfg = run.cfg
    texts = [d.plain for d in run.world.train_documents]
    passages = corpus_passages(texts, words=cfg.rag_passage_words)
    retriever = BM25Retriever(passages)
    inp = inputs(run)
    trex = inp["trex"]
    hits = retriever.retrieve([it.prompt for it in trex], cfg.rag_k)
    oracle, n_oracle = _oracle(passages, trex)
    readers = {"standard": run.model("standard")}
    given = None
    if cfg.rag_reader_fraction > 0:
        readers["reader"], given = _reader(run, retriever, texts)
    res = {"passages": len(passages), "oracle_items": n_oracle,
           # how often a retrieved passage holds the answer at all / names the subject and the answer
           "retrieval_recall_trex": _share(any(_names(p, it.gold) for p, _ in h) for it, h in zip(trex, hits)),
           "retrieval_subject_answer_trex": _share(any(_names(p, it.subject, it.gold) for p, _ in h)
                                                   for it, h in zip(trex, hits)),
           "readers": {}, "reader_training": given}
    for name, model in readers.items():
        console.print(f"RAG: BM25 over {len(passages)} passages, top {cfg.rag_k}, reader {name}")
        rag = RagGenerator(LookupGenerator(model, run.tok, None, use_db=False), retriever, k=cfg.rag_k)
        out = protocols(run, rag, rag, inp, force=False)
        with_passage = [(it, ps) for it, ps in zip(trex, oracle) if ps]
        if with_passage:
            gen = _Fixed(rag, [ps for _, ps in with_passage])
            out["oracle_passage_trex"] = trex_eval(gen, [it for it, _ in with_passage], force_lookup=False,
                                                   max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                                                   by_relation=False)["trex_exact_match"]
        res["readers"][name] = out
    # the paper's baseline (inference only) keeps the top-level keys the report and claims read
    res.update({k: res["readers"]["standard"][k] for k in ("metrics", "samples", "by_stated")})
    return res


class _Fixed:
    """A RAG generator whose passages are given, one list per prompt, in the order of the prompts."""

    def __init__(self, rag, passages):
        self.rag, self.passages, self.tok = rag, passages, rag.tok

    def generate(self, prompts, **kwargs):
        return self.rag.generate(prompts, passages=self.passages, **kwargs)


def _share(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else math.nan
