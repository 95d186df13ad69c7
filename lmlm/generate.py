"""Lookup-interleaved decoding: generate text whose lookup calls are answered by a knowledge base.

The model writes ``<|db_start|> entity <|sep|> relation <|db_retrieve|>``; the knowledge base answers
with a value, whose tokens and ``<|db_end|>`` are forced one step at a time, and generation goes on.
All of it is one Hugging Face ``LogitsProcessor`` (:class:`LookupLogitsProcessor`), so batching,
the KV cache, sampling, beams and streamers come from ``model.generate`` unchanged.

Exercised by ``lmlm generate``.

Examples:
    >>> gen = LookupGenerator(model, tokenizer, kb)
    >>> r = gen.generate(["Ada Lovelace was born in"])[0]
    >>> r.text
    "[dblookup('Ada Lovelace', 'Birth City') -> London] London."
    >>> r.trace[0].value, r.trace[0].found
    ('London', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .lookup import Segment, render, strip
from .tokens import LookupTokenizer

__all__ = [
    "LookupTrace", "GenerationResult", "LookupLogitsProcessor", "LookupGenerator", "PAPER_LOGIT_BIAS",
    "CallSpan", "call_spans", "query_key", "open_call",
]

PAPER_LOGIT_BIAS = (5.0, 2.0, 2.0, 2.0)  # added to <|db_start|>, <|sep|>, <|db_retrieve|>, <|db_end|>

# Per-row decoding states. Each selects one row of the ban table; VALUE rows are forced instead.
OUTSIDE, OUTSIDE_FULL, ENTITY0, ENTITY, RELATION0, RELATION, VALUE, NO_DB = range(8)
_NEG_INF = float("-inf")

Key = tuple[tuple[int, ...], tuple[int, ...]]  # (entity ids, relation ids) of one query


@dataclass(frozen=True)
class _Answer:
    """A resolved query: its decoded text, the KB match (or None) and the ids forced after retrieve."""

    entity: str
    relation: str
    match: Any
    value: str
    continuation: tuple[int, ...]
    kb_version: int | None


@dataclass
class LookupTrace:
    """One lookup made during generation. ``token_start:token_end`` slices the call out of ``token_ids``."""

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


@dataclass
class GenerationResult:
    """The continuation of one prompt.

    ``text`` renders the lookups in annotation form (``[dblookup('E', 'R') -> V]``), ``clean_text``
    drops them. ``token_ids`` are the generated ids (preceded by the prompt's open call, if the
    prompt ended inside one, as with ``force_lookup``); ``problems`` lists malformed or unfinished calls.
    """

    prompt: str
    text: str
    clean_text: str
    segments: list[Segment]
    trace: list[LookupTrace] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class LookupLogitsProcessor(LogitsProcessor):
    """Enforce the lookup grammar and answer lookups from a knowledge base while decoding.

    Each step, every row's state is recomputed from ``input_ids`` alone (the last call marker and the
    tokens after it), so rows may be reordered between steps, as beam search does. Outside a call
    ``<|sep|>``, ``<|db_retrieve|>`` and ``<|db_end|>`` are banned (and ``<|db_start|>`` once a row
    has made ``max_lookups`` calls); inside the entity or relation the other markers and the stop
    tokens are banned, an empty field cannot be closed, and a field of ``max_field_tokens`` tokens is
    closed by force. After ``<|db_retrieve|>`` the row's query is answered (all rows that need an
    answer in one step share one ``kb.lookup_batch`` call; answers are cached in ``cache``) and the
    value's ids and ``<|db_end|>`` are forced one per step.

    Args:
        tokenizer (`LookupTokenizer`): gives the marker ids and the value encoding.
        kb (optional): any object with ``lookup_batch([(entity, relation), ...]) -> [Match | None]``;
            ``None`` answers every lookup with ``fallback``.
        logit_bias (`tuple[float, float, float, float]`, defaults to the paper's `(5, 2, 2, 2)`): added
            to the start, sep, retrieve and end scores before the grammar; ``None`` adds nothing.
        max_lookups (`int`, defaults to 16): calls a row may open after ``count_from``.
        max_field_tokens (`int`, defaults to 24): longest entity or relation, in tokens.
        fallback (`str | None`, defaults to `"unknown"`): the value when nothing matches; ``None``
            closes the call at once with an empty value.
        use_db (`bool`, defaults to `True`): ``False`` bans the four lookup tokens everywhere.
        count_from (`int`, defaults to 0): column of ``input_ids`` where counting calls starts
            (the prompt width, so calls in the prompt do not count).
        query_only (`bool`, defaults to `False`): stop at the query; no lookups and nothing forced
            after ``<|db_retrieve|>`` (used by :meth:`LookupGenerator.complete_call`).
        cache (`dict`, optional): answers by (entity ids, relation ids); share it across batches.

    Shapes: ``input_ids`` `(batch_size, sequence_length)`, ``scores`` `(batch_size, vocab_size)`;
    returns a new `(batch_size, vocab_size)` tensor.

    Examples:
        >>> proc = LookupLogitsProcessor(tok, kb, logit_bias=None)
        >>> ids = torch.tensor([[tok.doc_id, tok.start_id]])
        >>> scores = proc(ids, torch.zeros(1, len(tok)))
        >>> bool(torch.isinf(scores[0, tok.sep_id]))  # an entity cannot be empty
        True
    """

    def __init__(self, tokenizer: LookupTokenizer, kb=None, *, logit_bias=PAPER_LOGIT_BIAS, max_lookups: int = 16,
                 max_field_tokens: int = 24, fallback: str | None = "unknown", use_db: bool = True,
                 count_from: int = 0, query_only: bool = False, cache: dict | None = None):
        if logit_bias is not None and len(tuple(logit_bias)) != 4:
            raise ValueError(f"logit_bias must be None or four floats (start, sep, retrieve, end), got {logit_bias!r}")
        if not isinstance(max_lookups, int) or max_lookups < 0:
            raise ValueError(f"max_lookups must be an int >= 0, got {max_lookups!r}")
        if not isinstance(max_field_tokens, int) or max_field_tokens < 1:
            raise ValueError(f"max_field_tokens must be an int >= 1, got {max_field_tokens!r}")
        if fallback is not None and not isinstance(fallback, str):
            raise ValueError(f"fallback must be a string or None, got {fallback!r}")
        self.tok, self.kb = tokenizer, kb
        self.logit_bias = None if logit_bias is None else tuple(float(b) for b in logit_bias)
        self.max_lookups, self.max_field_tokens = max_lookups, max_field_tokens
        self.fallback, self.use_db, self.query_only = fallback, use_db, query_only
        self.count_from = count_from
        self.cache: dict[Key, _Answer] = {} if cache is None else cache
        self.stop_ids = sorted({tokenizer.eos_id, tokenizer.doc_id})
        self._tables: tuple[torch.Tensor, ...] | None = None  # marker kind per id, ban per state, bias
        self._codes = torch.zeros(0, dtype=torch.long)

    # -- tables, built once per vocabulary size and device ---------------------------------------
    def _build(self, vocab_size: int, device: torch.device) -> None:
        t = self.tok
        start, sep, ret, end = t.call_ids
        size = max(vocab_size, max(t.call_ids) + 1, max(self.stop_ids) + 1)
        kind = torch.zeros(size, dtype=torch.long)  # id -> 0 (not a marker), 1 start, 2 sep, 3 retrieve, 4 end
        kind[list(t.call_ids)] = torch.arange(1, 5)
        inside = [start, end, *self.stop_ids]
        bans = {OUTSIDE: [sep, ret, end], OUTSIDE_FULL: [start, sep, ret, end], ENTITY0: inside + [ret, sep],
                ENTITY: inside + [ret], RELATION0: inside + [sep, ret], RELATION: inside + [sep], VALUE: [],
                NO_DB: list(t.call_ids)}
        ban = torch.zeros(len(bans), vocab_size, dtype=torch.bool)  # (n_states, vocab)
        for state, ids in bans.items():
            ban[state, [i for i in ids if i < vocab_size]] = True
        bias = torch.zeros(vocab_size)
        for i, b in zip(t.call_ids, self.logit_bias or ()):
            if i < vocab_size:
                bias[i] += b
        self._tables = tuple(x.to(device) for x in (kind, ban, bias))
        self._codes = torch.zeros(0, dtype=torch.long, device=device)

    def _position_codes(self, length: int) -> torch.Tensor:
        """``8 * (position + 1)`` for positions ``0..length-1`` (grown and kept on the device)."""
        if self._codes.shape[0] < length:
            n = max(length, 2 * self._codes.shape[0], 256)
            self._codes = 8 * torch.arange(1, n + 1, device=self._codes.device)
        return self._codes[:length]

    # -- one decoding step ------------------------------------------------------------------------
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._tables is None or self._tables[1].shape[1] != scores.shape[1] or self._tables[1].device != scores.device:
            self._build(scores.shape[1], scores.device)
        _, ban, bias = self._tables
        if self.logit_bias is not None:
            scores = scores + bias
        if not self.use_db:
            return scores.masked_fill(ban[NO_DB], _NEG_INF)
        states, forced = self.plan(input_ids)
        if len(set(states)) == 1:
            mask = ban[states[0]]  # (vocab,), the same for every row
        else:
            mask = ban[torch.tensor(states, device=scores.device)]  # (B, vocab)
        scores = scores.masked_fill(mask, _NEG_INF)  # a new tensor: safe to edit below
        if forced:
            rows = torch.tensor(list(forced), device=scores.device)
            scores[rows] = _NEG_INF
            scores[rows, torch.tensor(list(forced.values()), device=scores.device)] = 0.0
        return scores

    def plan(self, input_ids: torch.LongTensor) -> tuple[list[int], dict[int, int]]:
        """Each row's state, and the token forced on the rows that have one (row -> token id).

        Depends on ``input_ids`` alone (and the answer cache), so rows may be reordered between
        steps. Rows in a value ask the KB here, all in one batch.
        """
        if self._tables is None:
            self._build(len(self.tok), input_ids.device)
        T = input_ids.shape[1]
        k = self._tables[0][input_ids]  # (B, T) marker kind per token
        # the last marker of each row, as 8 * (position + 1) + kind (0 when the row has none)
        last = torch.where(k > 0, k + self._position_codes(T), 0).amax(dim=1).tolist()
        full = None
        if T - self.count_from >= 6 * self.max_lookups - 5:  # a call takes 6 tokens at least
            full = ((k[:, self.count_from:] == 1).sum(dim=1) >= self.max_lookups).tolist()
        states: list[int] = []
        forced: dict[int, int] = {}
        values: list[tuple[int, int]] = []  # (row, position of <|db_retrieve|>)
        for b, code in enumerate(last):
            pos, kind = code // 8 - 1, code % 8
            since = T - 1 - pos
            if kind in (0, 4):
                states.append(OUTSIDE_FULL if full is not None and full[b] else OUTSIDE)
            elif kind == 3:
                states.append(VALUE)
                values.append((b, pos))
            else:
                states.append((ENTITY if kind == 1 else RELATION) - (since == 0))
                if since >= self.max_field_tokens:
                    forced[b] = self.tok.sep_id if kind == 1 else self.tok.retrieve_id
        if values and not self.query_only:
            forced.update(self._value_tokens(input_ids, values))
        return states, forced

    # -- lookups --------------------------------------------------------------------------------
    def _value_tokens(self, input_ids: torch.LongTensor, rows: list[tuple[int, int]]) -> dict[int, int]:
        """The next forced token of each row in a value, answering new queries in one batch."""
        T = input_ids.shape[1]
        keys = [query_key(input_ids[b], p, self.tok, 2 * self.max_field_tokens + 2) for b, p in rows]
        self.resolve([key for key in dict.fromkeys(keys) if key not in self.cache])
        out = {}
        for (b, p), key in zip(rows, keys):
            cont, k = self.cache[key].continuation, T - 1 - p
            out[b] = cont[k] if k < len(cont) else self.tok.end_id
        return out

    def resolve(self, keys: Sequence[Key]) -> None:
        """Answer queries (entity ids, relation ids) with one ``kb.lookup_batch`` call and cache them."""
        if not keys:
            return
        texts = [(self.tok.decode_field(e), self.tok.decode_field(r)) for e, r in keys]
        ask = [i for i, (e, r) in enumerate(texts) if e and r] if self.kb is not None else []
        matches: list = [None] * len(keys)
        if ask:
            for i, m in zip(ask, self.kb.lookup_batch([texts[i] for i in ask])):
                matches[i] = m
        version = _kb_version(self.kb)
        for key, (e, r), m in zip(keys, texts, matches):
            value = m.value if m is not None else (self.fallback or "")
            self.cache[key] = _Answer(e, r, m, value, self._continuation(value),
                                      getattr(m, "version", None) if m is not None else version)

    def _continuation(self, value: str) -> tuple[int, ...]:
        """Value ids then ``<|db_end|>``; markers and stop tokens inside a value are dropped."""
        if not value.strip():
            return (self.tok.end_id,)
        bad = set(self.tok.call_ids) | set(self.stop_ids)
        return tuple(i for i in self.tok.encode_field(value) if i not in bad) + (self.tok.end_id,)


def _kb_version(kb) -> int | None:
    v = getattr(kb, "version", None) if kb is not None else None
    return v if isinstance(v, int) else None


def query_key(row: torch.Tensor, rpos: int, tok: LookupTokenizer, window: int) -> Key:
    """(entity ids, relation ids) of the call whose ``<|db_retrieve|>`` is at ``row[rpos]``."""
    lo = max(0, rpos - window)
    ids = row[lo:rpos].tolist()
    if tok.start_id not in ids and lo > 0:  # a long call written in the prompt
        ids = row[:rpos].tolist()
    s = len(ids) - 1 - ids[::-1].index(tok.start_id) if tok.start_id in ids else -1
    body = ids[s + 1:]
    if tok.sep_id not in body:
        return tuple(body), ()
    p = body.index(tok.sep_id)
    return tuple(body[:p]), tuple(body[p + 1:])


# ---------------------------------------------------------------------------------------------
# reading calls back out of generated ids

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


def _problems(ids: list[int], spans: list[CallSpan], stray: list[int], tok: LookupTokenizer, max_field: int) -> list[str]:
    """Unfinished calls, empty or cut fields and stray markers, in token order."""
    found: list[tuple[int, str]] = []
    names = dict(zip(tok.call_ids, tok.tokens.as_list()))
    for sp in spans:
        where = f"call at token {sp.start}"
        for name, a, b in (("entity", sp.start, sp.sep), ("relation", sp.sep, sp.retrieve)):
            if a is None or b is None:
                continue
            if not tok.decode_field(ids[a + 1:b]):
                found.append((sp.start, f"{where} has an empty {name}"))
            elif b - a - 1 >= max_field:
                found.append((sp.start, f"{where}: {name} was cut at max_field_tokens={max_field}"))
        if sp.end is None:
            found.append((sp.start, f"{where} is unfinished: generation stopped before {tok.tokens.end}"))
    found += [(i, f"{names[ids[i]]} outside a call at token {i}") for i in stray]
    return [msg for _, msg in sorted(found, key=lambda x: x[0])]


def _trace(ids: list[int], spans: list[CallSpan], cache: dict[Key, _Answer]) -> list[LookupTrace]:
    out = []
    for sp in spans:
        if sp.retrieve is None:
            continue
        ans = cache.get((tuple(ids[sp.start + 1:sp.sep]), tuple(ids[sp.sep + 1:sp.retrieve])))
        if ans is None:
            continue
        m = ans.match
        out.append(LookupTrace(
            query_entity=ans.entity, query_relation=ans.relation,
            matched_entity=getattr(m, "entity", None), matched_relation=getattr(m, "relation", None),
            value=ans.value, score=getattr(m, "score", None), triple_id=getattr(m, "triple_id", None),
            sources=tuple(getattr(m, "sources", ()) or ()), kb_version=ans.kb_version, found=m is not None,
            token_start=sp.start, token_end=len(ids) if sp.end is None else sp.end + 1))
    return out


def open_call(ids: Sequence[int], tok: LookupTokenizer) -> list[int]:
    """The tail of ``ids`` from its last ``<|db_start|>`` if that call is still open, else ``[]``."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == tok.end_id:
            return []
        if ids[i] == tok.start_id:
            return list(ids[i:])
    return []


# ---------------------------------------------------------------------------------------------

class LookupGenerator:
    """Generate with a model that makes lookup calls, answered by a knowledge base.

    Args:
        model: a Hugging Face causal LM trained on lookup-annotated text (put in eval mode).
        tokenizer (`LookupTokenizer`): the model's tokenizer.
        kb (optional): the knowledge base (``lookup_batch``); ``None`` answers ``fallback`` to all.
        logit_bias, max_lookups, max_field_tokens, fallback, use_db: see :class:`LookupLogitsProcessor`.
    """

    def __init__(self, model, tokenizer: LookupTokenizer, kb=None, *, logit_bias=PAPER_LOGIT_BIAS,
                 max_lookups: int = 16, max_field_tokens: int = 24, fallback: str | None = "unknown",
                 use_db: bool = True):
        self.model = model.eval()
        self.tok, self.kb = tokenizer, kb
        self.options = dict(logit_bias=logit_bias, max_lookups=max_lookups, max_field_tokens=max_field_tokens,
                            fallback=fallback, use_db=use_db)
        LookupLogitsProcessor(tokenizer, kb, **self.options)  # validate the options now

    def processor(self, **overrides) -> LookupLogitsProcessor:
        """A fresh processor with this generator's options (for evaluators driving ``generate`` themselves)."""
        return LookupLogitsProcessor(self.tok, self.kb, **{**self.options, **overrides})

    def prompt_ids(self, prompt: str, force_lookup: bool = False) -> list[int]:
        """``doc_id``, the prompt's ids and, with ``force_lookup``, ``<|db_start|>``."""
        return [self.tok.doc_id, *self.tok.encode_text(prompt)] + ([self.tok.start_id] if force_lookup else [])

    @torch.inference_mode()
    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 64, batch_size: int = 16,
                 force_lookup: bool = False, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, repetition_penalty: float = 1.0, seed: int | None = None, progress: bool = False,
                 **hf_kwargs) -> list[GenerationResult]:
        """Continue each prompt, answering its lookups from the KB.

        Args:
            prompts: plain-text prompts (each is preceded by the document separator, as in training).
            max_new_tokens: all generated tokens, forced value tokens included.
            batch_size: rows per ``model.generate`` call; prompts are grouped by length, left-padded.
            force_lookup: open a call at the end of every prompt (the paper's T-REx protocol).
            do_sample, temperature, top_p, top_k: sampling; the warpers run after the lookup grammar.
            repetition_penalty: Hugging Face's, applied before the lookup grammar.
            seed: seeds torch's global generator before sampling.
            progress: show a progress bar over batches.
            **hf_kwargs: passed to ``model.generate`` (``num_beams``, ``streamer``, ...).

        Returns:
            one :class:`GenerationResult` per prompt, in order.
        """
        if isinstance(prompts, str):
            raise TypeError("generate expects a list of prompts, got a single string")
        if force_lookup and not self.options["use_db"]:
            raise ValueError("force_lookup=True needs use_db=True")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if seed is not None:
            torch.manual_seed(seed)
        warpers = _warpers(do_sample, temperature, top_k, top_p)
        ids = [self.prompt_ids(p, force_lookup) for p in prompts]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        if progress:
            from tqdm.auto import tqdm
            batches = tqdm(batches, desc="generate", unit="batch")
        cache: dict[Key, _Answer] = {}
        results: list[GenerationResult | None] = [None] * len(ids)
        for batch in batches:
            rows = [ids[i] for i in batch]
            proc = self.processor(count_from=max(map(len, rows)) - int(force_lookup), cache=cache)
            gen = self._run(rows, LogitsProcessorList([proc, *warpers]), max_new_tokens, self._stop_ids(),
                            do_sample=do_sample, repetition_penalty=repetition_penalty, **hf_kwargs)
            for i, g in zip(batch, gen):
                results[i] = self._result(prompts[i], open_call(ids[i], self.tok) + g, cache)
        return results

    @torch.inference_mode()
    def complete_call(self, prefixes: Sequence[Sequence[int]], batch_size: int = 16) -> list[tuple[str, str]]:
        """Greedily write the query of a call opened at the end of each prefix.

        Each prefix (token ids, usually starting with ``doc_id``) must end with ``<|db_start|>``; the
        model writes entity and relation until ``<|db_retrieve|>`` (always within
        ``2 * max_field_tokens + 2`` tokens). Nothing is looked up. Returns ``(entity, relation)`` per prefix.
        """
        bad = [i for i, p in enumerate(prefixes) if not p or p[-1] != self.tok.start_id]
        if bad:
            raise ValueError(f"every prefix must end with {self.tok.tokens.start}; prefixes {bad[:5]} do not")
        if not self.options["use_db"]:
            raise ValueError("complete_call needs use_db=True")
        limit = 2 * self.options["max_field_tokens"] + 2
        out: list[tuple[str, str]] = [("", "")] * len(prefixes)
        order = sorted(range(len(prefixes)), key=lambda i: -len(prefixes[i]))
        for k in range(0, len(order), batch_size):
            batch = order[k:k + batch_size]
            rows = [list(prefixes[i]) for i in batch]
            proc = self.processor(count_from=max(map(len, rows)) - 1, query_only=True)
            gen = self._run(rows, LogitsProcessorList([proc]), limit, [self.tok.retrieve_id], do_sample=False)
            for i, g in zip(batch, gen):
                e, r = query_key(torch.tensor([self.tok.start_id, *g, self.tok.retrieve_id]), len(g) + 1,
                                 self.tok, len(g) + 1)
                out[i] = (self.tok.decode_field(e), self.tok.decode_field(r))
        return out

    # -- pieces ---------------------------------------------------------------------------------
    def _stop_ids(self) -> list[int]:
        return sorted({self.tok.eos_id, self.tok.doc_id})

    def _run(self, rows: list[list[int]], processors: LogitsProcessorList, max_new_tokens: int,
             stop_ids: list[int], **kwargs) -> list[list[int]]:
        """Left-pad ``rows``, run ``model.generate`` and return each row's new ids up to its stop token."""
        width = max(map(len, rows))
        pad = self.tok.eos_id
        device = self.model.device
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        if kwargs.get("do_sample"):  # sampling warpers are ours, after the grammar
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
        out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                  logits_processor=processors, eos_token_id=stop_ids, pad_token_id=pad, **kwargs)
        gen = []
        for row in out[:, width:].tolist():
            stops = [k for k, t in enumerate(row) if t in stop_ids]
            gen.append(row[:stops[0]] if stops else row)
        return gen

    def _result(self, prompt: str, ids: list[int], cache: dict[Key, _Answer]) -> GenerationResult:
        segments = self.tok.decode_segments(ids)
        spans, stray = call_spans(ids, self.tok)
        return GenerationResult(
            prompt=prompt, text=render(segments), clean_text=strip(segments), segments=segments,
            trace=_trace(ids, spans, cache), token_ids=ids,
            problems=_problems(ids, spans, stray, self.tok, self.options["max_field_tokens"]))


def _warpers(do_sample: bool, temperature: float, top_k: int, top_p: float) -> list[LogitsProcessor]:
    if not do_sample:
        return []
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")
    out: list[LogitsProcessor] = []
    if temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        out.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p))
    return out
