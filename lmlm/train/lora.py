"""Cheap continued training of a pretrained model: a LoRA adapter, frozen lower layers.

A pretrained model taught to look things up has to learn little: where to call, what to write in
the call, and to copy the answer. A LoRA adapter (Hu et al., 2021, through PEFT) trains low-rank
updates of every linear layer and leaves the weights themselves alone, so the backward pass computes
no weight gradients for them and the optimizer holds a few million numbers, not the model; the four
lookup tokens' embedding rows, which start as average tokens, are trained in full (PEFT's
``trainable_token_indices``, tied to the output head where the model ties them). Freezing the
lowest layers saves their weight gradients as well. :func:`merge` folds the adapter into the weights
before the checkpoint is saved: the result loads with ``AutoModelForCausalLM.from_pretrained`` like
any other model.

Exercised by ``lmlm train --init-from MODEL --lora 16 --freeze-layers 10`` and ``lmlm bench train``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .config import TrainConfigError

__all__ = ["add_lora", "lora_targets", "freeze_lower_layers", "merge", "trainable_parameters", "LoraError"]


class LoraError(TrainConfigError):
    """A model or setting the adapter cannot be fitted to; the message says which and why."""


def lora_targets(model) -> list[str]:
    """The linear layers LoRA adapts: attention and MLP projections of LLaMA- or GPT-2-style models."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    llama = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    found = [n for n in llama if n in names]
    if found:
        return found
    import transformers.pytorch_utils as pu

    conv = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, pu.Conv1D)}
    return sorted(conv & {"c_attn", "c_proj", "c_fc"}) or sorted(names - {"lm_head"})


def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's stack of transformer layers (LLaMA's ``model.layers``, GPT-2's ``transformer.h``)."""
    n = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise LoraError(f"{type(model).__name__}: no stack of {n} transformer layers found to freeze")


def _embedding_name(model) -> str:
    emb = model.get_input_embeddings()
    return next(name.rsplit(".", 1)[-1] for name, m in model.named_modules() if m is emb)


def add_lora(model, r: int = 32, alpha: int | None = None, dropout: float = 0.0, new_token_ids: Sequence[int] = (),
             freeze_layers: int = 0):
    """Wrap ``model`` in a PEFT LoRA adapter of rank ``r`` (scale ``alpha / r``; ``alpha`` None: ``2r``).

    The embedding rows of ``new_token_ids`` are trained as well; the lowest ``freeze_layers`` layers
    get no adapter. Everything else stays frozen.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise LoraError("LoRA needs peft: pip install peft (or 'lmlm[annotate-llm]')") from None
    if r <= 0:
        raise LoraError(f"LoRA rank must be positive, got {r}")
    depth = len(decoder_layers(model))
    if not 0 <= freeze_layers < depth:
        raise LoraError(f"freeze_layers {freeze_layers}: the model has {depth} layers; at most {depth - 1} "
                        f"can be frozen")
    extra: dict = {}
    if new_token_ids:
        extra["trainable_token_indices"] = {_embedding_name(model): sorted(set(int(i) for i in new_token_ids))}
    if freeze_layers:
        extra["layers_to_transform"] = list(range(freeze_layers, depth))
    import transformers.pytorch_utils as pu

    targets = lora_targets(model)
    conv = any(isinstance(m, pu.Conv1D) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules())
    config = LoraConfig(r=r, lora_alpha=alpha or 2 * r, lora_dropout=dropout, target_modules=targets,
                        fan_in_fan_out=conv, task_type="CAUSAL_LM", **extra)  # GPT-2's Conv1D stores W transposed
    peft_model = get_peft_model(model, config)
    for module in peft_model.modules():
        if type(module).__name__ == "TrainableTokensLayer" and isinstance(module.base_layer, torch.nn.Linear):
            _head_rows_only(module)
    return peft_model


def _head_rows_only(layer) -> None:
    """Let an output head whose new token rows train compute the gradient of those rows alone.

    PEFT's trainable-token layer writes the trained rows into a copy of the whole weight and multiplies
    by that, so the backward pass computes a gradient for every row of the vocabulary (for SmolLM2-135M a
    49,152 x 576 product a token, about a tenth of a LoRA step) and throws all but four away. Here the
    frozen weight gives every logit and the trained rows give theirs again: the same logits, the same
    gradients, no weight gradient for the frozen rows. Merged or disabled adapters go through PEFT's own path.
    """
    peft_forward = layer.forward_adapters

    def forward_adapters(x, active_adapters, *args, **kwargs):
        active = [a for a in active_adapters if a in layer.trainable_tokens_delta]
        base = layer.base_layer
        if layer.disable_adapters or layer.merged or not active or base.weight.requires_grad:
            return peft_forward(x, active_adapters, *args, **kwargs)
        layer._check_overlapping_tokens(active)
        out = torch.nn.functional.linear(x, base.weight, base.bias)
        for name in active:
            index = torch.tensor(layer.token_indices[name], device=out.device)
            rows = layer.trainable_tokens_delta[name].to(base.weight)
            bias = base.bias[index] if base.bias is not None else None
            out.index_copy_(-1, index, torch.nn.functional.linear(x, rows, bias))  # linear keeps no output for backward
        return out

    layer.forward_adapters = forward_adapters


def freeze_lower_layers(model, n: int) -> int:
    """Stop training the lowest ``n`` transformer layers of ``model`` (all their parameters); returns
    how many parameters were frozen. The embeddings and the layers above stay trainable."""
    layers = decoder_layers(model)
    if not 0 <= n < len(layers):
        raise LoraError(f"freeze_layers {n}: the model has {len(layers)} layers; at most {len(layers) - 1} "
                        f"can be frozen")
    frozen = 0
    for layer in list(layers)[:n]:
        for p in layer.parameters():
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


def merge(model):
    """``model`` with its LoRA adapter (and trained token rows) folded into the weights; a model
    without one is returned as it is."""
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        return model.merge_and_unload()
    return model


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
