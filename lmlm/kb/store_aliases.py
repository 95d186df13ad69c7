"""Aliases in the store: other names of entities, versioned like triples (``lmlm kb alias``).

:class:`StoredAliases` holds the SQL of the ``aliases`` table (migration 3) and is mixed into
:class:`lmlm.kb.store.SQLiteStore` (and so into the PostgreSQL store). An alias write is one
version (op ``alias`` or ``unalias``); a delete or forget that leaves an entity without facts
deletes its aliases in the same version. Exercised by ``lmlm kb alias`` and every entity-aware lookup.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .keys import normalize_text
from .schema import chunks as _chunks, marks as _marks

__all__ = ["AliasRow", "StoredAliases", "ALIAS_COLUMNS"]

ALIAS_COLUMNS = "alias, alias_norm, entity, entity_norm"


class AliasRow(NamedTuple):
    """One alias: another name ``alias`` of ``entity``, both as written and normalised."""

    alias: str
    alias_norm: str
    entity: str
    entity_norm: str


class StoredAliases:
    """Alias reads and writes; expects the store's ``_x``, ``_xm``, ``_transaction``, ``_new_version`` and ``version``."""

    def _drop_orphan_aliases(self, v: int) -> None:
        """Delete (as of version ``v``) the aliases of every entity that version ``v`` left without a fact."""
        if not self._x("SELECT 1 FROM aliases WHERE deleted_version IS NULL LIMIT 1").fetchone():
            return  # no alias to drop: spares reading a large delete's entities
        self._x("UPDATE aliases SET deleted_version = ? WHERE deleted_version IS NULL AND entity_norm IN"
                " (SELECT e.name_norm FROM changes c JOIN triples t ON t.id = c.triple_id"
                "  JOIN keys k ON k.id = t.key_id JOIN entities e ON e.id = k.entity_id"
                "  WHERE c.version = ? AND c.op = 'delete'"
                "  AND NOT EXISTS (SELECT 1 FROM keys ka JOIN triples a ON a.key_id = ka.id"
                "   WHERE ka.entity_id = e.id AND a.deleted_version IS NULL))", (v, v))

    # -- aliases -----------------------------------------------------------------------------------
    def add_aliases(self, pairs: Sequence[tuple[str, str]], who: str, why: str,
                    strict: bool = False) -> tuple[int, int]:
        """Record ``(alias, entity)`` pairs as one version (op ``alias``); pairs already active change
        nothing. Returns (version, number added). ``strict``: ValueError for an alias that is the name of
        another entity with facts (a bulk import of redirects keeps them: the entity's own name wins)."""
        rows = {}
        for alias, entity in pairs:
            an, en = normalize_text(alias), normalize_text(entity)
            if not an or not en:
                raise ValueError(f"alias and entity must not be empty (after normalisation): {(alias, entity)!r}")
            if an != en:
                rows.setdefault((an, en), (alias.strip(), an, entity.strip(), en))
        with self._transaction():
            active = set()
            for ch in _chunks(sorted({an for an, _ in rows})):
                active.update(self._x(f"SELECT alias_norm, entity_norm FROM aliases WHERE deleted_version IS NULL"
                                      f" AND alias_norm IN ({_marks(len(ch))})", list(ch)).fetchall())
            new = [r for k, r in rows.items() if k not in active]
            for r in new if strict else ():  # an alias names one entity, not another one with facts
                if self._x("SELECT 1 FROM entities e JOIN keys k ON k.entity_id = e.id"
                           " JOIN triples t ON t.key_id = k.id WHERE e.name_norm = ? AND t.deleted_version IS NULL"
                           " LIMIT 1", (r[1],)).fetchone():
                    raise ValueError(f"{r[0]!r} is the name of an entity with facts: it cannot also name {r[2]!r} "
                                     f"(delete its facts first, or choose another alias)")
            if not new:
                return self.version(), 0
            v = self._new_version("alias", who, why)
            self._xm(f"INSERT INTO aliases({ALIAS_COLUMNS}, created_version) VALUES (?, ?, ?, ?, ?)",
                     [(*r, v) for r in new])
            self._x("UPDATE versions SET n_changed = ? WHERE version = ?", (len(new), v))
        return v, len(new)

    def delete_aliases(self, alias_norm: str, entity_norm: str | None, who: str, why: str) -> tuple[int, int]:
        """Delete the active aliases ``alias_norm`` (of ``entity_norm`` only, if given) as one version
        (op ``unalias``). Returns (version, number deleted)."""
        where, params = "deleted_version IS NULL AND alias_norm = ?", [alias_norm]
        if entity_norm is not None:
            where, params = where + " AND entity_norm = ?", params + [entity_norm]
        with self._transaction():
            (n,) = self._x(f"SELECT count(*) FROM aliases WHERE {where}", params).fetchone()
            if not n:
                return self.version(), 0
            v = self._new_version("unalias", who, why)
            self._x(f"UPDATE aliases SET deleted_version = ? WHERE {where}", [v, *params])
            self._x("UPDATE versions SET n_changed = ? WHERE version = ?", (n, v))
        return v, n

    def aliases(self, entity_norm: str | None = None, at: int | None = None) -> list[AliasRow]:
        """Active aliases (of one entity, if given; as of version ``at``, if given), oldest first."""
        if at is None:
            where, params = "deleted_version IS NULL", []
        else:
            where, params = "created_version <= ? AND (deleted_version IS NULL OR deleted_version > ?)", [at, at]
        if entity_norm is not None:
            where, params = where + " AND entity_norm = ?", params + [entity_norm]
        return [AliasRow(*r) for r in self._x(f"SELECT {ALIAS_COLUMNS} FROM aliases WHERE {where} ORDER BY id",
                                              params).fetchall()]

    def alias_changes(self, after: int, upto: int) -> tuple[list[AliasRow], list[AliasRow]]:
        """Aliases (made active, deleted) by versions in ``(after, upto]``."""
        added = self._x(f"SELECT {ALIAS_COLUMNS} FROM aliases WHERE created_version > ? AND created_version <= ?"
                        " AND (deleted_version IS NULL OR deleted_version > ?)", (after, upto, upto)).fetchall()
        gone = self._x(f"SELECT {ALIAS_COLUMNS} FROM aliases WHERE deleted_version > ? AND deleted_version <= ?",
                       (after, upto)).fetchall()
        return [AliasRow(*r) for r in added], [AliasRow(*r) for r in gone]

    def deleted_names(self, at: int | None = None) -> list[tuple[str, str, str]]:
        """(name, name_norm, entity_norm) of every entity with a deleted fact and of every deleted alias
        (as of version ``at``): the names a reader may have to answer "deleted" for."""
        upto = "" if at is None else f" AND deleted_version <= {int(at)}"
        rows = self._x("SELECT e.name, e.name_norm, e.name_norm FROM entities e WHERE e.id IN"
                       " (SELECT k.entity_id FROM keys k WHERE k.id IN (SELECT key_id FROM triples"
                       f"  WHERE deleted_version IS NOT NULL{upto}))").fetchall()
        rows += self._x("SELECT min(alias), alias_norm, entity_norm FROM aliases"
                        f" WHERE deleted_version IS NOT NULL{upto} GROUP BY alias_norm, entity_norm").fetchall()
        return [tuple(r) for r in rows]
