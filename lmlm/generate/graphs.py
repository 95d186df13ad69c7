"""Decode steps replayed from a CUDA graph over a static KV cache, for the engine's loop on a GPU.

A decode step of the small models lookup decoding is run with costs a GPU little arithmetic and
many kernel launches: the Python of the model's modules and the launches, not the GPU, set the
pace. :class:`StaticDecoder` records the one-token forward once as a CUDA graph over a
Hugging Face ``StaticCache`` and replays it every step (one launch). Everything a step reads lives
in fixed buffers: the new token per row, its cache slot, its position, and an additive attention
mask over the cache's slots, so left padding and a lookup's forced value tokens (several tokens
fed in one eager forward) need no second graph.

The cache writes each step's keys at the slot its own counter points to (or at ``cache_position``
in older ``transformers``), so the buffers and that counter are kept in step: the graph is recorded
first and the cache is reset before every use.

Used by :func:`lmlm.generate.loop.decode` when the model is on a CUDA device
(``LookupGenerator(cuda_graphs=...)``); a model whose forward cannot be recorded falls back to the
eager loop with a warning. Measured by ``lmlm bench generate --device cuda``.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict

import torch

from ..models import cache_kwargs

__all__ = ["StaticDecoder", "static_decoder", "positions", "release"]

SLOT_ROUNDING = 256  # cache lengths are rounded up to a multiple of this, so graphs are reused
_KEEP = 4  # recorded decoders kept per model (least recently used dropped)
_DECODERS: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict]" = weakref.WeakKeyDictionary()
_FAILED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: real tokens count from 0, padding sits at 0 (as ``generate``)."""
    return (mask.long().cumsum(-1) - 1).clamp_(min=0)


def static_decoder(model, batch: int, length: int) -> "StaticDecoder | None":
    """A decoder for ``batch`` rows of up to ``length`` tokens (cached per model), its step recorded
    as a CUDA graph on a CUDA device (on a CPU the static cache alone, run eagerly: for tests), or
    ``None`` where the model's forward cannot be recorded (warned once per model)."""
    if model in _FAILED:
        return None
    length = -(-length // SLOT_ROUNDING) * SLOT_ROUNDING
    kept = _DECODERS.setdefault(model, OrderedDict())
    weights = next(model.parameters())
    key = (batch, length, str(weights.device), weights.dtype, weights.data_ptr())  # moved or cast: record again
    if key in kept:
        kept.move_to_end(key)
        return kept[key]
    try:
        decoder = StaticDecoder(model, batch, length, record=model.device.type == "cuda")
    except Exception as error:  # noqa: BLE001 -- any failure to record means: decode eagerly
        _FAILED.add(model)
        warnings.warn(f"CUDA graph decoding is off for this model ({type(error).__name__}: {error}); "
                      "decoding eagerly", RuntimeWarning, stacklevel=3)
        return None
    kept[key] = decoder
    release(model, keep=_KEEP)
    return decoder


def release(model, keep: int = 0) -> None:
    """Drop ``model``'s recorded decoders (and their caches) but the ``keep`` used last."""
    kept = _DECODERS.get(model)
    while kept and len(kept) > keep:
        kept.popitem(last=False)


class StaticDecoder:
    """Forward passes of ``model`` for ``batch`` rows over a static cache of ``length`` slots.

    Call :meth:`prefill` with the left-padded prompts, then :meth:`forward` with each step's new
    tokens; both return the last position's logits `(batch, vocab)`. The one-token forward is a
    CUDA graph replay (``record=True``, CUDA only); longer feeds run eagerly on the same cache.
    """

    def __init__(self, model, batch: int, length: int, record: bool = True):
        from transformers import StaticCache

        self.model, self.batch, self.length = model, batch, length
        device, dtype = model.device, model.dtype
        self.neg = torch.finfo(dtype).min
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.mask = torch.full((batch, 1, 1, length), self.neg, dtype=dtype, device=device)  # 0: attend
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.used = 0  # cache slots filled
        self.graph = None
        if record:
            self._record()

    def _record(self) -> None:
        device = self.model.device
        self.mask[..., 0] = 0  # recording reads slot 0 only
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(2):  # initialises the cache's buffers and the kernels' workspaces
                self._step()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.logits = self._step()

    def _step(self) -> torch.Tensor:
        out = self.model(input_ids=self.token, **cache_kwargs(self.model, self.cache), use_cache=True,
                         cache_position=self.slot,
                         position_ids=self.position, attention_mask=self.mask, logits_to_keep=1)
        return out.logits[:, -1]

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Start over with left-padded ``input_ids`` `(batch, width)` (``attention_mask`` 0 on padding)."""
        if input_ids.shape[0] != self.batch or input_ids.shape[1] > self.length:
            raise ValueError(f"{tuple(input_ids.shape)} does not fit a decoder of {self.batch} rows x {self.length}")
        self.cache.reset()
        self.mask.fill_(self.neg)
        self.used = 0
        real = attention_mask.bool()
        self.mask[:, 0, 0, :real.shape[1]].masked_fill_(real, 0)

        return self._eager(input_ids, positions(attention_mask))

    @torch.inference_mode()
    def forward(self, feed: torch.Tensor) -> torch.Tensor:
        """Append ``feed`` `(batch, n)` (every row real) and return the logits after its last token."""
        n = feed.shape[1]
        if self.used + n > self.length:
            raise ValueError(f"the cache holds {self.length} tokens; {self.used} used, {n} more asked")
        self.mask[..., self.used:self.used + n] = 0
        if n > 1 or self.graph is None:
            return self._eager(feed, self.position + torch.arange(1, n + 1, device=feed.device))
        self.token.copy_(feed)
        self.slot.fill_(self.used)
        self.position.add_(1)
        self.graph.replay()
        self.used += 1
        return self.logits

    def _eager(self, feed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``feed`` `(batch, n)` at slots ``used .. used + n - 1``: the slots' mask, causal among them."""
        n, start = feed.shape[1], self.used
        slots = torch.arange(self.length, device=feed.device)
        later = slots[None, :] > (start + torch.arange(n, device=feed.device))[:, None]  # (n, length)
        mask = self.mask.expand(-1, -1, n, -1).masked_fill(later, self.neg)
        out = self.model(input_ids=feed, **cache_kwargs(self.model, self.cache), use_cache=True,
                         cache_position=torch.arange(start, start + n, device=feed.device),
                         position_ids=positions, attention_mask=mask, logits_to_keep=1)
        self.used += n
        self.position.copy_(positions[:, -1:])
        return out.logits[:, -1]
