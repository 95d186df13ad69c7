"""Stages on the biography world: benchmark files, factual precision, ablations, NLU, RAG.

* ``data``: the world's facts written as T-REx, PopQA, FActScore and BIG-bench files
  (:mod:`lmlm.worlds.benchmarks`);
* ``factual``: T-REx, PopQA and FactScore for LMLM (fuzzy KB matching), LMLM with prefix-tree
  constrained queries, LMLM without its database and Standard; NLU (multiple choice) for both models;
* ``rag``: the same three protocols for Standard with BM25 passages of the training corpus.
"""

from __future__ import annotations

import math

from .context import Run, console

__all__ = ["data_stage", "factual_stage", "rag_stage"]

N_SAMPLES = 3  # generations kept per system and protocol for the report


def data_stage(run: Run) -> dict:
    from ..worlds.benchmarks import write_all

    cfg = run.cfg
    counts = write_all(run.world, run.data, n_trex=cfg.n_trex, n_popqa=cfg.n_popqa, n_factscore=cfg.n_factscore,
                       n_nlu=cfg.n_nlu)
    console.print(f"benchmark files in {run.data}: {counts}")
    return {"counts": counts, "folder": str(run.data)}


def _inputs(run: Run) -> dict:
    from ..evaluate.factscore import read_topics, world_from_kb
    from ..evaluate.popqa import read_popqa
    from ..evaluate.trex import read_trex

    return {"trex": read_trex(run.data / "trex.jsonl"), "popqa": read_popqa(run.data / "popqa.tsv"),
            "topics": read_topics(run.data / "factscore.jsonl"), "facts": world_from_kb(run.kb)}


def _protocols(run: Run, gen, trex_gen, inputs: dict, force: bool) -> dict:
    """T-REx (``trex_gen``: misses go on as text), PopQA and FactScore of one system, with samples."""
    from ..evaluate.factscore import factscore_eval
    from ..evaluate.popqa import popqa_eval
    from ..evaluate.trex import trex_eval

    cfg = run.cfg
    out, samples = {}, {}
    rec: list = []
    out["trex"] = trex_eval(trex_gen, inputs["trex"], force_lookup=force, max_new_tokens=cfg.max_new_tokens,
                            batch_size=cfg.batch_size, by_relation=False, records=rec)
    samples["trex"] = rec[:N_SAMPLES]
    rec = []
    out["popqa"] = popqa_eval(gen, inputs["popqa"], max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                              by_relation=False, records=rec)
    samples["popqa"] = rec[:N_SAMPLES]
    rec = []
    out["factscore"] = factscore_eval(gen, inputs["topics"], inputs["facts"], claims="values",
                                      max_new_tokens=cfg.factscore_tokens, batch_size=cfg.batch_size, records=rec)
    samples["factscore"] = [{k: r[k] for k in ("topic", "text", "claims", "supported")} for r in rec[:N_SAMPLES]]
    return {"metrics": out, "samples": samples}


def _nlu(run: Run) -> dict:
    from ..evaluate.nlu import nlu_eval, read_bigbench_mc

    files = {"bios_continuation": (run.data / "nlu.json", "{input}")}
    if run.cfg.nlu_data:
        files["external"] = (run.cfg.nlu_data, "Q: {input}\nA:")
    out = {}
    for name, (path, template) in files.items():
        items = read_bigbench_mc(path, template=template)
        out[name] = {mode: nlu_eval(run.model(mode), run.tok, items, batch_size=run.cfg.batch_size)
                     for mode in ("lmlm", "standard")}
    return out


def factual_stage(run: Run) -> dict:
    from ..generate import LookupGenerator

    inputs = _inputs(run)
    lmlm, std, tok, kb = run.model("lmlm"), run.model("standard"), run.tok, run.kb
    systems = {
        # name: (generator, T-REx generator, force a lookup at the T-REx mask)
        "lmlm": (LookupGenerator(lmlm, tok, kb), LookupGenerator(lmlm, tok, kb, on_miss="skip"), True),
        "lmlm_prefix_tree": (LookupGenerator(lmlm, tok, kb, constrained=True),
                             LookupGenerator(lmlm, tok, kb, constrained=True, on_miss="skip"), True),
        "lmlm_no_db": (LookupGenerator(lmlm, tok, None, use_db=False),) * 2 + (False,),
        "standard": (LookupGenerator(std, tok, None, use_db=False),) * 2 + (False,),
    }
    results = {}
    for name, (gen, trex_gen, force) in systems.items():
        console.print(f"factual precision: {name}")
        results[name] = _protocols(run, gen, trex_gen, inputs, force)
    console.print("NLU (multiple choice)")
    return {"systems": results, "nlu": _nlu(run),
            "n": {"trex": len(inputs["trex"]), "popqa": len(inputs["popqa"]), "factscore": len(inputs["topics"])}}


def rag_stage(run: Run) -> dict:
    from ..evaluate.rag import BM25Retriever, RagGenerator, corpus_passages
    from ..generate import LookupGenerator

    cfg = run.cfg
    passages = corpus_passages((d.plain for d in run.world.train_documents), words=cfg.rag_passage_words)
    retriever = BM25Retriever(passages)
    rag = RagGenerator(LookupGenerator(run.model("standard"), run.tok, None, use_db=False), retriever, k=cfg.rag_k)
    inputs = _inputs(run)
    console.print(f"RAG: BM25 over {len(passages)} passages, top {cfg.rag_k}")
    res = _protocols(run, rag, rag, inputs, force=False)
    # how often a retrieved passage holds the answer at all (what RAG can at best copy)
    hits = retriever.retrieve([it.prompt for it in inputs["trex"]], cfg.rag_k)
    recall = [any(it.gold.lower() in p.lower() for p, _ in h) for it, h in zip(inputs["trex"], hits)]
    res["retrieval_recall_trex"] = sum(recall) / len(recall) if recall else math.nan
    res["passages"] = len(passages)
    return res
