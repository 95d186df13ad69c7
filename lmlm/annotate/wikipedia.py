"""Distant supervision from Wikipedia: infobox facts become lookup calls in the article text.

No LLM is involved. Each article's infobox fields become ``(article title, Field Name, value)``
triples; wherever a value is mentioned in the article's plain text after the article first names
its entity, a lookup call is inserted right before that mention, as the paper places its calls:
at the value's first mention in each passage of about :data:`PASSAGE_CHARS` characters (paragraphs,
long ones cut at sentence ends), because a model reading a later passage no longer holds the
earlier mention in its context and must recall the fact again. A value that is a name of the
entity itself (``Common Name: Albania`` in *Albania*) is a fact but never a call: looking up the
name of the entity the text is about retrieves nothing the text has not said. The back matter
(references, external links, see also) gets no call.
Every triple goes to the KB (with the article as its source); only mentioned ones become calls.
A fact is seen once in the infobox and once at each of its calls (the triple's ``count``), so that
of a key's several values the KB answers one the text states over those the infobox only lists.
Other names of each entity go to ``aliases.jsonl``: the titles of the redirects to its article and
its infobox's ``name`` and ``birth_name`` (``lmlm kb build --aliases`` reads them).

Exercised by ``lmlm annotate wikipedia DUMP.xml.bz2 --out DIR``.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from pathlib import Path

from ..corpus import Document, write_documents
from ..errors import need
from ..jsonio import write_json
from ..lookup import Lookup, Text, plain_text, render
from .passages import split_passages
from .wikitext import (MONTHS, Infobox, WikiPage, article_text, field_values, iter_pages, parse_infobox,
                       relation_name)

PASSAGE_CHARS = 1000  # about what a 256-token training window holds: a value gets a call once per passage

__all__ = ["WikiPage", "Infobox", "iter_pages", "parse_infobox", "article_text", "annotate_article",
           "annotate_dump", "relation_name", "value_forms", "PASSAGE_CHARS"]


def _aliases(title: str, box: Infobox | None, raw_name: str | None) -> list[str]:
    base = re.sub(r"\s*\([^)]*\)$", "", title).strip()
    names = [title, base] + ([raw_name] if raw_name else [])
    return [n for n in dict.fromkeys(names) if n]


def _birth_names(box: Infobox | None) -> list[str]:
    return [v for r, v in (box.facts if box else []) if r == "Birth Name"]


def value_forms(value: str) -> list[str]:
    """Ways a value may be written in text: a ``Month D, YYYY`` date also as ``D Month YYYY``."""
    forms = [value]
    m = re.fullmatch(r"([A-Z][a-z]+) (\d{1,2}), (\d{4})", value)
    if m and m.group(1) in MONTHS:
        forms.append(f"{m.group(2)} {m.group(1)} {m.group(3)}")
    return forms


_BACK_MATTER = re.compile(r"^(References|External links|See also|Further reading|Notes|Bibliography|Sources|"
                          r"Citations|Footnotes|Notes and references)\s*$", re.MULTILINE)


def _back_matter(text: str) -> int:
    """Where the article's back matter (references, external links, see also) begins: no call goes there."""
    m = _BACK_MATTER.search(text)
    return m.start() if m else len(text)


def _inside_longer_name(text: str, start: int, end: int) -> bool:
    """True when a mention is part of a longer capitalized name (``Euro`` in ``CERH Euro Cup``,
    ``Tirana`` in ``Tirana–Elbasan Highway``)."""
    if re.match(r"[ \-\u2010-\u2015][A-Z]", text[end:end + 2]) or re.search(r"\w[\-\u2010-\u2015]$", text[max(0, start - 2):start]):
        return True
    m = re.search(r"(\S+) $", text[max(0, start - 40):start])
    if m and m.group(1)[:1].isupper():
        before = text[:start - len(m.group(0))].rstrip(" ")
        return not (before == "" or before[-1] in ".!?\n")  # a capitalized first word of a sentence is fine
    return False


def _find_mention(text: str, value: str, start: int, stop: int | None = None) -> tuple[int, int] | None:
    """The first trustworthy mention of ``value`` in ``text[start:stop]``, as ``(start, end)``."""
    if len(value) < 3 or re.fullmatch(r"[\d\s.,%]+", value) or re.fullmatch(r"[a-z]+", value):
        return None  # bare numbers and single common words ("right") match text by chance
    best = None
    for form in value_forms(value):
        for m in re.finditer(r"(?<!\w)" + re.escape(form) + r"(?!\w)", text[start:stop]):
            a, b = start + m.start(), start + m.end()
            if not _inside_longer_name(text, a, b):
                if best is None or a < best[0]:
                    best = (a, b)
                break
    return best


def annotate_article(page: WikiPage, all_mentions: bool = False) -> dict:
    """Annotate one article: ``{"doc_id", "title", "segments", "triples", "infobox", "entity_found"}``.

    ``triples`` are ``(entity, relation, value, position)``, with ``position`` the character offset
    of the fact's first call in the plain text, or ``None`` for facts the text never mentions after
    the entity. A fact whose value is not of its relation's kind (:func:`~lmlm.annotate.support.fits_kind`)
    is left out (``wrong_kind``); a mention whose sentence does not say, before it, what the
    relation is (:func:`~lmlm.annotate.support.stated_before`) gets no call (``unsupported``),
    unless ``all_mentions``.
    """
    from .support import fits_kind, stated_before

    mw = need("mwparserfromhell", "wikipedia", "reading Wikipedia markup")

    doc_id = f"enwiki-{page.page_id}"
    box = parse_infobox(page.wikitext)
    text = article_text(page.wikitext)
    raw_name = None
    if box is not None:
        for tpl in mw.parse(page.wikitext).filter_templates(recursive=True):
            if str(tpl.name).strip() == box.template and tpl.has("name"):
                vals = field_values(tpl.get("name").value)
                raw_name = vals[0] if vals else None
                break
    entity = page.title
    # a call goes where the text before it names the entity as the call writes it (the test of
    # `lmlm annotate validate`): not inside the title's own mention, nor after a redirect's name alone
    entity_end = _named_from(text, entity)
    calls: list[tuple[int, int, str, str]] = []  # (start, end, relation, value)
    unsupported = 0
    if box is not None and entity_end is not None:
        from ..kb.keys import normalize_text

        own = {normalize_text(n) for n in _aliases(page.title, box, raw_name) + _birth_names(box)}
        facts = [(r, v) for r, v in box.facts if normalize_text(v) not in own and fits_kind(r, v)]
        body_end = _back_matter(text)
        for a, b in split_passages(text[:body_end], PASSAGE_CHARS, min_chars=1):
            if b <= entity_end:
                continue
            for relation, value in facts:
                lo = max(a, entity_end)
                while (span := _find_mention(text, value, lo, b)) is not None:
                    if all_mentions or stated_before(text[_sentence_start(text, span[0]):span[0]], relation):
                        calls.append((span[0], span[1], relation, value))
                        break
                    unsupported += 1
                    lo = span[1]
    # one call per mention: the earliest fact wins a position; calls never overlap a previous mention
    calls.sort(key=lambda c: (c[0], -(c[1] - c[0])))
    kept, last_end = [], -1
    for c in calls:
        if c[0] >= last_end:
            kept.append(c)
            last_end = c[1]
    segments, pos = [], 0
    for start, _, relation, value in kept:
        before = text[pos:start]
        if before:
            segments.append(Text(before))
        segments.append(Lookup(entity, relation, value))
        pos = start
        # the call owns one space after it when the text before the mention ends in whitespace
        if start == 0 or text[start - 1].isspace():
            segments.append(Text(" "))
    if pos < len(text):
        segments.append(Text(text[pos:]))
    segments = _merge(segments)
    plain, positions = plain_text(segments)
    if plain != text:  # the text must come back unchanged
        raise AssertionError(f"{doc_id}: annotation changed the article text")
    mentioned: dict[tuple[str, str], int] = {}
    for (_, _, r, v), p in zip(kept, positions):
        mentioned.setdefault((r, v), p)  # the first mention
    triples = [(entity, r, v, mentioned.get((r, v))) for r, v in (box.facts if box else []) if fits_kind(r, v)]
    wrong_kind = len(box.facts) - len(triples) if box else 0
    names = [raw_name] + _birth_names(box)
    aliases = [n for n in dict.fromkeys(names) if n and n != entity]
    return {"doc_id": doc_id, "title": page.title, "segments": segments, "plain": text, "triples": triples,
            "aliases": aliases, "infobox": box.template if box else None, "entity_found": entity_end is not None,
            "wrong_kind": wrong_kind, "unsupported": unsupported}


_SENTENCE = re.compile(r"[.!?](?=\s+[A-Z0-9\"'(])|\n")


def _sentence_start(text: str, pos: int) -> int:
    """Where the sentence holding ``pos`` begins (after the last sentence end or line break before it)."""
    # the look-ahead reads the first letter of the sentence at ``pos``: search up to and including it
    ends = [m.end() for m in _SENTENCE.finditer(text, max(0, pos - 600), pos + 1) if m.end() <= pos]
    return ends[-1] if ends else max(0, pos - 600)


def _named_from(text: str, entity: str) -> int | None:
    """The first offset whose left context names ``entity`` (:func:`~lmlm.annotate.validate.entity_in_context`:
    each of its words before it), or ``None``; the test only ever passes once more text is before it."""
    from .validate import entity_in_context

    if not entity_in_context(text, entity):
        return None
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if entity_in_context(text[:mid], entity):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _merge(segments: list) -> list:
    out: list = []
    for s in segments:
        if isinstance(s, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + s.text)
        else:
            out.append(s)
    return out


def annotate_dump(dump: str | Path, out: str | Path, limit: int | None = None, progress: bool = True,
                  all_mentions: bool = False) -> dict:
    """Annotate every article of ``dump`` into ``out``.

    Writes ``documents.jsonl`` (the schema of :mod:`lmlm.corpus`: ``id``, ``annotated`` in the
    ``dblookup`` form, ``text``, ``source`` the article's title, and the ``infobox`` template),
    ``triples.jsonl`` (ready for ``lmlm kb build --triples``), ``aliases.jsonl`` (redirects and
    infobox names, for ``--aliases``) and ``report.json``
    (articles, infoboxes, triples, calls per article, the most frequent relations). Returns the report.

    Raises:
        ValueError: the dump is truncated or corrupt (its compressed stream or its XML); nothing is left
            written in ``out``.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_calls, relations, n_triples, with_box, n_articles, no_entity = [], Counter(), 0, 0, 0, 0
    dropped = Counter()
    triples_tmp = out / "triples.jsonl.tmp"
    redirects: list[tuple[str, str]] = []
    names: list[tuple[str, str]] = []
    with open(triples_tmp, "w", encoding="utf-8") as ft:
        def documents():
            nonlocal n_triples, with_box, n_articles, no_entity, names
            bar = tqdm(iter_pages(dump, redirects), desc="articles", unit="article", disable=not progress)
            for page in bar:
                if limit is not None and n_articles >= limit:
                    break
                art = annotate_article(page, all_mentions)
                dropped.update(wrong_kind=art["wrong_kind"], unsupported=art["unsupported"])
                n_articles += 1
                with_box += art["infobox"] is not None
                no_entity += art["infobox"] is not None and not art["entity_found"]
                calls = [s for s in art["segments"] if isinstance(s, Lookup)]
                n_calls.append(len(calls))
                names += [(a, art["title"]) for a in art["aliases"]]
                relations.update(c.relation for c in calls)
                stated = Counter((c.relation, c.value) for c in calls)
                for e, r, v, p in art["triples"]:
                    # seen in the infobox and at each call: the KB answers a stated value (module docstring)
                    count = {"count": 1 + stated[(r, v)]} if stated[(r, v)] else {}
                    ft.write(json.dumps({"entity": e, "relation": r, "value": v, "source": art["doc_id"],
                                         "position": p, **count}, ensure_ascii=False) + "\n")
                    n_triples += 1
                yield Document(art["doc_id"], render(art["segments"], "dblookup"), art["plain"], source=art["title"],
                               meta={"infobox": art["infobox"]})

        try:
            write_documents(out / "documents.jsonl", documents())
        except (EOFError, OSError, ValueError) as e:  # a cut-short or damaged dump: no partial triples left
            ft.close()
            triples_tmp.unlink(missing_ok=True)
            if isinstance(e, (EOFError, OSError)) and not isinstance(e, FileNotFoundError):
                raise ValueError(f"{dump}: the dump is truncated or corrupt ({e})") from None
            raise
    triples_tmp.replace(out / "triples.jsonl")
    aliases = list(dict.fromkeys(redirects + names))
    with open(out / "aliases.jsonl", "w", encoding="utf-8") as fa:
        for alias, entity in aliases:
            fa.write(json.dumps({"alias": alias, "entity": entity}, ensure_ascii=False) + "\n")
    report = {
        "dump": str(dump), "articles": n_articles, "with_infobox": with_box,
        "infobox_entity_not_in_text": no_entity, "triples": n_triples, "calls": sum(n_calls),
        "facts_wrong_kind": dropped["wrong_kind"], "mentions_unsupported": dropped["unsupported"],
        "all_mentions": all_mentions,
        "aliases": len(aliases), "redirects": len(redirects),
        "calls_per_article": round(sum(n_calls) / n_articles, 3) if n_articles else 0.0,
        "calls_per_infobox_article": round(sum(n_calls) / with_box, 3) if with_box else 0.0,
        "median_calls_per_article": statistics.median(n_calls) if n_calls else 0,
        "top_relations": relations.most_common(15),
    }
    write_json(out / "report.json", report)
    return report

