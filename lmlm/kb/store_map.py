"""What a reader's map of the store is read from: the best active triple of every key (or of one
key, for a map that holds nothing: :class:`lmlm.kb.keymap.StoreMap`), and what changed since a version.

:class:`StoredMap` is mixed into :class:`lmlm.kb.store.SQLiteStore` (and so into the PostgreSQL
store); :class:`lmlm.kb.KnowledgeBase` keeps its map in step with these reads. Exercised by every
lookup's ``refresh``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from .keys import KEY_SEP
from .records import Best
from .schema import ACTIVE_AT, KEY_IS, KEY_NORM, NAMED, chunks as _chunks, marks as _marks

__all__ = ["StoredMap"]

_BEST = (f"SELECT t.key_id, {KEY_NORM}, t.id, e.name, r.name, t.value, t.count, t.created_version FROM {NAMED}"
         " WHERE {}ORDER BY t.key_id, t.count DESC, t.created_version DESC, t.id DESC")


class StoredMap:
    """Reads for a reader's map; expects the store's ``_x``, ``_transaction`` and ``version``."""

    def catch_up(self, after: int) -> tuple[int, list[int] | None, list[Best]]:
        """What changed since version ``after``, read as one snapshot.

        Returns (version, ids of keys touched or None for all keys, best triple of each touched key
        that still has an active value).
        """
        with self._transaction(write=False):
            v = self.version()
            if after <= 0:
                return v, None, self.best()
            keys = self.changed_keys(after, v)
            return v, keys, self.best(keys)

    def catch_up_count(self, after: int, n: int) -> tuple[int, int]:
        """(version, triples active then), read as one snapshot, from ``n`` triples active at version
        ``after``: counted at a first read (``after`` 0), then moved on by the changes since."""
        with self._transaction(write=False):
            v = self.version()
            return v, (self.n_active() if after <= 0 else n + self.active_change(after, v))

    def n_active(self) -> int:
        """How many triples are active."""
        return self._x("SELECT count(*) FROM triples WHERE deleted_version IS NULL").fetchone()[0]

    def changed_keys(self, after: int, upto: int) -> list[int]:
        """Ids of keys touched by versions in ``(after, upto]``."""
        return [r[0] for r in self._x(
            "SELECT DISTINCT t.key_id FROM changes c JOIN triples t ON t.id = c.triple_id"
            " WHERE c.version > ? AND c.version <= ?", (after, upto))]

    def best(self, key_ids: Sequence[int] | None = None, at: int | None = None) -> list[Best]:
        """The best-supported active triple per key (highest count, then newest), for ``key_ids`` or
        all keys; with ``at``, among the triples active at that version (counts as they are now)."""
        if key_ids is None:
            return self._best_all(at)
        active, params = ("t.deleted_version IS NULL", []) if at is None else (ACTIVE_AT, [at, at])
        rows = []
        for ch in _chunks(sorted(set(key_ids))):
            rows += self._x(_BEST.format(f"{active} AND t.key_id IN ({_marks(len(ch))}) "), [*params, *ch]).fetchall()
        return Best.per_key(rows)

    def best_of(self, entity_norm: str, relation_norm: str, at: int) -> Best | None:
        """:meth:`best` of one key by its normalised names, at version ``at``; None when it has no active value."""
        rows = self._x(_BEST.format(f"{KEY_IS} AND {ACTIVE_AT} "), (entity_norm, relation_norm, at, at)).fetchall()
        return Best.per_key(rows)[0] if rows else None

    def active_among(self, key_ids: Sequence[int], at: int) -> set[int]:
        """Those of ``key_ids`` with a value active at version ``at``."""
        out: set[int] = set()
        for ch in _chunks(sorted(set(key_ids))):
            out.update(r[0] for r in self._x(
                f"SELECT DISTINCT t.key_id FROM triples t WHERE t.key_id IN ({_marks(len(ch))}) AND {ACTIVE_AT}",
                [*ch, at, at]))
        return out

    def active_key_ids(self, at: int) -> np.ndarray:
        """Every key id with a value active at version ``at``, ascending."""
        return np.fromiter((r[0] for r in self._x(
            f"SELECT DISTINCT t.key_id FROM triples t WHERE {ACTIVE_AT} ORDER BY t.key_id", (at, at))), dtype=np.int64)

    def active_key_names(self, at: int) -> Iterator[tuple[str, str, str]]:
        """(entity_norm, relation_norm, entity as written) of every key active at version ``at``,
        streamed (what an entity index is built from, without the values)."""
        return iter(self._x(
            "SELECT e.name_norm, r.name_norm, e.name FROM keys k JOIN entities e ON e.id = k.entity_id"
            " JOIN relations r ON r.id = k.relation_id"
            f" WHERE k.id IN (SELECT t.key_id FROM triples t WHERE {ACTIVE_AT})", (at, at)))

    def active_change(self, after: int, upto: int) -> int:
        """How many more triples are active at version ``upto`` than at ``after``: each add counts
        one, each delete (or value replaced by an edit) minus one."""
        return self._x("SELECT coalesce(sum(CASE op WHEN 'add' THEN 1 WHEN 'support' THEN 0 ELSE -1 END), 0)"
                       " FROM changes WHERE version > ? AND version <= ?", (after, upto)).fetchone()[0]

    def key_norms(self, key_ids: Sequence[int]) -> dict[int, str]:
        """The normalised key of each of ``key_ids``."""
        out: dict[int, str] = {}
        for ch in _chunks(sorted(set(key_ids))):
            out.update(self._x(f"SELECT k.id, {KEY_NORM} FROM keys k JOIN entities e ON e.id = k.entity_id"
                               " JOIN relations r ON r.id = k.relation_id"
                               f" WHERE k.id IN ({_marks(len(ch))})", list(ch)))
        return out

    def key_bound(self) -> int:
        """The highest key id (the number of keys ever made, deleted ones included); read at once."""
        return self._x("SELECT coalesce(max(id), 0) FROM keys").fetchone()[0]

    def _best_all(self, at: int | None = None) -> list[Best]:
        """:meth:`best` of every key, from one pass over each table joined here: at 10^6 keys a third
        of the time of SQLite's four-table join and sort (its caller pauses garbage collection)."""
        active, params = ("t.deleted_version IS NULL", ()) if at is None else (ACTIVE_AT, (at, at))
        ents = {i: (name, norm) for i, name, norm in self._x("SELECT id, name, name_norm FROM entities")}
        rels = {i: (name, norm) for i, name, norm in self._x("SELECT id, name, name_norm FROM relations")}
        top: dict[int, list] = {}  # key id -> [triple id, value, count, created, active values]
        for kid, tid, value, count, created in self._x(
                f"SELECT t.key_id, t.id, t.value, t.count, t.created_version FROM triples t WHERE {active}", params):
            cur = top.get(kid)
            if cur is None:
                top[kid] = [tid, value, count, created, 1]
            else:  # the best is the highest count, then the newest version, then the highest id
                cur[4] += 1
                if (count, created, tid) > (cur[2], cur[3], cur[0]):
                    cur[:4] = tid, value, count, created
        out, make = [], tuple.__new__
        for kid, e, r in self._x("SELECT id, entity_id, relation_id FROM keys ORDER BY id"):
            cur = top.get(kid)
            if cur is not None:
                (en, enorm), (rn, rnorm) = ents[e], rels[r]
                out.append(make(Best, (kid, enorm + KEY_SEP + rnorm, cur[0], en, rn, cur[1], cur[2], cur[3], cur[4])))
        return out

    def key_texts(self, key_ids: Sequence[int] | None = None) -> list[tuple[int, str, str]]:
        """(key_id, entity, relation) as first written, for embedding; None: every key with an active value."""
        sql = ("SELECT k.id, e.name, r.name FROM keys k JOIN entities e ON e.id = k.entity_id"
               " JOIN relations r ON r.id = k.relation_id WHERE k.id IN ")
        if key_ids is None:
            return self._x(sql + "(SELECT key_id FROM triples WHERE deleted_version IS NULL) ORDER BY k.id").fetchall()
        out = []
        for ch in _chunks(list(key_ids)):
            out += self._x(f"{sql}({_marks(len(ch))})", list(ch)).fetchall()
        return out
