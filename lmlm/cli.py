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
console = Console()
err = Console(stderr=True)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(2)


# -- the whole story -------------------------------------------------------------------------------

@app.command()
def quickstart(out: Path = typer.Option(Path("runs/quickstart"), help="output folder"),
               preset: str = typer.Option("default", help="'default' (about 12 min on 2 CPU cores) or 'smoke'"),
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
                       "standard": report["perplexity"]["standard"]},
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
def train(config: Path = typer.Option(..., help="TrainConfig JSON (mode, model, data, tokenizer, ...)"),
          out_dir: Optional[Path] = typer.Option(None, help="override the config's out_dir"),
          resume: bool = typer.Option(False, help="continue from OUT_DIR/state")):
    """Pretrain an LMLM or Standard model (several CPU processes: `torchrun --nproc_per_node N -m lmlm.train`)."""
    from .train import main

    argv = ["--config", str(config)] + (["--out-dir", str(out_dir)] if out_dir else []) + (["--resume"] if resume else [])
    main(argv)


@app.command()
def generate(prompt: List[str] = typer.Argument(..., help="one or more prompts"),
             model: Path = typer.Option(..., help="checkpoint folder"),
             kb: Optional[Path] = typer.Option(None, help="knowledge base folder (default: the checkpoint's)"),
             max_new_tokens: int = typer.Option(64),
             no_db: bool = typer.Option(False, help="ablation: no database, lookup tokens banned"),
             force_lookup: bool = typer.Option(False, help="open a lookup at the end of the prompt"),
             sample: bool = typer.Option(False, help="sample instead of greedy decoding"),
             temperature: float = typer.Option(1.0), top_p: float = typer.Option(1.0),
             seed: Optional[int] = typer.Option(None),
             as_json: bool = typer.Option(False, "--json", help="print results with traces as JSON")):
    """Generate with lookups; the looked-up facts are highlighted."""
    from .checkpoint import load_checkpoint
    from .generate import LookupGenerator
    from .kb import KnowledgeBase
    from .lookup import Lookup

    m, tok, meta = load_checkpoint(model)
    kb_path = kb or (Path(meta["kb"]) if meta.get("kb") else None)
    base = None
    if not no_db:
        if kb_path is None:
            _fail("no knowledge base: pass --kb or --no-db")
        base = KnowledgeBase.open(kb_path)
    gen = LookupGenerator(m, tok, base, use_db=not no_db)
    results = gen.generate(prompt, max_new_tokens=max_new_tokens, force_lookup=force_lookup, do_sample=sample,
                           temperature=temperature, top_p=top_p, seed=seed)
    if as_json:
        print(json.dumps([{"prompt": r.prompt, "text": r.text, "clean_text": r.clean_text,
                           "trace": [t.__dict__ for t in r.trace], "problems": r.problems} for r in results],
                         indent=2, default=str))
        return
    for r in results:
        console.print(f"[bold]{r.prompt}[/]", end="")
        for seg in r.segments:
            if isinstance(seg, Lookup):
                console.print(f"[reverse cyan]⟦{seg.entity} · {seg.relation} → {seg.value}⟧[/]", end="")
            else:
                console.print(seg.text, end="", markup=False, highlight=False)
        console.print()
        for t in r.trace:
            where = f"triple {t.triple_id}, KB v{t.kb_version}, sources {list(t.sources)[:3]}" if t.found else "no match"
            score = f"{t.score:.2f}" if t.score is not None else "-"
            console.print(f"  [dim]lookup ({t.query_entity!r}, {t.query_relation!r}) -> {t.value!r} "
                          f"[score {score}; {where}][/]")


# -- knowledge base --------------------------------------------------------------------------------

def _open_kb(path: Path):
    from .kb import KnowledgeBase, KBError

    try:
        return KnowledgeBase.open(path)
    except KBError as e:
        _fail(str(e))


@kb_app.command("build")
def kb_build(path: Path = typer.Argument(..., help="new KB folder"),
             triples: Path = typer.Option(..., help="JSONL of triples: entity, relation, value[, source]"),
             who: str = typer.Option("lmlm"), why: str = typer.Option("build")):
    """Create a KB from a JSONL file of triples."""
    from .kb import KnowledgeBase

    kb = KnowledgeBase.create(path, exist_ok=True)
    kb.import_jsonl(triples, who=who, why=why)
    console.print_json(json.dumps(kb.stats(), default=str))


@kb_app.command("add")
def kb_add(path: Path, entity: str, relation: str, value: str, source: Optional[str] = typer.Option(None),
           who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Add one fact."""
    from .kb import Triple

    kb = _open_kb(path)
    console.print(f"version {kb.add([Triple(entity, relation, value, source=source)], who=who, why=why)}")


@kb_app.command("edit")
def kb_edit(path: Path, entity: str, relation: str, value: str, who: str = typer.Option("lmlm"),
            why: str = typer.Option("")):
    """Give a fact a new value (the old one stays in the history)."""
    kb = _open_kb(path)
    console.print(f"version {kb.edit(entity, relation, value, who=who, why=why)}")


@kb_app.command("delete")
def kb_delete(path: Path, triple_id: List[int] = typer.Option(None, "--id"), entity: Optional[str] = None,
              relation: Optional[str] = None, source: Optional[str] = None, who: str = typer.Option("lmlm"),
              why: str = typer.Option("")):
    """Delete facts by id, entity, relation or source document; they are unreachable at once."""
    if not (triple_id or entity or relation or source):
        _fail("say what to delete: --id, --entity, --relation or --source")
    kb = _open_kb(path)
    n = kb.delete(triple_ids=triple_id or None, entity=entity, relation=relation, source=source, who=who, why=why)
    console.print(f"deleted {n} facts; version {kb.version}")


@kb_app.command("lookup")
def kb_lookup(path: Path, entity: str, relation: str, threshold: Optional[float] = None):
    """Look one key up as the generator would (exact first, then fuzzy)."""
    m = _open_kb(path).lookup(entity, relation, threshold=threshold)
    print(json.dumps(m.__dict__ if m else None, default=str, indent=2))


@kb_app.command("search")
def kb_search(path: Path, entity: str, relation: str, k: int = 5):
    """Top-k candidate keys with their scores (why did a lookup match?)."""
    for m in _open_kb(path).search(entity, relation, k=k):
        console.print(f"{m.score:.3f}  {m.entity} · {m.relation} → {m.value}  (triple {m.triple_id})")


@kb_app.command("stats")
def kb_stats(path: Path):
    """Counts and the current version."""
    console.print_json(json.dumps(_open_kb(path).stats(), default=str))


@kb_app.command("log")
def kb_log(path: Path, limit: int = 20):
    """The latest versions: who changed what and why."""
    for v in _open_kb(path).log(limit):
        console.print(v)


@kb_app.command("export")
def kb_export(path: Path, out: Path):
    """Write the active triples with their sources as JSONL."""
    console.print(f"{_open_kb(path).export_jsonl(out)} triples written to {out}")


@kb_app.command("import")
def kb_import(path: Path, triples: Path, who: str = typer.Option("lmlm"), why: str = typer.Option("import")):
    """Add the triples of a JSONL file as one version."""
    console.print(f"version {_open_kb(path).import_jsonl(triples, who=who, why=why)}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
