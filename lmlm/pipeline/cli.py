"""``lmlm pipeline RECIPE --out DIR``: corpus -> annotation -> KB -> LMLM and Standard -> evaluation -> report."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from .run import UNTIL

__all__ = ["pipeline_command"]


Until = Enum("Until", {s: s for s in UNTIL}, type=str)  # the choices --help lists


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def pipeline_command(
    recipe: str = typer.Argument(..., help="a shipped recipe (wiki-cpu, wiki-cpu-scratch, wiki-gpu) or a recipe "
                                            ".toml file"),
    out: Path = typer.Option(..., help="run folder: every stage's outputs, report.json and report.md"),
    corpus: Optional[Path] = typer.Option(None, help="the corpus (a Wikipedia dump .xml/.xml.bz2 or a document "
                                          "file), instead of the recipe's"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="change one recipe field: section.key=value "
                                             "(e.g. train.max_steps=2), repeatable"),
    device: Optional[Device] = typer.Option(None, help="auto (CUDA when visible), cpu or cuda; default: the recipe's"),
    fresh: bool = typer.Option(False, help="start over instead of resuming in OUT"),
    until: Optional[Until] = typer.Option(None, help="stop after this stage (seed, correct, distill: the LLM path's "
                                          "steps); the same command without it goes on, with another --device too"),
    progress: bool = typer.Option(True, help="show progress bars"),
):
    """Run a recipe end to end; rerun the same command to resume (finished stages are skipped).

    Stages: corpus (split into train and held-out), annotation (Wikipedia infoboxes; the LLM path: seed
    -> validate -> correct -> distill -> run; or the corpus's own calls), KB, LMLM and Standard training,
    cloze precision on real facts per split, edits of real facts in the KB, report.
    """
    from ..cli_errors import fail, out_folder, user_errors
    from ..errors import require
    from ..stages import resumable
    from .recipe import load_recipe
    from .run import run_pipeline

    out_folder(out)
    with user_errors():
        require("pipeline", ("matplotlib",), "lmlm pipeline")
        spec = load_recipe(recipe, set_ or (), corpus=str(corpus) if corpus else None,
                           device=device.value if device else None)
        if not spec.corpus.path:
            fail(f"recipe {spec.name} names no corpus: pass --corpus (a Wikipedia dump or a document file)")
        with resumable(out):
            report = run_pipeline(spec, out, fresh=fresh, progress=progress, until=until.value if until else None)
    if report is None:
        print(json.dumps({"stopped_after": until.value, "out": str(out)}))
        return
    c = report["corpus"]
    print(json.dumps({"lookup_calls": c["lookup_calls"], "calls_by_method": c["calls_by_method"],
                      "text_unchanged": c["text_unchanged"], "cloze": report["cloze"]["table"],
                      "edits": {k: v for k, v in (report["edits"] or {}).items() if k != "records"},
                      "report": str(out / "report.md")}))
