"""Generation routes: ``POST /api/generate`` (one prompt, full lookup trace) and OpenAI's
``POST /v1/completions``; both stream over server-sent events when asked.

Each request is queued on the model worker, which batches it with the others waiting; the
response says how many prompts shared its batch (``batch_rows``).
"""

import asyncio
import json
import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse

from ..lookup import Lookup, Text, plain_pieces
from .schemas import CompletionResponse, GenerateResponse, request_models
from .worker import Finished, GenParams

__all__ = ["router", "result_json", "trace_json"]

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def trace_json(t) -> dict:
    """One ``LookupTrace`` as the responses and the streamed ``lookup`` events give it."""
    return {"query_entity": t.query_entity, "query_relation": t.query_relation, "matched_entity": t.matched_entity,
            "matched_relation": t.matched_relation, "value": t.value, "score": t.score, "triple_id": t.triple_id,
            "sources": [str(s) for s in t.sources], "kb_version": t.kb_version, "found": t.found,
            "status": getattr(t, "status", None) or None, "problem": getattr(t, "problem", None),
            "via": getattr(t, "via", None), "miss_reason": getattr(t, "miss_reason", None),
            "miss_detail": getattr(t, "miss_detail", None),
            "candidates": [[str(c[0]), float(c[1])] for c in getattr(t, "candidates", ()) or ()]}


def result_json(r) -> dict:
    """Text, segments (each lookup pointing at its trace entry) and the trace of a ``GenerationResult``."""
    trace = [trace_json(t) for t in r.trace]
    segments, k = [], 0
    # each text as clean_text has it (the space before a call goes with it): the texts join to clean_text
    for seg, text in zip(r.segments, plain_pieces([Text(r.prompt), *r.segments])[1:]):
        if not isinstance(seg, Lookup):
            segments.append({"type": "text", "text": text})
            continue
        # the trace lists every answered call in token order; a finished call is also a segment
        while k < len(trace) and (trace[k]["query_entity"], trace[k]["query_relation"]) != (seg.entity, seg.relation):
            k += 1
        segments.append({"type": "lookup", "entity": seg.entity, "relation": seg.relation, "value": seg.value,
                         "trace": k if k < len(trace) else None})
        k += 1
    return {"prompt": r.prompt, "text": r.text, "clean_text": r.clean_text, "segments": segments, "trace": trace,
            "problems": list(r.problems)}


def _sse(event: str | None, data) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {payload}\n\n".encode()


class _Submission:
    """A request on the worker, seen from the event loop: its future and, when streaming, its events."""

    def __init__(self, state, prompts: list[str], params: GenParams, stream: bool):
        state.acquire()
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue | None = asyncio.Queue() if stream else None

        def on_token(i: int, event: dict) -> None:  # called on the model thread
            if not loop.is_closed():  # the server may be shutting down
                loop.call_soon_threadsafe(self.events.put_nowait, (i, event))

        try:
            self.future = asyncio.wrap_future(state.worker.submit(prompts, params, on_token if stream else None))
        except BaseException:
            state.release()
            raise
        self.future.add_done_callback(lambda _: state.release())
        if stream:
            self.future.add_done_callback(lambda _: self.events.put_nowait(None))

    async def finished(self) -> Finished:
        try:
            return await self.future
        except ValueError as e:  # PromptTooLong, or options generate refused
            raise HTTPException(422, str(e)) from None

    async def tokens(self) -> AsyncIterator[tuple[int, dict]]:
        while (item := await self.events.get()) is not None:
            yield item


def router(state) -> APIRouter:
    R = request_models(state.limits)
    api = APIRouter()

    async def kb_version() -> int:
        return await state.read(lambda: state.kb.version)

    @api.post("/api/generate", tags=["generate"], response_model=GenerateResponse,
              summary="Continue a prompt, answering its lookups from the KB",
              responses={200: {"content": {"text/event-stream": {}}, "description": "JSON, or with stream=true the "
                               "events token {index, token, text}, lookup {index, and the trace entry's fields} as "
                               "each call closes, text {index, text} if the end completes a character, "
                               "result (this JSON) and done"},
                         422: {"description": "invalid request, or the prompt is too long"},
                         429: {"description": "too many generation requests in flight"}})
    async def generate(body: R.GenerateRequest):
        params = GenParams(body.max_new_tokens, body.force_lookup, body.use_db, body.do_sample, body.temperature,
                           body.top_p, body.top_k, body.seed, body.repetition_penalty, body.max_lookups,
                           body.num_beams)
        sub = _Submission(state, [body.prompt], params, body.stream)

        async def answer(fin: Finished) -> dict:
            return {**result_json(fin.results[0]), "kb_version": await kb_version(),
                    "prompt_tokens": fin.prompt_tokens[0], "tokens": len(fin.results[0].token_ids),
                    "finish_reason": fin.finish_reasons[0], "batch_rows": fin.batch_rows,
                    "queued_s": round(fin.queued_s, 4), "run_s": round(fin.run_s, 4)}

        if not body.stream:
            return await answer(await sub.finished())

        async def events():
            async for i, event in sub.tokens():
                if "lookup" in event:
                    yield _sse("lookup", {"index": i, **trace_json(event["lookup"])})
                else:  # a token, or the text that completes the last character
                    yield _sse("token" if "token" in event else "text", {"index": i, **event})
            result = GenerateResponse(**await answer(await sub.finished()))  # the same fields as without streaming
            yield _sse("result", result.model_dump(mode="json"))
            yield _sse("done", {})

        return await _stream(sub, events())

    @api.post("/v1/completions", tags=["generate"], response_model=CompletionResponse,
              summary="OpenAI-compatible text completion (clean text; lookups under choices[].lmlm)",
              responses={200: {"content": {"text/event-stream": {}}}, 422: {}, 429: {}})
    async def completions(body: R.CompletionRequest):
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        prompts = [p for p in prompts for _ in range(body.n)]  # choice i*n + j
        greedy = body.temperature == 0
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        # the rows stop at a stop sequence (the text, its lookups and the usage end there), and the text is cut
        params = GenParams(body.max_tokens, body.force_lookup, True, not greedy, 1.0 if greedy else body.temperature,
                           body.top_p, 0, body.seed, stop=tuple(stops))
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": body.model or state.model_name}
        sub = _Submission(state, prompts, params, body.stream)

        def choice(i: int, fin: Finished) -> dict:
            r = fin.results[i]
            text, stopped = _cut(fin.texts[i], stops)
            return {"index": i, "text": (prompts[i] if body.echo else "") + text, "logprobs": None,
                    "finish_reason": "stop" if stopped else fin.finish_reasons[i],
                    "lmlm": {"text": r.text, "trace": result_json(r)["trace"]}}

        def usage(fin: Finished) -> dict:
            p, c = sum(fin.prompt_tokens), sum(len(r.token_ids) for r in fin.results)
            return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

        if not body.stream:
            fin = await sub.finished()
            return {**head, "choices": [choice(i, fin) for i in range(len(prompts))], "usage": usage(fin)}

        def chunk(i: int, text: str, reason=None, extra=None) -> bytes:
            c = {"index": i, "text": text, "logprobs": None, "finish_reason": reason, **(extra or {})}
            return _sse(None, {**head, "choices": [c]})

        async def events():
            cut = [_StopText(stops) for _ in prompts]
            if body.echo:
                for i, p in enumerate(prompts):
                    yield chunk(i, p)
            async for i, event in sub.tokens():
                if piece := cut[i].push(event.get("text", "")):
                    yield chunk(i, piece)
            fin = await sub.finished()
            for i in range(len(prompts)):
                c = choice(i, fin)
                rest = cut[i].rest(c["text"][len(prompts[i]) if body.echo else 0:])
                yield chunk(i, rest, c["finish_reason"], {"lmlm": c["lmlm"]})
            yield _sse(None, {**head, "choices": [], "usage": usage(fin)})
            yield _sse(None, "[DONE]")

        return await _stream(sub, events())

    return api


async def _stream(sub: _Submission, events: AsyncIterator[bytes]) -> StreamingResponse:
    """Start the event stream once the worker has accepted the request, so that a refusal is a 4xx."""
    if await sub.events.get() is None:  # failed before it was accepted
        await sub.finished()  # raises the 4xx
    return StreamingResponse(_errors_as_events(events), media_type="text/event-stream", headers=SSE_HEADERS)


async def _errors_as_events(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for e in events:
            yield e
    except HTTPException as e:  # the request failed after the stream began
        yield _sse("error", {"status": e.status_code, "detail": e.detail})


def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop sequence, and whether one was found."""
    at = [text.find(s) for s in stops if s in text]
    return (text[:min(at)], True) if at else (text, False)


class _StopText:
    """Streamed text cut at the first stop sequence: what could begin one is held back."""

    def __init__(self, stops: list[str]):
        self.stops, self.hold = stops, max((len(s) for s in stops), default=1) - 1
        self.buf, self.out, self.stopped = "", 0, False

    def push(self, delta: str) -> str:
        if self.stopped or not delta:
            return ""
        self.buf += delta
        text, self.stopped = _cut(self.buf, self.stops)
        end = len(text) if self.stopped else max(self.out, len(self.buf) - self.hold)
        piece, self.out = self.buf[self.out:end], end
        return piece

    def rest(self, final: str) -> str:
        """What the final text adds to what was sent (nothing if they disagree)."""
        sent = self.buf[:self.out]
        return final[len(sent):] if final.startswith(sent) else ""
