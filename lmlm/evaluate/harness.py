"""An lm-evaluation-harness model for LMLM checkpoints, registered as ``lmlm`` when lm-eval is installed.

Log-likelihood requests are scored as in :mod:`lmlm.evaluate.nlu` (lookup tokens banned);
generation requests run the lookup generator, answering lookups from a KB when one is given, and
return the text with lookups stripped. :class:`HarnessAdapter` holds the logic and needs no lm-eval;
:class:`LMLMEvalModel` is the registered ``lm_eval.api.model.LM`` subclass.

Examples:
    >>> import lm_eval, lmlm.evaluate.harness  # the import registers "lmlm"
    >>> lm_eval.simple_evaluate(model="lmlm", model_args="pretrained=runs/x/checkpoint,kb=runs/x/kb",
    ...                         tasks=["siqa", "piqa"])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import output_text
from .nlu import score_continuations, split_pair

__all__ = ["HarnessAdapter", "LMLMEvalModel"]


def _args(request) -> tuple:
    return tuple(request.args) if hasattr(request, "args") else tuple(request)


class HarnessAdapter:
    """Answers lm-eval's three request types for a model and its :class:`lmlm.tokens.LookupTokenizer`.

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its ``LookupTokenizer``.
        kb (optional): the knowledge base answering lookups while generating (None: lookups banned).
        batch_size (int, default 16): rows per forward pass or ``generate`` call.
        ban_lookup (bool, default True): score log-likelihoods over non-lookup tokens only.
    """

    def __init__(self, model, tokenizer, kb=None, *, batch_size: int = 16, ban_lookup: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tok, self.kb = model.eval(), tokenizer, kb
        self.batch_size, self.ban_lookup = batch_size, ban_lookup
        self._generator = None

    @classmethod
    def from_checkpoint(cls, pretrained: str, kb: str | None = None, device: str | None = None, **kwargs):
        """Open a checkpoint folder (:func:`lmlm.checkpoint.load_checkpoint`) and, if given, a KB folder."""
        from ..checkpoint import load_checkpoint
        from ..kb import KnowledgeBase

        model, tok, _ = load_checkpoint(pretrained, device=device)
        return cls(model, tok, KnowledgeBase.open(kb) if kb else None, **kwargs)

    @property
    def generator(self):
        if self._generator is None:
            from ..generate import LookupGenerator
            self._generator = LookupGenerator(self.model, self.tok, self.kb, use_db=self.kb is not None)
        return self._generator

    def _score(self, pairs):
        banned = self.tok.call_ids if self.ban_lookup else ()
        return score_continuations(self.model, pairs, banned=banned, batch_size=self.batch_size)

    def loglikelihood(self, requests: Sequence) -> list[tuple[float, bool]]:
        """``(log P(continuation | context), is_greedy)`` per request ``args = (context, continuation)``."""
        pairs = [split_pair(self.tok, *_args(r)[:2]) for r in requests]
        empty = [i for i, (_, cont) in enumerate(pairs) if not cont]
        if empty:
            raise ValueError(f"requests {empty[:5]} have an empty continuation")
        return [(s.logprob, s.greedy) for s in self._score(pairs)]

    def loglikelihood_rolling(self, requests: Sequence) -> list[float]:
        """Log-probability of each whole string ``args = (text,)``, in windows of the model's context."""
        from ..models import max_positions

        window = max_positions(self.model) - 1
        pairs, owner = [], []
        for k, r in enumerate(requests):
            ids = [self.tok.doc_id, *self.tok.encode_text(_args(r)[0])]
            for start in range(1, len(ids), window):  # each window keeps the ids before it as context
                pairs.append((ids[:start], ids[start:start + window]))
                owner.append(k)
        totals = [0.0] * len(requests)
        for k, s in zip(owner, self._score(pairs)):
            totals[k] += s.logprob
        return totals

    def generate_until(self, requests: Sequence) -> list[str]:
        """Greedy continuations of ``args = (context, {"until": [...], "max_gen_toks": N, ...})``, cut at ``until``."""
        out = []
        for r in requests:
            context, kwargs = _args(r)[:2]
            until = kwargs.get("until") or []
            until = [u for u in ([until] if isinstance(until, str) else until) if u]  # "" would stop at once
            res = self.generator.generate([context], max_new_tokens=int(kwargs.get("max_gen_toks", 256)),
                                          batch_size=1, stop_strings=until or None)[0]
            text = output_text(res, self.tok.tokens)
            for stop in until:
                text = text.split(stop, 1)[0]
            out.append(text)
        return out


try:  # the lm-eval model, when lm-eval is installed
    from lm_eval.api.model import LM as _LM
    from lm_eval.api.registry import register_model as _register_model
except ImportError:  # pragma: no cover - depends on the environment
    LMLMEvalModel = None
else:
    @_register_model("lmlm")
    class LMLMEvalModel(_LM):
        """lm-eval's ``--model lmlm``: ``model_args="pretrained=CHECKPOINT,kb=KB_FOLDER"``."""

        def __init__(self, pretrained: str, kb: str | None = None, batch_size: Any = 16, device: str | None = None,
                     ban_lookup: bool = True, **_ignored):
            super().__init__()
            size = int(batch_size) if str(batch_size).isdigit() else 16
            self.adapter = HarnessAdapter.from_checkpoint(pretrained, kb, device=device, batch_size=size,
                                                          ban_lookup=ban_lookup)

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return self.adapter.loglikelihood(requests)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            return self.adapter.loglikelihood_rolling(requests)

        def generate_until(self, requests, disable_tqdm: bool = False):
            return self.adapter.generate_until(requests)
