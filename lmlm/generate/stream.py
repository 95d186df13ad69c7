"""Streaming: text pieces and lookup events while ``model.generate`` runs in a background thread.

:class:`TokenEvents` turns one row's tokens into these events; ``stream()`` and the server's
streaming responses both read rows through it. Exercised by ``lmlm generate --stream``.

Examples:
    >>> for event in generator.stream("Ada Lovelace was born in", max_new_tokens=32):
    ...     print(event.text if event.lookup is None else f"[{event.lookup.value}]", end="")
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import torch
from transformers import StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from .answers import Answerer
from .trace import GenerationResult, LookupTrace, trace_entry, call_spans, continuation_text, open_call

__all__ = ["StreamEvent", "TokenEvents", "stream"]


@dataclass
class StreamEvent:
    """One streamed event: a piece of text outside calls, a finished lookup, or the final result.

    Text pieces concatenate to the decoded text outside the calls.
    """

    text: str = ""
    lookup: LookupTrace | None = None
    result: GenerationResult | None = None


class _TokenQueue(BaseStreamer):
    """Receives each step's token from ``model.generate`` (the prompt, pushed first, is skipped)."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.queue.put(value.reshape(-1).tolist())

    def end(self) -> None:  # the worker thread marks the end, also when generation fails
        pass


class _Cancel(StoppingCriteria):
    """Stops every row once ``event`` is set (the consumer stopped iterating)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class TokenEvents:
    """Turns one row's tokens, one at a time, into stream events: text pieces that add up to the
    result's ``clean_text`` (:func:`lmlm.generate.trace.continuation_text`: the text outside calls), and
    one lookup event per call as it closes.

    Args:
        gen (`LookupGenerator`): the generator decoding the row (tokenizer, field limit, prefix tree).
        prompt (`str`): the row's prompt.
        prompt_ids (`list[int]`): its ids as ``gen.prompt_ids`` made them (a forced call's open tail included).
        answers (`Answerer`): the answers ``generate`` gave (its ``cache`` passed to ``generate``).
    """

    def __init__(self, gen, prompt: str, prompt_ids: list[int], answers: Answerer):
        tail = open_call(prompt_ids, gen.tok)
        self.tok, self.answers, self.prompt = gen.tok, answers, prompt
        self.prefix = list(prompt_ids[:len(prompt_ids) - len(tail)])
        self.max_field, self.tree = gen.options["max_field_tokens"], gen.trie
        self.stops = set(gen._stop_ids())
        self.ids = list(tail)
        self.in_call = bool(tail)
        self.sent = ""

    def feed(self, t: int) -> Iterator[StreamEvent]:
        self.ids.append(t)
        if t == self.tok.start_id:
            self.in_call = True
        elif self.in_call:
            if t == self.tok.end_id:
                self.in_call = False
                yield self._lookup()
        else:
            yield from self._text(final=False)

    def finish(self) -> Iterator[StreamEvent]:
        yield from self._text(final=True)
        if self.in_call:
            yield self._lookup()

    def _text(self, final: bool) -> Iterator[StreamEvent]:
        text = continuation_text(self.prompt, self.ids, self.tok)
        if not final:
            text = text.rstrip("\ufffd")  # half a character: wait for the rest
        if not text.startswith(self.sent):  # the text so far changed behind us: nothing to add
            return
        piece, self.sent = text[len(self.sent):], text
        if piece:
            yield StreamEvent(text=piece)

    def _lookup(self) -> StreamEvent:
        span = call_spans(self.ids, self.tok)[0][-1]
        return StreamEvent(lookup=trace_entry(self.ids, span, self.tok, self.answers, self.max_field, self.tree,
                                               self.prefix))


def stream(gen, prompt: str, **kwargs) -> Iterator[StreamEvent]:
    """See :meth:`LookupGenerator.stream`."""
    if kwargs.get("num_beams", 1) > 1:
        raise ValueError("streaming does not support beam search")
    if isinstance(prompt, (list, tuple)):
        raise TypeError("stream takes one prompt (a string)")
    answers = gen.answerer(kwargs.pop("cache", None))
    tokens, cancel = _TokenQueue(), _Cancel()
    stopping = list(kwargs.pop("stopping_criteria", None) or []) + [cancel]
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = gen.generate([prompt], streamer=tokens, cache=answers.cache, stopping_criteria=stopping,
                                         **kwargs)[0]
        except BaseException as e:  # handed to the consumer
            box["error"] = e
        finally:
            tokens.queue.put(None)

    decoder = TokenEvents(gen, prompt, gen.prompt_ids(prompt, kwargs.get("force_lookup", False)), answers)
    thread = threading.Thread(target=work, name="lmlm-stream", daemon=True)
    thread.start()
    try:
        while (step := tokens.queue.get()) is not None:
            for t in step:
                if t in decoder.stops:
                    continue
                yield from decoder.feed(t)
    finally:
        cancel.event.set()
        thread.join()
    if "error" in box:
        raise box["error"]
    yield from decoder.finish()
    yield StreamEvent(result=box["result"])
