"""Reading a knowledge base as it was at a past version: checkout and diff.

A triple is active at version ``V`` when ``created_version <= V`` and it was not deleted by ``V``;
its count at ``V`` is the sum of the ``count_delta`` of its changes up to ``V``; its sources at
``V`` are those recorded by ``V``. :class:`PastVersions` holds the SQL for this and is mixed into
:class:`lmlm.kb.store.SQLiteStore` (see there for where the store's SQL lives). Exercised by
``lmlm kb diff`` and ``lmlm kb checkout``.
"""

from __future__ import annotations

import sqlite3
from typing import Iterator

from .records import Best, DiffEntry, KBError, TripleRecord, group_records
from .keys import KEY_SEP
from .schema import ACTIVE_AT, KEY_IS, KEY_NORM, NAMED, NO_POSITION

__all__ = ["PastVersions"]

# count of each triple at version ?, from its changes
_COUNTS_AT = "SELECT triple_id, sum(count_delta) AS count FROM changes WHERE version <= ? GROUP BY triple_id"


class PastVersions:
    """Reads of past versions; expects ``self.conn`` (sqlite3), ``self.folder`` and ``self.version()``."""

    conn: sqlite3.Connection

    def check_version(self, version: int) -> int:
        """``version`` as an int if it exists (0 is the empty KB), else a KBError naming the range."""

        current = self.version()
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= current:
            raise KBError(f"no version {version!r} in the knowledge base at {self.folder}: "
                          f"versions run from 0 to {current}")
        return version

    def best_at(self, version: int) -> list:
        """Like ``best()`` for every key, as of ``version``: the best-supported triple then, per key."""

        v = self.check_version(version)
        rows = self._x(
            f"WITH n AS ({_COUNTS_AT}) SELECT t.key_id, {KEY_NORM}, t.id, e.name, r.name, t.value, n.count,"
            f" t.created_version FROM {NAMED} JOIN n ON n.triple_id = t.id"
            f" WHERE {ACTIVE_AT} ORDER BY t.key_id, n.count DESC, t.created_version DESC, t.id DESC",
            (v, v, v)).fetchall()
        return Best.per_key(rows)

    def records_at(self, version: int, key_norm: str | None = None) -> Iterator[TripleRecord]:
        """The triples active at ``version`` (under ``key_norm`` only, if given) in id order, with
        their counts and sources then."""

        v = self.check_version(version)
        only, params = ("", ()) if key_norm is None else (f" AND {KEY_IS}", tuple(key_norm.split(KEY_SEP, 1)))
        counts = _COUNTS_AT if key_norm is None else _COUNTS_AT.replace(
            "WHERE version <= ?", f"WHERE version <= ? AND triple_id IN (SELECT t.id FROM triples t WHERE {KEY_IS})")
        yield from group_records(self._x(
            f"WITH n AS ({counts}) SELECT t.id, e.name, r.name, t.value, n.count, t.created_version, NULL,"
            f" d.doc_id, nullif(s.position, {NO_POSITION}) FROM {NAMED} JOIN n ON n.triple_id = t.id"
            " LEFT JOIN sources s ON s.triple_id = t.id AND s.version <= ? LEFT JOIN documents d ON d.id = s.doc"
            f" WHERE {ACTIVE_AT}{only} ORDER BY t.id, s.doc, s.position", (v, *params, v, v, v, *params)))

    def counts_at(self, version: int) -> dict[str, int]:
        v = self.check_version(version)
        q = lambda sql, *p: self._x(sql, p).fetchone()[0] or 0  # noqa: E731
        return {
            "triples": q(f"SELECT count(*) FROM triples t WHERE {ACTIVE_AT}", v, v),
            "keys": q(f"SELECT count(DISTINCT key_id) FROM triples t WHERE {ACTIVE_AT}", v, v),
            "deleted": q("SELECT count(*) FROM triples WHERE deleted_version <= ?", v),
            "sources": q("SELECT count(*) FROM sources WHERE version <= ?", v),
            "documents": q("SELECT count(DISTINCT doc) FROM sources WHERE version <= ?", v),
            "versions": v,
        }

    def diff(self, a: int, b: int) -> list[DiffEntry]:
        """What changed from version ``a`` to version ``b`` (either may be the older), by triple id.

        ``added``: active at ``b``, not at ``a``; ``removed``: the reverse; ``support``: active at
        both with another count. A triple added and deleted between the two does not appear.
        """
        a, b = self.check_version(a), self.check_version(b)
        lo, hi = min(a, b), max(a, b)
        rows = self._x(
            f"WITH lo AS ({_COUNTS_AT}), hi AS ({_COUNTS_AT}),"
            " touched AS (SELECT DISTINCT triple_id FROM changes WHERE version > ? AND version <= ?)"
            " SELECT t.id, e.name, r.name, t.value, t.created_version, t.deleted_version, lo.count, hi.count"
            f" FROM {NAMED} JOIN touched ON touched.triple_id = t.id LEFT JOIN lo ON lo.triple_id = t.id"
            " LEFT JOIN hi ON hi.triple_id = t.id ORDER BY t.id", (lo, hi, lo, hi)).fetchall()
        out = []
        for tid, e, r, val, created, deleted, n_lo, n_hi in rows:
            at_lo = created <= lo and (deleted is None or deleted > lo)
            at_hi = created <= hi and (deleted is None or deleted > hi)
            n_lo, n_hi = (n_lo or 0) if at_lo else 0, (n_hi or 0) if at_hi else 0
            if at_lo == at_hi and n_lo == n_hi:
                continue
            op = "support" if at_lo and at_hi else "added" if at_hi else "removed"
            if a > b:  # reading backwards: what was added is removed
                op = {"added": "removed", "removed": "added"}.get(op, op)
                n_lo, n_hi = n_hi, n_lo
            out.append(DiffEntry(op, tid, e, r, val, n_lo, n_hi))
        return out
