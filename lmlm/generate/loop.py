"""The engine's own KV-cached decoding loop: one forward per step, forced tokens in the same forward.

Hugging Face ``generate`` pays a fixed cost per step (model-input preparation, cache and mask
bookkeeping, its stopping machinery) that dominates for the small models lookup decoding is often
run with. :func:`decode` is the loop nanochat's ``Engine`` uses instead: the model, its
KV cache, the logits processors and a per-row ``unfinished`` flag, nothing else. With one
row, the tokens the grammar forces after the one just chosen (a call due at a ``force_lookup_at``
offset, the only way on in the prefix tree, the value and ``<|db_end|>``) go through the model with
it in one forward instead of one step each: their logits would be thrown away (SGLang calls this
jump-forward decoding). The KV cache is allocated once for the whole continuation and filled in
place (:func:`growing_cache`): ``DynamicCache`` concatenates every layer's keys and values again at
every step, which at a 700-token context took GPT2-124M on a CPU about a third of its decode step
at batch 1 and two thirds at batch 16 (torch profiler).

:meth:`lmlm.generate.LookupGenerator.generate` takes this path for greedy decoding and sampling
(beam search and any extra ``model.generate`` keyword go through Hugging Face). Greedy outputs
equal ``model.generate``'s with the same processors (tested). Exercised by ``lmlm generate`` and
``lmlm bench generate``.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import torch
from transformers import DynamicCache, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from ..models import cache_kwargs
from .graphs import positions

__all__ = ["decode", "LOOP_KWARGS", "positions", "growing_cache"]

# model.generate keywords the loop handles itself; any other sends a call through Hugging Face
LOOP_KWARGS = frozenset({"do_sample", "repetition_penalty", "num_beams", "stopping_criteria", "streamer"})
# With CUDA graphs a forced tail shorter than this goes step by step: one eager forward of several
# tokens costs a small model about as much as a few one-token graph replays (an estimate, not tuned).
GRAPH_MIN_TAIL = 4

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers before cache layers: growing_cache falls back to DynamicCache
    DynamicLayer = None

GrowingLayer = None
if DynamicLayer is not None:

    class GrowingLayer(DynamicLayer):
        """One layer's keys and values in buffers of ``capacity`` positions `(batch, heads, capacity,
        head_dim)`: ``update`` writes the new positions in place and returns views of the filled part,
        the same tensors a ``DynamicLayer`` returns without copying the whole cache each step."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self.filled = 0

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.dtype, self.device = key_states.dtype, key_states.device
            b, h, _, d = key_states.shape
            self._keys = key_states.new_empty(b, h, self.capacity, d)
            self._values = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            self.filled = 0
            self.keys, self.values = self._keys[:, :, :0], self._values[:, :, :0]
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, end = self.filled, self.filled + key_states.shape[-2]
            if end > self.capacity:
                raise ValueError(f"the KV cache holds {self.capacity} positions; {end} asked")
            self._keys[:, :, start:end] = key_states
            self._values[:, :, start:end] = value_states
            self.filled = end
            self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
            return self.keys, self.values

        def reset(self) -> None:
            super().reset()
            self.filled = 0


@torch.inference_mode()
def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, processors: LogitsProcessorList,
           max_new_tokens: int | None, stop_ids: Sequence[int], pad_id: int, *, do_sample: bool = False,
           repetition_penalty: float = 1.0, stopping_criteria: StoppingCriteriaList | None = None,
           streamer=None, forced_tail=None, graphs: bool = False) -> torch.Tensor:
    """Continue left-padded ``input_ids`` `(batch_size, width)`; returns `(batch_size, width + new)`.

    Args:
        processors: applied in order to each step's `(batch_size, vocab_size)` scores.
        max_new_tokens: the most new tokens per row; ``None``: until every row has stopped (the
            processors must see to it), the cache growing as it goes (no static cache, no graphs).
        stop_ids: a row that produces one of these is finished; it is padded with ``pad_id`` after.
        repetition_penalty: Hugging Face's, applied before ``processors`` (as ``generate`` does).
        stopping_criteria: called with the ids and scores after each step; ``True`` finishes a row.
        streamer: receives the prompt, then each new token of every row `(batch_size,)` (``put``),
            then ``end()``.
        forced_tail: ``forced_tail(row, token, limit) -> list[int]``: up to ``limit`` tokens the
            grammar forces after ``token``, the one just chosen for that row (a call's opening, the
            only way on in the prefix tree, a value); with one row they are fed in the same forward.
        graphs: run the forwards over a static cache, the one-token step replayed from a CUDA graph
            on a CUDA device (:mod:`lmlm.generate.graphs`): the same tokens, one launch per step.
    """
    B = input_ids.shape[0]
    device = input_ids.device
    padded = bool((attention_mask == 0).any())
    procs = LogitsProcessorList(([RepetitionPenaltyLogitsProcessor(repetition_penalty)]
                                 if repetition_penalty != 1.0 else []) + list(processors))
    stops = torch.tensor(list(stop_ids) or [-1], device=device)
    unfinished = torch.ones(B, dtype=torch.bool, device=device)
    static = None
    if graphs and max_new_tokens is not None:
        from .graphs import static_decoder

        static = static_decoder(model, B, input_ids.shape[1] + max_new_tokens)
    if static is not None:
        cache = None
    else:
        cache = DynamicCache() if max_new_tokens is None else growing_cache(input_ids.shape[1] + max_new_tokens)
    ids, mask, feed = input_ids, attention_mask, input_ids
    if streamer is not None:
        streamer.put(input_ids.cpu())
    new, limit = 0, float("inf") if max_new_tokens is None else max_new_tokens
    while new < limit:
        if static is None:
            logits = _forward(model, feed, mask if padded else None, cache)  # (B, vocab)
        elif feed is input_ids:
            logits = static.prefill(input_ids, attention_mask)
        else:
            logits = static.forward(feed).clone()  # the graph's output buffer is rewritten next step
        scores = procs(ids, logits.float())
        if do_sample:
            nxt = _sample(scores)
        else:
            nxt = scores.argmax(dim=-1)
        nxt = torch.where(unfinished, nxt, pad_id)  # (B,)
        step = nxt[:, None]
        new += 1
        if B == 1 and forced_tail is not None and bool(unfinished[0]):
            room = int(min(limit - new, 1 << 30))
            tail = forced_tail(0, int(nxt[0]), room)[:room]
            if static is not None and static.graph is not None and len(tail) < GRAPH_MIN_TAIL:
                tail = []  # cheaper as graph replays; the processor forces the same tokens step by step
            if tail:
                step = torch.cat([step, torch.tensor([tail], device=device)], dim=1)
                new += len(tail)
        ids = torch.cat([ids, step], dim=1)
        if padded:
            mask = torch.cat([mask, torch.ones_like(step)], dim=1)
        if streamer is not None:  # one token per row per put, as generate does (forced tails too)
            for column in step.cpu().unbind(dim=1):
                streamer.put(column)
        unfinished &= ~torch.isin(step, stops).any(dim=1)
        if stopping_criteria:
            unfinished &= ~stopping_criteria(ids, scores)
        if not bool(unfinished.any()):
            break
        feed = step
    if streamer is not None:
        streamer.end()
    return ids


def _forward(model, feed: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
    """Last-position logits of ``feed`` after what ``cache`` holds; fills the cache."""
    kwargs = {}
    if mask is not None:  # left padding: positions count real tokens only, as in generate
        kwargs = dict(attention_mask=mask, position_ids=positions(mask)[:, -feed.shape[1]:])
    out = model(input_ids=feed, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1, **kwargs)
    return out.logits[:, -1]


def growing_cache(capacity: int):
    """A KV cache for up to ``capacity`` tokens per row, each layer's buffers allocated at its first
    update and filled in place (a ``DynamicCache`` of :class:`GrowingLayer`); a plain ``DynamicCache``
    where the installed ``transformers`` has no cache layers."""
    cache = DynamicCache()
    if GrowingLayer is not None and getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = partial(GrowingLayer, capacity)  # layers are made at their first update
    return cache


def _sample(scores: torch.Tensor) -> torch.Tensor:
    """One token per row from ``softmax(scores)``; a row whose scores overflowed (a temperature so
    small that the logits became infinite) takes its argmax, which is what that temperature means."""
    probs = torch.softmax(scores, dim=-1)
    bad = ~torch.isfinite(probs).all(dim=-1) | (probs.sum(dim=-1) <= 0)
    if bool(bad.any()):
        probs[bad] = torch.nn.functional.one_hot(scores[bad].nan_to_num(nan=-torch.inf).argmax(dim=-1),
                                                 probs.shape[-1]).to(probs.dtype)
    return torch.multinomial(probs, num_samples=1).squeeze(1)
