"""Stage ``offloading``: rank facts by the paper's loss difference, train one model per ratio, evaluate.

0% is the biography run's Standard model and 100% its LMLM; every other ratio trains an LMLM with
the same recipe on the corpus whose calls are kept only for the top share of facts. Each model is
evaluated on held-out documents of trained people, annotated by the same rule (dynamic perplexity:
the model writes its own queries and the KB answers; static and normalized, whose oracle values
lower perplexity almost by construction as more facts are offloaded), on T-REx without a forced
lookup (the model decides when to look up; the KB answers), and on the continuation multiple
choice standing in for NLU. Rankings, checkpoints and
per-ratio results are kept in ``OUT/offloading`` so an interrupted stage resumes.
"""

from __future__ import annotations

from pathlib import Path

from ..models import max_positions
from .context import Run, console, read_json, write_json

__all__ = ["offloading_stage", "ratio_name"]


def ratio_name(ratio: float) -> str:
    return f"ratio-{round(ratio * 100):03d}"


def _ranking(run: Run, folder: Path) -> dict:
    from ..evaluate.offloading import fact_loss_differences, offload_thresholds

    path = folder / "ranking.json"
    if path.exists():
        doc = read_json(path)
        return {"deltas": {(e, r): d for e, r, d in doc["deltas"]}, "thresholds": doc["thresholds"]}
    console.print("offloading: loss differences of the 5 tokens after each call (Standard - LMLM)")
    docs = [d.segments for d in run.world.train_documents]
    deltas = fact_loss_differences(run.model("lmlm"), run.model("standard"), run.tok, docs,
                                   n_tokens=run.cfg.offload_tokens, batch_size=run.cfg.batch_size)
    thresholds = {str(r): t for r, t in offload_thresholds(deltas, (0.1, 0.25, 0.5, 0.75, 0.9)).items()}
    write_json(path, {"deltas": [[e, r, d] for (e, r), d in sorted(deltas.items())], "thresholds": thresholds})
    return {"deltas": deltas, "thresholds": thresholds}


def _model(run: Run, ratio: float, keys: set, folder: Path):
    """The model of one ratio: reused at 0 and 1, else trained (or resumed) in ``folder``."""
    from ..checkpoint import is_checkpoint, load_checkpoint
    from ..evaluate.offloading import offload_documents
    from ..quickstart import train_config
    from ..train import train

    if ratio == 0.0:
        return run.model("standard")
    if ratio == 1.0:
        return run.model("lmlm")
    ckpt = folder / "checkpoint"
    if not is_checkpoint(ckpt):
        console.rule(f"offloading: train an LMLM with {ratio:.0%} of the facts offloaded")
        docs = offload_documents((d.segments for d in run.world.train_documents), keys)
        train(train_config(run.quickstart_config, "lmlm", folder, run.bios / "kb"), docs, run.tok)
    return load_checkpoint(ckpt)[0]


def _evaluate(run: Run, model, ratio: float, keys: set, items, nlu_items) -> dict:
    from ..evaluate.nlu import nlu_eval
    from ..evaluate.offloading import offload_documents
    from .factual import above_chance
    from ..evaluate.perplexity import dynamic_perplexity, static_perplexity
    from ..evaluate.trex import trex_eval
    from ..generate import LookupGenerator

    tok, world = run.tok, run.world
    ctx = max_positions(model)
    held = [d for d in world.heldout_documents if world.person(d.person).split == "train"]
    held = offload_documents((d.segments for d in held), keys)
    # room for queries the model writes longer than the reference's (dynamic perplexity)
    held = [d for d in held if len(tok.encode(d)) <= ctx - 48]
    ppl = static_perplexity(model, tok, held, batch_size=run.cfg.batch_size)
    gen = LookupGenerator(model, tok, run.kb) if ratio > 0 else LookupGenerator(model, tok, None, use_db=False)
    # with nothing offloaded the documents have no calls: dynamic is static
    dyn = dynamic_perplexity(gen, held, batch_size=run.cfg.batch_size) if ratio > 0 else {"dynamic": ppl["static"]}
    trex = trex_eval(gen, items, force_lookup=False, max_new_tokens=run.cfg.max_new_tokens,
                     batch_size=run.cfg.batch_size, by_relation=False)
    nlu = nlu_eval(model, tok, nlu_items, batch_size=run.cfg.batch_size)
    return {"ratio": ratio, "facts_offloaded": len(keys), "perplexity_dynamic": dyn["dynamic"],
            "perplexity_static": ppl["static"], "perplexity_normalized": ppl["normalized"],
            "heldout_documents": len(held),
            "trex_exact_match": trex["trex_exact_match"], "trex_lookup_found": trex["trex_lookup_found"],
            "nlu_acc_norm": nlu["nlu_acc_norm"], "nlu_acc": nlu["nlu_acc"], "nlu_n": nlu["nlu_n"],
            "nlu_above_chance": above_chance(round(nlu["nlu_acc_norm"] * nlu["nlu_n"]), int(nlu["nlu_n"]),
                                             min((len(it.choices) for it in nlu_items), default=2))}


def offloading_stage(run: Run) -> dict:
    from ..evaluate.nlu import read_bigbench_mc
    from ..evaluate.offloading import offloaded_keys
    from ..evaluate.trex import read_trex

    folder = run.out / "offloading"
    ranking = _ranking(run, folder)
    deltas = ranking["deltas"]
    items = read_trex(run.data / "trex.jsonl")
    nlu_items = read_bigbench_mc(run.data / "nlu.json", template="{input}")
    rows = []
    for ratio in sorted(run.cfg.offload_ratios):
        done = folder / f"{ratio_name(ratio)}.json"
        if done.exists():
            rows.append(read_json(done))
            continue
        keys = offloaded_keys(deltas, ratio)
        model = _model(run, ratio, keys, folder / ratio_name(ratio))
        console.print(f"offloading: evaluate {ratio:.0%}")
        row = _evaluate(run, model, ratio, keys, items, nlu_items)
        write_json(done, row)
        rows.append(row)
    values = sorted(deltas.values())
    return {"ratios": rows, "thresholds": ranking["thresholds"], "facts": len(deltas),
            "delta_quantiles": {q: values[min(len(values) - 1, int(q * len(values)))] for q in (0.1, 0.25, 0.5, 0.75, 0.9)}
            if values else {}}
