"""Stages on the biography world: benchmark files, factual precision, ablations, NLU.

* ``data``: the world's facts written as T-REx, PopQA, FActScore and BIG-bench files
  (:mod:`lmlm.worlds.benchmarks`);
* ``factual``: T-REx, PopQA and FactScore for LMLM (fuzzy KB matching), LMLM with prefix-tree
  constrained queries, LMLM without its database (lookup tokens banned: near zero by construction,
  its values were never in its loss), LMLM with its calls unanswered (it writes its queries, gets no
  value and goes on by itself; the calls are stripped before scoring) and Standard; NLU (multiple
  choice) for both models, with a binomial test against chance.

Every precision is also split by facts a training document states and facts only the KB holds
(no Standard model could learn those).
"""

from __future__ import annotations

from .context import Run, console

__all__ = ["data_stage", "factual_stage", "protocols", "inputs", "above_chance"]

N_SAMPLES = 3  # generations kept per system and protocol for the report


def data_stage(run: Run) -> dict:
    from ..worlds.benchmarks import write_all

    cfg = run.cfg
    counts = write_all(run.world, run.data, n_trex=cfg.n_trex, n_popqa=cfg.n_popqa, n_factscore=cfg.n_factscore,
                       n_nlu=cfg.n_nlu)
    console.print(f"benchmark files in {run.data}: {counts}")
    return {"counts": counts, "folder": str(run.data)}


def inputs(run: Run) -> dict:
    """The benchmark items of the ``data`` stage, the KB's facts as the truth, and which fact each
    T-REx / PopQA item asks about."""
    from ..evaluate.factscore import read_topics, world_from_kb
    from ..evaluate.popqa import read_popqa
    from ..evaluate.trex import read_trex
    from ..worlds.benchmarks import POPQA_QUESTIONS

    trex, popqa = read_trex(run.data / "trex.jsonl"), read_popqa(run.data / "popqa.tsv")
    prop = {q[2]: rel for rel, q in POPQA_QUESTIONS.items()}  # PopQA's prop -> the world's relation
    return {"trex": trex, "popqa": popqa, "topics": read_topics(run.data / "factscore.jsonl"),
            "facts": world_from_kb(run.kb),
            "stated": {"trex": [run.world.stated(it.subject, it.relation) for it in trex],
                       "popqa": [run.world.stated(it.subject, prop.get(it.relation, it.relation)) for it in popqa]}}


def _split(records: list[dict], key: str, stated: list[bool]) -> dict:
    """Accuracy over items about facts stated in the training text and about KB-only facts, with counts."""
    out = {}
    for name, flag in (("stated", True), ("kb_only", False)):
        hits = [r[key] for r, s in zip(records, stated) if s is flag]
        out[name] = sum(hits) / len(hits) if hits else None
        out[f"n_{name}"] = len(hits)
    return out


def protocols(run: Run, gen, trex_gen, inp: dict, force: bool) -> dict:
    """T-REx (``trex_gen``: misses go on as text), PopQA and FactScore of one system, with samples
    and each protocol's precision on stated vs KB-only facts."""
    from ..evaluate.factscore import factscore_eval
    from ..evaluate.popqa import popqa_eval
    from ..evaluate.trex import trex_eval

    cfg = run.cfg
    out, samples, by_stated = {}, {}, {}
    rec: list = []
    out["trex"] = trex_eval(trex_gen, inp["trex"], force_lookup=force, max_new_tokens=cfg.max_new_tokens,
                            batch_size=cfg.batch_size, by_relation=False, records=rec)
    samples["trex"], by_stated["trex"] = rec[:N_SAMPLES], _split(rec, "exact_match", inp["stated"]["trex"])
    rec = []
    out["popqa"] = popqa_eval(gen, inp["popqa"], max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                              by_relation=False, records=rec)
    samples["popqa"], by_stated["popqa"] = rec[:N_SAMPLES], _split(rec, "correct", inp["stated"]["popqa"])
    rec = []
    fs = out["factscore"] = factscore_eval(gen, inp["topics"], inp["facts"], claims="text",
                                           max_new_tokens=cfg.factscore_tokens, batch_size=cfg.batch_size, records=rec)
    samples["factscore"] = [{k: r[k] for k in ("topic", "text", "claims", "supported")} for r in rec[:N_SAMPLES]]
    by_stated["factscore"] = {"stated": fs.get("factscore_precision_stated"),
                              "kb_only": fs.get("factscore_precision_kb_only"),
                              "n_stated": fs.get("factscore_claims_stated"), "n_kb_only": fs.get("factscore_claims_kb_only")}
    return {"metrics": out, "samples": samples, "by_stated": by_stated}


def above_chance(correct: int, n: int, n_choices: int) -> dict:
    """One-sided binomial test of ``correct`` of ``n`` against guessing among ``n_choices`` (scipy)."""
    from ..errors import need

    binomtest = need("scipy.stats", "tofu", "the binomial test against chance").binomtest

    p = binomtest(correct, n, 1 / n_choices, alternative="greater").pvalue if n else float("nan")
    return {"correct": correct, "n": n, "chance": 1 / n_choices, "p_value": float(p)}


def _nlu(run: Run) -> dict:
    from ..evaluate.nlu import nlu_eval, read_bigbench_mc

    files = {"bios_continuation": (run.data / "nlu.json", "{input}")}
    if run.cfg.nlu_data:
        files["external"] = (run.cfg.nlu_data, "Q: {input}\nA:")
    out = {}
    for name, (path, template) in files.items():
        items = read_bigbench_mc(path, template=template)
        out[name] = {}
        for mode in ("lmlm", "standard"):
            rec: list = []
            m = nlu_eval(run.model(mode), run.tok, items, batch_size=run.cfg.batch_size, records=rec)
            correct = sum(r["acc_norm"] == r["gold"] for r in rec)
            choices = min(len(it.choices) for it in items) if items else 2
            out[name][mode] = {**m, "above_chance": above_chance(correct, len(rec), choices)}
    return out


def factual_stage(run: Run) -> dict:
    from ..generate import LookupGenerator

    inp = inputs(run)
    lmlm, std, tok, kb = run.model("lmlm"), run.model("standard"), run.tok, run.kb
    systems = {
        # name: (generator, T-REx generator, force a lookup at the T-REx mask)
        "lmlm": (LookupGenerator(lmlm, tok, kb), LookupGenerator(lmlm, tok, kb, on_miss="skip"), True),
        "lmlm_prefix_tree": (LookupGenerator(lmlm, tok, kb, constrained=True),
                             LookupGenerator(lmlm, tok, kb, constrained=True, on_miss="skip"), True),
        "lmlm_no_db": (LookupGenerator(lmlm, tok, None, use_db=False),) * 2 + (False,),
        # its calls get no value: it goes on by itself after each query; calls are stripped for scoring
        "lmlm_calls_stripped": (LookupGenerator(lmlm, tok, None, on_miss="skip"),) * 2 + (False,),
        "standard": (LookupGenerator(std, tok, None, use_db=False),) * 2 + (False,),
    }
    results = {}
    for name, (gen, trex_gen, force) in systems.items():
        console.print(f"factual precision: {name}")
        results[name] = protocols(run, gen, trex_gen, inp, force)
    console.print("NLU (multiple choice)")
    st = inp["stated"]
    return {"systems": results, "nlu": _nlu(run),
            "n": {"trex": len(inp["trex"]), "popqa": len(inp["popqa"]), "factscore": len(inp["topics"]),
                  "trex_kb_only": st["trex"].count(False), "popqa_kb_only": st["popqa"].count(False)}}
