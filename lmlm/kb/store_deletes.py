"""Deleting from the store: a filter (``delete``) or a forget set (``forget``), each one version.

:class:`StoredDeletes` is mixed into :class:`lmlm.kb.store.SQLiteStore` (and so into the PostgreSQL
store). Both gather the ids to delete in a temporary table and mark them with one ``UPDATE``, so a
forget set of 50,000 facts costs a few statements, not 50,000. Exercised by ``lmlm kb delete`` and
``lmlm kb forget``.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .keys import KEY_SEP
from .schema import NoChange as _NoChange, chunks as _chunks, marks as _marks

__all__ = ["StoredDeletes"]


class StoredDeletes:
    """Deletes; expects the store's ``_x``, ``_xm``, ``_transaction``, ``_new_version``,
    ``_finish_version``, ``version`` and ``_drop_orphan_aliases``."""

    def delete(self, who: str, why: str, triple_ids: Sequence[int] | None = None, entity_norm: str | None = None,
               relation_norm: str | None = None, source: str | None = None) -> tuple[int, int]:
        """Mark matching active triples deleted (filters are ANDed). Returns (version, number deleted)."""
        where, params = ["t.deleted_version IS NULL"], []
        if entity_norm is not None:
            where.append("k.entity_id = (SELECT id FROM entities WHERE name_norm = ?)"), params.append(entity_norm)
        if relation_norm is not None:
            where.append("k.relation_id = (SELECT id FROM relations WHERE name_norm = ?)"), params.append(relation_norm)
        if source is not None:
            where.append("t.id IN (SELECT s.triple_id FROM sources s JOIN documents d ON d.id = s.doc"
                         " WHERE d.doc_id = ?)"), params.append(source)
        sql = ("INSERT OR IGNORE INTO forget_ids(id) SELECT t.id FROM triples t JOIN keys k ON k.id = t.key_id"
               " WHERE " + " AND ".join(where))
        try:
            with self._transaction():
                self._start_forget_set()
                if triple_ids is None:
                    self._x(sql, params)
                else:
                    for ch in _chunks(sorted({int(i) for i in triple_ids})):
                        self._x(f"{sql} AND t.id IN ({_marks(len(ch))})", [*params, *ch])
                return self._delete_forget_set(who, why)
        except _NoChange:
            return self.version(), 0

    def forget(self, who: str, why: str, triple_ids: Iterable[int] = (), keys: Iterable[str] = (),
               facts: Iterable[tuple[str, str]] = (), sources: Iterable[str] = (),
               known: tuple[int, list[int], list[str], list[tuple[str, str]]] | None = None) -> tuple[int, int]:
        """Delete, as one version, every active triple named by any of: id, key_norm, (key_norm,
        value_norm) or source document. Returns (version, number deleted).

        ``known``, ``(version, ids, keys, facts)``: what a reader's map of the store at ``version``
        already resolved (the ids of some of ``keys`` and ``facts``, and the ones it could not); used
        only if the store is still at that version, so nothing written since is missed.
        """
        try:
            with self._transaction():
                self._start_forget_set()
                if known is not None and known[0] == self.version():
                    triple_ids, keys, facts = [*triple_ids, *known[1]], known[2], known[3]
                self._xm("INSERT OR IGNORE INTO forget_ids(id) VALUES (?)", ((int(i),) for i in triple_ids))
                named = [(*k.split(KEY_SEP, 1), None) for k in keys]
                named += [(*k.split(KEY_SEP, 1), vn) for k, vn in facts]
                if named:
                    self._xm("INSERT INTO forget_facts(en, rn, vn) VALUES (?, ?, ?)", named)
                    self._x("INSERT OR IGNORE INTO forget_ids(id) SELECT t.id FROM forget_facts f"
                            " JOIN entities e ON e.name_norm = f.en JOIN relations r ON r.name_norm = f.rn"
                            " JOIN keys k ON k.entity_id = e.id AND k.relation_id = r.id"
                            " JOIN triples t ON t.key_id = k.id"
                            " WHERE t.deleted_version IS NULL AND (f.vn IS NULL OR t.value_norm = f.vn)")
                self._xm("INSERT OR IGNORE INTO forget_ids(id) SELECT s.triple_id FROM sources s"
                         " JOIN documents d ON d.id = s.doc WHERE d.doc_id = ?", ((d,) for d in sources))
                return self._delete_forget_set(who, why)
        except _NoChange:
            return self.version(), 0

    def _start_forget_set(self) -> None:
        """Empty this connection's temporary tables of ids and facts to delete."""
        self._x("CREATE TEMP TABLE IF NOT EXISTS forget_ids (id INTEGER PRIMARY KEY)")
        self._x("CREATE TEMP TABLE IF NOT EXISTS forget_facts (en TEXT NOT NULL, rn TEXT NOT NULL, vn TEXT)")
        self._x("DELETE FROM forget_ids")
        self._x("DELETE FROM forget_facts")

    def _delete_forget_set(self, who: str, why: str) -> tuple[int, int]:
        """Mark the active triples among ``forget_ids`` deleted, as a new version."""
        self._x("DELETE FROM forget_ids WHERE NOT EXISTS (SELECT 1 FROM triples t"
                " WHERE t.id = forget_ids.id AND t.deleted_version IS NULL)")
        (n,) = self._x("SELECT count(*) FROM forget_ids").fetchone()
        if n == 0:
            raise _NoChange
        v = self._new_version("delete", who, why)
        self._x("INSERT INTO changes(version, triple_id, op) SELECT ?, id, 'delete' FROM forget_ids ORDER BY id", (v,))
        self._x("UPDATE triples SET deleted_version = ? WHERE id IN (SELECT id FROM forget_ids)", (v,))
        self._drop_orphan_aliases(v)
        self._finish_version(v)
        return v, n
