"""``lmlm train``: a training run from flags, a config file, or both (flags win).

Also ``python -m lmlm.train ...`` with the same flags, for launchers: ``torchrun --nproc_per_node N
-m lmlm.train ...`` (CPU: gloo; GPUs: NCCL) or ``accelerate launch --config_file
configs/accelerate/fsdp.yaml -m lmlm.train ...``.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional, Sequence

import typer

__all__ = ["train_command", "main", "config_from_options"]


class Packing(str, Enum):
    stream = "stream"
    document = "document"
    fit = "fit"


class Mode(str, Enum):
    lmlm = "lmlm"
    standard = "standard"


class Precision(str, Enum):
    auto = "auto"
    no = "no"
    bf16 = "bf16"
    fp16 = "fp16"


# Fields that say the same thing another way: an option given replaces the config file's counterpart.
_COUNTERPARTS = {"max_steps": "epochs", "epochs": "max_steps", "batch_size": "max_tokens_per_step",
                 "max_tokens_per_step": "batch_size"}


def config_from_options(config_file: Path | None, options: dict[str, Any]):
    """The :class:`TrainConfig` of a config file (or the defaults) with the given options laid over it;
    an option replaces its counterpart in the file too (``epochs`` the file's ``max_steps``, ``batch_size``
    its ``max_tokens_per_step``, and back)."""
    from .config import TrainConfig

    given = {k: v for k, v in options.items() if v is not None}
    base = TrainConfig.from_file(config_file).to_dict() if config_file else {}
    for name, other in _COUNTERPARTS.items():
        if name in given and other not in given:
            base.pop(other, None)
    if "batch_size" in given or "max_tokens_per_step" in given:
        base.pop("grad_accum", None)  # a run's resolved config holds the old batch's
    return TrainConfig.from_dict({**base, **given})


def train_command(
    config: Optional[Path] = typer.Option(None, help="a TrainConfig JSON (fields: see the README); flags override it"),
    data: Optional[str] = typer.Option(None, help="training documents (.jsonl/.json/.parquet/.txt, a datasets "
                                       "folder) or a shards folder from `lmlm data prepare`"),
    eval_data: Optional[str] = typer.Option(None, help="held-out documents or shards, evaluated at the end"),
    split: Optional[str] = typer.Option(None, help="train on the documents of this split (default: train, and "
                                        "documents without a split; the others are counted in summary.json)"),
    model: Optional[str] = typer.Option(None, help="model preset trained from scratch (`lmlm presets`); "
                                        "default gpt2-small-cpu"),
    init_from: Optional[str] = typer.Option(None, help="start from these weights: an lmlm checkpoint, a Hugging "
                                            "Face folder, a hub name (local copy first) or a .gguf file"),
    tokenizer: Optional[str] = typer.Option(None, help="tokenizer folder/file/hub name or bpe:N (default: the "
                                            "init-from model's own, else bpe:8192 trained on the data)"),
    mode: Optional[Mode] = typer.Option(None, help="lmlm (calls kept, values untrained) or standard (calls stripped)"),
    max_steps: Optional[int] = typer.Option(None, min=1, help="optimizer steps"),
    epochs: Optional[float] = typer.Option(None, min=0.0, help="passes over the data (instead of --max-steps)"),
    batch_size: Optional[int] = typer.Option(None, min=1, help="global batch in sequences"),
    micro_batch_size: Optional[int] = typer.Option(None, min=1, help="sequences per forward pass and process"),
    max_tokens_per_step: Optional[int] = typer.Option(None, min=1, help="global batch in tokens (instead of --batch-size)"),
    seq_len: Optional[int] = typer.Option(None, min=1, help="tokens per training sequence"),
    packing: Optional[Packing] = typer.Option(None, help="stream: documents concatenated and cut (default); "
                                              "document: each document starts a sequence (short documents); fit: "
                                              "short documents share sequences whole, kept apart, no padding"),
    lora: Optional[int] = typer.Option(None, min=0, help="train a LoRA adapter of this rank on a pretrained "
                                       "--init-from (lookup token rows trained too; merged at save); 0: all weights"),
    lora_alpha: Optional[int] = typer.Option(None, min=1, help="LoRA scale numerator (default: twice the rank)"),
    freeze_layers: Optional[int] = typer.Option(None, min=0, help="leave the lowest N transformer layers untouched"),
    lr: Optional[float] = typer.Option(None, min=0.0, help="peak learning rate"),
    warmup_steps: Optional[int] = typer.Option(None, min=0, help="linear warmup steps"),
    precision: Optional[Precision] = typer.Option(None, help="auto: bf16 where the device computes it natively"),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile (default: on for CUDA)"),
    grad_checkpointing: Optional[bool] = typer.Option(None, "--grad-checkpointing", help="recompute activations: less memory"),
    report_to: Optional[List[str]] = typer.Option(None, help="also log to these trackers: tensorboard, wandb, all"),
    kb: Optional[str] = typer.Option(None, help="the KB the corpus was annotated against (recorded in the checkpoint)"),
    out: Optional[Path] = typer.Option(None, "--out", "--out-dir", help="run folder (default runs/train); a new "
                                       "run replaces the run it holds (--resume continues that one)"),
    seed: Optional[int] = typer.Option(None, min=0),
    save_every: Optional[int] = typer.Option(None, min=0, help="save the training state every N steps"),
    log_every: Optional[int] = typer.Option(None, min=1, help="log loss, tokens/s and MFU every N steps"),
    eval_every: Optional[int] = typer.Option(None, min=0, help="evaluate on --eval-data every N steps"),
    max_seconds: Optional[float] = typer.Option(None, min=0.0, help="stop (state saved) after this long"),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads per process"),
    cpu: Optional[bool] = typer.Option(None, "--cpu", help="train on the CPU even if a GPU is present"),
    allow_no_calls: Optional[bool] = typer.Option(None, "--allow-no-calls", help="train --mode lmlm on text without "
                                                  "a single lookup call"),
    skip_malformed: Optional[bool] = typer.Option(None, "--skip-malformed", help="leave out documents with a "
                                                  "malformed lookup call (counted in summary.json and on stderr); "
                                                  "without it such a document stops the run, named FILE:LINE"),
    resume: bool = typer.Option(False, help="continue from OUT/state (with none saved: start from step 0, and "
                                "say so)"),
    progress: bool = typer.Option(True, help="show a progress bar"),
):
    """Train an LMLM (or the Standard baseline) from scratch or from a pretrained model; writes OUT/checkpoint.

    OUT/summary.json says how many documents, lookup calls and tokens the run saw; OUT/train_log.jsonl
    holds loss, tokens/s and MFU. Several processes: `torchrun --nproc_per_node N -m lmlm.train ...`.
    """
    from ..cli_errors import fail, user_errors

    options = dict(data=data, eval_data=eval_data, split=split, model=model, init_from=init_from, tokenizer=tokenizer,
                   mode=mode.value if mode else None, max_steps=max_steps, epochs=epochs, batch_size=batch_size,
                   micro_batch_size=micro_batch_size, max_tokens_per_step=max_tokens_per_step, seq_len=seq_len,
                   packing=packing.value if packing else None, lora=lora, lora_alpha=lora_alpha,
                   freeze_layers=freeze_layers,
                   lr=lr, warmup_steps=warmup_steps, precision=precision.value if precision else None,
                   compile=compile, grad_checkpointing=grad_checkpointing, report_to=report_to or None, kb=kb,
                   out_dir=str(out) if out else None, seed=seed, save_every=save_every, log_every=log_every,
                   eval_every=eval_every, max_seconds=max_seconds, threads=threads, cpu=cpu,
                   allow_no_calls=allow_no_calls, skip_malformed=skip_malformed, resume=resume or None,
                   progress=None if progress else False)
    with user_errors():
        cfg = config_from_options(config, options)
        if batch_size is not None and micro_batch_size is None and cfg.batch_size % cfg.micro_batch_size:
            cfg = cfg.replace(micro_batch_size=math.gcd(cfg.batch_size, cfg.micro_batch_size))  # --batch-size 2 works
        if cfg.data is None:
            fail("nothing to train on: give --data (documents or a shards folder) or a --config with 'data'")
        return _run(cfg)


def _run(cfg) -> dict:
    import signal
    import sys

    import torch
    from accelerate import PartialState

    from .loop import STOP, train

    def stop(signum, frame):  # the first Ctrl-C ends the run after the step under way, its state saved
        if STOP.is_set():
            raise KeyboardInterrupt
        STOP.set()
        print("stopping after this step and saving the state (Ctrl-C again to quit at once)", file=sys.stderr)

    state = PartialState(cpu=cfg.cpu or not torch.cuda.is_available())
    previous = signal.signal(signal.SIGINT, stop)
    try:
        result = train(cfg)
    finally:
        signal.signal(signal.SIGINT, previous)
    if state.is_main_process:
        print(json.dumps(result.stats))
    state.destroy_process_group()
    if STOP.is_set() and not result.stats.get("completed"):
        print(f"interrupted at step {result.stats['steps']}: the state is saved in {cfg.out_dir}; the same command "
              f"with --resume goes on", file=sys.stderr)
        raise SystemExit(130)
    return result.stats


def main(argv: Sequence[str] | None = None) -> dict:
    """``python -m lmlm.train [flags]``: the ``lmlm train`` command; returns the run's stats."""
    import sys

    import typer.main

    command = typer.main.get_command(_app())
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:
        command(args, prog_name="python -m lmlm.train")
        return {}
    return command.main(args, prog_name="python -m lmlm.train", standalone_mode=False)


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_command)
    return app
