"""The SQLite schema of a knowledge base folder, as numbered, append-only migrations.

Never edit a migration that has shipped; append a new one. ``SQLiteStore.migrate`` applies the ones
a folder lacks, in order (a folder newer than this code is refused). Exercised by every ``lmlm kb``
command; the PostgreSQL store keeps its own list (:data:`lmlm.kb.postgres.PG_MIGRATIONS`).
"""

from __future__ import annotations

__all__ = ["DB_FILENAME", "FORMAT", "MIGRATIONS"]

DB_FILENAME = "kb.sqlite"
FORMAT = "lmlm-kb"

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
]
