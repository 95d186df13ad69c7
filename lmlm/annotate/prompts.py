"""Prompts for seed annotation, in our own words, following the paper's annotation principles.

The instructions ask for entity-level atomic facts written as ``[dblookup('Entity', 'Relation') ->
Value]`` right before the words that state the value, with full entity names, short reusable
relation labels, concise values, one fact per call, each call placed only once its entity and
relation have appeared to its left, and the text otherwise copied unchanged. Few-shot examples are
taken from annotated documents of the corpus itself (:func:`select_examples`); a single example of
our own stands in when there are none.

Exercised by ``lmlm annotate seed``.

Examples:
    >>> messages = build_messages("Ada Lovelace was born in London.")
    >>> [m["role"] for m in messages]
    ['system', 'user', 'assistant', 'user']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..lookup import parse, strip

__all__ = ["INSTRUCTIONS", "FACT_INSTRUCTIONS", "Example", "DEFAULT_EXAMPLE", "select_examples", "prompt_examples",
           "build_messages", "extract_annotation", "fact_lines", "parse_fact_lines", "STYLES"]

STYLES = ("inline", "facts")  # how the LLM answers: the annotated passage, or a list of facts

INSTRUCTIONS = """\
You mark the facts in a passage so that a language model can later look them up in a database \
instead of memorising them. Copy the passage exactly and insert a lookup call right before the \
words that state each fact:

[dblookup('Entity', 'Relation') -> Value] Value

What to mark:
- Facts about a named entity: a person, organisation, place, work or event. Common knowledge, \
opinions and how the text is worded are not facts to mark.
- One fact per call. A sentence with three facts gets three calls.

How to write a call:
- Entity: the entity's full name as the passage first gives it, even where the passage now says \
"she", "the company" or a short name.
- Relation: a short, general label in title case that can be reused for other entities \
(Birth Date, Birth City, Employer, Capital, Author), not a phrase copied from the sentence.
- Value: the fact itself, short, as the words right after the call say it.

Where to put a call:
- Right before the words that give the value, and only where the entity and the relation are \
already clear from the text before the call. Never mark a fact whose entity is only named later.

Do not change the passage: no words added, removed, reordered or corrected. Answer with the \
annotated passage only."""


FACT_INSTRUCTIONS = """\
List the facts that the passage states about named entities (people, organisations, places, works, \
events), one per line, as:
Entity | Relation | Value
- Entity: the full name of the entity the fact is about, as the passage gives it.
- Relation: a short, general label in title case that can be reused for other entities \
(Birth Date, Birth Place, Occupation, Nationality, Spouse, Capital, Founded, Author).
- Value: copied word for word from the passage, as short as possible.
Only facts the passage states. Answer with the fact lines only."""


@dataclass(frozen=True)
class Example:
    """A few-shot example: a passage and its annotation."""

    text: str
    annotated: str


DEFAULT_EXAMPLE = Example(
    "Marta Kowalska (born 3 May 1961 in Gdansk) is a Polish chemist. She studied at the University of "
    "Warsaw and has led the Institute of Catalysis since 2004.",
    "Marta Kowalska (born [dblookup('Marta Kowalska', 'Birth Date') -> 3 May 1961] 3 May 1961 in "
    "[dblookup('Marta Kowalska', 'Birth City') -> Gdansk] Gdansk) is a "
    "[dblookup('Marta Kowalska', 'Nationality') -> Polish] Polish "
    "[dblookup('Marta Kowalska', 'Occupation') -> chemist] chemist. She studied at "
    "[dblookup('Marta Kowalska', 'University') -> University of Warsaw] the University of Warsaw and has led "
    "[dblookup('Marta Kowalska', 'Employer') -> Institute of Catalysis] the Institute of Catalysis since "
    "[dblookup('Marta Kowalska', 'Employer Start Year') -> 2004] 2004.")


def select_examples(annotated: Iterable[str], k: int = 2, max_chars: int = 700) -> list[Example]:
    """Pick ``k`` few-shot examples from annotated documents of the corpus.

    Documents with malformed calls or over ``max_chars`` characters of text are skipped; among the
    rest, those with the most distinct relations per character come first, one per entity.

    Args:
        annotated: annotated documents (``[dblookup(...)]`` form).
        k: examples to return (0: none).
        max_chars: longest passage to show.
    """
    scored = []
    for doc in annotated:
        parsed = parse(doc)
        text = strip(parsed.segments)
        if parsed.problems or not parsed.lookups or len(text) > max_chars:
            continue
        relations = {lk.relation for lk in parsed.lookups}
        scored.append((-len(relations) / max(len(text), 1) * 100, len(text), text, doc, parsed.lookups[0].entity))
    scored.sort(key=lambda s: s[:2])
    chosen, entities = [], set()
    for *_, text, doc, entity in scored:
        if len(chosen) >= k:
            break
        if entity not in entities:
            chosen.append(Example(text, doc))
            entities.add(entity)
    return chosen


def fact_lines(annotated: str) -> str:
    """The calls of an annotation as ``Entity | Relation | Value`` lines (a few-shot answer of the ``facts`` style)."""
    return "\n".join(f"{c.entity} | {c.relation} | {c.value}" for c in parse(annotated).lookups)


def parse_fact_lines(answer: str) -> list[tuple[str, str, str]]:
    """``(entity, relation, value)`` of each well-formed ``Entity | Relation | Value`` line, repeats dropped.

    Examples:
        >>> parse_fact_lines("- Ada | Birth City | London\\nAda | Birth City | London\\nnot a fact")
        [('Ada', 'Birth City', 'London')]
    """
    out: dict[tuple[str, str, str], None] = {}
    for line in answer.splitlines():
        parts = [p.strip().strip("*").strip() for p in line.strip().lstrip("-*0123456789.) ").split("|")]
        if len(parts) == 3 and all(parts):
            out[tuple(parts)] = None  # type: ignore[index]
    return list(out)


def prompt_examples(examples: Sequence[Example] | None) -> Sequence[Example]:
    """The few-shot examples a prompt shows: ``examples``, or :data:`DEFAULT_EXAMPLE` when none are given
    (``None``); an empty sequence shows none."""
    return (DEFAULT_EXAMPLE,) if examples is None else examples


def build_messages(text: str, examples: Sequence[Example] | None = None, instructions: str | None = None,
                   style: str = "inline") -> list[dict]:
    """Chat messages asking to annotate ``text``: the instructions, few-shot turns, then the passage.

    ``style="inline"`` asks for the passage with its calls (the paper's way); ``"facts"`` asks for
    the facts as ``Entity | Relation | Value`` lines, which a small model manages far better than
    copying a passage (:func:`lmlm.annotate.validate.place_facts` then puts each call in the text).
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    default = INSTRUCTIONS if style == "inline" else FACT_INSTRUCTIONS
    messages = [{"role": "system", "content": instructions or default}]
    for ex in prompt_examples(examples):
        answer = ex.annotated if style == "inline" else fact_lines(ex.annotated)
        messages += [{"role": "user", "content": ex.text}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": text}]


_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n?```\s*$", re.DOTALL)
_LABEL = re.compile(r"^(?:annotated(?: passage| text)?|output|answer)\s*:\s*", re.IGNORECASE)


def extract_annotation(response: str) -> str:
    """The annotated passage from a model's answer: code fences and a leading label removed."""
    s = response.strip()
    m = _FENCE.match(s)
    if m:
        s = m.group(1).strip()
    return _LABEL.sub("", s, count=1).strip()
