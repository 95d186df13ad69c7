"""The authors' released database format, read into a :class:`KnowledgeBase`.

The LMLM authors release each database as one JSON object with four lists: ``entities``,
``relationships``, ``return_values`` and ``triplets`` (each triplet an ``[entity, relation, value]``
list; the first three lists only repeat what the triplets hold). Their fields keep the backslash of
quotes escaped during annotation (``Destiny\\'s Child``); it is removed here.

Exercised by ``lmlm generate --kb DATABASE.json``.

Examples:
    >>> kb = import_authors_json("squad-eval100-Annotator_database.json", "squad-kb")
    >>> kb.lookup("Beyoncé", "Spouse").value
    'Jay Z'
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from .base import KnowledgeBase
from .records import Triple

__all__ = ["AUTHORS_FIELDS", "read_authors_json", "import_authors_json", "open_authors_json"]

AUTHORS_FIELDS = ("entities", "relationships", "return_values", "triplets")
_MARKER = "authors_source.json"  # written into a KB folder built by open_authors_json
_ESCAPED_QUOTE = re.compile(r"\\(['\"])")


def read_authors_json(path: str | Path) -> tuple[list[Triple], int]:
    """The triples of an authors' database file, and how many triplets were skipped as malformed."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(k in data for k in AUTHORS_FIELDS):
        raise ValueError(f"{path} is not an authors' database: a JSON object with {', '.join(AUTHORS_FIELDS)} "
                         "lists is expected")
    triples, skipped = [], 0
    for item in data["triplets"]:
        try:
            if not isinstance(item, (list, tuple)) or len(item) != 3:
                raise ValueError(f"not an [entity, relation, value] list: {item!r}")
            e, r, v = (_ESCAPED_QUOTE.sub(r"\1", str(x)).strip() for x in item)
            triples.append(Triple(e, r, v, source=path.name))
        except (ValueError, TypeError):
            skipped += 1
    return triples, skipped


def import_authors_json(path: str | Path, kb: KnowledgeBase | str | Path, who: str = "lmlm") -> KnowledgeBase:
    """Add the triplets of an authors' database file to ``kb`` (a KB, or a folder to create) as one version."""
    path = Path(path)
    triples, skipped = read_authors_json(path)
    if not isinstance(kb, KnowledgeBase):
        kb = KnowledgeBase.create(kb, exist_ok=True)
    kb.add(triples, who=who, why=f"import of {path.name}: {len(triples)} triplets, {skipped} malformed skipped")
    return kb


def open_authors_json(path: str | Path, kb_dir: str | Path | None = None) -> KnowledgeBase:
    """A KB holding an authors' database file, imported once into ``kb_dir`` and reused after.

    ``kb_dir`` defaults to ``NAME.kb`` beside the file; it is rebuilt when the file changes (size or
    modification time). A folder that holds something else is never touched.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no database file at {path}")
    kb_dir = Path(kb_dir) if kb_dir is not None else path.with_name(path.stem + ".kb")
    stat = path.stat()
    stamp = {"file": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    marker = kb_dir / _MARKER
    if marker.exists():
        if json.loads(marker.read_text()) == stamp:
            return KnowledgeBase.open(kb_dir)
        shutil.rmtree(kb_dir)  # built by us from an older copy of the file
    elif kb_dir.exists() and any(kb_dir.iterdir()):
        raise FileExistsError(f"{kb_dir} exists and was not built from {path.name}; pass another kb_dir")
    kb = import_authors_json(path, kb_dir)
    marker.write_text(json.dumps(stamp) + "\n")
    return kb
