"""``LookupGenerator``: prompts in, continuations with answered lookups and their traces out.

Exercised by ``lmlm generate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from ..models import max_positions
from ..tokens import LookupTokenizer
from .answers import Answerer, query_key
from .loop import LOOP_KWARGS, decode
from .packed import pack_linears, packing
from .processor import PAPER_LOGIT_BIAS, LookupLogitsProcessor
from .trace import GenerationResult, build_result, open_call, prompt_row

if TYPE_CHECKING:
    from .stream import StreamEvent

__all__ = ["LookupGenerator", "batch_order"]


class LookupGenerator:
    """Generate with a model that makes lookup calls, answered by a knowledge base.

    Args:
        model: a Hugging Face causal LM trained on lookup-annotated text (put in eval mode).
        tokenizer (`LookupTokenizer`): the model's tokenizer.
        kb (optional): the knowledge base (``lookup_batch``); ``None`` misses every lookup.
        logit_bias, max_lookups, max_field_tokens, fallback, on_miss, use_db, matching, copy_bias,
            name_bias: see :class:`LookupLogitsProcessor` (``matching="key"``: the paper's single-key
            lookup; ``copy_bias``: added to the first token of an answered value right after the
            call, a value the text has begun then finished; ``name_bias``: added, inside a call's entity, to the next token of
            the KB names the text before the call gives).
        constrained (`bool`, defaults to `False`): keep every query on a key of the KB, through a
            token prefix tree (:class:`lmlm.generate.trie.KeyTrie`) that follows the KB's changes. Its queries
            are KB keys by construction, read against the text as every query is: a key about someone
            else than the text names is a miss.
        loop (`bool`, defaults to `True`): decode greedy and sampled rows with the engine's own
            KV-cached loop (:mod:`lmlm.generate.loop`); ``False`` always calls ``model.generate``.
        cuda_graphs (`bool`, *optional*): decode in the loop over a static KV cache, each one-token
            step replayed from a CUDA graph (:mod:`lmlm.generate.graphs`). ``None`` (default): on a
            CUDA device; ``True``: on a CPU as well (the static cache alone: slower, for checking);
            ``False``: never.
        packed_weights (`bool`, defaults to `True`): on a CPU, run the model's linear layers through
            weights laid out once for oneDNN (bfloat16, and float32 products of 4-64 rows;
            :mod:`lmlm.generate.packed`); the layers keep their parameters, and training or other
            devices and dtypes take their own ``forward``.
    """

    def __init__(self, model, tokenizer: LookupTokenizer, kb=None, *, logit_bias=PAPER_LOGIT_BIAS,
                 max_lookups: int = 16, max_field_tokens: int = 24, fallback: str | None = "unknown",
                 on_miss: str = "text", use_db: bool = True, constrained: bool = False, loop: bool = True,
                 cuda_graphs: bool | None = None, matching: str | None = None, copy_bias: float = 0.0,
                 packed_weights: bool = True, name_bias: float = 0.0):
        self.model = model.eval()
        self.packed_weights = packed_weights
        if packed_weights:
            pack_linears(model)
        self.loop, self.cuda_graphs = loop, cuda_graphs
        self._warned_room = False  # said once: a prompt and new tokens past a rotary model's trained context
        self.tok, self.kb = tokenizer, kb
        self.options = dict(logit_bias=logit_bias, max_lookups=max_lookups, max_field_tokens=max_field_tokens,
                            fallback=fallback, on_miss=on_miss, use_db=use_db, matching=matching,
                            copy_bias=copy_bias, name_bias=name_bias)
        LookupLogitsProcessor(tokenizer, kb, **self.options)  # validate the options now
        self.trie = None
        if constrained:
            if kb is None or not use_db:
                raise ValueError("constrained=True needs a KB and use_db=True")
            from .trie import KeyTrie
            self.trie = KeyTrie(kb, tokenizer)

    def processor(self, **overrides) -> LookupLogitsProcessor:
        """A fresh processor with this generator's options (for evaluators driving ``generate`` themselves)."""
        return LookupLogitsProcessor(self.tok, self.kb, **{"constraint": self.trie, **self.options, **overrides})

    def prompt_ids(self, prompt: str, force_lookup: bool = False) -> list[int]:
        """``doc_id``, the prompt's ids and, with ``force_lookup``, ``<|db_start|>`` (:func:`prompt_row`)."""
        return prompt_row(self.tok, prompt, force_lookup)

    @torch.inference_mode()
    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 64, batch_size: int = 16,
                 force_lookup: bool = False, force_lookup_at: Sequence[int] | Sequence[Sequence[int]] | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 repetition_penalty: float = 1.0, num_beams: int = 1, stop_strings: Sequence[str] | None = None,
                 ignore_eos: bool = False, suppress_ids: Sequence[int] = (), seed: int | None = None,
                 progress: bool = False, cache: dict | None = None, max_lookups: int | None = None,
                 **hf_kwargs) -> list[GenerationResult]:
        """Continue each prompt, answering its lookups from the KB.

        Args:
            prompts: plain-text prompts (each is preceded by the document separator, as in training).
            max_new_tokens: all generated tokens, forced value tokens included.
            batch_size: rows per ``model.generate`` call; prompts are grouped by length, left-padded.
            force_lookup: open a call at the end of every prompt (the paper's T-REx protocol).
            force_lookup_at: offsets into the continuation (0: its first token) where a call must
                begin, the same for every prompt or one list per prompt; a call already open then
                moves it to right after its end.
            do_sample, temperature, top_p, top_k: sampling; the warpers run after the lookup grammar.
            repetition_penalty: Hugging Face's, applied before the lookup grammar.
            num_beams: beam search (the best beam is returned); not with sampling.
            stop_strings: stop a row once its text outside calls ends with one of these.
            ignore_eos: run every row to ``max_new_tokens``; document separators are ordinary tokens.
            suppress_ids: ids never generated (with ``ignore_eos``, the ends of a document and a chat
                turn: a text that runs its full length in words); not the four call markers.
            seed: seeds torch's global generator before sampling.
            progress: show a progress bar over batches.
            cache: lookup answers by query ids, shared across calls (default: one per call).
            max_lookups: calls a row may open in this call (default: the generator's ``max_lookups``).
            **hf_kwargs: passed to ``model.generate`` (``streamer``, ``no_repeat_ngram_size``, ...).

        Returns:
            one :class:`GenerationResult` per prompt, in order.
        """
        if isinstance(prompts, str):
            raise TypeError("generate expects a list of prompts, got a single string")
        if (force_lookup or force_lookup_at is not None) and not self.options["use_db"]:
            raise ValueError("force_lookup and force_lookup_at need use_db=True")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if num_beams > 1 and do_sample:
            raise ValueError(f"num_beams={num_beams} is beam search; it does not combine with do_sample=True")
        if max_lookups is not None and max_lookups < 0:
            raise ValueError(f"max_lookups must be >= 0, got {max_lookups}")
        if (force_lookup or force_lookup_at) and (self.options["max_lookups"] if max_lookups is None
                                                  else max_lookups) == 0:
            raise ValueError("force_lookup and force_lookup_at open a call: they need max_lookups >= 1")
        if stop_strings is not None and (isinstance(stop_strings, str) or not all(stop_strings)):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r}")
        if stop_strings and ignore_eos:
            raise ValueError("stop_strings and ignore_eos exclude each other (a stopped row is padded with eos)")
        if set(suppress_ids) & set(self.tok.call_ids):
            raise ValueError("suppress_ids must not hold the call markers: use use_db=False for text without lookups")
        force_at = force_offsets(force_lookup_at, len(prompts))
        if seed is not None:
            torch.manual_seed(seed)
        warpers = _warpers(do_sample, temperature, top_k, top_p)
        if suppress_ids:
            from transformers import SuppressTokensLogitsProcessor

            warpers.insert(0, SuppressTokensLogitsProcessor(sorted(set(suppress_ids)), self.model.device))
        ids = [self.prompt_ids(p, force_lookup) for p in prompts]
        room = self._room(ids, max_new_tokens)
        order = batch_order(ids)
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        if progress:
            from tqdm.auto import tqdm
            batches = tqdm(batches, desc="generate", unit="batch")
        answers = self.answerer(cache)
        stop_ids = [] if ignore_eos else self._stop_ids()
        user_criteria = list(hf_kwargs.pop("stopping_criteria", None) or [])
        stops = _StopStrings(self.tok, stop_strings) if stop_strings else None
        results: list[GenerationResult | None] = [None] * len(ids)
        for batch in batches:
            rows = [ids[i] for i in batch]
            proc = self.processor(count_from=max(map(len, rows)) - int(force_lookup), cache=answers.cache,
                                  force_at=None if force_at is None else [force_at[i] for i in batch],
                                  **({} if max_lookups is None else {"max_lookups": max_lookups}))
            if stops is not None:
                stops.proc = proc
            criteria = user_criteria + ([stops] if stops is not None else [])
            gen = self._run(rows, LogitsProcessorList([proc, *warpers]), room(rows), stop_ids,
                            stopping_criteria=StoppingCriteriaList(criteria), do_sample=do_sample,
                            repetition_penalty=repetition_penalty, num_beams=num_beams, **hf_kwargs)
            for i, g in zip(batch, gen):
                tail = open_call(ids[i], self.tok)
                results[i] = self._result(prompts[i], tail + g, answers, ids[i][:len(ids[i]) - len(tail)])
        return results

    def _room(self, ids: Sequence[Sequence[int]], max_new_tokens: int):
        """How many tokens a batch of rows may generate. A prompt longer than the model's context is
        refused, naming it (never cut silently); under learned absolute positions (GPT-2) a batch
        stops where the positions end, with a warning saying so."""
        from ..models import context_length

        ctx, hard = context_length(self.model)
        for i, row in enumerate(ids):
            if ctx is not None and len(row) >= ctx + (0 if hard else 1):
                raise ValueError(f"prompt {i + 1} is {len(row)} tokens, the model's context is {ctx} positions: "
                                 "shorten it")
        if ctx is None:
            return lambda rows: max_new_tokens
        if not hard:  # rotary positions go on past the trained context, into text the model never saw
            longest = max(map(len, ids), default=0)
            if longest + max_new_tokens > ctx and not self._warned_room:
                import warnings

                self._warned_room = True
                warnings.warn(f"a {longest}-token prompt and {max_new_tokens} new tokens reach past the model's "
                              f"trained context of {ctx} positions: what it writes there is out of its training",
                              stacklevel=3)
            return lambda rows: max_new_tokens

        def room(rows) -> int:
            n = min(max_new_tokens, ctx - max(map(len, rows)))
            if n < max_new_tokens and not self._warned_room:
                import warnings

                self._warned_room = True
                warnings.warn(f"generation stops at the model's context of {ctx} positions: {n} new tokens instead "
                              f"of {max_new_tokens} for a {max(map(len, rows))}-token prompt", stacklevel=3)
            return n
        return room

    def stream(self, prompt: str, **kwargs) -> Iterator["StreamEvent"]:
        """Generate for one prompt, yielding text pieces and lookups as they are made.

        Takes :meth:`generate`'s keyword arguments (no beams). Yields :class:`StreamEvent` objects:
        pieces of text outside calls, one event per finished lookup (its :class:`LookupTrace`), and
        last the whole :class:`GenerationResult`. Stopping the iteration stops the generation.
        """
        from .stream import stream
        return stream(self, prompt, **kwargs)

    @torch.inference_mode()
    def complete_call(self, prefixes: Sequence[Sequence[int]], batch_size: int = 16) -> list[tuple[str, str]]:
        """Greedily write the query of a call opened at the end of each prefix.

        Each prefix (token ids, usually starting with ``doc_id``) must end with ``<|db_start|>``; the
        model writes entity and relation until ``<|db_retrieve|>`` (always within
        ``2 * max_field_tokens + 2`` tokens). Nothing is looked up. Returns ``(entity, relation)`` per prefix.
        """
        bad = [i for i, p in enumerate(prefixes) if not p or p[-1] != self.tok.start_id]
        if bad:
            raise ValueError(f"every prefix must end with {self.tok.tokens.start}; prefixes {bad[:5]} do not")
        if not self.options["use_db"]:
            raise ValueError("complete_call needs use_db=True")
        limit = 2 * self.options["max_field_tokens"] + 2
        out: list[tuple[str, str]] = [("", "")] * len(prefixes)
        order = batch_order(prefixes)
        for k in range(0, len(order), batch_size):
            batch = order[k:k + batch_size]
            room = max_positions(self.model) - limit  # a prefix past the context: its last part, as in scoring
            rows = [list(prefixes[i])[-room:] for i in batch]
            proc = self.processor(count_from=max(map(len, rows)) - 1, query_only=True)
            gen = self._run(rows, LogitsProcessorList([proc]), limit, [self.tok.retrieve_id], do_sample=False)
            for i, g in zip(batch, gen):
                e, r = query_key([self.tok.start_id, *g, self.tok.retrieve_id], len(g) + 1, self.tok, len(g) + 1)
                out[i] = (self.tok.decode_field(e), self.tok.decode_field(r))
        return out

    # -- pieces ---------------------------------------------------------------------------------
    @property
    def static_decoding(self) -> bool:
        """Whether the loop decodes over a static cache (CUDA graphs on a GPU): ``cuda_graphs`` resolved."""
        if self.cuda_graphs is None:
            return self.model.device.type == "cuda"
        return self.cuda_graphs

    def answerer(self, cache: dict | None = None) -> Answerer:
        """The lookups' answerer with this generator's options; pass its ``cache`` to :meth:`generate`
        to read the answers a generation gave (as streaming does)."""
        o = self.options
        return Answerer(self.tok, self.kb, fallback=o["fallback"], on_miss=o["on_miss"], cache=cache,
                        matching=o["matching"])

    def _stop_ids(self) -> list[int]:
        return sorted({self.tok.eos_id, self.tok.doc_id})

    def _run(self, rows: list[list[int]], processors: LogitsProcessorList, max_new_tokens: int,
             stop_ids: list[int], **kwargs) -> list[list[int]]:
        """Left-pad ``rows``, run ``model.generate`` and return each row's new ids up to its stop token."""
        width = max(map(len, rows))
        pad = self.tok.eos_id
        device = self.model.device
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        if max_new_tokens == 0:
            return [[] for _ in rows]
        with packing(self.packed_weights):  # a model another generator packed runs unpacked here if asked
            if self.loop and kwargs.get("num_beams", 1) == 1 and set(kwargs) <= LOOP_KWARGS:
                kwargs.pop("num_beams", None)
                lookup = next((p for p in processors if isinstance(p, LookupLogitsProcessor)), None)
                out = decode(self.model, input_ids, mask, processors, max_new_tokens, stop_ids, pad,
                             forced_tail=None if lookup is None else lookup.forced_tail,
                             graphs=self.static_decoding, **kwargs)
            else:
                if kwargs.get("do_sample"):  # sampling warpers are ours, after the grammar
                    kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
                out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                          logits_processor=processors, eos_token_id=stop_ids, pad_token_id=pad,
                                          **kwargs)
        gen = []
        stops = set(stop_ids)
        for row in out[:, width:].tolist():
            cut = next((k for k, t in enumerate(row) if t in stops), None)
            gen.append(row if cut is None else row[:cut])
        return gen

    def _result(self, prompt: str, ids: list[int], answers: Answerer, prefix: Sequence[int] = ()) -> GenerationResult:
        return build_result(prompt, ids, self.tok, answers, self.options["max_field_tokens"], self.trie, prefix)


class _Temperature(LogitsProcessor):
    """``scores / temperature`` with each row's best score moved to 0 first: the same distribution,
    and a temperature so small that the logits would overflow to ``+inf`` leaves only the argmax."""

    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        top = scores.max(dim=-1, keepdim=True).values
        return ((scores - top) / self.temperature).nan_to_num(nan=-torch.inf, posinf=0.0)


class _StopStrings(StoppingCriteria):
    """Hugging Face's stop strings, counted only while a row is outside a lookup call."""

    def __init__(self, tok: LookupTokenizer, strings: Sequence[str]):
        from transformers.generation.stopping_criteria import StopStringCriteria

        self.inner = StopStringCriteria(tok.hf, list(strings))
        self.proc: LookupLogitsProcessor | None = None  # the batch's processor: it knows the marker ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        done = self.inner(input_ids, scores, **kwargs)
        if done.any():
            done = done & self.proc.outside_call(input_ids)
        return done


def batch_order(prompt_ids) -> list[int]:
    """The order in which ``generate`` batches prompts: longest first, ties in input order (a stable
    sort), so rows of one batch need little padding. A streamer of a single batch reads rows in it."""
    return sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))


def force_offsets(at, n: int) -> list[tuple[int, ...]] | None:
    """``force_lookup_at`` as one tuple of offsets per prompt."""
    if at is None:
        return None
    at = list(at)
    if all(isinstance(p, int) for p in at):
        return [tuple(at)] * n
    if len(at) != n:
        raise ValueError(f"force_lookup_at needs one list of offsets per prompt ({n}), got {len(at)}")
    return [tuple(p) for p in at]


def _warpers(do_sample: bool, temperature: float, top_k: int, top_p: float) -> list[LogitsProcessor]:
    if not do_sample:
        return []
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")
    out: list[LogitsProcessor] = []
    if temperature != 1.0:
        out.append(_Temperature(temperature))
    if top_k > 0:
        out.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        out.append(TopPLogitsWarper(top_p))
    return out
