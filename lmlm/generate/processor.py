"""The lookup grammar as one Hugging Face ``LogitsProcessor``, so ``model.generate`` does the rest.

Each step every row's state is read off its ids alone (the last call marker and the tokens after
it), so rows may be reordered between steps as beam search does. The processor biases the four
markers, bans the markers that cannot come next, closes over-long fields, optionally keeps the
query inside the KB's prefix tree, opens calls at given positions, and forces the value and
``<|db_end|>`` after ``<|db_retrieve|>``, one token per step.

Exercised by ``lmlm generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import torch
from transformers import LogitsProcessor

from ..tokens import LookupTokenizer
from .answers import Answer, Answerer, Key, call_context, call_start, query_key

__all__ = ["LookupLogitsProcessor", "PAPER_LOGIT_BIAS", "Plan", "grammar_tables", "field_state", "call_due"]

PAPER_LOGIT_BIAS = (5.0, 2.0, 2.0, 2.0)  # added to <|db_start|>, <|sep|>, <|db_retrieve|>, <|db_end|>

# Per-row decoding states. Each selects one row of the ban table; VALUE rows are forced instead.
OUTSIDE, OUTSIDE_FULL, ENTITY0, ENTITY, RELATION0, RELATION, VALUE, NO_DB = range(8)
NEG_INF = float("-inf")


def grammar_tables(call_ids: Sequence[int], stop_ids: Sequence[int], logit_bias, vocab_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grammar as tables: each id's marker kind (0 not a marker, 1 start, 2 sep, 3 retrieve, 4 end),
    the ids each state bans ``(n_states, vocab_size)`` and the markers' bias ``(vocab_size,)``.

    Outside a call the closing markers are banned (and ``<|db_start|>`` too once the calls are spent);
    inside a field the other markers and the stop tokens are, and an empty field cannot be closed.
    """
    start, sep, ret, end = call_ids
    size = max(vocab_size, max(call_ids) + 1, max(stop_ids) + 1)
    kind = torch.zeros(size, dtype=torch.long)
    kind[list(call_ids)] = torch.arange(1, 5)
    inside = [start, end, *stop_ids]
    bans = {OUTSIDE: [sep, ret, end], OUTSIDE_FULL: [start, sep, ret, end], ENTITY0: inside + [ret, sep],
            ENTITY: inside + [ret], RELATION0: inside + [sep, ret], RELATION: inside + [sep], VALUE: [],
            NO_DB: list(call_ids)}
    ban = torch.zeros(len(bans), vocab_size, dtype=torch.bool)
    for state, ids in bans.items():
        ban[state, [i for i in ids if i < vocab_size]] = True
    bias = torch.zeros(vocab_size)
    for i, b in zip(call_ids, logit_bias or ()):
        if i < vocab_size:
            bias[i] += b
    return kind, ban, bias


def call_due(offsets, length: int, origin: int, last_start: int) -> bool:
    """Whether a row of ``length`` ids owes a call: one of ``offsets`` (counted from ``origin``, the
    continuation's first position) has passed with no ``<|db_start|>`` at or after it (``last_start``)."""
    due = [p for p in offsets if p <= length - origin]
    return bool(due) and last_start < origin + due[-1]


def field_state(kind: int, pos: int, length: int, calls: int, max_lookups: int) -> int:
    """The state of a row of ``length`` ids whose last marker, of ``kind``, stands at ``pos``."""
    if kind in (0, 4):
        return OUTSIDE_FULL if calls >= max_lookups else OUTSIDE
    if kind == 3:
        return VALUE
    return (ENTITY if kind == 1 else RELATION) - (pos == length - 1)


def only_token(logits: torch.Tensor, token: int) -> torch.Tensor:
    """``logits`` (one row) edited so that ``token`` is the only choice."""
    logits.fill_(NEG_INF)
    logits[token] = 0.0
    return logits


class Plan(NamedTuple):
    """One step's decisions: a state per row, forced tokens and prefix-tree allowances by row."""

    states: list[int]
    forced: dict[int, int]
    allowed: dict[int, torch.Tensor]


@dataclass
class _Rows:
    """Per-row bookkeeping of the last step: positions are columns of ``ids`` (-1: none)."""

    ids: torch.Tensor  # (B, T) the ids it describes
    last: list[int]  # the last marker's position
    kind: list[int]  # its kind: 0 none, 1 start, 2 sep, 3 retrieve, 4 end
    start: list[int]  # the last <|db_start|>'s position
    calls: list[int]  # <|db_start|> at or after count_from
    keys: dict[tuple[int, int], tuple[Key, tuple[int, ...]]]  # (row, <|db_retrieve|> pos) -> query, context
    copies: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (row, <|db_end|> pos) -> value ids
    names: dict[tuple[int, int], list[list[int]]] = field(default_factory=dict)  # (row, start pos) -> name ids


class LookupLogitsProcessor(LogitsProcessor):
    """Enforce the lookup grammar and answer lookups from a knowledge base while decoding.

    Outside a call ``<|sep|>``, ``<|db_retrieve|>`` and ``<|db_end|>`` are banned (and ``<|db_start|>``
    once a row has made ``max_lookups`` calls); inside the entity or relation the other markers and
    the stop tokens are banned, an empty field cannot be closed, and a field of ``max_field_tokens``
    tokens is closed by force. After ``<|db_retrieve|>`` the row's query is answered (all rows that
    need an answer in one step share one ``kb.lookup_batch`` call) and the value's ids and
    ``<|db_end|>`` are forced one per step.

    Args:
        tokenizer (`LookupTokenizer`): gives the marker ids and the value encoding.
        kb (optional): any object with ``lookup_batch([(entity, relation), ...]) -> [Match | None]``;
            ``None`` misses every lookup.
        logit_bias (`tuple[float, float, float, float]`, defaults to the paper's `(5, 2, 2, 2)`): added
            to the start, sep, retrieve and end scores before the grammar; ``None`` adds nothing.
        max_lookups (`int`, defaults to 16): calls a row may open after ``count_from``.
        max_field_tokens (`int`, defaults to 24): longest entity or relation, in tokens.
        fallback (`str | None`, defaults to `"unknown"`), on_miss (`str`, defaults to `"text"`): what a
            query without a match gets; see :class:`lmlm.generate.answers.Answerer`.
        use_db (`bool`, defaults to `True`): ``False`` bans the four lookup tokens everywhere.
        count_from (`int`, defaults to 0): column of ``input_ids`` where the continuation starts (the
            prompt width, less one when the prompt ends with a forced ``<|db_start|>``); calls before
            it do not count towards ``max_lookups``.
        query_only (`bool`, defaults to `False`): stop at the query; nothing is answered or forced
            after ``<|db_retrieve|>``.
        cache (`dict`, optional): answers by (entity ids, relation ids); share it across batches.
        constraint (`KeyTrie`, optional): keep every query on a path of this prefix tree of KB keys.
        force_at (`Sequence[Sequence[int]]`, optional): per batch item, offsets from ``count_from``
            at which a call must begin (a call already open then delays it to right after its end).
        matching (`str`, optional): ``"entity"`` or ``"key"``; ``None``: the KB's own (see ``Answerer``).
        copy_bias (`float`, defaults to 0): added, after an answered call's ``<|db_end|>``, to the
            score of the value's next token while the text is stating the value (its tokens so far
            are the value's first ones); 0 leaves the model alone. A small model may drift off a
            value it has never seen ("University of Port Jamesville" -> "... Port Emilyside").
        name_bias (`float`, defaults to 0): added, inside a call's entity, to the next token of each
            name of a KB entity the text before the call names (its tokens so far are the name's first
            ones; ``<|sep|>`` once a name is whole); 0 leaves the model alone. A small model writing
            a query may slip to a name it was trained on ("Heather Thomas was born in" -> a call on
            "Heather Hartman"), which the KB refuses as a name the text never gave.

    Shapes: ``input_ids`` `(batch_size, sequence_length)`, ``scores`` `(batch_size, vocab_size)`;
    returns a new `(batch_size, vocab_size)` tensor. With beam search ``batch_size`` is items times
    beams and each item's beams share its ``force_at``.

    Examples:
        >>> proc = LookupLogitsProcessor(tok, kb, logit_bias=None)
        >>> ids = torch.tensor([[tok.doc_id, tok.start_id]])
        >>> scores = proc(ids, torch.zeros(1, len(tok)))
        >>> bool(torch.isinf(scores[0, tok.sep_id]))  # an entity cannot be empty
        True
    """

    def __init__(self, tokenizer: LookupTokenizer, kb=None, *, logit_bias=PAPER_LOGIT_BIAS, max_lookups: int = 16,
                 max_field_tokens: int = 24, fallback: str | None = "unknown", on_miss: str = "text",
                 use_db: bool = True, count_from: int = 0, query_only: bool = False, cache: dict | None = None,
                 constraint=None, force_at: Sequence[Sequence[int]] | None = None, matching: str | None = None,
                 copy_bias: float = 0.0, name_bias: float = 0.0):
        if logit_bias is not None and len(tuple(logit_bias)) != 4:
            raise ValueError(f"logit_bias must be None or four floats (start, sep, retrieve, end), got {logit_bias!r}")
        if not isinstance(max_lookups, int) or max_lookups < 0:
            raise ValueError(f"max_lookups must be an int >= 0, got {max_lookups!r}")
        if not isinstance(max_field_tokens, int) or max_field_tokens < 1:
            raise ValueError(f"max_field_tokens must be an int >= 1, got {max_field_tokens!r}")
        for name, v in (("copy_bias", copy_bias), ("name_bias", name_bias)):
            if not (isinstance(v, (int, float)) and 0.0 <= float(v) < float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if force_at is not None and any(p < 0 for ps in force_at for p in ps):
            raise ValueError(f"force_at offsets must be >= 0, got {force_at!r}")
        self.tok, self.kb = tokenizer, kb
        self.answers = Answerer(tokenizer, kb, fallback=fallback, on_miss=on_miss, cache=cache, matching=matching)
        self.logit_bias = None if logit_bias is None else tuple(float(b) for b in logit_bias)
        self.max_lookups, self.max_field_tokens = max_lookups, max_field_tokens
        self.use_db, self.query_only = use_db, query_only
        self.count_from = count_from
        self.constraint = constraint
        self.force_at = None if force_at is None else [sorted(set(ps)) for ps in force_at]
        self.copy_bias, self.name_bias = float(copy_bias), float(name_bias)
        self.stop_ids = sorted({tokenizer.eos_id, tokenizer.doc_id})
        self._tables: tuple[torch.Tensor, ...] | None = None  # marker kind per id, ban per state, bias
        self._codes = torch.zeros(0, dtype=torch.long)
        self._rows: _Rows | None = None
        self._tails: dict[int, list[int]] = {}  # row -> forced tokens after this step's (the value's rest)

    @property
    def cache(self) -> dict[Key, Answer]:
        """Answers by (entity ids, relation ids)."""
        return self.answers.cache

    def forced_tail(self, b: int, token: int | None = None, limit: int | None = None) -> list[int]:
        """The tokens the grammar forces on row ``b`` after the one just chosen, so a decoder may feed
        them with it in one forward (their logits would be thrown away).

        Without ``token``: the rest of the value being forced and ``<|db_end|>``. With ``token`` (the
        id chosen at the last step, batch of one row only): every token forced from there on, found by
        planning the steps ahead on the ids alone, as :meth:`plan` would at each step: a
        ``<|db_start|>`` due at the next ``force_at`` offset, the only continuation the prefix tree
        allows, the value of a query just closed. Stops at the first token the model must choose,
        or after ``limit`` tokens.
        """
        tail = list(self._tails.get(b, []))
        rows = self._rows
        if token is None or rows is None or rows.ids.shape[0] != 1:
            return tail
        limit = 1 << 30 if limit is None else limit
        ids = torch.cat([rows.ids, torch.tensor([[token, *tail]], device=rows.ids.device)], dim=1)
        _, ban, _ = self._tables
        while len(tail) < limit:
            states, forced, allowed = self.plan(ids)
            nxt = forced.get(0)
            if nxt is None and 0 in allowed and len(allowed[0]) == 1 and not ban[states[0], allowed[0][0]]:
                nxt = int(allowed[0][0])  # the prefix tree leaves one way on
            if nxt is None:
                break
            more = [nxt, *self._tails.get(0, [])][:limit - len(tail)]
            tail += more
            ids = torch.cat([ids, torch.tensor([more], device=ids.device)], dim=1)
        return tail

    def resolve(self, keys: Sequence[Key]) -> None:
        """Answer queries with one ``kb.lookup_batch`` call and cache them."""
        self.answers.resolve(keys)

    # -- tables, built once per vocabulary size and device ---------------------------------------
    def _build(self, vocab_size: int, device: torch.device) -> None:
        tables = grammar_tables(self.tok.call_ids, self.stop_ids, self.logit_bias, vocab_size)
        self._tables = tuple(x.to(device) for x in tables)
        self._codes = torch.zeros(0, dtype=torch.long, device=device)

    def _position_codes(self, length: int) -> torch.Tensor:
        """``8 * (position + 1)`` for positions ``0..length-1`` (grown and kept on the device)."""
        if self._codes.shape[0] < length:
            n = max(length, 2 * self._codes.shape[0], 256)
            self._codes = 8 * torch.arange(1, n + 1, device=self._codes.device)
        return self._codes[:length]

    def outside_call(self, input_ids: torch.LongTensor) -> torch.BoolTensor:
        """``(batch_size,)``: whether each row of ``input_ids`` ``(batch_size, length)`` is outside a
        lookup call (no marker yet, or its last call closed by ``<|db_end|>``)."""
        if self._tables is None:
            raise RuntimeError("the processor has not seen a batch yet")
        kinds = self._tables[0][input_ids]  # (B, T) marker kind per token, 0: not a marker
        last = torch.where(kinds > 0, kinds + self._position_codes(input_ids.shape[1]), 0).amax(dim=1) % 8
        return (last == 0) | (last == 4)

    # -- one decoding step ------------------------------------------------------------------------
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tables = self._tables
        if tables is None or tables[1].shape[1] != scores.shape[1] or tables[1].device != scores.device:
            self._build(scores.shape[1], scores.device)
        _, ban, bias = self._tables
        if not self.use_db:
            return (scores + bias).masked_fill_(ban[NO_DB], NEG_INF)
        states, forced, allowed = self.plan(input_ids)
        if len(set(states)) == 1:
            mask = ban[states[0]]  # (vocab,), the same for every row
        else:
            mask = ban[torch.tensor(states, device=scores.device)]  # (B, vocab)
        scores = scores + bias if self.logit_bias is not None else scores.clone()  # ours to edit from here
        scores.masked_fill_(mask, NEG_INF)
        for b, ids in allowed.items():  # rows inside the prefix tree keep only its next tokens
            ids = ids.to(scores.device)
            keep = scores[b, ids]
            scores[b] = NEG_INF
            scores[b, ids] = keep
        if self.copy_bias:
            for b, t in self._copy_targets(input_ids).items():
                scores[b, t] += self.copy_bias
        if self.name_bias:
            for b, ts in self._name_targets(input_ids).items():
                scores[b, ts] += self.name_bias
        for b, t in forced.items():
            scores[b] = NEG_INF
            scores[b, t] = 0.0
        return scores

    def _copy_targets(self, input_ids: torch.LongTensor) -> dict[int, int]:
        """Rows that are stating an answered value after its ``<|db_end|>``: the value's next token.

        The text after a call states the value as the call's value field spells it (the field's ids
        are the text's, a leading space included), so while a row's tokens after ``<|db_end|>`` are a
        prefix of the value's, its next token is where the copy goes on. A miss (the fallback text) is
        never copied; a row that wrote something else has left the value, and is left alone.
        """
        rows, out = self._rows, {}
        T = input_ids.shape[1]
        for b, (pos, kind) in enumerate(zip(rows.last, rows.kind)):
            if kind != 4 or T - 1 - pos > 2 * self.max_field_tokens:
                continue
            value = rows.copies.get((b, pos))
            if value is None:
                value = rows.copies[(b, pos)] = self._answered_value(input_ids, b, pos)
            done = T - 1 - pos
            if done < len(value) and (done == 0 or input_ids[b, pos + 1:].tolist() == value[:done]):
                out[b] = value[done]
        return out

    def _name_targets(self, input_ids: torch.LongTensor) -> dict[int, list[int]]:
        """Rows writing a call's entity: the next token of each name (of a KB entity named in the
        text before the call) that the entity so far begins, or ``<|sep|>`` for a name written whole."""
        rows, out = self._rows, {}
        for b, (pos, kind) in enumerate(zip(rows.last, rows.kind)):
            if kind != 1:
                continue
            names = rows.names.get((b, pos))
            if names is None:
                names = rows.names[(b, pos)] = self.answers.names_before(input_ids[b].tolist(), pos)
            done = input_ids[b, pos + 1:].tolist()
            n = len(done)
            ts = {ids[n] if n < len(ids) else self.tok.sep_id for ids in names if ids[:n] == done}
            if ts:
                out[b] = sorted(ts)
        return out

    def _missed(self, input_ids: torch.LongTensor, b: int, end: int) -> bool:
        """Whether row ``b``'s call closed at ``end`` was one the KB found nothing for (a call the
        model closed itself, without ``<|db_retrieve|>``, is not a lookup)."""
        window = input_ids[b, max(end - 2 * self.max_field_tokens - 2, 0):end].tolist()
        if self.tok.retrieve_id not in window or self.tok.start_id not in window:
            return False
        ret = end - 1 - window[::-1].index(self.tok.retrieve_id)
        ans = self.answers.get(*self._query(input_ids, b, ret, self._rows.keys))
        return ans is not None and ans.match is None

    def _answered_value(self, input_ids: torch.LongTensor, b: int, end: int) -> list[int]:
        """The value ids of row ``b``'s call closed at ``end`` when the KB answered it, else ``[]``."""
        window = input_ids[b, max(end - 2 * self.max_field_tokens - 2, 0):end].tolist()
        if self.tok.retrieve_id not in window:
            return []
        ret = end - 1 - window[::-1].index(self.tok.retrieve_id)  # the call's last <|db_retrieve|>
        ans = self.answers.get(*self._query(input_ids, b, ret, self._rows.keys))
        return list(ans.continuation[:-1]) if ans is not None and ans.match is not None else []

    def _query(self, input_ids: torch.LongTensor, b: int, p: int,
               known: dict[tuple[int, int], tuple[Key, tuple[int, ...]]]) -> tuple[Key, tuple[int, ...]]:
        """Row ``b``'s query closed by ``<|db_retrieve|>`` at ``p`` and the context before its call,
        read once per call while the rows keep their order."""
        if (b, p) not in known:
            row = input_ids[b].tolist()
            known[(b, p)] = (query_key(row, p, self.tok, 2 * self.max_field_tokens + 2),
                             call_context(row, call_start(row, p, self.tok), self.tok))
        return known[(b, p)]

    def plan(self, input_ids: torch.LongTensor) -> Plan:
        """Each row's state, the token forced on rows that have one, and prefix-tree allowances.

        Depends on ``input_ids`` alone (and the answer cache and the KB), so rows may be reordered
        between steps. Rows in a value ask the KB here, all in one batch.
        """
        if self._tables is None:
            self._build(len(self.tok), input_ids.device)
        B, T = input_ids.shape
        rows = self._track(input_ids)
        self._tails = {}
        if self.constraint is not None:
            self.constraint.refresh()
        states: list[int] = []
        forced: dict[int, int] = {}
        allowed: dict[int, torch.Tensor] = {}
        values: list[tuple[int, int]] = []  # (row, position of <|db_retrieve|>)
        for b in range(B):
            pos, kind = rows.last[b], rows.kind[b]
            states.append(field_state(kind, pos, T, rows.calls[b], self.max_lookups))
            if kind == 4 and pos == T - 1 and states[-1] == OUTSIDE and self._missed(input_ids, b, pos):
                states[-1] = OUTSIDE_FULL  # after a lookup that found nothing the text goes on first
            if kind in (0, 4):
                if self.force_at is not None and self._start_due(b, B, T, rows.start[b]):
                    forced[b] = self.tok.start_id
            elif kind == 3:
                values.append((b, pos))
            else:
                ids = None
                if self.constraint is not None and rows.start[b] >= 0:
                    ids = self.constraint.next_tokens(input_ids[b, rows.start[b] + 1:].tolist())
                if ids is not None:
                    allowed[b] = ids  # the tree ends every path, so no field needs cutting
                elif T - 1 - pos >= self.max_field_tokens:
                    forced[b] = self.tok.sep_id if kind == 1 else self.tok.retrieve_id
        if values and not self.query_only:
            forced.update(self._value_tokens(input_ids, values, rows.keys))
        return Plan(states, forced, allowed)

    def _track(self, input_ids: torch.LongTensor) -> "_Rows":
        """Each row's last marker, last ``<|db_start|>`` and call count.

        Read from the new column alone while the rows only grew by one token since the last step
        (greedy decoding and sampling); scanned in full otherwise (the first step, beam reordering).
        """
        B, T = input_ids.shape
        rows = self._rows
        if rows is not None and rows.ids.shape == (B, T - 1) and torch.equal(input_ids[:, :-1], rows.ids):
            for b, kind in enumerate(self._tables[0][input_ids[:, -1]].tolist()):
                if kind:
                    rows.last[b], rows.kind[b] = T - 1, kind
                    if kind == 1:
                        rows.start[b] = T - 1
                        rows.calls[b] += T - 1 >= self.count_from
            rows.ids = input_ids
            return rows
        k = self._tables[0][input_ids]  # (B, T) marker kind per token
        codes = self._position_codes(T)
        last = torch.where(k > 0, k + codes, 0).amax(dim=1).tolist()  # 8 * (position + 1) + kind, 0: none
        start = (torch.where(k == 1, codes, 0).amax(dim=1) // 8 - 1).tolist()
        calls = (k[:, self.count_from:] == 1).sum(dim=1).tolist()
        self._rows = _Rows(input_ids, [c // 8 - 1 for c in last], [c % 8 for c in last], start, calls, {})
        return self._rows

    def _start_due(self, b: int, B: int, T: int, last_start: int) -> bool:
        """Whether row ``b`` owes a call: a ``force_at`` offset has passed with no call begun since."""
        offsets = self.force_at[b * len(self.force_at) // B]  # beams of one item share its offsets
        return call_due(offsets, T, self.count_from, last_start)

    # -- lookups --------------------------------------------------------------------------------
    def _value_tokens(self, input_ids: torch.LongTensor, rows: list[tuple[int, int]],
                      known: dict[tuple[int, int], tuple[Key, tuple[int, ...]]]) -> dict[int, int]:
        """The next forced token of each row in a value, answering new queries in one batch."""
        T = input_ids.shape[1]
        queries = [self._query(input_ids, b, p, known) for b, p in rows]
        keys, contexts = [q[0] for q in queries], [q[1] for q in queries]
        self.answers.resolve(keys, contexts)
        out = {}
        for (b, p), key, ctx in zip(rows, keys, contexts):
            cont, k = self.answers.get(key, ctx).continuation, T - 1 - p
            out[b] = cont[k] if k < len(cont) else self.tok.end_id
            self._tails[b] = list(cont[k + 1:])  # the continuation ends with <|db_end|>
        return out
