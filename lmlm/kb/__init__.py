"""The knowledge base: versioned ``(entity, relation) -> value`` facts, looked up entity first.

Exercised by ``lmlm kb`` and by every lookup during ``lmlm generate``. One module a concept:
``knowledge_base`` (the KB, composed of a ``store``, a ``keymap``, an ``index`` and a ``resolver``;
its views of past versions), ``store`` (SQLite: schema migrations, versions, aliases, deletes),
``postgres``, ``keymap``, ``index`` (the vector index: rows, codes, file), ``resolve`` (lookups),
``entities`` (name matching), ``keys`` (normalisation), ``records`` (values in and out),
``formats`` (files read and written), ``ingest`` and ``build`` (adding files), ``encoder``, ``cli``.

Examples:
    >>> from lmlm.kb import KnowledgeBase, Triple
    >>> kb = KnowledgeBase.create("my-kb")
    >>> kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-17")])
    1
    >>> kb.lookup("Ada Lovelace", "birthplace").value
    'London'
"""

from .build import build, open_authors_json
from .index import AnnConfig
from .knowledge_base import KnowledgeBase, KnowledgeBaseView
from .records import KBError, KBNotFound, Match, Miss, NotAKnowledgeBase, Triple

__all__ = ["KnowledgeBase", "KnowledgeBaseView", "Triple", "Match", "Miss", "KBError", "NotAKnowledgeBase",
           "KBNotFound", "AnnConfig", "build", "open_authors_json"]

# Also importable from here, as before (each lives in the module named):
from .build import import_authors_json  # noqa: F401,E402
from .encoder import DEFAULT_MODEL, Encoder, encode, get_encoder  # noqa: F401,E402
from .entities import ENTITY_MARGIN, ENTITY_THRESHOLD, EntityIndex  # noqa: F401,E402
from .formats import FORMATS, detect_format, read_authors_json  # noqa: F401,E402
from .index import VectorKeyIndex  # noqa: F401,E402
from .keys import key_text, normalize_key, normalize_text, normalize_value  # noqa: F401,E402
from .knowledge_base import INDEX_FILENAME, MAX_SOURCES, Restored  # noqa: F401,E402
from .records import AliasRow, Change, DiffEntry, TripleRecord, VersionRecord  # noqa: F401,E402
from .resolve import MATCHINGS, RELATION_THRESHOLD  # noqa: F401,E402
from .store import DB_FILENAME, MIGRATIONS, SQLiteStore  # noqa: F401,E402
