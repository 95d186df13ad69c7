"""Stage ``seeds``: the LMLM / Standard pair trained again with other seeds, to tell a margin from noise.

One seed cannot say whether a perplexity margin of 0.09 or a T-REx gap of a few points is the
method or the initialisation. For every seed of ``cfg.seeds`` (the first is the biography run's
own) an LMLM and a Standard model are trained with the same recipe, world, tokenizer and block
order, only the initialisation and shuffles changed; each pair is evaluated on the held-out
perplexities (a KB holding the facts of every held-out document) and on T-REx for the LMLM, the
LMLM without its database and Standard. The claims read the mean, the spread and the worst seed.
Everything is cached in ``OUT/seeds``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ..stages import copy_stage, finish_stage, stage_done
from .context import Run, console, read_json, write_json

__all__ = ["seeds_stage", "spread", "heldout_kb"]

METRICS = ("ppl_static", "ppl_dynamic", "ppl_normalized", "ppl_standard", "trex_lmlm", "trex_lmlm_no_db",
           "trex_standard", "trex_standard_stated")


def spread(values) -> dict:
    """``mean``, ``sd`` (sample standard deviation, 0 for one value), ``min``, ``max`` and ``n`` of the non-missing values."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    mu = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": mu, "sd": sd, "min": min(vals), "max": max(vals), "n": len(vals)}


def heldout_kb(run: Run, folder: Path):
    """A copy of the training KB with the added people's facts: the facts of every held-out document."""
    from ..kb import KnowledgeBase, Triple

    if stage_done(folder, legacy=folder / "built.json") is not None:
        return KnowledgeBase.open(folder)
    copy_stage(run.bios / "kb", folder)
    kb = KnowledgeBase.open(folder)
    kb.add([Triple(e, r, v, source=s) for e, r, v, s in run.world.added_triples()], who="reproduce",
           why="people added after training: every held-out document's facts")
    finish_stage(folder, {"version": kb.version, "triples": len(kb)})
    return kb


def _models(run: Run, seed: int, folder: Path):
    from ..checkpoint import is_checkpoint, load_checkpoint
    from ..quickstart import train_config
    from ..train import train

    if seed == run.cfg.seed:
        return run.model("lmlm"), run.model("standard")
    out = []
    for mode in ("lmlm", "standard"):
        ckpt = folder / f"train-{mode}" / "checkpoint"
        if not is_checkpoint(ckpt):
            console.rule(f"seeds: train {mode.upper()} with seed {seed}")
            cfg = replace(run.quickstart_config, seed=seed)
            train(train_config(cfg, mode, folder / f"train-{mode}", run.bios / "kb"),
                  [d.segments for d in run.world.train_documents], run.tok)
        out.append(load_checkpoint(ckpt)[0])
    return tuple(out)


def _trex(run: Run, lmlm, std) -> dict:
    from ..evaluate.trex import read_trex, trex_eval
    from ..generate import LookupGenerator

    items = read_trex(run.data / "trex.jsonl")
    stated = [run.world.stated(it.subject, it.relation) for it in items]
    cfg, tok = run.cfg, run.tok
    out = {}
    for name, gen, force in (("lmlm", LookupGenerator(lmlm, tok, run.kb, on_miss="skip"), True),
                             ("lmlm_no_db", LookupGenerator(lmlm, tok, None, use_db=False), False),
                             ("standard", LookupGenerator(std, tok, None, use_db=False), False)):
        rec: list = []
        m = trex_eval(gen, items, force_lookup=force, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                      by_relation=False, records=rec)
        out[f"trex_{name}"] = m["trex_exact_match"]
        hits = [r["exact_match"] for r, s in zip(rec, stated) if s]
        out[f"trex_{name}_stated"] = sum(hits) / len(hits) if hits else None
    return out


def seeds_stage(run: Run) -> dict:
    from ..quickstart import heldout_perplexity

    folder = run.out / "seeds"
    kb = heldout_kb(run, folder / "kb-heldout")
    rows = []
    for seed in run.cfg.seeds:
        path = folder / f"seed-{seed}.json"
        if not path.exists():
            lmlm, std = _models(run, seed, folder / f"seed-{seed}")
            console.print(f"seeds: evaluate the pair of seed {seed}")
            p = heldout_perplexity(run.world, run.tok, lmlm, std, kb, run.quickstart_config.n_heldout)
            row = {"seed": seed, "ppl_static": p["lmlm"]["static"], "ppl_dynamic": p["lmlm"]["dynamic"],
                   "ppl_normalized": p["lmlm"]["normalized"], "ppl_standard": p["standard"],
                   "by_group": p["by_group"], **_trex(run, lmlm, std)}
            write_json(path, row)
        rows.append(read_json(path))
    kb.close()
    summary = {k: spread(r.get(k) for r in rows) for k in METRICS}
    for k in ("static", "dynamic", "normalized"):  # the margins the perplexity claim reads, per seed
        summary[f"margin_{k}"] = spread(r["ppl_standard"] - r[f"ppl_{k}"] for r in rows)
    summary["margin_trex_no_db_vs_standard"] = spread(r["trex_lmlm_no_db"] - r["trex_standard"] for r in rows)
    summary["margin_trex_lmlm_vs_standard"] = spread(r["trex_lmlm"] - r["trex_standard"] for r in rows)
    return {"seeds": list(run.cfg.seeds), "rows": rows, "summary": summary}
