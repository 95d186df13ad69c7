"""Reading lookups back out of generated ids: call spans, one trace entry per call, problems.

Every call the model opened gets a :class:`LookupTrace`, finished or not: the query as the model
wrote it, what the KB matched and answered, and where the call sits in the ids. Calls that went
wrong (cut fields, empty fields, unfinished calls) carry a ``problem``; markers written outside any
call are listed in :attr:`GenerationResult.problems`.

Exercised by ``lmlm generate --json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..lookup import Segment, Text, render, strip
from ..tokens import LookupTokenizer
from .answers import Answerer, call_context

__all__ = ["continuation_text", "LookupTrace", "GenerationResult", "CallSpan", "call_spans", "open_call", "prompt_row",
           "build_result"]


@dataclass
class LookupTrace:
    """One lookup call made during generation.

    Attributes:
        query_entity, query_relation: the query as the model wrote it.
        matched_entity, matched_relation: the KB key that answered (None: no match).
        value: what was forced after ``<|db_retrieve|>`` ("" when nothing was).
        score: the match's similarity (1.0 exact), None without a match.
        triple_id, sources: the answering fact and the documents it came from.
        kb_version: the KB version that answered.
        found: whether a KB fact supplied the value.
        token_start, token_end: ``token_ids[token_start:token_end]`` is the call.
        status: ``exact``, ``fuzzy``, ``nearest`` (below threshold), ``fallback``, ``skipped`` or
            ``unfinished`` (generation stopped before ``<|db_retrieve|>``).
        problem: what went wrong with the call, if anything.
        via: how the KB found the entity (``exact``, ``alias``, ``context``, ``fuzzy``; ``key`` for the
            paper's single-key match), None on a miss.
        miss_reason: why the KB found nothing: ``no_entity``, ``ambiguous_entity``, ``no_relation`` or
            ``below_threshold`` (None when it found a fact or was not asked).
        miss_detail: the same in words.
        candidates: what the KB considered on a miss, ``[name, score]`` best first.
    """

    query_entity: str
    query_relation: str
    matched_entity: str | None
    matched_relation: str | None
    value: str
    score: float | None
    triple_id: int | None
    sources: tuple = ()
    kb_version: int | None = None
    found: bool = False
    token_start: int = 0
    token_end: int = 0
    status: str = ""
    problem: str | None = None
    via: str | None = None
    miss_reason: str | None = None
    miss_detail: str | None = None
    candidates: tuple = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "sources": list(self.sources), "candidates": [list(c) for c in self.candidates]}


@dataclass
class GenerationResult:
    """The continuation of one prompt.

    ``text`` renders the lookups in annotation form (``[dblookup('E', 'R') -> V]``), ``clean_text``
    drops them. ``token_ids`` are the generated ids (preceded by the prompt's open call, if the
    prompt ended inside one, as with ``force_lookup``); ``problems`` lists malformed or unfinished
    calls and markers outside a call, in token order.
    """

    prompt: str
    text: str
    clean_text: str
    segments: list[Segment]
    trace: list[LookupTrace] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "text": self.text, "clean_text": self.clean_text,
                "trace": [t.to_dict() for t in self.trace], "problems": self.problems, "token_ids": self.token_ids}


@dataclass
class CallSpan:
    """Positions of one call's markers in a token list (None: not reached)."""

    start: int
    sep: int | None = None
    retrieve: int | None = None
    end: int | None = None


def call_spans(ids: Sequence[int], tok: LookupTokenizer) -> tuple[list[CallSpan], list[int]]:
    """The calls in ``ids`` (finished or not) and the positions of markers found outside any call."""
    spans: list[CallSpan] = []
    stray: list[int] = []
    cur: CallSpan | None = None
    order = {tok.sep_id: "sep", tok.retrieve_id: "retrieve", tok.end_id: "end"}
    previous = {"sep": "start", "retrieve": "sep", "end": "retrieve"}
    for i, t in enumerate(ids):
        if t == tok.start_id:
            if cur is not None:
                spans.append(cur)
            cur = CallSpan(i)
        elif t in order:
            slot = order[t]
            if cur is None or getattr(cur, slot) is not None or getattr(cur, previous[slot]) is None:
                stray.append(i)
                continue
            setattr(cur, slot, i)
            if slot == "end":
                spans.append(cur)
                cur = None
    if cur is not None:
        spans.append(cur)
    return spans, stray


def open_call(ids: Sequence[int], tok: LookupTokenizer) -> list[int]:
    """The tail of ``ids`` from its last ``<|db_start|>`` if that call is still open, else ``[]``."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == tok.end_id:
            return []
        if ids[i] == tok.start_id:
            return list(ids[i:])
    return []


def prompt_row(tok: LookupTokenizer, prompt: str, force_lookup: bool = False) -> list[int]:
    """``doc_id``, the prompt's ids and, with ``force_lookup``, ``<|db_start|>``: the row a generator starts from.

    A prompt may end inside a call's entity or relation (the model writes the rest) or right after
    ``<|db_retrieve|>`` (the KB answers); not inside the value, which the KB writes (the text would hold
    the prompt's value and the trace the KB's).
    """
    ids = [tok.doc_id, *tok.encode_text(prompt)]
    tail, t = open_call(ids, tok), tok.tokens
    if tok.retrieve_id in tail and tail[-1] != tok.retrieve_id:
        raise ValueError(f"the prompt ends inside a call's value, which the KB writes: end it at {t.retrieve} for "
                         f"the KB to answer, or close the call with {t.end}")
    return ids + ([tok.start_id] if force_lookup else [])


def continuation_text(prompt: str, ids: Sequence[int], tok: LookupTokenizer) -> str:
    """The plain text generated ``ids`` add to ``prompt``: calls removed, a call still open at the end
    (cut by the token limit) too. The space a call leaves before its word goes with the call unless
    the prompt does not end in one (``"works as a"`` + call + ``" painter"`` continues ``" painter"``)."""
    ids = list(ids)
    return _after_prompt(prompt, tok.decode_segments(ids[:len(ids) - len(open_call(ids, tok))]))


def _after_prompt(prompt: str, segments: Sequence[Segment]) -> str:
    return strip([Text(prompt), *segments])[len(prompt):] if prompt else strip(segments)


def build_result(prompt: str, ids: list[int], tok: LookupTokenizer, answers: Answerer, max_field_tokens: int,
                 tree=None, prefix: Sequence[int] = ()) -> GenerationResult:
    """Text, segments, one trace entry per call and the problems of one row's generated ids.

    ``max_field_tokens`` is the length at which decoding closed a field by force; ``tree`` (a
    :class:`lmlm.generate.trie.KeyTrie`), when decoding followed one, exempts the queries on it.
    ``prefix``: the prompt's ids before ``ids`` (each call's answer was looked up in that context).
    """
    tail = open_call(ids, tok)  # a call the token limit cut: in the text, not among the segments, as in clean_text
    segments = tok.decode_segments(ids[:len(ids) - len(tail)])
    spans, stray = call_spans(ids, tok)
    trace = [trace_entry(ids, sp, tok, answers, max_field_tokens, tree, prefix) for sp in spans]
    names = dict(zip(tok.call_ids, tok.tokens.as_list()))
    found = [(t.token_start, msg) for t in trace for msg in (t.problem.split("; ") if t.problem else [])]
    found += [(i, f"{names[ids[i]]} outside a call at token {i}") for i in stray]
    clean = _after_prompt(prompt, segments)
    return GenerationResult(prompt=prompt, text=render(tok.decode_segments(ids) if tail else segments),
                            clean_text=clean, segments=segments,
                            trace=trace, token_ids=ids, problems=[m for _, m in sorted(found, key=lambda x: x[0])])


def trace_entry(ids: list[int], sp: CallSpan, tok: LookupTokenizer, answers: Answerer, max_field: int,
                 tree=None, prefix: Sequence[int] = ()) -> LookupTrace:
    n = len(ids)
    sep = sp.sep if sp.sep is not None else (sp.retrieve if sp.retrieve is not None else n)
    entity_ids = ids[sp.start + 1:sep]
    relation_ids = ids[sp.sep + 1:sp.retrieve if sp.retrieve is not None else n] if sp.sep is not None else []
    problems = _call_problems(ids, sp, tok, max_field, tree)
    end = n if sp.end is None else sp.end + 1
    ctx = call_context(list(prefix) + list(ids[:sp.start]), len(prefix) + sp.start, tok)
    ans = answers.get((tuple(entity_ids), tuple(relation_ids)), ctx) if sp.retrieve is not None else None
    if ans is None:  # stopped before <|db_retrieve|>, or never answered
        status = "unfinished" if sp.retrieve is None else "unanswered"
        return LookupTrace(tok.decode_field(entity_ids), tok.decode_field(relation_ids), None, None, "", None, None,
                           token_start=sp.start, token_end=end, status=status, problem="; ".join(problems) or None)
    m, miss = ans.match, ans.miss
    return LookupTrace(
        query_entity=ans.entity, query_relation=ans.relation,
        matched_entity=getattr(m, "entity", None), matched_relation=getattr(m, "relation", None),
        value=ans.value, score=getattr(m, "score", None), triple_id=getattr(m, "triple_id", None),
        sources=tuple(getattr(m, "sources", ()) or ()), kb_version=ans.kb_version, found=m is not None,
        token_start=sp.start, token_end=end, status=ans.status, problem="; ".join(problems) or None,
        via=getattr(m, "via", None), miss_reason=getattr(miss, "reason", None),
        miss_detail=getattr(miss, "detail", None), candidates=tuple(getattr(miss, "candidates", ()) or ()))


def _call_problems(ids: list[int], sp: CallSpan, tok: LookupTokenizer, max_field: int, tree=None) -> list[str]:
    """Empty or cut fields and an unfinished end, for one call (a field on the prefix tree is never cut)."""
    where = f"call at token {sp.start}"
    found = []
    for name, a, b in (("entity", sp.start, sp.sep), ("relation", sp.sep, sp.retrieve)):
        if a is None or b is None:
            continue
        if not tok.decode_field(ids[a + 1:b]):
            found.append(f"{where} has an empty {name}")
        elif b - a - 1 >= max_field and not (tree is not None and tree.is_prefix(ids[sp.start + 1:b + 1])):
            found.append(f"{where}: {name} was cut at max_field_tokens={max_field}")
    if sp.end is None:
        found.append(f"{where} is unfinished: generation stopped before {tok.tokens.end}")
    return found
