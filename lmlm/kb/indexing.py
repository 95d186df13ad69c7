"""Keeping a knowledge base's key index in step with its store: embed, save, load, catch up.

:class:`KeyIndexing` is mixed into :class:`lmlm.kb.KnowledgeBase`. The index file
(``index.faiss``) records the store version it reflects; a reader that finds it older replays the
changes since from the store (dead keys out, returning keys back in, new keys embedded), so the
file only ever spares work and is never trusted over the store. Long embedding runs save the index
every ``_CHECKPOINT`` keys (still marked with the old version), so a killed run resumes. Removals
alone never rewrite a large file. Exercised by ``lmlm kb build`` and every fuzzy lookup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .index import VectorKeyIndex, load_index, read_header, save_index
from .keys import key_text
from .store import KBError

__all__ = ["INDEX_FILENAME", "PROGRESS_MIN", "KeyIndexing"]

INDEX_FILENAME = "index.faiss"
PROGRESS_MIN = 5000  # show progress bars for writes or embeddings of at least this many items
_ADOPT_MIN = 1000  # keys to embed above which a newer saved index is read instead
_SAVE_MIN = 1000  # vectors embedded since the last save above which the index file is rewritten
_SMALL_INDEX = 50_000  # stored vectors up to which every change is saved (the file is small)
_EMBED_CHUNK = 8192  # keys per encoder call when embedding many keys
_CHECKPOINT = 65_536  # keys embedded between index saves of a long embedding run (resumable)
_SAMPLE = 65_536  # vectors a large index's structure is trained on before the first row goes in


def sorted_minus(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """The values of ``a`` not in ``b``, both ascending and without repeats, a chunk of ``a`` at a
    time: ``np.setdiff1d`` sorts copies of both, several GB at 5 x 10^7 key ids.

    Examples:
        >>> sorted_minus(np.array([1, 3, 5, 7]), np.array([3, 4, 7])).tolist()
        [1, 5]
    """
    if not len(b):
        return a.copy()
    parts = [a[:0]]
    for i in range(0, len(a), chunk):
        part = a[i:i + chunk]
        at = np.minimum(np.searchsorted(b, part), len(b) - 1)
        parts.append(part[b[at] != part])
    return np.concatenate(parts)


class KeyIndexing:
    """The key-index half of a KnowledgeBase; expects its ``store``, ``_lock``, ``_version``,
    ``_map``, ``encoder``, ``encoder_name``, ``ann_config`` and ``path``."""

    def _sync_index(self, progress: bool | None = None) -> VectorKeyIndex:
        """Bring the index to ``self._version``: dead keys out, returning keys back in, new keys embedded."""
        index_path = self.path / INDEX_FILENAME
        if self._index is None:
            self._load_saved_index(index_path)
            if self._index is None:
                self._index, self._index_version = VectorKeyIndex(self.encoder.dim, self.ann_config), 0
        if self._index_version != self._version:
            stale, new = self._index_delta()
            if len(new) >= _ADOPT_MIN:  # the process that added them may have saved an index holding them
                header = read_header(index_path)
                if header and self._index_version < header.get("version", -1) <= self._version \
                        and self._load_saved_index(index_path):
                    stale, new = self._index_delta()
            index = self._index
            missing = index.restore(new)
            self._unsaved += len(new) - len(missing)
            self._dirty |= bool(index.remove(stale) or new)
            if missing:
                self._embed_keys(missing, progress)
            self._index_version = self._version
            if missing:  # a catch-up (after a killed write, or keys added unembedded) is saved at once
                self._index.settle(progress)
                self._maybe_save(quiet=True)
        self._index.settle(progress)
        return self._index

    def _put_rows(self, key_ids: np.ndarray, vectors: np.ndarray) -> None:
        """Store vectors in the index (its structure catches up at the next settle) as unsaved work."""
        self._index.add(key_ids, vectors, build=False)
        self._unsaved += len(key_ids)
        self._dirty = True

    def _index_delta(self) -> tuple[list[int], list[int]]:
        """(key ids to take out of the index, key ids to put in) to reach ``self._version``."""
        index = self._index
        if self._index_version == 0:  # built from nothing: compare with every active key
            alive, held = self._map.id_array(), index.live_ids()
            return sorted_minus(held, alive).tolist(), sorted_minus(alive, held).tolist()
        touched = self.store.changed_keys(self._index_version, self._version)
        alive = self._map.active_among(touched)
        return ([k for k in touched if k in index and k not in alive],
                [k for k in touched if k in alive and k not in index])

    def _embed_keys(self, key_ids: Sequence[int], progress: bool | None = None) -> None:
        """Embed ``key_ids`` in chunks; a long run saves the index now and then, so a killed run resumes.

        When the index will hold at least ``ivf_min`` keys, the first ``_SAMPLE`` vectors (at most
        ``ivf_min``) train the structure for that size before any row goes in
        (:meth:`VectorKeyIndex.prepare`), so each chunk is stored as the index keeps it (PQ codes
        above ``pq_min``), never all of them as floats.
        """
        from tqdm.auto import tqdm

        key_ids = list(key_ids)
        expected = len(self._index) + len(key_ids)
        big = expected >= self.ann_config.ivf_min
        show = len(key_ids) >= PROGRESS_MIN if progress is None else progress
        since_save, held = 0, []  # held: encoded chunks waiting for the structure's training sample
        prepared = not big
        with tqdm(total=len(key_ids), desc="embedding KB keys", unit="key", disable=not show) as bar:
            for i in range(0, len(key_ids), _EMBED_CHUNK):
                chunk = self.store.key_texts(key_ids[i:i + _EMBED_CHUNK])
                vectors = self.encoder.encode([key_text(e, r) for _, e, r in chunk], cache=False)
                held.append((np.array([k for k, _, _ in chunk], dtype=np.int64), vectors))
                bar.update(len(chunk))
                last = i + _EMBED_CHUNK >= len(key_ids)
                if not prepared:
                    if sum(len(ids) for ids, _ in held) < min(_SAMPLE, self.ann_config.ivf_min) and not last:
                        continue
                    self._index.prepare(np.concatenate([v for _, v in held]), expected)
                    prepared = True
                for ids, vecs in held:
                    self._put_rows(ids, vecs)
                    since_save += len(ids)
                held = []
                if since_save >= _CHECKPOINT and not last:
                    self._index.settle(progress=False)
                    self._save_index(quiet=True)  # still at the old version: a reader embeds only the rest
                    since_save = 0

    def _load_saved_index(self, index_path: Path) -> bool:
        """Adopt the saved index if it was built with our encoder and is not ahead of our dict."""
        header = read_header(index_path)
        if not self._usable(header):
            return False
        loaded = load_index(index_path)
        if loaded is None:
            return False
        index, header = loaded
        if not self._usable(header):
            return False
        index.config = self.ann_config
        self._index, self._index_version, self._unsaved, self._dirty = index, int(header["version"]), 0, False
        return True

    def _usable(self, header: dict | None) -> bool:
        """An index file made with our encoder, at a version our dict has reached."""
        return bool(header) and header.get("encoder") == self.encoder_name and \
            0 <= header.get("version", -1) <= self._version

    def _save_index(self, quiet: bool = False) -> None:
        index_path = self.path / INDEX_FILENAME
        header = read_header(index_path)
        if header and header.get("encoder") == self.encoder_name and \
                (header.get("version", -1), header.get("rows", 0)) >= (self._index_version, self._index.rows) and \
                not self._dirty:
            return  # what is on disk is as new as ours
        try:
            save_index(self._index, index_path, {"version": self._index_version, "encoder": self.encoder_name})
            self._unsaved, self._dirty = 0, False
        except OSError:
            if not quiet:
                raise

    def _maybe_save(self, quiet: bool = False) -> None:
        """Save the index when many vectors are new since the last save, or on any change when it is
        small. Removals alone never rewrite a large file: a reader replays them from the store."""
        if self._index is not None and self._dirty and (self._unsaved >= _SAVE_MIN or self._index.rows <= _SMALL_INDEX):
            self._save_index(quiet)

    def embed(self, progress: bool | None = None) -> int:
        """Embed every active key that has no vector yet and save the index; returns the index size.

        Long runs show a progress bar and save the index every 65,536 keys, so a killed run resumes.
        """
        with self._lock:
            self.refresh()
            index = self._sync_index(progress)
            if self._dirty:
                self._save_index()
            return len(index)

    def put_vectors(self, key_ids: Sequence[int], vectors: np.ndarray) -> None:
        """Store embeddings computed elsewhere (another machine, a benchmark) for active keys.

        Args:
            key_ids: ids of active keys (see :meth:`key_ids`).
            vectors: ``(len(key_ids), dim)`` unit-norm float32 rows, made with this KB's encoder.
        """
        with self._lock:
            self.refresh()
            alive = self._map.active_among(int(k) for k in key_ids)
            unknown = [int(k) for k in key_ids if int(k) not in alive]
            if unknown:
                raise KBError(f"key ids {unknown[:5]} are not active keys of {self.path}")
            if self._index is None:
                self._load_saved_index(self.path / INDEX_FILENAME)
                if self._index is None:
                    self._index = VectorKeyIndex(np.asarray(vectors).shape[-1], self.ann_config)
            self._put_rows(np.asarray(key_ids, dtype=np.int64), vectors)
            self._sync_index()
            self._maybe_save()

    def put_vector_chunks(self, chunks: Iterable[tuple[Sequence[int], np.ndarray]], expected: int,
                          sample: np.ndarray | None = None, progress: bool | None = None) -> int:
        """Store embeddings computed elsewhere a chunk at a time, for a KB too large to hold them all.

        The key index is built for ``expected`` live keys before the first chunk goes in, trained on
        ``sample`` (``(m, dim)`` vectors like the keys'; default: the first chunk): above
        ``AnnConfig.pq_min`` keys each chunk is stored as ``pq_bytes``-byte PQ codes as it comes, so no float
        copy of the vectors is held. The index is saved once, at the end. Returns the index size.

        Args:
            chunks: ``(key ids, (len(ids), dim) unit-norm float32 vectors)`` of active keys.
            expected (int): how many keys the chunks hold in all.
        """
        from tqdm.auto import tqdm

        with self._lock:
            self.refresh()
            if self._index is None:
                self._load_saved_index(self.path / INDEX_FILENAME)
            show = expected >= 100_000 if progress is None else progress
            prepared = False
            with tqdm(total=expected, desc="indexing key vectors", unit="key", disable=not show) as bar:
                for key_ids, vectors in chunks:
                    key_ids = np.asarray(key_ids, dtype=np.int64)
                    unknown = np.setdiff1d(key_ids, np.fromiter(self._map.active_among(key_ids.tolist()),
                                                                dtype=np.int64))
                    if len(unknown):
                        raise KBError(f"key ids {unknown[:5].tolist()} are not active keys of {self.path}")
                    if self._index is None:
                        self._index = VectorKeyIndex(np.asarray(vectors).shape[-1], self.ann_config)
                    if not prepared:
                        self._index.prepare(vectors if sample is None else sample, expected)
                        prepared = True
                    self._put_rows(key_ids, vectors)
                    self._index.settle(progress=False)
                    bar.update(len(key_ids))
            self._sync_index()
            self._maybe_save()
            return len(self._index)

    def key_index(self, progress: bool | None = None) -> VectorKeyIndex:
        """The key index, brought up to date first (embedding keys that have no vector yet)."""
        with self._lock:
            self.refresh()
            return self._sync_index(progress)
