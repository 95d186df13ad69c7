"""Triple storage with provenance and history: SQLite in one folder (``kb.sqlite``).

Every change (add, import, edit, delete, alias) is one numbered version written in one transaction,
so a crash at any point leaves the store at the previous version or the next one, never in between.
Nothing is ever overwritten: a deleted or edited fact keeps its row with ``deleted_version`` set,
and ``changes`` says what each version did to each triple. The schema is built by numbered,
append-only migrations (:data:`MIGRATIONS`: never edit one that has shipped, append a new one;
:meth:`SQLiteStore.migrate` applies the ones a folder lacks, in order, and refuses a folder newer
than this code).

:class:`SQLiteStore` is the whole store in one class: writes, reads for people, past versions
(a triple is active at version ``V`` when ``created_version <= V`` and it was not deleted by ``V``;
its count at ``V`` is the sum of its ``count_delta`` up to ``V``), aliases (a delete that leaves an
entity without facts deletes its aliases in the same version), deletes (a filter or a forget set,
gathered in a temporary table and marked with one ``UPDATE``), and the reads a reader's map of the
store is built from (:mod:`lmlm.kb.keymap`). The knowledge base uses only its methods (no SQL
outside this module), so a server-backed store implements the same ones
(:class:`lmlm.kb.postgres.PostgresStore`, with its own migrations). Exercised by every ``lmlm kb`` command.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..memory import gc_paused
from .keys import KEY_SEP, normalize_text, normalize_value
from .records import (AliasRow, Best, Change, DiffEntry, Fact, KBError, KBNotFound, NotAKnowledgeBase, TripleRecord,
                      VersionRecord, group_records)

__all__ = ["DB_FILENAME", "FORMAT", "MIGRATIONS", "NAMED", "KEY_NORM", "KEY_IS", "ACTIVE_AT", "NO_POSITION",
           "stored_position", "utc_now", "NEW_DB", "ALIAS_COLUMNS", "Fact", "Best", "AliasRow",
           "SQLiteStore", "KBError", "NotAKnowledgeBase", "KBNotFound"]

DB_FILENAME = "kb.sqlite"
FORMAT = "lmlm-kb"

# SQL fragments of the current layout, shared by the store's modules:
# the names of triple ``t``, and its key as normalised text
NAMED = ("triples t JOIN keys k ON k.id = t.key_id JOIN entities e ON e.id = k.entity_id"
         " JOIN relations r ON r.id = k.relation_id")
KEY_NORM = f"e.name_norm || '{KEY_SEP}' || r.name_norm"
# triple ``t`` is under the key of (entity_norm, relation_norm) given as two parameters
KEY_IS = ("t.key_id = (SELECT k.id FROM keys k JOIN entities e ON e.id = k.entity_id"
          " JOIN relations r ON r.id = k.relation_id WHERE e.name_norm = ? AND r.name_norm = ?)")
# triple ``t`` is active at the version given twice as parameters
ACTIVE_AT = "t.created_version <= ? AND (t.deleted_version IS NULL OR t.deleted_version > ?)"

IN_CHUNK = 500  # ids per "IN (...)" clause, below SQLite's variable limit


class _NoChange(Exception):
    """Raised inside a write transaction that changed nothing, to roll it back without a version."""


def _chunks(items: Sequence, n: int = IN_CHUNK) -> Iterator[Sequence]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _marks(n: int) -> str:
    """``n`` placeholders for an ``IN (...)`` clause."""
    return ",".join("?" * n)


MIGRATIONS: list[str] = [
    # 1: the initial schema
    """
    CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE versions (
        version INTEGER PRIMARY KEY, time TEXT NOT NULL, who TEXT NOT NULL, why TEXT NOT NULL,
        op TEXT NOT NULL, n_changed INTEGER NOT NULL DEFAULT 0);
    -- one row per distinct normalised key; its id is the vector id in the index
    CREATE TABLE keys (
        id INTEGER PRIMARY KEY, key_norm TEXT NOT NULL UNIQUE, entity TEXT NOT NULL, relation TEXT NOT NULL);
    CREATE TABLE triples (
        id INTEGER PRIMARY KEY,
        key_id INTEGER NOT NULL REFERENCES keys(id),
        entity TEXT NOT NULL, relation TEXT NOT NULL, value TEXT NOT NULL,
        key_norm TEXT NOT NULL, entity_norm TEXT NOT NULL, relation_norm TEXT NOT NULL, value_norm TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 1,
        created_version INTEGER NOT NULL REFERENCES versions(version),
        deleted_version INTEGER REFERENCES versions(version));
    CREATE UNIQUE INDEX triples_active_fact ON triples(key_norm, value_norm) WHERE deleted_version IS NULL;
    CREATE INDEX triples_key ON triples(key_id);
    CREATE INDEX triples_entity ON triples(entity_norm);
    CREATE INDEX triples_relation ON triples(relation_norm);
    CREATE TABLE sources (
        triple_id INTEGER NOT NULL REFERENCES triples(id), doc_id TEXT NOT NULL, position INTEGER);
    CREATE UNIQUE INDEX sources_once ON sources(triple_id, doc_id, ifnull(position, -1));
    CREATE INDEX sources_doc ON sources(doc_id);
    CREATE TABLE changes (
        version INTEGER NOT NULL REFERENCES versions(version),
        triple_id INTEGER NOT NULL REFERENCES triples(id),
        op TEXT NOT NULL CHECK (op IN ('add', 'support', 'edit', 'delete')),
        old_value TEXT, new_value TEXT,
        PRIMARY KEY (version, triple_id));
    """,
    # 2: counts and sources by version, so a past version can be read back (checkout, diff).
    # A change carries how much it added to the triple's count; a source row, the version that
    # recorded it. Rows written before this migration get the whole count on their 'add' and the
    # triple's creation version: exact for the present, approximate for counts in between.
    """
    ALTER TABLE changes ADD COLUMN count_delta INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sources ADD COLUMN version INTEGER;
    UPDATE changes SET count_delta = (SELECT count FROM triples t WHERE t.id = changes.triple_id) WHERE op = 'add';
    UPDATE sources SET version = (SELECT created_version FROM triples t WHERE t.id = sources.triple_id);
    """,
    # 3: aliases, other names of an entity ("Lovelace, Ada", a redirect, a short name), versioned like
    # triples; deleting an entity's last fact deletes its aliases in the same version
    """
    CREATE TABLE aliases (
        id INTEGER PRIMARY KEY, alias TEXT NOT NULL, alias_norm TEXT NOT NULL,
        entity TEXT NOT NULL, entity_norm TEXT NOT NULL,
        created_version INTEGER NOT NULL REFERENCES versions(version),
        deleted_version INTEGER REFERENCES versions(version));
    CREATE UNIQUE INDEX aliases_active ON aliases(alias_norm, entity_norm) WHERE deleted_version IS NULL;
    CREATE INDEX aliases_entity ON aliases(entity_norm);
    CREATE INDEX triples_deleted ON triples(deleted_version) WHERE deleted_version IS NOT NULL;
    """,
    # 4: the compact layout. Entity and relation names are stored once (``entities``, ``relations``);
    # a key is a pair of their ids and a triple a key id and a value, so a triple's row holds no
    # names. Document ids are stored once (``documents``) and sources point at them. A change row
    # holds only what its triple does not: the new value of an edit (the old value of an edit,
    # support or delete is the triple's own value). Names as first written are kept; a triple
    # added later under another spelling of the same name shows the first spelling. Rows, ids and
    # the order of sources are kept, so key ids (the vector ids of the index) stay valid.
    """
    CREATE TABLE entities (id INTEGER PRIMARY KEY, name TEXT NOT NULL, name_norm TEXT NOT NULL UNIQUE);
    CREATE TABLE relations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, name_norm TEXT NOT NULL UNIQUE);
    CREATE TABLE documents (id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL UNIQUE);
    INSERT INTO entities(name, name_norm) SELECT name, en FROM (
        SELECT entity AS name, substr(key_norm, 1, instr(key_norm, char(9)) - 1) AS en, min(id) AS first
        FROM keys GROUP BY en) ORDER BY first;
    INSERT INTO relations(name, name_norm) SELECT name, rn FROM (
        SELECT relation AS name, substr(key_norm, instr(key_norm, char(9)) + 1) AS rn, min(id) AS first
        FROM keys GROUP BY rn) ORDER BY first;
    INSERT INTO documents(doc_id) SELECT doc_id FROM (
        SELECT doc_id, min(rowid) AS first FROM sources GROUP BY doc_id) ORDER BY first;
    CREATE TABLE keys_4 (
        id INTEGER PRIMARY KEY,
        entity_id INTEGER NOT NULL REFERENCES entities(id),
        relation_id INTEGER NOT NULL REFERENCES relations(id));
    INSERT INTO keys_4(id, entity_id, relation_id) SELECT k.id, e.id, r.id FROM keys k
        JOIN entities e ON e.name_norm = substr(k.key_norm, 1, instr(k.key_norm, char(9)) - 1)
        JOIN relations r ON r.name_norm = substr(k.key_norm, instr(k.key_norm, char(9)) + 1);
    CREATE TABLE triples_4 (
        id INTEGER PRIMARY KEY,
        key_id INTEGER NOT NULL REFERENCES keys(id),
        value TEXT NOT NULL, value_norm TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 1,
        created_version INTEGER NOT NULL REFERENCES versions(version),
        deleted_version INTEGER REFERENCES versions(version));
    INSERT INTO triples_4 SELECT id, key_id, value, value_norm, count, created_version, deleted_version FROM triples;
    CREATE TABLE sources_4 (
        triple_id INTEGER NOT NULL REFERENCES triples(id),
        doc INTEGER NOT NULL REFERENCES documents(id),
        position INTEGER, version INTEGER);
    INSERT INTO sources_4(rowid, triple_id, doc, position, version)
        SELECT s.rowid, s.triple_id, d.id, s.position, s.version FROM sources s JOIN documents d ON d.doc_id = s.doc_id;
    -- (the op check is an OR chain: SQLite checks an IN list three times slower per inserted row)
    CREATE TABLE changes_4 (
        version INTEGER NOT NULL REFERENCES versions(version),
        triple_id INTEGER NOT NULL REFERENCES triples(id),
        op TEXT NOT NULL CHECK (op = 'add' OR op = 'support' OR op = 'edit' OR op = 'delete'),
        new_value TEXT,
        count_delta INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (version, triple_id)) WITHOUT ROWID;
    INSERT INTO changes_4 SELECT version, triple_id, op, CASE WHEN op = 'edit' THEN new_value END, count_delta
        FROM changes;
    DROP TABLE changes;
    DROP TABLE sources;
    DROP TABLE triples;
    DROP TABLE keys;
    ALTER TABLE keys_4 RENAME TO keys;
    ALTER TABLE triples_4 RENAME TO triples;
    ALTER TABLE sources_4 RENAME TO sources;
    ALTER TABLE changes_4 RENAME TO changes;
    CREATE UNIQUE INDEX keys_pair ON keys(entity_id, relation_id);
    -- not unique and not partial: a delete then leaves it untouched (half the cost of a large forget);
    -- one active row per (key, value) is kept by the writer, which checks inside its write transaction
    CREATE INDEX triples_fact ON triples(key_id, value_norm);
    CREATE INDEX triples_deleted ON triples(deleted_version) WHERE deleted_version IS NOT NULL;
    CREATE UNIQUE INDEX sources_once ON sources(triple_id, doc, ifnull(position, -1));
    CREATE INDEX sources_doc ON sources(doc);
    """,
    # 5: sources keyed by what makes one unique (triple, document, position; -1: no position) in a
    # table without rowids, so the table is its own unique index (one b-tree where there were two:
    # about 19 bytes a triple less at 10^6 triples). A triple's sources read in the order their
    # documents were first seen.
    """
    CREATE TABLE sources_5 (
        triple_id INTEGER NOT NULL REFERENCES triples(id),
        doc INTEGER NOT NULL REFERENCES documents(id),
        position INTEGER NOT NULL,
        version INTEGER,
        PRIMARY KEY (triple_id, doc, position)) WITHOUT ROWID;
    INSERT OR IGNORE INTO sources_5 SELECT triple_id, doc, ifnull(position, -1), version FROM sources ORDER BY rowid;
    DROP TABLE sources;
    ALTER TABLE sources_5 RENAME TO sources;
    CREATE INDEX sources_doc ON sources(doc);
    """,
]

NO_POSITION = -1  # a source's position when the document gives none (stored so, read back as None)


def stored_position(position: int | None) -> int:
    """A source's position as the ``sources`` table keys it (:data:`NO_POSITION` for none)."""
    return NO_POSITION if position is None else position


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


# count of each triple at version ?, from its changes
_COUNTS_AT = "SELECT triple_id, sum(count_delta) AS count FROM changes WHERE version <= ? GROUP BY triple_id"

ALIAS_COLUMNS = "alias, alias_norm, entity, entity_norm"

_BEST = (f"SELECT t.key_id, {KEY_NORM}, t.id, e.name, r.name, t.value, t.count, t.created_version FROM {NAMED}"
         " WHERE {}ORDER BY t.key_id, t.count DESC, t.created_version DESC, t.id DESC")


class SQLiteStore:
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

    # -- past versions: checkout and diff ----------------------------------------------------------
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

    # -- aliases: other names of entities, versioned like triples (op ``alias`` or ``unalias``) --------
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

    # -- deletes: a filter or a forget set, each one version ---------------------------------------
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

    # -- what a reader's map of the store is read from ---------------------------------------------
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
