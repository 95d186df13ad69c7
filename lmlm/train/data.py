"""Training data: documents to token blocks, in memory or streamed from token shards.

Documents are tokenized into ids and roles (:mod:`lmlm.tokens`), concatenated in corpus order and
cut into blocks of ``seq_len`` tokens (the last one padded, its padding untrained). The labels are
the ids with value tokens and ``<|db_end|>`` set to -100. Two sources give the same blocks:
:class:`Packed` holds them in memory; :class:`lmlm.data.shards.ShardBlocks` reads them from
memory-mapped shards, so memory stays flat as the corpus grows. :class:`Batches` says which blocks
each optimizer step uses, as a pure function of the step.

A document with a malformed lookup call is never trained as it stands (its marker text would become
lookup tokens outside a call, or the Standard baseline would read a broken call as text):
:func:`screen_documents` refuses it, naming ``FILE:LINE`` and the reason, or leaves it out and
counts it (``skip_malformed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

import torch

from ..lookup import PAPER_TOKENS, LookupProblem, LookupSyntaxError, LookupTokens, Segment, Text, parse, strip
from ..tokens import IGNORE_INDEX, ORG, Encoded, LookupTokenizer, labels_from_roles

__all__ = ["Packed", "BlockSource", "Batches", "encode_documents", "pack", "as_segments", "shift_left",
           "call_problems", "screen_documents", "Malformed", "MalformedCallError"]


class BlockSource(Protocol):
    """Blocks of ``seq_len`` tokens: ``len`` blocks, and ``(input_ids, targets, target_roles)`` for some of them."""

    seq_len: int
    num_tokens: int

    def __len__(self) -> int: ...

    def blocks(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def trained_tokens(self) -> int: ...

    def real_tokens(self, idx: torch.Tensor) -> int: ...

    def positions(self, idx: torch.Tensor) -> torch.Tensor | None: ...


def shift_left(t: torch.Tensor, fill: int) -> torch.Tensor:
    return torch.cat([t[:, 1:], torch.full_like(t[:, :1], fill)], dim=1)


@dataclass
class Packed:
    """Packed blocks, all ``(num_blocks, seq_len)``; labels are aligned with ids (not shifted).

    ``num_tokens`` counts the real tokens; ``lengths`` the real tokens of each block, which come first
    in it and are followed by padding (label -100): by default every block is full but the last, as
    a stream is cut; packed by document, each document's last block has padding of its own.
    ``position_ids``: where a block holds several documents (``pack(..., fit=True)``), each one's
    positions start again at 0, and the model keeps them apart from those positions (Hugging Face's
    packed-sequence attention mask); ``None``: every block counts its positions from 0.
    """

    input_ids: torch.Tensor
    roles: torch.Tensor
    labels: torch.Tensor
    num_tokens: int | None = None
    lengths: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.num_tokens is None:
            self.num_tokens = self.input_ids.numel()
        if self.lengths is None:
            n, L = self.input_ids.shape
            self.lengths = (self.num_tokens - torch.arange(n) * L).clamp(0, L)
        self._targets = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    def targets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token targets and their roles: labels/roles shifted left, last position -100."""
        return shift_left(self.labels, IGNORE_INDEX), shift_left(self.roles, ORG)

    def real(self) -> torch.Tensor:
        """``(num_blocks, seq_len)`` bool: True for data, False for padding."""
        return torch.arange(self.seq_len)[None, :] < self.lengths[:, None]

    def real_tokens(self, idx: torch.Tensor) -> int:
        """How many of the tokens of blocks ``idx`` are data, not padding."""
        return int(self.lengths[idx].sum())

    def blocks(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, targets, target_roles)`` of blocks ``idx``, each ``(len(idx), seq_len)``."""
        if self._targets is None:
            self._targets = self.targets()
        targets, roles = self._targets
        return self.input_ids[idx], targets[idx], roles[idx]

    def positions(self, idx: torch.Tensor) -> torch.Tensor | None:
        """The position ids of blocks ``idx`` where documents share a block, else ``None``."""
        return None if self.position_ids is None else self.position_ids[idx]

    def trained_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


def as_segments(doc) -> list[Segment]:
    """A document's segments: from a :class:`lmlm.corpus.Document`, a segment list or annotated text."""
    if isinstance(doc, str):
        return parse(doc).segments
    segments = getattr(doc, "segments", None)
    return list(segments) if segments is not None else list(doc)


def call_problems(doc, tokens: LookupTokens = PAPER_TOKENS) -> list[LookupProblem]:
    """The malformed lookup calls of a document (:func:`lmlm.lookup.parse`'s problems), or else a
    lookup token of ``tokens`` (the tokenizer's) left in its text. Empty for a document that can be
    trained as it is."""
    if isinstance(doc, str) or getattr(doc, "annotated", None) is not None:
        parsed = parse(doc if isinstance(doc, str) else doc.annotated)
        if parsed.problems:
            return parsed.problems
        segments = parsed.segments
    else:
        segments = as_segments(doc)
    problems, pos = [], 0
    markers = sorted({*tokens.as_list(), *PAPER_TOKENS.as_list()})
    for seg in segments:
        if isinstance(seg, Text):
            problems += [LookupProblem(pos + i, f"{m} outside a lookup call", seg.text[i:i + 80])
                         for m in markers if (i := seg.text.find(m)) >= 0]
            pos += len(seg.text)
    return problems


class MalformedCallError(LookupSyntaxError):
    """Documents with malformed lookup calls given to training: the first is named, with the way out."""

    def __init__(self, where: str, problem: LookupProblem, count: int | None = None, total: int | None = None,
                 skipping: bool = False):
        self.problem = problem
        if skipping:
            tail = f"all {total} documents have one: nothing is left to train on"
        else:
            many = "" if count is None else f"{count} of {total} documents {'have' if count > 1 else 'has'} one; "
            tail = (f"{many}a broken call would be trained as stray lookup tokens or text: fix or remove it, "
                    f"or pass --skip-malformed to leave those documents out")
        ValueError.__init__(self, f"{where}: malformed lookup call {problem} ({tail})")


@dataclass
class Malformed:
    """Documents left out for malformed lookup calls: how many, of how many, and the first one."""

    documents: int = 0
    total: int = 0
    first: tuple[str, LookupProblem] | None = None

    def add(self, where: str, problem: LookupProblem) -> None:
        self.documents += 1
        if self.first is None:
            self.first = (where, problem)

    def note(self) -> str:
        """One line for stderr: what was left out and the first such document."""
        where, problem = self.first
        return (f"left out {self.documents} of {self.total} documents with malformed lookup calls (the first: "
                f"{where}: {problem})")

    def error(self, skipping: bool = False, counted: bool = True) -> MalformedCallError:
        """The error naming the first document (``counted``: with how many there are of how many)."""
        if not counted:
            return MalformedCallError(*self.first)
        return MalformedCallError(*self.first, self.documents, self.total, skipping)


def screen_documents(located: Iterable[tuple[str, object]], skip_malformed: bool = False,
                     tokens: LookupTokens = PAPER_TOKENS) -> tuple[list, Malformed]:
    """The documents of ``(where, document)`` pairs that hold no malformed lookup call.

    Args:
        located: documents with where each was read (``FILE:LINE``, ``document 3``).
        skip_malformed: leave a document with a malformed call out (counted in the returned
            :class:`Malformed`) instead of raising :class:`MalformedCallError` for the first.
        tokens: the lookup token vocabulary of the tokenizer that will encode the documents.
    """
    kept, bad = [], Malformed()
    for where, doc in located:
        bad.total += 1
        problems = call_problems(doc, tokens)
        if problems:
            bad.add(where, problems[0])
        else:
            kept.append(doc)
    if bad.documents and not skip_malformed:
        raise bad.error()
    if bad.documents and not kept:
        raise bad.error(skipping=True)
    return kept, bad


def encode_documents(documents: Sequence, tokenizer: LookupTokenizer, mode: str = "lmlm",
                     progress: bool = False) -> list[Encoded]:
    """Tokenize documents with their calls (``lmlm``) or stripped (``standard``).

    Documents are :class:`lmlm.corpus.Document`, segment lists or annotated strings. Both modes
    give identical ``org`` tokens. A document with a malformed call raises
    :class:`MalformedCallError` (:func:`screen_documents` leaves such documents out first); so no
    lookup token reaches the ``org`` text, nor any Standard sequence. ``progress``: a progress bar.
    """
    from tqdm.auto import tqdm

    if mode not in ("lmlm", "standard"):
        raise ValueError(f"mode must be 'lmlm' or 'standard', got {mode!r}")
    out = []
    for k, doc in enumerate(tqdm(documents, desc="tokenize", unit="doc", disable=not progress, dynamic_ncols=True)):
        if problems := call_problems(doc, tokenizer.tokens):
            raise MalformedCallError(f"document {getattr(doc, 'id', k + 1)}", problems[0], 1, len(documents))
        segs = as_segments(doc)
        out.append(tokenizer.encode(segs) if mode == "lmlm" else tokenizer.encode_plain(strip(segs)))
    return out


def pack(encoded_docs: Sequence[Encoded], seq_len: int, end_id: int, pad_id: int | None = None,
         by_document: bool = False, fit: bool = False, eod_id: int | None = None) -> Packed:
    """Concatenate encoded documents in order and cut the stream into blocks of ``seq_len``.

    Args:
        encoded_docs: from :func:`encode_documents` (each starts with the document separator).
        seq_len: block length.
        end_id: the ``<|db_end|>`` id (masked in the labels together with value tokens).
        pad_id: pad the last partial block with this id (role ``org``, label -100) so no token is
            lost; ``None`` drops the partial block instead.
        by_document: start every document at a block of its own (its last block padded with
            ``pad_id``), as generation sees a prompt: nothing of another document before it. For
            corpora of short documents (bios, QA pairs); costs the padding.
        fit: as ``by_document``, without its padding: documents of up to ``seq_len`` tokens (and the
            last piece of a longer one) share blocks, placed whole by best fit, each one's positions
            starting at 0 (``Packed.position_ids``), so that attention keeps it apart from the
            others; the token that starts a document is not a target of the one before it.
        eod_id: with ``by_document`` or ``fit``, each document ends with this id (role ``org``, a
            target): where a document ends is learnt, as the stream teaches it through the next
            document's separator. Without it a model trained on short documents never learns to
            stop, and after the last fact it knows it writes another (the same call, again and again).

    Returns:
        :class:`Packed` with ``input_ids``, ``roles`` and ``labels`` of shape ``(num_blocks, seq_len)``.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if eod_id is not None and (fit or by_document):
        encoded_docs = [e + Encoded([eod_id], [ORG]) for e in encoded_docs]
    if fit:
        return _fit(encoded_docs, seq_len, end_id, pad_id)
    if by_document:
        if pad_id is None:
            raise ValueError("packing by document needs a pad_id")
        parts = [pack([e], seq_len, end_id, pad_id) for e in encoded_docs]
        cat = (lambda name: torch.cat([getattr(p, name) for p in parts]) if parts else
               torch.empty(0, seq_len, dtype=torch.long))
        lengths = torch.cat([p.lengths for p in parts]) if parts else torch.empty(0, dtype=torch.long)
        return Packed(cat("input_ids"), cat("roles"), cat("labels"), num_tokens=sum(p.num_tokens for p in parts),
                      lengths=lengths)
    ids = [t for e in encoded_docs for t in e.input_ids]
    roles = [r for e in encoded_docs for r in e.roles]
    labels = labels_from_roles(ids, roles, end_id)
    num_tokens, rest = len(ids), len(ids) % seq_len
    if rest and pad_id is not None:
        n_pad = seq_len - rest
        ids, roles, labels = ids + [pad_id] * n_pad, roles + [ORG] * n_pad, labels + [IGNORE_INDEX] * n_pad
    n = len(ids) // seq_len * seq_len

    def blocks(x):
        return torch.tensor(x[:n], dtype=torch.long).view(-1, seq_len)

    return Packed(blocks(ids), blocks(roles), blocks(labels), num_tokens=min(num_tokens, n))


def _fit(encoded_docs: Sequence[Encoded], seq_len: int, end_id: int, pad_id: int | None) -> Packed:
    """``pack(..., fit=True)``: whole blocks of long documents, then the short pieces by best fit."""
    import bisect

    if pad_id is None:
        raise ValueError("packing by document needs a pad_id")
    whole, pieces = [], []  # full blocks; (ids, roles, labels) of pieces shorter than a block
    for e in encoded_docs:
        labels = labels_from_roles(e.input_ids, e.roles, end_id)
        n = len(e.input_ids)
        for start in range(0, n, seq_len):
            part = (e.input_ids[start:start + seq_len], e.roles[start:start + seq_len], labels[start:start + seq_len])
            (whole if len(part[0]) == seq_len else pieces).append(part)
    bins: list[list] = []
    free: list[tuple[int, int]] = []  # (room left, bin) sorted: the tightest bin a piece fits is found by bisect
    for part in sorted(pieces, key=lambda p: -len(p[0])):  # longest first; a stable sort keeps corpus order
        k = bisect.bisect_left(free, (len(part[0]), -1))
        if k == len(free):
            bins.append([part])
            room, b = seq_len - len(part[0]), len(bins) - 1
        else:
            room, b = free.pop(k)
            bins[b].append(part)
            room -= len(part[0])
        if room:
            bisect.insort(free, (room, b))
    rows = [[part] for part in whole] + bins
    n_rows = len(rows)
    ids = torch.full((n_rows, seq_len), pad_id, dtype=torch.long)
    roles = torch.full((n_rows, seq_len), ORG, dtype=torch.long)
    labels = torch.full((n_rows, seq_len), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((n_rows, seq_len), dtype=torch.long)
    lengths = torch.zeros(n_rows, dtype=torch.long)
    for r, parts in enumerate(rows):
        at = 0
        for part_ids, part_roles, part_labels in parts:
            n = len(part_ids)
            ids[r, at:at + n] = torch.tensor(part_ids)
            roles[r, at:at + n] = torch.tensor(part_roles)
            labels[r, at:at + n] = torch.tensor(part_labels)
            labels[r, at] = IGNORE_INDEX  # a document's first token is not the previous document's target
            positions[r, at:at + n] = torch.arange(n)
            at += n
        positions[r, at:] = torch.arange(seq_len - at)  # the padding: a sequence of its own, untrained
        lengths[r] = at
    return Packed(ids, roles, labels, num_tokens=int(lengths.sum()), lengths=lengths, position_ids=positions)


class Batches:
    """Which blocks each optimizer step uses: a pure function of the step, so resuming skips exactly
    the consumed batches. Each epoch is a fresh permutation of the blocks seeded by ``seed + epoch``;
    the last incomplete global batch of an epoch is dropped."""

    def __init__(self, num_blocks: int, batch_size: int, seed: int):
        self.steps_per_epoch = num_blocks // batch_size
        self.num_blocks, self.batch_size, self.seed = num_blocks, batch_size, seed
        self._epoch, self._perm = -1, None

    def __call__(self, step: int) -> torch.Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.num_blocks, generator=g)
        return self._perm[i * self.batch_size:(i + 1) * self.batch_size]
