"""The paper's whole story on a synthetic biography world, on a CPU: ``lmlm quickstart``.

1. generate a biography world and its annotated corpus;
2. build the knowledge base from the world's triples;
3. train LMLM (masked loss on annotated text) and Standard (plain loss on the stripped text) with
   the same tokenizer, block order and budget (optimizer steps x batch x block length);
4. evaluate both, then change the KB (add people, edit facts, delete a forget set) and evaluate again;
5. write ``OUT/report.json``, ``OUT/report.md`` with plots and sample generations, and both checkpoints.

Each stage writes its outputs under OUT and is skipped when they are already there, so an
interrupted run continues where it stopped (``--fresh`` starts over).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["QuickstartConfig", "QUICKSTART_PRESETS", "quickstart", "train_config"]

console = Console(stderr=True)


@dataclass
class QuickstartConfig:
    """One quickstart run.

    Args:
        world: a biography world preset (``lmlm.worlds.bios.BIOS_PRESETS``).
        model: a model preset (``lmlm.models.MODEL_PRESETS``), the same for both models.
        vocab_size: byte-level BPE vocabulary trained on the stripped corpus.
        seq_len, batch_size, max_steps, lr, warmup_steps: training, identical for both models.
        n_cloze: (person, relation) prompts of trained people for factual precision (None: all).
        n_edits: facts whose KB value is changed after training.
        forget_fraction: share of trained people whose facts are all deleted.
        n_retain: prompts about retained people checked before and after the deletion.
        n_heldout: held-out documents for perplexity (None: all the world has).
        n_samples: sample generations shown in the report.
        seed: world, shuffles and model initialisation.
        threads: torch threads for training (default: one per core; a tiny model runs faster on one).
    """

    name: str = "default"
    world: str = "default"
    model: str = "llama-small-cpu"
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 8
    max_steps: int = 900
    lr: float = 2e-3
    warmup_steps: int = 40
    precision: str = "auto"
    n_cloze: int | None = 1500
    n_edits: int = 200
    forget_fraction: float = 0.05
    n_retain: int = 600
    n_heldout: int | None = 200
    n_samples: int = 6
    max_new_tokens: int = 32
    seed: int = 0
    threads: int | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    world_overrides: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "QuickstartConfig":
        if name not in QUICKSTART_PRESETS:
            raise ValueError(f"unknown quickstart preset {name!r}; known: {sorted(QUICKSTART_PRESETS)}")
        return cls(**{"name": name, **QUICKSTART_PRESETS[name], **overrides})


QUICKSTART_PRESETS: dict[str, dict[str, Any]] = {
    # 12 minutes on a 2-core CPU with native bf16, 18 on an AVX2-only one
    "default": {},
    # about 2-3 minutes: what the tests run
    "smoke": dict(world="smoke", model="gpt2-small-cpu", vocab_size=1024, max_steps=200, warmup_steps=20, n_cloze=300, n_edits=40, n_retain=150, n_heldout=40, n_samples=3),
}


# ---------------------------------------------------------------------------------------------

def _stage(title: str):
    console.rule(f"[bold]{title}")


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)


def _cloze_items(world, prompts):
    from .evaluate.cloze import ClozeItem
    def key(person: str) -> str:
        split = world.person(person).split
        return world.mention_bucket(person) if split == "train" else split
    return [ClozeItem(c.prompt, c.gold, key(c.person)) for c in prompts]


def _precision(gen, items, force: bool, cfg: QuickstartConfig, keep: int = 0) -> dict:
    from .evaluate.cloze import cloze_precision
    return cloze_precision(gen, items, force_lookup=force, max_new_tokens=cfg.max_new_tokens, keep_samples=keep)


def _train_models(cfg: QuickstartConfig, world, tok, out: Path) -> dict:
    from .checkpoint import is_checkpoint, read_meta
    from .train import train

    docs = [d.segments for d in world.train_documents]
    stats = {}
    for mode in ("lmlm", "standard"):
        run = out / f"train-{mode}"
        if is_checkpoint(run / "checkpoint"):
            console.print(f"{mode}: checkpoint found in {run / 'checkpoint'}, skipping training")
            stats[mode] = read_meta(run / "checkpoint").get("stats", {})
            continue
        _stage(f"3. train {mode.upper()} ({cfg.model}, {cfg.max_steps} steps)")
        stats[mode] = train(train_config(cfg, mode, run, out / "kb"), docs, tok).stats
    return stats


def train_config(cfg: QuickstartConfig, mode: str, run: Path, kb: Path | None = None):
    """The :class:`lmlm.train.TrainConfig` of a quickstart model (``lmlm reproduce`` trains more like it)."""
    from .train import TrainConfig

    return TrainConfig(mode=mode, model=cfg.model, model_overrides=cfg.model_overrides, seq_len=cfg.seq_len,
                       batch_size=cfg.batch_size, micro_batch_size=cfg.batch_size, max_steps=cfg.max_steps, lr=cfg.lr,
                       warmup_steps=cfg.warmup_steps, precision=cfg.precision, seed=cfg.seed, out_dir=str(run),
                       resume=True, kb=str(kb) if kb else None, save_every=max(cfg.max_steps // 4, 50),
                       threads=cfg.threads)


def quickstart(out: str | Path = "runs/quickstart", preset: str = "default", fresh: bool = False,
               **overrides) -> dict:
    """Run the whole story and return the report (also written to ``out/report.json``)."""
    from .checkpoint import load_checkpoint
    from .evaluate.perplexity import dynamic_perplexity, standard_perplexity, static_perplexity
    from .generate import LookupGenerator
    from .kb import KnowledgeBase, Triple
    from .report import write_report
    from .tokens import LookupTokenizer, load_tokenizer, train_bpe
    from .worlds.bios import BiosConfig, BiosWorld

    cfg = QuickstartConfig.from_name(preset, **overrides)
    out = Path(out)
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", asdict(cfg))
    t_start = time.time()
    timings: dict[str, float] = {}

    # 1. world -------------------------------------------------------------------------------
    _stage("1. synthetic biography world")
    t = time.time()
    if (out / "world" / "config.json").exists():
        world = BiosWorld.load(out / "world")
    else:
        world = BiosWorld.generate(BiosConfig.from_name(cfg.world, seed=cfg.seed, **cfg.world_overrides))
        world.save(out / "world")
    console.print(world.stats())
    tok_dir = out / "tokenizer"
    if (tok_dir / "tokenizer.json").exists():
        tok = load_tokenizer(tok_dir)
    else:
        tok = LookupTokenizer(train_bpe((d.plain for d in world.train_documents), vocab_size=cfg.vocab_size))
        tok.save(tok_dir)
    timings["world"] = time.time() - t

    # 2. knowledge base ----------------------------------------------------------------------
    _stage("2. knowledge base")
    t = time.time()
    kb_dir = out / "kb"
    if (kb_dir / "built.json").exists():
        kb = KnowledgeBase.open(kb_dir)
    else:
        if kb_dir.exists():
            shutil.rmtree(kb_dir)
        kb = KnowledgeBase.create(kb_dir)
        kb.add([Triple(e, r, v, source=s) for e, r, v, s in world.triples()], who="quickstart",
               why="facts of the synthetic world at training time")
        _write_json(kb_dir / "built.json", {"version": kb.version, "triples": len(kb)})
    console.print(f"{len(kb)} triples, version {kb.version}")
    timings["kb"] = time.time() - t

    # 3. training ----------------------------------------------------------------------------
    t = time.time()
    train_stats = _train_models(cfg, world, tok, out)
    timings["train"] = time.time() - t

    # 4. evaluation ----------------------------------------------------------------------------
    _stage("4. evaluate, edit the KB, forget, evaluate again")
    t = time.time()
    lmlm_model, _, lmlm_meta = load_checkpoint(out / "train-lmlm" / "checkpoint")
    std_model, _, std_meta = load_checkpoint(out / "train-standard" / "checkpoint")
    # a fresh copy of the KB so re-running the evaluation starts from the trained-on facts
    eval_kb_dir = out / "kb-eval"
    if eval_kb_dir.exists():
        shutil.rmtree(eval_kb_dir)
    kb.close()
    shutil.copytree(kb_dir, eval_kb_dir)
    kb = KnowledgeBase.open(eval_kb_dir)
    lmlm = LookupGenerator(lmlm_model, tok, kb)
    no_db = LookupGenerator(lmlm_model, tok, None, use_db=False)
    standard = LookupGenerator(std_model, tok, None, use_db=False)

    rng = random.Random(cfg.seed)
    forget = world.forget_set(cfg.forget_fraction, seed=cfg.seed)
    forget_set = set(forget)
    cloze = [c for c in world.cloze_set("train", seed=cfg.seed) if c.person not in forget_set]
    if cfg.n_cloze is not None and len(cloze) > cfg.n_cloze:
        cloze = rng.sample(cloze, cfg.n_cloze)
    items = _cloze_items(world, cloze)
    console.print(f"factual precision on {len(items)} cloze prompts")
    fp = {"lmlm": _precision(lmlm, items, True, cfg, keep=cfg.n_samples),
          "lmlm_no_db": _precision(no_db, items, False, cfg, keep=2),
          "standard": _precision(standard, items, False, cfg, keep=2)}
    factual = {k: v["precision"] for k, v in fp.items()}
    factual["n"] = len(items)
    factual["by_mentions"] = {b: {k: fp[k]["by_key"].get(b) for k in fp} for b in ("1", "2-4", "5+")}
    factual["mention_counts"] = {b: sum(1 for it in items if it.key == b) for b in ("1", "2-4", "5+")}

    # perplexity on held-out documents
    ctx = lmlm_model.config.max_position_embeddings if hasattr(lmlm_model.config, "max_position_embeddings") \
        else lmlm_model.config.n_positions
    # documents must fit the context with room for lookups the model writes longer than the oracle's
    held = [d for d in world.heldout_documents if len(tok.encode(d.segments)) <= ctx - 48]
    held = held[: cfg.n_heldout] if cfg.n_heldout else held
    console.print(f"perplexity on {len(held)} held-out documents")
    st = static_perplexity(lmlm_model, tok, [d.segments for d in held])
    dyn = dynamic_perplexity(lmlm, [d.segments for d in held])
    sp = standard_perplexity(std_model, tok, [d.plain for d in held])
    perplexity = {"lmlm": {"static": st["static"], "dynamic": dyn["dynamic"], "normalized": st["normalized"],
                           "role_loss": st["role_loss"], "dynamic_lookups": dyn["lookups"],
                           "dynamic_lookup_found_rate": dyn["lookup_found_rate"]},
                  "standard": sp["perplexity"], "org_tokens": st["org_tokens"], "documents": len(held)}

    # added knowledge: people never in the text, only added to the KB now
    added = world.people_in("added")
    kb.add([Triple(e, r, v, source=s) for e, r, v, s in world.added_triples()], who="quickstart",
           why="people added after training")
    added_items = _cloze_items(world, [world.cloze(p.name, r) for p in added for r in p.facts])
    ak = _precision(lmlm, added_items, True, cfg, keep=2)
    ak_std = _precision(standard, added_items, False, cfg)
    added_knowledge = {"lmlm": ak["precision"], "standard": ak_std["precision"], "n": len(added_items),
                       "people": len(added)}

    # edits: change a value in the KB; the model should say the new one
    edits = [e for e in world.edits(cfg.n_edits, seed=cfg.seed) if e.person not in forget_set]
    for e in edits:
        kb.edit(e.person, e.relation, e.new_value, who="quickstart", why="edit after training")
    from .evaluate.cloze import ClozeItem
    edit_items = [ClozeItem(world.cloze(e.person, e.relation).prompt, e.new_value, "edit") for e in edits]
    ed = _precision(lmlm, edit_items, True, cfg, keep=2)
    old_items = [ClozeItem(it.prompt, e.old_value, "old") for it, e in zip(edit_items, edits)
                 if e.old_value != e.new_value]
    ed_old = _precision(lmlm, old_items, True, cfg)
    edits_report = {"lmlm": ed["precision"], "lmlm_old_value": ed_old["precision"], "n": len(edit_items)}

    # unlearning: delete every fact of a forget set of people
    edited = {(e.person, e.relation) for e in edits}
    forget_items = _cloze_items(world, [world.cloze(p, r) for p in forget for r in world.person(p).facts])
    retain_pool = [c for c in world.cloze_set("train", seed=cfg.seed + 1)
                   if c.person not in forget_set and (c.person, c.relation) not in edited]
    retain_items = _cloze_items(world, rng.sample(retain_pool, min(cfg.n_retain, len(retain_pool))))
    f_before = _precision(lmlm, forget_items, True, cfg)["precision"]
    r_before = _precision(lmlm, retain_items, True, cfg)["precision"]
    t0 = time.perf_counter()
    deleted = 0
    for person in forget:
        deleted += kb.delete(entity=person, who="quickstart", why="forget request")
    forget_seconds = time.perf_counter() - t0
    f_after_res = _precision(lmlm, forget_items, True, cfg, keep=2)
    r_after = _precision(lmlm, retain_items, True, cfg)["precision"]
    f_std = _precision(standard, forget_items, False, cfg)["precision"]
    unlearning = {"forget_before": f_before, "forget_after": f_after_res["precision"], "retain_before": r_before,
                  "retain_after": r_after, "seconds": forget_seconds, "people": len(forget),
                  "facts_deleted": deleted, "forget_prompts": len(forget_items),
                  "retain_prompts": len(retain_items), "standard_forget": f_std}
    timings["evaluate"] = time.time() - t
    timings["total"] = time.time() - t_start

    models = {}
    for mode, meta in (("lmlm", lmlm_meta), ("standard", std_meta)):
        s = train_stats.get(mode) or meta.get("stats", {})
        models[mode] = {"preset": cfg.model, "parameters": s.get("parameters"),
                        "training_tokens": s.get("tokens"), "trained_tokens": s.get("trained_tokens"),
                        "training_seconds": s.get("seconds"), "steps": s.get("steps"),
                        "final_loss": s.get("final_loss"), "epochs": s.get("epochs")}
    report = {
        "preset": cfg.name,
        "config": asdict(cfg),
        "world": world.stats(),
        "kb": {"triples_at_training": len(world.triples()), "final_version": kb.version, "final_triples": len(kb)},
        "factual_precision": factual,
        "added_knowledge": added_knowledge,
        "edits": edits_report,
        "unlearning": unlearning,
        "perplexity": perplexity,
        "models": models,
        "timings_seconds": timings,
        "samples": {"lmlm": fp["lmlm"]["samples"], "lmlm_no_db": fp["lmlm_no_db"]["samples"],
                    "standard": fp["standard"]["samples"], "added": ak["samples"], "edits": ed["samples"],
                    "forgotten": f_after_res["samples"]},
    }
    _write_json(out / "report.json", report)
    write_report(report, out)
    kb.close()
    console.print(f"[bold green]done in {timings['total']:.0f} s[/]: {out / 'report.md'}")
    return report
