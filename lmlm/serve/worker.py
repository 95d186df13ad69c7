"""The model worker: one thread owns the model and runs queued generation requests in batches.

Requests that arrive while a batch runs wait in a queue; the worker then takes all that are
waiting (up to ``max_batch`` prompts), groups those with the same decoding options and runs each
group as one :meth:`LookupGenerator.generate` call. Only this thread touches the model and the
tokenizer; the knowledge base is shared with the HTTP handlers (it is thread-safe) and every
lookup reads its current version. Streaming rows get their tokens and
lookups from a :class:`BatchStreamer` as the batch decodes.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import astuple, dataclass, field
from typing import Callable

from transformers.generation.streamers import BaseStreamer

from ..errors import LmlmError
from ..generate.base import batch_order
from ..generate.stream import TokenEvents
from ..generate.trace import open_call

__all__ = ["GenParams", "ModelWorker", "PromptTooLong", "Finished", "BatchStreamer"]

_seeded = itertools.count()  # a seeded request runs alone: its batch decides its random stream


@dataclass(frozen=True)
class GenParams:
    """Decoding options of one request; requests batch together only when these are equal."""

    max_new_tokens: int = 64
    force_lookup: bool = False
    use_db: bool = True
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0
    max_lookups: int | None = None  # None: the server's
    num_beams: int = 1
    stop: tuple[str, ...] = ()  # a row stops once its text outside calls ends with one of these

    def batch_key(self) -> tuple:
        return astuple(self) + ((next(_seeded),) if self.seed is not None else ())


class PromptTooLong(LmlmError, ValueError):
    """A prompt has more tokens than the limit, or leaves no room for ``max_new_tokens``."""


@dataclass
class Finished:
    """A request's results and how it was run."""

    results: list  # GenerationResult, one per prompt
    texts: list[str]  # plain text without a call left unfinished at the end (what streaming sends)
    prompt_tokens: list[int]
    finish_reasons: list[str]  # "stop" (a stop token) or "length" (max_new_tokens reached)
    batch_rows: int  # prompts in the generate call that ran it
    queued_s: float
    run_s: float


@dataclass
class _Job:
    prompts: list[str]
    params: GenParams
    future: Future
    on_token: Callable[[int, dict], None] | None  # (prompt index, event) for streaming; (-1, {}) once accepted
    submitted: float = field(default_factory=time.perf_counter)
    prompt_ids: list[list[int]] = field(default_factory=list)  # doc separator + prompt (+ open call)


_STOP = object()


class ModelWorker:
    """Run generation requests on one thread, batching the ones that wait together.

    Args:
        generators (`dict[bool, LookupGenerator]`): by ``use_db``; both share one model.
        max_batch (`int`, defaults to 32): most prompts in one ``generate`` call.
        batch_wait_s (`float`, defaults to 0.005): how long an idle worker waits for company
            after the first request arrives.
        max_prompt_tokens (`int`, defaults to 512): longest prompt, in tokens.
        context (`int | None`): the model's context; prompt plus ``max_new_tokens`` must fit.
    """

    def __init__(self, generators: dict, *, max_batch: int = 32, batch_wait_s: float = 0.005,
                 max_prompt_tokens: int = 512, context: int | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {batch_wait_s}")
        self.generators, self.max_batch, self.batch_wait_s = generators, max_batch, batch_wait_s
        self.max_prompt_tokens, self.context = max_prompt_tokens, context
        self.tok = generators[True].tok
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.stats = {"batches": 0, "rows": 0, "requests": 0, "max_rows": 0}

    # -- the caller's side ------------------------------------------------------------------------
    def submit(self, prompts: list[str], params: GenParams,
               on_token: Callable[[int, dict], None] | None = None) -> Future:
        """Queue ``prompts``; the future gets a :class:`Finished` (or PromptTooLong, or the error)."""
        self._ensure_started()
        job = _Job(list(prompts), params, Future(), on_token)
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="lmlm-model-worker", daemon=True)
                self._thread.start()

    # -- the worker's side ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs, stop = self._collect(first)
            groups: dict[tuple, list[_Job]] = {}
            for job in jobs:
                if self._admit(job):
                    groups.setdefault(job.params.batch_key(), []).append(job)
            for group in groups.values():
                self._run(group)
            if stop:
                return

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """``first`` and the jobs queued behind it, up to ``max_batch`` prompts (a request is never split)."""
        jobs, rows = [first], len(first.prompts)
        deadline = time.perf_counter() + self.batch_wait_s
        while rows < self.max_batch:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if job is _STOP:
                return jobs, True
            jobs.append(job)
            rows += len(job.prompts)
        return jobs, False

    def _admit(self, job: _Job) -> bool:
        """Count the job's prompt tokens; fail it (PromptTooLong) if one does not fit."""
        if not job.future.set_running_or_notify_cancel():
            return False
        gen = self.generators[job.params.use_db]
        try:
            job.prompt_ids = [gen.prompt_ids(p, job.params.force_lookup) for p in job.prompts]
        except ValueError as e:  # a prompt that ends inside a call's value, ...: said as it is
            job.future.set_exception(e)
            return False
        except Exception as e:  # a prompt the tokenizer cannot read
            job.future.set_exception(ValueError(f"cannot tokenize the prompt: {e}"))
            return False
        for n in map(len, job.prompt_ids):
            if n - 1 > self.max_prompt_tokens:
                job.future.set_exception(PromptTooLong(
                    f"the prompt has {n - 1} tokens; the limit is {self.max_prompt_tokens}"))
                return False
            if self.context is not None and n + job.params.max_new_tokens > self.context:
                job.future.set_exception(PromptTooLong(
                    f"the prompt ({n - 1} tokens) plus max_new_tokens ({job.params.max_new_tokens}) exceeds "
                    f"the model's context of {self.context - 1} tokens"))
                return False
        if job.on_token is not None:
            job.on_token(-1, {})  # accepted: the stream may begin
        return True

    def _run(self, group: list[_Job]) -> None:
        """One ``generate`` call for the whole group; each job gets its own slice of the results."""
        p = group[0].params
        gen = self.generators[p.use_db]
        prompts = [x for job in group for x in job.prompts]
        owners = [(job, i) for job in group for i in range(len(job.prompts))]
        streamer, cache = None, None
        if any(job.on_token for job in group):  # the streamer's lookup events read the answers generate gave
            answers = gen.answerer()
            cache = answers.cache
            streamer = BatchStreamer(gen, [ids for job in group for ids in job.prompt_ids], owners, answers)
        start = time.perf_counter()
        try:
            results = gen.generate(prompts, max_new_tokens=p.max_new_tokens, batch_size=len(prompts),
                                   force_lookup=p.force_lookup, do_sample=p.do_sample, temperature=p.temperature,
                                   top_p=p.top_p, top_k=p.top_k, seed=p.seed, cache=cache,
                                   repetition_penalty=p.repetition_penalty, max_lookups=p.max_lookups,
                                   num_beams=p.num_beams, stop_strings=list(p.stop) or None,
                                   **({"streamer": streamer} if streamer else {}))
            run_s = time.perf_counter() - start
            k = 0
            for job in group:
                mine = results[k:k + len(job.prompts)]
                k += len(job.prompts)
                # "length" when a row used all its tokens without writing a stop token
                reasons = ["length" if len(r.token_ids) - len(open_call(ids, self.tok)) >= p.max_new_tokens
                           else "stop" for r, ids in zip(mine, job.prompt_ids)]
                texts = [r.clean_text for r in mine]
                job.future.set_result(Finished(mine, texts, [len(ids) - 1 for ids in job.prompt_ids], reasons,
                                               len(prompts), start - job.submitted, run_s))
        except Exception as e:  # reported to every request of the group still waiting
            for job in group:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        self.stats["batches"] += 1
        self.stats["rows"] += len(prompts)
        self.stats["requests"] += len(group)
        self.stats["max_rows"] = max(self.stats["max_rows"], len(prompts))


class BatchStreamer(BaseStreamer):
    """Hand each row's new tokens to the request that owns the row, as ``generate`` makes them.

    ``LookupGenerator.generate`` orders a single batch by :func:`lmlm.generate.base.batch_order`; the
    streamer checks the prompts it is given against that order and stays silent if
    they differ (the requests still get their results at the end).

    Each row is read by a :class:`lmlm.generate.stream.TokenEvents`, as ``stream()`` reads its one
    row. A token gives ``{"token": raw text of the token, "text": new plain text}``: ``token`` shows the
    lookup markers as the model writes them; ``text`` grows only with text outside
    calls, the way ``GenerationResult.clean_text`` reads, so the pieces add up to it (a row that ends
    inside a character gives its last piece as ``{"text": ...}``). A call that closes first gives
    ``{"lookup": LookupTrace}``; ``answers`` must be the answerer whose cache ``generate`` was given.
    """

    def __init__(self, gen, prompt_ids: list[list[int]], owners: list[tuple[_Job, int]], answers):
        self.tok = gen.tok
        order = batch_order(prompt_ids)
        self.rows = [(owners[i], prompt_ids[i]) for i in order]  # model row -> ((job, index), prompt ids)
        self.readers = [TokenEvents(gen, job.prompts[i], ids, answers) for (job, i), ids in self.rows]
        self.done = [job.on_token is None for (job, _), _ in self.rows]  # a row nobody streams is never read
        self.started = False
        self.silent = False

    def put(self, value) -> None:
        value = value.reshape(len(self.rows), -1) if value.numel() else value
        if not self.started:  # the (left-padded) prompts
            self.started = True
            width = value.shape[1]
            self.silent = any(width < len(ids) or value[k, width - len(ids):].tolist() != ids
                              for k, (_, ids) in enumerate(self.rows))
            return
        if self.silent:
            return
        for k, token in enumerate(value[:, -1].tolist()):
            if self.done[k]:
                continue
            if token in self.readers[k].stops:
                self._finish(k)
                continue
            self._send(k, self.readers[k].feed(token), self.tok.hf.decode([token], skip_special_tokens=False))

    def end(self) -> None:
        if self.started and not self.silent:
            for k in range(len(self.rows)):
                self._finish(k)

    def _finish(self, k: int) -> None:
        if not self.done[k]:
            self.done[k] = True
            self._send(k, self.readers[k].finish(), None)

    def _send(self, k: int, events, token: str | None) -> None:
        """A row's events: lookups as they come, its text as one event (with ``token`` when one was read)."""
        (job, i), _ = self.rows[k]
        text = ""
        for e in events:
            if e.lookup is not None:
                job.on_token(i, {"lookup": e.lookup})
            text += e.text
        if token is not None:
            job.on_token(i, {"token": token, "text": text})
        elif text:  # the row's end completes a character
            job.on_token(i, {"text": text})
