"""The FastAPI app: :func:`create_app` loads a checkpoint and a KB and wires the routes together.

Routes: the web page (``/``), generation (``/api/generate``, OpenAI's ``/v1/completions``), KB reads
(``/api/kb/...``, open) and KB writes (``POST /api/kb/...``, behind a bearer token), ``/api/info``,
and the OpenAPI docs at ``/docs``. Requests name no files: the checkpoint and the KB folder are
fixed when the app is made, and the page is served from the package's ``static`` folder only.
"""

import asyncio
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .limits import ServeLimits
from .worker import ModelWorker

__all__ = ["create_app", "ServeState", "STATIC_DIR"]

STATIC_DIR = Path(__file__).parent / "static"
WRITE_PATHS = frozenset({"/api/kb/triples", "/api/kb/edit", "/api/kb/delete", "/api/kb/forget", "/api/kb/restore"})


class ServeState:
    """What the routes share: the model worker, the KB, the single KB writer thread and the limits.

    Args:
        model_dir: a checkpoint folder (:func:`lmlm.checkpoint.load_checkpoint`).
        kb_path: the KB folder; ``None`` uses the one named in the checkpoint's ``lmlm.json``.
        token: the bearer token of the write endpoints; ``None`` disables writes.
        limits: see :class:`ServeLimits`.
        device: where the model runs (default: CUDA when available, else CPU).
        threshold: the lookups' minimum similarity: of the relation under entity-aware matching (default
            the KB's, 0.5), of the whole key under the paper's key match (0.6).
        threads: torch's CPU threads, for the whole process (default: torch's). On a busy CPU
            fewer threads than cores leave room for the HTTP side; small models run fastest on one.
        copy_bias, name_bias: decoding biases of every request with the KB (see
            :class:`lmlm.generate.LookupGenerator`; 0: the model's own choices).
        matching: ``"entity"`` or ``"key"`` (the paper's single-key cosine), for generation and
            ``/api/kb/lookup`` alike (default: the KB's).
        constrained: keep every query on a key of the KB (a prefix tree that follows its writes).
        max_lookups: calls one continuation may open, unless a request asks for fewer or more.
    """

    def __init__(self, model_dir: str | Path, kb_path: str | Path | None = None, *, token: str | None = None,
                 limits: ServeLimits | None = None, device: str | None = None, threshold: float | None = None,
                 threads: int | None = None, copy_bias: float = 0.0, name_bias: float = 0.0,
                 matching: str | None = None, constrained: bool = False, max_lookups: int = 16):
        import torch

        from ..checkpoint import load_checkpoint
        from ..device import default_device
        from ..generate import LookupGenerator

        self.limits = limits or ServeLimits()
        if token is not None and (not isinstance(token, str) or len(token) < 8):
            raise ValueError("token must be a string of at least 8 characters (or None to disable writes)")
        self.token = token
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        device = default_device(device)
        model, tok, meta = load_checkpoint(model_dir, device=device)
        if kb_path is None:
            from ..checkpoint import kb_of

            kb_path = kb_of(meta, model_dir)
            if kb_path is None:
                raise ValueError(f"{model_dir} names no knowledge base: pass kb_path")
        from ..generate.loading import open_kb

        self.kb = open_kb(kb_path)
        if matching is not None:
            if matching not in ("entity", "key"):
                raise ValueError(f"matching must be 'entity' or 'key', got {matching!r}")
            self.kb.matching = matching
        if threshold is not None:
            if not 0 <= threshold <= 1:
                raise ValueError(f"threshold must be in [0, 1], got {threshold}")
            if self.kb.matching == "key":  # the threshold of the matching in effect, as `lmlm kb lookup --threshold`
                self.kb.threshold = float(threshold)
            else:
                self.kb.relation_threshold = float(threshold)
        self.model_name = _model_name(Path(model_dir))
        self.model_info = {"name": self.model_name, "type": model.config.model_type, "device": str(model.device),
                           "threads": torch.get_num_threads(),
                           "parameters": sum(p.numel() for p in model.parameters()), "context": _context(model)}
        context = self.model_info["context"]
        if context is not None and context > 2:  # a prompt of one token (after the separator) and the rest new
            self.limits = replace(self.limits, max_new_tokens=min(self.limits.max_new_tokens, context - 2),
                                  max_prompt_tokens=min(self.limits.max_prompt_tokens, context - 2))
        self.tok = tok
        self.lookups = {"constrained": constrained, "max_lookups": max_lookups}
        generators = {True: LookupGenerator(model, tok, self.kb, copy_bias=copy_bias, name_bias=name_bias,
                                            **self.lookups),
                      False: LookupGenerator(model, tok, None, use_db=False)}
        self.worker = ModelWorker(generators, max_batch=self.limits.max_batch,
                                  batch_wait_s=self.limits.batch_wait_ms / 1000,
                                  max_prompt_tokens=self.limits.max_prompt_tokens, context=self.model_info["context"])
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmlm-kb-writer")
        self.in_flight = 0  # generation requests queued or running (changed on the event loop only)

    def acquire(self) -> None:
        """Count a generation request in, or refuse it (429) when ``max_concurrent`` are in flight."""
        if self.in_flight >= self.limits.max_concurrent:
            raise HTTPException(429, f"too many generation requests in flight (limit {self.limits.max_concurrent}); "
                                     "retry shortly", headers={"Retry-After": "1"})
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    async def read(self, fn, *args, **kwargs):
        """Run a KB read on a worker thread (the KB locks each call)."""
        return await run_in_threadpool(fn, *args, **kwargs)

    async def write(self, fn, *args, **kwargs):
        """Run a KB write on the one writer thread: writes happen one at a time, in arrival order."""
        return await asyncio.wrap_future(self.writer.submit(fn, *args, **kwargs))

    def check_token(self, credentials: str | None) -> None:
        if self.token is None:
            raise HTTPException(403, "writes are disabled: the server was started read-only "
                                     "(lmlm serve --read-only, or no token)")
        if not credentials or not secrets.compare_digest(credentials.encode(), self.token.encode()):
            raise HTTPException(401, "this endpoint changes the KB: send 'Authorization: Bearer <token>'",
                                headers={"WWW-Authenticate": "Bearer"})

    def close(self) -> None:
        self.worker.close()
        self.writer.shutdown(wait=True)
        self.kb.close()


def _model_name(folder: Path) -> str:
    folder = folder.resolve()
    return f"{folder.parent.name}/{folder.name}" if folder.name == "checkpoint" else folder.name


def _context(model) -> int | None:
    c = model.config
    return getattr(c, "n_positions", None) or getattr(c, "max_position_embeddings", None)


class _Guard:
    """ASGI middleware run before routing: the token on write paths, then the body size limit.

    A body without ``Content-Length`` is read up to the limit and replayed to the app.
    """

    def __init__(self, app, state: ServeState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["method"] == "POST" and scope["path"].rstrip("/") in WRITE_PATHS:
            auth = headers.get("authorization", "")
            scheme, _, cred = auth.partition(" ")
            try:
                self.state.check_token(cred.strip() if scheme.lower() == "bearer" else None)
            except HTTPException as e:
                return await _send_json(send, e.status_code, {"detail": e.detail}, e.headers)
        limit = self.state.limits.max_body_bytes
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                return await _send_json(send, 400, {"detail": "Content-Length is not a number"})
            if int(length) > limit:
                return await _send_json(send, 413, {"detail": f"the body has {int(length)} bytes; the limit is {limit}"})
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await _send_json(send, 413, {"detail": f"the body is over the limit of {limit} bytes"})
            if not message.get("more_body"):
                break
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def create_app(model_dir: str | Path, kb_path: str | Path | None = None, *, token: str | None = None,
               limits: ServeLimits | None = None, device: str | None = None, threshold: float | None = None,
               threads: int | None = None, copy_bias: float = 0.0, name_bias: float = 0.0,
               matching: str | None = None, constrained: bool = False, max_lookups: int = 16) -> FastAPI:
    """The ``lmlm serve`` app for one checkpoint and one KB.

    Args:
        model_dir: checkpoint folder.
        kb_path: KB folder (default: the checkpoint's).
        token: bearer token required by the KB write endpoints; ``None`` disables them (403).
        limits: request limits (:class:`ServeLimits`).
        device: where the model runs (default: CUDA when available, else CPU).
        threshold: the lookups' minimum similarity (see :class:`ServeState`).
        threads: torch's CPU threads for the process (default: torch's own).
        copy_bias, name_bias, matching, constrained, max_lookups: how lookups are written and
            answered (see :class:`ServeState`).

    Examples:
        >>> app = create_app("runs/quickstart/train-lmlm/checkpoint", "runs/quickstart/kb-eval", token="s3cret-token")
        >>> uvicorn.run(app, port=8000)  # then open http://127.0.0.1:8000/
    """
    from contextlib import asynccontextmanager

    from . import gen_routes, kb_routes

    state = ServeState(model_dir, kb_path, token=token, limits=limits, device=device, threshold=threshold,
                       threads=threads, copy_bias=copy_bias, name_bias=name_bias, matching=matching,
                       constrained=constrained, max_lookups=max_lookups)

    @asynccontextmanager
    async def lifespan(app):
        yield
        state.close()

    app = FastAPI(title="lmlm serve", version="1", lifespan=lifespan,
                  description="Generate with a Limited Memory Language Model whose facts live in a knowledge base: "
                              "each lookup is traced to the KB row that answered it, and the KB can be read and "
                              "edited here. KB writes need `Authorization: Bearer <token>`.")
    app.state.lmlm = state
    app.add_middleware(_Guard, state=state)
    bearer = HTTPBearer(auto_error=False, description="the token given to `lmlm serve --token`")

    def require_token(cred: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
        state.check_token(cred.credentials if cred else None)

    app.include_router(gen_routes.router(state), dependencies=[Depends(_known_query)])
    app.include_router(kb_routes.router(state, require_token), dependencies=[Depends(_known_query)])
    _errors(app)

    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/api/info", tags=["server"], summary="The model, the KB, the limits and batching so far")
    async def info() -> dict:
        version = await state.read(lambda: state.kb.version)
        return {"model": state.model_info, "kb": {"name": Path(state.kb.path).name, "version": version,
                                                 "matching": state.kb.matching,
                                                 "threshold": state.kb.threshold if state.kb.matching == "key"
                                                 else state.kb.relation_threshold, **state.lookups},
                "limits": asdict(state.limits), "writes_enabled": state.token is not None,
                "lookup_tokens": state.tok.tokens.as_list(), "batching": dict(state.worker.stats),
                "in_flight": state.in_flight}

    @app.get("/api/health", tags=["server"], summary="200 when the server is up")
    def health() -> dict:
        return {"ok": True}

    return app


def _known_query(request: Request) -> None:
    """A 422 for a query parameter the route does not take (a misspelt or unsupported option is never
    ignored in silence: ``?at=3`` on a route without ``at`` would answer for the current version).
    OpenAI's ``/v1`` routes accept and ignore what they do not know, as their bodies do."""
    route = request.scope.get("route")
    if request.url.path.startswith("/v1/") or getattr(route, "dependant", None) is None:
        return
    known, todo = set(), [route.dependant]
    while todo:  # the route's own parameters and those of its dependencies
        d = todo.pop()
        known.update(p.alias for p in d.query_params)
        todo += d.dependencies
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
        raise HTTPException(422, f"unknown query parameter {', '.join(map(repr, unknown))}: {takes}")


def _errors(app: FastAPI) -> None:
    """4xx bodies: ``{"detail": ...}``, and OpenAI's ``{"error": {...}}`` under ``/v1``."""

    def body(request: Request, status: int, detail) -> dict:
        if request.url.path.startswith("/v1/"):
            msg = detail if isinstance(detail, str) else "; ".join(
                f"{'.'.join(str(x) for x in e.get('loc', ())[1:])}: {e.get('msg')}" for e in detail) \
                if isinstance(detail, list) else json.dumps(detail)
            return {"error": {"message": msg, "type": "invalid_request_error", "param": None, "code": status}}
        return {"detail": detail}

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse(body(request, exc.status_code, exc.detail), exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = []
        for e in exc.errors():
            # a union's members name themselves in the location ("function-after[partial(<...>)]"): not the user's
            loc = [x for x in e.get("loc", ()) if not (isinstance(x, str) and ("[" in x or "(" in x))]
            error = {"loc": loc, "msg": e.get("msg"), "type": e.get("type")}
            if loc == ["body"] and "json" not in request.headers.get("content-type", ""):
                error["msg"] = (f"{error['msg']}: send the body as JSON with 'content-type: application/json' "
                                f"(got {request.headers.get('content-type') or 'none'!r})")
            if error not in errors:
                errors.append(error)
        return JSONResponse(body(request, 422, errors), 422)
