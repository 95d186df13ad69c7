"""``lmlm bench train``: shard preparation and training speed, with MFU, for a model preset.

1. **Shards.** A synthetic corpus of about ``--corpus-tokens`` tokens (the documents of one
   biography world, :mod:`lmlm.worlds.bios`, written again and again under new ids until the size is
   reached) is prepared into token shards by ``lmlm data prepare`` in a child process; reported:
   seconds, tokens/s and the peak resident memory of the whole process tree (sampled from ``/proc``).
2. **Training.** The real training loop (:func:`lmlm.train.train`) runs ``--steps`` optimizer steps
   of the preset on those shards (LMLM mode), from random initialisation; the first
   ``--warmup-steps`` (compilation, allocator warm-up) are excluded from the speed. Reported:
   tokens/s, MFU (:mod:`lmlm.train.speed`: formula and peak table), peak memory, and the projected
   time for the paper's 24B training tokens (3B tokens x 8 epochs) on one such device.

Prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import typer

from ..jsonio import write_json
from . import bench_app

__all__ = ["run_train_bench", "synthetic_corpus", "tree_peak_rss"]

PAPER_TOKENS = 24e9  # about 3B tokens x 8 epochs per model (the paper, appendix A.2)
PAPER_TOKENS_PER_S_PER_H100 = 35e3  # 24B tokens in 8 H100-days


def synthetic_corpus(path: Path, tokens: int, tokenizer, world: str = "default", seed: int = 0) -> dict[str, Any]:
    """Write a corpus of about ``tokens`` tokens: one biography world's documents, copied under new ids."""
    from ..corpus import Document
    from ..worlds.bios import BiosConfig, BiosWorld

    w = BiosWorld.generate(BiosConfig.from_name(world, seed=seed))
    docs = [d.annotated for d in w.train_documents + w.heldout_documents]
    per_copy = sum(len(tokenizer.encode(d.segments).input_ids) for d in w.train_documents + w.heldout_documents)
    copies = max(1, -(-tokens // per_copy))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for c in range(copies):
            for i, text in enumerate(docs):
                doc = Document.from_annotated(f"copy{c}-{i}", text, source=f"bios-{world}-{seed}")
                f.write(json.dumps(doc.to_record(), ensure_ascii=False) + "\n")
    return {"world": world, "documents_per_copy": len(docs), "tokens_per_copy": per_copy, "copies": copies,
            "documents": copies * len(docs), "tokens_estimate": copies * per_copy}


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            continue
    return total


def tree_peak_rss(cmd: list[str], env: dict | None = None, interval: float = 0.2) -> tuple[int, float, int, str]:
    """Run ``cmd``; return (exit code, seconds, peak resident bytes of its process tree, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(interval)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    t.join()
    if proc.returncode:
        sys.stderr.write(err[-3000:])
    return proc.returncode, time.perf_counter() - t0, peak[0], out


def _prepare(corpus: Path, tokenizer_dir: Path, shards: Path, workers: int | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "lmlm.cli", "data", "prepare", str(corpus), "--tokenizer", str(tokenizer_dir),
           "--out", str(shards), "--no-progress"] + (["--workers", str(workers)] if workers else [])
    code, seconds, peak, out = tree_peak_rss(cmd)
    if code:
        raise RuntimeError(f"lmlm data prepare failed with exit code {code}")
    m = json.loads(out.strip().splitlines()[-1])
    return {"seconds": seconds, "tokens": m["tokens"], "documents": m["documents"], "lookup_calls": m["lookup_calls"],
            "tokens_per_s": m["tokens"] / seconds, "peak_rss_bytes": peak, "dtype": m["dtype"]}


def run_train_bench(model: str, seq_len: int, device: str, *, micro_batch_size: int, steps: int, warmup_steps: int,
                    corpus_tokens: int, tokenizer: str | None, precision: str, compile: bool | None,
                    grad_checkpointing: bool, workers: int | None, work: Path, log=print,
                    prepare_only: bool = False, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from ..models import ModelConfig
    from ..train import TrainConfig, train
    from ..train.config import TrainConfigError
    from ..train.inputs import tokenizer_from_spec

    try:  # an unknown preset or field, or a sequence past the context, fails before any work
        preset = ModelConfig.from_name(model, **(overrides or {}))
    except (ValueError, TypeError) as e:
        raise TrainConfigError(f"--model {model} with --override {overrides or {}}: {e}") from None
    if seq_len > preset.context_length:
        raise TrainConfigError(f"--seq-len {seq_len} exceeds the context length {preset.context_length} of "
                               f"{model}; give --seq-len {preset.context_length} or less")
    if tokenizer:
        tok = tokenizer_from_spec(tokenizer)
    else:  # a BPE trained on one copy of the corpus world
        from ..tokens import LookupTokenizer, train_bpe
        from ..worlds.bios import BiosConfig, BiosWorld

        w = BiosWorld.generate(BiosConfig.from_name("default"))
        tok = LookupTokenizer(train_bpe((d.plain for d in w.train_documents), vocab_size=8192))
    from ..data.shards import is_shards, read_manifest, tokenizer_hash

    work.mkdir(parents=True, exist_ok=True)
    # the shards of a --work folder used before are reused only for the same corpus request and tokenizer
    request = {"corpus_tokens": corpus_tokens, "world": "default", "tokenizer": tokenizer or "bpe:8192",
               "tokenizer_hash": tokenizer_hash(tok)}
    asked = work / "bench_request.json"
    shards = work / "shards"
    if (is_shards(shards) and read_manifest(shards)["complete"] and asked.exists()
            and json.loads(asked.read_text()) == request and read_manifest(shards)["tokenizer_hash"] ==
            request["tokenizer_hash"]):
        m = read_manifest(shards)
        prep = {"reused": str(shards), "tokens": m["tokens"], "documents": m["documents"]}
        log(f"prepare: reusing {shards} ({m['tokens']:,} tokens, the same corpus and tokenizer)")
    else:
        for old in (shards, work / "tokenizer", work / "run"):
            if old.exists():  # made for another request: made again
                shutil.rmtree(old)
        asked.unlink(missing_ok=True)
        tok.save(work / "tokenizer")
        log(f"corpus: about {corpus_tokens:,} tokens")
        corpus = synthetic_corpus(work / "corpus.jsonl", corpus_tokens, tok)
        log(f"prepare: {corpus['documents']:,} documents")
        prep = _prepare(work / "corpus.jsonl", work / "tokenizer", shards, workers)
        prep["corpus"] = corpus
        write_json(asked, request)
        log(f"prepare: {prep['tokens']:,} tokens in {prep['seconds']:.1f} s, peak "
            f"{prep['peak_rss_bytes'] / 2**20:,.0f} MiB")
    prep.update(corpus_tokens_asked=corpus_tokens, tokenizer=request["tokenizer"],
                tokenizer_hash=request["tokenizer_hash"])

    if prepare_only:
        return {"prepare": prep}
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    log_every = max(1, warmup_steps)
    cfg = TrainConfig(model=model, model_overrides=overrides or {}, data=str(work / "shards"), seq_len=seq_len, micro_batch_size=micro_batch_size,
                      batch_size=micro_batch_size, max_steps=warmup_steps + steps, warmup_steps=10, lr=3e-4,
                      log_every=log_every, precision=precision, compile=compile, cpu=not cuda,
                      grad_checkpointing=grad_checkpointing, out_dir=str(work / "run"), progress=False)
    result = train(cfg)
    records = [json.loads(line) for line in (work / "run" / "train_log.jsonl").read_text().splitlines()]
    timed = [r for r in records if "loss" in r and r["step"] > warmup_steps]
    # each record's speed covers the steps since the previous record; the first window holds the warm-up
    tokens_per_s = sum(r["tokens_per_second"] for r in timed) / len(timed) if timed else result.stats["tokens_per_second"]
    flops = None
    from ..train.speed import flops_per_token, mfu, peak_flops

    flops = flops_per_token(result.model, seq_len)
    from ..train.loop import resolve_precision

    prec = resolve_precision(precision, not cuda)
    peak = peak_flops(device, prec) if cuda else None
    memory = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "model": model, "overrides": overrides or {}, "seq_len": seq_len, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "precision": prec, "compile": result.stats.get("compile", compile), "micro_batch_size": micro_batch_size,
        "tokens_per_step": micro_batch_size * seq_len, "steps_timed": steps, "parameters": result.stats["parameters"],
        "flops_per_token": flops, "peak_flops": peak, "tokens_per_s": tokens_per_s,
        "mfu": mfu(tokens_per_s, flops, peak), "peak_memory_bytes": memory,
        "final_loss": result.stats["final_loss"], "first_loss": records[0].get("loss") if records else None,
        "projected_hours_24B_tokens": PAPER_TOKENS / tokens_per_s / 3600,
        "vs_paper_tokens_per_s": tokens_per_s / PAPER_TOKENS_PER_S_PER_H100,
        "tokenizer": prep["tokenizer"], "vocab_size": len(tok), "prepare": prep,
    }


@bench_app.command("train")
def bench_train(model: str = typer.Option("gpt2-small-cpu", help="model preset (lmlm presets)"),
                seq_len: Optional[int] = typer.Option(None, min=8, help="tokens per sequence (default 256; 96 "
                                                      "with --init-from)"),
                device: str = typer.Option("cpu", help="cpu or cuda"),
                micro_batch_size: int = typer.Option(8, min=1, help="sequences per step"),
                steps: int = typer.Option(20, min=1, help="timed optimizer steps"),
                warmup_steps: int = typer.Option(5, min=1, help="untimed steps first (compilation)"),
                corpus_tokens: int = typer.Option(2_000_000, min=1000, help="size of the synthetic corpus to shard: "
                                                  "whole copies of the world, so at least one (about 366k tokens "
                                                  "with the default BPE); the JSON gives what was written"),
                tokenizer: Optional[str] = typer.Option(None, help="tokenizer (default: a BPE of 8192 tokens on the "
                                                        "corpus world; the paper presets want gpt2/llama2)"),
                precision: str = typer.Option("auto", help="auto, no, bf16, fp16"),
                compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="default: on for CUDA"),
                grad_checkpointing: bool = typer.Option(False, "--grad-checkpointing"),
                workers: Optional[int] = typer.Option(None, min=1, help="shard tokenizer processes"),
                work: Optional[Path] = typer.Option(None, help="working folder (default: a temporary one); its "
                                                    "shards are reused for the same corpus size and tokenizer, "
                                                    "made again otherwise"),
                prepare_only: bool = typer.Option(False, "--prepare-only", help="measure the shard preparation only"),
                override: Optional[list[str]] = typer.Option(None, help="FIELD=VALUE of the model preset, e.g. dropout=0"),
                init_from: Optional[str] = typer.Option(None, help="compare the recipes of continued training of "
                                                        "this pretrained model instead (needs --data)"),
                data: Optional[Path] = typer.Option(None, help="with --init-from: the documents, e.g. call "
                                                    "windows from `lmlm data windows`"),
                lora: int = typer.Option(16, min=1, help="with --init-from: the LoRA rank of the cheap recipes"),
                freeze_layers: Optional[int] = typer.Option(None, min=0, help="with --init-from: layers frozen in "
                                                            "lora-freeze-fit (default: the lower half)"),
                recipes: str = typer.Option(",".join(("full-document", "full-fit", "lora-fit", "lora-freeze-fit",
                                                      "hf-trainer-peft")),
                                            help="with --init-from: the recipes to run, comma-separated"),
                threads: Optional[int] = typer.Option(None, min=1, help="with --init-from: CPU threads")):
    """Shard preparation (seconds, peak memory) and training tokens/s and MFU of a preset; with
    --init-from, real tokens/s of continued-training recipes side by side (full fine-tuning padded
    and packed, LoRA, LoRA with frozen layers, Hugging Face Trainer + PEFT)."""
    from ..cli_errors import check_device, fail, user_errors

    check_device(device)
    if init_from is not None:
        from .train_continue import run_continue_bench

        if data is None:
            fail("--init-from needs --data: the documents to train on (e.g. `lmlm data windows DOCS --out W.jsonl`)")
        if not data.is_file():
            fail(f"--data {data}: no such file")
        with tempfile.TemporaryDirectory() as tmp, user_errors():
            report = run_continue_bench(init_from, str(data), seq_len=seq_len or 96,
                                        micro_batch_size=micro_batch_size, steps=steps, warmup_steps=warmup_steps,
                                        lora=lora, freeze_layers=freeze_layers, threads=threads,
                                        recipes=[r.strip() for r in recipes.split(",") if r.strip()],
                                        work=work or Path(tmp), log=lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps(report))
        return
    seq_len = seq_len or 256
    from ..models import MODEL_PRESETS

    if model not in MODEL_PRESETS:
        fail(f"--model {model!r}: unknown preset; known: {', '.join(MODEL_PRESETS)}")
    if precision not in ("auto", "no", "bf16", "fp16"):
        fail(f"--precision {precision!r}: give auto, no, bf16 or fp16")

    overrides: dict[str, Any] = {}
    for item in override or []:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--override {item!r}: give FIELD=VALUE")
        try:
            overrides[key] = json.loads(value)
        except ValueError:
            overrides[key] = value

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp, user_errors():
        report = run_train_bench(model, seq_len, device, micro_batch_size=micro_batch_size, steps=steps,
                                 warmup_steps=warmup_steps, corpus_tokens=corpus_tokens, tokenizer=tokenizer,
                                 precision=precision, compile=compile, grad_checkpointing=grad_checkpointing,
                                 workers=workers, work=work or Path(tmp), log=log, prepare_only=prepare_only,
                                 overrides=overrides)
    print(json.dumps(report))
