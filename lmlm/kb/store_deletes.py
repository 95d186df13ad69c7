"""Deleting from the store: a filter (``delete``) or a forget set (``forget``), each one version.

:class:`StoredDeletes` is mixed into :class:`lmlm.kb.store.SQLiteStore` (and so into the PostgreSQL
store). Both gather the ids to delete in a temporary table and mark them with one ``UPDATE``, so a
forget set of 50,000 facts costs a few statements, not 50,000. Exercised by ``lmlm kb delete`` and
``lmlm kb forget``.
"""

from __future__ import annotations

import numbers
from typing import Iterable, Sequence

from .keys import KEY_SEP, clean_field, normalize_text, normalize_value
from .records import Triple, required
from .schema import NoChange as _NoChange, chunks as _chunks, marks as _marks

__all__ = ["StoredDeletes", "forget_item", "never_held_item"]


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
               known: tuple[int, list[int], list[str], list[tuple[str, str]]] | None = None,
               entities: Iterable[str] = ()) -> tuple[int, int]:
        """Delete, as one version, every active triple named by any of: id, key_norm, (key_norm,
        value_norm), source document or entity_norm (all its facts). Returns (version, number deleted).

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
                self._xm("INSERT OR IGNORE INTO forget_ids(id) SELECT t.id FROM entities e JOIN keys k"
                         " ON k.entity_id = e.id JOIN triples t ON t.key_id = k.id"
                         " WHERE e.name_norm = ? AND t.deleted_version IS NULL", ((e,) for e in entities))
                return self._delete_forget_set(who, why)
        except _NoChange:
            return self.version(), 0

    def never_held(self, entity_norm: str | None, relation_norm: str | None, source: str | None) -> list[str]:
        """Which of the given names no version of the store ever held: 'entity', 'relation', 'source'."""
        checks = (("entity", entity_norm, "SELECT 1 FROM entities WHERE name_norm = ?"),
                  ("relation", relation_norm, "SELECT 1 FROM relations WHERE name_norm = ?"),
                  ("source", source, "SELECT 1 FROM documents WHERE doc_id = ?"))
        return [kind for kind, name, sql in checks if name is not None and self._x(sql, (name,)).fetchone() is None]

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


def forget_item(item, n: int) -> tuple[str, object]:
    """Classify item ``n`` of a forget set as ('id', int), ('key', key_norm), ('fact', (key_norm,
    value_norm)), ('source', doc_id) or ('entity', entity_norm)."""
    if type(item) is tuple and len(item) == 3 and type(item[0]) is type(item[1]) is type(item[2]) is str:
        en, rn = normalize_text(item[0]), normalize_text(item[1])  # the common case: a fact, three strings
        if en and rn:
            return "fact", (en + KEY_SEP + rn, normalize_value(item[2]))
    elif isinstance(item, numbers.Integral) and not isinstance(item, bool):
        return "id", int(item)
    if isinstance(item, dict):
        if "id" in item or "triple_id" in item:
            return "id", int(item.get("id", item.get("triple_id")))
        if "source" in item:
            return "source", clean_field(str(item["source"]), "source")  # as an add stores it
        if set(item) & {"entity", "relation", "value"} == {"entity"} and isinstance(item["entity"], str):
            return "entity", required(normalize_text(item["entity"]), "entity", item["entity"])
        item = tuple(item[f] for f in ("entity", "relation", "value") if f in item)
    elif isinstance(item, Triple):
        item = (item.entity, item.relation, item.value)
    if isinstance(item, (tuple, list)) and len(item) in (2, 3) and all(isinstance(x, str) for x in item):
        en, rn = normalize_text(item[0]), normalize_text(item[1])
        if not en or not rn:
            raise ValueError(f"forget item {n}: empty entity or relation in {item!r}")
        kn = en + KEY_SEP + rn
        return ("key", kn) if len(item) == 2 else ("fact", (kn, normalize_value(item[2])))
    raise ValueError(f"forget item {n} is not a triple id, (entity, relation[, value]), Triple or dict "
                     f"with id, source, entity or entity+relation: {item!r}")


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
