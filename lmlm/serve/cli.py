"""``lmlm serve``: the HTTP server (:func:`lmlm.serve.create_app`) for a checkpoint and its KB."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..cli_errors import fail as _fail

console = Console(soft_wrap=True)  # piped output keeps one line per line (no wrap at 80)
err = Console(stderr=True, soft_wrap=True)


# -- serving ---------------------------------------------------------------------------------------

def serve_command(model: Optional[Path] = typer.Option(None, help="checkpoint folder"),
          kb: Optional[Path] = typer.Option(None, help="knowledge base folder (default: the checkpoint's)"),
          host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8000, min=0, max=65535),
          token: Optional[str] = typer.Option(None, envvar="LMLM_SERVE_TOKEN",
                                              help="bearer token for KB writes (default: a random one, printed)"),
          read_only: bool = typer.Option(False, help="refuse every KB write"),
          threshold: Optional[float] = typer.Option(None, help="a lookup's minimum similarity: of the relation "
                                                  "under entity-aware matching (default 0.5), of the key under "
                                                  "--matching key (0.6)"),
          max_new_tokens: int = typer.Option(256, min=1, help="most tokens one request may generate"),
          max_concurrent: int = typer.Option(64, min=1, help="generation requests in flight; more get 429"),
          max_batch: int = typer.Option(32, min=1, help="most prompts decoded together"),
          device: Optional[str] = typer.Option(None, help="cpu, cuda, ... (default: cuda when available)"),
          threads: Optional[int] = typer.Option(None, min=1,
                                                help="torch CPU threads (default: one less than the cores)"),
          log_level: str = typer.Option("info", help="uvicorn's: warning hides the access log"),
          copy_bias: float = typer.Option(5.0, min=0.0, help="as lmlm generate --copy-bias, for every request "
                                          "(0: the paper's decoding)"),
          name_bias: float = typer.Option(10.0, min=0.0, help="as lmlm generate --name-bias, for every request "
                                          "(0: the paper's decoding)"),
          matching: Optional[str] = typer.Option(None, help="KB lookup, for generation and /api/kb/lookup: 'entity' "
                                                 "(entity first, then relation) or 'key' (the paper's single-key "
                                                 "cosine); default: the KB's"),
          constrained: bool = typer.Option(False, help="as lmlm generate --constrained, for every request: write "
                                           "only queries the KB holds (follows the KB's writes)"),
          max_lookups: int = typer.Option(16, min=0, help="lookups per continuation; a request's max_lookups "
                                          "replaces it"),
          demo: Optional[Path] = typer.Option(None, help="train a tiny demo model and KB in this folder and serve "
                                                         "them (seconds on a CPU)")):
    """Serve generation with lookup traces, KB endpoints and a web page (API docs at /docs)."""
    import secrets

    from ..cli_errors import check_device

    check_device(device)
    if log_level.lower() not in ("critical", "error", "warning", "info", "debug", "trace"):
        _fail(f"--log-level must be critical, error, warning, info, debug or trace, got {log_level!r}")
    if matching is not None and matching not in ("entity", "key"):
        _fail(f"--matching must be 'entity' or 'key', got {matching!r}")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        _fail(f"--threshold must be a similarity between 0 and 1, got {threshold}")
    try:
        from ..serve import ServeLimits, create_app
        import fastapi, uvicorn  # noqa: F401,E401
    except ImportError as e:
        _fail(f"{e.name} is not installed: pip install -e '.[serve]'")
    if demo is not None:
        from ..serve.demo import build_demo

        built = build_demo(demo)
        model, kb = model or built.model_dir, kb or built.kb_dir
        err.print(f"demo model in {built.model_dir}, KB in {built.kb_dir}; try the prompt {built.prompts[0]!r}")
    if model is None:
        _fail("say what to serve: --model CHECKPOINT (or --demo FOLDER)")
    if token is not None and len(token) < 8:
        _fail("the token must have at least 8 characters")
    random_token = not read_only and token is None
    if random_token:
        token = secrets.token_urlsafe(18)
    try:
        limits = ServeLimits(max_new_tokens=max_new_tokens, max_concurrent=max_concurrent, max_batch=max_batch)
    except ValueError as e:
        _fail(str(e))
    import socket

    from ..cli_errors import user_errors

    try:  # a port taken, or a host that is no address here, before the model is loaded
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        _fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
    threads = threads or max(1, (os.cpu_count() or 2) - 1)  # a core for the HTTP side
    with user_errors(ValueError):  # a model or KB that does not open: one line, nothing said to be served
        app = create_app(model, kb, token=None if read_only else token, limits=limits, device=device,
                         threshold=threshold, threads=threads, copy_bias=copy_bias, name_bias=name_bias,
                         matching=matching, constrained=constrained, max_lookups=max_lookups)
    if random_token:
        err.print(f"KB write token: [bold]{token}[/] (set one with --token or LMLM_SERVE_TOKEN)")
    err.print(f"serving on http://{host}:{port}/  (API docs: http://{host}:{port}/docs)")
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower())
