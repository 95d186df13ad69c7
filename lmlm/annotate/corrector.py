"""The corrector filter: an under-fitted LM trained on the seed scores every call; the worst are dropped.

As in the paper (appendix A.1), a model is trained briefly on the seed annotations themselves (no
instructions: plain next-token prediction on the annotated text, values masked as in LMLM
pretraining), so it learns the common patterns but not the exceptions. Each call is then scored by
the model's loss on its entity tokens and on its relation tokens (roles from :mod:`lmlm.tokens`);
a call whose entity or relation the left context does not predict, or whose labels are odd, scores
high. The calls above the ``1 - drop`` quantile (the top 10% by default) are removed.

The corrector is a small preset model trained from scratch with a BPE of the corpus, or, with
``base``, a pretrained causal LM tuned with LoRA.

Exercised by ``lmlm annotate correct SEED.jsonl --out DIR`` (writes ``kept.jsonl``, ``scores.jsonl``,
``report.json`` and the loss histogram ``losses.png``).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..corpus import Document, write_documents
from ..device import default_device
from ..jsonio import write_json
from ..lookup import Lookup, Segment, plain_text
from ..scoring import token_logprobs
from ..tokens import ENTITY, RELATION, labels_from_roles
from .lm import FitConfig, add_lora, cpu_threads, fit, load_base, new_model, pack_examples
from .validate import calls_with_offsets, insert_calls

__all__ = ["CorrectorConfig", "CallScore", "Correction", "train_corrector", "score_calls", "correct", "plot_losses"]


@dataclass
class CorrectorConfig:
    """The corrector's model, training and cut.

    Args:
        base: a pretrained causal LM (folder, hub name or ``.gguf``) tuned with LoRA; ``None``: a
            fresh ``preset`` model with a ``vocab_size`` BPE of the corpus.
        preset, model_overrides: see :mod:`lmlm.models`.
        fit: the (short: under-fitted) training run.
        lora_r, lora_alpha: LoRA rank and scale (the paper: 32 and 16).
        drop: share of calls to remove (the top by score).
        score: ``"rank"`` (the higher of the entity's and the relation's percentile rank of
            surprisal: the paper's "loss on the entity or relation in the top N%", each on its own
            scale), ``"max"`` (the higher per-token mean loss) or ``"sum"`` (total surprisal).
        device: ``cuda``, ``cpu``, ... (default: cuda when available).
    """

    base: str | None = None
    preset: str = "llama-tiny"
    model_overrides: dict[str, Any] = field(default_factory=lambda: {"context_length": 256})
    vocab_size: int = 2048
    fit: FitConfig = field(default_factory=lambda: FitConfig(steps=120, batch_size=16, seq_len=256, lr=3e-3))
    lora_r: int = 32
    lora_alpha: int = 16
    drop: float = 0.10
    score: str = "rank"
    device: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fit, dict):
            self.fit = FitConfig(**self.fit)
        if not 0 <= self.drop < 1:
            raise ValueError(f"drop must be in [0, 1), got {self.drop}")
        if self.score not in ("rank", "max", "sum"):
            raise ValueError(f"score must be 'rank', 'max' or 'sum', got {self.score!r}")


@dataclass
class CallScore:
    """One call: its surprisal (summed loss in nats) on the entity and on the relation tokens, its
    score (see :func:`_assign_scores`) and whether the filter dropped it."""

    doc: int
    at: int
    entity: str
    relation: str
    value: str
    entity_loss: float
    relation_loss: float
    entity_tokens: int
    relation_tokens: int
    score: float = 0.0
    dropped: bool = False


@dataclass
class Correction:
    """The filtered documents, every call's score, the cut, and the training statistics.

    ``inputs``: the input documents when they were :class:`lmlm.corpus.Document` (their id, source,
    split and metadata go to ``kept.jsonl``).
    """

    documents: list[list[Segment]]
    scores: list[CallScore]
    threshold: float
    stats: dict[str, Any]
    inputs: list[Document] | None = None

    def kept_documents(self) -> list[Document]:
        """The filtered documents in the schema of :mod:`lmlm.corpus`."""
        if self.inputs is None:
            return [Document.from_segments(str(i), d) for i, d in enumerate(self.documents, 1)]
        from .validate import calls_with_offsets

        def meta(o: Document, d) -> dict:  # a seed's list of calls names the kept ones only
            if "calls" not in o.meta:
                return o.meta
            return {**o.meta, "calls": [dict(entity=c.entity, relation=c.relation, value=c.value, at=q)
                                        for q, c in calls_with_offsets(d)]}

        return [Document.from_segments(o.id, d, source=o.source, split=o.split, meta=meta(o, d))
                for o, d in zip(self.inputs, self.documents)]

    def kept_offsets(self) -> list[set[int]]:
        kept = [set() for _ in self.documents]
        for s in self.scores:
            if not s.dropped:
                kept[s.doc].add(s.at)
        return kept


def train_corrector(documents: Sequence[Sequence[Segment]], config: CorrectorConfig, progress: bool = True,
                    log_path: str | Path | None = None):
    """(model, tokenizer, fit statistics): the corrector trained on the annotated ``documents``."""
    if config.base:
        model, tok = load_base(config.base, config.device)
        model = add_lora(model, config.lora_r, config.lora_alpha, new_token_ids=tok.call_ids)
    else:
        model, tok = new_model(documents, config.preset, config.vocab_size, config.fit.seed, **config.model_overrides)
        model = model.to(default_device(config.device))
    encoded = [tok.encode(list(d)) for d in documents]
    examples = [(e.input_ids, labels_from_roles(e.input_ids, e.roles, tok.end_id)) for e in encoded]
    ids, labels = pack_examples(examples, config.fit.seq_len, tok.eos_id)
    stats = fit(model, ids, labels, config.fit, progress=progress, log_path=log_path)
    return model, tok, stats


def _windows(n: int, size: int) -> list[tuple[int, int, int]]:
    """(start, end, first scored) windows covering ``n`` tokens; each token is scored in one window
    with at least half a window of left context (all of it near the start)."""
    if n <= size:
        return [(0, n, 0)]
    out, half = [(0, size, 0)], size // 2
    start = half
    while start + half < n:
        out.append((start, min(start + size, n), start + half))
        start += half
    return out


def score_calls(model, tok, documents: Sequence[Sequence[Segment]], seq_len: int = 256,
                how: str = "rank", batch_size: int = 16) -> list[CallScore]:
    """Score every call of ``documents`` by the corrector's loss on its entity and relation tokens."""
    encoded = [tok.encode(list(d)) for d in documents]
    chunks = [(d, *w) for d, e in enumerate(encoded) for w in _windows(len(e), seq_len)]
    seqs = [encoded[d].input_ids[start:end] for d, start, end, _ in chunks]
    with cpu_threads(model):
        logps = token_logprobs(model, seqs, batch_size)
    nll = [np.zeros(len(e)) for e in encoded]  # entry t: the loss of predicting token t (0 at t = 0)
    for (d, start, end, first), lp in zip(chunks, logps):
        nll[d][first:end] = np.r_[0.0, -lp][first - start:]
    scores = []
    for d, (doc, enc) in enumerate(zip(documents, encoded)):
        spans = _call_spans(enc.input_ids, enc.roles, tok.start_id)
        for (at, call), (ent, rel) in zip(calls_with_offsets(doc), spans):
            scores.append(CallScore(d, at, call.entity, call.relation, call.value, float(nll[d][ent].sum()),
                                    float(nll[d][rel].sum()), len(ent), len(rel)))
    _assign_scores(scores, how)
    return scores


def _ranks(values: Sequence[float]) -> list[float]:
    """Each value's share of values below it (0 = lowest, near 1 = highest; ties in order of appearance).

    ``scipy.stats.rankdata(values, method="ordinal")``, less one, over the count (a NaN makes every rank NaN)."""
    a = np.asarray(values, dtype=float)
    if np.isnan(a).any():
        return [float("nan")] * len(a)
    ranks = np.empty(len(a))
    ranks[np.argsort(a, kind="stable")] = np.arange(len(a))
    return (ranks / max(len(a), 1)).tolist()


def _assign_scores(scores: list[CallScore], how: str) -> None:
    """``rank``: the higher of the entity's and the relation's percentile rank of surprisal (a call
    is dropped when either is unusually unexpected); ``max``: the higher per-token mean loss;
    ``sum``: entity plus relation surprisal."""
    if how == "rank":
        for s, e, r in zip(scores, _ranks([s.entity_loss for s in scores]), _ranks([s.relation_loss for s in scores])):
            s.score = max(e, r)
    elif how == "max":
        for s in scores:
            s.score = max(s.entity_loss / max(s.entity_tokens, 1), s.relation_loss / max(s.relation_tokens, 1))
    else:
        for s in scores:
            s.score = s.entity_loss + s.relation_loss


def _call_spans(ids: list[int], roles: list[int], start_id: int) -> list[tuple[list[int], list[int]]]:
    """(entity token indices, relation token indices) of each call, in order."""
    spans, n = [], len(ids)
    for t, tid in enumerate(ids):
        if tid != start_id:
            continue
        ent, k = [], t + 1
        while k < n and roles[k] == ENTITY:
            ent.append(k)
            k += 1
        rel, k = [], k + 1  # past <|sep|>
        while k < n and roles[k] == RELATION:
            rel.append(k)
            k += 1
        spans.append((ent, rel))
    return spans


def correct(documents: Sequence[Document | Sequence[Segment]], config: CorrectorConfig | None = None,
            out_dir: str | Path | None = None, progress: bool = True) -> Correction:
    """Train the corrector on ``documents``, score their calls and drop the top ``config.drop``.

    Args:
        documents: :class:`lmlm.corpus.Document` objects or segment lists.

    With ``out_dir``: writes ``kept.jsonl`` (the filtered documents), ``scores.jsonl`` (one line per
    call), ``report.json`` and ``losses.png``.
    """
    config = config or CorrectorConfig()
    inputs = list(documents) if documents and all(isinstance(d, Document) for d in documents) else None
    documents = [list(d.segments) if isinstance(d, Document) else list(d) for d in documents]
    log = Path(out_dir) / "train_log.jsonl" if out_dir else None
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
    model, tok, stats = train_corrector(documents, config, progress, log)
    scores = score_calls(model, tok, documents, config.fit.seq_len, config.score)
    threshold = _drop_highest(scores, config.drop)
    kept: list[list[tuple[int, Lookup]]] = [[] for _ in documents]
    for s in scores:
        if not s.dropped:
            kept[s.doc].append((s.at, Lookup(s.entity, s.relation, s.value)))
    filtered = [insert_calls(plain_text(d)[0], k) for d, k in zip(documents, kept)]
    stats = {**{k: v for k, v in stats.items() if k != "losses"}, "config": asdict(config)}
    result = Correction(filtered, scores, threshold, stats, inputs)
    if out_dir:
        write_correction(result, out_dir)
    return result


def _drop_highest(scores: Sequence[CallScore], drop: float) -> float:
    """Mark exactly the ``round(drop * n)`` highest-scoring calls dropped (ties of the score broken by
    the higher entity plus relation surprisal, then by order); returns the lowest dropped score."""
    k = round(drop * len(scores))
    order = sorted(range(len(scores)), key=lambda i: (-scores[i].score,
                                                       -(scores[i].entity_loss + scores[i].relation_loss), i))
    for rank, i in enumerate(order):
        scores[i].dropped = rank < k
    return scores[order[k - 1]].score if k else float("inf")


def summary(result: Correction) -> dict[str, Any]:
    """What ``report.json`` holds: counts, the cut, the score distribution, the training run."""
    values = [s.score for s in result.scores]
    dropped = [s for s in result.scores if s.dropped]
    return {"calls": len(values), "dropped": len(dropped), "threshold": result.threshold,
            "score_mean": statistics.fmean(values) if values else None,
            "score_median": statistics.median(values) if values else None,
            "dropped_by_relation": dict(Counter(s.relation for s in dropped).most_common(20)), "train": result.stats}


def write_correction(result: Correction, out_dir: str | Path, labels: Sequence[str | None] | None = None) -> None:
    """``kept.jsonl``, ``scores.jsonl``, ``report.json`` and ``losses.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_documents(out / "kept.jsonl", result.kept_documents())
    ids = [d.id for d in result.kept_documents()]  # "doc" is the document's place in the input; its id beside it
    with (out / "scores.jsonl").open("w", encoding="utf-8") as f:
        for s in result.scores:
            f.write(json.dumps({"doc_id": ids[s.doc], **asdict(s)}, ensure_ascii=False) + "\n")
    write_json(out / "report.json", summary(result))
    plot_losses(result.scores, result.threshold, out / "losses.png", labels)


def plot_losses(scores: Sequence[CallScore], threshold: float, path: str | Path,
                labels: Sequence[str | None] | None = None) -> Path:
    """Histograms of entity and relation surprisal, dropped calls stacked apart (or, with ``labels``,
    one per score, stacked by label)."""
    from ..report import plt_module

    plt = plt_module()

    if labels is None:
        labels = ["dropped" if s.dropped else "kept" for s in scores]
    groups = sorted({lb or "clean" for lb in labels}, key=lambda g: (g not in ("clean", "kept"), g))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, name in ((axes[0], "entity_loss", "entity"), (axes[1], "relation_loss", "relation")):
        data = [[getattr(s, key) for s, lb in zip(scores, labels) if (lb or "clean") == g] for g in groups]
        ax.hist(data, bins=50, stacked=True, label=groups, log=True)
        ax.set_xlabel(f"{name} surprisal (nats, summed over its tokens)")
        ax.set_ylabel("calls")
        ax.legend(fontsize=8)
    dropped = sum(s.dropped for s in scores)
    fig.suptitle(f"Corrector: {dropped} of {len(scores)} calls dropped (score cut {threshold:.3g})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
