"""Validation of annotated text: every lookup call is kept or rejected with a reason.

An annotator (an LLM, or our distilled model) returns the input text with lookup calls inserted.
:func:`validate` checks that answer against the input and rebuilds the annotation on the *input's*
text, so what comes out always strips back to the input exactly. Each call is rejected for the
first of these reasons that applies:

* ``malformed``: the call does not parse (unterminated, unquoted, empty field, no ``->``);
* ``text_changed``: the call sits where the annotator rewrote the text (the annotation with its
  calls removed must equal the input; calls in the unchanged parts are re-anchored and kept);
* ``value_not_after_call``: the value is not mentioned right after the call;
* ``entity_not_in_left_context``: the entity's words do not occur before the call, so a model
  reading left to right could not have written it (the look-ahead the paper observes in LLM
  annotations);
* ``duplicate``: the same key (entity and relation) was already called at the same mention, with
  this value or another (a repeated call gets the KB's one value for the key).

Exercised by ``lmlm annotate validate`` and every annotation command (``seed``, ``run``).

Examples:
    >>> v = validate("Ada Lovelace was born in London.",
    ...              "Ada Lovelace was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London.")
    >>> [c.relation for c in v.kept], v.rejected
    (['Birth City'], [])
    >>> validate("Ada was born in London.", "Ada was born in [dblookup('Ada', 'Birth City') -> Paris] London."
    ...          ).rejected[0].reason
    'value_not_after_call'
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable, Literal, Sequence

from ..corpus import Document
from ..lookup import PAPER_TOKENS, Lookup, Segment, Text, parse, plain_text, render, render_lookup, strip

__all__ = ["REASONS", "Rejected", "Validated", "ValidationReport", "validate", "validate_facts", "insert_calls",
           "calls_with_offsets", "place_facts"]

REASONS = ("malformed", "text_changed", "value_not_after_call", "entity_not_in_left_context", "duplicate",
           "value_not_in_text")
_WORD = re.compile(r"\w+", re.UNICODE)
# particles that a full name may carry without the text repeating them
_NAME_PARTICLES = {"the", "of", "and", "de", "da", "del", "der", "di", "du", "la", "le", "van", "von", "y"}
_MALFORMED_HEAD = re.compile(r"\[dblookup\((?:[^()\[\]\\]|\\.)*\)?\s*(?:->\s*)?")


@dataclass
class Rejected:
    """A call that was dropped, why, and where (``at``: character offset in the input text, or -1)."""

    reason: str
    call: str
    at: int
    entity: str | None = None
    relation: str | None = None
    value: str | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Validated:
    """The outcome for one document.

    ``segments`` are the input text with the kept calls inserted (``strip(segments) == text``);
    ``positions`` gives each kept call's character offset in ``text``.
    """

    text: str
    segments: list[Segment]
    kept: list[Lookup]
    positions: list[int]
    rejected: list[Rejected] = field(default_factory=list)
    text_changed: bool = False

    @property
    def annotated(self) -> str:
        return render(self.segments)

    def to_dict(self) -> dict:
        return {"text": self.text, "annotated": self.annotated, "text_changed": self.text_changed,
                "calls": [dict(entity=c.entity, relation=c.relation, value=c.value, at=p)
                          for c, p in zip(self.kept, self.positions)],
                "rejected": [r.to_dict() for r in self.rejected]}

    @classmethod
    def joined(cls, text: str, parts: Sequence[tuple[int, "Validated"]]) -> "Validated":
        """One outcome for ``text`` from those of its pieces, ``(offset in text, outcome)``: a long
        document annotated a passage at a time."""
        if len(parts) == 1 and parts[0][0] == 0 and parts[0][1].text == text:
            return parts[0][1]
        placed = sorted(((off + q, c) for off, v in parts for c, q in zip(v.kept, v.positions)), key=lambda x: x[0])
        rejected = [replace(r, at=off + r.at if r.at >= 0 else -1) for off, v in parts for r in v.rejected]
        return cls(text, insert_calls(text, placed), [c for _, c in placed], [q for q, _ in placed], rejected,
                   any(v.text_changed for _, v in parts))

    def document(self, of: Document) -> Document:
        """The annotated version of the input document ``of`` (id, source, split and metadata kept;
        ``text_changed``, ``calls`` and ``rejected`` added to its metadata)."""
        extra = {k: v for k, v in self.to_dict().items() if k not in ("text", "annotated")}
        return Document(of.id, self.annotated, self.text, of.source, of.split, {**of.meta, **extra})


@dataclass
class ValidationReport:
    """Counts over many documents: calls seen, kept, and rejected per reason."""

    documents: int = 0
    documents_text_changed: int = 0
    calls: int = 0
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)

    def add(self, v: Validated) -> None:
        self.documents += 1
        self.documents_text_changed += v.text_changed
        self.calls += len(v.kept) + len(v.rejected)
        self.kept += len(v.kept)
        self.rejected.update(r.reason for r in v.rejected)

    @classmethod
    def of(cls, results: Iterable[Validated]) -> "ValidationReport":
        report = cls()
        for v in results:
            report.add(v)
        return report

    def to_dict(self) -> dict:
        return {"documents": self.documents, "documents_text_changed": self.documents_text_changed,
                "calls": self.calls, "kept": self.kept, "rejected": sum(self.rejected.values()),
                "rejected_by_reason": {r: self.rejected.get(r, 0) for r in REASONS}}


# -- the checks ------------------------------------------------------------------------------------

def _words(s: str) -> list[str]:
    """Casefolded words, in one Unicode form: an NFC name is found in NFD text ("Zoë" either way)."""
    return _WORD.findall(unicodedata.normalize("NFC", s).casefold())


def value_follows(text: str, at: int, value: str, slack: int = 24, lead_words: int = 3) -> bool:
    """True if ``value`` is mentioned right after offset ``at``: its first word among the next
    ``lead_words`` words, and all its words within ``len(value) + slack`` characters (lists may gain
    an "and": ``singer, actress`` matches ``singer, and actress``)."""
    want = _words(value)
    if not want:
        return False
    window = _words(text[at:at + len(value) + slack])
    return want[0] in window[:lead_words] and not (Counter(want) - Counter(window))


def entity_in_context(left: str, entity: str) -> bool:
    """True if every word of ``entity`` (name particles aside) occurs in ``left``, the text before the call."""
    if unicodedata.normalize("NFC", entity).casefold() in unicodedata.normalize("NFC", left).casefold():
        return True
    have = set(_words(left))
    want = [w for w in _words(entity) if w not in _NAME_PARTICLES] or _words(entity)
    return bool(want) and all(w in have for w in want)


# -- parsing the answer ------------------------------------------------------------------------------

def _malformed_spans(annotation: str, problems) -> list[tuple[int, int, str]]:
    """(start, end, reason) of each malformed call: up to its closing bracket (``<|db_end|>`` in the token
    form) when that comes before the next call, else just its head, ``[dblookup(...) ->`` or the markers up
    to ``<|db_retrieve|>`` (its value is then left in the text); a stray marker alone."""
    spans = []
    for p in problems:
        start = p.position
        if annotation.startswith(PAPER_TOKENS.start, start):
            end = _malformed_token_call_end(annotation, start)
        elif not annotation.startswith("[dblookup(", start):
            end = start + next((len(mk) for mk in PAPER_TOKENS.as_list() if annotation.startswith(mk, start)), 1)
        else:
            nxt = annotation.find("[dblookup(", start + 1)
            close = annotation.find("]", start)
            if close >= 0 and (nxt < 0 or close < nxt):
                end = close + 1
            else:
                m = _MALFORMED_HEAD.match(annotation, start)
                end = m.end() if m else start + 1
        if spans and start < spans[-1][1]:
            continue
        spans.append((start, end, p.reason))
    return spans


def _malformed_token_call_end(annotation: str, start: int) -> int:
    """Where a malformed call of the token form that opens at ``start`` ends: after its ``<|db_end|>``
    when that comes before the next call, else after the last of its markers and the spaces that follow."""
    t = PAPER_TOKENS
    nxt = annotation.find(t.start, start + 1)
    nxt = len(annotation) if nxt < 0 else nxt
    close = annotation.find(t.end, start, nxt)
    if close >= 0:
        return close + len(t.end)
    end = start + len(t.start)
    for mk in (t.sep, t.retrieve):
        i = annotation.find(mk, end, nxt)
        end = i + len(mk) if i >= 0 else end
    while end < len(annotation) and annotation[end].isspace():
        end += 1
    return end


def _remove_malformed(annotation: str) -> tuple[str, list[tuple[int, str, str]]]:
    """The annotation without its malformed calls, and (offset in the cleaned text, call, reason) of each."""
    problems = parse(annotation).problems  # both forms
    spans = _malformed_spans(annotation, problems)
    out, removed, pos = [], [], 0
    for start, end, reason in spans:
        out.append(annotation[pos:start])
        cleaned_len = sum(map(len, out))
        removed.append((cleaned_len, annotation[start:end], reason))
        pos = end
        if annotation[pos:pos + 1] == " " and annotation[start - 1:start].isspace():
            pos += 1  # the call's own space
    out.append(annotation[pos:])
    return "".join(out), removed


def _aligner(plain: str, text: str):
    """A function mapping an offset in ``plain`` (the answer, stripped) to ``text`` (the input), or None
    where the answer changed the text within ``length`` characters from there."""
    if plain == text:
        return lambda p, loose=False, length=1: p
    blocks = difflib.SequenceMatcher(None, plain, text, autojunk=False).get_matching_blocks()

    def to_text(p: int, loose: bool = False, length: int = 1) -> int | None:
        for a, b, size in blocks:
            if a <= p < a + size:
                return b + (p - a) if loose or p + length <= a + size else None
            if loose and p < a and size:
                return b  # the first unchanged text after p
        return None

    return to_text


# -- the whole check ---------------------------------------------------------------------------------

def validate(text: str, annotation: str, *, dedupe: Literal["mention", "document"] = "mention",
             value_slack: int = 24) -> Validated:
    """Check an annotation of ``text``; rebuild it on ``text`` with the calls that pass.

    Args:
        text: the input the annotator was given.
        annotation: its answer: ``text`` with ``[dblookup('E', 'R') -> V]`` calls (the token form is
            accepted too).
        dedupe: ``"mention"`` rejects a repeated key (any value) at the same place; ``"document"``
            a repeated fact (same value) anywhere in the document.
        value_slack: characters beyond the value's length in which its words must all occur.

    Returns:
        :class:`Validated`; its ``segments`` strip to ``text`` whatever the annotator did.
    """
    if not isinstance(text, str) or not isinstance(annotation, str):
        raise TypeError("validate expects two strings: the input text and its annotation")
    cleaned, malformed = _remove_malformed(annotation)
    segments = parse(cleaned).segments
    plain, offsets = plain_text(segments)
    changed = plain != text
    to_text = _aligner(plain, text)
    rejected = [Rejected("malformed", call, _map_removed(cleaned, off, plain, text, to_text), detail=detail)
                for off, call, detail in malformed]
    placed: list[tuple[int, Lookup]] = []
    seen: set = set()
    for call, p in zip((s for s in segments if isinstance(s, Lookup)), offsets):
        q = to_text(_skip_space(plain, p), length=min(len(call.value), len(plain) - _skip_space(plain, p)))
        reason = _check(text, q, call, value_slack)
        # one key at one mention: a second value there is never what the KB answers the second call
        key = (call.entity.casefold(), call.relation.casefold()) + ((q,) if dedupe == "mention" else
                                                                    (call.value.casefold(),))
        if reason is None and key in seen:
            reason = "duplicate"
        if reason:
            rejected.append(Rejected(reason, render_lookup(call), -1 if q is None else q, call.entity,
                                     call.relation, call.value))
            continue
        seen.add(key)
        placed.append((q, call))
    rejected.sort(key=lambda r: r.at)
    return Validated(text, insert_calls(text, placed), [c for _, c in placed], [q for q, _ in placed],
                     rejected, changed)


def _check(text: str, q: int | None, call: Lookup, value_slack: int) -> str | None:
    if q is None:
        return "text_changed"
    if not value_follows(text, q, call.value, value_slack):
        return "value_not_after_call"
    if not entity_in_context(text[:q], call.entity):
        return "entity_not_in_left_context"
    return None


def _skip_space(s: str, p: int) -> int:
    while p < len(s) and s[p].isspace():
        p += 1
    return p


def _map_removed(cleaned: str, offset: int, plain: str, text: str, to_text) -> int:
    """Where a removed malformed call stood, as an offset in the input text (-1 if unknown)."""
    p = _skip_space(plain, len(strip(parse(cleaned[:offset]).segments)))
    q = to_text(p, loose=True) if p < len(plain) else None
    return -1 if q is None else _skip_space(text, q)


def insert_calls(text: str, placed: Iterable[tuple[int, Lookup]]) -> list[Segment]:
    """``text`` with each call inserted before offset ``q``; the space after a call belongs to it
    (``born [call] London``). Calls at the same offset are written next to each other, in order."""
    segments: list[Segment] = []
    pos, space = 0, False
    for q, call in sorted(placed, key=lambda x: x[0]):
        if q > pos:
            segments.append(Text((" " if space else "") + text[pos:q]))
            pos = q
        segments.append(call)
        space = q == 0 or text[q - 1].isspace()
    segments.append(Text((" " if space else "") + text[pos:]))
    out = [s for s in segments if not (isinstance(s, Text) and s.text == "")]
    if strip(out) != text:
        raise AssertionError("insert_calls changed the text")
    return out


def place_facts(text: str, facts: Iterable[tuple[str, str, str]]) -> str:
    """``text`` annotated with ``facts``: each call goes right before the first mention of its value
    (whole words, any case) that has the entity's words to its left; the value is written as the text
    spells it. Facts whose value is never mentioned so are left out (:func:`validate_facts` lists them).
    The result strips back to ``text``.

    Examples:
        >>> place_facts("Ada Lovelace was born in London.", [("Ada Lovelace", "Birth City", "london")])
        "Ada Lovelace was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London."
    """
    return render(insert_calls(text, _place_facts(text, facts)[0]))


def _place_facts(text: str, facts: Iterable[tuple[str, str, str]]
                 ) -> tuple[list[tuple[int, Lookup]], list[tuple[str, str, str]]]:
    """The calls of :func:`place_facts` with their offsets in ``text``, and the facts it could not place."""
    placed: list[tuple[int, Lookup]] = []
    unplaced: list[tuple[str, str, str]] = []
    for entity, relation, value in facts:
        if not _words(value):
            unplaced.append((entity, relation, value))
            continue
        pattern = r"(?<!\w)" + re.escape(value.strip()) + r"(?!\w)"
        for m in re.finditer(pattern, text, flags=re.IGNORECASE):
            if entity_in_context(text[:m.start()], entity):
                placed.append((m.start(), Lookup(entity, relation, m.group(0))))
                break
        else:
            unplaced.append((entity, relation, value))
    return placed, unplaced


def validate_facts(text: str, facts: Iterable[tuple[str, str, str]], **kwargs) -> Validated:
    """Validate ``facts``, ``(entity, relation, value)`` an LLM listed for ``text``, placed in it by
    :func:`place_facts`; a fact that cannot be placed (no mention of its value with its entity to the
    left) is rejected as ``value_not_in_text``. ``kwargs`` go to :func:`validate`.

    Examples:
        >>> v = validate_facts("Ada Lovelace was born in London.", [("Ada Lovelace", "Birth City", "London"),
        ...                                                       ("Ada Lovelace", "Death City", "Marylebone")])
        >>> [c.value for c in v.kept], [r.reason for r in v.rejected], v.text_changed
        (['London'], ['value_not_in_text'], False)
    """
    placed, unplaced = _place_facts(text, facts)
    v = validate(text, render(insert_calls(text, placed)), **kwargs)
    v.rejected += [Rejected("value_not_in_text", f"{e} | {r} | {val}", -1, e, r, val) for e, r, val in unplaced]
    return v


def calls_with_offsets(segments: Sequence[Segment]) -> list[tuple[int, Lookup]]:
    """(offset in the plain text of the word the call precedes, call) for each call of a document."""
    plain, positions = plain_text(segments)
    calls = [s for s in segments if isinstance(s, Lookup)]
    return [(_skip_space(plain, p), c) for p, c in zip(positions, calls)]
