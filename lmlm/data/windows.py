"""Call windows: short training documents cut around each lookup call, optionally with the entity renamed.

A pretrained model continued on whole articles spends most of its budget on text it already reads,
and on a real corpus its calls name the few entities that corpus is about: it learns *which*
entities a call names, not to name the one the text is about. Windows fix the first; renaming fixes
the second. :func:`call_windows` cuts, for every call of a document, the sentence that holds it (and
``before`` sentences more), the call, and ``after_words`` words of what follows, headed by the
entity's name on a line of its own (as the pipeline's training chunks are headed). :func:`swap_entity`
gives the entity another name in the head, the text and the call alike: the value is masked in the
loss, so the renamed window teaches nothing false, and the only way to write the call right is to
copy the name the text gives.

Exercised by ``lmlm data windows DOCS --out WINDOWS.jsonl --swap 0.7``.
"""

from __future__ import annotations

import random
import re
from typing import Iterable, Iterator, Sequence

from ..corpus import Document
from ..lookup import Lookup, Segment, Text, plain_pieces

__all__ = ["call_windows", "swap_entity", "windows_of", "fake_names"]

# a sentence ends at . ! ? followed by space and a capital, a digit or a quote, or at a line break
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n+")


def _sentences(text: str) -> tuple[list[int], list[int]]:
    """Where each sentence of ``text`` starts and where each ends (before the space that follows it)."""
    marks = list(_SENTENCE_END.finditer(text))
    return [0] + [m.end() for m in marks], [m.start() for m in marks] + [len(text.rstrip())]


def call_windows(segments: Sequence[Segment], before: int = 0, after_words: int = 8,
                 head: bool = True) -> list[list[Segment]]:
    """One window per lookup call of ``segments``: the call's sentence (and ``before`` sentences
    more) up to the call, the call, then ``after_words`` words, or fewer where the sentence ends
    sooner (a window that ends where its sentence does teaches where a text may stop); the other
    calls in it become text (their values stay, as the text writes them). ``head``: the entity's
    name first, on its own line."""
    segments = list(segments)
    pieces = plain_pieces(segments)
    text = "".join(pieces)
    starts, ends = _sentences(text)
    out: list[list[Segment]] = []
    pos = 0
    for seg, piece in zip(segments, pieces):
        if isinstance(seg, Lookup):
            k = max(i for i, s in enumerate(starts) if s <= pos)
            begin = starts[max(0, k - before)]
            rest = text[pos:]
            words = list(re.finditer(r"\S+", rest))
            end = pos + (words[after_words - 1].end() if len(words) >= after_words else len(rest))
            end = min(end, next((e for e in ends if e >= pos + len(piece)), end))  # the sentence ends sooner
            line = text[pos:end]
            nl = line.find("\n")
            if nl > 0:  # a line break (a heading, a new paragraph) ends the window
                end = pos + nl
            left = text[begin:pos].rstrip()
            window: list[Segment] = []
            if head:
                window.append(Text(seg.entity + "\n"))
            window += [Text(left + " " if left else ""), seg, Text(" " + text[pos:end].lstrip())]
            out.append([s for s in window if not isinstance(s, Text) or s.text])
        pos += len(piece)
    return out


def swap_entity(window: Sequence[Segment], name: str) -> list[Segment]:
    """``window`` with its call's entity named ``name`` in the call and wherever the text writes it."""
    calls = [s for s in window if isinstance(s, Lookup)]
    if not calls:
        return list(window)
    old = calls[0].entity
    pattern = re.compile(r"(?<!\w)" + re.escape(old) + r"(?!\w)")
    out: list[Segment] = []
    for s in window:
        if isinstance(s, Lookup):
            out.append(Lookup(name if s.entity == old else s.entity, s.relation, s.value))
        else:
            out.append(Text(pattern.sub(lambda _: name, s.text)))
    return out


def fake_names(seed: int = 0) -> Iterator[str]:
    """An endless stream of made-up proper names: people, places, organisations and works, mixed."""
    from ..errors import need

    fake = need("faker", "worlds", "made-up names").Faker(["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT"])
    fake.seed_instance(seed)
    kinds = (fake.name, fake.city, fake.company)
    rng = random.Random(seed)
    while True:
        name = " ".join(str(rng.choice(kinds)()).split())
        if name and all(c not in name for c in "[]()'\"|"):
            yield name


def windows_of(documents: Iterable[Document], *, before: int = 0, after_words: int = 8, head: bool = True,
               swap: float = 0.0, seed: int = 0, copies: int = 1) -> Iterator[Document]:
    """The call windows of ``documents`` as documents (id ``DOC/wN``, the document's split and source
    kept, ``meta.window_of``); a share ``swap`` of them has its entity renamed (``meta.renamed``).
    ``copies``: each window that many times (ids ``DOC/wN``, ``DOC/wN.1``, ...), each copy renamed anew."""
    if not 0 <= swap <= 1:
        raise ValueError(f"swap must be a share between 0 and 1, got {swap}")
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    rng = random.Random(seed)
    names = fake_names(seed)
    for doc in documents:
        for n, window in enumerate(call_windows(doc.segments, before, after_words, head)):
            for k in range(copies):
                meta, text = {"window_of": doc.id}, window
                if swap and rng.random() < swap:
                    entity = next(s.entity for s in window if isinstance(s, Lookup))
                    text = swap_entity(window, next(names))
                    meta["renamed"] = entity
                yield Document.from_segments(f"{doc.id}/w{n}" + (f".{k}" if k else ""), text, source=doc.source,
                                             split=doc.split, meta=meta)
