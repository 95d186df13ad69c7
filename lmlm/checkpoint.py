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

from .lookup import LookupTokens
from .tokens import LookupTokenizer

__all__ = ["META_FILE", "save_checkpoint", "load_checkpoint", "read_meta", "is_checkpoint"]

META_FILE = "lmlm.json"
FORMAT_VERSION = 1


def save_checkpoint(folder: str | Path, model, tokenizer: LookupTokenizer, meta: dict[str, Any] | None = None) -> Path:
    """Write ``model``, ``tokenizer`` and ``lmlm.json`` into ``folder`` (created if needed).

    Args:
        folder: output folder.
        model: a Hugging Face ``PreTrainedModel`` (unwrap it from DDP/Accelerate first).
        tokenizer: the :class:`LookupTokenizer` the model was trained with.
        meta: extra entries for ``lmlm.json`` (``mode``, ``train_config``, ``kb``, ``stats`` ...);
            ``lookup_tokens`` and ``format_version`` are filled in.

    Returns:
        the folder.
    """
    from transformers.utils import logging as hf_logging

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one small file: no "Writing model shards" bar
    try:
        model.save_pretrained(str(folder))
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tokenizer.save(folder)
    t = tokenizer.tokens
    record = {"format_version": FORMAT_VERSION, "mode": "lmlm", **(meta or {}),
              "lookup_tokens": {"start": t.start, "sep": t.sep, "retrieve": t.retrieve, "end": t.end}}
    (folder / META_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")
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


def load_checkpoint(folder: str | Path, device: str | None = None, dtype=None):
    """Load a checkpoint written by :func:`save_checkpoint`.

    Args:
        folder: the checkpoint folder.
        device: move the model there (default: CPU).
        dtype: load the weights in this dtype (default: as saved).

    Returns:
        ``(model, tokenizer, meta)``: the model in eval mode, a :class:`LookupTokenizer` with the
        checkpoint's lookup tokens, and the ``lmlm.json`` dict.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = read_meta(folder)
    tokens = LookupTokens(**meta["lookup_tokens"])
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    if device is not None:
        model = model.to(device)
    model.eval()
    tokenizer = LookupTokenizer(AutoTokenizer.from_pretrained(str(folder)), tokens)
    return model, tokenizer, meta
