"""The lookup grammar inside vLLM: :class:`lmlm.generate.rows.RowGrammar` (one
:class:`~lmlm.generate.rows.RowState`, the grammar the Hugging Face processor runs on each of its
rows) applied to each row of a vLLM batch, as a per-request logits processor of vLLM's V1 engine.

The vLLM backend (:mod:`lmlm.generate.vllm`) runs each row until ``<|db_retrieve|>`` and answers the
lookup itself; within a round this processor gives the row the grammar the Hugging Face engine gives
it: the markers' bias, the markers that cannot come next banned (``<|db_start|>`` inside a call or
once ``max_lookups`` calls are made, the closing markers outside one, the stop tokens inside a field,
an empty field closed), and a field of ``max_field_tokens`` tokens closed by force; with
``force_at`` a call opened at those offsets, and with ``trie`` (a JSON file of the KB's key paths,
read once per process) each query kept on a key. A request takes it through
``SamplingParams(extra_args={"lmlm_grammar": {...}})`` (plain numbers, lists and a file name, so the
engine's process can read them); requests without it are left alone.

Imports vLLM: load it only where vLLM is installed.
"""

from __future__ import annotations

import functools
import json

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from .rows import RowGrammar
from .trie import TokenTrie

__all__ = ["LookupGrammar", "GRAMMAR_ARG"]

GRAMMAR_ARG = "lmlm_grammar"


class LookupGrammar(AdapterLogitsProcessor):
    """vLLM's per-request adapter for :class:`RowGrammar` (``LLM(..., logits_processors=[LookupGrammar])``)."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        spec = (params.extra_args or {}).get(GRAMMAR_ARG)
        if spec is None:
            return None
        if spec.get("trie") is not None:
            spec = {**spec, "trie": read_trie(spec["trie"])}
        return RowGrammar(**spec)


@functools.lru_cache(maxsize=4)
def read_trie(path: str) -> TokenTrie:
    """The prefix tree of a file of key paths (a JSON list of id lists); one file per KB version."""
    with open(path, encoding="utf-8") as f:
        return TokenTrie(json.load(f))
