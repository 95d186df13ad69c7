"""Lookup keys: how an ``(entity, relation)`` pair is normalised for exact match and phrased for embedding.

Exact lookup compares :func:`normalize_key` strings; fuzzy lookup embeds :func:`key_text`, the raw
``f"{entity} {relation}"`` as in the paper. Exercised by every ``KnowledgeBase`` call.

Examples:
    >>> normalize_key("  Ada_Lovelace ", "Birth  City:")
    'ada lovelace\\tbirth city'
    >>> key_text("Ada Lovelace", "Birth City")
    'Ada Lovelace Birth City'
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["KEY_SEP", "normalize_text", "normalize_key", "normalize_value", "key_text"]

# Joins the entity and relation parts of a key. Whitespace is collapsed to single spaces inside a
# part, so a tab can never occur there and ("a b", "c") and ("a", "b c") stay distinct keys.
KEY_SEP = "\t"

_SPACE_RE = re.compile(r"\s+")


def _is_edge_junk(ch: str) -> bool:
    # Unicode punctuation (P*) and symbols (S*), e.g. quotes, colons, dashes, bullets.
    return unicodedata.category(ch)[0] in "PS"


def normalize_text(text: str) -> str:
    """NFKC, casefold, underscores to spaces, collapse whitespace, strip punctuation at both ends."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    s = unicodedata.normalize("NFKC", text).casefold().replace("_", " ")
    s = _SPACE_RE.sub(" ", s).strip()
    start, end = 0, len(s)
    while start < end and (_is_edge_junk(s[start]) or s[start].isspace()):
        start += 1
    while end > start and (_is_edge_junk(s[end - 1]) or s[end - 1].isspace()):
        end -= 1
    return s[start:end]


def normalize_key(entity: str, relation: str) -> str:
    """The exact-match key of ``(entity, relation)``: both parts normalised, joined by :data:`KEY_SEP`."""
    return normalize_text(entity) + KEY_SEP + normalize_text(relation)


def normalize_value(value: str) -> str:
    """What makes two values the same fact: NFKC, casefold, collapsed whitespace.

    Punctuation is kept, so ``C`` and ``C++`` stay different values.
    """
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    return _SPACE_RE.sub(" ", unicodedata.normalize("NFKC", value).casefold()).strip()


def key_text(entity: str, relation: str) -> str:
    """The text embedded for fuzzy lookup (the paper's ``entity relation`` string)."""
    return f"{entity} {relation}"
