"""``lmlm serve``: generation with lookup traces, KB read and write endpoints, and a web page.

One FastAPI app (:func:`create_app`) per checkpoint and KB. Concurrent generation requests are
batched on one model thread (:mod:`lmlm.serve.worker`); KB writes need a bearer token and run one
at a time; every request is bounded by :class:`ServeLimits`. The page at ``/`` marks each
looked-up fact in the output and lets a user delete or edit it and regenerate; the OpenAPI docs
are at ``/docs``. Exercised by ``lmlm serve`` and ``lmlm bench serve``.

Examples:
    >>> from lmlm.serve import create_app, serve
    >>> serve("runs/quickstart/train-lmlm/checkpoint", "runs/quickstart/kb-eval", token="a-long-secret")
"""

from __future__ import annotations

from pathlib import Path

from .limits import ServeLimits

__all__ = ["create_app", "serve", "ServeLimits"]


def create_app(*args, **kwargs):
    """See :func:`lmlm.serve.app.create_app` (imported lazily: FastAPI is an optional dependency)."""
    from .app import create_app as make

    return make(*args, **kwargs)


def serve(model_dir: str | Path, kb_path: str | Path | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          token: str | None = None, limits: ServeLimits | None = None, device: str | None = None,
          threshold: float | None = None, threads: int | None = None, log_level: str = "info",
          copy_bias: float = 0.0, name_bias: float = 0.0, matching: str | None = None, constrained: bool = False,
          max_lookups: int = 16) -> None:
    """Serve :func:`create_app` with uvicorn until interrupted."""
    import uvicorn

    app = create_app(model_dir, kb_path, token=token, limits=limits, device=device, threshold=threshold,
                     threads=threads, copy_bias=copy_bias, name_bias=name_bias, matching=matching,
                     constrained=constrained, max_lookups=max_lookups)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
