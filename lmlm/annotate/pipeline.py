"""Annotation from Python and from files: ``annotate(texts, backend=...)``, the seed and validate stages.

:func:`annotate` sends each text to an LLM backend (any URL of :mod:`lmlm.annotate.backends`, with
few-shot examples from the corpus) or to a distilled annotator (``annotator:FOLDER`` or an
:class:`~lmlm.annotate.annotator.Annotator`), and validates every answer. :func:`seed_file` and
:func:`validate_file` do the same for files and write the results with a report. Files are read
and written through :mod:`lmlm.corpus`: ``annotated`` holds the calls, ``text`` the input.

Exercised by ``lmlm annotate seed`` and ``lmlm annotate validate``.

Examples:
    >>> results = annotate(["Ada Lovelace was born in London."], backend="openai://127.0.0.1:8080/v1?model=m")  # doctest: +SKIP
    >>> results[0].annotated  # doctest: +SKIP
    "Ada Lovelace was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London."
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..corpus import Document, iter_documents, read_documents, write_documents
from ..jsonio import write_json
from .prompts import (Example, build_messages, extract_annotation, parse_fact_lines, prompt_examples,
                      select_examples)
from .validate import Validated, ValidationReport, validate, validate_facts

__all__ = ["annotate", "seed_file", "validate_file", "write_annotation"]


def annotate(texts: Sequence[str], backend: Any = "openai://127.0.0.1:8080/v1?model=default", *,
             examples: Sequence[Example] | None = None, cache: str | Path | bool | None = None, batch_size: int = 16,
             max_tokens: int | None = None, temperature: float = 0.0, style: str = "inline") -> list[Validated]:
    """Annotate ``texts`` with lookup calls and validate each answer.

    Args:
        texts: plain passages.
        backend: a backend URL or object (:func:`~lmlm.annotate.backends.get_backend`), an
            :class:`~lmlm.annotate.annotator.Annotator`, or ``"annotator:FOLDER"``.
        examples: few-shot examples (see :func:`~lmlm.annotate.prompts.select_examples`; ``None``: the
            built-in one, ``[]``: none).
        cache: the LLM response cache (a SQLite file; ``False``: none; ``None``: the default one).
        batch_size: texts sent per backend call.
        max_tokens: answer budget per text (default: about three times the passage; a third of that
            for ``style="facts"``).
        temperature: 0 for greedy answers.
        style: ``"inline"``: the LLM writes the passage with its calls (the paper's way);
            ``"facts"``: it lists ``Entity | Relation | Value`` lines and each call is placed before
            the value's first mention after its entity (:func:`~lmlm.annotate.validate.place_facts`;
            a fact it cannot place is rejected as ``value_not_in_text``), so the text is unchanged by
            construction (what a small model like SmolLM2-135M manages).

    Returns:
        One :class:`~lmlm.annotate.validate.Validated` per text: kept calls on the unchanged input text,
        rejected calls with their reasons.
    """
    from .annotator import Annotator
    from .backends import Backend, get_backend

    if isinstance(backend, str) and backend.startswith("annotator:"):
        backend = Annotator.load(backend.split(":", 1)[1])
    if isinstance(backend, Annotator):
        return backend.annotate(list(texts), batch_size)
    llm = backend if isinstance(backend, Backend) else get_backend(backend, cache=cache)
    out: list[Validated] = []
    for i in range(0, len(texts), batch_size):
        chunk = list(texts[i:i + batch_size])
        budget = max_tokens or max(256, max(len(t) for t in chunk))  # about 4 tokens per passage token
        if style == "facts" and not max_tokens:
            budget = max(96, budget // 3)
        answers = llm.complete([build_messages(t, examples, style=style) for t in chunk], max_tokens=budget,
                               temperature=temperature)
        if style == "facts":  # placed on the text itself: nothing to extract, and no fact left unreported
            out += [validate_facts(t, parse_fact_lines(a)) for t, a in zip(chunk, answers)]
        else:
            out += [validate(t, extract_annotation(a)) for t, a in zip(chunk, answers)]
    return out


def write_annotation(out: str | Path, documents: Sequence[Document], results: Sequence[Validated],
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``annotated.jsonl`` (the documents with their kept calls, in the schema of
    :mod:`lmlm.corpus`), ``rejected.jsonl`` (one line per rejected call) and ``report.json`` (counts
    per reason) into the folder ``out``; return the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_documents(out / "annotated.jsonl", (v.document(d) for d, v in zip(documents, results)))
    with (out / "rejected.jsonl").open("w", encoding="utf-8") as rf:
        for d, v in zip(documents, results):
            for r in v.rejected:
                rf.write(json.dumps({"id": d.id, **r.to_dict()}, ensure_ascii=False) + "\n")
    report = {**ValidationReport.of(results).to_dict(), **(extra or {})}
    write_json(out / "report.json", report)
    return report


def validate_file(path: str | Path, out: str | Path) -> dict[str, Any]:
    """Validate the annotated documents of ``path`` (any format of :mod:`lmlm.corpus`) against their
    plain text; a file that gives no plain text is checked against each annotation stripped
    (syntax, values, entities and duplicates, not text changes)."""
    docs = read_documents(path)
    return write_annotation(out, docs, [validate(d.text, d.annotated) for d in docs])


def seed_file(path: str | Path, out: str | Path, backend: str, *, examples_from: str | Path | None = None,
              k: int = 2, limit: int | None = None, cache: str | Path | bool | None = None,
              batch_size: int = 8, max_tokens: int | None = None, style: str = "inline",
              max_chars: int = 1000, progress: bool = True) -> dict[str, Any]:
    """Seed annotation: annotate the documents of ``path`` with an LLM backend and validate them.

    Args:
        path: documents (any format of :mod:`lmlm.corpus`); their plain ``text`` is annotated.
        examples_from: annotated documents to take ``k`` few-shot examples from (none of them fit, or
            none given: the built-in example; ``k=0``: no example).
        limit: the first ``limit`` documents only.
        max_tokens: answer budget per passage (default: see :func:`annotate`).
        style: ``inline`` or ``facts`` (see :func:`annotate`).
        max_chars: a longer document goes to the LLM a passage at a time (cut at sentence ends, see
            :func:`~lmlm.annotate.passages.cover_passages`) so that the prompt, the examples and the
            answer fit its context; the passages' calls are joined back into the document.
        progress: a progress bar on stderr.
    """
    from tqdm.auto import tqdm

    from .passages import cover_passages

    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if Path(out).exists() and not Path(out).is_dir():  # before any LLM call
        raise ValueError(f"{out}: is a file, not a folder for the seed's outputs")
    docs = read_documents(path)[:limit]
    examples = None  # the built-in example
    if k == 0:
        examples = []
    elif examples_from:
        examples = select_examples((d.annotated for d in iter_documents(examples_from)), k) or None
    pieces = []  # (document index, offset, passage), blank passages left out
    for j, d in enumerate(docs):
        off = 0
        for p in cover_passages(d.text, max_chars) if d.text else []:
            if p.strip():
                pieces.append((j, off, p))
            off += len(p)
    results = []
    for i in tqdm(range(0, len(pieces), batch_size), desc="seed", unit="batch", disable=not progress):
        results += annotate([p for _, _, p in pieces[i:i + batch_size]], backend, examples=examples, cache=cache,
                            batch_size=batch_size, max_tokens=max_tokens, style=style)
    parts: list[list[tuple[int, Validated]]] = [[] for _ in docs]
    for (j, off, _), v in zip(pieces, results):
        parts[j].append((off, v))
    joined = [Validated.joined(d.text, ps) if ps else validate(d.text, d.text) for d, ps in zip(docs, parts)]
    return write_annotation(out, docs, joined, {"backend": backend, "examples": len(prompt_examples(examples)),
                                                "style": style,
                                                "passages": len(pieces), "max_chars": max_chars})
