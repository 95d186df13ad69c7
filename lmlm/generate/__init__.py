"""Lookup-interleaved decoding: generate text whose lookup calls are answered by a knowledge base.

The model writes ``<|db_start|> entity <|sep|> relation <|db_retrieve|>``; the knowledge base answers
with a value, whose tokens and ``<|db_end|>`` are forced, and generation goes on. The grammar is one
Hugging Face ``LogitsProcessor`` (:class:`LookupLogitsProcessor`): the engine's own KV-cached loop
(``loop``) runs it for greedy decoding and sampling, feeding forced tokens in one forward, and
``model.generate`` runs it for beams and any other ``generate`` option.

* ``base``: :class:`LookupGenerator`, the public API (``generate``, ``stream``, ``complete_call``);
* ``loop``: the KV-cached decoding loop; ``graphs``: its static cache and CUDA graphs; ``packed``: linear
  layers laid out for oneDNN on a CPU;
* ``rows``: the grammar of one row (:class:`~lmlm.generate.rows.RowState`: its call state read off
  its ids, and how it edits its logits), shared by the Hugging Face processor and the vLLM backend;
* ``processor``: the grammar over a batch, per step, with the values forced from the KB;
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

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

# where each public name lives: imported on first use, so ``lmlm --help`` and the commands that never
# generate do not load torch and transformers
_HOMES = {
    "MISS_POLICIES": "answers", "Answer": "answers", "Answerer": "answers", "query_key": "answers",
    "LookupGenerator": "base", "PAPER_LOGIT_BIAS": "processor", "LookupLogitsProcessor": "processor",
    "StreamEvent": "stream", "CallSpan": "trace", "GenerationResult": "trace", "LookupTrace": "trace",
    "call_spans": "trace", "open_call": "trace",
}
__all__ = [
    "LookupTrace", "GenerationResult", "LookupLogitsProcessor", "LookupGenerator", "PAPER_LOGIT_BIAS",
    "CallSpan", "call_spans", "query_key", "open_call", "Answer", "Answerer", "MISS_POLICIES", "StreamEvent",
]

if TYPE_CHECKING:
    from .answers import MISS_POLICIES, Answer, Answerer, query_key
    from .base import LookupGenerator
    from .processor import PAPER_LOGIT_BIAS, LookupLogitsProcessor
    from .stream import StreamEvent
    from .trace import CallSpan, GenerationResult, LookupTrace, call_spans, open_call


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
