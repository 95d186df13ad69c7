"""The authors' released database format, read as a stream (a reader only: the KB side is
:func:`lmlm.kb.build.import_authors_json` and :func:`lmlm.kb.build.open_authors_json`).

The LMLM authors release each database as one JSON object with four lists: ``entities``,
``relationships``, ``return_values`` and ``triplets`` (each triplet an ``[entity, relation, value]``
list; the first three lists only repeat what the triplets hold). Their fields keep the backslash of
quotes escaped during annotation (``Destiny\\'s Child``); it is removed here.

The paper's database holds 54.6M triplets, far more than one ``json.load`` can hold in memory, so
the file is read with a streaming JSON parser (``ijson``): one pass checks the four lists and counts
the triplets (for the progress bar), a second adds them by chunks through
:func:`lmlm.kb.ingest.add_file`, each chunk one version that also records how far the import got.
Memory stays flat whatever the file's size, and an interrupted import run again goes on from its
last chunk without adding anything twice.

Exercised by ``lmlm generate --kb DATABASE.json``, ``lmlm kb import DATABASE.json`` and
``lmlm bench authors``.

Examples:
    >>> from lmlm.kb import import_authors_json
    >>> kb = import_authors_json("squad-eval100-Annotator_database.json", "squad-kb")
    >>> kb.lookup("Beyoncé", "Spouse").value
    'Jay Z'
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Iterator

from .records import Triple

__all__ = ["AUTHORS_FIELDS", "read_authors_json", "iter_authors_json", "scan_authors_json", "AUTHORS_MARKER"]

AUTHORS_FIELDS = ("entities", "relationships", "return_values", "triplets")
AUTHORS_MARKER = "authors_source.json"  # written into a KB folder built by lmlm.kb.build.open_authors_json
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
