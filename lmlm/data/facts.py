"""Real facts from an installed source, split by entity, and written as short documents with their calls.

A model continued on one corpus's calls learns the few entities and relations that corpus is about.
Facts about many other entities, each stated in a sentence of its own with its lookup call, teach
it to name the entity a text is about and the relation a sentence asks for, in the words text uses
("The capital of Kenya is", "People from Kenya are called"). The values are masked in the loss, so
these documents add no fact to the weights: only the habit of calling.

* :func:`country_facts`: capital, demonym, continent and region of about 250 countries, from
  ``countryinfo`` (MIT; ``pip install "lmlm[facts]"``).
* :func:`read_facts`: the same from a triples file (``lmlm kb build``'s formats), or the source's name.
* :func:`split_by_entity`: a seeded share of the entities held out whole (never a fact of one entity
  on each side), entities a corpus names kept out of the held-out side.
* :func:`fact_documents`: one short document a fact, from a few phrasings of its relation: a source's own
  (:data:`PHRASINGS`), else "The <relation> of <entity> is" or, for the common infobox fields, one of the
  ways running text states them (:data:`TEXT_PHRASINGS`: "<entity> was born in").
* :func:`cloze_records`: the held-out facts as LAMA T-REx cloze prompts for ``lmlm eval trex``.

Exercised by ``lmlm data facts countryinfo --out FACTS --unnamed-in DOCS``.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Iterable, Sequence

from ..corpus import Document
from ..errors import LmlmError
from ..lookup import Lookup, Text

__all__ = ["SOURCES", "FactsError", "country_facts", "read_facts", "split_by_entity", "fact_documents",
           "cloze_records", "write_jsonl", "PHRASINGS", "TEXT_PHRASINGS"]

SOURCES = ("countryinfo",)

# (text before the value, text after it): the first is the cloze prompt's, the rest vary the training documents
PHRASINGS: dict[str, list[tuple[str, str]]] = {
    "Capital": [("The capital of {e} is", "."), ("{e}'s capital is", ", the seat of its government."),
                ("Its capital city is", "."), ("The seat of government of {e} is", ".")],
    "Demonym": [("People from {e} are called", "."), ("The demonym for {e} is", "."),
                ("Its citizens are known as", ".")],
    "Continent": [("{e} is a country in", "."), ("{e} lies on the continent of", "."),
                  ("The country is located in", ".")],
    "Region": [("{e} is part of", "."), ("It is a country of", "."), ("Geographically, {e} belongs to", ".")],
}

# How text states the common infobox fields of English Wikipedia (as LAMA T-REx phrases its relations): the
# words a sentence about a fact uses, so that a model trained on a corpus's infobox facts meets each relation
# in the wording of running text ("Ada Lovelace was born in"), not only in its field's name. A fact of such a
# relation is written either way: "The <relation> of <entity> is" (the cloze prompt) or one of these.
TEXT_PHRASINGS: dict[str, list[tuple[str, str]]] = {
    "Birth Date": [("{e} was born on", "."), ("The date of birth of {e} is", ".")],
    "Birth Place": [("{e} was born in", "."), ("{e} is a native of", ".")],
    "Birth Name": [("{e} was born with the name", "."), ("At birth, {e} was named", ".")],
    "Death Date": [("{e} died on", "."), ("{e} passed away on", ".")],
    "Death Place": [("{e} died in", "."), ("{e} passed away in", ".")],
    "Resting Place": [("{e} is buried in", "."), ("{e} was laid to rest in", ".")],
    "Spouse": [("{e} married", "."), ("{e} was married to", ".")],
    "Spouses": [("{e} married", "."), ("{e} was married to", ".")],
    "Partner": [("{e} lived with", "."), ("The partner of {e} was", ".")],
    "Children": [("{e} was the parent of", "."), ("The children of {e} include", ".")],
    "Parents": [("{e} was born to", "."), ("{e} was the child of", ".")],
    "Siblings": [("{e} was the sibling of", "."), ("The siblings of {e} include", ".")],
    "Relatives": [("{e} was related to", "."), ("The relatives of {e} include", ".")],
    "Alma Mater": [("{e} studied at", "."), ("{e} graduated from", "."), ("{e} was educated at", ".")],
    "Education": [("{e} studied at", "."), ("{e} was educated at", ".")],
    "Occupation": [("{e} worked as", "."), ("By profession, {e} was", ".")],
    "Nationality": [("By nationality, {e} was", "."), ("{e} held the nationality", ".")],
    "Citizenship": [("{e} was a citizen of", "."), ("{e} held citizenship of", ".")],
    "Residence": [("{e} lived in", "."), ("{e} resided in", ".")],
    "Known For": [("{e} is best known for", "."), ("{e} is famous for", ".")],
    "Notable Works": [("{e} wrote", "."), ("Among the works of {e} is", ".")],
    "Notable Ideas": [("{e} is known for the idea of", "."), ("{e} introduced the notion of", ".")],
    "Main Interests": [("{e} worked mainly on", "."), ("The main interests of {e} were", ".")],
    "Field": [("{e} worked in the field of", "."), ("{e} was a scholar of", ".")],
    "Fields": [("{e} worked in the field of", "."), ("{e} was a scholar of", ".")],
    "Work Places": [("{e} worked at", "."), ("{e} taught at", ".")],
    "Workplaces": [("{e} worked at", "."), ("{e} taught at", ".")],
    "Awards": [("{e} received the", "."), ("{e} was awarded the", ".")],
    "Prizes": [("{e} won the", "."), ("{e} was awarded the", ".")],
    "Influences": [("{e} was influenced by", "."), ("{e} drew on the work of", ".")],
    "Influenced": [("{e} influenced", "."), ("Among those influenced by {e} is", ".")],
    "Party": [("{e} was a member of the", "."), ("{e} belonged to the", ".")],
    "Religion": [("By religion, {e} is", "."), ("The faith of {e} is", ".")],
    "Conventional Long Name": [("{e}, officially the", ", is a country."), ("The official name of {e} is the", ".")],
    "Official Languages": [("The official language of {e} is", "."), ("In {e}, the official language is", ".")],
    "National Languages": [("The national language of {e} is", "."), ("In {e}, people speak", ".")],
    "Languages": [("The languages spoken in {e} include", "."), ("In {e}, people speak", ".")],
    "Language": [("{e} is written in", "."), ("The original language of {e} is", ".")],
    "Largest City": [("The largest city of {e} is", "."), ("The most populous city in {e} is", ".")],
    "Currency": [("The currency of {e} is the", "."), ("In {e}, people pay with the", ".")],
    "Leader Name": [("{e} is led by", "."), ("The leader of {e} is", ".")],
    "Leader Title": [("The head of {e} holds the title of", "."), ("{e} is led by its", ".")],
    "Legislature": [("The legislature of {e} is the", "."), ("Laws in {e} are made by the", ".")],
    "Established Date": [("{e} was established on", "."), ("{e} was founded on", ".")],
    "Established Event": [("{e} was established by the", "."), ("{e} came into being with the", ".")],
    "Founded": [("{e} was founded in", "."), ("{e} was set up in", ".")],
    "Founder": [("{e} was founded by", "."), ("The founder of {e} is", ".")],
    "Author": [("{e} was written by", "."), ("The author of {e} is", ".")],
    "Writer": [("{e} was written by", "."), ("The screenplay of {e} was written by", ".")],
    "Illustrator": [("{e} was illustrated by", "."), ("The pictures in {e} were drawn by", ".")],
    "Director": [("{e} was directed by", "."), ("The director of {e} is", ".")],
    "Starring": [("{e} stars", "."), ("The cast of {e} includes", ".")],
    "Genre": [("{e} belongs to the genre of", "."), ("{e} is a work of", ".")],
    "Publisher": [("{e} was published by", "."), ("The publisher of {e} is", ".")],
    "Composer": [("The music of {e} was composed by", "."), ("The score of {e} is by", ".")],
    "Creator": [("{e} was created by", "."), ("The creator of {e} is", ".")],
    "Country": [("{e} is in", "."), ("{e} comes from", ".")],
    "Location": [("{e} is located in", "."), ("{e} lies in", ".")],
    "Headquarters": [("{e} is headquartered in", "."), ("The headquarters of {e} are in", ".")],
    "Operator": [("{e} was operated by", "."), ("{e} is run by", ".")],
    "Manufacturer": [("{e} was built by", "."), ("{e} was manufactured by", ".")],
    "Commander": [("{e} saw forces commanded by", "."), ("The commanders in {e} included", ".")],
    "Combatant": [("{e} was fought by", "."), ("The sides in {e} included", ".")],
    "Result": [("{e} ended in", "."), ("The outcome of {e} was", ".")],
    "Coach": [("{e} was coached by", "."), ("The coach of {e} was", ".")],
    "Time Zone": [("{e} is in the time zone", "."), ("The time in {e} follows", ".")],
}


class FactsError(LmlmError, ValueError):
    """A fact source that is missing or cannot be read."""


def country_facts() -> list[tuple[str, str, str]]:
    """``(country, relation, value)`` for the countries ``countryinfo`` knows: Capital, Demonym, Continent
    (its region) and Region (its intermediate region, else its subregion); empty values left out."""
    try:
        import countryinfo
    except ImportError:
        raise FactsError('countryinfo is not installed: pip install "lmlm[facts]"') from None
    out = []
    for country in countryinfo.all_countries():
        try:
            info = country.info()
        except Exception:  # a record the package cannot complete (a few territories)
            continue
        name = (info.get("name") or "").strip()
        fields = {"Capital": info.get("capital"), "Demonym": info.get("demonym"), "Continent": info.get("region"),
                  "Region": info.get("intermediateregion") or info.get("subregion")}
        for relation, value in fields.items():
            if name and isinstance(value, str) and value.strip() and value.strip() != name:
                out.append((name, relation, value.strip()))
    return out


def read_facts(source: str | Path) -> list[tuple[str, str, str]]:
    """The facts of a named source (:data:`SOURCES`) or of a triples file, as ``(entity, relation, value)``."""
    if str(source) == "countryinfo":
        return country_facts()
    path = Path(source)
    if not path.is_file():
        raise FactsError(f"{source}: neither a fact source ({', '.join(SOURCES)}) nor a triples file")
    from ..kb.formats import read

    try:
        facts, _ = read(path)
    except (ValueError, OSError, KeyError) as e:
        raise FactsError(f"{path}: {e}") from None
    return [(f.entity, f.relation, f.value) for f in facts]


def split_by_entity(facts: Sequence[tuple[str, str, str]], held_out: float, seed: int = 0,
                    named: str = "") -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """``(train, held_out)``: a share ``held_out`` of the entities (seeded by name, so adding facts moves
    none) with all their facts on one side. An entity whose name occurs in ``named`` (a corpus's text)
    never goes to the held-out side: the held-out entities are ones that text never names."""
    if not 0 <= held_out <= 1:
        raise FactsError(f"held_out must be a share between 0 and 1, got {held_out}")
    cut = int(held_out * (1 << 32))
    train, held = [], []
    for fact in facts:
        entity = fact[0]
        out = zlib.crc32(f"{seed}:{entity}".encode()) < cut and entity not in named
        (held if out else train).append(fact)
    return train, held


def _phrasings(relation: str) -> list[tuple[str, str]]:
    """The relation's phrasings, the cloze prompt's first: a source's own, else the field's name and its text's words."""
    return PHRASINGS.get(relation) or [(f"The {relation.lower()} of {{e}} is", ".")] + TEXT_PHRASINGS.get(relation, [])


def fact_documents(facts: Iterable[tuple[str, str, str]], seed: int = 0, head: bool = True,
                   prefix: str = "fact") -> list[Document]:
    """One document a fact: the entity's name on a line of its own (``head``), then a sentence that states
    the fact with its lookup call before the value, in one of the relation's phrasings (seeded)."""
    rng = random.Random(seed)
    docs = []
    for n, (entity, relation, value) in enumerate(facts):
        before, after = rng.choice(_phrasings(relation))
        segments = [Text((f"{entity}\n" if head else "") + before.format(e=entity) + " "),
                    Lookup(entity, relation, value), Text(" " + value + after.format(e=entity))]
        docs.append(Document.from_segments(f"{prefix}/{n}", segments, source=entity, split="train",
                                           meta={"fact_source": prefix}))
    return docs


def cloze_records(facts: Iterable[tuple[str, str, str]], split: str = "facts") -> list[dict]:
    """The facts as LAMA T-REx records, each prompt the relation's first phrasing after the entity's name."""
    out = []
    for n, (entity, relation, value) in enumerate(facts):
        before, _ = _phrasings(relation)[0]
        out.append({"uuid": f"{split}/{n}", "sub_label": entity, "obj_label": value, "predicate_id": relation,
                    "masked_sentences": [f"{entity}\n{before.format(e=entity)} [MASK] ."], "split": split})
    return out


def write_jsonl(path: Path, rows: Iterable[dict | tuple[str, str, str]]) -> None:
    """``rows`` as JSON lines (a fact as ``{"entity", "relation", "value"}``: ``lmlm kb build``'s triples)."""
    from ..jsonio import write_jsonl as write

    write(path, (r if isinstance(r, dict) else dict(zip(("entity", "relation", "value"), r)) for r in rows))
