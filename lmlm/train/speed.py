"""Training speed: FLOPs per token, the device's peak, and model FLOPs utilisation (MFU).

MFU = achieved model FLOPs per second / the device's peak dense FLOPs in the training precision.
Model FLOPs per token follow the PaLM paper (appendix B) and nanoGPT:

    6 * N  +  12 * n_layer * hidden_size * seq_len

where N counts the parameters that do matrix work for each token: every weight except the input
token and position embeddings, with the output head counted once (a tied head is the embedding
matrix, used as a matrix product). The factor 6 is 2 (multiply and add) for the forward pass and 4
for the backward; the second term is attention's two ``seq_len``-long matrix products per layer,
forward and backward, without the causal discount (as in PaLM). Activation recomputation is not
counted: it is work, but not model FLOPs.

Peak numbers are the vendors' dense (no sparsity) tensor-core figures per precision; a device
missing from :data:`PEAK_TFLOPS` gets no MFU (``None``) rather than a guess.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PEAK_TFLOPS", "flops_per_token", "peak_flops", "mfu", "matmul_parameters"]

# dense TFLOP/s by device name fragment (lower case) and precision: bf16/fp16 tensor cores; "fp32"
# is TF32 tensor-core math (what PyTorch uses for float32 matmuls with allow_tf32), else FP32.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "h200": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "h100 sxm": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "h100 80gb hbm3": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},  # the SXM part's name
    "h100 nvl": {"bf16": 835.5, "fp16": 835.5, "fp32": 417.8},
    "h100 pcie": {"bf16": 756.5, "fp16": 756.5, "fp32": 378.0},
    "h100": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "gh200": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "b200": {"bf16": 2250.0, "fp16": 2250.0, "fp32": 1100.0},
    "a100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "a10g": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},
    "l40s": {"bf16": 362.1, "fp16": 362.1, "fp32": 183.0},
    "l4": {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0},
    "rtx 4090": {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
    "rtx 3090": {"bf16": 71.0, "fp16": 71.0, "fp32": 35.6},
    "v100": {"fp16": 125.0, "fp32": 15.7},
    "t4": {"fp16": 65.0, "fp32": 8.1},
}


def matmul_parameters(model) -> int:
    """Parameters that do matrix work per token: all but the input token and position embeddings.

    A tied output head is the input embedding used as a matrix, so it counts once then.
    """
    params = {id(p): p.numel() for p in model.parameters()}
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb
    skip = 0 if tied else emb.numel()
    pos = getattr(getattr(model, "transformer", None), "wpe", None)  # GPT-2's learned positions
    if pos is not None:
        skip += pos.weight.numel()
    return sum(params.values()) - skip


def flops_per_token(model, seq_len: int) -> float:
    """Model FLOPs per trained token (forward + backward) at ``seq_len``: see the module docstring."""
    cfg = model.config
    n_layer = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    hidden = getattr(cfg, "hidden_size", None) or cfg.n_embd
    return 6.0 * matmul_parameters(model) + 12.0 * n_layer * hidden * seq_len


def peak_flops(device: Any, precision: str) -> float | None:
    """The dense peak FLOP/s of a CUDA ``device`` for ``precision`` (``bf16``, ``fp16``, ``no``), or None."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device).lower()
    key = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "fp32")
    for fragment, table in PEAK_TFLOPS.items():  # most specific first (dict order)
        if fragment in name and key in table:
            return table[key] * 1e12
    return None


def mfu(tokens_per_second: float, flops_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the peak is unknown."""
    if not peak:
        return None
    return tokens_per_second * flops_token / peak
