"""Building a knowledge base from a large file, resumably: ``lmlm kb build``.

The file's facts go in by chunks (:func:`add_file`, also used to import the authors' database),
each chunk one version (op ``import``) whose transaction also records how far the build got (meta
entry ``build:<file>:<size>:<mtime>``). A killed build leaves
the KB at its last complete chunk; running the same build again skips what is in and goes on.
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
from .encoder import Encoder
from .index import AnnConfig

__all__ = ["build", "add_file"]


def build(path: str | Path, source: str | Path, format: str | None = None, chunk_size: int = 100_000,
          who: str = "lmlm", why: str = "build", embed: bool = True, encoder: Encoder | str | None = None,
          ann: AnnConfig | None = None, progress: bool | None = None) -> KnowledgeBase:
    """Create (or resume) the KB at ``path`` from the facts in ``source``; returns it open.

    Args:
        path: the KB folder (created if new; an existing KB is added to).
        source: a file of triples or an annotated corpus (see :mod:`lmlm.kb.formats`).
        format (str, optional): the file's format, told from the file by default.
        chunk_size (int, default 100_000): facts per version; a crash loses at most one chunk.
        embed (bool, default True): embed every key at the end (else the first fuzzy lookup does).
        progress (bool, optional): progress bars (default: for files of ``PROGRESS_MIN`` facts or more).
    """
    if not Path(source).is_file():
        raise FileNotFoundError(f"no file to import at {source}")
    kb = KnowledgeBase.create(path, exist_ok=True, encoder=encoder, ann=ann)
    n = add_file(kb, source, format, chunk_size=chunk_size, who=who, why=why, progress=progress)
    if embed:
        show = n >= PROGRESS_MIN if progress is None else progress
        kb.embed(progress=show or None)
    return kb


def add_file(kb: KnowledgeBase, source: str | Path, format: str | None = None, chunk_size: int = 100_000,
             who: str = "lmlm", why: str = "build", progress: bool | None = None) -> int:
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
    stat = source.stat()
    mark = f"build:{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    done = int(kb.store.meta().get(mark, 0))
    show = (total or 0) >= PROGRESS_MIN if progress is None else progress
    it = islice(facts, done, None)  # a resumed build reads past what is already in
    with tqdm(total=total, initial=done, desc=f"adding {source.name}", unit="triple", disable=not show,
              dynamic_ncols=True) as bar:
        while chunk := list(islice(it, chunk_size)):
            end = done + len(chunk)
            kb.store.write_facts(chunk, "import", who, f"{why}: {source.name} facts {done + 1}-{end}",
                                 batch_size=1000, meta={mark: str(end)})
            done = end
            bar.update(len(chunk))
    return done
