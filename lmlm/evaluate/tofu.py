"""TOFU unlearning metrics: ROUGE-L recall, answer probability, truth ratio, forget quality, model utility.

The paper evaluates unlearning on TOFU (appendix B, "TOFU"), building on the official
implementation (locuslab/tofu, continued as locuslab/open-unlearning). What is implemented here,
with the definitions of Maini et al., "TOFU: A Task of Fictitious Unlearning for LLMs" (2024), §2.5:

* ROUGE-L recall of the greedy answer against the gold answer, by ``rouge-score`` (longest common
  subsequence over lowercased ``[a-z0-9]+`` runs), lookups stripped from the output (paper). TOFU
  runs it with the Porter stemmer; ``use_stemmer=True`` does the same, the default does not stem.
* Answer probability: ``P(a | q) ** (1 / |a|)``, the per-token geometric mean (forget and retain
  sets); for the real-authors and world-facts sets TOFU divides it by the sum over the correct and
  the perturbed answers (:func:`option_probability`).
* Truth ratio ``R = (prod_k P(a_pert_k | q) ** (1 / |a_pert_k|)) ** (1 / K) / P(a_para | q) ** (1 / |a_para|)``:
  the geometric mean of the length-normalized perturbed-answer probabilities over the
  length-normalized paraphrased-answer probability. TOFU reports ``max(0, 1 - R)`` on the retain,
  real-authors and world-facts sets (open-unlearning's "true_better" aggregator) and
  ``min(R, 1 / R)`` on the forget set ("closer_to_1_better"); see :func:`truth_ratio_score`.
* Forget quality: the p-value of the two-sample Kolmogorov-Smirnov test between the forget-set
  truth ratios of the unlearned model and of the retain model (TOFU uses ``scipy.stats.ks_2samp``,
  whose default is the exact distribution up to 10,000 items per sample); so does :func:`ks_2samp`.
* Model utility: the harmonic mean of the nine retain / real-authors / world-facts values
  (probability, ROUGE-L recall, truth-ratio score).

Likelihoods of an LMLM: the paper scores them on the *annotated* answers, over the trained tokens
(``T_train``: text, queries and markers, not the returned values). With ``kb`` given,
:func:`tofu_answer_stats` does this: each call of an annotated answer is answered by the KB as it is
*now* (``"unknown"`` when the fact was deleted), so a deleted fact no longer helps the model
restate its value. Without ``kb`` the plain answers are scored, lookup tokens banned.

Value tokens only (:func:`value_truth_ratios`): the perturbed answers are the paraphrase with wrong
values, so every other token is shared and only dilutes the truth ratio with the phrasing's noise.
The same ratio over the value's tokens alone (the span where the paraphrase and its perturbations
differ, as whole words; for an LMLM the value it writes after the call) is a control on what a low
forget quality measures: the facts, or the rest of the sentence.

Readers take TOFU's files as released (``forget01.json``, ``retain_perturbed.json`` ...): JSON
lines or a JSON list of records with ``question``, ``answer`` and, in the ``*_perturbed`` files,
``paraphrased_answer`` and ``perturbed_answer`` (a list). Records may also carry the annotated
forms (``annotated_answer``, ``annotated_paraphrased_answer``, ``annotated_perturbed_answer``), as
:mod:`lmlm.worlds.tofu` writes them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .base import mean, outputs_of, read_json_records

__all__ = [
    "QA_TEMPLATE",
    "TofuItem",
    "forget_quality",
    "kb_answered",
    "ks_2samp",
    "model_utility",
    "normalized_probability",
    "option_probability",
    "read_tofu",
    "rouge_l_recall",
    "tofu_answer_stats",
    "tofu_eval",
    "truth_ratio",
    "truth_ratio_score",
    "value_span",
    "value_truth_ratios",
]

QA_TEMPLATE = "Question: {question}\nAnswer:"


@dataclass(frozen=True)
class TofuItem:
    """One TOFU question; the ``annotated_*`` fields hold the answers with their lookup calls."""

    question: str
    answer: str
    paraphrased_answer: str | None = None
    perturbed_answers: tuple[str, ...] = ()
    annotated_answer: str | None = field(default=None, compare=False)
    annotated_paraphrased_answer: str | None = field(default=None, compare=False)
    annotated_perturbed_answers: tuple[str, ...] = field(default=(), compare=False)


def read_tofu(path: str | Path, *, limit: int | None = None) -> list[TofuItem]:
    """Read a TOFU split (JSON lines or a JSON list)."""
    items = []
    for k, rec in enumerate(read_json_records(path)[:limit], 1):
        if not isinstance(rec, dict) or "question" not in rec or "answer" not in rec:
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise ValueError(f"{path}: record {k} needs 'question' and 'answer'; got {got}")
        for name in ("question", "answer", "paraphrased_answer", "annotated_answer", "annotated_paraphrased_answer"):
            if rec.get(name) is not None and not isinstance(rec[name], str):
                raise ValueError(f"{path}: record {k}: {name!r} is {rec[name]!r}, not a text")
        pert, ann_pert = (_strings(rec.get(name) or (), path, k, name)
                          for name in ("perturbed_answer", "annotated_perturbed_answer"))
        items.append(TofuItem(rec["question"], rec["answer"], rec.get("paraphrased_answer"), pert,
                              rec.get("annotated_answer"), rec.get("annotated_paraphrased_answer"), ann_pert))
    return items


def _strings(x, path, k: int, name: str) -> tuple[str, ...]:
    """A text or a list of texts (``perturbed_answer``) as a tuple; anything else names its record."""
    if isinstance(x, str):
        return (x,)
    if isinstance(x, (list, tuple)) and all(isinstance(v, str) for v in x):
        return tuple(x)
    raise ValueError(f"{path}: record {k}: {name!r} is {x!r}, not a list of texts")


# -- ROUGE-L -------------------------------------------------------------------------------------

@functools.cache
def _rouge_l(use_stemmer: bool):
    from ..errors import need

    rouge_scorer = need("rouge_score.rouge_scorer", "tofu", "TOFU's ROUGE-L")

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer)


def rouge_l_recall(prediction: str, reference: str, use_stemmer: bool = False) -> float:
    """ROUGE-L recall of ``prediction`` against ``reference`` by ``rouge-score`` (its tokens: lowercased
    ``[a-z0-9]`` runs; TOFU's own runs add the Porter stemmer, ``use_stemmer=True``); 0 for an empty reference.

    Examples:
        >>> rouge_l_recall("the cat sat on a mat", "The cat is on the mat.")
        0.6666666666666666
    """
    return _rouge_l(bool(use_stemmer)).score(reference, prediction)["rougeL"].recall


# -- probabilities and truth ratio ---------------------------------------------------------------

def normalized_probability(logprob: float, n_tokens: int) -> float:
    """``exp(logprob / n_tokens)``: the per-token geometric mean of a sequence's probability."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    return math.exp(logprob / n_tokens)


def option_probability(correct: float, wrong: Sequence[float]) -> float:
    """TOFU's probability on real authors / world facts: ``p_correct / (p_correct + sum(p_wrong))``."""
    return correct / (correct + sum(wrong))


def truth_ratio(paraphrased: tuple[float, int], perturbed: Sequence[tuple[float, int]]) -> float:
    """``R``: geometric mean of the normalized perturbed probabilities over the normalized paraphrased one.

    Each answer is ``(summed log-probability, number of tokens)``.
    """
    if not perturbed:
        raise ValueError("truth_ratio needs at least one perturbed answer")
    log_pert = mean(lp / n for lp, n in perturbed)
    return math.exp(log_pert - paraphrased[0] / paraphrased[1])


def truth_ratio_score(ratios: Sequence[float], forget: bool = False) -> float:
    """TOFU's summary of truth ratios: ``mean(min(R, 1/R))`` on the forget set, else ``mean(max(0, 1 - R))``."""
    if forget:
        return mean(min(r, 1 / r) if r > 0 else 0.0 for r in ratios)
    return mean(max(0.0, 1 - r) for r in ratios)


# -- forget quality: two-sample Kolmogorov-Smirnov ----------------------------------------------

def ks_2samp(a: Sequence[float], b: Sequence[float], method: str = "auto") -> tuple[float, float]:
    """Two-sided two-sample KS test, ``(statistic D, p-value)``: :func:`scipy.stats.ks_2samp`, as TOFU
    computes forget quality (``method``: ``"auto"``, ``"exact"`` or ``"asymp"``)."""
    from ..errors import need

    stats = need("scipy.stats", "tofu", "TOFU's KS test")

    if len(a) == 0 or len(b) == 0:
        raise ValueError("ks_2samp needs two non-empty samples")
    if method not in ("auto", "exact", "asymp"):
        raise ValueError(f"method must be 'auto', 'exact' or 'asymp', got {method!r}")
    r = stats.ks_2samp(a, b, method=method)
    return float(r.statistic), float(r.pvalue)


def forget_quality(unlearned_ratios: Sequence[float], retain_ratios: Sequence[float], method: str = "auto") -> float:
    """KS-test p-value between the forget-set truth ratios of the unlearned and the retain model."""
    return ks_2samp(unlearned_ratios, retain_ratios, method)[1]


def model_utility(values: Mapping[str, float] | Sequence[float]) -> float:
    """Harmonic mean of the utility values (0 if any is 0); TOFU uses the nine retain / real-authors /
    world-facts probability, ROUGE-L recall and truth-ratio scores."""
    vals = list(values.values()) if isinstance(values, Mapping) else list(values)
    if not vals:
        raise ValueError("model_utility needs at least one value")
    if any(v < 0 for v in vals):
        raise ValueError(f"utility values must be >= 0, got {vals}")
    return float(statistics.harmonic_mean(vals))  # 0 when any value is 0


# -- running a model -----------------------------------------------------------------------------

def _answers(it: TofuItem, annotated: bool) -> list[tuple[str, str]]:
    """``(kind, text)`` of the answers of an item: ``answer``, then ``para`` and ``pert`` when present."""
    if annotated:
        a, para, pert = it.annotated_answer, it.annotated_paraphrased_answer, it.annotated_perturbed_answers
        if a is None or (it.paraphrased_answer and it.perturbed_answers and (para is None or not pert)):
            raise ValueError(f"scoring an LMLM with its KB needs the answers annotated with lookup calls "
                             f"('annotated_answer', 'annotated_paraphrased_answer', 'annotated_perturbed_answer'; "
                             f"the TOFU release has none); question {it.question!r} has none. --no-db scores "
                             f"the plain answers, the model without its KB")
    else:
        a, para, pert = it.answer, it.paraphrased_answer, it.perturbed_answers
    out = [("answer", a)]
    if it.paraphrased_answer and it.perturbed_answers:
        out += [("para", para)] + [("pert", p) for p in pert]
    return out


def kb_answered(documents: Sequence[Sequence], kb, fallback: str = "unknown") -> list[list]:
    """Each document (a list of segments) with its calls' values replaced by the KB's current answers
    (``fallback`` on a miss); every distinct key is looked up once, in one batch."""
    from ..lookup import Lookup

    keys = list(dict.fromkeys(s.key for d in documents for s in d if isinstance(s, Lookup)))
    found = dict(zip(keys, kb.lookup_batch(keys))) if keys else {}
    return [[Lookup(s.entity, s.relation, found[s.key].value if found[s.key] is not None else fallback)
             if isinstance(s, Lookup) else s for s in d] for d in documents]


def _annotated_scores(model, tok, contexts: Sequence[str], answers: Sequence[str], kb,
                      batch_size: int) -> list[tuple[float, int]]:
    """``(log-probability, tokens)`` of each annotated answer after its context, over its trained
    tokens (values and ``<|db_end|>`` excluded), the calls answered by ``kb``."""
    from ..lookup import Text, parse
    from ..tokens import VALUE
    from ..scoring import token_logprobs

    answered = kb_answered([parse(" " + a.strip(), form="dblookup").segments for a in answers], kb)
    seqs, scored = [], []
    for ctx, segs in zip(contexts, answered):
        enc = tok.encode([Text(ctx)] + segs)
        first = 1 + len(tok.encode_text(ctx))  # doc separator + context tokens
        seqs.append(enc.input_ids)
        scored.append([k for k in range(first, len(enc)) if enc.roles[k] != VALUE and enc.input_ids[k] != tok.end_id])
    out = []
    for lp, keep in zip(token_logprobs(model, seqs, batch_size), scored):
        keep = [k for k in keep if k - 1 < len(lp)]  # what fits the model's context
        if not keep:
            raise ValueError("an annotated answer does not fit the model's context")
        out.append((float(sum(lp[k - 1] for k in keep)), len(keep)))  # lp[t] scores token t + 1
    return out


def tofu_answer_stats(model, tok, items: Sequence[TofuItem], *, template: str = QA_TEMPLATE,
                      batch_size: int = 16, ban_lookup: bool = True, kb=None) -> list[dict]:
    """Per item: ``prob`` (normalized answer probability) and, with paraphrased and perturbed
    answers, ``truth_ratio`` and ``option_prob`` (correct vs perturbed normalized probabilities).

    With ``kb`` (an LMLM's knowledge base), the annotated answers are scored with their calls
    answered by the KB, over the trained tokens (see the module docstring); else the plain answers,
    lookup tokens banned when ``ban_lookup``.
    """
    from .nlu import score_continuations, split_pair

    contexts, texts, where = [], [], []
    for k, it in enumerate(items):
        ctx = template.format(question=it.question)
        for kind, a in _answers(it, annotated=kb is not None):
            contexts.append(ctx)
            texts.append(a)
            where.append((k, kind))
    if kb is not None:
        scores = _annotated_scores(model, tok, contexts, texts, kb, batch_size)
    else:
        pairs = [split_pair(tok, c, " " + a.strip()) for c, a in zip(contexts, texts)]
        scores = [(s.logprob, s.n_tokens) for s in score_continuations(
            model, pairs, banned=tok.call_ids if ban_lookup else (), batch_size=batch_size)]
    per: list[dict] = [{"answer": None, "para": None, "pert": []} for _ in items]
    for (k, kind), s in zip(where, scores):
        if kind == "pert":
            per[k]["pert"].append(s)
        else:
            per[k][kind] = s
    out = []
    for p in per:
        stats = {"prob": normalized_probability(*p["answer"])}
        if p["para"] is not None:
            stats["truth_ratio"] = truth_ratio(p["para"], p["pert"])
            stats["option_prob"] = option_probability(stats["prob"], [normalized_probability(*x) for x in p["pert"]])
        out.append(stats)
    return out


def value_span(paraphrased: str, perturbed: Sequence[str]) -> tuple[int, int] | None:
    """Characters ``(start, end)`` of ``paraphrased`` where its perturbations differ from it, widened to
    whole words: the value the perturbations change (None when they do not differ).

    Examples:
        >>> value_span("She was born in Lyon.", ["She was born in Lima.", "She was born in Oslo."])
        (16, 20)
    """
    start, end = len(paraphrased), 0
    for p in perturbed:
        k = 0
        while k < min(len(p), len(paraphrased)) and p[k] == paraphrased[k]:
            k += 1
        j = 0
        while j < min(len(p), len(paraphrased)) - k and p[-1 - j] == paraphrased[-1 - j]:
            j += 1
        start, end = min(start, k), max(end, len(paraphrased) - j)
    if start >= end:
        return None
    while start > 0 and not paraphrased[start - 1].isspace():
        start -= 1
    while end < len(paraphrased) and paraphrased[end].isalnum():
        end += 1
    return start, end


def _span_positions(tok, segments, span: tuple[int, int]) -> list[int]:
    """Positions in ``tok.encode(segments)`` of the text tokens that overlap ``span`` of the stripped text."""
    from ..lookup import plain_text
    from ..tokens import ORG

    plain, _ = plain_text(segments)
    offsets = tok.hf(plain, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    enc = tok.encode(segments)
    org = [k for k, r in enumerate(enc.roles) if r == ORG][1:]  # the first is the document separator
    return [k for k, (a, b) in zip(org, offsets) if a < span[1] and b > span[0]]


def value_truth_ratios(model, tok, items: Sequence[TofuItem], *, kb=None, template: str = QA_TEMPLATE,
                       batch_size: int = 16) -> list[float]:
    """The truth ratio of each item with a paraphrase and perturbations, over the value's tokens only.

    With ``kb`` (an LMLM's), the annotated answers are scored with their calls answered by the KB as
    it is now, and the value is the one written after the call; else the plain answers. Items whose
    value, in some answer, lies past the model's context are left out.
    """
    from ..lookup import Text, parse
    from ..scoring import token_logprobs

    seqs, where = [], []
    for k, it in enumerate(items):
        if not (it.paraphrased_answer and it.perturbed_answers):
            continue
        span = value_span(it.paraphrased_answer.strip(), [p.strip() for p in it.perturbed_answers])
        if span is None:
            continue
        ctx = template.format(question=it.question) + " "
        shift = (len(ctx), len(ctx))
        answers = ([it.annotated_paraphrased_answer, *it.annotated_perturbed_answers] if kb is not None
                   else [it.paraphrased_answer, *it.perturbed_answers])
        segs = [parse(a.strip(), form="dblookup").segments if kb is not None else [Text(a.strip())] for a in answers]
        if kb is not None:
            segs = kb_answered(segs, kb)
        for n, (a, sg) in enumerate(zip(answers, segs)):
            full = [Text(ctx)] + list(sg)
            plain_len = len(it.paraphrased_answer.strip()) if n == 0 else len(it.perturbed_answers[n - 1].strip())
            end = span[1] + (plain_len - len(it.paraphrased_answer.strip()))  # the suffix after the value is shared
            seqs.append((tok.encode(full).input_ids, _span_positions(tok, full, (shift[0] + span[0], shift[1] + end))))
            where.append((k, n))
    logps = token_logprobs(model, [ids for ids, _ in seqs], batch_size)
    per: dict[int, list[tuple[float, int] | None]] = {}
    for (k, n), (ids, pos), lp in zip(where, seqs, logps):
        fits = pos and all(0 < q <= len(lp) for q in pos)  # lp[t] scores token t + 1
        per.setdefault(k, []).append((float(sum(lp[q - 1] for q in pos)), len(pos)) if fits else None)
    # an item whose value does not fit the model's context in some answer is left out
    return [truth_ratio(v[0], v[1:]) for _, v in sorted(per.items()) if all(x is not None for x in v)]


def tofu_eval(model, tok, items: Sequence[TofuItem], *, split: str = "retain", generator=None,
              template: str = QA_TEMPLATE, max_new_tokens: int = 64, batch_size: int = 16, kb=None,
              records: list | None = None) -> dict[str, float]:
    """TOFU metrics of one split: ``tofu_<split>_prob``, ``_rouge_l_recall`` (with a ``generator``),
    ``_truth_ratio`` (the score of :func:`truth_ratio_score`; ``split`` starting with "forget" uses
    the forget convention) and ``_n``. Probabilities are option-normalized for ``real_authors`` and
    ``world_facts`` splits, as TOFU does. ``kb``: score an LMLM's annotated answers (see
    :func:`tofu_answer_stats`); records then hold the raw ``truth_ratio`` of each item too."""
    stats = tofu_answer_stats(model, tok, items, template=template, batch_size=batch_size, kb=kb)
    key = f"tofu_{split}_"
    use_options = split in ("real_authors", "world_facts") and all("option_prob" in s for s in stats)
    out = {key + "prob": mean(s["option_prob" if use_options else "prob"] for s in stats)}
    if generator is not None:
        res = generator.generate([template.format(question=it.question) for it in items],
                                 max_new_tokens=max_new_tokens, batch_size=batch_size)
        outputs = outputs_of(generator, res)
        rouge = [rouge_l_recall(o, it.answer) for o, it in zip(outputs, items)]
        out[key + "rouge_l_recall"] = mean(rouge)
        for s, r, o in zip(stats, rouge, outputs):
            s.update(rouge_l_recall=r, output=o)
    ratios = [s["truth_ratio"] for s in stats if "truth_ratio" in s]
    if ratios:
        out[key + "truth_ratio"] = truth_ratio_score(ratios, forget=split.startswith("forget"))
    out[key + "n"] = float(len(items))
    if records is not None:
        records.extend({"question": it.question, "answer": it.answer, **s} for it, s in zip(items, stats))
    return out
