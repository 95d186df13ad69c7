"""Triple storage with provenance and history: SQLite in one folder (``kb.sqlite``).

Every change (add, import, edit, delete) is one numbered version written in one transaction, so a
crash at any point leaves the store at the previous version or the next one, never in between.
Nothing is ever overwritten: a deleted or edited fact keeps its row with ``deleted_version`` set,
and ``changes`` says what each version did to each triple. The schema is built by numbered,
append-only migrations (:data:`lmlm.kb.schema.MIGRATIONS`).

The knowledge base uses only the methods of :class:`SQLiteStore` (no SQL outside this module and
its mixins: :mod:`lmlm.kb.versions`, which reads past versions, :mod:`lmlm.kb.store_aliases`,
:mod:`lmlm.kb.store_deletes` and :mod:`lmlm.kb.store_map`, which a reader's map is read from; the
layout's shared fragments are in :mod:`lmlm.kb.schema`), so a server-backed store implements the
same methods (:class:`lmlm.kb.postgres.PostgresStore`).
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

from .keys import normalize_text, normalize_value
from ..memory import gc_paused
from .records import Best, Change, KBError, KBNotFound, NotAKnowledgeBase, TripleRecord, VersionRecord, group_records
from .schema import DB_FILENAME, FORMAT, KEY_IS, MIGRATIONS, NAMED, NO_POSITION, stored_position
from .schema import NoChange as _NoChange, chunks as _chunks, marks as _marks
from .store_aliases import StoredAliases
from .store_deletes import StoredDeletes
from .store_map import StoredMap
from .versions import PastVersions

__all__ = ["DB_FILENAME", "FORMAT", "MIGRATIONS", "Fact", "Best",
           "SQLiteStore", "KBError", "NotAKnowledgeBase", "KBNotFound"]

class Fact(NamedTuple):
    """A fact to write: seen ``count`` more times, in ``sources`` ((doc_id, position) pairs)."""

    entity: str
    relation: str
    value: str
    count: int = 1
    sources: tuple[tuple[str, int | None], ...] = ()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


_COLUMNS = {"entities": ("name",), "relations": ("name",), "documents": ()}  # besides id and the name


def _checkpoint(db: Path) -> None:
    """A passive checkpoint of ``db``'s write-ahead log: it never waits for readers or the writer."""
    try:
        conn = sqlite3.connect(db.resolve().as_uri() + "?mode=rw", uri=True, timeout=0.0)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()
    except sqlite3.Error:
        pass  # busy or gone: the next write's checkpoint copies what this one did not


class _Cache:
    """Ids read or given by one write transaction (entity, relation and document ids by name, key ids
    by id pair); thrown away with it, so a rolled-back write leaves no stale id behind. Each map is
    emptied once it holds ``limit`` ids (a name it no longer holds is read from the store again):
    one write of 5 x 10^7 facts would otherwise hold every key's id pair, over 10 GB."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self.limit = limit
        self.entities: dict[str, int] = {}
        self.relations: dict[str, int] = {}
        self.keys: dict[tuple[int, int], int] = {}
        self.documents: dict[str, int] = {}
        self.first_triple: int | None = None  # the first triple id this write made

    def trim(self) -> None:
        for m in (self.entities, self.relations, self.keys, self.documents):
            if len(m) > self.limit:
                m.clear()


NEW_DB = DB_FILENAME + ".new"  # a database being created, before it is moved into place


class SQLiteStore(PastVersions, StoredAliases, StoredDeletes, StoredMap):
    """The SQLite store of one KB folder. One connection, WAL mode; safe to share between threads."""

    def __init__(self, folder: Path, conn: sqlite3.Connection):
        self.folder = folder
        self.conn = conn
        self.db = folder / DB_FILENAME
        self._lock = threading.RLock()
        self._checkpointer: threading.Thread | None = None  # the WAL copy running beside the writer

    # -- opening ---------------------------------------------------------------------------------
    @staticmethod
    def _connect(db: Path, create: bool) -> sqlite3.Connection:
        uri = db.resolve().as_uri() + ("?mode=rwc" if create else "?mode=rw")
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=60.0)
        conn.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, and the reverse
        conn.execute("PRAGMA synchronous=FULL")  # one fsync per version; versions are coarse
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA cache_size=-65536")  # 64 MiB of pages: lookups at 10^6 triples stay in memory
        conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run beside the writer (_checkpoint_soon)
        return conn

    @classmethod
    def create(cls, folder: Path, meta: dict[str, str]) -> "SQLiteStore":
        """Make the database under a temporary name and move it into place once it is a whole KB, so a
        creation cut short leaves no database that is not one (the next ``create`` starts again)."""
        import os

        tmp = folder / NEW_DB
        for leftover in folder.glob(NEW_DB + "*"):
            leftover.unlink()
        store = cls(folder, cls._connect(tmp, create=True))
        store.db = tmp
        try:
            store.migrate()
            with store._transaction():
                store._xm("INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)",
                          [("format", FORMAT), ("created", utc_now()), *meta.items()])
        finally:
            store.close()  # the last connection: its write-ahead log goes into the file
        os.replace(tmp, folder / DB_FILENAME)
        return cls.open(folder)

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
        if getattr(self, "_checkpointer", None) is not None:  # the PostgreSQL store has none
            self._checkpointer.join()
        self.conn.close()

    def _checkpoint_soon(self) -> None:
        """Copy the write-ahead log into the database file in a background thread, on a connection of
        its own, so a write returns once it is durable in the log rather than after the copy (which
        for a large delete is as long as the delete). One copy at a time; a write made while one runs
        is copied by the next. A copy cut short by a crash is finished by the next one."""
        if self._checkpointer is not None and self._checkpointer.is_alive():
            return
        self._checkpointer = threading.Thread(target=_checkpoint, args=(self.db,), name="lmlm-kb-checkpoint",
                                              daemon=True)
        self._checkpointer.start()

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
                # foreign keys off while a migration rebuilds a table (SQLite's documented way), checked after
                self.conn.execute("PRAGMA foreign_keys=OFF")
                try:
                    self.conn.executescript(f"BEGIN IMMEDIATE; {MIGRATIONS[n - 1]}; "
                                            f"INSERT INTO schema_version(version) VALUES ({n}); COMMIT;")
                except sqlite3.Error:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
                finally:
                    self.conn.execute("PRAGMA foreign_keys=ON")
                bad = self.conn.execute("PRAGMA foreign_key_check").fetchmany(3)
                if bad:
                    raise KBError(f"{self.folder}: migration {n} left rows that point nowhere: {bad}")

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
        if write:
            self._checkpoint_soon()

    def _new_version(self, op: str, who: str, why: str) -> int:
        v = self.version() + 1
        self._x("INSERT INTO versions(version, time, who, why, op) VALUES (?, ?, ?, ?, ?)",
                (v, utc_now(), who, why, op))
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
                    on_batch: Callable[[int], None] | None = None, meta: dict[str, str] | None = None,
                    cache_limit: int = 1_000_000, recount: bool = True) -> int:
        """Add ``facts`` as one version; returns it (or the current version when nothing changed).

        A fact already active under the same key and value gains ``count`` and its new sources
        instead of a second row; if every source it names is already recorded, it changes nothing.
        ``recount=False``: neither does a fact without sources that was active before this write
        (a file read again after it changed: its unchanged facts were counted when it was first read).
        ``meta`` entries are written in the same transaction (a resumable build records how far it got).
        ``cache_limit``: ids of names and keys held between chunks before the write forgets them.
        """
        it = iter(facts)
        try:
            with gc_paused(), self._transaction():
                v = self._new_version(op, who, why)
                cache = _Cache(cache_limit)
                while chunk := list(islice(it, batch_size)):
                    self._write_chunk(v, chunk, cache, recount)
                    cache.trim()
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

    def _ids(self, table: str, column: str, names: dict[str, tuple], cache: dict[str, int]) -> set[str]:
        """Fill ``cache`` with the id of every name in ``names`` ({name: the other columns of a new
        row}) in ``table``, adding the ones it lacks; returns the names added."""
        todo = [n for n in names if n not in cache]
        for ch in _chunks(todo):
            cache.update(self._x(f"SELECT {column}, id FROM {table} WHERE {column} IN ({_marks(len(ch))})", ch))
        new = [n for n in todo if n not in cache]
        if new:
            first = (self._x(f"SELECT max(id) FROM {table}").fetchone()[0] or 0) + 1
            cache.update(zip(new, range(first, first + len(new))))
            cols = ("id", column, *_COLUMNS[table])
            self._xm(f"INSERT INTO {table}({', '.join(cols)}) VALUES ({_marks(len(cols))})",
                     [(cache[n], n, *names[n]) for n in new])
        return set(new)

    def _key_ids(self, pairs: set[tuple[int, int]], fresh_entities: set[int], cache: _Cache) -> set[int]:
        """Fill ``cache.keys`` with the id of every (entity id, relation id) pair, adding the keys it
        lacks; returns the ids of the keys added."""
        todo = [p for p in pairs if p not in cache.keys]
        known = sorted({e for e, _ in todo if e not in fresh_entities})  # a new entity has no key yet
        for ch in _chunks(known):
            for kid, e, r in self._x(f"SELECT id, entity_id, relation_id FROM keys"
                                     f" WHERE entity_id IN ({_marks(len(ch))})", ch):
                cache.keys[(e, r)] = kid
        new = sorted(p for p in todo if p not in cache.keys)
        if not new:
            return set()
        first = (self._x("SELECT max(id) FROM keys").fetchone()[0] or 0) + 1
        cache.keys.update(zip(new, range(first, first + len(new))))
        self._xm("INSERT INTO keys(id, entity_id, relation_id) VALUES (?, ?, ?)", [(cache.keys[p], *p) for p in new])
        return set(range(first, first + len(new)))

    def _write_chunk(self, v: int, facts: Sequence[Fact], cache: _Cache, recount: bool = True) -> None:
        """New facts go in with one statement per table; facts already active gain support one by one."""
        ents, rels, docs = cache.entities, cache.relations, cache.documents
        new_e: dict[str, tuple] = {}  # names not yet in the cache, as first written
        new_r: dict[str, tuple] = {}
        new_d: dict[str, tuple] = {}
        rows = []
        norm, norm_value, add = normalize_text, normalize_value, rows.append
        for f in facts:
            entity, relation, value, _, sources = f
            en, rn = norm(entity), norm(relation)
            if en not in ents and en not in new_e:
                new_e[en] = (entity,)
            if rn not in rels and rn not in new_r:
                new_r[rn] = (relation,)
            for d, _ in sources:
                if d not in docs:
                    new_d[d] = ()
            add((f, en, rn, norm_value(value)))
        new_entities = self._ids("entities", "name_norm", new_e, ents)
        self._ids("relations", "name_norm", new_r, rels)
        self._ids("documents", "doc_id", new_d, docs)
        pairs = [(ents[en], rels[rn]) for _, en, rn, _ in rows]
        fresh = self._key_ids(set(pairs), {ents[en] for en in new_entities}, cache)
        keys = cache.keys
        kids = [keys[p] for p in pairs]
        active: dict[tuple[int, str], int] = {}  # (key id, value_norm) -> triple id
        for ch in _chunks(sorted(set(kids) - fresh)):  # a key made by this chunk has no triple yet
            active.update(((kid, vn), tid) for tid, kid, vn in self._x(
                "SELECT id, key_id, value_norm FROM triples WHERE deleted_version IS NULL"
                f" AND key_id IN ({_marks(len(ch))})", ch))
        first = next_id = (self._x("SELECT max(id) FROM triples").fetchone()[0] or 0) + 1
        if cache.first_triple is None:
            cache.first_triple = first
        new_triples, new_sources, support = [], [], []
        for (f, _, _, vn), kid in zip(rows, kids):
            tid = active.setdefault((kid, vn), next_id)
            if tid != next_id:
                if recount or f[4] or tid >= cache.first_triple:
                    support.append((tid, f))
                continue
            next_id += 1
            new_triples.append((tid, kid, f[2], vn, f[3], v))
            for d, p in f[4]:
                new_sources.append((tid, docs[d], stored_position(p), v))
        self._xm("INSERT INTO triples(id, key_id, value, value_norm, count, created_version)"
                 " VALUES (?, ?, ?, ?, ?, ?)", new_triples)
        self._xm("INSERT OR IGNORE INTO sources(triple_id, doc, position, version) VALUES (?, ?, ?, ?)",
                 new_sources)
        # the chunk's new triples have the ids first..next_id-1: their 'add' changes in one statement
        self._x("INSERT INTO changes(version, triple_id, op, count_delta) SELECT ?, id, 'add', count FROM triples"
                " WHERE id >= ? AND id < ?", (v, first, next_id))
        for tid, f in support:
            self._support(v, tid, f, cache)

    def _support(self, v: int, tid: int, f: Fact, cache: _Cache) -> None:
        """Fact ``f`` seen again for active triple ``tid``: its new sources, and count + f.count
        (nothing at all when every source it names is already recorded)."""
        new = sum(self._x("INSERT OR IGNORE INTO sources(triple_id, doc, position, version) VALUES (?, ?, ?, ?)",
                          (tid, cache.documents[d], stored_position(p), v)).rowcount for d, p in f.sources)
        if f.sources and not new:
            return  # already read from exactly these places
        self._x("UPDATE triples SET count = count + ? WHERE id = ?", (f.count, tid))
        self._x("INSERT INTO changes(version, triple_id, op, count_delta) VALUES (?, ?, 'support', ?)"
                " ON CONFLICT(version, triple_id) DO UPDATE SET count_delta = changes.count_delta"
                " + excluded.count_delta", (v, tid, f.count))

    def edit(self, entity: str, relation: str, value: str, who: str, why: str) -> int:
        """Make ``value`` the only active value of the key; the others are kept in history as edited.

        Raises KBError when the key has no active value (use ``write_facts`` to add one).
        """
        en, rn, vn = normalize_text(entity), normalize_text(relation), normalize_value(value)
        try:
            with self._transaction():
                rows = self._x(f"SELECT t.id, t.value, t.value_norm FROM triples t WHERE {KEY_IS}"
                               " AND t.deleted_version IS NULL", (en, rn)).fetchall()
                if not rows:
                    raise KBError(f"no active fact for ({entity!r}, {relation!r}) to edit; add it instead")
                others = [(i, val) for i, val, vnorm in rows if vnorm != vn]
                if not others:
                    raise _NoChange  # value already the only one
                v = self._new_version("edit", who, why)
                self._xm("UPDATE triples SET deleted_version = ? WHERE id = ?",
                         [(v, i) for i, _ in others])
                self._xm("INSERT INTO changes(version, triple_id, op, new_value)"
                         " VALUES (?, ?, 'edit', ?)", [(v, i, value) for i, _ in others])
                if len(others) == len(rows):  # the new value is not among the old ones
                    self._write_chunk(v, [Fact(entity, relation, value)], _Cache())
                self._finish_version(v)
        except _NoChange:
            return self.version()
        return v

    def sources(self, triple_ids: Sequence[int], limit: int = 32, at: int | None = None) -> dict[int, tuple[str, ...]]:
        """Distinct document ids per triple, in the order the KB first saw them, at most ``limit`` each (as of
        version ``at``)."""
        out: dict[int, list[str]] = {}
        upto = "" if at is None else f" AND s.version <= {int(at)}"
        for ch in _chunks(sorted(set(triple_ids))):
            for tid, doc in self._x(
                    "SELECT s.triple_id, d.doc_id FROM sources s JOIN documents d ON d.id = s.doc"
                    f" WHERE s.triple_id IN ({_marks(len(ch))}){upto}"
                    " GROUP BY s.triple_id, s.doc, d.doc_id ORDER BY s.triple_id, s.doc", list(ch)):
                docs = out.setdefault(tid, [])
                if len(docs) < limit:
                    docs.append(doc)
        return {k: tuple(v) for k, v in out.items()}

    # -- reads for people ------------------------------------------------------------------------
    _RECORD_SQL = (f"SELECT t.id, e.name, r.name, t.value, t.count, t.created_version, t.deleted_version,"
                   f" d.doc_id, nullif(s.position, {NO_POSITION}) FROM {NAMED}"
                   " LEFT JOIN sources s ON s.triple_id = t.id LEFT JOIN documents d ON d.id = s.doc")

    def _records(self, where: str, params: Sequence = ()) -> Iterator[TripleRecord]:
        return group_records(self._x(f"{self._RECORD_SQL} WHERE {where} ORDER BY t.id, s.doc, s.position", params))

    def get(self, triple_id: int) -> TripleRecord | None:
        return next(self._records("t.id = ?", (int(triple_id),)), None)

    def history(self, entity: str, relation: str) -> list[TripleRecord]:
        return list(self._records(KEY_IS, (normalize_text(entity), normalize_text(relation))))

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
        """What ``version`` did to each triple; the old value of an edit, support or delete and the
        new value of an add or support are the triple's own."""
        rows = self._x("SELECT c.version, c.triple_id, c.op,"
                       " CASE WHEN c.op = 'add' THEN NULL ELSE t.value END,"
                       " CASE WHEN c.op = 'edit' THEN c.new_value WHEN c.op = 'delete' THEN NULL ELSE t.value END"
                       " FROM changes c JOIN triples t ON t.id = c.triple_id"
                       " WHERE c.version = ? ORDER BY c.triple_id", (version,)).fetchall()
        return [Change(*r) for r in rows]

    def counts(self) -> dict[str, int]:
        q = lambda sql: self._x(sql).fetchone()[0] or 0  # noqa: E731
        return {
            "triples": q("SELECT count(*) FROM triples WHERE deleted_version IS NULL"),
            "keys": q("SELECT count(DISTINCT key_id) FROM triples WHERE deleted_version IS NULL"),
            "deleted": q("SELECT count(*) FROM triples WHERE deleted_version IS NOT NULL"),
            "sources": q("SELECT count(*) FROM sources"),
            "documents": q("SELECT count(DISTINCT doc) FROM sources"),
            "versions": q("SELECT count(*) FROM versions"),
            "aliases": q("SELECT count(*) FROM aliases WHERE deleted_version IS NULL"),
        }
