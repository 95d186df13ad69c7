"""T-REx (LAMA) cloze evaluation: complete a Wikipedia sentence cut at its masked object.

The paper's protocol (appendix B, "T-REx"): LAMA's T-REx facts, kept only when ``[MASK]`` is the
last word of the sentence (left-to-right compatible, as in Toolformer); the prompt is the sentence
cut at ``[MASK]``; greedy decoding; for an LMLM a lookup is forced at the masked position; lookups
are stripped from the output before scoring. Two metrics:

* ``trex_exact_match``: the gold object starts within the first five *content* words of the
  output (stop words removed, see :func:`lmlm.evaluate.cloze.match_first_content_words`);
* ``trex_precision_at_1``: the output's first content word(s) are the gold object.

The reader takes LAMA's files as released: one JSON object per line with ``sub_label``,
``obj_label``, ``predicate_id``, ``uuid`` and the masked sentences either as ``masked_sentences``
(a list), ``masked_sentence`` (a string) or ``evidences[*].masked_sentence``. A path may be one
``P19.jsonl`` file or a folder of them.

Exercised by ``lmlm eval trex``.

Examples:
    >>> items = read_trex("data/TREx/P19.jsonl")
    >>> items[0].prompt
    'Allan Peiper was born in'
    >>> trex_eval(generator, items)
    {'trex_exact_match': 0.61, 'trex_precision_at_1': 0.55, 'trex_n': 944.0, ...}
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import (Protocol, answer_budget, lookup_metrics, mean, normal_fields, outputs_of, progress_option,
                   trace_dicts)
from .cloze import match_first_content_words

__all__ = ["MASK", "TREX", "TrexItem", "cloze_prompt", "masked_sentences", "read_trex", "score_trex", "trex_eval"]

TREX = Protocol("trex", "trex_exact_match", paper="LMLM appendix B, T-REx (LAMA; Toolformer's left-to-right subset)")
MASK = "[MASK]"
_TAIL = re.compile(r"^[\s\W]*$")  # what may follow [MASK] in a left-to-right example: punctuation only


@dataclass(frozen=True)
class TrexItem:
    """One fact: ``prompt`` (the sentence up to ``[MASK]``) should continue with ``gold``."""

    prompt: str
    gold: str
    relation: str = ""  # the Wikidata property, e.g. "P19"
    subject: str = ""
    uid: str = ""

    def __post_init__(self) -> None:
        normal_fields(self, ("prompt", "gold", "subject"))


def cloze_prompt(sentence: str, left_to_right: bool = True) -> str | None:
    """The sentence cut at its first ``[MASK]``, right-stripped.

    With ``left_to_right`` (the paper's filter), None unless only punctuation follows the mask.

    Examples:
        >>> cloze_prompt("Jaideep Sahni (born 1968) is an Indian [MASK] .")
        'Jaideep Sahni (born 1968) is an Indian'
        >>> cloze_prompt("[MASK] is the capital of France.") is None
        True
    """
    head, sep, tail = sentence.partition(MASK)
    if not sep or not head.strip():
        return None
    if left_to_right and not _TAIL.match(tail):
        return None
    return head.rstrip()


def masked_sentences(record: dict) -> list[str]:
    """The masked sentences of a T-REx record, from any of the layouts LAMA's files use."""
    if isinstance(record.get("masked_sentences"), list):
        return [s for s in record["masked_sentences"] if isinstance(s, str)]
    if isinstance(record.get("masked_sentence"), str):
        return [record["masked_sentence"]]
    return [e["masked_sentence"] for e in record.get("evidences") or [] if isinstance(e, dict)
            and isinstance(e.get("masked_sentence"), str)] + [e for e in record.get("evidences") or []
                                                              if isinstance(e, str)]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".jsonl", ".json"))
        if not files:
            raise FileNotFoundError(f"no .jsonl files in {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return [path]


def read_trex(path: str | Path, *, left_to_right: bool = True, all_sentences: bool = False,
              limit: int | None = None, counts: dict | None = None) -> list[TrexItem]:
    """Read LAMA T-REx facts from a ``.jsonl`` file or a folder of them.

    Args:
        path: a LAMA T-REx file (``P19.jsonl``) or a folder of them.
        left_to_right (bool, default True): keep only sentences whose ``[MASK]`` is the last word.
        all_sentences (bool, default False): one item per usable masked sentence instead of one
            per fact (the first usable sentence).
        limit (int, optional): stop after this many items.
        counts (dict, optional): filled with ``records`` read and ``unusable`` ones (no sentence
            the cloze prompt can be made of).
    """
    items: list[TrexItem] = []
    counts = {} if counts is None else counts
    counts.update(records=0, unusable=0)
    for file in _files(Path(path)):
        for n, line in enumerate(file.read_text(encoding="utf-8-sig").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(rec, dict) or "obj_label" not in rec:
                raise ValueError(f"{file}:{n}: no 'obj_label' (is this a LAMA T-REx file?)")
            if not isinstance(rec["obj_label"], (str, int, float)) or isinstance(rec["obj_label"], bool):
                raise ValueError(f"{file}:{n}: 'obj_label' is {rec['obj_label']!r}, not a label")
            prompts = [p for p in (cloze_prompt(s, left_to_right) for s in masked_sentences(rec)) if p]
            counts["records"] += 1
            counts["unusable"] += not prompts
            for p in prompts if all_sentences else prompts[:1]:
                items.append(TrexItem(p, str(rec["obj_label"]), rec.get("predicate_id", ""),
                                      rec.get("sub_label", ""), str(rec.get("uuid", ""))))
                if limit is not None and len(items) >= limit:
                    return items
    return items


def score_trex(outputs: Sequence[str], items: Sequence[TrexItem], n_words: int = 5) -> list[dict]:
    """Per item: ``exact_match`` (gold within the first ``n_words`` content words) and ``precision_at_1``."""
    if len(outputs) != len(items):
        raise ValueError(f"{len(outputs)} outputs for {len(items)} items")
    return [{"exact_match": match_first_content_words(o, it.gold, n_words),
             "precision_at_1": match_first_content_words(o, it.gold, 1)} for o, it in zip(outputs, items)]


def trex_eval(generator, items: Sequence[TrexItem], *, force_lookup: bool = True, max_new_tokens: int = 16,
              batch_size: int = 32, n_words: int = 5, by_relation: bool = True,
              records: list | None = None, progress: bool = False) -> dict[str, float]:
    """Greedy T-REx evaluation of a :class:`lmlm.generate.LookupGenerator`.

    Args:
        generator: the model to evaluate; for a Standard model, one built with ``use_db=False``.
        items: from :func:`read_trex`.
        force_lookup (bool, default True): open a lookup at the masked position (LMLM protocol);
            pass False for a Standard model. The paper lets a missed lookup go on as plain decoding:
            build the generator with ``on_miss="skip"``.
        max_new_tokens (int, default 16): tokens of the answer's text; a model's calls take up to
            :data:`~lmlm.evaluate.base.CALL_ROOM` more (:func:`~lmlm.evaluate.base.answer_budget`).
        n_words (int, default 5): content words searched for the exact match.
        by_relation (bool, default True): also report ``trex_exact_match_<predicate_id>`` and its
            ``trex_n_<predicate_id>``.
        records (list, optional): appended with one dict per item (prompt, gold, output, verdicts, lookups).
        progress (bool, default False): a progress bar over the generation's batches.

    Returns:
        ``trex_exact_match``, ``trex_precision_at_1``, ``trex_n``, ``trex_lookup_found`` (share of
        items whose output used a KB fact about the item's subject; ``trex_lookup_answered``: any
        fact, ``trex_lookup_wrong_entity``: items answered only about someone else) and per-relation
        exact match and n.
    """
    results = generator.generate([it.prompt for it in items], max_new_tokens=answer_budget(generator, max_new_tokens),
                                 batch_size=batch_size, force_lookup=force_lookup, **progress_option(progress))
    outputs = outputs_of(generator, results, max_new_tokens)
    scores = score_trex(outputs, items, n_words)
    out = {TREX.key("exact_match"): mean(s["exact_match"] for s in scores),
           TREX.key("precision_at_1"): mean(s["precision_at_1"] for s in scores),
           TREX.key("n"): float(len(items)), **lookup_metrics(TREX, results, [it.subject for it in items])}
    if by_relation:
        for rel in sorted({it.relation for it in items if it.relation}):
            out[TREX.key(f"exact_match_{rel}")] = mean(s["exact_match"] for s, it in zip(scores, items)
                                                       if it.relation == rel)
            out[TREX.key(f"n_{rel}")] = float(sum(it.relation == rel for it in items))
    if records is not None:
        records.extend({"uuid": it.uid, "subject": it.subject, "prompt": it.prompt, "gold": it.gold,
                        "relation": it.relation, "output": o,
                        "text": r.text, **s, "lookups": trace_dicts(r)}
                       for it, r, o, s in zip(items, results, outputs, scores))
    return out
