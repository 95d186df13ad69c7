"""Model presets: the paper's GPT-2 and LLaMA-2 shapes and small CPU models, as data.

A preset is a row of ``MODEL_PRESETS``; :class:`ModelConfig` resolves it (``ModelConfig.from_name``)
and :func:`build_model` turns it into a plain Hugging Face ``GPT2LMHeadModel`` or
``LlamaForCausalLM``, so everything downstream (``generate``, ``save_pretrained``, Accelerate) is
stock Hugging Face. The vocabulary size is not part of a preset: it comes from the tokenizer (the
paper's GPT-2 tokenizer plus the four lookup tokens is 50,261; LLaMA-2's is 32,004).

Exercised by ``lmlm presets --json`` (the parameter table) and ``lmlm train``.

Examples:
    >>> cfg = ModelConfig.from_name("gpt2-124m")
    >>> count_parameters(cfg, vocab_size=50261)
    {'total': 124442880, 'non_embedding': 85842432}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, Mapping

__all__ = [
    "ModelConfig", "MODEL_PRESETS", "build_model", "count_parameters", "preset_table", "to_hf_config",
    "context_length", "max_positions", "cache_kwargs", "output_cache",
]

Family = Literal["gpt2", "llama"]

# Shapes from the paper's Table (appendix A.2, "Model Architecture and Training Details").
# ``paper_params`` is the paper's (total, non-embedding) count in millions, kept for comparison.
# Dropout: Hugging Face's default for each family on the paper presets (GPT-2 0.1, LLaMA 0.0);
# none on the CPU presets, whose short runs underfit and only pay for dropout in speed. The GPT-2
# presets use PyTorch's fused tanh GELU, the same function as GPT-2's "gelu_new" (to float rounding)
# in one kernel instead of six: 16 prompts of 512 tokens through GPT2-124M in bfloat16 on one CPU
# core take 3.5 s instead of 6.2 s, most of it the MLP's 3,072-wide activations.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # -- the paper's four ------------------------------------------------------------------------
    "gpt2-124m": dict(family="gpt2", hidden_size=768, n_layer=12, n_head=12, context_length=1024,
                      dropout=0.1, activation="gelu_pytorch_tanh", tokenizer="gpt2", paper_params=(124.4, 85.5)),
    "gpt2-355m": dict(family="gpt2", hidden_size=1024, n_layer=24, n_head=16, context_length=1024,
                      dropout=0.1, activation="gelu_pytorch_tanh", tokenizer="gpt2", paper_params=(354.8, 303.4)),
    "llama2-176m": dict(family="llama", hidden_size=512, n_layer=8, n_head=8, intermediate_size=11008,
                        context_length=1024, tie_embeddings=False, tokenizer="llama2",
                        paper_params=(176.4, 160.0)),
    "llama2-382m": dict(family="llama", hidden_size=768, n_layer=12, n_head=12, intermediate_size=11008,
                        context_length=1024, tie_embeddings=False, tokenizer="llama2",
                        paper_params=(381.8, 357.3)),
    # -- small CPU models: a BPE trained on the run's corpus ("bpe") ------------------------------
    "gpt2-tiny": dict(family="gpt2", hidden_size=64, n_layer=2, n_head=2, context_length=128,
                      dropout=0.0, activation="gelu_pytorch_tanh", tokenizer="bpe"),
    "gpt2-small-cpu": dict(family="gpt2", hidden_size=256, n_layer=4, n_head=4, context_length=256,
                           dropout=0.0, activation="gelu_pytorch_tanh", tokenizer="bpe"),
    "llama-tiny": dict(family="llama", hidden_size=64, n_layer=2, n_head=2, intermediate_size=176,
                       context_length=128, tie_embeddings=False, tokenizer="bpe"),
    "llama-small-cpu": dict(family="llama", hidden_size=256, n_layer=4, n_head=4, intermediate_size=688,
                            context_length=256, tie_embeddings=False, tokenizer="bpe"),
}


@dataclass
class ModelConfig:
    """One decoder-only architecture, independent of the vocabulary.

    Args:
        name: preset name (free text for custom configs).
        family: ``"gpt2"`` (learned positions, LayerNorm, GELU MLP) or ``"llama"`` (RoPE, RMSNorm,
            SwiGLU MLP).
        hidden_size, n_layer, n_head: width, depth, attention heads.
        intermediate_size: MLP width; ``None`` gives ``4 * hidden_size`` for GPT-2 and is required
            for LLaMA.
        n_kv_head: key/value heads (LLaMA only); ``None`` means ``n_head`` (no grouped-query attention).
        context_length: maximum positions.
        tie_embeddings: share the input embedding with the output head (GPT-2: yes; paper LLaMA: no).
        dropout: residual, embedding and attention dropout.
        activation: MLP activation as Hugging Face names it; ``None`` gives the family's own
            (GPT-2 ``gelu_new``, LLaMA ``silu``).
        norm_eps: LayerNorm/RMSNorm epsilon; ``None`` gives 1e-5 (the value of both original models).
        rope_theta: RoPE base (LLaMA only).
        tokenizer: the tokenizer the preset is meant for (``gpt2``, ``llama2`` or ``bpe``); used only
            to pair presets with tokenizers in :func:`preset_table`.
        paper_params: the paper's (total, non-embedding) parameter counts in millions, if any.
    """

    name: str
    family: Family
    hidden_size: int
    n_layer: int
    n_head: int
    intermediate_size: int | None = None
    n_kv_head: int | None = None
    context_length: int = 1024
    tie_embeddings: bool = True
    dropout: float = 0.0
    activation: str | None = None
    norm_eps: float | None = None
    rope_theta: float = 10000.0
    tokenizer: str = "bpe"
    paper_params: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.family not in ("gpt2", "llama"):
            raise ValueError(f"family must be 'gpt2' or 'llama', got {self.family!r}")
        for name in ("hidden_size", "n_layer", "n_head", "context_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.n_head:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by n_head {self.n_head}")
        if self.family == "llama" and self.intermediate_size is None:
            raise ValueError("intermediate_size is required for the llama family")
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {self.n_kv_head}")
        if self.activation is None:
            self.activation = "gelu_new" if self.family == "gpt2" else "silu"
        if self.norm_eps is None:
            self.norm_eps = 1e-5
        if self.paper_params is not None:
            self.paper_params = tuple(self.paper_params)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "ModelConfig":
        """A preset from ``MODEL_PRESETS``, with fields overridden by keyword."""
        if name not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known: {sorted(MODEL_PRESETS)}")
        return cls(name=name, **{**MODEL_PRESETS[name], **overrides})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def context_length(model_or_config) -> tuple[int | None, bool]:
    """The positions a Hugging Face model was built for, and whether they are a hard limit
    (learned absolute positions, GPT-2's ``n_positions``) or soft (rotary, LLaMA's
    ``max_position_embeddings``: longer runs, but past what the model was trained on)."""
    c = getattr(model_or_config, "config", model_or_config)
    if getattr(c, "n_positions", None):
        return int(c.n_positions), True
    n = getattr(c, "max_position_embeddings", None)
    return (int(n) if n else None), False


def max_positions(model_or_config, default: int = 2048) -> int:
    """:func:`context_length` as one number: the positions, or ``default`` when the config names none."""
    return context_length(model_or_config)[0] or default


def to_hf_config(config: ModelConfig, vocab_size: int, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, pad_token_id: int | None = None):
    """The Hugging Face ``GPT2Config`` / ``LlamaConfig`` for ``config`` and a vocabulary size."""
    from transformers import GPT2Config, LlamaConfig

    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    # explicit None: the families' defaults (GPT-2: 50256) are ids of their original vocabularies
    ids = dict(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    if config.family == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_positions=config.context_length, n_embd=config.hidden_size,
            n_layer=config.n_layer, n_head=config.n_head, n_inner=config.intermediate_size,
            activation_function=config.activation,
            resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.dropout,
            layer_norm_epsilon=config.norm_eps, tie_word_embeddings=config.tie_embeddings, **ids)
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head, hidden_act=config.activation,
        max_position_embeddings=config.context_length, rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta, attention_dropout=config.dropout,
        tie_word_embeddings=config.tie_embeddings, **ids)


def build_model(config: ModelConfig | str, vocab_size: int, tokenizer=None, *, seed: int | None = None,
                device: str | None = None, dtype=None):
    """Instantiate a freshly initialised Hugging Face causal LM for ``config``.

    Args:
        config: a :class:`ModelConfig` or a preset name.
        vocab_size: the tokenizer's size, lookup tokens included (``len(tokenizer)``).
        tokenizer: a ``LookupTokenizer``; if given, its document separator and eos ids become the
            config's bos/eos ids. No pad id is set: packed training has no padding, and the document
            separator inside every block would otherwise read as padding to Hugging Face.
        seed: seed ``torch`` before initialising (same weights on every process).
        device: where to create the weights (``"meta"`` allocates nothing).
        dtype: parameter dtype (float32 by default).

    Returns:
        ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` in training mode.
    """
    import torch
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    if isinstance(config, str):
        config = ModelConfig.from_name(config)
    ids = {}
    if tokenizer is not None:
        ids = dict(bos_token_id=tokenizer.doc_id, eos_token_id=tokenizer.eos_id)
    hf_config = to_hf_config(config, vocab_size, **ids)
    cls = GPT2LMHeadModel if config.family == "gpt2" else LlamaForCausalLM
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = cls(hf_config)
    if dtype is not None:
        model = model.to(dtype)
    return model


def count_parameters(config: ModelConfig | str, vocab_size: int) -> dict[str, int]:
    """Total and non-embedding parameter counts, from a model built on the ``meta`` device.

    Non-embedding is the total minus the input token embedding: positions (GPT-2) and an untied
    output head (LLaMA) count as non-embedding. This reproduces the paper's counts for GPT2-355M and
    both LLaMA models; for GPT2-124M it gives 85.8M where the paper prints 85.5M.
    """
    model = build_model(config, vocab_size, device="meta")
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    embedding = model.get_input_embeddings().weight.numel()
    return {"total": total, "non_embedding": total - embedding}


TOKENIZER_VOCAB = {"gpt2": 50257 + 4, "llama2": 32000 + 4, "bpe": 4096}
"""Vocabulary sizes with the four lookup tokens: the paper's GPT-2 and LLaMA-2 tokenizers, and the
size of the BPE the small presets train on their corpus (``lmlm presets`` counts with these)."""


def preset_table(tokenizers: Mapping[str, Any], presets: list[str] | None = None,
                 all_pairs: bool = False) -> list[dict[str, Any]]:
    """Rows of parameter counts, one per (preset, tokenizer) pair.

    Args:
        tokenizers: name -> ``LookupTokenizer`` or vocabulary size (e.g. ``{"gpt2": tok, "bpe": 8192}``).
        presets: preset names (default: all of ``MODEL_PRESETS``).
        all_pairs: pair every preset with every tokenizer; by default a preset is paired only with the
            tokenizer named as its ``tokenizer`` field and skipped if that one is not given.

    Returns:
        dicts with ``preset, family, tokenizer, vocab_size, hidden_size, n_layer, n_head,
        context_length, total, non_embedding, paper_total, paper_non_embedding`` (paper counts in
        parameters, ``None`` for non-paper presets).
    """
    rows = []
    for name in presets or list(MODEL_PRESETS):
        cfg = ModelConfig.from_name(name)
        names = list(tokenizers) if all_pairs else [n for n in tokenizers if n == cfg.tokenizer]
        for tok_name in names:
            tok = tokenizers[tok_name]
            vocab = tok if isinstance(tok, int) else len(tok)
            paper = cfg.paper_params
            rows.append(dict(
                preset=name, family=cfg.family, tokenizer=tok_name, vocab_size=vocab,
                hidden_size=cfg.hidden_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                context_length=cfg.context_length, **count_parameters(cfg, vocab),
                paper_total=round(paper[0] * 1e6) if paper else None,
                paper_non_embedding=round(paper[1] * 1e6) if paper else None))
    return rows


_CACHE_ARG: dict[type, str] = {}


def cache_kwargs(model, cache) -> dict[str, Any]:
    """``{name: cache}`` for a forward call of ``model``: newer ``transformers`` name the KV cache
    ``cache`` (``past_key_values`` is deprecated there), older ones only know ``past_key_values``."""
    cls = type(model)
    name = _CACHE_ARG.get(cls)
    if name is None:
        import inspect

        try:
            params = inspect.signature(cls.forward).parameters
        except (TypeError, ValueError):
            params = {}
        name = _CACHE_ARG[cls] = "cache" if "cache" in params else "past_key_values"
    return {name: cache}


def output_cache(out):
    """The KV cache a forward call returned, under either name."""
    cache = getattr(out, "cache", None) if not isinstance(out, tuple) else None
    return cache if cache is not None else out.past_key_values
