"""The biography world as benchmark files, in each benchmark's official format.

So that the paper's protocols run on the synthetic world exactly as they would on the real data,
the world's facts are written as:

* ``trex.jsonl``: LAMA T-REx lines (``sub_label``, ``obj_label``, ``predicate_id``,
  ``masked_sentences`` ending in ``[MASK] .``), from the relation's cloze template;
* ``popqa.tsv``: PopQA's columns (``id subj prop obj s_pop question possible_answers``) plus the
  completion rewrite in ``prompt`` (the paper's GPT-4 rewrite, here a template per relation);
  ``s_pop`` is the number of training documents about the person;
* ``factscore.jsonl``: FActScore topics (``{"topic": name}``), scored against the KB;
* ``nlu.json``: a BIG-bench multiple-choice task standing in for the NLU suite: a held-out
  sentence with no facts, cut in half; its true ending against the endings of other sentences
  (language, not facts: what offloading must not harm).

Exercised by ``lmlm reproduce``.
"""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path
from typing import Sequence

from ..jsonio import write_json
from .bios import RELATIONS, BiosWorld

__all__ = ["POPQA_QUESTIONS", "write_trex", "write_popqa", "write_factscore_topics", "write_nlu", "write_all"]

# relation -> (PopQA-style question, completion the answer follows, PopQA prop)
POPQA_QUESTIONS = {
    "Birth City": ("In what city was {name} born?", "{name} was born in", "place of birth"),
    "Birth Date": ("When was {name} born?", "{name} was born on", "date of birth"),
    "University": ("Which university did {name} attend?", "{name} graduated from", "educated at"),
    "Major": ("What did {name} study?", "{name} majored in", "field of study"),
    "Employer": ("Who is {name}'s employer?", "{name} works for", "employer"),
    "Employer City": ("In what city does {name} work?", "{name} works in the city of", "work location"),
}
assert set(POPQA_QUESTIONS) == set(RELATIONS)


def _pairs(world: BiosWorld, n: int | None, seed: int, people: Sequence[str] | None = None) -> list[tuple[str, str]]:
    names = people if people is not None else [p.name for p in world.people_in("train")]
    pairs = [(name, rel) for name in names for rel in RELATIONS]
    if n is not None and n < len(pairs):
        pairs = sorted(random.Random(seed).sample(pairs, n), key=pairs.index)
    return pairs


def write_trex(world: BiosWorld, path: str | Path, n: int | None = None, seed: int = 0,
               people: Sequence[str] | None = None) -> int:
    """Cloze facts of train people (or ``people``) as LAMA T-REx JSON lines; returns how many."""
    rows = []
    for k, (name, rel) in enumerate(_pairs(world, n, seed, people)):
        c = world.cloze(name, rel)
        rows.append({"uuid": f"bios-{k}", "sub_label": name, "obj_label": c.gold, "predicate_id": rel,
                     "masked_sentences": [f"{c.prompt} [MASK] ."]})
    _jsonl(path, rows)
    return len(rows)


def write_popqa(world: BiosWorld, path: str | Path, n: int | None = None, seed: int = 1,
                people: Sequence[str] | None = None) -> int:
    """Questions about train people (or ``people``) in PopQA's TSV columns; returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pairs = _pairs(world, n, seed, people)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["id", "subj", "prop", "obj", "s_pop", "question", "possible_answers", "prompt"])
        for k, (name, rel) in enumerate(pairs):
            question, completion, prop = POPQA_QUESTIONS[rel]
            value = world.person(name).facts[rel]
            q = question.format(name=name)
            w.writerow([k, name, prop, value, world.person(name).mentions, q, json.dumps([value]),
                        f"{q} {completion.format(name=name)}"])
    return len(pairs)


def write_factscore_topics(world: BiosWorld, path: str | Path, n: int | None = None, seed: int = 2) -> int:
    """Names of train people as FActScore topic lines; returns how many."""
    names = [p.name for p in world.people_in("train")]
    if n is not None and n < len(names):
        names = sorted(random.Random(seed).sample(names, n), key=names.index)
    _jsonl(path, [{"topic": name} for name in names])
    return len(names)


def _fact_free_sentences(world: BiosWorld) -> list[tuple[str, str]]:
    """``(text before, sentence)`` for each held-out sentence of 8+ words that states no fact."""
    from ..lookup import plain_text

    out = []
    for doc in world.heldout_documents:
        text, calls = plain_text(doc.segments)
        for m in re.finditer(r"[^.!?]+[.!?]", text):
            start, end = m.span()
            sentence = m.group().strip()
            if len(sentence.split()) >= 8 and not any(start <= c < end for c in calls):
                out.append((text[:start].strip(), sentence))
    return out


def write_nlu(world: BiosWorld, path: str | Path, n: int | None = 300, n_choices: int = 4, seed: int = 3) -> int:
    """The stand-in for the NLU suite as a BIG-bench multiple-choice task; returns how many.

    Each held-out sentence without facts is cut after its first half; the choices are its true
    ending and the endings of ``n_choices - 1`` other such sentences (HellaSwag's shape: which
    continuation makes sense here), scored by acc_norm.
    """
    rng = random.Random(seed)
    sentences = _fact_free_sentences(world)
    halves = [(before, s.split()[:len(s.split()) // 2], " ".join(s.split()[len(s.split()) // 2:]))
              for before, s in sentences]
    endings = sorted({tail for _, _, tail in halves})
    examples = []
    for before, head, tail in halves:
        others = [e for e in endings if e != tail]
        if len(others) < n_choices - 1:
            continue
        choices = [tail] + rng.sample(others, n_choices - 1)
        rng.shuffle(choices)
        examples.append({"input": (before + " " + " ".join(head)).strip(),
                         "target_scores": {c: int(c == tail) for c in choices}})
    if n is not None and n < len(examples):
        examples = rng.sample(examples, n)
    write_json(path, {"name": "bios_continuation", "description": "held-out sentence endings: the true one "
                      "against those of other sentences", "examples": examples}, indent=1)
    return len(examples)


def write_all(world: BiosWorld, folder: str | Path, n_trex: int | None = None, n_popqa: int | None = None,
              n_factscore: int | None = None, n_nlu: int | None = 300) -> dict[str, int]:
    """All four files into ``folder``; returns the number of items of each."""
    folder = Path(folder)
    return {"trex": write_trex(world, folder / "trex.jsonl", n_trex),
            "popqa": write_popqa(world, folder / "popqa.tsv", n_popqa),
            "factscore": write_factscore_topics(world, folder / "factscore.jsonl", n_factscore),
            "nlu": write_nlu(world, folder / "nlu.json", n_nlu)}


def _jsonl(path: str | Path, rows: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
