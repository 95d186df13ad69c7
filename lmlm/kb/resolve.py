"""Answering lookups against one version of a knowledge base: :class:`Resolver`, a part of
:class:`lmlm.kb.KnowledgeBase` and of each of its views.

A query's normalised key is tried first (a map probe, score 1.0). Otherwise ``matching="entity"``
(the default) resolves the query's entity on its own (:class:`lmlm.kb.entities.EntityIndex`: exact
name, alias, deleted name, the entities named in the text so far, then fuzzy with a margin), and
then the relation among that entity's keys only: the same normalised relation, else the most
similar one by MiniLM cosine of the relation names (or by characters, for a typo), taken at
``relation_threshold`` with ``RELATION_MARGIN`` over the next. A relation the KB holds for other
entities but not for this one is a miss, never a neighbour (``Birth City`` of a person whose birth
city was deleted is not their ``Birth Date``). ``matching="key"`` is the paper's single-key cosine
over ``entity relation`` (threshold 0.6), kept for comparison. A miss is a
:class:`lmlm.kb.records.Miss` that says which step failed. Every method takes the map of the store
it reads (:mod:`lmlm.kb.keymap`, with its version). Exercised by ``lmlm kb lookup`` and every
lookup during generation.

Examples:
    >>> kb.add_aliases([("Lovelace, Ada", "Ada Lovelace")])
    2
    >>> kb.explain("Lovelace, Ada", "birthplace").via
    'alias'
    >>> kb.explain("Joshua Frazier", "Birth City").reason   # only Timothy Frazier is in the KB
    'no_entity'
"""

from __future__ import annotations

from sys import intern
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from .entities import EntityIndex, Resolved
from .keys import KEY_SEP, key_text, normalize_text
from .records import AliasRow, Best, Match, Miss

if TYPE_CHECKING:
    from .encoder import Encoder
    from .keymap import MemoryMap, StoreMap
    from .store import SQLiteStore

    KeyMap = MemoryMap | StoreMap

__all__ = ["MATCHINGS", "RELATION_THRESHOLD", "RELATION_MARGIN", "MAX_SOURCES", "Resolver"]

MATCHINGS = ("entity", "key")
RELATION_THRESHOLD = 0.5  # MiniLM cosine of relation names: paraphrases 0.55-0.95, other relations below 0.5
RELATION_MARGIN = 0.03
MAX_SOURCES = 32  # document ids returned per match; KnowledgeBase.get has them all
_TYPO_RELATION = 0.85  # character similarity at which a relation counts as a misspelling of another
_CANDIDATES = 8  # index hits inspected per fuzzy query beyond k, in case some were just deleted

Hit = tuple  # (best, score, exact[, via, entity score, context free])


class Resolver:
    """Lookups of one KB handle: exact keys, the entity first, or the paper's nearest key.

    Args:
        store: the KB's store (aliases, deleted names and sources are read from it).
        encoder: returns the KB's sentence encoder (called at the first fuzzy lookup, which loads it).
        search: ``search(vectors, k) -> (scores, key ids)``, each ``(n, k)``: the nearest keys of this
            handle's version to ``(n, dim)`` unit-norm query vectors (-1 for no hit).
        at (int, optional): the version a view reads; None follows the store.
        relation_vectors (dict, optional): embeddings of relation names to share (a view shares its KB's).
    """

    def __init__(self, store: "SQLiteStore", encoder: Callable[[], "Encoder"],
                 search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]], at: int | None = None,
                 relation_vectors: dict[str, np.ndarray] | None = None):
        self.store, self.encoder, self.search = store, encoder, search
        self.at = {} if at is None else {"at": at}
        self.relation_vectors = {} if relation_vectors is None else relation_vectors
        self.entity_index: EntityIndex | None = None  # built at the first entity-aware lookup

    # -- the entity index, kept in step with the store ---------------------------------------------
    def entities(self, keys: "KeyMap") -> EntityIndex:
        """The entity index of ``keys``' version, built on first use."""
        if self.entity_index is None:
            ents = EntityIndex()
            for en, rn, entity in keys.names():
                ents.add_key(en, intern(rn), entity)  # a relation's name held once, not once per key
            ents.compact()
            for a in self.aliases():
                ents.add_alias(a.alias_norm, a.entity_norm, a.alias)
            for name, name_norm, en in self.store.deleted_names(**self.at):
                if en not in ents.relations and name_norm not in ents.relations:
                    ents.add_gone(name_norm, name, en)
            self.entity_index = ents
        return self.entity_index

    def aliases(self) -> list[AliasRow]:
        """The aliases active at this handle's version, oldest first."""
        return self.store.aliases(**self.at)

    def take_in(self, removed: Iterable[str], added: Iterable[Best], after: int, upto: int) -> None:
        """Apply a catch-up from version ``after`` to ``upto`` (key_norms gone, best triples of keys now
        active, and the aliases changed between them) to the entity index, if built."""
        ents = self.entity_index
        if ents is None:
            return
        touched = set()
        for kn in removed:
            en, rn = kn.split(KEY_SEP, 1)
            ents.remove_key(en, rn)
            touched.add(en)
        for b in added:
            en, rn = b.key_norm.split(KEY_SEP, 1)
            ents.add_key(en, intern(rn), b.entity)
            touched.add(en)
        new, old = self.store.alias_changes(after, upto)
        for a in old:
            ents.remove_alias(a.alias_norm, a.entity_norm)
            if a.entity_norm not in ents.relations:
                ents.add_gone(a.alias_norm, a.alias, a.entity_norm)
        for a in new:
            ents.add_alias(a.alias_norm, a.entity_norm, a.alias)
            touched.add(a.entity_norm)
        ents.settle(touched)

    def names_in(self, keys: "KeyMap", context: str) -> list[str]:
        """The entities that ``context`` names (by name or alias), as the KB writes them, first mention first."""
        ents = self.entities(keys)
        return [ents.display[e] for e in ents.mentions(context)]

    # -- answering ---------------------------------------------------------------------------------
    def resolve(self, keys: "KeyMap", queries: Sequence[tuple[str, str]], matching: str, threshold: float,
                fuzzy: bool = True, contexts: Sequence[str | None] | None = None) -> list[Match | Miss]:
        """A :class:`Match` or a :class:`Miss` per query; ``threshold`` is the key cosine under
        ``matching="key"``, the relation similarity under ``"entity"`` (arguments checked by the caller)."""
        if matching == "key":
            return self._resolve_keys(keys, queries, threshold, fuzzy)
        return self._resolve_entities(keys, queries, threshold, fuzzy, contexts)

    def _resolve_keys(self, keys, queries, threshold: float, fuzzy: bool) -> list[Match | Miss]:
        found = self.key_hits(keys, queries, threshold, fuzzy)
        out = []
        for m, (_, near) in zip(self.matches(keys, [h for h, _ in found]), found):
            if m is not None:
                out.append(m)
            elif near is None:
                out.append(Miss("below_threshold", "no key is exact" + ("" if fuzzy else " (fuzzy off)"),
                                version=keys.version))
            else:
                b, s = near
                out.append(Miss("below_threshold", f"the nearest key scores {s:.2f} < {threshold}",
                                candidates=((f"{b.entity} · {b.relation}", round(s, 3)),), version=keys.version))
        return out

    def _resolve_entities(self, keys, queries, threshold: float, fuzzy: bool, contexts) -> list[Match | Miss]:
        built = self.entity_index is not None or not self._all_exact(keys, queries, contexts)
        ents = self.entities(keys) if built else None
        out: list = [None] * len(queries)
        hits: list = [None] * len(queries)
        pending: list[tuple[int, Resolved, str]] = []
        for i, (entity, relation) in enumerate(queries):
            context = contexts[i] if contexts is not None else None
            exact = keys.get(normalize_text(entity) + KEY_SEP + normalize_text(relation))
            if exact is not None and context is None:
                hits[i] = (exact, 1.0, True, "exact", 1.0, True)  # no context: nothing to depend on
                continue
            res = ents.resolve(entity, context, fuzzy)
            if res.entity is None:
                out[i] = Miss(res.reason, res.detail, None, res.candidates, keys.version, res.context_free,
                              res.deleted)
                continue
            rn = normalize_text(relation)
            if rn in ents.relations[res.entity]:
                hits[i] = (keys[res.entity + KEY_SEP + rn], 1.0, res.via == "exact", res.via, res.score,
                           res.context_free)
            elif not fuzzy or not rn or ents.relation_counts.get(rn):  # a relation other entities have: not a paraphrase
                out[i] = Miss("no_relation", f"{ents.display[res.entity]!r} has no relation {relation!r}",
                              ents.display[res.entity], (), keys.version, res.context_free)
            else:
                pending.append((i, res, relation))
        for (i, res, _), (best, score, cands) in zip(pending, self._relation_matches(keys, pending)):
            hits[i], out[i] = self._relation_hit(keys, ents.display[res.entity], res, best, score, cands, threshold)
        for i, m in enumerate(self.matches(keys, hits)):
            if m is not None:
                out[i] = m
        return out

    @staticmethod
    def _relation_hit(keys, name: str, res: Resolved, best: Best | None, score: float, cands: list,
                      threshold: float) -> tuple[Hit | None, Miss | None]:
        """The hit of a resolved entity's most similar relation, or the miss that says why not."""
        if best is not None and score >= threshold and \
                (len(cands) < 2 or cands[0][1] - cands[1][1] >= RELATION_MARGIN):
            return (best, score, False, res.via, res.score, res.context_free), None
        why = (f"the closest relation of {name!r}, {cands[0][0]!r}, scores {cands[0][1]:.2f}"
               + (f" < {threshold}" if cands[0][1] < threshold else
                  f", within {RELATION_MARGIN} of {cands[1][0]!r}")) if cands else f"{name!r} has no facts"
        return None, Miss("no_relation", why, name, tuple(cands[:5]), keys.version, res.context_free)

    @staticmethod
    def _all_exact(keys, queries, contexts) -> bool:
        """Whether every query is an exact key with no context (answered without the entity index)."""
        return all((contexts is None or contexts[i] is None) and
                   keys.get(normalize_text(e) + KEY_SEP + normalize_text(r)) is not None
                   for i, (e, r) in enumerate(queries))

    def _relation_matches(self, keys, pending: list[tuple[int, Resolved, str]]) -> list[tuple[Best | None, float, list]]:
        """For each (row, resolved entity, query relation): the entity's best key by relation similarity."""
        if not pending:
            return []
        from rapidfuzz.fuzz import ratio

        ents, cache, encoder = self.entities(keys), self.relation_vectors, self.encoder()
        held = [[keys[res.entity + KEY_SEP + rn] for rn in ents.relations[res.entity]] for _, res, _ in pending]
        todo = list(dict.fromkeys(b.relation for bs in held for b in bs if b.relation not in cache))
        if todo:
            cache.update(zip(todo, encoder.encode(todo, cache=False)))
        queries = encoder.encode([r for _, _, r in pending])  # (n, dim), LRU-cached per string
        out = []
        for q, (_, _, relation), bs in zip(queries, pending, held):
            qn = normalize_text(relation)
            scored = []
            for b in bs:
                s = float(cache[b.relation] @ q)
                c = ratio(qn, b.key_norm.split(KEY_SEP, 1)[1]) / 100
                scored.append((max(s, c) if c >= _TYPO_RELATION else s, b))
            scored.sort(key=lambda x: -x[0])
            cands = [(b.relation, round(s, 3)) for s, b in scored]
            out.append((scored[0][1], scored[0][0], cands) if scored else (None, 0.0, []))
        return out

    # -- the paper's nearest key -------------------------------------------------------------------
    def key_hits(self, keys: "KeyMap", queries: Sequence[tuple[str, str]], threshold: float,
                 fuzzy: bool) -> list[tuple]:
        """The paper's match per query: (hit (best, score, exact) or None, nearest (best, score) or None)."""
        out: list[tuple] = [(None, None)] * len(queries)
        misses: list[int] = []
        for i, (entity, relation) in enumerate(queries):
            en, rn = normalize_text(entity), normalize_text(relation)
            if not en and not rn:
                continue  # a blank query matches nothing
            best = keys.get(en + KEY_SEP + rn)
            if best is not None:
                out[i] = ((best, 1.0, True), None)
            else:
                misses.append(i)
        if fuzzy and misses and keys.n_active:
            nearest = self.nearest(keys, [key_text(*queries[i]) for i in misses], k=1)
            for i, found in zip(misses, nearest):
                if found:
                    out[i] = ((found[0][0], found[0][1], False) if found[0][1] >= threshold else None, found[0])
        return out

    def nearest(self, keys: "KeyMap", texts: list[str], k: int) -> list[list[tuple[Best, float]]]:
        """Top-``k`` active keys per text, as (best triple, cosine)."""
        encoder = self.encoder()  # before searching: a first use loads the encoder
        return self.nearest_vectors(keys, encoder.encode(texts), k)  # (n, dim), cached per query string

    def nearest_vectors(self, keys: "KeyMap", vectors: np.ndarray, k: int) -> list[list[tuple[Best, float]]]:
        """Top-``k`` active keys per ``(n, dim)`` query vector, as (best triple, cosine)."""
        scores, ids = self.search(vectors, k + _CANDIDATES)
        ids, scores = ids.tolist(), scores.tolist()
        # The first k hits of each row are read first: on a KB read from its store each read is a
        # row lookup, and the hits after them matter only where one of the first was not active.
        active = keys.by_ids({kid for row in ids for kid in row[:k] if kid >= 0})

        def best(i: int, upto: int) -> list[tuple[Best, float]]:
            found = []
            for s, kid in zip(scores[i][:upto], ids[i][:upto]):
                b = active.get(kid)
                if b is not None:  # -1 (no hit) and keys not active in this version drop out
                    found.append((b, float(s)))
                    if len(found) == k:
                        break
            return found

        out = [best(i, k) for i in range(len(ids))]
        short = [i for i, found in enumerate(out) if len(found) < k and any(kid >= 0 for kid in ids[i][k:])]
        if short:
            active.update(keys.by_ids({kid for i in short for kid in ids[i][k:] if kid >= 0}))
            for i in short:
                out[i] = best(i, len(ids[i]))
        return out

    def matches(self, keys: "KeyMap", hits: Sequence[Hit | None]) -> list[Match | None]:
        """Matches from (best, score, exact[, via, entity score, context free]) tuples; None stays None."""
        sources = self.store.sources([h[0].triple_id for h in hits if h], limit=MAX_SOURCES, **self.at)
        return [None if h is None else Match(
            entity=h[0].entity, relation=h[0].relation, value=h[0].value, score=h[1], triple_id=h[0].triple_id,
            exact=h[2], sources=sources.get(h[0].triple_id, ()), version=keys.version,
            alternatives=h[0].n_active - 1, support=h[0].count, via=h[3] if len(h) > 3 else "key",
            entity_score=h[4] if len(h) > 4 else None, context_free=h[5] if len(h) > 5 else True) for h in hits]
