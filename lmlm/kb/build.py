"""Building a knowledge base from a large file, resumably: ``lmlm kb build``.

The file's facts go in by chunks (:func:`lmlm.kb.ingest.add_file`, shared with ``lmlm kb import``
and the authors' database import below),
each chunk one version (op ``import``) whose transaction also records how far the build got (meta
entry ``build:<fingerprint>``, a hash of the file's whole content). A killed
build leaves the KB at its last complete chunk; running the same build again skips what is in and
goes on, and importing the same content again (under any name) adds nothing. Other writers get the
lock between chunks.
Then every key is embedded, with the index saved every 65,536 keys, so that part resumes too.

Examples:
    >>> kb = build("people-kb", "triples.jsonl", chunk_size=100_000)
    >>> kb.stats()["versions"]
    3
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..jsonio import write_json
from .formats import AUTHORS_MARKER, scan_authors_json
from .ingest import PROGRESS_MIN, add_file, file_hashes, fingerprint
from .knowledge_base import KnowledgeBase
from .store import KBError
from .encoder import Encoder
from .index import AnnConfig

__all__ = ["build", "add_file", "fingerprint", "import_authors_json", "open_authors_json"]

def build(path: str | Path, source: str | Path, format: str | None = None, chunk_size: int = 100_000,
          who: str = "lmlm", why: str = "build", embed: bool = True, encoder: Encoder | str | None = None,
          ann: AnnConfig | None = None, progress: bool | None = None, append: bool = False) -> KnowledgeBase:
    """Create (or resume) the KB at ``path`` from the facts in ``source``; returns it open.

    Args:
        path: the KB folder (created if new; an existing KB is added to).
        source: a file of triples or an annotated corpus (see :mod:`lmlm.kb.formats`).
        format (str, optional): the file's format, told from the file by default.
        chunk_size (int, default 100_000): facts per version; a crash loses at most one chunk.
        embed (bool, default True): embed every key at the end (else the first fuzzy lookup does).
        progress (bool, optional): progress bars (default: for files of ``PROGRESS_MIN`` facts or more).
        append (bool, default False): add ``source`` to a KB that already holds facts from other
            data; without it that is refused (a build resumes or repeats, it never merges silently).
    """
    if not Path(source).is_file():
        raise FileNotFoundError(f"no file to import at {source}")
    kb = KnowledgeBase.create(path, exist_ok=True, encoder=encoder, ann=ann)
    hashes = file_hashes(Path(source))  # read once: the check below, the resume mark and the append record
    if not append and kb.version > 0 and f"build:{hashes[0]}" not in kb.store.meta():
        n, v = len(kb), kb.version
        kb.close()
        raise KBError(f"{path} already holds a KB ({n} facts, version {v}) built from other data than "
                      f"{Path(source).name}: `lmlm kb import` adds a file to it, --append builds on it, or give "
                      "a new folder")
    n = add_file(kb, source, format, chunk_size=chunk_size, who=who, why=why, progress=progress, hashes=hashes)
    if embed:
        show = n >= PROGRESS_MIN if progress is None else progress
        kb.embed(progress=show or None)
    return kb


# -- the authors' released database -------------------------------------------------------------

def import_authors_json(path: str | Path, kb: KnowledgeBase | str | Path, who: str = "lmlm",
                        chunk_size: int = 100_000, progress: bool | None = None) -> KnowledgeBase:
    """Add the triplets of an authors' database file to ``kb`` (a KB, or a folder to create or resume).

    Streamed by chunks of ``chunk_size`` triplets, one version each; the same call after an
    interruption adds only what is missing. ``progress``: a progress bar (default: for large files).
    """
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
    marker = kb_dir / AUTHORS_MARKER
    seen = json.loads(marker.read_text()) if marker.exists() else None
    if seen == stamp:
        return KnowledgeBase.open(kb_dir)
    if seen is not None and seen != partial:
        shutil.rmtree(kb_dir)  # built by us from an older copy of the file
    elif seen is None and kb_dir.exists() and any(kb_dir.iterdir()):
        raise FileExistsError(f"{kb_dir} exists and was not built from {path.name}; pass another kb_dir")
    kb = KnowledgeBase.open(kb_dir) if seen == partial else KnowledgeBase.create(kb_dir)
    write_json(marker, partial)
    import_authors_json(path, kb, progress=progress, chunk_size=chunk_size)
    write_json(marker, stamp)
    return kb
