"""Resolving the entity of a lookup on its own: which entity of the KB does a query name, if any?

The paper matches a whole ``entity relation`` key by cosine, so a query about a person the KB does
not hold (deleted, or never added) returns a namesake's fact. :class:`EntityIndex` answers the
entity first, in this order, and says why when it cannot:

1. **exact**: the normalised name of an entity that has facts;
2. **alias**: another name of one (``lmlm kb alias``), the one entity it names;
3. **deleted**: the name of an entity whose facts were all deleted, or of its deleted aliases, is
   a miss (``no_entity``), never someone else;
4. **context**: the entities named in the text being generated (the prompt and the document so
   far), found by a longest-match scan over the KB's names. A query whose words all belong to one
   of them ("Jasmine Mejia" after "Jasmine Mejia-Morris was born") names it; one named entity
   that strictly extends the query also wins over an exact match the text never names. With a
   text, a fuzzy match must be grounded in it (named there, or the query's words written there side by side):
   a near-miss of a name about someone the text never named is a miss; an exact name or alias is
   answered unless the text names someone else (a KB entity, a deleted one, or anyone sharing a
   word of the name: "Larry Davis" in a text about "Larry Huerta-Rogers") and never it: the model
   copying another person's name into a text about them. A name that shares a word with the one
   person the text names ("James Girard", "Irene Curie" or "Charles Darwin" in a text about
   "Jackson Girard", "Marie Curie" or "Charles Babbage") is never read as that person: a namesake or
   a relative is someone else, whose facts the KB may not hold. A text that names a deleted entity answers no
   query sharing a word of its name with it, unless the text names the queried entity ("Lisa
   Hoàng" after "James Hoàng", deleted, is never Lisa Zhang);
5. **fuzzy**: the names whose words align with the query's words one by one (typos within a word,
   diacritics, word order, a dropped initial), scored by the weakest aligned pair of words, taken
   at :data:`ENTITY_THRESHOLD` or above with :data:`ENTITY_MARGIN` over the next entity. A name
   that leaves out a query word, or adds one, scores low, so a namesake (same first or last name)
   never passes.

Two entities equally named (an alias shared, two context entities, two fuzzy candidates within
the margin) is ``ambiguous_entity``: no answer. Exercised by every ``KnowledgeBase.lookup``.

Examples:
    >>> idx = EntityIndex()
    >>> idx.add_key("jasmine mejia-morris", "birth city", "Jasmine Mejia-Morris")
    >>> idx.add_key("timothy frazier", "birth city", "Timothy Frazier")
    >>> idx.resolve("Joshua Frazier").reason
    'no_entity'
    >>> idx.resolve("Jasmine Mejia", context="Jasmine Mejia-Morris was born in").entity
    'jasmine mejia-morris'
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable

from .keys import names_someone, normalize_text

__all__ = ["ENTITY_THRESHOLD", "ENTITY_MARGIN", "EntityIndex", "Resolved", "name_score", "fuzzy_tokens",
           "MISS_REASONS"]

# Calibrated on the biography world (``tests/kb/test_entities.py`` checks it there): one typo in a
# word of five letters or more scores 0.8 to 0.95; two different words (namesakes) score below 0.6.
ENTITY_THRESHOLD = 0.8
ENTITY_MARGIN = 0.05  # the best entity's score must beat the next entity's by this much
INITIAL_PENALTY = 0.05  # per initial present on one side only ("Ada Lovelace" vs "Ada M. Lovelace")
_TYPO_MIN_LEN = 4  # shorter words, numbers and initials must be equal to align
MISS_REASONS = ("no_entity", "ambiguous_entity", "no_relation", "below_threshold")

_SPLIT = re.compile(r"[\s\-\u2010-\u2015/]+")
_POSSESSIVE = re.compile(r"['\u2019]s$")


def _edge_strip(token: str) -> str:
    start, end = 0, len(token)
    while start < end and unicodedata.category(token[start])[0] in "PS":
        start += 1
    while end > start and unicodedata.category(token[end - 1])[0] in "PS":
        end -= 1
    return token[start:end]


def name_key(text: str) -> str:
    """A name as the context scan compares it: normalised, words stripped of edge punctuation."""
    return " ".join(t for t in (_edge_strip(w) for w in normalize_text(text).split()) if t)


def _fold(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


@functools.lru_cache(maxsize=1 << 16)  # the same names come back at every lookup of a generation
def fuzzy_tokens(name_norm: str) -> tuple[str, ...]:
    """The words of a normalised name for alignment: diacritics folded, split at spaces and hyphens,
    edge punctuation dropped (``"m."`` is the initial ``"m"``)."""
    return tuple(t for t in (_edge_strip(w) for w in _SPLIT.split(_fold(name_norm))) if t)


def _token_sim(a: str, b: str) -> float:
    if a == b:
        return 1.0
    if len(a) < _TYPO_MIN_LEN or len(b) < _TYPO_MIN_LEN or a.isdigit() or b.isdigit():
        return 0.0
    from rapidfuzz.fuzz import ratio

    return ratio(a, b) / 100.0


def name_score(query: tuple[str, ...], name: tuple[str, ...]) -> float:
    """How well two names' words align: the weakest word's best match on either side (1.0: the same
    words in any order), less :data:`INITIAL_PENALTY` per initial that only one side has.

    Examples:
        >>> name_score(("ada", "lovelace"), ("ada", "lovelcae"))
        0.875
        >>> name_score(("joshua", "frazier"), ("timothy", "frazier")) < 0.5
        True
    """
    if not query or not name or sum(len(t) > 1 for t in query) != sum(len(t) > 1 for t in name):
        return 0.0  # the words align one to one: "Jason" is not "Jackson Jackson", whose words both near it
    worst, penalty = 1.0, 0.0
    for side, other in ((query, name), (name, query)):
        for t in side:
            s = max(_token_sim(t, o) for o in other)
            if s == 0.0 and len(t) == 1:
                penalty += INITIAL_PENALTY
            else:
                worst = min(worst, s)
    return max(0.0, worst - penalty)


def _word_seq(text: str) -> tuple[str, ...]:
    """The words of a text in order, as :func:`fuzzy_tokens` gives them, possessives dropped."""
    return tuple(_POSSESSIVE.sub("", w) for w in fuzzy_tokens(normalize_text(text)))


def _words(text: str) -> tuple[str, ...]:
    """The distinct words of a text (:func:`_word_seq`), first mention first."""
    return tuple(dict.fromkeys(_word_seq(text)))


def _written(query: tuple[str, ...], seq: tuple[str, ...]) -> bool:
    """Whether the text writes the query's name: its words (or typos of them) side by side, in any
    order. "Paul Nguyen" is not written in "Karen Nguyen was born in Port Paul"."""
    k = len(query)
    if not k or k > len(seq):
        return False
    return any(_refers(query, seq[i:i + k]) for i in range(len(seq) - k + 1))


def _namesake(query: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """Whether the text shares a word of the query's name without naming it: "Larry Davis" asked in a
    text about "Larry Huerta-Rogers", someone the KB may not hold (a namesake, never the same person)."""
    present = set(words)
    return any(len(t) > 1 and t in present for t in query)


def _shares_word(query: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """Whether a word of the query (not an initial) is (a typo of) a word of the name."""
    return any(len(t) > 1 and _token_sim(t, o) >= ENTITY_THRESHOLD for t in query for o in name)


def _refers(query: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """Whether every word of the query is (a typo of) a word of the name: "Jasmine Mejia" refers to
    "Jasmine Mejia-Morris", "Mejia-Morris" too; "Joshua Frazier" does not refer to "Timothy Frazier"."""
    return bool(query) and all(max(_token_sim(t, o) for o in name) >= ENTITY_THRESHOLD for t in query)


@dataclass
class Resolved:
    """The entity a query names (``entity`` set, ``via`` how), or why none (``reason``)."""

    entity: str | None = None  # entity_norm
    via: str | None = None  # exact | alias | context | fuzzy
    score: float = 1.0
    reason: str | None = None  # no_entity | ambiguous_entity
    detail: str = ""
    candidates: tuple[tuple[str, float], ...] = ()
    context_free: bool = True  # the same answer whatever the context
    deleted: bool = False  # the query names a deleted entity (or is closest to one)


@dataclass
class _Names:
    """Every name a query can land on: active entity names, aliases, and names of deleted entities."""

    display: dict[str, str] = field(default_factory=dict)  # name_norm -> as written
    owners: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name_norm -> entity_norms
    tokens: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name_norm -> fuzzy tokens
    postings: dict[str, set[str]] = field(default_factory=dict)  # fuzzy token -> name_norms


class EntityIndex:
    """The entities of a KB with their relations, aliases and deleted names, for :meth:`resolve`.

    Built from the KB's active keys (:meth:`add_key`, :meth:`remove_key`), its aliases
    (:meth:`add_alias`, :meth:`remove_alias`) and the names of deleted entities (:meth:`add_gone`);
    the KB keeps it in step with the store.
    """

    def __init__(self):
        # entity_norm -> its relation_norms in order, a tuple (a 10-relation dict costs 272 bytes a
        # person, a tuple 120, a tuple shared by every person with the same relations 8: :meth:`compact`)
        self.relations: dict[str, tuple[str, ...]] = {}
        self.relation_counts: dict[str, int] = {}  # relation_norm -> entities that have it
        self.display: dict[str, str] = {}  # entity_norm -> name as first written
        self.aliases: dict[str, dict[str, str]] = {}  # alias_norm -> {entity_norm: alias as written}
        self.gone: dict[str, str] = {}  # name_norm of a deleted entity or alias -> as written
        self._gone_of: dict[str, set[str]] = {}  # entity_norm -> its deleted names
        self._aliases_of: dict[str, set[str]] = {}  # entity_norm -> its alias_norms
        self._names = _Names()
        self._scan: dict[str, str] | None = None  # name_key -> name_norm (active names), built on use
        self._first: dict[str, set[int]] = {}  # first word of a scanned name -> word counts
        self._similar: dict[str, list[tuple[str, float]]] = {}  # query word -> similar indexed words

    # -- keeping in step ---------------------------------------------------------------------------
    def add_key(self, entity_norm: str, relation_norm: str, entity: str) -> None:
        relation_norm = sys.intern(relation_norm)  # one string per relation, not one per key read from the store
        rels = self.relations.get(entity_norm)
        if rels is None:
            rels = ()
            self.display.setdefault(entity_norm, entity)
            self._index_name(entity_norm, entity, entity_norm)
            self._scan = None
        if relation_norm not in rels:
            self.relation_counts[relation_norm] = self.relation_counts.get(relation_norm, 0) + 1
            self.relations[entity_norm] = (*rels, relation_norm)

    def remove_key(self, entity_norm: str, relation_norm: str) -> None:
        rels = self.relations.get(entity_norm)
        if rels is None:
            return
        if relation_norm in rels:
            self.relation_counts[relation_norm] -= 1
            rels = self.relations[entity_norm] = tuple(r for r in rels if r != relation_norm)
        if not rels:
            del self.relations[entity_norm]
            self._unindex_name(entity_norm, entity_norm)
            self._scan = None

    def add_alias(self, alias_norm: str, entity_norm: str, alias: str) -> None:
        self.aliases.setdefault(alias_norm, {})[entity_norm] = alias
        self._aliases_of.setdefault(entity_norm, set()).add(alias_norm)
        self._index_name(alias_norm, alias, entity_norm)
        self._scan = None

    def remove_alias(self, alias_norm: str, entity_norm: str) -> None:
        owners = self.aliases.get(alias_norm, {})
        owners.pop(entity_norm, None)
        self._aliases_of.get(entity_norm, set()).discard(alias_norm)
        if not owners:
            self.aliases.pop(alias_norm, None)
        self._unindex_name(alias_norm, entity_norm)
        self._scan = None

    def compact(self) -> None:
        """Share one tuple among the entities with the same relations in the same order (after a bulk
        build: about 150 bytes a person less for people of 10 relations each)."""
        pool: dict[tuple[str, ...], tuple[str, ...]] = {}
        for en, rels in self.relations.items():
            self.relations[en] = pool.setdefault(rels, rels)

    def add_gone(self, name_norm: str, name: str, entity_norm: str) -> None:
        """Record the name of a deleted entity (or of a deleted alias of one)."""
        self.gone[name_norm] = name
        self._gone_of.setdefault(entity_norm, set()).add(name_norm)
        self._index_name(name_norm, name, "\0gone:" + name_norm)

    def settle(self, touched: Iterable[str] = ()) -> None:
        """After a change to the entities ``touched``: one left without facts becomes a deleted name;
        one with facts again stops being deleted, its deleted aliases with it."""
        for en in touched:
            if en in self.relations:
                for name in self._gone_of.pop(en, ()):
                    self.gone.pop(name, None)
                    self._unindex_name(name, "\0gone:" + name)
            elif en in self.display:
                self.add_gone(en, self.display[en], en)

    def _index_name(self, name_norm: str, name: str, owner: str) -> None:
        n = self._names
        n.display.setdefault(name_norm, name)
        held = n.owners.get(name_norm, ())
        if owner not in held:
            n.owners[name_norm] = (*held, owner)  # a tuple: 56 bytes for the usual one owner, a set 216
        if name_norm not in n.tokens:
            toks = n.tokens[name_norm] = tuple(sys.intern(t) for t in fuzzy_tokens(name_norm))
            for t in set(toks):
                if t not in n.postings:
                    self._similar.clear()  # a new word may be similar to a cached query word
                n.postings.setdefault(t, set()).add(name_norm)

    def _unindex_name(self, name_norm: str, owner: str) -> None:
        n = self._names
        owners = n.owners.get(name_norm)
        if owners is None:
            return
        owners = tuple(o for o in owners if o != owner)
        if owners:
            n.owners[name_norm] = owners
            return
        del n.owners[name_norm]
        for t in set(n.tokens.pop(name_norm, ())):
            n.postings.get(t, set()).discard(name_norm)

    # -- resolving ---------------------------------------------------------------------------------
    def _alias_owners(self, alias_norm: str) -> list[str]:
        return [e for e in self.aliases.get(alias_norm, ()) if e in self.relations]

    def _entity_tokens(self, entity_norm: str) -> list[tuple[str, ...]]:
        """The word tuples of an entity's name and of each of its aliases."""
        names = [entity_norm, *self._aliases_of.get(entity_norm, ())]
        return [self._names.tokens.get(n) or fuzzy_tokens(n) for n in names]

    def mentions(self, context: str) -> list[str]:
        """Entities (with facts) named in ``context``, first mention first: a left-to-right scan
        taking the longest KB name (or alias) at each word, so "Jasmine Mejia" inside "Jasmine
        Mejia-Morris" is not a mention of someone else."""
        if self._scan is None:
            self._scan, self._first = {}, {}
            for name in list(self.relations) + [a for a in self.aliases if self._alias_owners(a)]:
                k = name_key(name)
                if k:
                    self._scan[name if k == name else k] = name  # the name's own string where they are equal
                    words = k.split(" ")
                    self._first.setdefault(words[0], set()).add(len(words))
        words = [w for w in (_POSSESSIVE.sub("", _edge_strip(w)) for w in normalize_text(context).split()) if w]
        words = [_edge_strip(w) for w in words]
        found: dict[str, None] = {}
        i = 0
        while i < len(words):
            step = 1
            for n in sorted(self._first.get(words[i], ()), reverse=True):
                name = self._scan.get(" ".join(words[i:i + n])) if i + n <= len(words) else None
                if name is not None:
                    for e in ([name] if name in self.relations else self._alias_owners(name)):
                        found.setdefault(e, None)
                    step = n
                    break
            i += step
        return list(found)

    def _gone_in(self, context: str) -> list[tuple[str, tuple[str, ...]]]:
        """The deleted entities (or deleted aliases) the text names word for word, possessive or not
        ("Ada Lind's"): ``(name, its words)``."""
        if not self.gone:
            return []
        text = f" {' '.join(fuzzy_tokens(normalize_text(context)))} "
        bare = f" {' '.join(_word_seq(context))} "
        named = []
        for n, shown in self.gone.items():
            words = fuzzy_tokens(n)
            spaced = f" {' '.join(words)} "
            if len(n) > 3 and (spaced in bare or spaced in text):
                named.append((shown, words))
        return named

    def _extended(self, query: tuple[str, ...], exclude: set[str]) -> bool:
        """Whether some other name holds every word of the query (the query may be a short form of it)."""
        if not query:
            return False
        sets = [self._names.postings.get(t, set()) for t in query]
        common = set.intersection(*sorted(sets, key=len)) if all(sets) else set()
        return any(o not in exclude and not o.startswith("\0") for n in common for o in self._names.owners.get(n, ()))

    def resolve(self, entity: str, context: str | None = None, fuzzy: bool = True) -> Resolved:
        """The entity ``entity`` names, reading ``context`` (the text so far) when given.

        With a context, an entity found by fuzzy matching must be grounded in it: named there (by
        name or alias), or the query's words written there side by side. A near-miss about someone the text
        never named is the model garbling a name, and is a miss. An exact name or alias is answered
        unless the text names another entity (of the KB, deleted, or a namesake sharing a word of
        the name) and never this one.
        """
        qn = normalize_text(entity)
        qt = fuzzy_tokens(qn)
        if not qn:
            return Resolved(reason="no_entity", detail="the query names no entity")
        ctx = self.mentions(context) if context else None
        res = self._resolve(entity, qn, qt, ctx, fuzzy)
        if ctx is None:
            return res
        res.context_free = False
        # a fuzzy match must be grounded in the text; an exact name or alias asks for that entity itself
        # and is refused only when the text names someone else (an entity of the KB, or a deleted one)
        # and never this one: the model copying another person's name into a text about them
        seq, gone = _word_seq(context), self._gone_in(context)
        words = tuple(dict.fromkeys(seq))
        if res.entity is not None and res.entity not in ctx and not _written(qt, seq) and (
                res.via == "fuzzy" or bool(ctx) or _namesake(qt, words) or bool(gone) or names_someone(context)):
            name = self.display[res.entity]
            res = Resolved(reason="no_entity", candidates=((name, round(res.score, 3)),), context_free=False,
                           detail=f"{name!r} fits {entity!r}, but the text so far never names {name!r}",
                           deleted=bool(gone))
        if res.entity not in ctx and res.via != "exact" and (
                named := next((n for n, w in gone if _refers(qt, w)), None)):  # "Jackson" after "Jackson Marshall"
            return Resolved(reason="no_entity", candidates=((named, 1.0),), context_free=False, deleted=True,
                            detail=f"{entity!r} refers to {named!r}, named in the text and deleted")
        if res.entity is not None and res.entity not in ctx and (
                named := next((n for n, w in gone if _shares_word(qt, w)), None)):
            # "John Frazier" or "Lisa Hoàng" in a text about Joshua Frazier or James Hoàng, deleted
            return Resolved(reason="no_entity", candidates=((named, 1.0),), context_free=False, deleted=True,
                            detail=f"{entity!r} shares a name with {named!r}, named in the text and deleted")
        if res.entity is not None and res.via == "fuzzy" and res.score < 1.0 and set(qt) <= set(words) and not any(
                {t for t in n if len(t) > 1} == {t for t in qt if len(t) > 1} for n in self._entity_tokens(res.entity)):
            name = self.display[res.entity]  # the text spells the query's name: a near name is someone else
            return Resolved(reason="no_entity", candidates=((name, round(res.score, 3)),), context_free=False,
                            detail=f"the text spells {entity!r} as the query does; {name!r} is another name")
        return res

    def _resolve(self, entity: str, qn: str, qt: tuple[str, ...], ctx: list[str] | None, fuzzy: bool) -> Resolved:
        direct = [qn] if qn in self.relations else self._alias_owners(qn)
        via = "exact" if qn in self.relations else "alias"
        if direct or qn in self.gone:
            free = not self._extended(qt, set(direct) | {qn})
            longer = [] if ctx is None or any(e in ctx for e in direct) else \
                [e for e in ctx if e not in direct and any(_refers(qt, t) for t in self._entity_tokens(e))]
            if longer and direct:  # "Maria Lopez", a KB entity, in a text about Maria Garcia-Lopez: either,
                named = [e for e in longer if e in self._alias_owners(qn)]  # unless it is her alias too
                if len(named) == 1:
                    return Resolved(named[0], "context", 1.0, context_free=False)
                return Resolved(reason="ambiguous_entity", context_free=False,
                                detail=f"{entity!r} is an entity's name, and the text names "
                                       f"{self.display[longer[0]]!r}, whose name holds it",
                                candidates=tuple((self.display[e], 1.0) for e in [*longer, *direct]))
            if len(longer) == 1 and qn not in self.gone:
                return Resolved(longer[0], "context", 1.0, context_free=False)
            if len(direct) == 1:
                return Resolved(direct[0], via, 1.0, context_free=free)
            if direct:
                named = [e for e in direct if ctx and e in ctx]
                if len(named) == 1:
                    return Resolved(named[0], "context", 1.0, context_free=False)
                return Resolved(reason="ambiguous_entity", detail=f"{entity!r} is an alias of {len(direct)} entities",
                                candidates=tuple((self.display[e], 1.0) for e in direct), context_free=False)
            return Resolved(reason="no_entity", detail=f"{self.gone[qn]!r} was deleted",
                            candidates=((self.gone[qn], 1.0),), context_free=free, deleted=True)
        if ctx:
            refs = [e for e in ctx if any(_refers(qt, t) for t in self._entity_tokens(e))]
            if len(refs) == 1:
                return Resolved(refs[0], "context", 1.0, context_free=False)
            if refs:
                return Resolved(reason="ambiguous_entity", context_free=False,
                                detail=f"{len(refs)} entities named in the text fit {entity!r}",
                                candidates=tuple((self.display[e], 1.0) for e in refs))
        # from here on the text before the call could have named the entity: nothing is context-free
        if not fuzzy:
            return Resolved(reason="no_entity", detail=f"no entity is named {entity!r}", context_free=False)
        return self._fuzzy(entity, qt, context_free=False)

    def _candidates(self, query: tuple[str, ...]) -> set[str]:
        """Names with, for every word of the query (initials aside), an equal or similar word."""
        from rapidfuzz import fuzz, process

        sets = []
        for t in query:
            if len(t) == 1:
                continue
            similar = self._similar.get(t)
            if similar is None:
                similar = [(t, 1.0)] if t in self._names.postings else []
                if len(t) >= _TYPO_MIN_LEN and not t.isdigit():
                    vocab = list(self._names.postings)
                    similar += [(vocab[i], s / 100) for _, s, i in process.extract(
                        t, vocab, scorer=fuzz.ratio, score_cutoff=ENTITY_THRESHOLD * 100, limit=None)
                        if vocab[i] != t]
                if len(self._similar) > 65536:
                    self._similar.clear()
                self._similar[t] = similar
            posts = [p for p in (self._names.postings.get(w) for w, _ in similar) if p]
            if not posts:
                return set()  # a word no name has, nor anything like it
            # a word's own postings are intersected as they are: at 5 x 10^6 people a first name's
            # postings hold 10^5 names, and copying them took most of a fuzzy lookup
            sets.append(posts[0] if len(posts) == 1 else set().union(*posts))
        if not sets:
            return set()
        sets.sort(key=len)
        return sets[0].intersection(*sets[1:])  # a new set, the smallest's members in every other

    def _fuzzy(self, entity: str, qt: tuple[str, ...], context_free: bool) -> Resolved:
        by_owner: dict[str, tuple[float, str]] = {}
        for name in self._candidates(qt):
            s = name_score(qt, self._names.tokens[name])
            for owner in self._names.owners.get(name, ()):
                if owner.startswith("\0") or owner in self.relations:
                    if s > by_owner.get(owner, (-1.0, ""))[0]:
                        by_owner[owner] = (s, name)
        ranked = sorted(by_owner.items(), key=lambda kv: -kv[1][0])
        cands = tuple((self._names.display.get(n, n) + (" (deleted)" if o.startswith("\0") else ""), round(s, 3))
                      for o, (s, n) in ranked[:5])
        if not ranked or ranked[0][1][0] < ENTITY_THRESHOLD:
            best = f"; the closest, {cands[0][0]!r}, scores {cands[0][1]:.2f} < {ENTITY_THRESHOLD}" if cands else ""
            return Resolved(reason="no_entity", detail=f"no entity is named {entity!r}{best}", candidates=cands,
                            context_free=context_free)
        (owner, (score, _)), rest = ranked[0], ranked[1:]
        if rest and score - rest[0][1][0] < ENTITY_MARGIN:
            return Resolved(reason="ambiguous_entity", candidates=cands, context_free=context_free,
                            detail=f"{cands[0][0]!r} and {cands[1][0]!r} fit {entity!r} almost equally")
        if owner.startswith("\0"):
            return Resolved(reason="no_entity", detail=f"{entity!r} is closest to {cands[0][0]!r}",
                            candidates=cands, context_free=context_free, deleted=True)
        return Resolved(owner, "fuzzy", score, candidates=cands, context_free=context_free)
