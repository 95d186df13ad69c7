"""The SQLite schema of a knowledge base folder, as numbered, append-only migrations.

Never edit a migration that has shipped; append a new one. ``SQLiteStore.migrate`` applies the ones
a folder lacks, in order (a folder newer than this code is refused). Exercised by every ``lmlm kb``
command; the PostgreSQL store keeps its own list (:data:`lmlm.kb.postgres.PG_MIGRATIONS`). Also the
SQL fragments and helpers the store's modules share (``store``, ``versions``, ``store_aliases``,
``store_deletes``, ``store_map``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

from .keys import KEY_SEP

__all__ = ["DB_FILENAME", "FORMAT", "MIGRATIONS", "NAMED", "KEY_NORM", "KEY_IS", "ACTIVE_AT", "NO_POSITION",
           "NoChange", "chunks", "marks", "stored_position"]

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


class NoChange(Exception):
    """Raised inside a write transaction that changed nothing, to roll it back without a version."""


def chunks(items: Sequence, n: int = IN_CHUNK) -> Iterator[Sequence]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def marks(n: int) -> str:
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
