"""``run_pipeline``: the stages of a recipe, each skipped when its outputs are already in OUT.

======================  ==================================================================================
``OUT/corpus``          the documents in the schema of :mod:`lmlm.corpus`, split into train and held-out
                        (``documents.jsonl``); for a Wikipedia dump also the infobox annotation
                        (``infobox.jsonl``, ``wikipedia/triples.jsonl``)
``OUT/annotate``        every method's calls merged (``documents.jsonl``), the KB's triples, the LLM path's
                        steps under ``llm/`` (seed, correct, annotator, run), ``report.json``
``OUT/kb``              the knowledge base (``lmlm kb build`` on ``annotate/triples.jsonl``, with the dump's aliases)
``OUT/train-MODE``      the LMLM and the Standard model (``lmlm train``), ``OUT/data`` their documents
``OUT/eval``            cloze prompts (``cloze/*.jsonl``, LAMA T-REx format), one results JSON per model and
                        split, ``edits.json``
``OUT/report.json``     machine-readable results; ``OUT/report.md`` with figures for people
======================  ==================================================================================

A stage is done when its folder holds ``done.json``; rerunning the same command skips finished
stages and resumes an interrupted one (training from its last saved state, the annotator from its
last finished document). ``until`` stops a run after one stage (:data:`UNTIL`), and the device may
change between runs of one folder (say the CPU stages on a laptop, the rest on a GPU machine):
``OUT/runs.jsonl`` records each run's device and the stages it reached.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from ..corpus import Document, corpus_stats, read_documents, write_documents
from ..jsonio import read_json, write_json
from ..stages import Stopped, finish_stage, stage_done, stop_after
from .recipe import Recipe, RecipeError, recipe_json
from .data import chunks as chunks_of, fact_documents_of, facts_split, infobox_split, plain_chunks

__all__ = ["run_pipeline", "STAGES", "UNTIL"]

STAGES = ("corpus", "annotate", "kb", "train", "evaluate", "report")
LLM_STEPS = ("seed", "correct", "distill")  # the LLM path's steps a run can stop after
UNTIL = ("corpus", *LLM_STEPS, "annotate", "kb", "train")  # every stage a run can stop after
console = Console(stderr=True)


def _log(msg: str) -> None:
    console.print(msg, highlight=False)


def _is_dump(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".xml", ".xml.bz2"))


# -- 1. corpus ------------------------------------------------------------------------------------------

def _assign_splits(docs: list[Document], heldout: float, seed: int, has_facts) -> list[Document]:
    """Hold out a seeded share of the documents, alike among documents with reference facts and without."""
    if any(d.split for d in docs):
        return [Document(d.id, d.annotated, d.text, d.source, d.split or "train", d.meta) for d in docs]
    rng = random.Random(seed)
    held: set[str] = set()
    for group in ([d for d in docs if has_facts(d)], [d for d in docs if not has_facts(d)]):
        ids = [d.id for d in group]
        rng.shuffle(ids)
        held.update(ids[:round(heldout * len(ids))])
    return [Document(d.id, d.annotated, d.text, d.source, "heldout" if d.id in held else "train", d.meta)
            for d in docs]


def _fingerprint(src: Path) -> dict:
    """The corpus file's size and, up to 512 MB, its SHA-256: a corpus edited in place is another corpus."""
    from ..kb.ingest import head_sha256

    if not src.is_file():
        return {}
    size = src.stat().st_size
    return {"bytes": size} if size > 512 << 20 else {"bytes": size, "sha256": head_sha256(src, size)}


def stage_corpus(recipe: Recipe, out: Path) -> dict:
    folder = out / "corpus"
    if (info := stage_done(folder)) is not None:
        src = Path(info.get("path", ""))
        was = info.get("fingerprint")
        now = _fingerprint(src) if was else None
        if was and now and any(was.get(k) != now.get(k) for k in was):
            change = f"{was['bytes']} -> {now['bytes']} bytes" if was["bytes"] != now["bytes"] else "its contents"
            raise RecipeError(f"{src} changed since {out} read it ({change}): rerun with --fresh to start over "
                              f"on it, or give another --out")
        return info
    t = time.time()
    if not recipe.corpus.path:
        raise RecipeError(f"recipe {recipe.name} names no corpus: pass --corpus (a Wikipedia dump or a document file)")
    src = Path(recipe.corpus.path).expanduser()
    if not src.exists():
        where = "" if src.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()})"
        raise FileNotFoundError(f"no corpus at {src}{where}")
    methods = recipe.annotate.methods
    limit = recipe.corpus.limit or None
    info: dict[str, Any] = {"path": str(src), "fingerprint": _fingerprint(src)}
    if _is_dump(src):
        if "given" in methods:
            raise RecipeError(f"annotate.methods: 'given' needs an annotated document file, and {src} is a dump")
        from ..annotate.wikipedia import annotate_dump

        info["wikipedia"] = annotate_dump(src, folder / "wikipedia", limit=limit)
        annotated = read_documents(folder / "wikipedia" / "documents.jsonl")
    else:
        if "infobox" in methods:
            raise RecipeError(f"annotate.methods: 'infobox' needs a Wikipedia dump (.xml/.xml.bz2), not {src}")
        annotated = read_documents(src)[:limit]
        if methods == ["given"] and not any(d.num_calls for d in annotated):
            raise RecipeError(f"annotate.methods = ['given'] takes the calls the documents carry, and none of the "
                              f"{len(annotated)} documents of {src} has one: annotate them first (lmlm annotate), "
                              f"or add another method")
    annotated = _assign_splits(annotated, recipe.corpus.heldout, recipe.seed, lambda d: d.num_calls > 0)
    if not any(d.split == "train" for d in annotated):  # found now, not by the training after the KB
        why = ("its documents' split fields name no 'train' document" if recipe.corpus.heldout == 0 or
               any(d.split != "heldout" for d in annotated) else f"corpus.heldout = {recipe.corpus.heldout} holds "
               f"out all {len(annotated)} of its documents")
        raise RecipeError(f"{src}: nothing to train on: {why}")
    plain = [Document(d.id, d.text, d.text, d.source, d.split, d.meta) for d in annotated]
    write_documents(folder / "documents.jsonl", plain)
    if any(d.num_calls for d in annotated):
        write_documents(folder / ("infobox.jsonl" if _is_dump(src) else "given.jsonl"), annotated)
    info.update(corpus_stats(plain), seconds=time.time() - t)
    return finish_stage(folder, info)


# -- 2. annotation -------------------------------------------------------------------------------------

def stage_annotate(recipe: Recipe, out: Path, device: str | None, progress: bool, until: str | None = None) -> dict:
    from ..annotate.validate import calls_with_offsets
    from .annotation import call_layer, merge_layers, run_llm, vet_layer

    folder = out / "annotate"
    if (info := stage_done(folder)) is not None:
        return info
    t = time.time()
    docs = read_documents(out / "corpus" / "documents.jsonl")
    layers, report = {}, {}
    infobox = read_documents(out / "corpus" / "infobox.jsonl") if (out / "corpus" / "infobox.jsonl").exists() else None
    if "infobox" in recipe.annotate.methods and infobox:
        layers["infobox"] = call_layer(infobox)
    if "given" in recipe.annotate.methods and (out / "corpus" / "given.jsonl").exists():
        layers["given"] = call_layer(read_documents(out / "corpus" / "given.jsonl"))
    if "llm" in recipe.annotate.methods:
        llm_layers, report["llm"] = run_llm(folder / "llm", docs, infobox, recipe.annotate.llm, device,
                                            recipe.seed, progress=progress, log=_log, until=until)
        keep = recipe.annotate.llm.keep
        reference = _reference(out, layers)
        vetted = {m: vet_layer(layer, reference, keep) for m, layer in llm_layers.items()}
        llm_layers = {m: layer for m, (layer, _) in vetted.items()}
        report["llm"]["vetting"] = {"keep": keep, **{m: c for m, (_, c) in vetted.items()}}
        for m, (_, c) in vetted.items():
            _log(f"{m}: {c['calls']} calls, {c['agrees']} agree with the reference facts, {c['conflicts']} "
                 f"conflict, {c['unknown_entity'] + c['unknown_relation']} name what they do not hold; "
                 f"{c['kept']} kept (annotate.llm.keep = {keep})")
        layers.update(llm_layers)
    merged = merge_layers(docs, layers)
    write_documents(folder / "documents.jsonl", merged)
    n_triples = _write_triples(folder / "triples.jsonl", merged, out / "corpus" / "wikipedia" / "triples.jsonl",
                               calls_with_offsets)
    stats = corpus_stats(merged)
    by_method: dict[str, int] = {}
    for d in merged:
        for m, k in d.meta["calls_by_method"].items():
            by_method[m] = by_method.get(m, 0) + k
    # triples.jsonl holds a fact once per mention (its source beside it); the KB stage counts distinct facts
    seconds = time.time() - t + (report.get("llm") or {}).get("seconds_earlier", 0.0)  # a resumed LLM path's steps
    info = {**stats, "calls_by_method": by_method, "triple_lines": n_triples, **report, "seconds": seconds}
    write_json(folder / "report.json", info)
    _log(f"annotation: {stats['lookup_calls']} calls ({by_method}), text unchanged in "
         f"{stats['text_unchanged']:.1%} of {stats['documents']} documents")
    return finish_stage(folder, info)


def _reference(out: Path, layers: dict):
    """The facts the LLM's calls are checked against: the dump's infobox facts (with its aliases) or
    the corpus's own calls (none: every call names an unknown entity)."""
    from .annotation import Reference

    wiki = out / "corpus" / "wikipedia"
    if (wiki / "triples.jsonl").exists():
        from ..kb.formats import read, read_aliases

        facts, _ = read(wiki / "triples.jsonl", "jsonl")
        names = wiki / "aliases.jsonl"  # empty when the dump has no redirect nor other infobox name
        aliases = read_aliases(names) if names.exists() and names.stat().st_size else ()
        return Reference(((f.entity, f.relation, f.value) for f in facts), aliases)
    given = layers.get("given")
    return Reference((c.entity, c.relation, c.value) for calls in (given or {}).values() for _, c in calls)


def _write_triples(path: Path, merged: list[Document], infobox_triples: Path, calls_with_offsets) -> int:
    """The KB's facts: every infobox fact (mentioned or not) and every call of every other method."""
    n = 0
    with path.open("w", encoding="utf-8") as f:
        if infobox_triples.exists():
            for line in infobox_triples.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    f.write(line + "\n")
                    n += 1
        for d in merged:
            for (q, c), m in zip(calls_with_offsets(d.segments), d.meta["call_methods"]):
                if m != "infobox" or not infobox_triples.exists():
                    f.write(json.dumps({"entity": c.entity, "relation": c.relation, "value": c.value, "source": d.id,
                                        "position": q, "method": m}, ensure_ascii=False) + "\n")
                    n += 1
    return n


# -- 3. knowledge base ----------------------------------------------------------------------------------

def stage_kb(recipe: Recipe, out: Path) -> dict:
    from ..kb import NotAKnowledgeBase, build

    folder = out / "kb"
    if (info := stage_done(folder)) is not None:
        return info
    t = time.time()
    args = dict(who="lmlm pipeline", why=f"recipe {recipe.name}")
    try:
        kb = build(folder, out / "annotate" / "triples.jsonl", **args)
    except NotAKnowledgeBase:  # its creation was cut short (Ctrl-C) before it held anything: made again
        shutil.rmtree(folder)
        kb = build(folder, out / "annotate" / "triples.jsonl", **args)
    aliases = out / "corpus" / "wikipedia" / "aliases.jsonl"  # redirects and infobox names (`lmlm kb build --aliases`)
    if aliases.exists() and aliases.stat().st_size and not kb.aliases():  # a resumed stage does not add them twice
        from ..kb.formats import read_aliases

        kb.add_aliases(read_aliases(aliases), who="lmlm pipeline", why="Wikipedia redirects and infobox names")
    stats = {k: v for k, v in kb.stats().items() if isinstance(v, (int, float, str))}
    kb.close()
    return finish_stage(folder, {**stats, "seconds": time.time() - t})


# -- 4. training ------------------------------------------------------------------------------------------

def _train_config(recipe: Recipe, out: Path, mode: str, tokenizer: Path | None, progress: bool = True):
    from ..train import TrainConfig
    from ..train.folder import holds_run

    spec = recipe.train
    return TrainConfig(
        mode=mode, model=None if spec.init_from else spec.model, model_overrides=spec.model_overrides,
        init_from=spec.init_from or None, tokenizer=str(tokenizer) if tokenizer else None,
        data=str(out / "data" / "train.jsonl"), eval_data=str(out / "data" / "heldout-loss.jsonl")
        if (out / "data" / "heldout-loss.jsonl").exists() else None, kb=str((out / "kb").resolve()),
        seq_len=spec.seq_len, batch_size=spec.batch_size, micro_batch_size=math.gcd(spec.batch_size, 16),
        max_steps=spec.max_steps, lr=spec.lr, warmup_steps=min(spec.warmup_steps, max(spec.max_steps // 5, 1)),
        precision=spec.precision, seed=recipe.seed, out_dir=str(out / f"train-{mode}"),
        resume=holds_run(out / f"train-{mode}"),  # a first run starts without saying there was nothing to resume
        save_every=max(spec.max_steps // 4, 25), cpu=recipe.device == "cpu", threads=spec.threads or None,
        compile=spec.compile, packing=spec.packing, lora=spec.lora, lora_alpha=spec.lora_alpha or None,
        freeze_layers=spec.freeze_layers, progress=progress)


def stage_train(recipe: Recipe, out: Path, progress: bool = True) -> dict:
    from ..checkpoint import is_checkpoint, read_meta
    from ..train import train

    folder = out / "data"
    if not stage_done(folder):
        docs = read_documents(out / "annotate" / "documents.jsonl")
        chunks = chunks_of(docs, recipe.train.chunk_chars)
        # only 'train' is trained on: a corpus's own 'test' or 'validation' documents are held out too
        held = [d for d in chunks if d.split not in (None, "train")]
        trained = [d for d in docs if d.split in (None, "train")]
        if recipe.train.windows:
            from ..data.windows import windows_of

            chunks = windows_of(trained, after_words=recipe.train.after_words, swap=recipe.train.swap,
                                seed=recipe.seed, copies=recipe.train.window_copies)
        train_docs = [d for d in chunks if d.split in (None, "train")]
        if recipe.train.plain:
            train_docs += plain_chunks(trained, recipe.train.plain, recipe.seed)
        facts = fact_documents_of(recipe, out, folder, _log)
        write_documents(folder / "train.jsonl", train_docs + facts)
        if held:
            write_documents(folder / "heldout.jsonl", held)
            n = recipe.train.heldout_chunks
            sample = sorted(random.Random(recipe.seed).sample(held, n), key=held.index) if 0 < n < len(held) else held
            write_documents(folder / "heldout-loss.jsonl", sample)  # what the trainings' held-out loss reads
        tokenizer = None
        if not recipe.train.init_from and recipe.train.tokenizer.startswith("bpe:"):
            from ..tokens import LookupTokenizer, train_bpe

            tok = LookupTokenizer(train_bpe((d.text for d in docs if d.split in (None, "train")),
                                            vocab_size=int(recipe.train.tokenizer[4:])))
            tok.save(folder / "tokenizer")
            tokenizer = str(folder / "tokenizer")
        elif not recipe.train.init_from:
            tokenizer = recipe.train.tokenizer
        finish_stage(folder, {"tokenizer": tokenizer, "train_chunks": len(train_docs), "heldout_chunks": len(held),
                         "fact_documents": len(facts), "windows": recipe.train.windows})
    tokenizer = stage_done(folder)["tokenizer"]
    stats = {}
    for mode in recipe.train.modes:
        run = out / f"train-{mode}"
        if not is_checkpoint(run / "checkpoint"):
            console.rule(f"train {mode.upper()}")
            train(_train_config(recipe, out, mode, tokenizer, progress))
        meta = read_meta(run / "checkpoint")
        got = meta.get("stats", {})
        stats[mode] = {k: got.get(k) for k in ("steps", "tokens", "trained_tokens", "seconds", "final_loss",
                                               "tokens_per_second", "parameters")}
        # the model trained on chunks of the training documents (train.chunk_chars), not on the documents
        stats[mode].update(chunks=got.get("documents"), lookup_calls=got.get("lookup_calls"), eval=got.get("eval"))
    return stats


# -- 5. evaluation -----------------------------------------------------------------------------------------

def stage_evaluate(recipe: Recipe, out: Path) -> dict:
    from ..evaluate.trex import read_trex
    from .facts import ClozeFact, choose_edits, cloze_facts, evaluate_edits, evaluate_models, plain_perplexity, write_trex

    folder = out / "eval"
    if (info := stage_done(folder)) is not None:
        return info
    t = time.time()
    spec = recipe.evaluate
    docs = read_documents(out / "annotate" / "documents.jsonl")
    facts = cloze_facts(docs, spec.cloze_per_split, recipe.seed)
    files = {s: write_trex(f, folder / "cloze" / f"{s}.jsonl") for s, f in sorted(facts.items())}
    if spec.heldout_infobox and (path := infobox_split(recipe, out, folder)) is not None:
        files["heldout_infobox"] = path
    models = {m: out / f"train-{m}" / "checkpoint" for m in recipe.train.modes}
    base = recipe.train.init_from if recipe.train.init_from and spec.base else None
    decoding = {"name_bias": spec.name_bias, "copy_bias": spec.copy_bias}
    args = dict(log=_log, free=spec.free, decoding=decoding)
    table = evaluate_models(folder, files, models, out / "kb", base, spec.constrained, recipe.device,
                            spec.max_new_tokens, spec.batch_size, **args) if files else {}
    held = out / "data" / "facts-heldout.jsonl"
    n_facts = facts_split(recipe, held, folder)
    if n_facts:  # entities no corpus text names, answered from a KB of their own facts
        more = evaluate_models(folder, {"facts": folder / "cloze" / "facts.jsonl"}, models, folder / "kb-facts",
                               base, spec.constrained, recipe.device, spec.max_new_tokens, spec.batch_size, **args)
        for name, splits in more.items():
            table.setdefault(name, {}).update(splits)
    perplexity = None
    if spec.perplexity and (out / "data" / "heldout.jsonl").exists():
        texts = [d.text for d in read_documents(out / "data" / "heldout.jsonl") if d.text.strip()]
        texts = random.Random(recipe.seed).sample(texts, min(spec.perplexity, len(texts)))
        _log(f"perplexity: {len(texts)} held-out plain-text chunks")
        perplexity = plain_perplexity(texts, models, base, recipe.device)
    edits = None
    if "lmlm" in models and spec.edits:
        # candidates: five for each scored edit, of which the first the LMLM states before its edit are scored;
        # the corpus's facts first (every one, not the cloze sample), then those of the entities no text names
        pool = [f for fs in cloze_facts(docs, 0, recipe.seed).values() for f in fs]
        pools = [(choose_edits(pool, 5 * spec.edits, recipe.seed), out / "kb")]
        if n_facts:
            more = [ClozeFact(t.subject, t.relation, t.gold, t.prompt, "facts", "facts", 0)
                    for t in read_trex(folder / "cloze" / "facts.jsonl")]
            pools.append((choose_edits(more, 5 * spec.edits, recipe.seed), folder / "kb-facts"))
        pools = [(chosen, kb) for chosen, kb in pools if chosen]
        if pools:
            _log(f"edits: real facts changed in a copy of the KB, {spec.edits} of those the LMLM states scored")
            edits = evaluate_edits(folder, pools, models["lmlm"], recipe.device, spec.max_new_tokens,
                                   spec.batch_size, decoding, spec.constrained, n=spec.edits)
            write_json(folder / "edits.json", edits)
    cloze = {**{s: len(f) for s, f in facts.items()}, **({"facts": n_facts} if n_facts else {}),
             **({"heldout_infobox": len(read_trex(files["heldout_infobox"]))} if "heldout_infobox" in files else {})}
    info = {"cloze": cloze, "table": table, "perplexity": perplexity,
            "edits": {k: v for k, v in (edits or {}).items() if k != "records"}, "seconds": time.time() - t}
    return finish_stage(folder, info)


def stage_protocols(recipe: Recipe, out: Path) -> dict | None:
    """Editing and forgetting by the fields' protocols (``[protocols]``) on copies of the corpus KB: the
    section of the report (``OUT/protocols``), or ``None`` when the recipe asks for none."""
    from ..checkpoint import load_checkpoint
    from ..device import default_device
    from ..evaluate.editing import kb_facts
    from ..evaluate.forgetting import read_facts, sample_facts
    from ..evaluate.protocols import run_protocols
    from ..kb import KnowledgeBase

    spec, folder = recipe.protocols, out / "protocols"
    if not spec.wanted:
        return None
    console.rule("[bold]editing and forgetting by the fields' protocols")
    if (info := stage_done(folder)) is not None:
        return info
    t = time.time()
    device = default_device(recipe.device)
    models = {mode: load_checkpoint(out / f"train-{mode}" / "checkpoint", device=device)[:2]
              for mode in recipe.train.modes}
    lmlm, standard = models["lmlm"], models.get("standard")
    kb = KnowledgeBase.open(out / "kb")
    facts = kb_facts(kb)
    kb.close()
    cloze = out / "eval" / "cloze"
    forget = sample_facts(read_facts(cloze / "train.jsonl"), spec.forget, recipe.seed) \
        if spec.forget and (cloze / "train.jsonl").exists() else []
    unseen_file = next((f for f in (cloze / "heldout_infobox.jsonl", cloze / "heldout.jsonl") if f.exists()), None)
    unseen = read_facts(unseen_file) if forget and unseen_file else []
    ev = recipe.evaluate
    start = None
    if forget and recipe.train.init_from and ev.base:  # what the pretrained start knew of the forget set
        from .facts import open_base

        start = open_base(recipe.train.init_from, device)
    section = run_protocols(lmlm, out / "kb", folder, facts=facts, standard=standard, start=start, forget=forget,
                            unseen=unseen, edits=spec.edits, weight_edits=spec.weight_edits, sample=spec.sample,
                            fluency_n=spec.fluency_n, fluency_tokens=spec.fluency_tokens,
                            decoding={"name_bias": ev.name_bias, "copy_bias": ev.copy_bias},
                            max_new_tokens=ev.max_new_tokens, batch_size=ev.batch_size, seed=recipe.seed, log=_log)
    return finish_stage(folder, {**section, "seconds": time.time() - t})


# -- the whole run ---------------------------------------------------------------------------------------------

def _device(recipe: Recipe) -> str | None:
    import torch

    if recipe.device == "cuda" and not torch.cuda.is_available():
        raise RecipeError("device = 'cuda' but no CUDA device is visible (use --device cpu or auto)")
    return None if recipe.device == "auto" else recipe.device


def _differences(before: dict, now: dict, where: str = "") -> dict[str, tuple]:
    """Fields of two recipes that differ, by dotted name: (before, now); a field one lacks shows as None."""
    out: dict[str, tuple] = {}
    for k in sorted(set(before) | set(now)):
        a, b = before.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(_differences(a, b, f"{where}{k}."))
        elif a != b:
            out[f"{where}{k}"] = (a, b)
    return out


# the folders (or files) of the first stage that reads each recipe field or section (any other: the corpus's);
# the LLM path's fields each by the step that first reads them: seed, correct, distill, run, then the merge
_LLM = "annotate/llm"
_FIRST_STAGE = {"annotate": ("annotate",), "train": ("train-lmlm", "train-standard"), "evaluate": ("eval",),
                "protocols": ("protocols",),
                "train.chunk_chars": ("data",), "train.tokenizer": ("data",), "train.init_from": ("data",),
                **{f"train.{k}": ("data",) for k in ("windows", "swap", "after_words", "window_copies", "plain")}, "facts": ("data",),
                "annotate.llm": (_LLM,),  # the seed's: model, style, seed_passages, examples, passage_chars, ...
                **{f"annotate.llm.{k}": (f"{_LLM}/correct",) for k in ("correct_drop", "correct_steps")},
                **{f"annotate.llm.{k}": (f"{_LLM}/annotator",) for k in (
                    "distill_steps", "distill_preset", "distill_from", "distill_base", "negatives", "min_f1",
                    "call_bias", "call_threshold", "run_batch_size")},
                "annotate.llm.run_passages": (f"{_LLM}/run",), "annotate.llm.keep": ("annotate/documents.jsonl",)}


def _begun(out: Path, key: str) -> bool:
    """Whether the first stage that reads recipe field ``key`` (``section.name``) has begun in ``out``."""
    parts = key.split(".")
    prefix = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in _FIRST_STAGE),
                  None)
    return any((out / f).exists() for f in _FIRST_STAGE.get(prefix, ("corpus",)))


def _check_folder(recipe: Recipe, out: Path, fresh: bool, until: str | None) -> None:
    """Refuse a folder holding a run of another recipe (the device aside); note this run in ``runs.jsonl``.

    A field whose first stage has not begun may change (the training steps of a run stopped by
    ``--until kb``, the options of a run refused before its first stage): what ran was made the same
    way under the new recipe."""
    import torch

    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = recipe_json(recipe)
    path = out / "recipe.json"
    if path.exists():
        before = read_json(path)
        changed = {k: d for k, d in _differences(before, json.loads(resolved)).items()
                   if k != "device" and _begun(out, k)}
        if changed:
            named = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items())
            raise RecipeError(f"{out} holds a run of another recipe ({named}; see {path}); pass --fresh to start "
                              "over or choose another --out")
    path.write_text(resolved)
    cuda = recipe.device != "cpu" and torch.cuda.is_available()
    record = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": recipe.device,
              "ran_on": torch.cuda.get_device_name(0) if cuda else "cpu",
              "done_before": [s for s in ("corpus", "annotate", "kb") if stage_done(out / s) is not None],
              "until": until}
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


def run_pipeline(recipe: Recipe, out: str | Path, fresh: bool = False, progress: bool = True,
                 until: str | None = None) -> dict | None:
    """Run every stage of ``recipe`` into ``out`` (skipping finished ones) and return the report, or
    ``None`` when ``until`` (one of :data:`UNTIL`) stopped the run after that stage. A run stopped before it
    wrote anything (a corpus refused) leaves no record in ``runs.jsonl``."""
    if until is not None and until not in UNTIL:
        raise RecipeError(f"until: {until!r} is not a stage to stop after; one of {', '.join(UNTIL)}")
    if until in LLM_STEPS and "llm" not in recipe.annotate.methods:
        raise RecipeError(f"until: {until!r} is a step of the LLM path, and annotate.methods has no 'llm'")
    out = Path(out)
    _check_folder(recipe, out, fresh, until)
    before = _outputs(out)
    try:
        return _run_stages(recipe, out, progress, until)
    except BaseException:
        if _outputs(out) == before:  # refused before it wrote anything (a bad corpus file): no part of the run
            _drop_last_run(out)
        raise


def _outputs(out: Path) -> dict[str, int]:
    """Every file of a run folder but its run records, by its time of last change."""
    return {str(p): p.stat().st_mtime_ns for p in out.rglob("*")
            if p.is_file() and not (p.parent == out and p.name in ("runs.jsonl", "recipe.json"))}


def _drop_last_run(out: Path) -> None:
    path = out / "runs.jsonl"
    lines = path.read_text().splitlines(True) if path.exists() else []
    if lines:
        path.write_text("".join(lines[:-1]))


def _run_stages(recipe: Recipe, out: Path, progress: bool, until: str | None) -> dict | None:
    from .report import write_pipeline_report

    if not progress:  # nor the bars transformers draws while loading a model
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    device = _device(recipe)
    timings: dict[str, float] = {}
    t0 = time.time()
    try:
        console.rule(f"[bold]lmlm pipeline {recipe.name}: corpus")
        corpus = stage_corpus(recipe, out)
        stop_after("corpus", until)
        console.rule("[bold]annotation")
        annotation = stage_annotate(recipe, out, device, progress, until)
        if until in LLM_STEPS:  # the LLM path ended before that step, or an earlier run finished the stage
            raise Stopped(until)
        stop_after("annotate", until)
        console.rule("[bold]knowledge base")
        kb = stage_kb(recipe, out)
        stop_after("kb", until)
        t = time.time()
        models = stage_train(recipe, out, progress)
        timings["train_this_run"] = time.time() - t
        stop_after("train", until)
    except Stopped as e:
        _log(f"[bold]stopped after {e.stage}[/]: its outputs are in {out}; the same command without --until "
             "goes on from there (on another device too)")
        return None
    console.rule("[bold]evaluation")
    evaluation = stage_evaluate(recipe, out)
    protocols = stage_protocols(recipe, out)
    timings["this_run"] = time.time() - t0
    report = write_pipeline_report(recipe, out, corpus, annotation, kb, models, evaluation, timings, protocols)
    _log(f"[bold green]done[/]: {out / 'report.md'}")
    return report
