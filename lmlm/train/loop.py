"""The training loop: one loop for the LMLM and the Standard baseline, on a CPU, a GPU or several.

The loop is written out (nanoGPT-style) on top of Hugging Face Accelerate, which handles DDP/FSDP,
mixed precision and ``save_state``. The loss is the token mean over the trained tokens of the
*global* batch, so one process with gradient accumulation and N processes sharing the same global
batch take the same steps. On a GPU: bf16 autocast, PyTorch SDPA attention (flash kernels), fused
AdamW and ``torch.compile`` of the model and loss; tokens/s and MFU (:mod:`lmlm.train.speed`) are
logged every ``log_every`` steps to ``train_log.jsonl`` and to Accelerate's trackers.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from ..jsonio import write_json
from ..scoring import target_logprobs
from ..tokens import IGNORE_INDEX, ROLE_NAMES, LookupTokenizer
from .config import TrainConfig, TrainConfigError
from .data import Batches, Packed, shift_left
from .lora import add_lora, freeze_lower_layers, merge, trainable_parameters
from .folder import (CHECKPOINT_DIR, CONFIG_FILE, LOG_FILE, STATE_DIR, STATS_FILE, SUMMARY_FILE, check_out_dir,
                     open_run_folder)
from .speed import flops_per_token, mfu, peak_flops

__all__ = ["TrainResult", "train", "run_steps", "evaluate_loss", "learning_rate", "resolve_precision", "make_optimizer",
           "optimizer_step", "lm_loss_sum", "accelerator_for", "LOG_FILE", "CONFIG_FILE", "SUMMARY_FILE", "STATE_DIR", "CHECKPOINT_DIR"]

STOP = threading.Event()  # set (lmlm train's Ctrl-C): stop after the step under way, the state saved as at the end


@dataclass
class TrainResult:
    """The trained model (unwrapped, eval mode), its tokenizer and the run's statistics."""

    model: Any
    stats: dict[str, Any]
    tokenizer: LookupTokenizer | None = None


# -- loss, evaluation, schedule -------------------------------------------------------------------

def lm_loss_sum(model, input_ids: torch.Tensor, targets: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of next-token cross-entropy over targets != -100. ``targets`` is already shifted;
    ``position_ids`` restart at each document of a block that holds several (``packing="fit"``)."""
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits  # (B, T, vocab)
    return -target_logprobs(logits, targets).sum()


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
    next_ids = shift_left(packed.input_ids, IGNORE_INDEX)  # the true next ids, masked or not
    real_next = shift_left(packed.real(), False)
    nll = []
    for i in range(0, len(packed), batch_size):
        positions = packed.positions(slice(i, i + batch_size))
        logits = model(input_ids=packed.input_ids[i:i + batch_size].to(device),
                       position_ids=None if positions is None else positions.to(device)).logits  # (B, T, vocab)
        nll.append(-target_logprobs(logits, next_ids[i:i + batch_size].to(device)).cpu())
    nll = torch.cat(nll).double()  # (num_blocks, seq_len)
    model.train(was_training)
    masks = {"loss": targets != IGNORE_INDEX}
    masks.update({f"loss_{name}": real_next & (target_roles == k) for k, name in enumerate(ROLE_NAMES)})
    return {key: float(nll[m].mean()) for key, m in masks.items() if m.any()}


def learning_rate(step: int, config: TrainConfig, total_steps: int) -> float:
    """Linear warmup to ``lr``, then cosine/linear decay to ``lr * min_lr_ratio`` (or constant).

    ``config``: anything with ``lr``, ``warmup_steps``, ``min_lr_ratio`` and optionally ``schedule``
    (default cosine): a :class:`TrainConfig` or the annotator's ``FitConfig``.
    """
    schedule = getattr(config, "schedule", "cosine")
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if schedule == "constant":
        return config.lr
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * decay)


def make_optimizer(model, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings; not biases or norms
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # the fused kernel is several times faster than the per-tensor loop on CPU as well as GPU
    fused = all(p.dtype == torch.float32 and p.device.type in ("cpu", "cuda") and type(p) is torch.nn.Parameter
                for p in params)  # not for FSDP's sharded (DTensor) parameters
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, fused=fused or None)


# -- the run ----------------------------------------------------------------------------------------

def _resolve(config: TrainConfig, num_blocks: int, num_processes: int) -> TrainConfig:
    """Fill in batch_size / grad_accum / max_steps and validate them against the data."""
    mb, P = config.micro_batch_size, num_processes
    batch_size = config.batch_size
    if batch_size is None and config.max_tokens_per_step is not None:
        batch_size = max(1, config.max_tokens_per_step // config.seq_len)
        batch_size = max(mb * P, batch_size // (mb * P) * (mb * P))  # a whole number of micro-batches
    if batch_size is None:
        grad_accum = config.grad_accum or 1
        batch_size = mb * grad_accum * P
    else:
        if batch_size % (mb * P):
            raise TrainConfigError(f"batch_size {batch_size} is not a multiple of micro_batch_size {mb} x "
                                   f"{P} processes")
        grad_accum = batch_size // (mb * P)
        if config.grad_accum is not None and config.grad_accum != grad_accum:
            raise TrainConfigError(f"grad_accum {config.grad_accum} disagrees with batch_size {batch_size} = "
                                   f"micro_batch_size {mb} x {P} processes x {grad_accum}")
    if num_blocks < batch_size:
        raise TrainConfigError(f"the data packs into {num_blocks} blocks of {config.seq_len} tokens, fewer than "
                               f"one batch (batch_size {batch_size}); lower batch_size or seq_len")
    max_steps = config.max_steps
    if max_steps is None:
        max_steps = max(1, math.ceil((config.epochs or 1.0) * (num_blocks // batch_size)))
    return config.replace(batch_size=batch_size, grad_accum=grad_accum, max_steps=max_steps, epochs=None,
                          max_tokens_per_step=None)


def _default_threads(num_local_processes: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, num_local_processes))


def train(config: TrainConfig, documents: Sequence | None = None, tokenizer: LookupTokenizer | None = None,
          eval_documents: Sequence | None = None) -> TrainResult:
    """Train a model and save it to ``out_dir/checkpoint``.

    Args:
        config: the run (see :class:`TrainConfig`).
        documents: :class:`lmlm.corpus.Document` objects, parsed documents (lists of segments) or
            annotated strings, in corpus order. ``None``: read ``config.data`` (documents or shards).
        tokenizer: the :class:`LookupTokenizer`; ``None``: from the shards, the ``init_from`` model,
            ``config.tokenizer``, or a BPE trained on the documents (see :class:`TrainConfig`).
        eval_documents: held-out documents for ``eval_every`` and the final evaluation
            (``None``: ``config.eval_data`` if set).

    Returns:
        :class:`TrainResult`; ``stats`` has ``steps, tokens, trained_tokens, seconds, final_loss,
        tokens_per_second, mfu, parameters`` and more, and is also stored in the checkpoint's ``lmlm.json``.
    """
    from .inputs import check_kb, open_inputs

    check_out_dir(config.out_dir)
    check_kb(config.kb)
    accelerator = accelerator_for(config)
    torch.set_num_threads(config.threads or _default_threads(_local_world_size()))
    inputs = open_inputs(config, documents, tokenizer, eval_documents, accelerator)
    model, tokenizer, data, eval_data = inputs.model, inputs.tokenizer, inputs.data, inputs.eval_data
    config = config.replace(seq_len=inputs.seq_len)
    config = _resolve(config, len(data), accelerator.num_processes)
    resolved = {"train": config.to_dict(), "model": inputs.model_info, "vocab_size": len(tokenizer),
                "num_processes": accelerator.num_processes, "num_blocks": len(data),
                "steps_per_epoch": len(data) // config.batch_size, "data_tokens": int(data.num_tokens),
                "data_trained_tokens": data.trained_tokens()}
    resuming = open_run_folder(accelerator, config, resolved, inputs.summary, keep_tokenizer=inputs.trained_tokenizer)

    if config.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    vocab = len(tokenizer)
    multiple = config.vocab_multiple or (64 if accelerator.device.type == "cuda" else 1)
    vocab_keys = _vocab_keys(model)
    if multiple > 1 and model.get_input_embeddings().num_embeddings % multiple:
        model.resize_token_embeddings(vocab, pad_to_multiple_of=multiple, mean_resizing=False)
    model = _cheap(model, config, tokenizer, accelerator)
    trainable = trainable_parameters(model)
    model, optimizer = accelerator.prepare(model, make_optimizer(model, config))  # together: FSDP2 needs both
    start = None  # a fresh run: run_steps starts at step 0
    if resuming:
        state_dir = Path(config.out_dir) / STATE_DIR
        accelerator.load_state(str(state_dir))
        start = json.loads((state_dir / "trainer_state.json").read_text())
    if config.report_to:
        accelerator.init_trackers("lmlm", config={k: v for k, v in config.to_dict().items()
                                                  if isinstance(v, (int, float, str, bool))})

    out_dir = Path(config.out_dir)
    progress = run_steps(accelerator, model, optimizer, config, data, start, eval_data=eval_data,
                         log_path=out_dir / LOG_FILE, state_dir=out_dir / STATE_DIR)
    unwrapped = accelerator.unwrap_model(model)
    stats = {"steps": progress["step"], "completed": progress["step"] >= config.max_steps,
             "tokens": progress["tokens"], "block_tokens": progress["step"] * config.batch_size * config.seq_len,
             "trained_tokens": progress["trained_tokens"], "seconds": progress["seconds"],
             "final_loss": progress["loss"], "tokens_per_second": progress["tokens_per_second"],
             "mfu": progress.get("mfu"), "compile": progress["compile"], "parameters": inputs.parameters,
             "trainable_parameters": trainable,
             "num_processes": accelerator.num_processes, "documents": inputs.summary.get("documents"),
             "lookup_calls": inputs.summary.get("lookup_calls")}
    if eval_data is not None:
        stats["eval"] = _evaluate_and_log(accelerator, model, eval_data, config, progress["step"])
    if config.report_to:
        accelerator.end_training()
    state_dict = accelerator.get_state_dict(model) if _sharded(accelerator) else None  # gathered on every rank
    model = _trim_vocab(merge(unwrapped), vocab).eval()
    model.config.vocab_size = vocab
    if state_dict is not None:
        state_dict = {k: (v[:vocab] if k in vocab_keys else v) for k, v in state_dict.items()}
    if accelerator.is_main_process:
        from ..checkpoint import save_checkpoint

        meta = {"mode": config.mode, "kb": _kb_reference(config.kb), "model_preset": config.model,
                "init_from": inputs.model_info.get("init_from"), "train_config": resolved, "stats": stats}
        save_checkpoint(Path(config.out_dir) / CHECKPOINT_DIR, model, tokenizer, meta, state_dict=state_dict)
        write_json(Path(config.out_dir) / STATS_FILE, stats)
        write_json(Path(config.out_dir) / SUMMARY_FILE, {**inputs.summary, "steps": stats["steps"],
                                                          "trained_tokens_seen": stats["trained_tokens"],
                                                          "tokens_seen": stats["tokens"]})
    accelerator.wait_for_everyone()
    return TrainResult(model, stats, tokenizer)


def _cheap(model, config: TrainConfig, tokenizer: LookupTokenizer, accelerator):
    """``model`` with a LoRA adapter (``config.lora``) or its lowest layers frozen (``config.freeze_layers``)."""
    if config.lora and _sharded(accelerator):
        raise TrainConfigError("lora with FSDP: the adapter is a few million weights, train it on one process "
                               "per GPU (DDP) instead")
    if config.lora:
        return add_lora(model, config.lora, config.lora_alpha, new_token_ids=tokenizer.call_ids,
                        freeze_layers=config.freeze_layers)
    if config.freeze_layers:
        freeze_lower_layers(model, config.freeze_layers)
    return model


def _trim_vocab(model, vocab: int):
    """Cut the training-only padding rows off the embedding and head (no-op without padding)."""
    if model.get_input_embeddings().num_embeddings > vocab and not _is_dtensor(model.get_input_embeddings().weight):
        model.resize_token_embeddings(vocab, mean_resizing=False)
    return model


def _vocab_keys(model) -> set[str]:
    """State-dict keys of the token embedding and output head (their first dimension is the vocabulary)."""
    mods = {id(m) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}
    return {f"{name}.weight" for name, m in model.named_modules() if id(m) in mods}


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor"


def _sharded(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP


def _kb_reference(kb: str | None) -> str | None:
    """The KB as recorded in the checkpoint: absolute for a local folder/file, as given for a URL."""
    if kb is None or "://" in kb:
        return kb
    return str(Path(kb).resolve())


def run_steps(accelerator, model, optimizer, config: TrainConfig, data: Packed, start: dict[str, Any] | None = None,
              *, eval_data: Packed | None = None, log_path: Path | None = None, state_dir: Path | None = None,
              on_step: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Optimizer steps from ``start["step"]`` (default 0) until ``max_steps``, ``stop_step`` or ``max_seconds``:
    the training loop of :func:`train`, and of the annotator's and corrector's ``fit``.

    Args:
        data: the packed blocks; each step takes the blocks :class:`Batches` gives it.
        eval_data: held-out blocks, evaluated every ``eval_every`` steps.
        log_path: where a JSON line goes every ``log_every`` steps and at the last (None: nowhere).
        state_dir: where the optimizer state is saved every ``save_every`` steps and at the end, so
            a run resumes (None: not saved).
        on_step: called with (step, loss) after every step.

    Returns the progress (``step, trained_tokens, seconds, loss``, cumulative over resumed runs),
    ``tokens_per_second`` and ``mfu`` of this invocation.
    """
    start = start or {"step": 0, "trained_tokens": 0, "seconds": 0.0, "loss": None}
    tokens_per_step = config.batch_size * config.seq_len
    start.setdefault("tokens", start["step"] * tokens_per_step)  # a state saved before padding was told apart
    batches = Batches(len(data), config.batch_size, config.seed)
    compile_ = config.compile if config.compile is not None else accelerator.device.type == "cuda"
    loss_fn = torch.compile(lm_loss_sum) if compile_ else lm_loss_sum
    flops = flops_per_token(accelerator.unwrap_model(model), config.seq_len)
    peak = peak_flops(accelerator.device, accelerator.mixed_precision)
    stop_at = min(config.max_steps, config.stop_step or config.max_steps)
    bar = tqdm(total=config.max_steps, initial=start["step"], desc="train", unit="step", dynamic_ncols=True,
               disable=not (accelerator.is_main_process and config.progress))
    progress = dict(start, tokens_per_second=0.0, mfu=None, compile=compile_)
    t0 = time.perf_counter()
    window = (t0, start["step"], start["tokens"])  # speed over the last log interval (after the first compile)
    while progress["step"] < stop_at:
        step = progress["step"]
        lr = learning_rate(step, config, config.max_steps)
        idx = batches(step)
        loss, count = optimizer_step(accelerator, model, optimizer, loss_fn, data.blocks(idx), config, lr,
                                     positions=data.positions(idx))
        step += 1
        now = time.perf_counter()
        tokens = progress["tokens"] + data.real_tokens(idx)  # the padding of short blocks is not counted
        span = max(now - window[0], 1e-9)
        speed, computed = (tokens - window[2]) / span, (step - window[1]) * tokens_per_step / span
        progress.update(step=step, tokens=tokens, trained_tokens=progress["trained_tokens"] + count, loss=loss,
                        seconds=start["seconds"] + now - t0, tokens_per_second=speed, mfu=mfu(computed, flops, peak))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{speed:,.0f}", refresh=False)
        if step % config.log_every == 0 or step == stop_at:
            record = {"step": step, "loss": loss, "lr": lr, "tokens": tokens}
            record.update({k: progress[k] for k in ("trained_tokens", "seconds", "tokens_per_second", "mfu")})
            if accelerator.is_main_process and log_path is not None:
                _append(log_path, record)
            if config.report_to:
                accelerator.log({k: v for k, v in record.items() if v is not None and k != "step"}, step=step)
            window = (time.perf_counter(), step, tokens)
        if eval_data is not None and config.eval_every and step % config.eval_every == 0 and step < stop_at:
            _evaluate_and_log(accelerator, model, eval_data, config, step)
        if on_step is not None:
            on_step(step, loss)
        if state_dir is not None and config.save_every and step % config.save_every == 0 and step < stop_at:
            _save_state(accelerator, state_dir, progress)
        if (config.max_seconds or STOP.is_set()) and _any_process(
                accelerator, STOP.is_set() or now - t0 >= config.max_seconds):
            break
    bar.close()
    span = max(time.perf_counter() - t0, 1e-9)
    progress["tokens_per_second"] = (progress["tokens"] - start["tokens"]) / span
    progress["mfu"] = mfu((progress["step"] - start["step"]) * tokens_per_step / span, flops, peak)
    if state_dir is not None:
        _save_state(accelerator, state_dir, progress)
    return progress


def optimizer_step(accelerator, model, optimizer, loss_fn, batch: tuple[torch.Tensor, ...], config: TrainConfig,
                    lr: float, positions: torch.Tensor | None = None) -> tuple[float, int]:
    """One optimizer step on the global batch ``(input_ids, targets, _)``; returns its loss and trained tokens.
    ``positions``: the blocks' position ids where documents share blocks (``Packed.positions``).

    The global batch is cut into ``grad_accum`` micro-steps of ``micro_batch_size`` blocks per
    process, process ``rank`` taking its slice of each (as ``Accelerator(split_batches=True)``
    would). The loss is the sum over trained tokens divided by their count in the whole global batch.
    """
    input_ids, targets = batch[0], batch[1]
    P, rank, mb = accelerator.num_processes, accelerator.process_index, config.micro_batch_size
    for group in optimizer.param_groups:
        group["lr"] = lr
    # Every process reads the whole global batch, so the global count of trained tokens needs no collective.
    count = int((targets != IGNORE_INDEX).sum())
    cuda = accelerator.device.type == "cuda"
    local_sum = torch.zeros((), device=accelerator.device)  # this process' loss sum, for logging
    for k in range(config.grad_accum):
        sl = slice((k * P + rank) * mb, (k * P + rank + 1) * mb)
        x, y, pos = (None if t is None else t[sl].pin_memory().to(accelerator.device, non_blocking=True) if cuda
                     else t[sl] for t in (input_ids, targets, positions))
        last = k == config.grad_accum - 1
        with (nullcontext() if last else accelerator.no_sync(model)):  # all-reduce once per step
            s = loss_fn(model, x, y, pos)
            # DDP averages gradients over processes: scale by P so the result is sum / global count.
            accelerator.backward(s * (P / max(count, 1)))
        local_sum += s.detach()
    if config.grad_clip:
        accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(accelerator.reduce(local_sum, "sum")) / max(count, 1), count


# -- helpers of the loop ---------------------------------------------------------------------------

def accelerator_for(config: TrainConfig):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # Accelerate keeps one process-wide state; a second in-process run with another precision
    # (a notebook, the tests) may start it afresh when no process group ties it down.
    cpu = config.cpu or not torch.cuda.is_available()
    precision = resolve_precision(config.precision, cpu)
    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision") != precision and _local_world_size() == 1:
        AcceleratorState._reset_state()
    kwargs: dict[str, Any] = {}
    if config.report_to:
        kwargs.update(log_with=config.report_to, project_dir=config.out_dir)
    if not cpu:
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 matmuls on tensor cores (precision "no")
        torch.backends.cudnn.allow_tf32 = True
    try:
        return Accelerator(mixed_precision=precision, cpu=cpu, **kwargs)
    except (ImportError, ValueError) as e:
        if config.report_to:
            raise TrainConfigError(f"report_to {config.report_to}: {e}") from None
        raise


def resolve_precision(precision: str, cpu: bool) -> str:
    """``"auto"`` made concrete for this machine (see :class:`TrainConfig`); other values as given."""
    if precision != "auto":
        return precision
    if not cpu:
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    from ..device import native_bf16

    return "bf16" if native_bf16() else "no"


def _local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


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
        record = {k: progress[k] for k in ("step", "tokens", "trained_tokens", "seconds", "loss")}
        (tmp / "trainer_state.json").write_text(json.dumps(record) + "\n")
        if state_dir.exists():
            shutil.rmtree(state_dir)
        tmp.rename(state_dir)
    accelerator.wait_for_everyone()
