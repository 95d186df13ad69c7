"""Files a knowledge base reads and writes: triples as JSON lines or Parquet, annotated corpora,
and the authors' released database JSON.

* ``jsonl``: one triple per line, ``entity``, ``relation``, ``value`` and optionally ``count`` and
  ``sources`` (a list of ``[doc_id, position]``), or ``source`` and ``position`` as in
  :class:`~lmlm.kb.records.Triple`. What :meth:`KnowledgeBase.export` writes, losslessly.
* ``parquet``: the same columns; ``sources`` is a list of ``{doc_id, position}`` structs. Needs
  ``pyarrow`` (``pip install 'lmlm[parquet]'``).
* ``corpus``: an annotated corpus: documents in any format of :mod:`lmlm.corpus` (JSON lines,
  Parquet, a ``datasets`` folder), whose ``annotated`` text holds the calls. Reading takes every call
  as a fact whose source is the document and whose position is the call's character offset in the
  plain text. Writing makes one document per source (facts with none go to ``kb-unsourced``), one
  sentence per fact, so reading it back gives the same facts and documents (positions are those of
  the written text).
* ``authors``: the authors' released database JSON, read only: one JSON object with four lists,
  ``entities``, ``relationships``, ``return_values`` and ``triplets`` (each triplet an ``[entity,
  relation, value]`` list; the first three lists only repeat what the triplets hold). Their fields
  keep the backslash of quotes escaped during annotation (``Destiny\\'s Child``); it is removed here.
  The paper's database holds 54.6M triplets, far more than one ``json.load`` can hold, so the file
  is streamed (``ijson``): one pass checks the four lists and counts the triplets
  (:func:`scan_authors_json`, for the progress bar), a second yields them (:func:`iter_authors_json`)
  for :func:`lmlm.kb.build.add_file` to add by chunks (the KB side: :func:`lmlm.kb.build.import_authors_json`
  and :func:`lmlm.kb.build.open_authors_json`; also ``lmlm generate --kb DATABASE.json``).
* ``csv``: a CSV (``.csv``) or TSV (``.tsv``) file with a header row naming ``entity``, ``relation``,
  ``value`` and optionally ``source``, ``position`` and ``count``. Read only. A CSV file whose header
  has no ``entity`` but a ``text`` or ``annotated`` column is a corpus.

Exercised by ``lmlm kb import``, ``lmlm kb export`` and ``lmlm kb build``.
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Iterator

from .keys import clean_field, is_plain
from .records import Fact, Triple, TripleRecord, as_triple, check_triple

__all__ = ["FORMATS", "detect_format", "read", "write", "count_items", "fact_of", "fact_from", "read_aliases",
           "UNSOURCED_DOC", "AUTHORS_FIELDS", "AUTHORS_MARKER", "read_authors_json", "iter_authors_json",
           "scan_authors_json"]

FORMATS = ("jsonl", "parquet", "corpus", "authors", "csv")  # the last two are read, never written
UNSOURCED_DOC = "kb-unsourced"
_PARQUET_BATCH = 65_536


def fact_of(t: Triple) -> Fact:
    """The stored form of a triple: every string through :func:`~lmlm.kb.keys.clean_field`."""
    return _fact(t.entity, t.relation, t.value, t.source, t.position)


def fact_from(item) -> Fact:
    """The stored form of anything :func:`~lmlm.kb.records.as_triple` accepts; a tuple is checked as
    a :class:`Triple` would be, without making one (a third of an add's Python time at 10^6 facts)."""
    if type(item) is tuple and 3 <= len(item) <= 5:
        check_triple(*item)
        return _fact(item[0], item[1], item[2], item[3] if len(item) > 3 else None, item[4] if len(item) > 4 else None)
    return fact_of(as_triple(item))


def _fact(e: str, r: str, v: str, source: str | None, position: int | None) -> Fact:
    sources = ((clean_field(source, "source"), position),) if source is not None else ()
    if is_plain(e + r + v):  # clean_field's fast path, for the three at once
        return Fact(e.strip(), r.strip(), v.strip(), 1, sources)
    return Fact(clean_field(e, "entity"), clean_field(r, "relation"), clean_field(v, "value"), 1, sources)


def _suffix(path: Path) -> str:
    """The suffix that says what ``path`` holds (``.jsonl`` for ``facts.jsonl.gz``)."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    return suffixes[-1] if suffixes else ""


def _open_bytes(path: Path):
    """``path`` opened for reading bytes, through gzip when it ends in ``.gz``."""
    import gzip

    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def _lines(path: Path) -> Iterator[bytes]:
    """The raw lines of ``path`` (gzipped or not); a broken gzip file is a ValueError naming it."""
    import gzip
    import zlib

    try:
        with _open_bytes(path) as f:
            yield from f
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: broken gzip file ({e or 'it ends early'})") from None


def detect_format(path: str | Path) -> str:
    """The format of ``path``: by suffix (``.parquet``, ``.json``), else by the first JSON line's fields;
    a Parquet file with documents' columns, a ``datasets`` folder or plain text (``.txt``) is a corpus.
    JSON lines, CSV/TSV and text may be gzipped (``facts.jsonl.gz``)."""
    path = Path(path)
    if path.is_dir():
        return "corpus"
    if path.suffix.lower() == ".parquet":
        try:
            names = set(_pyarrow().parquet.ParquetFile(path).schema_arrow.names)
        except Exception:  # unreadable: the triple reader reports it
            return "parquet"
        return "corpus" if "entity" not in names and names & {"annotated", "text"} else "parquet"
    if path.suffix.lower() == ".json":
        return "authors"
    if _suffix(path) == ".txt":  # plain text, one document a line (calls as dblookup)
        return "corpus"
    if _suffix(path) in (".csv", ".tsv"):
        return "csv" if "entity" in _csv_header(path) else "corpus"
    if path.is_file():
        for raw in _lines(path):
            try:
                line = raw.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    break
                if isinstance(first, dict) and ("annotated" in first or "text" in first):
                    return "corpus"
                break
    return "jsonl"


_OUTPUT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


def _check(path: str | Path, format: str | None, reading: bool) -> tuple[Path, str]:
    path = Path(path)
    if reading and not (path.is_file() or path.is_dir() and (format in (None, "corpus"))):
        raise FileNotFoundError(f"no file to import at {path}")
    if not reading:
        if path.is_dir():
            raise ValueError(f"{path} is a folder: give a file to write (name.jsonl or name.parquet)")
        if format is None:
            format = _OUTPUT_SUFFIXES.get(path.suffix.lower())
            if format is None:
                raise ValueError(f"cannot tell the format to write {path} in from its suffix "
                                 f"{path.suffix or '(none)'!r}: name it .jsonl or .parquet, or give the format "
                                 "(jsonl, parquet, corpus)")
    format = format or detect_format(path)
    if format not in FORMATS or (format in ("authors", "csv") and not reading):
        allowed = FORMATS if reading else FORMATS[:3]
        raise ValueError(f"unknown {'input' if reading else 'output'} format {format!r} for {path}; "
                         f"use one of {', '.join(allowed)}")
    return path, format


def count_items(path: str | Path, format: str | None = None) -> int | None:
    """How many facts (or documents, for a corpus) ``path`` holds, cheaply; None when unknown."""
    path, format = _check(path, format, reading=True)
    if format == "parquet":
        try:
            return _pyarrow().parquet.ParquetFile(path).metadata.num_rows
        except Exception:  # a broken file: its reader names the problem
            return None
    if format in ("jsonl", "corpus") and path.is_file():
        return sum(1 for line in _lines(path) if line.strip())
    return None


def read(path: str | Path, format: str | None = None) -> tuple[Iterator[Fact], int | None]:
    """The facts of ``path`` (streamed, validated as they come) and how many there are when known."""
    path, format = _check(path, format, reading=True)
    if format == "authors":  # streamed: the paper's database is tens of GB
        good, _ = scan_authors_json(path)
        return (fact_of(t) for t in iter_authors_json(path)), good
    reader = {"jsonl": _read_jsonl, "parquet": _read_parquet, "corpus": _read_corpus, "csv": _read_csv}[format]
    return reader(path), (count_items(path, format) if format not in ("corpus", "csv") else None)


def write(records: Iterable[TripleRecord], path: str | Path, format: str | None = None) -> int:
    """Write ``records`` to ``path`` (format by suffix unless given); returns how many were written."""
    path, format = _check(path, format, reading=False)
    return {"jsonl": _write_jsonl, "parquet": _write_parquet, "corpus": _write_corpus}[format](records, path)


# -- JSON lines ------------------------------------------------------------------------------------
def _fact_from_dict(d: dict) -> Fact:
    t = Triple(d["entity"], d["relation"], d["value"], d.get("source"), d.get("position"))
    sources = [(clean_field(str(s[0]), "source"), None if s[1] is None else int(s[1])) for s in d.get("sources") or []]
    count = int(d.get("count", 1))
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    fact = fact_of(t)
    return fact._replace(count=count, sources=fact.sources + tuple(sources))


def _read_jsonl(path: Path) -> Iterator[Fact]:
    for lineno, raw in enumerate(_lines(path), 1):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not line.strip():
            continue
        try:
            yield _fact_from_dict(json.loads(line))
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(f"{path}:{lineno}: not a triple: {_why(e)}") from None


def _csv_header(path: Path) -> list[str]:
    import csv

    import io

    try:
        with _open_bytes(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as f:
            return [c.strip() for c in next(csv.reader(f, delimiter="\t" if _suffix(path) == ".tsv" else ","), [])]
    except (UnicodeDecodeError, OSError, EOFError, csv.Error):
        return []  # the reader names the problem


def _read_csv(path: Path) -> Iterator[Fact]:
    from ..corpus import csv_rows  # its errors name the line, and are ValueErrors as ours

    for where, row in csv_rows(path):
        if None in row:
            raise ValueError(f"{where}: more cells than the header has columns")
        d = {k.strip(): v for k, v in row.items() if v not in (None, "")}
        try:
            if "position" in d:
                d["position"] = int(d["position"])
            yield _fact_from_dict(d)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{where}: not a triple: {_why(e)}") from None


def _write_jsonl(records: Iterable[TripleRecord], path: Path) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


# -- Parquet ---------------------------------------------------------------------------------------
def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError("reading or writing Parquet needs pyarrow: pip install 'lmlm[parquet]'") from None
    return pyarrow


def _schema(pa):
    source = pa.struct([("doc_id", pa.string()), ("position", pa.int64())])
    return pa.schema([("id", pa.int64()), ("entity", pa.string()), ("relation", pa.string()),
                      ("value", pa.string()), ("count", pa.int64()), ("created_version", pa.int64()),
                      ("sources", pa.list_(source))])


def _write_parquet(records: Iterable[TripleRecord], path: Path) -> int:
    pa = _pyarrow()
    schema, n = _schema(pa), 0
    with pa.parquet.ParquetWriter(path, schema) as writer:
        batch: list[dict] = []
        for record in records:
            batch.append({"id": record.id, "entity": record.entity, "relation": record.relation,
                          "value": record.value, "count": record.count, "created_version": record.created_version,
                          "sources": [{"doc_id": d, "position": p} for d, p in record.sources]})
            if len(batch) == _PARQUET_BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema))
                n, batch = n + len(batch), []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema) if batch else schema.empty_table())
            n += len(batch)
    return n


def _why(e: Exception) -> str:
    """A reader's error as a user reads it: a missing field is named as one."""
    return f"no {e.args[0]!r} field (a triple has entity, relation and value)" if isinstance(e, KeyError) else str(e)


def _read_parquet(path: Path) -> Iterator[Fact]:
    pa = _pyarrow()
    try:
        pf = pa.parquet.ParquetFile(path)
    except Exception as e:  # pyarrow raises its own error types for broken files
        raise ValueError(f"{path}: not a Parquet file: {e}") from None
    missing = {"entity", "relation", "value"} - set(pf.schema_arrow.names)
    if missing:
        raise ValueError(f"{path} has no column(s) {', '.join(sorted(missing))}: not a table of triples")
    row = 0
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH):
        for d in batch.to_pylist():
            row += 1
            try:
                if d.get("sources"):
                    d["sources"] = [(s["doc_id"], s["position"]) for s in d["sources"]]
                yield _fact_from_dict(d)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{path}: row {row}: not a triple: {_why(e)}") from None


# -- annotated corpus ------------------------------------------------------------------------------
def _read_corpus(path: Path) -> Iterator[Fact]:
    from ..corpus import iter_located
    from ..lookup import Lookup, parse, plain_text

    for where, doc in iter_located(path):
        # strict: a malformed call in a corpus the KB is built from is an error, not text
        segments = parse(doc.annotated, strict=True, source=where).segments
        calls = [s for s in segments if isinstance(s, Lookup)]
        for lk, pos in zip(calls, plain_text(segments)[1]):
            try:
                yield fact_of(Triple(lk.entity, lk.relation, lk.value, doc.id, pos))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{where}: {e}") from None


def _write_corpus(records: Iterable[TripleRecord], path: Path) -> int:
    from ..corpus import Document, write_documents
    from ..lookup import Lookup, Text

    docs: dict[str, list[tuple[int, TripleRecord]]] = defaultdict(list)
    n = 0
    for record in records:
        n += 1
        for doc, pos in dict.fromkeys(record.sources) or [(UNSOURCED_DOC, None)]:
            docs[doc].append((-1 if pos is None else pos, record))

    def documents():
        for doc, facts in docs.items():
            segments = []
            for _, r in sorted(facts, key=lambda x: (x[0], x[1].id)):
                segments += [Text(f"{r.entity}, {r.relation}: "), Lookup(r.entity, r.relation, r.value),
                             Text(f" {r.value}.\n")]
            yield Document.from_segments(doc, segments, source="kb")

    write_documents(path, documents())
    return n


def read_aliases(path: str | Path) -> list[tuple[str, str]]:
    """``(alias, entity)`` pairs from JSON lines with ``alias`` and ``entity`` (as ``lmlm world`` and
    ``lmlm annotate wikipedia`` write ``aliases.jsonl``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no alias file at {path}")
    out = []
    with path.open(encoding="utf-8-sig") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append((str(row["alias"]), str(row["entity"])))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not an alias line with 'alias' and 'entity' ({e})") from None
    if not out:
        raise ValueError(f"{path}: no aliases in it (one {{alias, entity}} per line)")
    return out


# -- the authors' released database --------------------------------------------------------------------------

AUTHORS_FIELDS = ("entities", "relationships", "return_values", "triplets")
AUTHORS_MARKER = "authors_source.json"  # written into a KB folder built by lmlm.kb.build.open_authors_json
_ESCAPED_QUOTE = re.compile(r"\\(['\"])")
_SCALARS = frozenset({"string", "number", "boolean", "null"})
_ITEM, _FIELD = "triplets.item", "triplets.item.item"


def iter_authors_json(path: str | Path) -> Iterator[Triple]:
    """The well-formed triplets of an authors' database file, streamed (malformed ones are skipped).

    Does not check the file's other lists: :func:`scan_authors_json` does, in its own pass.
    """
    from ..errors import need

    ijson = need("ijson", "authors", "reading the authors' database JSON")

    path = Path(path)
    with open(path, "rb") as f:
        for item in ijson.items(f, _ITEM, use_float=True):
            t = _triple(item, path.name)
            if t is not None:
                yield t


def scan_authors_json(path: str | Path) -> tuple[int, int]:
    """``(well-formed, malformed)`` triplet counts of an authors' database file, in one streamed pass.

    Raises:
        ValueError: the file is not JSON, or not an object holding the four lists.
    """
    path = Path(path)
    stat = path.stat()
    return _scan(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _scan(path: str, size: int, mtime_ns: int) -> tuple[int, int]:
    """:func:`scan_authors_json` of one version of a file (cached: an import reads the counts twice)."""
    from ..errors import need

    ijson = need("ijson", "authors", "reading the authors' database JSON")

    keys: set[str] = set()
    good = bad = fields = 0
    nested = False
    with open(path, "rb") as f:
        events = ijson.parse(f, use_float=True)
        try:
            first = next(events, None)
            if first is None or first[1] != "start_map":
                raise _not_authors(path)
            for prefix, event, value in events:
                if prefix == _FIELD:  # one field of a triplet
                    if event in _SCALARS:
                        fields += 1
                    elif event in ("start_map", "start_array"):
                        nested = True
                elif prefix == _ITEM:
                    if event == "start_array":
                        fields, nested = 0, False
                    elif event == "end_array":
                        ok = fields == 3 and not nested
                        good, bad = good + ok, bad + (not ok)
                    elif event in _SCALARS or event == "start_map":  # a triplet that is not a list
                        bad += 1
                elif prefix == "" and event == "map_key":
                    keys.add(value)
        except ijson.JSONError as e:
            raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not keys.issuperset(AUTHORS_FIELDS):
        raise _not_authors(path)
    return good, bad


def _not_authors(path: str) -> ValueError:
    return ValueError(f"{path} is not an authors' database: a JSON object with {', '.join(AUTHORS_FIELDS)} "
                      "lists is expected")


def _triple(item, source: str) -> Triple | None:
    """A triplet as a :class:`Triple`, or None when it is not three non-empty scalar fields."""
    if not isinstance(item, list) or len(item) != 3 or any(isinstance(x, (list, dict)) for x in item):
        return None
    try:
        e, r, v = (_unescape(str(x)).strip() for x in item)
        return Triple(e, r, v, source=source)
    except (ValueError, TypeError):
        return None


def _unescape(text: str) -> str:
    return _ESCAPED_QUOTE.sub(r"\1", text) if "\\" in text else text


def read_authors_json(path: str | Path) -> tuple[list[Triple], int]:
    """The triples of an authors' database file, and how many triplets were skipped as malformed.

    Holds every triple in memory: for large files use :func:`lmlm.kb.build.import_authors_json`, which streams.
    """
    good, bad = scan_authors_json(path)
    triples = list(iter_authors_json(path))
    return triples, bad + good - len(triples)
