"""What a run starts from: its data (documents or shards), its tokenizer and its model.

The tokenizer comes, in this order, from the caller, the shards (their manifest names it), the
``init_from`` model, ``config.tokenizer``, or a byte-level BPE trained on the stripped documents
(saved in ``out_dir/tokenizer`` so a resumed run reuses it). The model is a fresh preset, an lmlm
checkpoint, or a pretrained causal LM grown by the four lookup tokens (:mod:`lmlm.pretrained`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..models import max_positions
from ..tokens import LookupTokenizer
from .config import TrainConfig, TrainConfigError
from .data import Packed, as_segments, encode_documents, pack

__all__ = ["Inputs", "open_inputs", "check_kb", "shards_tokenizer", "split_documents", "DEFAULT_PRESET"]

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
    trained_tokenizer: bool = False  # a BPE trained on the documents, saved in out_dir/tokenizer


def _source(spec: str | None, documents, split: str | None | bool = None, skip_malformed: bool = False):
    """``(kind, data, left_out, malformed)`` for one data input: kind ``"shards"`` (data: the folder),
    ``"documents"`` or ``None``; ``left_out``: the documents of other splits a file held, ``{split: count}``
    (see :func:`split_documents`; ``split=False`` keeps every split); ``malformed``: documents with a
    malformed lookup call, refused or left out (:func:`lmlm.train.data.screen_documents`)."""
    from ..corpus import CorpusError, iter_located
    from ..data.shards import is_shards
    from .data import screen_documents

    left: dict[str, int] = {}
    if documents is not None:
        located = [(f"document {getattr(d, 'id', k)}", d) for k, d in enumerate(documents, 1)]
    elif spec is None:
        return None, None, {}, None
    elif is_shards(spec):
        return "shards", spec, {}, None
    else:
        located = list(iter_located(spec))
        if not located:
            raise CorpusError(f"{spec}: no documents")
        if split is not False:
            kept, left = split_documents([d for _, d in located], split, spec)
            ids = set(map(id, kept))
            located = [(where, d) for where, d in located if id(d) in ids]
    docs, malformed = screen_documents(located, skip_malformed)
    return "documents", docs, left, malformed


def split_documents(docs: Sequence, split: str | None, where: str) -> tuple[list, dict[str, int]]:
    """The documents of ``split`` and how many of each other split were left out.

    ``split`` ``None`` or ``"train"``: the training documents, those of split ``train`` and those
    without a split (as :mod:`lmlm.pipeline` trains); any other name: the documents of that split.
    """
    wanted = {None, "train"} if split in (None, "train") else {split}
    kept = [d for d in docs if getattr(d, "split", None) in wanted]
    left: dict[str, int] = {}
    for d in docs:
        if getattr(d, "split", None) not in wanted:
            name = getattr(d, "split", None) or "(no split)"
            left[name] = left.get(name, 0) + 1
    if not kept:
        has = ", ".join(f"{k} ({n})" for k, n in sorted(left.items()))
        raise TrainConfigError(f"{where}: no documents of split {split or 'train'!r} (it has {has}); choose one "
                               "with --split")
    return kept, left


def open_inputs(config: TrainConfig, documents: Sequence | None, tokenizer: LookupTokenizer | None,
                eval_documents: Sequence | None, accelerator) -> Inputs:
    kind, data, left_out, malformed = _source(config.data, documents, config.split, config.skip_malformed)
    if kind is None:
        raise TrainConfigError("nothing to train on: give data (--data FILE, a documents file or shards folder)")
    if kind == "documents" and not data:
        raise TrainConfigError("documents is empty: nothing to train on")
    eval_kind, eval_data, _, eval_malformed = _source(config.eval_data, eval_documents, False,
                                                      config.skip_malformed)
    for bad in (malformed, eval_malformed):
        if bad is not None and bad.documents and accelerator.is_main_process:
            print(f"warning: {bad.note()}", file=sys.stderr)
    shards_manifest = None
    if kind == "shards":
        if config.tokenizer and config.tokenizer.startswith("bpe:"):
            raise TrainConfigError(f"tokenizer {config.tokenizer!r}: {data} holds token shards, tokenized once with "
                                   f"their own tokenizer; train a new BPE on documents, or drop the tokenizer option")
        if config.packing != "stream":
            raise TrainConfigError(f"{data}: shards are packed as a stream when prepared; --packing "
                                   f"{config.packing} needs documents (--data FILE)")
        shards_manifest, shards_tok = shards_tokenizer(data)
        _check_shards_split(data, shards_manifest, config.split)
        n_docs, calls = shards_manifest["documents"], shards_manifest["lookup_calls"]
        if tokenizer is None and not config.init_from and not config.tokenizer:
            tokenizer = shards_tok  # a fresh model: the shards' tokenizer; otherwise the model's, checked below
    else:
        n_docs, calls = _count_calls(data)
    if config.mode == "lmlm" and calls == 0 and not config.allow_no_calls:
        where = config.data or "the documents"
        raise TrainConfigError(f"{where}: not one of its {n_docs} documents has a lookup call, so an LMLM trained "
                               "on it learns no lookups; annotate it first (lmlm annotate ...), train "
                               "--mode standard, or pass --allow-no-calls")
    trained = tokenizer is None and not config.init_from and (config.tokenizer or "bpe:").startswith("bpe:")
    eval_manifest = shards_tokenizer(eval_data)[0] if eval_kind == "shards" else None

    def check(tok: LookupTokenizer) -> None:  # before a pretrained model is loaded and grown
        if kind == "shards":
            _check_same_tokenizer(tok, data, shards_manifest, "data")
        if eval_manifest is not None:
            _check_same_tokenizer(tok, eval_data, eval_manifest, "eval data")

    model, tokenizer, info = _model_and_tokenizer(config, tokenizer, data if kind == "documents" else None,
                                                  accelerator, check)
    context = max_positions(model, default=1 << 30)
    if config.seq_len is None:
        config = config.replace(seq_len=min(DEFAULT_SEQ_LEN, context))
    if config.seq_len > context:
        raise TrainConfigError(f"seq_len {config.seq_len} exceeds the context length {context} of the model")
    if kind == "shards":
        from ..data.shards import ShardBlocks

        blocks = ShardBlocks(data, config.seq_len, config.mode)
        summary = {"data": str(data), "split": shards_manifest["source"].get("split")}
    else:
        progress = config.progress and accelerator.is_main_process
        blocks = _pack(config, tokenizer, encode_documents(data, tokenizer, config.mode, progress=progress))
        summary = {"data": config.data, "split": config.split or "train"} if config.data else {"data": None}
    summary.update({"documents": n_docs, **_calls(config.mode, calls), "data_tokens": int(blocks.num_tokens),
                    "data_trained_tokens": blocks.trained_tokens(), "blocks": len(blocks), "mode": config.mode})
    if left_out:
        summary["left_out"] = left_out  # documents of other splits: {split: count}
    if malformed is not None and malformed.documents:
        summary["documents_left_out_malformed"] = malformed.documents
    evald = None
    if eval_kind == "shards":
        from ..data.shards import ShardBlocks

        evald = ShardBlocks(eval_data, config.seq_len, config.mode).to_packed()
    elif eval_kind == "documents" and eval_data:
        evald = _pack(config, tokenizer, encode_documents(eval_data, tokenizer, config.mode))
    return Inputs(model, tokenizer, blocks, evald, info, _parameters(model), summary, config.seq_len, trained)


def _pack(config: TrainConfig, tokenizer: LookupTokenizer, encoded) -> Packed:
    """``encoded`` documents packed as ``config.packing`` says, training and held-out data alike. Short
    documents packed whole (``fit``) end with the end token as a target (``pack``'s ``eod_id``);
    ``document`` packing, which the tiny presets use, keeps its documents without one."""
    return pack(encoded, config.seq_len, tokenizer.end_id, pad_id=tokenizer.eos_id,
                by_document=config.packing == "document", fit=config.packing == "fit",
                eod_id=tokenizer.eos_id if config.packing == "fit" else None)


def check_kb(kb: str | None) -> None:
    """Refuse a ``kb`` that is neither a KB folder, an authors' JSON database nor a URL (generation opens it)."""
    from ..kb.store import DB_FILENAME

    if kb is None or "://" in kb:
        return
    path = Path(kb)
    if (path.is_file() and path.suffix == ".json") or path.name == DB_FILENAME and path.is_file():
        return
    if path.is_dir() and (path / DB_FILENAME).is_file():
        return
    what = "no such file or folder" if not path.exists() else f"not a knowledge base (no {DB_FILENAME})"
    raise TrainConfigError(f"kb {kb}: {what}; give the KB folder the corpus was annotated against (lmlm kb build "
                           "makes one) or the authors' JSON database")


def shards_tokenizer(folder: str | Path) -> tuple[dict[str, Any], LookupTokenizer]:
    """A shards folder's manifest and its tokenizer (``SHARDS/tokenizer``), checked against the manifest's hash."""
    from ..data.shards import read_manifest, tokenizer_hash
    from ..lookup import LookupTokens
    from ..tokens import load_tokenizer

    manifest = read_manifest(folder)
    tok_dir = Path(folder) / "tokenizer"
    redo = f"prepare the shards again (lmlm data prepare ... --out {folder})"
    if not tok_dir.is_dir() or not any(tok_dir.iterdir()):
        raise TrainConfigError(f"{folder}: the shards' tokenizer folder {tok_dir} is missing; {redo}")
    try:
        tok = load_tokenizer(tok_dir, LookupTokens(*manifest["lookup_tokens"]))
    except (OSError, ValueError) as e:
        raise TrainConfigError(f"{folder}: the shards' tokenizer cannot be loaded ({str(e).splitlines()[0]}); "
                               f"{redo}") from None
    if tokenizer_hash(tok) != manifest["tokenizer_hash"]:
        raise TrainConfigError(f"{folder}: the tokenizer in {tok_dir} is not the one the shards were made with "
                               f"(hash {tokenizer_hash(tok)}, manifest {manifest['tokenizer_hash']}); {redo}")
    return manifest, tok


def _check_same_tokenizer(tokenizer: LookupTokenizer, folder: str, manifest: dict[str, Any], what: str) -> None:
    """Refuse shards made with another tokenizer than the model's (their ids would mean other tokens)."""
    from ..data.shards import tokenizer_hash

    if tokenizer_hash(tokenizer) != manifest["tokenizer_hash"]:
        raise TrainConfigError(f"{what} {folder}: the shards were made with another tokenizer (hash "
                               f"{manifest['tokenizer_hash']}) than the model's (hash {tokenizer_hash(tokenizer)}); "
                               f"prepare them with the model's tokenizer (lmlm data prepare ... --tokenizer MODEL)")


def _check_shards_split(folder: str, manifest: dict[str, Any], split: str | None) -> None:
    prepared = manifest["source"].get("split")
    if split is not None and split != prepared:
        raise TrainConfigError(f"split {split!r}: {folder} holds the documents of "
                               f"{'split ' + repr(prepared) if prepared else 'every split'}; prepare shards with "
                               f"lmlm data prepare --split {split}")


def _calls(mode: str, calls: int) -> dict[str, int]:
    """The summary's lookup calls: those trained; a Standard run trains none (the corpus's are stripped)."""
    return {"lookup_calls": calls} if mode == "lmlm" else {"lookup_calls": 0, "lookup_calls_stripped": calls}


def _count_calls(documents: Sequence) -> tuple[int, int]:
    from ..lookup import Lookup

    return len(documents), sum(sum(isinstance(s, Lookup) for s in as_segments(d)) for d in documents)


def _model_and_tokenizer(config: TrainConfig, tokenizer: LookupTokenizer | None, documents, accelerator,
                         check: Callable[[LookupTokenizer], None]):
    """The starting model and tokenizer, and what to record about the model; ``check`` refuses a tokenizer
    the data was not made with, as soon as the tokenizer is known."""
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
            tokenizer = tokenizer or (tokenizer_from_spec(config.tokenizer) if config.tokenizer else own_tok)
            check(tokenizer)
            rows = model.get_input_embeddings().num_embeddings
            if len(tokenizer) != rows:
                raise TrainConfigError(f"init_from {config.init_from}: the model embeds {rows} tokens but the "
                                       f"tokenizer has {len(tokenizer)}; use the checkpoint's own tokenizer")
            info = {"init_from": {"kind": "checkpoint", "path": str(Path(config.init_from).resolve())},
                    "preset": meta.get("model_preset"), "hf": _hf_summary(model)}
            _set_attention(model, config.attention)
            return model, tokenizer, info
        from ..pretrained import lookup_tokenizer, pretrained_tokenizer, start_pretrained

        if tokenizer is None and config.tokenizer:
            tokenizer = tokenizer_from_spec(config.tokenizer)
        elif tokenizer is None and (own := pretrained_tokenizer(config.init_from)) is not None:
            tokenizer = lookup_tokenizer(own)  # the model's own, with the lookup tokens
        given = tokenizer is not None
        if given:
            check(tokenizer)
        model, tokenizer, opened = start_pretrained(config.init_from, tokenizer, attention=config.attention)
        if not given:  # a GGUF file's, read with the model
            check(tokenizer)
        model.train()
        return model, tokenizer, {"init_from": opened, "hf": _hf_summary(model)}
    name = config.model or DEFAULT_PRESET
    try:
        model_config = ModelConfig.from_name(name, **config.model_overrides)
    except (ValueError, TypeError) as e:
        raise TrainConfigError(f"train config field 'model' = {name!r}: {e}") from None
    if tokenizer is None:
        tokenizer = _fresh_tokenizer(config, documents, accelerator)
    check(tokenizer)
    model = build_model(model_config, len(tokenizer), tokenizer, seed=config.seed)
    _set_attention(model, config.attention)
    del torch
    return model, tokenizer, {**model_config.to_dict(), "preset": name}


def _set_attention(model, attention: str) -> None:
    if hasattr(model, "set_attn_implementation") and model.config._attn_implementation != attention:
        model.set_attn_implementation(attention)


def tokenizer_from_spec(spec: str) -> LookupTokenizer:
    from ..pretrained import StartError, is_local_spec, offline_smollm2
    from ..tokens import load_tokenizer

    if spec.endswith(".gguf") or spec.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct",
                                                   "huggingfacetb/smollm2-135m-instruct"):
        from transformers import AutoTokenizer

        from ..pretrained import lookup_tokenizer

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
        return tokenizer_from_spec(spec)
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
