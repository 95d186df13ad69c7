"""The one document schema and its one reader and writer.

A document is ``id``, ``annotated`` (the text with its lookup calls, either surface form),
``text`` (the plain text: the input the annotation was made from), ``source`` (where it came from:
a file, a Wikipedia title, a world), an optional ``split`` (``train``, ``heldout`` ...) and any
other fields as ``meta``. Every command that reads or writes documents goes through this module.

Readers take JSON lines (``.jsonl``, also gzipped), a JSON array (``.json``), Parquet (``.parquet``,
``pip install 'lmlm[parquet]'``), a Hugging Face ``datasets`` folder written by ``save_to_disk``
(a ``Dataset`` or a ``DatasetDict``, whose split names become ``split``), CSV and TSV with a header
row (``.csv``, ``.tsv``: a ``text`` or ``annotated`` column) and plain text (``.txt`` or any other
suffix, one document per line; spreadsheets, PDFs, archives and tensors are refused by suffix).
They accept the files earlier versions of lmlm wrote:

* ``annotated`` + ``text``/``plain`` (worlds, ``annotate wikipedia``, ``annotate validate``);
* ``text`` alone holding the calls (old training files, TOFU worlds, distilled corpora): the
  calls are found by parsing, and ``text`` becomes the stripped text;
* ``doc_id`` for ``id``; rows without either get their line (row) number.

A record that contradicts itself is refused with a :class:`CorpusError` naming file, line and
field: ``text`` holding calls while ``annotated`` is also given, or ``plain`` holding calls.

Exercised by every command that takes documents: ``lmlm train --data``, ``lmlm annotate ...``,
``lmlm kb build --triples`` (an annotated corpus), ``lmlm eval perplexity --data``, ``lmlm pipeline``.

Examples:
    >>> doc = Document.from_annotated("d1", "Ada was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London.")
    >>> doc.text
    'Ada was born in London.'
    >>> doc.num_calls
    1
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from .errors import LmlmError
from .lookup import Lookup, Segment, parse, render, strip

__all__ = ["Document", "CorpusError", "iter_documents", "iter_located", "read_documents", "write_documents", "corpus_stats",
           "csv_rows",
           "FIELDS", "document_from_record"]

FIELDS = ("id", "annotated", "text", "source", "split")
_TEXT_KEYS = ("text", "plain")  # older files name the plain text "plain"


class CorpusError(LmlmError, ValueError):
    """A document file that cannot be read as documents; the message names file, line and field."""


@dataclass
class Document:
    """One document of a corpus.

    Args:
        id: unique within the corpus (``doc_id`` in older files).
        annotated: the text with lookup calls, in either surface form; equal to ``text`` when it has none.
        text: the plain text (the annotation's input; ``strip(annotated)`` when not given).
        source: where the document came from (file, URL, article title, world name), if known.
        split: ``train``, ``heldout``, ``validation`` ... if the corpus is split.
        meta: every other field of the record (``person``, ``title``, ``calls`` ...), written back as is.
    """

    id: str
    annotated: str
    text: str
    source: str | None = None
    split: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_annotated(cls, id: str, annotated: str, **kw: Any) -> "Document":
        """A document from its annotated text; the plain text is the annotation stripped of its calls."""
        return cls(str(id), annotated, strip(parse(annotated).segments), **kw)

    @classmethod
    def from_segments(cls, id: str, segments: Sequence[Segment], **kw: Any) -> "Document":
        return cls(str(id), render(segments), strip(segments), **kw)

    @cached_property
    def segments(self) -> list[Segment]:
        """The parsed annotation (malformed calls stay text; see :func:`lmlm.lookup.parse`)."""
        return parse(self.annotated).segments

    @property
    def lookups(self) -> list[Lookup]:
        return [s for s in self.segments if isinstance(s, Lookup)]

    @property
    def num_calls(self) -> int:
        return len(self.lookups)

    @property
    def plain(self) -> str:
        """The annotation stripped of its calls (what the Standard baseline trains on)."""
        return strip(self.segments)

    def to_record(self) -> dict[str, Any]:
        """The JSON record: the schema's fields first, then ``meta``'s."""
        rec: dict[str, Any] = {"id": self.id, "annotated": self.annotated, "text": self.text}
        if self.source is not None:
            rec["source"] = self.source
        if self.split is not None:
            rec["split"] = self.split
        rec.update({k: v for k, v in self.meta.items() if k not in rec})
        return rec


# -- reading -----------------------------------------------------------------------------------------

def _has_calls(text: str) -> bool:
    return any(isinstance(s, Lookup) for s in parse(text).segments)


def document_from_record(row: Any, where: str, fallback_id: str) -> Document:
    """One record (a dict, or a string of annotated text) as a :class:`Document`; ``where`` names it in errors."""
    if isinstance(row, str):
        return Document.from_annotated(fallback_id, row)
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("annotated", *_TEXT_KEYS, "source", "split"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise CorpusError(f"{where}: field {key!r} must be a string, got {type(row[key]).__name__}")
    doc_id = row.get("id", row.get("doc_id", fallback_id))
    if doc_id is None or isinstance(doc_id, (dict, list)):
        raise CorpusError(f"{where}: field 'id' must be a string or number, got {doc_id!r}")
    given = {k: row[k] for k in _TEXT_KEYS if row.get(k) is not None}
    if "plain" in given and _has_calls(given["plain"]):
        raise CorpusError(f"{where}: field 'plain' holds lookup calls; annotated text belongs in 'annotated'")
    if "text" in given and "plain" in given and given["text"] != given["plain"]:
        raise CorpusError(f"{where}: fields 'text' and 'plain' differ; give the plain text once")
    annotated = row.get("annotated")
    if annotated is not None:
        if "text" in given and _has_calls(given["text"]):
            raise CorpusError(f"{where}: field 'text' holds lookup calls while 'annotated' is also given; "
                              "'text' must be the plain text")
        text = given.get("text", given.get("plain"))
        if text is None:
            text = strip(parse(annotated).segments)
    elif given:
        annotated = given.get("text", given.get("plain"))  # older files: 'text' held the calls, if any
        text = strip(parse(annotated).segments)
    else:
        raise CorpusError(f"{where}: no 'annotated' or 'text' field (fields: {', '.join(map(str, row)) or 'none'})")
    meta = {k: v for k, v in row.items() if k not in (*FIELDS, "doc_id", "plain")}
    return Document(str(doc_id), annotated, text, row.get("source"), row.get("split"), meta)


def _open_text(path: Path):
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")  # a byte-order mark (Excel's "CSV UTF-8", Notepad) is no text


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) of each record in ``path``: JSON lines, a JSON array, Parquet, a datasets folder, CSV/TSV
    or text."""
    if path.is_dir():
        yield from _dataset_folder_records(path)
        return
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    kind = suffixes[-1] if suffixes else ""
    if kind == ".parquet":
        yield from _parquet_records(path)
        return
    if kind in _NOT_TEXT:
        raise CorpusError(f"{path}: a {kind} file is not a corpus lmlm reads; give JSON lines (.jsonl), a JSON "
                          f"array (.json), Parquet, CSV or TSV (a 'text' or 'annotated' column), plain text (one "
                          f"document a line) or a datasets folder")
    if kind in (".csv", ".tsv"):
        for where, row in csv_rows(path):
            extra = row.pop(None, None)  # cells past the header's columns
            if extra and any(c.strip() for c in extra):
                raise CorpusError(f"{where}: {len(row) + len(extra)} cells under a header of {len(row)} columns "
                                  f"(a field with a {chr(9) if kind == '.tsv' else ','!r} needs quotes)")
            yield where, {k: v for k, v in row.items() if v is not None}
        return
    try:
        with _open_text(path) as f:
            if kind == ".json":
                try:
                    data = json.load(f)
                except ValueError as e:
                    raise CorpusError(f"{path}: not JSON: {e}") from None
                if not isinstance(data, list):
                    raise CorpusError(f"{path}: expected a JSON array of documents (or use .jsonl)")
                for i, row in enumerate(data, 1):
                    yield f"{path}: item {i}", row
                return
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                if kind == ".jsonl":
                    try:
                        yield where, json.loads(line)
                    except ValueError as e:
                        raise CorpusError(f"{where}: not a JSON line: {e}") from None
                else:
                    yield where, line.rstrip("\n")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise CorpusError(f"{path}: broken gzip file: {e}") from None


_NOT_TEXT = {".xlsx", ".xls", ".ods", ".pdf", ".docx", ".doc", ".odt", ".zip", ".tar", ".tgz", ".bz2", ".xz",
             ".zst", ".7z", ".arrow", ".feather", ".pkl", ".pickle", ".npy", ".npz", ".h5", ".hdf5", ".db",
             ".sqlite", ".pt", ".bin", ".safetensors"}


def csv_rows(path: str | Path) -> Iterator[tuple[str, dict]]:
    """``(where, row)`` of each row of a CSV file with a header row (a TSV by its ``.tsv`` suffix; also
    gzipped): ``where`` is ``FILE:LINE``, ``row`` maps the header's columns to the cells, cells past
    them under ``None`` as :class:`csv.DictReader` puts them. Broken CSV (naming the line), text
    or gzip raises :class:`CorpusError`. Shared by the document reader and ``lmlm kb``'s triples."""
    import csv
    import sys

    path = Path(path)
    tsv = [x.lower() for x in path.suffixes if x.lower() != ".gz"][-1:] == [".tsv"]
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a document is one field: often over 128 KB
    try:
        with (gzip.open(path, "rt", encoding="utf-8-sig", newline="") if path.suffix.lower() == ".gz"
              else open(path, encoding="utf-8-sig", newline="")) as f:
            rows = csv.DictReader(f, delimiter="\t" if tsv else ",")
            for row in rows:
                yield f"{path}:{rows.line_num}", row
    except csv.Error as e:
        raise CorpusError(f"{path}:{rows.line_num}: not {'TSV' if tsv else 'CSV'}: {e}") from None
    except UnicodeDecodeError as e:  # decoded a block at a time: no line to name
        raise CorpusError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise CorpusError(f"{path}: broken gzip file: {e}") from None


def _parquet_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError(f"{path}: reading Parquet needs pyarrow: pip install 'lmlm[parquet]'") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own error types for broken files
        raise CorpusError(f"{path}: not a Parquet file: {e}") from None
    row = 0
    for batch in pf.iter_batches(batch_size=4096):
        for rec in batch.to_pylist():
            row += 1
            yield f"{path}: row {row}", rec


def _dataset_folder_records(folder: Path) -> Iterator[tuple[str, Any]]:
    """A ``save_to_disk`` folder: a Dataset (``state.json``) or a DatasetDict (``dataset_dict.json``)."""
    if (folder / "dataset_dict.json").exists():
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        for split in splits:
            for where, rec in _dataset_folder_records(folder / split):
                yield where, ({**rec, "split": rec.get("split") or split} if isinstance(rec, dict) else rec)
        return
    state = folder / "state.json"
    if not state.exists():
        raise CorpusError(f"{folder}: a folder of documents must be a Hugging Face datasets folder "
                          "(save_to_disk: state.json or dataset_dict.json)")
    try:
        import pyarrow as pa
    except ImportError:
        raise CorpusError(f"{folder}: reading a datasets folder needs pyarrow: pip install 'lmlm[parquet]'") from None
    row = 0
    for entry in json.loads(state.read_text()).get("_data_files", []):
        with pa.memory_map(str(folder / entry["filename"])) as source:
            reader = pa.ipc.open_stream(source)
            for batch in reader:
                for rec in batch.to_pylist():
                    row += 1
                    yield f"{folder}: row {row}", rec


def iter_documents(path: str | Path, split: str | None = None) -> Iterator[Document]:
    """Stream the documents of ``path`` (see the module docstring for the formats).

    Args:
        path: a document file or a ``datasets`` folder.
        split: keep only documents of this split (documents without a split are kept when the file
            has no split at all).

    Raises:
        CorpusError: the file is missing, unreadable, or a record is not a document (file, line, field named).
    """
    for _, doc in iter_located(path, split):
        yield doc


def iter_located(path: str | Path, split: str | None = None) -> Iterator[tuple[str, Document]]:
    """:func:`iter_documents` with where each document was read (``FILE:LINE``, ``FILE: row N``), for
    callers that check documents further and must say where a bad one is."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: no such file or folder")
    seen: set[str] = set()
    for n, (where, rec) in enumerate(_records(path), 1):
        doc = document_from_record(rec, where, str(n))
        if doc.id in seen:
            raise CorpusError(f"{where}: duplicate document id {doc.id!r}")
        seen.add(doc.id)
        if split is None or doc.split == split:
            yield where, doc


def read_documents(path: str | Path, split: str | None = None) -> list[Document]:
    """All documents of ``path`` (:func:`iter_documents` as a list); a file without documents is an error."""
    docs = list(iter_documents(path, split))
    if not docs:
        what = f"no documents of split {split!r}" if split else "no documents"
        raise CorpusError(f"{path}: {what}")
    return docs


# -- writing -----------------------------------------------------------------------------------------

def write_documents(path: str | Path, documents: Iterable[Document]) -> int:
    """Write documents as JSON lines (or Parquet for ``.parquet``), atomically; returns how many.

    The file appears complete or not at all: a crash mid-write leaves the old file (if any) in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    n = 0
    try:
        if path.suffix.lower() == ".parquet":
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise CorpusError(f"{path}: writing Parquet needs pyarrow: pip install 'lmlm[parquet]'") from None
            rows = [d.to_record() for d in documents]
            n = len(rows)
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for doc in documents:
                    f.write(json.dumps(doc.to_record(), ensure_ascii=False) + "\n")
                    n += 1
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return n


def corpus_stats(documents: Iterable[Document]) -> dict[str, Any]:
    """Counts over documents: ``documents``, ``lookup_calls``, ``documents_with_calls``, ``characters``,
    ``text_unchanged`` (share of documents whose annotation strips back to their text) and per split."""
    n = calls = with_calls = chars = unchanged = 0
    splits: dict[str, int] = {}
    for d in documents:
        n += 1
        k = d.num_calls
        calls += k
        with_calls += k > 0
        chars += len(d.text)
        unchanged += d.plain == d.text
        if d.split is not None:
            splits[d.split] = splits.get(d.split, 0) + 1
    return {"documents": n, "lookup_calls": calls, "documents_with_calls": with_calls, "characters": chars,
            "text_unchanged": unchanged / n if n else 1.0, "splits": splits}
