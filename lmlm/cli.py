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

from .cli_errors import fail as _fail, out_folder
from .errors import LmlmError, require

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Limited Memory Language Models: train, run, evaluate and edit LMLMs.")
console = Console(soft_wrap=True)  # piped output keeps one line per line (no wrap at 80)


def _assemble() -> None:
    """Every command group lives beside its package (``<package>/cli.py``); this is the whole map."""
    from .annotate import cli as annotate_cli
    from .bench import cli as bench_cli
    from .data import cli as data_cli
    from .evaluate import cli as eval_cli
    from .generate import cli as generate_cli
    from .kb import cli as kb_cli
    from .pipeline import cli as pipeline_cli
    from .serve import cli as serve_cli
    from .train import cli as train_cli

    commands = {"train": train_cli.train_command, "generate": generate_cli.generate_command,
                "pipeline": pipeline_cli.pipeline_command, "serve": serve_cli.serve_command}
    groups = {"data": data_cli.data_app, "eval": eval_cli.eval_app, "kb": kb_cli.app,
              "annotate": annotate_cli.app, "bench": bench_cli.app}
    for name, fn in commands.items():
        app.command(name)(fn)
    for name, group in groups.items():
        app.add_typer(group, name=name)


# -- the whole story -------------------------------------------------------------------------------

@app.command()
def quickstart(out: Path = typer.Option(Path("runs/quickstart"), help="output folder"),
               preset: str = typer.Option("default", help="'default' (4 to 19 min on 2 CPU cores, by their bf16 and AVX), 'smoke', or a .toml file of its fields"),
               fresh: bool = typer.Option(False, help="start over instead of resuming in OUT"),
               seed: int = typer.Option(0, help="seed of the world, the shuffles and the models"),
               set_: Optional[List[str]] = typer.Option(None, "--set", help="change one field of the preset: "
                                                         "key=value (e.g. max_steps=100), repeatable")):
    """Generate a world, build its KB, train LMLM and Standard, evaluate, edit, forget, report."""
    from .quickstart import QUICKSTART_PRESETS, quickstart as run
    from .stages import resumable

    if preset not in QUICKSTART_PRESETS and not preset.endswith(".toml"):
        _fail(f"unknown preset {preset!r}; known: {', '.join(QUICKSTART_PRESETS)}")
    require("quickstart", ("faker", "matplotlib"), "lmlm quickstart")
    out_folder(out)
    with resumable(out):
        report = run(out, preset=preset, fresh=fresh, sets=[f"seed={seed}", *(set_ or ())])
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
              preset: str = typer.Option("cpu", help="'cpu' (about 3 h on 2 CPU cores), 'tiny' (minutes), or a .toml file of its fields"),
              fresh: bool = typer.Option(False, help="start over instead of resuming in OUT"),
              nlu_data: Optional[Path] = typer.Option(None, help="also score this BIG-bench multiple-choice file"),
              set_: Optional[List[str]] = typer.Option(None, "--set", help="change one field of the preset: "
                                                        "key=value (e.g. n_trex=100), repeatable")):
    """Every protocol of the paper on the embedded worlds; OUT/report.md beside the paper's numbers."""
    from .reproduce import REPRODUCE_PRESETS, reproduce as run
    from .stages import resumable

    if preset not in REPRODUCE_PRESETS and not preset.endswith(".toml"):
        _fail(f"unknown preset {preset!r}; known: {', '.join(REPRODUCE_PRESETS)}")
    require("reproduce", ("faker", "matplotlib", "bm25s", "rouge_score", "scipy"), "lmlm reproduce")
    out_folder(out)
    if nlu_data is not None:  # read now: not after the hours of stages before the one that scores it
        from .evaluate.nlu import read_bigbench_mc

        if not nlu_data.is_file():
            _fail(f"--nlu-data: no file at {nlu_data}")
        try:
            read_bigbench_mc(nlu_data, template="Q: {input}\nA:")
        except (ValueError, OSError) as e:
            _fail(f"--nlu-data: {e}")
    try:
        with resumable(out):
            report = run(out, preset=preset, fresh=fresh, sets=set_ or (),
                         **({"nlu_data": str(nlu_data)} if nlu_data else {}))
    except ValueError as e:
        _fail(str(e))
    console.print_json(json.dumps({"claims": {c["claim"]: c["holds"] for c in report["claims"]},
                                   "report": str(out / "report.md")}))


# -- presets and worlds ----------------------------------------------------------------------------

@app.command()
def presets(tokenizer: List[str] = typer.Option(
                None, help="NAME=PATH of a tokenizer to count with (default: the sizes of the paper's GPT-2 and "
                           "LLaMA-2 vocabularies with the four lookup tokens)"),
            as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")):
    """Model presets with vocabulary size, total and non-embedding parameters per tokenizer."""
    from rich.table import Table

    from .models import TOKENIZER_VOCAB, preset_table
    from .train.config import TrainConfigError
    from .train.inputs import tokenizer_from_spec

    toks: dict = dict(TOKENIZER_VOCAB)  # the paper's tokenizers' sizes; a file given replaces its entry
    for spec in tokenizer or ():
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            _fail(f"--tokenizer takes NAME=PATH, got {spec!r}")
        try:  # as lmlm train reads --tokenizer: a local path that is not there is named so
            toks[name] = tokenizer_from_spec(path)
        except TrainConfigError as e:
            _fail(f"--tokenizer {name}: {e}")
        except Exception as e:  # a clear message naming the tokenizer
            _fail(f"cannot load tokenizer {name!r} from {path}: {e}")
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
    from .cli_errors import user_errors
    from .worlds.bios import BiosConfig, BiosWorld

    try:
        cfg = BiosConfig.from_name(preset, seed=seed)
    except ValueError as e:
        _fail(str(e))
    out_folder(out, "OUT")
    w = BiosWorld.generate(cfg)
    with user_errors():  # a folder that cannot be made: one line, as every bad path
        w.save(out)
    console.print_json(json.dumps(w.stats()))


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
    except LmlmError as e:  # raised outside a command's own error path: the same one line
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except abort:  # Ctrl-C (Click turns KeyboardInterrupt into Abort)
        print("error: interrupted", file=sys.stderr)
        return 130
    if rv == 130:  # Typer turns Ctrl-C into exit code 130, returned without a word
        print("error: interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0


_assemble()

if __name__ == "__main__":
    sys.exit(main())
