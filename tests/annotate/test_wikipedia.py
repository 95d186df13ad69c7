"""Distant supervision from Wikipedia infoboxes on a dump written here and on the real 106-article excerpt."""

import bz2
import json
from pathlib import Path

import pytest

from lmlm.annotate.validate import validate
from lmlm.annotate.wikipedia import (annotate_article, annotate_dump, iter_pages, parse_infobox, relation_name,
                                     WikiPage)
from lmlm.kb import KnowledgeBase, get_encoder
from lmlm.kb.formats import read_aliases
from lmlm.lookup import Lookup, parse, plain_text

REAL_DUMP = next((p / "shared" / "data" / "wikipedia" / "enwiki-sample-106-articles.xml.bz2"
                  for p in Path(__file__).resolve().parents if (p / "shared" / "data").is_dir()), Path("missing"))

ADA = """{{Infobox scientist
| name        = Ada Lovelace
| birth_name  = Augusta Ada Byron
| image       = Ada_Lovelace.jpg
| caption     = Portrait, 1836
| birth_date  = {{birth date|1815|12|10}}
| birth_place = [[London]], England
| death_date  = {{death date and age|1852|11|27|1815|12|10}}
| known_for   = {{plainlist|
* [[Analytical Engine|the Analytical Engine]]
* Mathematics}}
| spouse      = [[William King-Noel, 1st Earl of Lovelace|William King]]<br />(m. 1835)
| drives_on   = right
| anthem      = ''[[Aruba Dushi Tera]]''<br/>{{small|''Aruba, Sweet Country''}}<br/>[[File:Aruba Dushi Tera.ogg|center]]
}}
'''Augusta Ada King''' ('''Ada Lovelace''') was an English mathematician born in [[London]] on 10 December 1815.
She married William King in 1835 and wrote about the Analytical Engine.<ref>A source</ref> She worked on the right problems.
She died on November 27, 1852.
[[Category:Mathematicians]]
"""


def _dump(tmp_path: Path, pages=None) -> Path:
    pages = pages or [("1", "Ada Lovelace", ADA, False), ("2", "Lovelace", "#REDIRECT [[Ada Lovelace]]", True),
                      ("3", "Plain page", "A page about nothing in particular.", False)]
    xml = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">']
    for pid, title, text, redirect in pages:
        esc = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        xml.append(f"<page><title>{title}</title><ns>0</ns><id>{pid}</id>"
                   + ('<redirect title="Ada Lovelace" />' if redirect else "")
                   + f"<revision><id>9{pid}</id><text>{esc}</text></revision></page>")
    xml.append("</mediawiki>")
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress("\n".join(xml).encode()))
    return path


def test_infobox_fields_become_readable_triples():
    box = parse_infobox(ADA)
    facts = dict.fromkeys(box.facts)
    assert ("Birth Date", "December 10, 1815") in facts
    assert ("Birth Place", "London, England") in facts
    assert ("Death Date", "November 27, 1852") in facts
    assert ("Known For", "the Analytical Engine") in facts and ("Known For", "Mathematics") in facts
    assert ("Spouse", "William King") in facts
    # a file link's options ("center") and a translation in small type are no value
    assert [v for r, v in box.facts if r == "Anthem"] == ["Aruba Dushi Tera"]
    assert not any(r in {"Image", "Caption", "Name"} for r, _ in box.facts)
    assert relation_name("term_start2") == "Term Start"
    # run-together keys are spelled as words (the encoder's vocabulary), abbreviations spelled out
    assert [relation_name(k) for k in ("officiallang", "notableworks", "placeofburial", "highestelevus",
                                       "nationality", "medianhouseholdincome", "combatant2")] == \
        ["Official Language", "Notable Works", "Place Of Burial", "Highest Elevation US", "Nationality",
         "Median Household Income", "Combatant"]


def test_calls_sit_before_mentions_and_the_text_is_unchanged():
    art = annotate_article(WikiPage("1", "Ada Lovelace", ADA), all_mentions=True)
    calls = [s for s in art["segments"] if isinstance(s, Lookup)]
    plain, positions = plain_text(art["segments"])
    assert plain == art["plain"] and "Category" not in plain and "A source" not in plain
    found = {(c.relation, c.value): plain[p:] for c, p in zip(calls, positions)}
    # the date is written "10 December 1815" in the text: the call carries the infobox value
    assert found[("Birth Date", "December 10, 1815")].startswith("10 December 1815")
    assert found[("Spouse", "William King")].startswith("William King in 1835")
    assert found[("Death Date", "November 27, 1852")].startswith("November 27, 1852.")
    assert found[("Known For", "the Analytical Engine")].startswith("the Analytical Engine")
    # "right" is a common word: a fact, but not trusted as a mention
    assert ("Drives On", "right") not in found
    assert all(c.entity == "Ada Lovelace" for c in calls)
    # every infobox fact is a triple; unmentioned ones have no position
    triples = {(r, v): p for _, r, v, p in art["triples"]}
    assert triples[("Drives On", "right")] is None and triples[("Birth Place", "London, England")] is None


def test_a_call_only_where_the_sentence_says_what_the_relation_is():
    """'She married William King' states the spouse; 'and wrote about the Analytical Engine' does not
    say that she is known for it: that mention gets no call (its fact stays in the KB)."""
    art = annotate_article(WikiPage("1", "Ada Lovelace", ADA))
    calls = {(c.relation, c.value) for c in art["segments"] if isinstance(c, Lookup)}
    assert calls == {("Birth Date", "December 10, 1815"), ("Spouse", "William King"),
                     ("Death Date", "November 27, 1852")}
    assert art["unsupported"] == 1 and ("Known For", "the Analytical Engine") in {(r, v) for _, r, v, _ in
                                                                                  art["triples"]}


def test_facts_not_of_their_relations_kind_stay_out_and_cues_read_the_words_before():
    from lmlm.annotate.support import fits_kind, stated_before

    assert not fits_kind("Largest City", "212,038") and fits_kind("Largest City", "Birmingham")
    assert not fits_kind("Birth Date", "London") and fits_kind("Birth Date", "10 December 1815")
    assert fits_kind("Population", "212,038") and fits_kind("Motto", "1")
    assert stated_before("Its capital and most populous city is", "Capital")
    assert stated_before("The state's most populous city is", "Largest City")
    assert stated_before("Huxley married", "Spouses") and stated_before("The premier has been", "Premier")
    assert not stated_before("Florida and the", "Lowest Point")
    assert not stated_before("also the Casbah of", "Capital")
    # the cue stands in the mention's own clause, or right before a break that sets the value beside it
    assert not stated_before("gradually replaced by a Turkic language, the early precursor of the", "Official Languages")
    assert stated_before("and the current Lt. Governor, ", "Lieutenant Governor")
    assert stated_before("in urban areas inequality is most evident in the capital, ", "Capital")
    assert stated_before("Her novella was written during a break from her next major novel, ", "Notable Works")
    # a relation the table knows is stated by its cues, not by a word of its name: "city" is any city
    assert not stated_before("many rural people migrated to the city of", "Largest City")
    assert stated_before("music was composed by", "Composer")  # no table entry: its own words


def test_a_mention_opening_a_sentence_is_not_supported_by_the_sentence_before():
    """'The nation is led by Ashraf Ghani as president. Abdullah Abdullah serves as chief executive': the mention's
    own sentence has no words before it, so no call there (the sentence before states another fact)."""
    box = "{{Infobox country\n| leader_name1 = Ashraf Ghani\n| leader_name2 = Abdullah Abdullah\n}}\n"
    text = ("'''Afghanistan''' is a country. The nation is led by Ashraf Ghani as president. "
            "Abdullah Abdullah serves as the chief executive.")
    art = annotate_article(WikiPage("2", "Afghanistan", box + text))
    calls = [(c.relation, c.value) for c in art["segments"] if isinstance(c, Lookup)]
    assert ("Leader Name", "Ashraf Ghani") in calls and ("Leader Name", "Abdullah Abdullah") not in calls


def test_dump_to_documents_triples_and_kb(tmp_path):
    out = tmp_path / "wiki"
    report = annotate_dump(_dump(tmp_path), out, progress=False)
    assert report["articles"] == 2 and report["with_infobox"] == 1  # the redirect is skipped
    docs = [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]
    assert [d["source"] for d in docs] == ["Ada Lovelace", "Plain page"]  # the schema of lmlm.corpus
    assert [d["id"] for d in docs] == ["enwiki-1", "enwiki-3"] and docs[0]["infobox"] == "Infobox scientist"
    for d in docs:
        assert plain_text(parse(d["annotated"], form="dblookup", strict=True).segments)[0] == d["text"]
    assert report["calls"] == sum(d["annotated"].count("[dblookup(") for d in docs) == 3
    assert report["mentions_unsupported"] == 1
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=get_encoder())
    kb.import_jsonl(out / "triples.jsonl", why="wikipedia infoboxes")
    m = kb.lookup("Ada Lovelace", "birth date")
    assert m is not None and m.value == "December 10, 1815"
    # the redirect's title and the infobox's birth name are other names of the article's entity
    aliases = read_aliases(out / "aliases.jsonl")
    assert set(aliases) == {("Lovelace", "Ada Lovelace"), ("Augusta Ada Byron", "Ada Lovelace")}
    assert report["redirects"] == 1 and report["aliases"] == 2
    kb.add_aliases(aliases, why="wikipedia redirects and names")
    assert kb.lookup("Lovelace", "birth date").value == "December 10, 1815"
    assert kb.explain("Augusta Ada Byron", "Birth Date").via == "alias"


def test_of_a_keys_several_values_the_kb_answers_the_one_the_text_states(tmp_path):
    """The infobox lists three coaches and the text states one. Built from the triples as they are written,
    the KB answers that one (seen in the infobox and at its call), not the newest one the infobox lists."""
    page = ("{{Infobox tennis biography\n| name = Tom Player\n"
            "| coach = [[Emma Stone (coach)|Emma Stone]]<br />[[Brad Gilbert]]<br />[[Darren Cahill]]\n}}\n"
            "'''Tom Player''' is a tennis player from Ohio. With new coach Brad Gilbert, he won eight titles.\n")
    out = tmp_path / "wiki"
    annotate_dump(_dump(tmp_path, [("5", "Tom Player", page, False)]), out, progress=False)
    rows = [json.loads(line) for line in (out / "triples.jsonl").read_text().splitlines()]
    assert [(r["value"], r.get("count", 1)) for r in rows] == [("Emma Stone", 1), ("Brad Gilbert", 2),
                                                                ("Darren Cahill", 1)]
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=get_encoder())
    kb.import_jsonl(out / "triples.jsonl", why="wikipedia infoboxes")
    m = kb.lookup("Tom Player", "Coach")
    assert (m.value, m.support, m.alternatives, m.sources) == ("Brad Gilbert", 2, 2, ("enwiki-5",))


def test_bad_dumps_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Wikipedia dump"):
        list(iter_pages(tmp_path / "missing.xml.bz2"))
    bad = tmp_path / "bad.xml"
    bad.write_text("<mediawiki><page><title>x</title>")
    with pytest.raises(ValueError, match="not a MediaWiki XML dump"):
        list(iter_pages(bad))


@pytest.mark.skipif(not REAL_DUMP.exists(), reason="the 106-article Wikipedia excerpt is not on this machine")
def test_real_excerpt_yields_an_annotated_corpus(tmp_path):
    report = annotate_dump(REAL_DUMP, tmp_path / "wiki", limit=25, progress=False)
    assert report["articles"] == 25 and report["with_infobox"] >= 8
    assert report["calls"] >= 25 and report["triples"] >= 200
    for line in (tmp_path / "wiki" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        assert plain_text(parse(d["annotated"], form="dblookup", strict=True).segments)[0] == d["text"]
        # every call is one `lmlm annotate validate` keeps ("Actresses (Catalan: Actrius)" gave one before its title)
        assert validate(d["text"], d["annotated"]).rejected == [], d["id"]


def test_a_call_follows_the_entitys_name_as_the_call_writes_it():
    box = "{{Infobox economy\n| country = [[Angola]]\n| name = Economy of Angola\n}}\n"
    art = annotate_article(WikiPage("7", "Economy of Angola", box + (
        "The Economy of Angola is one of the fastest-growing economies. Angola exports oil.")), all_mentions=True)
    plain, positions = plain_text(art["segments"])
    # not on the "Angola" of the title's own mention: the call would name an entity the text has not finished naming
    assert [plain[p:p + 6] for p in positions] == ["Angola"] and positions[0] > plain.index("Angola exports") - 1
    art = annotate_article(WikiPage("8", "Afroasiatic languages", box.replace("Economy of Angola", "Afroasiatic")
                                    + "Afroasiatic is spoken in Angola."))
    assert not any(isinstance(s, Lookup) for s in art["segments"])  # its title's words never come before the value


def test_a_fact_is_called_again_in_each_passage_but_never_for_the_entitys_own_name_or_the_back_matter():
    filler = "This sentence is about something else entirely and only fills the paragraph up. " * 14
    page = ADA.replace("[[Category:Mathematicians]]", (
        f"{filler}\nLater in life William King managed the estates while Ada wrote letters. William King "
        "outlived her.\nThe Ada Lovelace Day is named after Augusta Ada Byron, whose name appears here.\n"
        "The William King–Noel Estate is a place, not the spouse.\n\nReferences\n\nA book by William King.\n"
        "[[Category:Mathematicians]]"))
    art = annotate_article(WikiPage("1", "Ada Lovelace", page), all_mentions=True)
    plain, positions = plain_text(art["segments"])
    calls = [(c.relation, c.value, p) for c, p in zip((s for s in art["segments"] if isinstance(s, Lookup)),
                                                       positions)]
    spouse = [p for r, _, p in calls if r == "Spouse"]
    # the first paragraph's mention, then once more in the far paragraph (its second mention there is not)
    assert len(spouse) == 2 and plain[spouse[1]:].startswith("William King managed")
    # the birth name is a name of Ada herself: a triple, never a call
    assert ("Birth Name", "Augusta Ada Byron", None) in [(r, v, p) for _, r, v, p in art["triples"]]
    assert not any(r == "Birth Name" for r, _, _ in calls)
    # part of a longer name joined by a dash, and the references section, get no call
    assert not any(plain[p:].startswith(("William King–Noel", "William King.")) for _, _, p in calls)
    # the triple's position is the first mention
    assert dict(((r, v), p) for _, r, v, p in art["triples"])[("Spouse", "William King")] == spouse[0]
