"""One row's lookup grammar for a decoder that hands over one row at a time (vLLM's per-request
processors, :mod:`lmlm.generate.vllm_grammar`): the tables and states of :mod:`lmlm.generate.processor`,
applied without the Hugging Face engine's batch."""

from __future__ import annotations

import torch

from .processor import NEG_INF, NO_DB, OUTSIDE, OUTSIDE_FULL, call_due, field_state, grammar_tables, only_token

__all__ = ["RowGrammar"]


class RowGrammar:
    """One row's grammar for a decoder that hands over one row's ids and scores at a time (vLLM's
    per-request processors, :mod:`lmlm.generate.vllm_grammar`): the markers' bias, the ban of the
    row's state, an over-long field closed. No value is forced: the caller stops the row at
    ``<|db_retrieve|>`` and appends the answer. Reads the ids it has not seen yet at each step.

    Args (plain numbers and lists, so another process can build it):
        call_ids: the ids of ``<|db_start|>``, ``<|sep|>``, ``<|db_retrieve|>``, ``<|db_end|>``.
        stop_ids: ids that end a row (banned inside a field).
        logit_bias: four floats added to the markers' scores, or ``None``.
        max_lookups: calls the row may open in all; calls: those it has made before this request.
        max_field_tokens: longest entity or relation.
        use_db: ``False`` bans the four markers everywhere.
        force_at: offsets into the continuation where a call must begin (as the engine's
            ``force_lookup_at``: a call still open moves it to right after its end); ``origin``: the
            position of the continuation's first token in the row (the prompt's length).
        trie: a :class:`lmlm.generate.trie.TokenTrie` of ``entity <|sep|> relation <|db_retrieve|>``
            paths; a query inside it keeps to its next tokens (the engine's ``constrained=True``).
        copy_bias, copy: the engine's ``copy_bias`` for a request whose prompt ends with an answered
            call: ``copy`` is the value's ids, favoured while the output states it.
        name_bias, names: the engine's ``name_bias`` for a request whose prompt ends with
            ``<|db_start|>``: ``names`` holds the ids of each KB name the text before the call gives.
        missed: the request's prompt ends with a call the KB found nothing for: its first token is
            text (a call cannot follow that one at once, as the same call would, again and again).
    """

    def __init__(self, call_ids, stop_ids, logit_bias=None, max_lookups: int = 16, calls: int = 0,
                 max_field_tokens: int = 24, use_db: bool = True, force_at=None, origin: int = 0, trie=None,
                 copy_bias: float = 0.0, copy=None, name_bias: float = 0.0, names=None, missed: bool = False):
        self.call_ids, self.stop_ids, self.logit_bias = tuple(call_ids), tuple(stop_ids), logit_bias
        self.missed = missed
        self.max_lookups, self.max_field_tokens, self.use_db = max_lookups, max_field_tokens, use_db
        self.force_at, self.origin, self.trie = tuple(force_at or ()), origin, trie
        self.copy_bias, self.copy = float(copy_bias), list(copy or ())
        self.name_bias, self.names = float(name_bias), [list(n) for n in names or ()]
        self.calls, self.kind, self.pos, self.seen = calls, 0, -1, 0  # counted from the request's first output
        self.start = -1  # the position of the row's last <|db_start|>
        self._kinds = {i: k for k, i in enumerate(self.call_ids, 1)}
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def _read(self, ids, offset: int, count: bool) -> None:
        for j, t in enumerate(ids):
            k = self._kinds.get(t)
            if k:
                self.kind, self.pos = k, offset + j
                self.calls += count and k == 1
                if k == 1:
                    self.start = offset + j

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self._tables is None or self._tables[0].device != logits.device:
            _, ban, bias = grammar_tables(self.call_ids, self.stop_ids, self.logit_bias, logits.shape[-1])
            self._tables = (ban.to(logits.device), bias.to(logits.device))
            if self.seen == 0:
                self._read(prompt_ids, 0, count=False)
        ban, bias = self._tables
        n = len(prompt_ids)
        self._read(output_ids[self.seen:], n + self.seen, count=True)
        self.seen = len(output_ids)
        length = n + self.seen
        if not self.use_db:
            return (logits + bias).masked_fill_(ban[NO_DB], NEG_INF)
        state = field_state(self.kind, self.pos, length, self.calls, self.max_lookups)
        if self.missed and state == OUTSIDE and self.kind == 4 and self.pos == length - 1:
            state = OUTSIDE_FULL  # after a lookup that found nothing the text goes on: no call at once
        logits = (logits + bias).masked_fill_(ban[state], NEG_INF)
        if self.kind in (0, 4) and call_due(self.force_at, length, self.origin, self.start):
            return only_token(logits, self.call_ids[0])
        in_tree = False
        if self.kind in (1, 2) and self.trie is not None and self.start >= 0:
            row = (prompt_ids[self.start + 1:] if self.start + 1 < n else []) + output_ids[max(self.start + 1 - n, 0):]
            ids = self.trie.next_tokens(row)
            if ids is not None:  # the tree ends every path, so no field needs cutting
                ids, in_tree = ids.to(logits.device), True
                logits = torch.full_like(logits, NEG_INF).index_copy_(0, ids, logits[ids])
        done = output_ids[:self.seen]  # the request's prompt ends with the call or value the biases are about
        if self.copy_bias and self.kind == 4 and self.pos == n - 1 and len(done) < len(self.copy) \
                and done == self.copy[:len(done)] and len(done) <= 2 * self.max_field_tokens:
            logits[self.copy[len(done)]] += self.copy_bias
        if self.name_bias and self.kind == 1 and self.start == n - 1:
            ts = {ids[len(done)] if len(done) < len(ids) else self.call_ids[1] for ids in self.names
                  if ids[:len(done)] == done}
            logits[sorted(ts)] += self.name_bias  # none: nothing added
        if not in_tree and self.kind in (1, 2) and length - 1 - self.pos >= self.max_field_tokens:
            return only_token(logits, self.call_ids[self.kind])  # sep after the entity, retrieve after the relation
        return logits
