"""``lmlm bench annotate``: the annotation pipeline on a synthetic world with known gold calls.

1. A biography world (:mod:`lmlm.worlds.bios`) gives annotated training documents; 15% of their
   gold calls are damaged (:mod:`lmlm.annotate.corrupt`): wrong entity, relation not inferable from
   the left context, malformed, value not in the text.
2. Validation (:mod:`lmlm.annotate.validate`) and then the corrector (:mod:`lmlm.annotate.corrector`,
   an under-fitted LLaMA-style model trained here, the top 10% of calls by score dropped) clean the
   seed. Reported per kind of damage: the share removed (recall) by each stage and by both; per
   stage and per validation reason: the share of removed calls that were damaged (precision); and
   the share of clean calls kept.
3. An annotator (:mod:`lmlm.annotate.distill`, a small model trained from scratch on the cleaned
   seed) annotates held-out documents; reported: call-level precision/recall/F1 against their gold
   calls, and the share of documents whose text came back unchanged.

Prints one JSON object as its last line; ``--out`` also keeps the corrector's loss histogram
(``losses.png``), the annotator and ``report.json``. About three minutes on two CPU cores.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

from ..jsonio import write_json
from . import bench_app

__all__ = ["run_annotate_bench"]


def _per_reason(corrupted, validated) -> dict[str, Any]:
    """For each rejection reason: how many calls, and the share that were damaged (precision)."""
    out: dict[str, dict[str, Any]] = {}
    for doc, v in zip(corrupted, validated):
        for r in v.rejected:
            row = out.setdefault(r.reason, {"rejected": 0, "damaged": 0, "kinds": {}})
            kind = doc.labels.get(r.at, "unmatched") or "clean"  # unmatched: not at any gold call's place
            row["rejected"] += 1
            row["damaged"] += kind not in ("clean", "unmatched")
            row["kinds"][kind] = row["kinds"].get(kind, 0) + 1
    for row in out.values():
        row["precision"] = row["damaged"] / row["rejected"]
    return out


def _corrector_stage(corrupted, validated, correction) -> dict[str, Any]:
    """What the corrector alone did, on the calls that passed validation."""
    from ..annotate.corrupt import KINDS

    seen: dict[str, int] = {}
    dropped: dict[str, int] = {}
    for s in correction.scores:
        kind = corrupted[s.doc].labels.get(s.at) or "clean"
        seen[kind] = seen.get(kind, 0) + 1
        dropped[kind] = dropped.get(kind, 0) + s.dropped
    n_dropped = sum(dropped.values())
    return {"calls": len(correction.scores), "dropped": n_dropped,
            "precision": sum(dropped.get(k, 0) for k in KINDS) / max(n_dropped, 1),
            "removed": {k: dropped.get(k, 0) / seen[k] for k in (*KINDS, "clean") if seen.get(k)},
            "seen": seen}


def run_annotate_bench(out: Path | None = None, people: int = 600, fraction: float = 0.15, drop: float = 0.10,
                       corrector_steps: int = 150, annotator_steps: int = 400, heldout: int = 100, seed: int = 0,
                       progress: bool = False, annotator_base: str | None = None, lora_r: int = 32,
                       annotator_lr: float | None = None, device: str | None = None) -> dict[str, Any]:
    """Run the benchmark and return its report (see the module docstring)."""
    import torch

    from ..annotate.corrector import CorrectorConfig, correct, plot_losses
    from ..annotate.corrupt import call_f1, corrupt_documents, filter_scores
    from ..annotate.distill import DistillConfig, distill
    from ..annotate.lm import FitConfig
    from ..annotate.validate import ValidationReport, calls_with_offsets, validate
    from ..worlds.bios import BiosConfig, BiosWorld

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    world = BiosWorld.generate(BiosConfig.from_name("smoke", n_people=people, n_heldout_docs=heldout, seed=seed))
    corrupted = corrupt_documents([d.segments for d in world.train_documents], fraction, seed=seed)
    validated = [validate(c.text, c.annotated) for c in corrupted]
    t_validate = time.perf_counter()
    config = CorrectorConfig(drop=drop, device=device, fit=FitConfig(steps=corrector_steps, batch_size=8, seq_len=256,
                                                                     lr=5e-3, warmup_steps=10, seed=seed))
    correction = correct([v.segments for v in validated], config, out / "corrector" if out else None, progress)
    t_correct = time.perf_counter()
    if out:
        labels = [corrupted[s.doc].labels.get(s.at) for s in correction.scores]
        plot_losses(correction.scores, correction.threshold, out / "losses.png", labels)
    lr = annotator_lr or (2e-3 if annotator_base else 5e-3)
    annotator_cfg = DistillConfig(base=annotator_base, lora_r=lora_r, device=device,
                                  fit=FitConfig(steps=annotator_steps, batch_size=8, seq_len=256, lr=lr,
                                                warmup_steps=20, seed=seed))
    annotator, train_stats = distill(correction.documents, annotator_cfg, out / "annotator" if out else None, progress)
    t_distill = time.perf_counter()
    held = world.heldout_documents
    results = annotator.annotate([d.plain for d in held], batch_size=50)
    t_annotate = time.perf_counter()
    f1 = call_f1([list(zip(v.positions, v.kept)) for v in results], [calls_with_offsets(d.segments) for d in held])
    report = {
        "world": {"people": people, "train_documents": len(corrupted), "heldout_documents": len(held),
                  "calls": sum(len(c.labels) for c in corrupted), "damaged_fraction": fraction},
        "validation": {**filter_scores(corrupted, [set(v.positions) for v in validated]),
                       "reasons": _per_reason(corrupted, validated), **ValidationReport.of(validated).to_dict()},
        "corrector": {**_corrector_stage(corrupted, validated, correction), "drop": drop,
                      "train_loss": [correction.stats["first_loss"], correction.stats["final_loss"]],
                      "tokens_per_second": correction.stats["tokens_per_second"]},
        "validation_and_corrector": filter_scores(corrupted, correction.kept_offsets()),
        "annotator": {**f1, "text_unchanged": sum(not v.text_changed for v in results) / len(results),
                      "train_loss": [train_stats["first_loss"], train_stats["final_loss"]],
                      "train_tokens_per_second": train_stats["tokens_per_second"],
                      "base": annotator_base, "trainable_parameters": train_stats["trainable_parameters"],
                      "device": str(next(annotator.model.parameters()).device),
                      "documents_per_second": len(held) / (t_annotate - t_distill)},
        "seconds": {"validate": t_validate - t0, "corrector": t_correct - t_validate,
                    "distill": t_distill - t_correct, "annotate": t_annotate - t_distill,
                    "total": time.perf_counter() - t0},
    }
    if out:
        write_json(out / "report.json", report)
    return report


@bench_app.command("annotate")
def bench_annotate(out: Optional[Path] = typer.Option(None, help="keep the report, loss histogram and annotator here"),
                   people: int = typer.Option(600, min=2, help="people in the synthetic world"),
                   fraction: float = typer.Option(0.15, min=0.0, max=1.0, help="share of gold calls damaged"),
                   drop: float = typer.Option(0.10, min=0.0, max=1.0, help="share of calls the corrector drops"),
                   corrector_steps: int = typer.Option(150, min=1), annotator_steps: int = typer.Option(400, min=1),
                   heldout: int = typer.Option(100, min=1, help="held-out documents the annotator annotates"),
                   seed: int = typer.Option(0),
                   annotator_base: Optional[str] = typer.Option(
                       None, help="tune this pretrained LM (a folder, hub name or .gguf) with LoRA as the annotator "
                                  "instead of training a small one from scratch"),
                   lora_r: int = typer.Option(32, min=1, help="LoRA rank with --annotator-base"),
                   annotator_lr: Optional[float] = typer.Option(None, help="annotator peak learning rate "
                                                                           "(default 5e-3; 2e-3 with a base)"),
                   device: Optional[str] = typer.Option(None, help="cuda, cpu, ... (default: cuda when available)")):
    """Validation + corrector on damaged gold calls, and the distilled annotator's F1; JSON last line."""
    from ..cli_errors import check_device, user_errors

    check_device(device)
    if annotator_lr is not None and not annotator_lr > 0:
        raise typer.BadParameter(f"must be > 0, got {annotator_lr}", param_hint="--annotator-lr")
    with user_errors():  # a base model that is not there, ...: one line
        report = run_annotate_bench(out, people, fraction, drop, corrector_steps, annotator_steps, heldout, seed,
                                    progress=True, annotator_base=annotator_base, lora_r=lora_r,
                                    annotator_lr=annotator_lr, device=device)
    both, ann = report["validation_and_corrector"], report["annotator"]
    typer.echo(f"removed {both['removed_corrupted']:.1%} of damaged calls, kept {both['kept_clean']:.1%} of clean "
               f"ones; annotator F1 {ann['f1']:.3f}, text unchanged {ann['text_unchanged']:.0%}", err=True)
    print(json.dumps(report))
