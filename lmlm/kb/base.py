"""The knowledge base an LMLM looks facts up in: ``lookup(entity, relation) -> Match | None``.

A KB is one folder: ``kb.sqlite`` (triples, provenance, versions, audit log; see
:mod:`lmlm.kb.store`) and ``index.faiss`` (one MiniLM embedding per distinct key; see
:mod:`lmlm.kb.index`). Lookup tries the normalised key first (an in-memory dict hit, score 1.0)
and falls back to the nearest key by cosine similarity, accepted at ``threshold`` (0.6, as in the
paper) or above. Adds, edits and deletes are numbered versions; they reach the dict and the index
before the call returns, and other processes see them on their next lookup (each lookup checks
the store's version, one primary-key read). Exercised by ``lmlm kb`` and ``lmlm generate``.

Examples:
    >>> kb = KnowledgeBase.create("ada-kb")
    >>> kb.add([Triple("Ada Lovelace", "Birth City", "London", source="doc1")])
    1
    >>> kb.lookup("ada lovelace", "birth city").value
    'London'
    >>> m = kb.lookup("Ada Lovelace", "birthplace")
    >>> (m.value, m.exact, round(m.score, 2))
    ('London', False, 0.88)
"""

from __future__ import annotations

import json
import numbers
import threading
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .encoder import DEFAULT_MODEL, Encoder, get_encoder
from .index import FaissFlatIndex, KeyIndex, load_index, read_header, save_index
from .keys import KEY_SEP, key_text, normalize_key, normalize_text
from .records import Change, Match, Triple, TripleRecord, VersionRecord, as_triple
from .store import DB_FILENAME, Best, Fact, KBNotFound, NotAKnowledgeBase, SQLiteStore

__all__ = ["KnowledgeBase", "INDEX_FILENAME", "MAX_SOURCES", "PROGRESS_MIN"]

INDEX_FILENAME = "index.faiss"
MAX_SOURCES = 32  # document ids returned per match; KnowledgeBase.get has them all
PROGRESS_MIN = 5000  # show progress bars for writes or embeddings of at least this many items
_ADOPT_MIN = 1000  # keys to embed above which a newer saved index is read instead
_CANDIDATES = 8  # index hits inspected per fuzzy query, in case the best ones were just deleted


class KnowledgeBase:
    """A versioned store of ``(entity, relation) -> value`` facts with exact-then-fuzzy lookup.

    Open with :meth:`create` or :meth:`open`, not the constructor. Thread-safe: one lock guards
    each call. Close with :meth:`close` or use as a context manager.

    Attributes:
        threshold (float, default 0.6): minimum cosine similarity for a fuzzy match.
    """

    threshold: float = 0.6

    def __init__(self, path: Path, store: SQLiteStore, encoder: Encoder | None = None):
        self.path = path
        self.store = store
        self.encoder_name = store.meta().get("encoder", DEFAULT_MODEL)
        self._encoder = encoder
        self._lock = threading.RLock()
        self._version = 0  # the store version the dict reflects
        self._best: dict[str, Best] = {}  # key_norm -> best active triple
        self._key_norm: dict[int, str] = {}  # key_id -> key_norm, active keys only
        self._n_active = 0
        self._index: KeyIndex | None = None  # loaded on first fuzzy use or write
        self._index_version = 0  # the store version the index reflects
        self._sync()

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, exist_ok: bool = False, encoder: Encoder | str | None = None) -> "KnowledgeBase":
        """Make a new, empty KB in folder ``path`` (created if needed; an existing folder must be empty).

        Args:
            path: the KB folder.
            exist_ok (bool, default False): open the KB if ``path`` already holds one instead of raising.
            encoder: an :class:`Encoder` or a sentence-transformers model name (default all-MiniLM-L6-v2);
                the name is recorded so every later ``open`` embeds with the same model.
        """
        path = Path(path)
        if (path / DB_FILENAME).exists():
            if exist_ok:
                return cls.open(path, encoder=encoder if isinstance(encoder, Encoder) else None)
            raise FileExistsError(f"{path} already holds a knowledge base; use KnowledgeBase.open or exist_ok=True")
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"cannot create a knowledge base at {path}: it is a file")
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"cannot create a knowledge base in {path}: the folder is not empty")
        path.mkdir(parents=True, exist_ok=True)
        name = encoder.name if isinstance(encoder, Encoder) else (encoder or DEFAULT_MODEL)
        store = SQLiteStore.create(path, {"encoder": name})
        return cls(path, store, encoder if isinstance(encoder, Encoder) else None)

    @classmethod
    def open(cls, path: str | Path, encoder: Encoder | None = None) -> "KnowledgeBase":
        """Open the KB in folder ``path`` (or its ``kb.sqlite``)."""
        path = Path(path)
        if path.is_file() and path.name == DB_FILENAME:
            path = path.parent
        if not path.exists():
            raise KBNotFound(f"no knowledge base at {path}: the folder does not exist "
                             "(make one with KnowledgeBase.create)")
        if not path.is_dir():
            raise NotAKnowledgeBase(f"{path} is not a knowledge base: a KB is a folder holding {DB_FILENAME}")
        return cls(path, SQLiteStore.open(path), encoder)

    def close(self) -> None:
        with self._lock:
            self.store.close()

    def __enter__(self) -> "KnowledgeBase":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KnowledgeBase({str(self.path)!r}, version={self._version}, triples={self._n_active})"

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = get_encoder(self.encoder_name)
        return self._encoder

    # -- keeping in step with the store -----------------------------------------------------------
    def refresh(self) -> int:
        """Pick up changes made by other processes since the last call (cheap when there are none)."""
        with self._lock:
            if self.store.version() != self._version:
                self._sync()
            return self._version

    def _sync(self) -> None:
        version, keys, rows = self.store.catch_up(self._version)
        if keys is None:
            self._best, self._key_norm = {}, {}
        else:
            for kid in keys:
                kn = self._key_norm.pop(kid, None)
                if kn is not None:
                    self._n_active -= self._best.pop(kn).n_active
        for b in rows:
            self._best[b.key_norm] = b
            self._key_norm[b.key_id] = b.key_norm
        if keys is None:
            self._n_active = sum(b.n_active for b in rows)
        else:
            self._n_active += sum(b.n_active for b in rows)
        self._version = version

    def _sync_index(self, progress: bool | None = None) -> KeyIndex:
        """Bring the index to ``self._version``: remove keys with no active value, embed new ones."""
        index_path = self.path / INDEX_FILENAME
        if self._index is None:
            self._load_saved_index(index_path)
            if self._index is None:
                self._index, self._index_version = FaissFlatIndex(self.encoder.dim), 0
        if self._index_version == self._version:
            return self._index
        stale, new = self._index_delta()
        if len(new) >= _ADOPT_MIN:  # the process that added them may have saved an index holding them
            header = read_header(index_path)
            if header and self._index_version < header.get("version", -1) <= self._version \
                    and self._load_saved_index(index_path):
                stale, new = self._index_delta()
        index = self._index
        index.remove(stale)
        if new:
            rows = self.store.key_texts(new)
            show = len(rows) >= PROGRESS_MIN if progress is None else progress
            vectors = self.encoder.encode([key_text(e, r) for _, e, r in rows], cache=False,
                                          progress=show, desc="embedding KB keys")
            index.add(np.array([k for k, _, _ in rows], dtype=np.int64), vectors)
        self._index_version = self._version
        if len(new) >= _ADOPT_MIN:  # spare other readers the same embedding work
            self._save_index(quiet=True)
        return index

    def _index_delta(self) -> tuple[list[int], list[int]]:
        """(key ids to remove from the index, key ids to embed and add) to reach ``self._version``."""
        index = self._index
        if self._index_version == 0:  # built from nothing: compare with every active key
            return [k for k in index.ids() if k not in self._key_norm], [k for k in self._key_norm if k not in index]
        touched = self.store.changed_keys(self._index_version, self._version)
        return ([k for k in touched if k in index and k not in self._key_norm],
                [k for k in touched if k in self._key_norm and k not in index])

    def _load_saved_index(self, index_path: Path) -> bool:
        """Adopt the saved index if it was built with our encoder and is not ahead of our dict."""
        loaded = load_index(index_path)
        if loaded is None:
            return False
        index, header = loaded
        if header.get("encoder") != self.encoder_name or not 0 <= header.get("version", -1) <= self._version:
            return False
        self._index, self._index_version = index, int(header["version"])
        return True

    def _save_index(self, quiet: bool = False) -> None:
        index_path = self.path / INDEX_FILENAME
        header = read_header(index_path)
        if header and header.get("encoder") == self.encoder_name and header.get("version", -1) >= self._index_version:
            return  # what is on disk is as new as ours
        try:
            save_index(self._index, index_path, {"version": self._index_version, "encoder": self.encoder_name})
        except OSError:
            if not quiet:
                raise

    def _after_write(self, progress: bool | None = None, adds_keys: bool = True) -> None:
        """Take in a write just made. An add embeds its new keys now and saves the index; a delete or
        edit never adds a key, so an index not yet loaded is left for the next fuzzy lookup to catch up."""
        self._sync()
        if adds_keys or self._index is not None:
            self._sync_index(progress)
            self._save_index()

    # -- lookup ----------------------------------------------------------------------------------
    def lookup(self, entity: str, relation: str, threshold: float | None = None) -> Match | None:
        """The value of ``(entity, relation)``: exact normalised key first, else the nearest key.

        Args:
            entity, relation: the query, as the model wrote it.
            threshold (float, optional): minimum cosine for a fuzzy match (default ``self.threshold``).

        Returns:
            The best-supported active value of the matched key as a :class:`Match`, or None when no
            key is exact and none is at least ``threshold`` similar.
        """
        return self.lookup_batch([(entity, relation)], threshold)[0]

    def lookup_batch(self, queries: Sequence[tuple[str, str]], threshold: float | None = None) -> list[Match | None]:
        """:meth:`lookup` for many queries; the ones without an exact key share one encoder call."""
        threshold = self.threshold if threshold is None else float(threshold)
        with self._lock:
            self.refresh()
            hits: list[tuple[Best, float, bool] | None] = [None] * len(queries)
            fuzzy: list[int] = []
            for i, (entity, relation) in enumerate(queries):
                en, rn = normalize_text(entity), normalize_text(relation)
                if not en and not rn:
                    continue  # a blank query matches nothing
                best = self._best.get(en + KEY_SEP + rn)
                if best is not None:
                    hits[i] = (best, 1.0, True)
                else:
                    fuzzy.append(i)
            if fuzzy and self._best:
                nearest = self._nearest([key_text(*queries[i]) for i in fuzzy], k=1)
                for i, found in zip(fuzzy, nearest):
                    if found and found[0][1] >= threshold:
                        hits[i] = (found[0][0], found[0][1], False)
            return self._matches(hits)

    def search(self, entity: str, relation: str, k: int = 5) -> list[Match]:
        """The ``k`` nearest keys with their scores, best first, ignoring the threshold (for debugging)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock:
            self.refresh()
            exact = self._best.get(normalize_key(entity, relation))
            hits: list[tuple[Best, float, bool]] = [(exact, 1.0, True)] if exact else []
            if self._best:
                hits += [(b, s, False) for b, s in self._nearest([key_text(entity, relation)], k)[0]
                         if not (exact and b.key_id == exact.key_id)]
            return self._matches(hits[:k])

    def _nearest(self, texts: list[str], k: int) -> list[list[tuple[Best, float]]]:
        """Top-``k`` active keys per text, as (best triple, cosine)."""
        index = self._sync_index()
        vectors = self.encoder.encode(texts)  # (n, dim), cached per query string
        scores, ids = index.search(vectors, k + _CANDIDATES)
        out = []
        for row_scores, row_ids in zip(scores.tolist(), ids.tolist()):
            found = []
            for s, kid in zip(row_scores, row_ids):
                kn = self._key_norm.get(kid)
                if kn is not None:  # -1 (no hit) and keys deleted since the index was built drop out
                    found.append((self._best[kn], float(s)))
                if len(found) == k:
                    break
            out.append(found)
        return out

    def _matches(self, hits: Sequence[tuple[Best, float, bool] | None]) -> list[Match | None]:
        sources = self.store.sources([h[0].triple_id for h in hits if h], limit=MAX_SOURCES)
        return [None if h is None else Match(
            entity=h[0].entity, relation=h[0].relation, value=h[0].value, score=h[1], triple_id=h[0].triple_id,
            exact=h[2], sources=sources.get(h[0].triple_id, ()), version=self._version,
            alternatives=h[0].n_active - 1) for h in hits]

    # -- changes ---------------------------------------------------------------------------------
    def add(self, triples: Iterable[Triple], who: str = "lmlm", why: str = "", batch_size: int = 1000,
            progress: bool | None = None) -> int:
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
        """
        total = len(triples) if hasattr(triples, "__len__") else None
        facts = (_fact(as_triple(t)) for t in triples)
        return self._write(facts, "add", who, why, batch_size, progress, total)

    def import_jsonl(self, path: str | Path, who: str = "lmlm", why: str = "", batch_size: int = 1000,
                     progress: bool | None = None) -> int:
        """Add the facts of a JSON-lines file as one version (op ``import``) and return it.

        Each line holds ``entity``, ``relation``, ``value`` and optionally ``count`` and ``sources``
        (a list of ``[doc_id, position]``) as written by :meth:`export_jsonl`, or ``source`` and
        ``position`` as in :class:`Triple`.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no JSON-lines file at {path}")
        return self._write(_read_jsonl(path), "import", who, why, batch_size, progress, None)

    def _write(self, facts: Iterable[Fact], op: str, who: str, why: str, batch_size: int,
               progress: bool | None, total: int | None) -> int:
        _check_who(who, why)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        from tqdm.auto import tqdm

        show = progress if progress is not None else (total or 0) >= PROGRESS_MIN
        with self._lock:
            with tqdm(total=total, desc="writing triples", unit="triple", disable=not show) as bar:
                version = self.store.write_facts(facts, op, who, why, batch_size, bar.update)
            self._after_write(progress)
            return version

    def delete(self, *, triple_ids: Iterable[int] | int | None = None, entity: str | None = None,
               relation: str | None = None, source: str | None = None, who: str = "lmlm", why: str = "") -> int:
        """Delete the active facts matching all given filters, as one version; returns how many.

        Deleted facts are unreachable by exact and fuzzy lookup when this returns, and stay in
        history. ``source`` deletes every fact that cites that document, whatever else cites it.
        """
        if triple_ids is None and entity is None and relation is None and source is None:
            raise ValueError("delete needs at least one of triple_ids, entity, relation, source "
                             "(refusing to delete everything)")
        _check_who(who, why)
        ids = None if triple_ids is None else [triple_ids] if isinstance(triple_ids, numbers.Integral) \
            else [int(i) for i in triple_ids]
        en = None if entity is None else _required(normalize_text(entity), "entity", entity)
        rn = None if relation is None else _required(normalize_text(relation), "relation", relation)
        with self._lock:
            _, n = self.store.delete(who, why, triple_ids=ids, entity_norm=en, relation_norm=rn, source=source)
            if n:
                self._after_write(adds_keys=False)
            return n

    def edit(self, entity: str, relation: str, new_value: str, who: str = "lmlm", why: str = "") -> int:
        """Make ``new_value`` the only active value of ``(entity, relation)``; returns the new version.

        The replaced values stay in history (``deleted_version`` set, op ``edit`` in :meth:`changes`).
        Raises KBError when the key has no active value.
        """
        t = Triple(entity.strip(), relation.strip(), new_value.strip())  # validates
        _check_who(who, why)
        with self._lock:
            version = self.store.edit(t.entity, t.relation, t.value, who, why)
            self._after_write(adds_keys=False)
            return version

    # -- reading records -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The current version of the KB (0 when nothing was ever added)."""
        return self.refresh()

    def __len__(self) -> int:
        """Number of active triples."""
        self.refresh()
        return self._n_active

    def get(self, triple_id: int) -> TripleRecord:
        """A triple by id, active or not, with its count, versions and sources."""
        with self._lock:
            record = self.store.get(triple_id)
        if record is None:
            raise KeyError(f"no triple with id {triple_id} in {self.path}")
        return record

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

    def triples(self) -> Iterator[TripleRecord]:
        """The active triples in id order, streamed from a snapshot."""
        return self.store.records(active_only=True)

    def keys(self) -> list[tuple[str, str]]:
        """The (entity, relation) of every active key, as first written."""
        self.refresh()
        return [(b.entity, b.relation) for b in list(self._best.values())]

    def stats(self) -> dict:
        with self._lock:
            self.refresh()
            header = read_header(self.path / INDEX_FILENAME) or {}
            return {"path": str(self.path), "version": self._version, **self.store.counts(),
                    "encoder": self.encoder_name, "threshold": self.threshold,
                    "index_size": len(self._index) if self._index is not None else header.get("size", 0),
                    "index_version": self._index_version if self._index is not None else header.get("version", 0)}

    def export_jsonl(self, path: str | Path) -> int:
        """Write the active triples to a JSON-lines file (readable by :meth:`import_jsonl`); returns how many."""
        n = 0
        with open(path, "w", encoding="utf-8") as f:
            for record in self.triples():
                f.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
                n += 1
        return n


def _required(norm: str, name: str, raw: str) -> str:
    if not norm:
        raise ValueError(f"{name} is empty (after normalisation): {raw!r}")
    return norm


def _check_who(who: str, why: str) -> None:
    if not isinstance(who, str) or not who.strip():
        raise ValueError(f"who must be a non-empty string, got {who!r}")
    if not isinstance(why, str):
        raise TypeError(f"why must be a string, got {type(why).__name__}")


def _fact(t: Triple) -> Fact:
    sources = ((t.source, t.position),) if t.source is not None else ()
    return Fact(t.entity.strip(), t.relation.strip(), t.value.strip(), 1, sources)


def _read_jsonl(path: Path) -> Iterator[Fact]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                t = Triple(d["entity"], d["relation"], d["value"], d.get("source"), d.get("position"))
                sources = [(str(s[0]), s[1]) for s in d.get("sources", [])]
                count = int(d.get("count", 1))
                if count < 1:
                    raise ValueError(f"count must be >= 1, got {count}")
            except (ValueError, TypeError, KeyError, IndexError) as e:
                raise ValueError(f"{path}:{lineno}: not a triple: {e}") from None
            fact = _fact(t)
            yield fact._replace(count=count, sources=fact.sources + tuple(sources))
