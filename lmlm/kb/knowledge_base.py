"""The knowledge base an LMLM looks facts up in: ``lookup(entity, relation) -> Match | None``.

A KB is one folder: ``kb.sqlite`` (triples, aliases, provenance, versions, audit log; see
:mod:`lmlm.kb.store`) and ``index.faiss`` (one MiniLM embedding per distinct key; see
:mod:`lmlm.kb.index`). :class:`KnowledgeBase` is composed of four parts, each an attribute:

* ``store``: the :class:`~lmlm.kb.store.SQLiteStore` (or PostgreSQL store), the one source of truth;
* ``keymap``: this handle's map of the store at its version, key -> best active triple
  (:mod:`lmlm.kb.keymap`: held in memory, or read from the store for a KB above ``map_limit`` keys);
* ``index``: the key index kept in step with the store (:class:`LiveIndex`: embed, save, load, catch up);
* ``resolver``: the lookups over the key map and the index (:class:`lmlm.kb.resolve.Resolver`).

Lookup tries the normalised key first (a map probe, score 1.0). Otherwise, by default
(``matching="entity"``), it finds the entity on its own (exact name, alias, the names in the text
so far, a fuzzy match with a margin; a deleted or unknown name is a miss) and then the relation among
that entity's keys. ``matching="key"`` is the paper's: the nearest key by cosine similarity (exact
search for small KBs, HNSW or IVF candidates re-scored exactly for large ones), accepted at
``threshold`` (0.6) or above. :meth:`~KnowledgeBaseReader.explain` says why a lookup missed. Adds,
edits and deletes are numbered versions; they reach the map and the index before the call returns,
and other processes see them on their next lookup (each lookup checks the store's version, one
primary-key read). :meth:`KnowledgeBase.checkout` reads a past version (a
:class:`KnowledgeBaseView`, which shares the live KB's store, index and relation embeddings) and
:meth:`KnowledgeBase.restore` brings one back as new versions. Exercised by ``lmlm kb`` and
``lmlm generate``.

Examples:
    >>> kb = KnowledgeBase.create("ada-kb")
    >>> kb.add([Triple("Ada Lovelace", "Birth City", "London", source="doc1")])
    1
    >>> kb.lookup("ada lovelace", "birth city").value
    'London'
    >>> m = kb.lookup("Ada Lovelace", "birthplace")
    >>> (m.value, m.exact, round(m.score, 2))
    ('London', False, 0.88)
    >>> kb.checkout(1).lookup("Ada Lovelace", "Birth City").version
    1
"""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..memory import gc_paused
from . import formats
from .encoder import DEFAULT_MODEL, Encoder, get_encoder
from .formats import fact_from, fact_of
from .index import AnnConfig, Selection, VectorKeyIndex, load_index, read_header, save_index
from .ingest import PROGRESS_MIN, add_file
from .keymap import MAP_LIMIT, MemoryMap, StoreMap
from .keys import clean_field, key_text, normalize_key, normalize_text, normalize_value
from .records import (AliasRow, Best, Change, DiffEntry, Fact, KBError, KBNotFound, Match, Miss, NotAKnowledgeBase,
                      Triple, TripleRecord, VersionRecord, check_who, forget_item, required)
from .resolve import MATCHINGS, MAX_SOURCES, RELATION_THRESHOLD, Resolver
from .store import DB_FILENAME, NEW_DB, SQLiteStore

__all__ = ["KnowledgeBase", "KnowledgeBaseView", "KnowledgeBaseReader", "LiveIndex", "Restored", "restore_version",
           "never_held_item", "sorted_minus", "INDEX_FILENAME", "MAX_SOURCES", "PROGRESS_MIN", "MATCHINGS"]

INDEX_FILENAME = "index.faiss"
_ADOPT_MIN = 1000  # keys to embed above which a newer saved index is read instead
_SAVE_MIN = 1000  # vectors embedded since the last save above which the index file is rewritten
_SMALL_INDEX = 50_000  # stored vectors up to which every change is saved (the file is small)
_EMBED_CHUNK = 8192  # keys per encoder call when embedding many keys
_CHECKPOINT = 65_536  # keys embedded between index saves of a long embedding run (resumable)
_SAMPLE = 65_536  # vectors a large index's structure is trained on before the first row goes in

KeyMap = MemoryMap | StoreMap


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


class LiveIndex:
    """The live KB's key index, kept in step with its store: embed, save, load, catch up.

    The index file (``index.faiss``) records the store version it reflects; a reader that finds it
    older replays the changes since from the store (dead keys out, returning keys back in, new keys
    embedded), so the file only ever spares work and is never trusted over the store. Long embedding
    runs save the index every ``_CHECKPOINT`` keys (still marked with the old version), so a killed
    run resumes. Removals alone never rewrite a large file. Exercised by ``lmlm kb build`` and every
    fuzzy lookup.

    Args:
        path: the index file.
        store: the KB's store (changed keys and key texts are read from it).
        encoder_name: the encoder the KB records; an index file made with another is not used.
        encoder: returns the KB's encoder (called only when keys must be embedded).
        config: when the index switches from exact search to HNSW and IVF.

    Attributes:
        vectors (VectorKeyIndex | None): the index, None until first used (loaded or built).
        version (int): the store version ``vectors`` reflects.
        unsaved (int): vectors embedded or restored since the file was written.
        dirty (bool): any change (removals too) since then.
    """

    def __init__(self, path: Path, store: SQLiteStore, encoder_name: str, encoder: Callable[[], Encoder],
                 config: AnnConfig):
        self.path, self.store, self.encoder_name, self.encoder, self.config = path, store, encoder_name, encoder, config
        self.vectors: VectorKeyIndex | None = None
        self.version = 0
        self.unsaved = 0
        self.dirty = False

    def sync(self, keys: KeyMap, progress: bool | None = None) -> VectorKeyIndex:
        """Bring the index to ``keys.version``: dead keys out, returning keys back in, new keys embedded."""
        if self.vectors is None:
            self.load_saved(keys.version)
            if self.vectors is None:
                self.vectors, self.version = VectorKeyIndex(self.encoder().dim, self.config), 0
        if self.version != keys.version:
            self._catch_up(keys, progress)
        self.vectors.settle(progress)
        return self.vectors

    def _catch_up(self, keys: KeyMap, progress: bool | None) -> None:
        stale, new = self._delta(keys)
        if len(new) >= _ADOPT_MIN:  # the process that added them may have saved an index holding them
            header = read_header(self.path)
            if header and self.version < header.get("version", -1) <= keys.version and self.load_saved(keys.version):
                stale, new = self._delta(keys)
        missing = self.vectors.restore(new)
        self.unsaved += len(new) - len(missing)
        self.dirty |= bool(self.vectors.remove(stale) or new)
        if missing:
            self._embed_keys(missing, progress)
        self.version = keys.version
        if missing:  # a catch-up (after a killed write, or keys added unembedded) is saved at once
            self.vectors.settle(progress)
            self.maybe_save(quiet=True)

    def _delta(self, keys: KeyMap) -> tuple[list[int], list[int]]:
        """(key ids to take out of the index, key ids to put in) to reach ``keys.version``."""
        index = self.vectors
        if self.version == 0:  # built from nothing: compare with every active key
            alive, held = keys.id_array(), index.live_ids()
            return sorted_minus(held, alive).tolist(), sorted_minus(alive, held).tolist()
        touched = self.store.changed_keys(self.version, keys.version)
        alive = keys.active_among(touched)
        return ([k for k in touched if k in index and k not in alive],
                [k for k in touched if k in alive and k not in index])

    def put_rows(self, key_ids: np.ndarray, vectors: np.ndarray) -> None:
        """Store vectors in the index (its structure catches up at the next settle) as unsaved work."""
        self.vectors.add(key_ids, vectors, build=False)
        self.unsaved += len(key_ids)
        self.dirty = True

    def _embed_keys(self, key_ids: Sequence[int], progress: bool | None = None) -> None:
        """Embed ``key_ids`` in chunks; a long run saves the index now and then, so a killed run resumes.

        When the index will hold at least ``ivf_min`` keys, the first ``_SAMPLE`` vectors (at most
        ``ivf_min``) train the structure for that size before any row goes in
        (:meth:`VectorKeyIndex.prepare`), so each chunk is stored as the index keeps it (PQ codes
        above ``pq_min``), never all of them as floats.
        """
        from tqdm.auto import tqdm

        key_ids = list(key_ids)
        expected = len(self.vectors) + len(key_ids)
        show = len(key_ids) >= PROGRESS_MIN if progress is None else progress
        since_save, held = 0, []  # held: encoded chunks waiting for the structure's training sample
        prepared = expected < self.config.ivf_min
        with tqdm(total=len(key_ids), desc="embedding KB keys", unit="key", disable=not show) as bar:
            for i in range(0, len(key_ids), _EMBED_CHUNK):
                held.append(self._embed_chunk(key_ids[i:i + _EMBED_CHUNK]))
                bar.update(len(held[-1][0]))
                last = i + _EMBED_CHUNK >= len(key_ids)
                if not prepared:
                    if sum(len(ids) for ids, _ in held) < min(_SAMPLE, self.config.ivf_min) and not last:
                        continue
                    self.vectors.prepare(np.concatenate([v for _, v in held]), expected)
                    prepared = True
                for ids, vecs in held:
                    self.put_rows(ids, vecs)
                    since_save += len(ids)
                held = []
                if since_save >= _CHECKPOINT and not last:
                    self.vectors.settle(progress=False)
                    self.save(quiet=True)  # still at the old version: a reader embeds only the rest
                    since_save = 0

    def _embed_chunk(self, key_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(key ids, ``(n, dim)`` vectors) of one chunk of keys, embedded from their texts in the store."""
        chunk = self.store.key_texts(key_ids)
        vectors = self.encoder().encode([key_text(e, r) for _, e, r in chunk], cache=False)
        return np.array([k for k, _, _ in chunk], dtype=np.int64), vectors

    def load_saved(self, version: int) -> bool:
        """Adopt the saved index if it was built with our encoder and is not ahead of ``version``."""
        if not self._usable(read_header(self.path), version):
            return False
        loaded = load_index(self.path)
        if loaded is None:
            return False
        index, header = loaded
        if not self._usable(header, version):
            return False
        index.config = self.config
        self.vectors, self.version, self.unsaved, self.dirty = index, int(header["version"]), 0, False
        return True

    def _usable(self, header: dict | None, version: int) -> bool:
        """An index file made with our encoder, at a version the reader has reached."""
        return bool(header) and header.get("encoder") == self.encoder_name and 0 <= header.get("version", -1) <= version

    def open_for(self, version: int, dim: int) -> None:
        """Have an index to put vectors of ``dim`` dimensions in: the saved one, else a new one."""
        if self.vectors is None:
            self.load_saved(version)
            if self.vectors is None:
                self.vectors = VectorKeyIndex(dim, self.config)

    def save(self, quiet: bool = False) -> None:
        """Write the index file unless what is on disk is as new as ours (``quiet``: an OSError is ignored)."""
        header = read_header(self.path)
        if header and header.get("encoder") == self.encoder_name and \
                (header.get("version", -1), header.get("rows", 0)) >= (self.version, self.vectors.rows) and \
                not self.dirty:
            return
        try:
            save_index(self.vectors, self.path, {"version": self.version, "encoder": self.encoder_name})
            self.unsaved, self.dirty = 0, False
        except OSError:
            if not quiet:
                raise

    def maybe_save(self, quiet: bool = False) -> None:
        """Save the index when many vectors are new since the last save, or on any change when it is
        small. Removals alone never rewrite a large file: a reader replays them from the store."""
        if self.vectors is not None and self.dirty and (self.unsaved >= _SAVE_MIN or self.vectors.rows <= _SMALL_INDEX):
            self.save(quiet)

    def take_in_forget(self, key_ids: list[int], after: int, version: int) -> None:
        """Version ``version`` deleted exactly the keys ``key_ids``: take them out if the index was at ``after``."""
        if self.vectors is not None and self.version == after:
            self.dirty |= bool(self.vectors.remove(key_ids))
            self.version = version

    def stats(self) -> dict:
        """Size, version and kind of the index: of the one held, else as the file's header says."""
        if self.vectors is not None:
            return {"index_size": len(self.vectors), "index_version": self.version, "index_kind": self.vectors.ann_kind}
        header = read_header(self.path) or {}
        return {"index_size": header.get("size", 0), "index_version": header.get("version", 0),
                "index_kind": header.get("ann", "flat")}


class KnowledgeBaseReader:
    """Lookups and records of one version of a knowledge base: what the live KB and a view share.

    Args:
        path: the KB folder.
        store: its store.
        keymap: the map of the store this handle reads (its version is the handle's).
        resolver: the lookups over it.
        lock: guards each call (a view shares its KB's).
        encoder_name: the encoder the KB records.

    Attributes:
        matching (str, default ``"entity"``): ``"entity"`` finds the entity first, then the relation
            among its keys (:mod:`lmlm.kb.resolve`); ``"key"`` is the paper's single-key cosine.
        threshold (float, default 0.6): minimum cosine similarity of a key match under ``"key"``.
        relation_threshold (float, default 0.5): minimum relation similarity under ``"entity"``.
    """

    def __init__(self, path: Path, store: SQLiteStore, keymap: KeyMap, resolver: Resolver, lock: threading.RLock,
                 encoder_name: str):
        self.path, self.store, self.keymap, self.resolver = path, store, keymap, resolver
        self._lock, self.encoder_name = lock, encoder_name
        self.matching, self.threshold, self.relation_threshold = "entity", 0.6, RELATION_THRESHOLD

    @property
    def encoder(self) -> Encoder:
        raise NotImplementedError

    def refresh(self) -> int:
        """The version this handle reads, after picking up what other processes wrote (if it follows them)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this handle holds."""

    def __enter__(self) -> "KnowledgeBaseReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def version(self) -> int:
        """The current version of the KB (0 when nothing was ever added)."""
        return self.refresh()

    def __len__(self) -> int:
        """Number of active triples."""
        self.refresh()
        return self.keymap.n_active

    # -- lookups -----------------------------------------------------------------------------------
    def lookup(self, entity: str, relation: str, threshold: float | None = None, fuzzy: bool = True,
               context: str | None = None, matching: str | None = None) -> Match | None:
        """The value of ``(entity, relation)``, or None (:meth:`explain` says why).

        Args:
            entity, relation: the query, as the model wrote it.
            threshold (float, optional): minimum similarity: of the relation under entity-aware
                matching (default ``self.relation_threshold``), of the whole key under ``"key"``
                (default ``self.threshold``).
            fuzzy (bool, default True): False answers from exact keys only (no encoder call).
            context (str, optional): the text before the call (prompt and document so far); an
                entity it names resolves a short or misspelt name.
            matching (str, optional): ``"entity"`` or ``"key"`` (default ``self.matching``).

        Returns:
            The best-supported active value of the matched key as a :class:`Match`, or None.
        """
        return self.lookup_batch([(entity, relation)], threshold, fuzzy, [context], matching)[0]

    def lookup_batch(self, queries: Sequence[tuple[str, str]], threshold: float | None = None,
                     fuzzy: bool = True, contexts: Sequence[str | None] | None = None,
                     matching: str | None = None) -> list[Match | None]:
        """:meth:`lookup` for many queries, batched (one encoder call for those that need one)."""
        return [m if isinstance(m, Match) else None
                for m in self.resolve_batch(queries, threshold, fuzzy, contexts, matching)]

    def explain(self, entity: str, relation: str, context: str | None = None, threshold: float | None = None,
                matching: str | None = None) -> Match | Miss:
        """:meth:`lookup` that says why on a miss: a :class:`Match` or a :class:`Miss`."""
        return self.resolve_batch([(entity, relation)], threshold, contexts=[context], matching=matching)[0]

    def resolve_batch(self, queries: Sequence[tuple[str, str]], threshold: float | None = None, fuzzy: bool = True,
                      contexts: Sequence[str | None] | None = None, matching: str | None = None) -> list[Match | Miss]:
        """Answer many queries: a :class:`Match` or a :class:`Miss` (with its reason) each.

        Args:
            queries: ``(entity, relation)`` pairs as the model wrote them.
            threshold (float, optional): the paper's key cosine threshold under ``matching="key"``
                (default ``self.threshold``); the relation threshold under ``"entity"`` (default
                ``self.relation_threshold``).
            fuzzy (bool, default True): False answers exact normalised keys only (no encoder call).
            contexts (optional): per query, the text being generated before the call (prompt and
                document so far); the entities it names resolve short or misspelt names.
            matching (str, optional): ``"entity"`` or ``"key"`` (default ``self.matching``).
        """
        matching = self.matching if matching is None else matching
        if matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {MATCHINGS}, got {matching!r}")
        if contexts is not None and len(contexts) != len(queries):
            raise ValueError(f"contexts must have one entry per query ({len(queries)}), got {len(contexts)}")
        if threshold is not None and not -1.0 <= float(threshold) <= 2.0:  # a cosine (-1 takes anything); not nan
            raise ValueError(f"threshold must be a similarity (at most 1), got {threshold}")
        default = self.threshold if matching == "key" else self.relation_threshold
        with self._lock:
            self.refresh()
            return self.resolver.resolve(self.keymap, queries, matching,
                                         default if threshold is None else float(threshold), fuzzy, contexts)

    def lookup_vectors(self, vectors: np.ndarray, threshold: float | None = None) -> list[Match | None]:
        """Fuzzy lookup by query embeddings computed elsewhere, ``(n, dim)`` unit-norm rows."""
        threshold = self.threshold if threshold is None else float(threshold)
        with self._lock:
            self.refresh()
            keys = self.keymap
            if not keys.n_active:
                return [None] * len(vectors)
            found = self.resolver.nearest_vectors(keys, np.asarray(vectors, dtype=np.float32), k=1)
            return self.resolver.matches(keys, [(f[0][0], f[0][1], False) if f and f[0][1] >= threshold else None
                                                for f in found])

    def search(self, entity: str, relation: str, k: int = 5) -> list[Match]:
        """The ``k`` nearest keys with their scores, best first, ignoring the threshold (for debugging)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock:
            self.refresh()
            keys = self.keymap
            exact = keys.get(normalize_key(entity, relation))
            hits: list[tuple[Best, float, bool]] = [(exact, 1.0, True)] if exact else []
            if keys.n_active:
                hits += [(b, s, False) for b, s in self.resolver.nearest(keys, [key_text(entity, relation)], k)[0]
                         if not (exact and b.key_id == exact.key_id)]
            return self.resolver.matches(keys, hits[:k])

    def names_in(self, context: str) -> list[str]:
        """The KB's entities that ``context`` names (by name or alias), as the KB writes them, first
        mention first: the names a query about the text may use."""
        with self._lock:
            self.refresh()
            return self.resolver.names_in(self.keymap, context)

    # -- records -----------------------------------------------------------------------------------
    def aliases(self, entity: str | None = None) -> list[AliasRow]:
        """The active aliases (of ``entity`` only, if given), oldest first."""
        with self._lock:
            rows = self.resolver.aliases()
        if entity is None:
            return rows
        en = normalize_text(entity)
        return [a for a in rows if a.entity_norm == en]

    def key_ids(self) -> dict[tuple[str, str], int]:
        """Key id of every active key, by (entity, relation) as first written."""
        self.refresh()
        return {(b.entity, b.relation): b.key_id for b in self.keymap.values()}

    def keys(self) -> list[tuple[str, str]]:
        """The (entity, relation) of every active key, as first written."""
        self.refresh()
        return [(b.entity, b.relation) for b in self.keymap.values()]

    def get(self, triple_id: int) -> TripleRecord:
        """A triple by id, active or not, with its count, versions and sources."""
        with self._lock:
            record = self.store.get(triple_id)
        if record is None:
            raise KeyError(f"no triple with id {triple_id} in {self.path}")
        return record

    def values(self, entity: str, relation: str) -> list[TripleRecord]:
        """Every active value of the key, best supported first (the one :meth:`lookup` returns)."""
        with self._lock:
            active = [r for r in self.store.history(entity, relation) if r.active]
        return sorted(active, key=lambda r: (-r.count, -r.created_version, -r.id))

    def never_held(self, entity: str | None = None, relation: str | None = None,
                   source: str | None = None) -> list[str]:
        """Which of the given names this KB never held, in any version: ``"entity"``, ``"relation"``
        or ``"source"`` (a document id). A delete that matched nothing asks it: a typo, or done already?"""
        with self._lock:
            return self.store.never_held(None if entity is None else normalize_text(entity),
                                         None if relation is None else normalize_text(relation),
                                         None if source is None else clean_field(source, "source"))

    def history(self, entity: str, relation: str) -> list[TripleRecord]:
        """Every triple ever stored under the key, deleted ones included, oldest first."""
        with self._lock:
            return self.store.history(entity, relation)

    def log(self, limit: int | None = 20) -> list[VersionRecord]:
        """The latest ``limit`` versions (all when None), newest first."""
        with self._lock:
            return self.store.log(limit)

    def changes(self, version: int) -> list[Change]:
        """What ``version`` did to each triple it touched."""
        with self._lock:
            return self.store.changes(version)

    def diff(self, a: int, b: int) -> list[DiffEntry]:
        """The triples that differ between versions ``a`` and ``b`` (see :class:`DiffEntry`)."""
        with self._lock:
            return self.store.diff(a, b)

    def alias_diff(self, a: int, b: int) -> tuple[list[AliasRow], list[AliasRow]]:
        """The aliases active at version ``b`` and not at ``a`` (added), and the reverse (removed)."""
        with self._lock:
            a, b = self.store.check_version(a), self.store.check_version(b)
            at_a, at_b = self.store.aliases(at=a), self.store.aliases(at=b)
        in_a = {(r.alias_norm, r.entity_norm) for r in at_a}
        in_b = {(r.alias_norm, r.entity_norm) for r in at_b}
        return ([r for r in at_b if (r.alias_norm, r.entity_norm) not in in_a],
                [r for r in at_a if (r.alias_norm, r.entity_norm) not in in_b])

    def triples(self) -> Iterator[TripleRecord]:
        """The active triples in id order, streamed from a snapshot."""
        return self.store.records(active_only=True)

    def export(self, path: str | Path, format: str | None = None) -> int:
        """Write the active triples with counts and sources; returns how many.

        ``format``: ``jsonl`` (default), ``parquet`` or ``corpus`` (an annotated corpus, one
        document per source); by default told from the file suffix.
        """
        return formats.write(self.triples(), path, format)

    def export_jsonl(self, path: str | Path) -> int:
        """Write the active triples to a JSON-lines file (readable by :meth:`KnowledgeBase.import_jsonl`); returns how many."""
        return self.export(path, "jsonl")


class KnowledgeBase(KnowledgeBaseReader):
    """A versioned store of ``(entity, relation) -> value`` facts with entity-aware lookup.

    Open with :meth:`create` or :meth:`open`, not the constructor. Thread-safe: one lock guards
    each call. Close with :meth:`close` or use as a context manager. Composed of ``store``,
    ``keymap``, ``index`` (:class:`LiveIndex`) and ``resolver`` (see the module docstring).

    Attributes:
        matching, threshold, relation_threshold: as :class:`KnowledgeBaseReader`'s.
        ann_config (AnnConfig): when the key index switches from exact search to HNSW and IVF.
        map_limit (int): keys above which lookups read the store rather than a map held in memory.
    """

    def __init__(self, path: Path, store: SQLiteStore, encoder: Encoder | None = None,
                 ann: AnnConfig | None = None):
        encoder_name = store.meta().get("encoder", DEFAULT_MODEL)
        resolver = Resolver(store, lambda: self.encoder, self._search)
        super().__init__(path, store, MemoryMap(), resolver, threading.RLock(), encoder_name)
        self.index = LiveIndex(path / INDEX_FILENAME, store, encoder_name, lambda: self.encoder, ann or AnnConfig())
        self._encoder = encoder
        self.map_limit = MAP_LIMIT  # keys above which the map is read from the store, not held in memory
        self._loaded = False  # the map is read at the first lookup: a write (an import) never needs it

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, exist_ok: bool = False, encoder: Encoder | str | None = None,
               ann: AnnConfig | None = None, index_dir: str | Path | None = None) -> "KnowledgeBase":
        """Make a new, empty KB in folder ``path`` (created if needed; an existing folder must be empty).

        Args:
            path: the KB folder, or a ``postgresql://`` URL for a KB shared by many servers.
            exist_ok (bool, default False): open the KB if ``path`` already holds one instead of raising.
            encoder: an :class:`Encoder` or a sentence-transformers model name (default all-MiniLM-L6-v2);
                the name is recorded so every later ``open`` embeds with the same model.
            ann (AnnConfig, optional): sizes at which the key index becomes approximate.
            index_dir (optional): where a URL-backed KB keeps its key index on this machine
                (default: :func:`lmlm.kb.postgres.index_cache_dir`).
        """
        name = encoder.name if isinstance(encoder, Encoder) else (encoder or DEFAULT_MODEL)
        enc = encoder if isinstance(encoder, Encoder) else None
        if _is_url(path):
            return cls._create_at_url(path, name, enc, ann, exist_ok, index_dir)
        path = Path(path)
        if (path / DB_FILENAME).exists():
            if exist_ok:
                return cls.open(path, encoder=enc, ann=ann)
            raise FileExistsError(f"{path} already holds a knowledge base; use KnowledgeBase.open or exist_ok=True")
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"cannot create a knowledge base at {path}: it is a file")
        if path.exists() and any(p for p in path.iterdir() if not p.name.startswith(NEW_DB)):  # a creation cut short
            raise FileExistsError(f"cannot create a knowledge base in {path}: the folder is not empty")
        path.mkdir(parents=True, exist_ok=True)
        store = SQLiteStore.create(path, {"encoder": name})
        return cls(path, store, enc, ann)

    @classmethod
    def _create_at_url(cls, path, name: str, enc: Encoder | None, ann: AnnConfig | None, exist_ok: bool,
                       index_dir) -> "KnowledgeBase":
        from .postgres import PostgresStore, as_url, redact

        url = as_url(path)
        if PostgresStore.exists(url):
            if exist_ok:
                return cls.open(url, encoder=enc, ann=ann, index_dir=index_dir)
            raise FileExistsError(f"{redact(url)} already holds a knowledge base; use KnowledgeBase.open "
                                  "or exist_ok=True")
        return cls(_index_folder(url, index_dir), PostgresStore.create(url, {"encoder": name}), enc, ann)

    @classmethod
    def open(cls, path: str | Path, encoder: Encoder | None = None, ann: AnnConfig | None = None,
             index_dir: str | Path | None = None) -> "KnowledgeBase":
        """Open the KB in folder ``path`` (or its ``kb.sqlite``), or at a ``postgresql://`` URL.

        Opening reads no facts: the handle's map of the store (key -> best value, about 4 s and
        0.45 GB at 10^6 keys) is read at its first lookup, so a handle that only writes (an import,
        a forget) or reports (``version``, ``len``, :meth:`stats`) never holds it; above ``map_limit``
        keys lookups read the store instead and nothing is held (:mod:`lmlm.kb.keymap`)."""
        if _is_url(path):
            from .postgres import PostgresStore, as_url

            url = as_url(path)
            return cls(_index_folder(url, index_dir), PostgresStore.open(url), encoder, ann)
        path = Path(path)
        if path.is_file() and path.name == DB_FILENAME:
            path = path.parent
        if not path.exists():
            raise KBNotFound(f"no knowledge base at {path}: the folder does not exist "
                             "(make one with `lmlm kb build` or KnowledgeBase.create)")
        if not path.is_dir():
            raise NotAKnowledgeBase(f"{path} is not a knowledge base: a KB is a folder holding {DB_FILENAME}")
        return cls(path, SQLiteStore.open(path), encoder, ann)

    def close(self) -> None:
        """Save the key index if it has unsaved work worth keeping, and close the store."""
        with self._lock:
            self.index.maybe_save(quiet=True)
            self.store.close()

    @property
    def version(self) -> int:
        """The store's latest version. Reading it (or ``len``, or :meth:`stats`) does not load this
        handle's map of the store: a handle that only writes and reports never reads 10^7 keys."""
        with self._lock:
            return self.store.version()

    def __len__(self) -> int:
        """Number of active triples."""
        with self._lock:
            if self._loaded:
                self.refresh()
                return self.keymap.n_active
            return self.store.n_active()

    def __repr__(self) -> str:
        return f"KnowledgeBase({str(self.store.folder)!r}, version={self.version}, triples={len(self)})"

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = get_encoder(self.encoder_name)
        return self._encoder

    @property
    def ann_config(self) -> AnnConfig:
        return self.index.config

    # -- keeping in step with the store -----------------------------------------------------------
    def refresh(self) -> int:
        """Pick up changes made by other processes since the last call (cheap when there are none)."""
        with self._lock:
            if not self._loaded or self.store.version() != self.keymap.version:
                self._sync()
            return self.keymap.version

    def _sync(self) -> None:
        if not self._loaded and self.store.key_bound() > self.map_limit:
            self.keymap = StoreMap(self.store, 0)  # a large KB: lookups read the store, nothing held per key
        if not self.keymap.in_memory:
            return self._catch_up_store()
        with gc_paused():  # 10^6 map entries at a first load
            self._take_in(*self.store.catch_up(self.keymap.version))

    def _take_in(self, version: int, keys: list[int] | None, rows: list[Best]) -> None:
        after = self.keymap.version
        if keys is None:
            self.resolver.entity_index = None
        removed = self.keymap.take_in(keys, rows, version)
        self._loaded = True
        if keys is not None and after != version:
            self.resolver.take_in(removed, rows, after, version)

    def _catch_up_store(self) -> None:
        """:meth:`_sync` for a map read from the store: its version and count of active triples
        move on; an entity index already built takes in the keys that changed."""
        after = self.keymap.version
        version, n = self.store.catch_up_count(after, self.keymap.n_active)
        self.keymap.move_to(version, n)
        self._loaded = True
        if self.resolver.entity_index is not None and after != version:
            keys = self.store.changed_keys(after, version)
            rows = self.store.best(keys, at=version)
            gone = set(keys).difference(b.key_id for b in rows)
            self.resolver.take_in(self.store.key_norms(list(gone)).values(), rows, after, version)

    def _after_write(self, progress: bool | None = None, adds_keys: bool = True, embed: bool = True) -> None:
        """Take in a write just made. An add embeds its new keys now (unless ``embed`` is False); a
        delete or edit never adds a key, so an index not yet loaded is left for the next fuzzy lookup.
        A handle that has not read the store's map yet (one that only writes, such as an import) does
        not read it now unless the index needs it."""
        if not self._loaded and not (embed and adds_keys):
            return
        self._sync()
        if embed and (adds_keys or self.index.vectors is not None):
            self.index.sync(self.keymap, progress)
            self.index.maybe_save()

    def _search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The resolver's search: the live index, brought up to this handle's version first."""
        return self.index.sync(self.keymap).search(vectors, k)

    # -- changes ---------------------------------------------------------------------------------
    def add(self, triples: Iterable[Triple], who: str = "lmlm", why: str = "", batch_size: int = 1000,
            progress: bool | None = None, embed: bool = True, once: bool = False) -> int:
        """Add facts as one new version and return it (the current version if nothing changed).

        A fact whose key and value are already active gains support (``count`` + 1 and the new
        source) instead of a second row; one already recorded from the same source and position
        changes nothing. ``triples`` is consumed inside the write transaction, so a failure part
        way (a bad triple, a crash) leaves the KB as it was.

        Args:
            triples: :class:`Triple` objects, :class:`lmlm.lookup.Lookup` objects or tuples
                ``(entity, relation, value[, source[, position]])``.
            who, why: recorded in the audit log.
            batch_size (int, default 1000): triples read from ``triples`` per step.
            progress (bool, optional): show progress bars (default: for ``PROGRESS_MIN`` items or more).
            embed (bool, default True): embed new keys now; False leaves it to :meth:`embed` or the
                first fuzzy lookup (exact lookups never need it).
            once (bool, default False): a fact without a source that is already active changes
                nothing instead of gaining support, so a request sent again (a retry) counts once;
                the server's add and ``lmlm kb add`` use it.
        """
        total = len(triples) if hasattr(triples, "__len__") else None
        facts = (fact_from(t) for t in triples)
        if once:
            facts = (f for f in facts if f.sources or not any(
                r.active and normalize_value(r.value) == normalize_value(f.value)
                for r in self.store.history(f.entity, f.relation)))
        return self._write(facts, "add", who, why, batch_size, progress, total, embed=embed)

    def import_file(self, path: str | Path, format: str | None = None, who: str = "lmlm", why: str = "",
                    batch_size: int = 1000, progress: bool | None = None, embed: bool = True,
                    chunk_size: int = 100_000) -> int:
        """Add the facts of a file (op ``import``) and return the version the KB is at after.

        Resumable and idempotent (see :mod:`lmlm.kb.build`): a file of up to ``chunk_size`` facts
        is one version, a larger one a version per chunk, other writers getting the lock between
        them; after a crash the same call goes on where it stopped, and a file already imported (the
        same content, under any name) adds nothing.

        Args:
            path: JSON lines or Parquet of triples (as written by :meth:`export`), an annotated
                corpus (JSON lines with ``doc_id`` and ``annotated`` text), or the authors' database JSON.
            format (str, optional): ``jsonl``, ``parquet``, ``corpus`` or ``authors``; by default
                told from the file (see :func:`lmlm.kb.formats.detect_format`).
        """
        add_file(self, path, format, chunk_size=chunk_size, who=who, why=why or "import", progress=progress,
                 batch_size=batch_size)
        with self._lock:
            self._after_write(progress, embed=embed)
            return self.version

    def import_jsonl(self, path: str | Path, who: str = "lmlm", why: str = "", batch_size: int = 1000,
                     progress: bool | None = None) -> int:
        """Add the facts of a JSON-lines file as one version (op ``import``) and return it.

        Each line holds ``entity``, ``relation``, ``value`` and optionally ``count`` and ``sources``
        (a list of ``[doc_id, position]``) as written by :meth:`export_jsonl`, or ``source`` and
        ``position`` as in :class:`Triple`.
        """
        return self.import_file(path, "jsonl", who, why, batch_size, progress)

    def _write(self, facts: Iterable[Fact], op: str, who: str, why: str, batch_size: int,
               progress: bool | None, total: int | None, embed: bool = True, meta: dict | None = None) -> int:
        who, why = check_who(who, why)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        from tqdm.auto import tqdm

        show = progress if progress is not None else (total or 0) >= PROGRESS_MIN
        with self._lock:
            with tqdm(total=total, desc="writing triples", unit="triple", disable=not show) as bar:
                version = self.store.write_facts(facts, op, who, why, batch_size, bar.update, meta)
            self._after_write(progress, embed=embed)
            return version

    def delete(self, *, triple_ids: Iterable[int] | int | None = None, entity: str | None = None,
               relation: str | None = None, source: str | None = None, who: str = "lmlm", why: str = "") -> int:
        """Delete the active facts matching all given filters, as one version; returns how many.

        Deleted facts are unreachable by exact and fuzzy lookup when this returns, in this and every
        other handle, and stay in history. ``source`` deletes every fact that cites that document,
        whatever else cites it. To delete a list of facts, keys or documents at once, use :meth:`forget`.
        """
        if triple_ids is None and entity is None and relation is None and source is None:
            raise ValueError("delete needs at least one of triple_ids, entity, relation, source "
                             "(refusing to delete everything)")
        who, why = check_who(who, why)
        ids = None if triple_ids is None else [triple_ids] if isinstance(triple_ids, numbers.Integral) \
            else [int(i) for i in triple_ids]
        en = None if entity is None else required(normalize_text(entity), "entity", entity)
        rn = None if relation is None else required(normalize_text(relation), "relation", relation)
        source = None if source is None else required(clean_field(source, "source"), "source", source)
        with self._lock:
            _, n = self.store.delete(who, why, triple_ids=ids, entity_norm=en, relation_norm=rn, source=source)
            if n:
                self._after_write(adds_keys=False)
            return n

    def forget(self, items: Iterable, who: str = "lmlm", why: str = "") -> int:
        """Delete a forget set as one version; returns how many active facts it removed.

        Args:
            items: any mix of triple ids (int), keys ``(entity, relation)`` (every value of the key),
                facts ``(entity, relation, value)`` or :class:`Triple`, and dicts with ``id``,
                ``source`` (a document: every fact citing it), ``entity`` alone (every fact of the
                entity) or ``entity`` + ``relation`` [+ ``value``].

        Like :meth:`delete`, the facts are unreachable by any lookup when this returns.
        """
        who, why = check_who(who, why)
        ids, keys, facts, sources, entities = [], [], [], [], []
        lists = {"id": ids, "key": keys, "fact": facts, "source": sources, "entity": entities}
        for n, item in enumerate(items):
            kind, value = forget_item(item, n)
            lists[kind].append(value)
        with self._lock:
            known, gone = None, set()
            if self._loaded and self.keymap.in_memory:  # else the store looks the forget set up
                self.refresh()
                known, gone = self._known_ids(keys, facts)
            v, n = self.store.forget(who, why, ids, keys, facts, sources, known=known, entities=entities)
            if n and known and v == known[0] + 1 and not (ids or sources or entities or known[2] or known[3]):
                self._take_in_forget(v, gone)  # the store used the map: every deleted fact was in it
            if n:
                self._after_write(adds_keys=False)
            return n

    def _known_ids(self, keys: list[str], facts: list[tuple[str, str]]) -> tuple[tuple, set[str]]:
        """What this handle's map of the store (at its version) tells of a forget set: ``(version,
        ids, keys left, facts left)`` with the triple ids of the keys and facts it resolves (a key with
        one active value) and those left for the store to look up, and the keys those ids empty.
        The store uses it only while still at that version."""
        ids, keys_left, facts_left, gone = [], [], [], set()
        best = self.keymap
        for kn in keys:
            b = best.get(kn)
            if b is None:
                continue  # no active value: nothing to delete
            if b.n_active == 1:
                ids.append(b.triple_id)
                gone.add(kn)
            else:
                keys_left.append(kn)
        for kn, vn in facts:
            b = best.get(kn)
            if b is None:
                continue
            if b.n_active > 1:
                facts_left.append((kn, vn))
            elif normalize_value(b.value) == vn:
                ids.append(b.triple_id)
                gone.add(kn)
        return (self.keymap.version, ids, keys_left, facts_left), gone

    def _take_in_forget(self, version: int, gone: set[str]) -> None:
        """Version ``version`` deleted the only value of each key in ``gone`` and nothing else: drop
        them from the map, the entity index and the key index without reading the store again."""
        after = self.keymap.version
        key_ids = self.keymap.drop(gone, version)
        self.resolver.take_in(gone, [], after, version)
        self.index.take_in_forget(key_ids, after, version)

    def edit(self, entity: str, relation: str, new_value: str, who: str = "lmlm", why: str = "") -> int:
        """Make ``new_value`` the only active value of ``(entity, relation)``; returns the new version
        (the current one when it already was).

        The replaced values stay in history (``deleted_version`` set, op ``edit`` in :meth:`changes`).
        Raises KBError when the key has no active value.
        """
        f = fact_of(Triple(entity, relation, new_value))  # validated, and cleaned as an add stores it
        who, why = check_who(who, why)
        with self._lock:
            version = self.store.edit(f.entity, f.relation, f.value, who, why)
            self._after_write(adds_keys=False)
            return version

    # -- aliases (their lookups: lmlm.kb.resolve) -------------------------------------------------
    def add_aliases(self, pairs: Iterable[tuple[str, str]], who: str = "lmlm", why: str = "",
                    strict: bool = False) -> int:
        """Record other names of entities, ``(alias, entity)`` pairs, as one version; returns it.

        An alias is another way the text may name an entity: a short name, ``"Lovelace, Ada"``, a
        Wikipedia redirect. An alias of an entity with no facts is kept and used once it has some;
        deleting an entity's last fact deletes its aliases. ``strict``: refuse (ValueError) an alias that
        is the name of another entity with facts, which would answer for it once that entity is deleted.
        """
        who, why = check_who(who, why)
        pairs = [(clean_field(str(a), "alias"), clean_field(str(e), "entity")) for a, e in pairs]
        with self._lock:
            version, n = self.store.add_aliases(pairs, who, why, strict=strict)
            if n:
                self._after_write(adds_keys=False)
            return version

    def delete_alias(self, alias: str, entity: str | None = None, who: str = "lmlm", why: str = "") -> int:
        """Delete the alias ``alias`` (of ``entity`` only, if given) as one version; returns how many."""
        who, why = check_who(who, why)
        an = required(normalize_text(alias), "alias", alias)
        en = None if entity is None else required(normalize_text(entity), "entity", entity)
        with self._lock:
            _, n = self.store.delete_aliases(an, en, who, why)
            if n:
                self._after_write(adds_keys=False)
            return n

    # -- the key index -----------------------------------------------------------------------------
    def embed(self, progress: bool | None = None) -> int:
        """Embed every active key that has no vector yet and save the index; returns the index size.

        Long runs show a progress bar and save the index every 65,536 keys, so a killed run resumes.
        """
        with self._lock:
            self.refresh()
            index = self.index.sync(self.keymap, progress)
            if self.index.dirty:
                self.index.save()
            return len(index)

    def key_index(self, progress: bool | None = None) -> VectorKeyIndex:
        """The key index, brought up to date first (embedding keys that have no vector yet)."""
        with self._lock:
            self.refresh()
            return self.index.sync(self.keymap, progress)

    def put_vectors(self, key_ids: Sequence[int], vectors: np.ndarray) -> None:
        """Store embeddings computed elsewhere (another machine, a benchmark) for active keys.

        Args:
            key_ids: ids of active keys (see :meth:`key_ids`).
            vectors: ``(len(key_ids), dim)`` unit-norm float32 rows, made with this KB's encoder.
        """
        with self._lock:
            self.refresh()
            alive = self.keymap.active_among(int(k) for k in key_ids)
            unknown = [int(k) for k in key_ids if int(k) not in alive]
            if unknown:
                raise KBError(f"key ids {unknown[:5]} are not active keys of {self.path}")
            self.index.open_for(self.keymap.version, np.asarray(vectors).shape[-1])
            self.index.put_rows(np.asarray(key_ids, dtype=np.int64), vectors)
            self.index.sync(self.keymap)
            self.index.maybe_save()

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
            show = expected >= 100_000 if progress is None else progress
            first = True
            with tqdm(total=expected, desc="indexing key vectors", unit="key", disable=not show) as bar:
                for key_ids, vectors in chunks:
                    key_ids = np.asarray(key_ids, dtype=np.int64)
                    self._check_active(key_ids)
                    self.index.open_for(self.keymap.version, np.asarray(vectors).shape[-1])
                    if first:
                        self.index.vectors.prepare(vectors if sample is None else sample, expected)
                        first = False
                    self.index.put_rows(key_ids, vectors)
                    self.index.vectors.settle(progress=False)
                    bar.update(len(key_ids))
            self.index.sync(self.keymap)
            self.index.maybe_save()
            return len(self.index.vectors)

    def _check_active(self, key_ids: np.ndarray) -> None:
        """A KBError unless every key id is an active key of this handle's version."""
        unknown = np.setdiff1d(key_ids, np.fromiter(self.keymap.active_among(key_ids.tolist()), dtype=np.int64))
        if len(unknown):
            raise KBError(f"key ids {unknown[:5].tolist()} are not active keys of {self.path}")

    # -- past versions and counts -----------------------------------------------------------------
    def checkout(self, version: int) -> "KnowledgeBaseView":
        """A read-only snapshot of the KB as it was at ``version`` (a :class:`KnowledgeBaseView`):
        lookup, search, triples, export."""
        return KnowledgeBaseView(self, version)

    def restore(self, version: int, who: str = "lmlm", why: str = "") -> "Restored":
        """Make the active facts and aliases those of ``version``, as new versions; returns what changed
        (all 0 when they already are). History is never rewritten: ``version`` stays readable as it was
        (:meth:`checkout`). The facts active now and not then are deleted (one version, op ``delete``),
        the facts active then and not now written back with their counts and sources (one version, op
        ``restore``), and the aliases likewise. ``lmlm kb restore``."""
        version = self.store.check_version(version)
        why = why or f"restore version {version}"
        then = {_restore_key(r): r for r in self.store.records(active_only=True, at=version)}
        now = {_restore_key(r): r.id for r in self.store.records()}
        gone = sorted(tid for k, tid in now.items() if k not in then)
        back = [r for k, r in then.items() if k not in now]
        removed = self.forget(gone, who=who, why=why) if gone else 0  # an entity left without facts loses its aliases
        if back:
            self._write((Fact(r.entity, r.relation, r.value, r.count, tuple(r.sources)) for r in back), "restore",
                        who, why, batch_size=1000, progress=None, total=len(back))
        old, new = self.alias_diff(version, self.version)  # active now and not then; then and not now
        if new:
            self.add_aliases([(a.alias, a.entity) for a in new], who=who, why=why)
        for a in old:
            self.delete_alias(a.alias, a.entity, who=who, why=why)
        return Restored(self.version, removed, len(back), len(new), len(old))

    def stats(self) -> dict:
        with self._lock:
            return {"path": str(self.path), "version": self.version, **self.store.counts(),
                    "encoder": self.encoder_name, "matching": self.matching, "threshold": self.threshold,
                    "relation_threshold": self.relation_threshold, **self.index.stats(),
                    "map": ("memory" if self.keymap.in_memory else "store") if self._loaded else "unread"}


_WRITES = frozenset({"add", "delete", "edit", "forget", "import_file", "import_jsonl", "add_aliases", "delete_alias",
                     "embed", "put_vectors", "checkout", "restore"})


class KnowledgeBaseView(KnowledgeBaseReader):
    """``kb`` as it was at ``version``: a snapshot that reads, and has no writes. Closing it leaves ``kb`` open.

    The view answers ``lookup``, ``lookup_batch``, ``search``, ``triples``, ``stats`` and ``export``
    as the KB did at that version (values, counts, sources). Its fuzzy lookups share the live KB's
    key index: keys of the past version that are no longer live are searched through a
    :class:`~lmlm.kb.index.Selection` (keys deleted since keep their vectors as dead rows; keys the
    index never held are embedded once). Matches name the view's version, so a generation trace says
    which version it read. Exercised by ``lmlm kb checkout`` and ``lmlm kb lookup --at``.

    Args:
        kb: the live knowledge base.
        version: the version to read.
    """

    def __init__(self, kb: KnowledgeBase, version: int):
        with kb._lock:
            rows = kb.store.best_at(version)
        resolver = Resolver(kb.store, lambda: kb.encoder, self._search, at=version,
                            relation_vectors=kb.resolver.relation_vectors)
        super().__init__(kb.path, kb.store, MemoryMap(rows, version), resolver, kb._lock, kb.encoder_name)
        self.kb = kb
        self.matching, self.threshold, self.relation_threshold = kb.matching, kb.threshold, kb.relation_threshold
        self.ann_config = kb.ann_config
        self._selection: Selection | None = None

    def __repr__(self) -> str:
        return f"KnowledgeBaseView({str(self.path)!r}, version={self.keymap.version}, triples={self.keymap.n_active})"

    @property
    def encoder(self) -> Encoder:
        return self.kb.encoder

    def refresh(self) -> int:
        return self.keymap.version

    def close(self) -> None:
        """Nothing to release: the view borrows the store of the KB it came from."""

    def __getattr__(self, name: str):
        if name in _WRITES:  # what a live KB has and a snapshot does not: say so, by name
            raise KBError(f"the view of {self.path} at version {self.keymap.version} is read-only (no {name}); "
                          "write to the knowledge base itself")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The resolver's search: the live KB's index, within the keys of this version."""
        index = self.kb.index.sync(self.kb.keymap)
        if self._selection is None or self._selection.generation != index.generation:
            missing = [kid for kid in self.keymap.ids() if not index.has_vector(kid)]
            if missing:  # keys the live index never held: embed them once, as dead rows
                rows = self.store.key_texts(missing)
                vecs = self.encoder.encode([key_text(e, r) for _, e, r in rows], cache=False)
                index.add(np.array([k for k, _, _ in rows], dtype=np.int64), vecs, alive=False)
            self._selection = index.select(self.keymap.ids())
        return index.search(vectors, k, within=self._selection)

    # -- records ---------------------------------------------------------------------------------
    def triples(self):
        """The triples active at this version, with their counts and sources then."""
        return self.store.records(at=self.keymap.version)

    def values(self, entity: str, relation: str) -> list[TripleRecord]:
        with self._lock:
            kept = list(self.store.records_at(self.keymap.version, normalize_key(entity, relation)))
        return sorted(kept, key=lambda r: (-r.count, -r.created_version, -r.id))

    def log(self, limit: int | None = 20):
        return [r for r in self.store.log(None) if r.version <= self.keymap.version][:limit]

    def stats(self) -> dict:
        with self._lock:
            return {"path": str(self.path), "version": self.keymap.version, "read_only": True,
                    **self.store.counts_at(self.keymap.version), "encoder": self.encoder_name,
                    "threshold": self.threshold, "current_version": self.kb.version}


@dataclass(frozen=True)
class Restored:
    """What :meth:`KnowledgeBase.restore` did: facts deleted and written back, aliases added and deleted."""

    version: int
    removed: int
    added: int
    aliases_added: int
    aliases_removed: int

    @property
    def changed(self) -> int:
        return self.removed + self.added + self.aliases_added + self.aliases_removed


def _restore_key(r) -> tuple[str, str, str]:
    return normalize_text(r.entity), normalize_text(r.relation), normalize_value(r.value)


def restore_version(kb: KnowledgeBase, version: int, who: str = "lmlm", why: str = "") -> Restored:
    """:meth:`KnowledgeBase.restore` as a function (``lmlm kb restore`` and the server's restore)."""
    return kb.restore(version, who=who, why=why)


def never_held_item(kb: KnowledgeBaseReader, item) -> str | None:
    """What forget item ``item`` names that no version of ``kb`` held, said for a user (None: it held it,
    deleted or not): an unknown id or source, an entity (with the closest the KB holds), a key, or a value."""
    kind, what = forget_item(item, 0)
    if kind == "id":
        tid = int(item if not isinstance(item, dict) else item.get("id", item.get("triple_id")))
        return None if kb.store.get(tid) is not None else f"no triple with id {tid}"
    if kind == "source":
        return f"never held the source {what!r}" if kb.never_held(source=what) else None
    fields = item if isinstance(item, dict) else dict(zip(("entity", "relation", "value"), item))
    entity, relation, value = fields.get("entity"), fields.get("relation"), fields.get("value")
    if kb.never_held(entity=entity):
        found = kb.explain(entity, relation or "-")
        cands = [found.entity] if found.entity else [c for c, _ in getattr(found, "candidates", ())][:3]
        return f"never held the entity {entity!r}" + (f" (closest: {', '.join(map(repr, cands))})" if cands else "")
    if relation is None:
        return None
    history = kb.history(entity, relation)
    if not history:
        return f"never held the key ({entity!r}, {relation!r})"
    if value is not None and all(normalize_value(r.value) != normalize_value(str(value)) for r in history):
        held = ", ".join(repr(r.value) for r in history[:3])
        return f"never held ({entity!r}, {relation!r}) = {value!r} (it held {held})"
    return None


def _is_url(path) -> bool:
    from .postgres import is_url

    return is_url(path)


def _index_folder(url: str, index_dir: str | Path | None) -> Path:
    from .postgres import index_cache_dir

    folder = Path(index_dir) if index_dir is not None else index_cache_dir(url)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
