"""PopQA evaluation: questions about (mostly rare) entities, rewritten as completions.

The paper's protocol (appendix B, "PopQA"): the long-tail subset (subject popularity below 100
monthly page views, 1,399 questions, as in Self-RAG); each question is rewritten into a completion
the answer can follow ("What is Ufa the capital of? Ufa is the capital of"); an answer is correct
when any gold answer appears in the output. The paper rewrote with GPT-4; here the rewrite is a
fixed template per PopQA relation (:data:`COMPLETIONS`), and a file may carry its own rewrites in a
``prompt`` column. Matching is on normalized text (SQuAD's: lowercase, no punctuation or articles)
at word boundaries, so "Rome" does not match "Romeo".

Readers: PopQA's ``test.tsv`` (or the same columns as JSON / JSON lines: ``question``,
``possible_answers`` as a JSON list string, ``subj``, ``prop``, ``obj``, ``s_wiki_title``,
``s_pop``), and FanOutQA's dev file, whose single-hop sub-questions serve as a PopQA-style set.

Exercised by ``lmlm eval popqa``.

Examples:
    >>> items = read_popqa("popqa/test.tsv", max_popularity=100)
    >>> items[0].prompt
    'What is George Rankin's occupation? George Rankin's occupation is'
    >>> popqa_eval(generator, items)
    {'popqa_accuracy': 0.21, 'popqa_n': 1399.0, ...}
"""

from __future__ import annotations

import csv
import json
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .base import (Protocol, answer_budget, lookup_metrics, mean, normal_fields, outputs_of, progress_option,
                   read_json_records, trace_dicts)

__all__ = [
    "COMPLETIONS",
    "POPQA",
    "QAItem",
    "answer_in_output",
    "completion_prompt",
    "normalize_answer",
    "popqa_eval",
    "read_fanoutqa",
    "read_popqa",
    "read_qa",
]

POPQA = Protocol("popqa", "popqa_accuracy", paper="LMLM appendix B, PopQA (long-tail subset, completion format)")

# PopQA's 16 relations: a completion that follows the question and that the answer ends
COMPLETIONS = {
    "occupation": "{subj}'s occupation is",
    "place of birth": "{subj} was born in",
    "genre": "The genre of {subj} is",
    "father": "The father of {subj} is",
    "mother": "The mother of {subj} is",
    "country": "{subj} is located in the country of",
    "producer": "{subj} was produced by",
    "director": "{subj} was directed by",
    "capital of": "{subj} is the capital of",
    "capital": "The capital of {subj} is",
    "screenwriter": "The screenwriter of {subj} is",
    "composer": "The composer of {subj} is",
    "color": "The color of {subj} is",
    "religion": "The religion of {subj} is",
    "sport": "{subj} plays",
    "author": "The author of {subj} is",
}
FALLBACK = "The answer is"  # completion for questions of unknown relation (FanOutQA)


@dataclass(frozen=True)
class QAItem:
    """A question, the completion prompt the model continues, and the accepted answers."""

    question: str
    answers: tuple[str, ...]
    prompt: str
    subject: str = ""
    relation: str = ""
    uid: str = ""
    popularity: float | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        normal_fields(self, ("question", "answers", "prompt", "subject"))


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUM_SEP = re.compile(r"(?<=\d)[,_](?=\d{3}\b)")  # 1,000,000 -> 1000000


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalization, plus unicode folding and digit-group commas removed.

    Examples:
        >>> normalize_answer("The Beatles, 1,200 times!")
        'beatles 1200 times'
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _NUM_SEP.sub("", text)
    text = "".join(" " if ch in string.punctuation else ch for ch in text)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_in_output(output: str, answers: Sequence[str]) -> bool:
    """True when any normalized answer occurs in the normalized output, at word boundaries."""
    out = f" {normalize_answer(output)} "
    return any(f" {a} " in out for a in map(normalize_answer, answers) if a)


def completion_prompt(question: str, relation: str = "", subject: str = "") -> str:
    """The question followed by its relation's completion (paper: "What is Ufa the capital of? Ufa is the capital of")."""
    template = COMPLETIONS.get(relation.strip().lower()) if subject else None
    tail = template.format(subj=subject) if template else FALLBACK
    return f"{question.strip()} {tail}"


def _answers(value) -> tuple[str, ...]:
    if isinstance(value, str):  # PopQA's possible_answers is a JSON list written as a string
        if value.strip().startswith(("[", "{")):
            try:
                return _answers(json.loads(value))
            except json.JSONDecodeError as e:
                if value.strip().startswith("["):
                    raise ValueError(f"possible_answers {value!r} is not a JSON list ({e.msg})") from None
        return (value.strip(),) if value.strip() else ()
    if isinstance(value, bool):
        return ("yes",) if value else ("no",)
    if isinstance(value, (int, float)):
        return (f"{value:g}" if isinstance(value, float) else str(value),)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return tuple(a for v in value for a in _answers(v))
    return ()


def _popqa_item(rec: dict) -> QAItem:
    if "question" not in rec or "possible_answers" not in rec:
        raise ValueError(f"a PopQA record needs 'question' and 'possible_answers'; got {sorted(rec)}")
    subject = rec.get("subj") or (rec.get("s_wiki_title") or "").replace("_", " ")
    relation = rec.get("prop", "")
    prompt = rec.get("prompt") or completion_prompt(rec["question"], relation, subject)
    pop = rec.get("s_pop")
    answers = _answers(rec["possible_answers"])
    if not answers:  # an item no output could get right
        raise ValueError(f"no possible answer in {rec['possible_answers']!r}")
    return QAItem(rec["question"], answers, prompt, subject, relation,
                  str(rec.get("id", "")), float(pop) if pop not in (None, "") else None)


def read_popqa(path: str | Path, *, max_popularity: float | None = None, limit: int | None = None) -> list[QAItem]:
    """Read PopQA from its ``.tsv`` (or ``.csv``) file, or the same columns as JSON / JSON lines.

    Args:
        path: the file.
        max_popularity (float, optional): keep subjects with ``s_pop`` below this (100: the
            long-tail subset of the paper).
        limit (int, optional): keep the first this many items.
    """
    path = Path(path)
    if path.suffix.lower() in (".tsv", ".csv"):
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
            rows, where = [], []
            for row in reader:
                if None in row or None in row.values():  # more cells than the header names, or fewer
                    other = "comma" if path.suffix.lower() == ".tsv" else "tab"
                    raise ValueError(f"{path}:{reader.line_num}: the row's cells do not match the header's "
                                     f"{len(reader.fieldnames or ())} columns (is the file {other}-separated?)")
                rows.append(row)
                where.append(f"{path}:{reader.line_num}")
    else:
        rows = read_json_records(path)
        where = [f"{path}: record {k}" for k in range(1, len(rows) + 1)]
    items = []
    for row, at in zip(rows, where):
        try:
            items.append(_popqa_item(row))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{at}: {e}") from None
    if max_popularity is not None:
        items = [it for it in items if it.popularity is not None and it.popularity < max_popularity]
    return items[:limit]


def read_fanoutqa(path: str | Path, *, limit: int | None = None) -> list[QAItem]:
    """The single-hop sub-questions of FanOutQA (``fanout-final-dev.json``), one :class:`QAItem` each.

    Every leaf of each question's ``decomposition`` with an answer counts once (by ``id``); its
    evidence page title is the subject. Answers that are lists or dicts accept any of their items;
    numbers and booleans are written out ("1969", "yes"). The prompt is the question followed by
    "The answer is" (FanOutQA has no relation labels to rewrite by).
    """
    seen: set[str] = set()
    items: list[QAItem] = []

    def walk(node: dict) -> None:
        for sub in node.get("decomposition") or []:
            if sub.get("decomposition"):
                walk(sub)
                continue
            answers = _answers(sub.get("answer"))
            if not answers or sub.get("id") in seen:
                continue
            seen.add(sub.get("id"))
            title = (sub.get("evidence") or {}).get("title", "")
            items.append(QAItem(sub["question"], answers, completion_prompt(sub["question"]), title, "",
                                str(sub.get("id", ""))))

    for question in read_json_records(path):
        if "decomposition" not in question:
            raise ValueError(f"{path}: a FanOutQA question needs 'decomposition'; got {sorted(question)}")
        walk(question)
    return items[:limit]


def read_qa(path: str | Path, **kwargs) -> list[QAItem]:
    """:func:`read_fanoutqa` for a file of FanOutQA questions, else :func:`read_popqa`."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        with path.open(encoding="utf-8-sig") as f:
            head = f.read(4096)
        if '"decomposition"' in head:
            kwargs.pop("max_popularity", None)
            return read_fanoutqa(path, **kwargs)
    return read_popqa(path, **kwargs)


def popqa_eval(generator, items: Sequence[QAItem], *, force_lookup: bool = False, max_new_tokens: int = 32,
               batch_size: int = 32, by_relation: bool = True, records: list | None = None,
               progress: bool = False) -> dict[str, float]:
    """Greedy PopQA evaluation of a :class:`lmlm.generate.LookupGenerator`.

    Args:
        generator: the model to evaluate (a Standard model: one built with ``use_db=False``).
        items: from :func:`read_popqa` or :func:`read_fanoutqa`.
        force_lookup (bool, default False): open a lookup right after the prompt.
        max_new_tokens (int, default 32): tokens of the answer's text; a model's calls take up to
            :data:`~lmlm.evaluate.base.CALL_ROOM` more (:func:`~lmlm.evaluate.base.answer_budget`).
        by_relation (bool, default True): also report ``popqa_accuracy_<relation>`` and its ``popqa_n_<relation>``.
        records (list, optional): appended with one dict per item.
        progress (bool, default False): a progress bar over the generation's batches.

    Returns:
        ``popqa_accuracy`` (any gold answer in the lookup-stripped output), ``popqa_n``,
        ``popqa_lookup_found`` (a KB fact about the item's subject; ``popqa_lookup_answered``: any,
        ``popqa_lookup_wrong_entity``: items answered only about someone else) and per-relation accuracy and n.
    """
    results = generator.generate([it.prompt for it in items], max_new_tokens=answer_budget(generator, max_new_tokens),
                                 batch_size=batch_size, force_lookup=force_lookup, **progress_option(progress))
    outputs = outputs_of(generator, results, max_new_tokens)
    hits = [answer_in_output(o, it.answers) for o, it in zip(outputs, items)]
    out = {POPQA.key("accuracy"): mean(hits), POPQA.key("n"): float(len(items)),
           **lookup_metrics(POPQA, results, [it.subject for it in items])}
    if by_relation:
        for rel in sorted({it.relation for it in items if it.relation}):
            name = rel.replace(" ", "_")
            out[POPQA.key("accuracy_" + name)] = mean(h for h, it in zip(hits, items) if it.relation == rel)
            out[POPQA.key("n_" + name)] = float(sum(it.relation == rel for it in items))
    if records is not None:
        records.extend({"id": it.uid, "subject": it.subject, "question": it.question, "prompt": it.prompt,
                        "answers": list(it.answers),
                        "relation": it.relation, "output": o, "text": r.text, "correct": h,
                        "lookups": trace_dicts(r)} for it, r, o, h in zip(items, results, outputs, hits))
    return out
