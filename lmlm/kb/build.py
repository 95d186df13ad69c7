"""Building a knowledge base from a large file, resumably: ``lmlm kb build``.

The file's facts go in by chunks, each chunk one version (op ``import``) whose transaction also
records how far the build got (meta entry ``build:<file>:<size>:<mtime>``). A killed build leaves
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
from .base import PROGRESS_MIN, KnowledgeBase
from .encoder import Encoder
from .index import AnnConfig

__all__ = ["build"]


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
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    from tqdm.auto import tqdm

    source = Path(source)
    facts, total = formats.read(source, format)
    kb = KnowledgeBase.create(path, exist_ok=True, encoder=encoder, ann=ann)
    stat = source.stat()
    mark = f"build:{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    done = int(kb.store.meta().get(mark, 0))
    show = (total or 0) >= PROGRESS_MIN if progress is None else progress
    it = islice(facts, done, None)  # a resumed build reads past what is already in
    with tqdm(total=total, initial=done, desc=f"building from {source.name}", unit="triple", disable=not show) as bar:
        while chunk := list(islice(it, chunk_size)):
            end = done + len(chunk)
            kb._write(chunk, "import", who, f"{why}: {source.name} facts {done + 1}-{end}", batch_size=1000,
                      progress=False, total=None, embed=False, meta={mark: str(end)})
            done = end
            bar.update(len(chunk))
    if embed:
        kb.embed(progress=show or None)
    return kb
