"""Lookup-interleaved decoding: generate text whose lookup calls are answered by a knowledge base.

The model writes ``<|db_start|> entity <|sep|> relation <|db_retrieve|>``; the knowledge base answers
with a value, whose tokens and ``<|db_end|>`` are forced one step at a time, and generation goes on.
All of it is one Hugging Face ``LogitsProcessor`` (:class:`LookupLogitsProcessor`), so batching,
the KV cache, sampling, beams, stop strings and streamers come from ``model.generate`` unchanged.

* ``base``: :class:`LookupGenerator`, the public API (``generate``, ``stream``, ``complete_call``);
* ``processor``: the grammar, forced values, prefix-tree constraint and forced calls, per step;
* ``answers``: queries to values (KB lookups, miss policies, the answer cache);
* ``trace``: reading calls back out of the ids, one :class:`LookupTrace` per call;
* ``stream``: text pieces and lookup events while generating;
* ``loading``: opening a checkpoint (ours, or a plain Hugging Face folder such as the authors'
  released ones) and a KB (a folder, or the authors' JSON database);
* ``reencode``: the re-encode-everything loop of the authors' code, kept as a baseline;
* ``vllm``: an optional vLLM backend (stop at ``<|db_retrieve|>``, resume with prefix caching).

Exercised by ``lmlm generate`` and ``lmlm bench generate``.

Examples:
    >>> gen = LookupGenerator(model, tokenizer, kb)
    >>> r = gen.generate(["Ada Lovelace was born in"])[0]
    >>> r.text
    "[dblookup('Ada Lovelace', 'Birth City') -> London] London."
    >>> r.trace[0].value, r.trace[0].status
    ('London', 'exact')
"""

from .answers import MISS_POLICIES, Answer, Answerer, query_key
from .base import LookupGenerator
from .processor import PAPER_LOGIT_BIAS, LookupLogitsProcessor
from .stream import StreamEvent
from .trace import CallSpan, GenerationResult, LookupTrace, call_spans, open_call

__all__ = [
    "LookupTrace", "GenerationResult", "LookupLogitsProcessor", "LookupGenerator", "PAPER_LOGIT_BIAS",
    "CallSpan", "call_spans", "query_key", "open_call", "Answer", "Answerer", "MISS_POLICIES", "StreamEvent",
]
