"""Training data: documents to token blocks, in memory or streamed from token shards.

Documents are tokenized into ids and roles (:mod:`lmlm.tokens`), concatenated in corpus order and
cut into blocks of ``seq_len`` tokens (the last one padded, its padding untrained). The labels are
the ids with value tokens and ``<|db_end|>`` set to -100. Two sources give the same blocks:
:class:`Packed` holds them in memory; :class:`lmlm.data.shards.ShardBlocks` reads them from
memory-mapped shards, so memory stays flat as the corpus grows. :class:`Batches` says which blocks
each optimizer step uses, as a pure function of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ..lookup import Segment, parse, strip
from ..tokens import IGNORE_INDEX, ORG, Encoded, LookupTokenizer, labels_from_roles

__all__ = ["Packed", "BlockSource", "Batches", "encode_documents", "pack", "as_segments", "shift_left"]


class BlockSource(Protocol):
    """Blocks of ``seq_len`` tokens: ``len`` blocks, and ``(input_ids, targets, target_roles)`` for some of them."""

    seq_len: int
    num_tokens: int

    def __len__(self) -> int: ...

    def blocks(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def trained_tokens(self) -> int: ...


def shift_left(t: torch.Tensor, fill: int) -> torch.Tensor:
    return torch.cat([t[:, 1:], torch.full_like(t[:, :1], fill)], dim=1)


@dataclass
class Packed:
    """Packed blocks, all ``(num_blocks, seq_len)``; labels are aligned with ids (not shifted).

    ``num_tokens`` counts the real tokens; the rest of the last block is padding (label -100).
    """

    input_ids: torch.Tensor
    roles: torch.Tensor
    labels: torch.Tensor
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_tokens is None:
            self.num_tokens = self.input_ids.numel()
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
        return (torch.arange(self.input_ids.numel()) < self.num_tokens).view_as(self.input_ids)

    def blocks(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, targets, target_roles)`` of blocks ``idx``, each ``(len(idx), seq_len)``."""
        if self._targets is None:
            self._targets = self.targets()
        targets, roles = self._targets
        return self.input_ids[idx], targets[idx], roles[idx]

    def trained_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


def as_segments(doc) -> list[Segment]:
    """A document's segments: from a :class:`lmlm.corpus.Document`, a segment list or annotated text."""
    if isinstance(doc, str):
        return parse(doc).segments
    segments = getattr(doc, "segments", None)
    return list(segments) if segments is not None else list(doc)


def encode_documents(documents: Sequence, tokenizer: LookupTokenizer, mode: str = "lmlm") -> list[Encoded]:
    """Tokenize documents with their calls (``lmlm``) or stripped (``standard``).

    Documents are :class:`lmlm.corpus.Document`, segment lists or annotated strings. Both modes
    give identical ``org`` tokens.
    """
    if mode not in ("lmlm", "standard"):
        raise ValueError(f"mode must be 'lmlm' or 'standard', got {mode!r}")
    out = []
    for doc in documents:
        segs = as_segments(doc)
        out.append(tokenizer.encode(segs) if mode == "lmlm" else tokenizer.encode_plain(strip(segs)))
    return out


def pack(encoded_docs: Sequence[Encoded], seq_len: int, end_id: int, pad_id: int | None = None,
         by_document: bool = False) -> Packed:
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

    Returns:
        :class:`Packed` with ``input_ids``, ``roles`` and ``labels`` of shape ``(num_blocks, seq_len)``.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if by_document:
        if pad_id is None:
            raise ValueError("packing by document needs a pad_id")
        parts = [pack([e], seq_len, end_id, pad_id) for e in encoded_docs]
        cat = (lambda name: torch.cat([getattr(p, name) for p in parts]) if parts else
               torch.empty(0, seq_len, dtype=torch.long))
        return Packed(cat("input_ids"), cat("roles"), cat("labels"), num_tokens=sum(p.num_tokens for p in parts))
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
