"""Annotator distillation and corpus annotation at scale.

:func:`distill` trains an :class:`~lmlm.annotate.annotator.Annotator` on cleaned seed annotations:
a small preset model from scratch (prompt style ``none``), or a pretrained instruction model
(``base``: a Hugging Face folder, hub name or ``.gguf`` file) instruction-tuned with LoRA (the
paper: r=32, alpha=16) or fully (prompt style ``chat``). The loss curve and tokens/s go to
``train_log.jsonl`` and ``annotator.json``.

:func:`run_corpus` annotates a corpus with a trained annotator in shards: each finished document is
appended to its shard's ``.partial`` file at once, a shard is renamed when complete, and a run that
was killed picks up at the first document not yet written. ``worker=(k, n)`` takes every n-th shard,
so several processes or machines can share a corpus. ``shards/manifest.json`` records what the shards
are made of (the corpus, how many of its documents, the shard size, the annotator): a rerun of the same
request goes on, one with a larger ``limit`` reopens the last shard, any other is refused. When every
shard is done the shards are merged into ``annotated.jsonl``, ``triples.jsonl`` and ``report.json``.

Exercised by ``lmlm annotate distill SEED.jsonl --out DIR`` and ``lmlm annotate run CORPUS --annotator
DIR --out DIR``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ..corpus import Document, iter_documents, read_documents, write_documents
from ..device import default_device
from ..jsonio import write_json
from ..lookup import Lookup, Segment
from .annotator import PASSAGE_CHARS, Annotator, AnnotatorOptions
from .lm import FitConfig, add_lora, fit, load_base, new_model, pack_examples
from .validate import ValidationReport

__all__ = ["DistillConfig", "distill", "run_corpus"]


@dataclass
class DistillConfig:
    """How to train the annotator.

    Args:
        base: pretrained causal LM to tune (``None``: a fresh ``preset`` model with a BPE of the seed).
        preset, model_overrides, vocab_size: the fresh model (see :mod:`lmlm.models`).
        fit: the training run.
        lora: tune ``base`` with LoRA (``False``: every weight).
        lora_r, lora_alpha: LoRA rank and scale.
        entity: ``"copy"`` (entities copied from the text left of the call) or ``"free"``.
        relations: ``"seen"`` (only relation labels of the seed) or ``"free"``.
        device: ``cuda``, ``cpu``, ... (default: cuda when available).
    """

    base: str | None = None
    preset: str = "llama-tiny"
    model_overrides: dict[str, Any] = field(default_factory=lambda: {"context_length": 512})
    vocab_size: int = 2048
    fit: FitConfig = field(default_factory=lambda: FitConfig(steps=400, batch_size=8, seq_len=256, lr=5e-3))
    lora: bool = True
    lora_r: int = 32
    lora_alpha: int = 16
    entity: str = "copy"
    relations: str = "seen"
    device: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fit, dict):
            self.fit = FitConfig(**self.fit)
        if self.relations not in ("seen", "free"):
            raise ValueError(f"relations must be 'seen' or 'free', got {self.relations!r}")


def distill(documents: Sequence[Document | Sequence[Segment]], config: DistillConfig | None = None,
            out_dir: str | Path | None = None, progress: bool = True) -> tuple[Annotator, dict[str, Any]]:
    """Train an annotator on annotated ``documents`` (:class:`lmlm.corpus.Document` objects or
    segment lists); save it to ``out_dir`` if given.

    Returns:
        The annotator and the training statistics (``first_loss``, ``final_loss``,
        ``tokens_per_second``, ``seconds``, ``steps``, ``trainable_parameters``).
    """
    config = config or DistillConfig()
    documents = [list(d.segments) if isinstance(d, Document) else list(d) for d in documents]
    if not documents:
        raise ValueError("no documents to distill from")
    if config.base:
        model, tok = load_base(config.base, config.device)
        if config.lora:
            model = add_lora(model, config.lora_r, config.lora_alpha, new_token_ids=tok.call_ids)
    else:
        model, tok = new_model(documents, config.preset, config.vocab_size, config.fit.seed, **config.model_overrides)
        model = model.to(default_device(config.device))
    relations = sorted({s.relation for d in documents for s in d if isinstance(s, Lookup)})
    options = AnnotatorOptions(prompt="chat" if config.base else "none", entity=config.entity,
                               relations=relations if config.relations == "seen" else None,
                               base=config.base if config.base and config.lora else None)
    annotator = Annotator(model, tok, options)
    ids, labels = pack_examples([annotator.training_example(d) for d in documents], config.fit.seq_len, tok.eos_id)
    log = None
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        log = Path(out_dir) / "train_log.jsonl"
        log.unlink(missing_ok=True)
    stats = fit(model, ids, labels, config.fit, progress=progress, log_path=log)
    stats = {**stats, "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
             "documents": len(documents), "config": asdict(config)}
    if out_dir:
        annotator.save(out_dir, {k: v for k, v in stats.items() if k != "losses"})
    return annotator, stats


# -- annotating a corpus ------------------------------------------------------------------------------

def _resume_partial(path: Path) -> set[str]:
    """Ids already written to a shard's partial file; a torn last line (a kill mid-write) is cut off."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    keep = data[:data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        path.write_bytes(keep)
    return {json.loads(line)["id"] for line in keep.decode("utf-8").splitlines() if line.strip()}


def _write_shard(annotator: Annotator, docs: list[Document], final: Path, batch_size: int, bar) -> dict:
    """Annotate the documents of one shard that are not written yet; rename the shard when complete.

    A shard is a document file (:mod:`lmlm.corpus`) whose records also carry ``calls``,
    ``rejected`` and ``text_changed``."""
    partial = final.with_name(final.name + ".partial")
    done = _resume_partial(partial)
    todo = [d for d in docs if d.id not in done]
    counts = {"documents": 0, "tokens": 0}
    with partial.open("a", encoding="utf-8") as f:
        for k in range(0, len(todo), batch_size):
            batch = todo[k:k + batch_size]
            before = annotator.generated_tokens
            long = bar is not None and max(len(d.text) for d in batch) > 20 * PASSAGE_CHARS  # a bar of passages too
            for doc, v in zip(batch, annotator.annotate([d.text for d in batch], batch_size, progress=long)):
                f.write(json.dumps(v.document(doc).to_record(), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            counts["documents"] += len(batch)
            counts["tokens"] += annotator.generated_tokens - before
            if bar is not None:
                bar.update(len(batch))
    partial.rename(final)
    return counts


def run_corpus(corpus: str | Path, out_dir: str | Path, annotator: Annotator | str | Path, *,
               shard_size: int = 512, batch_size: int = 16, worker: tuple[int, int] = (0, 1),
               limit: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Annotate the plain ``text`` of the documents of ``corpus`` in shards.

    Args:
        corpus: the input documents (any format of :mod:`lmlm.corpus`).
        out_dir: shards go to ``out_dir/shards``; the merged results to ``out_dir``.
        annotator: an :class:`Annotator` or its folder.
        shard_size: documents per shard (the unit of resumption across workers).
        batch_size: documents decoded together.
        worker: ``(k, n)``: this process takes shards k, k+n, k+2n, ...
        limit: annotate only the first ``limit`` documents.

    Raises:
        ValueError: ``out_dir`` holds shards of another corpus, annotator or shard size, or of more documents.

    Returns:
        The report: documents and calls, rejections per reason, documents/s and tokens/s of this
        invocation, and whether every shard is done (then merged).
    """
    k, n = worker
    if not 0 <= k < n:
        raise ValueError(f"worker must be (k, n) with 0 <= k < n, got {worker}")
    if shard_size <= 0:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    docs = read_documents(corpus)
    corpus_fp, docs = _corpus_fingerprint(docs), docs[:limit]
    out, shards = Path(out_dir), Path(out_dir) / "shards"
    ann = annotator if isinstance(annotator, Annotator) else Annotator.load(annotator)
    request = {"corpus": corpus_fp, "documents": len(docs), "shard_size": shard_size,
               "annotator": ann.fingerprint or _weights_fingerprint(ann), "workers": n}
    _claim(shards, request)
    n_shards = math.ceil(len(docs) / shard_size)
    mine = [s for s in range(n_shards) if s % n == k and not (shards / f"shard-{s:05d}.jsonl").exists()]
    bar = _bar(progress, sum(len(docs[s * shard_size:(s + 1) * shard_size]) for s in mine))
    t0, totals = time.perf_counter(), {"documents": 0, "tokens": 0}
    for s in mine:
        c = _write_shard(ann, docs[s * shard_size:(s + 1) * shard_size], shards / f"shard-{s:05d}.jsonl", batch_size, bar)
        totals = {key: totals[key] + c[key] for key in totals}
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    report = {"shards": n_shards, "shards_done": sum((shards / f"shard-{s:05d}.jsonl").exists() for s in range(n_shards)),
              "documents_this_run": totals["documents"], "seconds": seconds,
              "documents_per_second": totals["documents"] / seconds if seconds else 0.0,
              "tokens_per_second": totals["tokens"] / seconds if seconds else 0.0}
    if report["shards_done"] == n_shards:
        report.update(_merge(out, n_shards))
    write_json(out / "report.json", report)
    return report


MANIFEST = "manifest.json"


def _corpus_fingerprint(docs: list[Document]) -> str:
    """A digest of the ids and plain texts of the documents, in order."""
    h = hashlib.sha256()
    for d in docs:
        h.update(json.dumps([d.id, d.text], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()[:16]


def _weights_fingerprint(annotator: Annotator) -> str:
    """A digest of an annotator that was never saved: its options and its weights."""
    h = hashlib.sha256(json.dumps(asdict(annotator.options), sort_keys=True).encode())
    for name, t in sorted(annotator.model.state_dict().items()):
        h.update(name.encode() + t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _claim(shards: Path, request: dict[str, Any]) -> None:
    """Check that the shards in ``shards`` were made by the same request, record it in the manifest.

    The shards are slices of the corpus in order, so another worker split only changes who writes which
    shard, and a larger ``limit`` (more documents) reopens the last shards to take the new documents.
    Another corpus, annotator or shard size, or fewer documents, is refused: their shards cannot be merged.
    """
    path = shards / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        start_over = f"use another --out, or delete {shards.parent} to start over"
        if old.get("corpus") != request["corpus"]:
            raise ValueError(f"{shards.parent}: holds a run on another corpus; {start_over}")
        if old.get("annotator") != request["annotator"]:
            raise ValueError(f"{shards.parent}: holds a run of another annotator; {start_over}")
        if old.get("shard_size") != request["shard_size"]:
            size = old.get("shard_size")
            raise ValueError(f"{shards.parent}: holds shards of {size} documents, not {request['shard_size']}: "
                             f"rerun with --shard-size {size}, or {start_over}")
        if request["documents"] < old["documents"]:
            raise ValueError(f"{shards.parent}: holds a run of the first {old['documents']} documents, more than the "
                             f"{request['documents']} asked (--limit); use --limit {old['documents']} or more, "
                             "or another --out")
        if request["documents"] > old["documents"]:  # the last shards of the smaller run take the new documents
            size = request["shard_size"]
            for s in range(old["documents"] // size, math.ceil(old["documents"] / size)):
                final = shards / f"shard-{s:05d}.jsonl"
                if final.exists():
                    final.rename(final.with_name(final.name + ".partial"))
            for name in ("annotated.jsonl", "triples.jsonl"):
                (shards.parent / name).unlink(missing_ok=True)
        if request == old:
            return
    elif shards.is_dir() and any(shards.glob("shard-*")):
        raise ValueError(f"{shards}: holds shards no manifest describes (of an earlier lmlm?); use another --out, "
                         f"or delete {shards.parent} to start over")
    shards.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(request, indent=2) + "\n")
    tmp.replace(path)


def _merge(out: Path, n_shards: int) -> dict[str, Any]:
    """Concatenate the shards into ``annotated.jsonl`` (documents) and ``triples.jsonl``; count calls
    and rejections."""
    report = ValidationReport()

    def documents():
        for s in range(n_shards):
            yield from iter_documents(out / "shards" / f"shard-{s:05d}.jsonl")

    with (out / "triples.jsonl").open("w", encoding="utf-8") as triples_f:
        def counted():
            for doc in documents():
                calls, rejected = doc.meta.get("calls", []), doc.meta.get("rejected", [])
                for c in calls:
                    triples_f.write(json.dumps({"entity": c["entity"], "relation": c["relation"], "value": c["value"],
                                                "source": doc.id, "position": c.get("at")},
                                               ensure_ascii=False) + "\n")
                report.documents += 1
                report.documents_text_changed += bool(doc.meta.get("text_changed"))
                report.kept += len(calls)
                report.calls += len(calls) + len(rejected)
                report.rejected.update(r["reason"] for r in rejected)
                yield doc

        write_documents(out / "annotated.jsonl", counted())
    return report.to_dict()


def _bar(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="annotate", unit="doc", dynamic_ncols=True)
