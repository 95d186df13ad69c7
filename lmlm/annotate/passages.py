"""Cutting text into passages an annotator takes at once: sentence ends first.

:func:`split_passages` gives the passages of a text as spans (paragraphs, long ones cut at sentence
ends; headings left out), for the LLM annotation of ``lmlm pipeline``; :func:`cover_passages` gives
pieces that join back to the whole text exactly (a text no longer than the limit whole), for the seed
and the distilled annotator, which must reproduce every character.
"""

from __future__ import annotations

import re
from bisect import bisect_right

__all__ = ["split_passages", "cover_passages"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_CUTS = (re.compile(r"\n[^\S\n]*\n\s*"), _SENTENCE_END, re.compile(r"\n\s*"), re.compile(r"\s+"))


def split_passages(text: str, max_chars: int = 400, min_chars: int = 40) -> list[tuple[int, int]]:
    """``(start, end)`` of each passage of ``text``: its paragraphs, long ones cut at sentence ends so
    each passage has at most ``max_chars`` characters where the sentences allow; passages shorter
    than ``min_chars`` (headings) are left out.

    Examples:
        >>> split_passages("Title\\nAda was born in 1815. She died in 1852.", max_chars=25, min_chars=10)
        [(6, 27), (28, 45)]
    """
    out = []
    pos = 0
    for para in text.split("\n"):
        start, end = pos, pos + len(para)
        pos = end + 1
        cuts = [start] + [start + m.end() for m in _SENTENCE_END.finditer(para)] + [end]
        a = cuts[0]
        for k in range(1, len(cuts)):
            b = cuts[k]
            nxt = cuts[k + 1] if k + 1 < len(cuts) else None
            if nxt is None or nxt - a > max_chars:
                s, e = _trim(text, a, b)
                if e - s >= min_chars:
                    out.append((s, e))
                a = b
    return out


def _trim(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def cover_passages(text: str, max_chars: int) -> list[str]:
    """``text`` cut into pieces of at most ``max_chars`` characters that join back to it exactly; a text
    that short is one piece, whatever its line breaks.

    A longer text is cut, each piece as long as it may be, at the last blank line that leaves a piece of
    at least half ``max_chars``, else the last sentence end, else the last line break, else the last
    space (the whitespace before a piece goes with the piece it ends), and mid-word only where a word
    is longer than that: a hard-wrapped sentence stays whole where the text allows.

    Examples:
        >>> cover_passages("Ada was born in London. She wrote notes.", 30)
        ['Ada was born in London. ', 'She wrote notes.']
        >>> cover_passages("Ada was born\\nin London.", 30)
        ['Ada was born\\nin London.']
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    # where a piece may start, best first: after a blank line, a sentence end, a line break, a space
    kinds = [[m.end() for m in pattern.finditer(text)] for pattern in _CUTS]
    out, a = [], 0
    while len(text) - a > max_chars:
        best = [_last(cuts, a + max_chars) for cuts in kinds]
        cut = next((c for c in best if c - a >= max_chars // 2), max(best))
        cut = cut if cut > a else a + max_chars  # no whitespace at all: mid-word
        out.append(text[a:cut])
        a = cut
    out.append(text[a:])
    return [p for p in out if p] or [text]


def _last(cuts: list[int], limit: int) -> int:
    """The last of the sorted ``cuts`` not after ``limit`` (0 if none)."""
    i = bisect_right(cuts, limit)
    return cuts[i - 1] if i else 0
