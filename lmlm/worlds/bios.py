"""Synthetic biographies: an annotated corpus whose every fact is known, for training and evaluating LMLMs.

Each person has six facts (birth date, birth city, university, major, employer, employer city) drawn
from shared pools, so a value cannot be guessed from the name. A person is the subject of a
long-tailed number of short training biographies (most exactly one, a Zipf tail up to
``max_mentions``); each biography states some of the person's facts with varied sentence templates
and adds filler sentences that carry no facts. Every stated value is preceded by its lookup call,
with the person's full name as entity (the paper's annotation rule), so the documents are ready for
LMLM pretraining and :func:`lmlm.lookup.strip` gives the Standard baseline's text.

People fall into three splits:

* ``train``: written about in the training documents; their facts are in the KB from the start.
* ``added``: never written about; their facts are added to the KB after training (knowledge updates).
* ``heldout``: neither in the text nor in the KB (unknown entities: what the model does when a
  lookup has no answer).

Evaluation sets come from the same world: held-out documents (fresh renderings for a sample of train
people and for added people) for perplexity, cloze prompts, fact edits and forget/retain sets. All
of it is deterministic given the config's seed (and the installed Faker version; a saved world is
the reference copy).

Exercised by ``lmlm world bios``.

Examples:
    >>> world = BiosWorld.generate("smoke")
    >>> world.stats()["people"]
    {'train': 127, 'added': 15, 'heldout': 8}
    >>> world.cloze(world.people_in("train")[0].name, "Birth City").prompt  # doctest: +SKIP
    'Brandy Boone was born in'
"""

from __future__ import annotations

import dataclasses
import json
import random
import string
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import date
from functools import cached_property
from pathlib import Path
from typing import Iterable, NamedTuple

from .. import corpus
from ..lookup import Lookup, Segment, Text, lookups, parse, plain_text, render, strip

__all__ = [
    "RELATIONS", "TEMPLATES", "CLOZE_TEMPLATES", "BIOS_PRESETS", "BiosConfig", "Person", "Document",
    "Triple", "ClozePrompt", "Edit", "BiosWorld", "claim_templates",
]

WORLD_SOURCE = "world:bios"  # the ``source`` of every document of a biography world
RELATIONS = ("Birth Date", "Birth City", "University", "Major", "Employer", "Employer City")
# template field -> relation label
_FIELDS = {
    "birth_date": "Birth Date", "birth_city": "Birth City", "university": "University",
    "major": "Major", "employer": "Employer", "employer_city": "Employer City",
}
# Relations that read naturally together, in the order a biography tells them.
_LIFE_GROUPS = (("Birth Date", "Birth City"), ("University", "Major"), ("Employer", "Employer City"))
_SPLITS = ("train", "added", "heldout")

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
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
# Locales for the share of non-US names: apostrophes (en_IE), diacritics, lowercase particles.
_NAME_LOCALES = ("en_IE", "de_DE", "fr_FR", "es_ES", "pl_PL", "nl_NL", "tr_TR", "vi_VN")
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


_COMPILED = {key: [_compile(t) for t in ts] for key, ts in TEMPLATES.items()}
_OPENERS = {key: [p for p in ps if _names_subject_first(p)] for key, ps in _COMPILED.items()}
_FILLERS = [_compile(t) for t in FILLER_TEMPLATES]
assert all(len(TEMPLATES[(r,)]) >= 4 for r in RELATIONS) and all(_OPENERS.values())


# ---------------------------------------------------------------------------------------------
# configuration

BIOS_PRESETS: dict[str, dict] = {
    "smoke": dict(n_people=150, n_heldout_docs=20, n_cities=40, n_universities=20, n_majors=20,
                  n_companies=40, n_first_names=40, n_last_names=40),
    "default": dict(n_people=1500, n_heldout_docs=200, n_first_names=100, n_last_names=150),
    "large": dict(n_people=20000, n_heldout_docs=1000, n_cities=1000, n_universities=300, n_companies=1000,
                  n_first_names=400, n_last_names=1000),
}


@dataclass
class BiosConfig:
    """How to generate a biography world.

    Args:
        name: preset name, recorded with the world.
        n_people: people in all splits.
        added_fraction: share of people whose facts reach the KB only after training.
        heldout_fraction: share of people in neither the text nor the KB.
        n_heldout_docs: held-out documents (half about added people where there are enough).
        max_mentions: most training documents about one person.
        zipf_exponent: tail of the mention counts, P(m) proportional to m ** -zipf_exponent; 2.0 gives
            about 63% of people one document and about 11% five or more.
        facts_per_doc: (min, max) facts stated in one document.
        filler_per_doc: (min, max) sentences without facts in one document.
        pair_prob: chance that two related facts (date and city of birth, ...) share a sentence.
        name_prob: chance that a sentence after the first names the person instead of a pronoun.
        international_names: share of names from non-US locales (diacritics, apostrophes).
        n_cities, n_universities, n_majors, n_companies: pool sizes shared by all people.
        n_first_names, n_last_names: names combine first and last names from pools of these sizes
            (0: any name Faker makes). Common names make copying a name into a lookup learnable
            by a small model with a small budget; a rare name is still a unique combination.
        birth_years: (first, last) year of birth.
        seed: everything is deterministic given the seed.
    """

    name: str = "default"
    n_people: int = 1500
    added_fraction: float = 0.1
    heldout_fraction: float = 0.05
    n_heldout_docs: int = 200
    max_mentions: int = 20
    zipf_exponent: float = 2.0
    facts_per_doc: tuple[int, int] = (3, 6)
    filler_per_doc: tuple[int, int] = (1, 3)
    pair_prob: float = 0.4
    name_prob: float = 0.3
    international_names: float = 0.15
    n_cities: int = 200
    n_universities: int = 100
    n_majors: int = 60
    n_companies: int = 200
    n_first_names: int = 0
    n_last_names: int = 0
    birth_years: tuple[int, int] = (1940, 2000)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("facts_per_doc", "filler_per_doc", "birth_years"):
            value = tuple(getattr(self, name))
            if len(value) != 2 or value[0] > value[1]:
                raise ValueError(f"{name} must be a (min, max) pair with min <= max, got {value}")
            setattr(self, name, value)
        checks = {
            "n_people": self.n_people >= 1,
            "added_fraction": 0 <= self.added_fraction < 1,
            "heldout_fraction": 0 <= self.heldout_fraction < 1 - self.added_fraction,
            "n_heldout_docs": self.n_heldout_docs >= 0,
            "max_mentions": self.max_mentions >= 1,
            "zipf_exponent": self.zipf_exponent > 0,
            "facts_per_doc": 1 <= self.facts_per_doc[0] and self.facts_per_doc[1] <= len(RELATIONS),
            "filler_per_doc": self.filler_per_doc[0] >= 0,
            "pair_prob": 0 <= self.pair_prob <= 1,
            "name_prob": 0 <= self.name_prob <= 1,
            "international_names": 0 <= self.international_names <= 1,
            "n_cities": self.n_cities >= 2, "n_universities": self.n_universities >= 2,
            "n_majors": 2 <= self.n_majors <= len(MAJORS), "n_companies": self.n_companies >= 2,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}={getattr(self, name)!r}")

    @classmethod
    def from_name(cls, name: str, **overrides) -> "BiosConfig":
        """The preset ``name`` from :data:`BIOS_PRESETS`, with keyword overrides (``seed=1``)."""
        if name not in BIOS_PRESETS:
            raise ValueError(f"unknown bios preset {name!r}; known: {sorted(BIOS_PRESETS)}")
        return cls(**{"name": name, **BIOS_PRESETS[name], **overrides})

    @classmethod
    def from_file(cls, path: str | Path) -> "BiosConfig":
        return cls(**json.loads(Path(path).read_text()))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# records

@dataclass
class Person:
    name: str
    facts: dict[str, str]  # relation -> value, in RELATIONS order
    mentions: int  # training documents about this person (0 unless split == "train")
    split: str  # "train", "added" or "heldout"
    gender: str  # "female" or "male": picks the pronouns


@dataclass
class Document:
    """One biography. ``split`` is ``"train"`` or ``"heldout"`` (the document's, not the person's)."""

    doc_id: str
    person: str
    segments: list[Segment]
    split: str = "train"

    @property
    def annotated(self) -> str:
        """The text with ``[dblookup('E', 'R') -> V]`` calls."""
        return render(self.segments)

    @property
    def plain(self) -> str:
        """The text with every call removed."""
        return strip(self.segments)

    @property
    def lookups(self) -> list[Lookup]:
        return lookups(self.segments)

    def to_document(self) -> corpus.Document:
        """This biography in the one document schema (:mod:`lmlm.corpus`); ``person`` in its metadata."""
        return corpus.Document(self.doc_id, self.annotated, self.plain, source=WORLD_SOURCE, split=self.split,
                               meta={"person": self.person})

    @classmethod
    def from_document(cls, doc: corpus.Document) -> "Document":
        """A biography read back by :mod:`lmlm.corpus` (also from the files older versions wrote)."""
        segments = parse(doc.annotated, form="dblookup", strict=True, source=doc.id).segments
        if "person" not in doc.meta:
            raise corpus.CorpusError(f"document {doc.id}: no 'person' field (not a biography world's document)")
        out = cls(doc.id, doc.meta["person"], segments, doc.split or "train")
        if out.plain != doc.text:
            raise corpus.CorpusError(f"document {doc.id}: stored plain text does not match its annotation")
        return out


class Triple(NamedTuple):
    """One KB row: a fact and the document it came from (``None``: in the KB but never written about)."""

    entity: str
    relation: str
    value: str
    source: str | None


@dataclass(frozen=True)
class ClozePrompt:
    prompt: str  # ends right before the value, no trailing space
    gold: str
    person: str
    relation: str


@dataclass(frozen=True)
class Edit:
    person: str
    relation: str
    old_value: str
    new_value: str


# ---------------------------------------------------------------------------------------------
# generation

def _rng(config: BiosConfig, stream: str) -> random.Random:
    # One independent stream per purpose: changing how documents are drawn leaves the people alone.
    return random.Random(f"bios:{config.seed}:{stream}")


def _faker(config: BiosConfig, stream: str, locale: str = "en_US"):
    from faker import Faker

    fake = Faker(locale)
    fake.seed_instance(f"bios:{config.seed}:{stream}:{locale}")
    return fake


def _unique(draw, n: int, what: str) -> list[str]:
    seen: dict[str, None] = {}
    for _ in range(50 * n + 100):
        if len(seen) == n:
            return list(seen)
        seen.setdefault(draw(), None)
    raise RuntimeError(f"could not draw {n} distinct {what}; lower the pool size")


def _random_date(rng: random.Random, years: tuple[int, int]) -> str:
    d = date.fromordinal(rng.randint(date(years[0], 1, 1).toordinal(), date(years[1], 12, 31).toordinal()))
    return f"{_MONTHS[d.month - 1]} {d.day}, {d.year}"


def _make_pools(config: BiosConfig) -> dict[str, list[str]]:
    """The shared value pools (birth dates are drawn from the year range instead)."""
    fake, rng = _faker(config, "pools"), _rng(config, "pools")
    university_patterns = [
        lambda: f"University of {fake.city()}", lambda: f"{fake.last_name()} University",
        lambda: f"{fake.state()} State University", lambda: f"{fake.last_name()} College",
        lambda: f"{fake.city()} Institute of Technology", lambda: f"{fake.last_name()} Polytechnic Institute",
    ]
    cities = _unique(fake.city, config.n_cities, "cities")
    return {
        "Birth City": cities,
        "University": _unique(lambda: rng.choice(university_patterns)(), config.n_universities, "universities"),
        "Major": rng.sample(MAJORS, config.n_majors),
        "Employer": _unique(fake.company, config.n_companies, "companies"),
        "Employer City": cities,
    }


def _make_names(config: BiosConfig) -> list[tuple[str, str]]:
    """``n_people`` distinct (full name, gender) pairs."""
    rng = _rng(config, "names")
    fakers = {loc: _faker(config, "names", loc) for loc in ("en_US", *_NAME_LOCALES)}

    def locale() -> str:
        return rng.choice(_NAME_LOCALES) if rng.random() < config.international_names else "en_US"

    def pool(n: int, make) -> list[str]:
        return _unique(lambda: make(fakers[locale()]), n, "names") if n else []

    # Finite name pools: names are combinations of common first and last names, as in real text.
    firsts = {"female": pool(config.n_first_names // 2, lambda f: f.first_name_female()),
              "male": pool(config.n_first_names - config.n_first_names // 2, lambda f: f.first_name_male())}
    lasts = pool(config.n_last_names, lambda f: f.last_name())
    if lasts:  # keep names that test quoting (O'Byrne) in every pool
        irish = _unique(lambda: fakers["en_IE"].last_name(), 200, "names")
        quoted = [n for n in irish if "'" in n and n not in lasts][:max(1, len(lasts) // 50)]
        lasts[-len(quoted):] = quoted

    def draw() -> tuple[str, str]:
        fake, gender = fakers[locale()], rng.choice(("female", "male"))
        if firsts[gender]:
            first = rng.choice(firsts[gender])
        else:
            first = fake.first_name_female() if gender == "female" else fake.first_name_male()
        last = rng.choice(lasts) if lasts else fake.last_name()
        if rng.random() < 0.04:
            last = f"{last}-{rng.choice(lasts) if lasts else fake.last_name()}"
        return " ".join(f"{first} {last}".split()), gender

    people: dict[str, str] = {}
    for _ in range(50 * config.n_people + 100):
        if len(people) == config.n_people:
            return list(people.items())
        name, gender = draw()
        people.setdefault(name, gender)
    raise RuntimeError(f"could not draw {config.n_people} distinct names")


def _make_people(config: BiosConfig, pools: dict[str, list[str]]) -> list[Person]:
    rng = _rng(config, "people")
    people = []
    for name, gender in _make_names(config):
        facts = {rel: _random_date(rng, config.birth_years) if rel == "Birth Date" else rng.choice(pools[rel])
                 for rel in RELATIONS}
        people.append(Person(name, facts, 0, "train", gender))
    order = rng.sample(range(len(people)), len(people))
    n_added = round(config.added_fraction * len(people))
    n_heldout = round(config.heldout_fraction * len(people))
    for i in order[:n_added]:
        people[i].split = "added"
    for i in order[n_added:n_added + n_heldout]:
        people[i].split = "heldout"
    train = [p for p in people if p.split == "train"]
    weights = [m ** -config.zipf_exponent for m in range(1, config.max_mentions + 1)]
    for p, m in zip(train, rng.choices(range(1, config.max_mentions + 1), weights, k=len(train))):
        p.mentions = m
    return people


def _fill(parts: list[tuple[str, str | None]], person: Person, named: bool,
          rng: random.Random | None = None) -> list[Segment]:
    """Render one compiled template; each value becomes ``Text("... ") Lookup Text(" value ...")``.

    ``named``: the first mention of the subject is the full name; later mentions are pronouns.
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


def _compose(person: Person, config: BiosConfig, rng: random.Random) -> list[Segment]:
    """One biography: facts in life order, the first sentence naming the person, fillers between."""
    chosen = set(rng.sample(RELATIONS, rng.randint(*config.facts_per_doc)))
    units: list[tuple[str, ...]] = []
    for group in _LIFE_GROUPS:
        present = [r for r in group if r in chosen]
        if len(present) == 2 and rng.random() < config.pair_prob:
            units.append(group)
        else:
            rng.shuffle(present)
            units += [(r,) for r in present]
    sentences = [_fill(rng.choice(_OPENERS[units[0]]), person, named=True)]
    for unit in units[1:]:
        sentences.append(_fill(rng.choice(_COMPILED[unit]), person, rng.random() < config.name_prob))
    for _ in range(rng.randint(*config.filler_per_doc)):
        filler = _fill(rng.choice(_FILLERS), person, rng.random() < config.name_prob, rng)
        sentences.insert(rng.randint(1, len(sentences)), filler)
    joined: list[Segment] = []
    for i, sentence in enumerate(sentences):
        joined += ([Text(" ")] if i else []) + sentence
    return _merge(joined)


def _make_documents(config: BiosConfig, people: list[Person]) -> tuple[list[Document], list[Document]]:
    rng = _rng(config, "documents")
    drafts = [(p, _compose(p, config, rng)) for p in people if p.split == "train" for _ in range(p.mentions)]
    rng.shuffle(drafts)  # repeated mentions of one person are spread through the corpus
    train = [Document(f"bios-train-{i:06d}", p.name, segs) for i, (p, segs) in enumerate(drafts)]

    seen_text = defaultdict(set)
    for doc in train:
        seen_text[doc.person].add(doc.plain)
    added = [p for p in people if p.split == "added"]
    trained = [p for p in people if p.split == "train"]
    n_added = min(len(added), config.n_heldout_docs // 2)
    n_trained = min(len(trained), config.n_heldout_docs - n_added)
    heldout = []
    for p in rng.sample(trained, n_trained) + rng.sample(added, n_added):
        for _ in range(20):  # a fresh rendering, not a copy of a training document
            segs = _compose(p, config, rng)
            if strip(segs) not in seen_text[p.name]:
                break
        heldout.append(Document(f"bios-heldout-{len(heldout):06d}", p.name, segs, "heldout"))
    return train, heldout


# ---------------------------------------------------------------------------------------------
# the world

def _write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class BiosWorld:
    """People, their training and held-out biographies, and the evaluation sets derived from them."""

    config: BiosConfig
    people: list[Person]
    train_documents: list[Document]
    heldout_documents: list[Document]
    pools: dict[str, list[str]] = field(repr=False)

    @classmethod
    def generate(cls, config: BiosConfig | str = "default") -> "BiosWorld":
        """Generate the world of ``config`` (a :class:`BiosConfig` or a preset name)."""
        config = BiosConfig.from_name(config) if isinstance(config, str) else config
        pools = _make_pools(config)
        people = _make_people(config, pools)
        train, heldout = _make_documents(config, people)
        return cls(config, people, train, heldout, pools)

    # -- lookups over people ------------------------------------------------------------------
    @cached_property
    def _by_name(self) -> dict[str, Person]:
        return {p.name: p for p in self.people}

    @cached_property
    def _sources(self) -> dict[tuple[str, str], list[str]]:
        """(person, relation) -> ids of the training documents that state the fact."""
        sources = defaultdict(list)
        for doc in self.train_documents:
            for key in dict.fromkeys(lk.key for lk in doc.lookups):
                sources[key].append(doc.doc_id)
        return {k: sorted(v) for k, v in sources.items()}

    def person(self, name: str) -> Person:
        if name not in self._by_name:
            raise KeyError(f"no person named {name!r} in this world")
        return self._by_name[name]

    def people_in(self, split: str) -> list[Person]:
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
        return [p for p in self.people if p.split == split]

    def stated(self, person: str, relation: str) -> bool:
        """Whether some training document states this fact; a fact that none states is in the KB only,
        so a Standard model could never have learned it."""
        return (person, relation) in self._sources

    def mention_bucket(self, person: str) -> str:
        """``"1"``, ``"2-4"`` or ``"5+"`` training documents; ``"0"`` for added and held-out people."""
        m = self.person(person).mentions
        return "0" if m == 0 else "1" if m == 1 else "2-4" if m <= 4 else "5+"

    # -- knowledge base -----------------------------------------------------------------------
    def _triples(self, split: str, with_sources: bool) -> list[Triple]:
        rows, all_sources = [], self._sources if with_sources else {}
        for p in self.people_in(split):
            for rel, value in p.facts.items():
                sources = all_sources.get((p.name, rel), [])
                rows += [Triple(p.name, rel, value, s) for s in sources] or [Triple(p.name, rel, value, None)]
        return rows

    def triples(self) -> list[Triple]:
        """The KB at training time: every fact of every train person, one row per document stating it
        (``source`` = doc id), or one row with ``source=None`` for a fact no document states."""
        return self._triples("train", with_sources=True)

    def added_triples(self) -> list[Triple]:
        """Facts of the added people, to insert into the KB after training (``source=None``)."""
        return self._triples("added", with_sources=False)

    @cached_property
    def _aliases(self) -> dict[str, list[str]]:
        """person -> other names: ``Last, First``, the name without diacritics, and for a
        double-barrelled surname the first surname alone (``Jasmine Mejia`` for ``Jasmine
        Mejia-Morris``). A form that another person of any split is called, or that two people
        would share, is nobody's alias."""
        import unicodedata

        def fold(name: str) -> str:
            return "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))

        forms: dict[str, list[str]] = {}
        for p in self.people:
            first, _, last = p.name.partition(" ")
            cands = [f"{last}, {first}"] if last else []
            if "-" in last:
                cands.append(f"{first} {last.split('-')[0]}")
            cands.append(fold(p.name))
            forms[p.name] = [c for c in dict.fromkeys(cands) if c != p.name]
        taken = Counter(a.casefold() for names in forms.values() for a in names)
        taken.update(n.casefold() for n in forms)
        return {name: [a for a in names if taken[a.casefold()] == 1] for name, names in forms.items()}

    def aliases(self, split: str = "train") -> list[tuple[str, str]]:
        """``(alias, person)`` pairs for the people of ``split``, for ``KnowledgeBase.add_aliases``."""
        return [(a, p.name) for p in self.people_in(split) for a in self._aliases[p.name]]

    # -- evaluation sets ----------------------------------------------------------------------
    def cloze(self, person: str, relation: str) -> ClozePrompt:
        """A prompt ending right before the value, from the relation's fixed cloze template."""
        if relation not in CLOZE_TEMPLATES:
            raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
        p = self.person(person)
        text, positions = plain_text(_fill(_COMPILED[(relation,)][0], p, named=True))
        return ClozePrompt(text[:positions[0]].rstrip(), p.facts[relation], p.name, relation)

    def cloze_set(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[ClozePrompt]:
        """Cloze prompts over the (person, relation) pairs of ``split``; ``n`` samples that many."""
        pairs = [(p.name, rel) for p in self.people_in(split) for rel in RELATIONS]
        if n is not None:
            if n < 0:
                raise ValueError(f"n must be >= 0, got {n}")
            picked = set(_rng(self.config, f"cloze:{split}:{seed}").sample(range(len(pairs)), min(n, len(pairs))))
            pairs = [pair for i, pair in enumerate(pairs) if i in picked]
        return [self.cloze(name, rel) for name, rel in pairs]

    def edits(self, n: int, seed: int = 0) -> list[Edit]:
        """``n`` distinct facts of train people, each given a different value from the same pool."""
        pairs = [(p.name, rel) for p in self.people_in("train") for rel in RELATIONS]
        if not 0 <= n <= len(pairs):
            raise ValueError(f"n must be between 0 and {len(pairs)}, got {n}")
        rng = _rng(self.config, f"edits:{seed}")
        out = []
        for name, rel in rng.sample(pairs, n):
            old = self.person(name).facts[rel]
            new = old
            while new == old:
                new = _random_date(rng, self.config.birth_years) if rel == "Birth Date" else rng.choice(self.pools[rel])
            out.append(Edit(name, rel, old, new))
        return out

    def forget_set(self, fraction: float = 0.05, seed: int = 0) -> list[str]:
        """Names of train people to unlearn (at least one when ``fraction > 0``), in world order."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        train = [p.name for p in self.people_in("train")]
        k = max(1, round(fraction * len(train))) if fraction > 0 else 0
        picked = set(_rng(self.config, f"forget:{seed}").sample(train, k))
        return [name for name in train if name in picked]

    def retain_set(self, fraction: float = 0.05, seed: int = 0) -> list[str]:
        """The train people not in ``forget_set(fraction, seed)``."""
        forget = set(self.forget_set(fraction, seed))
        return [p.name for p in self.people_in("train") if p.name not in forget]

    def stats(self) -> dict:
        train = self.people_in("train")
        buckets = Counter(self.mention_bucket(p.name) for p in train)
        n_facts, n_stated = len(train) * len(RELATIONS), len(self._sources)
        return {
            "people": {s: len(self.people_in(s)) for s in _SPLITS},
            "documents": {"train": len(self.train_documents), "heldout": len(self.heldout_documents)},
            "mentions": {b: buckets.get(b, 0) for b in ("1", "2-4", "5+")},
            "triples": {"train": sum(map(len, self._sources.values())) + n_facts - n_stated,
                        "added": len(self.people_in("added")) * len(RELATIONS),
                        "facts_stated": n_stated, "facts_unstated": n_facts - n_stated},
            "lookups": sum(len(d.lookups) for d in self.train_documents),
            "plain_chars": sum(len(d.plain) for d in self.train_documents),
            "distinct_values": {rel: len({p.facts[rel] for p in self.people}) for rel in RELATIONS},
        }

    # -- storage ------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        """Write ``documents.jsonl``, ``people.jsonl``, ``triples.jsonl``, ``config.json``,
        ``pools.json``, ``stats.json`` and ``aliases.jsonl`` (other names of the people in the KB)
        into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        corpus.write_documents(folder / "documents.jsonl",
                               (d.to_document() for d in self.train_documents + self.heldout_documents))
        _write_jsonl(folder / "people.jsonl", (dataclasses.asdict(p) for p in self.people))
        _write_jsonl(folder / "triples.jsonl", [
            {**dict(zip(Triple._fields, t)), "split": split}
            for split, rows in (("train", self.triples()), ("added", self.added_triples())) for t in rows])
        (folder / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")
        (folder / "pools.json").write_text(json.dumps(self.pools, ensure_ascii=False, indent=1) + "\n",
                                           encoding="utf-8")
        (folder / "stats.json").write_text(json.dumps(self.stats(), indent=2) + "\n")
        _write_jsonl(folder / "aliases.jsonl", [{"alias": a, "entity": e, "split": split}
                                                for split in ("train", "added") for a, e in self.aliases(split)])
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "BiosWorld":
        """Read a world written by :meth:`save`."""
        folder = Path(folder)
        config = BiosConfig.from_file(folder / "config.json")
        people = [Person(**row) for row in _read_jsonl(folder / "people.jsonl")]
        docs = [Document.from_document(d) for d in corpus.iter_documents(folder / "documents.jsonl")]
        pools = json.loads((folder / "pools.json").read_text(encoding="utf-8"))
        return cls(config, people, [d for d in docs if d.split == "train"],
                   [d for d in docs if d.split == "heldout"], pools)
