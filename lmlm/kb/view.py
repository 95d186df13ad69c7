"""A read-only view of a knowledge base at a past version: ``kb.checkout(version)``.

The view answers ``lookup``, ``lookup_batch``, ``search``, ``triples``, ``stats`` and ``export``
as the KB did at that version (values, counts, sources), and refuses every write. Its fuzzy
lookups share the live KB's key index: keys of the past version that are no longer live are
searched through a :class:`~lmlm.kb.index.Selection` (keys deleted since keep their vectors as
dead rows; keys the index never held are embedded once). Matches name the view's version, so a
generation trace says which version it read. Exercised by ``lmlm kb checkout`` and
``lmlm kb lookup --at``.

Examples:
    >>> old = kb.checkout(3)
    >>> old.lookup("Ada Lovelace", "Birth City").version
    3
"""

from __future__ import annotations

import numpy as np

from .encoder import Encoder
from .index import Selection
from .keymap import MemoryMap
from .keys import key_text, normalize_key
from .reader import MAX_SOURCES, KnowledgeBaseReader
from .records import TripleRecord
from .store import KBError

__all__ = ["KnowledgeBaseView"]


_WRITES = frozenset({"add", "delete", "edit", "forget", "import_file", "import_jsonl", "add_aliases", "delete_alias",
                     "embed", "put_vectors", "checkout"})


class KnowledgeBaseView(KnowledgeBaseReader):
    """``kb`` as it was at ``version``: a snapshot that reads, and has no writes. Closing it leaves ``kb`` open."""

    def __init__(self, kb, version: int):  # kb: the live lmlm.kb.KnowledgeBase (which imports this module)
        self._parent = kb
        self.path, self.store, self.encoder_name = kb.path, kb.store, kb.encoder_name
        self.threshold, self.ann_config = kb.threshold, kb.ann_config
        self._lock = kb._lock
        with self._lock:
            rows = kb.store.best_at(version)
        self._version = version
        self._map = MemoryMap(rows)
        self._n_active = sum(b.n_active for b in rows)
        self._selection: Selection | None = None
        self.matching, self.relation_threshold = kb.matching, kb.relation_threshold
        self._ents = None  # built on first use from this version's keys, aliases and deleted names
        self._rel_vecs = kb._relation_vectors()

    def _at(self) -> dict:
        return {"at": self._version}

    def __repr__(self) -> str:
        return f"KnowledgeBaseView({str(self.path)!r}, version={self._version}, triples={self._n_active})"

    @property
    def encoder(self) -> Encoder:
        return self._parent.encoder

    def refresh(self) -> int:
        return self._version

    def close(self) -> None:
        """Nothing to release: the view borrows the store of the KB it came from."""

    def __getattr__(self, name: str):
        if name in _WRITES:  # what a live KB has and a snapshot does not: say so, by name
            raise KBError(f"the view of {self.path} at version {self._version} is read-only (no {name}); "
                          "write to the knowledge base itself")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- fuzzy search within the keys of this version ---------------------------------------------
    def _sync_index(self, progress: bool | None = None):
        return self._parent._sync_index(progress)

    def _search_index(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        index = self._parent._sync_index()
        if self._selection is None or self._selection.generation != index.generation:
            missing = [kid for kid in self._map.ids() if not index.has_vector(kid)]
            if missing:  # keys the live index never held: embed them once, as dead rows
                rows = self.store.key_texts(missing)
                vecs = self.encoder.encode([key_text(e, r) for _, e, r in rows], cache=False)
                index.add(np.array([k for k, _, _ in rows], dtype=np.int64), vecs, alive=False)
            self._selection = index.select(self._map.ids())
        return index.search(vectors, k, within=self._selection)

    def _sources(self, triple_ids: list[int]) -> dict[int, tuple[str, ...]]:
        return self.store.sources(triple_ids, limit=MAX_SOURCES, at=self._version)

    # -- records ---------------------------------------------------------------------------------
    def triples(self):
        """The triples active at this version, with their counts and sources then."""
        return self.store.records(at=self._version)

    def values(self, entity: str, relation: str) -> list[TripleRecord]:
        with self._lock:
            kept = list(self.store.records_at(self._version, normalize_key(entity, relation)))
        return sorted(kept, key=lambda r: (-r.count, -r.created_version, -r.id))

    def log(self, limit: int | None = 20):
        return [r for r in self.store.log(None) if r.version <= self._version][:limit]

    def stats(self) -> dict:
        with self._lock:
            return {"path": str(self.path), "version": self._version, "read_only": True,
                    **self.store.counts_at(self._version), "encoder": self.encoder_name,
                    "threshold": self.threshold, "current_version": self._parent.version}

