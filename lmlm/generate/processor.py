"""The lookup grammar as one Hugging Face ``LogitsProcessor``, so ``model.generate`` does the rest.

Each batch row is one :class:`lmlm.generate.rows.RowState` (the grammar of one row, which vLLM's
backend runs too), read off its ids alone (the last call marker and the tokens after it), so rows
may be reordered between steps as beam search does. The processor biases the four markers and bans
the markers that cannot come next for the whole batch at once, answers the rows' lookups in one KB
batch, and lets each row's state make the rest of its edits: over-long fields closed, the query
kept inside the KB's prefix tree, calls opened at given positions, the value and ``<|db_end|>``
forced after ``<|db_retrieve|>`` one token per step, the copy and name biases.

Exercised by ``lmlm generate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from transformers import LogitsProcessor

from ..tokens import LookupTokenizer
from .answers import Answer, Answerer, Key, call_context, call_start, query_key
from .rows import NEG_INF, NO_DB, PAPER_LOGIT_BIAS, Grammar, RowState, Step, call_due, field_state, grammar_tables

__all__ = ["LookupLogitsProcessor", "PAPER_LOGIT_BIAS", "Plan", "grammar_tables", "field_state", "call_due"]


class Plan(NamedTuple):
    """One step's decisions: a state per row, forced tokens and prefix-tree allowances by row."""

    states: list[int]
    forced: dict[int, int]
    allowed: dict[int, torch.Tensor]


@dataclass
class _Rows:
    """The batch as of the last step: the ids, each row's :class:`RowState`, and the queries read."""

    ids: torch.Tensor  # (B, T) the ids it describes
    rows: list[RowState]
    keys: dict[tuple[int, int], tuple[Key, tuple[int, ...]]]  # (row, <|db_retrieve|> pos) -> query, context


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
        copy_bias (`float`, defaults to 0): added, right after an answered call's ``<|db_end|>``, to the
            score of the value's first token; once the text has begun the value, its next tokens are
            the only choice until it is stated. 0 leaves the model alone. A small model may drift off
            a value it has never seen ("University of Port Jamesville" -> "... Port Emilyside").
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
        self.grammar = Grammar(tokenizer.call_ids, tuple(self.stop_ids), self.logit_bias, max_lookups, max_field_tokens,
                               use_db, constraint, self.copy_bias, self.name_bias)
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
        self._tables = self.grammar.tables(vocab_size, device)
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
        steps = self._steps(input_ids)
        states = [s.state for s in steps]
        if len(set(states)) == 1:
            mask = ban[states[0]]  # (vocab,), the same for every row
        else:
            mask = ban[torch.tensor(states, device=scores.device)]  # (B, vocab)
        scores = scores + bias if self.logit_bias is not None else scores.clone()  # ours to edit from here
        scores.masked_fill_(mask, NEG_INF)  # every row's bans at once; the rest is each row's own
        T, boosting = input_ids.shape[1], self.copy_bias or self.name_bias
        for b, (row, step) in enumerate(zip(self._rows.rows, steps)):
            if step.forced is not None or step.allowed is not None or (boosting and row.boosts()):
                row.edit(scores[b], step, T, lambda p, b=b: input_ids[b, p:].tolist())
        return scores

    def plan(self, input_ids: torch.LongTensor) -> Plan:
        """Each row's state, the token forced on rows that have one, and prefix-tree allowances.

        Depends on ``input_ids`` alone (and the answer cache and the KB), so rows may be reordered
        between steps. Rows in a value ask the KB here, all in one batch.
        """
        steps = self._steps(input_ids)
        return Plan([s.state for s in steps], {b: s.forced for b, s in enumerate(steps) if s.forced is not None},
                    {b: s.allowed for b, s in enumerate(steps) if s.allowed is not None})

    def _steps(self, input_ids: torch.LongTensor) -> list[Step]:
        """Each row's :class:`Step`, after telling its state what the KB said about its last call."""
        if self._tables is None:
            self._build(len(self.tok), input_ids.device)
        T = input_ids.shape[1]
        track = self._track(input_ids)
        self._tails = {}
        if self.constraint is not None:
            self.constraint.refresh()
        window = 2 * self.max_field_tokens
        steps: list[Step | None] = []
        asking = []  # rows just past <|db_retrieve|>, their value not read yet: planned once answered
        for b, row in enumerate(track.rows):
            kind = row.kind
            if kind == 3 and row.value is None and not self.query_only:
                asking.append(b)
                steps.append(None)
                continue
            if kind == 4:
                if row.missed is None and row.last == T - 1 and row.calls < self.max_lookups:
                    row.missed = self._missed(input_ids, b, row.last)
                if self.copy_bias and row.copy is None and T - 1 - row.last <= window:
                    row.copy = self._answered_value(input_ids, b, row.last)
            elif kind == 1 and self.name_bias and row.names is None:
                row.names = self.answers.names_before(input_ids[b].tolist(), row.last)
            elif kind == 3 and row.value is not None:
                self._tails[b] = list(row.value[T - row.last:])  # the value's rest and <|db_end|>
            steps.append(row.plan(T, lambda p, b=b: input_ids[b, p:].tolist()))
        if asking:
            self._answer(input_ids, asking, track)
            for b in asking:
                row = track.rows[b]
                self._tails[b] = list(row.value[T - row.last:])
                steps[b] = row.plan(T, lambda p, b=b: input_ids[b, p:].tolist())
        return steps

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
        """The value ids of row ``b``'s call closed at ``end`` when the KB answered it, else ``[]``.

        The text after a call states the value as the call's value field spells it (the field's ids
        are the text's, a leading space included), so the copy bias follows these ids. A miss (the
        fallback text) is never copied.
        """
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

    def _track(self, input_ids: torch.LongTensor) -> "_Rows":
        """Each row's state: its last marker, last ``<|db_start|>`` and call count.

        Read from the new column alone while the rows only grew by one token since the last step
        (greedy decoding and sampling); scanned in full otherwise (the first step, beam reordering).
        """
        B, T = input_ids.shape
        rows = self._rows
        if rows is not None and rows.ids.shape == (B, T - 1) and torch.equal(input_ids[:, :-1], rows.ids):
            for b, kind in enumerate(self._tables[0][input_ids[:, -1]].tolist()):
                if kind:
                    rows.rows[b].see(kind, T - 1)
            rows.ids = input_ids
            return rows
        k = self._tables[0][input_ids]  # (B, T) marker kind per token
        codes = self._position_codes(T)
        last = torch.where(k > 0, k + codes, 0).amax(dim=1).tolist()  # 8 * (position + 1) + kind, 0: none
        start = (torch.where(k == 1, codes, 0).amax(dim=1) // 8 - 1).tolist()
        calls = (k[:, self.count_from:] == 1).sum(dim=1).tolist()
        at = self.force_at
        self._rows = _Rows(input_ids, [
            RowState(self.grammar, () if at is None else at[b * len(at) // B],  # beams of one item share it
                     self.count_from, self.count_from, calls[b], last[b] // 8 - 1, last[b] % 8, start[b])
            for b in range(B)], {})
        return self._rows

    # -- lookups --------------------------------------------------------------------------------
    def _answer(self, input_ids: torch.LongTensor, asking: list[int], track: _Rows) -> None:
        """Give each row in ``asking`` (just past ``<|db_retrieve|>``) the ids its answer forces,
        answering new queries in one batch."""
        queries = [self._query(input_ids, b, track.rows[b].last, track.keys) for b in asking]
        keys, contexts = [q[0] for q in queries], [q[1] for q in queries]
        self.answers.resolve(keys, contexts)
        for b, key, ctx in zip(asking, keys, contexts):
            track.rows[b].value = self.answers.get(key, ctx).continuation  # ends with <|db_end|>
