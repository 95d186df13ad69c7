"""Building a knowledge base from a large file, resumably: ``lmlm kb build``.

The file's facts go in by chunks (:func:`add_file`, also used to import the authors' database),
each chunk one version (op ``import``) whose transaction also records how far the build got (meta
entry ``build:<fingerprint>``, the file's size and a hash of its first and last megabytes). A killed
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

from itertools import islice
from pathlib import Path

from . import formats
from .base import PROGRESS_MIN, KnowledgeBase, _check_who
from .store import KBError
from .encoder import Encoder
from .index import AnnConfig

__all__ = ["build", "add_file", "fingerprint"]

_PROBE = 1 << 20


def fingerprint(path: str | Path) -> str:
    """Who a file (or a ``datasets`` folder) is, cheaply: its size and a SHA-256 of its first and last
    megabyte, so a multi-GB file is recognised in milliseconds, under any name or time stamp."""
    import hashlib

    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if path.is_dir() else ''}:{size}:".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_PROBE))
            if size > 2 * _PROBE:
                fh.seek(size - _PROBE)
                h.update(fh.read(_PROBE))
            elif size > _PROBE:
                h.update(fh.read())
    return h.hexdigest()[:32]


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
    if not append and kb.version > 0 and f"build:{fingerprint(source)}" not in kb.store.meta():
        n, v = len(kb), kb.version
        kb.close()
        raise KBError(f"{path} already holds a KB ({n} facts, version {v}) built from other data than "
                      f"{Path(source).name}: `lmlm kb import` adds a file to it, --append builds on it, or give "
                      "a new folder")
    n = add_file(kb, source, format, chunk_size=chunk_size, who=who, why=why, progress=progress)
    if embed:
        show = n >= PROGRESS_MIN if progress is None else progress
        kb.embed(progress=show or None)
    return kb


def add_file(kb: KnowledgeBase, source: str | Path, format: str | None = None, chunk_size: int = 100_000,
             who: str = "lmlm", why: str = "build", progress: bool | None = None, batch_size: int = 1000) -> int:
    """Add the facts of ``source`` to ``kb`` by chunks, resumably; returns how many facts the file holds.

    Each chunk is one version whose transaction also records how far the file got (see the module),
    so running the same call again after a crash skips what is in and adds the rest, nothing twice.
    Facts are streamed from the file and written straight to the store: memory stays flat however
    large the file (the KB's in-memory key table catches up at its next lookup, or at ``kb.embed()``).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    _check_who(who, why)
    from tqdm.auto import tqdm

    source = Path(source)
    facts, total = formats.read(source, format)
    mark = f"build:{fingerprint(source)}"
    done = int(kb.store.meta().get(mark, 0))
    show = (total or 0) >= PROGRESS_MIN if progress is None else progress
    it = islice(facts, done, None)  # a resumed build reads past what is already in
    with tqdm(total=total, initial=done, desc=f"adding {source.name}", unit="triple", disable=not show,
              dynamic_ncols=True) as bar:
        while chunk := list(islice(it, chunk_size)):
            end = done + len(chunk)
            kb.store.write_facts(chunk, "import", who, f"{why}: {source.name} facts {done + 1}-{end}",
                                 batch_size=batch_size, meta={mark: str(end)})
            done = end
            bar.update(len(chunk))
    if done == 0:
        raise ValueError(f"{source}: no facts in it (triples, an annotated corpus or the authors' JSON)")
    return done
