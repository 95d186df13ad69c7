"""Entity-aware lookup and aliases, the half of :class:`lmlm.kb.KnowledgeBase` that finds the entity first.

``matching="entity"`` (the default) resolves the query's entity on its own
(:class:`lmlm.kb.entities.EntityIndex`: exact name, alias, deleted name, the entities named in the
text so far, then fuzzy with a margin), and then the relation among that entity's keys only: the
same normalised relation, else the most similar one by MiniLM cosine of the relation names (or by
characters, for a typo), taken at ``relation_threshold`` with ``RELATION_MARGIN`` over the next. A
relation the KB holds for other entities but not for this one is a miss, never a neighbour
(``Birth City`` of a person whose birth city was deleted is not their ``Birth Date``).
``matching="key"`` is the paper's single-key cosine over ``entity relation`` (threshold 0.6), kept
for comparison. A miss is a :class:`lmlm.kb.records.Miss` that says which step failed.
Exercised by ``lmlm kb lookup`` and every lookup during generation.

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
from typing import Iterable, Sequence

import numpy as np

from .entities import EntityIndex, Resolved
from .keys import KEY_SEP, normalize_text
from .records import AliasRow, Best, Match, Miss

__all__ = ["MATCHINGS", "RELATION_THRESHOLD", "RELATION_MARGIN", "EntityLookup"]

MATCHINGS = ("entity", "key")
RELATION_THRESHOLD = 0.5  # MiniLM cosine of relation names: paraphrases 0.55-0.95, other relations below 0.5
RELATION_MARGIN = 0.03
_TYPO_RELATION = 0.85  # character similarity at which a relation counts as a misspelling of another


class EntityLookup:
    """Mixed into KnowledgeBase; expects ``store``, ``_map``, ``_version``, ``_lock``, ``encoder``,
    ``refresh`` and ``_matches``."""

    matching: str = "entity"
    relation_threshold: float = RELATION_THRESHOLD
    _ents: EntityIndex | None = None

    # -- the entity index, kept in step with the store ---------------------------------------------
    def _entity_index(self) -> EntityIndex:
        if self._ents is None:
            ents = EntityIndex()
            for en, rn, entity in self._map.names():
                ents.add_key(en, intern(rn), entity)  # a relation's name held once, not once per key
            ents.compact()
            for a in self._alias_rows():
                ents.add_alias(a.alias_norm, a.entity_norm, a.alias)
            for name, name_norm, en in self.store.deleted_names(**self._at()):
                if en not in ents.relations and name_norm not in ents.relations:
                    ents.add_gone(name_norm, name, en)
            self._ents = ents
        return self._ents

    def _at(self) -> dict:
        return {}

    def _alias_rows(self) -> list[AliasRow]:
        return self.store.aliases(**self._at())

    def _ents_update(self, removed: Iterable[str], added: Iterable[Best], after: int) -> None:
        """Apply a catch-up (key_norms gone, best triples of keys now active) to a built index."""
        ents = self._ents
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
        new, old = self.store.alias_changes(after, self._version)
        for a in old:
            ents.remove_alias(a.alias_norm, a.entity_norm)
            if a.entity_norm not in ents.relations:
                ents.add_gone(a.alias_norm, a.alias, a.entity_norm)
        for a in new:
            ents.add_alias(a.alias_norm, a.entity_norm, a.alias)
            touched.add(a.entity_norm)
        ents.settle(touched)

    def names_in(self, context: str) -> list[str]:
        """The KB's entities that ``context`` names (by name or alias), as the KB writes them, first
        mention first: the names a query about the text may use."""
        with self._lock:
            self.refresh()
            ents = self._entity_index()
            return [ents.display[e] for e in ents.mentions(context)]

    # -- aliases -----------------------------------------------------------------------------------
    def aliases(self, entity: str | None = None) -> list[AliasRow]:
        """The active aliases (of ``entity`` only, if given), oldest first."""
        with self._lock:
            rows = self._alias_rows()
        if entity is None:
            return rows
        en = normalize_text(entity)
        return [a for a in rows if a.entity_norm == en]

    # -- lookup ------------------------------------------------------------------------------------
    def explain(self, entity: str, relation: str, context: str | None = None, threshold: float | None = None,
                matching: str | None = None) -> Match | Miss:
        """:meth:`lookup` that says why on a miss: a :class:`Match` or a :class:`Miss`."""
        return self.resolve_batch([(entity, relation)], threshold, contexts=[context], matching=matching)[0]

    def resolve_batch(self, queries: Sequence[tuple[str, str]], threshold: float | None = None, fuzzy: bool = True,
                      contexts: Sequence[str | None] | None = None, matching: str | None = None) -> list[Match | Miss]:
        """Answer many queries: a :class:`Match` or a :class:`Miss` (with its reason) each.

        Args:
            queries: ``(entity, relation)`` pairs as the model wrote them.
            threshold (float, optional): the paper's key cosine threshold under ``matching="key"``
                (default ``self.threshold``); the relation threshold under ``"entity"`` (default
                ``self.relation_threshold``).
            fuzzy (bool, default True): False answers exact normalised keys only (no encoder call).
            contexts (optional): per query, the text being generated before the call (prompt and
                document so far); the entities it names resolve short or misspelt names.
            matching (str, optional): ``"entity"`` or ``"key"`` (default ``self.matching``).
        """
        matching = self.matching if matching is None else matching
        if matching not in MATCHINGS:
            raise ValueError(f"matching must be one of {MATCHINGS}, got {matching!r}")
        if contexts is not None and len(contexts) != len(queries):
            raise ValueError(f"contexts must have one entry per query ({len(queries)}), got {len(contexts)}")
        if threshold is not None and not -1.0 <= float(threshold) <= 2.0:  # a cosine (-1 takes anything); not nan
            raise ValueError(f"threshold must be a similarity (at most 1), got {threshold}")
        with self._lock:
            self.refresh()
            if matching == "key":
                return self._resolve_keys(queries, threshold, fuzzy)
            return self._resolve_entities(queries, threshold, fuzzy, contexts)

    def _resolve_keys(self, queries, threshold, fuzzy) -> list[Match | Miss]:
        found = self._key_hits(queries, self.threshold if threshold is None else float(threshold), fuzzy)
        matches = self._matches([h for h, _ in found])
        out = []
        for m, (_, near) in zip(matches, found):
            if m is not None:
                out.append(m)
            elif near is None:
                out.append(Miss("below_threshold", "no key is exact" + ("" if fuzzy else " (fuzzy off)"),
                                version=self._version))
            else:
                b, s = near
                out.append(Miss("below_threshold", f"the nearest key scores {s:.2f} < {threshold or self.threshold}",
                                candidates=((f"{b.entity} · {b.relation}", round(s, 3)),), version=self._version))
        return out

    def _resolve_entities(self, queries, threshold, fuzzy, contexts) -> list[Match | Miss]:
        ents = self._entity_index() if self._ents is not None or not self._all_exact(queries, contexts) else None
        rel_threshold = self.relation_threshold if threshold is None else float(threshold)
        out: list = [None] * len(queries)
        hits: list = [None] * len(queries)
        pending: list[tuple[int, Resolved, str]] = []
        for i, (entity, relation) in enumerate(queries):
            exact = self._map.get(normalize_text(entity) + KEY_SEP + normalize_text(relation))
            if exact is not None and (contexts is None or contexts[i] is None):
                hits[i] = (exact, 1.0, True, "exact", 1.0, True)  # no context: nothing to depend on
                continue
            res = ents.resolve(entity, contexts[i] if contexts is not None else None, fuzzy)
            if res.entity is None:
                out[i] = Miss(res.reason, res.detail, None, res.candidates, self._version, res.context_free,
                              res.deleted)
                continue
            rn = normalize_text(relation)
            if rn in ents.relations[res.entity]:
                hits[i] = (self._map[res.entity + KEY_SEP + rn], 1.0, res.via == "exact", res.via, res.score,
                           res.context_free)
            elif not fuzzy or not rn or ents.relation_counts.get(rn):  # a relation other entities have: not a paraphrase
                out[i] = Miss("no_relation", f"{ents.display[res.entity]!r} has no relation {relation!r}",
                              ents.display[res.entity], (), self._version, res.context_free)
            else:
                pending.append((i, res, relation))
        for (i, res, relation), (best, score, cands) in zip(pending, self._relation_matches(pending)):
            name = ents.display[res.entity]
            if best is not None and score >= rel_threshold and \
                    (len(cands) < 2 or cands[0][1] - cands[1][1] >= RELATION_MARGIN):
                hits[i] = (best, score, False, res.via, res.score, res.context_free)
            else:
                why = (f"the closest relation of {name!r}, {cands[0][0]!r}, scores {cands[0][1]:.2f}"
                       + (f" < {rel_threshold}" if cands[0][1] < rel_threshold else
                          f", within {RELATION_MARGIN} of {cands[1][0]!r}")) if cands else f"{name!r} has no facts"
                out[i] = Miss("no_relation", why, name, tuple(cands[:5]), self._version, res.context_free)
        for i, m in zip(range(len(queries)), self._matches(hits)):
            if m is not None:
                out[i] = m
        return out

    def _all_exact(self, queries, contexts) -> bool:
        """Whether every query is an exact key with no context (answered without the entity index)."""
        return all((contexts is None or contexts[i] is None) and
                   self._map.get(normalize_text(e) + KEY_SEP + normalize_text(r)) is not None
                   for i, (e, r) in enumerate(queries))

    def _relation_matches(self, pending: list[tuple[int, Resolved, str]]) -> list[tuple[Best | None, float, list]]:
        """For each (row, resolved entity, query relation): the entity's best key by relation similarity."""
        if not pending:
            return []
        from rapidfuzz.fuzz import ratio

        ents = self._entity_index()
        cache = self._relation_vectors()
        keys = [[self._map[res.entity + KEY_SEP + rn] for rn in ents.relations[res.entity]] for _, res, _ in pending]
        todo = list(dict.fromkeys(b.relation for bs in keys for b in bs if b.relation not in cache))
        if todo:
            cache.update(zip(todo, self.encoder.encode(todo, cache=False)))
        queries = self.encoder.encode([r for _, _, r in pending])  # (n, dim), LRU-cached per string
        out = []
        for q, (_, _, relation), bs in zip(queries, pending, keys):
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

    def _relation_vectors(self) -> dict[str, np.ndarray]:
        """Embeddings of relation names as written, shared by every lookup of this KB (and its views)."""
        if getattr(self, "_rel_vecs", None) is None:
            self._rel_vecs = {}
        return self._rel_vecs
