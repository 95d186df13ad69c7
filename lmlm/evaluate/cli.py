"""``lmlm eval``: run an evaluation protocol on a checkpoint and write its results as JSON.

Each command loads a checkpoint (:func:`lmlm.checkpoint.load_checkpoint`) and, for an LMLM, its
knowledge base, reads the benchmark file, runs the protocol, writes ``{"protocol", "metrics",
"config", "records"}`` to ``--out`` and prints the metrics as one JSON line.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import typer

from ..checkpoint import checkpoint_mode
from ..cli_errors import fail as _fail

eval_app = typer.Typer(no_args_is_help=True, help="Evaluate a checkpoint: perplexity, T-REx, PopQA, NLU, "
                       "FactScore, TOFU, forgetting, editing, offloading, RAG.")

MODEL = typer.Option(..., "--model", help="checkpoint folder (written by lmlm train / quickstart)")
KB = typer.Option(None, "--kb", help="KB folder (default: the checkpoint's KB; ignored for Standard models)")
DATA = typer.Option(..., "--data", help="the benchmark file, in its official format")
def _check_out(out: Path | None) -> Path | None:
    """``--out`` is a file that can be written, checked before the evaluation runs (not after it)."""
    import os

    if out is None:
        return out
    if out.is_dir():
        raise typer.BadParameter(f"{out} is a folder: give a file to write, e.g. {out / 'results.json'}")
    folder = out.absolute().parent
    while not folder.exists():  # the first folder that is there: the others are made when the results are written
        folder = folder.parent
    if not folder.is_dir():
        raise typer.BadParameter(f"{folder} is a file, so {out} cannot be written under it")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"{folder} is not writable, so {out} cannot be written")
    return out


OUT = typer.Option(None, "--out", help="results JSON (default: eval-<protocol>.json)", callback=_check_out)
LIMIT = typer.Option(None, "--limit", min=1, help="evaluate the first N items only")
BATCH = typer.Option(16, "--batch-size", min=1, help="rows per batch")
NO_DB = typer.Option(False, "--no-db", help="ablation: no database, lookup tokens banned")


def _read(reader, *args, **kwargs):
    """Run a benchmark reader; a missing or malformed file is a usage error."""
    try:
        return reader(*args, **kwargs)
    except UnicodeDecodeError:  # a ValueError that names no file
        _fail(f"cannot read the benchmark file: {args[0]} is not UTF-8 text (a compressed or binary file?)")
    except (ValueError, OSError) as e:
        _fail(f"cannot read the benchmark file: {e}")


def _load(model: Path, kb: Path | None, no_db: bool = False, need_generator: bool = True, *,
          kb_option: str = "--kb", instead: str | None = "--no-db", **options):
    """``(model, tokenizer, meta, generator, uses_db)`` for a checkpoint; Standard checkpoints get no KB.

    Without a KB where one is needed, the error names the command's own options: ``kb_option``, and
    ``instead`` (the option that does without one; ``None``: none does)."""
    from ..checkpoint import ModelOpenError, kb_of, open_model

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the results JSON is the last line of the output
    try:  # ours, the authors' released layout, or any causal-LM folder
        m, tok, meta = open_model(model)
    except ModelOpenError as e:
        _fail(str(e))
    uses_db = not no_db and meta.get("mode", "lmlm") != "standard"
    base = None
    if uses_db and need_generator:
        from ..kb import KBError

        kb_path = kb or kb_of(meta, model)
        if kb_path is None:
            _fail(f"no knowledge base for {model}: pass {kb_option}" + (f" (or {instead})" if instead else ""))
        try:
            from ..generate.loading import open_kb

            base = open_kb(kb_path)
        except (KBError, OSError) as e:
            _fail(str(e))
    gen = None
    if need_generator:
        from ..generate import LookupGenerator

        gen = LookupGenerator(m, tok, base, use_db=uses_db, **options)
    return m, tok, meta, gen, uses_db


def _finish(protocol, metrics: dict, records: list, out: Path | None, config: dict, gen=None) -> None:
    """Write the results file (``config``, with the KB ``gen`` answered from and its version) and print the metrics."""
    from .base import write_results

    kb = getattr(gen, "kb", None)
    if kb is not None and getattr(gen, "options", {}).get("use_db", True):
        config = {**config, "kb": str(kb.path), "kb_version": kb.version}
    path = write_results(out or Path(f"eval-{protocol.name}.json"), protocol, metrics, records, config)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    typer.echo(json.dumps({"metrics": clean, "out": str(path)}))


def _scratch_kb(gen, prefix: str):
    """A copy of ``gen``'s KB to change, removed when the command ends (the KB itself is left as it was);
    ``gen``'s own handle is closed."""
    import atexit
    import shutil

    from .base import scratch_kb

    source = Path(gen.kb.store.folder)
    gen.kb.close()
    work, scratch = scratch_kb(source, prefix)
    atexit.register(shutil.rmtree, scratch, True)
    return work, source


@eval_app.command()
def trex(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
         limit: int | None = LIMIT, batch_size: int = BATCH, no_db: bool = NO_DB,
         max_new_tokens: int = typer.Option(16, min=1, help="tokens of text per answer (a call's tokens come on top)"),
         all_positions: bool = typer.Option(False, help="keep facts whose [MASK] is not the last word")):
    """T-REx (LAMA) cloze: exact match in the first 5 content words, and precision@1."""
    from .trex import TREX, read_trex, trex_eval

    counts: dict = {}
    items = _read(read_trex, data, left_to_right=not all_positions, limit=limit, counts=counts)
    if not items:
        _fail(f"no usable T-REx facts in {data}")
    if counts["unusable"]:
        why = "with [MASK]" if all_positions else "ends in [MASK] (--all-positions keeps the others)"
        typer.echo(f"{counts['unusable']} of {counts['records']} T-REx records left out: no sentence {why}", err=True)
    _, _, _, gen, uses_db = _load(model, kb, no_db, on_miss="skip")  # a missed lookup goes on as text
    records: list = []
    metrics = trex_eval(gen, items, force_lookup=uses_db, max_new_tokens=max_new_tokens, batch_size=batch_size,
                        records=records, progress=True)
    _finish(TREX, metrics, records, out, {"model": str(model), "data": str(data), "force_lookup": uses_db,
                                          "max_new_tokens": max_new_tokens, "limit": limit}, gen)


@eval_app.command()
def popqa(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
          limit: int | None = LIMIT, batch_size: int = BATCH, no_db: bool = NO_DB,
          max_new_tokens: int = typer.Option(32, min=1, help="tokens of text per answer (a call's tokens come on top)"),
          max_popularity: float | None = typer.Option(None, help="keep subjects below this popularity "
                                                         "(100: the paper's long-tail subset)"),
          force_lookup: bool = typer.Option(False, help="open a lookup right after the prompt")):
    """PopQA (or FanOutQA's single-hop questions): any gold answer in the output."""
    from .popqa import POPQA, popqa_eval, read_qa

    items = _read(read_qa, data)
    if max_popularity is not None:
        kept = [it for it in items if it.popularity is not None and it.popularity < max_popularity]
        unknown = sum(it.popularity is None for it in items)
        typer.echo(f"{len(kept)} of {len(items)} questions have s_pop below {max_popularity:g}"
                   + (f" ({unknown} without s_pop, left out)" if unknown else ""), err=True)
        items = kept
    items = items[:limit]
    if not items:
        _fail(f"no questions in {data}")
    _, _, _, gen, uses_db = _load(model, kb, no_db)
    records: list = []
    metrics = popqa_eval(gen, items, force_lookup=force_lookup and uses_db, max_new_tokens=max_new_tokens,
                         batch_size=batch_size, records=records, progress=True)
    _finish(POPQA, metrics, records, out, {"model": str(model), "data": str(data), "max_new_tokens": max_new_tokens,
                                           "max_popularity": max_popularity, "limit": limit,
                                           "force_lookup": force_lookup and uses_db}, gen)


@eval_app.command()
def nlu(model: Path = MODEL, data: Path = DATA, out: Path | None = OUT, limit: int | None = LIMIT,
        batch_size: int = BATCH, kb: Path | None = typer.Option(None, "--kb", help="unused (scoring needs no KB)"),
        template: str = typer.Option("Q: {input}\nA:", help="context template ({input}: the example's input)")):
    """Multiple choice (BIG-bench JSON, e.g. Social IQa): acc and acc_norm, lookup tokens banned."""
    from .nlu import NLU, nlu_eval, read_bigbench_mc

    try:  # the template is the option's, not the file's: said before the file is read
        filled = template.format(input="\0")
    except (ValueError, KeyError, IndexError, AttributeError) as e:
        _fail(f"--template {template!r} is not a format string with {{input}} alone ({e}); write {{{{ and }}}} "
              "for braces")
    if "\0" not in filled:
        _fail(f"--template {template!r} has no {{input}}: every question would read the same")
    items = _read(read_bigbench_mc, data, template=template, limit=limit)
    m, tok, _, _, _ = _load(model, None, no_db=True, need_generator=False)
    records: list = []
    try:
        metrics = nlu_eval(m, tok, items, batch_size=batch_size, records=records)
    except ValueError as e:
        _fail(f"{data}: {e}")
    _finish(NLU, metrics, records, out, {"model": str(model), "data": str(data), "template": template})


@eval_app.command()
def factscore(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
              limit: int | None = LIMIT, batch_size: int = BATCH, no_db: bool = NO_DB,
              world: Path | None = typer.Option(None, help="true facts: a KB folder (default: --kb)"),
              claims: str = typer.Option("lookups", help="'lookups' (the model's lookups about the topic) or "
                                         "'text' (the facts each sentence states, read with the biography world's "
                                         "phrasings; also for Standard models)"),
              max_new_tokens: int = typer.Option(256, min=1), repetition_penalty: float = typer.Option(1.2),
              gamma: int = typer.Option(10, min=0, help="FActScore's length penalty (0: none)")):
    """Biography precision against known facts, without and with FActScore's length penalty."""
    from ..kb import KBError, KnowledgeBase
    from .factscore import FACTSCORE, factscore_eval, read_topics, world_from_kb

    topics = _read(read_topics, data)[:limit]
    if not topics:
        _fail(f"no topics in {data}")
    if claims == "lookups" and (no_db or checkpoint_mode(model) == "standard"):
        _fail("--claims lookups scores the facts the model looked up, and " + ("--no-db" if no_db else
              f"{model}, a Standard model,") + " makes no lookups: use --claims text (the facts its text states)")
    _, _, meta, gen, _ = _load(model, kb, no_db)
    truth = world or kb or (Path(meta["kb"]) if meta.get("kb") else None)
    if truth is None:
        _fail("no world to check claims against: pass --world or --kb")
    answers = getattr(gen, "kb", None)
    if claims == "lookups" and answers is not None and Path(str(answers.path)).resolve() == Path(str(truth)).resolve():
        _fail("--claims lookups checks the KB's own answers against the same KB: supported by construction. "
              "Pass --world with a KB of the true facts, or --claims text (the facts the text states)")
    try:
        facts = world_from_kb(KnowledgeBase.open(truth))
    except (KBError, OSError) as e:
        _fail(str(e))
    records: list = []
    try:
        metrics = factscore_eval(gen, topics, facts, claims=claims, gamma=gamma, max_new_tokens=max_new_tokens,
                                 repetition_penalty=repetition_penalty, batch_size=batch_size, records=records,
                                 progress=True)
    except ValueError as e:
        _fail(str(e))
    _unknown_topics(metrics, "factscore_topics_unknown", truth)
    _finish(FACTSCORE, metrics, records, out, {"model": str(model), "data": str(data), "world": str(truth),
                                               "claims": claims, "gamma": gamma}, gen)


def _unknown_topics(metrics: dict, key: str, world: Path) -> None:
    """Say so when some topics are no entity of the world (their claims count as unsupported), or when no
    response made a claim (every score is null)."""
    if metrics.get(key):
        typer.echo(f"{metrics[key]:.0f} of {metrics['factscore_n']:.0f} topics have no fact in {world}: every claim "
                   "about them counts as unsupported (is --world the KB of these people's true facts?)", err=True)
    if not metrics.get(key.replace("topics_unknown", "respond_ratio")):
        typer.echo("no response made a claim that could be read, so no score: --claims text reads the biography "
                   "world's phrasings ('was born in', 'works for'), --claims lookups the model's lookups", err=True)


def _documents(path: Path, heldout: bool = False, limit: int | None = None):
    """The first ``limit`` documents of a file :mod:`lmlm.corpus` reads; with ``heldout``, those of any split but
    ``train`` (``heldout``, ``test`` ...) where it marks splits: ``lmlm train`` trains on ``train`` and unsplit ones."""
    from ..corpus import read_documents

    docs = read_documents(path)
    kept = [d for d in docs if d.split not in (None, "train")]
    if heldout and docs and all(d.split == "train" for d in docs):
        typer.echo(f"every document of {path} is in split train: this scores text the model was trained on", err=True)
    if heldout and kept:
        if len(kept) < len(docs):
            first = f"the first {limit} of " if (limit or len(kept)) < len(kept) else ""
            names = ", ".join(sorted({d.split for d in kept}))
            typer.echo(f"scoring {first}the {len(kept)} held-out documents ({names}) of {len(docs)} in {path} (the "
                       "file marks splits; the others were trained on)", err=True)
        docs = kept
    return docs[:limit]


@eval_app.command()
def perplexity(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
               limit: int | None = LIMIT, batch_size: int = BATCH,
               dynamic: bool = typer.Option(True, help="also the dynamic perplexity (the model writes its queries)")):
    """Perplexity on annotated documents: static, dynamic, normalized (LMLM) or plain (Standard), per-role losses."""
    from ..lookup import Lookup, strip
    from .base import Protocol
    from .perplexity import dynamic_perplexity, standard_perplexity, static_perplexity

    progress = typer.get_text_stream("stderr").isatty()  # bars on a terminal: a log of both keeps the JSON line
    read = _read(_documents, data, heldout=True, limit=limit)
    docs = [d.segments for d in read]
    if not docs:
        _fail(f"no documents in {data}")
    if dynamic and checkpoint_mode(model) != "standard" and not any(isinstance(s, Lookup) for d in docs for s in d):
        typer.echo(f"no lookup calls in {data}: the dynamic perplexity scores the queries a model writes at each "
                   "call, so it needs annotated documents; static perplexity only", err=True)
        dynamic = False
    m, tok, meta, gen, uses_db = _load(model, kb, need_generator=dynamic and checkpoint_mode(model) != "standard",
                                        instead="--no-dynamic: static perplexity only")
    protocol = Protocol("perplexity", "perplexity_static", greater_is_better=False,
                        paper="LMLM appendix A.3, static / dynamic / normalized perplexity")
    if meta.get("mode") == "standard":
        res = standard_perplexity(m, tok, [strip(d) for d in docs], batch_size, progress=progress)
        metrics = {"perplexity_static": res["perplexity"], "perplexity_org_tokens": float(res["org_tokens"])}
    else:
        st = static_perplexity(m, tok, docs, batch_size, progress=progress)
        metrics = {"perplexity_static": st["static"], "perplexity_normalized": st["normalized"],
                   "perplexity_org_tokens": float(st["org_tokens"])}
        metrics.update({f"perplexity_loss_{k}": v for k, v in st["role_loss"].items()})
        if gen is not None:
            dyn = dynamic_perplexity(gen, docs, batch_size, progress=progress)
            metrics.update(perplexity_dynamic=dyn["dynamic"], perplexity_dynamic_lookup_found=dyn["lookup_found_rate"],
                           perplexity_dynamic_lookup_answered=dyn["lookup_matched_rate"],
                           perplexity_dynamic_lookup_wrong_entity=float(dyn["lookup_wrong_entity"]),
                           perplexity_dynamic_lookups=float(dyn["lookups"]))
    metrics["perplexity_documents"] = float(len(docs))
    records = [{k: read[v].id if k == "document" else v for k, v in q.items() if k != "group"}
               for q in dyn["queries"]] if metrics.get("perplexity_dynamic_lookups") else []  # to read the misses by
    _finish(protocol, metrics, records, out, {"model": str(model), "data": str(data), "documents": len(docs)}, gen)


@eval_app.command()
def tofu(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
         limit: int | None = LIMIT, batch_size: int = BATCH,
         no_db: bool = typer.Option(False, "--no-db", help="an LMLM without its KB: the plain answers scored, lookup "
                                    "tokens banned (TOFU's release has no annotated answers)"),
         split: str = typer.Option("forget05", help="forget split: forget01, forget05 or forget10"),
         retain_model: Path | None = typer.Option(None, help="the retain model (its forget truth ratios give forget quality)"),
         retain_kb: Path | None = typer.Option(None, help="the retain model's KB (when it is an LMLM)"),
         unlearn: str = typer.Option("none", help="none; kb (LMLM: delete the split's facts from a copy of the KB); "
                                     "ga, grad_diff or npo (train the model)"),
         steps: int = typer.Option(30, min=1, help="unlearning steps"),
         lr: float = typer.Option(2e-4, help="unlearning rate"),
         eval_every: int = typer.Option(5, min=1, help="steps between trajectory points"),
         max_new_tokens: int = typer.Option(48, min=1, help="generated tokens per answer (ROUGE-L)")):
    """TOFU: ROUGE-L, probability, truth ratio, forget quality, model utility; optionally unlearn first."""

    from .tofu import read_tofu
    from .unlearn import METHODS, TOFU, UnlearnConfig, kb_unlearn, read_tofu_sets, tofu_summary
    from .unlearn import unlearn as run_unlearn

    if unlearn not in ("none", "kb", *METHODS):
        _fail(f"--unlearn must be none, kb or one of {', '.join(METHODS)}; got {unlearn!r}")
    sets = _read(read_tofu_sets, data, split, limit=limit)
    retain_ratios = None
    if retain_model is not None:
        rm, rtok, _, rgen, r_db = _load(retain_model, retain_kb, no_db, kb_option="--retain-kb")  # scored alike
        retain_ratios = tofu_summary(rm, rtok, sets, kb=rgen.kb if r_db else None,
                                     batch_size=batch_size)["forget_truth_ratios"]
    m, tok, meta, gen, uses_db = _load(model, kb, no_db)
    deletion = None
    if unlearn == "kb":
        from ..generate import LookupGenerator

        if not uses_db:
            _fail("--unlearn kb needs an LMLM and its KB")
        gen = LookupGenerator(m, tok, _scratch_kb(gen, "lmlm-tofu-kb-")[0])
        try:
            deletion = kb_unlearn(gen.kb, _read(read_tofu, data / f"{split}.json"), who="lmlm eval tofu")
        except ValueError as e:
            _fail(str(e))
    config = {"model": str(model), "data": str(data), "split": split, "unlearn": unlearn, "no_db": no_db}

    def summary(model_):
        g = gen if model_ is m else type(gen)(model_, tok, gen.kb, use_db=uses_db)
        s = tofu_summary(model_, tok, sets, kb=gen.kb if uses_db else None, generator=g, retain_ratios=retain_ratios,
                         max_new_tokens=max_new_tokens, batch_size=batch_size)
        s.pop("forget_truth_ratios", None)
        return s

    records: list = []
    try:
        if unlearn in METHODS:
            forget = _read(read_tofu, data / f"{split}.json")
            retain = _read(read_tofu, data / f"retain{100 - int(split[6:])}.json")
            res = run_unlearn(m, tok, forget, retain, UnlearnConfig(method=unlearn, steps=steps, lr=lr,
                                                                    eval_every=eval_every), evaluate=summary)
            metrics, records = res.trajectory[-1], res.trajectory
        else:
            metrics = summary(m)
    except ValueError as e:  # e.g. an LMLM scored on TOFU files without annotated answers
        _fail(str(e))
    if deletion:
        config["deletion"] = deletion
    metrics = {f"tofu_{k}" if not k.startswith("tofu_") else k: v for k, v in metrics.items() if v is not None}
    per_item = {k: metrics.pop(k) for k in [k for k, v in metrics.items() if isinstance(v, (list, tuple, dict))]}
    if per_item and not records:  # the metrics line holds numbers; each question's values go in the records
        records = [{"per_question": per_item}]  # (an unlearning run's records are its trajectory, which has them)
    _finish(TOFU, metrics, records, out, config, gen)


@eval_app.command()
def forgetting(model: Path = MODEL, kb: Path | None = KB, out: Path | None = OUT, batch_size: int = BATCH,
               facts: Path | None = typer.Option(None, "--facts", help="facts to forget: JSON lines of entity, relation, "
                                                 "value, prompt (or LAMA T-REx records); all of an entity's facts go"),
               world: Path | None = typer.Option(None, "--world", help="instead of --facts and --unseen: a synthetic "
                                                 "biography world (a quickstart's OUT/world), its forget set and held-out people"),
               unseen: Path | None = typer.Option(None, "--unseen", help="facts of entities the models never read "
                                                  "(same format): the guessing rate parametric leakage is compared with"),
               standard: Path | None = typer.Option(None, "--standard", help="the Standard checkpoint, scored on --unseen"),
               start: str | None = typer.Option(None, "--start", help="the pretrained model the LMLM was continued from "
                                                "(as lmlm train --init-from names it): what it stated of the forget set "
                                                "before any LMLM training, beside DEL-OFF"),
               fraction: float = typer.Option(0.05, min=0.0, max=1.0, help="with --world: share of trained people forgotten"),
               limit: int | None = typer.Option(None, "--limit", min=1, help="about this many facts (whole entities)"),
               kinds: str = typer.Option(",".join(("name", "alias", "misspelling", "transliteration", "relation",
                                                   "description")), help="adversarial kinds, separated by commas"),
               name_bias: float = typer.Option(10.0, min=0.0, help="the LMLM's name bias (lmlm generate's default)"),
               copy_bias: float = typer.Option(5.0, min=0.0, help="the LMLM's copy bias (lmlm generate's default)"),
               max_new_tokens: int = typer.Option(24, min=1, help="tokens of text per answer"),
               on_miss: str = typer.Option("text", help="a lookup the KB does not answer: text ('unknown', as lmlm "
                                           "generate) or skip (no value: the model goes on from its weights)"),
               seed: int = typer.Option(0, help="seed of the forget set and of --limit's choice")):
    """Forgetting as the audit of LMLM forgetting measures it: FULL, DEL-ON and DEL-OFF of one model; parametric
    leakage and retrieval-mediated residue per adversarial kind (on a copy of the KB)."""

    from .forgetting import FORGETTING, KINDS, audit_forgetting, read_facts, sample_facts, world_sets

    if (facts is None) == (world is None):
        _fail("give the facts to forget: --facts FILE or --world DIR (one of them)")
    if on_miss not in ("text", "skip"):
        _fail(f"--on-miss must be text or skip, got {on_miss!r}")
    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    bad = [k for k in chosen if k not in KINDS]
    if bad or not chosen:
        _fail(f"--kinds takes {', '.join(KINDS)}; got {kinds!r}")
    if world is not None:
        from ..worlds.bios import BiosWorld

        if not (world / "config.json").exists():
            _fail(f"{world} is not a biography world folder (no config.json): give a quickstart's OUT/world")
        forget, unseen_facts = world_sets(BiosWorld.load(world), fraction, seed)
        if not forget:
            _fail(f"--fraction {fraction} forgets no one")
    else:
        forget = _read(read_facts, facts)
        unseen_facts = _read(read_facts, unseen) if unseen is not None else []
    forget = sample_facts(forget, limit, seed)
    if checkpoint_mode(model) == "standard":
        _fail(f"{model} is a Standard checkpoint: the audit deletes facts from an LMLM's KB (give it as --standard)")
    first = None
    if start is not None:  # before the LMLM and the KB copy: a start that is not there costs nothing
        from ..pretrained import StartError, start_pretrained

        try:
            sm, stok, _ = start_pretrained(start)
        except StartError as e:
            _fail(f"--start {start}: {e}")
        first = (sm.eval(), stok)
    m, tok, _, gen, _ = _load(model, kb, instead=None)
    if first is not None:
        first = (first[0].to(m.device), first[1])
    work, source = _scratch_kb(gen, "lmlm-forgetting-kb-")
    std = None
    if standard is not None:
        if checkpoint_mode(standard) != "standard":
            _fail(f"--standard {standard} is a {checkpoint_mode(standard)} checkpoint")
        sm, stok, _, _, _ = _load(standard, None, no_db=True, need_generator=False)
        std = (sm, stok)
    records: list = []
    metrics = audit_forgetting(m, tok, work, forget, unseen=unseen_facts, standard=std, start=first,
                               decoding={"name_bias": name_bias, "copy_bias": copy_bias}, max_new_tokens=max_new_tokens,
                               batch_size=batch_size, kinds=chosen, records=records, on_miss=on_miss,
                               log=lambda s: typer.echo(s, err=True))
    by_kind = metrics.pop("forgetting_by_kind")
    records.insert(0, {"by_kind": by_kind})
    work.close()
    _finish(FORGETTING, metrics, records, out, {"model": str(model), "kb": str(source), "facts": str(facts or world),
                                                "unseen": str(unseen) if unseen else None, "start": start, "kinds": chosen,
                                                "name_bias": name_bias, "copy_bias": copy_bias, "on_miss": on_miss,
                                                "by_kind": by_kind})


@eval_app.command()
def offloading(lmlm: Path = typer.Option(..., "--lmlm", help="the LMLM checkpoint"),
               standard: Path = typer.Option(..., "--standard", help="the Standard checkpoint (same tokenizer)"),
               data: Path = DATA, out: Path | None = OUT, limit: int | None = LIMIT, batch_size: int = BATCH,
               ratios: str = typer.Option("0.25,0.5,0.75,0.9", help="offloading ratios to report and write"),
               n_tokens: int = typer.Option(5, min=1, help="tokens after each call compared (paper: 5)"),
               corpora: Path | None = typer.Option(None, help="write the corpus of each ratio here (ratio-NNN.jsonl)")):
    """Rank facts by the loss difference after their calls (Standard - LMLM); thresholds and corpora per ratio."""
    from ..corpus import Document, write_documents
    from .offloading import OFFLOADING, fact_loss_differences, offload_documents, offload_thresholds, offloaded_keys, ranked_facts

    try:
        rs = [float(r) for r in ratios.split(",") if r.strip()]
    except ValueError:
        _fail(f"--ratios must be numbers separated by commas, got {ratios!r}")
    if any(not 0 <= r <= 1 for r in rs) or not rs:
        _fail(f"--ratios must be numbers in [0, 1], got {ratios!r}")
    from ..corpus import read_documents

    originals = _read(read_documents, data)[:limit]  # ids, splits and fields go on into the corpora
    docs = [d.segments for d in originals]
    if not any(d.num_calls for d in originals):
        _fail(f"no lookup calls in {data}: offloading ranks the facts of an annotated corpus's calls")
    for path, option, want in ((lmlm, "--lmlm", "lmlm"), (standard, "--standard", "standard")):
        if checkpoint_mode(path) != want:
            _fail(f"{option} {path} is a {checkpoint_mode(path)} checkpoint; {option} takes the {want} one")
    lm, tok, _, _, _ = _load(lmlm, None, no_db=True, need_generator=False)
    sm, stok, _, _, _ = _load(standard, None, no_db=True, need_generator=False)
    if stok.hf.get_vocab() != tok.hf.get_vocab():
        _fail(f"--lmlm and --standard have different tokenizers ({len(tok.hf)} and {len(stok.hf)} tokens): "
              "the loss after each call is compared token by token, so both must be trained with the same one")
    deltas = fact_loss_differences(lm, sm, tok, docs, n_tokens=n_tokens, batch_size=batch_size)
    if not deltas:
        _fail(f"no call in {data} has text after it: the loss difference is over the tokens that follow a call")
    thresholds = offload_thresholds(deltas, rs)
    metrics = {"offloading_facts": float(len(deltas))}
    metrics.update({f"offloading_threshold_{round(r * 100)}": t for r, t in thresholds.items() if t is not None})
    if corpora is not None:
        corpora.mkdir(parents=True, exist_ok=True)
        for r in rs:
            kept = offload_documents(docs, offloaded_keys(deltas, r))
            write_documents(corpora / f"ratio-{round(r * 100):03d}.jsonl",
                            (Document.from_segments(o.id, d, source=o.source or str(data), split=o.split, meta=o.meta)
                             for o, d in zip(originals, kept)))
    records = [{"entity": e, "relation": rel, "loss_difference": deltas[(e, rel)]} for e, rel in ranked_facts(deltas)]
    _finish(OFFLOADING, metrics, records, out, {"lmlm": str(lmlm), "standard": str(standard), "data": str(data),
                                                "ratios": rs, "n_tokens": n_tokens})


@eval_app.command()
def rag(model: Path = MODEL, data: Path = DATA, out: Path | None = OUT, limit: int | None = LIMIT,
        batch_size: int = BATCH,
        corpus: Path = typer.Option(..., help="passages' source: any document file (their plain text is used)"),
        task: str = typer.Option("trex", help="trex, popqa or factscore (the format of --data)"),
        k: int = typer.Option(4, "-k", "--k", min=1, help="passages per prompt (paper: 4)"),
        words: int = typer.Option(100, min=1, help="words per passage (paper: 100)"),
        world: Path | None = typer.Option(None, help="factscore: the true facts, a KB folder"),
        max_new_tokens: int = typer.Option(32, min=1, help="generated tokens per prompt")):
    """RAG baseline: BM25 top-k passages of a corpus prepended to a Standard model (T-REx, PopQA or FactScore)."""
    from ..lookup import strip
    from .rag import RAG, BM25Retriever, RagGenerator, corpus_passages

    if task not in ("trex", "popqa", "factscore"):
        _fail(f"--task must be trex, popqa or factscore, got {task!r}")
    texts = [strip(d.segments) for d in _read(_documents, corpus)]
    m, tok, _, gen, _ = _load(model, None, no_db=True)
    try:
        retriever = BM25Retriever(corpus_passages(texts, words))
    except ValueError as e:
        _fail(str(e))
    rag_gen = RagGenerator(gen, retriever, k=k)
    records: list = []
    if task == "trex":
        from .trex import read_trex, trex_eval
        items = _read(read_trex, data, limit=limit)
        if not items:
            _fail(f"no usable T-REx facts in {data}")
        metrics = trex_eval(rag_gen, items, force_lookup=False, max_new_tokens=max_new_tokens, batch_size=batch_size,
                            records=records, progress=True)
    elif task == "popqa":
        from .popqa import popqa_eval, read_qa
        items = _read(read_qa, data, limit=limit)
        if not items:
            _fail(f"no questions in {data}")
        metrics = popqa_eval(rag_gen, items, max_new_tokens=max_new_tokens, batch_size=batch_size, records=records,
                             progress=True)
    else:
        from ..kb import KBError, KnowledgeBase
        from .factscore import factscore_eval, read_topics, world_from_kb
        if world is None:
            _fail("factscore needs --world (a KB folder of true facts)")
        try:
            facts = world_from_kb(KnowledgeBase.open(world))
        except (KBError, OSError) as e:
            _fail(str(e))
        topics = _read(read_topics, data)[:limit]
        if not topics:
            _fail(f"no topics in {data}")
        metrics = factscore_eval(rag_gen, topics, facts, claims="text", max_new_tokens=max_new_tokens,
                                 batch_size=batch_size, records=records, progress=True)
        _unknown_topics(metrics, "factscore_topics_unknown", world)
    metrics = {f"rag_{k_}": v for k_, v in metrics.items() if "_lookup_" not in k_}  # a Standard reader makes none
    kept = rag_gen.last_passages
    if len(kept) == len(records):  # what each prompt was given, to read beside its answer
        from .popqa import answer_in_output

        for rec, passages in zip(records, kept):
            rec["passages"] = passages
        metrics["rag_passages_kept_mean"] = sum(map(len, kept)) / max(1, len(kept))
        if task != "factscore":  # the gold answer in a passage the reader was given: its ceiling
            golds = [[it.gold] if task == "trex" else list(it.answers) for it in items]
            metrics["rag_answer_in_passages"] = sum(answer_in_output(" ".join(ps), g) for ps, g in zip(kept, golds)) \
                / max(1, len(kept))
    primary = {"trex": "trex_exact_match", "popqa": "popqa_accuracy", "factscore": "factscore_score_no_penalty"}[task]
    _finish(replace(RAG, primary=f"rag_{primary}"), metrics, records, out,
            {"model": str(model), "corpus": str(corpus), "task": task, "k": k, "words": words})


EDIT_METHODS = ("lmlm", "ft-l", "rome", "memit")


def _edit_set(data: Path | None, world: Path | None, from_kb: Path | None, fmt: str, n: int, seed: int,
              write: Path | None):
    """The rewrites: read from ``--data``, or written from ``--world``'s facts or a KB's (``--from-kb``)
    in ``--format`` (saved to ``--write``). Returns ``(cases, world or None)``."""
    from .editing import counterfact_records, kb_facts, read_edit_set, world_facts, write_records, zsre_records

    if sum(x is not None for x in (data, world, from_kb)) != 1:
        _fail("give the rewrites: --data FILE (CounterFact or zsRE), --world DIR or --from-kb KB (one of them)")
    if fmt not in ("counterfact", "zsre"):
        _fail(f"--format must be counterfact or zsre, got {fmt!r}")
    if data is not None:
        return _read(read_edit_set, data), None
    w = None
    if world is not None:
        from ..worlds.bios import BiosWorld

        if not (world / "config.json").exists():
            _fail(f"{world} is not a biography world folder (no config.json): give a quickstart's OUT/world")
        w = BiosWorld.load(world)
        facts = world_facts(w)
    else:
        from ..kb import KBError, KnowledgeBase

        try:
            kb = KnowledgeBase.open(from_kb)
            facts = kb_facts(kb)
            kb.close()
        except (KBError, OSError) as e:
            _fail(str(e))
    make = counterfact_records if fmt == "counterfact" else zsre_records
    try:
        records = make(facts, n, world=w, seed=seed)
    except ValueError as e:
        _fail(str(e))
    path = write_records(write or Path(f"editing-{fmt}.json"), records)
    typer.echo(f"{len(records)} {fmt} rewrites of {len(facts)} facts written to {path}", err=True)
    return _read(read_edit_set, path), w


def _rome_texts(texts: Path | None, world) -> list[str]:
    """The text ROME's key second moment is estimated from: ``--texts`` documents, else the world's training ones."""
    from ..lookup import strip

    if texts is not None:
        return [strip(d.segments) for d in _read(_documents, texts)]
    if world is not None:
        return [d.plain for d in world.train_documents]
    _fail("--method rome and memit estimate their keys' second moment from text: pass --texts (a document file) "
          "or --world")


@eval_app.command()
def editing(model: Path = MODEL, kb: Path | None = KB, out: Path | None = OUT, batch_size: int = BATCH,
            data: Path | None = typer.Option(None, "--data", help="a CounterFact (counterfact.json) or zsRE "
                                             "(zsre_mend_eval.json) file"),
            world: Path | None = typer.Option(None, "--world", help="instead of --data: write the set from a biography "
                                              "world's facts and phrasings (a quickstart's OUT/world)"),
            from_kb: Path | None = typer.Option(None, "--from-kb", help="instead of --data: write the set from this "
                                                "KB's facts (generic phrasings 'The <relation> of <entity> is')"),
            fmt: str = typer.Option("counterfact", "--format", help="the written set's format: counterfact or zsre"),
            write: Path | None = typer.Option(None, "--write", help="where the written set goes "
                                              "(default: editing-<format>.json)"),
            method: str = typer.Option("lmlm", help="lmlm (KB edits of an LMLM, on a copy of its KB), ft-l, rome or "
                                       "memit (weight edits, on a Standard model: an LMLM is scored with lookups "
                                       "banned; memit edits a count in one batch)"),
            edits: str = typer.Option("1,100,1000", help="sequential edit counts, each from the same start"),
            sample: int = typer.Option(1000, min=1, help="edited facts scored per count at most (seeded)"),
            fluency_n: int = typer.Option(50, min=0, help="generation prompts for the fluency (n-gram entropy)"),
            fluency_tokens: int = typer.Option(100, min=1, help="tokens per fluency text (ROME: 100)"),
            layer: int | None = typer.Option(None, help="the edited MLP layer (ft-l: 0; rome: 17/48 of the depth; "
                                             "memit: its top layer alone, instead of 13-17/48 of the depth)"),
            norm: float = typer.Option(5e-4, help="ft-l: L-infinity bound on each weight's change (ROME's FT-L: 5e-4)"),
            texts: Path | None = typer.Option(None, "--texts", help="rome, memit: documents for the keys' second moment "
                                              "(default: the --world's training documents)"),
            name_bias: float = typer.Option(10.0, min=0.0, help="the LMLM's name bias (lmlm generate's default)"),
            copy_bias: float = typer.Option(5.0, min=0.0, help="the LMLM's copy bias (lmlm generate's default)"),
            seed: int = typer.Option(0, help="seed of the written set, the scored sample and the fluency texts")):
    """Knowledge editing as CounterFact/zsRE score it (efficacy, paraphrase, neighbourhood, fluency), sequential
    edits; an LMLM's through its lookups (forced at the answer; the object scored after the call)."""
    from .editing import EDITING, KBEditor, WeightEditor, parse_counts, run_editing

    if method not in EDIT_METHODS:
        _fail(f"--method must be one of {', '.join(EDIT_METHODS)}, got {method!r}")
    try:
        counts = parse_counts(edits)
    except ValueError as e:
        _fail(str(e))
    cases, w = _edit_set(data, world, from_kb, fmt, counts[-1], seed, write)
    if counts[-1] > len(cases):
        _fail(f"--edits {counts[-1]}: {data or write} holds {len(cases)} rewrites")
    mode = checkpoint_mode(model)
    if method == "lmlm":
        if mode == "standard":
            _fail(f"{model} is a Standard checkpoint: --method lmlm edits an LMLM's KB (ft-l or rome edit weights)")
        if any(c.relation is None for c in cases[:counts[-1]]):
            _fail("these zsRE records name no relation: an LMLM's edit is a KB key (subject, relation); write the "
                  "set with --world or --from-kb, which add it")
        from ..generate import LookupGenerator

        m, tok, _, gen, _ = _load(model, kb, instead=None)
        source = Path(gen.kb.store.folder)
        gen.kb.close()
        editor = KBEditor(source, lambda k: LookupGenerator(m, tok, k, name_bias=name_bias, copy_bias=copy_bias))
        config_kb = str(source)
    else:
        from .weight_editing import FineTuneL, Memit, Rome

        m, tok, _, gen, _ = _load(model, None, no_db=True)
        try:
            if method == "ft-l":
                edit = FineTuneL(m, tok, layer=0 if layer is None else layer, norm=norm)
            elif method == "rome":
                edit = Rome(m, tok, _rome_texts(texts, w), layer=layer, seed=seed)
            else:
                edit = Memit(m, tok, _rome_texts(texts, w), layers=None if layer is None else [layer], seed=seed)
        except ValueError as e:
            _fail(str(e))
        editor, config_kb = WeightEditor(edit, gen), None
    records: list = []
    try:
        metrics = run_editing(editor, cases, counts, sample=sample, fluency_n=fluency_n, fluency_tokens=fluency_tokens,
                              seed=seed, log=lambda s: typer.echo(s, err=True), records=records)
    except ValueError as e:
        _fail(str(e))
    _finish(EDITING, metrics, records, out, {
        "model": str(model), "mode": mode, "method": method, "data": str(data or write or Path(f"editing-{fmt}.json")),
        "edits": counts, "sample": sample, "fluency_n": fluency_n, "fluency_tokens": fluency_tokens, "kb": config_kb,
        "layer": getattr(getattr(editor, "method", None), "layer", None),
        "layers": getattr(getattr(editor, "method", None), "layers", None), "seed": seed,
        "name_bias": name_bias, "copy_bias": copy_bias})
