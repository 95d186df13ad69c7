"""What a decode step must read from memory, and how fast this machine reads it: the floor under
the decode steps ``lmlm bench generate --preset paper`` times.

A step that feeds one token per row reads every weight once (an embedding table only at the rows it
looks up, unless it is also the output layer) and every row's keys and values for its whole context.
No step takes less than those bytes over the rate at which the same threads stream memory
(:func:`stream_rate`, measured as a matrix-vector product over a buffer larger than the caches).
Batch 1 can beat its floor: its weights may stay in a large cache between steps, and it feeds a
call's forced tokens in one forward (:mod:`lmlm.generate.loop`). A batch reads its rows' keys and
values every step, so a long context puts a floor under the batched step that no kernel removes;
:func:`decode_floor` turns that into the fastest a batch could run beside a measured batch 1.

Examples:
    >>> weight, kv = weight_bytes_per_step(model), kv_bytes_per_token(model)  # doctest: +SKIP
    >>> floor = decode_floor(weight, kv, rows=16, context=767.5, rate=stream_rate(model.device))  # doctest: +SKIP
"""

from __future__ import annotations

import time

__all__ = ["kv_bytes_per_token", "weight_bytes_per_step", "stream_rate", "decode_floor"]


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one row's cache holds per position: measured from a real forward's cache."""
    import torch

    from ..models import output_cache

    with torch.inference_mode():
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.device), use_cache=True)
    cache = output_cache(out)
    if hasattr(cache, "layers"):
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    elif hasattr(cache, "key_cache"):
        tensors = [*cache.key_cache, *cache.value_cache]
    else:  # the legacy tuple of (keys, values) per layer
        tensors = [t for layer in cache for t in layer]
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_bytes_per_step(model) -> int:
    """Bytes of parameters a one-token step reads: all but the embedding tables it only indexes
    (an input embedding tied to the output layer is read whole)."""
    import torch

    out = model.get_output_embeddings()
    read_whole = {id(out.weight)} if out is not None else set()
    indexed = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - read_whole
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in indexed)


def stream_rate(device="cpu", mbytes: int = 512, repeats: int = 3) -> float:
    """Bytes per second the current threads read from memory: the best of ``repeats`` matrix-vector
    products over a ``mbytes`` float32 matrix (more than a CPU's last-level cache holds)."""
    import torch

    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    width = 1024
    matrix = torch.ones(mbytes * 2**20 // (4 * width), width, device=device)
    vector = torch.ones(width, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms up
        sync()
        t0 = time.perf_counter()
        torch.mv(matrix, vector)
        sync()
        best = min(best, time.perf_counter() - t0)
    return matrix.numel() * matrix.element_size() / best


def decode_floor(weight_bytes: int, kv_bytes: int, *, rows: int, context: float, rate: float) -> float:
    """Seconds a one-token step of ``rows`` rows at a mean ``context`` positions cannot go under: the
    weights once (``weight_bytes``, :func:`weight_bytes_per_step`) and every row's keys and values
    (``kv_bytes`` a position, :func:`kv_bytes_per_token`), at ``rate`` bytes per second."""
    if rows < 1 or context < 0 or rate <= 0:
        raise ValueError(f"rows >= 1, context >= 0 and rate > 0 needed; got {rows}, {context}, {rate}")
    return (weight_bytes + rows * context * kv_bytes) / rate
