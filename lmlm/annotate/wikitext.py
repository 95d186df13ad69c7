"""Reading a MediaWiki XML dump: pages and redirects (:func:`iter_pages`), infobox fields as
``(Field Name, values)`` (:func:`parse_infobox`, :func:`relation_name`) and an article's plain text
(:func:`article_text`). What :mod:`lmlm.annotate.wikipedia` turns into lookup calls.
"""

from __future__ import annotations

import bz2
import functools
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import need

__all__ = ["WikiPage", "Infobox", "iter_pages", "parse_infobox", "article_text", "relation_name", "field_values", "MONTHS"]

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
_FIRST_ARG_TEMPLATES = {"marriage", "nowrap", "nobr", "big", "native name", "nowrap begin",
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
# Word endings that the encoder's vocabulary also holds as words: a key is never split before one
# (``combatant`` is one word, not ``combat ant``).
_SUFFIXES = {"ant", "ants", "ent", "ents", "ion", "ions", "ism", "ist", "ists", "ity", "ness", "ment", "ments",
             "ship", "ance", "ence", "ers", "ing", "ings", "ian", "ians", "ese", "ish", "ive", "ous"}
_WORD = re.compile(r"\w", re.UNICODE)
MAX_VALUE_CHARS = 80


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
    opener = bz2.open if path.suffix.lower() == ".bz2" else open
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
    from ..kb.encoder import DEFAULT_MODEL, model_location

    try:
        lines = (Path(model_location(DEFAULT_MODEL)) / "vocab.txt").read_text(encoding="utf-8").splitlines()
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
            if prev is None or piece not in words or (len(piece) < 3 and piece not in _SHORT_WORDS) \
                    or (start > 0 and piece in _SUFFIXES):
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
    """Replace value templates in place: dates become text, lists become lines, the rest goes ({{small}}
    too, as the <small> tag: a translation or a note beside the value, "Aruba, Sweet Country")."""
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


_MEDIA_LINK = re.compile(r"\s*:?\s*(file|image|media|category)\s*:", re.I)


def field_values(raw) -> list[str]:
    """Clean fact values from one infobox field's wikicode (several per field for lists)."""
    mw = need("mwparserfromhell", "wikipedia", "reading Wikipedia markup")

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
    for link in code.filter_wikilinks(recursive=False):  # a file's options ("center", "250px") are no value
        if _MEDIA_LINK.match(str(link.title)):
            try:
                code.remove(link)
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
    mw = need("mwparserfromhell", "wikipedia", "reading Wikipedia markup")

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
            for v in field_values(p.value):
                box.facts.append((relation_name(key), v))
        box.facts = list(dict.fromkeys(box.facts))
        return box
    return None


def article_text(wikitext: str) -> str:
    """The article's readable text: templates, references, files, tables and categories removed."""
    mw = need("mwparserfromhell", "wikipedia", "reading Wikipedia markup")

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
