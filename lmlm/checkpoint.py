"""Checkpoints: a Hugging Face model folder plus ``lmlm.json``.

A checkpoint folder holds ``config.json`` and ``model.safetensors`` (``save_pretrained``), the
tokenizer files, and ``lmlm.json``: the lookup token names, the mode (``lmlm`` or ``standard``),
the resolved training recipe, the knowledge base the model was trained against (if any) and the
training statistics. ``AutoModelForCausalLM.from_pretrained(folder)`` loads the model alone;
:func:`load_checkpoint` loads all three pieces.

Written by ``lmlm train`` (``OUT_DIR/checkpoint``); read by ``lmlm generate`` and ``lmlm eval``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import LmlmError
from .jsonio import write_json
from .lookup import PAPER_TOKENS, TOKEN_VOCABULARIES, LookupTokens
from .tokens import LookupTokenizer

__all__ = ["META_FILE", "save_checkpoint", "open_model", "kb_of", "load_checkpoint", "read_meta", "is_checkpoint",
           "checkpoint_mode", "is_local_spec", "ModelOpenError"]


class ModelOpenError(LmlmError, ValueError):
    """A model that cannot be opened; the message names it and says why."""


def is_local_spec(spec: str | Path) -> bool:
    """True if ``spec`` can only mean a local path (it exists, starts like a path, names a file type, or
    lies in a folder that exists here: ``runs/checkpont``, a typo, is no hub name to wait on)."""
    spec = str(spec)
    return (Path(spec).exists() or spec.startswith(("/", "./", "../", "~")) or spec.endswith((".gguf", ".json"))
            or spec.count("/") > 1 or ("/" in spec and Path(spec).parent.is_dir()))

META_FILE = "lmlm.json"
FORMAT_VERSION = 1


def save_checkpoint(folder: str | Path, model, tokenizer: LookupTokenizer, meta: dict[str, Any] | None = None,
                    state_dict: dict | None = None) -> Path:
    """Write ``model``, ``tokenizer`` and ``lmlm.json`` into ``folder`` (created if needed).

    Args:
        folder: output folder.
        model: a Hugging Face ``PreTrainedModel`` (unwrap it from DDP/Accelerate first).
        tokenizer: the :class:`LookupTokenizer` the model was trained with.
        meta: extra entries for ``lmlm.json`` (``mode``, ``train_config``, ``kb``, ``stats`` ...);
            ``lookup_tokens`` and ``format_version`` are filled in.
        state_dict: the weights to write instead of ``model``'s own (a sharded model's gathered weights).

    Returns:
        the folder.
    """
    from transformers.utils import logging as hf_logging

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one small file: no "Writing model shards" bar
    try:
        model.save_pretrained(str(folder), **({"state_dict": state_dict} if state_dict is not None else {}))
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tokenizer.save(folder)
    t = tokenizer.tokens
    record = {"format_version": FORMAT_VERSION, "mode": "lmlm", **(meta or {}),
              "lookup_tokens": {"start": t.start, "sep": t.sep, "retrieve": t.retrieve, "end": t.end}}
    write_json(folder / META_FILE, record)
    return folder


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The ``lmlm.json`` of a checkpoint folder."""
    path = Path(folder) / META_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {folder} is not an lmlm checkpoint")
    return json.loads(path.read_text())


def is_checkpoint(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / META_FILE).exists() and (folder / "config.json").exists()


def checkpoint_mode(folder: str | Path) -> str:
    """``lmlm`` or ``standard``: what an lmlm checkpoint was trained as (``lmlm`` for any other model)."""
    return read_meta(folder).get("mode", "lmlm") if is_checkpoint(folder) else "lmlm"


def open_model(path: str | Path, tokens: str | LookupTokens | None = None, device: str | None = None, dtype=None,
               weights: bool = True):
    """Open a model and its :class:`LookupTokenizer`: the one opener of generate, eval, serve and the harness.

    Args:
        path: one of our checkpoints, a checkpoint in the authors' released layout (a plain Hugging
            Face folder whose tokenizer carries ``<|db_entity|>`` ...), any causal-LM folder, or a hub name.
        tokens: the lookup token vocabulary, by name (``paper``, ``released``) or as
            :class:`LookupTokens`; default: the checkpoint's ``lmlm.json``, else whichever
            vocabulary the tokenizer carries (``paper`` first).
        device, dtype: where and in which dtype to load the weights (default: CPU, as saved).
        weights: ``False`` opens the tokenizer and ``lmlm.json`` alone (the model is ``None``), for a
            backend that loads the weights itself (vLLM).

    Returns:
        ``(model, tokenizer, meta)``: the model in eval mode, the tokenizer, and the ``lmlm.json`` dict
        (empty for other folders).

    Raises:
        ModelOpenError: a local path that does not exist (never sent to a model hub), unreadable or
            truncated weights, or a tokenizer without the lookup tokens.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = str(path)
    if is_local_spec(where) and not Path(where).exists():
        raise ModelOpenError(f"{where}: no such model folder (a local path; nothing is fetched for it)")
    if Path(where).is_file():
        raise ModelOpenError(f"{where}: a model is a folder (config.json, weights, tokenizer), not a file")
    if Path(where).is_dir() and not (Path(where) / "config.json").exists():
        raise ModelOpenError(f"{where}: not a model folder (no config.json)")
    meta = read_meta(where) if is_checkpoint(where) else {}
    try:
        hf = AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise ModelOpenError(f"{where}: cannot open the tokenizer ({_first_line(e)})") from None
    if isinstance(tokens, str):
        tokens = LookupTokens.from_name(tokens)
    if tokens is None and meta.get("lookup_tokens"):
        tokens = LookupTokens(**meta["lookup_tokens"])
    if tokens is None:
        vocab = hf.get_vocab()
        tokens = next((t for t in TOKEN_VOCABULARIES.values() if all(x in vocab for x in t.as_list())), PAPER_TOKENS)
    missing = [t for t in tokens.as_list() if t not in hf.get_vocab()]
    if missing:
        raise ModelOpenError(f"{where}: its tokenizer has no {', '.join(missing)}: the model was not trained with "
                             "these lookup tokens (tokens='released' for the authors' checkpoints, 'paper' for ours)")
    if not weights:
        return None, LookupTokenizer(hf, tokens), meta
    kwargs = {"dtype": dtype} if dtype is not None else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
    except Exception as e:  # safetensors, torch and OS errors for truncated or foreign weight files
        if type(e).__name__ not in ("SafetensorError", "OSError", "ValueError", "RuntimeError", "EnvironmentError",
                                    "HeaderTooLarge", "UnpicklingError", "EOFError"):
            raise
        raise ModelOpenError(f"{where}: cannot read the model weights ({_first_line(e)})") from None
    if device is not None:
        model = model.to(device)
    tok = LookupTokenizer(hf, tokens)
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:
        raise ModelOpenError(f"{where}: the tokenizer has {len(tok)} tokens but the model embeds only {rows}")
    return model.eval(), tok, meta


def kb_of(meta: dict[str, Any], folder: str | Path) -> Path | str | None:
    """The KB a checkpoint names: a URL as is; a path absolute, or (older checkpoints) relative to the
    directory the run started in if it exists there, else to the checkpoint folder."""
    kb = meta.get("kb")
    if not kb or "://" in str(kb):
        return kb or None
    path = Path(kb)
    if path.is_absolute() or path.exists():
        return path
    for base in (Path(folder), Path(folder).parent, Path(folder).parent.parent):
        if (base / path).exists():
            return base / path
    return path


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_checkpoint(folder: str | Path, device: str | None = None, dtype=None):
    """Load a checkpoint: :func:`open_model` with the lookup tokens its ``lmlm.json`` names.

    Returns:
        ``(model, tokenizer, meta)``.
    """
    return open_model(folder, device=device, dtype=dtype)
