"""Biography factual precision against a world with known facts (FActScore's protocol, KB-grounded).

FActScore (Min et al., 2023) splits a generated biography into atomic claims and scores the share
a trusted source supports; the paper prompts ``"Tell me a bio of <name>. <name> is"``, decodes
greedily (256 tokens, repetition penalty 1.2) and reports the score with FActScore's length
penalty (appendix B, "FactScore"; the ablation tables also give it without). Where the true facts
are known (a synthetic world, a KB taken as ground truth) the claims need no LLM:

* ``claims="lookups"``: each lookup the model made about the topic and the KB answered is a claim
  ``(topic, relation, value)``: the value it wrote into its text (a miss's fallback value is none);
* ``claims="values"``: each known value of the world (any entity's, for any relation) named in the
  lookup-stripped text is a claim about the topic; this also scores a Standard model's text.

A claim is supported when the world holds that value for the topic, under any relation (relation
names are free text: "Birth Place" and "Birth City" are one relation to a fuzzy KB). Per response, precision = supported / claims; with FActScore's length penalty
(``gamma = 10``) it is multiplied by ``exp(1 - gamma / n_claims)`` when ``n_claims < gamma``.
Responses without claims count as abstentions: left out of the mean, reported in
``factscore_respond_ratio`` (as FActScore does).

Exercised by ``lmlm eval factscore``.

Examples:
    >>> world = world_from_kb(kb)
    >>> factscore_eval(generator, ["Ada Lind", "Bram Moss"], world)
    {'factscore_score': 0.83, 'factscore_score_no_penalty': 0.9, 'factscore_claims_per_response': 4.5, ...}
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..lookup import Lookup, parse
from .base import Protocol, mean, outputs_of, read_json_records, trace_dicts
from .popqa import normalize_answer

__all__ = [
    "BIO_PROMPT",
    "FACTSCORE",
    "GAMMA",
    "World",
    "factscore_eval",
    "length_penalty",
    "lookup_claims",
    "read_topics",
    "score_claims",
    "value_claims",
    "world_from_kb",
    "world_from_triples",
]

FACTSCORE = Protocol("factscore", "factscore_score", paper="LMLM appendix B, FactScore (length penalty gamma=10)")
BIO_PROMPT = "Tell me a bio of {name}. {name} is"
GAMMA = 10


class World:
    """Known facts: ``(entity, relation) -> set of values``, compared after :func:`normalize_answer`."""

    def __init__(self, facts: Iterable[tuple[str, str, str]]):
        self.values: dict[str, set[str]] = defaultdict(set)  # entity -> its values (any relation)
        self.facts: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.vocabulary: set[str] = set()  # every value of every entity
        self.max_words = 0
        for e, r, v in facts:
            e, r, v = normalize_answer(e), normalize_answer(r), normalize_answer(v)
            if v:
                self.facts[(e, r)].add(v)
                self.values[e].add(v)
                self.vocabulary.add(v)
                self.max_words = max(self.max_words, len(v.split()))

    def supports(self, entity: str, value: str, relation: str | None = None) -> bool:
        """Whether ``entity`` has ``value`` (for ``relation``, when given)."""
        e, v = normalize_answer(entity), normalize_answer(value)
        if relation is None:
            return v in self.values.get(e, ())
        return v in self.facts.get((e, normalize_answer(relation)), ())

    def __len__(self) -> int:
        return sum(map(len, self.facts.values()))


def world_from_triples(triples: Iterable) -> World:
    """A world from ``(entity, relation, value)`` tuples or objects with those attributes."""
    return World((t.entity, t.relation, t.value) if hasattr(t, "entity") else tuple(t) for t in triples)


def world_from_kb(kb) -> World:
    """A world of the KB's active facts (``kb.triples()``)."""
    return world_from_triples(t for t in kb.triples() if getattr(t, "active", True))


def length_penalty(n_claims: int, gamma: int = GAMMA) -> float:
    """FActScore's length penalty: ``exp(1 - gamma / n)`` below ``gamma`` claims, else 1 (0 for none).

    Examples:
        >>> length_penalty(5)  # exp(1 - 10 / 5) = exp(-1)
        0.36787944117144233
        >>> length_penalty(12)
        1.0
    """
    if n_claims <= 0:
        return 0.0
    return 1.0 if not gamma or n_claims >= gamma else math.exp(1 - gamma / n_claims)


def lookup_claims(lookups, topic: str, topic_only: bool = True) -> list[tuple[str, str, str]]:
    """Claims ``(entity, relation, value)`` of lookups: an annotated text (either surface form), a list
    of segments or :class:`lmlm.lookup.Lookup`; with ``topic_only``, those whose entity is the topic."""
    if isinstance(lookups, str):
        lookups = parse(lookups).segments
    t = normalize_answer(topic)
    return [(lk.entity, lk.relation, lk.value) for lk in lookups
            if isinstance(lk, Lookup) and lk.value and (not topic_only or normalize_answer(lk.entity) == t)]


def _answered_lookups(result) -> list[Lookup]:
    """The lookups of a generation that a KB fact answered (a miss's fallback value states nothing)."""
    trace = getattr(result, "trace", None)
    if trace is None:
        return [s for s in result.segments if isinstance(s, Lookup)]
    return [Lookup(t.query_entity, t.query_relation, t.value) for t in trace if getattr(t, "found", True) and t.value]


def value_claims(text: str, topic: str, world: World) -> list[tuple[str, str, str]]:
    """Claims ``(topic, "", value)``, one per distinct world value named in ``text``.

    Matching is on normalized words, longest values first; a mention inside a longer value already
    counted ("Paris" in "Paris Hilton"), or inside the topic's name, is not a claim of its own.
    """
    words = normalize_answer(text).split()
    covered = [False] * len(words)
    name = normalize_answer(topic).split()
    for i in range(len(words) - len(name) + 1):  # the topic's own name is no claim
        if name and words[i:i + len(name)] == name:
            covered[i:i + len(name)] = [True] * len(name)
    kept: list[str] = []
    for n in range(min(world.max_words, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            gram = " ".join(words[i:i + n])
            if gram in world.vocabulary and not all(covered[i:i + n]):
                covered[i:i + n] = [True] * n
                if gram not in kept:
                    kept.append(gram)
    return [(topic, "", v) for v in kept]


def score_claims(claims: Sequence[tuple[str, str, str]], topic: str, world: World, gamma: int = GAMMA) -> dict:
    """``n_claims``, ``supported``, ``precision`` (NaN without claims) and ``score`` (with the length penalty)."""
    supported = sum(world.supports(e or topic, v) for e, _, v in claims)
    n = len(claims)
    precision = supported / n if n else math.nan
    return {"n_claims": n, "supported": supported, "precision": precision,
            "score": precision * length_penalty(n, gamma) if n else math.nan}


def read_topics(path: str | Path) -> list[str]:
    """Topic names: a text file with one per line, or FActScore's JSON lines (``topic``, else ``input``)."""
    path = Path(path)
    if path.suffix in (".jsonl", ".json"):
        out = []
        for rec in read_json_records(path):
            name = rec.get("topic") or rec.get("entity") or rec.get("input")
            if not name:
                raise ValueError(f"{path}: a record needs 'topic' (or 'entity' / 'input'); got {sorted(rec)}")
            out.append(name)
        return out
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def factscore_eval(generator, topics: Sequence[str], world: World, *, claims: str = "lookups",
                   prompt: str = BIO_PROMPT, gamma: int = GAMMA, max_new_tokens: int = 256,
                   repetition_penalty: float = 1.2, batch_size: int = 16,
                   records: list | None = None) -> dict[str, float]:
    """Generate a biography per topic and score its claims against ``world``.

    Args:
        generator: a :class:`lmlm.generate.LookupGenerator`.
        topics: entity names (see :func:`read_topics`).
        world: the true facts (:func:`world_from_kb`, :func:`world_from_triples`).
        claims (str, default "lookups"): ``"lookups"`` or ``"values"`` (see the module docstring).
        prompt (str): the biography prompt, ``{name}`` filled with the topic (the paper's by default).
        gamma (int, default 10): FActScore's length penalty; 0 turns it off.
        max_new_tokens, repetition_penalty: the paper's decoding (256, 1.2), greedy.
        records (list, optional): appended with one dict per topic.

    Returns:
        ``factscore_score`` (mean penalized precision over responding topics),
        ``factscore_score_no_penalty``, ``factscore_claims_per_response``, ``factscore_respond_ratio``,
        ``factscore_n``.
    """
    if claims not in ("lookups", "values"):
        raise ValueError(f"claims must be 'lookups' or 'values', got {claims!r}")
    results = generator.generate([prompt.format(name=t) for t in topics], max_new_tokens=max_new_tokens,
                                 batch_size=batch_size, repetition_penalty=repetition_penalty)
    scored = []
    for topic, r, text in zip(topics, results, outputs_of(generator, results)):
        if claims == "lookups":
            cl = lookup_claims(_answered_lookups(r), topic)
        else:
            cl = value_claims(text, topic, world)
        scored.append(score_claims(cl, topic, world, gamma))
        if records is not None:
            records.append({"topic": topic, "text": r.text, "claims": [list(c) for c in cl], **scored[-1],
                            "lookups": trace_dicts(r)})
    answered = [s for s in scored if s["n_claims"]]
    return {FACTSCORE.key("score"): mean(s["score"] for s in answered),
            FACTSCORE.key("score_no_penalty"): mean(s["precision"] for s in answered),
            FACTSCORE.key("claims_per_response"): mean(s["n_claims"] for s in answered),
            FACTSCORE.key("respond_ratio"): mean(bool(s["n_claims"]) for s in scored),
            FACTSCORE.key("n"): float(len(topics))}
