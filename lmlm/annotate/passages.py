"""Cutting text into passages an annotator takes at once: sentence ends first.

:func:`split_passages` gives the passages of a text as spans (paragraphs, long ones cut at sentence
ends; headings left out), for the LLM annotation of ``lmlm pipeline``; :func:`cover_passages` gives
pieces that join back to the whole text exactly, for the distilled annotator, which must reproduce
every character.
"""

from __future__ import annotations

import re

__all__ = ["split_passages", "cover_passages"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


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
    """``text`` cut into pieces that join back to it exactly: at the starts of its
    :func:`split_passages` (the whitespace before a passage goes with the piece it ends), and a piece
    still longer than ``max_chars`` (a sentence that long, text without sentence ends) after a space
    where there is one, else mid-word.

    Examples:
        >>> cover_passages("Ada was born in London. She wrote notes.", 30)
        ['Ada was born in London. ', 'She wrote notes.']
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    starts = [0] + [s for s, _ in split_passages(text, max_chars, min_chars=1)[1:]]
    out = []
    for a, b in zip(starts, starts[1:] + [len(text)]):
        while b - a > max_chars:
            cut = text.rfind(" ", a + 1, a + max_chars)
            cut = cut + 1 if cut > a else a + max_chars
            out.append(text[a:cut])
            a = cut
        out.append(text[a:b])
    return [p for p in out if p] or [text]
