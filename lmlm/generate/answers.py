"""Answering lookup queries: from the ids a model wrote to the value forced after ``<|db_retrieve|>``.

One :class:`Answerer` serves every decoding path (the Hugging Face processor, the vLLM loop, the
re-encode baseline): it decodes a query's entity and relation, asks the KB for all new queries in
one batched KB call, applies the miss policy and caches the answer by the query's token ids. The
ids before the call (the prompt and the document so far) go with each query as its context: the KB
reads the entities named there to resolve a short or misspelt name. An answer that did not depend
on the context is cached by the query alone, one that did by the query and its context.

Miss policies (what a query without a match gets):

* ``"text"``: the ``fallback`` text (``"unknown"`` by default) is the value;
* ``"nearest"``: the KB's nearest key whatever its score (the authors' ``top1_anyway``), else the text;
  never for a query that names a deleted entity (its nearest key is someone else's);
* ``"skip"``: no value; ``<|db_end|>`` follows at once and the model goes on by itself.

Exercised by ``lmlm generate --fallback``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..tokens import LookupTokenizer

__all__ = ["Answer", "Answerer", "MISS_POLICIES", "Key", "query_key", "call_context"]

MISS_POLICIES = ("text", "nearest", "skip")
_ANY_SCORE = -1.0  # a cosine threshold every key passes

Key = tuple[tuple[int, ...], tuple[int, ...]]  # (entity ids, relation ids) of one query


@dataclass(frozen=True)
class Answer:
    """A resolved query: its text, the KB match (or None), the value and the ids forced after retrieve.

    ``status`` is ``exact`` or ``fuzzy`` (a match at or above the KB's threshold), ``nearest`` (below
    it, under the ``nearest`` policy), ``fallback`` (the fallback text) or ``skipped``. ``miss`` is
    the KB's :class:`lmlm.kb.Miss` for a query it did not answer (why, and what it considered).
    """

    entity: str
    relation: str
    match: Any
    value: str
    continuation: tuple[int, ...]
    kb_version: int | None
    status: str
    miss: Any = None
    context_free: bool = True


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
        matching (`str`, optional): the KB's matching, ``"entity"`` or ``"key"`` (the paper's single-key
            cosine); ``None`` uses the KB's own (``KnowledgeBase.matching``).
    """

    def __init__(self, tokenizer: LookupTokenizer, kb=None, *, fallback: str | None = "unknown",
                 on_miss: str = "text", cache: dict | None = None, matching: str | None = None):
        if fallback is not None and not isinstance(fallback, str):
            raise ValueError(f"fallback must be a string or None, got {fallback!r}")
        if on_miss not in MISS_POLICIES:
            raise ValueError(f"on_miss must be one of {MISS_POLICIES}, got {on_miss!r}")
        if matching not in (None, "entity", "key"):
            raise ValueError(f"matching must be 'entity', 'key' or None, got {matching!r}")
        self.tok, self.kb, self.matching = tokenizer, kb, matching
        self.fallback = fallback
        self.on_miss = "skip" if fallback is None else on_miss
        self.cache: dict[Key, Answer] = {} if cache is None else cache

    def __getitem__(self, key: Key) -> Answer:
        return self.cache[key]

    def get(self, key: Key, context: Sequence[int] | None = None) -> Answer | None:
        """The answer to ``key`` asked after the ids ``context`` (see :func:`call_context`)."""
        if context is not None:
            found = self.cache.get((*key, tuple(context)))
            if found is not None:
                return found
        return self.cache.get(key)

    def resolve(self, keys: Sequence[Key], contexts: Sequence[Sequence[int] | None] | None = None) -> None:
        """Answer the keys not yet cached (for their contexts), with one batched KB call (two under
        ``nearest``). ``contexts``: per key, the ids before its call (see :func:`call_context`)."""
        todo: dict[tuple, tuple[Key, tuple | None]] = {}
        for i, key in enumerate(keys):
            ctx = None if contexts is None or contexts[i] is None else tuple(contexts[i])
            known = self.cache.get(key)
            if known is not None and (known.context_free or ctx is None):
                continue
            if ctx is not None and (*key, ctx) in self.cache:
                continue
            todo.setdefault((*key, ctx), (key, ctx))
        if not todo:
            return
        items = list(todo.values())
        texts = [(self.tok.decode_field(e), self.tok.decode_field(r)) for (e, r), _ in items]
        ask = [i for i, (e, r) in enumerate(texts) if e and r] if self.kb is not None else []
        ctx_text = [None if c is None else self.context_text(c) for _, c in items]
        matches: list = [None] * len(items)
        for i, m in zip(ask, self.lookup([texts[i] for i in ask], [ctx_text[i] for i in ask])):
            matches[i] = m
        nearest = [False] * len(items)
        if self.on_miss == "nearest":
            # a query for a deleted entity stays a miss: the nearest key is someone else's
            missed = [i for i in ask if not matches[i] and not getattr(matches[i], "deleted", False)]
            for i, m in zip(missed, self.lookup([texts[i] for i in missed], None, threshold=_ANY_SCORE,
                                                 matching="key")):
                if m:
                    matches[i], nearest[i] = m, True
        version = _kb_version(self.kb)
        for (key, ctx), (e, r), m, near in zip(items, texts, matches, nearest):
            ans = self._answer(e, r, m, near, version)
            self.cache[key if ans.context_free or ctx is None else (*key, ctx)] = ans

    def names_before(self, ids: Sequence[int], start: int) -> list[list[int]]:
        """The field ids of each KB entity the text before the call opened at ``start`` names (by
        name or alias, first mention first): the names ``name_bias`` keeps a query's entity on."""
        if not hasattr(self.kb, "names_in"):
            return []
        text = self.context_text(call_context(ids, start, self.tok))
        return [self.tok.encode_field(n) for n in self.kb.names_in(text)]

    def context_text(self, ids: Sequence[int]) -> str:
        """The text of the ids before a call: call markers and separators become spaces, and the
        entity and relation the model wrote into earlier calls are left out (a name the model only
        queried is not a name the text gave: a missed "Chad Peterson" call in a text about Chad Lee
        must not ground the next one); the values the KB returned stay (they name the next hop). A name
        the KB refused in an earlier call because the text had not named it stays unnamed when the
        model writes it into the text afterwards ("born in ⟦Paul Marquez → unknown⟧ Port Paul Marquez.
        He studied ⟦Paul Marquez · Major⟧" in a text about Paul Gates), and so does a KB name the model
        writes after a refused call that shares a word with the refused name: the model renaming the
        person it could not look up ("Melissa Donovan was born on ⟦Melissa Donovan → unknown⟧ April
        Donovan, 1968. She graduated from ⟦April Donovan · University⟧")."""
        ids = list(ids)
        text = self._plain_text(ids)
        for name in self._refused_names(ids):
            text = re.sub(r"(?<!\w)" + re.escape(name) + r"(?!\w)", " ", text)
        return text

    def _plain_text(self, ids: list[int]) -> str:
        """The text of ``ids`` without the entity and relation of its calls (their values stay)."""
        tok = self.tok
        stops = set(tok.call_ids) | {tok.eos_id, tok.doc_id}
        pieces, run, in_key = [], [], False
        for t in ids + [-1]:
            if t in stops or t == -1:
                if run and not in_key:
                    pieces.append(tok.hf.decode(run, skip_special_tokens=False))
                run = []
                if t == tok.start_id:
                    in_key = True
                elif t in (tok.retrieve_id, tok.end_id, tok.doc_id):
                    in_key = False
            else:
                run.append(t)
        return " ".join(pieces)

    def _refused_names(self, ids: list[int]) -> set[str]:
        """The names the text before a call gives that earlier refused calls in ``ids`` keep unnamed:
        the refused entity itself where the KB holds that very name, and any KB name first written after
        the refusal that shares a word with it."""
        from ..kb.keys import normalize_text

        tok = self.tok
        out = set()
        for s, t in enumerate(ids):
            if t != tok.start_id or tok.retrieve_id not in ids[s:]:
                continue
            r = ids.index(tok.retrieve_id, s)
            body = ids[s + 1:r]
            if tok.sep_id not in body:
                continue
            p = body.index(tok.sep_id)
            ans = self.get((tuple(body[:p]), tuple(body[p + 1:])), call_context(ids, s, tok))
            miss = ans.miss if ans is not None else None
            if miss is None or getattr(miss, "reason", None) != "no_entity":
                continue
            name = normalize_text(ans.entity)
            # refused although the KB holds that very name: the text had named someone else (a name the KB
            # does not hold at all, "no entity is named ...", is the text's own and stays)
            if name and not getattr(miss, "deleted", False) and any(
                    normalize_text(c[0]) == name for c in getattr(miss, "candidates", ())):
                out.add(ans.entity.strip())
            out.update(self._renamed_after(ids, s, r, name))
        return out

    def _renamed_after(self, ids: list[int], start: int, retrieve: int, refused: str) -> list[str]:
        """KB names the text writes after the refused call at ``ids[start:retrieve]`` and not before it that
        share a word (not an initial) with the refused name ``refused``, normalised."""
        from ..kb.keys import normalize_text

        words = {w for w in refused.split() if len(w) > 1}
        if not words or not hasattr(self.kb, "names_in"):
            return []
        before = {normalize_text(n) for n in self.kb.names_in(self._plain_text(ids[:start]))}
        return [n for n in self.kb.names_in(self._plain_text(ids[retrieve:]))
                if normalize_text(n) not in before and words & set(normalize_text(n).split())]

    def lookup(self, queries: list[tuple[str, str]], contexts: list | None, **kwargs) -> list:
        """Matches, or misses that say why: ``kb.resolve_batch`` where the KB has it, else ``lookup_batch``."""
        if not queries:
            return []
        resolve = getattr(self.kb, "resolve_batch", None)
        if resolve is not None:
            kwargs.setdefault("matching", self.matching)
            return list(resolve(queries, contexts=contexts, **kwargs))
        if "matching" in kwargs:
            kwargs.pop("matching")
        return list(self.kb.lookup_batch(queries, **kwargs))

    def _answer(self, entity: str, relation: str, m, nearest: bool, version: int | None) -> Answer:
        miss = m if m is not None and not m else None  # a Miss (false in a test) says why
        free = getattr(m, "context_free", True) if m is not None else True
        m = m or None
        if m is not None:
            status = "nearest" if nearest else ("exact" if getattr(m, "exact", False) else "fuzzy")
            value = m.value
            version = getattr(m, "version", version)
        elif self.on_miss == "skip":
            status, value = "skipped", ""
        else:
            status, value = "fallback", self.fallback or ""
        return Answer(entity, relation, m, value, self.continuation(value), version, status, miss, free)

    def continuation(self, value: str) -> tuple[int, ...]:
        """Value ids then ``<|db_end|>``; markers and stop tokens inside a value are dropped."""
        if not value.strip():
            return (self.tok.end_id,)
        return tuple(self.tok.value_continuation(value))


def _kb_version(kb) -> int | None:
    v = getattr(kb, "version", None) if kb is not None else None
    return v if isinstance(v, int) else None


def call_context(row: torch.Tensor | Sequence[int], start: int, tok: LookupTokenizer) -> tuple[int, ...]:
    """The ids before the call that opens at ``row[start]``, from the last document separator on
    (the prompt and the document so far): the context a lookup is resolved in."""
    ids = _as_list(row[:start])
    doc = len(ids) - 1 - ids[::-1].index(tok.doc_id) if tok.doc_id in ids else 0
    return tuple(t for t in ids[doc:] if t != tok.eos_id)


def call_start(row: torch.Tensor | Sequence[int], rpos: int, tok: LookupTokenizer) -> int:
    """Position of the ``<|db_start|>`` of the call whose ``<|db_retrieve|>`` is at ``row[rpos]`` (0 if none)."""
    ids = _as_list(row[:rpos])
    return len(ids) - 1 - ids[::-1].index(tok.start_id) if tok.start_id in ids else 0


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
