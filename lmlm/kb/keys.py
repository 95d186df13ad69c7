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
import string
import unicodedata
from functools import lru_cache

__all__ = ["KEY_SEP", "normalize_text", "normalize_key", "normalize_value", "key_text", "clean_field", "is_plain",
           "printable", "names_someone"]

# Joins the entity and relation parts of a key. Whitespace is collapsed to single spaces inside a
# part, so a tab can never occur there and ("a b", "c") and ("a", "b c") stay distinct keys.
KEY_SEP = "\t"

_SPACE_RE = re.compile(r"\s+")
_BREAK_RE = re.compile("[ \t]*[\r\n\x0b\x0c\x85\u2028\u2029]+[ \t]*")  # a line break and the spaces around it


def _invisible(ch: str) -> bool:
    # format characters (Cf): zero-width spaces and joiners, the BOM, soft hyphens, bidi overrides
    return unicodedata.category(ch) == "Cf"


def is_plain(text: str) -> bool:
    """Whether ``text`` is printable ASCII, which :func:`clean_field` leaves as it is but for stripping
    (checked at C speed; callers with several fields pass them joined)."""
    return text.isascii() and text.isprintable()


def clean_field(text: str, name: str = "text") -> str:
    r"""A string as it may enter the KB: NFKC, format characters (zero-width, bidi) removed, line
    breaks and tabs made spaces, ends stripped. Any other control character (ESC, NUL, DEL, ...) is
    refused with a :class:`ValueError` naming the field, so no stored string can disguise itself as
    another or rewrite a terminal it is printed to.

    Examples:
        >>> clean_field("Ev\u200be  Smith\n")
        'Eve  Smith'
        >>> clean_field("Eve\x1b[31m", "entity")
        Traceback (most recent call last):
        ...
        ValueError: entity 'Eve\x1b[31m' holds the control character U+001B; remove it
    """
    if not isinstance(text, str):
        raise TypeError(f"{name} must be str, got {type(text).__name__}")
    if is_plain(text):  # the common case; NFKC leaves ASCII as it is
        return text.strip()
    s = unicodedata.normalize("NFKC", text)
    if s.isprintable() and s.isascii():
        return s.strip()
    s = _BREAK_RE.sub(" ", s)
    out = []
    for ch in s:
        if ch == "\t":
            out.append(" ")
        elif unicodedata.category(ch) == "Cc":
            raise ValueError(f"{name} {text!r} holds the control character U+{ord(ch):04X}; remove it")
        elif not _invisible(ch):
            out.append(ch)
    return "".join(out).strip()


def printable(text: str) -> str:
    """``text`` safe to print to a terminal: control and format characters shown as escapes."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _is_edge_junk(ch: str) -> bool:
    # Unicode punctuation (P*) and symbols (S*), e.g. quotes, colons, dashes, bullets.
    return unicodedata.category(ch)[0] in "PS"


def normalize_text(text: str) -> str:
    """NFKC, casefold, underscores to spaces, collapse whitespace, strip punctuation at both ends."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    return _normalize_text(text)


_ASCII_EDGE = string.punctuation + string.whitespace  # the ASCII characters stripped from both ends


@lru_cache(maxsize=1 << 16)  # names repeat (an entity has many facts, a relation many entities)
def _normalize_text(text: str) -> str:
    if text.isascii():  # NFKC leaves ASCII as it is, and its punctuation and symbols are string.punctuation
        return " ".join(text.casefold().replace("_", " ").split()).strip(_ASCII_EDGE)
    s = unicodedata.normalize("NFKC", text).casefold().replace("_", " ")
    if not s.isascii():  # a zero-width variant of a name is the same name
        s = "".join(ch for ch in s if not _invisible(ch))
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
    return _normalize_value(value)


@lru_cache(maxsize=1 << 16)  # values repeat too (cities, years, employers)
def _normalize_value(value: str) -> str:
    if not value.isascii():  # NFKC leaves ASCII as it is
        value = unicodedata.normalize("NFKC", value)
    return " ".join(value.casefold().split())  # split() breaks at the characters ``\s`` matches


def key_text(entity: str, relation: str) -> str:
    """The text embedded for fuzzy lookup (the paper's ``entity relation`` string)."""
    return f"{entity} {relation}"


def names_someone(text: str) -> bool:
    """Whether the text writes a name of its own: two capitalised words side by side, not across a
    sentence's end ("Wanda Smith was born in"), maybe of a person the KB does not hold. "The new mayor
    was born in" writes none."""
    words = text.split()
    return any(a[:1].isupper() and b[:1].isupper() and a[-1] not in ".!?:;,)\"”" for a, b in zip(words, words[1:]))
