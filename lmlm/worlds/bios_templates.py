"""The sentences of a biography world: fact and filler templates as data, and how a biography is
composed from them (:func:`compose`: facts in life order, the first sentence naming the person,
every stated value right after its lookup call). Used by :mod:`lmlm.worlds.bios_draw`.
"""

from __future__ import annotations

import random
import string
from typing import Iterable

from ..lookup import Lookup, Segment, Text

WORLD_SOURCE = "world:bios"  # the ``source`` of every document of a biography world
RELATIONS = ("Birth Date", "Birth City", "University", "Major", "Employer", "Employer City")
# template field -> relation label
_FIELDS = {
    "birth_date": "Birth Date", "birth_city": "Birth City", "university": "University",
    "major": "Major", "employer": "Employer", "employer_city": "Employer City",
}
# Relations that read naturally together, in the order a biography tells them.
_LIFE_GROUPS = (("Birth Date", "Birth City"), ("University", "Major"), ("Employer", "Employer City"))
SPLITS = ("train", "added", "heldout")

# Sentence templates keyed by the relations they state. The first single-relation template of each
# relation is its cloze template: it starts with the subject and ends right after the value.
TEMPLATES: dict[tuple[str, ...], list[str]] = {
    ("Birth Date",): [
        "{Subj} was born on {birth_date}.",
        "{Poss} date of birth is {birth_date}.",
        "{Subj} came into the world on {birth_date}.",
        "Records show that {subj} was born on {birth_date}.",
        "Born on {birth_date}, {subj} was raised by a close-knit family.",
    ],
    ("Birth City",): [
        "{Subj} was born in {birth_city}.",
        "{Poss} hometown is {birth_city}.",
        "{Subj} is a native of {birth_city}.",
        "{Poss} birthplace is {birth_city}.",
        "Born in {birth_city}, {subj} spent {poss} early years there.",
    ],
    ("University",): [
        "{Subj} graduated from {university}.",
        "{Subj} attended {university}.",
        "{Subj} earned a degree from {university}.",
        "{Poss} alma mater is {university}.",
        "After high school, {subj} enrolled at {university}.",
    ],
    ("Major",): [
        "{Subj} majored in {major}.",
        "{Subj} studied {major} in college.",
        "{Poss} field of study was {major}.",
        "{Subj} holds a degree in {major}.",
        "At university, {subj} chose to focus on {major}.",
    ],
    ("Employer",): [
        "{Subj} works for {employer}.",
        "{Subj} is employed by {employer}.",
        "{Poss} employer is {employer}.",
        "{Subj} has spent most of {poss} career at {employer}.",
        "Today, {subj} holds a position at {employer}.",
    ],
    ("Employer City",): [
        "{Subj} works in the city of {employer_city}.",
        "{Poss} office is located in {employer_city}.",
        "{Subj} commutes to an office in {employer_city}.",
        "{Poss} workplace is in {employer_city}.",
        "For work, {subj} moved to {employer_city}.",
    ],
    ("Birth Date", "Birth City"): [
        "{Subj} was born on {birth_date} in {birth_city}.",
        "{Subj} was born in {birth_city} on {birth_date}.",
        "Born on {birth_date} in {birth_city}, {subj} grew up there.",
    ],
    ("University", "Major"): [
        "{Subj} studied {major} at {university}.",
        "{Subj} graduated from {university} with a degree in {major}.",
        "At {university}, {subj} majored in {major}.",
    ],
    ("Employer", "Employer City"): [
        "{Subj} works for {employer} in {employer_city}.",
        "{Subj} is employed by {employer} at its office in {employer_city}.",
        "{Subj} joined {employer} and now works in {employer_city}.",
    ],
}
CLOZE_TEMPLATES = {rel: TEMPLATES[(rel,)][0] for rel in RELATIONS}

# Sentences with no facts, so the corpus has ordinary language to model as well.
FILLER_TEMPLATES = [
    "{Subj} enjoys {hobby} in {poss} free time.",
    "On weekends, {subj} can often be found {activity}.",
    "{Poss} friends describe {obj} as {trait} and {trait2}.",
    "{Subj} has a {pet} named {pet_name}.",
    "{Subj} likes to cook {food} for friends and family.",
    "{Subj} plays the {instrument} whenever there is time.",
    "{Poss} favorite season is {season}.",
    "{Subj} is a lifelong fan of {genre} music.",
    "{Subj} once spent a whole summer learning {skill}.",
    "In {poss} spare time, {subj} volunteers at a local {venue}.",
    "{Subj} reads a few pages of {book_genre} every night before bed.",
    "{Subj} tries to go {sport} at least once a week.",
    "{Subj} keeps a small garden of {plant} on the balcony.",
    "Few people know that {subj} collects {collectible}.",
    "{Poss} idea of a perfect evening involves {evening}.",
    "{Subj} prefers {drink} in the morning.",
]
FILLER_WORDS: dict[str, list[str]] = {
    "hobby": ["painting", "birdwatching", "chess", "knitting", "photography", "baking", "pottery",
              "woodworking", "calligraphy", "rock climbing", "gardening", "writing short stories"],
    "activity": ["hiking in the hills", "at the farmers' market", "at a quiet bookshop", "cycling along the river",
                 "playing board games", "at the local swimming pool", "fishing by the lake", "in a small jazz club"],
    "trait": ["kind", "curious", "patient", "witty", "generous", "thoughtful", "ambitious", "calm", "cheerful",
              "reliable", "modest", "energetic"],
    "pet": ["dog", "cat", "parrot", "rabbit", "tortoise", "goldfish", "hamster"],
    "pet_name": ["Biscuit", "Pepper", "Luna", "Milo", "Ziggy", "Olive", "Rocket", "Mochi", "Buster", "Clover"],
    "food": ["lasagna", "curry", "paella", "dumplings", "banana bread", "chili", "risotto", "pancakes"],
    "instrument": ["piano", "guitar", "violin", "cello", "flute", "drums", "saxophone", "ukulele"],
    "season": ["spring", "summer", "autumn", "winter"],
    "genre": ["jazz", "folk", "classical", "blues", "country", "soul", "rock", "bluegrass"],
    "skill": ["to sail", "to juggle", "to speak Italian", "to bake bread", "to dance the tango", "to surf"],
    "venue": ["animal shelter", "library", "food bank", "community garden", "youth club", "hospital"],
    "book_genre": ["mystery novels", "poetry", "science fiction", "history books", "biographies", "fantasy"],
    "sport": ["running", "swimming", "bowling", "skating", "rowing", "cycling"],
    "plant": ["tomatoes", "herbs", "succulents", "roses", "sunflowers", "peppers"],
    "collectible": ["stamps", "old coins", "vinyl records", "postcards", "seashells", "antique maps"],
    "evening": ["a good film", "a long walk", "a crossword puzzle", "dinner with old friends", "a quiet book"],
    "drink": ["tea", "orange juice", "hot chocolate", "sparkling water", "green tea"],
}
FILLER_WORDS["trait2"] = FILLER_WORDS["trait"]

MAJORS = [
    "Accounting", "Aerospace Engineering", "Anthropology", "Applied Mathematics", "Architecture", "Art History",
    "Astronomy", "Biochemistry", "Biology", "Biomedical Engineering", "Business Administration",
    "Chemical Engineering", "Chemistry", "Civil Engineering", "Classics", "Cognitive Science",
    "Communication Studies", "Comparative Literature", "Computer Engineering", "Computer Science",
    "Criminal Justice", "Dance", "Economics", "Education", "Electrical Engineering", "English Literature",
    "Environmental Science", "Film Studies", "Finance", "French", "Geography", "Geology", "German", "History",
    "Industrial Design", "International Relations", "Journalism", "Linguistics", "Marketing",
    "Materials Science", "Mathematics", "Mechanical Engineering", "Music", "Neuroscience", "Nursing",
    "Nutrition", "Philosophy", "Physics", "Political Science", "Psychology", "Public Health",
    "Religious Studies", "Sociology", "Spanish", "Statistics", "Theater", "Urban Planning",
    "Veterinary Science", "Zoology", "Graphic Design",
]
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
# Locales for the share of non-US names: apostrophes (en_IE), diacritics, lowercase particles.
NAME_LOCALES = ("en_IE", "de_DE", "fr_FR", "es_ES", "pl_PL", "nl_NL", "tr_TR", "vi_VN")
_SUBJECT_FIELDS = ("Subj", "subj", "Poss", "poss", "obj")
_PRONOUNS = {"female": ("She", "she", "Her", "her", "her"), "male": ("He", "he", "His", "his", "him")}


def _compile(template: str) -> list[tuple[str, str | None]]:
    """Split a template into (literal, field) pairs, checking that every value follows a space."""
    parts = [(lit, name) for lit, name, _, _ in string.Formatter().parse(template)]
    for lit, name in parts:
        if name in _FIELDS and not lit.endswith(" "):
            raise ValueError(f"template {template!r}: {{{name}}} must follow a space")
        if name is not None and name not in _FIELDS and name not in _SUBJECT_FIELDS and name not in FILLER_WORDS:
            raise ValueError(f"template {template!r}: unknown field {{{name}}}")
    return parts


def _names_subject_first(parts: list[tuple[str, str | None]]) -> bool:
    """True when the subject is mentioned before any value (usable as a document's first sentence)."""
    for _, name in parts:
        if name in _SUBJECT_FIELDS:
            return True
        if name in _FIELDS:
            return False
    return True


def claim_templates() -> list[str]:
    """Every fact template with ``{subject}`` for the person and ``{<Relation>}`` for each value
    (``"{subject} was born in {Birth City}."``): the phrasings a relation-aware claim extractor reads
    (:class:`lmlm.evaluate.factscore.ClaimPatterns`). Filler sentences state no fact and are not here."""
    fields = {**{f: f"{{{rel}}}" for f, rel in _FIELDS.items()}, **{f: "{subject}" for f in _SUBJECT_FIELDS}}
    return [t.format(**fields) for ts in TEMPLATES.values() for t in ts]


COMPILED = {key: [_compile(t) for t in ts] for key, ts in TEMPLATES.items()}
_OPENERS = {key: [p for p in ps if _names_subject_first(p)] for key, ps in COMPILED.items()}
_FILLERS = [_compile(t) for t in FILLER_TEMPLATES]
assert all(len(TEMPLATES[(r,)]) >= 4 for r in RELATIONS) and all(_OPENERS.values())


def fill(parts: list[tuple[str, str | None]], person, named: bool,
          rng: random.Random | None = None) -> list[Segment]:
    """Render one compiled template; each value becomes ``Text("... ") Lookup Text(" value ...")``.

    ``person``: a :class:`lmlm.worlds.bios_draw.Person` (``name``, ``gender``, ``facts``; not imported
    here: that module imports this one). ``named``: the first mention of the subject is the full name;
    later mentions are pronouns.
    """
    names = dict(zip(_SUBJECT_FIELDS, (person.name, person.name, f"{person.name}'s", f"{person.name}'s", person.name)))
    pronouns = dict(zip(_SUBJECT_FIELDS, _PRONOUNS[person.gender]))
    segments: list[Segment] = []
    buf, words = "", {}
    for literal, name in parts:
        buf += literal
        if name in _FIELDS:
            relation = _FIELDS[name]
            value = person.facts[relation]
            segments += [Text(buf), Lookup(person.name, relation, value)]
            buf = " " + value
        elif name in names:
            buf += (names if named else pronouns)[name]
            named = False
        elif name is not None:
            choices = [w for w in FILLER_WORDS[name] if w not in words.values()]
            words[name] = rng.choice(choices)
            buf += words[name]
    return segments + [Text(buf)]


def _merge(segments: Iterable[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + seg.text)
        elif not (isinstance(seg, Text) and seg.text == ""):
            out.append(seg)
    return out


def compose(person, config, rng: random.Random) -> list[Segment]:
    """One biography: facts in life order, the first sentence naming the person, fillers between
    (``person``, ``config``: a ``bios_draw.Person`` and ``BiosConfig``)."""
    chosen = set(rng.sample(RELATIONS, rng.randint(*config.facts_per_doc)))
    units: list[tuple[str, ...]] = []
    for group in _LIFE_GROUPS:
        present = [r for r in group if r in chosen]
        if len(present) == 2 and rng.random() < config.pair_prob:
            units.append(group)
        else:
            rng.shuffle(present)
            units += [(r,) for r in present]
    sentences = [fill(rng.choice(_OPENERS[units[0]]), person, named=True)]
    for unit in units[1:]:
        sentences.append(fill(rng.choice(COMPILED[unit]), person, rng.random() < config.name_prob))
    for _ in range(rng.randint(*config.filler_per_doc)):
        filler = fill(rng.choice(_FILLERS), person, rng.random() < config.name_prob, rng)
        sentences.insert(rng.randint(1, len(sentences)), filler)
    joined: list[Segment] = []
    for i, sentence in enumerate(sentences):
        joined += ([Text(" ")] if i else []) + sentence
    return _merge(joined)

