"""The lookup grammar: parse, render and strip database lookup calls in annotated text.

An annotated text interleaves plain text with lookup calls. Two surface forms exist:

* the annotation form written by LLM annotators: ``[dblookup('Entity', 'Relation') -> Value]``
* the token form used for pretraining: ``<|db_start|> Entity <|sep|> Relation <|db_retrieve|> Value <|db_end|>``

Both parse into the same segments, :class:`Text` and :class:`Lookup`. Parsing never drops text: in
the default (lenient) mode, a malformed call is kept verbatim as :class:`Text` and reported as a
:class:`LookupProblem` with its character position; ``strict=True`` raises
:class:`LookupSyntaxError` instead. Every segment records its ``span`` in the input, so the spans of
the returned segments tile the input exactly.

Exercised by ``lmlm world`` (writes annotated corpora) and every later stage.

Examples:
    >>> doc = parse("Ada was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London.")
    >>> doc.segments[1]
    Lookup(entity='Ada Lovelace', relation='Birth City', value='London')
    >>> strip(doc.segments)
    'Ada was born in London.'
    >>> render(doc.segments, form="tokens")
    'Ada was born in <|db_start|> Ada Lovelace <|sep|> Birth City <|db_retrieve|> London <|db_end|> London.'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Literal, Union

from .errors import LmlmError

__all__ = [
    "LookupTokens",
    "PAPER_TOKENS",
    "RELEASED_TOKENS",
    "TOKEN_VOCABULARIES",
    "Text",
    "Lookup",
    "Segment",
    "LookupProblem",
    "LookupSyntaxError",
    "ParsedText",
    "parse",
    "render",
    "render_lookup",
    "strip",
    "plain_text",
    "plain_pieces",
    "lookups",
    "convert",
]


@dataclass(frozen=True)
class LookupTokens:
    """The four special tokens that delimit a lookup call.

    Args:
        start: opens a call (paper: ``<|db_start|>``).
        sep: separates entity from relation (paper: ``<|sep|>``).
        retrieve: ends the query; the database value follows (paper: ``<|db_retrieve|>``).
        end: closes the call after the value (paper: ``<|db_end|>``).
    """

    start: str = "<|db_start|>"
    sep: str = "<|sep|>"
    retrieve: str = "<|db_retrieve|>"
    end: str = "<|db_end|>"

    def __post_init__(self) -> None:
        names = self.as_list()
        if any(not t or t != t.strip() for t in names):
            raise ValueError(f"lookup tokens must be non-empty and unpadded, got {names}")
        if len(set(names)) != 4:
            raise ValueError(f"lookup tokens must be four distinct strings, got {names}")

    def as_list(self) -> list[str]:
        return [self.start, self.sep, self.retrieve, self.end]

    @classmethod
    def from_name(cls, name: str) -> "LookupTokens":
        """Return a named vocabulary (``paper`` or ``released``)."""
        if name not in TOKEN_VOCABULARIES:
            raise ValueError(f"unknown lookup token vocabulary {name!r}; known: {sorted(TOKEN_VOCABULARIES)}")
        return TOKEN_VOCABULARIES[name]


PAPER_TOKENS = LookupTokens()
# The vocabulary of the authors' released checkpoints.
RELEASED_TOKENS = LookupTokens("<|db_entity|>", "<|db_relationship|>", "<|db_return|>", "<|db_end|>")
TOKEN_VOCABULARIES = {"paper": PAPER_TOKENS, "released": RELEASED_TOKENS}


@dataclass(frozen=True)
class Text:
    """Plain text between lookups. ``span`` is its (start, end) in the parsed input."""

    text: str
    span: tuple[int, int] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Lookup:
    """One lookup call: ``(entity, relation) -> value``. ``span`` as for :class:`Text`."""

    entity: str
    relation: str
    value: str
    span: tuple[int, int] | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.entity, self.relation)


Segment = Union[Text, Lookup]


@dataclass(frozen=True)
class LookupProblem:
    """A malformed call found while parsing; its text was kept as plain :class:`Text`."""

    position: int  # character offset in the parsed input
    reason: str
    text: str  # the offending text (truncated to 80 characters)

    def __str__(self) -> str:
        return f"at character {self.position}: {self.reason}: {self.text!r}"


class LookupSyntaxError(LmlmError, ValueError):
    """Raised by ``parse(..., strict=True)`` on the first malformed call."""

    def __init__(self, problem: LookupProblem, source: str | None = None):
        self.problem = problem
        where = f"{source}: " if source else ""
        super().__init__(f"{where}malformed lookup call {problem}")


@dataclass
class ParsedText:
    """Result of :func:`parse`: the segments and the problems found (empty when all calls are valid)."""

    segments: list[Segment]
    problems: list[LookupProblem]

    @property
    def lookups(self) -> list[Lookup]:
        return [s for s in self.segments if isinstance(s, Lookup)]

    def strip(self) -> str:
        return strip(self.segments)


# ---------------------------------------------------------------------------------------------
# annotation form: [dblookup('E', 'R') -> V]

_DBLOOKUP_OPEN = "[dblookup("
# A quoted string: single or double quotes, backslash escapes.
_QUOTED = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
_DBLOOKUP_RE = re.compile(
    r"\[dblookup\(\s*(?P<e>" + _QUOTED + r")\s*,\s*(?P<r>" + _QUOTED + r")\s*\)\s*->\s*(?P<v>(?:[^\[\]\\]|\\.)*?)\s*\]",
    re.DOTALL,
)


def _unquote(q: str) -> str:
    body = q[1:-1]
    return re.sub(r"\\(.)", r"\1", body, flags=re.DOTALL)


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _escape_value(s: str) -> str:
    return re.sub(r"([\\\[\]])", r"\\\1", s)


def _unescape_value(s: str) -> str:
    return re.sub(r"\\(.)", r"\1", s, flags=re.DOTALL)


def _valid_field(name: str, s: str) -> str | None:
    if not s.strip():
        return f"empty {name}"
    if s != s.strip():
        return f"{name} has leading or trailing whitespace"
    return None


def render_lookup(lk: Lookup, form: Literal["dblookup", "tokens"] = "dblookup", tokens: LookupTokens = PAPER_TOKENS) -> str:
    """Render one call in canonical surface form."""
    if form == "dblookup":
        return f"[dblookup({_quote(lk.entity)}, {_quote(lk.relation)}) -> {_escape_value(lk.value)}]"
    if form == "tokens":
        t = tokens
        return f"{t.start} {lk.entity} {t.sep} {lk.relation} {t.retrieve} {lk.value} {t.end}"
    raise ValueError(f"form must be 'dblookup' or 'tokens', got {form!r}")


def render(segments: Iterable[Segment], form: Literal["dblookup", "tokens"] = "dblookup",
           tokens: LookupTokens = PAPER_TOKENS) -> str:
    """Render segments back to annotated text in one surface form (canonical spacing and quoting)."""
    out = []
    for seg in segments:
        out.append(seg.text if isinstance(seg, Text) else render_lookup(seg, form, tokens))
    return "".join(out)


def plain_text(segments: Iterable[Segment]) -> tuple[str, list[int]]:
    """The stripped text and, for each lookup, its character position in that text.

    A call is written *before* the word it looks up, separated by one space
    (``born [dblookup(...) -> 1990] 1990``); that space belongs to the call and goes with it.
    """
    positions: list[int] = []
    n = 0
    segments = list(segments)
    pieces = plain_pieces(segments)
    for seg, text in zip(segments, pieces):
        if isinstance(seg, Lookup):
            positions.append(n)
        n += len(text)
    return "".join(pieces), positions


def plain_pieces(segments: Iterable[Segment]) -> list[str]:
    """What each segment adds to :func:`plain_text`'s text: a text its own text, less the space before
    it when a call took that space; a lookup ``""``."""
    pieces: list[str] = []
    last, n, after_call = "", 0, False
    for seg in segments:
        if isinstance(seg, Lookup):
            pieces.append("")
            after_call = True
            continue
        text = seg.text
        if after_call and text.startswith(" ") and (n == 0 or last[-1:].isspace()):
            text = text[1:]
        after_call = False
        pieces.append(text)
        last, n = text, n + len(text)
    return pieces


def strip(segments: Iterable[Segment]) -> str:
    """Plain text with every lookup call removed (what the Standard baseline trains on)."""
    return plain_text(segments)[0]


def lookups(segments: Iterable[Segment]) -> list[Lookup]:
    return [s for s in segments if isinstance(s, Lookup)]


def _check_lookup(e: str, r: str, v: str, tokens: LookupTokens) -> str | None:
    for name, s in (("entity", e), ("relation", r), ("value", v)):
        bad = _valid_field(name, s)
        if bad:
            return bad
        for tok in tokens.as_list():
            if tok in s:
                return f"{name} contains the lookup token {tok}"
    return None


def _merge_text(segments: list[Segment]) -> list[Segment]:
    """Join adjacent Text segments (a malformed call kept as text sits next to other text)."""
    out: list[Segment] = []
    for seg in segments:
        if out and isinstance(seg, Text) and isinstance(out[-1], Text):
            prev = out[-1]
            span = (prev.span[0], seg.span[1]) if prev.span and seg.span else None
            out[-1] = Text(prev.text + seg.text, span)
        else:
            out.append(seg)
    return [s for s in out if not (isinstance(s, Text) and s.text == "")]


def _parse_dblookup(text: str, tokens: LookupTokens) -> tuple[list[Segment], list[LookupProblem]]:
    segments: list[Segment] = []
    problems: list[LookupProblem] = []
    pos = 0
    while True:
        i = text.find(_DBLOOKUP_OPEN, pos)
        if i < 0:
            break
        m = _DBLOOKUP_RE.match(text, i)
        problem = None
        if m:
            e, r, v = _unquote(m["e"]), _unquote(m["r"]), _unescape_value(m["v"])
            problem = _check_lookup(e, r, v, tokens)
            if problem is None:
                segments.append(Text(text[pos:i], (pos, i)))
                segments.append(Lookup(e, r, v, (i, m.end())))
                pos = m.end()
                continue
        else:
            problem = "unterminated or ill-formed dblookup call"
        end = text.find("]", i)
        snippet = text[i: (end + 1 if end >= 0 else len(text))][:80]
        problems.append(LookupProblem(i, problem, snippet))
        # keep the bad opening as text and rescan after it
        segments.append(Text(text[pos:i + len(_DBLOOKUP_OPEN)], (pos, i + len(_DBLOOKUP_OPEN))))
        pos = i + len(_DBLOOKUP_OPEN)
    segments.append(Text(text[pos:], (pos, len(text))))
    return segments, problems


def _parse_tokens(text: str, tokens: LookupTokens) -> tuple[list[Segment], list[LookupProblem]]:
    t = tokens
    pat = re.compile(
        re.escape(t.start) + r"(?P<e>.*?)" + re.escape(t.sep) + r"(?P<r>.*?)" + re.escape(t.retrieve)
        + r"(?P<v>.*?)" + re.escape(t.end), re.DOTALL)
    segments: list[Segment] = []
    problems: list[LookupProblem] = []
    pos = 0
    markers = [t.start, t.sep, t.retrieve, t.end]
    while True:
        hits = [(text.find(mk, pos), mk) for mk in markers]
        hits = [(i, mk) for i, mk in hits if i >= 0]
        if not hits:
            break
        i, mk = min(hits)
        problem = None
        if mk == t.start:
            m = pat.match(text, i)
            if m:
                e, r, v = m["e"].strip(), m["r"].strip(), m["v"].strip()
                problem = _check_lookup(e, r, v, tokens)
                if problem is None:
                    segments.append(Text(text[pos:i], (pos, i)))
                    segments.append(Lookup(e, r, v, (i, m.end())))
                    pos = m.end()
                    continue
            else:
                problem = "lookup call is not closed in order (start, sep, retrieve, end)"
            # the broken call reaches to its end marker or the next call, whichever is first
            nxt = [j for j in (text.find(t.start, i + 1), text.find(t.end, i + 1)) if j >= 0]
            stop = min(nxt) if nxt else len(text)
            stop = stop + len(t.end) if text.startswith(t.end, stop) else stop
        else:
            problem = f"{mk} outside a lookup call"
            stop = i + len(mk)
        problems.append(LookupProblem(i, problem, text[i:i + 80]))
        segments.append(Text(text[pos:stop], (pos, stop)))
        pos = stop
    segments.append(Text(text[pos:], (pos, len(text))))
    return segments, problems


def parse(text: str, form: Literal["auto", "dblookup", "tokens"] = "auto", tokens: LookupTokens = PAPER_TOKENS,
          strict: bool = False, source: str | None = None) -> ParsedText:
    """Parse annotated text into :class:`Text` and :class:`Lookup` segments.

    Args:
        text: annotated text in either surface form.
        form: ``"dblookup"``, ``"tokens"`` or ``"auto"`` (both; the token form is tried where its
            markers occur, the annotation form elsewhere).
        tokens: the lookup token vocabulary of the token form.
        strict: raise :class:`LookupSyntaxError` on the first malformed call instead of keeping it
            as text and reporting it.
        source: a name for the input (file:line) used in error messages.

    Returns:
        ParsedText with ``segments`` whose spans tile ``text`` and ``problems`` (malformed calls).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse expects str, got {type(text).__name__}")
    if form not in ("auto", "dblookup", "tokens"):
        raise ValueError(f"form must be 'auto', 'dblookup' or 'tokens', got {form!r}")
    if form == "tokens":
        segments, problems = _parse_tokens(text, tokens)
    elif form == "dblookup":
        segments, problems = _parse_dblookup(text, tokens)
    else:
        segments, problems = _parse_tokens(text, tokens)
        out: list[Segment] = []
        for seg in segments:  # dblookup calls inside the text parts
            if isinstance(seg, Text):
                sub, sub_problems = _parse_dblookup(seg.text, tokens)
                off = seg.span[0]
                for s in sub:
                    span = (s.span[0] + off, s.span[1] + off)
                    out.append(Text(s.text, span) if isinstance(s, Text) else Lookup(s.entity, s.relation, s.value, span))
                problems.extend(LookupProblem(p.position + off, p.reason, p.text) for p in sub_problems)
            else:
                out.append(seg)
        segments = out
        problems.sort(key=lambda p: p.position)
    if strict and problems:
        raise LookupSyntaxError(problems[0], source)
    return ParsedText(_merge_text(segments), problems)


def convert(text: str, to: Literal["dblookup", "tokens"], tokens: LookupTokens = PAPER_TOKENS) -> str:
    """Convert annotated text between surface forms (malformed calls stay as they were)."""
    return render(parse(text, tokens=tokens).segments, form=to, tokens=tokens)

