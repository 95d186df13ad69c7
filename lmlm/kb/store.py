"""Triple storage with provenance and history: SQLite in one folder (``kb.sqlite``).

Every change (add, import, edit, delete) is one numbered version written in one transaction, so a
crash at any point leaves the store at the previous version or the next one, never in between.
Nothing is ever overwritten: a deleted or edited fact keeps its row with ``deleted_version`` set,
and ``changes`` says what each version did to each triple. The schema is built by numbered,
append-only migrations (:data:`lmlm.kb.schema.MIGRATIONS`).

The knowledge base uses only the methods of :class:`SQLiteStore` (no SQL outside this module,
:mod:`lmlm.kb.versions`, which reads past versions, and :mod:`lmlm.kb.store_aliases`), so a
server-backed store implements the same methods (:class:`lmlm.kb.postgres.PostgresStore`).
Exercised by every ``lmlm kb`` command.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from .keys import KEY_SEP, normalize_text, normalize_value
from .records import Best, Change, KBError, KBNotFound, NotAKnowledgeBase, TripleRecord, VersionRecord, _group_records
from .schema import DB_FILENAME, FORMAT, MIGRATIONS
from .store_aliases import StoredAliases
from .versions import PastVersions

__all__ = ["DB_FILENAME", "FORMAT", "MIGRATIONS", "Fact", "Best",
           "SQLiteStore", "KBError", "NotAKnowledgeBase", "KBNotFound"]

_IN_CHUNK = 500  # ids per "IN (...)" clause, below SQLite's variable limit


class Fact(NamedTuple):
    """A fact to write: seen ``count`` more times, in ``sources`` ((doc_id, position) pairs)."""

    entity: str
    relation: str
    value: str
    count: int = 1
    sources: tuple[tuple[str, int | None], ...] = ()


class _NoChange(Exception):
    """Raised inside a write transaction that changed nothing, to roll it back without a version."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _chunks(items: Sequence, n: int = _IN_CHUNK) -> Iterator[Sequence]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _marks(n: int) -> str:
    return ",".join("?" * n)


class SQLiteStore(PastVersions, StoredAliases):
    """The SQLite store of one KB folder. One connection, WAL mode; safe to share between threads."""

    def __init__(self, folder: Path, conn: sqlite3.Connection):
        self.folder = folder
        self.conn = conn
        self._lock = threading.RLock()

    # -- opening ---------------------------------------------------------------------------------
    @staticmethod
    def _connect(db: Path, create: bool) -> sqlite3.Connection:
        uri = db.resolve().as_uri() + ("?mode=rwc" if create else "?mode=rw")
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=60.0)
        conn.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, and the reverse
        conn.execute("PRAGMA synchronous=FULL")  # one fsync per version; versions are coarse
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA cache_size=-65536")  # 64 MiB of pages: lookups at 10^6 triples stay in memory
        return conn

    @classmethod
    def create(cls, folder: Path, meta: dict[str, str]) -> "SQLiteStore":
        db = folder / DB_FILENAME
        store = cls(folder, cls._connect(db, create=True))
        store.migrate()
        with store._transaction():
            store._xm("INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)",
                      [("format", FORMAT), ("created", _now()), *meta.items()])
        return store

    @classmethod
    def open(cls, folder: Path) -> "SQLiteStore":
        db = folder / DB_FILENAME
        if not db.is_file():
            raise NotAKnowledgeBase(f"{folder} is not a knowledge base: it has no {DB_FILENAME}")
        conn = None
        try:
            conn = cls._connect(db, create=False)
            store = cls(folder, conn)
            fmt = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        except sqlite3.DatabaseError as e:
            if conn is not None:
                conn.close()
            raise NotAKnowledgeBase(f"{db} is not a knowledge base database ({e})") from None
        if fmt is None or fmt[0] != FORMAT:
            store.close()
            raise NotAKnowledgeBase(f"{db} is an SQLite file but not an lmlm knowledge base (format={fmt})")
        store.migrate()
        return store

    def close(self) -> None:
        self.conn.close()

    def schema_version(self) -> int:
        self.conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = self.conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return row[0] or 0

    def migrate(self) -> None:
        """Apply the migrations this database has not seen, each in its own transaction."""
        with self._lock:
            current = self.schema_version()
            if current > len(MIGRATIONS):
                raise KBError(f"{self.folder} has schema version {current}, newer than this lmlm knows "
                              f"({len(MIGRATIONS)}); upgrade lmlm")
            for n in range(current + 1, len(MIGRATIONS) + 1):
                try:
                    self.conn.executescript(f"BEGIN IMMEDIATE; {MIGRATIONS[n - 1]}; "
                                            f"INSERT INTO schema_version(version) VALUES ({n}); COMMIT;")
                except sqlite3.Error:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise

    def meta(self) -> dict[str, str]:
        return dict(self._x("SELECT name, value FROM meta").fetchall())

    # -- statements (a server-backed store translates these) -------------------------------------
    def _x(self, sql: str, params: Sequence = ()):
        """Run one statement; returns a cursor."""
        return self.conn.execute(sql, params)

    def _xm(self, sql: str, rows: Iterable[Sequence]) -> None:
        """Run one statement for each parameter row."""
        self.conn.executemany(sql, rows)

    # -- transactions ----------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def _new_version(self, op: str, who: str, why: str) -> int:
        v = self.version() + 1
        self._x("INSERT INTO versions(version, time, who, why, op) VALUES (?, ?, ?, ?, ?)",
                (v, _now(), who, why, op))
        return v

    def _finish_version(self, v: int) -> None:
        (n,) = self._x("SELECT count(*) FROM changes WHERE version = ?", (v,)).fetchone()
        if n == 0:
            raise _NoChange
        self._x("UPDATE versions SET n_changed = ? WHERE version = ?", (n, v))

    def version(self) -> int:
        """The latest version (0 for an empty store). One primary-key lookup."""
        return self._x("SELECT max(version) FROM versions").fetchone()[0] or 0

    # -- writes ----------------------------------------------------------------------------------
    def write_facts(self, facts: Iterable[Fact], op: str, who: str, why: str, batch_size: int = 1000,
                    on_batch: Callable[[int], None] | None = None, meta: dict[str, str] | None = None) -> int:
        """Add ``facts`` as one version; returns it (or the current version when nothing changed).

        A fact already active under the same key and value gains ``count`` and its new sources
        instead of a second row; if every source it names is already recorded, it changes nothing.
        ``meta`` entries are written in the same transaction (a resumable build records how far it got).
        """
        it = iter(facts)
        try:
            with self._transaction():
                v = self._new_version(op, who, why)
                key_ids: dict[str, int] = {}
                while chunk := list(islice(it, batch_size)):
                    self._write_chunk(v, chunk, key_ids)
                    if on_batch:
                        on_batch(len(chunk))
                if meta:
                    self._put_meta(meta)
                self._finish_version(v)
        except _NoChange:
            if meta:
                with self._transaction():
                    self._put_meta(meta)
            return self.version()
        return v

    def _put_meta(self, meta: dict[str, str]) -> None:
        self._xm("INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)",
                 [(k, str(val)) for k, val in meta.items()])

    def set_meta(self, meta: dict[str, str]) -> None:
        with self._transaction():
            self._put_meta(meta)

    def _key_ids(self, keys: dict[str, tuple[str, str]], cache: dict[str, int]) -> None:
        """Fill ``cache`` with the id of every key_norm in ``keys`` ({key_norm: (entity, relation)})."""
        todo = [kn for kn in keys if kn not in cache]
        if not todo:
            return
        self._xm("INSERT OR IGNORE INTO keys(key_norm, entity, relation) VALUES (?, ?, ?)",
                 [(kn, *keys[kn]) for kn in todo])
        for ch in _chunks(todo):
            cache.update(self._x(f"SELECT key_norm, id FROM keys WHERE key_norm IN ({_marks(len(ch))})", ch))

    def _write_chunk(self, v: int, facts: Sequence[Fact], key_ids: dict[str, int]) -> None:
        """New facts go in with one statement per table; facts already active gain support one by one."""
        rows = []
        for f in facts:
            en, rn = normalize_text(f.entity), normalize_text(f.relation)
            rows.append((f, en, rn, en + KEY_SEP + rn, normalize_value(f.value)))
        kns = sorted({r[3] for r in rows})
        active: dict[tuple[str, str], int] = {}  # (key_norm, value_norm) -> triple id
        for ch in _chunks(kns):
            active.update(((kn, vn), tid) for tid, kn, vn in self._x(
                "SELECT id, key_norm, value_norm FROM triples WHERE deleted_version IS NULL"
                f" AND key_norm IN ({_marks(len(ch))})", ch))
        self._key_ids({r[3]: (r[0].entity, r[0].relation) for r in rows if (r[3], r[4]) not in active}, key_ids)
        next_id = (self._x("SELECT max(id) FROM triples").fetchone()[0] or 0) + 1
        new_triples, new_sources, new_changes, support = [], [], [], []
        for f, en, rn, kn, vn in rows:
            tid = active.get((kn, vn))
            if tid is not None:
                support.append((tid, f))
                continue
            tid = active[(kn, vn)] = next_id
            next_id += 1
            new_triples.append((tid, key_ids[kn], f.entity, f.relation, f.value, kn, en, rn, vn, f.count, v))
            new_sources += [(tid, d, p, v) for d, p in f.sources]
            new_changes.append((v, tid, f.value, f.count))
        self._xm("INSERT INTO triples(id, key_id, entity, relation, value, key_norm, entity_norm,"
                 " relation_norm, value_norm, count, created_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 new_triples)
        self._xm("INSERT OR IGNORE INTO sources(triple_id, doc_id, position, version) VALUES (?, ?, ?, ?)",
                 new_sources)
        self._xm("INSERT INTO changes(version, triple_id, op, new_value, count_delta) VALUES (?, ?, 'add', ?, ?)",
                 new_changes)
        for tid, f in support:
            self._support(v, tid, f)

    def _support(self, v: int, tid: int, f: Fact) -> None:
        """Fact ``f`` seen again for active triple ``tid``: its new sources, and count + f.count
        (nothing at all when every source it names is already recorded)."""
        new = sum(self._x("INSERT OR IGNORE INTO sources(triple_id, doc_id, position, version) VALUES (?, ?, ?, ?)",
                          (tid, d, p, v)).rowcount for d, p in f.sources)
        if f.sources and not new:
            return  # already read from exactly these places
        self._x("UPDATE triples SET count = count + ? WHERE id = ?", (f.count, tid))
        old = self._x("SELECT value FROM triples WHERE id = ?", (tid,)).fetchone()[0]
        self._x("INSERT INTO changes(version, triple_id, op, old_value, new_value, count_delta)"
                " VALUES (?, ?, 'support', ?, ?, ?) ON CONFLICT(version, triple_id)"
                " DO UPDATE SET count_delta = changes.count_delta + excluded.count_delta", (v, tid, old, old, f.count))

    def delete(self, who: str, why: str, triple_ids: Sequence[int] | None = None, entity_norm: str | None = None,
               relation_norm: str | None = None, source: str | None = None) -> tuple[int, int]:
        """Mark matching active triples deleted (filters are ANDed). Returns (version, number deleted)."""
        where, params = ["deleted_version IS NULL"], []
        if entity_norm is not None:
            where.append("entity_norm = ?"), params.append(entity_norm)
        if relation_norm is not None:
            where.append("relation_norm = ?"), params.append(relation_norm)
        if source is not None:
            where.append("id IN (SELECT triple_id FROM sources WHERE doc_id = ?)"), params.append(source)
        sql = "SELECT id, value FROM triples WHERE " + " AND ".join(where)
        try:
            with self._transaction():
                if triple_ids is None:
                    rows = self._x(sql, params).fetchall()
                else:
                    ids = sorted({int(i) for i in triple_ids})
                    rows = [r for ch in _chunks(ids) for r in self._x(
                        f"{sql} AND id IN ({_marks(len(ch))})", [*params, *ch]).fetchall()]
                if not rows:
                    raise _NoChange
                v = self._new_version("delete", who, why)
                self._xm("UPDATE triples SET deleted_version = ? WHERE id = ?", [(v, i) for i, _ in rows])
                self._xm("INSERT INTO changes(version, triple_id, op, old_value)"
                         " VALUES (?, ?, 'delete', ?)", [(v, i, val) for i, val in rows])
                self._drop_orphan_aliases(v)
                self._finish_version(v)
        except _NoChange:
            return self.version(), 0
        return v, len(rows)

    def forget(self, who: str, why: str, triple_ids: Iterable[int] = (), keys: Iterable[str] = (),
               facts: Iterable[tuple[str, str]] = (), sources: Iterable[str] = ()) -> tuple[int, int]:
        """Delete, as one version, every active triple named by any of: id, key_norm, (key_norm,
        value_norm) or source document. Returns (version, number deleted)."""
        try:
            with self._transaction():
                self._x("CREATE TEMP TABLE IF NOT EXISTS forget_ids (id INTEGER PRIMARY KEY)")
                self._x("DELETE FROM forget_ids")
                self._xm("INSERT OR IGNORE INTO forget_ids(id) VALUES (?)", ((int(i),) for i in triple_ids))
                self._xm("INSERT OR IGNORE INTO forget_ids(id) SELECT id FROM triples"
                         " WHERE key_norm = ? AND deleted_version IS NULL", ((k,) for k in keys))
                self._xm("INSERT OR IGNORE INTO forget_ids(id) SELECT id FROM triples"
                         " WHERE key_norm = ? AND value_norm = ? AND deleted_version IS NULL", facts)
                self._xm("INSERT OR IGNORE INTO forget_ids(id) SELECT triple_id FROM sources WHERE doc_id = ?",
                         ((d,) for d in sources))
                (n,) = self._x("SELECT count(*) FROM triples t JOIN forget_ids f ON f.id = t.id"
                               " WHERE t.deleted_version IS NULL").fetchone()
                if n == 0:
                    raise _NoChange
                v = self._new_version("delete", who, why)
                self._x("INSERT INTO changes(version, triple_id, op, old_value) SELECT ?, t.id, 'delete', t.value"
                        " FROM triples t JOIN forget_ids f ON f.id = t.id WHERE t.deleted_version IS NULL", (v,))
                self._x("UPDATE triples SET deleted_version = ? WHERE deleted_version IS NULL"
                        " AND id IN (SELECT id FROM forget_ids)", (v,))
                self._x("DELETE FROM forget_ids")
                self._drop_orphan_aliases(v)
                self._finish_version(v)
        except _NoChange:
            return self.version(), 0
        return v, n

    def edit(self, entity: str, relation: str, value: str, who: str, why: str) -> int:
        """Make ``value`` the only active value of the key; the others are kept in history as edited.

        Raises KBError when the key has no active value (use ``write_facts`` to add one).
        """
        en, rn, vn = normalize_text(entity), normalize_text(relation), normalize_value(value)
        kn = en + KEY_SEP + rn
        try:
            with self._transaction():
                rows = self._x("SELECT id, value, value_norm, key_id FROM triples"
                               " WHERE key_norm = ? AND deleted_version IS NULL", (kn,)).fetchall()
                if not rows:
                    raise KBError(f"no active fact for ({entity!r}, {relation!r}) to edit; add it instead")
                others = [(i, val) for i, val, vnorm, _ in rows if vnorm != vn]
                if not others:
                    raise _NoChange  # value already the only one
                v = self._new_version("edit", who, why)
                self._xm("UPDATE triples SET deleted_version = ? WHERE id = ?",
                         [(v, i) for i, _ in others])
                self._xm("INSERT INTO changes(version, triple_id, op, old_value, new_value)"
                         " VALUES (?, ?, 'edit', ?, ?)", [(v, i, old, value) for i, old in others])
                if len(others) == len(rows):  # the new value is not among the old ones
                    self._write_chunk(v, [Fact(entity, relation, value)], {kn: rows[0][3]})
                self._finish_version(v)
        except _NoChange:
            return self.version()
        return v

    # -- reads for keeping a reader in step --------------------------------------------------------
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

    def changed_keys(self, after: int, upto: int) -> list[int]:
        """Ids of keys touched by versions in ``(after, upto]``."""
        return [r[0] for r in self._x(
            "SELECT DISTINCT t.key_id FROM changes c JOIN triples t ON t.id = c.triple_id"
            " WHERE c.version > ? AND c.version <= ?", (after, upto))]

    def best(self, key_ids: Sequence[int] | None = None) -> list[Best]:
        """The best-supported active triple per key (highest count, then newest), for ``key_ids`` or all keys."""
        sql = ("SELECT t.key_id, k.key_norm, t.id, t.entity, t.relation, t.value, t.count, t.created_version"
               " FROM triples t JOIN keys k ON k.id = t.key_id WHERE t.deleted_version IS NULL {}"
               " ORDER BY t.key_id, t.count DESC, t.created_version DESC, t.id DESC")
        if key_ids is None:
            rows = self._x(sql.format("")).fetchall()
        else:
            rows = []
            for ch in _chunks(sorted(set(key_ids))):
                rows += self._x(sql.format(f"AND t.key_id IN ({_marks(len(ch))})"), list(ch)).fetchall()
        return Best.per_key(rows)

    def key_texts(self, key_ids: Sequence[int] | None = None) -> list[tuple[int, str, str]]:
        """(key_id, entity, relation) as first written, for embedding; None: every key with an active value."""
        if key_ids is None:
            return self._x("SELECT id, entity, relation FROM keys WHERE id IN"
                           " (SELECT key_id FROM triples WHERE deleted_version IS NULL) ORDER BY id").fetchall()
        out = []
        for ch in _chunks(list(key_ids)):
            out += self._x(f"SELECT id, entity, relation FROM keys WHERE id IN ({_marks(len(ch))})",
                           list(ch)).fetchall()
        return out

    def sources(self, triple_ids: Sequence[int], limit: int = 32, at: int | None = None) -> dict[int, tuple[str, ...]]:
        """Distinct document ids per triple, first recorded first, at most ``limit`` each (as of version ``at``)."""
        out: dict[int, list[str]] = {}
        upto = "" if at is None else f" AND version <= {int(at)}"
        for ch in _chunks(sorted(set(triple_ids))):
            for tid, doc in self._x(
                    f"SELECT triple_id, doc_id FROM sources WHERE triple_id IN ({_marks(len(ch))}){upto}"
                    " GROUP BY triple_id, doc_id ORDER BY triple_id, min(sources.rowid)", list(ch)):
                docs = out.setdefault(tid, [])
                if len(docs) < limit:
                    docs.append(doc)
        return {k: tuple(v) for k, v in out.items()}

    # -- reads for people ------------------------------------------------------------------------
    _RECORD_SQL = ("SELECT t.id, t.entity, t.relation, t.value, t.count, t.created_version, t.deleted_version,"
                   " s.doc_id, s.position FROM triples t LEFT JOIN sources s ON s.triple_id = t.id")

    def _records(self, where: str, params: Sequence = ()) -> Iterator[TripleRecord]:
        return _group_records(self._x(f"{self._RECORD_SQL} WHERE {where} ORDER BY t.id, s.rowid", params))

    def get(self, triple_id: int) -> TripleRecord | None:
        return next(self._records("t.id = ?", (int(triple_id),)), None)

    def history(self, entity: str, relation: str) -> list[TripleRecord]:
        kn = normalize_text(entity) + KEY_SEP + normalize_text(relation)
        return list(self._records("t.key_norm = ?", (kn,)))

    def records(self, active_only: bool = True, at: int | None = None) -> Iterator[TripleRecord]:
        """All (active) triples in id order, streamed: a separate cursor, not held in memory.
        With ``at``, the triples active at that version, with their counts and sources then."""
        cursor_conn = sqlite3.connect(self.folder.joinpath(DB_FILENAME).resolve().as_uri() + "?mode=ro", uri=True)
        try:
            reader = SQLiteStore(self.folder, cursor_conn)
            if at is not None:
                yield from reader.records_at(at)
            else:
                yield from reader._records("t.deleted_version IS NULL" if active_only else "1")
        finally:
            cursor_conn.close()

    def log(self, limit: int | None = 20) -> list[VersionRecord]:
        sql = "SELECT version, time, who, why, op, n_changed FROM versions ORDER BY version DESC"
        rows = self._x(sql if limit is None else sql + " LIMIT ?", () if limit is None else (int(limit),)).fetchall()
        return [VersionRecord(*r) for r in rows]

    def changes(self, version: int) -> list[Change]:
        rows = self._x("SELECT version, triple_id, op, old_value, new_value FROM changes"
                       " WHERE version = ? ORDER BY triple_id", (version,)).fetchall()
        return [Change(*r) for r in rows]

    def counts(self) -> dict[str, int]:
        q = lambda sql: self._x(sql).fetchone()[0] or 0  # noqa: E731
        return {
            "triples": q("SELECT count(*) FROM triples WHERE deleted_version IS NULL"),
            "keys": q("SELECT count(DISTINCT key_id) FROM triples WHERE deleted_version IS NULL"),
            "deleted": q("SELECT count(*) FROM triples WHERE deleted_version IS NOT NULL"),
            "sources": q("SELECT count(*) FROM sources"),
            "documents": q("SELECT count(DISTINCT doc_id) FROM sources"),
            "versions": q("SELECT count(*) FROM versions"),
            "aliases": q("SELECT count(*) FROM aliases WHERE deleted_version IS NULL"),
        }


