"""Every protocol of the paper on the embedded worlds, with a report beside the paper's numbers: ``lmlm reproduce``.

Stages, each in its folder ``OUT/<stage>`` with its summary in ``done.json`` when done (:mod:`lmlm.stages`:
a rerun skips finished stages, and a stage cut short resumes from its cached pieces and training
states; ``fresh`` starts over):

1. ``bios``: the quickstart run on the biography world (world, KB, LMLM and Standard trained alike,
   cloze precision, the three perplexities, edits and deletes), in ``OUT/bios``;
2. ``data``: the world's facts written as T-REx, PopQA, FActScore and BIG-bench files;
3. ``factual``: T-REx, PopQA, FactScore for LMLM, LMLM with prefix-tree queries, LMLM without its
   database, LMLM with its calls left unanswered, and Standard; NLU multiple choice;
4. ``seeds``: the LMLM / Standard pair trained with other seeds: perplexity and T-REx per seed, so
   that each claim's margin is read against its spread;
5. ``rag``: BM25 passages of the training corpus prepended, for Standard and for a reader trained
   with passages, on the same protocols;
6. ``offloading``: facts ranked by the paper's loss difference, one model per offloading ratio;
7. ``tofu``: a fictitious-authors world in TOFU's files; LMLM and Standard fine-tuned from the
   biography models; LMLM unlearning by KB delete vs gradient ascent and NPO on Standard, with the
   LMLM fine-tuned under several seeds (the null: two retain models);

then ``report.json`` and ``report.md`` with PNG figures and the paper's claims checked.

Examples:
    >>> report = reproduce("runs/reproduce", preset="tiny")
    >>> [c["holds"] for c in report["claims"]]
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import Iterable

from ..stages import run_stage
from .config import REPRODUCE_PRESETS, ReproduceConfig
from .context import Run, console, read_json, write_json

__all__ = ["REPRODUCE_PRESETS", "ReproduceConfig", "STAGES", "reproduce"]


def _bios_stage(run: Run) -> dict:
    from ..quickstart import quickstart

    cfg = run.cfg
    rep = quickstart(run.bios, preset=cfg.bios, seed=cfg.seed, **cfg.bios_overrides)
    return {k: rep[k] for k in ("world", "factual_precision", "perplexity", "unlearning", "edits", "added_knowledge",
                                "wrong_entity", "models", "timings_seconds")}


def _stages() -> dict:
    from .factual import data_stage, factual_stage
    from .offloading import offloading_stage
    from .rag import rag_stage
    from .seeds import seeds_stage
    from .unlearning import tofu_stage

    return {"bios": _bios_stage, "data": data_stage, "factual": factual_stage, "seeds": seeds_stage,
            "rag": rag_stage, "offloading": offloading_stage, "tofu": tofu_stage}


STAGES = ("bios", "data", "factual", "seeds", "rag", "offloading", "tofu")


def reproduce(out: str | Path = "runs/reproduce", preset: str = "cpu", fresh: bool = False,
              stop_after: str | None = None, sets: Iterable[str] = (), **overrides) -> dict:
    """Run every stage not yet done in ``out`` and write the report; returns it (``report.json``).

    Args:
        out: the run folder.
        preset: a row of :data:`REPRODUCE_PRESETS` (``cpu`` or ``tiny``) or a ``.toml`` file of its fields;
            ``sets`` (``key=value``, as ``--set``) and ``overrides`` change fields.
        fresh: delete ``out`` first.
        stop_after: stop once this stage is done, without a report (as if interrupted there).
    """
    import torch

    cfg = ReproduceConfig.from_name(preset, sets, **overrides)
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"stop_after must be one of {STAGES}, got {stop_after!r}")
    out = Path(out)
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "config.json").exists() and read_json(out / "config.json") != json.loads(json.dumps(cfg.to_dict())):
        raise ValueError(f"{out} holds a reproduction with another config; use another folder or fresh=True")
    write_json(out / "config.json", cfg.to_dict())
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run = Run(cfg, out)
    stages, timings = {}, {}
    fns = _stages()
    try:
        for name in STAGES:  # a folder of an older version marked a stage done by results/<stage>.json
            stages[name] = run_stage(out / name, partial(fns[name], run), name, title=f"reproduce: {name}",
                                     legacy=out / "results" / f"{name}.json")
            timings[name] = stages[name].get("seconds", 0.0)
            if name == stop_after:
                return {"preset": cfg.name, "config": cfg.to_dict(), "stages": stages, "timings_seconds": timings}
    finally:
        run.close()
    from .claims import check_claims
    from .report import write_reproduction_report

    timings["total"] = sum(timings.values())
    report = {"preset": cfg.name, "config": cfg.to_dict(), "stages": stages, "timings_seconds": timings,
              "claims": check_claims(stages)}
    write_json(out / "report.json", report)
    write_reproduction_report(report, out)
    console.print(f"[bold green]reproduction done[/]: {out / 'report.md'}")
    return report
