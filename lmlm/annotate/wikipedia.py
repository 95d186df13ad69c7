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
Other names of each entity go to ``aliases.jsonl``: the titles of the redirects to its article and
its infobox's ``name`` and ``birth_name`` (``lmlm kb build --aliases`` reads them).

Exercised by ``lmlm annotate wikipedia DUMP.xml.bz2 --out DIR``.
"""

from __future__ import annotations

import bz2
import functools
import json
import re
import statistics
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..corpus import Document, write_documents
from ..lookup import Lookup, Text, plain_text, render
from .passages import split_passages

__all__ = ["WikiPage", "Infobox", "iter_pages", "parse_infobox", "article_text", "annotate_article",
           "annotate_dump", "relation_name"]

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]

# fields that hold media, layout or links rather than facts about the entity
_SKIP_FIELD = re.compile(
    r"^(name|image|img|caption|alt|signature|logo|map|seal|flag|coat|symbol|website|url|homepage|footnote|"
    r"notes?|label|module|embed|pushpin|coord|coordinates|border|width|size|bodyclass|above|below|"
    r"child|header|data|imagesize|image_size|mapsize|blank|sortkey|smallimage|cover)"
    r"|(_?(image|caption|alt|size|width|map|logo|flag|seal|footnote|notes?|ref|link|url|type_?\d*|label|year|"
    r"rank|date_?ref|as_of|source))$")
_DATE_TEMPLATES = {"birth date", "death date", "birth date and age", "death date and age", "start date",
                   "end date", "start date and age", "end date and age", "dts", "birth-date", "death-date",
                   "film date", "release date", "bda", "dda", "birth year and age", "death year and age"}
_LIST_TEMPLATES = {"plainlist", "plain list", "ubl", "unbulleted list", "hlist", "flatlist", "flat list",
                   "bulleted list", "collapsible list", "ublist", "bulletedlist", "startplainlist", "endplainlist"}
_FIRST_ARG_TEMPLATES = {"marriage", "nowrap", "nobr", "small", "big", "native name", "nowrap begin",
                        "raise", "sup", "abbr", "nobold", "noitalic", "ill", "interlanguage link", "sort"}
_RELATION_ALIASES = {"vicepresident": "Vice President", "restingplace": "Resting Place",
                     "serviceyears": "Service Years", "birthplace": "Birth Place", "deathplace": "Death Place",
                     "birthdate": "Birth Date", "deathdate": "Death Date", "almamater": "Alma Mater",
                     "birthname": "Birth Name", "primeminister": "Prime Minister", "areatotal": "Area Total",
                     "doctoraladvisor": "Doctoral Advisor", "doctoralstudents": "Doctoral Students",
                     "knownfor": "Known For", "influenced": "Influenced", "influences": "Influences",
                     "mainint": "Main Interests", "notableideas": "Notable Ideas", "era": "Era",
                     "region": "Region", "school_tradition": "School Tradition"}
# abbreviations common in infobox keys, spelled out once a key is split into words
_ABBREVIATIONS = {"lang": "Language", "elev": "Elevation", "us": "US", "pop": "Population", "govt": "Government",
                  "est": "Established", "subj": "Subject", "db": "DB", "id": "ID"}
_SHORT_WORDS = {"of", "in", "on", "at", "to", "by", "us", "id", "db"}  # two-letter pieces a key may hold
_WORD = re.compile(r"\w", re.UNICODE)
MAX_VALUE_CHARS = 80
PASSAGE_CHARS = 1000  # about what a 256-token training window holds: a value gets a call once per passage


@dataclass(frozen=True)
class WikiPage:
    page_id: str
    title: str
    wikitext: str


@dataclass
class Infobox:
    template: str
    facts: list[tuple[str, str]] = field(default_factory=list)  # (relation, value), in field order


def iter_pages(path: str | Path, redirects: list[tuple[str, str]] | None = None) -> Iterator[WikiPage]:
    """Articles (namespace 0, redirects skipped) of a MediaWiki XML dump, plain or ``.bz2``.

    ``redirects``: a list that receives ``(redirect title, target title)`` for each article redirect.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no Wikipedia dump at {path}")
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rb") as f:
        try:
            for _, el in ET.iterparse(f, events=("end",)):
                if _local(el.tag) != "page":
                    continue
                ns = _child(el, "ns")
                redirect = next((c for c in el if _local(c.tag) == "redirect"), None)
                if redirect is not None and redirects is not None and (ns or "0") == "0":
                    target, title = redirect.get("title"), _child(el, "title")
                    if target and title and target != title:
                        redirects.append((title, target))
                rev = next((c for c in el if _local(c.tag) == "revision"), None)
                text = _child(rev, "text") if rev is not None else None
                if (ns or "0") == "0" and redirect is None and text:
                    yield WikiPage(_child(el, "id") or "", _child(el, "title") or "", text)
                el.clear()
        except ET.ParseError as e:
            raise ValueError(f"{path}: not a MediaWiki XML dump ({e})") from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(el, name: str) -> str | None:
    for c in el:
        if _local(c.tag) == name:
            return c.text
    return None


def relation_name(field_name: str) -> str:
    """A readable relation label for an infobox field: ``birth_place`` -> ``Birth Place``.

    Examples:
        >>> relation_name("term_start2"), relation_name("vicepresident")
        ('Term Start', 'Vice President')
    """
    key = re.sub(r"\d+$", "", field_name.strip().lower()).strip("_ ")
    if key in _RELATION_ALIASES:
        return _RELATION_ALIASES[key]
    words = [w for w in re.split(r"[_\s-]+", key) if w]
    if len(words) == 1:
        words = _split_compound(words[0])
    return " ".join(_ABBREVIATIONS.get(w) or w.capitalize() for w in words)


@functools.lru_cache(maxsize=1)
def _english_words() -> dict[str, int]:
    """Whole English words with their rank (a proxy for frequency): the MiniLM encoder's WordPiece
    vocabulary, which ships with the package that holds the encoder; empty if it cannot be read."""
    from ..kb.encoder import DEFAULT_MODEL, _model_location

    try:
        lines = (Path(_model_location(DEFAULT_MODEL)) / "vocab.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    words = {w: i for i, w in enumerate(lines) if w.isascii() and w.isalpha() and w.islower()}
    return {**{w: len(lines) for w in _ABBREVIATIONS}, **words}


@functools.lru_cache(maxsize=4096)
def _split_compound(key: str) -> tuple[str, ...]:
    """``notableworks`` -> ``("notable", "works")``: the fewest known words (then the most common)
    that spell a run-together key; the key itself when it is a word or cannot be spelled so.

    Examples:
        >>> _split_compound("largestcity"), _split_compound("population")
        (('largest', 'city'), ('population',))
    """
    words = _english_words()
    if len(key) < 7 or not key.isalpha() or key in words or not words:
        return (key,)
    # best[i]: (words, rank sum, split) spelling key[:i]
    best: list[tuple[int, int, tuple[str, ...]] | None] = [(0, 0, ())] + [None] * len(key)
    for end in range(2, len(key) + 1):
        for start in range(max(0, end - 20), end - 1):
            piece, prev = key[start:end], best[start]
            if prev is None or piece not in words or (len(piece) < 3 and piece not in _SHORT_WORDS):
                continue
            cand = (prev[0] + 1, prev[1] + words[piece], prev[2] + (piece,))
            if best[end] is None or cand[:2] < best[end][:2]:
                best[end] = cand
    return best[-1][2] if best[-1] is not None else (key,)


def _format_date(args: list[str]) -> str | None:
    nums = [a for a in args if re.fullmatch(r"\d{1,4}", a)]
    if not nums or len(nums[0]) != 4:
        return None
    year = nums[0]
    if len(nums) >= 3 and 1 <= int(nums[1]) <= 12 and 1 <= int(nums[2]) <= 31:
        return f"{MONTHS[int(nums[1]) - 1]} {int(nums[2])}, {year}"
    if len(nums) >= 2 and 1 <= int(nums[1]) <= 12:
        return f"{MONTHS[int(nums[1]) - 1]} {year}"
    return year


def _expand_templates(code) -> None:
    """Replace value templates in place: dates become text, lists become lines, the rest goes."""
    for tpl in code.filter_templates(recursive=False):
        name = str(tpl.name).strip().lower().replace("_", " ")
        positional = [str(p.value).strip() for p in tpl.params if not p.showkey]
        if name in _DATE_TEMPLATES:
            text = _format_date(positional) or ""
        elif name in _LIST_TEMPLATES:
            items = []
            for p in tpl.params:
                if not p.showkey:
                    _expand_templates(p.value)
                    items.append(str(p.value))
            text = "\n".join(items)
        elif name in _FIRST_ARG_TEMPLATES and tpl.params:
            first = next((p for p in tpl.params if not p.showkey), None)
            if first is None:
                text = ""
            else:
                _expand_templates(first.value)
                text = str(first.value)
        elif name == "lang" and len(positional) >= 2:
            text = positional[1]
        elif name == "convert" and positional:
            text = " ".join(positional[:2])
        else:
            text = ""
        try:
            code.replace(tpl, text)
        except ValueError:  # already replaced through a parent
            pass


def _values(raw) -> list[str]:
    """Clean fact values from one infobox field's wikicode (several per field for lists)."""
    import mwparserfromhell as mw

    code = mw.parse(str(raw))
    for tag in code.filter_tags(recursive=True):
        if str(tag.tag).strip().lower() == "br":
            try:
                code.replace(tag, "\n")
            except ValueError:
                pass
        elif str(tag.tag).strip().lower() in {"ref", "small", "sup", "sub"}:
            try:
                code.remove(tag)
            except ValueError:
                pass
    for c in code.filter_comments():
        try:
            code.remove(c)
        except ValueError:
            pass
    _expand_templates(code)
    text = code.strip_code(normalize=True, collapse=True)
    out = []
    for line in re.split(r"\n+", text):
        v = re.sub(r"\([^()]*\)", "", line).strip()
        v = re.sub(r"^[*#:;\s]+", "", v)
        v = re.sub(r"\s+", " ", v).strip(" ,;:")
        if v and len(v) <= MAX_VALUE_CHARS and _WORD.search(v) and not any(ch in v for ch in "{}|[]=<>"):
            out.append(v)
    return list(dict.fromkeys(out))


def parse_infobox(wikitext: str) -> Infobox | None:
    """The article's first infobox (``{{Infobox ...}}`` or a ``...box`` template with named fields)."""
    import mwparserfromhell as mw

    code = mw.parse(wikitext)
    for tpl in code.filter_templates(recursive=True):
        name = str(tpl.name).strip()
        name = re.sub(r"<!--.*?-->", "", name, flags=re.S).strip()
        low = name.lower()
        named = [p for p in tpl.params if p.showkey]
        if not (low.startswith("infobox") or (low.endswith("box") and len(named) >= 3)):
            continue
        box = Infobox(name)
        for p in named:
            key = str(p.name).strip()
            if not key or _SKIP_FIELD.search(key.lower()):
                continue
            for v in _values(p.value):
                box.facts.append((relation_name(key), v))
        box.facts = list(dict.fromkeys(box.facts))
        return box
    return None


def article_text(wikitext: str) -> str:
    """The article's readable text: templates, references, files, tables and categories removed."""
    import mwparserfromhell as mw

    code = mw.parse(wikitext)
    for node in list(code.filter_templates(recursive=False)) + list(code.filter_comments(recursive=False)):
        try:
            code.remove(node)
        except ValueError:
            pass
    for tag in code.filter_tags(recursive=False):
        if str(tag.tag).strip().lower() in {"ref", "gallery", "table", "math", "timeline", "imagemap", "references"}:
            try:
                code.remove(tag)
            except ValueError:
                pass
    for link in code.filter_wikilinks(recursive=False):
        target = str(link.title).strip().lower()
        if target.startswith(("file:", "image:", "category:", "media:")) or re.match(r"^[a-z]{2,3}(-[a-z]+)?:", target):
            try:
                code.remove(link)
            except ValueError:
                pass
    text = code.strip_code(normalize=True, collapse=True)
    text = re.sub(r"\{\|.*?\|\}", "", text, flags=re.S)  # wiki tables left by the parser
    lines = [re.sub(r"[ \t]+", " ", ln).strip() for ln in text.splitlines()]
    text = "\n".join(ln for ln in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _aliases(title: str, box: Infobox | None, raw_name: str | None) -> list[str]:
    base = re.sub(r"\s*\([^)]*\)$", "", title).strip()
    names = [title, base] + ([raw_name] if raw_name else [])
    return [n for n in dict.fromkeys(names) if n]


def _birth_names(box: Infobox | None) -> list[str]:
    return [v for r, v in (box.facts if box else []) if r == "Birth Name"]


def _value_forms(value: str) -> list[str]:
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
    for form in _value_forms(value):
        for m in re.finditer(r"(?<!\w)" + re.escape(form) + r"(?!\w)", text[start:stop]):
            a, b = start + m.start(), start + m.end()
            if not _inside_longer_name(text, a, b):
                if best is None or a < best[0]:
                    best = (a, b)
                break
    return best


def annotate_article(page: WikiPage) -> dict:
    """Annotate one article: ``{"doc_id", "title", "segments", "triples", "infobox", "entity_found"}``.

    ``triples`` are ``(entity, relation, value, position)``, with ``position`` the character offset
    of the fact's first call in the plain text, or ``None`` for facts the text never mentions after
    the entity.
    """
    import mwparserfromhell as mw

    doc_id = f"enwiki-{page.page_id}"
    box = parse_infobox(page.wikitext)
    text = article_text(page.wikitext)
    raw_name = None
    if box is not None:
        for tpl in mw.parse(page.wikitext).filter_templates(recursive=True):
            if str(tpl.name).strip() == box.template and tpl.has("name"):
                vals = _values(tpl.get("name").value)
                raw_name = vals[0] if vals else None
                break
    entity = page.title
    hits = [m.start() for a in _aliases(page.title, box, raw_name) for m in [re.search(re.escape(a), text)] if m]
    entity_end = None
    if hits:
        first = min(hits)
        entity_end = first + 1
    calls: list[tuple[int, int, str, str]] = []  # (start, end, relation, value)
    if box is not None and entity_end is not None:
        from ..kb.keys import normalize_text

        own = {normalize_text(n) for n in _aliases(page.title, box, raw_name) + _birth_names(box)}
        facts = [(r, v) for r, v in box.facts if normalize_text(v) not in own]
        body_end = _back_matter(text)
        for a, b in split_passages(text[:body_end], PASSAGE_CHARS, min_chars=1):
            if b <= entity_end:
                continue
            for relation, value in facts:
                span = _find_mention(text, value, max(a, entity_end), b)
                if span is not None:
                    calls.append((span[0], span[1], relation, value))
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
    triples = [(entity, r, v, mentioned.get((r, v))) for r, v in (box.facts if box else [])]
    names = [raw_name] + _birth_names(box)
    aliases = [n for n in dict.fromkeys(names) if n and n != entity]
    return {"doc_id": doc_id, "title": page.title, "segments": segments, "plain": text, "triples": triples,
            "aliases": aliases, "infobox": box.template if box else None, "entity_found": entity_end is not None}


def _merge(segments: list) -> list:
    out: list = []
    for s in segments:
        if isinstance(s, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + s.text)
        else:
            out.append(s)
    return out


def annotate_dump(dump: str | Path, out: str | Path, limit: int | None = None, progress: bool = True) -> dict:
    """Annotate every article of ``dump`` into ``out``.

    Writes ``documents.jsonl`` (the schema of :mod:`lmlm.corpus`: ``id``, ``annotated`` in the
    ``dblookup`` form, ``text``, ``source`` the article's title, and the ``infobox`` template),
    ``triples.jsonl`` (ready for ``lmlm kb build --triples``), ``aliases.jsonl`` (redirects and
    infobox names, for ``--aliases``) and ``report.json``
    (articles, infoboxes, triples, calls per article, the most frequent relations). Returns the report.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_calls, relations, n_triples, with_box, n_articles, no_entity = [], Counter(), 0, 0, 0, 0
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
                art = annotate_article(page)
                n_articles += 1
                with_box += art["infobox"] is not None
                no_entity += art["infobox"] is not None and not art["entity_found"]
                calls = [s for s in art["segments"] if isinstance(s, Lookup)]
                n_calls.append(len(calls))
                names += [(a, art["title"]) for a in art["aliases"]]
                relations.update(c.relation for c in calls)
                for e, r, v, p in art["triples"]:
                    ft.write(json.dumps({"entity": e, "relation": r, "value": v, "source": art["doc_id"],
                                         "position": p}, ensure_ascii=False) + "\n")
                    n_triples += 1
                yield Document(art["doc_id"], render(art["segments"], "dblookup"), art["plain"], source=art["title"],
                               meta={"infobox": art["infobox"]})

        write_documents(out / "documents.jsonl", documents())
    triples_tmp.replace(out / "triples.jsonl")
    aliases = list(dict.fromkeys(redirects + names))
    with open(out / "aliases.jsonl", "w", encoding="utf-8") as fa:
        for alias, entity in aliases:
            fa.write(json.dumps({"alias": alias, "entity": entity}, ensure_ascii=False) + "\n")
    report = {
        "dump": str(dump), "articles": n_articles, "with_infobox": with_box,
        "infobox_entity_not_in_text": no_entity, "triples": n_triples, "calls": sum(n_calls),
        "aliases": len(aliases), "redirects": len(redirects),
        "calls_per_article": round(sum(n_calls) / n_articles, 3) if n_articles else 0.0,
        "calls_per_infobox_article": round(sum(n_calls) / with_box, 3) if with_box else 0.0,
        "median_calls_per_article": statistics.median(n_calls) if n_calls else 0,
        "top_relations": relations.most_common(15),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
