"""The knowledge base an LMLM looks facts up in: ``lookup(entity, relation) -> Match | None``.

A KB is one folder: ``kb.sqlite`` (triples, aliases, provenance, versions, audit log; see
:mod:`lmlm.kb.store`) and ``index.faiss`` (one MiniLM embedding per distinct key; see
:mod:`lmlm.kb.index`). Lookup tries the normalised key first (an in-memory dict hit, score 1.0).
Otherwise, by default (``matching="entity"``, :mod:`lmlm.kb.resolve`), it finds the entity on its
own (exact name, alias, the names in the text so far, a fuzzy match with a margin; a deleted or
unknown name is a miss) and then the relation among that entity's keys. ``matching="key"`` is the
paper's: the nearest key by cosine similarity (exact search for small KBs, HNSW or IVF candidates
re-scored exactly for large ones), accepted at ``threshold`` (0.6) or above. :meth:`explain` says
why a lookup missed. Adds, edits and deletes are numbered versions; they reach the dict and the index before the
call returns, and other processes see them on their next lookup (each lookup checks the store's
version, one primary-key read). :meth:`KnowledgeBase.checkout` reads a past version. Exercised by
``lmlm kb`` and ``lmlm generate``.

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

import numbers
from pathlib import Path
import threading
from typing import TYPE_CHECKING, Iterable

import numpy as np

from .encoder import DEFAULT_MODEL, Encoder, get_encoder
from .formats import Fact, fact_from, fact_of
from .index import AnnConfig, VectorKeyIndex, read_header
from .indexing import INDEX_FILENAME, PROGRESS_MIN, KeyIndexing
from .keymap import MAP_LIMIT, MemoryMap, StoreMap
from .keys import clean_field, normalize_text, normalize_value
from .reader import MAX_SOURCES, KnowledgeBaseReader
from ..memory import gc_paused
from .records import Triple, check_who, forget_item, required
from .resolve import MATCHINGS
from .store import DB_FILENAME, NEW_DB, Best, KBNotFound, NotAKnowledgeBase, SQLiteStore

if TYPE_CHECKING:
    from .view import KnowledgeBaseView

__all__ = ["KnowledgeBase", "INDEX_FILENAME", "MAX_SOURCES", "PROGRESS_MIN", "MATCHINGS", "never_held_item"]


class KnowledgeBase(KnowledgeBaseReader, KeyIndexing):
    """A versioned store of ``(entity, relation) -> value`` facts with entity-aware lookup.

    Open with :meth:`create` or :meth:`open`, not the constructor. Thread-safe: one lock guards
    each call. Close with :meth:`close` or use as a context manager.

    Attributes:
        matching (str, default ``"entity"``): ``"entity"`` finds the entity first, then the relation
            among its keys (:mod:`lmlm.kb.resolve`); ``"key"`` is the paper's single-key cosine.
        threshold (float, default 0.6): minimum cosine similarity of a key match under ``"key"``.
        relation_threshold (float, default 0.5): minimum relation similarity under ``"entity"``.
        ann_config (AnnConfig): when the key index switches from exact search to HNSW and IVF.
        map_limit (int): keys above which lookups read the store rather than a map held in memory.
    """

    def __init__(self, path: Path, store: SQLiteStore, encoder: Encoder | None = None,
                 ann: AnnConfig | None = None):
        self.path = path
        self.store = store
        self.encoder_name = store.meta().get("encoder", DEFAULT_MODEL)
        self.ann_config = ann or AnnConfig()
        self._encoder = encoder
        self._lock = threading.RLock()
        self._version = 0  # the store version the dict reflects
        self._map: MemoryMap | StoreMap = MemoryMap()  # key_norm -> best active triple (lmlm.kb.keymap)
        self._n_active = 0
        self.map_limit = MAP_LIMIT  # keys above which the map is read from the store, not held in memory
        self._index: VectorKeyIndex | None = None  # loaded on first fuzzy use or write
        self._index_version = 0  # the store version the index reflects
        self._unsaved = 0  # vectors embedded or restored since the index file was written
        self._dirty = False  # any index change (removals too) since then
        self._ents = None  # the entity index (lmlm.kb.entities), built on first entity-aware lookup
        self._rel_vecs = None  # relation name -> embedding
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
            from .postgres import PostgresStore, as_url, redact

            url = as_url(path)
            if PostgresStore.exists(url):
                if exist_ok:
                    return cls.open(url, encoder=enc, ann=ann, index_dir=index_dir)
                raise FileExistsError(f"{redact(url)} already holds a knowledge base; use KnowledgeBase.open "
                                      "or exist_ok=True")
            return cls(_index_folder(url, index_dir), PostgresStore.create(url, {"encoder": name}), enc, ann)
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
            self._maybe_save(quiet=True)
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
                return self._n_active
            return self.store.n_active()

    def __repr__(self) -> str:
        return f"KnowledgeBase({str(self.store.folder)!r}, version={self.version}, triples={len(self)})"

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = get_encoder(self.encoder_name)
        return self._encoder

    # -- keeping in step with the store -----------------------------------------------------------
    def refresh(self) -> int:
        """Pick up changes made by other processes since the last call (cheap when there are none)."""
        with self._lock:
            if not self._loaded or self.store.version() != self._version:
                self._sync()
            return self._version

    def _sync(self) -> None:
        if not self._loaded and self.store.key_bound() > self.map_limit:
            self._map = StoreMap(self.store, 0)  # a large KB: lookups read the store, nothing held per key
        if not self._map.in_memory:
            return self._catch_up_store()
        with gc_paused():  # 10^6 map entries at a first load
            self._take_in(*self.store.catch_up(self._version))

    def _take_in(self, version: int, keys: list[int] | None, rows: list[Best]) -> None:
        after = self._version
        if keys is None:
            self._ents = None
        removed, delta = self._map.take_in(keys, rows)
        self._n_active += delta
        self._version, self._loaded = version, True
        if keys is not None and after != version:
            self._ents_update(removed, rows, after)

    def _catch_up_store(self) -> None:
        """:meth:`_sync` for a map read from the store: its version and count of active triples
        move on; an entity index already built takes in the keys that changed."""
        after = self._version
        version, n = self.store.catch_up_count(after, self._n_active)
        self._map.move_to(version)
        self._n_active, self._version, self._loaded = n, version, True
        if self._ents is not None and after != version:
            keys = self.store.changed_keys(after, version)
            rows = self.store.best(keys, at=version)
            gone = set(keys).difference(b.key_id for b in rows)
            self._ents_update(self.store.key_norms(list(gone)).values(), rows, after)

    def _after_write(self, progress: bool | None = None, adds_keys: bool = True, embed: bool = True) -> None:
        """Take in a write just made. An add embeds its new keys now (unless ``embed`` is False); a
        delete or edit never adds a key, so an index not yet loaded is left for the next fuzzy lookup.
        A handle that has not read the store's map yet (one that only writes, such as an import) does
        not read it now unless the index needs it."""
        if not self._loaded and not (embed and adds_keys):
            return
        self._sync()
        if embed and (adds_keys or self._index is not None):
            self._sync_index(progress)
            self._maybe_save()


    # -- fuzzy search in the live index ----------------------------------------------------------
    def _search_index(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self._sync_index().search(vectors, k)

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
        from .ingest import add_file

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
        who, why = _check_who(who, why)
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
        who, why = _check_who(who, why)
        ids = None if triple_ids is None else [triple_ids] if isinstance(triple_ids, numbers.Integral) \
            else [int(i) for i in triple_ids]
        en = None if entity is None else _required(normalize_text(entity), "entity", entity)
        rn = None if relation is None else _required(normalize_text(relation), "relation", relation)
        source = None if source is None else _required(clean_field(source, "source"), "source", source)
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
        who, why = _check_who(who, why)
        ids, keys, facts, sources, entities = [], [], [], [], []
        lists = {"id": ids, "key": keys, "fact": facts, "source": sources, "entity": entities}
        for n, item in enumerate(items):
            kind, value = forget_item(item, n)
            lists[kind].append(value)
        with self._lock:
            known, gone = None, set()
            if self._loaded and self._map.in_memory:  # else the store looks the forget set up
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
        best = self._map
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
        return (self._version, ids, keys_left, facts_left), gone

    def _take_in_forget(self, version: int, gone: set[str]) -> None:
        """Version ``version`` deleted the only value of each key in ``gone`` and nothing else: drop
        them from the map without reading the store again."""
        after = self._version
        key_ids = self._map.drop(gone)
        self._n_active -= len(gone)  # each held one value
        self._version = version
        self._ents_update(gone, [], after)
        if self._index is not None and self._index_version == after:  # the same keys out of the index
            self._dirty |= bool(self._index.remove(key_ids))
            self._index_version = version

    def edit(self, entity: str, relation: str, new_value: str, who: str = "lmlm", why: str = "") -> int:
        """Make ``new_value`` the only active value of ``(entity, relation)``; returns the new version
        (the current one when it already was).

        The replaced values stay in history (``deleted_version`` set, op ``edit`` in :meth:`changes`).
        Raises KBError when the key has no active value.
        """
        f = fact_of(Triple(entity, relation, new_value))  # validated, and cleaned as an add stores it
        who, why = _check_who(who, why)
        with self._lock:
            version = self.store.edit(f.entity, f.relation, f.value, who, why)
            self._after_write(adds_keys=False)
            return version

    # -- aliases (their lookups: lmlm.kb.resolve) -----------------------------------------------------------------------------------
    def add_aliases(self, pairs: Iterable[tuple[str, str]], who: str = "lmlm", why: str = "",
                    strict: bool = False) -> int:
        """Record other names of entities, ``(alias, entity)`` pairs, as one version; returns it.

        An alias is another way the text may name an entity: a short name, ``"Lovelace, Ada"``, a
        Wikipedia redirect. An alias of an entity with no facts is kept and used once it has some;
        deleting an entity's last fact deletes its aliases. ``strict``: refuse (ValueError) an alias that
        is the name of another entity with facts, which would answer for it once that entity is deleted.
        """
        who, why = _check_who(who, why)
        pairs = [(clean_field(str(a), "alias"), clean_field(str(e), "entity")) for a, e in pairs]
        with self._lock:
            version, n = self.store.add_aliases(pairs, who, why, strict=strict)
            if n:
                self._after_write(adds_keys=False)
            return version

    def delete_alias(self, alias: str, entity: str | None = None, who: str = "lmlm", why: str = "") -> int:
        """Delete the alias ``alias`` (of ``entity`` only, if given) as one version; returns how many."""
        who, why = _check_who(who, why)
        an = _required(normalize_text(alias), "alias", alias)
        en = None if entity is None else _required(normalize_text(entity), "entity", entity)
        with self._lock:
            _, n = self.store.delete_aliases(an, en, who, why)
            if n:
                self._after_write(adds_keys=False)
            return n

    # -- past versions and counts -----------------------------------------------------------------
    def checkout(self, version: int) -> "KnowledgeBaseView":
        """A read-only snapshot of the KB as it was at ``version`` (a :class:`~lmlm.kb.view.KnowledgeBaseView`):
        lookup, search, triples, export."""
        from .view import KnowledgeBaseView

        return KnowledgeBaseView(self, version)

    def stats(self) -> dict:
        with self._lock:
            header = read_header(self.path / INDEX_FILENAME) or {}
            loaded = self._index is not None
            return {"path": str(self.path), "version": self.version, **self.store.counts(),
                    "encoder": self.encoder_name, "matching": self.matching, "threshold": self.threshold,
                    "relation_threshold": self.relation_threshold,
                    "index_size": len(self._index) if loaded else header.get("size", 0),
                    "index_version": self._index_version if loaded else header.get("version", 0),
                    "index_kind": self._index.ann_kind if loaded else header.get("ann", "flat"),
                    "map": ("memory" if self._map.in_memory else "store") if self._loaded else "unread"}


def _is_url(path) -> bool:
    from .postgres import is_url

    return is_url(path)


def _index_folder(url: str, index_dir: str | Path | None) -> Path:
    from .postgres import index_cache_dir

    folder = Path(index_dir) if index_dir is not None else index_cache_dir(url)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def never_held_item(kb, item) -> str | None:
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


_required, _check_who = required, check_who  # the names the package used
