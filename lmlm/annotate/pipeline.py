"""Annotation from Python and from files: ``annotate(texts, backend=...)``, the seed and validate stages.

:func:`annotate` sends each text to an LLM backend (any URL of :mod:`lmlm.annotate.backends`, with
few-shot examples from the corpus) or to a distilled annotator (``annotator:FOLDER`` or an
:class:`~lmlm.annotate.annotator.Annotator`), and validates every answer. :func:`seed_file` and
:func:`validate_file` do the same for files and write the results with a report.

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

from .prompts import Example, build_messages, extract_annotation, select_examples
from .validate import Validated, ValidationReport, validate

__all__ = ["annotate", "read_texts", "read_annotated", "seed_file", "validate_file", "write_results"]


def annotate(texts: Sequence[str], backend: Any = "openai://127.0.0.1:8080/v1?model=default", *,
             examples: Sequence[Example] = (), cache: str | Path | bool | None = None, batch_size: int = 16,
             max_tokens: int | None = None, temperature: float = 0.0) -> list[Validated]:
    """Annotate ``texts`` with lookup calls and validate each answer.

    Args:
        texts: plain passages.
        backend: a backend URL or object (:func:`~lmlm.annotate.backends.get_backend`), an
            :class:`~lmlm.annotate.annotator.Annotator`, or ``"annotator:FOLDER"``.
        examples: few-shot examples (see :func:`~lmlm.annotate.prompts.select_examples`).
        cache: the LLM response cache (a SQLite file; ``False``: none; ``None``: the default one).
        batch_size: texts sent per backend call.
        max_tokens: answer budget per text (default: about three times the passage).
        temperature: 0 for greedy answers.

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
        answers = llm.complete([build_messages(t, examples) for t in chunk], max_tokens=budget,
                               temperature=temperature)
        out += [validate(t, extract_annotation(a)) for t, a in zip(chunk, answers)]
    return out


def _rows(path: Path) -> list[tuple[int, dict | str]]:
    """(line number, JSON object or text line) of a ``.jsonl`` or text file, blank lines skipped."""
    if not path.is_file():
        raise FileNotFoundError(f"no input file at {path}")
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line: {e}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            rows.append((lineno, row))
        else:
            rows.append((lineno, line))
    return rows


def read_texts(path: str | Path) -> list[tuple[str, str]]:
    """(id, plain text) of each document: ``.jsonl`` with ``text`` (or ``plain``) and optional ``id`` /
    ``doc_id``, or a text file with one document per line (id: the line number)."""
    path = Path(path)
    out = []
    for lineno, row in _rows(path):
        if isinstance(row, str):
            out.append((str(lineno), row))
            continue
        text = row.get("text", row.get("plain"))
        if not isinstance(text, str):
            raise ValueError(f"{path}:{lineno}: no 'text' field")
        out.append((str(row.get("id", row.get("doc_id", lineno))), text))
    return out


def read_annotated(path: str | Path) -> list[tuple[str, str | None, str]]:
    """(id, plain text or None, annotation) of each annotated document.

    ``.jsonl`` rows carry ``annotated`` (and ``text``/``plain``: the input it must match) or only
    ``text`` holding the annotation; text files hold one annotation per line.
    """
    path = Path(path)
    out = []
    for lineno, row in _rows(path):
        if isinstance(row, str):
            out.append((str(lineno), None, row))
            continue
        doc_id = str(row.get("id", row.get("doc_id", lineno)))
        if isinstance(row.get("annotated"), str):
            plain = row.get("plain", row.get("text"))
            out.append((doc_id, plain if isinstance(plain, str) else None, row["annotated"]))
        elif isinstance(row.get("text"), str):
            out.append((doc_id, None, row["text"]))
        else:
            raise ValueError(f"{path}:{lineno}: no 'annotated' or 'text' field")
    return out


def write_results(out: str | Path, ids: Sequence[str], results: Sequence[Validated],
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``annotated.jsonl`` (kept calls), ``rejected.jsonl`` (one line per rejected call) and
    ``report.json`` (counts per reason) into the folder ``out``; return the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "annotated.jsonl").open("w", encoding="utf-8") as f, \
            (out / "rejected.jsonl").open("w", encoding="utf-8") as rf:
        for doc_id, v in zip(ids, results):
            f.write(json.dumps({"id": doc_id, **v.to_dict()}, ensure_ascii=False) + "\n")
            for r in v.rejected:
                rf.write(json.dumps({"id": doc_id, **r.to_dict()}, ensure_ascii=False) + "\n")
    report = {**ValidationReport.of(results).to_dict(), **(extra or {})}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def validate_file(path: str | Path, out: str | Path) -> dict[str, Any]:
    """Validate the annotated documents of ``path``; rows without their plain text are checked against
    their own annotation stripped (syntax, values, entities and duplicates, not text changes)."""
    from ..lookup import parse, strip

    rows = read_annotated(path)
    results = [validate(plain if plain is not None else strip(parse(ann).segments), ann) for _, plain, ann in rows]
    return write_results(out, [r[0] for r in rows], results)


def seed_file(path: str | Path, out: str | Path, backend: str, *, examples_from: str | Path | None = None,
              k: int = 2, limit: int | None = None, cache: str | Path | bool | None = None,
              batch_size: int = 8) -> dict[str, Any]:
    """Seed annotation: annotate the documents of ``path`` with an LLM backend and validate them.

    Args:
        examples_from: annotated documents (JSONL/text) to take ``k`` few-shot examples from.
        limit: the first ``limit`` documents only.
    """
    docs = read_texts(path)[:limit]
    examples = select_examples((a for _, _, a in read_annotated(examples_from)), k) if examples_from else []
    results = []
    from tqdm.auto import tqdm

    for i in tqdm(range(0, len(docs), batch_size), desc="seed", unit="batch"):
        results += annotate([t for _, t in docs[i:i + batch_size]], backend, examples=examples, cache=cache,
                            batch_size=batch_size)
    return write_results(out, [d for d, _ in docs], results, {"backend": backend, "examples": len(examples)})
