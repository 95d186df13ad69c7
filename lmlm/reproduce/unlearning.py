"""Stage ``tofu``: a fictitious-authors world in TOFU's files, four fine-tuned models, three ways to forget.

As the paper (appendix B, "TOFU"): both models start from pretrained weights (here the biography
run's LMLM and Standard) and are fine-tuned on the TOFU QA pairs, the LMLM on the annotated ones;
a retain model of each kind is fine-tuned on the retain split only. Then:

* LMLM: delete the forget split's facts from a copy of its KB (no training);
* Standard: gradient ascent and NPO (open-unlearning's, with a retain term) as real training runs,
  with forget quality and model utility measured along the way.

Forget quality compares each model's forget-set truth ratios with those of the retain model of its
own kind (the LMLM's likelihoods are on annotated answers, as in the paper). Everything is cached in
``OUT/tofu``.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

from .context import Run, console, read_json, write_json

__all__ = ["tofu_stage"]

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

    if (folder / "built.json").exists():
        return KnowledgeBase.open(folder)
    if folder.exists():
        shutil.rmtree(folder)
    kb = KnowledgeBase.create(folder)
    kb.add([Triple(e, r, v) for e, r, v in triples], who="reproduce", why="TOFU facts at fine-tuning time")
    write_json(folder / "built.json", {"version": kb.version, "triples": len(kb)})
    return kb


def _finetune(run: Run, mode: str, split: str, docs, folder: Path, kb: Path):
    from ..checkpoint import is_checkpoint, load_checkpoint
    from ..train import TrainConfig, train

    ckpt = folder / "checkpoint"
    if not is_checkpoint(ckpt):
        qs, cfg = run.quickstart_config, run.cfg
        console.rule(f"TOFU: fine-tune {mode.upper()} on {split} ({cfg.tofu_epochs:g} epochs)")
        tc = TrainConfig(mode=mode, model=qs.model, model_overrides=qs.model_overrides,
                         seq_len=min(cfg.tofu_seq_len, qs.seq_len), batch_size=cfg.tofu_batch_size,
                         micro_batch_size=cfg.tofu_batch_size, epochs=cfg.tofu_epochs, lr=cfg.tofu_lr,
                         warmup_steps=10, precision=qs.precision, seed=cfg.seed, out_dir=str(folder), resume=True,
                         kb=str(kb), init_from=str(run.checkpoint(mode)), save_every=100, threads=cfg.threads)
        train(tc, docs, run.tok)
    return load_checkpoint(ckpt)[0]


def _summary(run: Run, path: Path, model, sets, kb=None, retain_ratios=None) -> dict:
    """TOFU summary of one model, cached in ``path``."""
    from ..evaluate.unlearn import tofu_summary
    from ..generate import LookupGenerator

    if path.exists():
        return read_json(path)
    gen = LookupGenerator(model, run.tok, kb) if kb is not None else LookupGenerator(model, run.tok, None, use_db=False)
    res = tofu_summary(model, run.tok, sets, kb=kb, generator=gen, retain_ratios=retain_ratios,
                       max_new_tokens=run.cfg.tofu_max_new_tokens, batch_size=run.cfg.batch_size)
    write_json(path, res)
    return res


def _standard_summary(run: Run, model, sets, retain_ratios) -> dict:
    """A point of an unlearning trajectory (not cached: the model changes)."""
    from ..evaluate.unlearn import tofu_summary
    from ..generate import LookupGenerator

    return tofu_summary(model, run.tok, sets, generator=LookupGenerator(model, run.tok, None, use_db=False),
                        retain_ratios=retain_ratios, max_new_tokens=run.cfg.tofu_max_new_tokens,
                        batch_size=run.cfg.batch_size)


def _slim(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "forget_truth_ratios"}


def tofu_stage(run: Run) -> dict:
    from ..evaluate.tofu import read_tofu
    from ..evaluate.unlearn import UnlearnConfig, kb_unlearn, read_tofu_sets, unlearn

    cfg = run.cfg
    root = run.out / "tofu"
    world = _world(run, root / "world")
    pct = int(cfg.tofu_forget[6:])
    retain_split = f"retain{100 - pct}"
    kb_full = _kb(root / "kb-full", world.triples("full"))
    kb_retain = _kb(root / "kb-retain", world.triples(retain_split))
    models = {(mode, split): _finetune(run, mode, split, world.documents(split), root / f"train-{mode}-{split}",
                                       root / ("kb-full" if split == "full" else "kb-retain"))
              for mode in ("lmlm", "standard") for split in ("full", retain_split)}
    sets = read_tofu_sets(root / "world", cfg.tofu_forget)
    ev = root / "eval"
    console.print("TOFU: evaluate the retain models, the fine-tuned models, and the LMLM after its KB delete")
    std_retain = _summary(run, ev / "standard-retain.json", models[("standard", retain_split)], sets)
    lmlm_retain = _summary(run, ev / "lmlm-retain.json", models[("lmlm", retain_split)], sets, kb=kb_retain)
    std_ratios, lmlm_ratios = std_retain["forget_truth_ratios"], lmlm_retain["forget_truth_ratios"]
    std_full = _summary(run, ev / "standard-full.json", models[("standard", "full")], sets, retain_ratios=std_ratios)
    lmlm_full = _summary(run, ev / "lmlm-full.json", models[("lmlm", "full")], sets, kb=kb_full,
                         retain_ratios=lmlm_ratios)
    forget_items = read_tofu(root / "world" / f"{cfg.tofu_forget}.json")
    kb_full.close()
    unlearned = root / "kb-unlearned"
    if not (ev / "lmlm-unlearned.json").exists():
        if unlearned.exists():
            shutil.rmtree(unlearned)
        shutil.copytree(root / "kb-full", unlearned)
        from ..kb import KnowledgeBase

        kb_u = KnowledgeBase.open(unlearned)
        deletion = kb_unlearn(kb_u, forget_items, who="reproduce")
        write_json(ev / "kb-delete.json", deletion)
        _summary(run, ev / "lmlm-unlearned.json", models[("lmlm", "full")], sets, kb=kb_u, retain_ratios=lmlm_ratios)
        kb_u.close()
    lmlm_after, deletion = read_json(ev / "lmlm-unlearned.json"), read_json(ev / "kb-delete.json")

    retain_items = read_tofu(root / "world" / f"{retain_split}.json")
    runs = {}
    for method in cfg.unlearn_methods:
        for seed in cfg.unlearn_seeds:
            path = ev / f"unlearn-{method}-{seed}.json"
            if not path.exists():
                console.rule(f"TOFU: unlearn the Standard model with {method} (seed {seed})")
                uc = UnlearnConfig(**{**cfg.unlearn, "method": method, "seed": seed})
                res = unlearn(models[("standard", "full")], run.tok, forget_items, retain_items, uc,
                              evaluate=lambda m: _slim(_standard_summary(run, m, sets, std_ratios)))
                write_json(path, {"config": asdict(uc), "trajectory": res.trajectory, "losses": res.losses,
                                  "seconds": res.seconds})
            runs[f"{method}-{seed}"] = read_json(path)
    kb_retain.close()
    return {"world": world.stats(), "forget_split": cfg.tofu_forget, "deletion": deletion,
            "models": {"standard_retain": _slim(std_retain), "lmlm_retain": _slim(lmlm_retain),
                       "standard_full": _slim(std_full), "lmlm_full": _slim(lmlm_full),
                       "lmlm_unlearned": _slim(lmlm_after)},
            "unlearning_runs": runs}
