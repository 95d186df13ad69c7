"""The knowledge base: versioned ``(entity, relation) -> value`` facts, looked up entity first.

Exercised by ``lmlm kb`` and by every lookup during ``lmlm generate``.

Examples:
    >>> from lmlm.kb import KnowledgeBase, Triple
    >>> kb = KnowledgeBase.create("my-kb")
    >>> kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-17")])
    1
    >>> kb.lookup("Ada Lovelace", "birthplace").value
    'London'
"""

from .formats import read_authors_json
from .build import import_authors_json, open_authors_json
from .base import INDEX_FILENAME, MAX_SOURCES, KnowledgeBase
from .build import build
from .encoder import DEFAULT_MODEL, Encoder, encode, get_encoder
from .formats import FORMATS, detect_format
from .index import AnnConfig, VectorKeyIndex
from .keys import key_text, normalize_key, normalize_text, normalize_value
from .entities import ENTITY_MARGIN, ENTITY_THRESHOLD, EntityIndex
from .records import AliasRow, Change, DiffEntry, Match, Miss, Triple, TripleRecord, VersionRecord
from .resolve import MATCHINGS, RELATION_THRESHOLD
from .store import DB_FILENAME, MIGRATIONS, KBError, KBNotFound, NotAKnowledgeBase, SQLiteStore
from .view import KnowledgeBaseView

__all__ = [
    "KnowledgeBase", "KnowledgeBaseView", "Triple", "Match", "Miss", "AliasRow", "MATCHINGS", "EntityIndex",
    "ENTITY_THRESHOLD", "ENTITY_MARGIN", "RELATION_THRESHOLD", "TripleRecord", "VersionRecord", "Change", "DiffEntry",
    "KBError", "NotAKnowledgeBase", "KBNotFound", "build", "FORMATS", "detect_format",
    "normalize_key", "normalize_text", "normalize_value", "key_text",
    "Encoder", "get_encoder", "encode", "DEFAULT_MODEL", "AnnConfig", "VectorKeyIndex",
    "SQLiteStore", "MIGRATIONS", "DB_FILENAME", "INDEX_FILENAME", "MAX_SOURCES",
    "import_authors_json", "open_authors_json", "read_authors_json",
]
