"""The pipeline's annotation stage: every method's calls placed in one annotated corpus.

Methods, each resumable on its own (a finished step leaves ``done.json`` in its folder):

* ``infobox``: the distant supervision of ``lmlm annotate wikipedia`` (made by the corpus stage);
* ``given``: the calls the input corpus already had;
* ``llm``: documents cut into passages; the seed LLM (SmolLM2-135M on llama.cpp by default) annotates
  ``seed_passages`` of them (``lmlm annotate seed``), every call validated; the corrector drops the
  worst (``lmlm annotate correct``); an annotator is distilled from the rest (``lmlm annotate
  distill``) and run on every other passage (``lmlm annotate run``, sharded and resumable).

The LLM's calls are then checked against the reference facts (the infoboxes', or the corpus's own
calls): each agrees with them, conflicts with them or names what they do not know, and
``annotate.llm.keep`` says which enter the corpus and the KB (:func:`vet_layer`). The calls are then merged per document at their character offsets (one call per position; an
infobox call wins over an LLM one, the seed's over the distilled annotator's) with
:func:`lmlm.annotate.validate.insert_calls`, so every document's annotation strips back to its text.
Each document records which method wrote each call (``call_methods``).
"""

from __future__ import annotations

import hashlib
import random
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from ..annotate.passages import split_passages
from ..corpus import Document, iter_documents, read_documents, write_documents
from ..jsonio import read_json, write_json
from ..lookup import Lookup
from ..stages import finish_stage, stage_done, stop_after
from .recipe import LLMSpec, RecipeError

__all__ = ["split_passages", "passages_of", "call_layer", "merge_layers", "run_llm", "METHOD_NAMES", "Reference",
           "vet_layer", "VERDICTS"]

METHOD_NAMES = {"infobox": "infobox", "given": "given", "llm_seed": "llm seed (SmolLM2, corrected)",
                "llm_distilled": "llm distilled annotator"}
_PRIORITY = ("infobox", "given", "llm_seed", "llm_distilled")
CHECK_MIN = 20  # passages with calls the distilled annotator needs for a held-out check (1/7 of them, 5 at least)
def passages_of(documents: list[Document], max_chars: int) -> list[Document]:
    """The passages of ``documents`` as documents (``meta``: ``doc`` and ``start``, the offset in it)."""
    return [Document(f"{d.id}@{s}", d.text[s:e], d.text[s:e], source=d.id, split=d.split,
                     meta={"doc": d.id, "start": s})
            for d in documents for s, e in split_passages(d.text, max_chars)]


Layer = dict[str, list[tuple[int, Lookup]]]  # document id -> (offset in its text, call)


def call_layer(documents, offset_of: Callable[[Document], tuple[str, int]] | None = None) -> Layer:
    """The calls of annotated documents (or passages: ``offset_of(p) -> (document id, start)``) by document."""
    from ..annotate.validate import calls_with_offsets

    layer: Layer = {}
    for d in documents:
        doc, start = offset_of(d) if offset_of else (d.id, 0)
        layer.setdefault(doc, []).extend((start + q, c) for q, c in calls_with_offsets(d.segments))
    return layer


def _passage_origin(p: Document) -> tuple[str, int]:
    return str(p.meta["doc"]), int(p.meta["start"])


def merge_layers(documents: list[Document], layers: dict[str, Layer]) -> list[Document]:
    """``documents`` with the calls of every method inserted; one method's calls per position, by method
    priority (a method may put several calls at one position: two relations of one value are kept).

    Each output document's ``meta`` gets ``call_methods`` (the method of each call, in order) and
    ``calls_by_method``.
    """
    from ..annotate.validate import insert_calls

    out = []
    for d in documents:
        taken: dict[int, tuple[str, list[Lookup]]] = {}
        for method in sorted(layers, key=lambda m: _PRIORITY.index(m) if m in _PRIORITY else len(_PRIORITY)):
            for q, call in layers[method].get(d.id, []):
                if d.text[q:q + 1].strip() and taken.setdefault(q, (method, []))[0] == method \
                        and call not in taken[q][1]:
                    taken[q][1].append(call)
        placed = [(q, m, c) for q, (m, calls) in sorted(taken.items()) for c in calls]
        methods = [m for _, m, _ in placed]
        segments = insert_calls(d.text, [(q, c) for q, _, c in placed])
        meta = {**d.meta, "call_methods": methods, "calls_by_method": dict(Counter(methods))}
        out.append(Document.from_segments(d.id, segments, source=d.source, split=d.split, meta=meta))
        if out[-1].text != d.text:
            raise AssertionError(f"{d.id}: merging the annotations changed the text")
    return out


VERDICTS = ("agrees", "conflicts", "unknown_entity", "unknown_relation")


class Reference:
    """Facts to check calls against: ``(entity, relation) -> values`` with the entities' other names.

    Names and values are compared as :func:`lmlm.kb.keys.normalize_text` writes them (case, spacing
    and the punctuation at their ends do not count), an alias stands for its entity, and a value in
    any of the forms text writes it (:func:`lmlm.annotate.wikipedia.value_forms`: ``April 4, 1932``
    is also ``4 April 1932``) is that value.
    """

    def __init__(self, triples, aliases=()):
        from ..annotate.wikipedia import value_forms
        from ..kb.keys import normalize_text

        self._norm = normalize_text
        self.aliases = {normalize_text(a): normalize_text(e) for a, e in aliases}
        self.values: dict[tuple[str, str], set[str]] = {}
        for e, r, v in triples:
            forms = map(normalize_text, value_forms(v))
            self.values.setdefault((self.entity(e), normalize_text(r)), set()).update(forms)
        self.entities = {e for e, _ in self.values}

    def entity(self, name: str) -> str:
        n = self._norm(name)
        return self.aliases.get(n, n)

    def verdict(self, call: Lookup) -> str:
        """``agrees``, ``conflicts`` (the entity and relation are known, with other values),
        ``unknown_entity`` or ``unknown_relation``."""
        e = self.entity(call.entity)
        if e not in self.entities:
            return "unknown_entity"
        known = self.values.get((e, self._norm(call.relation)))
        if known is None:
            return "unknown_relation"
        return "agrees" if self._norm(call.value) in known else "conflicts"


KEEP = {"all": set(VERDICTS), "consistent": {"agrees", "unknown_entity", "unknown_relation"}, "known": {"agrees"}}


def vet_layer(layer: Layer, reference: Reference, keep: str) -> tuple[Layer, dict[str, int]]:
    """The calls of ``layer`` that ``keep`` lets in (``all``; ``consistent``: all but those that conflict
    with the reference; ``known``: only those that agree), and how many had each verdict."""
    allowed, counts, out = KEEP[keep], Counter(), {}
    for doc, calls in layer.items():
        for q, call in calls:
            verdict = reference.verdict(call)
            counts[verdict] += 1
            if verdict in allowed:
                out.setdefault(doc, []).append((q, call))
    return out, {"calls": sum(counts.values()), **{v: counts[v] for v in VERDICTS},
                 "kept": sum(map(len, out.values()))}


# -- the LLM path ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, seconds: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the llama.cpp server at {url} did not come up in {seconds:.0f} s")


def _seed_backend(spec: LLMSpec):
    """``(backend URL, server or None)``: a URL as given, or a llama.cpp server started here for a GGUF."""
    if "://" in spec.model or spec.model.startswith(("hf:", "vllm:", "openai:")):
        return spec.model, None
    from ..annotate.backends import BackendError
    from ..annotate.serve_gguf import start_gguf_server

    port = _free_port()
    try:
        server = start_gguf_server(spec.model or None, port=port, threads=spec.threads, parallel=spec.parallel,
                                   n_ctx=2048 * spec.parallel, alias="seed", quiet=True)
    except RuntimeError as e:  # xllamacpp missing
        raise BackendError(f"annotate.llm.model: {e}") from None
    _wait_healthy(f"http://127.0.0.1:{port}/health")
    return (f"openai://127.0.0.1:{port}/v1?model=seed&timeout=1800&concurrency={spec.parallel}"
            f"&cache_as={_gguf_identity(spec.model)}"), server


def _gguf_identity(model: str) -> str:
    """A name for the GGUF the seed's server runs, the same on any port: its file and size, hashed
    (the response cache keys on it, so a rerun finds the answers of a run cut short)."""
    from ..annotate.serve_gguf import smollm2_gguf_path

    path = Path(model).resolve() if model else smollm2_gguf_path()
    size = path.stat().st_size if path and path.is_file() else 0
    return "gguf-" + hashlib.sha256(f"{path}:{size}".encode()).hexdigest()[:16]


def _seed_choice(passages: list[Document], n: int, covered: set[str] = frozenset(), min_chars: int = 120
                 ) -> list[Document]:
    """Lead passages of training documents first (where articles state most facts), then the next ones;
    documents the infoboxes left without a call (``covered`` are the others) come first at each rank.
    Passages of ``min_chars`` or more first; shorter ones (a corpus of short documents) fill the rest."""
    train = [p for p in sorted(passages, key=lambda p: str(p.meta["doc"]) in covered)  # stable: corpus order kept
             if p.split in (None, "train") and p.text.strip()]
    chosen: list[Document] = []
    for tier in ([p for p in train if len(p.text) >= min_chars], [p for p in train if len(p.text) < min_chars]):
        by_doc: dict[str, list[Document]] = {}
        for p in tier:
            by_doc.setdefault(str(p.meta["doc"]), []).append(p)
        rank = 0
        while len(chosen) < n and any(len(v) > rank for v in by_doc.values()):
            chosen += [v[rank] for v in by_doc.values() if len(v) > rank][:n - len(chosen)]
            rank += 1
    return chosen


def _examples(infobox: list[Document] | None, folder: Path, max_chars: int) -> Path:
    """The seed's few-shot pool: lmlm's own example and the infobox-annotated passages with two calls or
    more whose values are written as the text writes them."""
    from ..annotate.prompts import DEFAULT_EXAMPLE

    rows = [Document.from_annotated("lmlm-example", DEFAULT_EXAMPLE.annotated)]
    for p in _infobox_passages(infobox or [], max_chars):
        calls = call_layer([p])[p.id]
        if len(calls) >= 2 and len(p.text) >= 120 and all(p.text.startswith(c.value, q) for q, c in calls):
            rows.append(p)
    write_documents(folder / "examples.jsonl", rows)
    return folder / "examples.jsonl"


def run_llm(folder: Path, documents: list[Document], infobox: list[Document] | None, spec: LLMSpec,
            device: str | None, seed: int, progress: bool = True, log: Callable[[str], None] = print,
            until: str | None = None) -> tuple[dict[str, Layer], dict]:
    """The LLM path over ``documents``; returns ``{"llm_seed": layer, "llm_distilled": layer}`` and a report.
    ``until``: ``seed``, ``correct`` or ``distill`` raises :class:`lmlm.stages.Stopped` once that step is done."""
    from ..annotate.corrector import CorrectorConfig, correct, summary
    from ..annotate.distill import DistillConfig, distill, run_corpus
    from ..annotate.lm import FitConfig
    from ..annotate.pipeline import seed_file

    folder.mkdir(parents=True, exist_ok=True)
    passages = passages_of(documents, spec.passage_chars)
    seeds = _seed_choice(passages, spec.seed_passages, {d.id for d in infobox or [] if d.num_calls})
    if not seeds:
        raise RecipeError(f"annotate.llm: none of the {len(documents)} documents has a training passage with text "
                          "for the LLM to annotate")
    seed_ids = {p.id for p in seeds}
    rest = [p for p in passages if p.id not in seed_ids]
    if spec.run_passages:
        rest = rest[:spec.run_passages]
    report: dict[str, Any] = {"passages": len(passages), "seed_passages": len(seeds), "run_passages": len(rest)}
    # the time of steps an earlier invocation finished, so the stage's time covers all of its work
    report["seconds_earlier"] = sum((stage_done(folder / step) or {}).get("seconds") or 0.0
                                    for step in ("seed", "correct", "annotator", "run"))

    # 1. seed: the LLM annotates the seed passages, every call validated
    seed_dir = folder / "seed"
    if not stage_done(seed_dir):
        write_documents(folder / "seed-passages.jsonl", seeds)
        examples = _examples(infobox, folder, spec.passage_chars)
        t = time.time()
        url, server = _seed_backend(spec)
        log(f"seed: {len(seeds)} passages through {url.split('?')[0]} ({spec.style} style)")
        try:
            rep = seed_file(folder / "seed-passages.jsonl", seed_dir, url, examples_from=examples, k=spec.examples,
                            cache=folder / "seed-cache.sqlite", batch_size=max(spec.parallel, 1) * 2,
                            max_tokens=spec.max_tokens or None, style=spec.style, progress=progress)
        finally:
            del server
        finish_stage(seed_dir, {**rep, "seconds": time.time() - t})
    report["seed"] = stage_done(seed_dir)
    stop_after("seed", until)
    seeded = read_documents(seed_dir / "annotated.jsonl")
    if not any(d.num_calls for d in seeded):
        log("seed: no call survived validation; the LLM path stops here")
        return {"llm_seed": {}, "llm_distilled": {}}, report

    # 2. correct: an under-fitted LM on the seed drops the calls it finds least predictable
    corr_dir = folder / "correct"
    if not stage_done(corr_dir):
        t = time.time()
        config = CorrectorConfig(drop=spec.correct_drop, device=device,
                                 fit=FitConfig(steps=spec.correct_steps, batch_size=8, seq_len=256, lr=3e-3, seed=seed))
        result = correct(seeded, config, corr_dir, progress=progress)
        finish_stage(corr_dir, {**{k: v for k, v in summary(result).items() if k != "train"}, "seconds": time.time() - t})
    report["correct"] = stage_done(corr_dir)
    stop_after("correct", until)
    kept = read_documents(corr_dir / "kept.jsonl")

    # 3. distill: the annotator learns from the corrected seed (and the infobox passages), validated
    ann_dir = folder / "annotator"
    if not stage_done(ann_dir):
        t = time.time()
        train_docs = [d for d in kept if d.num_calls] if "seed" in spec.distill_from else []
        if "infobox" in spec.distill_from and infobox:
            train_docs += [p for p in _infobox_passages(infobox, spec.passage_chars) if p.id not in seed_ids]
        train_docs = [d for d in (_validated(d) for d in train_docs) if d.num_calls]
        # passages without a call: the annotator learns to copy them unchanged, and its check counts
        # the calls it writes there as wrong (most passages it runs on state no infobox fact)
        blank = [p for p in _infobox_passages(infobox or [], spec.passage_chars, with_calls=False)
                 if p.id not in seed_ids] if train_docs and spec.negatives > 0 else []
        random.Random(seed).shuffle(blank)
        check: list[Document] = []
        if spec.min_f1 > 0 and 0 < len(train_docs) < CHECK_MIN:  # it could not be checked, so it would not run
            why = (f"{len(train_docs)} passages with calls, too few to hold out a check of the annotator "
                   f"({CHECK_MIN} needed; annotate.llm.min_f1 = 0 runs it unchecked)")
            log(f"distill: skipped, {why}")
            finish_stage(ann_dir, {"skipped": why, "calls": sum(d.num_calls for d in train_docs)})
        else:
            if spec.min_f1 > 0 and len(train_docs) >= CHECK_MIN:  # held out to measure the annotator before it runs
                random.Random(seed).shuffle(train_docs)
                k = max(5, len(train_docs) // 7)
                check, train_docs = train_docs[:k], train_docs[k:]
                k_blank = min(round(spec.negatives * k), len(blank))
                check, blank = check + blank[:k_blank], blank[k_blank:]
                write_documents(folder / "check.jsonl", check)
            negatives = blank[:round(spec.negatives * len(train_docs))]
            if not train_docs:
                log("distill: no validated call to learn from; the LLM path stops after the seed")
                return {"llm_seed": call_layer(kept, _passage_origin), "llm_distilled": {}}, report
            base = spec.distill_base or None
            config = DistillConfig(base=base, preset=spec.distill_preset, device=device,
                                   fit=FitConfig(steps=spec.distill_steps, batch_size=8, seq_len=256,
                                                 lr=2e-3 if base else 5e-3, seed=seed))
            log(f"distill: an annotator ({base or spec.distill_preset}) learns from {len(train_docs)} passages, "
                f"{sum(d.num_calls for d in train_docs)} calls, and {len(negatives)} passages without a call")
            _, stats = distill(train_docs + negatives, config, ann_dir, progress=progress)
            if spec.call_bias or spec.call_threshold:
                meta = read_json(ann_dir / "annotator.json")
                meta["options"].update(call_bias=spec.call_bias, call_threshold=spec.call_threshold or None)
                write_json(ann_dir / "annotator.json", meta)
            info = {**{k: stats[k] for k in ("steps", "first_loss", "final_loss", "seconds", "documents")},
                    "calls": sum(d.num_calls for d in train_docs), "passages_without_calls": len(negatives)}
            if check:
                info["check"] = _check_annotator(ann_dir, check, spec.run_batch_size)
                log(f"distill: on {len(check)} held-out passages ({info['check']['without_calls']} without a call) "
                    f"the annotator scores F1 {info['check']['f1']:.3f} (precision {info['check']['precision']:.3f}, "
                    f"{info['check']['predicted']} calls for {info['check']['gold']}; "
                    f"{info['check']['calls_where_none']} where none belongs)")
            finish_stage(ann_dir, info)
    report["distill"] = stage_done(ann_dir)
    stop_after("distill", until)
    if "skipped" in report["distill"]:
        report["run"] = {"skipped": report["distill"]["skipped"]}
        return {"llm_seed": call_layer(kept, _passage_origin), "llm_distilled": {}}, report
    f1 = (report["distill"].get("check") or {}).get("f1")
    if f1 is not None and f1 < spec.min_f1:
        log(f"run: skipped, the annotator's F1 {f1:.3f} is below annotate.llm.min_f1 = {spec.min_f1} "
            "(its calls would mostly be wrong)")
        report["run"] = {"skipped": f"annotator F1 {f1:.3f} < min_f1 {spec.min_f1}"}
        return {"llm_seed": call_layer(kept, _passage_origin), "llm_distilled": {}}, report

    # 4. run the distilled annotator on every other passage (sharded: a killed run goes on)
    run_dir = folder / "run"
    if not stage_done(run_dir):
        t = time.time()
        write_documents(folder / "run-passages.jsonl", rest)
        rep = run_corpus(folder / "run-passages.jsonl", run_dir, ann_dir, batch_size=spec.run_batch_size,
                         shard_size=max(256, spec.run_batch_size), progress=progress)
        if rep["shards_done"] != rep["shards"]:
            raise RuntimeError(f"{run_dir}: {rep['shards_done']} of {rep['shards']} shards annotated")
        finish_stage(run_dir, {**rep, "seconds": time.time() - t})
    report["run"] = stage_done(run_dir)
    layers = {"llm_seed": call_layer(kept, _passage_origin),
              "llm_distilled": call_layer(iter_documents(run_dir / "annotated.jsonl"), _passage_origin)}
    return layers, report


def _check_annotator(folder: Path, check: list[Document], batch_size: int) -> dict[str, Any]:
    """Call-level precision/recall/F1 of the annotator in ``folder`` on held-out passages (those without a
    call count each call written there as wrong), and how many calls it wrote where none belongs."""
    from ..annotate.annotator import Annotator
    from ..annotate.corrupt import call_f1
    from ..annotate.validate import calls_with_offsets

    results = Annotator.load(folder).annotate([d.text for d in check], batch_size)
    predicted = [list(zip(v.positions, v.kept)) for v in results]
    gold = [calls_with_offsets(d.segments) for d in check]
    blank = [p for p, g in zip(predicted, gold) if not g]  # passages where no call belongs
    return {**call_f1(predicted, gold), "without_calls": len(blank), "calls_where_none": sum(map(len, blank))}


def _validated(doc: Document) -> Document:
    """``doc`` with only the calls that pass :func:`lmlm.annotate.validate.validate`."""
    from ..annotate.validate import validate

    v = validate(doc.text, doc.annotated)
    return Document.from_segments(doc.id, v.segments, source=doc.source, split=doc.split, meta=doc.meta)


def _infobox_passages(infobox: list[Document], max_chars: int, with_calls: bool = True) -> list[Document]:
    """The infobox-annotated documents cut into passages: those with calls (or, ``with_calls=False``,
    those of the same articles where distant supervision placed none)."""
    from ..annotate.validate import insert_calls

    out = []
    for d in infobox:
        if not d.num_calls:
            continue
        layer = call_layer([d])[d.id]
        for s, e in split_passages(d.text, max_chars):
            calls = [(q - s, c) for q, c in layer if s <= q < e]
            if bool(calls) == with_calls:
                out.append(Document.from_segments(f"{d.id}@{s}", insert_calls(d.text[s:e], calls), source=d.id,
                                                  split=d.split, meta={"doc": d.id, "start": s}))
    return out
