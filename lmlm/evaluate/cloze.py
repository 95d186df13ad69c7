"""Cloze factual precision: complete ``"<person> was born in"`` and check the gold value.

The rule is the paper's T-REx one: greedy decoding, lookups stripped from the output, and the
answer counts when the gold value appears among the first five words of the continuation (a
multi-word value must *start* within the first five words). For an LMLM a lookup is forced at the
end of the prompt (``force_lookup``); the model writes the entity and relation itself.

Exercised by ``lmlm quickstart`` and ``lmlm eval trex``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

__all__ = ["normalize_words", "match_first_words", "STOP_WORDS", "content_words", "match_first_content_words",
           "ClozeItem", "cloze_precision", "wrong_entity"]

_PUNCT = re.compile(r"[^\w\s]")


def normalize_words(text: str) -> list[str]:
    """Lowercased words with punctuation removed (``"May 3, 1960."`` -> ``["may", "3", "1960"]``)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return _PUNCT.sub(" ", text).split()


def match_first_words(output: str, gold: str, n_words: int = 5) -> bool:
    """True when the gold value's words start within the first ``n_words`` words of ``output``.

    Examples:
        >>> match_first_words(" Paris, where she grew up", "Paris")
        True
        >>> match_first_words(" on May 3, 1960 in Rome", "May 3, 1960")
        True
        >>> match_first_words(" a b c d e Paris", "Paris")
        False
    """
    out, g = normalize_words(output), normalize_words(gold)
    if not g:
        raise ValueError("gold value has no words")
    return any(out[i:i + len(g)] == g for i in range(min(n_words, len(out))))


# English function words skipped when counting "content words" (T-REx exact match and precision@1).
# Not "may": it is a month, and skipping it made "May 27" match "June 27".
STOP_WORDS = frozenset("""
a an the and or but nor so yet of in on at to for from by with about as into onto upon over under
than then there here this that these those it its is are was were be been being am has have had do
does did will would shall should can could might must not no also very just only which who whom
whose what when where while he she they them their his her him we us our you your i me my
""".split())


def content_words(text: str) -> list[str]:
    """:func:`normalize_words` without :data:`STOP_WORDS` (``"is an Indian actor"`` -> ``["indian", "actor"]``)."""
    return [w for w in normalize_words(text) if w not in STOP_WORDS]


def match_first_content_words(output: str, gold: str, n_words: int = 5) -> bool:
    """True when the gold value's content words start within the first ``n_words`` content words of ``output``.

    A gold value made only of stop words is matched as :func:`match_first_words` does.

    Examples:
        >>> match_first_content_words(" is the capital of the United States", "United States", 3)
        True
        >>> match_first_content_words(" the actor", "actor", 1)
        True
        >>> match_first_content_words(" on June 27, 1960", "May 27, 1960")
        False
    """
    g = content_words(gold)
    if not g:
        return match_first_words(output, gold, n_words)
    out = content_words(output)
    return any(out[i:i + len(g)] == g for i in range(min(n_words, len(out))))


@dataclass(frozen=True)
class ClozeItem:
    prompt: str
    gold: str
    key: str = ""  # grouping label, e.g. a mention bucket


def cloze_precision(generator, items: Sequence[ClozeItem], *, force_lookup: bool = False,
                    max_new_tokens: int = 32, batch_size: int = 32, n_words: int = 5,
                    keep_samples: int = 0, progress: bool = False, keep_results: bool = False) -> dict:
    """Share of items whose gold value appears early in the greedy continuation.

    Returns ``{"precision", "n", "by_key": {key: precision}, "hits": [bool per item], "samples": [...]}``;
    ``hits`` lets a caller group the items another way; samples hold the first ``keep_samples``
    generations with their lookup traces; ``keep_results`` adds every :class:`GenerationResult`
    under ``"results"``.
    """
    results = generator.generate([it.prompt for it in items], max_new_tokens=max_new_tokens,
                                 batch_size=batch_size, force_lookup=force_lookup, progress=progress)
    hits = [match_first_words(r.clean_text, it.gold, n_words) for r, it in zip(results, items)]
    by_key: dict[str, list[bool]] = {}
    for it, h in zip(items, hits):
        by_key.setdefault(it.key, []).append(h)
    samples = [{"prompt": it.prompt, "gold": it.gold, "text": r.text, "clean_text": r.clean_text, "hit": h,
                "lookups": [t.__dict__ for t in r.trace]}
               for it, r, h in list(zip(items, results, hits))[:keep_samples]]
    return {
        "precision": sum(hits) / len(hits) if hits else float("nan"),
        "n": len(hits),
        "by_key": {k: sum(v) / len(v) for k, v in sorted(by_key.items())},
        "hits": hits,
        "samples": samples,
        **({"results": results} if keep_results else {}),
    }


def wrong_entity(results, subjects: Sequence[str]) -> dict:
    """Lookups of generations about ``subjects`` (one per result) answered with another entity's fact.

    Returns ``{"wrong", "answered", "lookups", "share"}``: ``share`` is wrong / lookups (0.0 without
    lookups), and ``examples`` lists up to five ``(subject, query entity, matched entity)``.
    """
    from ..kb.keys import normalize_text

    wrong = answered = lookups = 0
    examples = []
    for r, subject in zip(results, subjects):
        for t in r.trace:
            lookups += 1
            if t.found:
                answered += 1
                if normalize_text(t.matched_entity or "") != normalize_text(subject):
                    wrong += 1
                    if len(examples) < 5:
                        examples.append([subject, t.query_entity, t.matched_entity])
    return {"wrong": wrong, "answered": answered, "lookups": lookups,
            "share": round(wrong / lookups, 4) if lookups else 0.0, "examples": examples}
