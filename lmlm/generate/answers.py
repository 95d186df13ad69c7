"""Answering lookup queries: from the ids a model wrote to the value forced after ``<|db_retrieve|>``.

One :class:`Answerer` serves every decoding path (the Hugging Face processor, the vLLM loop, the
re-encode baseline): it decodes a query's entity and relation, asks the KB for all new queries in
one ``lookup_batch`` call, applies the miss policy and caches the answer by the query's token ids.

Miss policies (what a query without a match gets):

* ``"text"``: the ``fallback`` text (``"unknown"`` by default) is the value;
* ``"nearest"``: the KB's nearest key whatever its score (the authors' ``top1_anyway``), else the text;
* ``"skip"``: no value; ``<|db_end|>`` follows at once and the model goes on by itself.

Exercised by ``lmlm generate --fallback``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..tokens import LookupTokenizer

__all__ = ["Answer", "Answerer", "MISS_POLICIES", "Key", "query_key"]

MISS_POLICIES = ("text", "nearest", "skip")
_ANY_SCORE = -1.0  # a cosine threshold every key passes

Key = tuple[tuple[int, ...], tuple[int, ...]]  # (entity ids, relation ids) of one query


@dataclass(frozen=True)
class Answer:
    """A resolved query: its text, the KB match (or None), the value and the ids forced after retrieve.

    ``status`` is ``exact`` or ``fuzzy`` (a match at or above the KB's threshold), ``nearest`` (below
    it, under the ``nearest`` policy), ``fallback`` (the fallback text) or ``skipped``.
    """

    entity: str
    relation: str
    match: Any
    value: str
    continuation: tuple[int, ...]
    kb_version: int | None
    status: str


class Answerer:
    """Answer queries from a KB with a miss policy; answers are cached by query ids.

    Args:
        tokenizer (`LookupTokenizer`): decodes queries, encodes values.
        kb (optional): any object with ``lookup_batch([(entity, relation), ...]) -> [Match | None]``
            (and a ``threshold`` keyword for ``on_miss="nearest"``); ``None`` misses every query.
        fallback (`str | None`, defaults to `"unknown"`): the value of a miss under ``on_miss="text"``;
            ``None`` is the same as ``on_miss="skip"``.
        on_miss (`str`, defaults to `"text"`): ``"text"``, ``"nearest"`` or ``"skip"`` (see the module).
        cache (`dict`, optional): answers by key; share it across batches and calls.
    """

    def __init__(self, tokenizer: LookupTokenizer, kb=None, *, fallback: str | None = "unknown",
                 on_miss: str = "text", cache: dict | None = None):
        if fallback is not None and not isinstance(fallback, str):
            raise ValueError(f"fallback must be a string or None, got {fallback!r}")
        if on_miss not in MISS_POLICIES:
            raise ValueError(f"on_miss must be one of {MISS_POLICIES}, got {on_miss!r}")
        self.tok, self.kb = tokenizer, kb
        self.fallback = fallback
        self.on_miss = "skip" if fallback is None else on_miss
        self.cache: dict[Key, Answer] = {} if cache is None else cache
        self._bad = set(tokenizer.call_ids) | {tokenizer.eos_id, tokenizer.doc_id}

    def __getitem__(self, key: Key) -> Answer:
        return self.cache[key]

    def get(self, key: Key) -> Answer | None:
        return self.cache.get(key)

    def resolve(self, keys: Sequence[Key]) -> None:
        """Answer the keys not yet cached, with one ``kb.lookup_batch`` call (two under ``nearest``)."""
        keys = [k for k in dict.fromkeys(keys) if k not in self.cache]
        if not keys:
            return
        texts = [(self.tok.decode_field(e), self.tok.decode_field(r)) for e, r in keys]
        ask = [i for i, (e, r) in enumerate(texts) if e and r] if self.kb is not None else []
        matches: list = [None] * len(keys)
        for i, m in zip(ask, self._lookup([texts[i] for i in ask])):
            matches[i] = m
        nearest = [False] * len(keys)
        if self.on_miss == "nearest":
            missed = [i for i in ask if matches[i] is None]
            for i, m in zip(missed, self._lookup([texts[i] for i in missed], threshold=_ANY_SCORE)):
                matches[i], nearest[i] = m, m is not None
        version = _kb_version(self.kb)
        for key, (e, r), m, near in zip(keys, texts, matches, nearest):
            self.cache[key] = self._answer(e, r, m, near, version)

    def _lookup(self, queries: list[tuple[str, str]], **kwargs) -> list:
        if not queries:
            return []
        return list(self.kb.lookup_batch(queries, **kwargs))

    def _answer(self, entity: str, relation: str, m, nearest: bool, version: int | None) -> Answer:
        if m is not None:
            status = "nearest" if nearest else ("exact" if getattr(m, "exact", False) else "fuzzy")
            value = m.value
            version = getattr(m, "version", version)
        elif self.on_miss == "skip":
            status, value = "skipped", ""
        else:
            status, value = "fallback", self.fallback or ""
        return Answer(entity, relation, m, value, self.continuation(value), version, status)

    def continuation(self, value: str) -> tuple[int, ...]:
        """Value ids then ``<|db_end|>``; markers and stop tokens inside a value are dropped."""
        if not value.strip():
            return (self.tok.end_id,)
        return tuple(i for i in self.tok.encode_field(value) if i not in self._bad) + (self.tok.end_id,)


def _kb_version(kb) -> int | None:
    v = getattr(kb, "version", None) if kb is not None else None
    return v if isinstance(v, int) else None


def query_key(row: torch.Tensor | Sequence[int], rpos: int, tok: LookupTokenizer, window: int) -> Key:
    """(entity ids, relation ids) of the call whose ``<|db_retrieve|>`` is at ``row[rpos]``."""
    lo = max(0, rpos - window)
    ids = _as_list(row[lo:rpos])
    if tok.start_id not in ids and lo > 0:  # a long call written in the prompt
        ids = _as_list(row[:rpos])
    s = len(ids) - 1 - ids[::-1].index(tok.start_id) if tok.start_id in ids else -1
    body = ids[s + 1:]
    if tok.sep_id not in body:
        return tuple(body), ()
    p = body.index(tok.sep_id)
    return tuple(body[:p]), tuple(body[p + 1:])


def _as_list(x) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)
