"""Lookup decoding on vLLM (GPU serving): stop at ``<|db_retrieve|>``, answer, resume with prefix caching.

Every round submits each unfinished row as token ids and lets vLLM generate until the row writes
``<|db_retrieve|>`` (or a stop token, or its budget ends). The queries of all rows that stopped at
retrieve are answered in one KB batch, the value ids and ``<|db_end|>`` are appended, and the rows
go back in. vLLM's prefix caching keeps the KV blocks of the text already seen, so a round encodes
only what was appended. Within a round the grammar is the Hugging Face engine's
(:mod:`lmlm.generate.vllm_grammar` runs each row's :class:`lmlm.generate.rows.RowState`, as the
engine's processor does: the markers' bias, the markers that cannot come next banned, over-long
fields closed); the
value and ``<|db_end|>`` are appended here rather than forced token by token. Calls forced at offsets
(``force_lookup_at``) and queries kept on the KB's keys (``constrained=True``) work as in the engine:
the prefix tree reaches vLLM's engine process as a file of key paths, one per KB version. So do the
engine's ``copy_bias`` (the round after an answer favours the value's tokens) and ``name_bias``: a
row then also stops at ``<|db_start|>``, the KB names the text before the call gives are found here,
and the row goes on with them.

Install with ``pip install 'lmlm[vllm]'``.

Examples:
    >>> gen = VLLMLookupGenerator("runs/quickstart/train-lmlm/checkpoint", kb=kb, gpu_memory_utilization=0.3)
    >>> gen.generate(["Ada Lovelace was born in"])[0].trace[0].value
    'London'
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..tokens import LookupTokenizer
from .answers import Answerer, call_context, call_start, query_key
from .rows import PAPER_LOGIT_BIAS
from .trace import GenerationResult, build_result, open_call, prompt_row

__all__ = ["VLLMLookupGenerator", "llm_options", "vllm_installed"]


def llm_options(specs: Sequence[str], defaults: dict | None = None) -> dict:
    """``KEY=VALUE`` strings as keyword arguments of ``vllm.LLM``, each VALUE read as JSON where it
    parses (``0.3``, ``true``, ``{"backend": ...}``) and kept as text otherwise; ValueError names a
    malformed one."""
    import json

    options = dict(defaults or {})
    for spec in specs:
        key, eq, value = spec.partition("=")
        if not eq or not key.isidentifier():
            raise ValueError(f"expected KEY=VALUE, got {spec!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None

class VLLMLookupGenerator:
    """Generate with lookups on a vLLM engine.

    Args:
        model: a checkpoint folder or hub name vLLM can load.
        kb (optional): the knowledge base (``lookup_batch``); ``None`` misses every lookup.
        tokenizer (`LookupTokenizer`, optional): default: loaded from ``model`` with ``tokens``.
        tokens: the lookup token vocabulary when loading the tokenizer (``paper`` or ``released``).
        logit_bias, max_lookups, max_field_tokens, fallback, on_miss, use_db, constrained, matching, copy_bias,
            name_bias: as for :class:`lmlm.generate.LookupGenerator` (``constrained``: the KB's prefix tree of
            keys, written to a file the engine's process reads, again whenever the KB's version moves).
        **llm_kwargs: passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``dtype``, ...).
    """

    def __init__(self, model: str | Path, kb=None, *, tokenizer: LookupTokenizer | None = None, tokens=None,
                 logit_bias=PAPER_LOGIT_BIAS, max_lookups: int = 16, max_field_tokens: int = 24,
                 fallback: str | None = "unknown", on_miss: str = "text", use_db: bool = True,
                 constrained: bool = False, matching: str | None = None, copy_bias: float = 0.0,
                 name_bias: float = 0.0, **llm_kwargs):
        import os

        for name, v in (("copy_bias", copy_bias), ("name_bias", name_bias)):
            if not (isinstance(v, (int, float)) and 0.0 <= float(v) < float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

        # vLLM logs to stdout by default; lmlm's commands print their results there (--json, the benches'
        # JSON), so vLLM's logs go to stderr unless the caller chose a stream (its engine process inherits it)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("the vLLM backend needs vllm: pip install 'lmlm[vllm]'") from e
        if tokenizer is None:
            from ..lookup import LookupTokens
            from ..tokens import load_tokenizer
            vocab = LookupTokens.from_name(tokens) if isinstance(tokens, str) else tokens
            tokenizer = load_tokenizer(model, vocab) if vocab is not None else load_tokenizer(model)
        self.tok, self.kb = tokenizer, kb
        self.options = dict(logit_bias=logit_bias, max_lookups=max_lookups, max_field_tokens=max_field_tokens,
                            fallback=fallback, on_miss=on_miss, use_db=use_db, matching=matching,
                            copy_bias=float(copy_bias), name_bias=float(name_bias))
        Answerer(tokenizer, kb, fallback=fallback, on_miss=on_miss, matching=matching)  # validate the options now
        self.trie = self._trie_dir = None
        if constrained:
            if kb is None or not use_db:
                raise ValueError("constrained=True needs a KB and use_db=True")
            import tempfile

            from .trie import KeyTrie
            self.trie, self._trie_dir = KeyTrie(kb, tokenizer), tempfile.TemporaryDirectory(prefix="lmlm-trie-")
            self._trie_file: tuple[int | None, str] = (None, "")
        # the row grammar's settings (plain lists, for vLLM's engine process), the same for every row and round
        self._grammar = dict(call_ids=list(tokenizer.call_ids), stop_ids=sorted({tokenizer.eos_id, tokenizer.doc_id}),
                             logit_bias=list(logit_bias) if logit_bias is not None else None, max_lookups=max_lookups,
                             max_field_tokens=max_field_tokens, use_db=use_db)
        from .vllm_grammar import LookupGrammar

        processors = [*(llm_kwargs.pop("logits_processors", None) or ()), LookupGrammar]
        self.model_dir = model
        self.llm = LLM(model=str(model), enable_prefix_caching=True, logits_processors=processors, **llm_kwargs)

    def close(self) -> None:
        """Stop vLLM's engine (its process and GPU memory) and remove the prefix tree's files."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        if self._trie_dir is not None:
            self._trie_dir.cleanup()

    def __enter__(self) -> "VLLMLookupGenerator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prompt_ids(self, prompt: str, force_lookup: bool = False) -> list[int]:
        return prompt_row(self.tok, prompt, force_lookup)

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 64, force_lookup: bool = False,
                 force_lookup_at: Sequence[int] | Sequence[Sequence[int]] | None = None,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, repetition_penalty: float = 1.0,
                 seed: int | None = None, ignore_eos: bool = False) -> list[GenerationResult]:
        """Continue each prompt (greedy at ``temperature=0``); one :class:`GenerationResult` per prompt.
        ``force_lookup_at``: offsets into the continuation where a call must begin, as for
        :meth:`lmlm.generate.LookupGenerator.generate`."""
        from .base import force_offsets

        if isinstance(prompts, str):
            raise TypeError("generate expects a list of prompts, got a single string")
        if (force_lookup or force_lookup_at is not None) and not self.options["use_db"]:
            raise ValueError("force_lookup and force_lookup_at need use_db=True")
        force_at = force_offsets(force_lookup_at, len(prompts))
        tok = self.tok
        prompt_ids = [self.prompt_ids(p, force_lookup) for p in prompts]
        new: list[list[int]] = [open_call(ids, tok) for ids in prompt_ids]  # a forced call is part of the output
        budget = [max_new_tokens] * len(prompts)
        o = self.options
        answers = Answerer(tok, self.kb, fallback=o["fallback"], on_miss=o["on_miss"], matching=o["matching"])
        stops = [] if ignore_eos else sorted({tok.eos_id, tok.doc_id})
        sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1,
                        repetition_penalty=repetition_penalty, seed=seed, ignore_eos=ignore_eos)
        skip = [len(open_call(ids, tok)) for ids in prompt_ids]
        copies: dict[int, list[int]] = {}  # row -> the value just answered, for the copy bias
        missed: set[int] = set()  # rows whose last call the KB found nothing for: text goes on first

        def full(i: int) -> list[int]:  # the row as the model sees it: prompt, then what follows the open call
            return prompt_ids[i] + new[i][skip[i]:]

        window = 2 * self.options["max_field_tokens"] + 2
        active = [i for i in range(len(prompts)) if budget[i] > 0]
        while active:
            trie = self._trie_path()
            rows = {i: dict(trie=trie, origin=len(prompt_ids[i]) - skip[i],
                            force_at=list(force_at[i]) if force_at else None, missed=i in missed,
                            **self._biases(full(i), copies.pop(i, None), answers)) for i in active}
            missed.clear()
            outs = self._round([full(i) for i in active],
                               [self._params(new[i], budget[i], stops, sampling, rows[i]) for i in active])
            asking = []
            for i, got in zip(active, outs):
                budget[i] -= len(got)
                if got and got[-1] in stops:
                    new[i] += got[:-1]
                    budget[i] = 0
                    continue
                new[i] += got
                if got and got[-1] == tok.retrieve_id and self.options["use_db"] and budget[i] > 0:
                    asking.append(i)
                elif not (got and got[-1] == tok.start_id and budget[i] > 0):  # a call opens: find its names
                    budget[i] = 0
            keys = [query_key(full(i), len(full(i)) - 1, tok, window) for i in asking]
            ctxs = [call_context(full(i), call_start(full(i), len(full(i)) - 1, tok), tok) for i in asking]
            answers.resolve(keys, ctxs)
            for i, key, ctx in zip(asking, keys, ctxs):
                answer = answers.get(key, ctx)
                value = list(answer.continuation[:budget[i]])
                new[i] += value
                budget[i] -= len(value)
                if answer.match is not None:
                    copies[i] = value[:-1]
                else:
                    missed.add(i)
            active = [i for i in active if budget[i] > 0]
        return [build_result(p, ids, tok, answers, self.options["max_field_tokens"], prefix=pi[:len(pi) - s])
                for p, ids, pi, s in zip(prompts, new, prompt_ids, skip)]

    def _biases(self, row: list[int], copy: list[int] | None, answers: Answerer) -> dict:
        """The row grammar's biases for a round on ``row``: the value it just got (``copy``) favoured
        while the text states it, or the names the text gives favoured in the call ``row`` ends with."""
        o, spec = self.options, {}
        if o["copy_bias"] and copy:
            spec.update(copy_bias=o["copy_bias"], copy=copy)
        if o["name_bias"] and row[-1] == self.tok.start_id:
            spec.update(name_bias=o["name_bias"], names=answers.names_before(row, len(row) - 1))
        return spec

    def _trie_path(self) -> str | None:
        """The file of the prefix tree's key paths for the KB's current version (``None``: unconstrained)."""
        if self.trie is None:
            return None
        self.trie.refresh()
        version, path = self._trie_file
        if version != self.trie.version:
            import json

            path = f"{self._trie_dir.name}/keys-{self.trie.version}.json"
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump([list(p) for p in self.trie.paths()], f)
            Path(path + ".tmp").replace(path)
            self._trie_file = (self.trie.version, path)
        return path

    def _params(self, so_far: list[int], budget: int, stops: list[int], sampling: dict, row: dict):
        from vllm import SamplingParams

        from .vllm_grammar import GRAMMAR_ARG

        t, use_db = self.tok, self.options["use_db"]
        stop_ids = stops + ([t.retrieve_id] if use_db else []) + ([t.start_id] if use_db and self.options["name_bias"]
                                                                 else [])
        grammar = {**self._grammar, **row, "calls": so_far.count(t.start_id)}  # calls made in earlier rounds
        return SamplingParams(max_tokens=budget, stop_token_ids=stop_ids, detokenize=False, skip_special_tokens=False,
                              extra_args={GRAMMAR_ARG: grammar}, **sampling)

    def _round(self, rows: list[list[int]], params: list) -> list[list[int]]:
        """One vLLM call over all rows; each row's new ids, ending with the stop token that ended it."""
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        got = []
        for out in outs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            stop = c.stop_reason if isinstance(c.stop_reason, int) else None
            if stop is not None and (not ids or ids[-1] != stop):  # some versions leave the stop id out
                ids.append(stop)
            got.append(ids)
        return got
