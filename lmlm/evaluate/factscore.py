"""Biography factual precision against a world with known facts (FActScore's protocol, KB-grounded).

FActScore (Min et al., 2023) splits a generated biography into atomic claims and scores the share
a trusted source supports; the paper prompts ``"Tell me a bio of <name>. <name> is"``, decodes
greedily (256 tokens, repetition penalty 1.2) and reports the score with FActScore's length
penalty (appendix B, "FactScore"; the ablation tables also give it without). Where the true facts
are known (a synthetic world, a KB taken as ground truth) the claims need no LLM:

* ``claims="text"``: each fact a sentence of the lookup-stripped text states, read with the
  world's phrasings (:class:`ClaimPatterns`; the biography world's by default): the cue before a
  value names its relation ("was born in" -> Birth City), so a claim is ``(topic, relation,
  value)``. A value outside the world's values is an invented claim; a sentence that states no
  fact ("a lifelong fan of jazz music") makes none. This also scores a Standard model's text.
* ``claims="lookups"``: each lookup the model made about the topic and the KB answered is a claim
  ``(topic, relation, value)``: the value it wrote into its text (a miss's fallback value is none).

A claim is supported when the world holds that value for the topic under that relation (relation
names compared after normalization); an invented value is never supported. Per response,
precision = supported / claims; FActScore's length penalty (``gamma = 10``) multiplies it by
``exp(1 - gamma / n_claims)`` when ``n_claims < gamma``. With at most six facts per person the
penalty caps a perfect biography at ``exp(1 - 10 / 6) = 0.513``, so here the precision without
it is the comparable number and is reported first (``factscore_score_no_penalty``). Responses
without claims count as abstentions: left out of the mean, reported in
``factscore_respond_ratio`` (as FActScore does).

Where the world knows which facts some training document states (:func:`world_from_kb`: a KB
fact with a source), precision is also split by claims about facts ``stated`` in the training
text and facts in the KB ``kb_only`` (those no Standard model could learn), pooled over claims.

Exercised by ``lmlm eval factscore``.

Examples:
    >>> world = world_from_kb(kb)
    >>> factscore_eval(generator, ["Ada Lind", "Bram Moss"], world)
    {'factscore_score_no_penalty': 0.9, 'factscore_score': 0.83, 'factscore_claims_per_response': 4.5, ...}
"""

from __future__ import annotations

import math
import re
import string
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..lookup import Lookup, parse
from .base import Protocol, mean, normal_text, outputs_of, progress_option, read_json_records, trace_dicts
from .popqa import normalize_answer

__all__ = [
    "BIO_PROMPT",
    "FACTSCORE",
    "GAMMA",
    "Claim",
    "ClaimPatterns",
    "World",
    "factscore_eval",
    "length_penalty",
    "lookup_claims",
    "read_topics",
    "score_claims",
    "text_claims",
    "world_from_kb",
    "world_from_triples",
]

FACTSCORE = Protocol("factscore", "factscore_score_no_penalty",
                     paper="LMLM appendix B, FactScore (also with length penalty gamma=10)")
BIO_PROMPT = "Tell me a bio of {name}. {name} is"
GAMMA = 10
SUBJECT = "subject"  # the person's field in a claim template
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class World:
    """Known facts: ``(entity, relation) -> set of values``, compared after :func:`normalize_answer`.

    Args:
        facts: ``(entity, relation, value)`` triples.
        stated: the ``(entity, relation)`` facts some training document states (None: not known).
    """

    def __init__(self, facts: Iterable[tuple[str, str, str]], stated: Iterable[tuple[str, str]] | None = None):
        self.values: dict[str, set[str]] = defaultdict(set)  # entity -> its values (any relation)
        self.facts: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.vocabulary: set[str] = set()  # every value of every entity
        self.max_words = 0
        self.max_words_of: dict[str, int] = defaultdict(int)  # relation -> longest value in words
        for e, r, v in facts:
            e, r, v = normalize_answer(e), normalize_answer(r), normalize_answer(v)
            if v:
                self.facts[(e, r)].add(v)
                self.values[e].add(v)
                self.vocabulary.add(v)
                self.max_words = max(self.max_words, len(v.split()))
                self.max_words_of[r] = max(self.max_words_of[r], len(v.split()))
        self.stated = None if stated is None else {(normalize_answer(e), normalize_answer(r)) for e, r in stated}

    def supports(self, entity: str, value: str, relation: str | None = None) -> bool:
        """Whether ``entity`` has ``value`` (for ``relation``, when given)."""
        e, v = normalize_answer(entity), normalize_answer(value)
        if relation is None:
            return v in self.values.get(e, ())
        return v in self.facts.get((e, normalize_answer(relation)), ())

    def is_stated(self, entity: str, relation: str) -> bool | None:
        """Whether a training document states ``entity``'s ``relation`` (None when the world cannot tell,
        or holds no such fact: a claim about someone it does not know is neither stated nor KB-only)."""
        if self.stated is None or not relation:
            return None
        key = (normalize_answer(entity), normalize_answer(relation))
        return None if key not in self.facts else key in self.stated

    def __len__(self) -> int:
        return sum(map(len, self.facts.values()))


def world_from_triples(triples: Iterable, stated: Iterable[tuple[str, str]] | None = None) -> World:
    """A world from ``(entity, relation, value)`` tuples or objects with those attributes."""
    return World(((t.entity, t.relation, t.value) if hasattr(t, "entity") else tuple(t) for t in triples), stated)


def world_from_kb(kb) -> World:
    """A world of the KB's active facts (``kb.triples()``); a fact with a source document is ``stated``."""
    rows = [t for t in kb.triples() if getattr(t, "active", True)]
    if not any(hasattr(t, "sources") for t in rows):
        return world_from_triples(rows)  # a KB that records no sources cannot tell stated facts
    stated = [(t.entity, t.relation) for t in rows if any(_source_id(s) for s in getattr(t, "sources", ()) or ())]
    return world_from_triples(rows, stated)


def _source_id(source) -> str | None:
    return source[0] if isinstance(source, (tuple, list)) else source


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


# -- claims ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """One atomic claim: ``entity``'s ``relation`` is ``value``; ``invented`` when the value is no
    value of the world at all."""

    entity: str
    relation: str
    value: str
    invented: bool = False

    def as_list(self) -> list:
        return [self.entity, self.relation, self.value] + (["invented"] if self.invented else [])


@dataclass(frozen=True)
class _Cue:
    words: tuple[str, ...]
    relation: str
    after: str | None  # None: anywhere; "^": at a sentence start; else right after a value of this relation

    @property
    def names_value(self) -> bool:
        """Whether unknown words after the cue are a value the text invents: after a verb phrase about the
        person ("was born in"), not after a bare preposition ("At ...", "... in")."""
        return self.after is None or (self.after == "^" and len(self.words) > 1)


class ClaimPatterns:
    """Reads the facts a text states, by the phrasings of a world's fact templates.

    Each template names the person ``{subject}`` and each value by its relation (``"{subject} was born
    on {Birth Date} in {Birth City}."``). The words right before a value are its *cue*: a cue after
    the subject may occur anywhere ("was born in"), one opening a template only at a sentence start
    ("Born in"), one after another value only right after a value of that relation ("... on May 3,
    1960 in"). Where a cue fires, the value is the longest known value that follows; when none
    follows, the next words (at most the relation's longest value) are an invented value, unless the
    cue is a bare preposition ("At", "in"), which names no relation by itself.

    Args:
        templates: the templates (:func:`lmlm.worlds.bios.claim_templates` by default).
    """

    def __init__(self, templates: Iterable[str] | None = None):
        if templates is None:
            from ..worlds.bios import claim_templates

            templates = claim_templates()
        cues: dict[tuple, _Cue] = {}
        for template in templates:
            prev: str | None = "^"
            for literal, field, _, _ in string.Formatter().parse(template):
                if field is None:
                    continue
                if field != SUBJECT:
                    words = tuple(normalize_answer(literal).split())
                    if not words:
                        raise ValueError(f"template {template!r}: {{{field}}} needs words before it")
                    cue = _Cue(words, field, prev)
                    cues[(cue.words, cue.after)] = cue
                prev = None if field == SUBJECT else field
        if not cues:
            raise ValueError("no template names a value")
        self.cues = sorted(cues.values(), key=lambda c: -len(c.words))

    def _cue_at(self, words: list[str], i: int, last: tuple[str, int] | None) -> _Cue | None:
        for cue in self.cues:
            if cue.after == "^" and i != 0:
                continue
            if cue.after not in (None, "^") and (last is None or last != (cue.after, i)):
                continue
            if tuple(words[i:i + len(cue.words)]) == cue.words:
                return cue
        return None

    def _chained_at(self, words: list[str], i: int, relation: str) -> bool:
        return any(c.after == relation and tuple(words[i:i + len(c.words)]) == c.words for c in self.cues)

    def claims(self, text: str, topic: str, world: World) -> list[Claim]:
        """The distinct claims of ``text`` about ``topic``, in order."""
        out: dict[tuple[str, str], Claim] = {}
        for sentence in _SENTENCE_END.split(text.strip()):
            words = normalize_answer(sentence).split()
            i, last = 0, None
            while i < len(words):
                cue = self._cue_at(words, i, last)
                if cue is None:
                    i += 1
                    continue
                j = i + len(cue.words)
                value = next((" ".join(words[j:j + n]) for n in range(min(world.max_words, len(words) - j), 0, -1)
                              if " ".join(words[j:j + n]) in world.vocabulary), None)
                invented = value is None
                if invented and not cue.names_value:
                    i += 1
                    continue
                if invented:  # the words up to the relation's longest value, a chained cue or the sentence end
                    k = j
                    limit = j + max(1, world.max_words_of.get(normalize_answer(cue.relation), 0) or world.max_words)
                    while k < min(limit, len(words)) and (k == j or not self._chained_at(words, k, cue.relation)):
                        k += 1
                    value = " ".join(words[j:k])
                if value:
                    out.setdefault((normalize_answer(cue.relation), value), Claim(topic, cue.relation, value, invented))
                i = j + len(value.split())
                last = (cue.relation, i)
        return list(out.values())


def text_claims(text: str, topic: str, world: World, patterns: ClaimPatterns | None = None) -> list[Claim]:
    """Relation-aware claims of a plain text about ``topic`` (:class:`ClaimPatterns`)."""
    return (patterns or ClaimPatterns()).claims(text, topic, world)


def lookup_claims(lookups, topic: str, topic_only: bool = True) -> list[Claim]:
    """Claims of lookups: an annotated text (either surface form), a list of segments or
    :class:`lmlm.lookup.Lookup`; with ``topic_only``, those whose entity is the topic."""
    if isinstance(lookups, str):
        lookups = parse(lookups).segments
    t = normalize_answer(topic)
    return [Claim(lk.entity, lk.relation, lk.value) for lk in lookups
            if isinstance(lk, Lookup) and lk.value and (not topic_only or normalize_answer(lk.entity) == t)]


def _answered_lookups(result) -> list[Lookup]:
    """The lookups of a generation that a KB fact answered (a miss's fallback value states nothing)."""
    trace = getattr(result, "trace", None)
    if trace is None:
        return [s for s in result.segments if isinstance(s, Lookup)]
    return [Lookup(t.query_entity, t.query_relation, t.value) for t in trace if getattr(t, "found", True) and t.value]


def score_claims(claims: Sequence[Claim], topic: str, world: World, gamma: int = GAMMA) -> dict:
    """``n_claims``, ``supported``, ``precision`` (NaN without claims), ``score`` (with the length
    penalty), ``invented``, and per claim whether it is ``supported_each`` and about a ``stated`` fact."""
    each = [not c.invented and world.supports(c.entity or topic, c.value, c.relation) for c in claims]
    n = len(claims)
    precision = sum(each) / n if n else math.nan
    return {"n_claims": n, "supported": sum(each), "precision": precision,
            "score": precision * length_penalty(n, gamma) if n else math.nan,
            "invented": sum(c.invented for c in claims), "supported_each": each,
            "stated": [world.is_stated(c.entity or topic, c.relation) for c in claims]}


_BIO_OF = re.compile(r"\bbio(?:graphy)? of (.+?)\s*[.?!]?\s*$", re.IGNORECASE)


def read_topics(path: str | Path) -> list[str]:
    """Topic names: a text file with one per line, or FActScore's JSON lines (``topic``, else ``input``)."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        out = []
        for k, rec in enumerate(read_json_records(path), 1):
            name = rec.get("topic") or rec.get("entity") if isinstance(rec, dict) else None
            if not name and isinstance(rec, dict) and isinstance(rec.get("input"), str):
                asked = _BIO_OF.search(rec["input"])  # FActScore's prompts: "Question: Tell me a bio of X."
                name = asked.group(1) if asked else rec["input"]
            if not name:
                raise ValueError(f"{path}: record {k} needs 'topic' (or 'entity' / 'input')")
            out.append(normal_text(str(name).strip()))
        return out
    return [normal_text(line.strip()) for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]


def _prompt_tail(prompt: str) -> str:
    """The prompt's last sentence (``"Ada Lind is"``): the start of the response's first sentence."""
    return _SENTENCE_END.split(prompt.strip())[-1]


def _pooled(scored: Sequence[dict], stated: bool) -> tuple[float, int]:
    pairs = [(ok, st) for s in scored for ok, st in zip(s["supported_each"], s["stated"]) if st is stated]
    return (mean(ok for ok, _ in pairs), len(pairs))


def factscore_eval(generator, topics: Sequence[str], world: World, *, claims: str = "lookups",
                   prompt: str = BIO_PROMPT, gamma: int = GAMMA, max_new_tokens: int = 256,
                   repetition_penalty: float = 1.2, batch_size: int = 16, patterns: ClaimPatterns | None = None,
                   records: list | None = None, progress: bool = False) -> dict[str, float]:
    """Generate a biography per topic and score its claims against ``world``.

    Args:
        generator: a :class:`lmlm.generate.LookupGenerator`.
        topics: entity names (see :func:`read_topics`).
        world: the true facts (:func:`world_from_kb`, :func:`world_from_triples`).
        claims (str, default "lookups"): ``"lookups"`` or ``"text"`` (see the module docstring).
        prompt (str): the biography prompt, ``{name}`` filled with the topic (the paper's by default).
        gamma (int, default 10): FActScore's length penalty; 0 turns it off.
        max_new_tokens, repetition_penalty: the paper's decoding (256, 1.2), greedy.
        patterns: the phrasings ``claims="text"`` reads (default: the biography world's).
        records (list, optional): appended with one dict per topic.
        progress (bool, default False): a progress bar over the generation's batches.

    Returns:
        ``factscore_score_no_penalty`` (mean precision over responding topics), ``factscore_score``
        (with the length penalty), ``factscore_claims_per_response``, ``factscore_respond_ratio``,
        ``factscore_invented`` (share of claims with a value the world does not have),
        ``factscore_precision_stated`` / ``factscore_precision_kb_only`` and their claim counts
        ``factscore_claims_stated`` / ``factscore_claims_kb_only`` (when the world knows),
        ``factscore_topics_unknown`` (topics the world holds no fact of: their claims cannot be supported),
        ``factscore_n``.
    """
    if claims not in ("lookups", "text"):
        raise ValueError(f"claims must be 'lookups' or 'text', got {claims!r}")
    patterns = patterns or (ClaimPatterns() if claims == "text" else None)
    prompts = [prompt.format(name=t) for t in topics]
    results = generator.generate(prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                 repetition_penalty=repetition_penalty, **progress_option(progress))
    scored = []
    for topic, p, r, text in zip(topics, prompts, results, outputs_of(generator, results)):
        if claims == "lookups":
            cl = lookup_claims(_answered_lookups(r), topic)
        else:
            cl = patterns.claims(f"{_prompt_tail(p)} {text.strip()}", topic, world)
        scored.append(score_claims(cl, topic, world, gamma))
        if records is not None:
            records.append({"topic": topic, "text": r.text, "claims": [c.as_list() for c in cl], **scored[-1],
                            "lookups": trace_dicts(r)})
    answered = [s for s in scored if s["n_claims"]]
    out = {FACTSCORE.key("score_no_penalty"): mean(s["precision"] for s in answered),
           FACTSCORE.key("score"): mean(s["score"] for s in answered),
           FACTSCORE.key("claims_per_response"): mean(s["n_claims"] for s in answered),
           FACTSCORE.key("respond_ratio"): mean(bool(s["n_claims"]) for s in scored),
           FACTSCORE.key("invented"): (sum(s["invented"] for s in answered) / sum(s["n_claims"] for s in answered)
                                       if answered else math.nan)}
    if world.stated is not None:
        for name, flag in (("stated", True), ("kb_only", False)):
            precision, n = _pooled(scored, flag)
            out[FACTSCORE.key(f"precision_{name}")] = precision
            out[FACTSCORE.key(f"claims_{name}")] = float(n)
    # a topic the world holds no fact of: every claim about it is unsupported, however true
    out[FACTSCORE.key("topics_unknown")] = float(sum(normalize_answer(t) not in world.values for t in topics))
    out[FACTSCORE.key("n")] = float(len(topics))
    return out
