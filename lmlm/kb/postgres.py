"""A knowledge base in PostgreSQL, for one KB shared by many servers: ``KnowledgeBase.open(URL)``.

:class:`PostgresStore` has the methods and the semantics of :class:`~lmlm.kb.store.SQLiteStore`
(it is one, with each statement translated): every change is one numbered version in one
transaction, writers queue on a transaction-level advisory lock, and a reader catches up from a
repeatable-read snapshot, so a delete through one server is invisible to lookups on every server
as soon as the call returns. The schema is built by its own numbered :data:`PG_MIGRATIONS`.

Each machine keeps the key index in a cache folder (``LMLM_KB_CACHE``, default
``~/.cache/lmlm/kb``) named after the URL; the database is the truth, the file only spares
re-embedding. Needs psycopg (``pip install 'lmlm[postgres]'``). Exercised by every ``lmlm kb``
command given a ``postgresql://`` URL.

Examples:
    >>> kb = KnowledgeBase.create("postgresql://kb@db.internal/facts")
    >>> kb.add([Triple("Ada Lovelace", "Birth City", "London")])
    1
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .store import FORMAT, KBError, KBNotFound, NotAKnowledgeBase, SQLiteStore, utc_now

__all__ = ["PG_MIGRATIONS", "PostgresStore", "is_url", "as_url", "index_cache_dir", "redact"]

_LOCK_KEY = 0x6C6D6C6D  # advisory lock id taken by every write transaction ("lmlm")
_CURSORS = itertools.count()

PG_MIGRATIONS: list[str] = [
    # 1: the schema of SQLite migrations 1 and 2; sources gain an explicit order column (seq)
    """
    CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE versions (
        version INTEGER PRIMARY KEY, time TEXT NOT NULL, who TEXT NOT NULL, why TEXT NOT NULL,
        op TEXT NOT NULL, n_changed INTEGER NOT NULL DEFAULT 0);
    CREATE TABLE keys (
        id BIGSERIAL PRIMARY KEY, key_norm TEXT NOT NULL UNIQUE, entity TEXT NOT NULL, relation TEXT NOT NULL);
    CREATE TABLE triples (
        id BIGINT PRIMARY KEY,
        key_id BIGINT NOT NULL REFERENCES keys(id),
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
        seq BIGSERIAL PRIMARY KEY, triple_id BIGINT NOT NULL REFERENCES triples(id), doc_id TEXT NOT NULL,
        position BIGINT, version INTEGER);
    CREATE UNIQUE INDEX sources_once ON sources(triple_id, doc_id, coalesce(position, -1));
    CREATE INDEX sources_doc ON sources(doc_id);
    CREATE TABLE changes (
        version INTEGER NOT NULL REFERENCES versions(version),
        triple_id BIGINT NOT NULL REFERENCES triples(id),
        op TEXT NOT NULL CHECK (op IN ('add', 'support', 'edit', 'delete')),
        old_value TEXT, new_value TEXT, count_delta INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (version, triple_id));
    """,
    # 2: SQLite migration 3, aliases
    """
    CREATE TABLE aliases (
        id BIGSERIAL PRIMARY KEY, alias TEXT NOT NULL, alias_norm TEXT NOT NULL,
        entity TEXT NOT NULL, entity_norm TEXT NOT NULL,
        created_version INTEGER NOT NULL REFERENCES versions(version),
        deleted_version INTEGER REFERENCES versions(version));
    CREATE UNIQUE INDEX aliases_active ON aliases(alias_norm, entity_norm) WHERE deleted_version IS NULL;
    CREATE INDEX aliases_entity ON aliases(entity_norm);
    CREATE INDEX triples_deleted ON triples(deleted_version) WHERE deleted_version IS NOT NULL;
    """,
    # 3: SQLite migration 4, the compact layout (names and document ids stored once, triples by key id)
    r"""
    CREATE TABLE entities (id BIGINT PRIMARY KEY, name TEXT NOT NULL, name_norm TEXT NOT NULL UNIQUE);
    CREATE TABLE relations (id BIGINT PRIMARY KEY, name TEXT NOT NULL, name_norm TEXT NOT NULL UNIQUE);
    CREATE TABLE documents (id BIGINT PRIMARY KEY, doc_id TEXT NOT NULL UNIQUE);
    INSERT INTO entities(id, name, name_norm) SELECT row_number() OVER (ORDER BY first), name, en FROM (
        SELECT DISTINCT ON (en) entity AS name, en, id AS first
        FROM (SELECT id, entity, split_part(key_norm, E'\t', 1) AS en FROM keys) a ORDER BY en, id) b;
    INSERT INTO relations(id, name, name_norm) SELECT row_number() OVER (ORDER BY first), name, rn FROM (
        SELECT DISTINCT ON (rn) relation AS name, rn, id AS first
        FROM (SELECT id, relation, split_part(key_norm, E'\t', 2) AS rn FROM keys) a ORDER BY rn, id) b;
    INSERT INTO documents(id, doc_id) SELECT row_number() OVER (ORDER BY first), doc_id FROM (
        SELECT doc_id, min(seq) AS first FROM sources GROUP BY doc_id) b;
    ALTER TABLE keys ADD COLUMN entity_id BIGINT REFERENCES entities(id),
        ADD COLUMN relation_id BIGINT REFERENCES relations(id);
    UPDATE keys k SET entity_id = e.id, relation_id = r.id FROM entities e, relations r
        WHERE e.name_norm = split_part(k.key_norm, E'\t', 1) AND r.name_norm = split_part(k.key_norm, E'\t', 2);
    ALTER TABLE keys ALTER COLUMN entity_id SET NOT NULL, ALTER COLUMN relation_id SET NOT NULL,
        DROP COLUMN key_norm, DROP COLUMN entity, DROP COLUMN relation;
    CREATE UNIQUE INDEX keys_pair ON keys(entity_id, relation_id);
    ALTER TABLE triples DROP COLUMN entity, DROP COLUMN relation, DROP COLUMN key_norm,
        DROP COLUMN entity_norm, DROP COLUMN relation_norm;
    DROP INDEX triples_key;
    CREATE INDEX triples_fact ON triples(key_id, value_norm);
    ALTER TABLE sources ADD COLUMN doc BIGINT REFERENCES documents(id);
    UPDATE sources s SET doc = d.id FROM documents d WHERE d.doc_id = s.doc_id;
    ALTER TABLE sources ALTER COLUMN doc SET NOT NULL, DROP COLUMN doc_id;
    CREATE UNIQUE INDEX sources_once ON sources(triple_id, doc, coalesce(position, -1));
    CREATE INDEX sources_doc ON sources(doc);
    UPDATE changes SET new_value = NULL WHERE op <> 'edit';
    ALTER TABLE changes DROP COLUMN old_value;
    """,
]

_URL = re.compile(r"^(postgres(?:ql)?):/+", re.IGNORECASE)  # one slash too: a URL that went through Path()


def is_url(location) -> bool:
    """Whether ``location`` (a str or Path) names a PostgreSQL database rather than a folder."""
    return bool(_URL.match(str(location)))


def as_url(location) -> str:
    """``location`` as a ``postgresql://`` URL (mends the slash that ``Path`` drops)."""
    return _URL.sub(r"\1://", str(location), count=1)


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def index_cache_dir(url: str) -> Path:
    """This machine's folder for the key index of the KB at ``url``."""
    root = Path(os.environ.get("LMLM_KB_CACHE") or Path.home() / ".cache" / "lmlm" / "kb")
    return root / hashlib.sha1(redact(url).encode("utf-8")).hexdigest()[:16]


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise ImportError("a PostgreSQL knowledge base needs psycopg: pip install 'lmlm[postgres]'") from None
    return psycopg


_TRANSLATED: dict[str, str] = {}


def _translate(sql: str) -> str:
    """SQLite statement -> PostgreSQL: placeholders, INSERT OR IGNORE/REPLACE."""
    out = _TRANSLATED.get(sql)
    if out is None:
        out = sql.replace("?", "%s")
        if "INSERT OR REPLACE INTO meta" in out:
            out = out.replace("INSERT OR REPLACE", "INSERT") + \
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value"
        elif "INSERT OR IGNORE" in out:
            out = out.replace("INSERT OR IGNORE", "INSERT") + " ON CONFLICT DO NOTHING"
        out = out.replace("(id INTEGER PRIMARY KEY)", "(id BIGINT PRIMARY KEY)")
        _TRANSLATED[sql] = out
    return out


class PostgresStore(SQLiteStore):
    """The store of one KB in a PostgreSQL database (``folder`` is the URL, password hidden)."""

    def __init__(self, url: str, conn, stream: bool = False):
        self.url, self.folder = url, redact(url)
        self.conn = conn
        self._stream = stream
        self._lock = threading.RLock()

    @staticmethod
    def _connect_url(url: str):
        psycopg = _psycopg()
        try:
            return psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError as e:
            raise KBNotFound(f"cannot reach the knowledge base at {redact(url)}: {str(e).strip()}") from None

    @classmethod
    def exists(cls, url: str) -> bool:
        """Whether the database at ``url`` already holds a knowledge base."""
        with cls._connect_url(url) as conn:
            if conn.execute("SELECT to_regclass('meta')").fetchone()[0] is None:
                return False
            return conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() is not None

    @classmethod
    def create(cls, url: str, meta: dict[str, str]) -> "PostgresStore":
        store = cls(url, cls._connect_url(url))
        store.migrate()
        with store._transaction():
            if store._x("SELECT 1 FROM meta WHERE name = 'format'").fetchone():
                raise KBError(f"{store.folder} already holds a knowledge base")
            store._xm("INSERT OR REPLACE INTO meta(name, value) VALUES (?, ?)",
                      [("format", FORMAT), ("created", utc_now()), *meta.items()])
        return store

    @classmethod
    def open(cls, url: str) -> "PostgresStore":
        store = cls(url, cls._connect_url(url))
        fmt = None
        if store._x("SELECT to_regclass('meta')").fetchone()[0] is not None:
            fmt = store._x("SELECT value FROM meta WHERE name = 'format'").fetchone()
        if fmt is None or fmt[0] != FORMAT:
            store.close()
            raise NotAKnowledgeBase(f"the database at {store.folder} is not an lmlm knowledge base "
                                    "(make one with `lmlm kb build` or KnowledgeBase.create)")
        store.migrate()
        return store

    def schema_version(self) -> int:
        self._x("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        return self._x("SELECT max(version) FROM schema_version").fetchone()[0] or 0

    def migrate(self) -> None:
        """Apply the PostgreSQL migrations this database has not seen, under the write lock."""
        with self._lock:
            current = self.schema_version()
            if current > len(PG_MIGRATIONS):
                raise KBError(f"{self.folder} has schema version {current}, newer than this lmlm knows "
                              f"({len(PG_MIGRATIONS)}); upgrade lmlm")
            with self.conn.transaction():
                self._x("SELECT pg_advisory_xact_lock(%s)" % _LOCK_KEY)
                for n in range(self.schema_version() + 1, len(PG_MIGRATIONS) + 1):
                    self.conn.execute(PG_MIGRATIONS[n - 1])
                    self._x("INSERT INTO schema_version(version) VALUES (?)", (n,))

    # -- statements and transactions ---------------------------------------------------------------
    def _x(self, sql: str, params: Sequence = ()):
        if self._stream:  # a server-side cursor: rows come in batches, not all at once
            cur = self.conn.cursor(name=f"lmlm_stream_{next(_CURSORS)}")
            cur.itersize = 5000
            return cur.execute(_translate(sql), params or None)
        return self.conn.execute(_translate(sql), params or None)

    def _xm(self, sql: str, rows: Iterable[Sequence]) -> None:
        rows = list(rows)
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(_translate(sql), rows)

    @contextmanager
    def _transaction(self, write: bool = True):
        with self._lock, self.conn.transaction():
            if write:
                self._x("SELECT pg_advisory_xact_lock(%s)" % _LOCK_KEY)  # one writer at a time, queued
            else:
                self._x("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # one snapshot for the whole read
            yield self.conn

    def records(self, active_only: bool = True, at: int | None = None) -> Iterator:
        """All (active) triples in id order, streamed through a server-side cursor on its own connection."""
        conn = self._connect_url(self.url)
        try:
            with conn.transaction():
                reader = PostgresStore(self.url, conn, stream=True)
                if at is not None:
                    yield from reader.records_at(at)
                else:
                    yield from reader._records("t.deleted_version IS NULL" if active_only else "1 = 1")
        finally:
            conn.close()
