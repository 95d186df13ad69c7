"""The knowledge base: versioned ``(entity, relation) -> value`` facts with exact-then-fuzzy lookup.

Exercised by ``lmlm kb`` and by every lookup during ``lmlm generate``.

Examples:
    >>> from lmlm.kb import KnowledgeBase, Triple
    >>> kb = KnowledgeBase.create("my-kb")
    >>> kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-17")])
    1
    >>> kb.lookup("Ada Lovelace", "birthplace").value
    'London'
"""

from .base import INDEX_FILENAME, MAX_SOURCES, KnowledgeBase
from .encoder import DEFAULT_MODEL, Encoder, encode, get_encoder
from .keys import key_text, normalize_key, normalize_text, normalize_value
from .records import Change, Match, Triple, TripleRecord, VersionRecord
from .store import DB_FILENAME, MIGRATIONS, KBError, KBNotFound, NotAKnowledgeBase, SQLiteStore

__all__ = [
    "KnowledgeBase", "Triple", "Match", "TripleRecord", "VersionRecord", "Change",
    "KBError", "NotAKnowledgeBase", "KBNotFound",
    "normalize_key", "normalize_text", "normalize_value", "key_text",
    "Encoder", "get_encoder", "encode", "DEFAULT_MODEL",
    "SQLiteStore", "MIGRATIONS", "DB_FILENAME", "INDEX_FILENAME", "MAX_SOURCES",
]
