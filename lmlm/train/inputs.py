"""What a run starts from: its data (documents or shards), its tokenizer and its model.

The tokenizer comes, in this order, from the caller, the shards (their manifest names it), the
``init_from`` model, ``config.tokenizer``, or a byte-level BPE trained on the stripped documents
(saved in ``out_dir/tokenizer`` so a resumed run reuses it). The model is a fresh preset, an lmlm
checkpoint, or a pretrained causal LM grown by the four lookup tokens (:mod:`lmlm.train.start`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..models import max_positions
from ..tokens import LookupTokenizer
from .config import TrainConfig, TrainConfigError
from .data import Packed, as_segments, encode_documents, pack

__all__ = ["Inputs", "open_inputs", "DEFAULT_PRESET"]

DEFAULT_PRESET = "gpt2-small-cpu"
DEFAULT_SEQ_LEN = 256


@dataclass
class Inputs:
    model: Any
    tokenizer: LookupTokenizer
    data: Any  # Packed or ShardBlocks
    eval_data: Packed | None
    model_info: dict[str, Any]
    parameters: dict[str, int]
    summary: dict[str, Any] = field(default_factory=dict)
    seq_len: int = 0


def _source(spec: str | None, documents, name: str, skip_malformed: bool = False):
    """``("shards", folder, None)``, ``("documents", docs, malformed)`` or ``(None, None, None)`` for one data
    input; documents with a malformed lookup call are refused or left out (:func:`screen_documents`)."""
    from ..corpus import CorpusError, iter_located
    from ..data.shards import is_shards
    from .data import screen_documents

    if documents is not None:
        located = ((f"document {getattr(d, 'id', k)}", d) for k, d in enumerate(documents, 1))
    elif spec is None:
        return None, None, None
    elif is_shards(spec):
        return "shards", spec, None
    else:
        located = iter_located(spec)
    docs, malformed = screen_documents(located, skip_malformed)
    if spec is not None and documents is None and not malformed.total:
        raise CorpusError(f"{spec}: no documents")
    return "documents", docs, malformed


def open_inputs(config: TrainConfig, documents: Sequence | None, tokenizer: LookupTokenizer | None,
                eval_documents: Sequence | None, accelerator) -> Inputs:
    kind, data, malformed = _source(config.data, documents, "data", config.skip_malformed)
    if kind is None:
        raise TrainConfigError("nothing to train on: give data (--data FILE, a documents file or shards folder)")
    if kind == "documents" and not data:
        raise TrainConfigError("documents is empty: nothing to train on")
    eval_kind, eval_data, eval_malformed = _source(config.eval_data, eval_documents, "eval_data",
                                                   config.skip_malformed)
    for bad in (malformed, eval_malformed):
        if bad is not None and bad.documents and accelerator.is_main_process:
            print(f"warning: {bad.note()}", file=sys.stderr)
    shards_tok = None
    if kind == "shards":
        from ..data.shards import read_manifest, tokenizer_hash
        from ..tokens import load_tokenizer
        from ..lookup import LookupTokens

        manifest = read_manifest(data)
        if config.tokenizer and config.tokenizer.startswith("bpe:"):
            raise TrainConfigError(f"tokenizer {config.tokenizer!r}: {data} holds token shards, tokenized once with "
                                   f"their own tokenizer; train a new BPE on documents, or drop the tokenizer option")
        shards_tok = load_tokenizer(Path(data) / "tokenizer", LookupTokens(*manifest["lookup_tokens"]))
        if tokenizer is not None and tokenizer_hash(tokenizer) != manifest["tokenizer_hash"]:
            raise TrainConfigError(f"{data}: the shards were made with another tokenizer than the one given")
        tokenizer = tokenizer or shards_tok
    model, tokenizer, info = _model_and_tokenizer(config, tokenizer, data if kind == "documents" else None,
                                                  accelerator)
    if kind == "shards" and len(tokenizer) != len(shards_tok):
        raise TrainConfigError(f"{data}: shards of a {len(shards_tok)}-token vocabulary, but the model's tokenizer "
                               f"has {len(tokenizer)}: prepare the shards with the model's tokenizer")
    context = max_positions(model, default=1 << 30)
    if config.seq_len is None:
        config = config.replace(seq_len=min(DEFAULT_SEQ_LEN, context))
    if config.seq_len > context:
        raise TrainConfigError(f"seq_len {config.seq_len} exceeds the context length {context} of the model")
    if kind == "shards":
        from ..data.shards import ShardBlocks, read_manifest

        if config.packing != "stream":
            raise TrainConfigError(f"{data}: shards are packed as a stream when prepared; --packing document "
                                   "needs documents (--data FILE)")
        m = read_manifest(data)
        blocks = ShardBlocks(data, config.seq_len, config.mode)
        summary = {"data": str(data), "documents": m["documents"], **_calls(config.mode, m["lookup_calls"]),
                   "data_tokens": blocks.num_tokens, "data_trained_tokens": blocks.trained_tokens(),
                   "blocks": len(blocks), "mode": config.mode}
    else:
        docs = data
        n_docs, calls = _count_calls(docs)
        if config.mode == "lmlm" and calls == 0 and not config.allow_no_calls:
            where = config.data or "the documents"
            raise TrainConfigError(f"{where}: not one of its {n_docs} documents has a lookup call, so an LMLM trained "
                                   "on it learns no lookups; annotate it first (lmlm annotate ...), train "
                                   "--mode standard, or pass --allow-no-calls")
        progress = config.progress and accelerator.is_main_process
        blocks = pack(encode_documents(docs, tokenizer, config.mode, progress=progress), config.seq_len,
                      tokenizer.end_id, pad_id=tokenizer.eos_id, by_document=config.packing == "document")
        summary = {"data": config.data, "documents": n_docs, **_calls(config.mode, calls),
                   "data_tokens": int(blocks.num_tokens), "data_trained_tokens": blocks.trained_tokens(),
                   "blocks": len(blocks), "mode": config.mode}
        if malformed.documents:
            summary["documents_left_out_malformed"] = malformed.documents
    evald = None
    if eval_kind == "shards":
        from ..data.shards import ShardBlocks

        evald = ShardBlocks(eval_data, config.seq_len, config.mode).to_packed()
    elif eval_kind == "documents" and eval_data:
        evald = pack(encode_documents(eval_data, tokenizer, config.mode), config.seq_len, tokenizer.end_id,
                     pad_id=tokenizer.eos_id, by_document=config.packing == "document")
    return Inputs(model, tokenizer, blocks, evald, info, _parameters(model), summary, config.seq_len)


def _calls(mode: str, calls: int) -> dict[str, int]:
    """The summary's lookup calls: those trained; a Standard run trains none (the corpus's are stripped)."""
    return {"lookup_calls": calls} if mode == "lmlm" else {"lookup_calls": 0, "lookup_calls_stripped": calls}


def _count_calls(documents: Sequence) -> tuple[int, int]:
    from ..lookup import Lookup

    return len(documents), sum(sum(isinstance(s, Lookup) for s in as_segments(d)) for d in documents)


def _model_and_tokenizer(config: TrainConfig, tokenizer: LookupTokenizer | None, documents, accelerator):
    """The starting model and tokenizer, and what to record about the model."""
    import torch

    from ..checkpoint import is_checkpoint
    from ..models import ModelConfig, build_model

    if config.init_from:
        if is_checkpoint(config.init_from):
            from ..checkpoint import load_checkpoint

            model, own_tok, meta = load_checkpoint(config.init_from)
            if config.model and meta.get("model_preset") and config.model != meta["model_preset"]:
                raise TrainConfigError(f"init_from {config.init_from} holds a {meta['model_preset']!r} model, but "
                                       f"model {config.model!r} was asked for; leave model unset to continue it")
            model.train()
            tokenizer = tokenizer or (_tokenizer_from_spec(config.tokenizer) if config.tokenizer else own_tok)
            rows = model.get_input_embeddings().num_embeddings
            if len(tokenizer) != rows:
                raise TrainConfigError(f"init_from {config.init_from}: the model embeds {rows} tokens but the "
                                       f"tokenizer has {len(tokenizer)}; use the checkpoint's own tokenizer")
            info = {"init_from": {"kind": "checkpoint", "path": str(Path(config.init_from).resolve())},
                    "preset": meta.get("model_preset"), "hf": _hf_summary(model)}
            _set_attention(model, config.attention)
            return model, tokenizer, info
        from .start import add_lookup_embeddings, lookup_tokenizer, open_pretrained

        model, hf_tok, opened = open_pretrained(config.init_from, attention=config.attention)
        if tokenizer is None:
            tokenizer = _tokenizer_from_spec(config.tokenizer) if config.tokenizer else lookup_tokenizer(hf_tok)
        added = add_lookup_embeddings(model, tokenizer)
        model.train()
        return model, tokenizer, {"init_from": {**opened, "rows_added": added}, "hf": _hf_summary(model)}
    name = config.model or DEFAULT_PRESET
    try:
        model_config = ModelConfig.from_name(name, **config.model_overrides)
    except (ValueError, TypeError) as e:
        raise TrainConfigError(f"train config field 'model' = {name!r}: {e}") from None
    if tokenizer is None:
        tokenizer = _fresh_tokenizer(config, documents, accelerator)
    model = build_model(model_config, len(tokenizer), tokenizer, seed=config.seed)
    _set_attention(model, config.attention)
    del torch
    return model, tokenizer, {**model_config.to_dict(), "preset": name}


def _set_attention(model, attention: str) -> None:
    if hasattr(model, "set_attn_implementation") and model.config._attn_implementation != attention:
        model.set_attn_implementation(attention)


def _tokenizer_from_spec(spec: str) -> LookupTokenizer:
    from .start import StartError, is_local_spec, offline_smollm2
    from ..tokens import load_tokenizer

    if spec.endswith(".gguf") or spec.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct",
                                                   "huggingfacetb/smollm2-135m-instruct"):
        from transformers import AutoTokenizer

        from .start import lookup_tokenizer

        path = Path(spec) if spec.endswith(".gguf") else offline_smollm2()
        if path is None or not path.exists():
            raise TrainConfigError(f"tokenizer {spec}: no such file")
        return lookup_tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
    if is_local_spec(spec) and not Path(spec).exists():
        raise TrainConfigError(f"tokenizer {spec}: no such file or folder")
    try:
        return load_tokenizer(spec)
    except (OSError, ValueError, StartError) as e:
        raise TrainConfigError(f"tokenizer {spec}: cannot be loaded ({str(e).splitlines()[0]})") from None


def _fresh_tokenizer(config: TrainConfig, documents, accelerator) -> LookupTokenizer:
    """``config.tokenizer``, or a BPE trained once on the stripped documents (the main process trains it)."""
    from ..lookup import strip
    from ..tokens import train_bpe

    spec = config.tokenizer or "bpe:8192"
    if not spec.startswith("bpe:"):
        return _tokenizer_from_spec(spec)
    if documents is None:
        raise TrainConfigError("a BPE tokenizer is trained on documents: give documents, not shards, or a tokenizer")
    tok_dir = Path(config.out_dir) / "tokenizer"
    with accelerator.main_process_first():
        if accelerator.is_main_process and not (config.resume and (tok_dir / "tokenizer.json").exists()):
            tok = LookupTokenizer(train_bpe((strip(as_segments(d)) for d in documents), vocab_size=int(spec[4:])))
            tok.save(tok_dir)
            return tok
        from ..tokens import load_tokenizer

        return load_tokenizer(tok_dir)


def _hf_summary(model) -> dict[str, Any]:
    cfg = model.config
    return {"model_type": cfg.model_type, "hidden_size": getattr(cfg, "hidden_size", None) or cfg.n_embd,
            "n_layer": getattr(cfg, "num_hidden_layers", None) or cfg.n_layer,
            "vocab_size": model.get_input_embeddings().num_embeddings, "context_length": max_positions(model, default=1 << 30)}


def _parameters(model) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    return {"total": total, "non_embedding": total - model.get_input_embeddings().weight.numel()}
