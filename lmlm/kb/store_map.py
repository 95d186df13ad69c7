"""What a reader's map of the store is read from: the best active triple of every key, and what
changed since a version.

:class:`StoredMap` is mixed into :class:`lmlm.kb.store.SQLiteStore` (and so into the PostgreSQL
store); :class:`lmlm.kb.KnowledgeBase` keeps its map in step with these reads. Exercised by every
lookup's ``refresh``.
"""

from __future__ import annotations

from typing import Sequence

from .keys import KEY_SEP
from .records import Best
from .schema import KEY_NORM, NAMED, chunks as _chunks, marks as _marks

__all__ = ["StoredMap"]


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

    def n_active(self) -> int:
        """How many triples are active."""
        return self._x("SELECT count(*) FROM triples WHERE deleted_version IS NULL").fetchone()[0]

    def changed_keys(self, after: int, upto: int) -> list[int]:
        """Ids of keys touched by versions in ``(after, upto]``."""
        return [r[0] for r in self._x(
            "SELECT DISTINCT t.key_id FROM changes c JOIN triples t ON t.id = c.triple_id"
            " WHERE c.version > ? AND c.version <= ?", (after, upto))]

    def best(self, key_ids: Sequence[int] | None = None) -> list[Best]:
        """The best-supported active triple per key (highest count, then newest), for ``key_ids`` or all keys."""
        if key_ids is None:
            return self._best_all()
        sql = (f"SELECT t.key_id, {KEY_NORM}, t.id, e.name, r.name, t.value, t.count, t.created_version"
               f" FROM {NAMED} WHERE t.deleted_version IS NULL AND t.key_id IN ({{}})"
               " ORDER BY t.key_id, t.count DESC, t.created_version DESC, t.id DESC")
        rows = []
        for ch in _chunks(sorted(set(key_ids))):
            rows += self._x(sql.format(_marks(len(ch))), list(ch)).fetchall()
        return Best.per_key(rows)

    def _best_all(self) -> list[Best]:
        """:meth:`best` of every key, from one pass over each table joined here: at 10^6 keys a third
        of the time of SQLite's four-table join and sort (its caller pauses garbage collection)."""
        ents = {i: (name, norm) for i, name, norm in self._x("SELECT id, name, name_norm FROM entities")}
        rels = {i: (name, norm) for i, name, norm in self._x("SELECT id, name, name_norm FROM relations")}
        top: dict[int, list] = {}  # key id -> [triple id, value, count, created, active values]
        for kid, tid, value, count, created in self._x(
                "SELECT key_id, id, value, count, created_version FROM triples WHERE deleted_version IS NULL"):
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
