"""NLU multiple choice: score each choice's log-probability given the context, as lm-eval does.

The paper checks that offloading facts leaves language understanding intact (appendix, NLU table:
CSQA, HellaSwag, PIQA, SIQA, ARC-Easy; normalized accuracy). A choice's score is the summed
log-probability of its tokens after the context; the prediction is the best choice by

* ``nlu_acc``: the summed log-probability;
* ``nlu_acc_norm``: the summed log-probability divided by the choice's length in characters
  (lm-eval's ``acc_norm``);
* ``nlu_acc_per_token``: the mean log-probability per token.

The model is scored as a plain language model: lookup tokens are banned (their logits set to
-inf before the softmax), so the probability of a choice is spread over text tokens only.
Contexts and choices are tokenized as lm-eval does: the context's trailing spaces move to the
choice, the choice's tokens are those of ``context + choice`` after the context's tokens.

The reader takes BIG-bench's JSON task format (``examples`` with ``input`` and
``target_scores``), e.g. Social IQa. The lm-eval-harness adapter is in :mod:`lmlm.evaluate.harness`.

Exercised by ``lmlm eval nlu``.

Examples:
    >>> items = read_bigbench_mc("bigbench/social_iqa.json")
    >>> items[0].context, items[0].choices
    ("Q: Tracy didn't go home that evening ... before this?\\nA:", ('Make a new plan', ...))
    >>> nlu_eval(model, tok, items)
    {'nlu_acc': 0.41, 'nlu_acc_norm': 0.43, 'nlu_acc_per_token': 0.42, 'nlu_n': 1954.0}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..models import max_positions
from ..scoring import token_logprobs
from ..tokens import LookupTokenizer
from .base import Protocol, mean

__all__ = [
    "NLU",
    "MCItem",
    "Score",
    "choice_scores",
    "nlu_eval",
    "predictions",
    "read_bigbench_mc",
    "score_continuations",
    "split_pair",
]

NLU = Protocol("nlu", "nlu_acc_norm", paper="LMLM appendix, NLU benchmarks (lm-eval multiple choice)")
DEFAULT_TEMPLATE = "Q: {input}\nA:"


@dataclass(frozen=True)
class MCItem:
    """A multiple-choice question: ``context`` then one of ``choices`` (each scored after ``" "``)."""

    context: str
    choices: tuple[str, ...]
    gold: int
    uid: str = ""


@dataclass(frozen=True)
class Score:
    """The log-probability of a continuation: ``logprob`` summed over its ``n_tokens`` tokens;
    ``greedy`` when each of its tokens was the most likely one."""

    logprob: float
    n_tokens: int
    greedy: bool


def read_bigbench_mc(path: str | Path, *, template: str = DEFAULT_TEMPLATE, limit: int | None = None) -> list[MCItem]:
    """Multiple-choice examples of a BIG-bench JSON task (``examples[*].input`` / ``target_scores``).

    The gold choice is the one with the highest target score (the first, on ties); the context is
    ``template`` filled with the example's stripped input.
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a BIG-bench JSON task file ({e}); a .jsonl is read by other protocols") from None
    examples = doc.get("examples") if isinstance(doc, dict) else None
    if not isinstance(examples, list):
        raise ValueError(f"{path}: a BIG-bench task needs an 'examples' list")
    if "{input}" not in template:
        raise ValueError(f"the template {template!r} has no {{input}}: every question would read the same")
    items = []
    for k, ex in enumerate(examples[:limit], 1):
        scores = ex.get("target_scores") if isinstance(ex, dict) else None
        if not isinstance(scores, dict) or len(scores) < 2:
            raise ValueError(f"{path}: example {k} has no multiple-choice 'target_scores'")
        if not isinstance(ex.get("input"), str):
            raise ValueError(f"{path}: example {k} has no 'input' text")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scores.values()):
            raise ValueError(f"{path}: example {k}'s target_scores are not all numbers: {scores}")
        best = max(scores.values())
        if best <= 0:
            raise ValueError(f"{path}: example {k} marks no choice right (every target score is {best})")
        choices = tuple(scores)
        try:
            context = template.format(input=ex["input"].strip())
        except (KeyError, IndexError) as e:
            raise ValueError(f"the template {template!r} names {e}, which an example does not have: use {{input}}") \
                from None
        items.append(MCItem(context, choices, next(i for i, c in enumerate(choices) if scores[c] == best), str(k - 1)))
    return items


def split_pair(tok: LookupTokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of ``context`` (after the document separator) and of ``continuation`` after it.

    As lm-eval: trailing spaces of the context go to the continuation, and the continuation's ids
    are those of ``context + continuation`` past the context's ids.
    """
    n_space = len(context) - len(context.rstrip())
    if n_space:
        context, continuation = context[:-n_space], context[-n_space:] + continuation
    ctx = tok.encode_text(context)
    whole = tok.encode_text(context + continuation)
    return [tok.doc_id, *ctx], whole[len(ctx):]


def score_continuations(model, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                        banned: Sequence[int] = (), batch_size: int = 16) -> list[Score]:
    """Log-probability of each continuation's ids given its context's ids.

    Args:
        model: a Hugging Face causal LM.
        pairs: ``(context_ids, continuation_ids)``; the context must hold at least one id.
            Sequences longer than the model's context lose their oldest context ids.
        banned: token ids whose logits are set to -inf (the lookup tokens).
        batch_size: rows per forward pass (right padded).
    """
    max_len = max_positions(model)
    seqs = []
    for ctx, cont in pairs:
        if not ctx or not cont:
            raise ValueError("every pair needs a non-empty context and continuation")
        if len(cont) >= max_len:
            raise ValueError(f"a continuation of {len(cont)} tokens does not fit the model's {max_len}")
        seqs.append((list(ctx) + list(cont))[-max_len:])
    scored = token_logprobs(model, seqs, batch_size, max_len, banned=banned, greedy=True)
    out = []
    for (lp, hit), (_, cont) in zip(scored, pairs):
        k = len(cont)  # the last k scores are the continuation's
        out.append(Score(float(lp[-k:].sum()), k, bool(hit[-k:].all())))
    return out


def choice_scores(model, tok: LookupTokenizer, items: Sequence[MCItem], *, batch_size: int = 16,
                  ban_lookup: bool = True) -> list[list[Score]]:
    """One :class:`Score` per choice of every item (each choice scored as ``" " + choice``)."""
    pairs = [split_pair(tok, it.context, " " + c) for it in items for c in it.choices]
    max_len, k = max_positions(model), 0
    for it in items:
        for c in it.choices:
            if len(pairs[k][1]) >= max_len:
                raise ValueError(f"example {int(it.uid) + 1 if it.uid.isdigit() else it.uid}: the choice "
                                 f"{c[:40]!r}{'...' if len(c) > 40 else ''} is {len(pairs[k][1])} tokens, which do "
                                 f"not fit the model's context of {max_len}")
            k += 1
    flat = score_continuations(model, pairs, banned=tok.call_ids if ban_lookup else (), batch_size=batch_size)
    out, k = [], 0
    for it in items:
        out.append(flat[k:k + len(it.choices)])
        k += len(it.choices)
    return out


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))  # first best on ties


def predictions(item: MCItem, scores: Sequence[Score]) -> dict[str, int]:
    """The chosen index under each rule: ``acc`` (sum), ``acc_norm`` (per character), ``acc_per_token``."""
    return {"acc": _argmax([s.logprob for s in scores]),
            "acc_norm": _argmax([s.logprob / max(len(c), 1) for s, c in zip(scores, item.choices)]),
            "acc_per_token": _argmax([s.logprob / s.n_tokens for s in scores])}


def nlu_eval(model, tok: LookupTokenizer, items: Sequence[MCItem], *, batch_size: int = 16,
             ban_lookup: bool = True, records: list | None = None) -> dict[str, float]:
    """Multiple-choice accuracy of a causal LM: ``nlu_acc``, ``nlu_acc_norm``, ``nlu_acc_per_token``, ``nlu_n``,
    and ``nlu_chance``, the accuracy of a uniform guess (the mean of 1 / choices).

    Args:
        model: a Hugging Face causal LM (an LMLM checkpoint or a Standard one).
        tok: its :class:`LookupTokenizer`.
        items: from :func:`read_bigbench_mc`.
        ban_lookup (bool, default True): renormalize over non-lookup tokens.
        records (list, optional): appended with one dict per item (choice log-probs, predictions).
    """
    scores = choice_scores(model, tok, items, batch_size=batch_size, ban_lookup=ban_lookup)
    preds = [predictions(it, s) for it, s in zip(items, scores)]
    out = {NLU.key(rule): mean(p[rule] == it.gold for p, it in zip(preds, items))
           for rule in ("acc", "acc_norm", "acc_per_token")}
    out[NLU.key("chance")] = mean(1 / len(it.choices) for it in items)  # what guessing scores, to read the rest by
    out[NLU.key("n")] = float(len(items))
    if records is not None:
        records.extend({"context": it.context, "choices": list(it.choices), "gold": it.gold,
                        "logprobs": [s.logprob for s in sc], "n_tokens": [s.n_tokens for s in sc], **p}
                       for it, sc, p in zip(items, scores, preds))
    return out
