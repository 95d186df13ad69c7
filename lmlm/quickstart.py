"""The paper's whole story on a synthetic biography world, on a CPU: ``lmlm quickstart``.

1. generate a biography world and its annotated corpus;
2. build the knowledge base from the world's triples;
3. train LMLM (masked loss on annotated text) and Standard (plain loss on the stripped text) with
   the same tokenizer, block order and budget (optimizer steps x batch x block length);
4. evaluate both, then change the KB (add people, edit facts, delete a forget set) and evaluate again;
5. write ``OUT/report.json``, ``OUT/report.md`` with plots and sample generations, and both checkpoints.

Each stage writes its outputs under OUT (the world, tokenizer and KB each with its ``done.json``, the
models their checkpoints) and is skipped when they are already there, so an interrupted run continues
where it stopped (``--fresh`` starts over); :mod:`lmlm.stages` is the runner.
"""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console

from .jsonio import write_json
from .recipe import RecipeError, from_preset
from .stages import copy_stage, finish_stage, stage_done

__all__ = ["QuickstartConfig", "QUICKSTART_PRESETS", "quickstart", "train_config", "heldout_perplexity",
           "stated_split"]

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
        eval_batch_size: rows per generation batch of the evaluation and the protocols (greedy rows come
            out the same at any size; 128 rows of the small models take two thirds of the time of 32 on 2 cores).
        protocol_edits: sequential KB edit counts of the editing field's protocol (CounterFact rewrites of the
            trained-on facts: ``lmlm.evaluate.protocols``; empty: no editing section).
        protocol_weight_edits: FT-L's counts on the Standard model's weights beside them (empty: none).
        protocol_sample, protocol_fluency: edited facts scored per count; fluency texts (60 tokens each).
        protocol_forget: the forgetting audit (FULL, DEL-ON, DEL-OFF, residue per adversarial kind) of the
            forget set, with the Standard model's guess rate on the held-out people's facts.
        seed: world, shuffles and model initialisation.
        threads: torch threads for training (default: one per core; a tiny model runs faster on one).
    """

    name: str = "default"
    world: str = "default"
    model: str = "llama-small-cpu"
    vocab_size: int = 4096
    seq_len: int = 256
    batch_size: int = 8
    max_steps: int = 300  # the fewest that keep every claim with margin: docs/quickstart.md, budget table
    lr: float = 2e-3
    warmup_steps: int = 40
    precision: str = "auto"
    n_cloze: int | None = 600
    n_edits: int = 200
    forget_fraction: float = 0.05
    n_retain: int = 300
    n_heldout: int | None = 200
    n_samples: int = 6
    max_new_tokens: int = 32
    eval_batch_size: int = 128
    protocol_edits: list[int] = field(default_factory=lambda: [1, 100, 1000, 10000])
    protocol_weight_edits: list[int] = field(default_factory=lambda: [1, 100])
    protocol_sample: int = 100
    protocol_fluency: int = 100
    protocol_forget: bool = True
    seed: int = 0
    threads: int | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    world_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .evaluate.editing import bad_counts

        for name in ("protocol_edits", "protocol_weight_edits"):
            counts = getattr(self, name)
            if bad_counts(counts):
                raise RecipeError(f"quickstart: {name} = {counts} must hold edit counts of at least 1")
        for name, least in (("eval_batch_size", 1), ("protocol_sample", 1), ("protocol_fluency", 0)):
            if getattr(self, name) < least:
                raise RecipeError(f"quickstart: {name} = {getattr(self, name)} must be at least {least}")

    @classmethod
    def from_name(cls, name: str, sets: Iterable[str] = (), **overrides) -> "QuickstartConfig":
        """Preset ``name`` (of :data:`QUICKSTART_PRESETS`, or a ``.toml`` file of these fields), then the
        ``key=value`` assignments of ``sets`` (``--set``), then ``overrides`` (:func:`lmlm.recipe.from_preset`)."""
        return from_preset(cls, QUICKSTART_PRESETS, name, sets, kind="quickstart", **overrides)


QUICKSTART_PRESETS: dict[str, dict[str, Any]] = {
    # the budget table in docs/quickstart.md: the fewest steps that keep every claim with margin
    "default": {},
    # what the tests run: about 3 minutes on 2 cores with native bf16, 10 on 2 AVX2 cores without
    "smoke": dict(world="smoke", model="gpt2-small-cpu", vocab_size=1024, max_steps=200, warmup_steps=20, n_cloze=300, n_edits=40, n_retain=150, n_heldout=40, n_samples=3,
                  protocol_edits=[1, 20], protocol_weight_edits=[1], protocol_sample=20, protocol_fluency=8),
}


# ---------------------------------------------------------------------------------------------

def _stage(title: str):
    console.rule(f"[bold]{title}")


def _cloze_items(world, prompts):
    from .evaluate.cloze import ClozeItem
    def key(person: str) -> str:
        split = world.person(person).split
        return world.mention_bucket(person) if split == "train" else split
    return [ClozeItem(c.prompt, c.gold, key(c.person)) for c in prompts]


def _precision(gen, items, force: bool, cfg: QuickstartConfig, keep: int = 0, results: bool = False) -> dict:
    from .evaluate.cloze import cloze_precision
    return cloze_precision(gen, items, force_lookup=force, max_new_tokens=cfg.max_new_tokens,
                           batch_size=cfg.eval_batch_size, keep_samples=keep, keep_results=results)


def _kb_wrong_entity(kb, people: list[str], relations, matching: str) -> dict:
    """Every key of ``people`` (none of whom has facts in ``kb``) looked up: how many got someone's fact."""
    keys = [(p, r) for p in people for r in relations]
    got = kb.resolve_batch(keys, matching=matching)
    return {"wrong": sum(1 for m in got if m), "n": len(keys),
            "examples": [[e, r, m.entity, round(m.score, 3)] for (e, r), m in zip(keys, got) if m][:5]}


def _misses(results, limit: int = 10) -> dict:
    """Why the lookups of ``results`` that the KB did not answer missed: counts by reason, and examples."""
    from collections import Counter
    misses = [t for r in results for t in r.trace if not t.found and t.miss_reason]
    return {"by_reason": dict(Counter(t.miss_reason for t in misses)), "examples": [
        {"query": [t.query_entity, t.query_relation], "reason": t.miss_reason, "detail": t.miss_detail,
         "candidates": [list(c) for c in t.candidates[:3]]} for t in misses[:limit]]}


COPY_BIAS = 5.0  # the added-knowledge row with `lmlm generate --copy-bias 5`: the value's tokens favoured after the call
NAME_BIAS = 10.0  # rows with `lmlm generate --name-bias 10`: a query's entity kept on the names the text gives


def _wrong_answers(items, hits, results, limit: int = 10) -> dict:
    """The items a system got wrong, split by what its lookups did: no lookup answered (the KB missed
    or none was written), or one answered and the text after it still missed the gold value."""
    wrong = [(it, r) for it, r, h in zip(items, results, hits) if not h]
    answered = [(it, r) for it, r in wrong if any(t.found for t in r.trace)]
    unanswered = [(it, r) for it, r in wrong if not any(t.found for t in r.trace)]
    return {"n": len(wrong), "lookup_answered": len(answered), "no_answer": len(unanswered),
            "examples": [{"prompt": it.prompt[-80:], "gold": it.gold, "text": r.text[:160]}
                         for it, r in answered[:limit // 2] + unanswered[:limit // 2]]}


def stated_split(hits: dict[str, list[bool]], stated: list[bool]) -> dict:
    """Precision of each system over the items whose fact a training document states and over those
    only the KB holds (no Standard model could learn these): ``{"stated": {system: p}, "kb_only": ...}``."""
    def share(h, flag):
        sel = [x for x, s in zip(h, stated) if s is flag]
        return sum(sel) / len(sel) if sel else None
    return {name: {k: share(h, flag) for k, h in hits.items()} for name, flag in (("stated", True), ("kb_only", False))}


def heldout_perplexity(world, tok, lmlm_model, std_model, kb, n_heldout: int | None) -> dict:
    """Static, dynamic and normalized perplexity of the LMLM and the Standard model's, on held-out
    documents, for all and by group: ``trained`` (people in the training text) and ``added`` (people
    whose facts reached the KB after training). ``kb`` must hold the facts of every held-out
    document, as the paper's database covers its validation text."""
    from .evaluate.perplexity import dynamic_perplexity, standard_perplexity, static_perplexity
    from .generate import LookupGenerator

    c = lmlm_model.config
    ctx = getattr(c, "max_position_embeddings", None) or c.n_positions
    # documents must fit the context with room for lookups the model writes longer than the oracle's
    held = [d for d in world.heldout_documents if len(tok.encode(d.segments)) <= ctx - 48]
    held = held[:n_heldout] if n_heldout else held
    groups = ["trained" if world.person(d.person).split == "train" else "added" for d in held]
    console.print(f"perplexity on {len(held)} held-out documents ({groups.count('trained')} about trained people, "
                  f"{groups.count('added')} about added ones)")
    st = static_perplexity(lmlm_model, tok, [d.segments for d in held], groups=groups)
    dyn = dynamic_perplexity(LookupGenerator(lmlm_model, tok, kb), [d.segments for d in held], groups=groups)
    sp = standard_perplexity(std_model, tok, [d.plain for d in held], groups=groups)
    by_group = {g: {"static": st["by_group"][g]["static"], "dynamic": dyn["by_group"][g]["dynamic"],
                    "normalized": st["by_group"][g]["normalized"], "standard": sp["by_group"][g]["perplexity"],
                    "documents": st["by_group"][g]["documents"], "org_tokens": st["by_group"][g]["org_tokens"],
                    **{k: dyn["by_group"][g][k] for k in ("lookups", "lookup_found_rate", "lookup_matched_rate",
                                                          "lookup_wrong_entity")}}
                for g in ("trained", "added") if g in st["by_group"]}
    return {"lmlm": {"static": st["static"], "dynamic": dyn["dynamic"], "normalized": st["normalized"],
                     "role_loss": st["role_loss"], "dynamic_lookups": dyn["lookups"],
                     "dynamic_lookup_found_rate": dyn["lookup_found_rate"],
                     "dynamic_lookup_matched_rate": dyn["lookup_matched_rate"],
                     "dynamic_lookup_wrong_entity": dyn["lookup_wrong_entity"]},
            "standard": sp["perplexity"], "org_tokens": st["org_tokens"], "documents": len(held),
            "by_group": by_group}


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
               sets: Iterable[str] = (), **overrides) -> dict:
    """Run the whole story and return the report (also written to ``out/report.json``); ``preset``,
    ``sets`` and ``overrides`` as :meth:`QuickstartConfig.from_name` reads them."""
    cfg = QuickstartConfig.from_name(preset, sets, **overrides)
    out = Path(out)
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", asdict(cfg))
    t_start = time.time()
    timings: dict[str, float] = {}

    t = time.time()
    world, tok = _world_and_tokenizer(cfg, out)
    timings["world"] = time.time() - t
    t = time.time()
    kb = _knowledge_base(world, out)
    timings["kb"] = time.time() - t
    t = time.time()
    train_stats = _train_models(cfg, world, tok, out)
    timings["train"] = time.time() - t

    _stage("4. evaluate, edit the KB, forget, evaluate again")
    t = time.time()
    kb, dec, metas = _evaluation_setup(out, kb, tok)
    rng = random.Random(cfg.seed)
    forget = world.forget_set(cfg.forget_fraction, seed=cfg.seed)
    factual, wrong, samples = _evaluate_trained(cfg, world, dec, kb, set(forget), rng)
    added_knowledge, perplexity = _evaluate_added(cfg, world, dec, kb, samples)
    edits_report, edited = _evaluate_edits(cfg, world, dec, kb, set(forget), samples)
    unlearning = _evaluate_forgetting(cfg, world, dec, kb, forget, edited, rng, wrong, samples)
    timings["evaluate"] = time.time() - t
    t = time.time()
    protocols = _protocols(cfg, world, dec, out)
    timings["protocols"] = time.time() - t
    timings["total"] = time.time() - t_start

    models = {}
    for mode, meta in zip(("lmlm", "standard"), metas):
        s = train_stats.get(mode) or meta.get("stats", {})
        models[mode] = {"preset": cfg.model, "parameters": s.get("parameters"),
                        "training_tokens": s.get("block_tokens", s.get("tokens")),
                        "trained_tokens": s.get("trained_tokens"),
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
        "wrong_entity": wrong,
        "perplexity": perplexity,
        "protocols": protocols,
        "models": models,
        "timings_seconds": timings,
        "samples": samples,
    }
    from .report import write_quickstart_report

    write_json(out / "report.json", report)
    write_quickstart_report(report, out)
    kb.close()
    console.print(f"[bold green]done in {timings['total']:.0f} s[/]: {out / 'report.md'}")
    return report


def _protocols(cfg: QuickstartConfig, world, dec: "_Decoders", out: Path) -> dict | None:
    """Editing and forgetting by the fields' protocols (:mod:`lmlm.evaluate.protocols`) on copies of the
    trained-on KB: the same forget set as the unlearning above, the held-out people as never read."""
    if not (cfg.protocol_edits or cfg.protocol_weight_edits or cfg.protocol_forget):
        return None
    _stage("5. editing and forgetting by the fields' protocols")
    from .evaluate.editing import world_facts
    from .evaluate.forgetting import world_sets
    from .evaluate.protocols import run_protocols

    forget, unseen = world_sets(world, cfg.forget_fraction, cfg.seed) if cfg.protocol_forget else ([], [])
    return run_protocols((dec.lmlm.model, dec.lmlm.tok), out / "kb", out / "protocols", facts=world_facts(world),
                         world=world, standard=(dec.standard.model, dec.standard.tok), forget=forget, unseen=unseen,
                         edits=cfg.protocol_edits, weight_edits=cfg.protocol_weight_edits, sample=cfg.protocol_sample,
                         fluency_n=cfg.protocol_fluency, decoding={"name_bias": NAME_BIAS, "copy_bias": COPY_BIAS},
                         max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size, seed=cfg.seed,
                         log=console.print)


def _world_and_tokenizer(cfg: QuickstartConfig, out: Path):
    """1. the biography world and the tokenizer trained on its stripped text (loaded when already there)."""
    from .tokens import LookupTokenizer, load_tokenizer, train_bpe
    from .worlds.bios import BiosConfig, BiosWorld

    _stage("1. synthetic biography world")
    world_dir, tok_dir = out / "world", out / "tokenizer"
    if stage_done(world_dir) is not None:
        world = BiosWorld.load(world_dir)
    else:
        world = BiosWorld.generate(BiosConfig.from_name(cfg.world, seed=cfg.seed, **cfg.world_overrides))
        world.save(world_dir)
        finish_stage(world_dir, world.stats())
    console.print(world.stats())
    if stage_done(tok_dir) is not None:
        return world, load_tokenizer(tok_dir)
    tok = LookupTokenizer(train_bpe((d.plain for d in world.train_documents), vocab_size=cfg.vocab_size))
    tok.save(tok_dir)
    finish_stage(tok_dir, {"vocab_size": cfg.vocab_size})
    return world, tok


def _knowledge_base(world, out: Path):
    """2. the KB of the world's facts at training time (opened when a finished one is there)."""
    from .kb import KnowledgeBase, Triple

    _stage("2. knowledge base")
    kb_dir = out / "kb"
    if stage_done(kb_dir, legacy=kb_dir / "built.json") is not None:
        kb = KnowledgeBase.open(kb_dir)
    else:
        if kb_dir.exists():
            shutil.rmtree(kb_dir)
        kb = KnowledgeBase.create(kb_dir)
        kb.add([Triple(e, r, v, source=s) for e, r, v, s in world.triples()], who="quickstart",
               why="facts of the synthetic world at training time")
        kb.add_aliases(world.aliases("train"), who="quickstart", why="other names of the people in the KB")
        finish_stage(kb_dir, {"version": kb.version, "triples": len(kb)})
    console.print(f"{len(kb)} triples, version {kb.version}")
    return kb


@dataclass
class _Decoders:
    """The decodings every evaluation compares, one model and KB each."""

    lmlm: Any  # the default: entity-aware lookups, name and copy bias (`lmlm generate`'s defaults)
    plain: Any  # the paper's plain decoding, entity-aware lookups
    paper: Any  # plain decoding, the paper's single-key cosine match
    no_db: Any  # the LMLM without its KB
    standard: Any  # the Standard model


def _evaluation_setup(out: Path, kb, tok):
    """Both checkpoints loaded, a fresh copy of the KB (so that re-running the evaluation starts from the
    trained-on facts) and the decoders over it."""
    from .checkpoint import load_checkpoint
    from .generate import LookupGenerator
    from .kb import KnowledgeBase

    lmlm_model, _, lmlm_meta = load_checkpoint(out / "train-lmlm" / "checkpoint")
    std_model, _, std_meta = load_checkpoint(out / "train-standard" / "checkpoint")
    eval_kb_dir = out / "kb-eval"
    kb.close()
    copy_stage(out / "kb", eval_kb_dir)
    kb = KnowledgeBase.open(eval_kb_dir)
    # the default decoding: a small model otherwise slips to a name it was trained on ("James Girard" for
    # Jackson Girard) or off the value it was given
    dec = _Decoders(lmlm=LookupGenerator(lmlm_model, tok, kb, copy_bias=COPY_BIAS, name_bias=NAME_BIAS),
                    plain=LookupGenerator(lmlm_model, tok, kb),
                    paper=LookupGenerator(lmlm_model, tok, kb, matching="key"),
                    no_db=LookupGenerator(lmlm_model, tok, None, use_db=False),
                    standard=LookupGenerator(std_model, tok, None, use_db=False))
    return kb, dec, (lmlm_meta, std_meta)


def _evaluate_trained(cfg: QuickstartConfig, world, dec: _Decoders, kb, forget_set: set, rng):
    """Factual precision on trained people, by mentions and by whether a document states the fact, and
    the wrong-entity counts of those prompts and of people never in the KB."""
    from .evaluate.cloze import wrong_entity
    from .worlds.bios import RELATIONS

    cloze = [c for c in world.cloze_set("train", seed=cfg.seed) if c.person not in forget_set]
    if cfg.n_cloze is not None and len(cloze) > cfg.n_cloze:
        cloze = rng.sample(cloze, cfg.n_cloze)
    items = _cloze_items(world, cloze)
    console.print(f"factual precision on {len(items)} cloze prompts")
    fp = {"lmlm": _precision(dec.lmlm, items, True, cfg, keep=cfg.n_samples, results=True),
          "lmlm_paper": _precision(dec.paper, items, True, cfg, results=True),
          "lmlm_no_db": _precision(dec.no_db, items, False, cfg, keep=2),
          "standard": _precision(dec.standard, items, False, cfg, keep=2)}
    subjects = [c.person for c in cloze]
    res, res_paper = fp["lmlm"].pop("results"), fp["lmlm_paper"].pop("results")
    fp_plain = _precision(dec.plain, items, True, cfg, results=True)
    wrong = {"cloze": {**wrong_entity(res, subjects), "misses": _misses(res),
                       "paper": {**wrong_entity(res_paper, subjects), "misses": _misses(res_paper)},
                       "plain": {**wrong_entity(fp_plain["results"], subjects),
                                 "misses": _misses(fp_plain["results"])}}}
    # people who were never in the KB (the world's held-out people): any answer is someone else's
    absent = [p.name for p in world.people_in("heldout")]
    absent_items = _cloze_items(world, [world.cloze(p, r) for p in absent for r in world.person(p).facts])
    absent_subjects = [p for p in absent for _ in world.person(p).facts]
    wrong["absent"] = {}
    absent_keys = {m: _kb_wrong_entity(kb, absent, RELATIONS, m) for m in ("entity", "key")}  # no decoding in it
    for name, gen, matching in (("lmlm", dec.lmlm, "entity"), ("paper", dec.paper, "key"), ("plain", dec.plain, "entity")):
        res = _precision(gen, absent_items, True, cfg, results=True)["results"]
        row = {**absent_keys[matching], "generated": wrong_entity(res, absent_subjects)}
        if name == "lmlm":
            row["misses"] = _misses(res)
            wrong["absent"].update(row)
        else:
            wrong["absent"][name] = row
    factual = {k: v["precision"] for k, v in fp.items()}
    factual.update(lmlm_plain=fp_plain["precision"], name_bias=NAME_BIAS, copy_bias=COPY_BIAS, n=len(items))
    factual["by_mentions"] = {b: {k: fp[k]["by_key"].get(b) for k in fp} for b in ("1", "2-4", "5+")}
    factual["mention_counts"] = {b: sum(1 for it in items if it.key == b) for b in ("1", "2-4", "5+")}
    # facts no training document states are in the KB only: no Standard model could learn them
    stated = [world.stated(c.person, c.relation) for c in cloze]
    hits = {k: v["hits"] for k, v in fp.items()}
    factual["by_stated"] = stated_split(hits, stated)
    factual["stated_counts"] = {"stated": sum(stated), "kb_only": len(stated) - sum(stated)}
    factual["by_mentions_stated"] = {
        b: {**stated_split({k: [h for h, it in zip(v, items) if it.key == b] for k, v in hits.items()},
                           [s for s, it in zip(stated, items) if it.key == b])["stated"],
            "kb_only_prompts": sum(1 for s, it in zip(stated, items) if it.key == b and not s)}
        for b in ("1", "2-4", "5+")}
    samples = {k: fp[k]["samples"] for k in ("lmlm", "lmlm_no_db", "standard")}
    return factual, wrong, samples


def _evaluate_added(cfg: QuickstartConfig, world, dec: _Decoders, kb, samples: dict):
    """Added knowledge (people never in the text, only added to the KB now) and the held-out perplexity,
    with a KB that holds the facts of every held-out document."""
    from .kb import Triple

    added = world.people_in("added")
    kb.add([Triple(e, r, v, source=s) for e, r, v, s in world.added_triples()], who="quickstart",
           why="people added after training")
    perplexity = heldout_perplexity(world, dec.lmlm.tok, dec.lmlm.model, dec.standard.model, kb, cfg.n_heldout)
    added_items = _cloze_items(world, [world.cloze(p.name, r) for p in added for r in p.facts])
    kb.add_aliases(world.aliases("added"), who="quickstart", why="other names of the people added")
    ak = _precision(dec.lmlm, added_items, True, cfg, keep=2, results=True)
    ak_res = ak.pop("results")
    samples["added"] = ak["samples"]
    return {"lmlm": ak["precision"], "lmlm_paper": _precision(dec.paper, added_items, True, cfg)["precision"],
            "lmlm_plain": _precision(dec.plain, added_items, True, cfg)["precision"],
            "standard": _precision(dec.standard, added_items, False, cfg)["precision"],
            "copy_bias": COPY_BIAS, "name_bias": NAME_BIAS, "n": len(added_items), "people": len(added),
            "misses": _misses(ak_res), "wrong_answers": _wrong_answers(added_items, ak["hits"], ak_res)}, perplexity


def _evaluate_edits(cfg: QuickstartConfig, world, dec: _Decoders, kb, forget_set: set, samples: dict):
    """Values changed in the KB: the share of prompts that state the new one, and the old one."""
    from .evaluate.cloze import ClozeItem

    edits = [e for e in world.edits(cfg.n_edits, seed=cfg.seed) if e.person not in forget_set]
    for e in edits:
        kb.edit(e.person, e.relation, e.new_value, who="quickstart", why="edit after training")
    edit_items = [ClozeItem(world.cloze(e.person, e.relation).prompt, e.new_value, "edit") for e in edits]
    ed = _precision(dec.lmlm, edit_items, True, cfg, keep=2)
    samples["edits"] = ed["samples"]
    old_items = [ClozeItem(it.prompt, e.old_value, "old") for it, e in zip(edit_items, edits)
                 if e.old_value != e.new_value]
    report = {"lmlm": ed["precision"], "lmlm_old_value": _precision(dec.lmlm, old_items, True, cfg)["precision"],
              "n": len(edit_items)}
    return report, {(e.person, e.relation) for e in edits}


def _evaluate_forgetting(cfg: QuickstartConfig, world, dec: _Decoders, kb, forget: list, edited: set, rng,
                         wrong: dict, samples: dict) -> dict:
    """Unlearning: every fact of a forget set of people deleted; their prompts and those of retained people
    before and after, for each decoding, and the wrong-entity counts of the deleted people."""
    from .evaluate.cloze import wrong_entity
    from .worlds.bios import RELATIONS

    forget_set = set(forget)
    forget_items = _cloze_items(world, [world.cloze(p, r) for p in forget for r in world.person(p).facts])
    retain_pool = [c for c in world.cloze_set("train", seed=cfg.seed + 1)
                   if c.person not in forget_set and (c.person, c.relation) not in edited]
    retain_items = _cloze_items(world, rng.sample(retain_pool, min(cfg.n_retain, len(retain_pool))))
    before = {"forget_before": _precision(dec.lmlm, forget_items, True, cfg)["precision"]}
    for name, gen in (("", dec.lmlm), ("_paper", dec.paper), ("_plain", dec.plain)):
        before[f"retain_before{name}"] = _precision(gen, retain_items, True, cfg)["precision"]
    t0 = time.perf_counter()
    deleted = sum(kb.delete(entity=person, who="quickstart", why="forget request") for person in forget)
    forget_seconds = time.perf_counter() - t0
    after, generated = {}, {}
    for name, gen in (("", dec.lmlm), ("_paper", dec.paper), ("_plain", dec.plain)):
        f = _precision(gen, forget_items, True, cfg, keep=2 if not name else 0, results=True)
        generated[name] = wrong_entity(f.pop("results"), [p for p in forget for _ in world.person(p).facts])
        after[f"forget_after{name}"] = f["precision"]
        after[f"retain_after{name}"] = _precision(gen, retain_items, True, cfg)["precision"]
        if not name:
            samples["forgotten"] = f["samples"]
    deleted_keys = _kb_wrong_entity(kb, forget, RELATIONS, "entity")  # the keys alone: the same for both decodings
    wrong["deleted"] = {**deleted_keys, "generated": generated[""],
                        "paper": {**_kb_wrong_entity(kb, forget, RELATIONS, "key"), "generated": generated["_paper"]},
                        "plain": {**deleted_keys, "generated": generated["_plain"]}}
    return {**before, **after, "seconds": forget_seconds, "people": len(forget), "facts_deleted": deleted,
            "forget_prompts": len(forget_items), "retain_prompts": len(retain_items),
            "standard_forget": _precision(dec.standard, forget_items, False, cfg)["precision"]}
