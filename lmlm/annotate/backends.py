"""LLM backends for seed annotation, behind one interface and chosen by a URL-like name.

======================================================  =============================================
``openai://HOST:PORT/v1?model=NAME``                    any OpenAI-compatible server over plain HTTP
``http(s)://HOST/v1?model=NAME``                        the same, with the scheme spelled out
``openai:MODEL``                                        api.openai.com
``hf:PATH_OR_NAME`` (``hf:/path/model.gguf``)           a local Hugging Face causal LM (chat template)
``vllm:NAME``                                           vLLM in this process (``pip install vllm``)
======================================================  =============================================

Query options after ``?``: ``model``, ``key_env`` (the environment variable holding the API key;
default ``LMLM_API_KEY``, then ``OPENAI_API_KEY``), ``timeout`` (seconds), ``retries``, ``rpm``
(requests per minute), ``concurrency`` (requests in flight), ``device``, ``dtype``, ``batch_size``,
``cache_as`` (a name the response cache keys answers under in place of the endpoint: a local server
started on whatever port is free, whose answers a rerun on another port should find).
A backend answers ``complete(prompts)`` where each prompt is a list of chat messages; HTTP calls
are retried (tenacity) with exponential backoff on timeouts, 429 and 5xx (``Retry-After`` honoured). Every
answer is cached in SQLite keyed by (backend, model, messages, parameters), so a re-run costs
nothing. Backends are registered by scheme with :func:`register_backend`, the built-in ones too.

Exercised by ``lmlm annotate seed --backend URL``.

Examples:
    >>> backend = get_backend("openai://127.0.0.1:8080/v1?model=smollm2", cache=False)
    >>> backend.model
    'smollm2'
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import parse_qsl, urlsplit

from ..errors import LmlmError

__all__ = ["Backend", "BackendError", "ResponseCache", "CachedBackend", "OpenAIBackend", "HFBackend",
           "VLLMBackend", "register_backend", "get_backend", "backend_schemes", "default_cache_path"]

Messages = list[dict[str, str]]
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class BackendError(LmlmError, RuntimeError):
    """A backend could not be created or did not answer (after its retries)."""


class Backend:
    """Chat completion for a batch of prompts. Subclasses set ``kind``, ``model`` and ``endpoint``."""

    kind = "base"
    model = ""
    endpoint = ""
    cache_as: str | None = None  # keys the response cache in place of the endpoint (the ``cache_as`` option)

    @property
    def cache_name(self) -> str:
        """What the response cache keys answers under, beside the model: the backend and its endpoint."""
        return f"{self.kind}:{self.cache_as or self.endpoint}"

    def complete(self, prompts: Sequence[Messages], *, max_tokens: int = 1024, temperature: float = 0.0,
                 **params: Any) -> list[str]:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections or weights."""


_REGISTRY: dict[str, Callable[[str, dict[str, str]], Backend]] = {}


def register_backend(*schemes: str):
    """Class or function decorator: ``factory(url, options) -> Backend`` serves these URL schemes."""
    def wrap(factory):
        for s in schemes:
            _REGISTRY[s] = factory
        return factory
    return wrap


def backend_schemes() -> list[str]:
    return sorted(_REGISTRY)


def _split(url: str) -> tuple[str, str, dict[str, str]]:
    """``scheme:rest?query`` -> (scheme, rest without query, options)."""
    if ":" not in url:
        raise BackendError(f"backend {url!r} has no scheme; known: {', '.join(backend_schemes())}")
    scheme, rest = url.split(":", 1)
    rest, _, query = rest.partition("?")
    return scheme.lower(), rest, dict(parse_qsl(query))


def get_backend(url: str | Backend, *, cache: str | Path | bool | None = None, **options: Any) -> Backend:
    """The backend named by ``url``, wrapped in the response cache.

    Args:
        url: a backend URL (table above) or a :class:`Backend` (returned as is, cache added).
        cache: a SQLite file, ``None`` for :func:`default_cache_path`, ``False`` for no cache.
        options: override the URL's query options (``model="x"``, ``rpm=60``).
    """
    if isinstance(url, Backend):
        backend = url
    else:
        scheme, _, query = _split(url)
        if scheme not in _REGISTRY:
            raise BackendError(f"unknown backend scheme {scheme!r} in {url!r}; known: {', '.join(backend_schemes())}")
        backend = _REGISTRY[scheme](url, {**query, **{k: str(v) for k, v in options.items()}})
    if cache is False or isinstance(backend, CachedBackend):
        return backend
    return CachedBackend(backend, ResponseCache(default_cache_path() if cache in (None, True) else cache))


def default_cache_path() -> Path:
    """``$LMLM_CACHE_DIR/annotate-cache.sqlite`` (default ``~/.cache/lmlm``)."""
    from ..pretrained import cache_root

    return cache_root() / "annotate-cache.sqlite"


# -- cache -----------------------------------------------------------------------------------------

class ResponseCache:
    """Answers on disk in SQLite, keyed by a hash of (backend, model, messages, parameters)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, backend TEXT, model TEXT, "
                         "request TEXT, response TEXT, created REAL)")
        self._db.commit()

    @staticmethod
    def key(backend: Backend, messages: Messages, params: dict[str, Any]) -> str:
        blob = json.dumps({"backend": backend.cache_name, "model": backend.model,
                           "messages": messages, "params": params}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, backend: Backend, messages: Messages, response: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                             (key, backend.cache_name, backend.model,
                              json.dumps(messages, ensure_ascii=False), response, time.time()))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()


class CachedBackend(Backend):
    """A backend whose answers are looked up in a :class:`ResponseCache` first; ``hits``/``misses`` count."""

    def __init__(self, inner: Backend, cache: ResponseCache):
        self.inner, self.cache = inner, cache
        self.kind, self.model, self.endpoint = inner.kind, inner.model, inner.endpoint
        self.hits = self.misses = 0

    def complete(self, prompts: Sequence[Messages], **params: Any) -> list[str]:
        keys = [ResponseCache.key(self.inner, list(p), params) for p in prompts]
        out = [self.cache.get(k) for k in keys]
        todo = [i for i, r in enumerate(out) if r is None]
        self.hits += len(prompts) - len(todo)
        self.misses += len(todo)
        if todo:
            answers = self.inner.complete([prompts[i] for i in todo], **params)
            for i, a in zip(todo, answers):
                self.cache.put(keys[i], self.inner, list(prompts[i]), a)
                out[i] = a
        return out

    def close(self) -> None:
        self.inner.close()
        self.cache.close()


# -- OpenAI-compatible HTTP ----------------------------------------------------------------------------

@dataclass
class RateLimiter:
    """At most ``rpm`` request starts per minute across threads (0: no limit)."""

    rpm: float = 0.0
    _next: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self) -> None:
        if self.rpm <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + 60.0 / self.rpm
        time.sleep(max(0.0, start - now))


@register_backend("openai", "http", "https")
class OpenAIBackend(Backend):
    """``POST {base}/chat/completions`` on any OpenAI-compatible server (vLLM, llama.cpp, hosted APIs).

    Args:
        url: ``openai://host:port/v1?model=...``, ``http(s)://host/v1?model=...`` or ``openai:MODEL``.
        options: ``model``, ``key_env``, ``timeout`` (120), ``retries`` (5), ``rpm`` (0: none),
            ``concurrency`` (4), ``backoff`` (first wait in seconds, 1.0), ``cache_as``.
    """

    kind = "openai"

    def __init__(self, url: str, options: dict[str, str]):
        import httpx

        scheme, rest, _ = _split(url)
        if scheme == "openai" and not rest.startswith("//"):
            base, model = "https://api.openai.com/v1", rest or options.get("model", "")
        else:
            parts = urlsplit(("http:" if scheme == "openai" else scheme + ":") + rest)
            base, model = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/"), options.get("model", "")
        if not model:
            raise BackendError(f"backend {url!r} names no model: add ?model=NAME")
        self.endpoint, self.model = base, options.get("model", model)
        self.cache_as = options.get("cache_as")
        key_env = options.get("key_env")
        key = os.environ.get(key_env) if key_env else (os.environ.get("LMLM_API_KEY") or os.environ.get("OPENAI_API_KEY"))
        if key_env and not key:
            raise BackendError(f"backend {url!r}: environment variable {key_env} is not set")
        self.retries, self.backoff = int(options.get("retries", 5)), float(options.get("backoff", 1.0))
        self.concurrency = max(1, int(options.get("concurrency", 4)))
        self.limiter = RateLimiter(float(options.get("rpm", 0)))
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=base, headers=headers, timeout=float(options.get("timeout", 120)))

    def complete(self, prompts: Sequence[Messages], *, max_tokens: int = 1024, temperature: float = 0.0,
                 **params: Any) -> list[str]:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature, **params}
        if len(prompts) <= 1 or self.concurrency == 1:
            return [self._one(list(p), body) for p in prompts]
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda p: self._one(list(p), body), prompts))

    def _one(self, messages: Messages, body: dict[str, Any]) -> str:
        import httpx
        from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

        def attempt() -> str:
            self.limiter.wait()
            try:
                r = self._client.post("/chat/completions", json={**body, "messages": messages})
            except (httpx.TimeoutException, httpx.TransportError) as e:
                raise _Retryable(f"{type(e).__name__}: {e}") from None
            if r.status_code == 200:
                return _message_text(r.json(), self.endpoint)
            if r.status_code not in _RETRY_STATUS:
                raise BackendError(f"{self.endpoint}/chat/completions answered {r.status_code}: {r.text[:300]}")
            raise _Retryable(f"HTTP {r.status_code}: {r.text[:200]}", _retry_after(r.headers.get("retry-after")))

        def wait(state) -> float:  # the server's Retry-After, else exponential backoff with jitter
            asked = getattr(state.outcome.exception(), "wait", None)
            if asked is not None:
                return asked
            return self.backoff * 2 ** (state.attempt_number - 1) * (0.5 + random.random())

        try:
            return Retrying(stop=stop_after_attempt(self.retries + 1), wait=wait,
                            retry=retry_if_exception_type(_Retryable), reraise=True)(attempt)
        except _Retryable as e:
            raise BackendError(f"{self.endpoint}: no answer after {self.retries + 1} attempts ({e})") from None

    def close(self) -> None:
        self._client.close()


class _Retryable(Exception):
    """A failed attempt worth repeating (timeout, connection error, 429, 5xx); ``wait``: the server's Retry-After."""

    def __init__(self, message: str, wait: float | None = None):
        super().__init__(message)
        self.wait = wait


def _retry_after(value: str | None) -> float | None:
    try:
        return min(60.0, max(0.0, float(value))) if value else None
    except ValueError:
        return None


def _message_text(payload: dict, where: str) -> str:
    try:
        return payload["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise BackendError(f"{where}: unexpected answer {json.dumps(payload)[:300]}") from None


# -- local models ---------------------------------------------------------------------------------------

def load_causal_lm(spec: str, device: str | None = None, dtype: str | None = None):
    """(model, tokenizer) from a Hugging Face folder, a hub name, or a ``.gguf`` file (dequantised)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(spec)
    kwargs: dict[str, Any] = {}
    if dtype:
        kwargs["dtype"] = getattr(torch, dtype)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise BackendError(f"no GGUF file at {path}")
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    else:
        tok = AutoTokenizer.from_pretrained(spec)
        model = AutoModelForCausalLM.from_pretrained(spec, **kwargs)
    from ..device import default_device

    return model.to(default_device(device)).eval(), tok


@register_backend("hf")
class HFBackend(Backend):
    """Greedy or sampled chat completion with a local ``transformers`` model (``hf:PATH_OR_NAME``)."""

    kind = "hf"

    def __init__(self, url: str, options: dict[str, str]):
        _, rest, _ = _split(url)
        if not rest:
            raise BackendError(f"backend {url!r} names no model: hf:PATH_OR_NAME")
        self.model = self.endpoint = rest
        self.batch_size = int(options.get("batch_size", 4))
        try:
            self._model, self._tok = load_causal_lm(rest, options.get("device"), options.get("dtype"))
        except OSError as e:  # no such folder, not a model, a hub name that is not one
            raise BackendError(f"backend {url!r}: cannot load a model from {rest}: {str(e).splitlines()[0]}") from e
        self._tok.padding_side = "left"
        if self._tok.pad_token is None:
            self._tok.pad_token = self._tok.eos_token

    def complete(self, prompts: Sequence[Messages], *, max_tokens: int = 1024, temperature: float = 0.0,
                 **params: Any) -> list[str]:
        import torch

        out = []
        for i in range(0, len(prompts), self.batch_size):
            texts = [self._tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True)
                     for p in prompts[i:i + self.batch_size]]
            batch = self._tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self._model.device)
            sample = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)
            with torch.no_grad():
                ids = self._model.generate(**batch, max_new_tokens=max_tokens, pad_token_id=self._tok.pad_token_id,
                                           **sample, **params)
            out += self._tok.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        return out


@register_backend("vllm")
class VLLMBackend(Backend):
    """vLLM in this process (``vllm:NAME``); GPU machines with ``pip install vllm``."""

    kind = "vllm"

    def __init__(self, url: str, options: dict[str, str]):
        try:
            from vllm import LLM
        except ImportError:
            raise BackendError("the vllm backend needs vLLM: pip install 'lmlm[vllm]' (on a GPU machine)") from None
        _, rest, _ = _split(url)
        self.model = self.endpoint = rest
        self._llm = LLM(model=rest, **({"dtype": options["dtype"]} if "dtype" in options else {}))

    def complete(self, prompts: Sequence[Messages], *, max_tokens: int = 1024, temperature: float = 0.0,
                 **params: Any) -> list[str]:
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, **params)
        return [o.outputs[0].text for o in self._llm.chat([list(p) for p in prompts], sp, use_tqdm=False)]
