"""Linear layers with their weights laid out once for oneDNN, for inference on a CPU.

``torch.nn.functional.linear`` on a CPU hands each weight to its matrix library as it is stored, and
that library lays it out again for its kernels at every call (GPT-2's ``Conv1D``, which stores its
weight transposed, pays the most). :func:`pack_linears` keeps, beside each ``nn.Linear`` and
``Conv1D``, a copy in oneDNN's own layout (``torch.ops.mkldnn._reorder_linear_weight``) and runs
inference through ``torch.ops.mkldnn._linear_pointwise``, the path PyTorch's own compiler takes for a
frozen model on a CPU.

Measured by ``lmlm bench generate --preset paper`` (512 + 512 tokens, one core of a 2-core CPU with
AMX), which runs the engine without the packed weights beside it: in bfloat16 batch 1 decodes 1.59x
(GPT2-124M) and 1.49x (LLaMA2-176M) faster, batch 16 1.18x and 1.23x; in float32 batch 16 1.2x. In
float32 the BLAS is the faster for one or two rows and for long prompts, the laid-out weights for
4-64 rows, so only float32 products of 4 to 64 rows take the packed path, and only for a batch of
sequences: one sequence's steps of one token and of several (its forced tokens) would otherwise read
both copies of the weights, twice the bytes to keep in cache (batch 1 was 3-6% slower that way).
Greedy outputs are the same in float32; in bfloat16 the two paths can use different kernels (always
for ``Conv1D``), and a random model's near-flat logits then part at a rounding.

Anything under autograd, off the CPU or in another dtype goes through the layer's own ``forward``:
training never sees the copy. bfloat16 takes the packed path only where oneDNN has bfloat16 kernels
for this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; PyTorch is asked once, see :func:`packable_dtypes`):
on an AVX2-only CPU a bfloat16 model runs through its layers' own ``forward``, as if never packed.
A copy is made at the first inference call and again after its weight changes (an optimizer step,
``load_state_dict``, ``.to()``), so stale weights are never served. It costs the weights' size once
more in memory while the model lives.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["pack_linears", "packable_dtypes", "packed_copies", "packing", "packing_available"]

FLOAT32_ROWS = (4, 64)  # rows of a float32 product that take the packed path (see above)
_ENABLED: ContextVar[bool] = ContextVar("lmlm_packed_linears", default=True)
_PACKED: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


def packing_available(dtype: torch.dtype | None = None) -> bool:
    """Whether this PyTorch has oneDNN's linear ops (``False`` on builds without mkldnn) and, given a
    ``dtype``, whether weights of that dtype can take the packed path on this CPU."""
    return bool(packable_dtypes()) and (dtype is None or dtype in packable_dtypes())


@functools.cache
def packable_dtypes() -> frozenset[torch.dtype]:
    """The weight dtypes whose linear products oneDNN runs here: float32 wherever PyTorch has oneDNN's
    linear ops, bfloat16 only where oneDNN has bfloat16 kernels for this CPU, as PyTorch's own check
    says (``_is_mkldnn_bf16_supported``; it honours ``ONEDNN_MAX_CPU_ISA``). Asked once a process."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return frozenset()
    bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return frozenset({torch.float32} | ({torch.bfloat16} if bf16 is not None and bf16() else set()))


def pack_linears(model: torch.nn.Module) -> int:
    """Route the CPU inference calls of ``model``'s linear layers through weights laid out for oneDNN.

    Idempotent; returns how many layers take the packed path (0 where oneDNN is missing). The
    layers keep their parameters and their training behaviour.
    """
    if not packing_available():
        return 0
    from transformers.pytorch_utils import Conv1D

    n = 0
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, Conv1D)):
            if getattr(module.forward, "__func__", None) is not _forward:
                module.forward = types.MethodType(_forward, module)
            n += 1
    return n


def packed_copies(model: torch.nn.Module) -> int:
    """How many of ``model``'s layers hold a laid-out copy of their weight now, i.e. have run an
    inference call through the packed path since their weight last changed hands."""
    return sum(1 for m in model.modules() if m in _PACKED)


@contextmanager
def packing(enabled: bool = True) -> Iterator[None]:
    """Within the block (this thread or task), packed layers take the packed path only if ``enabled``:
    ``packing(False)`` runs them through their own ``forward``, as if never packed."""
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (not _ENABLED.get() or w.device.type != "cpu" or w.dtype not in packable_dtypes() or x.dtype != w.dtype
            or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
        return type(self).forward(self, x)
    if w.dtype == torch.float32 and (x.dim() > 2 and x.shape[0] == 1  # one sequence: keep one copy in cache
                                     or not FLOAT32_ROWS[0] <= x.numel() // max(x.shape[-1], 1) <= FLOAT32_ROWS[1]):
        return type(self).forward(self, x)
    key = (w.data_ptr(), w._version, w.dtype, tuple(w.shape))
    cached = _PACKED.get(self)
    if cached is None or cached[0] != key:
        dense = w if isinstance(self, torch.nn.Linear) else w.t()  # Conv1D stores (in, out)
        with torch.no_grad():
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(dense.detach().contiguous()))
        _PACKED[self] = cached
    bias = None if self.bias is None else self.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(x, cached[1], bias, "none", [], "")
