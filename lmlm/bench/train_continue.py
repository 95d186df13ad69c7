"""``lmlm bench train --init-from MODEL --data DOCS``: the recipes of continued training side by side.

The same pretrained model, the same documents (short call windows, ``lmlm data windows``), the same
sequence length and micro-batch, each recipe for ``--warmup-steps`` untimed and ``--steps`` timed
optimizer steps in this one process, one after the other:

* ``full-document``: every weight trained, each document a block of its own, padded (the recipe a
  user had before ``--lora`` and ``--packing fit``);
* ``full-fit``: every weight, short documents sharing blocks without padding (``--packing fit``);
* ``lora-fit``: a LoRA adapter of rank ``--lora`` and the lookup tokens' rows (``--lora R``), fit;
* ``lora-freeze-fit``: the same with the lowest ``--freeze-layers`` layers untouched;
* ``hf-trainer-peft``: Hugging Face ``Trainer`` with the same PEFT adapter and its padding-free
  collator (``DataCollatorWithFlattening``), the peer a user would otherwise reach for.

Reported for each: real (non-padding) tokens/s over the timed steps, the padding share of the block
tokens, trainable parameters, first and last loss; and each recipe's real tokens/s as a ratio to
``full-document``'s. Prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["RECIPES", "run_continue_bench"]

RECIPES = ("full-document", "full-fit", "lora-fit", "lora-freeze-fit", "hf-trainer-peft")


def _timed(records: list[dict], warmup: int) -> dict[str, float]:
    """Real tokens/s and padding share over the steps after ``warmup`` from a run's train log."""
    by_step = {r["step"]: r for r in records if "loss" in r}
    first, last = by_step[warmup], by_step[max(by_step)]
    seconds = last["seconds"] - first["seconds"]
    tokens = last["tokens"] - first["tokens"]
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / max(seconds, 1e-9),
            "first_loss": by_step[min(by_step)]["loss"], "final_loss": last["loss"]}


def _ours(name: str, init_from: str, data: str, seq_len: int, mb: int, steps: int, warmup: int, lora: int,
          freeze: int, lr: float, threads: int | None, work: Path) -> dict[str, Any]:
    from ..train import TrainConfig, train

    cheap = {"full-document": dict(packing="document"), "full-fit": dict(packing="fit"),
             "lora-fit": dict(packing="fit", lora=lora), "lora-freeze-fit": dict(packing="fit", lora=lora,
                                                                              freeze_layers=freeze)}[name]
    cfg = TrainConfig(init_from=init_from, data=data, seq_len=seq_len, micro_batch_size=mb, batch_size=mb,
                      max_steps=warmup + steps, warmup_steps=min(2, warmup), lr=lr, weight_decay=0.0,
                      log_every=1, precision="no", cpu=True, compile=False, threads=threads, progress=False,
                      out_dir=str(work / name), **cheap)
    result = train(cfg)
    records = [json.loads(line) for line in (work / name / "train_log.jsonl").read_text().splitlines()]
    timed = _timed(records, warmup)
    blocks = steps * mb * seq_len
    return {**timed, "padding_share": 1 - timed["tokens"] / blocks, "block_tokens": blocks,
            "trainable_parameters": result.stats["trainable_parameters"],
            "parameters": result.stats["parameters"]["total"], "recipe": cfg.to_dict()}


def _hf_trainer(init_from: str, data: str, seq_len: int, mb: int, steps: int, warmup: int, lora: int,
                lr: float, threads: int | None, work: Path) -> dict[str, Any]:
    """The same adapter through Hugging Face Trainer and its padding-free collator."""
    import torch
    from transformers import DataCollatorWithFlattening, Trainer, TrainerCallback, TrainingArguments

    from ..corpus import read_documents
    from ..tokens import labels_from_roles
    from ..train.data import encode_documents
    from ..train.lora import add_lora, trainable_parameters
    from ..pretrained import start_pretrained

    if threads:
        torch.set_num_threads(threads)
    model, tok, _ = start_pretrained(init_from)
    model = add_lora(model, lora, new_token_ids=tok.call_ids)
    enc = [e for e in encode_documents(read_documents(data), tok, "lmlm") if len(e) <= seq_len]
    examples = [{"input_ids": e.input_ids, "labels": labels_from_roles(e.input_ids, e.roles, tok.end_id)}
                for e in enc]
    per_step = max(1, round(mb * seq_len / (sum(len(e) for e in enc) / len(enc))))  # about our block tokens
    flatten = DataCollatorWithFlattening()
    batch_tokens: list[int] = []
    step_ends: list[float] = []
    losses: list[float] = []

    def collate(features):
        batch_tokens.append(sum(len(f["input_ids"]) for f in features))
        return flatten(features)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step_ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    args = TrainingArguments(output_dir=str(work / "hf-trainer-peft"), per_device_train_batch_size=per_step,
                             max_steps=warmup + steps, learning_rate=lr, warmup_steps=min(2, warmup),
                             lr_scheduler_type="cosine", weight_decay=0.0, logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
    Trainer(model=model, args=args, train_dataset=examples, data_collator=collate, callbacks=[Clock()]).train()
    seconds = step_ends[-1] - step_ends[warmup - 1]
    tokens = sum(batch_tokens[warmup:warmup + steps])
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / max(seconds, 1e-9),
            "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
            "padding_share": 0.0, "block_tokens": tokens, "trainable_parameters": trainable_parameters(model),
            "parameters": sum(p.numel() for p in model.parameters()), "recipe": {"examples_per_step": per_step,
                                                                                  "collator": "flattening"}}


def run_continue_bench(init_from: str, data: str, *, seq_len: int = 96, micro_batch_size: int = 8, steps: int = 6,
                       warmup_steps: int = 2, lora: int = 16, freeze_layers: int | None = None, lr: float = 2e-4,
                       threads: int | None = None, recipes: Sequence[str] = RECIPES, work: Path,
                       log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``recipes`` one after the other on the same model and documents; see the module docstring."""
    from ..corpus import read_documents
    from ..train.config import TrainConfigError
    from ..train.lora import decoder_layers
    from ..pretrained import open_pretrained

    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        raise TrainConfigError(f"--recipes {','.join(unknown)}: unknown; known: {', '.join(RECIPES)}")
    docs = read_documents(data)
    if freeze_layers is None:  # half the stack, the lower half
        model, _, _ = open_pretrained(init_from, with_tokenizer=False)
        freeze_layers = len(decoder_layers(model)) // 2
        del model
    out: dict[str, Any] = {"init_from": init_from, "data": data, "documents": len(docs), "seq_len": seq_len,
                           "micro_batch_size": micro_batch_size, "steps_timed": steps, "warmup_steps": warmup_steps,
                           "lora": lora, "freeze_layers": freeze_layers, "threads": threads, "recipes": {}}
    for name in recipes:
        log(f"{name}: {warmup_steps} + {steps} steps")
        if name == "hf-trainer-peft":
            r = _hf_trainer(init_from, data, seq_len, micro_batch_size, steps, warmup_steps, lora, lr, threads, work)
        else:
            r = _ours(name, init_from, data, seq_len, micro_batch_size, steps, warmup_steps, lora, freeze_layers,
                      lr, threads, work)
        log(f"{name}: {r['tokens_per_s']:.1f} real tokens/s, padding {r['padding_share']:.0%}, "
            f"{r['trainable_parameters']:,} trainable")
        out["recipes"][name] = r
    base = out["recipes"].get("full-document")
    if base:
        out["vs_full_document"] = {k: v["tokens_per_s"] / base["tokens_per_s"] for k, v in out["recipes"].items()}
    return out
