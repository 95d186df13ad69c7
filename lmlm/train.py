"""Pretraining on annotated text: one loop for the LMLM and for the Standard baseline.

The LMLM trains on documents with their lookup calls, the Standard baseline on the same documents
stripped of them; everything else (model, order of documents, block shuffle, schedule) is shared.
Documents are tokenized into ids and roles (:mod:`lmlm.tokens`), concatenated in the given order,
packed into blocks of ``seq_len`` tokens, and the blocks are shuffled with the config's seed. The
labels are the ids with value tokens and ``<|db_end|>`` set to -100: the model learns to ask the
database, never to memorise its answers.

The loop is written out (nanoGPT-style) on top of Hugging Face Accelerate, which handles DDP,
mixed precision and ``save_state``. The loss is the token mean over the trained tokens of the
*global* batch, so one process with gradient accumulation and N processes sharing the same global
batch take the same steps.

Exercised by ``lmlm train`` and ``python -m lmlm.train --config cfg.json``; for several processes,
``torchrun --nproc_per_node N -m lmlm.train --config cfg.json`` (CPU: gloo; GPUs: NCCL) or, on
GPUs, ``accelerate launch -m lmlm.train --config cfg.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .lookup import Segment, parse, strip
from .models import ModelConfig, build_model, count_parameters
from .tokens import IGNORE_INDEX, ORG, ROLE_NAMES, Encoded, LookupTokenizer, labels_from_roles

__all__ = [
    "TrainConfig", "TrainResult", "Packed", "train", "pack", "encode_documents", "evaluate_loss",
    "read_documents", "main",
]

LOG_FILE = "train_log.jsonl"
CONFIG_FILE = "train_config.json"
STATE_DIR = "state"
CHECKPOINT_DIR = "checkpoint"

# Fields that may change when a run is resumed: they do not change which batches are seen or how.
_RESUMABLE_FIELDS = {"resume", "max_seconds", "stop_step", "eval_every", "save_every", "log_every", "progress",
                     "threads", "compile", "out_dir", "data", "eval_data", "micro_batch_size", "grad_accum"}


@dataclass
class TrainConfig:
    """Everything that defines a pretraining run; the resolved copy is written to ``out_dir``.

    Args:
        mode: ``"lmlm"`` (text with lookup calls, values masked) or ``"standard"`` (stripped text).
        model: a preset name from ``MODEL_PRESETS``; ``model_overrides`` changes single fields.
        tokenizer: used by :func:`main` only: a tokenizer folder/file/hub name, or ``"bpe:N"`` to
            train an N-token byte-level BPE on the stripped training text.
        data, eval_data: used by :func:`main` only: ``.jsonl`` (a ``"text"`` field per line) or
            ``.txt`` (one document per line) of annotated text.
        kb: the knowledge base the corpus was annotated against, recorded in the checkpoint.
        init_from: a checkpoint folder whose weights start the run (fine-tuning, e.g. on TOFU after
            pretraining); its architecture must be ``model`` and its vocabulary the tokenizer's.
        seq_len: tokens per packed block (at most the model's context length).
        batch_size: global batch in sequences per optimizer step (all processes together).
            ``None``: ``micro_batch_size * grad_accum * num_processes``.
        micro_batch_size: sequences per forward pass on each process.
        grad_accum: micro-steps per optimizer step; ``None``: derived from ``batch_size``.
        lr, min_lr_ratio, warmup_steps, schedule: peak learning rate, floor as a fraction of it,
            linear warmup steps, and ``"cosine"``, ``"linear"`` or ``"constant"`` after warmup.
        weight_decay, betas, grad_clip: AdamW (decay on matrices only) and gradient-norm clipping.
        max_steps: optimizer steps; ``None``: ``epochs`` passes over the blocks (1 if both unset).
        max_seconds: stop (and save state) once this much time has passed in this invocation.
        stop_step: stop (and save state) at this step; the schedule still runs to ``max_steps``.
        seed: model initialisation and block shuffle.
        eval_every: evaluate on ``eval_documents`` every this many steps (0: only at the end).
        save_every: ``accelerator.save_state`` every this many steps (0: only at the end/stop).
        log_every: write a line to ``train_log.jsonl`` every this many steps.
        out_dir: run folder (config, log, ``state/``, ``checkpoint/``).
        resume: continue from ``out_dir/state`` if it exists.
        precision: ``"no"``, ``"bf16"`` or ``"fp16"`` (Accelerate mixed precision), or ``"auto"``:
            bf16 on a GPU that has it and on a CPU with native bf16 (AVX512-BF16 or AMX), else
            ``"no"`` (on other CPUs bf16 autocast is many times slower than float32).
        cpu: train on CPU even if a GPU is present.
        threads: torch intra-op threads per process (default: cores / processes on this machine;
            on a machine shared with other busy processes, fewer threads can be faster).
        compile: ``torch.compile`` the forward and loss (20-50 s of compilation, needs a C++
            compiler; on 2 CPU cores it gained nothing in float32 and about 1.2x with bf16).
        progress: show a progress bar.
    """

    mode: str = "lmlm"
    model: str = "gpt2-small-cpu"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    data: str | None = None
    eval_data: str | None = None
    kb: str | None = None
    init_from: str | None = None
    seq_len: int = 256
    batch_size: int | None = None
    micro_batch_size: int = 16
    grad_accum: int | None = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_steps: int | None = None
    epochs: float | None = None
    max_seconds: float | None = None
    stop_step: int | None = None
    seed: int = 0
    eval_every: int = 0
    save_every: int = 0
    log_every: int = 10
    out_dir: str = "runs/train"
    resume: bool = False
    precision: str = "no"
    cpu: bool = False
    threads: int | None = None
    compile: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("lmlm", "standard"):
            raise ValueError(f"mode must be 'lmlm' or 'standard', got {self.mode!r}")
        if self.schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"schedule must be 'cosine', 'linear' or 'constant', got {self.schedule!r}")
        if self.precision not in ("no", "bf16", "fp16", "auto"):
            raise ValueError(f"precision must be 'no', 'bf16', 'fp16' or 'auto', got {self.precision!r}")
        for name in ("seq_len", "micro_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("batch_size", "grad_accum", "max_steps", "epochs", "max_seconds"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive or None, got {getattr(self, name)}")
        if self.max_steps is not None and self.epochs is not None:
            raise ValueError("give max_steps or epochs, not both")
        self.betas = tuple(self.betas)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_file(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainResult:
    """The trained model (unwrapped, eval mode) and the run's statistics."""

    model: Any
    stats: dict[str, Any]


# -- data ------------------------------------------------------------------------------------------

@dataclass
class Packed:
    """Packed blocks, all ``(num_blocks, seq_len)``; labels are aligned with ids (not shifted).

    ``num_tokens`` counts the real tokens; the rest of the last block is padding (label -100).
    """

    input_ids: torch.Tensor
    roles: torch.Tensor
    labels: torch.Tensor
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_tokens is None:
            self.num_tokens = self.input_ids.numel()

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token targets and their roles: labels/roles shifted left, last position -100."""
        return _shift_left(self.labels, IGNORE_INDEX), _shift_left(self.roles, ORG)

    def real(self) -> torch.Tensor:
        """``(num_blocks, seq_len)`` bool: True for data, False for padding."""
        return (torch.arange(self.input_ids.numel()) < self.num_tokens).view_as(self.input_ids)


def _shift_left(t: torch.Tensor, fill: int) -> torch.Tensor:
    return torch.cat([t[:, 1:], torch.full_like(t[:, :1], fill)], dim=1)


def encode_documents(documents: Sequence[Sequence[Segment] | str], tokenizer: LookupTokenizer,
                     mode: str = "lmlm") -> list[Encoded]:
    """Tokenize parsed documents: with their calls (``lmlm``) or stripped (``standard``).

    Strings are parsed as annotated text first. Both modes give identical ``org`` tokens.
    """
    if mode not in ("lmlm", "standard"):
        raise ValueError(f"mode must be 'lmlm' or 'standard', got {mode!r}")
    out = []
    for doc in documents:
        segs = parse(doc).segments if isinstance(doc, str) else doc
        out.append(tokenizer.encode(segs) if mode == "lmlm" else tokenizer.encode_plain(strip(segs)))
    return out


def pack(encoded_docs: Sequence[Encoded], seq_len: int, end_id: int, pad_id: int | None = None) -> Packed:
    """Concatenate encoded documents in order and cut the stream into blocks of ``seq_len``.

    Args:
        encoded_docs: from :func:`encode_documents` (each starts with the document separator).
        seq_len: block length.
        end_id: the ``<|db_end|>`` id (masked in the labels together with value tokens).
        pad_id: pad the last partial block with this id (role ``org``, label -100) so no token is
            lost; ``None`` drops the partial block instead.

    Returns:
        :class:`Packed` with ``input_ids``, ``roles`` and ``labels`` of shape ``(num_blocks, seq_len)``.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    ids = [t for e in encoded_docs for t in e.input_ids]
    roles = [r for e in encoded_docs for r in e.roles]
    labels = labels_from_roles(ids, roles, end_id)
    num_tokens, rest = len(ids), len(ids) % seq_len
    if rest and pad_id is not None:
        n_pad = seq_len - rest
        ids, roles, labels = ids + [pad_id] * n_pad, roles + [ORG] * n_pad, labels + [IGNORE_INDEX] * n_pad
    n = len(ids) // seq_len * seq_len

    def blocks(x):
        return torch.tensor(x[:n], dtype=torch.long).view(-1, seq_len)

    return Packed(blocks(ids), blocks(roles), blocks(labels), num_tokens=min(num_tokens, n))


def read_documents(path: str | Path) -> list[list[Segment]]:
    """Read annotated documents: ``.jsonl`` with a ``"text"`` field per line, or text, one per line."""
    path = Path(path)
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    texts = [json.loads(ln)["text"] for ln in lines] if path.suffix == ".jsonl" else lines
    return [parse(t).segments for t in texts]


# -- loss, evaluation, schedule -------------------------------------------------------------------

def _loss_sum(model, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over targets != -100. ``targets`` is already shifted."""
    logits = model(input_ids=input_ids).logits  # (B, T, vocab)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


@torch.no_grad()
def evaluate_loss(model, packed: Packed, batch_size: int = 16) -> dict[str, float]:
    """Mean next-token loss on trained tokens (``loss``) and per target role (``loss_org`` ...).

    The per-role losses cover every real target of that role, trained or not, so ``loss_value``
    shows how well the model guesses the values it is not trained on.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    targets, target_roles = packed.targets()
    next_ids = _shift_left(packed.input_ids, IGNORE_INDEX)  # the true next ids, masked or not
    real_next = _shift_left(packed.real(), False)
    nll = []
    for i in range(0, len(packed), batch_size):
        logits = model(input_ids=packed.input_ids[i:i + batch_size].to(device)).logits.float()  # (B, T, vocab)
        nll.append(F.cross_entropy(logits.transpose(1, 2), next_ids[i:i + batch_size].to(device),
                                   ignore_index=IGNORE_INDEX, reduction="none").cpu())
    nll = torch.cat(nll).double()  # (num_blocks, seq_len)
    model.train(was_training)
    masks = {"loss": targets != IGNORE_INDEX}
    masks.update({f"loss_{name}": real_next & (target_roles == k) for k, name in enumerate(ROLE_NAMES)})
    return {key: float(nll[m].mean()) for key, m in masks.items() if m.any()}


def learning_rate(step: int, config: TrainConfig, total_steps: int) -> float:
    """Linear warmup to ``lr``, then cosine/linear decay to ``lr * min_lr_ratio`` (or constant)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return config.lr
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if config.schedule == "cosine" else 1 - progress
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * decay)


def _optimizer(model, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings; not biases or norms
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # the fused kernel is several times faster than the per-tensor loop on CPU as well as GPU
    fused = all(p.dtype == torch.float32 and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=fused or None)


# -- the loop -------------------------------------------------------------------------------------

class _Batches:
    """Which blocks each optimizer step uses: a pure function of the step, so resuming skips exactly
    the consumed batches. Each epoch is a fresh permutation of the blocks seeded by ``seed + epoch``;
    the last incomplete global batch of an epoch is dropped."""

    def __init__(self, num_blocks: int, batch_size: int, seed: int):
        self.steps_per_epoch = num_blocks // batch_size
        self.num_blocks, self.batch_size, self.seed = num_blocks, batch_size, seed
        self._epoch, self._perm = -1, None

    def __call__(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.num_blocks, generator=g)
        return self._perm[i * self.batch_size:(i + 1) * self.batch_size]


def _resolve(config: TrainConfig, num_blocks: int, num_processes: int) -> TrainConfig:
    """Fill in batch_size / grad_accum / max_steps and validate them against the data."""
    mb, P = config.micro_batch_size, num_processes
    if config.batch_size is None:
        grad_accum = config.grad_accum or 1
        batch_size = mb * grad_accum * P
    else:
        batch_size = config.batch_size
        if batch_size % (mb * P):
            raise ValueError(f"batch_size {batch_size} is not a multiple of micro_batch_size {mb} x "
                             f"{P} processes")
        grad_accum = batch_size // (mb * P)
        if config.grad_accum is not None and config.grad_accum != grad_accum:
            raise ValueError(f"grad_accum {config.grad_accum} disagrees with batch_size {batch_size} = "
                             f"micro_batch_size {mb} x {P} processes x {grad_accum}")
    if num_blocks < batch_size:
        raise ValueError(f"the data packs into {num_blocks} blocks of {config.seq_len} tokens, fewer than "
                         f"one batch (batch_size {batch_size}); lower batch_size or seq_len")
    max_steps = config.max_steps
    if max_steps is None:
        max_steps = max(1, math.ceil((config.epochs or 1.0) * (num_blocks // batch_size)))
    return TrainConfig(**{**config.to_dict(), "batch_size": batch_size, "grad_accum": grad_accum,
                          "max_steps": max_steps, "epochs": None})


def _default_threads(num_local_processes: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, num_local_processes))


def train(config: TrainConfig, documents: Sequence[Sequence[Segment] | str], tokenizer: LookupTokenizer,
          eval_documents: Sequence[Sequence[Segment] | str] | None = None) -> TrainResult:
    """Pretrain a fresh model from ``config.model`` on ``documents`` and save it to ``out_dir/checkpoint``.

    Args:
        config: the run (see :class:`TrainConfig`).
        documents: parsed documents (lists of segments) or annotated strings, in corpus order.
        tokenizer: the :class:`LookupTokenizer` (lookup tokens included).
        eval_documents: optional held-out documents for ``eval_every`` and the final evaluation.

    Returns:
        :class:`TrainResult`; ``stats`` has ``steps, tokens, trained_tokens, seconds, final_loss,
        parameters`` and more, and is also stored in the checkpoint's ``lmlm.json``.
    """
    accelerator = _accelerator(config)
    torch.set_num_threads(config.threads or _default_threads(_local_world_size()))
    model_config = ModelConfig.from_name(config.model, **config.model_overrides)
    if config.seq_len > model_config.context_length:
        raise ValueError(f"seq_len {config.seq_len} exceeds the context length {model_config.context_length} "
                         f"of model {config.model!r}")
    if not documents:
        raise ValueError("documents is empty: nothing to train on")
    data, eval_data = (pack(encode_documents(docs, tokenizer, config.mode), config.seq_len, tokenizer.end_id,
                            pad_id=tokenizer.eos_id) if docs else None
                       for docs in (documents, eval_documents))
    config = _resolve(config, len(data), accelerator.num_processes)
    resolved = {"train": config.to_dict(), "model": model_config.to_dict(), "vocab_size": len(tokenizer),
                "num_processes": accelerator.num_processes, "num_blocks": len(data),
                "steps_per_epoch": len(data) // config.batch_size, "data_tokens": int(data.input_ids.numel()),
                "data_trained_tokens": int((data.labels != IGNORE_INDEX).sum())}
    resuming = _open_run_folder(accelerator, config, resolved)

    model = build_model(model_config, len(tokenizer), tokenizer, seed=config.seed)
    if config.init_from:
        _load_weights(model, config.init_from)
    model.train()
    model, optimizer = accelerator.prepare(model, _optimizer(model, config))
    start = {"step": 0, "trained_tokens": 0, "seconds": 0.0, "loss": None}
    if resuming:
        state_dir = Path(config.out_dir) / STATE_DIR
        accelerator.load_state(str(state_dir))
        start = json.loads((state_dir / "trainer_state.json").read_text())

    progress = _loop(accelerator, model, optimizer, config, data, eval_data, start)
    stats = {"steps": progress["step"], "completed": progress["step"] >= config.max_steps,
             "tokens": progress["step"] * config.batch_size * config.seq_len,
             "trained_tokens": progress["trained_tokens"], "seconds": progress["seconds"],
             "final_loss": progress["loss"], "tokens_per_second": progress["tokens_per_second"],
             "parameters": count_parameters(model_config, len(tokenizer)),
             "num_processes": accelerator.num_processes}
    if eval_data is not None:
        stats["eval"] = _evaluate_and_log(accelerator, model, eval_data, config, progress["step"])
    model = accelerator.unwrap_model(model).eval()
    if accelerator.is_main_process:
        from .checkpoint import save_checkpoint

        meta = {"mode": config.mode, "kb": config.kb, "model_preset": config.model, "train_config": resolved,
                "stats": stats}
        save_checkpoint(Path(config.out_dir) / CHECKPOINT_DIR, model, tokenizer, meta)
        (Path(config.out_dir) / "train_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    accelerator.wait_for_everyone()
    return TrainResult(model, stats)


def _load_weights(model, folder: str) -> None:
    """Copy the weights of the checkpoint in ``folder`` into ``model`` (same shapes required)."""
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    target = model.state_dict()
    bad = sorted(k for k in target if k not in source or source[k].shape != target[k].shape)
    if bad:
        raise ValueError(f"init_from {folder}: its weights do not fit the model ({len(bad)} tensors differ, "
                         f"e.g. {bad[0]}); use the same model preset and tokenizer")
    model.load_state_dict({k: source[k] for k in target})


def _loop(accelerator, model, optimizer, config: TrainConfig, data: Packed, eval_data: Packed | None,
          start: dict[str, Any]) -> dict[str, Any]:
    """Optimizer steps from ``start["step"]`` until ``max_steps``, ``stop_step`` or ``max_seconds``.

    Returns the progress (``step, trained_tokens, seconds, loss``, cumulative over resumed runs) and
    ``tokens_per_second`` of this invocation; the state is saved at the end.
    """
    out_dir = Path(config.out_dir)
    targets, _ = data.targets()
    batches = _Batches(len(data), config.batch_size, config.seed)
    loss_fn = torch.compile(_loss_sum) if config.compile else _loss_sum
    stop_at = min(config.max_steps, config.stop_step or config.max_steps)
    bar = _progress(accelerator.is_main_process and config.progress, config.max_steps, start["step"])
    progress = dict(start, tokens_per_second=0.0)
    t0 = time.perf_counter()
    while progress["step"] < stop_at:
        step = progress["step"]
        lr = learning_rate(step, config, config.max_steps)
        loss, count = _optimizer_step(accelerator, model, optimizer, loss_fn, data.input_ids, targets,
                                      batches(step), config, lr)
        elapsed = time.perf_counter() - t0
        step += 1
        speed = (step - start["step"]) * config.batch_size * config.seq_len / elapsed
        progress.update(step=step, trained_tokens=progress["trained_tokens"] + count, loss=loss,
                        seconds=start["seconds"] + elapsed, tokens_per_second=speed)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{speed:,.0f}", refresh=False)
        if accelerator.is_main_process and (step % config.log_every == 0 or step == stop_at):
            record = {"step": step, "loss": loss, "lr": lr, "tokens": step * config.batch_size * config.seq_len}
            record.update({k: progress[k] for k in ("trained_tokens", "seconds", "tokens_per_second")})
            _append(out_dir / LOG_FILE, record)
        if eval_data is not None and config.eval_every and step % config.eval_every == 0 and step < stop_at:
            _evaluate_and_log(accelerator, model, eval_data, config, step)
        if config.save_every and step % config.save_every == 0 and step < stop_at:
            _save_state(accelerator, out_dir / STATE_DIR, progress)
        if config.max_seconds and _any_process(accelerator, elapsed >= config.max_seconds):
            break
    if bar is not None:
        bar.close()
    _save_state(accelerator, out_dir / STATE_DIR, progress)
    return progress


def _optimizer_step(accelerator, model, optimizer, loss_fn, input_ids: torch.Tensor, targets: torch.Tensor,
                    idx: torch.Tensor, config: TrainConfig, lr: float) -> tuple[float, int]:
    """One optimizer step on the global batch ``idx`` (block indices); returns its loss and trained tokens.

    The global batch is cut into ``grad_accum`` micro-steps of ``micro_batch_size`` blocks per
    process, process ``rank`` taking its slice of each (as ``Accelerator(split_batches=True)``
    would). The loss is the sum over trained tokens divided by their count in the whole global batch.
    """
    P, rank, mb = accelerator.num_processes, accelerator.process_index, config.micro_batch_size
    for group in optimizer.param_groups:
        group["lr"] = lr
    # Every process holds all the data, so the global count of trained tokens needs no collective.
    count = int((targets[idx] != IGNORE_INDEX).sum())
    local_sum = torch.zeros((), device=accelerator.device)  # this process' loss sum, for logging
    for k in range(config.grad_accum):
        mine = idx[(k * P + rank) * mb:(k * P + rank + 1) * mb]  # (micro_batch_size,)
        x, y = input_ids[mine].to(accelerator.device), targets[mine].to(accelerator.device)
        last = k == config.grad_accum - 1
        with (nullcontext() if last else accelerator.no_sync(model)):  # all-reduce once per step
            s = loss_fn(model, x, y)
            # DDP averages gradients over processes: scale by P so the result is sum / global count.
            accelerator.backward(s * (P / max(count, 1)))
        local_sum += s.detach()
    if config.grad_clip:
        accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(accelerator.reduce(local_sum, "sum")) / max(count, 1), count


def _open_run_folder(accelerator, config: TrainConfig, resolved: dict[str, Any]) -> bool:
    """Create ``out_dir``, write the resolved config, and say whether to resume from ``out_dir/state``."""
    out_dir = Path(config.out_dir)
    resuming = config.resume and (out_dir / STATE_DIR / "trainer_state.json").exists()
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        if resuming:
            _check_resume(out_dir / CONFIG_FILE, resolved)
        elif (out_dir / LOG_FILE).exists():
            (out_dir / LOG_FILE).unlink()
        (out_dir / CONFIG_FILE).write_text(json.dumps(resolved, indent=2) + "\n")
    accelerator.wait_for_everyone()
    return resuming


# -- helpers of the loop ---------------------------------------------------------------------------

def _accelerator(config: TrainConfig):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # Accelerate keeps one process-wide state; a second in-process run with another precision
    # (a notebook, the tests) may start it afresh when no process group ties it down.
    cpu = config.cpu or not torch.cuda.is_available()
    precision = resolve_precision(config.precision, cpu)
    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision") != precision and _local_world_size() == 1:
        AcceleratorState._reset_state()
    return Accelerator(mixed_precision=precision, cpu=cpu)


def resolve_precision(precision: str, cpu: bool) -> str:
    """``"auto"`` made concrete for this machine (see :class:`TrainConfig`); other values as given."""
    if precision != "auto":
        return precision
    if not cpu:
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    from .kb.encoder import native_bf16

    return "bf16" if native_bf16() else "no"


def _local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def _progress(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _any_process(accelerator, flag: bool) -> bool:
    """True on every process if ``flag`` is true on any (processes stop at the same step)."""
    if accelerator.num_processes == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(t, "sum").item() > 0)


def _evaluate_and_log(accelerator, model, eval_data: Packed, config: TrainConfig, step: int) -> dict:
    """Evaluate on the main process (no collectives in the unwrapped forward); others wait."""
    result: dict[str, float] = {}
    if accelerator.is_main_process:
        result = evaluate_loss(accelerator.unwrap_model(model), eval_data, config.micro_batch_size)
        _append(Path(config.out_dir) / LOG_FILE, {"step": step, "eval": result})
    accelerator.wait_for_everyone()
    return result


class _TiedWeightsNote(logging.Filter):
    """Accelerate warns that it drops the tied GPT-2 output head when saving; loading re-ties it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


def _save_state(accelerator, state_dir: Path, progress: dict[str, Any]) -> None:
    """``accelerator.save_state`` into a fresh folder, then swap it in (a crash keeps the old state)."""
    log = logging.getLogger("accelerate.utils.other")
    if not any(isinstance(f, _TiedWeightsNote) for f in log.filters):
        log.addFilter(_TiedWeightsNote())
    tmp = state_dir.with_name(state_dir.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        record = {k: progress[k] for k in ("step", "trained_tokens", "seconds", "loss")}
        (tmp / "trainer_state.json").write_text(json.dumps(record) + "\n")
        if state_dir.exists():
            shutil.rmtree(state_dir)
        tmp.rename(state_dir)
    accelerator.wait_for_everyone()


def _check_resume(path: Path, resolved: dict[str, Any]) -> None:
    """Refuse to resume a run whose data or recipe changed (the saved batches would not line up)."""
    if not path.exists():
        return
    old = json.loads(path.read_text())
    diffs = []
    for key in set(old) | set(resolved):
        a, b = old.get(key), resolved.get(key)
        if key == "train":
            a = {k: v for k, v in (a or {}).items() if k not in _RESUMABLE_FIELDS}
            b = {k: v for k, v in (b or {}).items() if k not in _RESUMABLE_FIELDS}
            diffs += [f"train.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
                      if json.dumps(a.get(k)) != json.dumps(b.get(k))]
        elif key != "num_processes" and json.dumps(a) != json.dumps(b):
            diffs.append(f"{key}: {a!r} -> {b!r}")
    if diffs:
        raise ValueError(f"cannot resume from {path.parent}: the run changed ({'; '.join(diffs)})")


# -- command line -----------------------------------------------------------------------------------

def resolve_tokenizer(spec: str | None, documents: Sequence[Sequence[Segment]]) -> LookupTokenizer:
    """``"bpe:N"`` (default ``bpe:8192``) trains a BPE on the stripped documents; else load a tokenizer."""
    from .tokens import load_tokenizer, train_bpe

    spec = spec or "bpe:8192"
    if spec.startswith("bpe:"):
        return LookupTokenizer(train_bpe((strip(d) for d in documents), vocab_size=int(spec[4:])))
    return load_tokenizer(spec)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m lmlm.train --config cfg.json [--out-dir DIR] [--resume]``: train and print the stats."""
    from accelerate import PartialState

    parser = argparse.ArgumentParser(prog="python -m lmlm.train", description=main.__doc__)
    parser.add_argument("--config", required=True, help="TrainConfig as JSON (needs 'data')")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    config = TrainConfig.from_file(args.config)
    if args.out_dir:
        config.out_dir = args.out_dir
    if args.resume:
        config.resume = True
    if not config.data:
        raise SystemExit("the config needs 'data': a .jsonl or .txt file of annotated documents")
    state = PartialState(cpu=config.cpu or not torch.cuda.is_available())
    documents = read_documents(config.data)
    eval_documents = read_documents(config.eval_data) if config.eval_data else None
    tok_dir = Path(config.out_dir) / "tokenizer"
    with state.main_process_first():  # the main process trains a BPE once, the others load it
        if config.tokenizer and not config.tokenizer.startswith("bpe:"):
            tokenizer = resolve_tokenizer(config.tokenizer, documents)
        elif state.is_main_process and not (config.resume and (tok_dir / "tokenizer.json").exists()):
            tokenizer = resolve_tokenizer(config.tokenizer, documents)
            tokenizer.save(tok_dir)
        else:
            tokenizer = resolve_tokenizer(str(tok_dir), documents)
    result = train(config, documents, tokenizer, eval_documents)
    if state.is_main_process:
        print(json.dumps(result.stats))
    state.destroy_process_group()
    return result.stats


if __name__ == "__main__":
    main()
