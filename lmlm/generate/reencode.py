"""The baseline ``lmlm bench generate --preset paper`` measures the engine against: the re-encode-everything
loop of the authors' code. Not a decoding path to use (:class:`LookupGenerator` is); kept to be timed
(``reencode_b1``) and as the reference the engine's greedy outputs must match token for token.

One prompt at a time: call ``model.generate`` until ``<|db_retrieve|>``, look the query up, append
the value and ``<|db_end|>``, and call ``generate`` again on the whole sequence. Nothing is kept
between calls, so each lookup costs a new prompt encoding of everything so far. The grammar is the
engine's processor with nothing forced (``query_only``), so greedy outputs can be compared token for
token with :meth:`LookupGenerator.generate`.

By default the ids are carried from call to call. ``retokenize=True`` does what the authors' code
does: decode to text, append the value as text, and tokenize the whole text again. That is lossy:
a model's non-canonical token split (``" s" "um"`` for ``" sum"``) comes back merged, and text right
after a special token gains the tokenizer's prefix space, so the next call sees other ids.

Exercised by ``lmlm bench generate --preset paper`` and ``tests/generate/test_generate_adversarial.py``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import LogitsProcessorList

from .answers import call_context, call_start, query_key
from .base import LookupGenerator
from .trace import GenerationResult, build_result

__all__ = ["reencode_generate"]


@torch.inference_mode()
def reencode_generate(gen: LookupGenerator, prompt: str, *, max_new_tokens: int = 64, ignore_eos: bool = False,
                      retokenize: bool = False, force_lookup_at: Sequence[int] | None = None) -> GenerationResult:
    """Greedy decoding of one prompt with the re-encode loop, using ``gen``'s model, tokenizer, KB and options.

    ``force_lookup_at``: offsets into the continuation where a call must begin, as in
    :meth:`LookupGenerator.generate`.
    """
    tok, model = gen.tok, gen.model
    ids = gen.prompt_ids(prompt)
    if retokenize:
        text = tok.hf.decode(ids, skip_special_tokens=False)
        ids = tok.hf.encode(text, add_special_tokens=False)
    width = len(ids)
    answers = gen.answerer()
    stops = [] if ignore_eos else gen._stop_ids()
    window = 2 * gen.options["max_field_tokens"] + 2
    force_at = None if force_lookup_at is None else [tuple(force_lookup_at)]
    new = 0
    while new < max_new_tokens:
        proc = gen.processor(count_from=width, query_only=True, cache=answers.cache, force_at=force_at)
        x = torch.tensor([ids], device=model.device)  # everything so far, encoded again
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens - new,
                             logits_processor=LogitsProcessorList([proc]), eos_token_id=stops + [tok.retrieve_id],
                             pad_token_id=tok.eos_id, do_sample=False)
        got = out[0, len(ids):].tolist()
        stopped = bool(got) and got[-1] in stops
        if stopped:
            got = got[:-1]
        new += len(got)
        ids = ids + got
        if stopped or not got or got[-1] != tok.retrieve_id or new >= max_new_tokens:
            break
        key = query_key(ids, len(ids) - 1, tok, window)
        ctx = call_context(ids, call_start(ids, len(ids) - 1, tok), tok)
        answers.resolve([key], [ctx])
        value = list(answers.get(key, ctx).continuation[:max_new_tokens - new])
        new += len(value)
        ids = ids + value  # the value ids and <|db_end|>
        if retokenize:
            ids = tok.hf.encode(tok.hf.decode(ids, skip_special_tokens=False), add_special_tokens=False)
    return build_result(prompt, ids[width:], tok, answers, gen.options["max_field_tokens"], prefix=ids[:width])
