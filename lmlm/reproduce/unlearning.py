"""Stage ``tofu``: a fictitious-authors world in TOFU's files, four fine-tuned models, three ways to forget.

As the paper (appendix B, "TOFU"): both models start from pretrained weights (here the biography
run's LMLM and Standard) and are fine-tuned on the TOFU QA pairs, the LMLM on the annotated ones;
a retain model of each kind is fine-tuned on the retain split only. Then:

* LMLM: delete the forget split's facts from a copy of its KB (no training);
* Standard: gradient ascent and NPO (open-unlearning's, with a retain term) as real training runs,
  with forget quality and model utility measured along the way.

Forget quality compares each model's forget-set truth ratios with those of the retain model of its
own kind (the LMLM's likelihoods are on annotated answers, as in the paper), over all answer tokens
and over the value tokens only. The LMLM is fine-tuned under every seed of ``tofu_seeds`` (full and
retain models), which gives forget quality after the delete per seed and the null: the forget
quality of one retain model against another that differs only by its seed, i.e. what "no
difference" scores at this n. :func:`forget_verdict` reads these to say whether a low value is
memorisation, noise or the metric. Everything is cached in ``OUT/tofu``.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

from ..stages import copy_stage, finish_stage, stage_done
from .context import Run, console, read_json, write_json

__all__ = ["tofu_stage", "forget_verdict"]

THRESHOLD = 0.05  # the paper's: forget quality above it means indistinguishable from the retain model

_REAL_RELATIONS = ("Birth City", "University")


def _world(run: Run, folder: Path):
    from ..worlds.tofu import TofuConfig, TofuWorld

    if (folder / "world.json").exists():
        return TofuWorld.load(folder)
    people = sorted(run.world.people_in("train"), key=lambda p: (-p.mentions, p.name))[:run.cfg.tofu_real_people]
    real = [(p.name, {r: p.facts[r] for r in _REAL_RELATIONS}) for p in people]
    world = TofuWorld.generate(TofuConfig(**{"seed": run.cfg.seed, **run.cfg.tofu}), real_people=real)
    world.save(folder)
    return world


def _kb(folder: Path, triples):
    from ..kb import KnowledgeBase, Triple

    if stage_done(folder, legacy=folder / "built.json") is not None:
        return KnowledgeBase.open(folder)
    if folder.exists():
        shutil.rmtree(folder)
    kb = KnowledgeBase.create(folder)
    kb.add([Triple(e, r, v) for e, r, v in triples], who="reproduce", why="TOFU facts at fine-tuning time")
    finish_stage(folder, {"version": kb.version, "triples": len(kb)})
    return kb


def _finetune(run: Run, mode: str, split: str, docs, folder: Path, kb: Path, seed: int | None = None):
    from ..checkpoint import is_checkpoint, load_checkpoint
    from ..train import TrainConfig, train

    ckpt = folder / "checkpoint"
    if not is_checkpoint(ckpt):
        qs, cfg = run.quickstart_config, run.cfg
        seed = cfg.seed if seed is None else seed
        console.rule(f"TOFU: fine-tune {mode.upper()} on {split} ({cfg.tofu_epochs:g} epochs, seed {seed})")
        tc = TrainConfig(mode=mode, model=qs.model, model_overrides=qs.model_overrides,
                         seq_len=min(cfg.tofu_seq_len, qs.seq_len), batch_size=cfg.tofu_batch_size,
                         micro_batch_size=cfg.tofu_batch_size, epochs=cfg.tofu_epochs, lr=cfg.tofu_lr,
                         warmup_steps=10, precision=qs.precision, seed=seed, out_dir=str(folder), resume=True,
                         kb=str(kb), init_from=str(run.checkpoint(mode)), save_every=100, threads=cfg.threads)
        train(tc, docs, run.tok)
    return load_checkpoint(ckpt)[0]


def _summary(run: Run, path: Path, model, sets, kb=None, retain: dict | None = None) -> dict:
    """TOFU summary of one model, cached in ``path``; ``retain``: the retain model's summary."""
    from ..evaluate.unlearn import tofu_summary
    from ..generate import LookupGenerator

    if path.exists():
        return read_json(path)
    gen = LookupGenerator(model, run.tok, kb) if kb is not None else LookupGenerator(model, run.tok, None, use_db=False)
    retain = retain or {}
    res = tofu_summary(model, run.tok, sets, kb=kb, generator=gen, retain_ratios=retain.get("forget_truth_ratios"),
                       retain_value_ratios=retain.get("forget_value_truth_ratios"),
                       max_new_tokens=run.cfg.tofu_max_new_tokens, batch_size=run.cfg.batch_size)
    write_json(path, res)
    return res


def _standard_summary(run: Run, model, sets, retain: dict) -> dict:
    """A point of an unlearning trajectory (not cached: the model changes)."""
    from ..evaluate.unlearn import tofu_summary
    from ..generate import LookupGenerator

    return tofu_summary(model, run.tok, sets, generator=LookupGenerator(model, run.tok, None, use_db=False),
                        retain_ratios=retain["forget_truth_ratios"],
                        retain_value_ratios=retain.get("forget_value_truth_ratios"),
                        max_new_tokens=run.cfg.tofu_max_new_tokens, batch_size=run.cfg.batch_size)


def _slim(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("forget_truth_ratios", "forget_value_truth_ratios")}


def _unlearned_kb(root: Path, forget_items):
    """A copy of the full KB with the forget split's facts deleted (made once), and the deletion."""
    from ..evaluate.unlearn import kb_unlearn
    from ..kb import KnowledgeBase

    folder = root / "kb-unlearned"
    if (deletion := stage_done(folder, legacy=folder / "built.json")) is None:
        copy_stage(root / "kb-full", folder)
        kb = KnowledgeBase.open(folder)
        return kb, finish_stage(folder, kb_unlearn(kb, forget_items, who="reproduce"))
    return KnowledgeBase.open(folder), deletion


def _ks(a, b) -> float | None:
    from ..evaluate.tofu import forget_quality

    return forget_quality(a, b) if a and b else None


def _lmlm_seeds(run: Run, world, sets, retain_split: str, root: Path, kbs: dict) -> dict:
    """Per TOFU seed: the LMLM retain, full and after-delete summaries; and the null between retain models."""
    ev, cfg = root / "eval", run.cfg
    per, raw = {}, {}
    for seed in cfg.tofu_seeds:
        sfx = "" if seed == cfg.seed else f"-seed{seed}"
        full = _finetune(run, "lmlm", "full", world.documents("full"), root / f"train-lmlm-full{sfx}",
                         root / "kb-full", seed)
        retain_model = _finetune(run, "lmlm", retain_split, world.documents(retain_split),
                                 root / f"train-lmlm-{retain_split}{sfx}", root / "kb-retain", seed)
        retain = _summary(run, ev / f"lmlm-retain{sfx}.json", retain_model, sets, kb=kbs["retain"])
        before = _summary(run, ev / f"lmlm-full{sfx}.json", full, sets, kb=kbs["full"], retain=retain)
        after = _summary(run, ev / f"lmlm-unlearned{sfx}.json", full, sets, kb=kbs["unlearned"], retain=retain)
        raw[seed] = retain
        per[str(seed)] = {"retain": _slim(retain), "full": _slim(before), "unlearned": _slim(after)}
    seeds = list(cfg.tofu_seeds)
    null = {f"{a}-{b}": {"forget_quality": _ks(raw[a]["forget_truth_ratios"], raw[b]["forget_truth_ratios"]),
                         "forget_quality_values": _ks(raw[a].get("forget_value_truth_ratios"),
                                                      raw[b].get("forget_value_truth_ratios"))}
            for i, a in enumerate(seeds) for b in seeds[i + 1:]}
    n = len(raw[seeds[0]]["forget_truth_ratios"])
    return {"per_seed": per, "null": null, "n_forget": n}


def forget_verdict(seeds: dict) -> dict:
    """What a low forget quality after the KB delete is, from the per-seed values and the null.

    * ``noise``: two retain models that differ only by their seed already score below the threshold
      (the test separates seeds at this n), or the seeds fall on both sides of it;
    * ``the metric``: over value tokens only the deleted facts are indistinguishable from the retain
      model in every seed; what the KS test sees is the rest of the sentence;
    * ``memorisation``: over value tokens the fine-tuned weights still tell the deleted values apart
      while two retain models do not;
    * ``forgets``: forget quality above the threshold in every seed.
    """
    after = [s["unlearned"]["forget_quality"] for s in seeds["per_seed"].values()]
    values = [s["unlearned"].get("forget_quality_values") for s in seeds["per_seed"].values()]
    null = [x["forget_quality"] for x in seeds["null"].values() if x["forget_quality"] is not None]
    null_values = [x["forget_quality_values"] for x in seeds["null"].values() if x["forget_quality_values"] is not None]
    low = [a for a in after if a is not None and a <= THRESHOLD]
    n = seeds.get("n_forget")
    facts = {"after": after, "after_values": values, "null": null, "null_values": null_values, "n": n}
    if not low:
        return {"label": "forgets", "text": f"above {THRESHOLD} in every seed", **facts}
    if (null and min(null) <= THRESHOLD) or len(low) < len([a for a in after if a is not None]):
        why = (f"two retain models differing only by seed score {min(null):.3g} at n={n}" if null and min(null) <= THRESHOLD
               else f"the seeds fall on both sides of {THRESHOLD}")
        return {"label": "noise", "text": why, **facts}
    if values and all(v is not None and v > THRESHOLD for v in values):
        return {"label": "the metric", "text": "over value tokens only the deleted facts are indistinguishable from "
                "the retain model in every seed; the low value comes from the rest of the sentence", **facts}
    if values and all(v is not None for v in values) and (not null_values or min(null_values) > THRESHOLD):
        return {"label": "memorisation", "text": "over value tokens the deleted values are still told apart while "
                "two retain models are not", **facts}
    return {"label": "undecided", "text": "the controls disagree", **facts}


def tofu_stage(run: Run) -> dict:
    from ..evaluate.tofu import read_tofu
    from ..evaluate.unlearn import UnlearnConfig, read_tofu_sets, unlearn

    cfg = run.cfg
    root = run.out / "tofu"
    world = _world(run, root / "world")
    pct = int(cfg.tofu_forget[6:])
    retain_split = f"retain{100 - pct}"
    forget_items = read_tofu(root / "world" / f"{cfg.tofu_forget}.json")
    kb_full = _kb(root / "kb-full", world.triples("full"))
    kb_full.close()  # copied, closed, for the unlearned copy
    kb_unlearned, deletion = _unlearned_kb(root, forget_items)
    kbs = {"full": _kb(root / "kb-full", world.triples("full")), "retain": _kb(root / "kb-retain", world.triples(retain_split)),
           "unlearned": kb_unlearned}
    std = {split: _finetune(run, "standard", split, world.documents(split), root / f"train-standard-{split}",
                            root / ("kb-full" if split == "full" else "kb-retain"))
           for split in ("full", retain_split)}
    sets = read_tofu_sets(root / "world", cfg.tofu_forget)
    ev = root / "eval"
    console.print("TOFU: evaluate the retain models, the fine-tuned models, and the LMLM after its KB delete")
    std_retain = _summary(run, ev / "standard-retain.json", std[retain_split], sets)
    std_full = _summary(run, ev / "standard-full.json", std["full"], sets, retain=std_retain)
    seeds = _lmlm_seeds(run, world, sets, retain_split, root, kbs)
    first = seeds["per_seed"][str(cfg.seed)]

    retain_items = read_tofu(root / "world" / f"{retain_split}.json")
    runs = {}
    for method in cfg.unlearn_methods:
        for seed in cfg.unlearn_seeds:
            path = ev / f"unlearn-{method}-{seed}.json"
            if not path.exists():
                console.rule(f"TOFU: unlearn the Standard model with {method} (seed {seed})")
                uc = UnlearnConfig(**{**cfg.unlearn, "method": method, "seed": seed})
                res = unlearn(std["full"], run.tok, forget_items, retain_items, uc,
                              evaluate=lambda m: _slim(_standard_summary(run, m, sets, std_retain)))
                write_json(path, {"config": asdict(uc), "trajectory": res.trajectory, "losses": res.losses,
                                  "seconds": res.seconds})
            runs[f"{method}-{seed}"] = read_json(path)
    for kb in kbs.values():
        kb.close()
    return {"world": world.stats(), "forget_split": cfg.tofu_forget, "deletion": deletion,
            "models": {"standard_retain": _slim(std_retain), "lmlm_retain": first["retain"],
                       "standard_full": _slim(std_full), "lmlm_full": first["full"],
                       "lmlm_unlearned": first["unlearned"]},
            "unlearning_runs": runs, "seeds": seeds, "verdict": forget_verdict(seeds)}
