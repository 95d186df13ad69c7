"""The authors' released database format, read into a :class:`KnowledgeBase` as a stream.

The LMLM authors release each database as one JSON object with four lists: ``entities``,
``relationships``, ``return_values`` and ``triplets`` (each triplet an ``[entity, relation, value]``
list; the first three lists only repeat what the triplets hold). Their fields keep the backslash of
quotes escaped during annotation (``Destiny\\'s Child``); it is removed here.

The paper's database holds 54.6M triplets, far more than one ``json.load`` can hold in memory, so
the file is read with a streaming JSON parser (``ijson``): one pass checks the four lists and counts
the triplets (for the progress bar), a second adds them by chunks through
:func:`lmlm.kb.build.add_file`, each chunk one version that also records how far the import got.
Memory stays flat whatever the file's size, and an interrupted import run again goes on from its
last chunk without adding anything twice.

Exercised by ``lmlm generate --kb DATABASE.json``, ``lmlm kb import DATABASE.json`` and
``lmlm bench authors``.

Examples:
    >>> kb = import_authors_json("squad-eval100-Annotator_database.json", "squad-kb")
    >>> kb.lookup("Beyoncé", "Spouse").value
    'Jay Z'
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path
from typing import Iterator

from .base import KnowledgeBase
from .records import Triple

__all__ = ["AUTHORS_FIELDS", "read_authors_json", "iter_authors_json", "scan_authors_json", "import_authors_json",
           "open_authors_json"]

AUTHORS_FIELDS = ("entities", "relationships", "return_values", "triplets")
_MARKER = "authors_source.json"  # written into a KB folder built by open_authors_json
_ESCAPED_QUOTE = re.compile(r"\\(['\"])")
_SCALARS = frozenset({"string", "number", "boolean", "null"})
_ITEM, _FIELD = "triplets.item", "triplets.item.item"


def iter_authors_json(path: str | Path) -> Iterator[Triple]:
    """The well-formed triplets of an authors' database file, streamed (malformed ones are skipped).

    Does not check the file's other lists: :func:`scan_authors_json` does, in its own pass.
    """
    import ijson

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
    import ijson

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
        e, r, v = (_ESCAPED_QUOTE.sub(r"\1", str(x)).strip() for x in item)
        return Triple(e, r, v, source=source)
    except (ValueError, TypeError):
        return None


def read_authors_json(path: str | Path) -> tuple[list[Triple], int]:
    """The triples of an authors' database file, and how many triplets were skipped as malformed.

    Holds every triple in memory: for large files use :func:`import_authors_json`, which streams.
    """
    good, bad = scan_authors_json(path)
    triples = list(iter_authors_json(path))
    return triples, bad + good - len(triples)


def import_authors_json(path: str | Path, kb: KnowledgeBase | str | Path, who: str = "lmlm",
                        chunk_size: int = 100_000, progress: bool | None = None) -> KnowledgeBase:
    """Add the triplets of an authors' database file to ``kb`` (a KB, or a folder to create or resume).

    Streamed by chunks of ``chunk_size`` triplets, one version each; the same call after an
    interruption adds only what is missing. ``progress``: a progress bar (default: for large files).
    """
    from .build import add_file

    path = Path(path)
    good, bad = scan_authors_json(path)
    if not isinstance(kb, KnowledgeBase):
        kb = KnowledgeBase.create(kb, exist_ok=True)
    add_file(kb, path, "authors", chunk_size=chunk_size, who=who, progress=progress,
             why=f"import of {path.name} ({good} triplets, {bad} malformed skipped)")
    return kb


def open_authors_json(path: str | Path, kb_dir: str | Path | None = None, progress: bool | None = None,
                      chunk_size: int = 100_000) -> KnowledgeBase:
    """A KB holding an authors' database file, imported once into ``kb_dir`` and reused after.

    ``kb_dir`` defaults to ``NAME.kb`` beside the file; it is rebuilt when the file changes (size or
    modification time), and an import cut short is finished by the next call. A folder that holds
    something else is never touched.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no database file at {path}")
    kb_dir = Path(kb_dir) if kb_dir is not None else path.with_name(path.stem + ".kb")
    stat = path.stat()
    stamp = {"file": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    partial = {**stamp, "partial": True}  # written before the import, replaced by ``stamp`` after it
    marker = kb_dir / _MARKER
    seen = json.loads(marker.read_text()) if marker.exists() else None
    if seen == stamp:
        return KnowledgeBase.open(kb_dir)
    if seen is not None and seen != partial:
        shutil.rmtree(kb_dir)  # built by us from an older copy of the file
    elif seen is None and kb_dir.exists() and any(kb_dir.iterdir()):
        raise FileExistsError(f"{kb_dir} exists and was not built from {path.name}; pass another kb_dir")
    kb = KnowledgeBase.open(kb_dir) if seen == partial else KnowledgeBase.create(kb_dir)
    marker.write_text(json.dumps(partial) + "\n")
    import_authors_json(path, kb, progress=progress, chunk_size=chunk_size)
    marker.write_text(json.dumps(stamp) + "\n")
    return kb
