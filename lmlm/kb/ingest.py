"""Adding a file's facts to a knowledge base by chunks, resumably and once: the core of
``lmlm kb build``, ``lmlm kb import`` and the authors' database import (see :mod:`lmlm.kb.build`).

Each chunk is one version whose transaction also records how far the file got (meta entry
``build:<fingerprint>``); running the same call again skips what is in, and the same content
under another name adds nothing.
"""

from __future__ import annotations

import json
import time
from itertools import islice
from pathlib import Path

from . import formats
from ..memory import gc_paused
from .records import check_who

__all__ = ["add_file", "file_hashes", "fingerprint", "head_sha256", "PROGRESS_MIN"]

_BLOCK = 1 << 22


PROGRESS_MIN = 5000  # show progress bars for writes or embeddings of at least this many items


def fingerprint(path: str | Path) -> str:
    """Who a file (or a ``datasets`` folder) is, under any name or time stamp: a SHA-256 of its whole
    content (about a second per GB), so a file edited anywhere, even to the same size, is another file."""
    return file_hashes(Path(path))[0]


def file_hashes(path: Path) -> tuple[str, str | None]:
    """``path``'s fingerprint and, for a file, the SHA-256 of its content (what :func:`head_sha256`
    gives for its whole size), from one read."""
    import hashlib

    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h, whole = hashlib.sha256(), None if path.is_dir() else hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(path) if path.is_dir() else ''}:{f.stat().st_size}:".encode())
        with open(f, "rb") as fh:
            while block := fh.read(_BLOCK):
                h.update(block)
                if whole is not None:
                    whole.update(block)
    return h.hexdigest()[:32], whole and whole.hexdigest()


def head_sha256(path: Path, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``path``."""
    import hashlib

    h, left = hashlib.sha256(), size
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(left, _BLOCK))):
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def _stamp(path: Path) -> tuple[int, int] | None:
    """A file's size and modification time, to tell whether it was written to in between."""
    st = path.stat()
    return (st.st_size, st.st_mtime_ns) if path.is_file() else None


def _grew(path: Path, before: dict) -> bool:
    """Whether ``path`` is the file imported whole before (``before``: its size, hash, facts) with bytes
    added at its end: the facts it held then are in, and only the lines after them are new."""
    return (path.is_file() and path.stat().st_size > before["bytes"]
            and head_sha256(path, before["bytes"]) == before["sha256"])


def add_file(kb, source: str | Path, format: str | None = None, chunk_size: int = 100_000,
             who: str = "lmlm", why: str = "build", progress: bool | None = None, batch_size: int = 1000,
             hashes: tuple[str, str | None] | None = None) -> int:
    """Add the facts of ``source`` to ``kb`` (a :class:`~lmlm.kb.KnowledgeBase`) by chunks, resumably; returns how many facts the file holds.

    Each chunk is one version whose transaction also records how far the file got (see the module),
    so running the same call again after a crash skips what is in and adds the rest, nothing twice.
    Facts are streamed from the file and written straight to the store: memory stays flat however
    large the file (the KB's in-memory key table catches up at its next lookup, or at ``kb.embed()``).
    Other writers wait at most one chunk: ``kb.last_import`` says how many chunks this call wrote and
    the longest time one of them held the write lock (``longest_lock_seconds``). ``hashes``: the file's
    ``(fingerprint, sha256)`` where the caller read them already (the file is read once for them).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    who, why = check_who(who, why)
    from tqdm.auto import tqdm

    source = Path(source)
    facts, total = formats.read(source, format)
    read = _stamp(source)
    fp, sha = hashes or file_hashes(source)
    mark, here = f"build:{fp}", f"import:{source.resolve()}"
    meta = kb.store.meta()
    done, before = int(meta.get(mark, 0)), json.loads(meta.get(here, "null"))
    grew = not done and before and _grew(source, before)
    if grew:
        done = before["facts"]  # lines added at the end of a file imported whole: only they are new
    recount = not before or grew  # a changed file read again: its unchanged sourceless facts were counted
    show = (total or 0) >= PROGRESS_MIN if progress is None else progress
    it = islice(facts, done, None)  # a resumed build reads past what is already in
    chunks, longest = 0, 0.0
    with gc_paused(), tqdm(total=total, initial=done, desc=f"adding {source.name}", unit="triple",
                           disable=not show, dynamic_ncols=True) as bar:
        while chunk := list(islice(it, chunk_size)):
            end = done + len(chunk)
            t = time.perf_counter()
            kb.store.write_facts(chunk, "import", who, f"{why}: {source.name} facts {done + 1}-{end}",
                                 batch_size=batch_size, meta={mark: str(end)}, recount=recount)
            chunks, longest = chunks + 1, max(longest, time.perf_counter() - t)
            done = end
            bar.update(len(chunk))
            bar.set_postfix(lock_s=f"{longest:.2f}")
    kb.last_import = {"source": str(source), "facts": done, "chunks": chunks,
                      "longest_lock_seconds": round(longest, 3)}
    if (format or formats.detect_format(source)) == "authors":  # the release's format skips bad triplets: count them
        from .formats import scan_authors_json

        kb.last_import["skipped"] = sum(scan_authors_json(source)) - done
    if source.is_file() and done:  # what this path held when whole, to tell a file grown by appends
        size = source.stat().st_size
        if sha is None or _stamp(source) != read:  # written to since it was hashed: hash what it holds now
            sha = head_sha256(source, size)
        kb.store.set_meta({here: json.dumps({"bytes": size, "sha256": sha, "facts": done})})
    if done == 0:
        if (format or formats.detect_format(source)) == "corpus":
            raise ValueError(f"{source}: its documents hold no lookup call, so no fact to build a KB from: "
                             "annotate them first (lmlm annotate ...)")
        raise ValueError(f"{source}: no facts in it (triples, an annotated corpus or the authors' JSON)")
    return done
