"""Corrupted annotations with known labels: how well do validation and the corrector clean a seed set?

:func:`corrupt_documents` damages a share of the gold calls of annotated documents, each in one of
four ways an LLM annotator goes wrong:

* ``wrong_entity``: the call names another entity of the corpus;
* ``relation_not_inferable``: the relation is another label, one the text to the left does not
  support (``was born in`` followed by ``Employer City``);
* ``malformed``: the call's syntax is broken (no closing bracket, no arrow, an unquoted or empty field);
* ``value_not_in_text``: the value is one the text does not mention.

Every call is identified by its document and its character offset in the plain text, so kept and
removed calls can be scored per kind (:func:`filter_scores`).

Exercised by ``lmlm bench annotate``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from ..lookup import Lookup, Segment, Text, plain_text, render_lookup
from .validate import calls_with_offsets

__all__ = ["KINDS", "CorruptedDocument", "corrupt_documents", "filter_scores", "call_f1"]

KINDS = ("wrong_entity", "relation_not_inferable", "malformed", "value_not_in_text")


@dataclass
class CorruptedDocument:
    """An annotated document with some calls damaged; ``labels`` maps a call's offset to its kind (None: clean)."""

    text: str
    annotated: str
    labels: dict[int, str | None] = field(default_factory=dict)


def _offsets(segments: Sequence[Segment]) -> list[int]:
    return [at for at, _ in calls_with_offsets(segments)]


def _break_syntax(call: Lookup, rng: random.Random) -> str:
    good = render_lookup(call)
    way = rng.randrange(4)
    if way == 0:
        return good[:-1]  # no closing bracket
    if way == 1:
        return good.replace(" -> ", " ", 1)  # no arrow
    if way == 2:
        return f"[dblookup({call.entity}, {call.relation!r}) -> {call.value}]"  # unquoted entity
    return f"[dblookup({call.entity!r}, '') -> {call.value}]"  # empty relation


def _damage(call: Lookup, kind: str, text: str, rng: random.Random, entities: Sequence[str],
            relations: Sequence[str], values: dict[str, Sequence[str]]) -> str:
    """The damaged call as written in the annotation."""
    if kind == "malformed":
        return _break_syntax(call, rng)
    if kind == "wrong_entity":
        others = [e for e in entities if e != call.entity and e not in text]
        return render_lookup(Lookup(rng.choice(others), call.relation, call.value))
    if kind == "relation_not_inferable":
        return render_lookup(Lookup(call.entity, rng.choice([r for r in relations if r != call.relation]), call.value))
    pool = [v for v in values.get(call.relation, ()) if v not in text and v.split()[0] not in text]
    return render_lookup(Lookup(call.entity, call.relation, rng.choice(pool)))


def corrupt_documents(documents: Sequence[Sequence[Segment]], fraction: float = 0.15, seed: int = 0,
                      kinds: Sequence[str] = KINDS) -> list[CorruptedDocument]:
    """Damage ``fraction`` of all gold calls, the kinds in equal shares, chosen at random.

    Args:
        documents: gold annotated documents (segments).
        fraction: share of calls to damage.
        seed: which calls and how.
        kinds: the kinds of damage to use.

    Returns:
        One :class:`CorruptedDocument` per input, in order.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown corruption kinds {sorted(unknown)}; known: {KINDS}")
    rng = random.Random(seed)
    calls = [(d, k) for d, doc in enumerate(documents) for k, s in enumerate(doc) if isinstance(s, Lookup)]
    chosen = rng.sample(calls, round(fraction * len(calls)))
    kind_of = {c: kinds[i % len(kinds)] for i, c in enumerate(chosen)}
    lookups = [s for doc in documents for s in doc if isinstance(s, Lookup)]
    entities = sorted({lk.entity for lk in lookups})
    relations = sorted({lk.relation for lk in lookups})
    values: dict[str, list[str]] = {}
    for lk in lookups:
        values.setdefault(lk.relation, []).append(lk.value)
    values = {r: sorted(set(v)) for r, v in values.items()}
    out = []
    for d, doc in enumerate(documents):
        text = plain_text(doc)[0]
        parts, labels = [], {}
        offsets = iter(_offsets(doc))
        for k, seg in enumerate(doc):
            if isinstance(seg, Text):
                parts.append(seg.text)
                continue
            kind = kind_of.get((d, k))
            labels[next(offsets)] = kind
            parts.append(render_lookup(seg) if kind is None else
                         _damage(seg, kind, text, rng, entities, relations, values))
        out.append(CorruptedDocument(text, "".join(parts), labels))
    return out


def filter_scores(documents: Sequence[CorruptedDocument], kept: Sequence[set[int]]) -> dict:
    """How a filter did: ``kept[i]`` holds the offsets of the calls it kept in document ``i``.

    Returns:
        ``removed`` per kind (recall of that kind), ``removed_corrupted`` (all kinds), ``kept_clean``,
        ``precision`` (removed calls that were corrupted) and counts.
    """
    total, removed = Counter(), Counter()
    for doc, keep in zip(documents, kept):
        for at, kind in doc.labels.items():
            kind = kind or "clean"
            total[kind] += 1
            removed[kind] += at not in keep
    corrupted = sum(total[k] for k in KINDS)
    removed_corrupted = sum(removed[k] for k in KINDS)
    removed_all = removed_corrupted + removed["clean"]
    return {
        "removed": {k: removed[k] / total[k] for k in KINDS if total[k]},
        "removed_corrupted": removed_corrupted / max(corrupted, 1),
        "kept_clean": 1 - removed["clean"] / max(total["clean"], 1),
        "precision": removed_corrupted / max(removed_all, 1),
        "counts": {k: {"total": total[k], "removed": removed[k]} for k in (*KINDS, "clean")},
    }


def call_f1(predicted: Sequence[Sequence[tuple[int, Lookup]]], gold: Sequence[Sequence[tuple[int, Lookup]]]) -> dict:
    """Call-level precision, recall and F1: a call counts when its offset, entity, relation and value match."""
    tp = n_pred = n_gold = 0
    for pred, ref in zip(predicted, gold):
        p = Counter((at, c.entity, c.relation, c.value) for at, c in pred)
        g = Counter((at, c.entity, c.relation, c.value) for at, c in ref)
        tp += sum((p & g).values())
        n_pred += sum(p.values())
        n_gold += sum(g.values())
    precision, recall = tp / max(n_pred, 1), tp / max(n_gold, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return {"precision": precision, "recall": recall, "f1": f1, "predicted": n_pred, "gold": n_gold, "correct": tp}
