"""A reader's map of the store: normalised key -> its best active triple (:class:`Best`), as of
the map's ``version`` (with ``n_active``, the active triples then).

Two kinds, one interface. :class:`MemoryMap` holds every active key in Python dicts (about 450
bytes a key: at 10^6 keys 0.45 GB, read in about 5 s), so an exact lookup is a dict probe.
:class:`StoreMap` holds nothing per key: each lookup is read from the store's indexes (entity name
-> key -> triples, about 0.1 ms), as of the map's version, so it opens at once and holds nothing
at any size (the entity index, built at the first entity-aware lookup, still holds every name).
:class:`lmlm.kb.KnowledgeBase` picks by size at its first lookup: a KB that has made more than
``map_limit`` keys (default :data:`MAP_LIMIT`, or the environment's ``LMLM_KB_MAP_LIMIT``) reads
from the store. A view of a past version holds a :class:`MemoryMap` of
that version. Exercised by every lookup.
"""

from __future__ import annotations

import os
from typing import Collection, Iterable, Iterator, Sequence

import numpy as np

from .keys import KEY_SEP
from .records import Best

__all__ = ["MemoryMap", "StoreMap", "MAP_LIMIT"]

# keys above which a live KB reads lookups from the store instead of holding them
MAP_LIMIT = int(os.environ.get("LMLM_KB_MAP_LIMIT", 4_000_000))
_CACHE = 65_536  # keys a StoreMap remembers between two versions (a generation asks the same keys often)
_MISSING = object()


class MemoryMap:
    """Every active key in memory: ``key_norm -> Best`` and ``key_id -> key_norm``.

    Args:
        rows: the best triple of every active key at ``version``.
        version (int, default 0): the store version the map reflects.
    """

    in_memory = True

    def __init__(self, rows: Iterable[Best] = (), version: int = 0):
        self._best: dict[str, Best] = {}
        self._norm: dict[int, str] = {}
        self.version, self.n_active = version, 0  # n_active: active triples (a key may hold several)
        self.take_in(None, rows, version)

    def get(self, key_norm: str) -> Best | None:
        return self._best.get(key_norm)

    def __getitem__(self, key_norm: str) -> Best:
        return self._best[key_norm]

    def by_ids(self, key_ids: Iterable[int]) -> dict[int, Best]:
        """The best triple of each of ``key_ids`` that is active, by key id."""
        norm, best = self._norm, self._best
        return {k: best[norm[k]] for k in key_ids if k in norm}

    def active_among(self, key_ids: Iterable[int]) -> set[int]:
        return {k for k in key_ids if k in self._norm}

    def ids(self) -> Collection[int]:
        """Every active key id (a set-like view)."""
        return self._norm.keys()

    def id_array(self) -> np.ndarray:
        """Every active key id, ascending (int64)."""
        return np.sort(np.fromiter(self._norm.keys(), dtype=np.int64, count=len(self._norm)))

    def values(self) -> list[Best]:
        return list(self._best.values())

    def names(self) -> Iterator[tuple[str, str, str]]:
        """(entity_norm, relation_norm, entity as written) of every active key."""
        for b in self.values():
            en, rn = b.key_norm.split(KEY_SEP, 1)
            yield en, rn, b.entity

    def take_in(self, keys: Sequence[int] | None, rows: Iterable[Best], version: int) -> list[str]:
        """Replace the keys ``keys`` (None: all) by ``rows``, the map then at ``version``; returns the key_norms removed."""
        removed, delta = [], 0
        if keys is None:
            delta -= sum(b.n_active for b in self._best.values())
            self._best, self._norm = {}, {}
        else:
            for kid in keys:
                kn = self._norm.pop(kid, None)
                if kn is not None:
                    delta -= self._best.pop(kn).n_active
                    removed.append(kn)
        best, norm = self._best, self._norm
        for b in rows:
            best[b.key_norm] = b
            norm[b.key_id] = b.key_norm
            delta += b.n_active
        self.n_active += delta
        self.version = version
        return removed

    def drop(self, key_norms: Iterable[str], version: int) -> list[int]:
        """Take out keys whose one value ``version`` deleted (and nothing else); returns their key ids."""
        out = [self._best.pop(kn).key_id for kn in key_norms]
        for kid in out:
            del self._norm[kid]
        self.n_active -= len(out)  # each held one value
        self.version = version
        return out


class StoreMap:
    """Lookups read from the store as of ``version``: nothing per key in memory.

    A key's best triple is chosen as :class:`MemoryMap`'s is (highest count, then newest, then
    highest id) among the triples active at ``version``; counts are the store's present ones."""

    in_memory = False

    def __init__(self, store, version: int, n_active: int = 0):
        self.store, self.version, self.n_active = store, version, n_active
        self._cache: dict[str, Best | None] = {}

    def get(self, key_norm: str) -> Best | None:
        hit = self._cache.get(key_norm, _MISSING)
        if hit is _MISSING:
            en, _, rn = key_norm.partition(KEY_SEP)
            hit = self.store.best_of(en, rn, self.version)
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            self._cache[key_norm] = hit
        return hit

    def __getitem__(self, key_norm: str) -> Best:
        b = self.get(key_norm)
        if b is None:
            raise KeyError(key_norm)
        return b

    def by_ids(self, key_ids: Iterable[int]) -> dict[int, Best]:
        return {b.key_id: b for b in self.store.best(list(key_ids), at=self.version)}

    def active_among(self, key_ids: Iterable[int]) -> set[int]:
        return self.store.active_among(list(key_ids), at=self.version)

    def ids(self) -> set[int]:
        return set(self.id_array().tolist())

    def id_array(self) -> np.ndarray:
        return self.store.active_key_ids(self.version)

    def values(self) -> list[Best]:
        return self.store.best(None, at=self.version)

    def names(self) -> Iterator[tuple[str, str, str]]:
        return self.store.active_key_names(self.version)

    def move_to(self, version: int, n_active: int) -> None:
        self.version, self.n_active = version, n_active
        self._cache.clear()
