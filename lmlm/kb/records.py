"""The values that go into and come out of a knowledge base: facts, matches, history records."""

from __future__ import annotations

from dataclasses import dataclass
import numbers
from typing import Iterable, Iterator, NamedTuple

from ..errors import LmlmError
from ..lookup import TOKEN_VOCABULARIES
from .keys import KEY_SEP, clean_field, is_plain, normalize_text, normalize_value

# the lookup tokens of every vocabulary: a name or value holding one could never be written inside a call
_MARKERS = tuple(sorted({m for v in TOKEN_VOCABULARIES.values() for m in v.as_list()}))

__all__ = ["Triple", "check_triple", "Match", "Miss", "TripleRecord", "VersionRecord", "Change", "DiffEntry", "as_triple",
           "KBError", "NotAKnowledgeBase", "KBNotFound", "Best", "Fact", "AliasRow", "check_who", "required", "forget_item"]


@dataclass(frozen=True)
class Triple:
    """One fact to add: ``(entity, relation) -> value``, optionally with where it was read.

    Args:
        entity, relation: the lookup key; neither may be empty after normalisation.
        value: the answer; not blank.
        source (str, optional): id of the document the fact came from.
        position (int, optional): character offset of the fact in that document.
    """

    entity: str
    relation: str
    value: str
    source: str | None = None
    position: int | None = None

    def __post_init__(self) -> None:
        check_triple(self.entity, self.relation, self.value, self.source, self.position)


def check_triple(entity, relation, value, source=None, position=None) -> None:
    """Raise what :class:`Triple` raises for these fields (a ValueError or TypeError naming the
    field); nothing when they make a valid triple."""
    e, r, v = entity, relation, value
    if not (type(e) is str and type(r) is str and type(v) is str and is_plain(e + r + v)):  # else the slow check
        for name, x in (("entity", e), ("relation", r), ("value", v)):
            if not isinstance(x, str):
                raise TypeError(f"Triple.{name} must be str, got {type(x).__name__}: {x!r}")
            clean_field(x, f"Triple.{name}")  # control characters are refused here
    if "<|" in e or "<|" in r or "<|" in v:
        for name, x in (("entity", e), ("relation", r), ("value", v)):
            if marker := next((m for m in _MARKERS if m in x), None):
                raise ValueError(f"Triple.{name} {x!r} holds the lookup token {marker}, which no call can carry "
                                 "(it would end the call's field); remove it")
    if not normalize_text(e):
        raise ValueError(f"Triple.entity is empty (after normalisation): {e!r}")
    if not normalize_text(r):
        raise ValueError(f"Triple.relation is empty (after normalisation): {r!r}")
    if not (v.strip() if is_plain(v) else clean_field(v, "Triple.value")):  # "\u200b" is blank too
        raise ValueError(f"Triple.value is blank for ({e!r}, {r!r})")
    if source is not None:
        if not isinstance(source, str):
            raise TypeError(f"Triple.source must be str or None, got {type(source).__name__}")
        if not (source.strip() if is_plain(source) else clean_field(source, "Triple.source")):
            raise ValueError(f"Triple.source is blank for ({e!r}, {r!r}): give a document id or none")
    if position is not None and (isinstance(position, bool) or not isinstance(position, int)):
        raise TypeError(f"Triple.position must be int or None, got {type(position).__name__}")


def as_triple(item) -> Triple:
    """Accept a :class:`Triple`, anything with ``entity``/``relation``/``value`` attributes (such as
    :class:`lmlm.lookup.Lookup`), or a tuple ``(entity, relation, value[, source[, position]])``."""
    if isinstance(item, Triple):
        return item
    if isinstance(item, (tuple, list)):
        if not 3 <= len(item) <= 5:
            raise ValueError("a triple tuple has 3 to 5 fields (entity, relation, value, source, position), "
                             f"got {item!r}")
        return Triple(*item)
    if all(hasattr(item, a) for a in ("entity", "relation", "value")):
        return Triple(item.entity, item.relation, item.value,
                      getattr(item, "source", None), getattr(item, "position", None))
    raise TypeError(f"cannot read a triple from {type(item).__name__}: {item!r}")


@dataclass(frozen=True)
class Match:
    """The answer to a lookup.

    Attributes:
        entity, relation, value: the stored fact (its own spelling, not the query's).
        score: 1.0 for an exact key match, else the cosine similarity of query and key.
        triple_id: id of the fact in the store (see ``KnowledgeBase.get``).
        exact: whether the normalised query key equals the fact's key.
        sources: ids of documents the fact was read from (at most ``MAX_SOURCES``).
        version: the KB version that answered.
        alternatives: how many other active values the key has (0 when unambiguous).
        support: how often the returned value was seen (its count); it is the key's best-supported value.
        via: how the entity was found: ``exact``, ``alias``, ``context`` (named in the text so far) or
            ``fuzzy`` under entity-aware matching; ``key`` under the paper's single-key match.
        entity_score: how well the query's entity fits the matched one (1.0 unless ``via`` is fuzzy).
        context_free: whether the same query would get this answer whatever text preceded it.
    """

    entity: str
    relation: str
    value: str
    score: float
    triple_id: int
    exact: bool
    sources: tuple[str, ...]
    version: int
    alternatives: int
    support: int = 1
    via: str = "key"
    entity_score: float | None = None
    context_free: bool = True

    def to_dict(self) -> dict:
        return {**self.__dict__, "sources": list(self.sources)}


@dataclass(frozen=True)
class Miss:
    """Why a lookup found nothing; false in a boolean test, like ``None``.

    Attributes:
        reason: ``no_entity`` (no such entity, or it was deleted), ``ambiguous_entity`` (two entities
            fit equally), ``no_relation`` (the entity has no fact close to the relation) or
            ``below_threshold`` (the paper's single-key match: the nearest key is not similar enough).
        detail: the same in words, naming what was closest.
        entity: the entity that was found, for ``no_relation``.
        candidates: what was considered, ``(name, score)`` best first (entities, relations or keys).
        version: the KB version that answered.
        context_free: whether the same query would miss whatever text preceded it.
        deleted: the query names a deleted entity (or the text around it does): no fallback may
            answer it with another entity's fact.
    """

    reason: str
    detail: str = ""
    entity: str | None = None
    candidates: tuple[tuple[str, float], ...] = ()
    version: int = 0
    context_free: bool = True
    deleted: bool = False

    def __bool__(self) -> bool:
        return False

    def to_dict(self) -> dict:
        return {"reason": self.reason, "detail": self.detail, "entity": self.entity,
                "candidates": [list(c) for c in self.candidates], "version": self.version, "deleted": self.deleted}


@dataclass(frozen=True)
class TripleRecord:
    """A stored fact with its metadata; ``deleted_version`` is None while it is active."""

    id: int
    entity: str
    relation: str
    value: str
    count: int
    created_version: int
    deleted_version: int | None
    sources: tuple[tuple[str, int | None], ...]  # (doc_id, position)

    @property
    def active(self) -> bool:
        return self.deleted_version is None

    def to_dict(self) -> dict:
        return {"id": self.id, "entity": self.entity, "relation": self.relation, "value": self.value,
                "count": self.count, "created_version": self.created_version,
                "deleted_version": self.deleted_version, "sources": [list(s) for s in self.sources]}


@dataclass(frozen=True)
class VersionRecord:
    """One entry of the audit log: a numbered change and who made it, when and why."""

    version: int
    time: str  # ISO 8601, UTC
    who: str
    why: str
    op: str  # add | import | edit | delete
    n_changed: int  # number of triples touched


@dataclass(frozen=True)
class Change:
    """What one version did to one triple. ``op``: add (new triple), support (seen again), edit, delete."""

    version: int
    triple_id: int
    op: str
    old_value: str | None
    new_value: str | None


@dataclass(frozen=True)
class DiffEntry:
    """One triple that differs between two versions (see ``KnowledgeBase.diff``).

    ``op``: ``added`` (active only in the newer), ``removed`` (only in the older) or ``support``
    (in both, seen a different number of times); counts are 0 where the triple is not active.
    """

    op: str
    triple_id: int
    entity: str
    relation: str
    value: str
    count_before: int
    count_after: int

    def to_dict(self) -> dict:
        return {"op": self.op, "id": self.triple_id, "entity": self.entity, "relation": self.relation,
                "value": self.value, "count_before": self.count_before, "count_after": self.count_after}


# -- errors, and what the stores return ---------------------------------------------------------

class KBError(LmlmError):
    """A knowledge base cannot do what was asked (wrong schema, missing fact, ...)."""


class NotAKnowledgeBase(KBError, ValueError):
    """The path exists but does not hold a knowledge base."""


class KBNotFound(KBError, FileNotFoundError):
    """Nothing exists at the path given for a knowledge base."""



class Best(NamedTuple):
    """The best-supported active triple of one key, and how many active values the key has."""

    key_id: int
    key_norm: str
    triple_id: int
    entity: str
    relation: str
    value: str
    count: int
    created_version: int
    n_active: int

    @classmethod
    def per_key(cls, rows) -> list["Best"]:
        """Rows ``(key_id, key_norm, triple_id, entity, relation, value, count, created_version)``
        ordered by key, best first: the first of each key, with the key's row count as ``n_active``."""
        out: list[Best] = []
        make, last = tuple.__new__, None  # tuple.__new__: NamedTuple's keyword call costs 3x at 10^6 keys
        for r in rows:
            if r[0] == last:
                out[-1] = out[-1]._replace(n_active=out[-1].n_active + 1)
            else:
                out.append(make(cls, (*r, 1)))
                last = r[0]
        return out




class Fact(NamedTuple):
    """A fact to write: seen ``count`` more times, in ``sources`` ((doc_id, position) pairs)."""

    entity: str
    relation: str
    value: str
    count: int = 1
    sources: tuple[tuple[str, int | None], ...] = ()




class AliasRow(NamedTuple):
    """One alias: another name ``alias`` of ``entity``, both as written and normalised."""

    alias: str
    alias_norm: str
    entity: str
    entity_norm: str


def group_records(rows: Iterable[tuple]) -> Iterator[TripleRecord]:
    """Rows (id, entity, relation, value, count, created, deleted, doc_id, position), ordered by id -> records."""
    rec, srcs = None, []
    for r in rows:
        if rec is not None and r[0] != rec[0]:
            yield TripleRecord(*rec, sources=tuple(srcs))
            srcs = []
        rec = r[:7]
        if r[7] is not None:
            srcs.append((r[7], r[8]))
    if rec is not None:
        yield TripleRecord(*rec, sources=tuple(srcs))


def required(norm: str, name: str, raw: str) -> str:
    """``norm``, or a ValueError saying the ``name`` was empty once normalised."""
    if not norm:
        raise ValueError(f"{name} is empty (after normalisation): {raw!r}")
    return norm


def check_who(who: str, why: str) -> tuple[str, str]:
    """Every write says who made it (a non-empty string) and why (a string); both as the audit log
    stores them (:func:`~lmlm.kb.keys.clean_field`: a control character is refused, a line break is
    a space)."""
    if not isinstance(why, str):
        raise TypeError(f"why must be a string, got {type(why).__name__}")
    if not isinstance(who, str) or not clean_field(who, "who"):
        raise ValueError(f"who must be a non-empty string, got {who!r}")
    return clean_field(who, "who"), clean_field(why, "why")


def forget_item(item, n: int) -> tuple[str, object]:
    """Classify item ``n`` of a forget set as ('id', int), ('key', key_norm), ('fact', (key_norm,
    value_norm)), ('source', doc_id) or ('entity', entity_norm)."""
    if type(item) is tuple and len(item) == 3 and type(item[0]) is type(item[1]) is type(item[2]) is str:
        en, rn = normalize_text(item[0]), normalize_text(item[1])  # the common case: a fact, three strings
        if en and rn:
            return "fact", (en + KEY_SEP + rn, normalize_value(item[2]))
    elif isinstance(item, numbers.Integral) and not isinstance(item, bool):
        return "id", int(item)
    if isinstance(item, dict):
        if "id" in item or "triple_id" in item:
            return "id", int(item.get("id", item.get("triple_id")))
        if "source" in item:
            return "source", clean_field(str(item["source"]), "source")  # as an add stores it
        if set(item) & {"entity", "relation", "value"} == {"entity"} and isinstance(item["entity"], str):
            return "entity", required(normalize_text(item["entity"]), "entity", item["entity"])
        item = tuple(item[f] for f in ("entity", "relation", "value") if f in item)
    elif isinstance(item, Triple):
        item = (item.entity, item.relation, item.value)
    if isinstance(item, (tuple, list)) and len(item) in (2, 3) and all(isinstance(x, str) for x in item):
        en, rn = normalize_text(item[0]), normalize_text(item[1])
        if not en or not rn:
            raise ValueError(f"forget item {n}: empty entity or relation in {item!r}")
        kn = en + KEY_SEP + rn
        return ("key", kn) if len(item) == 2 else ("fact", (kn, normalize_value(item[2])))
    raise ValueError(f"forget item {n} is not a triple id, (entity, relation[, value]), Triple or dict "
                     f"with id, source, entity or entity+relation: {item!r}")
