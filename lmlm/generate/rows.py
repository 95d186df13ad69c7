"""The lookup grammar, written once, per row: :class:`RowState` reads a row's call state off its ids
and edits that row's logits; :class:`Grammar` holds what every row shares (the marker ids, the
limits, the biases, the prefix tree) and the grammar's tables.

Both decoding backends run it: the Hugging Face processor (:class:`lmlm.generate.processor.
LookupLogitsProcessor`, used by ``model.generate`` and the engine's loop) keeps one ``RowState`` per
batch row and applies the markers' bias and the states' bans to the whole batch at once, and the
vLLM backend's per-request processor (:class:`RowGrammar`, run by :mod:`lmlm.generate.vllm_grammar`)
keeps one for its request. What a row's state cannot read off its ids (the answer to its last call,
the KB names the text before a call gives) its owner fills in: the processor from its answer cache
and the KB, the vLLM backend from the round before.

Exercised by ``lmlm generate`` (``--backend hf`` and ``--backend vllm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import torch

__all__ = ["RowState", "Grammar", "RowGrammar", "Step", "PAPER_LOGIT_BIAS", "grammar_tables", "field_state",
           "call_due"]

PAPER_LOGIT_BIAS = (5.0, 2.0, 2.0, 2.0)  # added to <|db_start|>, <|sep|>, <|db_retrieve|>, <|db_end|>

# Per-row decoding states. Each selects one row of the ban table; VALUE rows are forced instead.
OUTSIDE, OUTSIDE_FULL, ENTITY0, ENTITY, RELATION0, RELATION, VALUE, NO_DB = range(8)
NEG_INF = float("-inf")

IdsFrom = Callable[[int], list]  # position -> the row's ids from that position on


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


@dataclass
class Grammar:
    """What every row of a decoder shares: the markers, the limits, the biases and the prefix tree.

    Args:
        call_ids: the ids of ``<|db_start|>``, ``<|sep|>``, ``<|db_retrieve|>``, ``<|db_end|>``.
        stop_ids: ids that end a row (banned inside a field).
        logit_bias: four floats added to the markers' scores, or ``None``.
        max_lookups (defaults to 16): calls a row may open; max_field_tokens (24): longest entity or relation.
        use_db (defaults to `True`): ``False`` bans the four markers everywhere.
        trie: a prefix tree with ``next_tokens(ids) -> Tensor | None`` (:class:`lmlm.generate.trie.TokenTrie`)
            of ``entity <|sep|> relation <|db_retrieve|>`` paths; a query inside it keeps to its next tokens.
        copy_bias, name_bias (default 0): added to the first token of an answered value right after its
            call (a text that begins the value then finishes it), and to the next token of each KB name
            the text before a call gives while the call's entity spells it.
    """

    call_ids: tuple[int, int, int, int]
    stop_ids: tuple[int, ...]
    logit_bias: tuple[float, ...] | None = None
    max_lookups: int = 16
    max_field_tokens: int = 24
    use_db: bool = True
    trie: object = None
    copy_bias: float = 0.0
    name_bias: float = 0.0
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.kinds = dict(zip(self.call_ids, range(1, 5)))  # marker id -> kind (1 start ... 4 end)

    def tables(self, vocab_size: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`grammar_tables` for ``vocab_size`` on ``device``, built once for each."""
        key = (vocab_size, str(device))
        if key not in self._tables:
            tables = grammar_tables(self.call_ids, self.stop_ids, self.logit_bias, vocab_size)
            self._tables[key] = tuple(t.to(device) for t in tables)
        return self._tables[key]


class Step(NamedTuple):
    """One row's decisions for one step: its state (the row of the ban table), the token it is forced
    to (or ``None``) and the ids the prefix tree lets come next (or ``None``: any)."""

    state: int
    forced: int | None = None
    allowed: torch.Tensor | None = None


_PLAIN = [Step(state) for state in range(NO_DB + 1)]  # the steps that force and restrict nothing


@dataclass
class RowState:
    """One row's call state, read off its ids, and how it edits that row's logits.

    Positions are indices into the row's ids (prompt included). :meth:`see` takes each marker as the
    row grows; :meth:`plan` gives the step's :class:`Step`, and :meth:`edit` applies it to the row's
    logits after the markers' bias and the state's bans (:meth:`mask`, or the same done to a whole
    batch at once). ``value``, ``missed``, ``copy`` and ``names`` are what the row's owner knows about
    its last call (``None``: not known yet); :meth:`see` forgets them when a new marker comes.

    Args:
        grammar: the settings and tables the row shares with the others.
        force_at: offsets from ``origin`` (the continuation's first position) at which a call must begin
            (a call still open then moves it to right after its end).
        count_from: calls opened at or after this position count towards ``max_lookups``;
            calls: the count so far.

    Examples:
        >>> row = RowState(Grammar(tok.call_ids, (tok.eos_id, tok.doc_id), max_field_tokens=2))
        >>> ids = [tok.doc_id, *tok.encode_text("Ada was born in"), tok.start_id]
        >>> row.read(ids)
        >>> row.plan(len(ids), lambda p: ids[p:]).state == ENTITY0  # an entity cannot be empty
        True
        >>> ids += tok.encode_field("Ada Lovelace")[:2]
        >>> row.plan(len(ids), lambda p: ids[p:]).forced == tok.sep_id  # a field of two tokens is closed
        True
    """

    grammar: Grammar
    force_at: Sequence[int] = ()
    origin: int = 0
    count_from: int = 0
    calls: int = 0
    last: int = -1  # the last marker's position
    kind: int = 0  # its kind: 0 none, 1 start, 2 sep, 3 retrieve, 4 end
    start: int = -1  # the last <|db_start|>'s position
    value: Sequence[int] | None = None  # after <|db_retrieve|>: the ids forced there (the value, <|db_end|>)
    missed: bool | None = None  # after <|db_end|>: the call was a lookup the KB found nothing for
    copy: Sequence[int] | None = None  # after <|db_end|>: the answered value's ids ([]: none to copy)
    names: Sequence[Sequence[int]] | None = None  # after <|db_start|>: the ids of the KB names the text gives

    def see(self, kind: int, pos: int) -> None:
        """Take a marker of ``kind`` (1 start, 2 sep, 3 retrieve, 4 end) at ``pos``."""
        self.last, self.kind = pos, kind
        self.value = self.missed = self.copy = self.names = None
        if kind == 1:
            self.start = pos
            self.calls += pos >= self.count_from

    def read(self, ids: Sequence[int], offset: int = 0) -> None:
        """Take the markers among ``ids``, the row's ids from ``offset`` on."""
        kinds = self.grammar.kinds
        for j, t in enumerate(ids):
            k = kinds.get(t)
            if k:
                self.see(k, offset + j)

    def plan(self, length: int, ids_from: IdsFrom) -> Step:
        """The step of a row of ``length`` ids: its state (after a lookup the KB found nothing for, no
        call at once: the text goes on first), a call due at a ``force_at`` offset opened, the value
        (when known) forced after ``<|db_retrieve|>``, a query kept in the prefix tree, an over-long
        field closed. ``ids_from(p)``: the row's ids from position ``p`` on."""
        g, kind = self.grammar, self.kind
        if not g.use_db:
            return _PLAIN[NO_DB]
        if kind == 0 or kind == 4:
            state = field_state(kind, self.last, length, self.calls, g.max_lookups)
            if state == OUTSIDE and kind == 4 and self.missed and self.last == length - 1:
                state = OUTSIDE_FULL
            if self.force_at and call_due(self.force_at, length, self.origin, self.start):
                return Step(state, g.call_ids[0])
            return _PLAIN[state]
        if kind == 3:
            if self.value is None:
                return _PLAIN[VALUE]
            k = length - 1 - self.last
            return Step(VALUE, self.value[k] if k < len(self.value) else g.call_ids[3])
        state = field_state(kind, self.last, length, self.calls, g.max_lookups)
        if g.trie is not None and self.start >= 0:
            ids = g.trie.next_tokens(ids_from(self.start + 1))
            if ids is not None:  # the tree ends every path, so no field needs cutting
                return Step(state, None, ids)
        if length - 1 - self.last >= g.max_field_tokens:
            return Step(state, g.call_ids[kind])  # sep after the entity, retrieve after the relation
        return _PLAIN[state]

    def boosts(self) -> bool:
        """Whether :meth:`edit` may add a bias to this row (a value to copy, names to favour)."""
        g = self.grammar
        return bool((g.copy_bias and self.kind == 4 and self.copy) or (g.name_bias and self.kind == 1 and self.names))

    def mask(self, logits: torch.Tensor, step: Step) -> torch.Tensor:
        """``logits`` ``(vocab_size,)`` plus the markers' bias, with the step's state's bans: a new tensor."""
        _, ban, bias = self.grammar.tables(logits.shape[-1], logits.device)
        return (logits + bias).masked_fill_(ban[step.state], NEG_INF)

    def edit(self, logits: torch.Tensor, step: Step, length: int, ids_from: IdsFrom) -> torch.Tensor:
        """Edit this row's ``logits`` ``(vocab_size,)`` in place, after :meth:`mask`: kept to the prefix
        tree's next tokens, the copy and name biases added, a forced token made the only choice."""
        if step.state == NO_DB:
            return logits
        if step.forced is not None:
            logits.fill_(NEG_INF)
            logits[step.forced] = 0.0
            return logits
        if step.allowed is not None:
            ids = step.allowed.to(logits.device)
            keep = logits[ids]
            logits.fill_(NEG_INF)
            logits[ids] = keep
        g = self.grammar
        if g.copy_bias and self.kind == 4 and self.copy:
            done = length - 1 - self.last  # the text's tokens after <|db_end|>
            if done == 0:
                logits[self.copy[0]] += g.copy_bias
            elif done < min(len(self.copy), 2 * g.max_field_tokens + 1) and \
                    ids_from(self.last + 1) == list(self.copy[:done]):
                logits.fill_(NEG_INF)  # the text has begun the value: it finishes it
                logits[self.copy[done]] = 0.0
        if g.name_bias and self.kind == 1 and self.names:
            done = ids_from(self.last + 1)  # the entity so far
            n = len(done)
            ts = {ids[n] if n < len(ids) else g.call_ids[1] for ids in self.names if list(ids[:n]) == done}
            if ts:
                logits[sorted(ts)] += g.name_bias
        return logits


class RowGrammar:
    """vLLM's per-request processor (:mod:`lmlm.generate.vllm_grammar`): one :class:`RowState` over
    the request's prompt and output ids, read as they grow. No value is forced: the vLLM backend
    stops the row at ``<|db_retrieve|>`` and appends the answer itself.

    Args (plain numbers and lists, so another process can build it):
        call_ids, stop_ids, logit_bias, max_lookups, max_field_tokens, use_db, trie: as for :class:`Grammar`;
            calls: the calls the row made before this request (``max_lookups`` counts them too).
        force_at, origin: offsets into the continuation where a call must begin (the engine's
            ``force_lookup_at``) and the position of the continuation's first token in the row.
        copy_bias, copy: for a request whose prompt ends with an answered call: ``copy`` is the value's
            ids, favoured while the output states it.
        name_bias, names: for a request whose prompt ends with ``<|db_start|>``: ``names`` holds the
            ids of each KB name the text before the call gives.
        missed: the request's prompt ends with a call the KB found nothing for: its first token is
            text (a call cannot follow that one at once, as the same call would, again and again).
    """

    def __init__(self, call_ids, stop_ids, logit_bias=None, max_lookups: int = 16, calls: int = 0,
                 max_field_tokens: int = 24, use_db: bool = True, force_at=None, origin: int = 0, trie=None,
                 copy_bias: float = 0.0, copy=None, name_bias: float = 0.0, names=None, missed: bool = False):
        grammar = Grammar(tuple(call_ids), tuple(stop_ids), None if logit_bias is None else tuple(logit_bias),
                          max_lookups, max_field_tokens, use_db, trie, float(copy_bias), float(name_bias))
        self.row = RowState(grammar, tuple(force_at or ()), origin, calls=calls)
        self._facts = dict(missed=missed, copy=list(copy or ()), names=[list(n) for n in names or ()])
        self.seen = -1  # output ids read; -1: not even the prompt yet

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        row, n = self.row, len(prompt_ids)
        if self.seen < 0:
            row.count_from = n  # the prompt's calls are the caller's to count (``calls``)
            row.read(prompt_ids)
            if row.last == n - 1:  # what the caller said is about the call the prompt ends with
                row.missed, row.copy, row.names = (self._facts[k] for k in ("missed", "copy", "names"))
            self.seen = 0
        row.read(output_ids[self.seen:], n + self.seen)
        self.seen = len(output_ids)
        length = n + self.seen

        def ids_from(p: int) -> list[int]:
            return (prompt_ids[p:] if p < n else []) + output_ids[max(p - n, 0):]

        step = row.plan(length, ids_from)
        return row.edit(row.mask(logits, step), step, length, ids_from)
